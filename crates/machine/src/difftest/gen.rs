//! The random case generator.
//!
//! A case is 1 to `max_items` items. Most items are one instruction whose
//! form (iced `Code`) is drawn from every legacy 64-bit encoding of a chosen
//! mnemonic, with operands instantiated from the form's operand kinds:
//! registers of every width (including AH..BH), memory operands in all
//! addressing modes that stay inside the window, immediates biased to edge
//! values. Some items carry setup instructions the semantics need: string
//! instructions get RSI/RDI/RCX pointing into the window, a bit test on
//! memory with a register offset gets an offset that stays in the window,
//! 16-bit SHLD/SHRD by CL get a count. Jump items jump forward to a later
//! item or to the end.
//!
//! Memory operands are based on two registers that no generated instruction
//! writes (the window base and a small index) or on RSP (which only
//! pushes and pops move, by a bounded amount), so every memory access is
//! inside the window. The [`Tracker`] rejects any instruction that reads
//! undefined state; a rejected item is drawn again.

use super::defined::{Definedness, Hints, Tracker};
use super::layout::{self, CODE_ADDR, DATA_ADDR, INITIAL_RSP, STACK_ADDR, WINDOW_PAGE_SIZE};
use super::rng::Rng;
use super::InitialState;
use crate::cpu::state::rflags;
use iced_x86::{
    BlockEncoder, BlockEncoderOptions, Code, CpuidFeature, Decoder, DecoderOptions, Encoder,
    EncodingKind, Formatter, IcedError, Instruction, InstructionBlock, IntelFormatter,
    MemoryOperand, Mnemonic, OpCodeOperandKind, Register, RepPrefixKind,
};
use std::sync::OnceLock;

/// What the generator may use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GenConfig {
    /// Items per case are drawn from `1..=max_items`.
    pub max_items: usize,
    /// Generate LZCNT (needs the host's ABM/LZCNT).
    pub lzcnt: bool,
    /// Generate TZCNT (needs BMI1; without it the bytes mean REP BSF).
    pub tzcnt: bool,
    /// Generate POPCNT.
    pub popcnt: bool,
    /// The instruction groups cases are drawn from (each case belongs to
    /// one).
    pub groups: Vec<Group>,
}

/// A family of cases: what the generator draws instructions from and
/// which state it randomises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Group {
    /// The integer ISA (general registers, flags, memory).
    Int,
    /// SSE/SSE2 with integer instructions mixed in: random XMM registers
    /// and MXCSR, compared with the general state.
    Sse,
    /// x87 with integer instructions mixed in: a random x87 stack, tags,
    /// control and status words; all eight 80-bit registers, FCW, FSW and
    /// the tag word compared.
    X87,
    /// 32-bit code in compatibility mode (see [`super::gen32`]).
    C32,
    /// XSAVE, XSAVEOPT and XRSTOR (and their REX.W forms) with a
    /// requested-feature mask within x87 | SSE (EDX:EAX = 0:0..3), between
    /// SSE and x87 instructions; a random x87 stack, XMM registers and
    /// MXCSR. What depends on the host's XCR0 (XGETBV's value, XSTATE_BV
    /// bits of components beyond SSE) and the init and modified
    /// optimizations the SDM leaves to the implementation are kept out
    /// (see `Generator::xsave`).
    Xsave,
}

impl Group {
    /// Every group, in the order reports list them.
    pub const ALL: [Group; 5] = [Group::Int, Group::Sse, Group::X87, Group::C32, Group::Xsave];

    /// The group's name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Group::Int => "int",
            Group::Sse => "sse",
            Group::X87 => "x87",
            Group::C32 => "c32",
            Group::Xsave => "xsave",
        }
    }

    /// The code size the group's snippets are encoded for.
    pub fn bits(self) -> u32 {
        match self {
            Group::C32 => 32,
            _ => 64,
        }
    }

    /// The group named `name`.
    pub fn from_name(name: &str) -> Option<Group> {
        Group::ALL.into_iter().find(|g| g.name() == name)
    }

    /// Relative frequency in a campaign over several groups.
    fn weight(self) -> u32 {
        match self {
            Group::Int => 1,
            Group::Sse => 1,
            Group::X87 => 1,
            Group::C32 => 1,
            Group::Xsave => 1,
        }
    }
}

impl GenConfig {
    /// All instructions the host CPU supports (features from CPUID).
    pub fn for_host() -> GenConfig {
        #[cfg(target_arch = "x86_64")]
        {
            GenConfig {
                max_items: 8,
                lzcnt: std::arch::is_x86_feature_detected!("lzcnt"),
                tzcnt: std::arch::is_x86_feature_detected!("bmi1"),
                popcnt: std::arch::is_x86_feature_detected!("popcnt"),
                // XSAVE and XSAVEOPT, enabled by the host OS.
                groups: Group::ALL
                    .into_iter()
                    .filter(|&g| {
                        g != Group::Xsave
                            || (std::arch::is_x86_feature_detected!("xsave")
                                && std::arch::is_x86_feature_detected!("xsaveopt"))
                    })
                    .collect(),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            GenConfig {
                max_items: 8,
                lzcnt: false,
                tzcnt: false,
                popcnt: false,
                groups: Group::ALL.to_vec(),
            }
        }
    }
}

/// The definedness in force when the instruction at `addr` starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    pub addr: u64,
    pub defined: Definedness,
}

/// One generated case.
#[derive(Debug, Clone)]
pub struct Case {
    pub seed: u64,
    pub index: u64,
    pub group: Group,
    /// The snippet, to be placed at [`CODE_ADDR`]; execution that reaches
    /// its end has finished.
    pub code: Vec<u8>,
    pub initial: InitialState,
    /// One per reachable instruction, in address order.
    pub checkpoints: Vec<Checkpoint>,
    /// The address of every instruction, reachable or not, in order.
    pub boundaries: Vec<u64>,
    /// Definedness at the end of the snippet.
    pub end: Definedness,
}

impl Case {
    /// A case from hand-written code: every instruction boundary (found by
    /// decoding) is a checkpoint and everything counts as defined, so the
    /// author vouches that the code reads no undefined state.
    pub fn handwritten(code: Vec<u8>, initial: InitialState) -> Case {
        let boundaries: Vec<u64> =
            Decoder::with_ip(64, &code, CODE_ADDR, DecoderOptions::NO_INVALID_CHECK)
                .iter()
                .map(|i| i.ip())
                .collect();
        let checkpoints = boundaries
            .iter()
            .map(|&addr| Checkpoint {
                addr,
                defined: Definedness::ALL_DEFINED,
            })
            .collect();
        Case {
            seed: 0,
            index: 0,
            group: Group::Int,
            code,
            initial,
            checkpoints,
            boundaries,
            end: Definedness::ALL_DEFINED,
        }
    }

    /// The definedness to compare with when a run stopped at `rip`
    /// (`finished`: the end of the snippet). For an address that is not an
    /// instruction start (which a correct run never reports) the union of
    /// all points, so nothing undefined anywhere is compared.
    pub fn defined_at(&self, rip: u64, finished: bool) -> Definedness {
        if finished {
            return self.end;
        }
        if let Some(c) = self.checkpoints.iter().find(|c| c.addr == rip) {
            return c.defined;
        }
        let mut all = self.end;
        for c in &self.checkpoints {
            all.merge(&c.defined);
        }
        all
    }

    /// The snippet disassembled: (address, bytes, Intel syntax), one
    /// entry per generated instruction (so an over-long instruction shows
    /// as one entry).
    pub fn disassembly(&self) -> Vec<(u64, Vec<u8>, String)> {
        let mut ends = self.boundaries.iter().skip(1).copied().collect::<Vec<_>>();
        ends.push(CODE_ADDR + self.code.len() as u64);
        self.boundaries
            .iter()
            .zip(ends)
            .map(|(&start, end)| {
                let bytes = &self.code[(start - CODE_ADDR) as usize..(end - CODE_ADDR) as usize];
                let mut decoded = disassemble_bits(bytes, start, self.group.bits());
                let text = match decoded.len() {
                    1 if decoded[0].1.len() == bytes.len() => decoded.remove(0).2,
                    _ => format!("(bad: {} bytes, longer than 15)", bytes.len()),
                };
                (start, bytes.to_vec(), text)
            })
            .collect()
    }
}

/// Disassembles `code` placed at `addr` (Intel syntax).
pub fn disassemble(code: &[u8], addr: u64) -> Vec<(u64, Vec<u8>, String)> {
    disassemble_bits(code, addr, 64)
}

/// Disassembles `bits`-bit code (64, 32 or 16) placed at `addr`.
pub fn disassemble_bits(code: &[u8], addr: u64, bits: u32) -> Vec<(u64, Vec<u8>, String)> {
    // Without the validity checks, a misplaced LOCK shows as written.
    let mut decoder = Decoder::with_ip(bits, code, addr, DecoderOptions::NO_INVALID_CHECK);
    let mut formatter = IntelFormatter::new();
    let mut out = Vec::new();
    for instr in decoder.iter() {
        let mut text = String::new();
        formatter.format(&instr, &mut text);
        let start = (instr.ip() - addr) as usize;
        out.push((instr.ip(), code[start..start + instr.len()].to_vec(), text));
    }
    out
}

/// Generates case `index` of the run seeded with `seed`.
pub fn generate_case(seed: u64, index: u64, config: &GenConfig) -> Case {
    // The group comes from a stream of its own, so a case of a group is
    // the same whichever other groups the campaign includes.
    let group = match config.groups.as_slice() {
        [] => Group::Int,
        [only] => *only,
        groups => {
            let mut pick = Rng::for_item(seed ^ 0x6772_6f75_7073, index);
            let weights: Vec<u32> = groups.iter().map(|g| g.weight()).collect();
            groups[pick.weighted(&weights)]
        }
    };
    let mut rng = Rng::for_item(seed, index);
    if group == Group::C32 {
        loop {
            let initial = |rng: &mut Rng, base, base_value| {
                // No index register in 32-bit code: R8 gets a harmless 0.
                initial_state(rng, base, base_value, 8, 0)
            };
            if let Some(case) = super::gen32::try_generate(&mut rng, seed, index, config, initial) {
                return case;
            }
        }
    }
    loop {
        // Encoding can fail only when a short branch cannot reach its
        // target; then the case is drawn again from the same stream.
        if let Some(case) = try_generate(&mut rng, seed, index, config, group) {
            return case;
        }
    }
}

const R64: [Register; 16] = [
    Register::RAX,
    Register::RCX,
    Register::RDX,
    Register::RBX,
    Register::RSP,
    Register::RBP,
    Register::RSI,
    Register::RDI,
    Register::R8,
    Register::R9,
    Register::R10,
    Register::R11,
    Register::R12,
    Register::R13,
    Register::R14,
    Register::R15,
];
const R32: [Register; 16] = [
    Register::EAX,
    Register::ECX,
    Register::EDX,
    Register::EBX,
    Register::ESP,
    Register::EBP,
    Register::ESI,
    Register::EDI,
    Register::R8D,
    Register::R9D,
    Register::R10D,
    Register::R11D,
    Register::R12D,
    Register::R13D,
    Register::R14D,
    Register::R15D,
];
const R16: [Register; 16] = [
    Register::AX,
    Register::CX,
    Register::DX,
    Register::BX,
    Register::SP,
    Register::BP,
    Register::SI,
    Register::DI,
    Register::R8W,
    Register::R9W,
    Register::R10W,
    Register::R11W,
    Register::R12W,
    Register::R13W,
    Register::R14W,
    Register::R15W,
];
const R8: [Register; 16] = [
    Register::AL,
    Register::CL,
    Register::DL,
    Register::BL,
    Register::SPL,
    Register::BPL,
    Register::SIL,
    Register::DIL,
    Register::R8L,
    Register::R9L,
    Register::R10L,
    Register::R11L,
    Register::R12L,
    Register::R13L,
    Register::R14L,
    Register::R15L,
];
const R8_HIGH: [Register; 4] = [Register::AH, Register::CH, Register::DH, Register::BH];

const RSP: usize = 4;
/// Registers that may serve as the window base (never RAX/RCX/RDX/RSI/RDI,
/// which instructions write implicitly).
const BASE_CANDIDATES: [usize; 5] = [3, 5, 12, 13, 15];
/// Registers that may serve as the small index.
const INDEX_CANDIDATES: [usize; 5] = [8, 9, 10, 11, 14];

/// The register of encoding number `index` at `bits` width.
fn gpr(index: usize, bits: u32) -> Register {
    match bits {
        8 => R8[index],
        16 => R16[index],
        32 => R32[index],
        _ => R64[index],
    }
}

