//! The vCPU side of the paravirtual CR3 cache (`mmu/shadow/cr3_cache.rs`
//! has the table and the invariant): registration by hypercall, adding a
//! pair after a CR3-load exit, finding out at the next exit which cached
//! root the guest switched to, and dropping the entries (table and
//! CR3-target list) when the MMU changes under them.

use super::{Requests, Vcpu};
use crate::mmu::shadow::cache::CachedRoot;
use crate::mmu::shadow::cr3_cache::{self, Cr3Cache, Cr3Entry};
use crate::mmu::LoadedRoot;
use crate::shared::Shared;
use crate::time::Cycles;
use abi::errno;
use machine::mmu::paging::pte;
use machine::vmx::Eptp;
use machine::{Gpa, Hfn};

impl Vcpu {
    /// HC_CR3_CACHE_REGISTER: the guest's table at `gpa` (0: none).
    pub(super) fn register_cr3_cache(&mut self, shared: &mut Shared, gpa: u64) -> i64 {
        let Some(targets) = shared.cr3_cache else {
            return -errno::KVM_ENOSYS;
        };
        self.drop_cr3_cache(shared);
        self.shadow.cr3_cache = None;
        if gpa == 0 {
            return 0;
        }
        let size = std::mem::size_of::<abi::Cr3Cache>() as u64;
        if gpa % 8 != 0 || (gpa & 0xfff) + size > machine::addr::PAGE_SIZE {
            return -errno::EINVAL;
        }
        // Empty entries and the count; `wanted_cr3` is the guest's.
        let mut head = vec![0u8; cr3_cache::MAX_IDX_OFFSET as usize + 4];
        head[cr3_cache::MAX_IDX_OFFSET as usize..].copy_from_slice(&(targets as u32).to_le_bytes());
        if shared.write_guest(Gpa(gpa), &head).is_err() {
            return -errno::EFAULT;
        }
        self.shadow.cr3_cache = Some(Cr3Cache::new(Gpa(gpa), targets));
        targets as i64
    }

    /// The frame the machine's CR3 points at.
    fn machine_root_frame(&self) -> Hfn {
        Hfn((self.cpu.state().cr3 & pte::ADDR_MASK) >> 12)
    }

    /// At an exit (and before the sweep drops entries): if the guest
    /// switched to a cached root without exiting, the hv's view (guest
    /// CR3, loaded root, `prev_roots`) follows. A root the hv no longer
    /// knows (cannot happen while the invariant holds) is replaced by a
    /// reload of the CR3 the guest said it wanted.
    pub(crate) fn cr3_cache_resync(&mut self, shared: &mut Shared) {
        let frame = self.machine_root_frame();
        let Some(cache) = self.shadow.cr3_cache.as_mut() else {
            return;
        };
        if self.root.is_some_and(|r| r.eptp.pml4() == frame.addr()) {
            return;
        }
        let generation = shared.host.mmu.generation();
        match cache.by_frame(frame) {
            Some(entry) => {
                self.stats.cr3_cache.switches_seen += 1;
                if let Some(old) = self.root {
                    if let Some(context) = self.shadow.loaded_context {
                        self.shadow.remember(CachedRoot {
                            cr3: self.shadow.loaded_cr3,
                            context,
                            id: old.id,
                        });
                    }
                }
                self.shadow.guest_cr3 = entry.root.cr3;
                self.shadow.loaded_cr3 = entry.root.cr3;
                self.shadow.loaded_context = Some(entry.root.context);
                self.root = Some(LoadedRoot {
                    id: entry.root.id,
                    eptp: Eptp::new(entry.frame.addr(), false),
                    generation: entry.generation.min(generation),
                });
            }
            None => {
                let table = cache.table;
                self.stats.cr3_cache.stale_loads += 1;
                if let Some(wanted) = read_wanted(shared, table) {
                    self.shadow.guest_cr3 = wanted;
                }
                self.requests.set(Requests::RELOAD_ROOT);
            }
        }
    }

    /// A MOV to CR3 exited with `value`: the guest CR3 it stands for. A
    /// marked value is an entry dropped while the guest looked it up; the
    /// guest's `wanted_cr3` says which CR3 it meant.
    pub(super) fn cr3_cache_guest_value(&mut self, shared: &mut Shared, value: u64) -> u64 {
        self.stats.cr3_cache.cr3_load_exits += 1;
        let Some(cache) = &self.shadow.cr3_cache else {
            return value;
        };
        if value & abi::CR3_CACHE_HOST_MARK == 0 {
            return value;
        }
        self.stats.cr3_cache.stale_loads += 1;
        read_wanted(shared, cache.table).unwrap_or(value)
    }

