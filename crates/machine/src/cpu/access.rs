//! Linear-memory and operand access.
//!
//! Every guest data access goes linear address -> [`mmu::translate`] (TLB,
//! then page walk) -> host-physical address -> [`PhysMemory`]. Accesses that
//! cross a page boundary are split into bytes, each translated, so a fault
//! on the second page reports the right CR2. Translation failures become
//! [`Fault`]s: #PF, #GP/#SS for non-canonical addresses, or a VM exit for
//! EPT violations and misconfigurations.

use super::debug_regs::DR7_ENABLES;
use super::l1tlb::{self, KeyContext};
use super::state::{cr0, cr4, rflags};
use super::{vector, Cpu, Fault, FaultKind};
use crate::addr::{Gva, Hpa};
use crate::alu::Size;
use crate::memory::PhysMemory;
use crate::mmu::{self, Access, AccessKind, PagingRegs, PmlLog, TranslateCtx, TranslateError};
use crate::vmx::VmExit;
use iced_x86::{Instruction, OpKind, Register};
use std::cell::Cell;

/// Where a read-modify-write operand lives.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Place {
    /// General register `idx`; `high` for AH/CH/DH/BH.
    Reg { idx: u8, high: bool },
    /// Memory inside one page, already translated for writing.
    Mem { hpa: Hpa },
    /// Memory crossing a page boundary (accessed byte by byte).
    Split { la: u64 },
}

/// Decodes an iced general-purpose register into (index, size, high-byte).
#[inline]
pub(crate) fn gpr_info(r: Register) -> (u8, Size, bool) {
    let v = r as u32;
    let al = Register::AL as u32;
    let ax = Register::AX as u32;
    let eax = Register::EAX as u32;
    let rax = Register::RAX as u32;
    if v >= rax && v < rax + 16 {
        ((v - rax) as u8, Size::B8, false)
    } else if v >= eax && v < eax + 16 {
        ((v - eax) as u8, Size::B4, false)
    } else if v >= ax && v < ax + 16 {
        ((v - ax) as u8, Size::B2, false)
    } else {
        let k = v.wrapping_sub(al);
        match k {
            0..=3 => (k as u8, Size::B1, false),
            4..=7 => ((k - 4) as u8, Size::B1, true),
            8..=19 => ((k - 4) as u8, Size::B1, false),
            // Not a general register: callers only pass GPRs, but a wrong
            // value must not index out of bounds.
            _ => (0, Size::B8, false),
        }
    }
}

impl Cpu {
    /// Paging registers for the MMU. Implicit supervisor accesses
    /// (descriptor tables, TSS, interrupt frames) ignore RFLAGS.AC for SMAP.
    #[inline]
    fn paging_regs(&self, implicit: bool) -> PagingRegs {
        PagingRegs {
            cr0: self.state.cr0,
            cr3: self.state.cr3,
            cr4: self.state.cr4,
            efer: self.state.efer,
            rflags_ac: !implicit && self.state.rflags & rflags::AC != 0,
        }
    }

    /// Translates `la` for an access by the running code, charging
    /// page-walk references.
    #[inline]
    pub(crate) fn translate(
        &mut self,
        mem: &PhysMemory,
        la: u64,
        kind: AccessKind,
        user: bool,
    ) -> Result<Hpa, Fault> {
        self.translate_as(mem, la, kind, user, false)
    }

    /// Translation with the implicit-supervisor flag spelled out: the
    /// first-level TLB inline, everything else out of line.
    #[inline(always)]
    fn translate_as(
        &mut self,
        mem: &PhysMemory,
        la: u64,
        kind: AccessKind,
        user: bool,
        implicit: bool,
    ) -> Result<Hpa, Fault> {
        if implicit {
            return self.translate_implicit(mem, la, Access { kind, user });
        }
        let class = kind as usize * 2 + user as usize;
        self.sync_l1();
        if let Some(hpa) = self.l1.lookup(class, la) {
            return Ok(hpa);
        }
        self.translate_slow(mem, la, kind, user)
    }

    /// The translation of an implicit supervisor access. Implicit
    /// accesses differ only in SMAP's AC handling: they bypass the
    /// first-level TLB rather than get classes of their own. The TLB
    /// lookup [`mmu::translate`] would make is made here: `Tlb::lookup` is
    /// `Tlb::lookup_keyed` with the key `LookupKey::new` makes of the same
    /// registers, VPID and EPTP. A hit is the answer; the rest (a miss's
    /// walk, faults, MMIO emulation) goes the full way, only without a
    /// second lookup.
    fn translate_implicit(
        &mut self,
        mem: &PhysMemory,
        la: u64,
        access: Access,
    ) -> Result<Hpa, Fault> {
        let mut looked_up = false;
        if let Some(key) = mmu::is_canonical(Gva(la))
            .then(|| self.lookup_key(access, true))
            .flatten()
        {
            if let Some(hpa) = self.tlb.lookup_keyed(&key, Gva(la)) {
                return Ok(hpa);
            }
            looked_up = true;
        }
        self.translate_full_or_mmio(mem, la, access, true, looked_up)
    }

    /// Brings the first-level TLB up to the TLB's removals and the mode
    /// epoch (see `l1tlb`): before any probe or fill of its slots, and
    /// before translated code reads them.
    #[inline(always)]
    pub(crate) fn sync_l1(&mut self) {
        if !self.l1_in_sync() {
            self.resync_l1();
        }
    }

    /// When frames came to hold decoded code since the last look (on any
    /// CPU: `PhysMemory::code_marks`), takes the write slots of such
    /// frames from translated code, whose stores then take the slow path
    /// (`L1Tlb::keep_stores_off_code`): before translated code runs, and
    /// after this CPU decodes a block.
    #[inline(always)]
    pub(crate) fn keep_stores_off_code(&mut self, mem: &PhysMemory) {
        let marks = mem.code_marks();
        if marks != self.jit_code_marks {
            self.jit_code_marks = marks;
            self.l1.keep_stores_off_code(|hpa| mem.is_code(hpa));
        }
    }

    /// [`Self::sync_l1`] when entries left the TLB or the mode epoch
    /// moved: the slots that must go are emptied (`l1tlb`).
    #[inline(never)]
    fn resync_l1(&mut self) {
        let mode_epoch = self.mode_epoch;
        let context = (!self.l1.mode_in_sync(mode_epoch)).then(|| self.key_context());
        self.l1.resync(self.tlb.removals(), mode_epoch, context);
    }

    /// Whether the first-level TLB is in sync with the TLB's removals and
    /// the mode epoch.
    #[inline(always)]
    fn l1_in_sync(&self) -> bool {
        self.l1.in_sync(self.tlb.removals().count, self.mode_epoch)
    }