/// What a generated item is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Template {
    /// One instruction with one of these mnemonics, any legacy form.
    Generic(&'static [Mnemonic]),
    /// A string instruction with its RSI/RDI/RCX/DF setup.
    String,
    /// A forward jump.
    Jump,
    /// DIV/IDIV, sometimes with the dividend's high half prepared.
    Divide,
    /// A shift or rotate by CL with CL set first.
    ShiftByKnownCl,
    /// An instruction that must raise #UD: UD2, or a LOCK prefix where it
    /// is not allowed (register destination, or an instruction that cannot
    /// be locked).
    InvalidOpcode,
    /// A memory access or string instruction at the edge of a window page,
    /// often crossing into the unmapped neighbour page: both runs must
    /// fault at the same instruction (and iteration) without partial
    /// writes.
    PageEdge,
    /// An instruction padded with ignored segment prefixes to 15 bytes
    /// (valid) or 16 (#GP: too long).
    Padded,
    /// LDMXCSR of a value stored just before (mostly valid).
    LoadMxcsr,
    /// FXSAVE (then FXRSTOR of the image, changed) at an aligned address.
    Fxsave { restore: bool },
    /// XSAVE, then XSAVEOPT or XRSTOR of the area (see `Generator::xsave`).
    Xsave(XsaveUse),
    /// An SSE load or store at the edge of a window page.
    SimdPageEdge,
}

use Mnemonic as M;

const ALU: &[Mnemonic] = &[
    M::Add,
    M::Or,
    M::Adc,
    M::Sbb,
    M::And,
    M::Sub,
    M::Xor,
    M::Cmp,
    M::Test,
];
const UNARY: &[Mnemonic] = &[M::Inc, M::Dec, M::Neg, M::Not];
const SHIFTS: &[Mnemonic] = &[
    M::Rol,
    M::Ror,
    M::Rcl,
    M::Rcr,
    M::Shl,
    M::Sal,
    M::Shr,
    M::Sar,
];
const DOUBLE_SHIFTS: &[Mnemonic] = &[M::Shld, M::Shrd];
const MULTIPLY: &[Mnemonic] = &[M::Mul, M::Imul];
const BIT_TESTS: &[Mnemonic] = &[M::Bt, M::Bts, M::Btr, M::Btc];
const BIT_SCANS: &[Mnemonic] = &[M::Bsf, M::Bsr, M::Tzcnt, M::Lzcnt, M::Popcnt];
const SETCC: &[Mnemonic] = &[
    M::Seto,
    M::Setno,
    M::Setb,
    M::Setae,
    M::Sete,
    M::Setne,
    M::Setbe,
    M::Seta,
    M::Sets,
    M::Setns,
    M::Setp,
    M::Setnp,
    M::Setl,
    M::Setge,
    M::Setle,
    M::Setg,
];
const CMOVCC: &[Mnemonic] = &[
    M::Cmovo,
    M::Cmovno,
    M::Cmovb,
    M::Cmovae,
    M::Cmove,
    M::Cmovne,
    M::Cmovbe,
    M::Cmova,
    M::Cmovs,
    M::Cmovns,
    M::Cmovp,
    M::Cmovnp,
    M::Cmovl,
    M::Cmovge,
    M::Cmovle,
    M::Cmovg,
];
const EXTEND: &[Mnemonic] = &[M::Movzx, M::Movsx, M::Movsxd];
const MOV: &[Mnemonic] = &[M::Mov];
const LEA: &[Mnemonic] = &[M::Lea];
const STACK: &[Mnemonic] = &[M::Push, M::Pop];
const EXCHANGE: &[Mnemonic] = &[M::Xchg, M::Cmpxchg, M::Xadd];
const CONVERT: &[Mnemonic] = &[M::Cbw, M::Cwde, M::Cdqe, M::Cwd, M::Cdq, M::Cqo];
const BSWAP: &[Mnemonic] = &[M::Bswap];
const NOP: &[Mnemonic] = &[M::Nop];
const FLAG_OPS: &[Mnemonic] = &[M::Stc, M::Clc, M::Cmc, M::Std, M::Cld];

const SSE_MOVE: &[Mnemonic] = &[
    M::Movdqa,
    M::Movdqu,
    M::Movaps,
    M::Movups,
    M::Movapd,
    M::Movupd,
    M::Movntdq,
    M::Movntps,
    M::Movntpd,
    M::Movnti,
    M::Movd,
    M::Movq,
    M::Movss,
    M::Movsd,
    M::Movlps,
    M::Movlpd,
    M::Movhps,
    M::Movhpd,
    M::Movhlps,
    M::Movlhps,
    M::Movmskps,
    M::Movmskpd,
    M::Pmovmskb,
    M::Pextrw,
    M::Pinsrw,
    M::Stmxcsr,
];
const SSE_INT: &[Mnemonic] = &[
    M::Paddb,
    M::Paddw,
    M::Paddd,
    M::Paddq,
    M::Psubb,
    M::Psubw,
    M::Psubd,
    M::Psubq,
    M::Paddsb,
    M::Paddsw,
    M::Psubsb,
    M::Psubsw,
    M::Paddusb,
    M::Paddusw,
    M::Psubusb,
    M::Psubusw,
    M::Pcmpeqb,
    M::Pcmpeqw,
    M::Pcmpeqd,
    M::Pcmpgtb,
    M::Pcmpgtw,
    M::Pcmpgtd,
    M::Pminub,
    M::Pmaxub,
    M::Pminsw,
    M::Pmaxsw,
    M::Pavgb,
    M::Pavgw,
    M::Pmullw,
    M::Pmulhw,
    M::Pmulhuw,
    M::Pmuludq,
    M::Pmaddwd,
    M::Psadbw,
    M::Pand,
    M::Pandn,
    M::Por,
    M::Pxor,
    M::Andps,
    M::Andpd,
    M::Andnps,
    M::Andnpd,
    M::Orps,
    M::Orpd,
    M::Xorps,
    M::Xorpd,
    M::Punpcklbw,
    M::Punpcklwd,
    M::Punpckldq,
    M::Punpcklqdq,
    M::Punpckhbw,
    M::Punpckhwd,
    M::Punpckhdq,
    M::Punpckhqdq,
    M::Unpcklps,
    M::Unpcklpd,
    M::Unpckhps,
    M::Unpckhpd,
    M::Packsswb,
    M::Packssdw,
    M::Packuswb,
    M::Pshufd,
    M::Pshuflw,
    M::Pshufhw,
    M::Shufps,
    M::Shufpd,
];
const SSE_FP: &[Mnemonic] = &[
    M::Addss,
    M::Addsd,
    M::Addps,
    M::Addpd,
    M::Subss,
    M::Subsd,
    M::Subps,
    M::Subpd,
    M::Mulss,
    M::Mulsd,
    M::Mulps,
    M::Mulpd,
    M::Divss,
    M::Divsd,
    M::Divps,
    M::Divpd,
    M::Minss,
    M::Minsd,
    M::Minps,
    M::Minpd,
    M::Maxss,
    M::Maxsd,
    M::Maxps,
    M::Maxpd,
    M::Sqrtss,
    M::Sqrtsd,
    M::Sqrtps,
    M::Sqrtpd,
    M::Rcpss,
    M::Rcpps,
    M::Rsqrtss,
    M::Rsqrtps,
];
const SSE_CONVERT: &[Mnemonic] = &[
    M::Cvtss2sd,
    M::Cvtsd2ss,
    M::Cvtdq2ps,
    M::Cvtps2dq,
    M::Cvttps2dq,
    M::Cvtdq2pd,
    M::Cvtpd2dq,
    M::Cvttpd2dq,
    M::Cvtps2pd,
    M::Cvtpd2ps,
    M::Cvtsi2ss,
    M::Cvtsi2sd,
    M::Cvtss2si,
    M::Cvttss2si,
    M::Cvtsd2si,
    M::Cvttsd2si,
];
const SSE_COMPARE: &[Mnemonic] = &[
    M::Comiss,
    M::Comisd,
    M::Ucomiss,
    M::Ucomisd,
    M::Cmpss,
    M::Cmpsd,
    M::Cmpps,
    M::Cmppd,
];
/// SSE instructions whose immediate is a shift count.
const SSE_SHIFTS: &[Mnemonic] = &[
    M::Pslldq,
    M::Psrldq,
    M::Psllw,
    M::Pslld,
    M::Psllq,
    M::Psrlw,
    M::Psrld,
    M::Psrlq,
    M::Psraw,
    M::Psrad,
];

/// Templates of the SSE group: SSE/SSE2 forms, with the integer
/// instructions that consume their results (flags, moves to GPRs).
const SSE_TEMPLATES: &[(Template, u32)] = &[
    (Template::Generic(SSE_MOVE), 14),
    (Template::Generic(SSE_INT), 12),
    (Template::Generic(SSE_SHIFTS), 4),
    (Template::Generic(SSE_FP), 16),
    (Template::Generic(SSE_CONVERT), 8),
    (Template::Generic(SSE_COMPARE), 8),
    (Template::LoadMxcsr, 3),
    (Template::Fxsave { restore: false }, 1),
    (Template::Fxsave { restore: true }, 2),
    (Template::SimdPageEdge, 3),
    (Template::Generic(ALU), 3),
    (Template::Generic(MOV), 2),
    (Template::Generic(SETCC), 3),
    (Template::Generic(CMOVCC), 2),
    (Template::Jump, 3),
];

const X87_LOAD: &[Mnemonic] = &[
    M::Fld,
    M::Fild,
    M::Fldz,
    M::Fld1,
    M::Fldpi,
    M::Fldl2e,
    M::Fldl2t,
    M::Fldlg2,
    M::Fldln2,
];

const X87_ARITH: &[Mnemonic] = &[
    M::Fadd,
    M::Faddp,
    M::Fiadd,
    M::Fsub,
    M::Fsubp,
    M::Fisub,
    M::Fsubr,
    M::Fsubrp,
    M::Fisubr,
    M::Fmul,
    M::Fmulp,
    M::Fimul,
    M::Fdiv,
    M::Fdivp,
    M::Fidiv,
    M::Fdivr,
    M::Fdivrp,
    M::Fidivr,
    M::Fchs,
    M::Fabs,
    M::Fsqrt,
    M::Frndint,
    M::Fprem,
    M::Fprem1,
    M::Fscale,
    M::Fxtract,
];

/// Their results are the host's (as on the machine, which runs them on
/// the host's unit).
const X87_TRANSCENDENTAL: &[Mnemonic] = &[
    M::F2xm1,
    M::Fyl2x,
    M::Fyl2xp1,
    M::Fptan,
    M::Fpatan,
    M::Fsin,
    M::Fcos,
    M::Fsincos,
];

const X87_COMPARE: &[Mnemonic] = &[
    M::Fcom,
    M::Fcomp,
    M::Fcompp,
    M::Fucom,
    M::Fucomp,
    M::Fucompp,
    M::Fcomi,
    M::Fcomip,
    M::Fucomi,
    M::Fucomip,
    M::Ficom,
    M::Ficomp,
    M::Ftst,
    M::Fxam,
    M::Fcmovb,
    M::Fcmove,
    M::Fcmovbe,
    M::Fcmovu,
    M::Fcmovnb,
    M::Fcmovne,
    M::Fcmovnbe,
    M::Fcmovnu,
];

const X87_STORE: &[Mnemonic] = &[
    M::Fst,
    M::Fstp,
    M::Fist,
    M::Fistp,
    M::Fisttp,
    M::Fbstp,
    M::Fnstsw,
    M::Fnstcw,
];

/// Stack and control instructions. Not FNSTENV/FNSAVE: they store the
/// code and data selectors, which differ between the two runs. (The
/// waiting forms FSTSW, FSTCW, FINIT, FCLEX are FWAIT and the FN form:
/// both are here.)
const X87_CONTROL: &[Mnemonic] = &[
    M::Fxch,
    M::Ffree,
    M::Ffreep,
    M::Fdecstp,
    M::Fincstp,
    M::Fnop,
    M::Fninit,
    M::Fnclex,
    M::Wait,
    M::Fldcw,
    M::Fldenv,
    M::Frstor,
];

/// What an [`Template::Xsave`] item does after its XSAVE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XsaveUse {
    /// Nothing more.
    Save,
    /// XSAVEOPT to the same area (after an XRSTOR from it, sometimes).
    SaveOpt,
    /// XRSTOR of the area, changed (registers, MXCSR, XSTATE_BV).
    Restore,
}

