//! The swap device model: what each page-in and page-out costs in virtual
//! time.
//!
//! A device serves up to `queue` requests at once (its queue depth, or
//! the number of things that can seek in parallel); a request waits for
//! the earliest free server, then takes its access latency (drawn from a
//! uniform range with the VM's seeded generator, so runs repeat exactly)
//! plus its transfer time at the device bandwidth.
//!
//! Reads (page-ins) are what a faulting vCPU waits for. Writes
//! (page-outs) are modelled as the kernel's swap writeback is: clustered
//! and sequential, on their own queue, so they cost bandwidth but never
//! delay a read or the evicting vCPU (the data goes to the file at once).
//!
//! # Presets
//!
//! | preset | read latency | bandwidth | queue | basis |
//! |---|---|---|---|---|
//! | `hdd` | 4–17 ms | 160 MB/s | 1 | 7200 rpm SATA disk: 8.3 ms a revolution (4.2 ms average rotational delay) plus 0–9 ms seek, mean about 10 ms, i.e. ~100 random-read IOPS; one actuator serves one request at a time; 160 MB/s sequential (datasheets of 1–2 TB desktop drives) |
//! | `ssd` | 80–120 µs | 550 MB/s | 32 | SATA SSD: ~10k IOPS 4 KiB random read at queue depth 1 (about 100 µs), SATA 6 Gb/s ceiling, NCQ's 32 tags |
//! | `nvme` | 50–90 µs | 3.5 GB/s | 128 | PCIe 3.0 x4 NVMe: 4 KiB QD1 random read ~70 µs on consumer drives (NAND read ~50 µs plus the stack), PCIe 3.0 x4 bandwidth |
//! | `net` | 150–350 µs | 1.25 GB/s | 16 | swap over 10 GbE (NBD/iSCSI or a remote-memory server): a few LAN round trips of 50–100 µs plus the server, 10 Gb/s line rate |
//!
//! Sequential writes get the preset's bandwidth and a small fixed setup
//! time (`write_latency`).

use machine::cost::CYCLES_PER_SECOND;
use std::fmt;
use std::str::FromStr;

/// Bytes moved per request (one page).
const PAGE_BYTES: u64 = machine::addr::PAGE_SIZE;

/// A latency range in virtual cycles, drawn uniformly (min == max: fixed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LatencyRange {
    pub min: u64,
    pub max: u64,
}

impl LatencyRange {
    /// A fixed latency.
    pub const fn fixed(cycles: u64) -> Self {
        LatencyRange {
            min: cycles,
            max: cycles,
        }
    }

    /// The mean in cycles.
    pub fn mean(&self) -> u64 {
        self.min / 2 + self.max / 2
    }
}

impl fmt::Display for LatencyRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.min == self.max {
            write!(f, "{}", format_duration(self.min))
        } else {
            write!(
                f,
                "{}-{}",
                format_duration(self.min),
                format_duration(self.max)
            )
        }
    }
}

/// Parses a duration like `8ms`, `100us`, `1.5ms`, `2s` or `300ns` into
/// virtual cycles.
pub fn parse_duration(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| c.is_ascii_alphabetic() || c == 'µ')
        .ok_or_else(|| format!("`{s}` has no unit (ns, us, ms or s)"))?;
    let (number, unit) = s.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("`{s}` is not a duration (e.g. 8ms, 100us)"))?;
    let scale = match unit {
        "ns" => 1e-9,
        "us" | "µs" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        _ => return Err(format!("`{unit}` is not a unit (ns, us, ms or s)")),
    };
    let cycles = value * scale * CYCLES_PER_SECOND as f64;
    if !cycles.is_finite() || !(0.0..=1e18).contains(&cycles) {
        return Err(format!("`{s}` is out of range"));
    }
    Ok(cycles.round() as u64)
}

