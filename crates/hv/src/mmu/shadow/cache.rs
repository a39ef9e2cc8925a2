//! Shadow roots: one per (guest CR3, paging context), found in the page
//! hash like any shadow page (the root shadows the guest's PML4), and each
//! vCPU's `prev_roots` (KVM's `kvm_mmu_root_info prev_roots[]`): a small
//! LRU of the roots it used last, so a CR3 switch back to a recent address
//! space takes its root without `mmu_lock` or a lookup.

use super::pages::{Effects, ShadowError, Tables};
use super::role::{access, PagingContext, ShadowRole};
use super::ShadowStats;
use crate::mmu::page::{PageRole, ROOT_LEVEL};
use crate::mmu::root::RootId;
use machine::mmu::paging::pte;
use machine::{Gfn, Hfn};
use std::collections::VecDeque;

/// The role of the root for `context`: it shadows the guest's PML4, or,
/// with guest paging off, is the top of the direct gva = gpa mapping.
pub(crate) fn root_role(context: PagingContext) -> PageRole {
    PageRole {
        level: ROOT_LEVEL,
        direct: !context.paging,
        shadow: Some(ShadowRole {
            access: access::ALL,
            context,
        }),
    }
}

/// The gfn of the guest's PML4 in a CR3 value.
pub(crate) fn cr3_gfn(cr3: u64) -> Gfn {
    Gfn((cr3 & pte::ADDR_MASK) >> 12)
}

/// The root for guest `cr3` under `context`, made if there is none.
/// Returns it and whether it was made.
pub(crate) fn find_or_build_root(
    t: &mut Tables<'_>,
    stats: &mut ShadowStats,
    cr3: u64,
    context: PagingContext,
    fx: &mut Effects,
) -> Result<(RootId, Hfn), ShadowError> {
    // With paging off the guest's CR3 means nothing: one root per context.
    let gfn = if context.paging { cr3_gfn(cr3) } else { Gfn(0) };
    let role = root_role(context);
    if let Some(frame) = t.pages.find(gfn, role) {
        if let Some(id) = t.pages.get(frame).and_then(|p| p.root) {
            stats.roots_reused += 1;
            return Ok((id, frame));
        }
    }
    let id = t
        .roots
        .create(t.mem, t.frames, t.headers, role, t.generation)
        .map_err(|e| match e {
            crate::mmu::root::RootError::OutOfFrames(o) => ShadowError::OutOfFrames(o),
            crate::mmu::root::RootError::Memory(m) => ShadowError::Memory(m),
        })?;
    let frame = t.roots.get(id).expect("just made").pml4;
    fx.allocated += 1;
    t.create(gfn, role, Some((id, frame)), fx)?;
    stats.roots_built += 1;
    Ok((id, frame))
}

/// A root a vCPU used, remembered for a switch back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CachedRoot {
    pub cr3: u64,
    pub context: PagingContext,
    pub id: RootId,
}

/// A vCPU's shadow-paging state.
#[derive(Debug, Clone, Default)]
pub(crate) struct ShadowVcpu {
    /// The CR3 the guest loaded (the machine's CR3 is the shadow root).
    pub guest_cr3: u64,
    /// The guest CR3 and context of the root loaded now.
    pub loaded_cr3: u64,
    pub loaded_context: Option<PagingContext>,
    /// Most recent first, at most `capacity`.
    pub prev_roots: VecDeque<CachedRoot>,
    pub capacity: usize,
    /// A write to a tracked guest table being let through (one
    /// instruction under the monitor trap flag).
    pub pending_write: Option<PendingWrite>,
    /// The guest cleared EFER.NXE (the machine keeps it set).
    pub guest_nxe_off: bool,
    /// The fault being handed to the async-PF policy.
    pub faulting: Option<ShadowPrefault>,
    /// The paravirtual CR3 cache, once the guest registered one.
    pub cr3_cache: Option<super::cr3_cache::Cr3Cache>,
}

/// A guest write to a write-tracked table, let through for one
/// instruction: the spte made writable and the table's contents before.
#[derive(Debug, Clone)]
pub(crate) struct PendingWrite {
    pub gfn: Gfn,
    pub gva: machine::Gva,
    pub leaf: machine::Hpa,
    pub before: Box<[u8; 4096]>,
}

impl ShadowVcpu {
    /// Remembers the root being left.
    pub fn remember(&mut self, root: CachedRoot) {
        if self.capacity == 0 {
            return;
        }
        self.prev_roots.retain(|r| r.id != root.id);
        self.prev_roots.push_front(root);
        self.prev_roots.truncate(self.capacity);
    }

    /// Takes the cached root for (`cr3`, `context`), if any.
    pub fn take(&mut self, cr3: u64, context: PagingContext) -> Option<CachedRoot> {
        let gfn = cr3_gfn(cr3);
        let i = self
            .prev_roots
            .iter()
            .position(|r| cr3_gfn(r.cr3) == gfn && r.context == context)?;
        self.prev_roots.remove(i)
    }
}

/// The access an async fault began with under shadow paging: the page is
/// mapped for it when it arrives only if the guest's CR3 is still `cr3`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ShadowPrefault {
    pub cr3: u64,
    pub gva: machine::Gva,
    pub write: bool,
    pub user: bool,
}
