//! Port I/O exits: dispatched to the platform's port bus
//! (`crate::devices`); the interrupts a device access raises go to the
//! local APICs the IOAPIC names.

use super::{Next, Vcpu};
use crate::devices::DeviceStop;
use crate::shared::StopReason;
use crate::shared::{CrossRequest, Shared};
use machine::vmx::IoDirection;

/// The sender of device interrupts in an IPI request: no APIC has this
/// id, so every destination (the sender's own included) gets it.
const NO_SENDER_APIC: u32 = u32::MAX - 1;

impl Vcpu {
    pub(super) fn handle_io(
        &mut self,
        shared: &mut Shared,
        port: u16,
        size: u8,
        dir: IoDirection,
        value: u32,
    ) -> Next {
        let stop = match dir {
            IoDirection::Out => {
                self.cpu.skip_instruction();
                shared.platform.pio_write(port, size, value)
            }
            IoDirection::In => {
                let result = shared.platform.pio_read(port, size);
                self.cpu.complete_io_in(size, result);
                None
            }
        };
        self.deliver_device_interrupts(shared);
        for line in shared.platform.take_reports() {
            shared.reports.push(crate::shared::Report {
                vcpu: self.id.0,
                cycles: self.cpu.cycles(),
                line,
            });
        }
        match stop {
            Some(DeviceStop::DebugExit { status }) => Next::Stop(StopReason::DebugExit { status }),
            Some(DeviceStop::PowerOff) => Next::Stop(StopReason::PowerOff),
            None => Next::Continue,
        }
    }

    /// The local APIC broadcast the EOI of a level-triggered `vector`:
    /// the IOAPIC clears Remote IRR of its pins with that vector and
    /// delivers again those whose line is still up.
    pub(super) fn eoi_broadcast(&mut self, shared: &mut Shared, vector: u8) {
        shared.platform.eoi_broadcast(vector);
        self.deliver_device_interrupts(shared);
    }

    /// Queues the interrupt messages the devices raised, stamped with this
    /// vCPU's clock (the access that raised them).
    pub(super) fn deliver_device_interrupts(&mut self, shared: &mut Shared) {
        shared.service_devices();
        self.pic_pending = shared.platform.pic_output() && self.cpu.apic().accepts_pic_interrupts();
        let at = self.clock();
        for ipi in shared.platform.take_interrupts() {
            shared.cross.push(CrossRequest::Ipi {
                sender_apic: NO_SENDER_APIC,
                ipi,
                at,
            });
        }
    }
}
