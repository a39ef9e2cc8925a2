//! Bare mode: run an ELF in ring 0 long mode with no hypervisor.
//!
//! [`BareMachine`] is a one-CPU computer in the state a boot loader leaves
//! behind (as Firecracker builds it for a Linux kernel): long mode, paging on
//! with an identity map of all RAM, a flat GDT with ring-0 and ring-3
//! segments, a TSS with a ring-0 stack and one IST stack, interrupts off and
//! no IDT. The program finds two devices:
//!
//! - COM1 (port 0x3f8): bytes written to the transmit register go to the
//!   serial sink; the line-status register (0x3fd) always reads 0x60
//!   (transmitter empty), so a polling driver never waits.
//! - isa-debug-exit (port 0xf4): writing value `v` stops the machine with
//!   exit status `(v << 1) | 1`, as QEMU's device does. A program signals
//!   success with `v = 0`, i.e. status 1; statuses of program exits are
//!   always odd, which leaves even values to the runner's own errors.
//!
//! Other ports read as all ones and ignore writes (nothing is attached).
//!
//! # Physical memory layout
//!
//! | range | contents |
//! |---|---|
//! | `0x1000` | GDT ([`KERNEL_CS`], [`KERNEL_DS`], [`USER_DS`], [`USER_CS`], [`TSS_SELECTOR`]) |
//! | `0x2000` | TSS |
//! | `0x4000..0x8000` | IST1 stack |
//! | `0x8000..0x10000` | RSP0 stack (ring-3 to ring-0 transitions) |
//! | `0x10000..0x100000` | boot stack (initial RSP = `0x100000`) |
//! | `0x100000..` | the program (linked at or above 1 MiB, virtual = physical) |
//! | top of RAM | page tables |
//!
//! # Guest mode
//!
//! With [`Mode::GuestEpt`] the same program runs in VMX guest mode: the
//! machine memory is RAM plus an identity EPT placed above it (the guest
//! cannot see it), with VPID 1, HLT exiting, every I/O port exiting, x2APIC
//! virtualization and an MSR bitmap passing through the MSRs programs use
//! ([`GUEST_PASSTHROUGH_MSRS`]). Exits are handled as a minimal hypervisor
//! would: I/O as in bare mode; HLT by skipping idle time to the next APIC
//! timer deadline (as KVM blocks a halted vCPU until an interrupt), or an
//! error if nothing can wake the CPU; an MSR outside the bitmap gets #GP(0)
//! injected (the MSR does not exist for this guest); CPUID is an error (the
//! test programs do not use it), as are all other exits.
//!
//! # Single CPU
//!
//! An IPI to another CPU ([`VmExit::Ipi`]) is an error: there is no one to
//! receive it. Self-IPIs never leave the local APIC.

pub mod page_tables;

use crate::addr::{Hpa, PAGE_SIZE};
use crate::cpu::state::{msr, rflags, seg_attr, Activity, DescriptorTable, Segment};
use crate::cpu::{Cpu, CpuConfig, CpuStats, Gpr};
use crate::elf::{self, ElfError};
use crate::memory::{MemCreateError, MemError, PhysMemory};
use crate::mmu::tlb::TlbStats;
use crate::vmx::{
    Eptp, EventInjection, EventKind, IoDirection, Ipi, MsrExiting, VmExit, VmxControls,
};
use page_tables::{PageSize, PageTableError};
use std::collections::BTreeMap;
use std::io::Write;
use std::ops::Range;
use thiserror::Error;

/// Selector of the 64-bit ring-0 code segment.
pub const KERNEL_CS: u16 = 0x08;
/// Selector of the ring-0 data segment.
pub const KERNEL_DS: u16 = 0x10;
/// Selector of the ring-3 data segment (GDT entry 3, RPL 3). It precedes
/// the user code segment, as SYSRET requires (SS = `STAR[63:48] + 8`,
/// CS = `STAR[63:48] + 16`).
pub const USER_DS: u16 = 0x18 | 3;
/// Selector of the 64-bit ring-3 code segment (GDT entry 4, RPL 3).
pub const USER_CS: u16 = 0x20 | 3;
/// Selector of the TSS (a 16-byte descriptor, entries 5 and 6).
pub const TSS_SELECTOR: u16 = 0x28;

