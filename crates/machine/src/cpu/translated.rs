//! The run loop's side of the translator (`crate::jit`): when a block is
//! translated, running it, and turning how it stopped into exactly what the
//! interpreter's loop would have done.

use super::code_cache::Block;
use super::{fast, Cpu, Step};
use crate::jit::native::Translation;
use crate::jit::{self, status, ChainEntry, Engine, Offsets};
use crate::memory::PhysMemory;
use std::rc::Rc;

/// Whole runs of a block before it is translated, by default: code run
/// once (boot code) is not worth translating.
pub(super) const TRANSLATE_AFTER_RUNS: u32 = 2;

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
    /// when events must be looked at after it), translated on their second
    /// whole run.
    #[inline(always)]
    pub(super) fn translation<'b>(
        &mut self,
        block: &'b Block,
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
        let runs = block.runs.get() + 1;
        block.runs.set(runs);
        if runs < self.jit_threshold {
            return None;
        }
        let offsets = self.jit_offsets();
        let translation =
            match jit::translate(block, offsets, jit::native::call_out_address(), user) {
                Ok((code, chain_offset)) => {
                    let t = self.jit_arena.install(&code, chain_offset, user);
                    match &t {
                        Some(_) => {
                            self.jit_stats.blocks_translated += 1;
                            self.jit_stats.code_bytes += code.len() as u64;
                        }
                        None => self.jit_stats.blocks_failed += 1,
                    }
                    t
                }
                Err(jit::NotTranslated::NothingNative) => {
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
        };
        if self.jit_chain[slot] != entry {
            self.jit_chain[slot] = entry;
            self.jit_chain_blocks[slot] = Some(block.clone());
        }
        let (mem_base, code_frames, code_generation) = mem.jit_view();
        let env = jit::native::Env {
            l1_slots: self.l1.slots_address(),
            mem_base,
            mem_size: mem.size(),
            code_frames,
            cycle_limit,
            chain: self.jit_chain.as_ptr(),
            code_generation,
        };
        self.jit_stop = false;
        self.jit_chained = 0;
        let r = t.run(self, mem, block, &env);
        // The block it stopped in: this one, or the last it chained to.
        let last = if self.jit_chained != 0 {
            self.jit_chain_blocks[jit::chain_slot(self.jit_chain_rip)].clone()
        } else {
            None
        };
        let block: &Block = last.as_deref().unwrap_or(block);
        let k = (r >> 8) as usize;
        let Some(op) = block.insns.get(k) else {
            // Cannot happen: the code only reports its own instructions.
            return (0, self.state.rip, Step::Continue);
        };
        match r & 0xff {
            status::LEAVE => (k + 1, self.next_rip, Step::Continue),
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

    /// Offsets of the state the generated code reads and writes, from the
    /// start of the `Cpu` (the same for every `Cpu`: one type, one layout).
    pub(crate) fn jit_offsets(&self) -> Offsets {
        let base = self as *const Cpu as usize;
        let off = |p: usize| (p - base) as i32;
        Offsets {
            gpr: off(self.state.gpr.as_ptr() as usize),
            rflags: off(&self.state.rflags as *const u64 as usize),
            next_rip: off(&self.next_rip as *const u64 as usize),
            tlb_epoch: off(self.tlb.epoch_address()),
            mode_epoch: off(&self.mode_epoch as *const u64 as usize),
            instructions: off(&self.stats.instructions as *const u64 as usize),
            cycles: off(&self.cycles as *const u64 as usize),
            next_timer_cycle: off(&self.next_timer_cycle as *const u64 as usize),
            check_events: off(&self.check_events as *const bool as usize),
            jit_stop: off(&self.jit_stop as *const bool as usize),
            jit_chained: off(&self.jit_chained as *const u64 as usize),
            jit_chain_rip: off(&self.jit_chain_rip as *const u64 as usize),
            instruction_cost: self.costs.instruction,
            multiply_cost: self.costs.multiply,
            divide_cost: self.costs.divide,
            locked_cost: self.costs.locked,
            fs_base: off(&self.state.fs.base as *const u64 as usize),
            gs_base: off(&self.state.gs.base as *const u64 as usize),
        }
    }

    /// Instruction `k` of `block`, run by the interpreter for translated
    /// code: the status word of [`jit::status`]. The flags are left exact
    /// in `state.rflags` (the generated code reads them from there).
    pub(crate) fn jit_call_out(&mut self, mem: &PhysMemory, block: &Block, k: usize) -> u64 {
        let Some(op) = block.insns.get(k) else {
            return status::NEXT_IP | (k as u64) << 8;
        };
        self.jit_stats.call_outs += 1;
        if let Some(p) = &mut self.jit_profile {
            p.count(op);
        }
        let mode_epoch = self.mode_epoch;
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
        // Anything the run loop must look at before the next block stops
        // chaining (what it looks at itself: events, STI/MOV-SS blocking,
        // activity, a store into code, an IPI, a mode or privilege change).
        if self.check_events
            || self.state.interruptibility != 0
            || self.state.activity != super::Activity::Active
            || self.code_written
            || self.pending_ipi.is_some()
            || self.mode_epoch != mode_epoch
        {
            self.jit_stop = true;
        }
        if s == status::NEXT {
            0
        } else {
            s | (k as u64) << 8
        }
    }
}
