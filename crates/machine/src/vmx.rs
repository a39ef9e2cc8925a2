//! The VMX-like virtualization interface: VM-execution controls, VM exits
//! and event injection.
//!
//! A [`crate::Cpu`] runs in guest mode when it has [`VmxControls`]
//! (`Cpu::set_vmx`). The controls are the machine's equivalent of the VMCS
//! control fields; the guest's architectural state is the CPU's own state,
//! read and written by the hypervisor through `Cpu::state`/`state_mut` (the
//! VMCS guest-state area). VM exits come back from `Cpu::run` as [`VmExit`].
//!
//! Without controls (bare mode), the CPU is a plain processor: exceptions and
//! interrupts go through the IDT, CPUID/MSRs execute natively, and `run`
//! returns only [`VmExit::Io`], [`VmExit::Hlt`], [`VmExit::TripleFault`],
//! [`VmExit::Ipi`], [`VmExit::CycleLimit`] and [`VmExit::MachineError`].

use crate::addr::{Gpa, Gva};
use crate::memory::MemError;

/// Bits of the EPT-violation exit qualification (Intel SDM Vol. 3, 28.3.3.2).
pub mod ept_qual {
    /// The access was a data read.
    pub const READ: u64 = 1 << 0;
    /// The access was a data write.
    pub const WRITE: u64 = 1 << 1;
    /// The access was an instruction fetch.
    pub const FETCH: u64 = 1 << 2;
    /// The gpa was readable (AND of the R bits of all EPT levels walked).
    pub const READABLE: u64 = 1 << 3;
    /// The gpa was writable.
    pub const WRITABLE: u64 = 1 << 4;
    /// The gpa was executable.
    pub const EXECUTABLE: u64 = 1 << 5;
    /// The guest-linear-address field is valid.
    pub const GLA_VALID: u64 = 1 << 7;
    /// With `GLA_VALID`: set if the access was to the translated address,
    /// clear if to a guest paging structure during the walk.
    pub const GLA_TRANSLATED: u64 = 1 << 8;
}

/// The EPT pointer: root of the EPT paging structures plus attributes, in
/// the VMX format (bits 2:0 memory type, 5:3 walk length - 1, bit 6 A/D
/// enable, 51:12 PML4 host-physical address).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Eptp(pub u64);

impl Eptp {
    /// Write-back, 4-level, with or without accessed/dirty flags.
    pub fn new(pml4: crate::Hpa, ad_enabled: bool) -> Self {
        Eptp((pml4.0 & 0x000f_ffff_ffff_f000) | 6 | (3 << 3) | ((ad_enabled as u64) << 6))
    }
    /// Host-physical address of the PML4 table.
    pub fn pml4(self) -> crate::Hpa {
        crate::Hpa(self.0 & 0x000f_ffff_ffff_f000)
    }
    /// Whether EPT accessed/dirty flags are enabled.
    pub fn ad_enabled(self) -> bool {
        self.0 & (1 << 6) != 0
    }
}

/// How MSR accesses in guest mode are handled.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum MsrExiting {
    /// Every RDMSR/WRMSR exits (no MSR bitmap).
    #[default]
    All,
    /// The listed MSRs are accessed natively by the guest (pass-through of
    /// the CPU's own MSR state); all others exit. The hv uses this for
    /// FS/GS base, KERNEL_GS_BASE, STAR/LSTAR/FMASK, TSC_AUX and the like.
    Bitmap {
        /// MSRs whose reads do not exit.
        read_passthrough: Vec<u32>,
        /// MSRs whose writes do not exit.
        write_passthrough: Vec<u32>,
    },
}

