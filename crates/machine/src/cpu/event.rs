//! Exception and interrupt delivery through the long-mode IDT.
//!
//! Delivery reads the 16-byte gate, checks it, switches stacks (TSS RSPn on
//! a privilege change, or an IST stack), pushes SS, RSP, RFLAGS, CS, RIP and
//! the error code, and jumps to the handler. A fault during delivery turns
//! into a double fault or a triple fault by the SDM's table of exception
//! classes (Vol. 3, 6.15, Table 6-5). In guest mode the exception bitmap is
//! consulted for the exception that would finally be delivered, and any VM
//! exit during delivery records the event as IDT-vectoring information so
//! the hypervisor can re-inject it.

use super::state::{rflags, seg_attr, Activity, Segment};
use super::{vector, Cpu, Fault, FaultKind, Step};
use crate::alu::Size;
use crate::memory::PhysMemory;
use crate::vmx::{EventInjection, EventKind, VmExit};

/// Exception class for double-fault detection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Benign,
    Contributory,
    PageFault,
    DoubleFault,
}

fn class_of(ev: &EventInjection) -> Class {
    if ev.kind != EventKind::HardwareException {
        return Class::Benign;
    }
    match ev.vector {
        vector::DE | vector::TS | vector::NP | vector::SS | vector::GP => Class::Contributory,
        vector::PF => Class::PageFault,
        vector::DF => Class::DoubleFault,
        _ => Class::Benign,
    }
}

/// Whether `ev` is a fault-class hardware exception (#DE, #BR, #UD, #NM,
/// #TS, #NP, #SS, #GP, #PF, #MF, #AC, #XM, #VE, #CP): its frame points at
/// the faulting instruction and carries RFLAGS.RF = 1. #DB is left out: its
/// faults are instruction breakpoints, whose frames keep RF as it was.
fn is_fault_class(ev: &EventInjection) -> bool {
    ev.kind == EventKind::HardwareException
        && matches!(ev.vector, 0 | 5 | 6 | 7 | 10..=14 | 16 | 17 | 19..=21)
}

/// Whether `vector` pushes an error code when raised as an exception.
pub fn has_error_code(vector: u8) -> bool {
    matches!(vector, 8 | 10..=14 | 17 | 21 | 29 | 30)
}

impl Cpu {
    /// Raises an exception caused by the current instruction.
    pub(super) fn raise_exception(
        &mut self,
        mem: &PhysMemory,
        vector: u8,
        error_code: Option<u32>,
        cr2: Option<u64>,
    ) -> Step {
        self.stats.exceptions += 1;
        if vector == vector::DB && self.db_pending != 0 {
            self.merge_pending_breakpoints();
        }
        let ev = EventInjection {
            kind: EventKind::HardwareException,
            vector,
            error_code,
            instruction_len: 0,
        };
        self.chain_first = Some(ev);
        self.deliver_with_cr2(mem, ev, cr2, None)
    }

    /// Delivers an interrupt or exception event (no CR2 update).
    pub(super) fn deliver_event(&mut self, mem: &PhysMemory, ev: EventInjection) -> Step {
        self.chain_first = Some(ev);
        self.deliver_with_cr2(mem, ev, None, None)
    }

    /// Delivers an event injected on VM entry. Injected events are never
    /// intercepted by the exception bitmap (VMX delivers them directly).
    pub(super) fn deliver_injected(&mut self, mem: &PhysMemory, ev: EventInjection) -> Step {
        self.chain_first = Some(ev);
        match self.push_idt_frame(mem, &ev) {
            Ok(()) => Step::Continue,
            Err(f) => self.delivery_failed(mem, ev, f),
        }
    }

    /// Delivers `ev`. `outer` is the event whose delivery raised this one.
    fn deliver_with_cr2(
        &mut self,
        mem: &PhysMemory,
        ev: EventInjection,
        cr2: Option<u64>,
        outer: Option<EventInjection>,
    ) -> Step {
        // The delivery pushes RFLAGS.
        self.flush_flags();
        if ev.kind == EventKind::HardwareException {
            if let Some(v) = self.vmx.as_deref() {
                if self.exception_exits(v, ev.vector, ev.error_code.unwrap_or(0)) {
                    self.idt_vectoring = outer;
                    return Step::Exit(VmExit::Exception {
                        vector: ev.vector,
                        error_code: ev.error_code,
                        qualification: cr2.unwrap_or(0),
                    });
                }
            }
            if let Some(addr) = cr2 {
                self.state.cr2 = addr;
            }
        }
        match self.push_idt_frame(mem, &ev) {
            Ok(()) => Step::Continue,
            Err(f) => self.delivery_failed(mem, ev, f),
        }
    }

    /// The exception bitmap decision, with the #PF error-code mask/match.
    fn exception_exits(&self, v: &crate::vmx::VmxControls, vector: u8, error_code: u32) -> bool {
        let bit = vector < 32 && v.exception_bitmap & (1 << vector) != 0;
        if vector == vector::PF {
            let matched = error_code & v.pf_error_code_mask == v.pf_error_code_match;
            bit == matched
        } else {
            bit
        }
    }