/// Templates of the XSAVE group: the XSAVE family between SSE and x87
/// instructions that change the state it saves.
const XSAVE_TEMPLATES: &[(Template, u32)] = &[
    (Template::Xsave(XsaveUse::Save), 6),
    (Template::Xsave(XsaveUse::SaveOpt), 5),
    (Template::Xsave(XsaveUse::Restore), 8),
    (Template::Generic(SSE_MOVE), 4),
    (Template::Generic(SSE_INT), 3),
    (Template::Generic(SSE_FP), 3),
    (Template::Generic(X87_LOAD), 4),
    (Template::Generic(X87_ARITH), 3),
    (Template::Generic(X87_STORE), 2),
    (Template::Generic(ALU), 2),
];

/// Templates of the x87 group, with the integer instructions that consume
/// FCOMI's flags and FNSTSW's word.
const X87_TEMPLATES: &[(Template, u32)] = &[
    (Template::Generic(X87_LOAD), 12),
    (Template::Generic(X87_ARITH), 20),
    (Template::Generic(X87_TRANSCENDENTAL), 3),
    (Template::Generic(X87_COMPARE), 10),
    (Template::Generic(X87_STORE), 10),
    (Template::Generic(X87_CONTROL), 5),
    (Template::Generic(SETCC), 2),
    (Template::Generic(CMOVCC), 1),
    (Template::Generic(MOV), 2),
    (Template::Jump, 2),
];

/// Templates and their relative weights.
const TEMPLATES: &[(Template, u32)] = &[
    (Template::Generic(ALU), 20),
    (Template::Generic(UNARY), 5),
    (Template::Generic(SHIFTS), 9),
    (Template::ShiftByKnownCl, 4),
    (Template::Generic(DOUBLE_SHIFTS), 4),
    (Template::Generic(MULTIPLY), 6),
    (Template::Divide, 5),
    (Template::Generic(BIT_TESTS), 6),
    (Template::Generic(BIT_SCANS), 5),
    (Template::Generic(SETCC), 3),
    (Template::Generic(CMOVCC), 4),
    (Template::Jump, 6),
    (Template::Generic(EXTEND), 4),
    (Template::Generic(MOV), 5),
    (Template::Generic(LEA), 5),
    (Template::Generic(STACK), 5),
    (Template::Generic(EXCHANGE), 6),
    (Template::Generic(CONVERT), 3),
    (Template::Generic(BSWAP), 2),
    (Template::String, 8),
    (Template::Generic(NOP), 1),
    (Template::Generic(FLAG_OPS), 2),
    (Template::InvalidOpcode, 1),
    (Template::PageEdge, 3),
    (Template::Padded, 1),
];

/// Whether the generator can instantiate an operand of this kind.
fn supported_operand(kind: OpCodeOperandKind) -> bool {
    use OpCodeOperandKind as K;
    matches!(
        kind,
        K::r8_or_mem
            | K::r16_or_mem
            | K::r32_or_mem
            | K::r64_or_mem
            | K::r8_reg
            | K::r8_opcode
            | K::r16_reg
            | K::r16_opcode
            | K::r16_rm
            | K::r32_reg
            | K::r32_opcode
            | K::r32_rm
            | K::r64_reg
            | K::r64_opcode
            | K::r64_rm
            | K::mem
            | K::mem_offs
            | K::imm8
            | K::imm8_const_1
            | K::imm8sex16
            | K::imm8sex32
            | K::imm8sex64
            | K::imm16
            | K::imm32
            | K::imm32sex64
            | K::imm64
            | K::al
            | K::cl
            | K::ax
            | K::eax
            | K::rax
            | K::xmm_reg
            | K::xmm_rm
            | K::xmm_or_mem
            | K::st0
            | K::sti_opcode
    )
}

/// x87 register ST(`k`).
fn st(k: usize) -> Register {
    [
        Register::ST0,
        Register::ST1,
        Register::ST2,
        Register::ST3,
        Register::ST4,
        Register::ST5,
        Register::ST6,
        Register::ST7,
    ][k & 7]
}

/// A random x87 state: a stack top, registers (empty or holding edge-case
/// values), control word (any rounding, a valid precision, sometimes
/// exceptions unmasked), condition codes and sticky flags. Usually no
/// exception is pending; sometimes one is, so the next waiting instruction
/// must raise #MF.
fn random_x87(rng: &mut Rng, fpu: &mut crate::cpu::fpu_state::FpuState) {
    let top = rng.below(8) as u16;
    fpu.ftw = 0;
    for r in 0..8 {
        if rng.chance(3, 4) {
            fpu.ftw |= 1 << r;
        }
        fpu.st[r] = interesting_f80(rng);
    }
    let precision = *rng.pick(&[0u16, 2, 3, 3, 3]);
    let mut fcw = 0x0040 | 0x3f | ((rng.below(4) as u16) << 10) | (precision << 8);
    if rng.chance(1, 6) {
        fcw &= !(rng.below(64) as u16);
    }
    let condition_codes = ((rng.below(8) as u16) << 8) | ((rng.below(2) as u16) << 14);
    let mut fsw = (top << 11) | condition_codes;
    let masked = fcw & 0x3f;
    if rng.chance(1, 4) {
        fsw |= rng.below(64) as u16 & masked;
    }
    if masked != 0x3f && rng.chance(1, 8) {
        // A pending exception: an unmasked flag and the summary bits.
        fsw |= (!masked & 0x3f) | 0x8080;
    }
    fpu.fcw = fcw;
    fpu.fsw = fsw;
}

/// An 80-bit extended value: zeros, ones, denormals, pseudo-denormals,
/// unnormals, infinities, NaNs, doubles widened, large integers, or random
/// bits.
fn interesting_f80(rng: &mut Rng) -> u128 {
    const J: u64 = 1 << 63;
    let f80 = |sign: u16, exp: u16, sig: u64| (((sign << 15) | exp) as u128) << 64 | sig as u128;
    let sign = rng.below(2) as u16;
    match rng.below(12) {
        0 => f80(sign, 0, 0),
        1 => f80(sign, 0x3fff, J),
        2 => f80(
            sign,
            (0x3fff + rng.range_i64(-70, 70)) as u16,
            J | rng.next_u64(),
        ),
        3 => f80(sign, 0, rng.next_u64() >> rng.below(64)),
        4 => f80(sign, 0, J | rng.next_u64()),
        5 => f80(sign, rng.below(0x7ffe) as u16 + 1, rng.next_u64() >> 1),
        6 => f80(sign, 0x7fff, J),
        7 => f80(sign, 0x7fff, J | (1 << 62) | (rng.next_u64() >> 2)),
        8 => f80(sign, 0x7fff, J | (rng.next_u64() >> 2) | 1),
        9 => {
            // A double widened exactly.
            let d = (rng.range_i64(-100_000, 100_000) as f64) / (rng.below(1000) + 1) as f64;
            let bits = d.to_bits();
            if d == 0.0 {
                return f80((bits >> 63) as u16, 0, 0);
            }
            let exp = ((bits >> 52) & 0x7ff) as u16 + 16383 - 1023;
            f80((bits >> 63) as u16, exp, J | (bits & ((1 << 52) - 1)) << 11)
        }
        10 => f80(
            sign,
            0x3fff + 62 + rng.below(4) as u16,
            J | rng.below(1 << 20) << 40,
        ),
        _ => rng.next_u64() as u128 | (rng.next_u64() as u128 & 0xffff) << 64,
    }
}

/// XMM register `k`.
fn xmm(k: usize) -> Register {
    match k & 15 {
        0 => Register::XMM0,
        1 => Register::XMM1,
        2 => Register::XMM2,
        3 => Register::XMM3,
        4 => Register::XMM4,
        5 => Register::XMM5,
        6 => Register::XMM6,
        7 => Register::XMM7,
        8 => Register::XMM8,
        9 => Register::XMM9,
        10 => Register::XMM10,
        11 => Register::XMM11,
        12 => Register::XMM12,
        13 => Register::XMM13,
        14 => Register::XMM14,
        _ => Register::XMM15,
    }
}

/// A random MXCSR: any rounding mode, sometimes DAZ/FTZ, sticky flags
/// already set, or exceptions unmasked.
fn random_mxcsr(rng: &mut Rng) -> u32 {
    let mut v = 0x1f80u32;
    if rng.chance(1, 2) {
        v |= (rng.below(4) as u32) << 13;
    }
    if rng.chance(1, 8) {
        v |= 1 << 6;
    }
    if rng.chance(1, 8) {
        v |= 1 << 15;
    }
    if rng.chance(1, 4) {
        v |= rng.below(64) as u32;
    }
    if rng.chance(1, 6) {
        // Unmask some of IE, DE, ZE and PE. Overflow and underflow stay
        // masked: with them unmasked the precision flag depends on whether
        // the unbounded-exponent result is exact, which the interpreter
        // only approximates (docs/machine.md).
        v &= !(((rng.below(64) as u32) & 0x27) << 7);
    }
    v
}

/// A 128-bit value made of floating-point edge cases (as doubles or as
/// singles), small integers or random bits.
fn interesting_xmm(rng: &mut Rng) -> u128 {
    const F64: [u64; 20] = [
        0,
        0x8000_0000_0000_0000, // -0
        0x3ff0_0000_0000_0000, // 1
        0xbff0_0000_0000_0000, // -1
        0x3ff8_0000_0000_0000, // 1.5
        0x3fd5_5555_5555_5555, // 1/3
        0x0010_0000_0000_0000, // smallest normal
        0x0000_0000_0000_0001, // smallest denormal
        0x000f_ffff_ffff_ffff, // largest denormal
        0x7fef_ffff_ffff_ffff, // largest finite
        0x7ff0_0000_0000_0000, // +inf
        0xfff0_0000_0000_0000, // -inf
        0x7ff8_0000_0000_0000, // quiet NaN
        0xfff8_0000_0000_0000, // indefinite
        0x7ff4_0000_0000_0001, // signalling NaN
        0x43e0_0000_0000_0000, // 2^63
        0xc3e0_0000_0000_0000, // -2^63
        0x41e0_0000_0000_0000, // 2^31
        0x4004_0000_0000_0000, // 2.5
        0x3c90_0000_0000_0000, // 2^-54
    ];
    const F32: [u32; 16] = [
        0,
        0x8000_0000,
        0x3f80_0000,
        0xbf80_0000,
        0x3fc0_0000,
        0x3eaa_aaab,
        0x0080_0000,
        0x0000_0001,
        0x007f_ffff,
        0x7f7f_ffff,
        0x7f80_0000,
        0xff80_0000,
        0x7fc0_0000,
        0xffc0_0000,
        0x7fa0_0001,
        0x4f00_0000,
    ];
    let mut v = 0u128;
    match rng.below(4) {
        0 => {
            for k in 0..2 {
                let x = if rng.chance(3, 4) {
                    *rng.pick(&F64)
                } else {
                    // A random finite double of moderate size.
                    f64::from(rng.range_i64(-1000, 1000) as i32).to_bits() ^ rng.below(4)
                };
                v |= (x as u128) << (64 * k);
            }
        }
        1 => {
            for k in 0..4 {
                let x = if rng.chance(3, 4) {
                    *rng.pick(&F32)
                } else {
                    (rng.range_i64(-1000, 1000) as f32).to_bits() ^ rng.below(4) as u32
                };
                v |= (x as u128) << (32 * k);
            }
        }
        2 => {
            for k in 0..2 {
                v |= (rng.interesting_u64() as u128) << (64 * k);
            }
        }
        _ => {
            v = rng.next_u64() as u128 | (rng.next_u64() as u128) << 64;
        }
    }
    v
}

/// Every usable 64-bit-mode legacy encoding, grouped by mnemonic.
fn forms_of(mnemonic: Mnemonic) -> &'static [Code] {
    static TABLE: OnceLock<Vec<Vec<Code>>> = OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let mnemonic_count = Code::values()
            .map(|c| c.mnemonic() as usize)
            .max()
            .unwrap_or(0)
            + 1;
        let mut table: Vec<Vec<Code>> = vec![Vec::new(); mnemonic_count];
        for code in Code::values() {
            let op = code.op_code();
            let usable = op.is_instruction()
                && op.encoding() == EncodingKind::Legacy
                && op.mode64()
                && op.op_kinds().iter().all(|&k| supported_operand(k))
                // BSWAP r16 has an undefined result.
                && code != Code::Bswap_r16
                // Only the SSE and SSE2 forms of SIMD mnemonics (not the
                // SSE4.1 PEXTRW to memory, say).
                // FBLD of bytes that are no packed BCD has an undefined
                // result.
                && code.mnemonic() != M::Fbld
                // FISTTP (SSE3) is the one SSE3 instruction run here.
                && (code.mnemonic() == M::Fisttp || code.cpuid_features().iter().all(|f| {
                    !matches!(
                        f,
                        CpuidFeature::SSE3
                            | CpuidFeature::SSSE3
                            | CpuidFeature::SSE4_1
                            | CpuidFeature::SSE4_2
                            | CpuidFeature::SSE4A
                            | CpuidFeature::MMX
                    )
                }));
            if usable {
                table[code.mnemonic() as usize].push(code);
            }
        }
        table
    });
    table.get(mnemonic as usize).map_or(&[], Vec::as_slice)
}

