//! Memslot changes while a guest runs: [`SlotChurn`] deletes and re-adds
//! a slot, and [`MemslotRun`] records what each change cost. `faultline
//! run --memslot-period` drives it, and so does `bench memslot`.
//!
//! The slot the VMM deletes and re-adds is a small one above guest RAM
//! that the guest never touches, as a VMM remapping a device region does:
//! deleting any slot drops every mapping of the VM (zap-all), so the
//! guest's own memory refaults afterwards while its contents stay where
//! they are.

use crate::units::cycles_to_secs;
use hv::{Cycles, Gpa, MemslotError, SlotFlags, SlotId, Vm, ZapMode};
use serde::{Deserialize, Serialize};

/// The slot the VMM deletes and re-adds.
pub const CHURN_SLOT: SlotId = SlotId(1);
/// Its size.
pub const CHURN_SLOT_SIZE: u64 = 2 << 20;

/// The report key the guest's `touchloop` sends after each pass.
const PASS_KEY: &str = "touchloop_pass";

/// When the VMM changes the slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChurnTrigger {
    /// After each pass the guest reports (`touchloop_pass=N`): op k once
    /// pass k is done, so each op is followed by a pass that refaults the
    /// whole array.
    GuestPasses,
    /// Every period of virtual time, from the first period on.
    Period(Cycles),
}

/// One delete + re-add of the slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemslotOp {
    /// Virtual time when it started.
    pub at_cycles: u64,
    /// The operation's virtual time (the VMM thread's, start to end).
    pub op_cycles: u64,
    pub pages_zapped: u64,
    pub sptes_zapped: u64,
    pub lock_breaks: u64,
    /// Fault exits (EPT violations; under shadow, #PF exits) from this op
    /// to the next (or the end), all vCPUs.
    pub refaults: u64,
    /// Their cost: the hv's handling plus the VM exit and entry, summed
    /// over vCPUs.
    pub refault_cycles: u64,
    /// A seed zap (`--zap seed`): bytes of hash table and rmaps zeroed
    /// under the lock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed_bytes_zeroed: Option<u64>,
}

/// The memslot changes of one run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemslotRun {
    pub zap: String,
    pub ops: Vec<MemslotOp>,
    /// The longest single stall any vCPU had from a zap (a wait behind
    /// its teardown holds, or a root reload).
    pub max_vcpu_stall_cycles: u64,
    /// Every vCPU's stalls from zaps, summed.
    pub total_vcpu_stall_cycles: u64,
    pub root_reloads: u64,
}

impl MemslotRun {
    /// The mean of `f` over the ops (0 without ops).
    pub fn mean(&self, f: impl Fn(&MemslotOp) -> u64) -> f64 {
        self.ops.iter().map(|o| f(o) as f64).sum::<f64>() / self.ops.len().max(1) as f64
    }

    /// Mean operation time in virtual milliseconds.
    pub fn op_ms(&self) -> f64 {
        self.mean(|o| o.op_cycles) / hv::CYCLES_PER_SECOND as f64 * 1e3
    }

    /// Mean refault cost per op in virtual milliseconds (CPU time over
    /// all vCPUs).
    pub fn refault_ms(&self) -> f64 {
        self.mean(|o| o.refault_cycles) / hv::CYCLES_PER_SECOND as f64 * 1e3
    }

    pub fn max_stall_us(&self) -> f64 {
        cycles_to_secs(self.max_vcpu_stall_cycles) * 1e6
    }

    /// Pages zapped per op (the mean, rounded down).
    pub fn pages_zapped(&self) -> u64 {
        self.mean(|o| o.pages_zapped) as u64
    }

    /// Bytes a seed zap zeroed under the lock per op (the mean, rounded
    /// down; 0 for the other modes).
    pub fn seed_bytes_zeroed(&self) -> u64 {
        self.mean(|o| o.seed_bytes_zeroed.unwrap_or(0)) as u64
    }

    /// Lock breaks per op (the mean, rounded down).
    pub fn lock_breaks(&self) -> u64 {
        self.mean(|o| o.lock_breaks) as u64
    }
}

/// The exits a refault takes: an EPT violation, or under shadow paging the
/// guest #PF intercepted through the exception bitmap (the only exception
/// it intercepts; once the array is touched the guest takes no #PF of its
/// own).
const FAULT_EXITS: [&str; 2] = ["ept_violation", "exception"];

/// Fault-exit totals over every vCPU.
#[derive(Debug, Clone, Copy, Default)]
pub struct FaultTotals {
    pub count: u64,
    /// The hv's handling.
    pub hv_cycles: u64,
    /// The VM exit and entry transitions.
    pub exit_cycles: u64,
}

