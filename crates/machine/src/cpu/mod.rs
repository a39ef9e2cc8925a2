//! One CPU: architectural state, the interpreter and the VMX glue.
//!
//! The run loop is a small state machine over [`state::Activity`]:
//! an active CPU executes decoded blocks (straight-line runs of
//! instructions ending at a branch, a serializing instruction or a page end)
//! from a per-CPU code cache; between blocks it checks, in priority order,
//! the cycle limit, a pending VM-entry injection, the interrupt window, host
//! interrupts and local-APIC interrupts. A halted CPU skips virtual time to
//! its next timer deadline instead of spinning.
//!
//! Sub-modules split the interpreter by concern:
//! - [`code_cache`]: decoded blocks keyed by host-physical address.
//! - `access`: linear memory and operand access (translation, splits).
//! - `event`: exception/interrupt delivery through the IDT, double and
//!   triple faults, and the VMX exception-bitmap decision.
//! - `exec`: integer, data-movement and control-flow instructions.
//! - `system`: privileged and system instructions (CRs, MSRs, descriptor
//!   tables, SYSCALL/SYSRET, I/O, CPUID, ...).
//! - `far`: far JMP/CALL/RET and IRET between code segments, far-pointer
//!   loads, real-mode segments.
//! - `legacy`: instructions only 32- and 16-bit code has (PUSHA, BCD, ...).

mod access;
pub mod code_cache;
pub mod debug_regs;
mod event;
pub(crate) mod fast;
pub(crate) mod l1tlb;
mod legacy;
pub mod mce;
mod mmio;
pub use event::has_error_code;
pub use mmio::{MmioEmulation, MmioWrite};
pub use system::{native_cpuid, with_osxsave};
mod exec;
mod far;
pub mod fpu_state;
mod hostfp;
mod hostx87;
mod mmx;
#[cfg(test)]
mod mode_tests;
pub mod snapshot;
mod sse;
pub mod state;
mod system;
#[cfg(test)]
mod tests;
mod translated;
pub mod triple_fault;
mod x87;
pub mod xsave;

use crate::apic::Lapic;
use crate::cost::CycleCosts;
use crate::memory::{MemError, PhysMemory};
use crate::mmu::tlb::{Tlb, TlbConfig};
use crate::vmx::{EventInjection, EventKind, InveptKind, InvvpidKind, VmExit, VmxControls};
use crate::Gva;
use code_cache::{CodeCache, MAX_INSN_LEN};
use iced_x86::Instruction;
use state::{interruptibility, rflags};
pub use state::{Activity, CpuState, Gpr};

/// Construction parameters of a CPU.
#[derive(Debug, Clone)]
pub struct CpuConfig {
    /// x2APIC id (also what CPUID reports).
    pub apic_id: u32,
    pub tlb: TlbConfig,
    /// Sizes of the paging-structure caches (`mmu::psc`; 0 = off). They
    /// save host work only: virtual time is the same with any sizes.
    pub psc: crate::mmu::psc::PscConfig,
    pub costs: CycleCosts,
    /// What runs the guest code: the interpreter or the translator (the
    /// same guest state, memory and cycles either way).
    pub engine: crate::jit::Engine,
}

impl Default for CpuConfig {
    fn default() -> Self {
        CpuConfig {
            apic_id: 0,
            tlb: TlbConfig::default(),
            psc: crate::mmu::psc::PscConfig::default(),
            costs: CycleCosts::DEFAULT,
            engine: crate::jit::Engine::default(),
        }
    }
}

/// Counters kept by the CPU.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CpuStats {
    /// Retired instructions.
    pub instructions: u64,
    /// Exceptions raised (delivered to the guest or exiting).
    pub exceptions: u64,
    /// Interrupts delivered through the IDT.
    pub interrupts: u64,
    /// VM exits (guest mode only).
    pub vm_exits: u64,
    /// VM entries (guest mode only).
    pub vm_entries: u64,
    /// Memory references made by page walks.
    pub page_walk_refs: u64,
    /// Blocks decoded (code-cache misses).
    pub blocks_decoded: u64,
    /// Entries written to the page-modification log.
    pub pml_entries_logged: u64,
}

/// Why an instruction did not complete: an architectural exception to
/// deliver, or something that leaves the CPU (a VM exit or machine error).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FaultKind {
    /// An exception. `cr2` is set for #PF.
    Exception {
        vector: u8,
        error_code: Option<u32>,
        cr2: Option<u64>,
    },
    /// The instruction exits (or the machine could not complete it).
    Exit(VmExit),
}

/// A [`FaultKind`], boxed: faults are rare, and a one-pointer error keeps
/// every `Result<u64, Fault>` of the memory-access hot path in registers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fault(Box<FaultKind>);

impl Fault {
    pub(crate) fn exception(vector: u8) -> Fault {
        Self::exception_with(vector, None, None)
    }
    pub(crate) fn with_code(vector: u8, code: u32) -> Fault {
        Self::exception_with(vector, Some(code), None)
    }
    pub(crate) fn exception_with(vector: u8, error_code: Option<u32>, cr2: Option<u64>) -> Fault {
        Fault(Box::new(FaultKind::Exception {
            vector,
            error_code,
            cr2,
        }))
    }
    pub(crate) fn exit(exit: VmExit) -> Fault {
        Fault(Box::new(FaultKind::Exit(exit)))
    }
    pub(crate) fn kind(&self) -> &FaultKind {
        &self.0
    }
    pub(crate) fn into_kind(self) -> FaultKind {
        *self.0
    }
}

impl From<MemError> for Fault {
    fn from(e: MemError) -> Self {
        Fault::exit(VmExit::MachineError(e))
    }
}

/// Exception vectors.
pub mod vector {
    pub const DE: u8 = 0;
    pub const DB: u8 = 1;
    pub const NMI: u8 = 2;
    pub const BP: u8 = 3;
    pub const OF: u8 = 4;
    pub const BR: u8 = 5;
    pub const UD: u8 = 6;
    pub const NM: u8 = 7;
    pub const DF: u8 = 8;
    pub const TS: u8 = 10;
    pub const NP: u8 = 11;
    pub const SS: u8 = 12;
    pub const GP: u8 = 13;
    pub const PF: u8 = 14;
    pub const MF: u8 = 16;
    pub const AC: u8 = 17;
    pub const MC: u8 = 18;
    pub const XM: u8 = 19;
}