/// Transmit register of COM1.
pub const COM1_DATA: u16 = 0x3f8;
/// Line-status register of COM1.
pub const COM1_LINE_STATUS: u16 = 0x3fd;
/// Line status: transmit holding register empty and transmitter empty.
const LINE_STATUS_IDLE: u32 = 0x60;
/// The isa-debug-exit port.
pub const DEBUG_EXIT_PORT: u16 = 0xf4;

/// Physical address of the GDT.
pub const GDT_ADDR: u64 = 0x1000;
/// Physical address of the TSS.
pub const TSS_ADDR: u64 = 0x2000;
/// Top of the IST1 stack (16 KiB).
pub const IST1_STACK_TOP: u64 = 0x8000;
/// Top of the ring-0 stack used on entry from ring 3 (32 KiB).
pub const RSP0_STACK_TOP: u64 = 0x1_0000;
/// Initial RSP (a 960 KiB boot stack below it).
pub const BOOT_STACK_TOP: u64 = 0x10_0000;
/// Programs must load at or above this address.
pub const PROGRAM_MIN_ADDR: u64 = 0x10_0000;
/// Default RAM size.
pub const DEFAULT_MEM_SIZE: u64 = 64 << 20;

/// GDT entries: null, kernel code, kernel data, user data, user code, TSS
/// (two slots).
const GDT_ENTRIES: u64 = 7;
/// TSS offsets (SDM Vol. 3, figure 8-11).
const TSS_RSP0: u64 = 0x04;
const TSS_IST1: u64 = 0x24;
const TSS_IOMAP_BASE: u64 = 0x66;
/// TSS limit: 104 bytes, no I/O permission bitmap.
const TSS_LIMIT: u32 = 0x67;
/// #GP.
const GP_VECTOR: u8 = 13;

/// MSRs the guest-mode variant lets the program access without an exit.
pub const GUEST_PASSTHROUGH_MSRS: &[u32] = &[
    msr::EFER,
    msr::STAR,
    msr::LSTAR,
    msr::CSTAR,
    msr::FMASK,
    msr::FS_BASE,
    msr::GS_BASE,
    msr::KERNEL_GS_BASE,
    msr::TSC_AUX,
    msr::TSC,
    msr::TSC_DEADLINE,
    msr::APIC_BASE,
    msr::PAT,
];

/// How the program runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// On the bare CPU (no VMX).
    #[default]
    Bare,
    /// In VMX guest mode with an identity EPT (see the module docs).
    GuestEpt,
}

/// Configuration of a [`BareMachine`].
#[derive(Debug, Clone)]
pub struct BareConfig {
    /// RAM size in bytes (a multiple of 4 KiB, at least 2 MiB).
    pub mem_size: u64,
    /// Largest page of the identity map (4 KiB or 2 MiB; 1 GiB works too).
    pub page_size: PageSize,
    /// Stop with [`BareError::CycleLimit`] at this many cycles.
    pub max_cycles: Option<u64>,
    pub mode: Mode,
    pub cpu: CpuConfig,
}

impl Default for BareConfig {
    fn default() -> Self {
        BareConfig {
            mem_size: DEFAULT_MEM_SIZE,
            page_size: PageSize::Size2M,
            max_cycles: None,
            mode: Mode::Bare,
            cpu: CpuConfig::default(),
        }
    }
}

/// Where the machine put things.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// RAM the program sees: `[0, ram_size)`.
    pub ram_size: u64,
    /// The program's entry point.
    pub entry: u64,
    /// Physical range of the program's segments.
    pub program: Range<u64>,
    /// The identity page tables (CR3 = `page_tables.start`).
    pub page_tables: Range<Hpa>,
    /// Guest mode: the EPT pointer and the tables, above RAM.
    pub ept: Option<(Eptp, Range<Hpa>)>,
}

/// How the program stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProgramExit {
    /// The value written to the isa-debug-exit port.
    pub value: u32,
}

impl ProgramExit {
    /// The exit status, as QEMU's isa-debug-exit computes it.
    pub fn status(&self) -> u64 {
        (u64::from(self.value) << 1) | 1
    }
    /// The program reported success (wrote 0).
    pub fn success(&self) -> bool {
        self.value == 0
    }
}