/// VM-execution controls: the policy of guest mode, owned by the hypervisor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmxControls {
    /// Bit n set: exception vector n exits instead of going to the guest IDT.
    pub exception_bitmap: u32,
    /// #PF exits iff bit 14 of the bitmap equals
    /// `(error_code & pf_error_code_mask) == pf_error_code_match`.
    pub pf_error_code_mask: u32,
    /// See `pf_error_code_mask`.
    pub pf_error_code_match: u32,
    /// MOV to CR3 exits unless the value is in `cr3_targets`.
    pub cr3_load_exiting: bool,
    /// MOV from CR3 exits.
    pub cr3_store_exiting: bool,
    /// CR3 values whose loads do not exit (the CR3-target list; only the
    /// first `cr3_target_count` count).
    pub cr3_targets: Vec<u64>,
    /// CR3-target values the CPU supports (IA32_VMX_MISC bits 24:16;
    /// Intel CPUs report [`MAX_CR3_TARGETS`]). A model parameter, so the
    /// seed's "only 4 entries" can be varied.
    pub cr3_target_count: usize,
    /// CR0 bits owned by the host: guest reads see `cr0_read_shadow` there,
    /// guest writes that would change them relative to the shadow exit.
    pub cr0_guest_host_mask: u64,
    /// See `cr0_guest_host_mask`.
    pub cr0_read_shadow: u64,
    /// CR4 bits owned by the host (as for CR0).
    pub cr4_guest_host_mask: u64,
    /// See `cr4_guest_host_mask`.
    pub cr4_read_shadow: u64,
    /// MOV to/from CR8 exits.
    pub cr8_exiting: bool,
    /// HLT exits.
    pub hlt_exiting: bool,
    /// INVLPG exits.
    pub invlpg_exiting: bool,
    /// The "enable INVPCID" secondary control: when clear, INVPCID is #UD
    /// in the guest (SDM Vol. 3C 26.3). INVPCID never exits (the
    /// INVLPG-exiting control would make it exit; no hypervisor here
    /// sets both).
    pub enable_invpcid: bool,
    /// RDTSC/RDTSCP exit.
    pub rdtsc_exiting: bool,
    /// I/O instructions exit. `None`: all of them; `Some(ports)`: only
    /// these ports exit (the I/O bitmap); others act as on bare hardware
    /// with nothing attached (reads return all ones).
    pub io_exiting: Option<Vec<u16>>,
    /// RDMSR/WRMSR handling.
    pub msr_exiting: MsrExiting,
    /// x2APIC MSRs (0x800-0x8ff) go to the CPU's own local APIC (as with
    /// APIC virtualization) instead of exiting. IPIs to other CPUs still
    /// exit as [`VmExit::Ipi`].
    pub virtualize_x2apic: bool,
    /// Host interrupts (`Cpu::post_external_interrupt`) cause a VM exit.
    pub external_interrupt_exiting: bool,
    /// Exit as soon as the guest can take an interrupt (RFLAGS.IF=1, no
    /// STI/MOV-SS blocking, no event being injected).
    pub interrupt_window_exiting: bool,
    /// NMI-window exiting (SDM Vol. 3C 25.3): exit ([`VmExit::NmiWindow`])
    /// before any instruction when there is no NMI blocking and no
    /// blocking by STI or MOV SS, e.g. right after the IRET that ends an
    /// NMI handler, so a hypervisor holding an NMI can inject it there.
    pub nmi_window_exiting: bool,
    /// Monitor trap flag: exit ([`VmExit::MonitorTrap`]) at the next
    /// instruction boundary, after one guest instruction has completed (or
    /// an event was delivered instead). A shadow MMU uses it to let one
    /// write through to a write-protected guest page table.
    pub monitor_trap_flag: bool,
    /// Extended page tables; `None` means guest-physical equals
    /// host-physical (a convenience for tests; real VMX without EPT runs
    /// the guest on the hv's shadow page tables, which it loads into CR3).
    pub ept: Option<Eptp>,
    /// Virtual-processor identifier tagging TLB entries; 0 means VPID is
    /// disabled and the TLB is flushed on every VM entry and exit.
    pub vpid: u16,
    /// Added to the cycle counter to give the guest's TSC.
    pub tsc_offset: i64,
    /// Page-modification logging (SDM Vol. 3C 29.3.6; the "enable PML"
    /// secondary processor-based control with the 64-bit PML address
    /// field): the host-physical address of the 4 KiB log, `None` when
    /// off. Takes effect only with EPT A/D flags on in the EPTP. When the
    /// CPU sets an EPT leaf's dirty flag (0 to 1) it writes the 4 KiB-
    /// aligned guest-physical address of the access at `pml_address + 8 *
    /// pml_index` and decrements `pml_index`; if the index is outside
    /// 0..=511 when an EPT accessed or dirty flag must be set, the access
    /// does not happen and the CPU exits with [`VmExit::PmlFull`].
    pub pml_address: Option<crate::Hpa>,
    /// The PML index (a 16-bit guest-state field of the VMCS): the next
    /// log entry the CPU writes. It counts down from [`PML_HEAD_INDEX`]
    /// and may wrap from 0 to 0xffff, after which the next logging event
    /// is a PML-full exit. The hypervisor reads the log from index + 1 to
    /// 511 and resets it to [`PML_HEAD_INDEX`].
    pub pml_index: u16,
}