/// Formats virtual cycles as a short duration (`8ms`, `100us`).
pub fn format_duration(cycles: u64) -> String {
    let ns = cycles as f64 * 1e9 / CYCLES_PER_SECOND as f64;
    if ns >= 1e9 {
        format!("{}s", trim(ns / 1e9))
    } else if ns >= 1e6 {
        format!("{}ms", trim(ns / 1e6))
    } else if ns >= 1e3 {
        format!("{}us", trim(ns / 1e3))
    } else {
        format!("{}ns", trim(ns))
    }
}

fn trim(v: f64) -> String {
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

impl FromStr for LatencyRange {
    type Err = String;
    /// `8ms` (fixed) or `4ms-17ms` (uniform).
    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once('-') {
            Some((a, b)) => {
                let (min, max) = (parse_duration(a)?, parse_duration(b)?);
                if min > max {
                    return Err(format!("latency range `{s}` has min above max"));
                }
                Ok(LatencyRange { min, max })
            }
            None => parse_duration(s).map(LatencyRange::fixed),
        }
    }
}

/// A named device preset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DevicePreset {
    Hdd,
    Ssd,
    Nvme,
    Net,
}

impl DevicePreset {
    pub const ALL: [DevicePreset; 4] = [
        DevicePreset::Hdd,
        DevicePreset::Ssd,
        DevicePreset::Nvme,
        DevicePreset::Net,
    ];

    /// The preset's name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            DevicePreset::Hdd => "hdd",
            DevicePreset::Ssd => "ssd",
            DevicePreset::Nvme => "nvme",
            DevicePreset::Net => "net",
        }
    }

    /// The preset's parameters (see the module table for their sources).
    pub fn model(self) -> DeviceModel {
        let us = CYCLES_PER_SECOND / 1_000_000;
        let (min_us, max_us, bandwidth, queue, write_us) = match self {
            DevicePreset::Hdd => (4_000, 17_000, 160_000_000, 1, 100),
            DevicePreset::Ssd => (80, 120, 550_000_000, 32, 20),
            DevicePreset::Nvme => (50, 90, 3_500_000_000, 128, 10),
            DevicePreset::Net => (150, 350, 1_250_000_000, 16, 50),
        };
        DeviceModel {
            name: self.name().to_string(),
            read_latency: LatencyRange {
                min: min_us * us,
                max: max_us * us,
            },
            write_latency: write_us * us,
            bandwidth,
            queue,
        }
    }
}

impl FromStr for DevicePreset {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        DevicePreset::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| format!("unknown swap device `{s}` (hdd, ssd, nvme or net)"))
    }
}

/// The parameters of a swap device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceModel {
    /// The preset it came from (with `+` when overridden).
    pub name: String,
    /// Access latency of a random page read.
    pub read_latency: LatencyRange,
    /// Setup time of a (sequential, clustered) page write.
    pub write_latency: u64,
    /// Bytes per second.
    pub bandwidth: u64,
    /// Requests served at once.
    pub queue: u32,
}

impl Default for DeviceModel {
    fn default() -> Self {
        DevicePreset::Hdd.model()
    }
}

impl DeviceModel {
    /// Transfer time of one page at the device bandwidth.
    pub fn transfer_cycles(&self) -> u64 {
        (PAGE_BYTES as u128 * CYCLES_PER_SECOND as u128 / self.bandwidth.max(1) as u128) as u64
    }
}

/// Device counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceStats {
    pub reads: u64,
    pub writes: u64,
    /// Sum over reads of (completion - submission).
    pub read_wait_cycles: u64,
    /// Sum over reads of time spent queued behind other reads.
    pub read_queue_cycles: u64,
    pub max_read_wait_cycles: u64,
    /// Reads that started service after a read submitted later than
    /// themselves: served out of first-come order (always 0; with the
    /// `order-checks` feature, a panic).
    pub read_inversions: u64,
    /// Writes that started after a write submitted later than themselves
    /// (as `read_inversions`).
    pub write_inversions: u64,
}

