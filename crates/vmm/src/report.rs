//! The run summary, as text or JSON. Only virtual-time figures appear here,
//! so the same run prints the same summary.

use crate::session::Ending;
use crate::units::{cycles_to_secs, format_duration};
use hv::{StopReason, Vm};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write;

#[derive(Serialize)]
pub struct ExitSummary {
    pub count: u64,
    pub hv_cycles: u64,
}

#[derive(Serialize)]
pub struct VcpuSummary {
    pub id: usize,
    pub cycles: u64,
    pub instructions: u64,
    pub busy_cycles: u64,
    pub idle_cycles: u64,
    pub utilization: f64,
    pub ept_faults: u64,
    pub mmu_lock_wait_cycles: u64,
    /// Its timed holds of `mmu_lock` and how many of them waited.
    pub mmu_lock_acquisitions: u64,
    pub mmu_lock_contended: u64,
    pub halts: u64,
    pub ipis_sent: u64,
    pub apf: hv::apf::ApfStats,
    /// CR3-load exits and the paravirtual CR3 cache (shadow paging).
    pub cr3: hv::Cr3CacheStats,
    /// Host CPUs (`--host-cpus`): steal time and what comes with it.
    pub steal: StealSummary,
    /// PV send-IPI and PV EOI.
    pub pv: PvSummary,
    pub exits: BTreeMap<String, ExitSummary>,
}

/// One vCPU's use of PV send-IPI and PV EOI.
#[derive(Serialize)]
pub struct PvSummary {
    /// KVM_HC_SEND_IPI calls (their IPIs count in `ipis_sent`).
    pub send_ipi_calls: u64,
    /// Entries with the PV EOI flag set.
    pub eoi_offered: u64,
    /// EOIs the hv did because the guest took the flag instead.
    pub eois: u64,
}

/// One vCPU's time without a host CPU and the paravirtual features that
/// deal with it.
#[derive(Serialize)]
pub struct StealSummary {
    /// Cycles it wanted to run with no host CPU.
    pub steal_cycles: u64,
    /// The same in nanoseconds (the unit of the guest's steal clock).
    pub steal_ns: u64,
    /// Of it, what the hv added to the guest's steal-time area (the steal
    /// after the guest registered it, up to the last schedule-in).
    pub reported_ns: u64,
    /// Times it lost its host CPU while it wanted to run.
    pub preemptions: u64,
    /// TLB flushes the hv did for it at entry (PV TLB flush).
    pub pv_tlb_flushes: u64,
    pub ipis_received: u64,
    /// IPIs that found it preempted.
    pub ipis_received_preempted: u64,
    pub sched_yields: u64,
    /// Yields that handed the caller's host CPU to a preempted vCPU.
    pub sched_yields_directed: u64,
    pub kicks_sent: u64,
}

/// Host memory overcommit: the pool, the swap device, what moved.
#[derive(Serialize)]
pub struct MemorySummary {
    pub host_mem_pages: u64,
    pub resident_pages: u64,
    pub swap_device: String,
    pub pager: hv::pager::PagerStats,
    pub swap_reads: u64,
    pub swap_writes: u64,
    pub mean_read_wait_cycles: u64,
    pub max_read_wait_cycles: u64,
    /// Reads the device served after a read submitted later than
    /// themselves (`docs/design.md`, "Virtual time and the order of
    /// events"; 0 when the order holds).
    pub swap_read_inversions: u64,
    /// The same for writes.
    pub swap_write_inversions: u64,
}

/// Asynchronous page faults, summed over vCPUs.
#[derive(Serialize)]
pub struct ApfSummary {
    pub mode: String,
    pub protocol: String,
    /// Page-not-present notifications sent.
    pub not_present_sent: u64,
    /// Page-ready notifications sent (wake-alls included).
    pub ready_sent: u64,
    pub wake_all_sent: u64,
    /// Halts in the hv waiting for a page.
    pub halts: u64,
    pub halt_cycles: u64,
    /// Synchronous waits (no interrupts) for a page.
    pub stalls: u64,
    pub stall_cycles: u64,
    /// Most outstanding on one vCPU.
    pub peak_outstanding: u64,
    pub repeat_faults: u64,
    /// Page-ready acknowledgements the guest wrote (its own count of the
    /// page-ready notifications it handled).
    pub acks_received: u64,
}

#[derive(Serialize)]
pub struct ReportLine {
    pub vcpu: usize,
    pub cycles: u64,
    pub line: String,
}