/// Host interrupts waiting for this CPU (a 256-bit pending set: a vector is
/// pending at most once, as with an interrupt controller's request register).
#[derive(Debug, Clone, Copy, Default)]
struct PendingVectors([u64; 4]);

impl PendingVectors {
    fn set(&mut self, v: u8) {
        self.0[(v >> 6) as usize] |= 1 << (v & 63);
    }
    fn highest(&self) -> Option<u8> {
        (0..4)
            .rev()
            .find(|&i| self.0[i] != 0)
            .map(|i| (i as u32 * 64 + 63 - self.0[i].leading_zeros()) as u8)
    }
    fn clear(&mut self, v: u8) {
        self.0[(v >> 6) as usize] &= !(1 << (v & 63));
    }
}

/// One x86-64 CPU.
pub struct Cpu {
    state: CpuState,
    cycles: u64,
    costs: CycleCosts,
    tlb: Tlb,
    apic: Lapic,
    vmx: Option<Box<VmxControls>>,
    injection: Option<EventInjection>,
    /// The event being delivered when the last exit happened (the VMX
    /// IDT-vectoring information): the hv must re-inject it.
    idt_vectoring: Option<EventInjection>,
    host_interrupts: PendingVectors,
    /// The last run in guest mode ended at its cycle limit: the CPU is
    /// paused in guest mode, not exited (see [`Cpu::run`]).
    paused: bool,
    exit_len: u8,
    /// The MMIO access of the instruction that exited on an EPT
    /// violation (`mmio.rs`).
    mmio: Option<mmio::PendingMmio>,
    /// The linear address of the last #PF or EPT violation's access (the
    /// page [`Cpu::emulate_mmio`] routes to the VMM under shadow paging).
    fault_la: Option<u64>,
    /// Set only inside [`Cpu::emulate_mmio`] (`mmio.rs`).
    mmio_emu: Option<Box<mmio::MmioEmu>>,
    stats: CpuStats,
    code: CodeCache,
    /// Target RIP of the instruction being executed (branches set it).
    next_rip: u64,
    /// Set when something between instructions may have become deliverable
    /// (STI, POPF, IRET, APIC writes, posted interrupts, EOI...).
    check_events: bool,
    /// Set when a store hit a page holding cached code.
    code_written: bool,
    /// An IPI or EOI broadcast the APIC produced during the last
    /// instruction: the exit it becomes once the instruction completes.
    pending_apic_exit: Option<VmExit>,
    /// The I/O exit being made is one element of a REP INS/OUTS with more
    /// to go: RIP stays at the instruction (exit length 0).
    string_io_resume: bool,
    /// The I/O exit being made is an INS: `complete_io_in` keeps its
    /// value for the instruction, which runs again and stores it.
    string_in_exit: bool,
    /// The value an INS read from its port, to store at ES:RDI.
    pending_string_in: Option<u32>,
    /// The instruction being run alone loaded RFLAGS.RF (an IRET): RF
    /// stays set for the next instruction instead of being cleared.
    rf_loaded: bool,
    /// The instruction being run alone was SYSCALL or SYSRET: its
    /// single-step trap depends on TF after it only.
    pub(super) tf_after_only: bool,
    /// DR6.B0-B3 of the data and I/O breakpoints the running instruction
    /// met (or a MOV SS before it held back): its #DB trap is due.
    db_pending: u64,
    /// First-level TLB in front of `tlb` (see [`l1tlb`]).
    l1: l1tlb::L1Tlb,
    /// Bumped whenever the first-level TLB's lookup-key context
    /// (`Cpu::key_context`: CR0, CR4, EFER, RFLAGS.AC under SMAP, VPID,
    /// EPTP) may have changed; the next sync compares the context.
    mode_epoch: u64,
    /// Cycle of the next APIC timer expiry (`u64::MAX`: none), refreshed
    /// whenever events are checked (every APIC change requests a check).
    next_timer_cycle: u64,
    /// Arithmetic flags not yet folded into RFLAGS (see [`fast::LazyFlags`]).
    lazy: fast::LazyFlags,
    /// The event whose delivery began the current chain of nested faults.
    chain_first: Option<EventInjection>,
    /// Why the CPU shut down, once it triple-faulted.
    triple_fault: Option<triple_fault::TripleFaultCause>,
    /// The engine running guest code.
    engine: crate::jit::Engine,
    /// Code memory of the translator.
    jit_arena: crate::jit::native::Arena,
    /// The fault of the instruction a translated block stopped at.
    jit_fault: Option<Fault>,
    /// Whole runs of a block before the translator translates it.
    jit_threshold: u32,
    jit_stats: crate::jit::JitStats,
    /// Call-outs by instruction shape (host-side; see `jit::profile`).
    jit_profile: Option<Box<crate::jit::profile::CallOutProfile>>,
    /// While translated code runs: the cycle count at which it must stop
    /// chaining and return to the run loop, min(cycle limit, timer
    /// deadline); 0 once a call-out did something the run loop must look
    /// at before the next block (events, a store into code, an IPI, a mode
    /// change...). One compare per chained block covers all of them.
    jit_deadline: u64,
    /// Nonzero when Rust ran since translated code last checked a
    /// self-loop's fetch (`Emitter::self_loop_exit`): set on every entry
    /// into generated code from Rust and on every return to it from a
    /// call into Rust (`jit::native`), cleared by a back edge whose checks
    /// passed. Only Rust changes what those checks look at (the
    /// first-level iTLB's slots, which translated code fills only at
    /// chaining exits, and a frame's code-write generation), so while it
    /// is clear a loop's back edge skips them. Host side only.
    jit_loop_recheck: u64,
    /// While translated code runs: the run loop's cycle limit (what
    /// `jit_deadline` is recomputed from after an event check made for a
    /// chaining exit, `Cpu::jit_chain_fetch`).
    jit_cycle_limit: u64,
    /// The VM exit an event check made for a chaining exit ended in
    /// (status `FETCH_EXIT`).
    jit_exit: Option<VmExit>,
    /// The RIP of the block translated code ended in (its chaining-table
    /// slot): the block it was started with unless it chained on.
    jit_chain_rip: u64,
    /// Page-crossing blocks translated code chained into (through
    /// `Cpu::jit_chain_crossing`), kept alive until it returns.
    jit_entered: Vec<std::rc::Rc<code_cache::Block>>,
    /// The run loop is running the block after a chaining exit's fetch
    /// (`Cpu::jit_chain_fetch`, status `FETCHED`): no further fetch from
    /// generated code until it returns.
    jit_fetched: bool,
    /// The chaining table and the blocks it keeps alive.
    jit_chain: Box<[crate::jit::ChainEntry]>,
    jit_chain_blocks: Box<[Option<std::rc::Rc<code_cache::Block>>]>,
    /// `PhysMemory::code_writes` when the first-level iTLB's versions were
    /// last renewed for it (`L1Tlb::renew_fetch_versions`).
    jit_code_writes: u64,
    /// `PhysMemory::code_marks` when the write slots were last kept off
    /// frames holding code (`L1Tlb::keep_stores_off_code`).
    jit_code_marks: u64,
    /// Translations asked of the translator thread (`jit::background`),
    /// made on first use.
    jit_pending: Option<crate::jit::background::Pending>,
}