    /// A fault happened while delivering `ev`.
    fn delivery_failed(&mut self, mem: &PhysMemory, ev: EventInjection, f: Fault) -> Step {
        match f.into_kind() {
            FaultKind::Exit(e) => {
                self.idt_vectoring = Some(ev);
                Step::Exit(e)
            }
            FaultKind::Exception {
                vector: v2,
                error_code,
                cr2,
            } => {
                self.stats.exceptions += 1;
                // A nested exception the exception bitmap selects is a VM
                // exit with the first event in the IDT-vectoring
                // information, before any double-fault rule (SDM 27.2.4,
                // "nested exception"): a shadow MMU's #PF on an IDT or
                // stack page it has not mapped yet.
                if let Some(v) = self.vmx.as_deref() {
                    if self.exception_exits(v, v2, error_code.unwrap_or(0)) {
                        self.idt_vectoring = Some(ev);
                        return Step::Exit(VmExit::Exception {
                            vector: v2,
                            error_code,
                            qualification: cr2.unwrap_or(0),
                        });
                    }
                }
                let second = EventInjection {
                    kind: EventKind::HardwareException,
                    vector: v2,
                    error_code,
                    instruction_len: 0,
                };
                let first = class_of(&ev);
                let next = class_of(&second);
                let double = matches!(
                    (first, next),
                    (Class::Contributory, Class::Contributory)
                        | (Class::PageFault, Class::Contributory)
                        | (Class::PageFault, Class::PageFault)
                );
                if first == Class::DoubleFault {
                    return self.triple_fault(v2);
                }
                if double {
                    let df = EventInjection {
                        kind: EventKind::HardwareException,
                        vector: vector::DF,
                        error_code: Some(0),
                        instruction_len: 0,
                    };
                    self.deliver_with_cr2(mem, df, None, Some(ev))
                } else {
                    self.deliver_with_cr2(mem, second, cr2, Some(ev))
                }
            }
        }
    }

    fn triple_fault(&mut self, during_double_fault: u8) -> Step {
        self.triple_fault = Some(super::triple_fault::TripleFaultCause {
            first: self.chain_first.unwrap_or(EventInjection {
                kind: EventKind::HardwareException,
                vector: vector::DF,
                error_code: Some(0),
                instruction_len: 0,
            }),
            during_double_fault,
        });
        self.state.activity = Activity::Shutdown;
        Step::Exit(VmExit::TripleFault)
    }

    /// Reads a 64-bit word of the TSS at `offset`.
    fn tss_read(&mut self, mem: &PhysMemory, offset: u64) -> Result<u64, Fault> {
        if offset + 7 > self.state.tr.limit as u64 || self.state.tr.attr & seg_attr::UNUSABLE != 0 {
            return Err(Fault::with_code(
                vector::TS,
                (self.state.tr.selector & !3) as u32,
            ));
        }
        self.read_implicit(mem, self.state.tr.base.wrapping_add(offset), Size::B8)
    }

