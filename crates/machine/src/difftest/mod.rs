//! Differential testing of the interpreter against the host CPU.
//!
//! A case is a short random instruction sequence (1-8 generated items) with
//! a random initial state. It runs twice: natively in ring 3 in a forked
//! child ([`native`]), and in the interpreter in ring 3 guest mode
//! ([`interp`]). Both runs use the same linear addresses ([`layout`]), so
//! the final general registers, the architecturally defined RFLAGS bits and
//! the memory window must agree bit for bit ([`compare`]).
//!
//! What "defined" means is tracked per instruction by [`defined`] from
//! iced-x86's instruction info plus the SDM's count-dependent rules for
//! shifts and rotates; the generator ([`gen`]) never emits an instruction
//! that reads a flag or register bit whose value the architecture leaves
//! undefined, so every compared bit is architecturally determined.
//!
//! [`fuzz`] reuses the interpreter sandbox to check that no input makes the
//! interpreter panic.

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub mod campaign;
pub mod compare;
pub mod defined;
pub mod fuzz;
pub mod gen;
pub mod gen32;
pub mod interp;
pub mod layout;
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub mod native;
pub mod panics;
pub mod rng;

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub use campaign::{run_campaign, CampaignReport, CaseOutcome};
pub use compare::{compare, Difference};
pub use gen::{generate_case, Case, GenConfig};
pub use interp::{run_snippet, Sandbox, SandboxMode};

use crate::cpu::fpu_state::FpuState;
use crate::cpu::state::rflags;

/// RFLAGS bits the tester loads and compares: the arithmetic flags and DF.
pub const COMPARED_FLAGS: u64 = rflags::ARITH | rflags::DF;

/// The state a case starts from (identical for both runs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitialState {
    /// RAX..R15 in encoding order.
    pub gpr: [u64; 16],
    /// Only [`COMPARED_FLAGS`] are used; both runs add IF and the fixed bit.
    pub rflags: u64,
    /// Contents of the memory window (data page, then stack page).
    pub window: Vec<u8>,
    /// x87 and SSE state (XMM registers, MXCSR, the x87 stack).
    pub fpu: FpuState,
}

/// How an exception that stopped a run is classified, so a native signal
/// and an interpreter exception vector can be compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FaultKind {
    /// #DE, SIGFPE.
    DivideError,
    /// #UD, SIGILL.
    InvalidOpcode,
    /// #GP, #SS or #PF; SIGSEGV.
    Protection,
    /// #BP or #DB; SIGTRAP.
    Trap,
    /// #AC; SIGBUS.
    Alignment,
    /// #XM or #MF; SIGFPE with a floating-point `si_code`.
    FloatingPoint,
    /// Any other vector or signal (the raw number).
    Other(i32),
}

impl FaultKind {
    /// The class of an exception vector.
    pub fn from_vector(vector: u8) -> FaultKind {
        match vector {
            0 => FaultKind::DivideError,
            6 => FaultKind::InvalidOpcode,
            // Linux reports #OF (INTO) and #BR (BOUND) as SIGSEGV too.
            4 | 5 | 12..=14 => FaultKind::Protection,
            1 | 3 => FaultKind::Trap,
            17 => FaultKind::Alignment,
            16 | 19 => FaultKind::FloatingPoint,
            v => FaultKind::Other(v as i32),
        }
    }

    /// The class of a POSIX signal with its `si_code`.
    pub fn from_signal(signal: i32, code: i32) -> FaultKind {
        match signal {
            // si_code FPE_INTDIV (1) or FPE_INTOVF (2): a #DE.
            libc::SIGFPE if code == 1 || code == 2 => FaultKind::DivideError,
            libc::SIGFPE => FaultKind::FloatingPoint,
            libc::SIGILL => FaultKind::InvalidOpcode,
            libc::SIGSEGV => FaultKind::Protection,
            libc::SIGTRAP => FaultKind::Trap,
            libc::SIGBUS => FaultKind::Alignment,
            s => FaultKind::Other(s),
        }
    }

    /// Short name for reports.
    pub fn name(self) -> String {
        match self {
            FaultKind::DivideError => "#DE/SIGFPE".into(),
            FaultKind::InvalidOpcode => "#UD/SIGILL".into(),
            FaultKind::Protection => "#GP/#PF/SIGSEGV".into(),
            FaultKind::Trap => "#BP/#DB/SIGTRAP".into(),
            FaultKind::Alignment => "#AC/SIGBUS".into(),
            FaultKind::FloatingPoint => "#XM/#MF/SIGFPE".into(),
            FaultKind::Other(n) => format!("other({n})"),
        }
    }
}

/// Why a run stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    /// Execution reached the end of the snippet.
    Finished,
    /// An exception at `rip` (the faulting instruction). `raw` is the
    /// signal number (native) or vector (interpreter); `address` the
    /// faulting address where one is reported.
    Fault {
        kind: FaultKind,
        raw: i32,
        address: Option<u64>,
    },
    /// The run ended some other way (an unexpected VM exit, a panic in the
    /// interpreter, a native child that died or timed out).
    Abnormal(String),
}

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stop::Finished => write!(f, "finished"),
            Stop::Fault { kind, raw, address } => {
                write!(f, "fault {} (raw {raw})", kind.name())?;
                if let Some(a) = address {
                    write!(f, " address {a:#x}")?;
                }
                Ok(())
            }
            Stop::Abnormal(why) => write!(f, "abnormal: {why}"),
        }
    }
}

/// The state a run ended in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FinalState {
    pub stop: Stop,
    /// The end of the snippet, or the faulting instruction.
    pub rip: u64,
    pub gpr: [u64; 16],
    pub rflags: u64,
    /// Contents of the memory window at the end.
    pub window: Vec<u8>,
    /// x87 and SSE state at the end.
    pub fpu: FpuState,
}

impl FinalState {
    /// A state for a run that could not produce one (`gpr`, `rflags` and
    /// window zero).
    pub fn abnormal(why: impl Into<String>) -> FinalState {
        FinalState {
            stop: Stop::Abnormal(why.into()),
            rip: 0,
            gpr: [0; 16],
            rflags: 0,
            window: vec![0; layout::WINDOW_SIZE],
            fpu: FpuState::default(),
        }
    }
}

/// Names of the general registers in encoding order.
pub const GPR_NAMES: [&str; 16] = [
    "rax", "rcx", "rdx", "rbx", "rsp", "rbp", "rsi", "rdi", "r8", "r9", "r10", "r11", "r12", "r13",
    "r14", "r15",
];