impl std::fmt::Debug for Cpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cpu")
            .field("rip", &format_args!("{:#x}", self.state.rip))
            .field("cycles", &self.cycles)
            .field("guest_mode", &self.vmx.is_some())
            .finish_non_exhaustive()
    }
}

/// What the run loop does next.
enum Step {
    /// Keep executing.
    Continue,
    /// Leave `run` with this exit.
    Exit(VmExit),
}

impl Cpu {
    /// A CPU in the default 64-bit state ([`CpuState::default`]).
    pub fn new(config: CpuConfig) -> Self {
        Cpu {
            state: CpuState::default(),
            cycles: 0,
            costs: config.costs,
            tlb: Tlb::with_psc(config.tlb, config.psc),
            apic: Lapic::new(config.apic_id),
            vmx: None,
            injection: None,
            idt_vectoring: None,
            host_interrupts: PendingVectors::default(),
            paused: false,
            exit_len: 0,
            mmio: None,
            fault_la: None,
            mmio_emu: None,
            stats: CpuStats::default(),
            code: CodeCache::new(),
            next_rip: 0,
            check_events: true,
            code_written: false,
            pending_apic_exit: None,
            string_io_resume: false,
            string_in_exit: false,
            pending_string_in: None,
            rf_loaded: false,
            tf_after_only: false,
            db_pending: 0,
            l1: l1tlb::L1Tlb::new(),
            mode_epoch: 1,
            next_timer_cycle: 0,
            lazy: fast::LazyFlags::NONE,
            chain_first: None,
            triple_fault: None,
            engine: config.engine,
            jit_arena: Default::default(),
            jit_fault: None,
            jit_threshold: translated::TRANSLATE_AFTER_RUNS,
            jit_stats: Default::default(),
            jit_profile: crate::jit::profile::CallOutProfile::from_env(),
            jit_deadline: 0,
            jit_loop_recheck: 1,
            jit_cycle_limit: 0,
            jit_exit: None,
            jit_entered: Vec::new(),
            jit_fetched: false,
            jit_chain_rip: 0,
            jit_chain: vec![crate::jit::ChainEntry::default(); crate::jit::CHAIN_SLOTS]
                .into_boxed_slice(),
            jit_chain_blocks: vec![None; crate::jit::CHAIN_SLOTS].into_boxed_slice(),
            jit_code_writes: 0,
            jit_code_marks: 0,
            jit_pending: None,
        }
    }

    /// After a [`VmExit::TripleFault`]: the event that began the chain of
    /// faults and the one that made the double fault undeliverable.
    pub fn triple_fault_cause(&self) -> Option<triple_fault::TripleFaultCause> {
        self.triple_fault
    }

    /// Architectural state (the VMCS guest-state area, in guest mode).
    pub fn state(&self) -> &CpuState {
        &self.state
    }

    /// Mutable architectural state. Changing CR3 here does not flush the
    /// TLB, as writing the VMCS guest CR3 field does not.
    pub fn state_mut(&mut self) -> &mut CpuState {
        self.check_events = true;
        self.mode_epoch += 1;
        &mut self.state
    }

    /// The cycle counter (virtual time of this CPU).
    pub fn cycles(&self) -> u64 {
        self.cycles
    }

    /// Moves the cycle counter forward (a halted CPU skipping idle time).
    pub fn advance_cycles(&mut self, n: u64) {
        self.cycles = self.cycles.saturating_add(n);
        self.check_events = true;
    }

    /// Counters.
    pub fn stats(&self) -> CpuStats {
        self.stats
    }

    /// The cost table in use.
    pub fn costs(&self) -> &CycleCosts {
        &self.costs
    }

    /// The TSC as the running code sees it (guest TSC in guest mode).
    pub fn tsc(&self) -> u64 {
        let offset = self.vmx.as_ref().map_or(0, |v| v.tsc_offset);
        self.cycles.wrapping_add(offset as u64)
    }

    /// A digest of the architectural state and the cycle counter, for
    /// determinism checks.
    pub fn state_digest(&self) -> u64 {
        let mut h = state::Fnv::default();
        h.u64(self.state.digest());
        h.u64(self.cycles);
        h.u64(self.stats.instructions);
        h.finish()
    }

    /// Enters guest mode with these controls (`Some`), or returns to bare
    /// mode (`None`). Entering or leaving flushes nothing; with VPID 0 the
    /// TLB is flushed on each entry and exit instead.
    pub fn set_vmx(&mut self, controls: Option<VmxControls>) {
        self.end_pause();
        self.mode_epoch += 1;
        self.vmx = controls.map(Box::new);
        self.check_events = true;
    }

    /// The VM-execution controls, in guest mode.
    pub fn vmx(&self) -> Option<&VmxControls> {
        self.vmx.as_deref()
    }

    /// Mutable VM-execution controls.
    pub fn vmx_mut(&mut self) -> Option<&mut VmxControls> {
        self.check_events = true;
        self.mode_epoch += 1;
        self.vmx.as_deref_mut()
    }