/// Counters of a run.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RunStats {
    /// Virtual cycles.
    pub cycles: u64,
    pub cpu: CpuStats,
    pub tlb: TlbStats,
    /// How often `Cpu::run` returned, by exit name.
    pub exits: BTreeMap<&'static str, u64>,
}

/// Why the machine could not be built or the program did not exit.
#[derive(Debug, Error)]
pub enum BareError {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("cannot create machine memory: {0}")]
    Memory(#[from] MemCreateError),
    #[error("bad program: {0}")]
    Elf(#[from] ElfError),
    #[error(
        "program segment {index} ({start:#x}..{end:#x}) is outside the program area \
         {area_start:#x}..{area_end:#x} (below is the machine's, above are the page tables)"
    )]
    ProgramOutsideArea {
        index: usize,
        start: u64,
        end: u64,
        area_start: u64,
        area_end: u64,
    },
    #[error("program segment {index} has virtual address {vaddr:#x} != physical {paddr:#x}; the machine identity-maps memory")]
    NotIdentityLinked {
        index: usize,
        vaddr: u64,
        paddr: u64,
    },
    #[error("building page tables: {0}")]
    PageTables(#[from] PageTableError),
    #[error("writing machine structures: {0}")]
    Setup(MemError),
    #[error("the program halted at rip {rip:#x} with nothing to wake it (RFLAGS.IF={interrupts_enabled:#})")]
    Halted { rip: u64, interrupts_enabled: bool },
    #[error(
        "triple fault at rip {rip:#x}: the CPU shut down (an exception with no working handler)"
    )]
    TripleFault { rip: u64 },
    #[error("machine error at rip {rip:#x}: {error}")]
    MachineError { rip: u64, error: MemError },
    #[error("cycle budget of {limit} cycles exhausted at rip {rip:#x}")]
    CycleLimit { limit: u64, rip: u64 },
    #[error(
        "the program sent an IPI ({ipi:?}) at rip {rip:#x}, but this machine has a single CPU"
    )]
    Ipi { ipi: Ipi, rip: u64 },
    #[error("writing serial output: {0}")]
    Serial(std::io::Error),
    #[error("unexpected VM exit at rip {rip:#x}: {exit:?}")]
    UnexpectedExit { exit: VmExit, rip: u64 },
}

/// What a complete run produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunOutput {
    pub exit: ProgramExit,
    /// Everything written to COM1.
    pub serial: Vec<u8>,
    pub stats: RunStats,
}

/// A one-CPU machine running one program.
pub struct BareMachine {
    mem: PhysMemory,
    cpu: Cpu,
    config: BareConfig,
    layout: Layout,
    exits: BTreeMap<&'static str, u64>,
}

impl std::fmt::Debug for BareMachine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BareMachine")
            .field("config", &self.config)
            .field("layout", &self.layout)
            .finish_non_exhaustive()
    }
}

