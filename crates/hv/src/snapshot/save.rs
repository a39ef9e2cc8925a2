//! Taking a snapshot: what can be saved now, and the VM's state and
//! pages as the format holds them (`snapshot/mod.rs` says what is saved).

use super::*;

impl Vm {
    /// Why this VM cannot be saved now, if it cannot: state the format
    /// does not carry yet (shadow paging, `--mmu none`, the CR3 cache,
    /// dirty logging, memslots beyond RAM), or a VM that has stopped.
    pub(super) fn check_snapshottable(&self) -> Result<(), SnapshotError> {
        let unsupported = |what: &str| Err(SnapshotError::Unsupported(what.to_string()));
        if self.sched.stopped.is_some() {
            return unsupported("it has stopped");
        }
        if self.shared.host.mmu.mode == MmuMode::Native {
            return unsupported("--mmu none is not saved in snapshots");
        }
        if self.vcpus.iter().any(|v| v.shadow.pending_write.is_some()) {
            return unsupported("a vCPU is in the middle of a write to a tracked guest page table");
        }
        if self.shared.cr3_cache.is_some() {
            return unsupported("the CR3 cache is not saved");
        }
        let slots: Vec<_> = self.shared.host.slots.iter().collect();
        if slots.len() != 1 || slots[0].id != RAM_SLOT {
            return unsupported("memslots other than guest RAM are not saved");
        }
        if slots[0].dirty_log.is_some() {
            return unsupported("dirty logging is on");
        }
        if !self.shared.cross.is_empty() {
            return unsupported("cross-vCPU requests are pending (save between run slices)");
        }
        if self
            .vcpus
            .iter()
            .any(|v| v.ring_full || v.pml_page.is_some())
        {
            return unsupported("a vCPU logs dirty pages");
        }
        Ok(())
    }

    /// Saves the VM (between two `run_until` slices). Swapped-out pages
    /// are read back to be saved, so the pager's state changes as the
    /// VMM's reads of guest memory change it.
    pub fn snapshot(&mut self) -> Result<Vec<u8>, SnapshotError> {
        let state_bytes = self.snapshot_state()?;
        let pages = self.saved_pages()?;
        let memory = format::encode_memory(&pages);
        Ok(format::encode(&[
            (format::SectionKind::State, &state_bytes),
            (format::SectionKind::Memory, &memory),
        ]))
    }

    /// The gfns of guest RAM that were ever touched (resident or in the
    /// swap file): what a migration's first round sends.
    pub fn touched_pages(&self) -> Vec<u64> {
        let Some(slot) = self.shared.host.slots.get(RAM_SLOT) else {
            return Vec::new();
        };
        (0..slot.npages)
            .filter(|&i| !matches!(slot.state_at(i), crate::memslot::PageState::Untouched))
            .map(|i| slot.gfn_at(i).0)
            .collect()
    }