    /// What the TLB lookup keys ([`Self::lookup_key`]) are computed from
    /// now. RFLAGS.AC counts only while CR4.SMAP is on (the keys read it
    /// only then, `mmu::tlb::permit_masks`): STAC, CLAC and POPF without
    /// SMAP keep the first-level TLB.
    pub(super) fn key_context(&self) -> KeyContext {
        let regs = self.paging_regs(false);
        KeyContext {
            cr0: regs.cr0,
            cr4: regs.cr4,
            efer: regs.efer,
            rflags_ac: regs.rflags_ac && regs.cr4 & cr4::SMAP != 0,
            vpid: self.vpid(),
            eptp: self.vmx.as_deref().and_then(|v| v.ept).map(|e| e.0),
            pcid: if regs.cr4 & cr4::PCIDE != 0 && regs.cr0 & cr0::PG != 0 {
                regs.cr3 & 0xfff
            } else {
                0
            },
        }
    }

    /// [`Self::translate`] for translated code's first-level TLB miss of
    /// an access of `bytes` bytes (within one page) at `la`, with the same
    /// effects: the first-level TLB, then a usable TLB hit taken with the
    /// lookup key cached per mode (the common case: the first-level TLB is
    /// small and direct-mapped), then the full way. Returns the
    /// host-physical page when the first-level slot now gives it to
    /// translated code (not when its frame lies outside memory).
    #[inline]
    pub(crate) fn translate_for_jit(
        &mut self,
        mem: &PhysMemory,
        la: u64,
        bytes: u64,
        class: usize,
        kind: AccessKind,
        user: bool,
    ) -> Result<Option<Hpa>, Fault> {
        debug_assert!(self.l1_in_sync());
        debug_assert_eq!(class, kind as usize * 2 + user as usize);
        if !self.l1.peek(class, la) {
            // The interpreter's own miss path (its fill comes after any
            // walk and syncs first: the slots stay in sync).
            self.translate_slow_inline(mem, la, Access { kind, user })?;
            debug_assert!(self.l1_in_sync());
        }
        Ok(self.l1.jit_slot(class, la, bytes))
    }

    /// A first-level TLB miss of class `class` (`kind`, `user`): the TLB
    /// lookup [`mmu::translate`] makes, with exactly its effects (a hit
    /// counted and its entry marked recently used; a miss counted, and an
    /// entry that does not allow the access dropped), taken with the lookup
    /// key cached per class and mode (built once per mode), and on a hit
    /// the first-level fill. [`Keyed::Unkeyed`], with nothing done, when
    /// `mmu::translate` would not look the TLB up (a non-canonical address,
    /// no paging and no EPT). The slots must be synced. Inlined in
    /// [`Self::translate_slow`] (out of line).
    #[inline(always)]
    fn translate_keyed(
        &mut self,
        mem: &PhysMemory,
        la: u64,
        class: usize,
        kind: AccessKind,
        user: bool,
    ) -> Keyed {
        if !mmu::is_canonical(Gva(la)) {
            return Keyed::Unkeyed;
        }
        if self.l1.key(class).is_none() && !self.cache_lookup_key(class, kind, user) {
            return Keyed::Unkeyed;
        }
        debug_assert_eq!(
            self.l1.key(class).copied(),
            self.lookup_key(Access { kind, user }, false),
            "a stale TLB lookup key"
        );
        // (Read in place: the key cache and the TLB are separate fields.)
        let Some(key) = self.l1.key(class) else {
            return Keyed::Unkeyed;
        };
        match self.tlb.lookup_keyed(key, Gva(la)) {
            Some(hpa) => {
                // A hit removes nothing: the slots stay in sync.
                debug_assert!(self.l1_in_sync());
                self.l1.use_memory(mem.jit_view().0, mem.size());
                self.fill_l1(mem, class, la, hpa);
                Keyed::Hit(hpa)
            }
            None => Keyed::Missed,
        }
    }

    /// The first-level fill of a translation the TLB just gave (the slots
    /// synced), with a supervisor data fill noted while the first-level
    /// TLB notes them (RFLAGS.AC set under SMAP, `l1tlb`), and a write
    /// slot of a frame holding decoded code kept from translated stores.
    #[inline(always)]
    fn fill_l1(&mut self, mem: &PhysMemory, class: usize, la: u64, hpa: Hpa) {
        self.l1.fill(class, la, hpa, |frame| mem.is_code(frame));
        if self.l1.notes_user_pages() && l1tlb::is_supervisor_data(class) {
            let user_page = self.maps_user_page(class, la);
            self.l1.note_user_page(class, la, user_page);
        }
    }

    /// Whether the translation of `la` for class `class` maps a user-mode
    /// page: the U flag of the TLB entry it comes from (none without
    /// paging and EPT: no user-mode page). Should the TLB hold no entry,
    /// it is taken for one, which AC's clearing revokes.
    #[inline(never)]
    fn maps_user_page(&self, class: usize, la: u64) -> bool {
        self.l1
            .key(class)
            .is_some_and(|key| self.tlb.maps_user_page(key, Gva(la)) != Some(false))
    }

    /// Computes and caches the TLB lookup key of class `class` (`kind`,
    /// `user`) under the current mode; false when there is none (no
    /// paging and no EPT). Once per class and key context.
    #[cold]
    #[inline(never)]
    pub(super) fn cache_lookup_key(&mut self, class: usize, kind: AccessKind, user: bool) -> bool {
        match self.lookup_key(Access { kind, user }, false) {
            Some(k) => {
                self.l1.set_key(class, k);
                true
            }
            None => false,
        }
    }

    /// The TLB lookup key of an access now, `implicit` or not (`None`
    /// when the TLB is not consulted: no paging and no EPT).
    fn lookup_key(&self, access: Access, implicit: bool) -> Option<mmu::tlb::LookupKey> {
        let regs = self.paging_regs(implicit);
        let ept = self.vmx.as_deref().and_then(|v| v.ept);
        (regs.cr0 & cr0::PG != 0 || ept.is_some())
            .then(|| mmu::tlb::LookupKey::new(self.vpid(), &regs, ept, access))
    }

    /// A first-level TLB miss: the TLB's usable hit through the cached
    /// key when there is one, else the full way.
    #[inline(never)]
    fn translate_slow(
        &mut self,
        mem: &PhysMemory,
        la: u64,
        kind: AccessKind,
        user: bool,
    ) -> Result<Hpa, Fault> {
        self.translate_slow_inline(mem, la, Access { kind, user })
    }

