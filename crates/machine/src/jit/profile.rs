//! A host-side histogram of the instructions translated code calls out
//! for (the interpreter runs them), by mnemonic and operand shape: what to
//! make native next. Off unless the environment variable
//! `FAULTLINE_JIT_CALLOUTS` is set when the CPU is made; each CPU prints
//! its histogram to stderr when it is dropped. Set to `sites`, it counts
//! by guest address too (`... @ffffffff81234567`): which code to look
//! at. Nothing here is guest state: guest state, memory and virtual time
//! do not depend on it.

use crate::cpu::fast::Op;
use iced_x86::OpKind;
use std::collections::HashMap;

/// The environment variable that turns the histogram on.
pub const ENV: &str = "FAULTLINE_JIT_CALLOUTS";

/// Entries printed.
const TOP: usize = 40;

/// Call-outs by instruction shape.
#[derive(Debug, Default)]
pub(crate) struct CallOutProfile {
    counts: HashMap<String, u64>,
    /// Count each instruction address apart (`FAULTLINE_JIT_CALLOUTS=sites`).
    by_site: bool,
}

impl CallOutProfile {
    /// A profile if the environment asks for one.
    pub(crate) fn from_env() -> Option<Box<CallOutProfile>> {
        std::env::var_os(ENV).map(|v| {
            Box::new(CallOutProfile {
                counts: HashMap::new(),
                by_site: v == "sites",
            })
        })
    }

    /// Counts one call-out of `op`.
    pub(crate) fn count(&mut self, op: &Op) {
        let mut key = shape(op);
        if self.by_site {
            key.push_str(&format!(" @{:x}", op.insn.ip()));
        }
        *self.counts.entry(key).or_insert(0) += 1;
    }

    /// The histogram, most frequent first (ties by name).
    pub(crate) fn sorted(&self) -> Vec<(&str, u64)> {
        let mut v: Vec<(&str, u64)> = self.counts.iter().map(|(k, &n)| (k.as_str(), n)).collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        v
    }
}

impl Drop for CallOutProfile {
    fn drop(&mut self) {
        let v = self.sorted();
        let total: u64 = v.iter().map(|e| e.1).sum();
        if total == 0 {
            return;
        }
        eprintln!("jit call-outs: {total} (top {TOP})");
        for (k, n) in v.iter().take(TOP) {
            eprintln!("  {n:>12} {:>5.1}%  {k}", *n as f64 * 100.0 / total as f64);
        }
    }
}

/// `MNEMONIC op,op` with operands as `r64`, `cl`, `m32`, `fs:m64`, `imm`,
/// `rel` and the fast form's variant when there is one.
fn shape(op: &Op) -> String {
    let i = &op.insn;
    let mut s = format!("{:?}", i.mnemonic()).to_lowercase();
    if i.has_rep_prefix() || i.has_repne_prefix() {
        s.insert_str(0, "rep ");
    }
    if i.has_lock_prefix() {
        s.insert_str(0, "lock ");
    }
    for n in 0..i.op_count() {
        s.push(if n == 0 { ' ' } else { ',' });
        match i.op_kind(n) {
            OpKind::Register => {
                let r = i.op_register(n);
                if r == iced_x86::Register::CL {
                    s.push_str("cl");
                } else if r.is_gpr() {
                    s.push_str(&format!("r{}", r.size() * 8));
                } else {
                    s.push_str(&format!("{r:?}").to_lowercase());
                }
            }
            OpKind::Memory => {
                if matches!(
                    i.memory_segment(),
                    iced_x86::Register::FS | iced_x86::Register::GS
                ) {
                    s.push_str(&format!("{:?}:", i.memory_segment()).to_lowercase());
                }
                s.push_str(&format!("m{}", i.memory_size().size() * 8));
            }
            OpKind::NearBranch16 | OpKind::NearBranch32 | OpKind::NearBranch64 => s.push_str("rel"),
            k if format!("{k:?}").starts_with("Immediate") => s.push_str("imm"),
            // String operands (MemorySegRSI, MemoryESRDI...).
            k if format!("{k:?}").starts_with("Memory") => {
                s.push_str(&format!("m{}", i.memory_size().size() * 8))
            }
            _ => s.push('?'),
        }
    }
    let fast = format!("{:?}", op.fast);
    let variant = fast.split([' ', '{']).next().unwrap_or("");
    if variant != "Generic" {
        s.push_str(&format!("  [{variant}]"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(bytes: &[u8]) -> Op {
        let mut d = iced_x86::Decoder::with_ip(64, bytes, 0x1000, 0);
        Op::new(d.decode())
    }

    #[test]
    fn shapes_name_the_form() {
        assert_eq!(shape(&op(&[0x48, 0xd3, 0xe8])), "shr r64,cl  [Shift]");
        assert_eq!(
            shape(&op(&[0x65, 0x48, 0x8b, 0x03])),
            "mov r64,gs:m64  [MovRM]"
        );
        assert_eq!(shape(&op(&[0x87, 0x03])), "xchg m32,r32");
        assert_eq!(shape(&op(&[0xf3, 0x48, 0xab])), "rep stosq m64,r64");
        let mut p = CallOutProfile::default();
        p.count(&op(&[0x87, 0x03]));
        p.count(&op(&[0x48, 0xd3, 0xe8]));
        p.count(&op(&[0x87, 0x03]));
        assert_eq!(
            p.sorted(),
            vec![("xchg m32,r32", 2), ("shr r64,cl  [Shift]", 1)]
        );
        p.counts.clear();
        p.by_site = true;
        p.count(&op(&[0x87, 0x03]));
        assert_eq!(p.sorted(), vec![("xchg m32,r32 @1000", 1)]);
        p.counts.clear();
    }
}
