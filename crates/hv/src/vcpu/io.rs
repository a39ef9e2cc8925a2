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

    /// Queues the interrupt messages the devices raised, stamped with this
    /// vCPU's clock (the access that raised them).
    pub(super) fn deliver_device_interrupts(&mut self, shared: &mut Shared) {
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
