//! kvmclock, KVM's paravirtual clock (`arch/x86/kvm/x86.c`
//! `kvm_guest_time_update`, `kvm_write_wall_clock`; the ABI is in `abi`).
//!
//! The guest's TSC is the machine's cycle counter plus the vCPU's TSC
//! offset, running at [`crate::CYCLES_PER_SECOND`] on every vCPU from the
//! same origin, so one scale serves the whole VM. It is not advertised
//! stable (no `PVCLOCK_TSC_STABLE_BIT`, no
//! `KVM_FEATURE_CLOCKSOURCE_STABLE_BIT`), as KVM does on a host whose TSCs
//! are not synchronised: vCPUs run guest code up to the lookahead apart
//! in virtual time (`vm/sched.rs`), so a reading one vCPU hands to
//! another through memory can be later than the other's clock. Linux
//! then keeps its readings monotonic across CPUs itself (pvclock's
//! `last_value`), and so does the bundled kernel. The time info says: at guest TSC
//! `tsc_timestamp` the VM had run `system_time` nanoseconds; it is written
//! when the guest enables it and again whenever the vCPU's TSC is written
//! (the offset moved), as KVM's `KVM_REQ_CLOCK_UPDATE` does. Everything
//! comes from virtual time, so a run's readings repeat exactly.
//!
//! As KVM, an address outside guest RAM is accepted and simply not
//! written (the guest reads nothing there).

use super::Vcpu;
use crate::error::VmError;
use crate::shared::Shared;
pub(crate) use crate::shared::WallClock;
use abi::{PvclockVcpuTimeInfo, PvclockWallClock};
use machine::Gpa;

/// Nanoseconds per second: the clock's unit.
const NSEC_PER_SEC: u64 = 1_000_000_000;

/// How the guest turns TSC ticks into nanoseconds:
/// `((delta shifted by shift) * mul) >> 32`, a negative shift shifting
/// right (pvclock's `pvclock_scale_delta`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TimeScale {
    pub mul: u32,
    pub shift: i8,
}

impl TimeScale {
    /// The scale from `base_hz` ticks to `scaled_hz` units, with `mul` in
    /// [2^31, 2^32) so the product keeps 31 significant bits (what KVM's
    /// `kvm_get_time_scale` finds).
    pub fn new(base_hz: u64, scaled_hz: u64) -> TimeScale {
        assert!(base_hz > 0 && scaled_hz > 0, "clock rates are positive");
        // mul / 2^32 * 2^shift = scaled / base; pick shift so that
        // mul = scaled * 2^(32 - shift) / base lands in [2^31, 2^32).
        // The ABI's shift is an i8 and KVM keeps it within [-32, 31]: a
        // ratio outside 2^-32..2^32 would not fit, and no clock has one.
        let mut shift: i32 = 0;
        while (-32..=31).contains(&shift) {
            let num = u128::from(scaled_hz) << (32 - shift);
            let mul = num / u128::from(base_hz);
            if mul >= 1 << 32 {
                shift += 1;
            } else if mul < 1 << 31 {
                shift -= 1;
            } else {
                return TimeScale {
                    mul: mul as u32,
                    shift: shift as i8,
                };
            }
        }
        panic!("a clock ratio of {scaled_hz}/{base_hz} has no pvclock scale")
    }

    /// `delta` ticks in the scaled unit.
    pub fn apply(self, delta: u64) -> u64 {
        let shifted = if self.shift < 0 {
            delta >> self.shift.unsigned_abs()
        } else {
            delta << self.shift
        };
        ((u128::from(shifted) * u128::from(self.mul)) >> 32) as u64
    }
}

/// The guest TSC's scale to nanoseconds.
fn tsc_scale() -> TimeScale {
    TimeScale::new(crate::CYCLES_PER_SECOND, NSEC_PER_SEC)
}

/// A vCPU's kvmclock state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct KvmClock {
    /// `MSR_KVM_SYSTEM_TIME_NEW` as last written.
    msr: u64,
    /// The time info's version (even: stable).
    version: u32,
}

impl KvmClock {
    fn enabled(self) -> bool {
        self.msr & abi::KVM_SYSTEM_TIME_ENABLE != 0
    }

    fn area(self) -> Gpa {
        Gpa(self.msr & !abi::KVM_SYSTEM_TIME_ENABLE)
    }
}

/// RDMSR of a kvmclock MSR (`None`: not one).
pub(super) fn rdmsr(vcpu: &Vcpu, shared: &Shared, index: u32) -> Option<u64> {
    match index {
        abi::MSR_KVM_SYSTEM_TIME_NEW => Some(vcpu.kvmclock.msr),
        abi::MSR_KVM_WALL_CLOCK_NEW => Some(shared.wall_clock.msr),
        _ => None,
    }
}

