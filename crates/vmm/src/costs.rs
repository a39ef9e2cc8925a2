//! `--cost NAME=CYCLES`: one entry of the machine's or the hv's cost table
//! set to another figure, for sensitivity studies. Every figure in the
//! tables is cited; where a source gives a range or only a bound, runs at
//! the ends of it show how much a result rests on the figure
//! (`docs/mmu.md` does so for the CR3 cache's exit costs).

use hv::{CycleCosts, HvCosts, NamedCosts, VmConfig};
use serde::{Deserialize, Serialize};

/// One cost-table entry set from the command line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CostOverride {
    /// The entry's field name in `hv::CycleCosts` (the machine's) or `hv::HvCosts`.
    pub name: String,
    pub cycles: u64,
}

impl CostOverride {
    /// Sets the entry in whichever table has it (names are unique across
    /// the two; [`parse_cost_override`] has checked the name).
    pub fn apply(&self, config: &mut VmConfig) {
        if !config.costs.set(&self.name, self.cycles) {
            config.cpu_costs.set(&self.name, self.cycles);
        }
    }
}

/// Every entry name, machine's first.
pub fn cost_names() -> Vec<&'static str> {
    let (mut cpu, mut hv) = (CycleCosts::DEFAULT, HvCosts::DEFAULT);
    let mut names = cpu.names();
    names.extend(hv.names());
    names
}

/// Parses `NAME=CYCLES`.
pub fn parse_cost_override(s: &str) -> Result<CostOverride, String> {
    let (name, cycles) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}`: expected NAME=CYCLES, e.g. exit_base=300"))?;
    let names = cost_names();
    if !names.contains(&name) {
        return Err(format!(
            "`{name}`: no such cost entry; the entries are {}",
            names.join(", ")
        ));
    }
    let cycles = cycles
        .parse::<u64>()
        .map_err(|_| format!("`{cycles}`: cycles must be a whole number"))?;
    Ok(CostOverride {
        name: name.to_string(),
        cycles,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_across_the_two_tables() {
        let names = cost_names();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), names.len());
    }

    #[test]
    fn an_override_sets_the_entry_of_its_table() {
        let mut config = VmConfig::default();
        parse_cost_override("exit_base=7")
            .unwrap()
            .apply(&mut config);
        parse_cost_override("vm_exit=9").unwrap().apply(&mut config);
        assert_eq!(config.costs.exit_base, 7);
        assert_eq!(config.cpu_costs.vm_exit, 9);
        assert_eq!(config.cpu_costs.vm_entry, CycleCosts::DEFAULT.vm_entry);
    }

    #[test]
    fn bad_overrides_are_refused_with_the_reason() {
        assert!(parse_cost_override("exit_base")
            .unwrap_err()
            .contains("NAME=CYCLES"));
        assert!(parse_cost_override("nope=1")
            .unwrap_err()
            .contains("exit_base"));
        assert!(parse_cost_override("exit_base=-1")
            .unwrap_err()
            .contains("whole number"));
        assert!(parse_cost_override("exit_base=1x").is_err());
    }
}