/// A device in use: its servers' busy-until times and its generator.
#[derive(Debug, Clone)]
pub struct Device {
    model: DeviceModel,
    read_servers: Vec<u64>,
    write_busy_until: u64,
    rng: u64,
    stats: DeviceStats,
    /// The last reads' (submission, start of service), for the order
    /// check: a read served before an earlier one breaks first come,
    /// first served.
    recent_reads: std::collections::VecDeque<(u64, u64)>,
    /// The same for writes.
    recent_writes: std::collections::VecDeque<(u64, u64)>,
}

impl Device {
    /// A device with latency draws seeded by `seed`.
    pub fn new(model: DeviceModel, seed: u64) -> Self {
        let queue = model.queue.max(1) as usize;
        Device {
            read_servers: vec![0; queue],
            write_busy_until: 0,
            // xorshift needs a non-zero state.
            rng: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
            stats: DeviceStats::default(),
            recent_reads: std::collections::VecDeque::new(),
            recent_writes: std::collections::VecDeque::new(),
            model,
        }
    }

    /// The model.
    pub fn model(&self) -> &DeviceModel {
        &self.model
    }

    /// Counters so far.
    pub fn stats(&self) -> DeviceStats {
        self.stats
    }

    fn next_random(&mut self) -> u64 {
        let mut x = self.rng;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng = x;
        x
    }

    fn draw(&mut self, range: LatencyRange) -> u64 {
        let span = range.max - range.min;
        if span == 0 {
            range.min
        } else {
            range.min + self.next_random() % (span + 1)
        }
    }

    /// Submits a page read at virtual time `now`; returns when it
    /// completes.
    pub fn submit_read(&mut self, now: u64) -> u64 {
        let latency = self.draw(self.model.read_latency);
        let service = latency + self.model.transfer_cycles();
        // The earliest-free server; ties go to the lowest index, so the
        // choice is deterministic.
        let (server, &free_at) = self
            .read_servers
            .iter()
            .enumerate()
            .min_by_key(|&(i, &t)| (t, i))
            .expect("a device has at least one server");
        let start = now.max(free_at);
        self.check_read_order(now, start);
        let done = start + service;
        self.read_servers[server] = done;
        self.stats.reads += 1;
        self.stats.read_wait_cycles += done - now;
        self.stats.read_queue_cycles += start - now;
        self.stats.max_read_wait_cycles = self.stats.max_read_wait_cycles.max(done - now);
        done
    }

    /// Requests remembered for the order check: more than can be in
    /// flight.
    const RECENT: usize = 256;

    /// Checks that a read submitted at `now` and served from `start` is
    /// not served after one submitted later (a reordered submission that
    /// still finds a server free at `now` is served in order).
    fn check_read_order(&mut self, now: u64, start: u64) {
        if served_late(&mut self.recent_reads, now, start) {
            self.stats.read_inversions += 1;
            if cfg!(feature = "order-checks") {
                panic!("swap device: a read submitted at {now} is served after a later one");
            }
        }
    }

    /// Submits a page write at `now`; returns when it completes.
    pub fn submit_write(&mut self, now: u64) -> u64 {
        let start = now.max(self.write_busy_until);
        if served_late(&mut self.recent_writes, now, start) {
            self.stats.write_inversions += 1;
            if cfg!(feature = "order-checks") {
                panic!("swap device: a write submitted at {now} is served after a later one");
            }
        }
        let done = start + self.model.write_latency + self.model.transfer_cycles();
        self.write_busy_until = done;
        self.stats.writes += 1;
        done
    }
}

