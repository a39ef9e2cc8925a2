//! Roots: the top of one EPT hierarchy, as objects.
//!
//! A vCPU does not own a root: at each VM entry it asks the MMU for a valid
//! root of the role it needs ([`super::Mmu::root_for_entry`]) unless the
//! one it entered with last time is still valid, and loads its EPTP. A root
//! made in an older MMU generation is obsolete: no vCPU picks it again,
//! and once none uses it its tables can be torn down (the zap-all by
//! generation of seed 003 builds on this). Under the shadow MMU a root is
//! keyed by the guest's CR3 as well; the CR3 cache keeps several.

use super::page::{PageHeader, PageHeaders, PageRole};
use crate::frames::{FrameAllocator, OutOfFrames};
use machine::vmx::Eptp;
use machine::{Gfn, Hfn, MemError, PhysMemory};

/// Identifier of a root (never reused within a VM).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct RootId(pub u32);

/// One root.
#[derive(Debug, Clone)]
pub(crate) struct Root {
    pub id: RootId,
    pub pml4: Hfn,
    pub role: PageRole,
    /// The MMU generation it was made in.
    pub generation: u64,
    /// vCPUs that entered with it most recently.
    pub users: u32,
}

impl Root {
    /// The EPT pointer, with A/D flags enabled or not (`--ept-ad`).
    pub fn eptp(&self, ad_enabled: bool) -> Eptp {
        Eptp::new(self.pml4.addr(), ad_enabled)
    }
}

/// Building a root failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RootError {
    #[error("allocating an EPT root: {0}")]
    OutOfFrames(#[from] OutOfFrames),
    #[error("EPT root outside host memory: {0:?}")]
    Memory(MemError),
}

/// The roots of a VM.
#[derive(Debug, Default)]
pub(crate) struct Roots {
    roots: Vec<Root>,
    next_id: u32,
}

impl Roots {
    /// A new empty root (one zeroed PML4) of `role` made in `generation`.
    pub fn create(
        &mut self,
        mem: &PhysMemory,
        frames: &mut FrameAllocator,
        headers: &mut PageHeaders,
        role: PageRole,
        generation: u64,
    ) -> Result<RootId, RootError> {
        let pml4 = frames.alloc()?;
        if let Err(e) = mem.zero(pml4.addr(), machine::addr::PAGE_SIZE) {
            frames.free(pml4);
            return Err(RootError::Memory(e));
        }
        let id = RootId(self.next_id);
        self.next_id += 1;
        headers.insert(
            pml4,
            PageHeader {
                role,
                gfn: Gfn(0),
                generation,
                parent: None,
                root: id,
            },
        );
        self.roots.push(Root {
            id,
            pml4,
            role,
            generation,
            users: 0,
        });
        Ok(id)
    }

    pub fn get(&self, id: RootId) -> Option<&Root> {
        self.roots.iter().find(|r| r.id == id)
    }

    pub fn get_mut(&mut self, id: RootId) -> Option<&mut Root> {
        self.roots.iter_mut().find(|r| r.id == id)
    }

    /// A root of `role` made in `generation` (a valid one).
    pub fn find_valid(&self, role: PageRole, generation: u64) -> Option<RootId> {
        self.roots
            .iter()
            .find(|r| r.role == role && r.generation == generation)
            .map(|r| r.id)
    }

    /// The root whose top table is `pml4`.
    pub fn by_table(&self, pml4: Hfn) -> Option<RootId> {
        self.roots.iter().find(|r| r.pml4 == pml4).map(|r| r.id)
    }

    /// Forgets a root whose top table is being freed (a vCPU that entered
    /// with it last reloads before it enters again).
    pub fn remove(&mut self, id: RootId) -> Option<Root> {
        let at = self.roots.iter().position(|r| r.id == id)?;
        Some(self.roots.remove(at))
    }

    /// Every root.
    pub fn iter(&self) -> impl Iterator<Item = &Root> {
        self.roots.iter()
    }
}
