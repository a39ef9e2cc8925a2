//! The MC146818 real-time clock and its CMOS RAM, at ports 0x70 (index)
//! and 0x71 (data), as a PC has it (multiboot kernels only).
//!
//! Its time is the VM's wall clock at boot plus virtual time (so runs
//! repeat), plus what the guest moved it by writing the time registers.
//! Everything is computed from virtual time when the guest looks:
//!
//! - the time registers (0, 2, 4, 6..9, the century at 0x32), in BCD or
//!   binary and 12- or 24-hour format as register B says;
//! - register A's UIP (bit 7): set for the 244 µs before each update (the
//!   second boundary), as the part's datasheet gives;
//! - register C's flags: UF at each update, AF at an update whose time
//!   matches the alarm registers (1, 3, 5; a value 0xc0..0xff is "don't
//!   care"), PF at the periodic rate register A's RS bits select; IRQF when
//!   a flag is set whose enable (PIE, AIE, UIE in register B) is; reading
//!   register C returns and clears them;
//! - register B's SET stops updates (the time registers hold still for
//!   the guest to write), as does a divider (register A's DV) other than
//!   the 32.768 kHz time base.
//!
//! The RTC raises no IRQ 8: the platform has no device timers that fire
//! in virtual time by themselves, so a guest polls register C. Its alarm
//! is an ACPI wake event ([`Rtc::next_alarm`]) that ends S3.

/// The index register (bit 7: NMI disable, ignored).
pub const INDEX_PORT: u16 = 0x70;
/// The data register.
pub const DATA_PORT: u16 = 0x71;
/// CMOS RAM size (the clock's 14 registers included).
const RAM_SIZE: usize = 128;
/// The century register (the FADT's CENTURY field names it).
pub const CENTURY: u8 = 0x32;

/// Register indices.
pub mod reg {
    pub const SECONDS: u8 = 0;
    pub const SECONDS_ALARM: u8 = 1;
    pub const MINUTES: u8 = 2;
    pub const MINUTES_ALARM: u8 = 3;
    pub const HOURS: u8 = 4;
    pub const HOURS_ALARM: u8 = 5;
    pub const DAY_OF_WEEK: u8 = 6;
    pub const DAY_OF_MONTH: u8 = 7;
    pub const MONTH: u8 = 8;
    pub const YEAR: u8 = 9;
    pub const A: u8 = 10;
    pub const B: u8 = 11;
    pub const C: u8 = 12;
    pub const D: u8 = 13;
}

/// Register A.
pub mod a {
    pub const UIP: u8 = 0x80;
    /// Divider bits (6..4): 0b010 is the 32.768 kHz time base.
    pub const DV_MASK: u8 = 0x70;
    pub const DV_NORMAL: u8 = 0x20;
    pub const RS_MASK: u8 = 0x0f;
}

/// Register B.
pub mod b {
    pub const SET: u8 = 0x80;
    pub const PIE: u8 = 0x40;
    pub const AIE: u8 = 0x20;
    pub const UIE: u8 = 0x10;
    /// Binary (not BCD) data mode.
    pub const DM: u8 = 0x04;
    /// 24-hour mode.
    pub const HOUR_24: u8 = 0x02;
}

/// Register C.
pub mod c {
    pub const IRQF: u8 = 0x80;
    pub const PF: u8 = 0x40;
    pub const AF: u8 = 0x20;
    pub const UF: u8 = 0x10;
}

/// An alarm register value that matches any time.
pub const DONT_CARE: u8 = 0xc0;
/// How long before an update UIP is set (the datasheet's 244 µs).
pub const UIP_NS: u64 = 244_000;
/// The PM bit of the hours register in 12-hour mode.
const PM: u8 = 0x80;

const NS_PER_S: u64 = 1_000_000_000;
const SECONDS_PER_DAY: i64 = 86_400;