/// Whether a request submitted at `now` and served from `start` starts
/// after one of the `recent` (submission, start) pairs that was submitted
/// later; it joins them.
fn served_late(recent: &mut std::collections::VecDeque<(u64, u64)>, now: u64, start: u64) -> bool {
    let late = recent
        .iter()
        .any(|&(submitted, started)| submitted > now && started < start);
    if recent.len() == Device::RECENT {
        recent.pop_front();
    }
    recent.push_back((now, start));
    late
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = CYCLES_PER_SECOND / 1000;

    #[test]
    fn durations_parse_and_print() {
        assert_eq!(parse_duration("8ms"), Ok(8 * MS));
        assert_eq!(parse_duration("100us"), Ok(MS / 10));
        assert_eq!(parse_duration("1.5ms"), Ok(3 * MS / 2));
        assert!(parse_duration("8").is_err());
        assert!(parse_duration("8 parsecs").is_err());
        assert!(parse_duration("-1ms").is_err());
        assert_eq!(format_duration(8 * MS), "8ms");
        assert_eq!(format_duration(MS / 10), "100us");
        let r: LatencyRange = "4ms-17ms".parse().unwrap();
        assert_eq!((r.min, r.max), (4 * MS, 17 * MS));
        assert_eq!(r.to_string(), "4ms-17ms");
        assert!("17ms-4ms".parse::<LatencyRange>().is_err());
        assert_eq!("hdd".parse(), Ok(DevicePreset::Hdd));
        assert!("floppy".parse::<DevicePreset>().is_err());
    }

    #[test]
    fn one_server_serializes_reads_and_latencies_stay_in_range() {
        let model = DeviceModel {
            queue: 1,
            read_latency: LatencyRange::fixed(1000),
            bandwidth: CYCLES_PER_SECOND * 4096 / 100, // 100 cycles a page
            ..DevicePreset::Hdd.model()
        };
        let mut d = Device::new(model, 1);
        assert_eq!(d.submit_read(0), 1100);
        assert_eq!(d.submit_read(0), 2200, "queued behind the first");
        assert_eq!(d.submit_read(5000), 6100, "idle device: no queueing");
        assert_eq!(d.stats().read_queue_cycles, 1100);

        let mut hdd = Device::new(DevicePreset::Hdd.model(), 7);
        let range = DevicePreset::Hdd.model().read_latency;
        let mut t = 0;
        for _ in 0..100 {
            let done = hdd.submit_read(t);
            let service = done - t;
            assert!(service >= range.min && service <= range.max + hdd.model().transfer_cycles());
            t = done;
        }
    }

    #[test]
    #[cfg_attr(
        feature = "order-checks",
        should_panic(expected = "served after a later one")
    )]
    fn the_checker_counts_a_read_served_after_a_later_one() {
        let model = DeviceModel {
            queue: 2,
            read_latency: LatencyRange::fixed(1000),
            bandwidth: CYCLES_PER_SECOND * 4096 / 100,
            ..DevicePreset::Hdd.model()
        };
        let mut d = Device::new(model, 1);
        d.submit_read(5000);
        // Submitted earlier, processed later, a server free: in order.
        assert_eq!(d.submit_read(0), 1100);
        d.submit_read(5000);
        assert_eq!(d.stats().read_inversions, 0);
        // Both servers busy at 4000 with reads submitted at 5000: this
        // read waits behind later ones.
        d.submit_read(4000);
        assert_eq!(d.stats().read_inversions, 1);
    }

    #[test]
    fn parallel_servers_and_seeded_draws_repeat() {
        let mut a = Device::new(DevicePreset::Ssd.model(), 3);
        let mut b = Device::new(DevicePreset::Ssd.model(), 3);
        let xs: Vec<u64> = (0..32).map(|_| a.submit_read(0)).collect();
        let ys: Vec<u64> = (0..32).map(|_| b.submit_read(0)).collect();
        assert_eq!(xs, ys);
        // 32 servers: none of the first 32 reads queues.
        assert_eq!(a.stats().read_queue_cycles, 0);
        let mut c = Device::new(DevicePreset::Ssd.model(), 4);
        let zs: Vec<u64> = (0..32).map(|_| c.submit_read(0)).collect();
        assert_ne!(xs, zs, "another seed draws other latencies");
    }

    #[test]
    fn writes_use_their_own_queue() {
        let mut d = Device::new(DevicePreset::Hdd.model(), 1);
        let w1 = d.submit_write(0);
        let w2 = d.submit_write(0);
        assert!(w2 > w1);
        let r = d.submit_read(0);
        assert!(r >= DevicePreset::Hdd.model().read_latency.min);
        assert_eq!(
            d.stats().read_queue_cycles,
            0,
            "reads do not queue behind writes"
        );
    }
}
