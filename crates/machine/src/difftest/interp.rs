//! Running code in the interpreter at the tester's fixed addresses.
//!
//! [`Sandbox`] builds a small machine: identity-mapped 4-level page tables
//! mapping the code page, the window pages (user, writable; data pages
//! NX as the native child's are) and supervisor pages holding a GDT, a TSS,
//! an IDT whose gates all lead to a `hlt` loop, and a ring-0 stack. The code
//! is followed by a `vmcall` sentinel. [`run_snippet`] runs a difftest case
//! in ring 3 guest mode with every exception exiting; the fuzzer also uses
//! ring 0 bare mode, where exceptions go through the IDT.

use super::layout::*;
use super::{FaultKind, FinalState, InitialState, Stop, COMPARED_FLAGS};
use crate::cpu::state::{cr0, cr4, rflags, seg_attr, CpuState, Segment};
use crate::jit::Engine;
use crate::memory::{MemCreateError, MemError, PhysMemory};
use crate::mmu::paging::pte;
use crate::vmx::{VmExit, VmxControls};
use crate::{Cpu, CpuConfig, Hpa};
use thiserror::Error;

/// The bytes of `vmcall`, the end-of-snippet sentinel.
pub const SENTINEL: [u8; 3] = [0x0f, 0x01, 0xc1];

/// Errors building a sandbox.
#[derive(Debug, Error)]
pub enum SandboxError {
    #[error("creating machine memory: {0}")]
    Create(#[from] MemCreateError),
    #[error("writing machine memory: {0}")]
    Memory(#[from] MemError),
    #[error("code of {0} bytes does not fit the code page")]
    CodeTooLong(usize),
    #[error("window of {0} bytes, expected {WINDOW_SIZE}")]
    WindowSize(usize),
}

/// Privilege and control setup of a sandbox run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SandboxMode {
    /// Ring 3 in guest mode with these exceptions (bitmap) exiting; the
    /// others are delivered through the IDT.
    UserGuest { exception_bitmap: u32 },
    /// Ring 0, no VMX: exceptions go through the IDT.
    KernelBare,
    /// As `UserGuest`, but CS is the 32-bit user code segment
    /// (compatibility mode).
    UserGuestCompat { exception_bitmap: u32 },
    /// Ring 0, no VMX, 16-bit real mode (paging off): the code page is
    /// CS's cached base (as a protected-mode loader can leave it), the
    /// data and stack pages DS/ES/FS/GS's and SS's, the IVT at the IDT's
    /// address. For the fuzzer: the 16-bit decoding and execution paths.
    KernelReal,
    /// Ring 0, no VMX, 32-bit protected mode with paging off and flat
    /// segments. For the fuzzer: legacy-mode execution outside IA-32e.
    KernelProtected32,
}

/// A machine with the tester's memory layout.
pub struct Sandbox {
    mem: PhysMemory,
}

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox").finish_non_exhaustive()
    }
}

/// Code and data segment descriptors (flat, 64-bit code).
const GDT_KERNEL_CODE: u64 = 0x00af_9b00_0000_ffff;
const GDT_KERNEL_DATA: u64 = 0x00cf_9300_0000_ffff;
const GDT_USER_DATA: u64 = 0x00cf_f300_0000_ffff;
const GDT_USER_CODE: u64 = 0x00af_fb00_0000_ffff;
/// Flat 32-bit ring-3 code (compatibility mode), at Linux's selector 0x23.
const GDT_USER_CODE32: u64 = 0x00cf_fb00_0000_ffff;
/// The IDT handler: `hlt; jmp $-3` (a halt that stays halted).
const HANDLER_CODE: [u8; 3] = [0xf4, 0xeb, 0xfd];

