//! A tiny test rig: 64 MiB of memory identity-mapped with 2 MiB pages, a
//! GDT with kernel/user segments and a TSS, an IDT whose handler for vector
//! v does `mov r15d, 0x1000+v; hlt`, and code assembled with iced-x86.
#![allow(dead_code)]

use iced_x86::code_asm::CodeAssembler;
use machine::cpu::state::{seg_attr, Segment};
use machine::jit::JitStats;
use machine::vmx::VmxControls;
use machine::{Cpu, CpuConfig, Engine, Hpa, PhysMemory, VmExit};

pub const MEM: u64 = 64 << 20;
pub const PML4: u64 = 0x1000;
pub const PDPT: u64 = 0x2000;
pub const PD: u64 = 0x3000;
pub const GDT: u64 = 0x5000;
pub const TSS: u64 = 0x6000;
pub const IDT: u64 = 0x7000;
pub const HANDLERS: u64 = 0x10000;
pub const CODE: u64 = 0x100000;
pub const STACK_TOP: u64 = 0x1ff000;
pub const RSP0: u64 = 0x1f0000;
pub const IST1: u64 = 0x1e0000;
pub const DATA: u64 = 0x300000;
pub const KERNEL_CS: u16 = 0x08;
pub const KERNEL_DS: u16 = 0x10;
pub const USER_DS: u16 = 0x1b;
pub const USER_CS: u16 = 0x23;
pub const TSS_SEL: u16 = 0x28;

/// Marker a handler leaves in r15: 0x1000 + vector.
pub const HANDLER_MARK: u64 = 0x1000;

pub struct Rig {
    pub mem: PhysMemory,
    pub cpu: Cpu,
}

fn w(mem: &PhysMemory, a: u64, v: u64) {
    mem.write_u64(Hpa(a), v).unwrap();
}

/// Builds the rig with `code` assembled at CODE.
pub fn rig(code: impl FnOnce(&mut CodeAssembler)) -> Rig {
    let mem = PhysMemory::new(MEM).unwrap();
    // Identity map with 2 MiB user+writable pages.
    w(&mem, PML4, PDPT | 0x7);
    w(&mem, PDPT, PD | 0x7);
    for i in 0..(MEM >> 21) {
        w(&mem, PD + i * 8, (i << 21) | 0x87);
    }
    // GDT.
    let code64 = |dpl: u64| 0x00af_9a00_0000_ffffu64 | (dpl << 45);
    let data = |dpl: u64| 0x00cf_9200_0000_ffffu64 | (dpl << 45);
    w(&mem, GDT, 0);
    w(&mem, GDT + 0x08, code64(0));
    w(&mem, GDT + 0x10, data(0));
    w(&mem, GDT + 0x18, data(3));
    w(&mem, GDT + 0x20, code64(3));
    let tss_lo = 0x67 | ((TSS & 0xff_ffff) << 16) | (0x89u64 << 40) | (((TSS >> 24) & 0xff) << 56);
    w(&mem, GDT + 0x28, tss_lo);
    w(&mem, GDT + 0x30, TSS >> 32);
    // TSS: RSP0 and IST1.
    w(&mem, TSS + 4, RSP0);
    w(&mem, TSS + 0x24, IST1);
    // IDT and handlers.
    for v in 0..256u64 {
        let h = HANDLERS + v * 16;
        let mut a = CodeAssembler::new(64).unwrap();
        a.mov(iced_x86::code_asm::r15d, (HANDLER_MARK + v) as u32)
            .unwrap();
        a.hlt().unwrap();
        let bytes = a.assemble(h).unwrap();
        mem.write_bytes(Hpa(h), &bytes).unwrap();
        let lo = (h & 0xffff)
            | ((KERNEL_CS as u64) << 16)
            | (0x8eu64 << 40)
            | (((h >> 16) & 0xffff) << 48);
        w(&mem, IDT + v * 16, lo);
        w(&mem, IDT + v * 16 + 8, h >> 32);
    }
    let mut a = CodeAssembler::new(64).unwrap();
    code(&mut a);
    let bytes = a.assemble(CODE).unwrap();
    mem.write_bytes(Hpa(CODE), &bytes).unwrap();

    let mut cpu = Cpu::new(CpuConfig::default());
    let s = cpu.state_mut();
    s.cr3 = PML4;
    s.gdtr.base = GDT;
    s.gdtr.limit = 0x37;
    s.idtr.base = IDT;
    s.idtr.limit = 0xfff;
    s.tr = Segment {
        selector: TSS_SEL,
        base: TSS,
        limit: 0x67,
        attr: seg_attr::TYPE_TSS64_BUSY | seg_attr::PRESENT,
    };
    s.rip = CODE;
    s.gpr[4] = STACK_TOP;
    Rig { mem, cpu }
}