/// Why the run ended: `{"reason": ..., ...}` in JSON.
#[derive(Serialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum Stop {
    /// The guest called HC_SHUTDOWN with `status`.
    Shutdown { status: u64 },
    /// The guest wrote v to the isa-debug-exit port: `status` is
    /// `(v << 1) | 1`.
    DebugExit { status: u32 },
    /// The VM stopped with an error (triple fault, access outside guest
    /// memory, swap I/O error, ...).
    Error { message: String },
    /// The guest powered off (ACPI S5 through the FADT).
    PowerOff,
    /// SIGINT or SIGTERM.
    Interrupted { signal: &'static str },
    /// `--time-limit` (virtual time) was reached.
    TimeLimit { limit: String, limit_cycles: u64 },
    /// `--wall-limit` (host time) was reached.
    WallLimit { limit: String },
    /// `--snapshot-at`: the VM was saved to `file` at `at`.
    Snapshot {
        file: String,
        at: String,
        at_cycles: u64,
    },
    /// `--snapshot-at`: the VM could not be saved.
    SnapshotFailed { message: String },
    /// `--migrate-to`: the VM went to `to` (figures in `migration`).
    Migrated { to: String },
    /// A Linux guest's kernel panicked with `message`.
    Panic { message: String },
}

impl Stop {
    fn new(ending: &Ending) -> Stop {
        match ending {
            Ending::Vm(StopReason::Shutdown { status }) => Stop::Shutdown { status: *status },
            Ending::Vm(StopReason::DebugExit { status }) => Stop::DebugExit { status: *status },
            Ending::Vm(StopReason::PowerOff) => Stop::PowerOff,
            Ending::Vm(StopReason::Error(e)) => Stop::Error {
                message: e.to_string(),
            },
            Ending::Interrupted(signal) => Stop::Interrupted {
                signal: signal.name(),
            },
            Ending::TimeLimit(d) => Stop::TimeLimit {
                limit: format_duration(*d),
                limit_cycles: crate::units::duration_to_cycles(*d),
            },
            Ending::WallLimit(d) => Stop::WallLimit {
                limit: format_duration(*d),
            },
            Ending::Snapshot { path, at } => Stop::Snapshot {
                file: path.display().to_string(),
                at: format_duration(*at),
                at_cycles: crate::units::duration_to_cycles(*at),
            },
            Ending::SnapshotFailed { message } => Stop::SnapshotFailed {
                message: message.clone(),
            },
            Ending::Migrated { to } => Stop::Migrated { to: to.clone() },
            Ending::GuestPanic { message } => Stop::Panic {
                message: message.clone(),
            },
        }
    }
}

#[derive(Serialize)]
pub struct Summary {
    pub stop: Stop,
    /// The process's exit status.
    pub exit_status: u8,
    /// The guest's console output (JSON only: as text it precedes the
    /// summary), decoded as UTF-8 with invalid bytes replaced.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub console: Option<String>,
    #[serde(skip)]
    stop_text: String,
    pub virtual_cycles: u64,
    pub virtual_seconds: f64,
    pub instructions: u64,
    /// Accesses to unassigned MMIO, all vCPUs: reads gave all ones, writes
    /// were dropped (`--strict-mmio` stops the VM instead).
    pub unassigned_mmio: u64,
    pub ept_faults: u64,
    pub guest_frames_allocated: u64,
    pub host_frames_in_use: u64,
    pub host_frames_peak: u64,
    pub ept_tables: u64,
    pub mmu_lock_wait_cycles: u64,
    /// `mmu_lock` over every core that took it (the VMM's thread
    /// included): acquisitions, waits, cache-line transfers, handoffs.
    pub mmu_lock: hv::MmuLockStats,
    /// Faults the fast page fault handled: fixed, found fixed already,
    /// left to the slow path.
    pub fast_pf: FastPfSummary,
    /// `ept` or `shadow`.
    pub mmu: String,
    /// Host CPUs the vCPUs shared (`--host-cpus`), when fewer than the
    /// vCPUs; `null`: one each.
    pub host_cpus: Option<usize>,
    /// Shadow paging's counters.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shadow: Option<hv::ShadowStats>,
    pub exits: BTreeMap<String, ExitSummary>,
    pub memory: MemorySummary,
    pub apf: ApfSummary,
    pub vcpus: Vec<VcpuSummary>,
    pub reports: Vec<ReportLine>,
    /// Memslot changes made while the guest ran (`--memslot-period`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memslot: Option<crate::memslot_churn::MemslotRun>,
    /// Dirty logging of guest RAM (`--dirty-log`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dirty_log: Option<DirtyLogSummary>,
    /// A live migration (`--migrate-to`), done or failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub migration: Option<crate::migrate::precopy::MigrationReport>,
    /// A post-copy destination's figures (`faultline incoming`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub postcopy: Option<crate::migrate::postcopy::PostcopyStats>,
    /// A `--snapshot-at` or `--migrate-at` the run ended before.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_reached: Option<NotReached>,
}