impl Sandbox {
    /// Builds the machine with `code` (at most one page minus the
    /// sentinel) at [`CODE_ADDR`] and `window` in the window pages.
    pub fn new(code: &[u8], window: &[u8]) -> Result<Sandbox, SandboxError> {
        if code.len() + SENTINEL.len() > CODE_SIZE as usize {
            return Err(SandboxError::CodeTooLong(code.len()));
        }
        if window.len() != WINDOW_SIZE {
            return Err(SandboxError::WindowSize(window.len()));
        }
        let mem = PhysMemory::new(MEMORY_SIZE)?;
        let sandbox = Sandbox { mem };
        sandbox.build_page_tables()?;
        sandbox.build_descriptor_tables()?;
        let m = &sandbox.mem;
        m.write_bytes(Hpa(CODE_ADDR), code)?;
        m.write_bytes(Hpa(CODE_ADDR + code.len() as u64), &SENTINEL)?;
        m.write_bytes(Hpa(DATA_ADDR), &window[..WINDOW_PAGE_SIZE as usize])?;
        m.write_bytes(Hpa(STACK_ADDR), &window[WINDOW_PAGE_SIZE as usize..])?;
        m.write_bytes(Hpa(HANDLER_ADDR), &HANDLER_CODE)?;
        Ok(sandbox)
    }

    fn build_page_tables(&self) -> Result<(), MemError> {
        let m = &self.mem;
        let table = pte::PRESENT | pte::WRITABLE | pte::USER;
        let index = |addr: u64, level: u32| (addr >> (12 + 9 * level)) & 0x1ff;
        m.write_u64(Hpa(PML4_ADDR + 8 * index(CODE_ADDR, 3)), PDPT_ADDR | table)?;
        m.write_u64(Hpa(PDPT_ADDR + 8 * index(CODE_ADDR, 2)), PD_ADDR | table)?;
        m.write_u64(Hpa(PD_ADDR + 8 * index(CODE_ADDR, 1)), PT_ADDR | table)?;
        let user = pte::PRESENT | pte::WRITABLE | pte::USER;
        let supervisor = pte::PRESENT | pte::WRITABLE;
        let pages = [
            (CODE_ADDR, user),
            (DATA_ADDR, user | pte::NX),
            (STACK_ADDR, user | pte::NX),
            (GDT_ADDR, supervisor | pte::NX),
            (IDT_ADDR, supervisor | pte::NX),
            (HANDLER_ADDR, supervisor),
            (KERNEL_STACK_TOP - 0x1000, supervisor | pte::NX),
        ];
        for (addr, flags) in pages {
            m.write_u64(Hpa(PT_ADDR + 8 * index(addr, 0)), addr | flags)?;
        }
        Ok(())
    }

    fn build_descriptor_tables(&self) -> Result<(), MemError> {
        let m = &self.mem;
        let gdt =
            |selector: u16, value: u64| m.write_u64(Hpa(GDT_ADDR + (selector as u64 & !7)), value);
        gdt(KERNEL_CS, GDT_KERNEL_CODE)?;
        gdt(KERNEL_DS, GDT_KERNEL_DATA)?;
        gdt(USER_DS, GDT_USER_DATA)?;
        gdt(USER_CS, GDT_USER_CODE)?;
        gdt(super::gen32::USER32_CS, GDT_USER_CODE32)?;
        // 16-byte available 64-bit TSS descriptor (type 9), limit 0x67.
        let tss_low = 0x67
            | ((TSS_ADDR & 0xff_ffff) << 16)
            | (0x89 << 40)
            | (((TSS_ADDR >> 24) & 0xff) << 56);
        gdt(TSS_SELECTOR, tss_low)?;
        m.write_u64(Hpa(GDT_ADDR + TSS_SELECTOR as u64 + 8), TSS_ADDR >> 32)?;
        // TSS: RSP0 at offset 4.
        m.write(Hpa(TSS_ADDR + 4), 8, KERNEL_STACK_TOP)?;
        // 256 interrupt gates (type 0xe, DPL 0, present) to the handler.
        for vector in 0..256u64 {
            let low = (HANDLER_ADDR & 0xffff)
                | ((KERNEL_CS as u64) << 16)
                | (0x8e << 40)
                | (((HANDLER_ADDR >> 16) & 0xffff) << 48);
            m.write_u64(Hpa(IDT_ADDR + 16 * vector), low)?;
            m.write_u64(Hpa(IDT_ADDR + 16 * vector + 8), HANDLER_ADDR >> 32)?;
        }
        Ok(())
    }

    /// The machine memory.
    pub fn memory(&self) -> &PhysMemory {
        &self.mem
    }

