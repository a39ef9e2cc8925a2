//! Virtual-cycle charges for hypervisor work.
//!
//! The machine charges guest execution, page walks and VM entry/exit
//! transitions (`machine::cost`). What the hypervisor does between an exit
//! and the next entry is charged here, from this one table, with
//! `Cpu::advance_cycles` on the vCPU that did the work. Comparisons between
//! mechanisms (later: fast page fault, async page faults) then come from the
//! work each one does, not from host wall time.
//!
//! Figures are round numbers of the right order for KVM on a 3 GHz core.
//! `docs/costs.md` lists every entry with the source read for it, or
//! `faultline calibrate`'s measurement, or that it has neither.

use machine::NamedCosts;

/// Cycle charges of hypervisor primitives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HvCosts {
    /// Fixed software cost of dispatching any exit in the hv (reading the
    /// exit reason and qualification, the handler call, the checks before
    /// the next entry). No measurement of KVM's in-kernel exit dispatch
    /// alone was found; what bounds it: the one found (the LKML thread
    /// cited at `machine::CycleCosts::vm_exit`, timing KVM's SVM run loop
    /// with the TSC) puts all of KVM's software around one VMRUN at 576 +
    /// 576 = 1,152 cycles, including the ioctl entry and the return to
    /// user space that an exit handled in the kernel does not take. 300
    /// is an estimate inside [0, 1,152]. Whole in-kernel round trips (Linux
    /// commit b7ffc44d5b2e: "cpuid 1291", "vmcall 1181", "outl_to_kernel
    /// 1391" cycles) leave under 200 for dispatch and handler together
    /// beside two 600-cycle transitions, where this table has 400
    /// (`docs/costs.md`). Single steps of KVM's exit path print their own
    /// cost (a CR2 reload, Linux commit d3edefc00356: "Shaves 70 cycles
    /// off the vmexit latency"; the FPU's save and restore, 7807fa6ca5af:
    /// "~100 cycles"). No guest-timed test can split it from the
    /// transitions: every exit a guest times is a round trip of both.
    /// `bench ctxsw`'s acceptance ratios,
    /// which rest on it, hold at 0 and at 1,152 (`docs/mmu.md`, "How much the
    /// ratios rest on the estimates"; the test
    /// `bench_ctxsw_acceptance_holds_across_the_exit_cost_range`), and
    /// `--cost exit_base=N` runs any benchmark with another figure.
    pub exit_base: u64,
    /// Looking up the memslot of a gfn (binary search over the slots).
    /// Measured: `faultline calibrate`'s `memslot_lookup` (`docs/costs.md`).
    pub memslot_lookup: u64,
    /// Taking a frame from the frame allocator. Measured with
    /// `frame_free`: `faultline calibrate`'s `frame_alloc_free`.
    pub frame_alloc: u64,
    /// Returning a frame to the frame allocator (a zapped MMU page; as
    /// freeing a page to the buddy allocator costs about what taking one
    /// does).
    pub frame_free: u64,
    /// Zeroing a 4 KiB frame (~64 cache lines at ~10 cycles each).
    pub zero_4k: u64,
    /// Copying 4 KiB.
    pub copy_4k: u64,
    /// Writing one spte (an atomic store plus the rmap update). Measured:
    /// `faultline calibrate`'s `spte_write_rmap`.
    pub spte_write: u64,
    /// Reading one paging-structure entry of the EPT tables in software.
    pub spte_read: u64,
    /// Acquiring `mmu_lock` uncontended (an atomic RMW and its fence), its
    /// line in this core's cache (the same core held the lock last).
    pub lock_acquire: u64,
    /// Moving a cache line another core wrote last to this one, on one
    /// die: what a lock's atomic costs when another core held the lock
    /// last (instead of `lock_acquire`), and each of the steps of a
    /// contended ticket lock's handoff (`mmu::lock::handoff_cycles`).
    /// David, Guerraoui, Trigonakis, "Everything You Always Wanted to Know
    /// About Synchronization but Were Afraid to Ask", SOSP 2013, Table 2:
    /// on the Intel Xeon (Westmere-EX E7-8867L), a load of a line Modified
    /// in another core of the same die takes 109 cycles, and the atomic
    /// operations on such a line cost about the same (their CAS/FAI/SWAP
    /// rows); their ccbench tool's published sample run (the ccbench
    /// README, load from modified between two cores, Westmere-EX fence
    /// settings) averages 112.3 on the loading core (its 111.5 is the
    /// other core's store). 110. Of these only the README was opened
    /// (`docs/costs.md`); `faultline calibrate` measures the host's. The
    /// same-die figure: the seed's
    /// x11perf host (an i5-2540M) is one die, and a 6-core X5690 die
    /// holds the 6 vCPUs of `bench dirty-log` (the table's cross-socket
    /// figures are far higher; `docs/mmu.md` shows how much the result
    /// rests on this one). Only lines another
    /// core wrote are charged: like the rest of this table, no capacity
    /// miss (a line evicted to the shared L3) is.
    pub line_transfer: u64,
    /// A `lock cmpxchg` on an spte (the fast page fault's fix, access
    /// tracking's aging): about 20 cycles on an uncontended line in cache
    /// (Agner Fog, "Instruction tables", LOCK CMPXCHG on Skylake: 18-20
    /// cycles), the same order as `lock_acquire`'s atomic RMW.
    pub spte_cmpxchg: u64,
    /// Handling a hypercall beyond `exit_base` (argument decoding). Only
    /// the whole round trip has a source: Linux commit b7ffc44d5b2e
    /// ("x86/kvm/vmx: Defer TR reload after VM exit") prints
    /// kvm-unit-tests' "vmcall 1181" cycles for an exit, KVM's handling
    /// (of hypercall 0, the least a handler does) and the entry, where
    /// this table's sum is 1,600 (`docs/costs.md`); `faultline
    /// calibrate`'s `kvm_vmcall_exit` measures the same where the host's
    /// KVM runs the guest on the CPU. The baseline of `io_emulation`'s and
    /// `cpuid_msr`'s sourced differences.
    pub hypercall: u64,
    /// Emulating a port I/O access to a device model. Inside a whole round
    /// trip: the same commit's "outl_to_kernel 1391" (a device in the
    /// kernel), 210 cycles above its "vmcall 1181", where this table has
    /// `io_emulation` 100 above `hypercall` (`docs/costs.md`: the sourced
    /// difference gives 310). `faultline calibrate`'s `kvm_pio_kernel_exit`
    /// measures the in-kernel write (minus `kvm_vmcall_exit`: the
    /// difference), `kvm_pio_exit` an exit to user space and back.
    pub io_emulation: u64,
    /// Emulating CPUID or an MSR access. Inside a whole round trip: the
    /// same commit's "cpuid 1291", 110 cycles above its "vmcall 1181",
    /// where this table has `cpuid_msr` equal to `hypercall`
    /// (`docs/costs.md`: the sourced difference gives 210); `faultline
    /// calibrate`'s `kvm_cpuid_exit` and `kvm_rdmsr_exit` (minus
    /// `kvm_vmcall_exit`: the difference).
    pub cpuid_msr: u64,
    /// Injecting an event (filling the entry interruption field): KVM's
    /// `vmx_inject_irq` does it with one VMWRITE of
    /// VM_ENTRY_INTR_INFO_FIELD (and one of VM_ENTRY_INSTRUCTION_LEN for a
    /// software interrupt), and Linux commit 5a8781607e67 ("KVM: nVMX:
    /// Cache host_rsp on a per-VMCS basis") prices "two VMWRITEs (~55
    /// cycles)". 50 is the two-VMWRITE figure.
    pub event_injection: u64,
    /// Issuing an INVEPT. No source and no measurement: see `invvpid`.
    pub invept: u64,
    /// Issuing an INVVPID: priced as INVEPT (both drop one context's
    /// cached translations). Under shadow paging every CR3 load that exits
    /// ends in one (KVM's `vmx_flush_tlb_current` after `kvm_mmu_new_pgd`):
    /// the flush the guest's non-PCID MOV to CR3 asks for. No published
    /// latency of INVVPID or INVEPT was found (`docs/costs.md` lists what
    /// was searched), and neither can be measured by `faultline
    /// calibrate` on any host: they execute in VMX root only (the host
    /// kernel), and a guest's exits to KVM. A kernel module on a VMX host
    /// could time them. An estimate of the order of a serializing
    /// instruction plus the TLB invalidation; the refill that follows is
    /// charged by the machine's page walks, not here. `bench ctxsw`'s
    /// ratios hold from 0 to 1,000 (five times the estimate; see
    /// `exit_base`).
    pub invvpid: u64,
    /// Submitting a swap I/O request (building and queueing it).
    /// `faultline calibrate`'s `host_read_4k` measures a synchronous 4 KiB
    /// read from the page cache, its upper bound.
    pub io_submit: u64,
    /// The host side of a fault's frame lookup on a resident page (KVM's
    /// `hva_to_pfn` → `hva_to_pfn_fast` → GUP-fast,
    /// `virt/kvm/kvm_main.c` and `mm/gup.c`), which the slow path does
    /// before taking `mmu_lock` and the fast path skips (seed 001: "it
    /// fixes page fault in the front of gfn_to_pfn, it means no host page
    /// table walking"). Step by step: the lockless walk of the host's
    /// 4-level page table plus GUP-fast's re-read of the PTE after taking
    /// the reference and its read of the page's flags, 6 memory
    /// references at the machine's paging-structure price
    /// (`machine::cost::CycleCosts::page_walk_ref`, 5: 30); interrupts
    /// off and on around the walk (`local_irq_save`/`restore`: PUSHF, CLI,
    /// STI, a few µops each, about 10 cycles together in Agner Fog's
    /// "Instruction tables" for Skylake); and the page reference
    /// (`try_grab_folio`: a LOCK-prefixed add on the refcount, 18-20
    /// cycles on an uncontended line, Agner Fog, LOCK XADD / ADD m,r on
    /// Skylake: 20). 30 + 10 + 20.
    pub host_pfn_lookup: u64,
    /// Dropping that reference once the spte is set (KVM's
    /// `kvm_release_pfn_clean` → `put_page`): a LOCK-prefixed decrement of
    /// the refcount (Agner Fog, Skylake: 18-20). In the seed's KVM (3.x,
    /// `mmu_set_spte`) it runs inside `mmu_lock`, so it is part of the
    /// hold.
    pub host_page_release: u64,
    /// `mmu_notifier_retry`: re-reading `kvm->mmu_notifier_seq` (and
    /// `mmu_notifier_count`) under `mmu_lock` and comparing with the value
    /// read before the frame lookup: two loads of a line in L1 (4-5
    /// cycles each, Intel's optimization manual, Skylake L1D latency).
    pub mmu_notifier_check: u64,
    /// Setting a page's bit in a memslot's dirty bitmap (KVM's
    /// `mark_page_dirty_in_slot` → `set_bit_le`): a LOCK BTS / LOCK OR on
    /// the bitmap word (Agner Fog, Skylake: 18-20). In the seed's KVM the
    /// slow path does it (with `mark_page_dirty`'s memslot lookup) inside
    /// `mmu_lock`, from `set_spte`; the fast path after its cmpxchg.
    pub dirty_bit_set: u64,
}