/// WRMSR of a kvmclock MSR (`None`: not one). KVM refuses none.
pub(super) fn wrmsr(
    vcpu: &mut Vcpu,
    shared: &mut Shared,
    index: u32,
    value: u64,
) -> Result<Option<bool>, VmError> {
    match index {
        abi::MSR_KVM_SYSTEM_TIME_NEW => {
            vcpu.kvmclock.msr = value;
            update_time_info(vcpu, shared)?;
        }
        abi::MSR_KVM_WALL_CLOCK_NEW => {
            let wall = &mut shared.wall_clock;
            wall.msr = value;
            wall.version = wall.version.wrapping_add(2);
            let info = PvclockWallClock {
                version: wall.version,
                sec: (wall.boot_ns / NSEC_PER_SEC) as u32,
                nsec: (wall.boot_ns % NSEC_PER_SEC) as u32,
            };
            let mut bytes = [0u8; 12];
            bytes[0..4].copy_from_slice(&info.version.to_le_bytes());
            bytes[4..8].copy_from_slice(&info.sec.to_le_bytes());
            bytes[8..12].copy_from_slice(&info.nsec.to_le_bytes());
            write_if_ram(vcpu, shared, Gpa(value), &bytes)?;
        }
        _ => return Ok(None),
    }
    Ok(Some(true))
}

/// Writes the vCPU's time info afresh if kvmclock is on (after enabling,
/// or when the guest moved its TSC).
pub(super) fn update_time_info(vcpu: &mut Vcpu, shared: &mut Shared) -> Result<(), VmError> {
    if !vcpu.kvmclock.enabled() {
        return Ok(());
    }
    let scale = tsc_scale();
    vcpu.kvmclock.version = vcpu.kvmclock.version.wrapping_add(2);
    let info = PvclockVcpuTimeInfo {
        version: vcpu.kvmclock.version,
        pad0: 0,
        tsc_timestamp: vcpu.cpu.tsc(),
        // The VM's own age at that instant, from the same cycle counter
        // the TSC counts.
        system_time: scale.apply(vcpu.cpu.cycles()),
        tsc_to_system_mul: scale.mul,
        tsc_shift: scale.shift,
        flags: 0,
        pad: [0; 2],
    };
    let mut bytes = [0u8; 32];
    bytes[0..4].copy_from_slice(&info.version.to_le_bytes());
    bytes[8..16].copy_from_slice(&info.tsc_timestamp.to_le_bytes());
    bytes[16..24].copy_from_slice(&info.system_time.to_le_bytes());
    bytes[24..28].copy_from_slice(&info.tsc_to_system_mul.to_le_bytes());
    bytes[28] = info.tsc_shift as u8;
    bytes[29] = info.flags;
    let area = vcpu.kvmclock.area();
    write_if_ram(vcpu, shared, area, &bytes)
}

/// Writes `bytes` at `gpa` if all of it is guest RAM; otherwise nothing.
fn write_if_ram(vcpu: &Vcpu, shared: &mut Shared, gpa: Gpa, bytes: &[u8]) -> Result<(), VmError> {
    let last = Gpa(gpa.0.wrapping_add(bytes.len() as u64 - 1));
    let in_ram = |g: Gpa| shared.host.slots.lookup(g.frame()).is_some();
    if last.0 < gpa.0 || !in_ram(gpa) || !in_ram(last) {
        return Ok(());
    }
    shared
        .write_guest(gpa, bytes)
        .map_err(|source| VmError::GuestMemory {
            vcpu: vcpu.id,
            rip: vcpu.rip(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scale_converts_3_ghz_ticks_to_nanoseconds() {
        let s = tsc_scale();
        assert!(s.mul >= 1 << 31, "{s:?}");
        // 3 GHz: a third of a nanosecond per tick.
        assert_eq!(s.shift, -1);
        for ticks in [0u64, 3, 3_000, 3_000_000_000, 3 * 3_600 * 1_000_000_000] {
            let ns = s.apply(ticks);
            let exact = ticks / 3;
            assert!(exact - ns <= 1 + exact / 1_000_000_000, "{ticks}: {ns}");
        }
    }

    #[test]
    fn scales_hold_their_precision_across_rates() {
        for (base, scaled) in [
            (1u64, 1u64),
            (1_000_000_000, 1_000_000_000),
            (2_500_000_000, NSEC_PER_SEC),
            (10_000_000, NSEC_PER_SEC),
            (3, 1),
        ] {
            let s = TimeScale::new(base, scaled);
            assert!(s.mul >= 1 << 31, "{base} {scaled}: {s:?}");
            let one_second = s.apply(base);
            let err = one_second.abs_diff(scaled);
            assert!(
                err <= 1 + scaled / (1 << 30),
                "{base} -> {scaled}: {one_second}"
            );
        }
    }
}
