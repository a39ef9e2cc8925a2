//! Counters per vCPU and per exit reason.

use crate::apf::ApfStats;
pub use crate::mmu::lock::MmuLockStats;
use crate::pager::PagerStats;
use crate::swap::DeviceStats;
use machine::vmx::VmExit;
use std::collections::BTreeMap;

/// Count and hv cycles of one exit reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ExitStat {
    pub count: u64,
    /// Cycles the hv charged handling these exits (beyond the machine's
    /// VM exit/entry transition costs).
    pub hv_cycles: u64,
}

/// Why a vCPU exited, as the statistics count it: one per
/// `machine::vmx::VmExit` variant, declared in the order of their names
/// (the order every report lists them in).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ExitReason {
    Cpuid,
    CrAccess,
    CycleLimit,
    EoiBroadcast,
    EptMisconfig,
    EptViolation,
    Exception,
    ExternalInterrupt,
    Hlt,
    InterruptWindow,
    Invlpg,
    Io,
    Ipi,
    MachineError,
    MonitorTrap,
    MsrRead,
    MsrWrite,
    NmiWindow,
    PmlFull,
    Rdtsc,
    TripleFault,
    Vmcall,
}

impl ExitReason {
    /// Every reason, in name order.
    pub const ALL: [ExitReason; 22] = [
        ExitReason::Cpuid,
        ExitReason::CrAccess,
        ExitReason::CycleLimit,
        ExitReason::EoiBroadcast,
        ExitReason::EptMisconfig,
        ExitReason::EptViolation,
        ExitReason::Exception,
        ExitReason::ExternalInterrupt,
        ExitReason::Hlt,
        ExitReason::InterruptWindow,
        ExitReason::Invlpg,
        ExitReason::Io,
        ExitReason::Ipi,
        ExitReason::MachineError,
        ExitReason::MonitorTrap,
        ExitReason::MsrRead,
        ExitReason::MsrWrite,
        ExitReason::NmiWindow,
        ExitReason::PmlFull,
        ExitReason::Rdtsc,
        ExitReason::TripleFault,
        ExitReason::Vmcall,
    ];

    /// The reason of `exit`.
    pub fn of(exit: &VmExit) -> ExitReason {
        match exit {
            VmExit::Exception { .. } => ExitReason::Exception,
            VmExit::ExternalInterrupt { .. } => ExitReason::ExternalInterrupt,
            VmExit::InterruptWindow => ExitReason::InterruptWindow,
            VmExit::NmiWindow => ExitReason::NmiWindow,
            VmExit::MonitorTrap => ExitReason::MonitorTrap,
            VmExit::TripleFault => ExitReason::TripleFault,
            VmExit::Cpuid => ExitReason::Cpuid,
            VmExit::Hlt => ExitReason::Hlt,
            VmExit::Invlpg { .. } => ExitReason::Invlpg,
            VmExit::Rdtsc { .. } => ExitReason::Rdtsc,
            VmExit::Vmcall => ExitReason::Vmcall,
            VmExit::CrAccess(_) => ExitReason::CrAccess,
            VmExit::Io { .. } => ExitReason::Io,
            VmExit::MsrRead { .. } => ExitReason::MsrRead,
            VmExit::MsrWrite { .. } => ExitReason::MsrWrite,
            VmExit::EptViolation { .. } => ExitReason::EptViolation,
            VmExit::EptMisconfig { .. } => ExitReason::EptMisconfig,
            VmExit::PmlFull => ExitReason::PmlFull,
            VmExit::Ipi(_) => ExitReason::Ipi,
            VmExit::EoiBroadcast { .. } => ExitReason::EoiBroadcast,
            VmExit::CycleLimit => ExitReason::CycleLimit,
            VmExit::MachineError(_) => ExitReason::MachineError,
        }
    }

    /// The name in reports: `VmExit::name` of its exits.
    pub fn name(self) -> &'static str {
        match self {
            ExitReason::Cpuid => "cpuid",
            ExitReason::CrAccess => "cr_access",
            ExitReason::CycleLimit => "cycle_limit",
            ExitReason::EoiBroadcast => "eoi_broadcast",
            ExitReason::EptMisconfig => "ept_misconfig",
            ExitReason::EptViolation => "ept_violation",
            ExitReason::Exception => "exception",
            ExitReason::ExternalInterrupt => "external_interrupt",
            ExitReason::Hlt => "hlt",
            ExitReason::InterruptWindow => "interrupt_window",
            ExitReason::Invlpg => "invlpg",
            ExitReason::Io => "io",
            ExitReason::Ipi => "ipi",
            ExitReason::MachineError => "machine_error",
            ExitReason::MonitorTrap => "monitor_trap",
            ExitReason::MsrRead => "msr_read",
            ExitReason::MsrWrite => "msr_write",
            ExitReason::NmiWindow => "nmi_window",
            ExitReason::PmlFull => "pml_full",
            ExitReason::Rdtsc => "rdtsc",
            ExitReason::TripleFault => "triple_fault",
            ExitReason::Vmcall => "vmcall",
        }
    }

    /// The reason named `name`.
    pub fn from_name(name: &str) -> Option<ExitReason> {
        ExitReason::ALL.into_iter().find(|r| r.name() == name)
    }
}

