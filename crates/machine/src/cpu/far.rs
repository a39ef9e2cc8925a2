//! Transfers between code segments and segment loads outside 64-bit mode:
//! far JMP/CALL (direct ptr16:16/32 and indirect m16:16/32/64), far RET,
//! IRET of every operand size, LDS/LES/LSS/LFS/LGS, and real-mode
//! segment loads (base = selector * 16, no descriptor).
//!
//! In protected mode the target code segment comes from the GDT with the
//! SDM's checks for a direct transfer (conforming or not, DPL, RPL,
//! present, and in IA-32e mode L and D not both set). Call gates, task
//! gates and TSS targets are not modelled: a far JMP/CALL naming a system
//! descriptor raises #GP(selector). CS limits are not checked.

use super::exec::ud;
use super::state::{cr0, efer, rflags, seg_attr, Segment};
use super::{vector, Cpu, Fault};
use crate::addr::is_canonical;
use crate::alu::Size;
use crate::memory::PhysMemory;
use iced_x86::{Code, Instruction, Mnemonic as M, OpKind, Register};

fn gp(code: u32) -> Fault {
    Fault::with_code(vector::GP, code)
}

impl Cpu {
    /// Whether the CPU is in real mode (CR0.PE clear).
    #[inline]
    pub(super) fn real_mode(&self) -> bool {
        self.state.cr0 & cr0::PE == 0
    }

    /// The segment a real-mode load of `sel` gives `old`: the base is
    /// `sel * 16`; limit and attributes stay (so a segment loaded in
    /// protected mode keeps its limit: "unreal" mode).
    pub(super) fn real_mode_segment(old: &Segment, sel: u16) -> Segment {
        let attr = if old.attr & seg_attr::UNUSABLE != 0 {
            seg_attr::TYPE_DATA_RW_ACCESSED | seg_attr::S | seg_attr::PRESENT
        } else {
            old.attr
        };
        Segment {
            selector: sel,
            base: (sel as u64) << 4,
            limit: if old.limit == 0 { 0xffff } else { old.limit },
            attr,
        }
    }

    /// Whether `seg` as CS runs 64-bit code.
    fn is_64bit_code(&self, seg: &Segment) -> bool {
        self.state.efer & efer::LMA != 0 && seg.attr & seg_attr::LONG != 0
    }

    /// The code segment a far JMP or CALL to `sel` loads (same privilege
    /// only: call gates are not modelled).
    fn far_target_segment(&mut self, mem: &PhysMemory, sel: u16) -> Result<Segment, Fault> {
        if self.real_mode() {
            return Ok(Self::real_mode_segment(&self.state.cs, sel));
        }
        let err = gp((sel & !3) as u32);
        if sel & !3 == 0 {
            return Err(gp(0));
        }
        let d = self.load_descriptor(mem, sel, 0)?;
        let cpl = self.state.cpl();
        let code = d.attr & seg_attr::S != 0 && d.attr & 0x8 != 0;
        if !code {
            return Err(err);
        }
        let conforming = d.attr & 0x4 != 0;
        let allowed = if conforming {
            d.dpl() <= cpl
        } else {
            (sel & 3) as u8 <= cpl && d.dpl() == cpl
        };
        if !allowed {
            return Err(err);
        }
        if self.state.efer & efer::LMA != 0
            && d.attr & seg_attr::LONG != 0
            && d.attr & seg_attr::DB != 0
        {
            return Err(err);
        }
        if d.attr & seg_attr::PRESENT == 0 {
            return Err(Fault::with_code(vector::NP, (sel & !3) as u32));
        }
        Ok(Segment {
            selector: (sel & !3) | cpl as u16,
            ..d
        })
    }

    /// The offset a transfer to `code` may use: canonical for 64-bit
    /// code, else wrapped at the operand size.
    fn far_offset(&self, code: &Segment, offset: u64, size: Size) -> Result<u64, Fault> {
        if self.is_64bit_code(code) {
            if !is_canonical(offset) {
                return Err(gp(0));
            }
            Ok(offset)
        } else {
            Ok(offset & size.mask())
        }
    }

