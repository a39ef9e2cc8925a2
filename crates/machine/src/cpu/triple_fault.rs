//! What led to a triple fault: the machine keeps the event whose delivery
//! began the chain (a fault, then perhaps a second one, then #DF) and the
//! exception that made #DF undeliverable, so a shutdown can be explained
//! rather than just located.

use crate::vmx::{EventInjection, EventKind};
use std::fmt;

/// The chain of events that ended in a triple fault (CPU shutdown).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TripleFaultCause {
    /// The event whose delivery began the chain (an exception the
    /// instruction raised, or an interrupt or injected event).
    pub first: EventInjection,
    /// The exception raised while delivering the double fault.
    pub during_double_fault: u8,
}

/// `#UD`-style mnemonic and description of exception vector `v`.
pub fn exception_name(v: u8) -> (&'static str, &'static str) {
    match v {
        0 => ("#DE", "divide error"),
        1 => ("#DB", "debug"),
        2 => ("NMI", "non-maskable interrupt"),
        3 => ("#BP", "breakpoint"),
        4 => ("#OF", "overflow"),
        5 => ("#BR", "bound range exceeded"),
        6 => ("#UD", "invalid opcode"),
        7 => ("#NM", "device not available"),
        8 => ("#DF", "double fault"),
        10 => ("#TS", "invalid TSS"),
        11 => ("#NP", "segment not present"),
        12 => ("#SS", "stack-segment fault"),
        13 => ("#GP", "general protection"),
        14 => ("#PF", "page fault"),
        16 => ("#MF", "x87 floating-point error"),
        17 => ("#AC", "alignment check"),
        18 => ("#MC", "machine check"),
        19 => ("#XM", "SIMD floating-point error"),
        20 => ("#VE", "virtualization exception"),
        21 => ("#CP", "control protection"),
        _ => ("?", "reserved vector"),
    }
}

/// Describes an event: "#UD (invalid opcode)", "#GP(0x3a) (general
/// protection)", "external interrupt 0x20", "int 0x80".
pub fn describe_event(ev: &EventInjection) -> String {
    match ev.kind {
        EventKind::HardwareException => {
            let (mnemonic, what) = exception_name(ev.vector);
            match ev.error_code {
                Some(code) => format!("{mnemonic}({code:#x}) ({what})"),
                None => format!("{mnemonic} ({what})"),
            }
        }
        EventKind::Nmi => "NMI".to_string(),
        EventKind::ExternalInterrupt => format!("external interrupt {:#x}", ev.vector),
        EventKind::SoftwareInterrupt => format!("int {:#x}", ev.vector),
    }
}

impl fmt::Display for TripleFaultCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (df_fault, df_what) = exception_name(self.during_double_fault);
        write!(
            f,
            "the chain began with {}; delivering #DF raised {df_fault} ({df_what})",
            describe_event(&self.first)
        )
    }
}