/// An operand before it is put into an `Instruction`.
#[derive(Debug, Clone, Copy)]
enum Operand {
    Reg(Register),
    Mem(MemoryOperand),
    Imm(i64),
    Imm64(u64),
}

/// Builds an instruction from a form and instantiated operands (`None`
/// when iced rejects the combination).
fn build(code: Code, ops: &[Operand]) -> Option<Instruction> {
    use Operand::*;
    let built: Result<Instruction, IcedError> = match ops {
        [] => Ok(Instruction::with(code)),
        [Reg(a)] => Instruction::with1(code, *a),
        [Mem(a)] => Instruction::with1(code, *a),
        [Imm(a)] => Instruction::with1(code, *a as i32),
        [Reg(a), Reg(b)] => Instruction::with2(code, *a, *b),
        [Reg(a), Mem(b)] => Instruction::with2(code, *a, *b),
        [Mem(a), Reg(b)] => Instruction::with2(code, *a, *b),
        [Reg(a), Imm(b)] => Instruction::with2(code, *a, *b),
        [Reg(a), Imm64(b)] => Instruction::with2(code, *a, *b),
        [Mem(a), Imm(b)] => Instruction::with2(code, *a, *b as i32),
        [Reg(a), Reg(b), Reg(c)] => Instruction::with3(code, *a, *b, *c),
        [Reg(a), Reg(b), Imm(c)] => Instruction::with3(code, *a, *b, *c as i32),
        [Reg(a), Mem(b), Imm(c)] => Instruction::with3(code, *a, *b, *c as i32),
        [Mem(a), Reg(b), Reg(c)] => Instruction::with3(code, *a, *b, *c),
        [Mem(a), Reg(b), Imm(c)] => Instruction::with3(code, *a, *b, *c as i32),
        _ => return None,
    };
    built.ok()
}

/// One generated item: setup instructions plus the instruction under test.
#[derive(Debug, Clone)]
struct Item {
    instrs: Vec<Instruction>,
    hints: Vec<Hints>,
    /// For a jump: the item it jumps to (`n_items` = the end).
    jump_to: Option<usize>,
    /// False after an unconditional jump.
    falls_through: bool,
}

impl Item {
    fn single(instr: Instruction) -> Item {
        Item {
            instrs: vec![instr],
            hints: vec![Hints::default()],
            jump_to: None,
            falls_through: true,
        }
    }

    fn push(&mut self, instr: Instruction, hints: Hints) {
        self.instrs.push(instr);
        self.hints.push(hints);
    }
}

/// Fake original addresses for the block encoder: item `i`, instruction
/// `k` is at `FAKE_IP + i * 0x100 + k`, so a jump to item `j` targets
/// `FAKE_IP + j * 0x100`.
const FAKE_IP: u64 = 0x7000_0000_0000;

struct Generator<'a> {
    rng: &'a mut Rng,
    config: &'a GenConfig,
    base: usize,
    index: usize,
    base_value: u64,
    index_value: u64,
    writable: Vec<usize>,
    tracker: Tracker,
    /// Place the next memory operands at a window page edge.
    edge: bool,
    /// The templates of the case's group, with weights.
    templates: &'static [(Template, u32)],
    /// Memory operand size of the form being instantiated.
    mem_size: u32,
}

fn try_generate(
    rng: &mut Rng,
    seed: u64,
    index: u64,
    config: &GenConfig,
    group: Group,
) -> Option<Case> {
    let base = *rng.pick(&BASE_CANDIDATES);
    let index_reg = *rng.pick(&INDEX_CANDIDATES);
    let base_value = DATA_ADDR + 0x600 + rng.below(0x400);
    let index_value = rng.range_i64(-16, 16) as u64;
    let writable: Vec<usize> = (0..16)
        .filter(|&r| r != RSP && r != base && r != index_reg)
        .collect();
    let mut initial = initial_state(rng, base, base_value, index_reg, index_value);
    if matches!(group, Group::Sse | Group::Xsave) {
        for x in initial.fpu.xmm.iter_mut() {
            *x = interesting_xmm(rng);
        }
        initial.fpu.mxcsr = random_mxcsr(rng);
    }
    if matches!(group, Group::X87 | Group::Xsave) {
        random_x87(rng, &mut initial.fpu);
    }

    let mut gen = Generator {
        rng,
        config,
        base,
        index: index_reg,
        base_value,
        index_value,
        writable,
        tracker: Tracker::new(&[base, index_reg]),
        edge: false,
        templates: match group {
            Group::Int => TEMPLATES,
            Group::Sse => SSE_TEMPLATES,
            Group::X87 => X87_TEMPLATES,
            Group::Xsave => XSAVE_TEMPLATES,
            // Generated by `gen32`, never here.
            Group::C32 => TEMPLATES,
        },
        mem_size: 0,
    };

    let n_items = 1 + gen.rng.index(config.max_items.max(1));
    // in_state[i]: definedness on entry to item i, None while unreachable.
    let mut in_state: Vec<Option<Definedness>> = vec![None; n_items + 1];
    in_state[0] = Some(Definedness::ALL_DEFINED);
    let mut items = Vec::with_capacity(n_items);
    let mut item_checkpoints: Vec<Vec<Option<Definedness>>> = Vec::with_capacity(n_items);

    for i in 0..n_items {
        let entry = in_state[i];
        let (item, states, exit) = gen.item(i, n_items, entry.unwrap_or(Definedness::ALL_DEFINED));
        if entry.is_some() {
            let merge = |slot: &mut Option<Definedness>| match slot {
                Some(d) => d.merge(&exit),
                None => *slot = Some(exit),
            };
            if item.falls_through {
                merge(&mut in_state[i + 1]);
            }
            if let Some(target) = item.jump_to {
                merge(&mut in_state[target]);
            }
            item_checkpoints.push(states.into_iter().map(Some).collect());
        } else {
            item_checkpoints.push(vec![None; item.instrs.len()]);
        }
        items.push(item);
    }

    // Lay out: item instructions with fake addresses, then the sentinel.
    let mut flat = Vec::new();
    let mut flat_states = Vec::new();
    for (i, (item, states)) in items.iter().zip(item_checkpoints).enumerate() {
        for (k, (instr, state)) in item.instrs.iter().zip(states).enumerate() {
            let mut instr = *instr;
            instr.set_ip(FAKE_IP + i as u64 * 0x100 + k as u64);
            flat.push(instr);
            flat_states.push(state);
        }
    }
    let mut sentinel = Instruction::with(Code::Vmcall);
    sentinel.set_ip(FAKE_IP + n_items as u64 * 0x100);
    flat.push(sentinel);

    let (code, offsets) = encode_block(&flat)?;
    let boundaries = offsets.iter().map(|&off| CODE_ADDR + off as u64).collect();
    let checkpoints = offsets
        .iter()
        .zip(flat_states)
        .filter_map(|(&off, state)| {
            state.map(|defined| Checkpoint {
                addr: CODE_ADDR + off as u64,
                defined,
            })
        })
        .collect();
    Some(Case {
        seed,
        index,
        group,
        code,
        initial,
        checkpoints,
        boundaries,
        end: in_state[n_items].unwrap_or(Definedness::ALL_DEFINED),
    })
}

/// Encodes the block at [`CODE_ADDR`] keeping the chosen branch forms; if
/// a short branch cannot reach, retries with all branches near. Returns the
/// snippet without the sentinel and each instruction's offset.
fn encode_block(flat: &[Instruction]) -> Option<(Vec<u8>, Vec<u32>)> {
    let options = BlockEncoderOptions::DONT_FIX_BRANCHES
        | BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS;
    let result =
        BlockEncoder::encode(64, InstructionBlock::new(flat, CODE_ADDR), options).or_else(|_| {
            let near: Vec<Instruction> = flat
                .iter()
                .map(|i| {
                    let mut i = *i;
                    i.as_near_branch();
                    i
                })
                .collect();
            BlockEncoder::encode(64, InstructionBlock::new(&near, CODE_ADDR), options)
        });
    let result = result.ok()?;
    let mut code = result.code_buffer;
    // The last instruction is the VMCALL sentinel (0f 01 c1).
    if code.len() < 3
        || code[code.len() - 3..] != [0x0f, 0x01, 0xc1]
        || code.len() - 3 > layout::MAX_SNIPPET_LEN
    {
        return None;
    }
    code.truncate(code.len() - 3);
    let mut offsets = result.new_instruction_offsets;
    offsets.pop();
    Some((code, offsets))
}

fn initial_state(
    rng: &mut Rng,
    base: usize,
    base_value: u64,
    index: usize,
    index_value: u64,
) -> InitialState {
    let mut gpr = [0u64; 16];
    for v in gpr.iter_mut() {
        *v = rng.interesting_u64();
    }
    // Counts in CL and RCX are more interesting when small.
    if rng.chance(1, 3) {
        gpr[1] = rng.below(70);
    }
    gpr[RSP] = INITIAL_RSP;
    gpr[base] = base_value;
    gpr[index] = index_value;
    let mut flags = rng.next_u64() & rflags::ARITH;
    if rng.chance(1, 4) {
        flags |= rflags::DF;
    }
    let mut window = vec![0u8; layout::WINDOW_SIZE];
    if rng.chance(1, 3) {
        // A small alphabet, so string compares and CMPXCHG see equal values.
        const ALPHABET: [u8; 4] = [0x00, 0x01, 0x80, 0xff];
        for b in window.iter_mut() {
            *b = *rng.pick(&ALPHABET);
        }
    } else {
        rng.fill(&mut window);
    }
    InitialState {
        gpr,
        rflags: flags,
        window,
        fpu: crate::cpu::fpu_state::FpuState::default(),
    }
}

