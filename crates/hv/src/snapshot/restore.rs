//! Restoring a snapshot into a new VM, whole or with a post-copy's pages
//! still at the source.

use super::*;

impl Vm {
    /// A VM restored from `bytes` ([`Vm::snapshot`]'s output), ready to
    /// run on from the saved virtual time. Everything is checked; a bad
    /// snapshot is an error, never a panic.
    pub fn restore(bytes: &[u8], options: &RestoreOptions) -> Result<Vm, SnapshotError> {
        Vm::restore_with_remote(bytes, options, &[])
    }

    /// [`Vm::restore`], with the gfns `remote` (a post-copy's pages still
    /// at the source, increasing) left out of the EPT it rebuilds.
    pub(super) fn restore_with_remote(
        bytes: &[u8],
        options: &RestoreOptions,
        remote: &[u64],
    ) -> Result<Vm, SnapshotError> {
        let (state, memory) = decode_state(bytes)?;
        let config = state.config.to_config(options)?;
        let npages = config.mem_size / PAGE_SIZE;
        if state.vcpus.len() != config.vcpus as usize {
            return Err(SnapshotError::Invalid(format!(
                "{} vCPU states for {} vCPUs",
                state.vcpus.len(),
                config.vcpus
            )));
        }
        let pages = format::memory_pages(memory, npages)?;
        let mut vm = Vm::new(&config)?;
        vm.kernel = state
            .kernel
            .map(|(entry, start, end)| KernelImage { entry, start, end });
        vm.shared.time = Cycles(state.time);
        for (gfn, data) in pages {
            if options.lazy {
                let page: &[u8; PAGE_SIZE as usize] = data
                    .try_into()
                    .map_err(|_| SnapshotError::Invalid("a short page".into()))?;
                let shared = &mut vm.shared;
                shared
                    .pager
                    .place_in_swap(
                        &mut shared.host.slots,
                        crate::pager::PageRef {
                            slot: RAM_SLOT,
                            index: gfn,
                        },
                        page,
                    )
                    .map_err(|e| SnapshotError::Unsupported(format!("lazy restore: {e}")))?;
            } else {
                vm.shared.write_guest(Gpa(gfn * PAGE_SIZE), data)?;
            }
        }
        vm.carry_out_cross_requests();
        if !options.lazy {
            vm.restore_ept(&state.ept, remote)?;
        }
        vm.shared.wall_clock = WallClock {
            boot_ns: config.wall_clock_at_boot_ns,
            ..state.wall_clock
        };
        vm.shared
            .platform
            .restore(&state.platform)
            .map_err(SnapshotError::Invalid)?;
        for r in &state.reports {
            if r.vcpu >= config.vcpus {
                return Err(SnapshotError::Invalid(format!(
                    "a report from vCPU {}",
                    r.vcpu
                )));
            }
        }
        vm.shared.reports = state
            .reports
            .iter()
            .map(|r| Report {
                vcpu: r.vcpu as usize,
                cycles: r.cycles,
                line: r.line.clone(),
            })
            .collect();
        for (index, saved) in state.vcpus.iter().enumerate() {
            let vcpu = &mut vm.vcpus[index];
            vcpu.cpu
                .restore_snapshot(&saved.cpu)
                .map_err(|source| SnapshotError::Cpu {
                    vcpu: index,
                    source,
                })?;
            vcpu.kicked = saved.kicked;
            vcpu.nmi_pending = saved.nmi_pending;
            vcpu.wake_not_before = Cycles(saved.wake_not_before);
            vcpu.kvmclock = saved.kvmclock;
            vcpu.steal = saved.steal;
            vcpu.pv_eoi = saved.pv_eoi;
            vcpu.stats = saved.stats.clone();
            vcpu.xapic = saved.xapic;
            match (saved.shadow, vcpu.mmu_mode) {
                (Some((guest_cr3, nxe_off)), MmuMode::Shadow) => {
                    if guest_cr3 >> machine::mmu::paging::MAX_PHYS_ADDR_BITS != 0 {
                        return Err(SnapshotError::Invalid(format!(
                            "vCPU {index}: guest CR3 {guest_cr3:#x} has reserved bits"
                        )));
                    }
                    vcpu.shadow.guest_cr3 = guest_cr3;
                    vcpu.shadow.guest_nxe_off = nxe_off;
                }
                (None, MmuMode::Ept) => {}
                _ => {
                    return Err(SnapshotError::Invalid(format!(
                        "vCPU {index}: shadow-paging state does not match the MMU"
                    )))
                }
            }
            vcpu.requests.set(Requests::RELOAD_ROOT);
            if vcpu.mmu_mode == MmuMode::Ept {
                let eptp = vm.shared.host.mmu.current_eptp(&vm.shared.host.costs);
                let mut tlb = saved.tlb.clone();
                tlb.entries.retain_mut(|e| vm.repoint_tlb_entry(e, eptp));
                vm.vcpus[index]
                    .cpu
                    .load_tlb_image(&tlb, |_| true)
                    .map_err(|source| SnapshotError::Cpu {
                        vcpu: index,
                        source,
                    })?;
                // Paused in guest mode at the save, its EPTP was in the
                // VMCS: load its root now (untimed, as at boot), so the
                // first run resumes the pause as the unsaved run would.
                let vcpu = &mut vm.vcpus[index];
                if vcpu.cpu.is_paused() {
                    vcpu.process_requests(&mut vm.shared).map_err(|e| {
                        SnapshotError::Invalid(format!("vCPU {index}: loading its EPT root: {e}"))
                    })?;
                }
            } else {
                // Shadow paging rebuilds its shadow pages and their write
                // protection from nothing: no cached translation may
                // outlive them.
                vcpu.requests.set(Requests::TLB_FLUSH);
            }
            vm.shared.directory[index].started = saved.started;
            vm.restore_apf_state(index, &saved.apf, saved.apf_waiters)?;
            let vcpu = &mut vm.vcpus[index];
            vcpu.apf.stats = saved.apf_stats;
            match saved.run {
                RunSnap::WaitingForStart => vcpu.run = RunState::WaitingForStart,
                RunSnap::Runnable => vm.sched.set_runnable(vcpu),
                RunSnap::Halted => vm.sched.block(vcpu, RunState::Halted),
            }
        }
        match (&state.host_cpus, vm.sched.host_cpus()) {
            (Some(host), Some(_)) => {
                vm.sched
                    .set_host_cpu_state(host)
                    .map_err(SnapshotError::Invalid)?;
            }
            (None, None) => {}
            _ => {
                return Err(SnapshotError::Invalid(
                    "host CPU state does not match --host-cpus".into(),
                ))
            }
        }
        Ok(vm)
    }