    /// Sets the VM-entry event-injection field.
    pub fn inject_event(&mut self, event: EventInjection) {
        self.injection = Some(event);
        self.check_events = true;
    }

    /// The event waiting to be injected on the next entry, if any.
    pub fn pending_injection(&self) -> Option<EventInjection> {
        self.injection
    }

    /// The event whose delivery the last exit interrupted (the VMX
    /// IDT-vectoring information). The hypervisor re-injects it after
    /// handling the exit (e.g. after fixing an EPT violation on the guest
    /// stack during interrupt delivery).
    pub fn idt_vectoring_info(&self) -> Option<EventInjection> {
        self.idt_vectoring
    }

    /// Length of the instruction that caused the last exit.
    pub fn exit_instruction_len(&self) -> u8 {
        self.exit_len
    }

    /// Advances RIP past the instruction that caused the last exit, and
    /// ends STI/MOV-SS blocking as completing an instruction does.
    ///
    /// The instruction completed, so RFLAGS.RF clears, and under
    /// RFLAGS.TF its single-step #DB is queued for the next entry (KVM's
    /// `kvm_skip_emulated_instruction`).
    pub fn skip_instruction(&mut self) {
        self.state.rip = self.state.rip.wrapping_add(self.exit_len as u64);
        self.state.interruptibility = 0;
        self.state.rflags &= !rflags::RF;
        self.exit_len = 0;
        self.check_events = true;
        // I/O breakpoints the instruction met (`exec_io`).
        let hits = std::mem::take(&mut self.db_pending);
        let tf = self.state.rflags & rflags::TF != 0;
        if (tf || hits != 0) && self.injection.is_none() {
            let bs = if tf { debug_regs::DR6_BS } else { 0 };
            let d = &mut self.state.debug;
            d.dr6 = (d.dr6 & !debug_regs::DR6_HITS) | hits | bs | debug_regs::DR6_FIXED_1;
            self.inject_event(EventInjection {
                kind: EventKind::HardwareException,
                vector: vector::DB,
                error_code: None,
                instruction_len: 0,
            });
        }
    }

    /// Completes an `in` that exited: writes AL/AX/EAX with `value` and
    /// skips the instruction. (A 32-bit `in` zero-extends into RAX.)
    pub fn complete_io_in(&mut self, size: u8, value: u32) {
        if std::mem::take(&mut self.string_in_exit) {
            // An INS: the instruction runs again and stores the value.
            self.pending_string_in = Some(value);
            self.exit_len = 0;
            self.check_events = true;
            return;
        }
        let rax = &mut self.state.gpr[0];
        *rax = match size {
            1 => (*rax & !0xff) | (value as u64 & 0xff),
            2 => (*rax & !0xffff) | (value as u64 & 0xffff),
            _ => value as u64,
        };
        self.skip_instruction();
    }

    /// Completes an RDMSR that exited: EDX:EAX = value, skip.
    pub fn complete_rdmsr(&mut self, value: u64) {
        self.state.gpr[Gpr::Rax as usize] = value & 0xffff_ffff;
        self.state.gpr[Gpr::Rdx as usize] = value >> 32;
        self.skip_instruction();
    }

    /// A host (external) interrupt arrives at this CPU. In guest mode with
    /// external-interrupt exiting it causes a VM exit at the next
    /// instruction boundary; otherwise it is delivered through the IDT when
    /// RFLAGS.IF allows.
    pub fn post_external_interrupt(&mut self, vector: u8) {
        self.host_interrupts.set(vector);
        self.check_events = true;
    }

    /// An INIT signal (an IPI with delivery mode INIT): the CPU takes the
    /// INIT state (real mode, [`CpuState::real_mode_at`]; x87/SSE state
    /// and the APIC id kept, the APIC reset) and waits for a startup IPI.
    /// Pending events are dropped; the TLB and decoded code are flushed.
    pub fn receive_init(&mut self) {
        self.end_pause();
        let fpu = self.state.fpu;
        self.state = CpuState::real_mode_at(0, 0);
        self.state.fpu = fpu;
        self.state.activity = Activity::WaitForSipi;
        self.apic.reset();
        self.injection = None;
        self.host_interrupts = PendingVectors::default();
        self.tlb.flush_vpid(self.vpid());
        self.mode_epoch += 1;
        self.check_events = true;
    }

    /// A startup IPI with `vector`: a CPU waiting for SIPI starts in real
    /// mode at CS = `vector << 8`, IP = 0 (linear `vector << 12`), as
    /// hardware does. Any other CPU ignores it; returns whether it started.
    pub fn receive_startup(&mut self, vector: u8) -> bool {
        if self.state.activity != Activity::WaitForSipi {
            return false;
        }
        let fpu = self.state.fpu;
        self.state = CpuState::real_mode_at((vector as u16) << 8, 0);
        self.state.fpu = fpu;
        self.mode_epoch += 1;
        self.check_events = true;
        true
    }

    /// The local APIC.
    pub fn apic(&self) -> &Lapic {
        &self.apic
    }

    /// The local APIC, mutably (to deliver IPIs and device interrupts).
    pub fn apic_mut(&mut self) -> &mut Lapic {
        self.check_events = true;
        &mut self.apic
    }

    /// The TLB (for statistics).
    pub fn tlb(&self) -> &Tlb {
        &self.tlb
    }

    /// INVEPT issued by the hypervisor.
    pub fn invept(&mut self, kind: InveptKind) {
        self.tlb.invept(kind);
    }

    /// INVVPID issued by the hypervisor.
    pub fn invvpid(&mut self, kind: InvvpidKind) {
        self.tlb.invvpid(kind);
    }

    /// INVLPG on behalf of the hypervisor, in the current VPID.
    pub fn invlpg(&mut self, gva: Gva) {
        let vpid = self.vpid();
        self.tlb.invlpg(vpid, gva);
    }

    /// The VPID tagging this CPU's current translations.
    #[inline]
    pub(crate) fn vpid(&self) -> u16 {
        self.vmx.as_ref().map_or(0, |v| v.vpid)
    }

