//! Translating on a host thread of its own, so that the vCPU thread
//! interprets a block while it is translated instead of waiting for it.
//!
//! What a translation is depends only on the block's instructions, the
//! `Cpu` layout ([`Offsets`]), the helpers' addresses and the privilege it
//! is made for, all copied into the request; the vCPU thread installs the
//! code and attaches it to the block when the answer has come (the block
//! still alive), so when a block starts to run translated changes nothing
//! but host time: the interpreter and translated code are the same machine
//! (`tests/jit.rs`, difftest). Host instruction counts of a run are then
//! not the same from run to run; `FAULTLINE_JIT_SYNC=1` translates on the
//! vCPU thread (callgrind measurements, `scripts/jit-profile.py`).
//!
//! One translator thread serves every `Cpu` of the process, each with
//! its own channel for the answers. Off by default (the library's tests
//! count what was translated when); `faultline` turns it on
//! ([`set_enabled`]).

use super::{Helpers, NotTranslated, Offsets};
use crate::cpu::code_cache::Block;
use crate::cpu::fast::Op;
use std::collections::HashMap;
use std::rc::{Rc, Weak};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Mutex, OnceLock};

/// Whether new translations are made on the translator thread.
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Translate on the translator thread from now on (`on`), unless the
/// environment variable `FAULTLINE_JIT_SYNC` is set (not empty); or on
/// the vCPU thread (`!on`).
pub fn set_enabled(on: bool) {
    let sync = std::env::var_os("FAULTLINE_JIT_SYNC").is_some_and(|v| !v.is_empty());
    ENABLED.store(on && !sync, Ordering::Relaxed);
}

/// Whether translations are made on the translator thread.
#[inline]
pub(crate) fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// A block to translate: what `jit::translate` reads of it.
struct Request {
    id: u64,
    rip: u64,
    hpa: u64,
    generation: u32,
    bits: u8,
    insns: Vec<Op>,
    offsets: Offsets,
    helpers: Helpers,
    user: bool,
    answer: Sender<Answer>,
}

/// A translation made, or why not.
pub(crate) struct Answer {
    id: u64,
    pub(crate) result: Result<(Vec<u8>, usize), NotTranslated>,
    pub(crate) user: bool,
}

/// The translator thread's queue (made with the thread, on first use).
fn requests() -> Option<&'static Mutex<Sender<Request>>> {
    static QUEUE: OnceLock<Option<Mutex<Sender<Request>>>> = OnceLock::new();
    QUEUE
        .get_or_init(|| {
            let (tx, rx) = channel::<Request>();
            std::thread::Builder::new()
                .name("faultline-jit".into())
                .spawn(move || serve(rx))
                .ok()
                .map(|_| Mutex::new(tx))
        })
        .as_ref()
}

/// The translator thread: translates until every sender is gone.
fn serve(rx: Receiver<Request>) {
    while let Ok(r) = rx.recv() {
        let block = Block {
            rip: r.rip,
            hpa: r.hpa,
            generation: r.generation,
            bits: r.bits,
            insns: r.insns,
            runs: Default::default(),
            jit: Default::default(),
        };
        let result = super::translate(&block, r.offsets, r.helpers, r.user);
        // The `Cpu` may be gone: then nobody wants it.
        let _ = r.answer.send(Answer {
            id: r.id,
            result,
            user: r.user,
        });
    }
}

/// One `Cpu`'s translations in flight.
pub(crate) struct Pending {
    answers: Receiver<Answer>,
    answer_to: Sender<Answer>,
    /// The blocks asked for, by request id (not kept alive by the wait).
    blocks: HashMap<u64, Weak<Block>>,
    next_id: u64,
}

impl Pending {
    pub(crate) fn new() -> Pending {
        let (answer_to, answers) = channel();
        Pending {
            answers,
            answer_to,
            blocks: HashMap::new(),
            next_id: 0,
        }
    }

    /// Asks for `block`'s translation; false if the translator thread
    /// cannot be had (the caller translates it itself).
    pub(crate) fn request(
        &mut self,
        block: &Rc<Block>,
        offsets: Offsets,
        helpers: Helpers,
        user: bool,
    ) -> bool {
        let Some(queue) = requests() else {
            return false;
        };
        let id = self.next_id;
        let r = Request {
            id,
            rip: block.rip,
            hpa: block.hpa,
            generation: block.generation,
            bits: block.bits,
            insns: block.insns.clone(),
            offsets,
            helpers,
            user,
            answer: self.answer_to.clone(),
        };
        let sent = match queue.lock() {
            Ok(q) => q.send(r).is_ok(),
            Err(_) => false,
        };
        if sent {
            self.next_id += 1;
            self.blocks.insert(id, Rc::downgrade(block));
        }
        sent
    }

    /// The next answer that has come for a block still alive, with it.
    pub(crate) fn next_answer(&mut self) -> Option<(Rc<Block>, Answer)> {
        while let Ok(a) = self.answers.try_recv() {
            if let Some(block) = self.blocks.remove(&a.id).and_then(|w| w.upgrade()) {
                return Some((block, a));
            }
        }
        None
    }
}