    /// Points a saved TLB entry ([`saved_tlb`]) at this VM's frame for its
    /// page and at its root, or refuses it (`false`): a page not resident
    /// here (a lazy restore's, a post-copy's remote ones, one evicted by a
    /// smaller `--host-mem`) or, under EPT, not mapped, must fault as it
    /// would, not hit a cached translation.
    pub(super) fn repoint_tlb_entry(
        &self,
        entry: &mut machine::mmu::tlb::TlbImageEntry,
        eptp: Option<u64>,
    ) -> bool {
        let host = &self.shared.host;
        let gfn = entry.hpa().0 / PAGE_SIZE;
        let Some(slot) = host.slots.get(RAM_SLOT) else {
            return false;
        };
        if entry.size() != machine::mmu::PageSize::Size4K || !slot.contains(machine::Gfn(gfn)) {
            return false;
        }
        let crate::memslot::PageState::Resident(frame) = slot.state(machine::Gfn(gfn)) else {
            return false;
        };
        if entry.under_ept() {
            entry.eptp = match (entry.eptp, eptp) {
                (TLB_CURRENT_ROOT, Some(eptp)) => {
                    if host
                        .mmu
                        .leaf_spte(&host.mem, &host.costs, machine::Gfn(gfn))
                        .is_none()
                    {
                        return false;
                    }
                    eptp
                }
                (TLB_OLD_ROOT, _) => NO_ROOT_EPTP,
                _ => return false,
            };
        } else if entry.eptp != 0 {
            return false;
        }
        entry.set_hpa(frame.addr());
        true
    }