    /// Runs until something needs the outside world or `cycles()` reaches
    /// `cycle_limit` (then [`VmExit::CycleLimit`]).
    ///
    /// In guest mode, reaching the cycle limit is a pause, not a VM exit:
    /// the simulator stops interpreting to let other CPUs catch up in
    /// virtual time, which the guest cannot see and hardware does not do.
    /// A pause charges no VM exit, and the next run resumes it without a
    /// VM entry. Anything the hypervisor does to a paused CPU that needs
    /// a real exit (an event to inject, requests to process) ends the
    /// pause with [`Cpu::end_pause`] first: a kick's exit.
    pub fn run(&mut self, mem: &PhysMemory, cycle_limit: u64) -> VmExit {
        self.exit_len = 0;
        let guest = self.vmx.is_some();
        if self.injection.is_some() {
            self.end_pause();
        }
        let resuming = std::mem::take(&mut self.paused);
        if guest && !resuming {
            self.stats.vm_entries += 1;
            self.cycles += self.costs.vm_entry;
            if self.vpid() == 0 {
                self.tlb.flush_vpid(0);
            }
            self.idt_vectoring = None;
        }
        self.check_events = true;
        let exit = self.run_loop(mem, cycle_limit);
        // Nothing outside a run sees pending flags.
        self.flush_flags();
        if guest {
            if matches!(exit, VmExit::CycleLimit) {
                self.paused = true;
                return exit;
            }
            self.stats.vm_exits += 1;
            self.cycles += self.costs.vm_exit;
            if self.vpid() == 0 {
                self.tlb.flush_vpid(0);
            }
        }
        exit
    }

    /// Whether the CPU is paused in guest mode (see [`Cpu::run`]).
    pub fn is_paused(&self) -> bool {
        self.paused
    }

    /// Ends a pause with a VM exit (what a kick from the hypervisor
    /// costs); the next run enters again. Nothing happens to a CPU that
    /// is not paused.
    pub fn end_pause(&mut self) {
        if std::mem::take(&mut self.paused) && self.vmx.is_some() {
            self.stats.vm_exits += 1;
            self.cycles += self.costs.vm_exit;
            if self.vpid() == 0 {
                self.tlb.flush_vpid(0);
            }
        }
    }

    fn run_loop(&mut self, mem: &PhysMemory, cycle_limit: u64) -> VmExit {
        // VM-entry injection happens before anything else, whatever RFLAGS.IF.
        if let Some(ev) = self.injection.take() {
            self.state.activity = Activity::Active;
            if let Step::Exit(e) = self.deliver_injected(mem, ev) {
                return e;
            }
        }
        loop {
            if self.cycles >= cycle_limit {
                return VmExit::CycleLimit;
            }
            if self.check_events || self.cycles >= self.next_timer_cycle {
                match self.check_events_now(mem) {
                    Step::Continue => {}
                    Step::Exit(e) => return e,
                }
            }
            match self.state.activity {
                Activity::Active => {}
                Activity::Halted => match self.idle(cycle_limit) {
                    Some(exit) => return exit,
                    None => continue,
                },
                Activity::WaitForSipi => return VmExit::Hlt,
                Activity::Shutdown => return VmExit::TripleFault,
            }
            if let Step::Exit(e) = self.run_blocks(mem, cycle_limit) {
                return e;
            }
        }
    }

    /// A halted CPU: skip to the next event that could wake it.
    fn idle(&mut self, cycle_limit: u64) -> Option<VmExit> {
        let can_take_interrupts = self.state.rflags & rflags::IF != 0;
        let deadline = if can_take_interrupts {
            self.timer_deadline_cycles()
        } else {
            None
        };
        match deadline {
            // Events were checked before idling, so a deadline not in the
            // future would mean no progress: treat it as nothing to wait for.
            Some(d) if d <= self.cycles => Some(VmExit::Hlt),
            Some(d) if d < cycle_limit => {
                self.cycles = d;
                self.check_events = true;
                None
            }
            Some(_) => {
                self.cycles = self.cycles.max(cycle_limit);
                Some(VmExit::CycleLimit)
            }
            None => Some(VmExit::Hlt),
        }
    }

    /// The cycle at which the APIC timer next fires, if armed.
    fn timer_deadline_cycles(&self) -> Option<u64> {
        let offset = self.vmx.as_ref().map_or(0, |v| v.tsc_offset);
        self.apic
            .next_timer_deadline()
            .map(|tsc| (tsc as i128 - offset as i128).max(0) as u64)
    }

    /// Between instructions: interrupt window, host interrupts, APIC.
    fn check_events_now(&mut self, mem: &PhysMemory) -> Step {
        self.check_events = false;
        let now = self.tsc();
        self.apic.update_timer(now);
        self.next_timer_cycle = self.timer_deadline_cycles().unwrap_or(u64::MAX);
        let blocked =
            self.state.interruptibility & (interruptibility::STI | interruptibility::MOV_SS) != 0;
        let if_set = self.state.rflags & rflags::IF != 0;
        let can_interrupt = if_set && !blocked;
        if blocked {
            // Look again after the next instruction.
            self.check_events = true;
        }
        if let Some(v) = self.vmx.as_deref() {
            if v.interrupt_window_exiting && can_interrupt {
                return Step::Exit(VmExit::InterruptWindow);
            }
            if v.nmi_window_exiting && !blocked && !self.state.nmi_blocked {
                return Step::Exit(VmExit::NmiWindow);
            }
            if v.external_interrupt_exiting {
                if let Some(vec) = self.host_interrupts.highest() {
                    self.host_interrupts.clear(vec);
                    self.state.activity = match self.state.activity {
                        Activity::Halted => Activity::Active,
                        a => a,
                    };
                    return Step::Exit(VmExit::ExternalInterrupt { vector: vec });
                }
            }
        }
        if !can_interrupt {
            return Step::Continue;
        }
        if let Some(vec) = self.host_interrupts.highest() {
            self.host_interrupts.clear(vec);
            return self.deliver_interrupt(mem, vec);
        }
        if let Some(vec) = self.apic.deliverable_vector() {
            self.apic.start_delivery(vec);
            return self.deliver_interrupt(mem, vec);
        }
        Step::Continue
    }