impl BareMachine {
    /// Builds the machine and loads the program `elf_bytes`, ready to run.
    pub fn new(config: BareConfig, elf_bytes: &[u8]) -> Result<Self, BareError> {
        let ram = config.mem_size;
        if ram % PAGE_SIZE != 0 || ram < 2 * PROGRAM_MIN_ADDR {
            return Err(BareError::Config(format!(
                "memory size {ram:#x} must be a multiple of 4 KiB and at least 2 MiB"
            )));
        }
        let image = elf::parse(elf_bytes)?;

        // Page tables at the top of RAM; EPT (guest mode) above RAM.
        let table_bytes = page_tables::identity_table_bytes(ram, config.page_size);
        let tables = Hpa(ram - table_bytes)..Hpa(ram);
        let ept_bytes = match config.mode {
            Mode::Bare => 0,
            Mode::GuestEpt => page_tables::identity_table_bytes(ram, PageSize::Size2M),
        };
        let host_size = ram
            .checked_add(ept_bytes)
            .ok_or_else(|| BareError::Config(format!("memory size {ram:#x} is too large")))?;

        let area = PROGRAM_MIN_ADDR..tables.start.0;
        for seg in &image.segments {
            if seg.vaddr != seg.paddr {
                return Err(BareError::NotIdentityLinked {
                    index: seg.index,
                    vaddr: seg.vaddr,
                    paddr: seg.paddr,
                });
            }
            if seg.paddr < area.start || seg.paddr_end() > area.end {
                return Err(BareError::ProgramOutsideArea {
                    index: seg.index,
                    start: seg.paddr,
                    end: seg.paddr_end(),
                    area_start: area.start,
                    area_end: area.end,
                });
            }
        }

        let mem = PhysMemory::new(host_size)?;
        let cr3 = page_tables::build_identity_paging(&mem, tables.clone(), ram, config.page_size)?;
        let ept = match config.mode {
            Mode::Bare => None,
            Mode::GuestEpt => {
                let region = Hpa(ram)..Hpa(host_size);
                let eptp =
                    page_tables::build_identity_ept(&mem, region.clone(), ram, PageSize::Size2M)?;
                Some((eptp, region))
            }
        };
        write_gdt(&mem).map_err(BareError::Setup)?;
        write_tss(&mem).map_err(BareError::Setup)?;
        elf::load_identity(&image, &mem)?;

        let mut cpu = Cpu::new(config.cpu.clone());
        let state = cpu.state_mut();
        state.cr3 = cr3.0;
        state.gdtr = DescriptorTable {
            base: GDT_ADDR,
            limit: (GDT_ENTRIES * 8 - 1) as u16,
        };
        state.idtr = DescriptorTable { base: 0, limit: 0 };
        state.tr = Segment {
            selector: TSS_SELECTOR,
            base: TSS_ADDR,
            limit: TSS_LIMIT,
            attr: seg_attr::TYPE_TSS64_BUSY | seg_attr::PRESENT,
        };
        state.rip = image.entry;
        state.set_gpr(Gpr::Rsp, BOOT_STACK_TOP);
        if let Some((eptp, _)) = &ept {
            cpu.set_vmx(Some(guest_controls(*eptp)));
        }

        let (start, end) = image.paddr_span();
        let layout = Layout {
            ram_size: ram,
            entry: image.entry,
            program: start..end,
            page_tables: tables,
            ept,
        };
        Ok(BareMachine {
            mem,
            cpu,
            config,
            layout,
            exits: BTreeMap::new(),
        })
    }

    /// Builds the machine, runs the program to its exit and collects the
    /// serial output.
    pub fn run_elf(config: BareConfig, elf_bytes: &[u8]) -> Result<RunOutput, BareError> {
        let mut machine = BareMachine::new(config, elf_bytes)?;
        let mut serial = Vec::new();
        let exit = machine.run(&mut serial)?;
        Ok(RunOutput {
            exit,
            serial,
            stats: machine.stats(),
        })
    }

    /// The CPU.
    pub fn cpu(&self) -> &Cpu {
        &self.cpu
    }

    /// The CPU, mutably (e.g. to change state before running).
    pub fn cpu_mut(&mut self) -> &mut Cpu {
        &mut self.cpu
    }

    /// Machine memory.
    pub fn memory(&self) -> &PhysMemory {
        &self.mem
    }

    /// Where things are.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The configuration.
    pub fn config(&self) -> &BareConfig {
        &self.config
    }

    /// Counters so far.
    pub fn stats(&self) -> RunStats {
        RunStats {
            cycles: self.cpu.cycles(),
            cpu: self.cpu.stats(),
            tlb: self.cpu.tlb().stats(),
            exits: self.exits.clone(),
        }
    }

