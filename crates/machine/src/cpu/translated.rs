//! The run loop's side of the translator (`crate::jit`): when a block is
//! translated, running it, and turning how it stopped into exactly what the
//! interpreter's loop would have done.

use super::code_cache::Block;
use super::{fast, Cpu, Step, MAX_INSN_LEN};
use crate::jit::native::Translation;
use crate::jit::{self, status, ChainEntry, Engine, Offsets};
use crate::memory::PhysMemory;
use std::rc::Rc;

/// `Cpu::jit_chain_rip` for the block `Cpu::jit_entered[i]`: `ENTERED | i`,
/// never a canonical RIP (bit 62 set, 63 and 47 clear).
const ENTERED: u64 = 1 << 62;
/// Page-crossing blocks one run of translated code may chain into.
const ENTERED_MAX: usize = 16;

/// The index in `Cpu::jit_entered` a reported RIP stands for.
fn entered_index(rip: u64) -> Option<usize> {
    (rip & !0xffff == ENTERED).then_some((rip & 0xffff) as usize)
}

/// Whole runs of a block before it is translated, by default: code run
/// a few times (boot code) is not worth translating. Measured on `faultline
/// run --guest linux --vcpus 1 -- hello`, alternating runs on this 2-core
/// host: 2 runs 2.44-2.70 s wall, 8 runs 2.32-2.46 s, 32 runs 2.32-2.42
/// s, 128 runs 2.20-2.27 s; host instructions of the same run
/// (`valgrind --tool=callgrind --smc-check=all`, deterministic, measured
/// before blocks without native forms were translated): 32 runs 18.75 G,
/// 128 runs 18.47 G, 512 runs 19.40 G. The virtual-time results are the
/// same for every value (the engines are bit-identical).
pub(super) const TRANSLATE_AFTER_RUNS: u32 = 128;

/// `Block::runs` of a block whose translation has been asked of the
/// translator thread (`jit::background`): it is interpreted until the
/// answer has come.
const ASKED: u32 = u32::MAX;

impl Cpu {
    /// The engine running guest code.
    pub fn engine(&self) -> Engine {
        self.engine
    }

    /// The translator's counters.
    pub fn jit_stats(&self) -> jit::JitStats {
        self.jit_stats
    }

    /// Switches engines (between runs; guest state, memory and virtual
    /// time do not depend on the choice).
    pub fn set_engine(&mut self, engine: Engine) {
        self.engine = engine;
    }

    /// Translate blocks on their `runs`-th whole run (at least the first).
    /// Results do not depend on it; tests and the differential tester use
    /// 1 so that code run once is translated too.
    pub fn set_jit_threshold(&mut self, runs: u32) {
        self.jit_threshold = runs.max(1);
    }