    /// [`Self::translate_slow`]'s body, inlined where first-level misses
    /// are the rule ([`Self::translate_fetch_after_miss`],
    /// [`Self::translate_for_jit`]).
    #[inline(always)]
    fn translate_slow_inline(
        &mut self,
        mem: &PhysMemory,
        la: u64,
        access: Access,
    ) -> Result<Hpa, Fault> {
        let Access { kind, user } = access;
        let mut looked_up = false;
        // `translate_as`'s lookup synced the slots.
        let class = kind as usize * 2 + user as usize;
        match self.translate_keyed(mem, la, class, kind, user) {
            Keyed::Hit(hpa) => return Ok(hpa),
            Keyed::Missed => looked_up = true,
            Keyed::Unkeyed => {}
        }
        self.translate_full_or_mmio(mem, la, access, false, looked_up)
    }

    /// [`Self::translate_full`], then, under MMIO emulation, the
    /// translation a fault there stands for (`mmio_emu_translation`).
    #[inline(always)]
    fn translate_full_or_mmio(
        &mut self,
        mem: &PhysMemory,
        la: u64,
        access: Access,
        implicit: bool,
        looked_up: bool,
    ) -> Result<Hpa, Fault> {
        let Access { kind, user } = access;
        let r = self.translate_full(mem, la, kind, user, implicit, looked_up);
        if let Err(f) = &r {
            if self.mmio_emu.is_some() {
                if let Some(hpa) = self.mmio_emu_translation(la, kind, f) {
                    return Ok(hpa);
                }
            }
        }
        r
    }

    /// [`mmu::translate`] with the CPU's paging state, charging the walk's
    /// references (and PML writes), then the first-level fill. With
    /// `looked_up`, the TLB lookup was made (and missed,
    /// [`Self::translate_keyed`]): only the miss path is left.
    #[inline(always)]
    fn translate_full(
        &mut self,
        mem: &PhysMemory,
        la: u64,
        kind: AccessKind,
        user: bool,
        implicit: bool,
        looked_up: bool,
    ) -> Result<Hpa, Fault> {
        let regs = self.paging_regs(implicit);
        let vpid = self.vpid();
        // The PML index is the one control the walk writes: lend it as a
        // cell for the translation.
        let (ept, pml) = match self.vmx.as_deref_mut() {
            Some(v) => (
                v.ept,
                v.pml_address.map(|address| PmlLog {
                    address,
                    index: Cell::from_mut(&mut v.pml_index),
                }),
            ),
            None => (None, None),
        };
        let pml_index_before = pml.map(|p| p.index.get());
        let ctx = TranslateCtx {
            mem,
            regs,
            ept,
            vpid,
            pml,
        };
        let mut refs = 0;
        let access = Access { kind, user };
        let r = if looked_up {
            mmu::translate_miss(&mut self.tlb, &ctx, Gva(la), access, &mut refs)
        } else {
            mmu::translate(&mut self.tlb, &ctx, Gva(la), access, &mut refs)
        };
        if let (Some(before), Some(pml)) = (pml_index_before, pml) {
            // One decrement per entry written (a guest walk may log its
            // tables' pages and the final page).
            let logged = u64::from(before.wrapping_sub(pml.index.get()));
            if logged != 0 {
                self.stats.pml_entries_logged += logged;
                self.cycles += logged * self.costs.pml_log_write;
            }
        }
        if refs != 0 {
            self.stats.page_walk_refs += refs;
            self.cycles += refs * self.costs.page_walk_ref;
        }
        let hpa = r.map_err(translate_fault)?;
        if !implicit {
            let class = kind as usize * 2 + user as usize;
            self.l1.use_memory(mem.jit_view().0, mem.size());
            // The walk's fill may have evicted an entry (its slots go).
            self.sync_l1();
            self.fill_l1(mem, class, la, hpa);
        }
        Ok(hpa)
    }

    /// Translation for an instruction fetch at the current privilege.
    #[inline]
    pub(crate) fn translate_fetch(&mut self, mem: &PhysMemory, la: u64) -> Result<Hpa, Fault> {
        let user = self.state.cpl() == 3;
        self.translate(mem, la, AccessKind::Execute, user)
    }

    /// [`Self::translate_fetch`] (with `user` the privilege now) where
    /// translated code's first-level iTLB probe just missed (a chaining
    /// exit's fetch): the same lookup, with the miss path inlined. (The
    /// probe here can still hit: translated code's compares a slot's
    /// `jit_page`, which no page equals when the frame is outside memory.)
    #[inline(always)]
    pub(crate) fn translate_fetch_after_miss(
        &mut self,
        mem: &PhysMemory,
        la: u64,
        user: bool,
    ) -> Result<Hpa, Fault> {
        let class = AccessKind::Execute as usize * 2 + user as usize;
        self.sync_l1();
        if let Some(hpa) = self.l1.lookup(class, la) {
            return Ok(hpa);
        }
        let access = Access {
            kind: AccessKind::Execute,
            user,
        };
        self.translate_slow_inline(mem, la, access)
    }

    #[inline]
    pub(crate) fn user_access(&self) -> bool {
        self.state.cpl() == 3
    }

    /// Reads `size` bytes at linear address `la` (a normal data access).
    #[inline]
    pub(crate) fn read_mem(&mut self, mem: &PhysMemory, la: u64, size: Size) -> Result<u64, Fault> {
        let user = self.user_access();
        self.read_mem_as(mem, la, size, user, false)
    }

    /// An implicit supervisor read (descriptor tables, TSS, IDT gates).
    pub(crate) fn read_implicit(
        &mut self,
        mem: &PhysMemory,
        la: u64,
        size: Size,
    ) -> Result<u64, Fault> {
        self.read_mem_as(mem, la, size, false, true)
    }

    /// An implicit supervisor write (interrupt frames, the busy TSS bit).
    pub(crate) fn write_implicit(
        &mut self,
        mem: &PhysMemory,
        la: u64,
        size: Size,
        v: u64,
    ) -> Result<(), Fault> {
        self.write_mem_as(mem, la, size, v, false, true)
    }

    #[inline(always)]
    fn read_mem_as(
        &mut self,
        mem: &PhysMemory,
        la: u64,
        size: Size,
        user: bool,
        implicit: bool,
    ) -> Result<u64, Fault> {
        if self.state.debug.dr7 & DR7_ENABLES != 0 && !implicit {
            self.note_data_access(la, size.bytes() as u64, false);
        }
        if (la & 0xfff) + size.bytes() as u64 <= 0x1000 {
            let hpa = self.translate_as(mem, la, AccessKind::Read, user, implicit)?;
            self.phys_read(mem, hpa, size.bytes())
        } else {
            self.read_split(mem, la, size, user, implicit)
        }
    }