/// A stop point (`--snapshot-at`, `--migrate-at`) the run never reached.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct NotReached {
    /// `--snapshot-at` or `--migrate-at`.
    pub option: &'static str,
    pub at: String,
    pub at_cycles: u64,
    /// The virtual time the run ended at.
    pub ended_cycles: u64,
}

/// What `--dirty-log` collected (virtual time).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct DirtyLogSummary {
    /// `bitmap`, `manual`, `ring` or `pml`.
    pub mode: String,
    pub period_ms: f64,
    /// Collections made (ring: harvests, periodic and on a full ring).
    pub collections: u64,
    /// Pages returned, summed over the collections.
    pub pages: u64,
    /// Get and clear time, summed over the collections.
    pub get_ms: f64,
    pub clear_ms: f64,
    pub ring_full_exits: u64,
    pub pml_full_exits: u64,
}

/// The fast page fault's counters over every vCPU.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct FastPfSummary {
    pub fixed: u64,
    pub spurious: u64,
    pub slow: u64,
}

fn exits(table: &hv::stats::ExitTable) -> BTreeMap<String, ExitSummary> {
    table
        .iter()
        .map(|(k, v)| {
            (
                k.to_string(),
                ExitSummary {
                    count: v.count,
                    hv_cycles: v.hv_cycles,
                },
            )
        })
        .collect()
}

impl Summary {
    pub fn new(vm: &Vm, ending: &Ending, exit_status: u8, console: Option<String>) -> Summary {
        let stats = vm.stats();
        Summary {
            stop: Stop::new(ending),
            exit_status,
            console,
            stop_text: ending.describe(),
            virtual_cycles: stats.virtual_cycles,
            virtual_seconds: cycles_to_secs(stats.virtual_cycles),
            instructions: stats.instructions(),
            unassigned_mmio: stats.vcpus.iter().map(|v| v.unassigned_mmio).sum(),
            ept_faults: stats.ept_faults(),
            guest_frames_allocated: stats.vcpus.iter().map(|v| v.frames_allocated).sum(),
            host_frames_in_use: stats.frames_in_use,
            host_frames_peak: stats.frames_peak,
            ept_tables: stats.ept_tables,
            mmu_lock_wait_cycles: stats.vcpus.iter().map(|v| v.mmu_lock_wait_cycles).sum(),
            mmu_lock: stats.mmu_lock,
            fast_pf: FastPfSummary {
                fixed: stats.vcpus.iter().map(|v| v.fast_pf_fixed).sum(),
                spurious: stats.vcpus.iter().map(|v| v.fast_pf_spurious).sum(),
                slow: stats.vcpus.iter().map(|v| v.fast_pf_slow).sum(),
            },
            mmu: stats.mmu.to_string(),
            host_cpus: stats.host_cpus,
            shadow: stats.shadow,
            exits: exits(&stats.exits()),
            memory: MemorySummary {
                host_mem_pages: stats.host_mem_pages,
                resident_pages: stats.resident_pages,
                swap_device: stats.device_desc.clone(),
                pager: stats.pager,
                swap_reads: stats.device.reads,
                swap_writes: stats.device.writes,
                mean_read_wait_cycles: stats.device.read_wait_cycles / stats.device.reads.max(1),
                max_read_wait_cycles: stats.device.max_read_wait_cycles,
                swap_read_inversions: stats.device.read_inversions,
                swap_write_inversions: stats.device.write_inversions,
            },
            apf: {
                let a = stats.apf();
                ApfSummary {
                    mode: stats.apf_mode.to_string(),
                    protocol: stats.apf_protocol.to_string(),
                    not_present_sent: a.not_present,
                    ready_sent: a.ready,
                    wake_all_sent: a.wake_all,
                    halts: a.halts,
                    halt_cycles: a.halt_cycles,
                    stalls: a.stalls,
                    stall_cycles: a.stall_cycles,
                    peak_outstanding: a.peak_outstanding,
                    repeat_faults: a.repeat_faults,
                    acks_received: a.acks,
                }
            },
            vcpus: stats
                .vcpus
                .iter()
                .enumerate()
                .map(|(id, v)| VcpuSummary {
                    id,
                    cycles: v.cycles,
                    instructions: v.instructions,
                    busy_cycles: v.busy_cycles,
                    idle_cycles: v.idle_cycles,
                    utilization: v.utilization(stats.virtual_cycles),
                    ept_faults: v.ept_faults,
                    mmu_lock_wait_cycles: v.mmu_lock_wait_cycles,
                    mmu_lock_acquisitions: v.mmu_lock_acquisitions,
                    mmu_lock_contended: v.mmu_lock_contended,
                    halts: v.halts,
                    ipis_sent: v.ipis_sent,
                    apf: v.apf,
                    cr3: v.cr3_cache,
                    steal: StealSummary {
                        steal_cycles: v.steal_cycles,
                        steal_ns: hv::Cycles(v.steal_cycles).as_ns(),
                        reported_ns: v.steal_reported_ns,
                        preemptions: v.preemptions,
                        pv_tlb_flushes: v.pv_tlb_flushes,
                        ipis_received: v.ipis_received,
                        ipis_received_preempted: v.ipis_received_preempted,
                        sched_yields: v.sched_yields,
                        sched_yields_directed: v.sched_yields_directed,
                        kicks_sent: v.kicks_sent,
                    },
                    pv: PvSummary {
                        send_ipi_calls: v.pv_send_ipi_calls,
                        eoi_offered: v.pv_eoi_offered,
                        eois: v.pv_eois,
                    },
                    exits: exits(&v.exits),
                })
                .collect(),
            reports: vm
                .reports()
                .iter()
                .map(|r| ReportLine {
                    vcpu: r.vcpu,
                    cycles: r.cycles,
                    line: r.line.clone(),
                })
                .collect(),
            memslot: None,
            dirty_log: None,
            migration: None,
            postcopy: None,
            not_reached: None,
        }
    }