    /// The translation to run `block` with, if the translator runs it: only
    /// whole blocks (not the single first instruction the run loop takes
    /// when events must be looked at after it), translated on their
    /// `jit_threshold`-th whole run: there and then, or asked of the
    /// translator thread (`jit::background`), the block interpreted until
    /// its translation has come.
    #[inline(always)]
    pub(super) fn translation<'b>(
        &mut self,
        block: &'b Rc<Block>,
        whole: bool,
    ) -> Option<&'b Translation> {
        if self.engine != Engine::Jit || !whole {
            return None;
        }
        let user = self.state.cpl() == 3;
        if let Some(t) = block.jit.get() {
            // Made for the other privilege: its inline accesses would use
            // the other first-level TLB class (rare: interpret).
            return t.as_ref().filter(|t| t.user == user);
        }
        let runs = block.runs.get();
        if runs == ASKED {
            return self.translation_come(block, user);
        }
        let runs = runs.saturating_add(1).min(ASKED - 1);
        block.runs.set(runs);
        if runs < self.jit_threshold {
            return None;
        }
        let offsets = self.jit_offsets();
        let helpers = self.jit_helpers();
        if jit::background::enabled() {
            let pending = self
                .jit_pending
                .get_or_insert_with(jit::background::Pending::new);
            if pending.request(block, offsets, helpers, user) {
                block.runs.set(ASKED);
                return self.translation_come(block, user);
            }
            // No translator thread: translate here.
        }
        let result = jit::translate(block, offsets, helpers, user);
        self.install_translation(block, result, user)
    }

    /// [`Self::translation`] of a block whose translation was asked of
    /// the translator thread: installs every answer that has come, then
    /// the block's, if it has.
    #[inline(never)]
    fn translation_come<'b>(
        &mut self,
        block: &'b Rc<Block>,
        user: bool,
    ) -> Option<&'b Translation> {
        while let Some((b, answer)) = self.jit_pending.as_mut().and_then(|p| p.next_answer()) {
            let _ = self.install_translation(&b, answer.result, answer.user);
        }
        block.jit.get()?.as_ref().filter(|t| t.user == user)
    }

    /// The helpers translated code calls (the fill thunk installed on
    /// first use).
    fn jit_helpers(&mut self) -> jit::Helpers {
        jit::Helpers {
            call_out: jit::native::call_out_address(),
            fill: self.jit_arena.fill_address(),
        }
    }

    /// Installs what translating `block` for `user` gave and attaches it
    /// to the block (for good: a block is translated once).
    fn install_translation<'b>(
        &mut self,
        block: &'b Block,
        result: Result<(Vec<u8>, usize), jit::NotTranslated>,
        user: bool,
    ) -> Option<&'b Translation> {
        let translation = match result {
            Ok((code, chain_offset)) => {
                let t = self.jit_arena.install(&code, chain_offset, user);
                match &t {
                    Some(t) => {
                        let (start, len) = t.code_range();
                        jit::perf_map::record(start, len, block.rip, block.hpa);
                        self.jit_stats.blocks_translated += 1;
                        self.jit_stats.code_bytes += code.len() as u64;
                    }
                    None => self.jit_stats.blocks_failed += 1,
                }
                t
            }
            Err(jit::NotTranslated::Not64Bit) => {
                self.jit_stats.blocks_interpreted += 1;
                None
            }
            Err(_) => {
                self.jit_stats.blocks_failed += 1;
                None
            }
        };
        block.jit.get_or_init(|| translation).as_ref()
    }

    /// Runs a translated block: (instructions completed, RIP after, what
    /// next), as [`Cpu::interpret_block`] gives them.
    #[inline(always)]
    pub(super) fn run_translated(
        &mut self,
        mem: &PhysMemory,
        block: &Rc<Block>,
        t: &Translation,
        cycle_limit: u64,
    ) -> (usize, u64, Step) {
        // The generated code keeps the flags exact in `state.rflags`.
        self.flush_flags();
        // Other blocks may chain to this one from now on.
        let slot = jit::chain_slot(block.rip);
        let entry = ChainEntry {
            rip: block.rip,
            hpa: block.hpa,
            generation: block.generation as u64,
            entry: t.chain_entry(),
            block: Rc::as_ptr(block) as u64,
            user: t.user as u64,
            version: jit::NO_VERSION,
        };
        // (An entry already there keeps the version an exit recorded.)
        let there = ChainEntry {
            version: jit::NO_VERSION,
            ..self.jit_chain[slot]
        };
        if there != entry {
            self.jit_chain[slot] = entry;
            self.jit_chain_blocks[slot] = Some(block.clone());
        }
        // A store into code anywhere: no chaining check made before holds.
        let code_writes = mem.code_writes();
        if code_writes != self.jit_code_writes {
            self.jit_code_writes = code_writes;
            self.l1.renew_fetch_versions();
        }
        let (mem_base, code_frames, code_generation) = mem.jit_view();
        // The inline accesses read first-level TLB slots with one compare:
        // they must hold nothing stale (see `l1tlb`), and no write slot of
        // a frame holding code.
        self.l1.use_memory(mem_base, mem.size());
        self.sync_l1();
        self.keep_stores_off_code(mem);
        let tlb = self.tlb.jit_pointers();
        let env = jit::native::Env {
            l1_slots: self.l1.slots_address(),
            mem_base,
            mem_size: mem.size(),
            code_frames,
            chain: self.jit_chain.as_ptr(),
            code_generation,
            chain_crossing: jit::native::chain_crossing_address(),
            chain_fetch: jit::native::chain_fetch_address(),
            l1_book: self.l1.book_address(),
            tlb_hints: tlb.hints,
            tlb_entries: tlb.entries,
            tlb_recently_used: tlb.recently_used,
            tlb_hits: tlb.hits,
            tlb_ways: tlb.ways,
            tlb_full_set_mask: tlb.full_set_mask,
            tlb_epoch: tlb.epoch,
            memory: mem,
        };
        // What the run loop checks between blocks, as one deadline (events
        // are not pending: a block runs translated only when they are not).
        self.jit_deadline = if self.check_events {
            0
        } else {
            cycle_limit.min(self.next_timer_cycle)
        };
        self.jit_cycle_limit = cycle_limit;
        self.jit_chain_rip = block.rip;
        self.jit_loop_recheck = 1;
        let r = t.run(self, mem, block, &env);
        match r & 0xff {
            status::FETCHED => {
                self.jit_entered.clear();
                let step = self.run_fetched(mem, cycle_limit);
                return (0, self.state.rip, step);
            }
            status::FETCH_EXIT => {
                self.jit_entered.clear();
                let step = match self.jit_exit.take() {
                    Some(e) => Step::Exit(e),
                    None => Step::Continue,
                };
                return (0, self.state.rip, step);
            }
            status::FETCH_FAULT => {
                self.jit_entered.clear();
                // As `run_block` takes a fault of its fetch.
                self.mmio = None;
                let step = match self.jit_fault.take() {
                    Some(f) => self.handle_fault(mem, f, 0),
                    None => Step::Continue,
                };
                return (0, self.state.rip, step);
            }
            _ => {}
        }
        // The block it stopped in: this one, or the last it chained to
        // (which the chaining table keeps alive), or a page-crossing block
        // it chained into (`jit_chain_crossing`).
        let last = if self.jit_chain_rip == block.rip {
            None
        } else if let Some(i) = entered_index(self.jit_chain_rip) {
            self.jit_entered.get(i).cloned()
        } else {
            self.jit_chain_blocks[jit::chain_slot(self.jit_chain_rip)].clone()
        };
        self.jit_entered.clear();
        let block: &Block = last.as_deref().unwrap_or(block);
        let k = (r >> 8) as usize;
        let Some(op) = block.insns.get(k) else {
            // Cannot happen: the code only reports its own instructions.
            return (0, self.state.rip, Step::Continue);
        };
        match r & 0xff {
            // (`LEAVE_FETCH` never gets here: the generated code turns it
            // into `LEAVE` or goes on.)
            status::LEAVE | status::LEAVE_FETCH => (k + 1, self.next_rip, Step::Continue),
            status::FAULT => match self.jit_fault.take() {
                Some(f) => {
                    let step = self.fault_in_block(mem, op, f);
                    (k, self.state.rip, step)
                }
                None => (k, op.insn.ip(), Step::Continue),
            },
            _ => (k + 1, op.next_ip, Step::Continue),
        }
    }

    /// The rest of the run loop's step after a chaining exit made its fetch
    /// (`Cpu::jit_chain_fetch`, status `FETCHED`): the block there, run as
    /// the run loop would (its fetch is now a first-level iTLB hit, which
    /// changes nothing; the between-block checks were made before the
    /// fetch). The counts of the block that exited are in already, so the
    /// caller reports none for it.
    #[inline(never)]
    fn run_fetched(&mut self, mem: &PhysMemory, cycle_limit: u64) -> Step {
        self.jit_fetched = true;
        // Only translated code makes such a fetch: the translator's loop.
        let step = self.run_block::<true>(mem, cycle_limit);
        self.jit_fetched = false;
        step
    }

    /// A chaining exit of translated code is about to go on at `rip` (a
    /// 64-bit block's, the deadline compare passed: the run loop would go
    /// straight on), after this block's `instructions`, and the first-level
    /// iTLB misses for it. Either changes nothing (zeros: the code returns
    /// to the run loop as before), or does what the run loop would do
    /// next: adds the block's counts, sets RIP and fetches at `rip`
    /// (`translate_fetch`, the TLB lookup or walk with its cycles and
    /// counters and the first-level fill). Then, if the fetch faulted, the
    /// status `FETCH_FAULT` (the fault in `jit_fault`); if the block there
    /// is translated for this privilege (in the chaining table for this
    /// frame generation, or in the code cache: then kept alive until the
    /// generated code returns, as `jit_chain_crossing` does), its chained
    /// entry and the block (reported as the one the code is in); otherwise
    /// the status `FETCHED` (the run loop runs that block, `run_fetched`).
    pub(crate) fn jit_chain_fetch(
        &mut self,
        mem: &PhysMemory,
        rip: u64,
        instructions: u64,
    ) -> jit::native::CrossingEntry {
        use jit::native::CrossingEntry;
        const NONE: CrossingEntry = CrossingEntry { entry: 0, block: 0 };
        self.jit_loop_recheck = 1;
        let mtf = self.vmx.as_ref().is_some_and(|v| v.monitor_trap_flag);
        // (The deadline covers these; checked again so that what follows
        // is the run loop's next step whatever the caller.)
        if self.jit_fetched
            || mtf
            || self.code_written
            || self.pending_apic_exit.is_some()
            || self.state.interruptibility != 0
            || self.state.activity != super::Activity::Active
            || self.state.code_bits() != 64
            || self.debug_steps()
            || self.cycles + instructions * self.costs.instruction >= self.jit_deadline
        {
            return NONE;
        }
        // `run_block`'s end for this block, then the next one's fetch. The
        // next block is a run loop step of its own: an instruction of this
        // one that traps on the TF it leaves (`tf_after_only`: SYSCALL,
        // SYSRET, INT n, which end their blocks and come here through a
        // privilege change or an event check) has left TF clear, so no
        // trap; the next block starts without that mark, as `run_block`
        // starts it.
        self.tf_after_only = false;
        self.jit_stats.chain_fetches += 1;
        self.stats.instructions += instructions;
        self.cycles += instructions * self.costs.instruction;
        self.state.rip = rip;
        if self.check_events {
            // The run loop would look at events first (a call-out asked,
            // `jit_call_out`): the cycle limit is not reached (the
            // deadline is below it), so `run_loop`'s event check.
            if let Step::Exit(e) = self.check_events_now(mem) {
                self.jit_exit = Some(e);
                return CrossingEntry {
                    entry: 0,
                    block: status::FETCH_EXIT,
                };
            }
            self.jit_deadline = self.jit_cycle_limit.min(self.next_timer_cycle);
            if self.state.activity != super::Activity::Active {
                // (The check does not stop the CPU; were it to, the run
                // loop's own loop would take it from here.)
                return CrossingEntry {
                    entry: 0,
                    block: status::FETCH_EXIT,
                };
            }
            if self.check_events {
                // An event was delivered (or is blocked): the run loop
                // runs one instruction before it looks again, from the
                // RIP the check left.
                return CrossingEntry {
                    entry: 0,
                    block: status::FETCHED,
                };
            }
        }
        let user = self.state.cpl() == 3;
        let hpa = match self.translate_fetch_after_miss(mem, rip, user) {
            Ok(hpa) => hpa,
            Err(f) => {
                self.jit_fault = Some(f);
                return CrossingEntry {
                    entry: 0,
                    block: status::FETCH_FAULT,
                };
            }
        };
        let e = self.jit_chain[jit::chain_slot(rip)];
        if e.rip == rip
            && e.hpa == hpa.0
            && e.user == user as u64
            && e.generation == u64::from(mem.code_generation(hpa))
        {
            self.jit_chain_rip = rip;
            return CrossingEntry {
                entry: e.entry,
                block: e.block,
            };
        }
        if self.jit_entered.len() < ENTERED_MAX {
            if let Some(block) = self.code.lookup(mem, hpa, rip, 64) {
                if let Some(Some(t)) = block.jit.get() {
                    if t.user == user {
                        let entry = t.chain_entry();
                        return self.jit_enter(block, entry);
                    }
                }
            }
        }
        CrossingEntry {
            entry: 0,
            block: status::FETCHED,
        }
    }

    /// Translated code is about to go on at `rip`, which is not in the
    /// chaining table (the deadline checked): if the run loop would fetch
    /// a page-crossing instruction's block there without changing anything
    /// (both pages first-level iTLB hits, no block cached at that address,
    /// the crossing cache holding the same bytes from the same frames) and
    /// that block is translated for this privilege, its chained entry and
    /// the block (kept alive until the generated code returns); zeros
    /// otherwise. Changes nothing else: reports the block as the one the
    /// code is in.
    pub(crate) fn jit_chain_crossing(
        &mut self,
        mem: &PhysMemory,
        rip: u64,
    ) -> jit::native::CrossingEntry {
        const NONE: jit::native::CrossingEntry = jit::native::CrossingEntry { entry: 0, block: 0 };
        self.jit_loop_recheck = 1;
        let room = 4096 - (rip & 0xfff) as usize;
        if room >= MAX_INSN_LEN
            || self.state.code_bits() != 64
            || self.jit_entered.len() >= ENTERED_MAX
        {
            return NONE;
        }
        let user = self.state.cpl() == 3;
        let class = 2 * 2 + user as usize;
        self.sync_l1();
        let Some(hpa) = self.l1.lookup(class, rip) else {
            return NONE;
        };
        let next_page = (rip & !0xfff).wrapping_add(0x1000);
        let Some(hpa2) = self.l1.lookup(class, next_page) else {
            return NONE;
        };
        if self.code.lookup(mem, hpa, rip, 64).is_some() {
            return NONE;
        }
        // (The crossing cache holding all these bytes implies that the
        // check of their first part `fetch_block` makes passes.)
        let Some(block) = self.code.lookup_crossing_in_memory(mem, rip, hpa, hpa2, 64) else {
            return NONE;
        };
        let Some(Some(t)) = block.jit.get() else {
            return NONE;
        };
        if t.user != user {
            return NONE;
        }
        let entry = t.chain_entry();
        self.jit_enter(block, entry)
    }

    /// Translated code goes on into `block` (not in the chaining table) at
    /// its chained `entry`: keeps the block alive until the code returns
    /// (`jit_entered`) and reports it as the block the code is in; the
    /// entry and the block for the code.
    fn jit_enter(&mut self, block: Rc<Block>, entry: u64) -> jit::native::CrossingEntry {
        let i = match self.jit_entered.iter().position(|b| Rc::ptr_eq(b, &block)) {
            Some(i) => i,
            None => {
                self.jit_entered.push(block.clone());
                self.jit_entered.len() - 1
            }
        };
        self.jit_chain_rip = ENTERED | i as u64;
        jit::native::CrossingEntry {
            entry,
            block: Rc::as_ptr(&block) as u64,
        }
    }

    /// Offsets of the state the generated code reads and writes, from the
    /// start of the `Cpu` (the same for every `Cpu`: one type, one layout).
    pub(crate) fn jit_offsets(&self) -> Offsets {
        let base = self as *const Cpu as usize;
        let off = |p: usize| (p - base) as i32;
        Offsets {
            gpr: off(self.state.gpr.as_ptr() as usize),
            rflags: off(&self.state.rflags as *const u64 as usize),
            rip: off(&self.state.rip as *const u64 as usize),
            next_rip: off(&self.next_rip as *const u64 as usize),
            instructions: off(&self.stats.instructions as *const u64 as usize),
            cycles: off(&self.cycles as *const u64 as usize),
            jit_deadline: off(&self.jit_deadline as *const u64 as usize),
            jit_chain_rip: off(&self.jit_chain_rip as *const u64 as usize),
            jit_loop_recheck: off(&self.jit_loop_recheck as *const u64 as usize),
            instruction_cost: self.costs.instruction,
            multiply_cost: self.costs.multiply,
            divide_cost: self.costs.divide,
            locked_cost: self.costs.locked,
            serializing_cost: self.costs.serializing,
            string_iteration_cost: self.costs.string_iteration,
            fs_base: off(&self.state.fs.base as *const u64 as usize),
            gs_base: off(&self.state.gs.base as *const u64 as usize),
            kernel_gs_base: off(&self.state.kernel_gs_base as *const u64 as usize),
            cs_selector: off(&self.state.cs.selector as *const u16 as usize),
            selectors: [
                &self.state.es,
                &self.state.cs,
                &self.state.ss,
                &self.state.ds,
                &self.state.fs,
                &self.state.gs,
            ]
            .map(|s| off(&s.selector as *const u16 as usize)),
            check_events: off(&self.check_events as *const bool as usize),
            interruptibility: off(&self.state.interruptibility as *const u8 as usize),
            cr0: off(&self.state.cr0 as *const u64 as usize),
            cr4: off(&self.state.cr4 as *const u64 as usize),
            xmm: off(self.state.fpu.xmm.as_ptr() as usize),
            tsc_aux: off(&self.state.tsc_aux as *const u64 as usize),
            vmx: off(&self.vmx as *const Option<Box<crate::vmx::VmxControls>> as usize),
            state: off(&self.state as *const super::state::CpuState as usize),
            privilege_transition: self.costs.privilege_transition,
        }
    }

    /// Instruction `k` of `block`, run by the interpreter for translated
    /// code: the status word of [`jit::status`]. The flags are left exact
    /// in `state.rflags` (the generated code reads them from there).
    pub(crate) fn jit_call_out(&mut self, mem: &PhysMemory, block: &Block, k: usize) -> u64 {
        self.jit_loop_recheck = 1;
        let Some(op) = block.insns.get(k) else {
            return status::NEXT_IP | (k as u64) << 8;
        };
        self.jit_stats.call_outs += 1;
        if let Some(p) = &mut self.jit_profile {
            p.count(op);
        }
        let privilege = (self.state.cpl(), self.state.code_bits());
        let s = match self.exec_op(mem, op) {
            Ok(fast::Flow::Next) => status::NEXT,
            Ok(fast::Flow::Stored) if !self.code_written => status::NEXT,
            Ok(fast::Flow::Stored) => status::NEXT_IP,
            Ok(fast::Flow::Leave) => status::LEAVE,
            Err(f) => {
                self.jit_fault = Some(f);
                status::FAULT
            }
        };
        self.flush_flags();
        // Entries may have left the TLB, or the mode moved: translated
        // code must not see stale first-level TLB slots.
        self.sync_l1();
        // Anything the run loop must look at before the next block stops
        // chaining (what it looks at itself: events, STI/MOV-SS blocking,
        // activity, a store into code, an IPI).
        if self.state.interruptibility != 0
            || self.state.activity != super::Activity::Active
            || self.code_written
            || self.pending_apic_exit.is_some()
            || self.debug_steps()
        {
            self.jit_deadline = 0;
        } else if self.check_events || privilege != (self.state.cpl(), self.state.code_bits()) {
            // A privilege or code-size change (SYSCALL, SYSRET, far
            // transfers) must not chain through the inline exits: they
            // probe the iTLB class of the block's own privilege and chain
            // only to 64-bit blocks of it, and the first-level TLB keeps
            // its slots across such a change. (Other mode changes that
            // matter to the probes change the lookup-key context, which
            // empties it.) So must a call-out that asks for an event check
            // (SYSRET, IRET, POPF, STI...). A branch goes on through
            // `jit_chain_fetch` instead, which makes the event check and
            // the fetch at the new privilege as the run loop would;
            // anything else stops chaining.
            if s == status::LEAVE {
                return status::LEAVE_FETCH | (k as u64) << 8;
            }
            self.jit_deadline = 0;
        }
        if s == status::NEXT {
            0
        } else {
            s | (k as u64) << 8
        }
    }

    /// A first-level TLB miss of an inline access of `bytes` bytes at `la`
    /// in `class` (`l1tlb`): translates it exactly as the interpreter's
    /// access would (the TLB lookup or walk, its cycles and counters, the
    /// first-level fill), so that the generated code can probe again and
    /// do the access itself; or says the instruction must run through the
    /// interpreter (nothing done yet), or that the access faults (the fault
    /// in `jit_fault`, as the instruction would take it: every inline form
    /// makes this one translation first).
    ///
    /// With [`jit::fill::NO_REMOVAL`] in `bytes`, only where the TLB holds
    /// an entry that allows the access (the lookup is a hit: no entry
    /// removed or inserted); otherwise the interpreter, nothing done.
    pub(crate) fn jit_fill(&mut self, mem: &PhysMemory, la: u64, class: usize, bytes: u64) -> u64 {
        use crate::mmu::AccessKind;
        self.jit_loop_recheck = 1;
        self.jit_stats.rust_fills += 1;
        let kind = match class / 2 {
            0 => AccessKind::Read,
            1 => AccessKind::Write,
            _ => return jit::fill::FULL,
        };
        let no_removal = bytes & u64::from(jit::fill::NO_REMOVAL) != 0;
        let bytes = bytes & !u64::from(jit::fill::NO_REMOVAL);
        // Crossing accesses translate both pages, and a non-canonical
        // address is #GP or #SS by form: the interpreter's business.
        if (la & 0xfff) + bytes > 0x1000 || !crate::addr::is_canonical(la) {
            return jit::fill::FULL;
        }
        let user = class & 1 == 1;
        if no_removal {
            // The key cached as the interpreter's translation of the
            // access caches it (should this leave it the instruction, it
            // finds it cached: the same state).
            if self.l1.key(class).is_none() && !self.cache_lookup_key(class, kind, user) {
                return jit::fill::FULL;
            }
            let usable = self
                .l1
                .key(class)
                .is_some_and(|key| self.tlb.holds_usable(key, crate::addr::Gva(la)));
            if !usable {
                return jit::fill::FULL;
            }
        }
        match self.translate_for_jit(mem, la, bytes, class, kind, user) {
            Ok(Some(hpa)) if kind == AccessKind::Read || !mem.is_code(hpa) => jit::fill::RETRY,
            Ok(_) => jit::fill::FULL,
            Err(f) => {
                self.jit_fault = Some(f);
                jit::fill::FAULT
            }
        }
    }
}