    /// After a CR3 load that exited and synced every page: the pair goes
    /// into the table and the target list (replacing the least recently
    /// used). Returns the hv's cost: one entry written to guest memory.
    pub(super) fn cr3_cache_add(&mut self, shared: &mut Shared) -> Cycles {
        let (Some(cache), Some(root), Some(context)) = (
            self.shadow.cr3_cache.as_mut(),
            self.root,
            self.shadow.loaded_context,
        ) else {
            return Cycles::ZERO;
        };
        let entry = Cr3Entry {
            root: CachedRoot {
                cr3: self.shadow.guest_cr3,
                context,
                id: root.id,
            },
            frame: Hfn(root.eptp.pml4().0 >> 12),
            generation: root.generation,
            last_used: 0,
        };
        let (slot, _) = cache.insert(entry);
        let table = cache.table;
        let targets = cache.targets();
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&entry.root.cr3.to_le_bytes());
        bytes[8..].copy_from_slice(&entry.host_cr3().to_le_bytes());
        let written = shared
            .write_guest(table.add(cr3_cache::entry_offset(slot)), &bytes)
            .is_ok();
        if !written {
            // The guest moved its table out of RAM: no cache.
            self.shadow.cr3_cache = None;
            self.set_cr3_targets(Vec::new());
            return Cycles::ZERO;
        }
        self.set_cr3_targets(targets);
        self.stats.cr3_cache.entries_added += 1;
        Cycles(2 * shared.host.costs.spte_write)
    }

    fn set_cr3_targets(&mut self, targets: Vec<u64>) {
        if let Some(v) = self.cpu.vmx_mut() {
            v.cr3_targets = targets;
        }
    }

    /// Takes every entry out of the target list and the guest's table
    /// (the hv's view first brought up to date, as the root the guest is
    /// on may be one of them).
    pub(crate) fn drop_cr3_cache(&mut self, shared: &mut Shared) {
        self.cr3_cache_resync(shared);
        let Some(cache) = self.shadow.cr3_cache.as_mut() else {
            return;
        };
        let slots: Vec<usize> = (0..cache.entries.len())
            .filter(|&i| cache.entries[i].is_some())
            .collect();
        let dropped = cache.clear();
        let table = cache.table;
        self.set_cr3_targets(Vec::new());
        self.stats.cr3_cache.entries_dropped += dropped;
        for slot in slots {
            // Failing to write means the table is no longer RAM; the
            // target list, which is what lets loads through, is empty.
            let _ = shared.write_guest(table.add(cr3_cache::entry_offset(slot)), &[0u8; 16]);
        }
    }

    /// Whether the vCPU has cached roots.
    pub(crate) fn has_cr3_entries(&self) -> bool {
        self.shadow
            .cr3_cache
            .as_ref()
            .is_some_and(|c| !c.is_empty())
    }

    /// The invariant's violations for this vCPU (none when it holds).
    pub(crate) fn cr3_cache_violations(&self, shared: &Shared) -> Vec<String> {
        let Some(cache) = &self.shadow.cr3_cache else {
            return Vec::new();
        };
        let host = &shared.host;
        let unsync = host.mmu.shadow_stats(&host.costs).unsync_pages;
        let mut bad = cache.violations(
            |id| host.mmu.shadow_root_exists(id, &host.costs),
            host.mmu.generation(),
            unsync,
            self.paging_context(),
        );
        let targets = self.cpu.vmx().map_or(Vec::new(), |v| v.cr3_targets.clone());
        if targets != cache.targets() {
            bad.push(format!(
                "CR3-target list {targets:x?} is not the cache's {:x?}",
                cache.targets()
            ));
        }
        bad.into_iter()
            .map(|b| format!("vcpu {}: {b}", self.id))
            .collect()
    }
}

/// What the guest stored as the CR3 it is switching to.
fn read_wanted(shared: &mut Shared, table: Gpa) -> Option<u64> {
    let mut buf = [0u8; 8];
    shared
        .read_guest(table.add(cr3_cache::WANTED_OFFSET), &mut buf)
        .ok()?;
    Some(u64::from_le_bytes(buf))
}
