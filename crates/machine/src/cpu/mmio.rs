//! What a VMM needs to emulate an MMIO access: when a data access exits
//! with an EPT violation, the machine records the access of the
//! faulting instruction if it is a plain `mov` between a general
//! register (or an immediate) and memory, the form device drivers use
//! (Linux's `readl`/`writel`, a C `volatile` load or store). The VMM
//! reads it with [`Cpu::mmio_access`] and finishes the instruction with
//! [`Cpu::skip_instruction`] (a store) or [`Cpu::complete_mmio_read`] (a
//! load): hardware VMX leaves this decoding to the VMM; the machine has
//! the instruction decoded already, so it hands the result over.

use super::access::gpr_info;
use super::{Cpu, Fault, FaultKind};
use crate::alu::Size;
use crate::vmx::{MmioAccess, VmExit};
use iced_x86::{Instruction, Mnemonic, OpKind};

/// Where a recorded MMIO load goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MmioLoad {
    idx: u8,
    size: Size,
    high: bool,
}

/// The recorded access of the instruction that exited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PendingMmio {
    access: MmioAccess,
    load: Option<MmioLoad>,
}

impl Cpu {
    /// Records the MMIO access of `insn` if `fault` is an EPT violation
    /// or a page fault (under shadow paging the hv sees MMIO as a #PF
    /// exit) and the instruction a plain register/immediate `mov` (else
    /// clears it).
    pub(super) fn note_mmio(&mut self, insn: &Instruction, fault: &Fault) {
        self.mmio = match fault.kind() {
            FaultKind::Exit(VmExit::EptViolation { .. })
            | FaultKind::Exception {
                vector: super::vector::PF,
                ..
            } => self.decode_mmio(insn),
            _ => None,
        };
    }

    fn decode_mmio(&self, i: &Instruction) -> Option<PendingMmio> {
        if i.mnemonic() != Mnemonic::Mov || i.op_count() != 2 {
            return None;
        }
        let gpr = |n: u32| i.op_kind(n) == OpKind::Register && i.op_register(n).is_gpr();
        if i.op_kind(0) == OpKind::Memory {
            let size = Cpu::op_size(i, 0);
            let value = if gpr(1) {
                self.reg(i.op_register(1))
            } else if matches!(
                i.op_kind(1),
                OpKind::Immediate8
                    | OpKind::Immediate16
                    | OpKind::Immediate32
                    | OpKind::Immediate32to64
            ) {
                i.immediate(1) & size.mask()
            } else {
                return None;
            };
            Some(PendingMmio {
                access: MmioAccess {
                    size: size.bytes(),
                    write: Some(value),
                },
                load: None,
            })
        } else if gpr(0) && i.op_kind(1) == OpKind::Memory {
            let (idx, size, high) = gpr_info(i.op_register(0));
            Some(PendingMmio {
                access: MmioAccess {
                    size: size.bytes(),
                    write: None,
                },
                load: Some(MmioLoad { idx, size, high }),
            })
        } else {
            None
        }
    }

    /// After an [`VmExit::EptViolation`] (or a #PF exit): the data access of the
    /// instruction, if the machine could describe it (see the module).
    pub fn mmio_access(&self) -> Option<MmioAccess> {
        self.mmio.map(|m| m.access)
    }

    /// Completes the MMIO load [`Cpu::mmio_access`] described: the
    /// destination register gets `value` (x86 partial-register rules)
    /// and the instruction is skipped. Without a recorded load, nothing
    /// is written and the instruction is still skipped.
    pub fn complete_mmio_read(&mut self, value: u64) {
        if let Some(load) = self.mmio.and_then(|m| m.load) {
            self.set_gpr_sized(load.idx, load.size, load.high, value);
        }
        self.mmio = None;
        self.skip_instruction();
    }
}