    pub fn to_json(&self) -> String {
        let mut s =
            serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"));
        s.push('\n');
        s
    }

    pub fn to_text(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "--- faultline summary ---");
        let _ = writeln!(s, "stopped:      {}", self.stop_text);
        if let Some(n) = &self.not_reached {
            let _ = writeln!(
                s,
                "not reached:  {} {}: the run ended at {:.6} s",
                n.option,
                n.at,
                cycles_to_secs(n.ended_cycles)
            );
        }
        let _ = writeln!(
            s,
            "virtual time: {:.6} s ({} cycles)",
            self.virtual_seconds, self.virtual_cycles
        );
        let _ = writeln!(s, "instructions: {}", self.instructions);
        if self.unassigned_mmio != 0 {
            let _ = writeln!(
                s,
                "unassigned MMIO: {} accesses (reads all ones, writes dropped)",
                self.unassigned_mmio
            );
        }
        let _ = writeln!(
            s,
            "EPT faults:   {} ({} guest frames allocated; host frames in use {}, peak {}, EPT tables {})",
            self.ept_faults,
            self.guest_frames_allocated,
            self.host_frames_in_use,
            self.host_frames_peak,
            self.ept_tables
        );
        let l = &self.mmu_lock;
        let _ = writeln!(
            s,
            "mmu_lock:     {} cycles waited by vCPUs; taken {} times, {} contended, \
             {} line transfers, {} cycles of handoffs; {} overlapping holds, \
             {} requests served after a later one",
            self.mmu_lock_wait_cycles,
            l.acquisitions,
            l.contended,
            l.line_transfers,
            l.handoff_cycles,
            l.overlaps,
            l.inversions
        );
        let f = &self.fast_pf;
        let _ = writeln!(
            s,
            "fast PF:      {} fixed without mmu_lock, {} spurious, {} to the slow path",
            f.fixed, f.spurious, f.slow
        );
        let _ = writeln!(s, "mmu:          {}", self.mmu);
        if let Some(n) = self.host_cpus {
            let steal: u64 = self.vcpus.iter().map(|v| v.steal.steal_cycles).sum();
            let _ = writeln!(
                s,
                "host CPUs:    {n} for {} vCPUs; steal {:.3} ms in all",
                self.vcpus.len(),
                cycles_to_secs(steal) * 1e3
            );
        }
        if let Some(sh) = &self.shadow {
            let l = sh.pages_by_level;
            let _ = writeln!(
                s,
                "shadow:       pages by level 1/2/3/4 {}/{}/{}/{}, {} unsync now ({} went unsync, {} syncs); tracked writes {} emulated, {} unprotected",
                l[0], l[1], l[2], l[3], sh.unsync_pages, sh.unsynced, sh.syncs, sh.wp_emulated, sh.wp_unprotected
            );
            let _ = writeln!(
                s,
                "              roots {} built, {} reused, {} prev-root hits; {} guest #PFs injected; {} pages zapped",
                sh.roots_built, sh.roots_reused, sh.prev_root_hits, sh.guest_pf_injected, sh.pages_zapped
            );
        }
        if let Some(m) = &self.memslot {
            let _ = writeln!(
                s,
                "memslots:     {} deletes + re-adds (zap {}): {:.3} ms each, {} pages zapped, {} lock breaks; longest vCPU stall {:.1} us, {} root reloads",
                m.ops.len(),
                m.zap,
                m.op_ms(),
                m.pages_zapped(),
                m.lock_breaks(),
                m.max_stall_us(),
                m.root_reloads
            );
        }
        if let Some(m) = &self.migration {
            let _ = writeln!(
                s,
                "migration:    {} to {}: {} rounds, {} pages ({} bytes) sent, {} in the last round; pre-copy {:.3} ms, downtime {:.3} ms, total {:.3} ms; dirty log {:.3} ms{}",
                m.mode,
                m.to,
                m.rounds,
                m.pages_sent,
                m.bytes_sent,
                m.final_pages,
                m.precopy_ms,
                m.downtime_ms,
                m.total_ms,
                m.dirty_log_get_ms,
                m.failed
                    .as_ref()
                    .filter(|_| m.postcopy.is_none())
                    .map(|f| format!("; FAILED: {f} (the VM went on here)"))
                    .unwrap_or_default()
            );
            if m.rounds > 0 {
                let g = &m.guest_during_precopy;
                let _ = writeln!(
                    s,
                    "pre-copy:     the guest ran {} instructions; its vCPUs were busy {:.3} ms, \
                     stalled on page reads {:.3} ms, idle or preempted {:.3} ms",
                    g.instructions, g.busy_ms, g.stalled_ms, g.idle_ms
                );
            }
            if let Some(p) = &m.postcopy {
                let _ = writeln!(
                    s,
                    "post-copy:    {} pages after the switch-over, {:.3} ms on the link, {} reconnects{}",
                    p.pages,
                    p.postcopy_ms,
                    p.reconnects,
                    m.failed
                        .as_ref()
                        .map(|f| format!("; FAILED: {f}"))
                        .unwrap_or_default()
                );
            }
        }
        if let Some(p) = &self.postcopy {
            let _ = writeln!(
                s,
                "post-copy:    {} pages to come: {} requested, {} touched after their arrival, {} touches waited {:.3} ms in all; all here {:.3} ms after the switch-over; {} reconnects",
                p.pages,
                p.requested,
                p.touched_present,
                p.waited,
                p.wait_ms,
                p.complete_ms,
                p.reconnects
            );
        }
        if let Some(d) = &self.dirty_log {
            let _ = writeln!(
                s,
                "dirty log:    {} every {:.3} ms: {} collections, {} pages; get {:.3} ms, clear {:.3} ms in all; {} ring-full exits, {} PML-full exits",
                d.mode,
                d.period_ms,
                d.collections,
                d.pages,
                d.get_ms,
                d.clear_ms,
                d.ring_full_exits,
                d.pml_full_exits
            );
        }
        let m = &self.memory;
        let _ = writeln!(
            s,
            "host memory:  {} pages pool, {} resident; {} evictions ({} written, {} clean drops), {} swap-ins, {} batches",
            m.host_mem_pages,
            m.resident_pages,
            m.pager.evictions,
            m.pager.swap_outs,
            m.pager.clean_drops,
            m.pager.swap_ins,
            m.pager.batches
        );
        if m.swap_reads + m.swap_writes > 0 {
            let _ = writeln!(
                s,
                "swap device:  {}; {} reads (mean wait {} cycles, max {}, {} served after a later one), {} writes ({} served after a later one)",
                m.swap_device,
                m.swap_reads,
                m.mean_read_wait_cycles,
                m.max_read_wait_cycles,
                m.swap_read_inversions,
                m.swap_writes,
                m.swap_write_inversions
            );
        }
        let a = &self.apf;
        let _ = writeln!(
            s,
            "async PF:     --apf {} ({}): {} not-present, {} ready ({} wake-all, {} acked), {} halts ({} cycles), {} stalls ({} cycles), peak outstanding {}",
            a.mode,
            a.protocol,
            a.not_present_sent,
            a.ready_sent,
            a.wake_all_sent,
            a.acks_received,
            a.halts,
            a.halt_cycles,
            a.stalls,
            a.stall_cycles,
            a.peak_outstanding
        );
        let _ = writeln!(s, "exits:");
        for (name, e) in &self.exits {
            let _ = writeln!(
                s,
                "  {name:<20} {:>12} exits {:>14} hv cycles",
                e.count, e.hv_cycles
            );
        }
        let _ = writeln!(s, "vCPUs:");
        for v in &self.vcpus {
            let exits: u64 = v.exits.values().map(|e| e.count).sum();
            let _ = writeln!(
                s,
                "  vcpu {:<3} {:>6.1}% busy {:>14} instructions {:>10} exits {:>8} EPT faults {:>6} halts | apf {} np {} ready {} halts {} stall cycles",
                v.id,
                v.utilization * 100.0,
                v.instructions,
                exits,
                v.ept_faults,
                v.halts,
                v.apf.not_present,
                v.apf.ready,
                v.apf.halts,
                v.apf.stall_cycles
            );
            if v.mmu_lock_acquisitions > 0 {
                let _ = writeln!(
                    s,
                    "           mmu_lock: taken {} times, {} contended ({:.1} %), {} cycles waited",
                    v.mmu_lock_acquisitions,
                    v.mmu_lock_contended,
                    v.mmu_lock_contended as f64 * 100.0 / v.mmu_lock_acquisitions as f64,
                    v.mmu_lock_wait_cycles
                );
            }
            let pv = &v.pv;
            if pv.send_ipi_calls + pv.eoi_offered > 0 {
                let _ = writeln!(
                    s,
                    "           pv: {} send-IPI hypercalls, PV EOI flag set at {} entries, {} EOIs done by the hv",
                    pv.send_ipi_calls, pv.eoi_offered, pv.eois
                );
            }
            let st = &v.steal;
            if self.host_cpus.is_some() {
                let _ = writeln!(
                    s,
                    "           steal: {:.3} ms ({:.1}%), {} preemptions, {} PV TLB flushes, {} IPIs received ({} while preempted), {} yields ({} directed), {} kicks sent",
                    cycles_to_secs(st.steal_cycles) * 1e3,
                    st.steal_cycles as f64 * 100.0 / self.virtual_cycles.max(1) as f64,
                    st.preemptions,
                    st.pv_tlb_flushes,
                    st.ipis_received,
                    st.ipis_received_preempted,
                    st.sched_yields,
                    st.sched_yields_directed,
                    st.kicks_sent
                );
            }
            let c = &v.cr3;
            if self.mmu == "shadow" {
                let _ = writeln!(
                    s,
                    "           cr3: {} load exits; cache {} entries added, {} exitless switches seen, {} dropped, {} stale loads",
                    c.cr3_load_exits, c.entries_added, c.switches_seen, c.entries_dropped, c.stale_loads
                );
            }
        }
        if !self.reports.is_empty() {
            let _ = writeln!(s, "reports:");
            for r in &self.reports {
                let line = escape_controls(&r.line);
                let _ = writeln!(s, "  vcpu {} @{}: {line}", r.vcpu, r.cycles);
            }
        }
        s
    }
}

/// `line` with control characters (NUL, escape sequences, newlines...)
/// written as escapes, so a guest's report cannot garble the summary or
/// the terminal.
pub fn escape_controls(line: &str) -> String {
    line.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::escape_controls;

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(escape_controls("a=1 b=\"x\""), "a=1 b=\"x\"");
        assert_eq!(
            escape_controls("nul\0 esc\x1b[2J\n"),
            "nul\\u{0} esc\\u{1b}[2J\\n"
        );
        assert_eq!(escape_controls("µs"), "µs");
    }
}