/// Exit counters by reason: a fixed table indexed by [`ExitReason`]
/// (counting an exit allocates nothing). It reads like the map it stands
/// for: the reasons seen (count above zero), in name order; saved and
/// loaded as that map.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExitTable([ExitStat; ExitReason::ALL.len()]);

impl ExitTable {
    /// Counts one exit of `reason` that cost the hv `hv_cycles`.
    pub fn record(&mut self, reason: ExitReason, hv_cycles: u64) {
        let stat = &mut self.0[reason as usize];
        stat.count += 1;
        stat.hv_cycles += hv_cycles;
    }

    /// The counters of `reason`, if an exit of it was seen.
    pub fn stat(&self, reason: ExitReason) -> Option<&ExitStat> {
        Some(&self.0[reason as usize]).filter(|s| s.count > 0)
    }

    /// The counters of the reason named `name`, if an exit of it was seen.
    pub fn get(&self, name: &str) -> Option<&ExitStat> {
        self.stat(ExitReason::from_name(name)?)
    }

    /// Whether an exit of the reason named `name` was seen.
    pub fn contains_key(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// The reasons seen, in name order, with their counters.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, &ExitStat)> + '_ {
        ExitReason::ALL
            .into_iter()
            .filter_map(|r| self.stat(r).map(|s| (r.name(), s)))
    }

    /// The counters of the reasons seen, in name order.
    pub fn values(&self) -> impl Iterator<Item = &ExitStat> + '_ {
        self.iter().map(|(_, s)| s)
    }

    /// Adds `other`'s counters to these.
    pub fn add(&mut self, other: &ExitTable) {
        for (mine, theirs) in self.0.iter_mut().zip(&other.0) {
            mine.count += theirs.count;
            mine.hv_cycles += theirs.hv_cycles;
        }
    }
}

impl std::ops::Index<&str> for ExitTable {
    type Output = ExitStat;

    /// The counters of the reason named `name`; panics if none was seen
    /// (as a map's index does).
    fn index(&self, name: &str) -> &ExitStat {
        self.get(name)
            .unwrap_or_else(|| panic!("no {name:?} exit was counted"))
    }
}

impl<'a> IntoIterator for &'a ExitTable {
    type Item = (&'static str, &'a ExitStat);
    type IntoIter = Box<dyn Iterator<Item = (&'static str, &'a ExitStat)> + 'a>;

    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}

impl serde::Serialize for ExitTable {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let seen: Vec<(&str, &ExitStat)> = self.iter().collect();
        serializer.collect_map(seen)
    }
}

impl<'de> serde::Deserialize<'de> for ExitTable {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let map = BTreeMap::<String, ExitStat>::deserialize(deserializer)?;
        let mut table = ExitTable::default();
        for (name, stat) in map {
            let reason = ExitReason::from_name(&name)
                .ok_or_else(|| serde::de::Error::custom(format!("unknown exit reason {name:?}")))?;
            table.0[reason as usize] = stat;
        }
        Ok(table)
    }
}