    /// The state section alone (everything but guest memory), for a
    /// migration that sends memory its own way.
    pub fn snapshot_state(&mut self) -> Result<Vec<u8>, SnapshotError> {
        self.settle();
        self.check_snapshottable()?;
        let platform = self
            .shared
            .platform
            .snapshot()
            .map_err(SnapshotError::Unsupported)?;
        let gfn_of = self.gfn_of_frame();
        let mut vcpus = Vec::with_capacity(self.vcpus.len());
        for (index, vcpu) in self.vcpus.iter_mut().enumerate() {
            let cpu = vcpu.cpu.snapshot().map_err(|source| SnapshotError::Cpu {
                vcpu: index,
                source,
            })?;
            let run = match vcpu.run {
                RunState::WaitingForStart => RunSnap::WaitingForStart,
                RunState::Halted => RunSnap::Halted,
                RunState::Runnable | RunState::Stalled { .. } | RunState::ApfHalted => {
                    RunSnap::Runnable
                }
            };
            vcpus.push(VcpuState {
                cpu,
                run,
                kicked: vcpu.kicked,
                nmi_pending: vcpu.nmi_pending,
                wake_not_before: vcpu.wake_not_before.0,
                started: self.shared.directory[index].started,
                apf: vcpu.apf.state,
                apf_waiters: !vcpu.apf.works.is_empty() || !vcpu.apf.ready_queue.is_empty(),
                apf_stats: vcpu.apf.stats,
                kvmclock: vcpu.kvmclock,
                steal: vcpu.steal,
                pv_eoi: vcpu.pv_eoi,
                stats: vcpu.stats.clone(),
                xapic: vcpu.xapic,
                shadow: (vcpu.mmu_mode == MmuMode::Shadow)
                    .then_some((vcpu.shadow.guest_cr3, vcpu.shadow.guest_nxe_off)),
                tlb: if vcpu.mmu_mode == MmuMode::Ept {
                    saved_tlb(vcpu.cpu.tlb().image(), vcpu.root.map(|r| r.eptp.0), &gfn_of)
                } else {
                    TlbImage::default()
                },
            });
        }
        let shared = &self.shared;
        let config = self.config_state();
        let state = VmState {
            config,
            time: shared.time.0,
            kernel: self.kernel.as_ref().map(|k| (k.entry, k.start, k.end)),
            wall_clock: shared.wall_clock,
            platform,
            reports: shared
                .reports
                .iter()
                .map(|r| ReportState {
                    vcpu: r.vcpu as u32,
                    cycles: r.cycles,
                    line: r.line.clone(),
                })
                .collect(),
            vcpus,
            host_cpus: self.sched.host_cpu_state(),
            ept: self.ept_leaves(),
        };
        options()
            .serialize(&state)
            .map_err(|e| SnapshotError::Unsupported(format!("encoding the state: {e}")))
    }

    /// Host frame → gfn, for the resident pages of guest RAM.
    pub(super) fn gfn_of_frame(&self) -> std::collections::HashMap<u64, u64> {
        let Some(slot) = self.shared.host.slots.get(RAM_SLOT) else {
            return Default::default();
        };
        (0..slot.npages)
            .filter_map(|i| match slot.state_at(i) {
                crate::memslot::PageState::Resident(frame) => Some((frame.0, slot.gfn_at(i).0)),
                _ => None,
            })
            .collect()
    }

    /// The RAM pages the EPT maps, with their leaf bits (empty under
    /// shadow paging, whose sptes a restore rebuilds from the guest's page
    /// tables as it refaults).
    pub(super) fn ept_leaves(&self) -> Vec<(u64, u64)> {
        let host = &self.shared.host;
        if host.mmu.mode != MmuMode::Ept {
            return Vec::new();
        }
        let Some(slot) = host.slots.get(RAM_SLOT) else {
            return Vec::new();
        };
        let resident = (0..slot.npages)
            .filter(|&i| matches!(slot.state_at(i), crate::memslot::PageState::Resident(_)))
            .map(|i| slot.gfn_at(i));
        host.mmu
            .leaf_bits(&host.mem, &host.costs, resident)
            .into_iter()
            .map(|(gfn, bits)| (gfn.0, bits))
            .collect()
    }

    /// The configuration the VM was built with, as saved.
    pub(super) fn config_state(&self) -> ConfigState {
        ConfigState::of(&self.config)
    }

    /// Every page of guest RAM that has been touched and does not read as
    /// zero, with its contents (swapped pages read back).
    pub(super) fn saved_pages(&mut self) -> Result<Vec<(u64, Vec<u8>)>, SnapshotError> {
        let npages = self.mem_size() / PAGE_SIZE;
        let mut pages = Vec::new();
        let mut buf = vec![0u8; PAGE_SIZE as usize];
        for gfn in 0..npages {
            let touched =
                self.shared.host.slots.get(RAM_SLOT).is_some_and(|s| {
                    !matches!(s.state_at(gfn), crate::memslot::PageState::Untouched)
                });
            if !touched {
                continue;
            }
            self.shared.read_guest(Gpa(gfn * PAGE_SIZE), &mut buf)?;
            if buf.iter().any(|&b| b != 0) {
                pages.push((gfn, buf.clone()));
            }
        }
        self.carry_out_cross_requests();
        Ok(pages)
    }
}