impl Generator<'_> {
    /// Draws item `i` of `n` until the tracker accepts all its instructions
    /// (at most a fixed number of tries, then a NOP). Returns the item, the
    /// definedness before each of its instructions, and after the item.
    fn item(
        &mut self,
        i: usize,
        n: usize,
        entry: Definedness,
    ) -> (Item, Vec<Definedness>, Definedness) {
        let weights: Vec<u32> = self.templates.iter().map(|t| t.1).collect();
        for _ in 0..64 {
            let template = self.templates[self.rng.weighted(&weights)].0;
            let Some(item) = self.draw(template, i, n) else {
                continue;
            };
            if let Some((states, exit)) = self.check(&item, entry) {
                return (item, states, exit);
            }
        }
        let nop = Item::single(Instruction::with(Code::Nopd));
        let (states, exit) = self.check(&nop, entry).unwrap_or((vec![entry], entry));
        (nop, states, exit)
    }

    /// Runs the tracker over an item and checks every instruction encodes.
    fn check(
        &mut self,
        item: &Item,
        entry: Definedness,
    ) -> Option<(Vec<Definedness>, Definedness)> {
        let mut state = entry;
        let mut states = Vec::with_capacity(item.instrs.len());
        let mut encoder = Encoder::new(64);
        for (instr, hints) in item.instrs.iter().zip(&item.hints) {
            // Branch targets are fake addresses until the block is laid out.
            if !is_branch(instr) && encoder.encode(instr, CODE_ADDR).is_err() {
                return None;
            }
            states.push(state);
            if instr.code() == Code::DeclareByte {
                // Raw bytes (a padded instruction): track what they decode
                // to; an over-long one faults and changes nothing.
                let bytes: Vec<u8> = (0..instr.declare_data_len())
                    .map(|i| instr.get_declare_byte_value(i))
                    .collect();
                let decoded =
                    Decoder::with_ip(64, &bytes, CODE_ADDR, DecoderOptions::NONE).decode();
                if !decoded.is_invalid() {
                    state = self.tracker.apply(&state, &decoded, *hints).ok()?;
                }
                continue;
            }
            state = self.tracker.apply(&state, instr, *hints).ok()?;
        }
        Some((states, state))
    }

    fn draw(&mut self, template: Template, i: usize, n: usize) -> Option<Item> {
        match template {
            Template::Generic(mnemonics) => {
                let mnemonic = *self.rng.pick(mnemonics);
                if !self.allowed(mnemonic) {
                    return None;
                }
                self.generic(mnemonic)
            }
            Template::String => self.string_op(),
            Template::Jump => self.jump(i, n),
            Template::Divide => self.divide(),
            Template::ShiftByKnownCl => self.shift_by_known_cl(),
            Template::InvalidOpcode => self.invalid_opcode(),
            Template::PageEdge => {
                self.edge = true;
                let item = if self.rng.chance(1, 3) {
                    self.string_op()
                } else {
                    // Not the bit tests: the SDM lets a bit test on memory access 2 or
                    // 4 (or 8) bytes around the addressed bit, so whether it
                    // faults next to a page end is implementation-specific.
                    let families = [ALU, UNARY, SHIFTS, MOV, EXTEND, STACK, EXCHANGE, MULTIPLY];
                    let family = *self.rng.pick(&families);
                    let mnemonic = *self.rng.pick(family);
                    self.generic(mnemonic)
                };
                self.edge = false;
                item
            }
            Template::Padded => self.padded(),
            Template::LoadMxcsr => self.load_mxcsr(),
            Template::Fxsave { restore } => self.fxsave(restore),
            Template::Xsave(then) => self.xsave(then),
            Template::SimdPageEdge => {
                self.edge = true;
                let mnemonic = *self.rng.pick(&[
                    M::Movdqu,
                    M::Movups,
                    M::Movq,
                    M::Movd,
                    M::Movss,
                    M::Movsd,
                    M::Movhps,
                    M::Movlpd,
                    M::Addsd,
                    M::Pinsrw,
                    M::Cvtsi2sd,
                ]);
                let item = self.generic(mnemonic);
                self.edge = false;
                item
            }
        }
    }

    /// `mov dword [m], v; ldmxcsr [m]` with a mostly valid MXCSR value.
    fn load_mxcsr(&mut self) -> Option<Item> {
        let m = self.window_memory(4);
        let mut value = random_mxcsr(self.rng);
        if self.rng.chance(1, 10) {
            // A reserved bit: #GP(0). Not bit 17, which AMD processors
            // accept (their misaligned-exception mask).
            value |= 1 << (18 + self.rng.below(14));
        }
        let store = Instruction::with2(Code::Mov_rm32_imm32, m, value).ok()?;
        let load = Instruction::with1(Code::Ldmxcsr_m32, m).ok()?;
        let mut item = Item::single(store);
        item.push(load, Hints::default());
        Some(item)
    }

    /// FXSAVE64 or FXSAVE to an aligned window address, then stores that
    /// clear the vendor-specific fields (the pointers, which AMD saves only
    /// with an exception pending, and MXCSR_MASK); with `restore`, a few
    /// fields changed and FXRSTOR of the image.
    fn fxsave(&mut self, restore: bool) -> Option<Item> {
        let target = (DATA_ADDR + 0x100 + self.rng.below(WINDOW_PAGE_SIZE - 0x200 - 512)) & !15;
        let disp = target.wrapping_sub(self.base_value) as i64;
        let at = |off: i64| {
            MemoryOperand::new(
                R64[self.base],
                Register::None,
                1,
                disp + off,
                8,
                false,
                Register::None,
            )
        };
        let wide = self.rng.chance(1, 2);
        let (save, load) = if wide {
            (Code::Fxsave64_m512byte, Code::Fxrstor64_m512byte)
        } else {
            (Code::Fxsave_m512byte, Code::Fxrstor_m512byte)
        };
        let mut item = Item::single(Instruction::with1(save, at(0)).ok()?);
        let zero = |off: i64| Instruction::with2(Code::Mov_rm64_imm32, at(off), 0);
        for off in [0, 8, 16] {
            // Bytes 0-5 (FCW, FSW, FTW) are kept: re-store them.
            if off == 0 {
                item.push(
                    Instruction::with2(Code::Mov_rm16_imm16, at(6), 0).ok()?,
                    Hints::default(),
                );
                continue;
            }
            item.push(zero(off).ok()?, Hints::default());
        }
        item.push(
            Instruction::with2(Code::Mov_rm32_imm32, at(28), 0).ok()?,
            Hints::default(),
        );
        if restore {
            let mxcsr = random_mxcsr(self.rng);
            item.push(
                Instruction::with2(Code::Mov_rm32_imm32, at(24), mxcsr).ok()?,
                Hints::default(),
            );
            for _ in 0..self.rng.below(3) {
                let slot = 160 + 8 * self.rng.below(32) as i64;
                let v = self.rng.interesting_u64() as i32;
                item.push(
                    Instruction::with2(Code::Mov_rm64_imm32, at(slot), v).ok()?,
                    Hints::default(),
                );
            }
            item.push(Instruction::with1(load, at(0)).ok()?, Hints::default());
        }
        Some(item)
    }

    /// XSAVE (or XSAVE64) of the components EDX:EAX requests, a subset of
    /// x87 | SSE, to a 64-byte aligned area in the data page (misaligned
    /// now and then: #GP), then per `then` an XSAVEOPT or XRSTOR of it.
    ///
    /// Kept out of the comparison, as implementation-specific:
    /// - FOP, FIP, FDP (bytes 6-23) and MXCSR_MASK (28-31) are zeroed
    ///   after every save, as for FXSAVE;
    /// - XSTATE_BV[i] of a requested component is XINUSE[i], which a
    ///   processor may clear while the component is in its initial
    ///   configuration (the init optimization; faultline keeps XINUSE all
    ///   ones): the item ORs the requested bits into it after each save.
    ///   The bits of components not requested are compared (kept);
    /// - XSAVEOPT's init and modified optimizations may leave a component
    ///   unwritten: it only follows an XSAVE to the same area (or an
    ///   XRSTOR of all the components it saves from there), so the area
    ///   holds the same bytes whether a component is written or skipped;
    /// - XSTATE_BV of an XRSTOR holds only x87 and SSE bits: a bit beyond
    ///   is legal or #GP by the host's XCR0. No XGETBV: its value is the
    ///   host's XCR0. The header's bytes 8-63 are zero except, now and
    ///   then, bytes 16-23 (#GP in the standard form); the XCOMP_BV field
    ///   stays 0 (no compacted form).
    fn xsave(&mut self, then: XsaveUse) -> Option<Item> {
        const AREA: u64 = crate::cpu::xsave::XSAVE_AREA_SIZE as u64;
        const HEADER: i64 = 512;
        let mut target =
            (DATA_ADDR + 0x100 + self.rng.below(WINDOW_PAGE_SIZE - 0x100 - AREA)) & !63;
        if self.rng.chance(1, 24) {
            target += 16;
        }
        let disp = target.wrapping_sub(self.base_value) as i64;
        let base = R64[self.base];
        let at = |off: i64| {
            MemoryOperand::new(
                base,
                Register::None,
                1,
                disp + off,
                8,
                false,
                Register::None,
            )
        };
        let wide = self.rng.chance(1, 2);
        let pick = |wide: bool, narrow: Code, rex: Code| if wide { rex } else { narrow };
        let save = pick(wide, Code::Xsave_mem, Code::Xsave64_mem);
        let mask = |rng: &mut Rng| -> u32 {
            if rng.chance(1, 2) {
                3
            } else {
                rng.below(4) as u32
            }
        };
        let rfbm = mask(self.rng);
        let mut item =
            Item::single(Instruction::with2(Code::Mov_r32_imm32, Register::EAX, rfbm).ok()?);
        let push = |item: &mut Item, i: Instruction| item.push(i, Hints::default());
        push(
            &mut item,
            Instruction::with2(Code::Mov_r32_imm32, Register::EDX, 0u32).ok()?,
        );
        // Header bytes 8-63 zero (XRSTOR reads them; XSAVE writes none).
        let zero_header = |item: &mut Item| -> Option<()> {
            for off in (8..64).step_by(8) {
                item.push(
                    Instruction::with2(Code::Mov_rm64_imm32, at(HEADER + off), 0).ok()?,
                    Hints::default(),
                );
            }
            Some(())
        };
        let normalize = |item: &mut Item, rfbm: u32| -> Option<()> {
            item.push(
                Instruction::with2(Code::Mov_rm16_imm16, at(6), 0u32).ok()?,
                Hints::default(),
            );
            for off in [8, 16] {
                item.push(
                    Instruction::with2(Code::Mov_rm64_imm32, at(off), 0).ok()?,
                    Hints::default(),
                );
            }
            item.push(
                Instruction::with2(Code::Mov_rm32_imm32, at(28), 0u32).ok()?,
                Hints::default(),
            );
            if rfbm != 0 {
                item.push(
                    Instruction::with2(Code::Or_rm8_imm8, at(HEADER), rfbm).ok()?,
                    Hints::default(),
                );
            }
            Some(())
        };
        push(&mut item, Instruction::with1(save, at(0)).ok()?);
        normalize(&mut item, rfbm)?;
        match then {
            XsaveUse::Save => {}
            XsaveUse::SaveOpt => {
                let opt = pick(
                    self.rng.chance(1, 2),
                    Code::Xsaveopt_mem,
                    Code::Xsaveopt64_mem,
                );
                if self.rng.chance(1, 2) {
                    // XRSTOR of everything XSAVEOPT saves (its modified
                    // optimization may then skip what did not change).
                    zero_header(&mut item)?;
                    push(
                        &mut item,
                        Instruction::with2(Code::Mov_rm64_imm32, at(HEADER), rfbm).ok()?,
                    );
                    let load = pick(self.rng.chance(1, 2), Code::Xrstor_mem, Code::Xrstor64_mem);
                    push(&mut item, Instruction::with1(load, at(0)).ok()?);
                }
                // Sometimes a change to what it saves in between.
                match self.rng.below(3) {
                    0 => push(&mut item, Instruction::with(Code::Fld1)),
                    1 => {
                        let x = xmm(self.rng.below(16) as usize);
                        push(
                            &mut item,
                            Instruction::with2(Code::Movd_xmm_rm32, x, Register::EAX).ok()?,
                        );
                    }
                    _ => {}
                }
                push(&mut item, Instruction::with1(opt, at(0)).ok()?);
                normalize(&mut item, rfbm)?;
            }
            XsaveUse::Restore => {
                zero_header(&mut item)?;
                let bv = self.rng.below(4) as i32;
                push(
                    &mut item,
                    Instruction::with2(Code::Mov_rm64_imm32, at(HEADER), bv).ok()?,
                );
                if self.rng.chance(1, 16) {
                    let junk = self.rng.interesting_u64() as i32 | 1;
                    push(
                        &mut item,
                        Instruction::with2(Code::Mov_rm64_imm32, at(HEADER + 16), junk).ok()?,
                    );
                }
                let mxcsr = random_mxcsr(self.rng);
                push(
                    &mut item,
                    Instruction::with2(Code::Mov_rm32_imm32, at(24), mxcsr).ok()?,
                );
                for _ in 0..self.rng.below(4) {
                    // An x87 register's significand or an XMM register's
                    // half.
                    let slot = 32 + 8 * self.rng.below(48) as i64;
                    let slot = if (slot - 32) % 16 == 8 && slot < 160 {
                        slot - 8
                    } else {
                        slot
                    };
                    let v = self.rng.interesting_u64() as i32;
                    push(
                        &mut item,
                        Instruction::with2(Code::Mov_rm64_imm32, at(slot), v).ok()?,
                    );
                }
                let again = mask(self.rng);
                if again != rfbm {
                    push(
                        &mut item,
                        Instruction::with2(Code::Mov_r32_imm32, Register::EAX, again).ok()?,
                    );
                }
                let load = pick(self.rng.chance(1, 2), Code::Xrstor_mem, Code::Xrstor64_mem);
                push(&mut item, Instruction::with1(load, at(0)).ok()?);
            }
        }
        Some(item)
    }

    /// A memory operand of the current form's size for an SSE instruction:
    /// mostly 16-byte aligned when the operand is 16 bytes.
    fn simd_memory(&mut self) -> MemoryOperand {
        let size = self.mem_size.max(1);
        if self.edge {
            return self.edge_memory(size);
        }
        if size == 16 && self.rng.chance(7, 8) {
            let target = self.window_target(16) & !15;
            return self.absolute_rip_or_base(target, 4, 4);
        }
        self.window_memory(size)
    }

    fn allowed(&self, mnemonic: Mnemonic) -> bool {
        match mnemonic {
            M::Lzcnt => self.config.lzcnt,
            M::Tzcnt => self.config.tzcnt,
            M::Popcnt => self.config.popcnt,
            _ => true,
        }
    }

    /// One instruction of `mnemonic` in a random form, plus the setup some
    /// forms need.
    fn generic(&mut self, mnemonic: Mnemonic) -> Option<Item> {
        let forms = forms_of(mnemonic);
        if forms.is_empty() {
            return None;
        }
        let code = *self.rng.pick(forms);
        self.instance(code)
    }

    fn instance(&mut self, code: Code) -> Option<Item> {
        // MOVSXD r16, m16 reads 16 bits on Intel but 32 on AMD: at a page
        // end the fault is vendor-specific.
        if self.edge && code == Code::Movsxd_r16_rm16 {
            return None;
        }
        let op_code = code.op_code();
        let kinds = op_code.op_kinds();
        let mnemonic = code.mnemonic();
        let is_shift = matches!(
            mnemonic,
            M::Rol
                | M::Ror
                | M::Rcl
                | M::Rcr
                | M::Shl
                | M::Sal
                | M::Shr
                | M::Sar
                | M::Shld
                | M::Shrd
        );
        let is_shift = is_shift || SSE_SHIFTS.contains(&mnemonic);
        self.mem_size = op_code.memory_size().size() as u32;
        let mut ops = Vec::with_capacity(kinds.len());
        for (position, &kind) in kinds.iter().enumerate() {
            ops.push(self.operand(kind, position, mnemonic, is_shift)?);
        }
        let mut instr = build(code, &ops)?;
        let mut item = Item {
            instrs: Vec::new(),
            hints: Vec::new(),
            jump_to: None,
            falls_through: true,
        };

        let memory_destination = matches!(ops.first(), Some(Operand::Mem(_)));
        if memory_destination && op_code.can_use_lock_prefix() && self.rng.chance(1, 3) {
            instr.set_has_lock_prefix(true);
        }

        // A bit test on memory with a register offset addresses
        // `ea + (offset >> log2(width)) * width / 8`: give the offset a value
        // that keeps the access in the window.
        if matches!(mnemonic, M::Bt | M::Bts | M::Btr | M::Btc) && memory_destination {
            if let Some(Operand::Reg(offset_reg)) = ops.get(1) {
                let (reg_index, _) = super::defined::gpr_bits(*offset_reg)?;
                if reg_index != self.index {
                    if !self.writable.contains(&reg_index) {
                        return None;
                    }
                    let bit_offset = self.rng.range_i64(-0x800, 0x800);
                    let set = Instruction::with2(Code::Mov_rm64_imm32, R64[reg_index], bit_offset)
                        .ok()?;
                    item.push(set, Hints::default());
                }
            }
        }
        item.push(instr, Hints::default());
        Some(item)
    }

    /// Instantiates one operand of kind `kind` at `position`.
    fn operand(
        &mut self,
        kind: OpCodeOperandKind,
        position: usize,
        mnemonic: Mnemonic,
        is_shift: bool,
    ) -> Option<Operand> {
        use OpCodeOperandKind as K;
        // The first operand is usually written: draw it from the registers
        // the sequence may change (PUSH and reads may also use RSP).
        let destination = position == 0;
        Some(match kind {
            K::r8_or_mem | K::r16_or_mem | K::r32_or_mem | K::r64_or_mem => {
                let bits = rm_bits(kind);
                if self.edge || self.rng.chance(1, 2) {
                    Operand::Mem(self.window_memory(bits / 8))
                } else {
                    Operand::Reg(self.register(bits, destination, mnemonic))
                }
            }
            K::r8_reg | K::r8_opcode => Operand::Reg(self.register(8, destination, mnemonic)),
            K::r16_reg | K::r16_opcode | K::r16_rm => {
                Operand::Reg(self.register(16, destination, mnemonic))
            }
            K::r32_reg | K::r32_opcode | K::r32_rm => {
                Operand::Reg(self.register(32, destination, mnemonic))
            }
            K::r64_reg | K::r64_opcode | K::r64_rm => {
                Operand::Reg(self.register(64, destination, mnemonic))
            }
            K::mem if !matches!(mnemonic, M::Lea | M::Nop) => Operand::Mem(self.simd_memory()),
            K::mem => Operand::Mem(self.any_address()),
            K::xmm_reg | K::xmm_rm => Operand::Reg(xmm(self.rng.index(16))),
            K::st0 => Operand::Reg(Register::ST0),
            K::sti_opcode => Operand::Reg(st(self.rng.index(8))),
            K::xmm_or_mem => {
                if self.edge || self.rng.chance(1, 2) {
                    Operand::Mem(self.simd_memory())
                } else {
                    Operand::Reg(xmm(self.rng.index(16)))
                }
            }
            K::mem_offs => {
                let target = self.window_target(8);
                let size = if self.rng.chance(1, 4) { 4 } else { 8 };
                Operand::Mem(MemoryOperand::with_displ(target, size))
            }
            K::imm8 if is_shift => Operand::Imm(self.shift_count() as i64),
            K::imm8 => Operand::Imm(self.rng.interesting_u64() as u8 as i64),
            K::imm8_const_1 => Operand::Imm(1),
            K::imm8sex16 | K::imm8sex32 | K::imm8sex64 => {
                Operand::Imm(self.rng.interesting_u64() as i8 as i64)
            }
            K::imm16 => Operand::Imm(self.rng.interesting_u64() as u16 as i64),
            K::imm32 => Operand::Imm(self.rng.interesting_u64() as u32 as i64),
            K::imm32sex64 => Operand::Imm(self.rng.interesting_u64() as i32 as i64),
            K::imm64 => Operand::Imm64(self.rng.interesting_u64()),
            K::al => Operand::Reg(Register::AL),
            K::cl => Operand::Reg(Register::CL),
            K::ax => Operand::Reg(Register::AX),
            K::eax => Operand::Reg(Register::EAX),
            K::rax => Operand::Reg(Register::RAX),
            _ => return None,
        })
    }

    /// A register of `bits` width. Destinations come from the writable
    /// set (PUSH may push RSP); sources from all sixteen.
    fn register(&mut self, bits: u32, destination: bool, mnemonic: Mnemonic) -> Register {
        let index = if destination && !(mnemonic == M::Push && self.rng.chance(1, 8)) {
            *self.rng.pick(&self.writable)
        } else {
            self.rng.index(16)
        };
        if bits == 8 && index < 4 && self.rng.chance(1, 3) {
            // AH, CH, DH, BH share the numbers of SPL..DIL without REX; the
            // encoder rejects combinations that need REX.
            return R8_HIGH[index];
        }
        gpr(index, bits)
    }

    /// A shift count biased to the boundaries (0, 1, width-1, width,
    /// width+1, the 5- and 6-bit masks).
    fn shift_count(&mut self) -> u8 {
        const COUNTS: [u8; 16] = [0, 1, 2, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 0xff];
        if self.rng.chance(3, 4) {
            *self.rng.pick(&COUNTS)
        } else {
            self.rng.below(256) as u8
        }
    }

    /// A linear address for an access of `size` bytes inside the data page
    /// (with room for string and bit-offset excursions around it).
    fn window_target(&mut self, size: u32) -> u64 {
        DATA_ADDR + 0x100 + self.rng.below(WINDOW_PAGE_SIZE - 0x200 - size as u64)
    }

    /// A memory operand of `size` bytes whose address is in the window, in
    /// one of the addressing modes.
    fn window_memory(&mut self, size: u32) -> MemoryOperand {
        if self.edge {
            return self.edge_memory(size);
        }
        let base64 = R64[self.base];
        let index64 = R64[self.index];
        let long = |rng: &mut Rng| if rng.chance(1, 4) { 8 } else { 1 };
        let mut m = match self.rng.below(9) {
            // [base + disp8]
            0 | 1 => {
                let disp = self.rng.range_i64(-128, 127 - size as i64);
                MemoryOperand::new(
                    base64,
                    Register::None,
                    1,
                    disp,
                    long(self.rng),
                    false,
                    Register::None,
                )
            }
            // [base + disp] reaching further
            2 => {
                let target = self.window_target(size);
                let disp = target.wrapping_sub(self.base_value) as i64;
                MemoryOperand::new(
                    base64,
                    Register::None,
                    1,
                    disp,
                    long(self.rng),
                    false,
                    Register::None,
                )
            }
            // [base + index * scale + disp]
            3 | 4 => {
                let scale = 1u32 << self.rng.below(4);
                let target = self.window_target(size);
                let disp = target
                    .wrapping_sub(self.base_value)
                    .wrapping_sub(self.index_value.wrapping_mul(scale as u64))
                    as i64;
                let disp_size = if disp == 0 && self.rng.chance(1, 2) {
                    0
                } else {
                    long(self.rng)
                };
                MemoryOperand::new(
                    base64,
                    index64,
                    scale,
                    disp,
                    disp_size,
                    false,
                    Register::None,
                )
            }
            // [rsp + disp]: the stack page
            5 => {
                let disp = self.rng.range_i64(-0x100, 0x100);
                MemoryOperand::new(
                    Register::RSP,
                    Register::None,
                    1,
                    disp,
                    long(self.rng),
                    false,
                    Register::None,
                )
            }
            // [rip + target]
            6 => {
                let target = self.window_target(size);
                rip_relative(target)
            }
            // 32-bit address size: [base32 + index32 * scale + disp],
            // wrapping at 4 GiB
            7 => {
                let with_index = self.rng.chance(1, 2);
                let scale = 1u32 << self.rng.below(4);
                let target = self.window_target(size);
                let scaled = if with_index {
                    (self.index_value as u32).wrapping_mul(scale)
                } else {
                    0
                };
                let disp = (target as u32)
                    .wrapping_sub(self.base_value as u32)
                    .wrapping_sub(scaled) as i32 as i64;
                let index = if with_index {
                    R32[self.index]
                } else {
                    Register::None
                };
                let disp_size = if self.rng.chance(1, 4) { 4 } else { 1 };
                MemoryOperand::new(
                    R32[self.base],
                    index,
                    scale,
                    disp,
                    disp_size,
                    false,
                    Register::None,
                )
            }
            // [disp32] absolute
            _ => {
                let target = self.window_target(size);
                let size = if self.rng.chance(1, 4) { 4 } else { 8 };
                MemoryOperand::with_displ(target, size)
            }
        };
        // In 64-bit mode ES/CS/SS/DS overrides are ignored.
        if self.rng.chance(1, 10) {
            m.segment_prefix =
                *self
                    .rng
                    .pick(&[Register::ES, Register::CS, Register::SS, Register::DS]);
        }
        m
    }

    /// A memory operand at one edge of a window page: the access fits
    /// exactly, crosses into the unmapped neighbour page, or lies entirely
    /// beyond.
    fn edge_memory(&mut self, size: u32) -> MemoryOperand {
        let size = size as u64;
        let page = if self.rng.chance(1, 4) {
            STACK_ADDR
        } else {
            DATA_ADDR
        };
        let target = if self.rng.chance(2, 3) {
            // Upper edge: from "ends at the last byte" to "starts past it".
            page + WINDOW_PAGE_SIZE - size + self.rng.below(size + 1)
        } else {
            // Lower edge: starting up to `size` bytes below the page.
            page - self.rng.below(size + 1)
        };
        self.absolute_rip_or_base(target, 8, 1)
    }

    /// `target` addressed one of three ways, chosen at random: an absolute
    /// displacement (`absolute_displ_size` bytes), RIP-relative, or
    /// `[base + disp]` from the base register's value
    /// (`base_displ_size` bytes).
    fn absolute_rip_or_base(
        &mut self,
        target: u64,
        absolute_displ_size: u32,
        base_displ_size: u32,
    ) -> MemoryOperand {
        match self.rng.below(3) {
            0 => MemoryOperand::with_displ(target, absolute_displ_size),
            1 => rip_relative(target),
            _ => MemoryOperand::new(
                R64[self.base],
                Register::None,
                1,
                target.wrapping_sub(self.base_value) as i64,
                base_displ_size,
                false,
                Register::None,
            ),
        }
    }

    /// One instruction padded with ignored segment prefixes to exactly 15
    /// bytes (the limit) or 16 (#GP). Branches and RIP-relative operands
    /// are not padded (their displacements depend on the layout).
    fn padded(&mut self) -> Option<Item> {
        let family = *self.rng.pick(&[
            ALU, UNARY, SHIFTS, MOV, EXTEND, MULTIPLY, BIT_SCANS, CONVERT,
        ]);
        let mnemonic = *self.rng.pick(family);
        if !self.allowed(mnemonic) {
            return None;
        }
        let mut item = self.generic(mnemonic)?;
        let last = item.instrs.pop()?;
        let hints = item.hints.pop()?;
        if last.is_ip_rel_memory_operand() {
            return None;
        }
        let mut encoder = Encoder::new(64);
        encoder.encode(&last, CODE_ADDR).ok()?;
        let bytes = encoder.take_buffer();
        let total: usize = if self.rng.chance(1, 3) { 16 } else { 15 };
        let padding = total.checked_sub(bytes.len()).filter(|&p| p > 0)?;
        let mut padded = Vec::with_capacity(total);
        for _ in 0..padding {
            padded.push(*self.rng.pick(&[0x2e, 0x3e, 0x26, 0x36]));
        }
        padded.extend_from_slice(&bytes);
        item.push(Instruction::with_declare_byte(&padded).ok()?, hints);
        Some(item)
    }

    /// Any address (for LEA and NOP, which do not access memory): every
    /// base, index, scale, displacement size, RIP-relative, 32-bit.
    fn any_address(&mut self) -> MemoryOperand {
        let address32 = self.rng.chance(1, 4);
        let regs: &[Register; 16] = if address32 { &R32 } else { &R64 };
        if self.rng.chance(1, 8) {
            // RIP/EIP-relative: the displacement field holds the target.
            let target = (CODE_ADDR as i64 + self.rng.range_i64(-0x0100_0000, 0x0100_0000)) as u64;
            let base = if address32 {
                Register::EIP
            } else {
                Register::RIP
            };
            return MemoryOperand::new(
                base,
                Register::None,
                1,
                target as i64,
                if address32 { 4 } else { 8 },
                false,
                Register::None,
            );
        }
        let base = if self.rng.chance(1, 8) {
            Register::None
        } else {
            regs[self.rng.index(16)]
        };
        let index = if self.rng.chance(1, 3) {
            Register::None
        } else {
            // RSP cannot be an index.
            let i = self.rng.index(15);
            regs[if i >= RSP { i + 1 } else { i }]
        };
        let scale = 1u32 << self.rng.below(4);
        let (disp, disp_size) = match self.rng.below(3) {
            0 if base != Register::None => (0, 0),
            1 => (self.rng.range_i64(-128, 127), 1),
            _ => {
                let d = self.rng.interesting_u64() as i32 as i64;
                (d, if address32 { 4 } else { 8 })
            }
        };
        let disp_size = if base == Register::None && index == Register::None {
            if address32 {
                4
            } else {
                8
            }
        } else {
            disp_size
        };
        MemoryOperand::new(base, index, scale, disp, disp_size, false, Register::None)
    }

    /// A shift or rotate by CL, with CL set just before to a boundary count
    /// (the tracker then knows the count exactly).
    fn shift_by_known_cl(&mut self) -> Option<Item> {
        let family = if self.rng.chance(1, 2) {
            SHIFTS
        } else {
            DOUBLE_SHIFTS
        };
        let mnemonic = *self.rng.pick(family);
        let forms: Vec<Code> = forms_of(mnemonic)
            .iter()
            .copied()
            .filter(|c| c.op_code().op_kinds().contains(&OpCodeOperandKind::cl))
            .collect();
        if forms.is_empty() {
            return None;
        }
        let code = *self.rng.pick(&forms);
        let mut shift = self.instance(code)?;
        let count = self.shift_count();
        let set_cl = Instruction::with2(Code::Mov_r8_imm8, Register::CL, count as i64).ok()?;
        let mut item = Item::single(set_cl);
        for (instr, _) in shift.instrs.drain(..).zip(shift.hints.drain(..)) {
            item.push(
                instr,
                Hints {
                    cl: Some(count),
                    rcx: None,
                },
            );
        }
        Some(item)
    }

    /// UD2, or an instruction with a LOCK prefix it does not allow.
    fn invalid_opcode(&mut self) -> Option<Item> {
        if self.rng.chance(1, 3) {
            return Some(Item::single(Instruction::with(Code::Ud2)));
        }
        let family = *self.rng.pick(&[ALU, UNARY, MOV, BIT_TESTS, EXTEND, SHIFTS]);
        let mnemonic = *self.rng.pick(family);
        let mut item = self.generic(mnemonic)?;
        let last = item.instrs.last_mut()?;
        let lockable = last.code().op_code().can_use_lock_prefix()
            && last.op0_kind() == iced_x86::OpKind::Memory;
        if lockable {
            return None;
        }
        last.set_has_lock_prefix(true);
        Some(item)
    }

    /// DIV/IDIV; more often than not with the high half of the dividend
    /// made small (zero or the sign extension) so that the quotient fits,
    /// otherwise with whatever the registers hold (mostly #DE).
    fn divide(&mut self) -> Option<Item> {
        let mnemonic = if self.rng.chance(1, 2) {
            M::Div
        } else {
            M::Idiv
        };
        let code = *self.rng.pick(forms_of(mnemonic));
        let body = self.instance(code)?;
        let width = match code {
            Code::Div_rm8 | Code::Idiv_rm8 => 8,
            Code::Div_rm16 | Code::Idiv_rm16 => 16,
            Code::Div_rm32 | Code::Idiv_rm32 => 32,
            _ => 64,
        };
        let mut item = Item {
            instrs: Vec::new(),
            hints: Vec::new(),
            jump_to: None,
            falls_through: true,
        };
        if self.rng.chance(3, 5) {
            let setup = match (mnemonic, width) {
                (M::Div, 8) => Instruction::with2(Code::Movzx_r16_rm8, Register::AX, Register::AL),
                (M::Div, _) => Instruction::with2(Code::Xor_r32_rm32, Register::EDX, Register::EDX),
                (_, 8) => Ok(Instruction::with(Code::Cbw)),
                (_, 16) => Ok(Instruction::with(Code::Cwd)),
                (_, 32) => Ok(Instruction::with(Code::Cdq)),
                _ => Ok(Instruction::with(Code::Cqo)),
            };
            item.push(setup.ok()?, Hints::default());
        }
        for instr in body.instrs {
            item.push(instr, Hints::default());
        }
        Some(item)
    }

    /// A string instruction with RSI/RDI in the window, a small RCX and
    /// sometimes STD/CLD first.
    fn string_op(&mut self) -> Option<Item> {
        #[derive(Clone, Copy, PartialEq)]
        enum Kind {
            Movs,
            Stos,
            Lods,
            Cmps,
            Scas,
        }
        let kind = *self
            .rng
            .pick(&[Kind::Movs, Kind::Stos, Kind::Lods, Kind::Cmps, Kind::Scas]);
        let size = 1u32 << self.rng.below(4);
        let compares = matches!(kind, Kind::Cmps | Kind::Scas);
        let rep = match self.rng.below(3) {
            0 => RepPrefixKind::None,
            1 => RepPrefixKind::Repe,
            _ if compares => RepPrefixKind::Repne,
            _ => RepPrefixKind::Repe,
        };
        let address_size = if self.rng.chance(1, 8) { 32 } else { 64 };
        let count = self.rng.below(9);
        let reads_rsi = matches!(kind, Kind::Movs | Kind::Lods | Kind::Cmps);
        let reads_rdi = matches!(kind, Kind::Movs | Kind::Stos | Kind::Cmps | Kind::Scas);

        let mut item = Item {
            instrs: Vec::new(),
            hints: Vec::new(),
            jump_to: None,
            falls_through: true,
        };
        // Pointers at least 0x100 bytes from the page ends, so the at most
        // 64 bytes a string instruction here touches stay inside in either
        // direction; sometimes into the stack page. At a page edge, one
        // pointer instead starts within reach of the end it runs towards,
        // so the repetition crosses into the unmapped neighbour page.
        let upwards = self.rng.chance(1, 2);
        let edge_reg = if reads_rsi && (!reads_rdi || self.rng.chance(1, 2)) {
            Register::RSI
        } else {
            Register::RDI
        };
        let iterations = if rep == RepPrefixKind::None { 1 } else { count };
        let span = iterations.max(1) * size as u64;
        for (needed, reg) in [(reads_rsi, Register::RSI), (reads_rdi, Register::RDI)] {
            if needed || self.rng.chance(1, 4) {
                let page = if self.rng.chance(1, 4) {
                    STACK_ADDR
                } else {
                    DATA_ADDR
                };
                let target = if self.edge && reg == edge_reg {
                    if upwards {
                        page + WINDOW_PAGE_SIZE - self.rng.below(span + 1)
                    } else {
                        page - size as u64 + self.rng.below(span + 1)
                    }
                } else {
                    page + 0x100 + self.rng.below(WINDOW_PAGE_SIZE - 0x200)
                };
                let disp = target.wrapping_sub(self.base_value) as i64;
                let lea = Instruction::with2(
                    Code::Lea_r64_m,
                    reg,
                    MemoryOperand::new(
                        R64[self.base],
                        Register::None,
                        1,
                        disp,
                        1,
                        false,
                        Register::None,
                    ),
                )
                .ok()?;
                item.push(lea, Hints::default());
            }
        }
        if address_size == 32 && self.rng.chance(1, 2) {
            // A 32-bit address size uses ESI/EDI and writes them back
            // zero-extended: put garbage above bit 31 to see both.
            for reg in [Register::RSI, Register::RDI] {
                let bit = 32 + self.rng.below(32) as i64;
                item.push(
                    Instruction::with2(Code::Bts_rm64_imm8, reg, bit).ok()?,
                    Hints::default(),
                );
            }
        }
        item.push(
            Instruction::with2(Code::Mov_r32_imm32, Register::ECX, count as i64).ok()?,
            Hints::default(),
        );
        if self.edge {
            // The direction decides which page end the pointer runs into.
            let set_df = if upwards { Code::Cld } else { Code::Std };
            item.push(Instruction::with(set_df), Hints::default());
        } else {
            match self.rng.below(3) {
                0 => item.push(Instruction::with(Code::Std), Hints::default()),
                1 => item.push(Instruction::with(Code::Cld), Hints::default()),
                _ => {}
            }
        }
        let seg = Register::None;
        let instr = match (kind, size) {
            (Kind::Movs, 1) => Instruction::with_movsb(address_size, seg, rep),
            (Kind::Movs, 2) => Instruction::with_movsw(address_size, seg, rep),
            (Kind::Movs, 4) => Instruction::with_movsd(address_size, seg, rep),
            (Kind::Movs, _) => Instruction::with_movsq(address_size, seg, rep),
            (Kind::Stos, 1) => Instruction::with_stosb(address_size, rep),
            (Kind::Stos, 2) => Instruction::with_stosw(address_size, rep),
            (Kind::Stos, 4) => Instruction::with_stosd(address_size, rep),
            (Kind::Stos, _) => Instruction::with_stosq(address_size, rep),
            (Kind::Lods, 1) => Instruction::with_lodsb(address_size, seg, rep),
            (Kind::Lods, 2) => Instruction::with_lodsw(address_size, seg, rep),
            (Kind::Lods, 4) => Instruction::with_lodsd(address_size, seg, rep),
            (Kind::Lods, _) => Instruction::with_lodsq(address_size, seg, rep),
            (Kind::Cmps, 1) => Instruction::with_cmpsb(address_size, seg, rep),
            (Kind::Cmps, 2) => Instruction::with_cmpsw(address_size, seg, rep),
            (Kind::Cmps, 4) => Instruction::with_cmpsd(address_size, seg, rep),
            (Kind::Cmps, _) => Instruction::with_cmpsq(address_size, seg, rep),
            (Kind::Scas, 1) => Instruction::with_scasb(address_size, rep),
            (Kind::Scas, 2) => Instruction::with_scasw(address_size, rep),
            (Kind::Scas, 4) => Instruction::with_scasd(address_size, rep),
            (Kind::Scas, _) => Instruction::with_scasq(address_size, rep),
        }
        .ok()?;
        item.push(
            instr,
            Hints {
                cl: None,
                rcx: Some(count),
            },
        );
        Some(item)
    }

    /// A forward jump (Jcc short/near, JMP short/near, JRCXZ/JECXZ, LOOP)
    /// to a later item or the end.
    fn jump(&mut self, i: usize, n: usize) -> Option<Item> {
        const OTHERS: [Code; 7] = [
            Code::Jmp_rel8_64,
            Code::Jmp_rel32_64,
            Code::Jrcxz_rel8_64,
            Code::Jecxz_rel8_64,
            Code::Loop_rel8_64_RCX,
            Code::Loope_rel8_64_RCX,
            Code::Loopne_rel8_64_RCX,
        ];
        let code = if self.rng.chance(3, 4) {
            let cc = self.rng.below(16) as u32;
            let short = Code::Jo_rel8_64 as u32 + 3 * cc;
            let code = if self.rng.chance(1, 2) {
                // Jcc_rel8_64 codes are spaced by three (16/32/64 forms).
                short
            } else {
                Code::Jo_rel32_64 as u32 + 3 * cc
            };
            Code::try_from(code as usize).ok()?
        } else {
            *self.rng.pick(&OTHERS)
        };
        if !code.is_jcc_short_or_near() && !OTHERS.contains(&code) {
            return None;
        }
        let target = i + 1 + self.rng.index(n - i);
        let instr = Instruction::with_branch(code, FAKE_IP + target as u64 * 0x100).ok()?;
        let unconditional = matches!(code, Code::Jmp_rel8_64 | Code::Jmp_rel32_64);
        Some(Item {
            instrs: vec![instr],
            hints: vec![Hints::default()],
            jump_to: Some(target),
            falls_through: !unconditional,
        })
    }
}