    /// A CPU about to run the code at [`CODE_ADDR`] in `mode`, with these
    /// registers and RFLAGS (IF and the fixed bit are added; only the
    /// arithmetic flags and DF of `flags` are used).
    pub fn cpu(&self, mode: &SandboxMode, gpr: &[u64; 16], flags: u64) -> Cpu {
        let mut cpu = Cpu::new(CpuConfig::default());
        let s = cpu.state_mut();
        s.gpr = *gpr;
        s.rip = CODE_ADDR;
        s.rflags = (flags & COMPARED_FLAGS) | rflags::FIXED1 | rflags::IF;
        s.cr3 = PML4_ADDR;
        // XSAVE enabled with x87 and SSE, as a host OS enables it (the
        // host's XCR0 may have more, which the snippets keep out of the
        // comparison).
        s.cr4 |= cr4::OSXSAVE;
        s.xcr0 = crate::cpu::xsave::XCR0_SUPPORTED;
        s.gdtr.base = GDT_ADDR;
        s.gdtr.limit = TSS_SELECTOR + 15;
        s.idtr.base = IDT_ADDR;
        s.idtr.limit = 256 * 16 - 1;
        s.tr = Segment {
            selector: TSS_SELECTOR,
            base: TSS_ADDR,
            limit: 0x67,
            attr: seg_attr::TYPE_TSS64_BUSY | seg_attr::PRESENT,
        };
        let flat = |selector: u16, attr: u32| Segment {
            selector,
            base: 0,
            limit: 0xffff_ffff,
            attr,
        };
        let (cs, ds) = match mode {
            SandboxMode::UserGuest { .. } => (
                flat(USER_CS, seg_attr::CODE64_USER),
                flat(USER_DS, seg_attr::DATA_USER),
            ),
            SandboxMode::UserGuestCompat { .. } => (
                flat(
                    super::gen32::USER32_CS,
                    (seg_attr::CODE64_USER & !seg_attr::LONG) | seg_attr::DB,
                ),
                flat(USER_DS, seg_attr::DATA_USER),
            ),
            SandboxMode::KernelBare | SandboxMode::KernelReal | SandboxMode::KernelProtected32 => (
                flat(KERNEL_CS, seg_attr::CODE64_KERNEL),
                flat(KERNEL_DS, seg_attr::DATA_KERNEL),
            ),
        };
        s.cs = cs;
        s.ss = ds;
        s.ds = ds;
        s.es = ds;
        s.fs = ds;
        s.gs = ds;
        match mode {
            SandboxMode::KernelReal => {
                let real = CpuState::real_mode_at(0, 0);
                s.cr0 = real.cr0;
                s.cr4 = 0;
                s.efer = 0;
                let based = |segment: Segment, base: u64| Segment { base, ..segment };
                s.cs = based(real.cs, CODE_ADDR);
                s.ds = based(real.ds, DATA_ADDR);
                s.es = s.ds;
                s.fs = s.ds;
                s.gs = s.ds;
                s.ss = based(real.ss, STACK_ADDR);
                s.rip = 0;
                s.idtr.limit = 0x3ff;
            }
            SandboxMode::KernelProtected32 => {
                s.cr0 = cr0::PE | cr0::ET;
                s.cr4 = 0;
                s.efer = 0;
                s.cs = flat(
                    KERNEL_CS,
                    (seg_attr::CODE64_KERNEL & !seg_attr::LONG) | seg_attr::DB,
                );
            }
            _ => {}
        }
        if let SandboxMode::UserGuest { exception_bitmap }
        | SandboxMode::UserGuestCompat { exception_bitmap } = mode
        {
            cpu.set_vmx(Some(VmxControls {
                exception_bitmap: *exception_bitmap,
                ept: None,
                vpid: 1,
                ..Default::default()
            }));
        }
        cpu
    }

    /// The current contents of the window.
    pub fn window(&self) -> Vec<u8> {
        let mut window = vec![0u8; WINDOW_SIZE];
        let (data, stack) = window.split_at_mut(WINDOW_PAGE_SIZE as usize);
        // The window pages are inside memory by construction (checked in
        // `new`), so these reads cannot fail; keep zeros if they ever did.
        let _ = self.mem.read_bytes(Hpa(DATA_ADDR), data);
        let _ = self.mem.read_bytes(Hpa(STACK_ADDR), stack);
        window
    }
}