impl HvCosts {
    /// An IPI's (or kick's) flight, in cycles after the sender's exit:
    /// the hv's dispatch of the exit (`exit_base`) up to the handler that
    /// sends it, then the notification crossing to the target's core,
    /// priced as one cache-line transfer (`line_transfer`: the
    /// posted-interrupt descriptor's line the sender wrote and the target
    /// reads, Intel SDM Vol. 3C, "Posted-Interrupt Processing"). The
    /// target then takes the interrupt in guest mode, which the machine
    /// charges as any interrupt delivery.
    pub fn ipi_latency(&self) -> u64 {
        self.exit_base + self.line_transfer
    }

    /// The default table (see the field docs).
    pub const DEFAULT: HvCosts = HvCosts {
        exit_base: 300,
        memslot_lookup: 40,
        frame_alloc: 100,
        frame_free: 100,
        zero_4k: 600,
        copy_4k: 700,
        spte_write: 20,
        spte_read: 5,
        lock_acquire: 25,
        line_transfer: 110,
        spte_cmpxchg: 20,
        hypercall: 100,
        io_emulation: 200,
        cpuid_msr: 100,
        event_injection: 50,
        invept: 200,
        invvpid: 200,
        io_submit: 1000,
        host_pfn_lookup: 60,
        host_page_release: 20,
        mmu_notifier_check: 10,
        dirty_bit_set: 20,
    };
}