impl Rig {
    /// The same machine with a TLB of this geometry (a new CPU in the
    /// rig's state).
    pub fn with_tlb(mut self, tlb: machine::mmu::tlb::TlbConfig) -> Self {
        let state = self.cpu.state().clone();
        self.cpu = Cpu::new(CpuConfig {
            tlb,
            ..CpuConfig::default()
        });
        *self.cpu.state_mut() = state;
        self
    }

    /// Enters guest mode with these controls.
    pub fn guest(mut self, controls: VmxControls) -> Self {
        self.cpu.set_vmx(Some(controls));
        self
    }

    /// The same machine on `engine` (the interpreter or the translator).
    #[allow(dead_code)]
    pub fn with_engine(mut self, engine: machine::Engine) -> Self {
        let state = self.cpu.state().clone();
        self.cpu = Cpu::new(CpuConfig {
            engine,
            ..CpuConfig::default()
        });
        *self.cpu.state_mut() = state;
        self
    }

    /// Runs to the HLT at the end of the code or in the handler of the
    /// first exception; returns the vector taken (from r15's mark), if any.
    #[allow(dead_code)]
    pub fn vector_taken(&mut self) -> Option<u8> {
        assert_eq!(self.run(), machine::VmExit::Hlt);
        let mark = self.gpr(15);
        (mark != 0).then(|| (mark - HANDLER_MARK) as u8)
    }

    /// Runs with a generous cycle limit.
    pub fn run(&mut self) -> machine::VmExit {
        let limit = self.cpu.cycles() + 10_000_000;
        self.cpu.run(&self.mem, limit)
    }

    pub fn gpr(&self, i: usize) -> u64 {
        self.cpu.state().gpr[i]
    }

    /// Switches the CPU to ring 3 (user segments), keeping RIP and RSP.
    pub fn enter_user_mode(&mut self) {
        let s = self.cpu.state_mut();
        s.cs = Segment {
            selector: USER_CS,
            base: 0,
            limit: 0xffff_ffff,
            attr: seg_attr::CODE64_USER,
        };
        s.ss = Segment {
            selector: USER_DS,
            base: 0,
            limit: 0xffff_ffff,
            attr: seg_attr::DATA_USER,
        };
    }
}

/// Controls for tests: everything off except HLT exiting, VPID 1, no EPT.
pub fn controls() -> VmxControls {
    VmxControls {
        hlt_exiting: true,
        external_interrupt_exiting: false,
        ..VmxControls::default()
    }
}

/// Everything a run's outcome is made of (what the engines must agree
/// on).
#[derive(Debug, PartialEq, Eq)]
pub struct Outcome {
    pub exit: VmExit,
    pub cycles: u64,
    pub state: u64,
    /// A digest of DATA's first 32 KiB and CODE's 4 KiB.
    pub memory: u64,
    pub instructions: u64,
    pub tlb: machine::mmu::tlb::TlbStats,
    /// The whole TLB: entries, places and recently-used bits.
    pub tlb_image: machine::mmu::tlb::TlbImage,
    pub gpr: [u64; 16],
    pub rip: u64,
}

impl Rig {
    /// Runs on `engine` (blocks translated at their `threshold`-th run)
    /// to the end: the outcome and the translator's counters.
    pub fn outcome(mut self, engine: Engine, threshold: u32) -> (Outcome, JitStats) {
        self.cpu.set_engine(engine);
        self.cpu.set_jit_threshold(threshold);
        let exit = self.run();
        let mut h = machine::cpu::state::Fnv::default();
        let mut page = vec![0u8; 0x8000];
        self.mem.read_bytes(Hpa(DATA), &mut page).unwrap();
        h.bytes(&page);
        let mut code = vec![0u8; 0x1000];
        self.mem.read_bytes(Hpa(CODE), &mut code).unwrap();
        h.bytes(&code);
        (
            Outcome {
                exit,
                cycles: self.cpu.cycles(),
                state: self.cpu.state_digest(),
                memory: h.finish(),
                instructions: self.cpu.stats().instructions,
                tlb: self.cpu.tlb().stats(),
                tlb_image: self.cpu.tlb().image(),
                gpr: self.cpu.state().gpr,
                rip: self.cpu.state().rip,
            },
            self.cpu.jit_stats(),
        )
    }
}

/// Runs a program with `run` (on an engine, blocks translated at a
/// threshold) on the interpreter, then on the translator at each of
/// `thresholds`: each translator run must end as the interpreter's
/// (`what` names the case). The interpreter's outcome and the
/// translator's counters, a run per threshold.
pub fn engines_agree<O: PartialEq + std::fmt::Debug>(
    what: &str,
    thresholds: &[u32],
    run: impl Fn(Engine, u32) -> (O, JitStats),
) -> (O, Vec<JitStats>) {
    let (interp, _) = run(Engine::Interp, 1);
    let stats = thresholds
        .iter()
        .map(|&threshold| {
            let (jit, stats) = run(Engine::Jit, threshold);
            assert!(
                interp == jit,
                "{what}: interp vs jit (translating at run {threshold}):\n{interp:?}\n{jit:?}"
            );
            stats
        })
        .collect();
    (interp, stats)
}
