//! Port I/O exits: the serial port (COM1) and the isa-debug-exit port.

use super::{Next, Vcpu};
use crate::vm::shared::Shared;
use crate::vm::StopReason;
use machine::vmx::IoDirection;

const COM1_LSR: u16 = abi::COM1_PORT + 5;
/// Transmitter empty and holding register empty: always ready.
const LSR_THRE_TEMT: u32 = 0x60;

impl Vcpu {
    pub(super) fn handle_io(
        &mut self,
        shared: &mut Shared,
        port: u16,
        size: u8,
        dir: IoDirection,
        value: u32,
    ) -> Next {
        match dir {
            IoDirection::Out => {
                self.cpu.skip_instruction();
                if port == abi::COM1_PORT {
                    shared.serial.push(value as u8);
                } else if port == abi::DEBUG_EXIT_PORT {
                    let mask = if size >= 4 {
                        u32::MAX
                    } else {
                        (1 << (size * 8)) - 1
                    };
                    let v = value & mask;
                    return Next::Stop(StopReason::DebugExit {
                        status: (v << 1) | 1,
                    });
                }
                // Other COM1 registers and other ports: writes are ignored.
            }
            IoDirection::In => {
                let result = match port {
                    COM1_LSR => LSR_THRE_TEMT,
                    p if (abi::COM1_PORT..abi::COM1_PORT + 8).contains(&p) => 0,
                    // Nothing attached: the bus floats high.
                    _ => u32::MAX,
                };
                self.cpu.complete_io_in(size, result);
            }
        }
        Next::Continue
    }
}
