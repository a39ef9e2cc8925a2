//! ACPI S3 (suspend to RAM) for the platforms that offer it (multiboot
//! kernels: `devices::acpi`'s fixed-hardware model). The guest's write of
//! SLP_EN with S3's SLP_TYP to PM1a_CNT puts the machine to sleep at the
//! writing vCPU's clock: every vCPU stops as after INIT (memory is kept;
//! the CPU state is lost, as power to the package is). When the enabled
//! wake event comes (the RTC alarm with RTC_EN:
//! `devices::Platform::suspend`), the boot vCPU resumes as firmware's
//! resume path hands over (ACPI 6.5, 5.2.10): at the FACS's
//! X_Firmware_Waking_Vector if the OS wrote one, in 32-bit protected mode
//! (flat 4 GiB segments, paging and interrupts off: the FACS offers no
//! 64-bit wake), else in real mode at its Firmware_Waking_Vector (CS =
//! vector >> 4, IP = vector & 0xf); WAK_STS is set. The others wait for
//! INIT/SIPI. With no enabled wake event the machine sleeps for
//! good and the run ends as every vCPU halted.
//!
//! S3 is refused (the write does nothing, as on a machine that cannot
//! enter it) while the VM holds host resources on a vCPU's behalf: an
//! async page fault in flight or undelivered, a vCPU stalled on a
//! page-in, or a fast zap-all's teardown. The sleep itself is no state of
//! its own: the boot vCPU idles to the wake time, so snapshots need
//! nothing more than the devices' state.

use super::Vm;
use crate::devices::acpi::{FACS_GPA, FACS_WAKING_VECTOR, FACS_X_WAKING_VECTOR};
use crate::mmu::MmuMode;
use crate::time::Cycles;
use crate::vcpu::RunState;
use machine::Gpa;

impl Vm {
    /// vCPU `index` asked for S3 (its exit is handled). Returns whether
    /// the machine slept.
    pub(super) fn suspend(&mut self, index: usize) -> bool {
        let busy = self.vcpus.iter().any(|v| {
            !v.apf.works.is_empty()
                || !v.apf.ready_queue.is_empty()
                || matches!(v.run, RunState::Stalled { .. })
        });
        if busy || self.teardown.is_some() {
            return false;
        }
        let at = self.vcpus[index].clock();
        let wake = self.shared.platform.suspend(at.0);
        for (i, vcpu) in self.vcpus.iter_mut().enumerate() {
            vcpu.cpu.receive_init();
            vcpu.nmi_pending = false;
            vcpu.parked_exit = None;
            if vcpu.mmu_mode == MmuMode::Shadow {
                vcpu.reset_shadow_paging();
            }
            // Drops its wake event.
            self.sched.set_runnable(vcpu);
            vcpu.run = RunState::WaitingForStart;
            self.shared.directory[i].started = false;
        }
        let Some(wake) = wake else {
            return true;
        };
        // A FACS that cannot be read (no RAM there) reads as zeros, as
        // firmware would find them.
        let mut facs = [0u8; 32];
        let _ = self.shared.read_guest(Gpa(FACS_GPA), &mut facs);
        let vector_at = FACS_WAKING_VECTOR as usize;
        let x_at = FACS_X_WAKING_VECTOR as usize;
        let vector = u32::from_le_bytes(facs[vector_at..vector_at + 4].try_into().expect("4"));
        let x_vector = u64::from_le_bytes(facs[x_at..x_at + 8].try_into().expect("8"));
        let bsp = &mut self.vcpus[0];
        bsp.cpu.receive_startup(0);
        let state = bsp.cpu.state_mut();
        if x_vector != 0 {
            enter_protected_mode(state, x_vector);
        } else {
            state.cs.selector = (vector >> 4) as u16;
            state.cs.base = u64::from(vector >> 4) << 4;
            state.rip = u64::from(vector & 0xf);
        }
        if bsp.mmu_mode == MmuMode::Shadow {
            bsp.reset_shadow_paging();
        }
        self.shared.directory[0].started = true;
        bsp.idle_until(Cycles(wake).max(at));
        bsp.run = RunState::Runnable;
        true
    }
}