/// `[rip + target]`: the encoder turns the absolute target into the
/// RIP-relative displacement.
fn rip_relative(target: u64) -> MemoryOperand {
    MemoryOperand::new(
        Register::RIP,
        Register::None,
        1,
        target as i64,
        8,
        false,
        Register::None,
    )
}

fn rm_bits(kind: OpCodeOperandKind) -> u32 {
    match kind {
        OpCodeOperandKind::r8_or_mem => 8,
        OpCodeOperandKind::r16_or_mem => 16,
        OpCodeOperandKind::r32_or_mem => 32,
        _ => 64,
    }
}

fn is_branch(instr: &Instruction) -> bool {
    instr.is_jcc_short_or_near()
        || instr.is_jmp_short_or_near()
        || instr.is_loop()
        || instr.is_loopcc()
        || instr.code().is_jcx_short()
}

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::{InstructionInfoFactory, OpAccess};

    /// Each generated instruction decoded at its own boundary (so an
    /// over-long one cannot desynchronise the rest), those skipped.
    fn instructions(case: &Case) -> Vec<Instruction> {
        case.disassembly()
            .into_iter()
            .filter(|(_, bytes, _)| bytes.len() <= 15)
            .map(|(addr, bytes, _)| {
                Decoder::with_ip(64, &bytes, addr, DecoderOptions::NO_INVALID_CHECK).decode()
            })
            .collect()
    }

    fn config() -> GenConfig {
        GenConfig {
            max_items: 8,
            lzcnt: true,
            tzcnt: true,
            popcnt: true,
            // The 64-bit generator's groups (`c32` has its own tests).
            groups: vec![Group::Int, Group::Sse, Group::X87],
        }
    }

    #[test]
    fn generation_is_deterministic() {
        for index in 0..50 {
            let a = generate_case(3, index, &config());
            let b = generate_case(3, index, &config());
            assert_eq!(a.code, b.code);
            assert_eq!(a.initial, b.initial);
            assert_eq!(a.checkpoints, b.checkpoints);
        }
        assert_ne!(
            generate_case(3, 0, &config()).code,
            generate_case(4, 0, &config()).code
        );
    }

    #[test]
    fn jcc_codes_are_spaced_by_three() {
        // `jump` relies on the layout of the Jcc codes in iced's enum.
        for cc in 0..16u32 {
            let short = Code::try_from((Code::Jo_rel8_64 as u32 + 3 * cc) as usize).unwrap();
            let near = Code::try_from((Code::Jo_rel32_64 as u32 + 3 * cc) as usize).unwrap();
            assert!(
                short.is_jcc_short()
                    && short.op_code().mode64()
                    && short.op_code().operand_size() == 64
            );
            assert!(near.is_jcc_near() && near.op_code().operand_size() == 64);
        }
    }

    #[test]
    fn static_memory_accesses_stay_in_the_window() {
        // Every explicit memory operand of a generated instruction is
        // computed from the initial register values (the base and index
        // are never written, RSP moves by a bounded amount) and must land
        // in the window.
        let mut factory = InstructionInfoFactory::new();
        let mut seen_mnemonics = std::collections::BTreeSet::new();
        for index in 0..2000 {
            let case = generate_case(11, index, &config());
            for instr in instructions(&case) {
                seen_mnemonics.insert(format!("{:?}", instr.mnemonic()));
                assert!(!instr.is_invalid(), "case {index}: invalid instruction");
                if matches!(instr.mnemonic(), M::Lea | M::Nop) || instr.is_string_instruction() {
                    continue;
                }
                let info = factory.info(&instr);
                for mem in info.used_memory() {
                    if mem.access() == OpAccess::NoMemAccess {
                        continue;
                    }
                    if matches!(instr.mnemonic(), M::Bt | M::Bts | M::Btr | M::Btc)
                        && instr.op1_kind() == iced_x86::OpKind::Register
                    {
                        continue; // the offset register moves the address
                    }
                    let addr = mem
                        .virtual_address(0, |reg, _, _| {
                            let value = match reg {
                                Register::RIP | Register::EIP => Some(instr.next_ip()),
                                Register::ES | Register::CS | Register::SS | Register::DS => {
                                    Some(0)
                                }
                                _ => super::super::defined::gpr_bits(reg).map(|(i, m)| {
                                    let v = case.initial.gpr[i];
                                    if m == 0xff00 {
                                        (v >> 8) & 0xff
                                    } else {
                                        v & m
                                    }
                                }),
                            }?;
                            Some(value)
                        })
                        .unwrap();
                    let addr = if mem.address_size() == iced_x86::CodeSize::Code32 {
                        addr & 0xffff_ffff
                    } else {
                        addr
                    };
                    // Page-edge items start accesses up to 16 bytes (an XMM
                    // operand) outside a window page (in its unmapped
                    // neighbour).
                    let near =
                        |page: u64| (page - 16..page + WINDOW_PAGE_SIZE + 16).contains(&addr);
                    assert!(
                        near(DATA_ADDR) || near(STACK_ADDR),
                        "case {index}: {instr} accesses {addr:#x}"
                    );
                }
            }
        }
        for needed in [
            "Add", "Adc", "Shld", "Rcr", "Imul", "Div", "Bts", "Bsf", "Sete", "Cmovne", "Movsxd",
            "Lea", "Push", "Pop", "Xadd", "Cmpxchg", "Cqo", "Bswap", "Movsb", "Scasq", "Nop",
            "Jrcxz", "Loop", "Std",
        ] {
            assert!(seen_mnemonics.contains(needed), "never generated {needed}");
        }
    }

    #[test]
    fn required_forms_are_generated() {
        use iced_x86::{OpKind, Register as R};
        let mut seen = std::collections::BTreeSet::new();
        let mut note = |what: String| {
            seen.insert(what);
        };
        for index in 0..4000 {
            let case = generate_case(17, index, &config());
            for instr in instructions(&case) {
                let m = format!("{:?}", instr.mnemonic());
                if instr.has_lock_prefix()
                    && !(instr.op_code().can_use_lock_prefix()
                        && instr.op0_kind() == OpKind::Memory)
                {
                    note("invalid lock".into());
                }
                let width = match instr.op0_kind() {
                    OpKind::Register => instr.op0_register().size() * 8,
                    OpKind::Memory => instr.memory_size().size() * 8,
                    _ => 0,
                };
                note(format!("{m}/{width}"));
                let has_memory = (0..instr.op_count()).any(|i| instr.op_kind(i) == OpKind::Memory);
                if has_memory {
                    note(format!(
                        "{m}/mem{}",
                        if instr.has_lock_prefix() { "/lock" } else { "" }
                    ));
                    if instr.memory_base() == R::RIP {
                        note("rip-relative".into());
                    }
                    let base32 = instr.memory_base().size() == 4;
                    if base32
                        || (instr.memory_base() == R::None && instr.memory_index().size() == 4)
                    {
                        note("address32".into());
                    }
                    if instr.memory_index() != R::None {
                        note(format!("scale{}", instr.memory_index_scale()));
                    }
                }
                if instr.has_rep_prefix() {
                    note(format!("rep {m}"));
                }
                if instr.has_repne_prefix() {
                    note(format!("repne {m}"));
                }
                if instr.is_string_instruction()
                    && !instr.has_rep_prefix()
                    && !instr.has_repne_prefix()
                {
                    note(format!("plain {m}"));
                }
                let shift = [M::Shl, M::Shr, M::Sar, M::Rol, M::Ror, M::Rcl, M::Rcr];
                if shift.contains(&instr.mnemonic()) {
                    if instr.op1_kind() == OpKind::Register {
                        note("shift by cl".into());
                    } else if format!("{:?}", instr.code()).ends_with("_1") {
                        note("shift by 1 (D0/D1)".into());
                    } else {
                        note(match instr.immediate8() as usize {
                            0 => "shift imm 0".into(),
                            1 => "shift imm 1".into(),
                            c if c > width => "shift imm above width".into(),
                            _ => "shift imm other".into(),
                        });
                    }
                }
                if instr.is_jcc_short() {
                    note("jcc short".into());
                }
                if instr.is_jcc_near() {
                    note("jcc near".into());
                }
            }
        }
        let mut required: Vec<String> = Vec::new();
        let all_widths = [
            "Add", "Or", "Adc", "Sbb", "And", "Sub", "Xor", "Cmp", "Test", "Inc", "Dec", "Neg",
            "Not", "Shl", "Shr", "Sar", "Rol", "Ror", "Rcl", "Rcr", "Mul", "Imul", "Div", "Idiv",
            "Mov", "Xchg", "Cmpxchg", "Xadd",
        ];
        for m in all_widths {
            for w in [8, 16, 32, 64] {
                required.push(format!("{m}/{w}"));
            }
        }
        let wide_only = [
            "Shld", "Shrd", "Bt", "Bts", "Btr", "Btc", "Bsf", "Bsr", "Tzcnt", "Lzcnt", "Popcnt",
            "Cmove", "Movsx", "Movzx", "Lea",
        ];
        for m in wide_only {
            for w in [16, 32, 64] {
                required.push(format!("{m}/{w}"));
            }
        }
        for m in ["Xchg", "Cmpxchg", "Xadd", "Add", "Bts", "Neg"] {
            required.push(format!("{m}/mem"));
            required.push(format!("{m}/mem/lock"));
        }
        for m in [
            "Bt", "Imul", "Cmovne", "Movsxd", "Push", "Pop", "Sete", "Nop",
        ] {
            required.push(format!("{m}/mem"));
        }
        for m in ["Movsb", "Movsq", "Stosw", "Lodsd", "Cmpsb", "Scasq"] {
            required.push(format!("plain {m}"));
        }
        for r in [
            "rep Movsd",
            "rep Stosb",
            "rep Lodsq",
            "rep Cmpsw",
            "repne Cmpsb",
            "rep Scasd",
            "repne Scasb",
        ] {
            required.push(r.into());
        }
        let misc = [
            "Cbw/0",
            "Cwde/0",
            "Cdqe/0",
            "Cwd/0",
            "Cdq/0",
            "Cqo/0",
            "Bswap/32",
            "Bswap/64",
            "Std/0",
            "Cld/0",
            "Movsxd/64",
            "Jrcxz/0",
            "Jmp/0",
            "Loop/0",
            "rip-relative",
            "address32",
            "scale1",
            "scale2",
            "scale4",
            "scale8",
            "shift by cl",
            "shift by 1 (D0/D1)",
            "shift imm 0",
            "shift imm 1",
            "shift imm above width",
            "jcc short",
            "jcc near",
        ];
        required.extend(misc.iter().map(|s| s.to_string()));
        let missing: Vec<&String> = required.iter().filter(|r| !seen.contains(*r)).collect();
        assert!(missing.is_empty(), "never generated: {missing:?}");
    }

    #[test]
    fn fault_points_have_checkpoints_and_encoding_matches() {
        for index in 0..300 {
            let case = generate_case(5, index, &config());
            let decoded = case.disassembly();
            assert!(!decoded.is_empty());
            let total: usize = decoded.iter().map(|d| d.1.len()).sum();
            assert_eq!(total, case.code.len());
            for (addr, bytes, text) in &decoded {
                // Only the padded items are longer than 15 bytes, and every
                // instruction decodes whole.
                assert!(bytes.len() <= 16, "{addr:#x}: {text}");
                assert!(
                    bytes.len() == 16 || !text.starts_with("(bad"),
                    "{addr:#x}: {text}"
                );
            }
            for c in &case.checkpoints {
                assert!(
                    case.boundaries.contains(&c.addr),
                    "checkpoint off an instruction boundary"
                );
            }
            // The first instruction is always reached.
            assert_eq!(case.checkpoints[0].addr, CODE_ADDR);
        }
    }
}