    /// A read crossing a page boundary: both pages are translated before
    /// anything is read, so a fault leaves nothing half done.
    #[cold]
    #[inline(never)]
    fn read_split(
        &mut self,
        mem: &PhysMemory,
        la: u64,
        size: Size,
        user: bool,
        implicit: bool,
    ) -> Result<u64, Fault> {
        let n = size.bytes() as usize;
        let mut v = 0u64;
        let mut hpas = [Hpa(0); 8];
        for (i, h) in hpas.iter_mut().enumerate().take(n) {
            *h = self.translate_as(
                mem,
                la.wrapping_add(i as u64),
                AccessKind::Read,
                user,
                implicit,
            )?;
        }
        for (i, h) in hpas.iter().enumerate().take(n) {
            v |= self.phys_read(mem, *h, 1)? << (8 * i);
        }
        Ok(v)
    }

    /// Writes `size` bytes at linear address `la`.
    #[inline]
    pub(crate) fn write_mem(
        &mut self,
        mem: &PhysMemory,
        la: u64,
        size: Size,
        value: u64,
    ) -> Result<(), Fault> {
        let user = self.user_access();
        self.write_mem_as(mem, la, size, value, user, false)
    }

    #[inline(always)]
    fn write_mem_as(
        &mut self,
        mem: &PhysMemory,
        la: u64,
        size: Size,
        value: u64,
        user: bool,
        implicit: bool,
    ) -> Result<(), Fault> {
        if self.state.debug.dr7 & DR7_ENABLES != 0 && !implicit {
            self.note_data_access(la, size.bytes() as u64, true);
        }
        if (la & 0xfff) + size.bytes() as u64 <= 0x1000 {
            let hpa = self.translate_as(mem, la, AccessKind::Write, user, implicit)?;
            self.store(mem, hpa, size, value)
        } else {
            self.write_split(mem, la, size, value, user, implicit)
        }
    }

    /// A write crossing a page boundary: both pages are translated (and
    /// checked for writing) before anything is written.
    #[cold]
    #[inline(never)]
    fn write_split(
        &mut self,
        mem: &PhysMemory,
        la: u64,
        size: Size,
        value: u64,
        user: bool,
        implicit: bool,
    ) -> Result<(), Fault> {
        let n = size.bytes() as usize;
        let mut hpas = [Hpa(0); 8];
        for (i, h) in hpas.iter_mut().enumerate().take(n) {
            *h = self.translate_as(
                mem,
                la.wrapping_add(i as u64),
                AccessKind::Write,
                user,
                implicit,
            )?;
        }
        for (i, h) in hpas.iter().enumerate().take(n) {
            self.store(mem, *h, Size::B1, value >> (8 * i))?;
        }
        Ok(())
    }

    /// A store to host-physical memory, noting writes into cached code.
    #[inline]
    pub(crate) fn store(
        &mut self,
        mem: &PhysMemory,
        hpa: Hpa,
        size: Size,
        value: u64,
    ) -> Result<(), Fault> {
        if hpa.0 & super::mmio::MMIO_HPA != 0 && self.mmio_emu.is_some() {
            self.mmio_emu_write(hpa.0 & !super::mmio::MMIO_HPA, size.bytes(), value);
            return Ok(());
        }
        if mem.write_noting_code(hpa, size.bytes(), value)? {
            self.code_written = true;
        }
        Ok(())
    }

    /// Reads a general register of the given iced kind.
    #[inline]
    pub(crate) fn reg(&self, r: Register) -> u64 {
        let (idx, size, high) = gpr_info(r);
        let v = self.state.gpr[idx as usize];
        if high {
            (v >> 8) & 0xff
        } else {
            v & size.mask()
        }
    }

    /// Writes a general register with x86 partial-register rules: 32-bit
    /// writes zero-extend, 8/16-bit writes merge.
    #[inline]
    pub(crate) fn set_reg(&mut self, r: Register, value: u64) {
        let (idx, size, high) = gpr_info(r);
        self.set_gpr_sized(idx, size, high, value);
    }

    #[inline]
    pub(crate) fn set_gpr_sized(&mut self, idx: u8, size: Size, high: bool, value: u64) {
        let slot = &mut self.state.gpr[idx as usize & 15];
        let m = size.mask();
        *slot = if high {
            (*slot & !0xff00) | ((value & 0xff) << 8)
        } else if size.bytes() >= 4 {
            // 32-bit writes zero-extend; 64-bit writes replace.
            value & m
        } else {
            (*slot & !m) | (value & m)
        };
    }

    /// The 64-bit value of a full register (for addressing).
    #[inline]
    fn reg_for_address(&self, r: Register) -> u64 {
        match r {
            Register::None => 0,
            Register::RIP | Register::EIP => 0,
            _ => {
                let (idx, _, _) = gpr_info(r);
                self.state.gpr[idx as usize]
            }
        }
    }

    /// Linear address of the memory operand.
    #[inline]
    pub(crate) fn effective_address(&self, i: &Instruction) -> u64 {
        self.linear(i.memory_segment(), self.operand_offset(i))
    }

    /// The offset of the memory operand in its segment (LEA's result),
    /// wrapped at the address size.
    #[inline]
    pub(crate) fn operand_offset(&self, i: &Instruction) -> u64 {
        let base = i.memory_base();
        let index = i.memory_index();
        let mut a = i.memory_displacement64();
        if base != Register::RIP && base != Register::EIP {
            a = a.wrapping_add(self.reg_for_address(base));
        }
        if index != Register::None {
            a = a.wrapping_add(
                self.reg_for_address(index)
                    .wrapping_mul(i.memory_index_scale() as u64),
            );
        }
        if base.is_gpr32() || index.is_gpr32() || base == Register::EIP {
            // 32-bit address size: the offset wraps at 4 GiB.
            a & 0xffff_ffff
        } else if base.is_gpr16() || index.is_gpr16() {
            a & 0xffff
        } else if base == Register::None && index == Register::None && !self.state.in_64bit_mode() {
            // A bare displacement outside 64-bit mode: its size is the
            // address size.
            if i.memory_displ_size() == 2 {
                a & 0xffff
            } else {
                a & 0xffff_ffff
            }
        } else {
            a
        }
    }

    /// The linear address of `offset` in segment `seg`: in 64-bit mode
    /// only FS and GS have a base; elsewhere every segment's base applies
    /// and the address wraps at 4 GiB. Segment limits are not checked.
    #[inline]
    pub(crate) fn linear(&self, seg: Register, offset: u64) -> u64 {
        if self.state.in_64bit_mode() {
            offset.wrapping_add(self.segment_base(seg))
        } else {
            self.segment(seg).base.wrapping_add(offset) & 0xffff_ffff
        }
    }

    /// Base of a segment for address computation in 64-bit mode (only FS
    /// and GS have one).
    #[inline]
    pub(crate) fn segment_base(&self, seg: Register) -> u64 {
        match seg {
            Register::FS => self.state.fs.base,
            Register::GS => self.state.gs.base,
            _ => 0,
        }
    }