    /// Runs until the program writes the isa-debug-exit port, sending COM1
    /// output to `serial`.
    pub fn run(&mut self, serial: &mut dyn Write) -> Result<ProgramExit, BareError> {
        let limit = self.config.max_cycles.unwrap_or(u64::MAX);
        loop {
            let exit = self.cpu.run(&self.mem, limit);
            *self.exits.entry(exit.name()).or_insert(0) += 1;
            let rip = self.cpu.state().rip;
            match exit {
                VmExit::Io {
                    port,
                    size,
                    direction: IoDirection::Out,
                    value,
                } => {
                    self.cpu.skip_instruction();
                    match port {
                        COM1_DATA => serial
                            .write_all(&[value as u8])
                            .map_err(BareError::Serial)?,
                        DEBUG_EXIT_PORT => {
                            serial.flush().map_err(BareError::Serial)?;
                            return Ok(ProgramExit {
                                value: value & size_mask(size),
                            });
                        }
                        _ => {}
                    }
                }
                VmExit::Io {
                    port,
                    size,
                    direction: IoDirection::In,
                    ..
                } => {
                    let value = match port {
                        COM1_LINE_STATUS => LINE_STATUS_IDLE,
                        _ => u32::MAX,
                    };
                    self.cpu.complete_io_in(size, value & size_mask(size));
                }
                VmExit::Hlt => self.handle_hlt()?,
                // An MSR outside the pass-through bitmap does not exist for
                // this guest: #GP(0), as KVM answers an unknown MSR.
                VmExit::MsrRead { .. } | VmExit::MsrWrite { .. } => {
                    self.cpu.inject_event(EventInjection {
                        kind: EventKind::HardwareException,
                        vector: GP_VECTOR,
                        error_code: Some(0),
                        instruction_len: 0,
                    });
                }
                VmExit::TripleFault => return Err(BareError::TripleFault { rip }),
                VmExit::MachineError(error) => return Err(BareError::MachineError { rip, error }),
                VmExit::CycleLimit => return Err(BareError::CycleLimit { limit, rip }),
                VmExit::Ipi(ipi) => return Err(BareError::Ipi { ipi, rip }),
                // No IOAPIC hears it.
                VmExit::EoiBroadcast { .. } => {}
                other => return Err(BareError::UnexpectedExit { exit: other, rip }),
            }
        }
    }

    /// A HLT came back from the CPU. In bare mode the CPU only returns one
    /// when nothing can ever wake it. In guest mode every HLT exits: the
    /// "hypervisor" lets virtual time pass until the APIC timer fires.
    fn handle_hlt(&mut self) -> Result<(), BareError> {
        let state = self.cpu.state();
        let rip = state.rip;
        let interrupts_enabled = state.rflags & rflags::IF != 0;
        let halted = BareError::Halted {
            rip,
            interrupts_enabled,
        };
        if self.config.mode == Mode::Bare || !interrupts_enabled {
            return Err(halted);
        }
        let apic = self.cpu.apic();
        if apic.deliverable_vector().is_none() {
            let Some(deadline) = apic.next_timer_deadline() else {
                return Err(halted);
            };
            // The guest's TSC is the cycle counter plus the TSC offset (0
            // here), so the deadline is a cycle count.
            let now = self.cpu.cycles();
            if deadline > now {
                self.cpu.advance_cycles(deadline - now);
            }
        }
        self.cpu.skip_instruction();
        self.cpu.state_mut().activity = Activity::Active;
        Ok(())
    }
}

/// The VM-execution controls of the guest-mode variant.
fn guest_controls(eptp: Eptp) -> VmxControls {
    VmxControls {
        ept: Some(eptp),
        vpid: 1,
        hlt_exiting: true,
        io_exiting: None,
        virtualize_x2apic: true,
        msr_exiting: MsrExiting::Bitmap {
            read_passthrough: GUEST_PASSTHROUGH_MSRS.to_vec(),
            write_passthrough: GUEST_PASSTHROUGH_MSRS
                .iter()
                .copied()
                .filter(|&m| m != msr::APIC_BASE)
                .collect(),
        },
        ..VmxControls::default()
    }
}

fn size_mask(size: u8) -> u32 {
    match size {
        1 => 0xff,
        2 => 0xffff,
        _ => u32::MAX,
    }
}

/// A flat code or data descriptor (base 0, limit 4 GiB) with the access
/// rights `attr` in VMCS format, whose bits 7:0 and 15:12 are exactly the
/// descriptor's access byte and flags nibble.
fn segment_descriptor(attr: u32) -> u64 {
    let access = u64::from(attr & 0xff);
    let flags = u64::from((attr >> 12) & 0xf);
    0xffff | (0xf << 48) | (access << 40) | (flags << 52)
}

/// The 16-byte descriptor of a busy 64-bit TSS.
fn tss_descriptor(base: u64, limit: u32) -> [u64; 2] {
    let access = u64::from(seg_attr::TYPE_TSS64_BUSY | seg_attr::PRESENT);
    let low = u64::from(limit & 0xffff)
        | ((base & 0xff_ffff) << 16)
        | (access << 40)
        | (u64::from((limit >> 16) & 0xf) << 48)
        | (((base >> 24) & 0xff) << 56);
    [low, base >> 32]
}

