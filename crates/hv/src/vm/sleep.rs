//! ACPI S3 (suspend to RAM) for the platforms that offer it (multiboot
//! kernels: `devices::acpi`'s fixed-hardware model). The guest's write of
//! SLP_EN with S3's SLP_TYP to PM1a_CNT puts the machine to sleep at the
//! writing vCPU's clock: every vCPU stops as after INIT (memory is kept;
//! the CPU state is lost, as power to the package is). When the enabled
//! wake event comes (the RTC alarm with RTC_EN:
//! `devices::Platform::suspend`), the boot vCPU resumes as firmware's
//! resume path hands over: in real mode at the FACS's firmware waking
//! vector (CS = vector >> 4, IP = vector & 0xf), WAK_STS set; the others
//! wait for INIT/SIPI. With no enabled wake event the machine sleeps for
//! good and the run ends as every vCPU halted.
//!
//! S3 is refused (the write does nothing, as on a machine that cannot
//! enter it) while the VM holds host resources on a vCPU's behalf: an
//! async page fault in flight or undelivered, a vCPU stalled on a
//! page-in, or a fast zap-all's teardown. The sleep itself is no state of
//! its own: the boot vCPU idles to the wake time, so snapshots need
//! nothing more than the devices' state.

use super::Vm;
use crate::devices::acpi::{FACS_GPA, FACS_WAKING_VECTOR};
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
        // A guest that cannot be read here (no RAM at the FACS) resumes
        // at 0, as firmware reading zeros would.
        let vector = self
            .shared
            .read_u32(Gpa(FACS_GPA + FACS_WAKING_VECTOR))
            .unwrap_or(0);
        let bsp = &mut self.vcpus[0];
        bsp.cpu.receive_startup(0);
        let state = bsp.cpu.state_mut();
        state.cs.selector = (vector >> 4) as u16;
        state.cs.base = u64::from(vector >> 4) << 4;
        state.rip = u64::from(vector & 0xf);
        if bsp.mmu_mode == MmuMode::Shadow {
            bsp.reset_shadow_paging();
        }
        self.shared.directory[0].started = true;
        bsp.idle_until(Cycles(wake).max(at));
        bsp.run = RunState::Runnable;
        true
    }
}