    /// Operand size of operand `n` (register or memory).
    #[inline]
    pub(crate) fn op_size(i: &Instruction, n: u32) -> Size {
        match i.op_kind(n) {
            OpKind::Register => gpr_info(i.op_register(n)).1,
            _ => Size::from_bytes(i.memory_size().size()).unwrap_or(Size::B8),
        }
    }

    /// Reads operand `n` zero-extended (immediates come sign-extended to
    /// 64 bits and are masked by the caller's size).
    #[inline]
    pub(crate) fn read_op(
        &mut self,
        mem: &PhysMemory,
        i: &Instruction,
        n: u32,
        size: Size,
    ) -> Result<u64, Fault> {
        match i.op_kind(n) {
            OpKind::Register => Ok(self.reg(i.op_register(n))),
            OpKind::Memory => {
                let la = self.effective_address(i);
                self.read_mem(mem, la, size)
            }
            _ => Ok(i.immediate(n) & size.mask()),
        }
    }

    /// Writes operand `n`.
    #[inline]
    pub(crate) fn write_op(
        &mut self,
        mem: &PhysMemory,
        i: &Instruction,
        n: u32,
        size: Size,
        v: u64,
    ) -> Result<(), Fault> {
        match i.op_kind(n) {
            OpKind::Register => {
                self.set_reg(i.op_register(n), v);
                Ok(())
            }
            OpKind::Memory => {
                let la = self.effective_address(i);
                self.write_mem(mem, la, size, v)
            }
            _ => Err(Fault::exception(vector::UD)),
        }
    }

    /// Resolves operand `n` as a read-modify-write destination, checking
    /// write permission up front as hardware does.
    #[inline]
    pub(crate) fn place(
        &mut self,
        mem: &PhysMemory,
        i: &Instruction,
        n: u32,
        size: Size,
    ) -> Result<Place, Fault> {
        match i.op_kind(n) {
            OpKind::Register => {
                let (idx, _, high) = gpr_info(i.op_register(n));
                Ok(Place::Reg { idx, high })
            }
            OpKind::Memory => {
                let la = self.effective_address(i);
                if self.state.debug.dr7 & DR7_ENABLES != 0 {
                    // A read-modify-write: a write for the breakpoints.
                    self.note_data_access(la, size.bytes() as u64, true);
                }
                if (la & 0xfff) + size.bytes() as u64 <= 0x1000 {
                    let user = self.user_access();
                    let hpa = self.translate(mem, la, AccessKind::Write, user)?;
                    Ok(Place::Mem { hpa })
                } else {
                    // Check both pages for writing before anything changes.
                    let user = self.user_access();
                    self.translate(mem, la, AccessKind::Write, user)?;
                    self.translate(
                        mem,
                        la.wrapping_add(size.bytes() as u64 - 1),
                        AccessKind::Write,
                        user,
                    )?;
                    Ok(Place::Split { la })
                }
            }
            _ => Err(Fault::exception(vector::UD)),
        }
    }

    /// Reads a resolved place.
    #[inline]
    pub(crate) fn read_place(
        &mut self,
        mem: &PhysMemory,
        p: Place,
        size: Size,
    ) -> Result<u64, Fault> {
        match p {
            Place::Reg { idx, high } => {
                let v = self.state.gpr[idx as usize & 15];
                Ok(if high {
                    (v >> 8) & 0xff
                } else {
                    v & size.mask()
                })
            }
            Place::Mem { hpa } => self.phys_read(mem, hpa, size.bytes()),
            Place::Split { la } => self.read_mem(mem, la, size),
        }
    }

    /// Writes a resolved place.
    #[inline]
    pub(crate) fn write_place(
        &mut self,
        mem: &PhysMemory,
        p: Place,
        size: Size,
        v: u64,
    ) -> Result<(), Fault> {
        match p {
            Place::Reg { idx, high } => {
                self.set_gpr_sized(idx, size, high, v);
                Ok(())
            }
            Place::Mem { hpa } => self.store(mem, hpa, size, v),
            Place::Split { la } => self.write_mem(mem, la, size, v),
        }
    }

    /// Atomically replaces a memory place: `f(old)` gives `Some(new)` to
    /// store or `None` to store nothing; returns the old value. Used for
    /// LOCK-prefixed instructions and XCHG with memory, so that CPUs on
    /// several host threads stay coherent.
    pub(crate) fn atomic_update(
        &mut self,
        mem: &PhysMemory,
        p: Place,
        size: Size,
        mut f: impl FnMut(u64) -> Option<u64>,
    ) -> Result<u64, Fault> {
        match p {
            Place::Mem { hpa }
                if hpa.0 % size.bytes() as u64 == 0
                    && (hpa.0 & super::mmio::MMIO_HPA == 0 || self.mmio_emu.is_none()) =>
            {
                loop {
                    let old = mem.read(hpa, size.bytes())?;
                    match f(old) {
                        None => return Ok(old),
                        Some(new) => {
                            let seen = mem.cmpxchg(hpa, size.bytes(), old, new)?;
                            if seen == old {
                                if mem.is_code(hpa) {
                                    self.code_written = true;
                                }
                                self.cycles += self.costs.locked;
                                return Ok(old);
                            }
                        }
                    }
                }
            }
            _ => {
                // Registers, and split or misaligned locks (which real CPUs
                // execute with a bus lock): not atomic across host threads.
                let old = self.read_place(mem, p, size)?;
                if let Some(new) = f(old) {
                    self.write_place(mem, p, size, new)?;
                }
                Ok(old)
            }
        }
    }

    /// Pushes a value of `size` bytes on the stack.
    #[inline]
    pub(crate) fn push(&mut self, mem: &PhysMemory, size: Size, v: u64) -> Result<(), Fault> {
        let rsp = self.state.gpr[4].wrapping_sub(size.bytes() as u64);
        self.write_mem(mem, rsp, size, v).map_err(stack_fault)?;
        self.state.gpr[4] = rsp;
        Ok(())
    }

    /// Pops a value of `size` bytes from the stack.
    #[inline]
    pub(crate) fn pop(&mut self, mem: &PhysMemory, size: Size) -> Result<u64, Fault> {
        let rsp = self.state.gpr[4];
        let v = self.read_mem(mem, rsp, size).map_err(stack_fault)?;
        self.state.gpr[4] = rsp.wrapping_add(size.bytes() as u64);
        Ok(v)
    }
}