/// Runs `code` from `initial` in ring 3 guest mode with every exception
/// exiting, until the sentinel (`Stop::Finished`), an exception
/// (`Stop::Fault` at the faulting RIP) or anything else (`Stop::Abnormal`,
/// including `cycle_limit` being reached).
pub fn run_snippet(
    code: &[u8],
    initial: &InitialState,
    cycle_limit: u64,
) -> Result<FinalState, SandboxError> {
    run_snippet_bits(code, initial, cycle_limit, 64)
}

/// [`run_snippet`] for `bits`-bit code: 64, or 32 (in compatibility mode,
/// CS the 32-bit user code segment).
pub fn run_snippet_bits(
    code: &[u8],
    initial: &InitialState,
    cycle_limit: u64,
    bits: u32,
) -> Result<FinalState, SandboxError> {
    run_snippet_on(code, initial, cycle_limit, bits, Engine::Interp).map(|r| r.state)
}

/// A run of a snippet on one engine: the final state and the counts
/// virtual time is made of.
#[derive(Debug, Clone)]
pub struct EngineRun {
    pub state: FinalState,
    pub cycles: u64,
    pub instructions: u64,
    pub tlb: crate::mmu::tlb::TlbStats,
}

/// [`run_snippet_bits`] on `engine`. The translating engine translates
/// every block on its first run here (a snippet's blocks mostly run once).
pub fn run_snippet_on(
    code: &[u8],
    initial: &InitialState,
    cycle_limit: u64,
    bits: u32,
    engine: Engine,
) -> Result<EngineRun, SandboxError> {
    let sandbox = Sandbox::new(code, &initial.window)?;
    let exception_bitmap = 0xffff_ffff;
    let mode = if bits == 32 {
        SandboxMode::UserGuestCompat { exception_bitmap }
    } else {
        SandboxMode::UserGuest { exception_bitmap }
    };
    let mut cpu = sandbox.cpu(&mode, &initial.gpr, initial.rflags);
    cpu.state_mut().fpu = initial.fpu;
    cpu.set_engine(engine);
    cpu.set_jit_threshold(1);
    let sentinel_rip = CODE_ADDR + code.len() as u64;
    let exit = cpu.run(sandbox.memory(), cycle_limit);
    let state = cpu.state();
    let stop = match exit {
        VmExit::Vmcall if state.rip == sentinel_rip => Stop::Finished,
        VmExit::Vmcall => {
            Stop::Abnormal(format!("vmcall at {:#x}, not at the sentinel", state.rip))
        }
        VmExit::Exception {
            vector,
            error_code,
            qualification,
        } => Stop::Fault {
            kind: FaultKind::from_vector(vector),
            raw: vector as i32,
            address: match (vector, error_code) {
                (14, _) => Some(qualification),
                _ => None,
            },
        },
        other => Stop::Abnormal(format!("unexpected exit {other:?}")),
    };
    Ok(EngineRun {
        state: FinalState {
            stop,
            rip: state.rip,
            gpr: state.gpr,
            rflags: state.rflags,
            window: sandbox.window(),
            fpu: state.fpu,
        },
        cycles: cpu.cycles(),
        instructions: cpu.stats().instructions,
        tlb: cpu.tlb().stats(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_layout_is_consistent() {
        let window: Vec<u8> = (0..WINDOW_SIZE).map(|i| i as u8).collect();
        let sandbox = Sandbox::new(&[0x90], &window).unwrap();
        assert_eq!(sandbox.window(), window);
        let m = sandbox.memory();
        assert_eq!(m.read(Hpa(CODE_ADDR), 1).unwrap(), 0x90);
        assert_eq!(m.read(Hpa(CODE_ADDR + 1), 1).unwrap(), 0x0f);
        // Walk the tables by hand for every mapped page.
        for addr in [
            CODE_ADDR,
            DATA_ADDR,
            STACK_ADDR,
            GDT_ADDR,
            IDT_ADDR,
            HANDLER_ADDR,
        ] {
            let mut table = PML4_ADDR;
            for level in (0..4).rev() {
                let entry = m
                    .read_u64(Hpa(table + 8 * ((addr >> (12 + 9 * level)) & 0x1ff)))
                    .unwrap();
                assert!(entry & pte::PRESENT != 0, "{addr:#x} level {level}");
                table = entry & pte::ADDR_MASK;
            }
            assert_eq!(table, addr);
        }
        assert!(Sandbox::new(&[0; 4094], &window).is_err());
        assert!(Sandbox::new(&[], &window[1..]).is_err());
    }
}
