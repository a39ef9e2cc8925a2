//! The MMU, split as KVM's `arch/x86/kvm/mmu`:
//! - [`spte`]: the entry layout, every bit documented and overlap-checked;
//! - [`tdp`]: the EPT (TDP) tables;
//! - [`rmap`]: host frame -> sptes, for zapping;
//! - [`fault`]: the EPT-violation handler (demand paging of guest RAM).
//!
//! `mmu_lock` is a real `std::sync::Mutex` around the tables and the rmap.
//! vCPUs run on one host thread today, so it is never contended on the
//! host; its acquisition is charged in virtual time (see `crate::cost`).

pub mod fault;
pub mod rmap;
pub mod spte;
pub mod tdp;

use machine::vmx::Eptp;
use machine::{Hfn, MemError, PhysMemory};
use std::sync::{Mutex, MutexGuard};

/// State protected by `mmu_lock`.
#[derive(Debug)]
pub struct MmuInner {
    pub root: tdp::TdpRoot,
    pub rmap: rmap::Rmap,
}

/// The VM's MMU.
#[derive(Debug)]
pub struct Mmu {
    mmu_lock: Mutex<MmuInner>,
    eptp: Eptp,
}

impl Mmu {
    /// An MMU with an empty EPT hierarchy (A/D flags enabled).
    pub fn new(root: tdp::TdpRoot) -> Self {
        let eptp = Eptp::new(root.pml4(), true);
        Mmu {
            mmu_lock: Mutex::new(MmuInner {
                root,
                rmap: rmap::Rmap::default(),
            }),
            eptp,
        }
    }

    /// The EPT pointer every vCPU uses.
    pub fn eptp(&self) -> Eptp {
        self.eptp
    }

    /// Takes `mmu_lock`. A poisoned lock (a panic while holding it) still
    /// yields the data: the tables are only ever changed by single atomic
    /// stores, so they are consistent at every point.
    pub fn lock(&self) -> MutexGuard<'_, MmuInner> {
        self.mmu_lock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Removes every spte mapping these frames and returns how many were
    /// cleared. The caller must INVEPT on every vCPU before the frames are
    /// reused.
    pub fn zap_frames(
        &self,
        mem: &PhysMemory,
        frames: impl IntoIterator<Item = Hfn>,
    ) -> Result<u64, MemError> {
        let mut inner = self.lock();
        let mut zapped = 0;
        for frame in frames {
            for at in inner.rmap.take(frame) {
                tdp::write_spte(mem, at, 0)?;
                zapped += 1;
            }
        }
        Ok(zapped)
    }
}
