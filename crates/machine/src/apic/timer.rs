//! The APIC timer, driven by the TSC.
//!
//! The timer is evaluated lazily: it keeps only the TSC value of its next
//! expiry, and the current count is computed from `now` on demand. One
//! timer tick is `divisor` TSC cycles, so a count of `n` armed at `t`
//! expires at `t + n * divisor`, and at any `now` before that the current
//! count is `ceil((expiry - now) / divisor)`, which equals
//! `n - floor((now - t) / divisor)`.

/// LVT timer bits 18:17.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(super) enum TimerMode {
    OneShot,
    Periodic,
    TscDeadline,
}

/// Position of the timer-mode field in the LVT timer register.
const LVT_TIMER_MODE_SHIFT: u32 = 17;
/// The timer-mode field of the LVT timer register.
pub(super) const LVT_TIMER_MODE_MASK: u32 = 0b11 << LVT_TIMER_MODE_SHIFT;

impl TimerMode {
    /// The mode encoded in an LVT timer value; `None` for the reserved
    /// encoding 11b.
    pub(super) fn from_lvt(lvt: u32) -> Option<Self> {
        match (lvt & LVT_TIMER_MODE_MASK) >> LVT_TIMER_MODE_SHIFT {
            0b00 => Some(TimerMode::OneShot),
            0b01 => Some(TimerMode::Periodic),
            0b10 => Some(TimerMode::TscDeadline),
            _ => None,
        }
    }

    /// This mode as LVT timer bits 18:17.
    pub(super) fn lvt_bits(self) -> u32 {
        let field = match self {
            TimerMode::OneShot => 0b00,
            TimerMode::Periodic => 0b01,
            TimerMode::TscDeadline => 0b10,
        };
        field << LVT_TIMER_MODE_SHIFT
    }
}

/// Divide configuration bits that exist (0, 1 and 3); the rest are reserved.
pub(super) const DIVIDE_CONFIG_BITS: u32 = 0b1011;

/// The divisor a divide-configuration value selects: bits 3,1:0 form a
/// 3-bit code where 000b..110b divide by 2..128 and 111b divides by 1.
pub(super) fn divisor(divide_config: u32) -> u64 {
    let code = ((divide_config >> 1) & 0b100) | (divide_config & 0b11);
    if code == 0b111 {
        1
    } else {
        2 << code
    }
}

/// Timer state: mode, the count registers and the armed expiry.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(super) struct Timer {
    mode: TimerMode,
    /// The initial-count register as last written (one-shot/periodic).
    initial_count: u32,
    /// The divide-configuration register (only bits 0, 1 and 3).
    divide_config: u32,
    /// TSC of the next expiry while armed. In TSC-deadline mode this is
    /// IA32_TSC_DEADLINE (never `Some(0)`: writing 0 disarms).
    expiry: Option<u64>,
}

impl Default for Timer {
    /// The reset state: one-shot, disarmed, divide by 2.
    fn default() -> Self {
        Timer {
            mode: TimerMode::OneShot,
            initial_count: 0,
            divide_config: 0,
            expiry: None,
        }
    }
}

impl Timer {
    pub(super) fn mode(&self) -> TimerMode {
        self.mode
    }

    /// A write of the LVT timer register selected `mode`. The SDM: "A write
    /// to the LVT Timer Register that changes the timer mode disarms the
    /// local APIC timer", which is what a switch to or from TSC-deadline
    /// mode does here (and the initial count is cleared, so a disarmed
    /// timer never reads as if a count were loaded). Between one-shot and
    /// periodic, KVM (`apic_update_lvtt`) and QEMU keep the initial count
    /// and the count running from where it is, and kvm-unit-tests' `apic`
    /// test requires it; so does this model.
    pub(super) fn set_mode(&mut self, mode: TimerMode) {
        if mode != self.mode {
            if mode == TimerMode::TscDeadline || self.mode == TimerMode::TscDeadline {
                self.initial_count = 0;
                self.expiry = None;
            }
            self.mode = mode;
        }
    }

    pub(super) fn initial_count(&self) -> u32 {
        self.initial_count
    }

    pub(super) fn divide_config(&self) -> u32 {
        self.divide_config
    }

    /// TSC of the next expiry, if armed. For a periodic timer that was not
    /// updated in time this can lie in the past (it then fires once, see
    /// [`Timer::fire_if_due`]).
    pub(super) fn expiry(&self) -> Option<u64> {
        self.expiry
    }