impl Default for HvCosts {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl NamedCosts for HvCosts {
    fn entries_mut(&mut self) -> Vec<(&'static str, &mut u64)> {
        let HvCosts {
            exit_base,
            memslot_lookup,
            frame_alloc,
            frame_free,
            zero_4k,
            copy_4k,
            spte_write,
            spte_read,
            lock_acquire,
            line_transfer,
            spte_cmpxchg,
            hypercall,
            io_emulation,
            cpuid_msr,
            event_injection,
            invept,
            invvpid,
            io_submit,
            host_pfn_lookup,
            host_page_release,
            mmu_notifier_check,
            dirty_bit_set,
        } = self;
        vec![
            ("exit_base", exit_base),
            ("memslot_lookup", memslot_lookup),
            ("frame_alloc", frame_alloc),
            ("frame_free", frame_free),
            ("zero_4k", zero_4k),
            ("copy_4k", copy_4k),
            ("spte_write", spte_write),
            ("spte_read", spte_read),
            ("lock_acquire", lock_acquire),
            ("line_transfer", line_transfer),
            ("spte_cmpxchg", spte_cmpxchg),
            ("hypercall", hypercall),
            ("io_emulation", io_emulation),
            ("cpuid_msr", cpuid_msr),
            ("event_injection", event_injection),
            ("invept", invept),
            ("invvpid", invvpid),
            ("io_submit", io_submit),
            ("host_pfn_lookup", host_pfn_lookup),
            ("host_page_release", host_page_release),
            ("mmu_notifier_check", mmu_notifier_check),
            ("dirty_bit_set", dirty_bit_set),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::HvCosts;

    #[test]
    fn every_entry_can_be_set_by_name() {
        machine::cost::check_named_costs(HvCosts::DEFAULT);
    }
}