/// The clock and its RAM.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Rtc {
    index: u8,
    ram: Vec<u8>,
    /// Wall time (ns since the Unix epoch) at virtual time 0, moved by
    /// the guest's writes of the time.
    base_ns: i128,
    /// While SET (or a stopped divider) holds updates: the time held, in
    /// seconds since the epoch.
    held: Option<i64>,
    /// Virtual time (ns) up to which register C's flags are accounted.
    flags_at: u64,
    /// An alarm interrupt happened (AF with AIE) since the ACPI status
    /// last looked ([`Rtc::take_alarm_event`]).
    alarm_event: bool,
}

impl Rtc {
    /// A clock reading `wall_clock_at_boot_ns` at virtual time 0; register
    /// A as firmware leaves it (32.768 kHz base, 1024 Hz periodic rate),
    /// register B in 24-hour BCD mode, the valid-RAM bit of register D.
    pub fn new(wall_clock_at_boot_ns: u64) -> Rtc {
        let mut ram = vec![0u8; RAM_SIZE];
        ram[usize::from(reg::A)] = a::DV_NORMAL | 0x6;
        ram[usize::from(reg::B)] = b::HOUR_24;
        ram[usize::from(reg::D)] = 0x80;
        Rtc {
            index: 0,
            ram,
            base_ns: i128::from(wall_clock_at_boot_ns),
            held: None,
            flags_at: 0,
            alarm_event: false,
        }
    }

    fn b(&self) -> u8 {
        self.ram[usize::from(reg::B)]
    }

    fn running(&self) -> bool {
        self.held.is_none()
    }

    /// The wall time (ns since the epoch) at virtual time `now` (ns).
    fn wall_ns(&self, now: u64) -> i128 {
        self.base_ns + i128::from(now)
    }

    /// The time the clock shows at `now`, in seconds since the epoch.
    fn seconds(&self, now: u64) -> i64 {
        match self.held {
            Some(s) => s,
            None => self.wall_ns(now).div_euclid(i128::from(NS_PER_S)) as i64,
        }
    }

    /// Whether updates run: SET clear and the divider at its time base.
    fn updates_enabled(&self) -> bool {
        self.b() & b::SET == 0 && self.ram[usize::from(reg::A)] & a::DV_MASK == a::DV_NORMAL
    }

    /// Stops or restarts the clock as SET and the divider now say; a
    /// restart puts the next update one second later, as the part does.
    fn sync_running(&mut self, now: u64) {
        match (self.updates_enabled(), self.held) {
            (false, None) => {
                self.account(now);
                self.held = Some(self.seconds(now));
            }
            (true, Some(held)) => {
                self.base_ns = i128::from(held) * i128::from(NS_PER_S) - i128::from(now);
                self.held = None;
                self.flags_at = now;
            }
            _ => {}
        }
    }

    /// An `in` from `port` at virtual time `now` (ns).
    pub fn read(&mut self, port: u16, now: u64) -> u8 {
        if port == INDEX_PORT {
            // The index register is write-only: the bus floats high.
            return 0xff;
        }
        self.account(now);
        match self.index {
            reg::SECONDS
            | reg::MINUTES
            | reg::HOURS
            | reg::DAY_OF_WEEK
            | reg::DAY_OF_MONTH
            | reg::MONTH
            | reg::YEAR
            | CENTURY => self.time_register(self.index, now),
            reg::A => {
                let uip = if self.update_in_progress(now) {
                    a::UIP
                } else {
                    0
                };
                self.ram[usize::from(reg::A)] & !a::UIP | uip
            }
            reg::C => {
                let value = self.ram[usize::from(reg::C)];
                self.ram[usize::from(reg::C)] = 0;
                value
            }
            index => self.ram[usize::from(index)],
        }
    }