    /// Far JMP (`call` false) or CALL to another code segment.
    pub(super) fn exec_far_jump(
        &mut self,
        mem: &PhysMemory,
        i: &Instruction,
        call: bool,
    ) -> Result<(), Fault> {
        let (sel, offset, size) = match i.op0_kind() {
            OpKind::FarBranch16 => (i.far_branch_selector(), i.far_branch16() as u64, Size::B2),
            OpKind::FarBranch32 => (i.far_branch_selector(), i.far_branch32() as u64, Size::B4),
            OpKind::Memory => {
                // m16:16, m16:32 or m16:64: the offset, then the selector.
                let size = match i.memory_size().size() {
                    4 => Size::B2,
                    6 => Size::B4,
                    10 => Size::B8,
                    _ => return Err(ud()),
                };
                let offset = self.operand_offset(i);
                let seg = i.memory_segment();
                let la = self.linear(seg, offset);
                let off = self.read_mem(mem, la, size)?;
                let sel_la = self.linear(seg, offset.wrapping_add(size.bytes() as u64));
                let sel = self.read_mem(mem, sel_la, Size::B2)? as u16;
                (sel, off, size)
            }
            _ => return Err(ud()),
        };
        let code = self.far_target_segment(mem, sel)?;
        let target = self.far_offset(&code, offset, size)?;
        if call {
            // CS and the return offset: each push is half the change.
            let push = match i.stack_pointer_increment().unsigned_abs() {
                4 => Size::B2,
                8 => Size::B4,
                _ => Size::B8,
            };
            let saved = self.state.gpr[4];
            let old_cs = self.state.cs.selector as u64;
            let ret = self.next_rip & push.mask();
            let pushed = self
                .stack_push(mem, push, old_cs)
                .and_then(|()| self.stack_push(mem, push, ret));
            if let Err(f) = pushed {
                self.state.gpr[4] = saved;
                return Err(f);
            }
        }
        self.state.cs = code;
        self.mode_epoch += 1;
        self.next_rip = target;
        Ok(())
    }

    /// Far RET of any operand size, to the same or an outer privilege.
    pub(super) fn exec_retf(&mut self, mem: &PhysMemory, i: &Instruction) -> Result<(), Fault> {
        let size = match i.code() {
            Code::Retfw | Code::Retfw_imm16 => Size::B2,
            Code::Retfq | Code::Retfq_imm16 => Size::B8,
            _ => Size::B4,
        };
        let n = size.bytes() as u64;
        let extra = if i.op_count() == 1 {
            i.immediate16() as u64
        } else {
            0
        };
        let cpl = self.state.cpl();
        let offset = self.stack_peek(mem, 0, size)?;
        let sel = self.stack_peek(mem, n, size)? as u16;
        if self.real_mode() {
            let code = Self::real_mode_segment(&self.state.cs, sel);
            self.state.cs = code;
            let sp = self.state.gpr[4].wrapping_add(2 * n + extra);
            self.set_stack_pointer(sp);
            self.next_rip = offset & size.mask();
            return Ok(());
        }
        let new_cpl = (sel & 3) as u8;
        if new_cpl < cpl {
            return Err(gp((sel & !3) as u32));
        }
        let code = self.return_code_segment(mem, sel)?;
        let target = self.far_offset(&code, offset, size)?;
        let mut stack = None;
        if new_cpl > cpl {
            let outer_sp = self.stack_peek(mem, 2 * n + extra, size)?;
            let ss = self.stack_peek(mem, 3 * n + extra, size)? as u16;
            stack = Some((self.return_stack_segment(mem, ss, new_cpl)?, outer_sp));
        }
        let sp = self.state.gpr[4].wrapping_add(2 * n + extra);
        self.set_stack_pointer(sp);
        self.state.cs = code;
        if let Some((ss, outer_sp)) = stack {
            self.state.ss = ss;
            self.state.gpr[4] = outer_sp.wrapping_add(extra);
        }
        self.mode_epoch += 1;
        self.check_events = true;
        self.next_rip = target;
        Ok(())
    }