impl Cpu {
    /// The linear address of stack offset `sp` (SS.base applies outside
    /// 64-bit mode).
    #[inline]
    fn stack_linear(&self, sp: u64) -> u64 {
        if self.state.in_64bit_mode() {
            sp
        } else {
            self.state.ss.base.wrapping_add(sp) & 0xffff_ffff
        }
    }

    /// Sets the stack pointer at the stack's width: SP merges into RSP,
    /// ESP zero-extends as every 32-bit register write does.
    #[inline]
    pub(crate) fn set_stack_pointer(&mut self, sp: u64) {
        let mask = self.state.stack_mask();
        let rsp = &mut self.state.gpr[4];
        *rsp = if mask == 0xffff {
            (*rsp & !0xffff) | (sp & 0xffff)
        } else {
            sp & mask
        };
    }

    /// PUSH in any mode: the stack width is SS.B outside 64-bit mode.
    pub(crate) fn stack_push(&mut self, mem: &PhysMemory, size: Size, v: u64) -> Result<(), Fault> {
        if self.state.in_64bit_mode() {
            return self.push(mem, size, v);
        }
        let sp = self.state.gpr[4].wrapping_sub(size.bytes() as u64) & self.state.stack_mask();
        let la = self.stack_linear(sp);
        self.write_mem(mem, la, size, v).map_err(stack_fault)?;
        self.set_stack_pointer(sp);
        Ok(())
    }

    /// POP in any mode.
    pub(crate) fn stack_pop(&mut self, mem: &PhysMemory, size: Size) -> Result<u64, Fault> {
        let v = self.stack_peek(mem, 0, size)?;
        let sp = self.state.gpr[4].wrapping_add(size.bytes() as u64);
        self.set_stack_pointer(sp & self.state.stack_mask());
        Ok(v)
    }

    /// Reads the stack `offset` bytes above the stack pointer, without
    /// popping (multi-word pops check everything before committing).
    pub(crate) fn stack_peek(
        &mut self,
        mem: &PhysMemory,
        offset: u64,
        size: Size,
    ) -> Result<u64, Fault> {
        let sp = self.state.gpr[4].wrapping_add(offset) & self.state.stack_mask();
        let la = self.stack_linear(sp);
        self.read_mem(mem, la, size).map_err(stack_fault)
    }

    /// `out.len()` consecutive stack items of `size` bytes, the first
    /// `offset` bytes above the stack pointer: exactly the
    /// [`Self::stack_peek`]s of each in turn (IRET and far RET read their
    /// frames so). When the items lie in one page without wrapping and an
    /// access does no more than translate and read (no data breakpoints
    /// enabled in DR7, no MMIO emulation), the first item's translation has
    /// all the effects and fills the first-level TLB, and each later item's
    /// would be a first-level hit, which has none: so one translation, then
    /// the reads from its page.
    pub(crate) fn stack_peek_run(
        &mut self,
        mem: &PhysMemory,
        offset: u64,
        size: Size,
        out: &mut [u64],
    ) -> Result<(), Fault> {
        let n = size.bytes() as u64;
        let total = n * out.len() as u64;
        let mask = self.state.stack_mask();
        let sp = self.state.gpr[4].wrapping_add(offset) & mask;
        let la = self.stack_linear(sp);
        let one_page = total != 0
            && sp.checked_add(total - 1).is_some_and(|end| end <= mask)
            && (la & 0xfff) + total <= 0x1000;
        if !one_page || self.state.debug.dr7 & DR7_ENABLES != 0 || self.mmio_emu.is_some() {
            for (k, v) in (0u64..).zip(out.iter_mut()) {
                *v = self.stack_peek(mem, offset.wrapping_add(k * n), size)?;
            }
            return Ok(());
        }
        let user = self.user_access();
        let hpa = self
            .translate(mem, la, AccessKind::Read, user)
            .map_err(stack_fault)?;
        for (k, v) in (0u64..).zip(out.iter_mut()) {
            // (Without MMIO emulation `phys_read` is this read.)
            *v = mem
                .read(Hpa(hpa.0 + k * n), size.bytes())
                .map_err(|e| stack_fault(e.into()))?;
        }
        Ok(())
    }
}

/// What [`Cpu::translate_keyed`] did.
enum Keyed {
    /// The TLB gave the translation (the first-level slot is filled).
    Hit(Hpa),
    /// The TLB lookup missed, with its effects: the walk is next.
    Missed,
    /// Nothing: the TLB is not to be looked up with a key here.
    Unkeyed,
}

/// A non-canonical stack address is #SS(0), not #GP(0).
pub(crate) fn stack_fault(f: Fault) -> Fault {
    match f.kind() {
        FaultKind::Exception {
            vector: vector::GP,
            error_code: Some(0),
            cr2: None,
        } => Fault::with_code(vector::SS, 0),
        _ => f,
    }
}