impl Default for VmxControls {
    fn default() -> Self {
        Self {
            exception_bitmap: 0,
            pf_error_code_mask: 0,
            pf_error_code_match: 0,
            cr3_load_exiting: false,
            cr3_store_exiting: false,
            cr3_targets: Vec::new(),
            cr3_target_count: MAX_CR3_TARGETS,
            cr0_guest_host_mask: 0,
            cr0_read_shadow: 0,
            cr4_guest_host_mask: 0,
            cr4_read_shadow: 0,
            cr8_exiting: false,
            hlt_exiting: true,
            invlpg_exiting: false,
            enable_invpcid: false,
            rdtsc_exiting: false,
            io_exiting: None,
            msr_exiting: MsrExiting::All,
            virtualize_x2apic: false,
            external_interrupt_exiting: true,
            interrupt_window_exiting: false,
            nmi_window_exiting: false,
            monitor_trap_flag: false,
            ept: None,
            vpid: 1,
            tsc_offset: 0,
            pml_address: None,
            pml_index: PML_HEAD_INDEX,
        }
    }
}

/// Entries of the page-modification log: one 4 KiB page of 64-bit
/// guest-physical addresses (SDM Vol. 3C 29.3.6).
pub const PML_ENTRIES: u16 = 512;

/// The PML index of an empty log: the CPU writes entry 511 first, then
/// 510, and so on (KVM's `PML_HEAD_INDEX`).
pub const PML_HEAD_INDEX: u16 = PML_ENTRIES - 1;

/// Entries in the CR3-target list of Intel CPUs (IA32_VMX_MISC); the
/// default `cr3_target_count`.
pub const MAX_CR3_TARGETS: usize = 4;

/// Kind of an event injected on VM entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum EventKind {
    /// An external interrupt (delivered through the IDT like a device IRQ).
    ExternalInterrupt,
    /// Non-maskable interrupt (vector 2).
    Nmi,
    /// A hardware exception (#PF, #GP, ...), with an error code if the
    /// vector has one.
    HardwareException,
    /// A software interrupt (`int n`): the return address is RIP plus
    /// `instruction_len`, and the gate's DPL is checked.
    SoftwareInterrupt,
}

/// The VM-entry interruption-information field: an event delivered to the
/// guest as the first thing on the next VM entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EventInjection {
    pub kind: EventKind,
    pub vector: u8,
    pub error_code: Option<u32>,
    /// For software interrupts: the length of the `int n` instruction.
    pub instruction_len: u8,
}

/// Direction of an I/O access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoDirection {
    /// `in`: the handler supplies the value with `Cpu::complete_io_in`.
    In,
    /// `out`: the value written is in the exit.
    Out,
}

/// A CR access that exited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrAccess {
    /// MOV to CRn from a general register (already read into `value`).
    MovTo { cr: u8, gpr: u8, value: u64 },
    /// MOV from CRn into a general register; the handler writes the
    /// register and skips the instruction.
    MovFrom { cr: u8, gpr: u8 },
}

/// Delivery mode of an IPI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpiMode {
    Fixed,
    LowestPriority,
    Smi,
    Nmi,
    Init,
    Startup,
}

/// Destination shorthand of an IPI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpiDest {
    /// The APIC with this x2APIC id (0xffff_ffff: broadcast).
    Physical(u32),
    /// Logical destination (x2APIC cluster mode), raw.
    Logical(u32),
    SelfOnly,
    AllIncludingSelf,
    AllExcludingSelf,
}

/// The data access of an instruction that exited with an EPT violation,
/// as `Cpu::mmio_access` reports it for MMIO emulation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MmioAccess {
    /// Bytes accessed (1, 2, 4 or 8).
    pub size: u8,
    /// A store, with the value stored; `None`: a load.
    pub write: Option<u64>,
}

/// An inter-processor interrupt written to the ICR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipi {
    pub dest: IpiDest,
    pub vector: u8,
    pub mode: IpiMode,
    /// Level-triggered assert/deassert (matters for INIT deassert only).
    pub level_assert: bool,
    /// Trigger mode level (ICR bit 15, an IOAPIC entry's bit 15): a
    /// fixed interrupt so accepted sets its TMR bit, and its EOI is
    /// broadcast to the IOAPICs ([`VmExit::EoiBroadcast`]).
    pub trigger_level: bool,
}

