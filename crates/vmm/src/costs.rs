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

/// The default table's figure for entry `name`.
pub fn default_cycles(name: &str) -> Option<u64> {
    let (mut cpu, mut hv) = (CycleCosts::DEFAULT, HvCosts::DEFAULT);
    let mut entries = cpu.entries_mut();
    entries.extend(hv.entries_mut());
    entries
        .into_iter()
        .find(|(n, _)| *n == name)
        .map(|(_, cycles)| *cycles)
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

/// `--cost-profile FILE`: a whole set of entries, one `NAME=CYCLES` per
/// line (`#` starts a comment), applied before any `--cost`. `faultline
/// calibrate --write-profile FILE` writes one from this host's
/// measurements; entries a profile leaves out keep the default table's
/// figure (`docs/costs.md`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CostProfile {
    /// The file, as given.
    pub path: String,
    pub entries: Vec<CostOverride>,
}

/// The most a profile file may hold: two tables' worth of lines with
/// comments, many times over.
const PROFILE_CAP: u64 = 64 * 1024;

impl CostProfile {
    /// Sets every entry of the profile.
    pub fn apply(&self, config: &mut VmConfig) {
        for entry in &self.entries {
            entry.apply(config);
        }
    }

    /// Parses a profile's text; errors name the line.
    pub fn parse(path: &str, text: &str) -> Result<CostProfile, String> {
        let mut entries: Vec<CostOverride> = Vec::new();
        for (index, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let entry = parse_cost_override(line)
                .map_err(|e| format!("{path}, line {}: {e}", index + 1))?;
            if entries.iter().any(|e| e.name == entry.name) {
                return Err(format!(
                    "{path}, line {}: `{}` is set twice",
                    index + 1,
                    entry.name
                ));
            }
            entries.push(entry);
        }
        if entries.is_empty() {
            return Err(format!("{path}: no NAME=CYCLES line"));
        }
        Ok(CostProfile {
            path: path.to_string(),
            entries,
        })
    }

    /// A profile's text: a comment block, then one line per entry with
    /// its own comment.
    pub fn text(header: &[String], entries: &[(CostOverride, String)]) -> String {
        let mut out = String::new();
        for line in header {
            out.push_str(&format!("# {line}\n"));
        }
        for (entry, why) in entries {
            out.push_str(&format!("{}={}  # {why}\n", entry.name, entry.cycles));
        }
        out
    }
}

/// Reads and parses `--cost-profile FILE` (a clap value parser, so a bad
/// profile is a usage error before anything runs).
pub fn parse_cost_profile(s: &str) -> Result<CostProfile, String> {
    let bytes =
        crate::config::read_input_file("--cost-profile", std::path::Path::new(s), PROFILE_CAP)
            .map_err(|e| e.to_string())?;
    let text = String::from_utf8(bytes).map_err(|_| format!("{s}: not UTF-8 text"))?;
    CostProfile::parse(s, &text)
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

    #[test]
    fn a_profile_sets_its_entries_and_names_a_bad_line() {
        let text = "# from calibrate\nline_transfer=162  # 54 ns\n\nvm_exit=900\n";
        let profile = CostProfile::parse("p", text).unwrap();
        let mut config = VmConfig::default();
        profile.apply(&mut config);
        assert_eq!(config.costs.line_transfer, 162);
        assert_eq!(config.cpu_costs.vm_exit, 900);
        assert_eq!(config.costs.exit_base, HvCosts::DEFAULT.exit_base);

        let bad = CostProfile::parse("p", "line_transfer=1\nno_such=3\n").unwrap_err();
        assert!(
            bad.starts_with("p, line 2: `no_such`: no such cost entry"),
            "{bad}"
        );
        let twice = CostProfile::parse("p", "vm_exit=1\nvm_exit=2\n").unwrap_err();
        assert!(twice.contains("line 2: `vm_exit` is set twice"), "{twice}");
        assert!(CostProfile::parse("p", "# nothing\n").is_err());
    }

    #[test]
    fn a_profile_written_is_read_back_the_same() {
        let entries = vec![
            (
                parse_cost_override("zero_4k=1336").unwrap(),
                "zero_4k: 445.4 ns".to_string(),
            ),
            (
                parse_cost_override("locked=26").unwrap(),
                "lock_add: 8.8 ns".to_string(),
            ),
        ];
        let text = CostProfile::text(&["host x".to_string()], &entries);
        let back = CostProfile::parse("p", &text).unwrap();
        let names: Vec<_> = back
            .entries
            .iter()
            .map(|e| (e.name.as_str(), e.cycles))
            .collect();
        assert_eq!(names, [("zero_4k", 1336), ("locked", 26)]);
    }
}