    fn deliver_interrupt(&mut self, mem: &PhysMemory, vector: u8) -> Step {
        if self.state.activity == Activity::Halted {
            self.state.activity = Activity::Active;
        }
        self.stats.interrupts += 1;
        self.check_events = true;
        let ev = EventInjection {
            kind: EventKind::ExternalInterrupt,
            vector,
            error_code: None,
            instruction_len: 0,
        };
        self.deliver_event(mem, ev)
    }

    /// Executes blocks for as long as nothing needs a look between them:
    /// the checks of `run_loop` that would find nothing to do are made
    /// here, without leaving the loop.
    fn run_blocks(&mut self, mem: &PhysMemory, cycle_limit: u64) -> Step {
        // One loop per engine (the engine does not change during a run):
        // the interpreter's has no translator checks per block.
        match self.engine {
            crate::jit::Engine::Jit => self.run_blocks_with::<true>(mem, cycle_limit),
            crate::jit::Engine::Interp => self.run_blocks_with::<false>(mem, cycle_limit),
        }
    }

    /// [`Cpu::run_blocks`] for one engine: `JIT` runs translated blocks.
    #[inline(never)]
    fn run_blocks_with<const JIT: bool>(&mut self, mem: &PhysMemory, cycle_limit: u64) -> Step {
        loop {
            if let Step::Exit(e) = self.run_block::<JIT>(mem, cycle_limit) {
                return Step::Exit(e);
            }
            if self.cycles >= cycle_limit
                || self.check_events
                || self.cycles >= self.next_timer_cycle
                || self.state.activity != Activity::Active
            {
                return Step::Continue;
            }
        }
    }

    /// Executes one block (or a single instruction when the next one must
    /// be followed by an event check).
    ///
    /// RIP is written when the block is left, not per instruction: the
    /// fast paths do not read it, the generic path sets it for itself, and
    /// a fault sets it to the faulting instruction.
    #[inline(always)]
    fn run_block<const JIT: bool>(&mut self, mem: &PhysMemory, cycle_limit: u64) -> Step {
        let mtf = self.vmx.as_ref().is_some_and(|v| v.monitor_trap_flag);
        // RFLAGS.RF (set by an IRET to a faulting instruction) lasts for
        // one instruction: run it alone and clear RF after it.
        // TF (single-step) and enabled DR0-DR3 breakpoints: one
        // instruction at a time, checked before and after it.
        let tf = self.state.rflags & rflags::TF != 0;
        let breakpoints = self.state.debug.dr7 & debug_regs::DR7_ENABLES != 0;
        let single = self.state.interruptibility != 0
            || mtf
            || self.debug_steps()
            || self.mmio_emu.is_some();
        self.rf_loaded = false;
        self.tf_after_only = false;
        let shadow = self.state.interruptibility;
        // Instruction breakpoints are inhibited on the instruction after a
        // MOV SS or POP SS (Intel; kvm-unit-tests' emulator "#DB
        // suppressed after MOV SS").
        if breakpoints
            && self.state.rflags & rflags::RF == 0
            && shadow & interruptibility::MOV_SS == 0
        {
            if let Some(hits) = self.instruction_breakpoint_hits() {
                return self.debug_exception(mem, hits);
            }
        }
        let block = match self.fetch_block(mem) {
            Ok(b) => b,
            Err(f) => {
                self.mmio = None;
                return self.handle_fault(mem, f, 0);
            }
        };
        // Pending events (e.g. just after delivering an interrupt) are
        // looked at again after the first instruction.
        let whole = !(single || self.check_events);
        let translation = if JIT {
            self.translation(&block, whole)
        } else {
            None
        };
        let (executed, rip, mut step) = match translation {
            Some(t) => self.run_translated(mem, &block, t, cycle_limit),
            None => self.interpret_block(mem, &block, whole),
        };
        self.state.rip = rip;
        let executed = executed as u64;
        self.code_written = false;
        self.stats.instructions += executed;
        self.cycles += executed * self.costs.instruction;
        // SYSCALL/SYSRET trap on the TF they leave, which a SYSRET may
        // set in a block that began with TF clear.
        let tf_set_by_insn = self.tf_after_only && self.state.rflags & rflags::TF != 0;
        if single || self.pending_apic_exit.is_some() || tf_set_by_insn {
            step = self.after_single_or_ipi(mem, executed, step, mtf, tf, shadow);
        }
        step
    }

    /// RFLAGS.TF or RF set, or a DR0-DR3 breakpoint enabled: the run loop
    /// takes one instruction at a time, checked before and after it. An
    /// instruction that turns one of them on (POPF, SYSRET, IRET, MOV to
    /// DR7) ends translated code's run of blocks.
    #[inline(always)]
    pub(super) fn debug_steps(&self) -> bool {
        self.state.rflags & (rflags::RF | rflags::TF) != 0
            || self.state.debug.dr7 & debug_regs::DR7_ENABLES != 0
    }

    /// The end of [`Cpu::run_block`] when it ran a single instruction (for
    /// STI/MOV-SS blocking or the monitor trap flag) or an IPI is pending.
    #[inline(never)]
    fn after_single_or_ipi(
        &mut self,
        mem: &PhysMemory,
        executed: u64,
        mut step: Step,
        mtf: bool,
        tf: bool,
        shadow: u8,
    ) -> Step {
        // Single-step trap (SDM Vol. 3A 18.3.1.4): after an instruction
        // that began with TF set and completed (a POPF that clears TF
        // included); after SYSCALL/SYSRET and INT n by TF as they leave it
        // (KVM's emulator does the same; INT n's handler starts with TF
        // clear, so there is none).
        let tf_now = self.state.rflags & rflags::TF != 0;
        // A MOV SS or POP SS holds its single-step trap back with the
        // interrupts (SDM Vol. 3A 6.8.3): the next instruction's covers it.
        let mov_ss = self.state.interruptibility & !shadow & interruptibility::MOV_SS != 0;
        let single_step = executed > 0
            && matches!(step, Step::Continue)
            && !mov_ss
            && if self.tf_after_only { tf_now } else { tf };
        if executed > 0 {
            // The shadow this instruction ran in ends; one it began (a
            // MOV SS, an STI) covers the next instruction.
            self.state.interruptibility &= !shadow;
            // The processor clears RF after each instruction completes
            // (SDM Vol. 3A 18.3.1.1); an IRET loads it from the frame.
            if !self.rf_loaded {
                self.state.rflags &= !rflags::RF;
            }
        }
        if let Some(exit) = self.pending_apic_exit.take() {
            if matches!(step, Step::Continue) {
                step = Step::Exit(exit);
            }
        }
        // Data and I/O breakpoint traps: held over a MOV SS with the
        // single-step trap; dropped when the instruction faulted; kept
        // for `skip_instruction` when it exits (an I/O port).
        let hits = std::mem::take(&mut self.db_pending);
        match step {
            Step::Continue if executed > 0 && mov_ss => self.db_pending = hits,
            Step::Continue if executed > 0 && (hits != 0 || single_step) => {
                let bs = if single_step { debug_regs::DR6_BS } else { 0 };
                step = self.debug_exception(mem, hits | bs);
            }
            Step::Exit(_) => self.db_pending = hits,
            _ => {}
        }
        if mtf && matches!(step, Step::Continue) {
            step = Step::Exit(VmExit::MonitorTrap);
        }
        step
    }