    /// An `out` of `value` to `port` at virtual time `now` (ns).
    pub fn write(&mut self, port: u16, value: u8, now: u64) {
        if port == INDEX_PORT {
            self.index = value & 0x7f;
            return;
        }
        self.account(now);
        match self.index {
            reg::SECONDS
            | reg::MINUTES
            | reg::HOURS
            | reg::DAY_OF_MONTH
            | reg::MONTH
            | reg::YEAR
            | CENTURY => self.set_time_register(self.index, value, now),
            reg::A => {
                self.ram[usize::from(reg::A)] = value & !a::UIP;
                self.sync_running(now);
            }
            reg::B => {
                // SET clears UIE (the datasheet).
                let value = if value & b::SET != 0 {
                    value & !b::UIE
                } else {
                    value
                };
                self.ram[usize::from(reg::B)] = value;
                self.sync_running(now);
                self.update_irqf();
            }
            // C and D are read-only.
            reg::C | reg::D => {}
            index => self.ram[usize::from(index)] = value,
        }
    }

    /// Whether UIP reads as set at `now`.
    fn update_in_progress(&self, now: u64) -> bool {
        self.running()
            && self.wall_ns(now).rem_euclid(i128::from(NS_PER_S)) >= i128::from(NS_PER_S - UIP_NS)
    }

    /// Sets register C's flags for what happened in (flags_at, now].
    fn account(&mut self, now: u64) {
        if now <= self.flags_at {
            return;
        }
        let from = self.flags_at;
        self.flags_at = now;
        if let Some(period) = self.periodic_units() {
            // Ticks counted in units of 1/32768 ns to stay exact.
            let tick = |t: u64| u128::from(t) * 32_768 / period;
            if tick(now) > tick(from) {
                self.ram[usize::from(reg::C)] |= c::PF;
            }
        }
        if self.running() {
            let first = self.seconds(from) + 1;
            let last = self.seconds(now);
            if last >= first {
                self.ram[usize::from(reg::C)] |= c::UF;
                // Every time of day comes round within a day.
                let start = first.max(last - SECONDS_PER_DAY);
                if (start..=last).rev().any(|s| self.alarm_matches(s)) {
                    self.ram[usize::from(reg::C)] |= c::AF;
                    if self.b() & b::AIE != 0 {
                        self.alarm_event = true;
                    }
                }
            }
        }
        self.update_irqf();
    }

    fn update_irqf(&mut self) {
        let flags = self.ram[usize::from(reg::C)];
        let enabled = self.b() & (b::PIE | b::AIE | b::UIE);
        let irqf = if flags & enabled & (c::PF | c::AF | c::UF) != 0 {
            c::IRQF
        } else {
            0
        };
        self.ram[usize::from(reg::C)] = flags & !c::IRQF | irqf;
    }

    /// The periodic interrupt's period in ns × 32768 (`None`: RS = 0).
    fn periodic_units(&self) -> Option<u128> {
        let rs = u32::from(self.ram[usize::from(reg::A)] & a::RS_MASK);
        // RS 1 and 2 repeat the rates of 8 and 9 (256 and 128 Hz).
        let shift = match rs {
            0 => return None,
            1 | 2 => rs + 6,
            _ => rs - 1,
        };
        Some(u128::from(NS_PER_S) << shift)
    }

    /// Whether the alarm registers match the time `seconds` (since the
    /// epoch), compared in the format register B gives.
    fn alarm_matches(&self, seconds: i64) -> bool {
        [
            (reg::SECONDS_ALARM, reg::SECONDS),
            (reg::MINUTES_ALARM, reg::MINUTES),
            (reg::HOURS_ALARM, reg::HOURS),
        ]
        .iter()
        .all(|&(alarm, field)| {
            let want = self.ram[usize::from(alarm)];
            want & DONT_CARE == DONT_CARE || want == self.encode(field, seconds)
        })
    }

    /// The next virtual time (ns) after `now` at which the alarm fires
    /// with its interrupt enabled (AIE): a wake event. `None` if it never
    /// does (AIE clear, updates stopped, or no time of day matches).
    pub fn next_alarm(&self, now: u64) -> Option<u64> {
        if self.b() & b::AIE == 0 || !self.running() {
            return None;
        }
        let now_s = self.seconds(now);
        let s = (now_s + 1..=now_s + SECONDS_PER_DAY).find(|&s| self.alarm_matches(s))?;
        let at = i128::from(s) * i128::from(NS_PER_S) - self.base_ns;
        u64::try_from(at).ok()
    }