    /// Builds the interrupt frame and transfers control to the handler.
    /// Registers are committed only after every memory access succeeded.
    fn push_idt_frame(&mut self, mem: &PhysMemory, ev: &EventInjection) -> Result<(), Fault> {
        if self.real_mode() {
            return self.push_ivt_frame(mem, ev);
        }
        let vec = ev.vector as u64;
        let software = ev.kind == EventKind::SoftwareInterrupt;
        let ext: u32 = if software { 0 } else { 1 };
        let idt_error = (vec as u32) * 8 + 2 + ext;
        let cpl = self.state.cpl();
        if vec * 16 + 15 > self.state.idtr.limit as u64 {
            return Err(Fault::with_code(vector::GP, idt_error));
        }
        let gate_la = self.state.idtr.base.wrapping_add(vec * 16);
        let lo = self.read_implicit(mem, gate_la, Size::B8)?;
        let hi = self.read_implicit(mem, gate_la.wrapping_add(8), Size::B8)?;
        let gate_type = (lo >> 40) & 0xf;
        let gate_dpl = ((lo >> 45) & 3) as u8;
        let present = (lo >> 47) & 1 != 0;
        let ist = (lo >> 32) & 7;
        let selector = ((lo >> 16) & 0xffff) as u16;
        let target = (lo & 0xffff) | (((lo >> 48) & 0xffff) << 16) | ((hi & 0xffff_ffff) << 32);
        if gate_type != 0xe && gate_type != 0xf {
            return Err(Fault::with_code(vector::GP, idt_error));
        }
        if software && gate_dpl < cpl {
            return Err(Fault::with_code(vector::GP, idt_error));
        }
        if !present {
            return Err(Fault::with_code(vector::NP, idt_error));
        }
        let code = self.load_descriptor(mem, selector, ext)?;
        let is_code = code.attr & seg_attr::S != 0 && code.attr & 0x8 != 0;
        if selector & !3 == 0 || !is_code || code.attr & seg_attr::LONG == 0 {
            return Err(Fault::with_code(vector::GP, (selector & !3) as u32 | ext));
        }
        let new_cpl = code.dpl();
        if new_cpl > cpl {
            return Err(Fault::with_code(vector::GP, (selector & !3) as u32 | ext));
        }
        if code.attr & seg_attr::PRESENT == 0 {
            return Err(Fault::with_code(vector::NP, (selector & !3) as u32 | ext));
        }
        let old_rsp = self.state.gpr[4];
        let mut rsp = if ist != 0 {
            self.tss_read(mem, 0x24 + (ist - 1) * 8)?
        } else if new_cpl < cpl {
            self.tss_read(mem, 4 + new_cpl as u64 * 8)?
        } else {
            old_rsp
        };
        if !crate::addr::is_canonical(rsp) {
            return Err(Fault::with_code(vector::SS, ext));
        }
        rsp &= !0xf;
        let return_rip = if software {
            self.state.rip.wrapping_add(ev.instruction_len as u64)
        } else {
            self.state.rip
        };
        // RF in the saved RFLAGS: set for every fault-class exception but
        // an instruction-breakpoint #DB (SDM Vol. 3A 18.3.1.1), so that
        // the IRET back to the faulting instruction does not fault on an
        // instruction breakpoint there again.
        let saved_rflags = if is_fault_class(ev) {
            self.state.rflags | rflags::RF
        } else {
            self.state.rflags
        };
        let mut frame = [
            self.state.ss.selector as u64,
            old_rsp,
            saved_rflags,
            self.state.cs.selector as u64,
            return_rip,
            0,
        ];
        let mut n = 5;
        if let Some(code) = ev.error_code {
            if ev.kind == EventKind::HardwareException {
                frame[5] = code as u64;
                n = 6;
            }
        }
        for &word in frame.iter().take(n) {
            rsp = rsp.wrapping_sub(8);
            self.write_implicit(mem, rsp, Size::B8, word)
                .map_err(super::access::stack_fault)?;
        }
        // Commit.
        self.mode_epoch += 1;
        self.state.gpr[4] = rsp;
        self.state.cs = Segment {
            selector: (selector & !3) | new_cpl as u16,
            ..code
        };
        if new_cpl != cpl {
            self.state.ss = Segment {
                selector: new_cpl as u16,
                base: 0,
                limit: 0,
                attr: seg_attr::UNUSABLE | ((new_cpl as u32) << seg_attr::DPL_SHIFT),
            };
        }
        let mut fl = self.state.rflags & !(rflags::TF | rflags::NT | rflags::RF | rflags::VM);
        if gate_type == 0xe {
            fl &= !rflags::IF;
        }
        self.state.rflags = fl;
        self.state.rip = target;
        self.state.interruptibility = 0;
        if ev.kind == EventKind::Nmi {
            self.state.nmi_blocked = true;
        }
        self.state.activity = Activity::Active;
        self.cycles += self.costs.event_delivery;
        self.check_events = true;
        Ok(())
    }

    /// Real-mode delivery through the interrupt vector table (IDTR.base,
    /// 4-byte IP:CS entries): FLAGS, CS and IP are pushed (no error code),
    /// IF, TF, AC and RF are cleared.
    fn push_ivt_frame(&mut self, mem: &PhysMemory, ev: &EventInjection) -> Result<(), Fault> {
        let vec = ev.vector as u64;
        if vec * 4 + 3 > self.state.idtr.limit as u64 {
            return Err(Fault::with_code(vector::GP, (vec as u32) * 8 + 2));
        }
        let entry =
            self.read_implicit(mem, self.state.idtr.base.wrapping_add(vec * 4), Size::B4)?;
        let return_ip = if ev.kind == EventKind::SoftwareInterrupt {
            self.state.rip.wrapping_add(ev.instruction_len as u64)
        } else {
            self.state.rip
        };
        let saved = self.state.gpr[4];
        let frame = [
            self.state.rflags & 0xffff,
            self.state.cs.selector as u64,
            return_ip & 0xffff,
        ];
        for word in frame {
            if let Err(f) = self.stack_push(mem, Size::B2, word) {
                self.state.gpr[4] = saved;
                return Err(f);
            }
        }
        self.state.cs = Self::real_mode_segment(&self.state.cs, (entry >> 16) as u16);
        self.state.rip = entry & 0xffff;
        self.state.rflags &= !(rflags::IF | rflags::TF | rflags::AC | rflags::RF);
        self.state.interruptibility = 0;
        if ev.kind == EventKind::Nmi {
            self.state.nmi_blocked = true;
        }
        self.state.activity = Activity::Active;
        self.mode_epoch += 1;
        self.cycles += self.costs.event_delivery;
        self.check_events = true;
        Ok(())
    }
}