impl FaultTotals {
    fn cycles(&self) -> u64 {
        self.hv_cycles + self.exit_cycles
    }
}

pub fn fault_totals(vm: &Vm) -> FaultTotals {
    let mut totals = FaultTotals::default();
    for (vcpu, stats) in vm.vcpus().iter().zip(vm.stats().vcpus) {
        let costs = vcpu.cpu().costs();
        for stat in FAULT_EXITS.iter().filter_map(|name| stats.exits.get(name)) {
            totals.count += stat.count;
            totals.hv_cycles += stat.hv_cycles;
            totals.exit_cycles += stat.count * (costs.vm_exit + costs.vm_entry);
        }
    }
    totals
}

/// Deletes and re-adds [`CHURN_SLOT`] while a guest runs, recording
/// each operation.
pub struct SlotChurn {
    trigger: ChurnTrigger,
    wanted: u32,
    base: Gpa,
    ops: Vec<MemslotOp>,
    /// Passes the guest has reported done, and the reports read so far.
    passes: u64,
    reports_read: usize,
    /// Faults at the last op.
    since: FaultTotals,
    error: Option<MemslotError>,
}

impl SlotChurn {
    /// Adds the slot (just above guest RAM) to a booted VM.
    pub fn install(vm: &mut Vm, trigger: ChurnTrigger, ops: u32) -> Result<Self, MemslotError> {
        let base = Gpa(vm.mem_size());
        vm.add_memslot(CHURN_SLOT, base, CHURN_SLOT_SIZE, SlotFlags::default())?;
        Ok(SlotChurn {
            trigger,
            wanted: ops,
            base,
            ops: Vec::new(),
            passes: 0,
            reports_read: 0,
            since: FaultTotals::default(),
            error: None,
        })
    }

    /// Does the next operation if it is due (call between slices).
    pub fn after_slice(&mut self, vm: &mut Vm) {
        for report in &vm.reports()[self.reports_read..] {
            for kv in report.line.split_whitespace() {
                if let Some(n) = kv.strip_prefix(PASS_KEY).and_then(|v| v.strip_prefix('=')) {
                    self.passes = self.passes.max(n.parse().unwrap_or(0));
                }
            }
        }
        self.reports_read = vm.reports().len();
        if self.error.is_some() || self.ops.len() as u32 >= self.wanted {
            return;
        }
        let next = self.ops.len() as u64 + 1;
        let due = match self.trigger {
            ChurnTrigger::GuestPasses => self.passes >= next,
            ChurnTrigger::Period(period) => vm.time().0 >= period.0.saturating_mul(next),
        };
        if due {
            if let Err(e) = self.change(vm) {
                self.error = Some(e);
            }
        }
    }

    fn change(&mut self, vm: &mut Vm) -> Result<(), MemslotError> {
        self.close_window(vm);
        let at = vm.time();
        let report = vm.delete_memslot(CHURN_SLOT)?;
        vm.add_memslot(CHURN_SLOT, self.base, CHURN_SLOT_SIZE, SlotFlags::default())?;
        self.ops.push(MemslotOp {
            at_cycles: at.0,
            op_cycles: report.cycles().0,
            pages_zapped: report.pages_zapped,
            sptes_zapped: report.sptes_zapped,
            lock_breaks: report.lock_breaks,
            refaults: 0,
            refault_cycles: 0,
            seed_bytes_zeroed: report.seed.map(|w| w.bytes_zeroed),
        });
        Ok(())
    }

    /// Charges the faults since the last op to it.
    fn close_window(&mut self, vm: &Vm) {
        let now = fault_totals(vm);
        if let Some(last) = self.ops.last_mut() {
            last.refaults = now.count - self.since.count;
            last.refault_cycles = now.cycles() - self.since.cycles();
        }
        self.since = now;
    }

    /// The run's record, or why an operation failed.
    pub fn finish(mut self, vm: &Vm, zap: ZapMode) -> Result<MemslotRun, MemslotError> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        self.close_window(vm);
        let stats = vm.stats();
        Ok(MemslotRun {
            zap: zap.name().to_string(),
            ops: self.ops,
            max_vcpu_stall_cycles: stats
                .vcpus
                .iter()
                .map(|v| v.zap_stall_max)
                .max()
                .unwrap_or(0),
            total_vcpu_stall_cycles: stats.vcpus.iter().map(|v| v.zap_stall_cycles).sum(),
            root_reloads: stats.vcpus.iter().map(|v| v.root_reloads).sum(),
        })
    }
}