fn write_gdt(mem: &PhysMemory) -> Result<(), MemError> {
    let [tss_low, tss_high] = tss_descriptor(TSS_ADDR, TSS_LIMIT);
    let entries = [
        0,
        segment_descriptor(seg_attr::CODE64_KERNEL),
        segment_descriptor(seg_attr::DATA_KERNEL),
        segment_descriptor(seg_attr::DATA_USER),
        segment_descriptor(seg_attr::CODE64_USER),
        tss_low,
        tss_high,
    ];
    debug_assert_eq!(entries.len() as u64, GDT_ENTRIES);
    for (i, e) in entries.iter().enumerate() {
        mem.write_u64(Hpa(GDT_ADDR + 8 * i as u64), *e)?;
    }
    Ok(())
}

fn write_tss(mem: &PhysMemory) -> Result<(), MemError> {
    mem.zero(Hpa(TSS_ADDR), PAGE_SIZE)?;
    mem.write_u64(Hpa(TSS_ADDR + TSS_RSP0), RSP0_STACK_TOP)?;
    mem.write_u64(Hpa(TSS_ADDR + TSS_IST1), IST1_STACK_TOP)?;
    // An I/O-map base past the limit: no I/O permission bitmap.
    mem.write(Hpa(TSS_ADDR + TSS_IOMAP_BASE), 2, u64::from(TSS_LIMIT) + 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::CpuState;

    #[test]
    fn gdt_descriptors_match_the_architectural_encodings() {
        assert_eq!(
            segment_descriptor(seg_attr::CODE64_KERNEL),
            0x00af_9b00_0000_ffff
        );
        assert_eq!(
            segment_descriptor(seg_attr::DATA_KERNEL),
            0x00cf_9300_0000_ffff
        );
        assert_eq!(
            segment_descriptor(seg_attr::DATA_USER),
            0x00cf_f300_0000_ffff
        );
        assert_eq!(
            segment_descriptor(seg_attr::CODE64_USER),
            0x00af_fb00_0000_ffff
        );
        assert_eq!(
            tss_descriptor(0x1234_5678_9abc_def0, 0x67),
            [0x9a00_8bbc_def0_0067, 0x1234_5678]
        );
    }

    #[test]
    fn gdt_selectors_agree_with_the_default_cpu_state() {
        let s = CpuState::default();
        assert_eq!(s.cs.selector, KERNEL_CS);
        assert_eq!(s.ds.selector, KERNEL_DS);
        assert_eq!(s.ss.selector, KERNEL_DS);
        // SYSRET derives both user selectors from one STAR field.
        let star_base = USER_DS - 8;
        assert_eq!(star_base + 16, USER_CS);
    }

    #[test]
    fn tss_and_gdt_contents() {
        let mem = PhysMemory::new(1 << 20).unwrap();
        write_gdt(&mem).unwrap();
        write_tss(&mem).unwrap();
        assert_eq!(mem.read_u64(Hpa(TSS_ADDR + 4)).unwrap(), RSP0_STACK_TOP);
        assert_eq!(mem.read_u64(Hpa(TSS_ADDR + 0x24)).unwrap(), IST1_STACK_TOP);
        assert_eq!(mem.read(Hpa(TSS_ADDR + 0x66), 2).unwrap(), 0x68);
        let user_cs = mem
            .read_u64(Hpa(GDT_ADDR + u64::from(USER_CS & !7)))
            .unwrap();
        assert_eq!((user_cs >> 45) & 3, 3, "user code DPL");
        let tss_low = mem
            .read_u64(Hpa(GDT_ADDR + u64::from(TSS_SELECTOR)))
            .unwrap();
        assert_eq!((tss_low >> 16) & 0xff_ffff, TSS_ADDR);
    }

    #[test]
    fn exit_status_mirrors_isa_debug_exit() {
        assert_eq!(ProgramExit { value: 0 }.status(), 1);
        assert_eq!(ProgramExit { value: 1 }.status(), 3);
        assert_eq!(ProgramExit { value: 0x7f }.status(), 0xff);
        assert_eq!(ProgramExit { value: u32::MAX }.status(), 0x1_ffff_ffff);
        assert!(ProgramExit { value: 0 }.success());
    }
}