/// Why the CPU stopped running: a VM exit in guest mode, or in bare mode
/// one of the few events the outside world must handle.
///
/// For exits caused by an instruction (`Io`, `Msr*`, `Cpuid`, `Hlt`,
/// `Vmcall`, `CrAccess`, `Invlpg`, `Rdtsc`), RIP still points at the
/// instruction and `Cpu::exit_instruction_len` gives its length; the handler
/// emulates it and calls `Cpu::skip_instruction`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VmExit {
    /// An exception whose bit is set in the exception bitmap. For #PF,
    /// `qualification` is the faulting linear address (CR2 is not written).
    Exception {
        vector: u8,
        error_code: Option<u32>,
        qualification: u64,
    },
    /// A host interrupt arrived while `external_interrupt_exiting`.
    ExternalInterrupt { vector: u8 },
    /// The guest can now take an interrupt (`interrupt_window_exiting`).
    InterruptWindow,
    /// The guest can now take an NMI (`nmi_window_exiting`).
    NmiWindow,
    /// One instruction completed under `monitor_trap_flag`.
    MonitorTrap,
    /// A fault during delivery of a double fault: the CPU shut down.
    TripleFault,
    /// CPUID (always exits in guest mode).
    Cpuid,
    /// HLT (`hlt_exiting`), or in bare mode a halt nothing can wake.
    Hlt,
    /// INVLPG (`invlpg_exiting`).
    Invlpg { gva: Gva },
    /// RDTSC or RDTSCP (`rdtsc_exiting`).
    Rdtsc { rdtscp: bool },
    /// VMCALL (always exits in guest mode; #UD in bare mode).
    Vmcall,
    /// A control-register access that the controls make exit.
    CrAccess(CrAccess),
    /// IN/OUT of 1, 2 or 4 bytes.
    Io {
        port: u16,
        size: u8,
        direction: IoDirection,
        /// The value written, for `Out`.
        value: u32,
    },
    /// RDMSR that exits; complete with `Cpu::complete_rdmsr` or inject #GP.
    MsrRead { index: u32 },
    /// WRMSR that exits.
    MsrWrite { index: u32, value: u64 },
    /// A guest-physical access EPT does not allow.
    EptViolation {
        gpa: Gpa,
        gla: Option<Gva>,
        qualification: u64,
    },
    /// A misconfigured EPT entry (e.g. writable but not readable).
    EptMisconfig { gpa: Gpa },
    /// Page-modification log full (exit reason 62, SDM Vol. 3C 29.3.6):
    /// an access needed an EPT accessed or dirty flag set while the PML
    /// index was outside 0..=511. No flag was set and the access did not
    /// happen: RIP is at the instruction, which runs again after the
    /// hypervisor empties the log and resets the index.
    PmlFull,
    /// The local APIC sent an IPI that the outside world must route (any
    /// destination other than this CPU alone). The ICR write has completed.
    Ipi(Ipi),
    /// An EOI for a vector whose TMR bit was set (a level-triggered
    /// interrupt): the local APIC broadcasts it to the IOAPICs, which the
    /// outside world models (VMX's EOI-induced exit). The EOI write has
    /// completed.
    EoiBroadcast { vector: u8 },
    /// The cycle limit given to `Cpu::run` was reached (the VMX-preemption
    /// timer, in effect).
    CycleLimit,
    /// The machine itself could not complete an access: a page walk or
    /// guest access reached a host-physical address outside memory. The
    /// CPU is left at the faulting instruction.
    MachineError(MemError),
}

impl VmExit {
    /// A short stable name for statistics.
    pub fn name(&self) -> &'static str {
        match self {
            VmExit::Exception { .. } => "exception",
            VmExit::ExternalInterrupt { .. } => "external_interrupt",
            VmExit::InterruptWindow => "interrupt_window",
            VmExit::NmiWindow => "nmi_window",
            VmExit::MonitorTrap => "monitor_trap",
            VmExit::TripleFault => "triple_fault",
            VmExit::Cpuid => "cpuid",
            VmExit::Hlt => "hlt",
            VmExit::Invlpg { .. } => "invlpg",
            VmExit::Rdtsc { .. } => "rdtsc",
            VmExit::Vmcall => "vmcall",
            VmExit::CrAccess(_) => "cr_access",
            VmExit::Io { .. } => "io",
            VmExit::MsrRead { .. } => "msr_read",
            VmExit::MsrWrite { .. } => "msr_write",
            VmExit::EptViolation { .. } => "ept_violation",
            VmExit::EptMisconfig { .. } => "ept_misconfig",
            VmExit::PmlFull => "pml_full",
            VmExit::Ipi(_) => "ipi",
            VmExit::EoiBroadcast { .. } => "eoi_broadcast",
            VmExit::CycleLimit => "cycle_limit",
            VmExit::MachineError(_) => "machine_error",
        }
    }
}

/// INVVPID types (Intel SDM "INVVPID").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InvvpidKind {
    /// Entries for one linear address of one VPID.
    IndividualAddress { vpid: u16, gva: Gva },
    /// All entries of one VPID.
    SingleContext { vpid: u16 },
    /// All entries of all VPIDs except 0.
    AllContext,
    /// All non-global entries of one VPID.
    SingleContextRetainingGlobals { vpid: u16 },
}

/// INVEPT types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InveptKind {
    /// Mappings derived from one EPTP.
    SingleContext(Eptp),
    /// Mappings derived from any EPTP.
    Global,
}