    /// Whether an alarm interrupt happened since the last call (up to
    /// `now`): the ACPI RTC_STS event.
    pub fn take_alarm_event(&mut self, now: u64) -> bool {
        self.account(now);
        std::mem::take(&mut self.alarm_event)
    }

    /// The value of time register `index` for `seconds`, in the format
    /// register B selects.
    fn encode(&self, index: u8, seconds: i64) -> u8 {
        let days = seconds.div_euclid(SECONDS_PER_DAY);
        let in_day = seconds.rem_euclid(SECONDS_PER_DAY);
        let (year, month, day) = civil_from_days(days);
        let value = match index {
            reg::SECONDS => in_day % 60,
            reg::MINUTES => in_day / 60 % 60,
            reg::HOURS => in_day / 3600,
            // 1 = Sunday; 1970-01-01 was a Thursday.
            reg::DAY_OF_WEEK => (days + 4).rem_euclid(7) + 1,
            reg::DAY_OF_MONTH => day,
            reg::MONTH => month,
            reg::YEAR => year.rem_euclid(100),
            _ => year.div_euclid(100),
        } as u8;
        let binary = self.b() & b::DM != 0;
        let to_format = |v: u8| if binary { v } else { to_bcd(v) };
        if index == reg::HOURS && self.b() & b::HOUR_24 == 0 {
            let pm = if value >= 12 { PM } else { 0 };
            let hour12 = match value % 12 {
                0 => 12,
                h => h,
            };
            return to_format(hour12) | pm;
        }
        to_format(value)
    }

    fn time_register(&self, index: u8, now: u64) -> u8 {
        self.encode(index, self.seconds(now))
    }

    /// A write of time register `index`: the clock moves to the time with
    /// that field replaced (day of week aside, which follows the date).
    fn set_time_register(&mut self, index: u8, value: u8, now: u64) {
        let binary = self.b() & b::DM != 0;
        let from_format = |v: u8| i64::from(if binary { v } else { from_bcd(v) });
        let field = if index == reg::HOURS && self.b() & b::HOUR_24 == 0 {
            let hour = from_format(value & !PM) % 12;
            hour + if value & PM != 0 { 12 } else { 0 }
        } else {
            from_format(value)
        };
        let current = self.seconds(now);
        let days = current.div_euclid(SECONDS_PER_DAY);
        let in_day = current.rem_euclid(SECONDS_PER_DAY);
        let (year, month, day) = civil_from_days(days);
        let (mut h, mut m, mut s) = (in_day / 3600, in_day / 60 % 60, in_day % 60);
        let (mut year, mut month, mut day) = (year, month, day);
        match index {
            reg::SECONDS => s = field,
            reg::MINUTES => m = field,
            reg::HOURS => h = field,
            reg::DAY_OF_MONTH => day = field,
            reg::MONTH => month = field,
            reg::YEAR => year = year.div_euclid(100) * 100 + field,
            _ => year = field * 100 + year.rem_euclid(100),
        }
        let target = days_from_civil(year, month, day) * SECONDS_PER_DAY + h * 3600 + m * 60 + s;
        match self.held.as_mut() {
            Some(held) => *held = target,
            None => self.base_ns += i128::from(target - current) * i128::from(NS_PER_S),
        }
    }
}

fn to_bcd(v: u8) -> u8 {
    ((v / 10) << 4) | (v % 10)
}

fn from_bcd(v: u8) -> u8 {
    (v >> 4) * 10 + (v & 0xf)
}

