//! The edu device behind the Intel VT-d unit (`guests/iommu.c`): PCI
//! configuration, DMA through translated IOVAs (into a page only the device
//! writes, which the dirty log must then hold), a DMA fault recorded in the
//! fault-recording register, and the device's interrupt as a remapped MSI
//! and through a remappable IOAPIC entry.

use hv::{DeviceSet, DirtyLogMode, MmuMode, StopReason, Vm, VmConfig, RAM_SLOT};

mod kv_lines;
use kv_lines::values;

const IOMMU: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/iommu.elf"));

fn config(mmu: MmuMode) -> VmConfig {
    VmConfig {
        vcpus: 1,
        mem_size: 16 << 20,
        mmu,
        devices: DeviceSet {
            edu: true,
            intel_iommu: true,
        },
        ..VmConfig::default()
    }
}

fn run(mmu: MmuMode) {
    let mut vm = Vm::boot(&config(mmu), IOMMU).expect("boot");
    vm.enable_dirty_log(RAM_SLOT, DirtyLogMode::Bitmap)
        .expect("dirty log");
    let reason = vm.run();
    let out = String::from_utf8_lossy(&vm.take_serial()).into_owned();
    assert_eq!(reason, StopReason::DebugExit { status: 1 }, "{out}");
    let v = values(&out);
    assert_eq!(v["host_bridge"], 0x29c0_8086, "{out}");
    assert_eq!(v["edu_ids"], 0x11e8_1234);
    assert_eq!(v["edu_bar"], 0xfe00_0000);
    assert_eq!(v["edu_line"], 16);
    assert_eq!(v["edu_id"], 0x0100_00ed);
    assert_eq!(v["vtd_version"], 0x10);
    // TES, RTPS, IRES, IRTPS.
    assert_eq!(v["vtd_status"], 0xc300_0000);
    assert_eq!(v["dma_word"], 0x1234_5678, "{out}");
    assert_eq!(v["fsts_before"], 0);
    // PPF; the write to IOVA 0x9010 from 00:03.0 with no page: reason 5.
    assert_eq!(v["fsts"], 2, "{out}");
    assert_eq!(v["fault_info"], 0x9000);
    assert_eq!(v["fault_hi"], (1 << 63) | (5 << 32) | 0x18);
    assert_eq!(v["msi_irqs"], 1, "{out}");
    assert_eq!(v["ioapic_irqs"], 1, "{out}");
    assert_eq!(v["msi_irqs_after"], 1);
    assert!(out.ends_with("bye\n"), "{out}");
    // The page only the device wrote is in the dirty log.
    let dirty = vm.get_dirty_log(RAM_SLOT).expect("dirty log").pages;
    assert!(
        dirty.contains(&(v["target_page"] >> 12)),
        "DMA target {:#x} not logged",
        v["target_page"]
    );
}

#[test]
fn translated_dma_and_remapped_interrupts_under_ept() {
    run(MmuMode::Ept);
}

#[test]
fn translated_dma_and_remapped_interrupts_under_shadow_paging() {
    run(MmuMode::Shadow);
}

#[test]
fn runs_repeat_exactly() {
    let cycles = |_| {
        let mut vm = Vm::boot(&config(MmuMode::Ept), IOMMU).expect("boot");
        vm.run();
        (vm.take_serial(), vm.stats().vcpus[0].cycles)
    };
    assert_eq!(cycles(0), cycles(1));
}

#[test]
fn a_vm_with_the_pci_devices_refuses_snapshots() {
    let mut vm = Vm::boot(&config(MmuMode::Ept), IOMMU).expect("boot");
    let err = vm.snapshot_state().expect_err("refused").to_string();
    assert!(err.contains("--device edu"), "{err}");
}