    /// IRET, IRETD or IRETQ. In 64-bit mode SS:RSP are always popped;
    /// elsewhere only on a return to an outer privilege. Returns to
    /// virtual-8086 mode and nested tasks (NT) are not modelled: #GP(0).
    pub(super) fn exec_iret(&mut self, mem: &PhysMemory, i: &Instruction) -> Result<(), Fault> {
        self.cycles += self.costs.privilege_transition;
        // IRET ends blocking by NMI even if it faults (SDM Vol. 3A 6.7.1).
        self.state.nmi_blocked = false;
        let size = match i.mnemonic() {
            M::Iret => Size::B2,
            M::Iretd => Size::B4,
            _ => Size::B8,
        };
        let n = size.bytes() as u64;
        let cpl = self.state.cpl();
        let rflags_before = self.state.rflags;
        let mut frame = [0u64; 3];
        self.stack_peek_run(mem, 0, size, &mut frame)?;
        let [offset, sel, fl] = frame;
        let sel = sel as u16;
        let mut mask = rflags::WRITABLE;
        if size == Size::B2 {
            mask &= 0xffff;
        }
        if self.real_mode() {
            let code = Self::real_mode_segment(&self.state.cs, sel);
            self.state.rflags = (self.state.rflags & !mask) | (fl & mask) | rflags::FIXED1;
            self.state.cs = code;
            let sp = self.state.gpr[4].wrapping_add(3 * n);
            self.set_stack_pointer(sp);
            self.next_rip = offset & size.mask();
            self.check_events = true;
            self.iret_moves_mode(rflags_before);
            return Ok(());
        }
        if self.state.rflags & rflags::NT != 0 || (fl & rflags::VM != 0 && cpl == 0) {
            return Err(gp(0));
        }
        let new_cpl = (sel & 3) as u8;
        if new_cpl < cpl {
            return Err(gp((sel & !3) as u32));
        }
        let code = self.return_code_segment(mem, sel)?;
        let target = self.far_offset(&code, offset, size)?;
        let pop_stack = self.state.in_64bit_mode() || new_cpl > cpl;
        let mut stack = None;
        if pop_stack {
            let mut outer = [0u64; 2];
            self.stack_peek_run(mem, 3 * n, size, &mut outer)?;
            let [new_sp, ss] = outer;
            stack = Some((self.return_stack_segment(mem, ss as u16, new_cpl)?, new_sp));
        }
        if cpl > 0 {
            mask &= !rflags::IOPL;
        }
        if cpl > self.iopl() {
            mask &= !rflags::IF;
        }
        let s = &mut self.state;
        s.rflags = (s.rflags & !mask) | (fl & mask) | rflags::FIXED1;
        match stack {
            Some((ss, new_sp)) => {
                s.cs = code;
                s.ss = ss;
                s.gpr[4] = new_sp;
            }
            None => {
                let sp = s.gpr[4].wrapping_add(3 * n);
                self.set_stack_pointer(sp);
                self.state.cs = code;
            }
        }
        self.rf_loaded = self.state.rflags & rflags::RF != 0;
        self.iret_moves_mode(rflags_before);
        self.next_rip = target;
        self.check_events = true;
        Ok(())
    }

    /// The mode epoch's move for an IRET that has changed RFLAGS from
    /// `before` (`system_moves_mode`): of what IRET changes, the
    /// first-level TLB's lookup-key context holds only RFLAGS.AC (CS and
    /// the privilege are not in it), so it moves only when AC changed.
    /// (Moving it for nothing would only make the next sync recompute the
    /// context and find it the same.)
    fn iret_moves_mode(&mut self, before: u64) {
        if (self.state.rflags ^ before) & rflags::AC != 0 {
            self.mode_epoch += 1;
        }
    }

    /// LDS, LES, LSS, LFS, LGS: a far pointer from memory into a segment
    /// register and a general register.
    pub(super) fn exec_load_far_pointer(
        &mut self,
        mem: &PhysMemory,
        i: &Instruction,
    ) -> Result<(), Fault> {
        if i.op1_kind() != OpKind::Memory {
            return Err(ud());
        }
        let size = Self::op_size(i, 0);
        let offset = self.operand_offset(i);
        let seg = i.memory_segment();
        let la = self.linear(seg, offset);
        let value = self.read_mem(mem, la, size)?;
        let sel_la = self.linear(seg, offset.wrapping_add(size.bytes() as u64));
        let sel = self.read_mem(mem, sel_la, Size::B2)? as u16;
        let target = match i.mnemonic() {
            M::Les => Register::ES,
            M::Lds => Register::DS,
            M::Lss => Register::SS,
            M::Lfs => Register::FS,
            _ => Register::GS,
        };
        self.load_segment_register(mem, target, sel)?;
        self.set_reg(i.op0_register(), value);
        Ok(())
    }
}