/// (year, month 1..=12, day 1..=31) of `days` since 1970-01-01, in the
/// proleptic Gregorian calendar (the days-from-civil algorithm in reverse).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Days since 1970-01-01 of a proleptic Gregorian date.
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let yoe = year.rem_euclid(400);
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-01-01 00:00:00 UTC, a Thursday.
    const BOOT: u64 = 1_767_225_600 * NS_PER_S;
    const MS: u64 = 1_000_000;

    fn rd(rtc: &mut Rtc, index: u8, now: u64) -> u8 {
        rtc.write(INDEX_PORT, index, now);
        rtc.read(DATA_PORT, now)
    }

    fn wr(rtc: &mut Rtc, index: u8, value: u8, now: u64) {
        rtc.write(INDEX_PORT, index, now);
        rtc.write(DATA_PORT, value, now);
    }

    #[test]
    fn the_time_is_the_boot_wall_clock_plus_virtual_time_in_bcd_or_binary() {
        let mut rtc = Rtc::new(BOOT);
        let now = (3600 * 13 + 60 * 45 + 59) * NS_PER_S + 500 * MS;
        let fields = [
            reg::SECONDS,
            reg::MINUTES,
            reg::HOURS,
            reg::DAY_OF_WEEK,
            reg::DAY_OF_MONTH,
            reg::MONTH,
            reg::YEAR,
            CENTURY,
        ];
        let read = |rtc: &mut Rtc| fields.map(|f| rd(rtc, f, now));
        assert_eq!(read(&mut rtc), [0x59, 0x45, 0x13, 5, 1, 1, 0x26, 0x20]);
        wr(&mut rtc, reg::B, b::DM | b::HOUR_24, now);
        assert_eq!(read(&mut rtc), [59, 45, 13, 5, 1, 1, 26, 20]);
        // 12-hour BCD: 1 PM.
        wr(&mut rtc, reg::B, 0, now);
        assert_eq!(rd(&mut rtc, reg::HOURS, now), 0x81);
        // A leap day far on.
        let leap = Rtc::new(BOOT + (31 + 28 + 365 * 2) * 86_400 * NS_PER_S);
        assert_eq!(
            [reg::DAY_OF_MONTH, reg::MONTH, reg::YEAR].map(|f| leap.encode(f, leap.seconds(0))),
            [0x29, 0x02, 0x28]
        );
    }

    #[test]
    fn uip_is_set_for_the_244_us_before_each_update() {
        let mut rtc = Rtc::new(BOOT);
        let uip = |rtc: &mut Rtc, now| rd(rtc, reg::A, now) & a::UIP != 0;
        assert!(!uip(&mut rtc, 0));
        assert!(!uip(&mut rtc, NS_PER_S - UIP_NS - 1));
        assert!(uip(&mut rtc, NS_PER_S - UIP_NS));
        assert!(uip(&mut rtc, NS_PER_S - 1));
        assert!(!uip(&mut rtc, NS_PER_S));
        assert!(uip(&mut rtc, 5 * NS_PER_S - 1000));
        assert_eq!(rd(&mut rtc, reg::A, 0), 0x26, "the rest of A as written");
        // SET holds updates: no UIP, and the time stands still.
        wr(&mut rtc, reg::B, b::SET | b::HOUR_24, 5 * NS_PER_S);
        assert!(!uip(&mut rtc, 6 * NS_PER_S - 1000));
        assert_eq!(rd(&mut rtc, reg::SECONDS, 9 * NS_PER_S), 0x05);
    }

    #[test]
    fn register_c_flags_are_set_by_updates_and_alarms_and_cleared_by_reading() {
        let mut rtc = Rtc::new(BOOT);
        wr(&mut rtc, reg::A, a::DV_NORMAL, 0); // no periodic interrupt
        assert_eq!(rd(&mut rtc, reg::C, 100 * MS), 0);
        // Alarm at hh:mm:03 (minutes and hours don't care).
        wr(&mut rtc, reg::SECONDS_ALARM, 0x03, 100 * MS);
        wr(&mut rtc, reg::MINUTES_ALARM, DONT_CARE, 100 * MS);
        wr(&mut rtc, reg::HOURS_ALARM, 0xff, 100 * MS);
        assert_eq!(rd(&mut rtc, reg::C, 1500 * MS), c::UF, "update, no match");
        assert_eq!(rd(&mut rtc, reg::C, 1600 * MS), 0, "read cleared it");
        assert_eq!(rd(&mut rtc, reg::C, 3000 * MS), c::UF | c::AF);
        // IRQF follows the enables.
        wr(&mut rtc, reg::B, b::HOUR_24 | b::UIE, 3000 * MS);
        assert_eq!(rd(&mut rtc, reg::C, 4000 * MS), c::IRQF | c::UF);
        // A match on every field, hours in 12-hour BCD (01 AM).
        wr(&mut rtc, reg::B, b::AIE, 4000 * MS);
        let one_am = 3600 + 60 * 2 + 7;
        wr(&mut rtc, reg::SECONDS_ALARM, 0x07, 4000 * MS);
        wr(&mut rtc, reg::MINUTES_ALARM, 0x02, 4000 * MS);
        wr(&mut rtc, reg::HOURS_ALARM, 0x01, 4000 * MS);
        assert_eq!(rtc.next_alarm(4000 * MS), Some(one_am * NS_PER_S));
        assert!(!rtc.take_alarm_event(one_am * NS_PER_S - 1));
        rd(&mut rtc, reg::C, one_am * NS_PER_S - 1);
        assert_eq!(
            rd(&mut rtc, reg::C, one_am * NS_PER_S),
            c::IRQF | c::AF | c::UF
        );
        assert!(rtc.take_alarm_event(one_am * NS_PER_S));
        assert!(!rtc.take_alarm_event(one_am * NS_PER_S));
        // Periodic: RS = 15 is 2 Hz.
        let t = (one_am + 10) * NS_PER_S;
        wr(&mut rtc, reg::A, a::DV_NORMAL | 15, t);
        wr(&mut rtc, reg::B, b::HOUR_24, t);
        rd(&mut rtc, reg::C, t);
        assert_eq!(rd(&mut rtc, reg::C, t + 499 * MS), 0);
        assert_eq!(rd(&mut rtc, reg::C, t + 500 * MS), c::PF);
    }

    #[test]
    fn the_dont_care_alarm_fires_at_the_next_second() {
        let mut rtc = Rtc::new(BOOT);
        let now = 2_300 * MS;
        assert_eq!(rtc.next_alarm(now), None, "AIE clear");
        for alarm in [reg::SECONDS_ALARM, reg::MINUTES_ALARM, reg::HOURS_ALARM] {
            wr(&mut rtc, alarm, DONT_CARE, now);
        }
        wr(&mut rtc, reg::B, b::HOUR_24 | b::AIE, now);
        assert_eq!(rtc.next_alarm(now), Some(3 * NS_PER_S));
        // Hours 25 never match.
        wr(&mut rtc, reg::HOURS_ALARM, 0x25, now);
        assert_eq!(rtc.next_alarm(now), None);
    }

    #[test]
    fn writing_the_time_moves_the_clock_and_set_holds_it() {
        let mut rtc = Rtc::new(BOOT);
        wr(&mut rtc, reg::B, b::SET | b::HOUR_24, 0);
        wr(&mut rtc, reg::HOURS, 0x23, 0);
        wr(&mut rtc, reg::MINUTES, 0x59, 0);
        wr(&mut rtc, reg::SECONDS, 0x58, 0);
        wr(&mut rtc, reg::YEAR, 0x99, 0);
        assert_eq!(rd(&mut rtc, reg::SECONDS, 7 * NS_PER_S), 0x58, "held");
        // Released at 7 s: the next update one second later.
        wr(&mut rtc, reg::B, b::HOUR_24, 7 * NS_PER_S);
        assert_eq!(rd(&mut rtc, reg::SECONDS, 7 * NS_PER_S + 999 * MS), 0x58);
        let after = 9 * NS_PER_S;
        assert_eq!(
            [
                reg::SECONDS,
                reg::HOURS,
                reg::DAY_OF_MONTH,
                reg::YEAR,
                CENTURY
            ]
            .map(|f| rd(&mut rtc, f, after)),
            [0x00, 0x00, 0x02, 0x99, 0x20]
        );
    }

    #[test]
    fn the_calendar_round_trips() {
        for days in [-1, 0, 59, 365, 10_957, 20_454, 100_000] {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
        assert_eq!(civil_from_days(20_454), (2026, 1, 1));
    }
}