/// 32-bit protected mode at `rip` with flat 4 GiB segments (code 0x08,
/// data 0x10), paging and interrupts off: the X_Firmware_Waking_Vector's
/// hand-over without 64BIT_WAKE_F.
fn enter_protected_mode(state: &mut machine::cpu::state::CpuState, rip: u64) {
    use machine::cpu::state::seg_attr;
    const CR0_PE: u64 = 1;
    state.cr0 |= CR0_PE;
    let code32 = seg_attr::TYPE_CODE_RX_ACCESSED
        | seg_attr::S
        | seg_attr::PRESENT
        | seg_attr::DB
        | seg_attr::GRANULARITY;
    super::load_flat_segments(state, (0x08, code32), 0x10);
    state.rip = rip;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::{acpi, rtc};
    use crate::image as boot;
    use crate::shared::StopReason;
    use crate::vcpu::VcpuId;
    use crate::vm::VmConfig;

    const CODE: u64 = 0x10_0000;
    const SECOND: u64 = crate::CYCLES_PER_SECOND;

    /// A VM with the multiboot platform's devices whose vCPU 0 writes
    /// SLP_EN with S3 to PM1a_CNT, then halts; the RTC alarm set to every
    /// second with AIE, RTC_EN as `rtc_en` says; the FACS's waking vector
    /// 0x8004, where real-mode code exits with status 11.
    fn sleeping_vm(vcpus: u32, rtc_en: bool) -> Vm {
        let mut vm = crate::vm::bare_vm(&VmConfig {
            vcpus,
            mem_size: 4 << 20,
            ..VmConfig::default()
        });
        // mov $0x2400, %ax; mov $0x614, %dx; out %ax, %dx; 1: hlt; jmp 1b
        let code = [
            0x66, 0xb8, 0x00, 0x24, 0x66, 0xba, 0x14, 0x06, 0x66, 0xef, 0xf4, 0xeb, 0xfd,
        ];
        vm.write_guest(Gpa(CODE), &code).unwrap();
        // mov $5, %al; out %al, $0xf4; hlt
        vm.write_guest(Gpa(0x8004), &[0xb0, 0x05, 0xe6, 0xf4, 0xf4])
            .unwrap();
        vm.write_guest(Gpa(FACS_GPA + FACS_WAKING_VECTOR), &0x8004u32.to_le_bytes())
            .unwrap();
        let platform = &mut vm.shared.platform;
        platform.attach_test_devices(crate::vm::DEFAULT_WALL_CLOCK_AT_BOOT_NS);
        for alarm in [1, 3, 5] {
            platform.pio_write(rtc::INDEX_PORT, 1, alarm);
            platform.pio_write(rtc::DATA_PORT, 1, u32::from(rtc::DONT_CARE));
        }
        platform.pio_write(rtc::INDEX_PORT, 1, u32::from(rtc::reg::B));
        platform.pio_write(rtc::DATA_PORT, 1, u32::from(rtc::b::HOUR_24 | rtc::b::AIE));
        if rtc_en {
            platform.pio_write(acpi::PM1A_EVT_PORT + 2, 2, u32::from(acpi::pm1::RTC));
        }
        vm.start_vcpu(VcpuId(0), CODE, boot::BOOT_STACK_TOP, 0);
        vm
    }

    #[test]
    fn the_rtc_alarm_wakes_the_boot_vcpu_at_the_waking_vector() {
        let mut vm = sleeping_vm(2, true);
        assert_eq!(vm.run(), StopReason::DebugExit { status: 11 });
        let bsp = vm.vcpus[0].cpu.state();
        assert_eq!((bsp.cs.selector, bsp.cs.base), (0x800, 0x8000));
        assert!((SECOND..SECOND + SECOND / 1000).contains(&vm.time().0));
        assert_eq!(vm.vcpus[1].run, RunState::WaitingForStart);
    }

    #[test]
    fn a_64_bit_waking_vector_resumes_in_32_bit_protected_mode() {
        let mut vm = sleeping_vm(1, true);
        // The same code at 0x20_0000 (it runs in either mode).
        vm.write_guest(Gpa(0x20_0000), &[0xb0, 0x05, 0xe6, 0xf4, 0xf4])
            .unwrap();
        vm.write_guest(
            Gpa(FACS_GPA + FACS_X_WAKING_VECTOR),
            &0x20_0000u64.to_le_bytes(),
        )
        .unwrap();
        assert_eq!(vm.run(), StopReason::DebugExit { status: 11 });
        let bsp = vm.vcpus[0].cpu.state();
        assert_eq!(bsp.cr0 & 0x8000_0001, 1, "PE, no paging");
        assert_eq!((bsp.cs.base, bsp.cs.limit), (0, u32::MAX));
        assert_ne!(bsp.cs.attr & machine::cpu::state::seg_attr::DB, 0);
        assert_eq!(bsp.rip, 0x20_0000 + 4, "after the out");
    }

    #[test]
    fn without_an_enabled_wake_event_the_machine_sleeps_for_good() {
        let mut vm = sleeping_vm(1, false);
        let reason = vm.run();
        assert!(
            matches!(
                reason,
                StopReason::Error(crate::error::VmError::AllHalted { .. })
            ),
            "{reason:?}"
        );
        assert_eq!(vm.vcpus[0].run, RunState::WaitingForStart);
    }

    #[test]
    fn s3_is_refused_while_a_vcpu_waits_for_a_page_in() {
        let mut vm = sleeping_vm(2, true);
        vm.vcpus[1].run = RunState::Stalled {
            until: Cycles(10 * SECOND),
            slot: crate::swap::SwapSlot(0),
        };
        // The write does nothing: vCPU 0 halts in its loop, the other
        // vCPU stays stalled until its (never finished) read.
        vm.run_until(Cycles(SECOND / 10));
        assert_eq!(vm.vcpus[0].run, RunState::Halted);
        assert_eq!(vm.vcpus[0].cpu.state().rip, CODE + 11);
    }
}