/// Counters of one vCPU.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VcpuStats {
    /// Counters by exit reason (named as `VmExit::name`).
    pub exits: ExitTable,
    /// EPT violations fixed.
    pub ept_faults: u64,
    /// EPT violations the fast page fault fixed without `mmu_lock`
    /// (counted apart from `ept_faults`, which the slow path fixed).
    pub fast_pf_fixed: u64,
    /// Violations the fast path found already fixed (another vCPU's fix).
    pub fast_pf_spurious: u64,
    /// Violations the fast path looked at and left to the slow path.
    pub fast_pf_slow: u64,
    /// Guest frames allocated by those faults (first touches).
    pub frames_allocated: u64,
    /// Virtual cycles spent waiting for `mmu_lock`.
    pub mmu_lock_wait_cycles: u64,
    /// Its timed holds of `mmu_lock` (exit handling and pager work).
    #[serde(default)]
    pub mmu_lock_acquisitions: u64,
    /// Of those, the ones that had to wait.
    #[serde(default)]
    pub mmu_lock_contended: u64,
    /// Roots reloaded after a zap-all.
    pub root_reloads: u64,
    /// Virtual cycles held up by zap-alls: waits behind their teardown
    /// holds of `mmu_lock` and root reloads.
    pub zap_stall_cycles: u64,
    /// The longest single such stall.
    pub zap_stall_max: u64,
    /// HLT exits.
    pub halts: u64,
    /// IPIs routed.
    pub ipis_sent: u64,
    /// MMIO accesses emulated (IOAPIC, xAPIC page).
    pub mmio_accesses: u64,
    /// Accesses to unassigned MMIO (no RAM, no device): reads gave all
    /// ones, writes were dropped (a stop under `--strict-mmio`).
    #[serde(default)]
    pub unassigned_mmio: u64,
    /// Cycles interpreting guest code or handling its exits.
    pub busy_cycles: u64,
    /// Cycles skipped while halted or not started.
    pub idle_cycles: u64,
    /// Cycles it wanted to run but had no host CPU (`--host-cpus`): steal
    /// time.
    pub steal_cycles: u64,
    /// Steal (ns) the hv added to the guest's steal-time area: the steal
    /// since the guest registered the area, up to the vCPU's last
    /// schedule-in (what the guest's steal clock can show).
    pub steal_reported_ns: u64,
    /// Times it lost its host CPU while it wanted to run.
    pub preemptions: u64,
    /// TLB flushes the hv did at its entry for a PV TLB flush (the guest
    /// set `KVM_VCPU_FLUSH_TLB` while it was preempted).
    pub pv_tlb_flushes: u64,
    /// Fixed IPIs it received, and of them those that found it preempted
    /// (they wait for it to get a host CPU again).
    pub ipis_received: u64,
    pub ipis_received_preempted: u64,
    /// KVM_HC_SCHED_YIELD calls it made, and those that gave its host CPU
    /// to a preempted target.
    pub sched_yields: u64,
    pub sched_yields_directed: u64,
    /// KVM_HC_KICK_CPU calls it made.
    pub kicks_sent: u64,
    /// KVM_HC_SEND_IPI calls it made (each sends one IPI per target,
    /// counted in `ipis_sent`).
    pub pv_send_ipi_calls: u64,
    /// Entries with its PV EOI flag set (one vector in service, none
    /// pending), and the EOIs the hv did because the guest cleared the
    /// flag instead of writing the EOI register.
    pub pv_eoi_offered: u64,
    pub pv_eois: u64,
    /// NMIs injected (NMI IPIs, by ICR or PV send-IPI).
    pub nmis_received: u64,
    /// The vCPU's clock.
    pub cycles: u64,
    /// Retired guest instructions.
    pub instructions: u64,
    /// TLB lookups that needed a page walk.
    pub tlb_misses: u64,
    /// Paging-structure entries those walks read (guest and EPT: up to 24
    /// per miss under EPT, 4 with one-dimensional paging).
    pub page_walk_refs: u64,
    /// Asynchronous page faults and waits for swapped pages.
    pub apf: ApfStats,
    /// Times its dirty ring filled and it waited for a harvest.
    pub dirty_ring_full_exits: u64,
    /// Page-modification-log entries the hv drained from its log (dirty-log
    /// mode `pml`; its PML-full exits are in `exits["pml_full"]`).
    pub pml_entries_drained: u64,
    /// CR3-load exits and the paravirtual CR3 cache.
    pub cr3_cache: crate::mmu::shadow::cr3_cache::Cr3CacheStats,
}

impl VcpuStats {
    /// Counts a stall caused by a zap-all (nothing if zero).
    pub(crate) fn note_zap_stall(&mut self, stall: crate::time::Cycles) {
        self.zap_stall_cycles += stall.0;
        self.zap_stall_max = self.zap_stall_max.max(stall.0);
    }

    /// Share of `virtual_cycles` (the VM's virtual time) this vCPU spent
    /// busy. A vCPU's own clock can lag the VM's when the VM stops in the
    /// middle of a round, so the VM's time is the denominator.
    pub fn utilization(&self, virtual_cycles: u64) -> f64 {
        if virtual_cycles == 0 {
            0.0
        } else {
            self.busy_cycles as f64 / virtual_cycles as f64
        }
    }
}