/// Maps an MMU error to the fault the CPU raises.
pub(crate) fn translate_fault(e: TranslateError) -> Fault {
    match e {
        TranslateError::PageFault { gva, error_code } => {
            Fault::exception_with(vector::PF, Some(error_code), Some(gva.0))
        }
        TranslateError::NonCanonical { .. } => Fault::with_code(vector::GP, 0),
        TranslateError::EptViolation {
            gpa,
            gla,
            qualification,
        } => Fault::exit(VmExit::EptViolation {
            gpa,
            gla,
            qualification,
        }),
        TranslateError::EptMisconfig { gpa } => Fault::exit(VmExit::EptMisconfig { gpa }),
        TranslateError::PmlFull => Fault::exit(VmExit::PmlFull),
        TranslateError::Memory(e) => Fault::exit(VmExit::MachineError(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::CpuConfig;
    use crate::jit::Engine;
    use crate::mmu::paging::pte;
    use crate::vmx::VmxControls;

    /// Identity-mapped 4 KiB pages below 2 MiB, supervisor-only but the
    /// ones at `USER_PAGES`; a supervisor 2 MiB page above for the stack.
    const USER_PAGES: [u64; 2] = [0x30000, 0x31000];
    const USER_PAGE: u64 = USER_PAGES[0];
    const KERNEL_PAGE: u64 = 0x20000;

    fn smap_machine(engine: Engine) -> (PhysMemory, Cpu) {
        let mem = PhysMemory::new(4 << 20).unwrap();
        let table = pte::PRESENT | pte::WRITABLE | pte::USER;
        mem.write_u64(Hpa(0x1000), 0x2000 | table).unwrap();
        mem.write_u64(Hpa(0x2000), 0x3000 | table).unwrap();
        mem.write_u64(Hpa(0x3000), 0x4000 | table).unwrap();
        mem.write_u64(
            Hpa(0x3008),
            (1 << 21) | pte::PRESENT | pte::WRITABLE | pte::HUGE,
        )
        .unwrap();
        for page in 0..512u64 {
            let user = if USER_PAGES.contains(&(page << 12)) {
                pte::USER
            } else {
                0
            };
            mem.write_u64(
                Hpa(0x4000 + page * 8),
                page << 12 | pte::PRESENT | pte::WRITABLE | user,
            )
            .unwrap();
        }
        let mut cpu = Cpu::new(CpuConfig {
            engine,
            ..CpuConfig::default()
        });
        cpu.set_jit_threshold(1);
        // Exceptions leave `run` as exits.
        cpu.set_vmx(Some(VmxControls {
            exception_bitmap: !0,
            hlt_exiting: true,
            ..Default::default()
        }));
        let s = cpu.state_mut();
        s.cr3 = 0x1000;
        s.cr4 |= cr4::SMAP;
        s.gpr[4] = 0x3f_f000;
        (mem, cpu)
    }

    fn run_at(cpu: &mut Cpu, mem: &PhysMemory, rip: u64) -> VmExit {
        let s = cpu.state_mut();
        s.rip = rip;
        s.activity = super::super::Activity::Active;
        let limit = cpu.cycles() + 1_000_000;
        cpu.run(mem, limit)
    }

    /// Under SMAP, STAC and CLAC flush no TLB (SDM Vol. 3A 4.6: SMAP is
    /// checked on each access): after a CLAC the first-level slots of
    /// instruction fetches, of user-mode accesses and of supervisor
    /// accesses to supervisor pages are still there; the supervisor data
    /// slot of the user page read under STAC is not, and reading it again
    /// faults. The same in both engines, the translated code's fill
    /// included (the loop runs the blocks translated).
    #[test]
    fn clac_under_smap_drops_only_the_supervisor_slots_of_user_pages() {
        use iced_x86::code_asm::{ptr, rax, rbx, rcx, rdx, CodeAssembler};
        let (code, clac_page, faulting) = (0x10000u64, 0x11000u64, 0x12000u64);
        let assemble = |at: u64, f: &dyn Fn(&mut CodeAssembler)| {
            let mut a = CodeAssembler::new(64).unwrap();
            f(&mut a);
            a.assemble(at).unwrap()
        };
        let first = assemble(code, &|a| {
            a.stac().unwrap();
            a.mov(rax, ptr(KERNEL_PAGE)).unwrap();
            a.mov(rbx, ptr(USER_PAGES[0])).unwrap();
            a.mov(rdx, ptr(USER_PAGES[1])).unwrap();
            a.hlt().unwrap();
        });
        let second = assemble(clac_page, &|a| {
            a.clac().unwrap();
            a.hlt().unwrap();
        });
        let read = assemble(faulting, &|a| {
            a.mov(rcx, ptr(USER_PAGE)).unwrap();
            a.hlt().unwrap();
        });
        for engine in Engine::ALL {
            let (mem, mut cpu) = smap_machine(engine);
            for (at, bytes) in [(code, &first), (clac_page, &second), (faulting, &read)] {
                mem.write_bytes(Hpa(at), bytes).unwrap();
            }
            let user_read = AccessKind::Read as usize * 2 + 1;
            let supervisor_read = AccessKind::Read as usize * 2;
            let supervisor_fetch = AccessKind::Execute as usize * 2;
            for round in 0..3 {
                // A user-mode read of the user page (allowed whatever AC).
                cpu.translate(&mem, USER_PAGE, AccessKind::Read, true)
                    .unwrap();
                assert_eq!(run_at(&mut cpu, &mem, code), VmExit::Hlt);
                let what = format!("{engine:?}, round {round}");
                // The supervisor read slots of the user pages are noted
                // as such (the second one's by the translated code's
                // fill after the first round), the kernel page's is not.
                cpu.sync_l1();
                let slot = |la: u64| 1u64 << l1tlb::slot_index(la);
                let users = slot(USER_PAGES[0]) | slot(USER_PAGES[1]);
                let noted = cpu.l1.user_pages(supervisor_read) & (users | slot(KERNEL_PAGE));
                assert_eq!(noted, users, "{what}");
                assert_eq!(run_at(&mut cpu, &mem, clac_page), VmExit::Hlt);
                assert_eq!(cpu.state().rflags & rflags::AC, 0);
                cpu.sync_l1();
                assert!(cpu.l1.consistent(), "{what}");
                assert!(!cpu.l1.peek(supervisor_read, USER_PAGES[0]), "{what}");
                assert!(!cpu.l1.peek(supervisor_read, USER_PAGES[1]), "{what}");
                assert!(cpu.l1.peek(supervisor_read, KERNEL_PAGE), "{what}");
                assert!(cpu.l1.peek(user_read, USER_PAGE), "{what}");
                assert!(cpu.l1.peek(supervisor_fetch, code), "{what}");
            }
            let exit = run_at(&mut cpu, &mem, faulting);
            assert!(
                matches!(
                    exit,
                    VmExit::Exception {
                        vector: vector::PF,
                        ..
                    }
                ),
                "{engine:?}: {exit:?}"
            );
        }
    }

    /// What the model keeps of accesses: cycles, the TLB's counters, page
    /// walk references, and whether the first-level TLB's supervisor read
    /// class holds `pages`.
    fn counts(cpu: &mut Cpu, pages: &[u64]) -> String {
        cpu.sync_l1();
        let slots: Vec<bool> = pages
            .iter()
            .map(|&la| cpu.l1.peek(AccessKind::Read as usize * 2, la))
            .collect();
        format!(
            "cycles {} tlb {:?} refs {} psc {:?} l1 {slots:?}",
            cpu.cycles(),
            cpu.tlb.stats(),
            cpu.stats().page_walk_refs,
            cpu.tlb.psc().stats(),
        )
    }

    /// Two ways of an access agree: the same result, and the same
    /// [`counts`] on their CPUs.
    fn agree<T: PartialEq + std::fmt::Debug>(
        what: &str,
        (got, a): (T, &mut Cpu),
        (want, b): (T, &mut Cpu),
        pages: &[u64],
    ) {
        assert_eq!(got, want, "{what}");
        assert_eq!(counts(a, pages), counts(b, pages), "{what}");
    }

    /// `stack_peek_run` is the `stack_peek`s it stands for: the same
    /// values or fault, cycles, TLB counters and first-level slots, in one
    /// page (its one-translation way), across a page, with a wrapping
    /// 16-bit stack, with DR7 breakpoints on, on a missing page and at a
    /// non-canonical address; twice each (TLB misses, then hits).
    #[test]
    fn a_stack_run_reads_and_counts_as_its_single_reads() {
        let missing = 0x40_0100; // Past the mapped 4 MiB.
        let cases: [(&str, u64, Size, usize, u64); 8] = [
            ("one page", 0x3f_e000 - 40, Size::B8, 5, 0),
            ("one page, end", KERNEL_PAGE + 0x1000 - 24, Size::B8, 3, 0),
            ("across pages", KERNEL_PAGE + 0x1000 - 16, Size::B8, 3, 0),
            // SP 0xfffa after the offset: the fourth item wraps to SS.base,
            // which is in another page than KERNEL_PAGE + 0x800.
            ("16-bit wrap", 0xfff2, Size::B2, 5, 0),
            ("32-bit", KERNEL_PAGE + 0x10, Size::B4, 5, 0),
            ("dr7", KERNEL_PAGE + 0x40, Size::B8, 5, 1),
            ("missing", missing, Size::B8, 3, 0),
            ("non-canonical", 1 << 60, Size::B8, 2, 0),
        ];
        for (what, rsp, size, count, dr7) in cases {
            let setup = || {
                let (mem, mut cpu) = smap_machine(Engine::Interp);
                for (k, page) in [KERNEL_PAGE, KERNEL_PAGE + 0x1000, 0x3f_d000]
                    .into_iter()
                    .enumerate()
                {
                    for q in 0..512u64 {
                        let v = ((k as u64 + 1) << 56) | page | (q * 8);
                        mem.write_u64(Hpa(page + q * 8), v).unwrap();
                    }
                }
                let s = cpu.state_mut();
                s.gpr[4] = rsp;
                s.debug.dr7 = dr7;
                if size != Size::B8 {
                    // Compatibility mode: a 16-bit stack (SS.B clear) or
                    // a 32-bit one.
                    s.cs.attr &= !super::super::state::seg_attr::LONG;
                    if size == Size::B2 {
                        s.ss.attr &= !super::super::state::seg_attr::DB;
                        s.ss.base = KERNEL_PAGE + 0x800 - 0xfffa;
                    } else {
                        s.ss.attr |= super::super::state::seg_attr::DB;
                        s.ss.base = 0;
                    }
                }
                (mem, cpu)
            };
            let (mem, mut run) = setup();
            let (_, mut single) = setup();
            let pages = [rsp, rsp + 0x1000, KERNEL_PAGE, KERNEL_PAGE + 0x1000];
            for round in 0..2 {
                let offset = 8;
                let mut got = vec![0u64; count];
                let got = run
                    .stack_peek_run(&mem, offset, size, &mut got)
                    .map(|()| got);
                let want: Result<Vec<u64>, Fault> = (0..count as u64)
                    .map(|k| single.stack_peek(&mem, offset + k * size.bytes() as u64, size))
                    .collect();
                let what = format!("{what}, round {round}");
                agree(&what, (got, &mut run), (want, &mut single), &pages);
            }
        }
    }

    /// An implicit access's translations the way [`mmu::translate`]
    /// makes them, with its own TLB lookup (one, or one per byte across
    /// pages as `read_split` and `write_split` make them).
    fn implicit_full_way(
        cpu: &mut Cpu,
        mem: &PhysMemory,
        la: u64,
        size: Size,
        kind: AccessKind,
    ) -> Result<Vec<Hpa>, Fault> {
        let n = size.bytes() as u64;
        let one_page = (la & 0xfff) + n <= 0x1000;
        (0..if one_page { 1 } else { n })
            .map(|i| cpu.translate_full(mem, la.wrapping_add(i), kind, false, true, false))
            .collect()
    }

    /// An implicit read and write, whose TLB lookup the CPU makes with a
    /// key of its own, are the full way ([`implicit_full_way`]): the same
    /// value or fault, cycles, TLB counters (a miss and its walk, then
    /// hits) and first-level slots (they fill none), for a supervisor
    /// page, a user page under SMAP with RFLAGS.AC set (an implicit access
    /// ignores AC: #PF, while a normal read with AC set has put the page
    /// in the TLB), a missing page, a non-canonical address, an access
    /// across pages, and with paging off.
    #[test]
    fn an_implicit_access_with_its_own_key_counts_as_the_full_way() {
        let cases: [(&str, u64, bool, bool); 7] = [
            ("supervisor", KERNEL_PAGE + 0x18, false, true),
            ("supervisor, AC", KERNEL_PAGE + 0x18, true, true),
            ("user, AC", USER_PAGE + 0x20, true, true),
            ("missing", 0x40_0000, false, true),
            ("non-canonical", 1 << 60, false, true),
            ("across pages", KERNEL_PAGE + 0xffc, false, true),
            ("no paging", KERNEL_PAGE + 0x18, false, false),
        ];
        for (what, la, ac, paging) in cases {
            let setup = || {
                let (mem, mut cpu) = smap_machine(Engine::Interp);
                mem.write_u64(Hpa(KERNEL_PAGE + 0x18), 0x1122_3344_5566_7788)
                    .unwrap();
                mem.write_u64(Hpa(USER_PAGE + 0x20), 0x99).unwrap();
                let s = cpu.state_mut();
                if ac {
                    s.rflags |= rflags::AC;
                }
                if !paging {
                    s.cr0 &= !cr0::PG;
                }
                if ac && paging {
                    // A normal read, allowed by AC, puts the page in the TLB.
                    cpu.read_mem(&mem, la, Size::B8).unwrap();
                }
                (mem, cpu)
            };
            let (mem, mut keyed) = setup();
            let (_, mut full) = setup();
            let pages = [la, KERNEL_PAGE, USER_PAGE];
            for round in 0..2 {
                let what = format!("{what}, round {round}");
                let got = keyed.read_implicit(&mem, la, Size::B8);
                let v = *got.as_ref().unwrap_or(&0);
                let want = implicit_full_way(&mut full, &mem, la, Size::B8, AccessKind::Read)
                    .and_then(|hpas| match hpas[..] {
                        [hpa] => full.phys_read(&mem, hpa, 8),
                        _ => (0..8).try_fold(0, |v, i| {
                            Ok(v | full.phys_read(&mem, hpas[i], 1)? << (8 * i))
                        }),
                    });
                agree(
                    &format!("read, {what}"),
                    (got, &mut keyed),
                    (want, &mut full),
                    &pages,
                );
                // Writing back what was read leaves memory as it was.
                let got = keyed.write_implicit(&mem, la, Size::B8, v);
                let want = implicit_full_way(&mut full, &mem, la, Size::B8, AccessKind::Write)
                    .and_then(|hpas| match hpas[..] {
                        [hpa] => full.store(&mem, hpa, Size::B8, v),
                        _ => (0..8)
                            .try_for_each(|i| full.store(&mem, hpas[i], Size::B1, v >> (8 * i))),
                    });
                agree(
                    &format!("write, {what}"),
                    (got, &mut keyed),
                    (want, &mut full),
                    &pages,
                );
            }
        }
    }
}