    /// Maps the saved EPT leaves `ept` again, for the pages resident here
    /// (a lazy restore's, a post-copy's still-`remote` and pages a smaller
    /// `--host-mem` evicted while loading fault in as they would have).
    /// Every entry is checked: gfns increasing inside RAM, the bits those
    /// of a present 4 KiB leaf the MMU could have made.
    pub(super) fn restore_ept(
        &mut self,
        ept: &[(u64, u64)],
        remote: &[u64],
    ) -> Result<(), SnapshotError> {
        use crate::mmu::spte;
        let npages = self.mem_size() / PAGE_SIZE;
        if !ept.is_empty() && self.shared.host.mmu.mode != MmuMode::Ept {
            return Err(SnapshotError::Invalid(
                "EPT mappings in a shadow-paging snapshot".into(),
            ));
        }
        let mut previous = None;
        for &(gfn, bits) in ept {
            let host = &mut self.shared.host;
            let invalid = |why: &str| {
                Err(SnapshotError::Invalid(format!(
                    "EPT leaf of gfn {gfn:#x} ({bits:#x}): {why}"
                )))
            };
            if gfn >= npages || previous.is_some_and(|p| p >= gfn) {
                return invalid("outside guest RAM or out of order");
            }
            previous = Some(gfn);
            if bits & spte::ADDR_MASK != 0 || bits & spte::HUGE != 0 {
                return invalid("address bits or a large page");
            }
            if !spte::is_present(bits)
                || bits & spte::READ == 0
                || !spte::writable_bits_consistent(bits)
            {
                return invalid("not a leaf the MMU makes");
            }
            let state = |host: &crate::host::Host| {
                host.slots
                    .get(RAM_SLOT)
                    .map(|slot| slot.state(machine::Gfn(gfn)))
            };
            if remote.binary_search(&gfn).is_ok() {
                continue;
            }
            if matches!(state(host), Some(crate::memslot::PageState::Untouched)) {
                // A page the guest touched that reads as zero (the memory
                // section leaves those out): touched again here, as it
                // was, rather than at the guest's cost.
                self.shared
                    .write_guest(Gpa(gfn * PAGE_SIZE), &[0; PAGE_SIZE as usize])?;
            }
            let host = &mut self.shared.host;
            let Some(crate::memslot::PageState::Resident(frame)) = state(host) else {
                continue;
            };
            host.mmu
                .restore_leaf(
                    &host.mem,
                    &mut host.frames,
                    machine::Gfn(gfn),
                    frame,
                    bits,
                    &host.costs,
                )
                .map_err(|e| SnapshotError::Unsupported(format!("rebuilding the EPT: {e}")))?;
        }
        Ok(())
    }

    /// A post-copy destination's VM: restored from `bytes` (its memory
    /// section holds the pages received before the switch-over), with the
    /// guest RAM pages `remote` (gfns, strictly increasing, none of them
    /// in the memory section) still at the source. Each is fetched from
    /// `source` at its first touch, through the swap-in path: the vCPU
    /// waits for it as `--apf` says (`docs/migration.md`, "Post-copy").
    pub fn restore_postcopy(
        bytes: &[u8],
        options: &RestoreOptions,
        remote: &[u64],
        source: Box<dyn crate::pager::PageSource>,
    ) -> Result<Vm, SnapshotError> {
        let mut vm = Vm::restore_with_remote(bytes, options, remote)?;
        let npages = vm.mem_size() / PAGE_SIZE;
        let mut previous = None;
        for &gfn in remote {
            if gfn >= npages || previous.is_some_and(|p| p >= gfn) {
                return Err(SnapshotError::Invalid(format!(
                    "remote page {gfn:#x}: outside the guest's {npages} pages or out of order"
                )));
            }
            previous = Some(gfn);
            let shared = &mut vm.shared;
            let untouched =
                shared.host.slots.get(RAM_SLOT).is_some_and(|s| {
                    matches!(s.state_at(gfn), crate::memslot::PageState::Untouched)
                });
            if !untouched {
                return Err(SnapshotError::Invalid(format!(
                    "page {gfn:#x} both received and still to come"
                )));
            }
            shared
                .pager
                .place_remote(
                    &mut shared.host.slots,
                    crate::pager::PageRef {
                        slot: RAM_SLOT,
                        index: gfn,
                    },
                )
                .map_err(|e| SnapshotError::Unsupported(format!("post-copy: {e}")))?;
        }
        vm.shared.pager.set_page_source(Some(source));
        Ok(vm)
    }

    /// Post-copy: guest pages still at the source, never touched here.
    pub fn remote_pages(&self) -> u64 {
        self.shared.pager.remote_pages()
    }
}