    /// Runs a block (all of it, or only its first instruction) through the
    /// interpreter: (instructions completed, RIP after, what next).
    #[inline(always)]
    fn interpret_block(
        &mut self,
        mem: &PhysMemory,
        block: &code_cache::Block,
        whole: bool,
    ) -> (usize, u64, Step) {
        let insns = if whole {
            &block.insns[..]
        } else {
            &block.insns[..1]
        };
        for (k, op) in insns.iter().enumerate() {
            match self.exec_op(mem, op) {
                Ok(fast::Flow::Next) => {}
                Ok(fast::Flow::Stored) => {
                    if self.code_written {
                        return (k + 1, op.next_ip, Step::Continue);
                    }
                }
                Ok(fast::Flow::Leave) => return (k + 1, self.next_rip, Step::Continue),
                Err(f) => {
                    let step = self.fault_in_block(mem, op, f);
                    return (k, self.state.rip, step);
                }
            }
        }
        // Ran off its end (a block is never empty).
        let next_ip = insns.last().map_or(self.state.rip, |op| op.next_ip);
        (insns.len(), next_ip, Step::Continue)
    }

    /// Instruction `op` of a block faulted: RIP to it, then deliver or exit.
    #[cold]
    #[inline(never)]
    fn fault_in_block(&mut self, mem: &PhysMemory, op: &fast::Op, f: Fault) -> Step {
        if !matches!(op.fast, fast::Fast::Generic) {
            self.state.rip = op.insn.ip();
        }
        self.note_mmio(&op.insn, &f);
        let f = self.stack_segment_fault(&op.insn, f);
        self.handle_fault(mem, f, op.insn.len() as u8)
    }

    /// A memory operand through SS (based on RSP or RBP, or with an SS
    /// override) at a non-canonical address faults #SS(0), not #GP(0)
    /// (SDM Vol. 3A 6.15, "Interrupt 12"; kvm-unit-tests' `emulator`
    /// "non-canonical rsp-based access").
    fn stack_segment_fault(&self, insn: &iced_x86::Instruction, f: Fault) -> Fault {
        let through_ss = (0..insn.op_count()).any(|n| insn.op_kind(n) == iced_x86::OpKind::Memory)
            && insn.memory_segment() == iced_x86::Register::SS;
        if through_ss
            && self.state.in_64bit_mode()
            && !crate::addr::is_canonical(self.effective_address(insn))
        {
            access::stack_fault(f)
        } else {
            f
        }
    }

    /// Turns a fault of the current instruction into an exception delivery
    /// or an exit.
    fn handle_fault(&mut self, mem: &PhysMemory, fault: Fault, insn_len: u8) -> Step {
        self.flush_flags();
        match fault.into_kind() {
            FaultKind::Exception {
                vector,
                error_code,
                cr2,
            } => {
                if vector == vector::PF && self.mmio_emu.is_none() {
                    self.fault_la = cr2;
                }
                // A #PF that exits (shadow paging) may be an MMIO access the
                // VMM emulates and skips (`Cpu::mmio_access`): it needs the
                // instruction's length, as after an EPT violation.
                if vector == vector::PF {
                    self.exit_len = insn_len;
                }
                self.raise_exception(mem, vector, error_code, cr2)
            }
            FaultKind::Exit(exit) => {
                if let (VmExit::EptViolation { gla, .. }, None) = (&exit, &self.mmio_emu) {
                    self.fault_la = gla.map(|g| g.0);
                }
                self.exit_len = if std::mem::take(&mut self.string_io_resume) {
                    0
                } else {
                    insn_len
                };
                Step::Exit(exit)
            }
        }
    }

    /// Decodes or finds the block at RIP.
    ///
    /// Outside 64-bit mode RIP is the offset in CS: the fetch is at
    /// CS.base + EIP (wrapping at 4 GiB), and the block is decoded for the
    /// code size CS selects.
    ///
    /// Inline up to a first-level iTLB and front-cache hit (once per block
    /// in the run loop); decoding is out of line.
    #[inline(always)]
    fn fetch_block(&mut self, mem: &PhysMemory) -> Result<std::rc::Rc<code_cache::Block>, Fault> {
        let rip = self.state.rip;
        let bits = self.state.code_bits();
        let la = if bits == 64 {
            rip
        } else {
            self.state.cs.base.wrapping_add(rip) & 0xffff_ffff
        };
        let hpa = self.translate_fetch(mem, la)?;
        if let Some(b) = self.code.lookup(mem, hpa, rip, bits) {
            return Ok(b);
        }
        self.decode_at(mem, rip, la, hpa)
    }

