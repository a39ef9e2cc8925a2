//! Counters per vCPU and per exit reason.

use crate::apf::ApfStats;
pub use crate::mmu::lock::MmuLockStats;
use crate::pager::PagerStats;
use crate::swap::DeviceStats;
use std::collections::BTreeMap;

/// Count and hv cycles of one exit reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ExitStat {
    pub count: u64,
    /// Cycles the hv charged handling these exits (beyond the machine's
    /// VM exit/entry transition costs).
    pub hv_cycles: u64,
}

/// Counters of one vCPU.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VcpuStats {
    /// Exit reason (`VmExit::name`) -> counters, in name order.
    pub exits: BTreeMap<String, ExitStat>,
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
    pub fn exits(&self) -> BTreeMap<String, ExitStat> {
        let mut all: BTreeMap<String, ExitStat> = BTreeMap::new();
        for v in &self.vcpus {
            for (name, stat) in &v.exits {
                let e = all.entry(name.clone()).or_default();
                e.count += stat.count;
                e.hv_cycles += stat.hv_cycles;
            }
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