/// Counters of a VM.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct VmStats {
    /// Virtual time: the furthest vCPU clock.
    pub virtual_cycles: u64,
    pub vcpus: Vec<VcpuStats>,
    /// Host frames in use (guest RAM touched + EPT tables).
    pub frames_in_use: u64,
    pub frames_peak: u64,
    /// EPT table frames.
    pub ept_tables: u64,
    pub memslot_generation: u64,
    /// Host memory pool for guest pages, in pages.
    pub host_mem_pages: u64,
    /// Guest pages resident (or being read) now.
    pub resident_pages: u64,
    /// Eviction and swap counters.
    pub pager: PagerStats,
    /// The swap device's counters.
    pub device: DeviceStats,
    /// The swap device model's name and parameters.
    pub device_desc: String,
    /// Host CPUs the vCPUs shared, when fewer than the vCPUs
    /// (`--host-cpus`).
    pub host_cpus: Option<usize>,
    /// `off`, `halt` or `pv`.
    pub apf_mode: &'static str,
    /// `x86` or `event`.
    pub apf_protocol: &'static str,
    /// `ept` or `shadow`.
    pub mmu: &'static str,
    /// The shadow MMU's counters (shadow paging only).
    pub shadow: Option<crate::mmu::shadow::ShadowStats>,
    /// `mmu_lock`'s counters.
    pub mmu_lock: MmuLockStats,
}

impl VmStats {
    /// Exits summed over vCPUs, by reason.
    pub fn exits(&self) -> ExitTable {
        let mut all = ExitTable::default();
        for v in &self.vcpus {
            all.add(&v.exits);
        }
        all
    }

    /// Instructions summed over vCPUs.
    pub fn instructions(&self) -> u64 {
        self.vcpus.iter().map(|v| v.instructions).sum()
    }

    /// APF counters summed over vCPUs (peak outstanding: the maximum).
    pub fn apf(&self) -> ApfStats {
        let mut all = ApfStats::default();
        for v in &self.vcpus {
            let a = &v.apf;
            all.not_present += a.not_present;
            all.ready += a.ready;
            all.wake_all += a.wake_all;
            all.halts += a.halts;
            all.halt_cycles += a.halt_cycles;
            all.stalls += a.stalls;
            all.stall_cycles += a.stall_cycles;
            all.peak_outstanding = all.peak_outstanding.max(a.peak_outstanding);
            all.repeat_faults += a.repeat_faults;
            all.acks += a.acks;
        }
        all
    }

    /// EPT faults summed over vCPUs.
    pub fn ept_faults(&self) -> u64 {
        self.vcpus.iter().map(|v| v.ept_faults).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_in_name_order_and_named_as_the_machine_names_exits() {
        let names: Vec<&str> = ExitReason::ALL.iter().map(|r| r.name()).collect();
        assert!(names.windows(2).all(|w| w[0] < w[1]), "{names:?}");
        for (i, r) in ExitReason::ALL.into_iter().enumerate() {
            assert_eq!(r as usize, i);
            assert_eq!(ExitReason::from_name(r.name()), Some(r));
        }
        for exit in [
            VmExit::InterruptWindow,
            VmExit::NmiWindow,
            VmExit::MonitorTrap,
            VmExit::TripleFault,
            VmExit::Cpuid,
            VmExit::Hlt,
            VmExit::Vmcall,
            VmExit::PmlFull,
            VmExit::CycleLimit,
        ] {
            assert_eq!(ExitReason::of(&exit).name(), exit.name());
        }
    }

    /// The table reads, and saves, as the map of the reasons seen.
    #[test]
    fn the_table_is_the_map_of_the_reasons_seen() {
        let mut table = ExitTable::default();
        let mut map: BTreeMap<String, ExitStat> = BTreeMap::new();
        for (reason, cycles) in [
            (ExitReason::Vmcall, 7),
            (ExitReason::EptViolation, 100),
            (ExitReason::Vmcall, 5),
            (ExitReason::Cpuid, 0),
        ] {
            table.record(reason, cycles);
            let stat = map.entry(reason.name().to_string()).or_default();
            stat.count += 1;
            stat.hv_cycles += cycles;
        }
        let listed: Vec<(String, ExitStat)> =
            table.iter().map(|(n, s)| (n.to_string(), *s)).collect();
        let expected: Vec<(String, ExitStat)> = map.clone().into_iter().collect();
        assert_eq!(listed, expected);
        assert_eq!(table.get("vmcall").map(|s| s.count), Some(2));
        assert_eq!(table.get("hlt"), None);
        assert_eq!(table.get("no_such_exit"), None);
        let bytes = bincode::serialize(&table).unwrap();
        assert_eq!(bytes, bincode::serialize(&map).unwrap());
        assert_eq!(bincode::deserialize::<ExitTable>(&bytes).unwrap(), table);
    }
}