    /// [`Cpu::fetch_block`] when no block is cached at RIP (linear address
    /// `la`, host-physical `hpa`): decodes one.
    #[inline(never)]
    fn decode_at(
        &mut self,
        mem: &PhysMemory,
        rip: u64,
        la: u64,
        hpa: crate::Hpa,
    ) -> Result<std::rc::Rc<code_cache::Block>, Fault> {
        // Bytes to the end of the page, but no more than a long block needs
        // (a block cut short by the window simply ends early).
        let room = 4096 - (la & 0xfff) as usize;
        if room < MAX_INSN_LEN {
            return self.fetch_page_end(mem, rip, la, hpa);
        }
        let window = room.min(DECODE_WINDOW);
        let mut buf = [0u8; DECODE_WINDOW];
        let first = &mut buf[..window];
        mem.read_bytes(hpa, first)?;
        self.decode_into_cache(mem, rip, la, hpa, first)
    }

    /// Decodes the block at RIP (linear address `la`, host-physical `hpa`)
    /// from `bytes`, those to the end of its page (or of the decode
    /// window), and caches it; when its first instruction does not fit, the
    /// instruction crossing into the next page instead.
    fn decode_into_cache(
        &mut self,
        mem: &PhysMemory,
        rip: u64,
        la: u64,
        hpa: crate::Hpa,
        bytes: &[u8],
    ) -> Result<std::rc::Rc<code_cache::Block>, Fault> {
        let bits = self.state.code_bits();
        match code_cache::decode_block(bytes, rip, bits) {
            Some(insns) => {
                self.stats.blocks_decoded += 1;
                let block = self.code.insert(mem, hpa, rip, bits, insns);
                // (Translated code may be running: its own decodes come
                // here, through `jit_chain_fetch`.)
                self.keep_stores_off_code(mem);
                Ok(block)
            }
            None => {
                let mut first = [0u8; MAX_INSN_LEN];
                let n = bytes.len().min(MAX_INSN_LEN);
                first[..n].copy_from_slice(&bytes[..n]);
                self.fetch_crossing(mem, rip, la, hpa, first)
            }
        }
    }

    /// [`Cpu::fetch_block`] at `rip` (linear address `la`, host-physical
    /// `hpa`) less than 15 bytes before the end of its page, no block
    /// cached there: a block of what fits, or the instruction that crosses
    /// into the next page.
    #[inline(never)]
    fn fetch_page_end(
        &mut self,
        mem: &PhysMemory,
        rip: u64,
        la: u64,
        hpa: crate::Hpa,
    ) -> Result<std::rc::Rc<code_cache::Block>, Fault> {
        let bits = self.state.code_bits();
        let room = 4096 - (la & 0xfff) as usize;
        let mut bytes = [0u8; MAX_INSN_LEN];
        // The usual case, a page-crossing instruction run before whose
        // bytes did not change, checked in memory a word at a time: what
        // the byte-by-byte path below does, in the same order (the bytes
        // to the page end, then the next page's translation, then its
        // bytes).
        if self.code.crossing_prefix_in_memory(mem, rip, hpa, bits) {
            let hpa2 = self.translate_fetch(mem, self.next_code_page(la))?;
            if let Some(b) = self
                .code
                .lookup_crossing_in_memory(mem, rip, hpa, hpa2, bits)
            {
                return Ok(b);
            }
            mem.read_bytes(hpa, &mut bytes[..room])?;
            return self.fetch_crossing_at(mem, rip, hpa, hpa2, bytes, room);
        }
        let first = &mut bytes[..room];
        mem.read_bytes(hpa, first)?;
        // A page-crossing instruction seen before, with the same bytes up
        // to the page end, would fail to decode here the same way: go
        // straight to its second page.
        if self.code.crossing_prefix_matches(rip, hpa, bits, first) {
            return self.fetch_crossing(mem, rip, la, hpa, bytes);
        }
        self.decode_into_cache(mem, rip, la, hpa, &bytes[..room])
    }

    /// The linear address of the page after the one of `la`, in the code
    /// size running.
    fn next_code_page(&self, la: u64) -> u64 {
        let next_page = (la & !0xfff).wrapping_add(0x1000);
        if self.state.code_bits() == 64 {
            next_page
        } else {
            next_page & 0xffff_ffff
        }
    }

    /// The instruction at `rip` (linear address `la`) crosses into the
    /// next page (`bytes` holds its bytes up to the page end): fetch up to
    /// 15 bytes across the boundary and run it alone, decoded again unless
    /// the same bytes from the same frames were decoded before.
    fn fetch_crossing(
        &mut self,
        mem: &PhysMemory,
        rip: u64,
        la: u64,
        hpa: crate::Hpa,
        bytes: [u8; MAX_INSN_LEN],
    ) -> Result<std::rc::Rc<code_cache::Block>, Fault> {
        let room = 4096 - (la & 0xfff) as usize;
        let hpa2 = self.translate_fetch(mem, self.next_code_page(la))?;
        self.fetch_crossing_at(mem, rip, hpa, hpa2, bytes, room.min(MAX_INSN_LEN))
    }

    /// [`Cpu::fetch_crossing`] once the next page is translated (to
    /// `hpa2`): `bytes` holds the first `n` bytes.
    fn fetch_crossing_at(
        &mut self,
        mem: &PhysMemory,
        rip: u64,
        hpa: crate::Hpa,
        hpa2: crate::Hpa,
        mut bytes: [u8; MAX_INSN_LEN],
        n: usize,
    ) -> Result<std::rc::Rc<code_cache::Block>, Fault> {
        let bits = self.state.code_bits();
        mem.read_bytes(hpa2, &mut bytes[n..])?;
        if let Some(b) = self.code.lookup_crossing(rip, hpa, hpa2, bits, &bytes) {
            return Ok(b);
        }
        self.stats.blocks_decoded += 1;
        let op = code_cache::decode_one(&bytes, rip, bits);
        Ok(self.code.insert_crossing(rip, hpa, hpa2, &bytes, op, bits))
    }
}

/// Bytes fetched to decode one block.
const DECODE_WINDOW: usize = 512;

/// Whether an instruction ends a block: control flow, anything that may
/// change translation, privilege or interrupt state.
///
/// Conditional branches do not end a block: when not taken, execution goes
/// on in the same block (the run loop leaves it when one is taken).
pub(crate) fn ends_block(insn: &Instruction) -> bool {
    use iced_x86::FlowControl;
    !matches!(
        insn.flow_control(),
        FlowControl::Next | FlowControl::ConditionalBranch
    ) || code_cache::is_serializing(insn)
}