    /// Writes the initial-count register: a non-zero count arms the timer
    /// at `now`, zero stops it. Ignored in TSC-deadline mode (SDM).
    pub(super) fn write_initial_count(&mut self, count: u32, now: u64) {
        if self.mode == TimerMode::TscDeadline {
            return;
        }
        self.initial_count = count;
        self.expiry = (count != 0).then(|| now.saturating_add(self.ticks_to_tsc(count)));
    }

    /// Writes the divide configuration (reserved bits already rejected). A
    /// running count keeps its remaining ticks, which now last the new
    /// number of TSC cycles each; the partial tick in progress is dropped.
    pub(super) fn write_divide_config(&mut self, divide_config: u32, now: u64) {
        let remaining = self.current_count(now);
        self.divide_config = divide_config & DIVIDE_CONFIG_BITS;
        if remaining != 0 {
            self.expiry = Some(now.saturating_add(self.ticks_to_tsc(remaining)));
        }
    }

    /// IA32_TSC_DEADLINE as RDMSR sees it: 0 unless armed in TSC-deadline
    /// mode.
    pub(super) fn tsc_deadline(&self) -> u64 {
        match self.mode {
            TimerMode::TscDeadline => self.expiry.unwrap_or(0),
            TimerMode::OneShot | TimerMode::Periodic => 0,
        }
    }

    /// WRMSR IA32_TSC_DEADLINE: arms (or with 0 disarms) the timer in
    /// TSC-deadline mode; ignored in the other modes (SDM).
    pub(super) fn write_tsc_deadline(&mut self, deadline: u64) {
        if self.mode == TimerMode::TscDeadline {
            self.expiry = (deadline != 0).then_some(deadline);
        }
    }

    /// The current-count register at `now`: 0 in TSC-deadline mode, when
    /// disarmed and when a one-shot count has run out.
    pub(super) fn current_count(&self, now: u64) -> u32 {
        if self.mode == TimerMode::TscDeadline {
            return 0;
        }
        let Some(expiry) = self.expiry else {
            return 0;
        };
        let expiry = if expiry > now {
            expiry
        } else {
            match self.mode {
                // Not yet updated: the count has already reloaded.
                TimerMode::Periodic => self.next_periodic_expiry(expiry, now),
                TimerMode::OneShot | TimerMode::TscDeadline => return 0,
            }
        };
        let ticks = (expiry - now).div_ceil(self.divisor());
        // At most the initial count by construction.
        u32::try_from(ticks).unwrap_or(u32::MAX)
    }

    /// If the timer is armed and `now` has reached its expiry, disarms a
    /// one-shot or TSC-deadline timer, or re-arms a periodic one, and
    /// returns true (the caller raises the interrupt once).
    ///
    /// A periodic timer re-arms from its previous expiry, not from `now`,
    /// so late updates do not accumulate drift; if several periods passed
    /// it still fires once and moves to the first expiry after `now`.
    pub(super) fn fire_if_due(&mut self, now: u64) -> bool {
        let Some(expiry) = self.expiry else {
            return false;
        };
        if now < expiry {
            return false;
        }
        self.expiry = match self.mode {
            TimerMode::Periodic => Some(self.next_periodic_expiry(expiry, now)),
            TimerMode::OneShot | TimerMode::TscDeadline => None,
        };
        true
    }

    fn divisor(&self) -> u64 {
        divisor(self.divide_config)
    }

    fn ticks_to_tsc(&self, ticks: u32) -> u64 {
        // At most (2^32 - 1) * 128, far below u64::MAX.
        u64::from(ticks) * self.divisor()
    }

    /// The first expiry of the periodic lattice `expiry + k * period`
    /// (k >= 1) that lies after `now`, for `expiry <= now`.
    fn next_periodic_expiry(&self, expiry: u64, now: u64) -> u64 {
        // An armed periodic timer always has a non-zero count; max(1)
        // only keeps the division defined.
        let period = self.ticks_to_tsc(self.initial_count).max(1);
        let elapsed_periods = now.saturating_sub(expiry) / period;
        expiry.saturating_add(elapsed_periods.saturating_add(1).saturating_mul(period))
    }
}

impl Timer {
    /// Whether a restored timer holds only values a guest can produce
    /// (the divide configuration's reserved bits clear, no armed expiry in
    /// a mode that has none).
    pub(super) fn check_restored(&self) -> Result<(), String> {
        if self.divide_config & !DIVIDE_CONFIG_BITS != 0 {
            return Err(format!(
                "APIC timer divide configuration {:#x} has reserved bits",
                self.divide_config
            ));
        }
        if self.mode == TimerMode::TscDeadline && self.expiry == Some(0) {
            return Err("APIC TSC-deadline timer armed at 0".into());
        }
        Ok(())
    }
}
