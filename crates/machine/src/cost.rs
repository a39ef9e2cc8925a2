//! Virtual time: what each machine operation costs, in cycles.
//!
//! The machine has no wall clock. Every CPU carries a cycle counter that only
//! this table advances, so the same program with the same inputs takes the
//! same number of cycles, bit for bit, on any host. The figures are round
//! numbers of the right order for a recent Intel core (Skylake-class, 3 GHz);
//! what matters for the project's experiments is that mechanisms are compared
//! by the work they do, all charged from this one table. `docs/costs.md`
//! lists every entry with the source read for it, or `faultline
//! calibrate`'s measurement, or that it has neither.

/// Cycle costs of machine operations. See the field docs for the rationale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CycleCosts {
    /// Every retired instruction (a pipelined core retires ~1/cycle).
    pub instruction: u64,
    /// Extra for a multiply (latency 3 on Skylake).
    pub multiply: u64,
    /// Extra for a divide (latency 20-90; 26 is the 32-bit figure).
    pub divide: u64,
    /// Extra per iteration of a `rep` string instruction. AMD's Software
    /// Optimization Guide (25112 rev. 3.06, Table 6) gives one cycle an
    /// iteration ("rep movs ... 15 + (1 * c)"); `faultline calibrate`'s
    /// `rep_movsb` and `rep_stosb` measure this host's (`docs/costs.md`).
    pub string_iteration: u64,
    /// Extra for a locked read-modify-write (~18 cycles uncontended).
    pub locked: u64,
    /// One memory reference made by a page walk (guest paging or EPT). A
    /// paging-structure cache hit is ~L1/L2 latency; a 2-D walk makes up to
    /// 24 of them, which is why TLB misses under EPT are expensive.
    pub page_walk_ref: u64,
    /// Delivering an exception or interrupt through the IDT (or the
    /// real-mode vector table). No source read for the delivery itself;
    /// the nearest figure read is a far call and its RETF, 220 cycles on
    /// Skylake, which does less (`docs/costs.md`). `faultline
    /// calibrate`'s `kvm_int_iret` measures it with its IRET inside a KVM
    /// guest where the host's KVM runs the guest on the CPU, and
    /// `int80_syscall` against `syscall` on a host whose kernel the CPU
    /// delivers events to.
    pub event_delivery: u64,
    /// `iretq`, `sysret`, `syscall`: privilege transitions.
    pub privilege_transition: u64,
    /// A serializing instruction (CPUID, MOV CR, WRMSR, INVLPG, ...).
    pub serializing: u64,
    /// Writing one page-modification-log entry (SDM Vol. 3C 29.3.6): an
    /// 8-byte store by the page walker into the 4 KiB log, which it fills
    /// sequentially (8 entries per 64-byte line), so an L1 hit. Priced as
    /// one of the walker's memory references (`page_walk_ref`): Skylake's
    /// L1 data-cache latency is 4-5 cycles (Intel 64 and IA-32
    /// Architectures Optimization Reference Manual, Skylake
    /// microarchitecture, cache hierarchy table: L1 DCU 4-5 cycles).
    pub pml_log_write: u64,
    /// VM exit: saving guest state, loading host state (~half of the
    /// ~1,200-cycle round trip measured on Skylake). Sources for the round
    /// trip: KVM's SVM run loop timed with the TSC in a Dec 2020 LKML
    /// thread on saving host state around VMRUN
    /// (<https://lkml.iu.edu/hypermail/linux/kernel/2012.2/00527.html>):
    /// VMRUN to #VMEXIT 1,344-1,376 cycles on an AMD host; a Linux commit
    /// (5a8781607e67) putting "the extra VMX transition" at "600+ cycles".
    /// Agesen, Mattson, Rugina, Sheldon, "Software Techniques for Avoiding
    /// Hardware Virtualization Exits" (USENIX ATC 2012), Figure 1, plots
    /// the per-generation decline of Intel's round trip; its figures were
    /// not reached (`docs/costs.md`). Not tuned to any benchmark's
    /// figure.
    pub vm_exit: u64,
    /// VM entry: the other half of the round trip (see `vm_exit`).
    pub vm_entry: u64,
}

impl CycleCosts {
    /// The default table (see the module docs).
    pub const DEFAULT: CycleCosts = CycleCosts {
        instruction: 1,
        multiply: 2,
        divide: 25,
        string_iteration: 1,
        locked: 17,
        page_walk_ref: 5,
        pml_log_write: 5,
        event_delivery: 60,
        privilege_transition: 40,
        serializing: 30,
        vm_exit: 600,
        vm_entry: 600,
    };
}

impl Default for CycleCosts {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// Cycles per second of virtual time, used to turn cycles into nanoseconds.
pub const CYCLES_PER_SECOND: u64 = 3_000_000_000;

/// A cost table whose entries can be named, for overrides in sensitivity
/// studies (the vmm's `--cost NAME=CYCLES`): the machine's and the hv's.
pub trait NamedCosts {
    /// Every entry by its field name. Implementations destructure the
    /// table naming every field, so an entry added without a name does
    /// not compile.
    fn entries_mut(&mut self) -> Vec<(&'static str, &mut u64)>;

    /// Sets entry `name` to `cycles`; false if the table has no such entry.
    fn set(&mut self, name: &str, cycles: u64) -> bool {
        match self.entries_mut().into_iter().find(|(n, _)| *n == name) {
            Some((_, entry)) => {
                *entry = cycles;
                true
            }
            None => false,
        }
    }

    /// The entries' names.
    fn names(&mut self) -> Vec<&'static str> {
        self.entries_mut().into_iter().map(|(n, _)| n).collect()
    }
}

impl NamedCosts for CycleCosts {
    fn entries_mut(&mut self) -> Vec<(&'static str, &mut u64)> {
        let CycleCosts {
            instruction,
            multiply,
            divide,
            string_iteration,
            locked,
            page_walk_ref,
            pml_log_write,
            event_delivery,
            privilege_transition,
            serializing,
            vm_exit,
            vm_entry,
        } = self;
        vec![
            ("instruction", instruction),
            ("multiply", multiply),
            ("divide", divide),
            ("string_iteration", string_iteration),
            ("locked", locked),
            ("page_walk_ref", page_walk_ref),
            ("pml_log_write", pml_log_write),
            ("event_delivery", event_delivery),
            ("privilege_transition", privilege_transition),
            ("serializing", serializing),
            ("vm_exit", vm_exit),
            ("vm_entry", vm_entry),
        ]
    }
}

/// Checks that every name of `table` sets its own entry and that an
/// unknown name is refused (for the tables' unit tests).
pub fn check_named_costs(mut table: impl NamedCosts) {
    let names = table.names();
    for (i, name) in names.iter().enumerate() {
        assert!(table.set(name, 1_000_000 + i as u64), "{name}");
    }
    let values: Vec<u64> = table.entries_mut().into_iter().map(|(_, v)| *v).collect();
    let expected: Vec<u64> = (0..names.len() as u64).map(|i| 1_000_000 + i).collect();
    assert_eq!(values, expected, "each name sets its own entry");
    assert!(!table.set("no_such_entry", 1));
}

#[cfg(test)]
mod tests {
    use super::{check_named_costs, CycleCosts};

    #[test]
    fn every_entry_can_be_set_by_name() {
        check_named_costs(CycleCosts::DEFAULT);
    }
}
