//! Strict parsing of the sizes and durations the command line takes.
//!
//! Sizes: a whole number with an optional binary suffix `K`, `M`, `G` or
//! `T` (`256M`, `1T`, `4096`). Durations: a decimal number and a unit `ns`,
//! `us` (or `µs`), `ms`, `s`, `m` or `h` (`500ms`, `1.5s`, `10us`, `1m`).
//! No signs, exponents, spaces inside, or precision finer than a
//! nanosecond: what does not parse exactly is an error, never a guess.

use std::time::Duration;

/// Parses `256M`, `1G`, `1T`, `4096K` or a byte count.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let (digits, shift) = match s.char_indices().last() {
        Some((i, 'k' | 'K')) => (&s[..i], 10),
        Some((i, 'm' | 'M')) => (&s[..i], 20),
        Some((i, 'g' | 'G')) => (&s[..i], 30),
        Some((i, 't' | 'T')) => (&s[..i], 40),
        _ => (s, 0),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("`{s}` is not a size (e.g. 256M, 1G, 4096K)"));
    }
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1 << shift))
        .ok_or_else(|| format!("`{s}` is too large"))
}

/// Parses a size that must not be zero.
pub fn parse_nonzero_size(s: &str) -> Result<u64, String> {
    match parse_size(s)? {
        0 => Err(format!("`{s}` must be more than zero")),
        n => Ok(n),
    }
}

/// `bytes` with the largest binary suffix that divides it exactly (`8M`,
/// `3G`, `4097K`, `123`).
pub fn format_size(bytes: u64) -> String {
    for (shift, suffix) in [(40, 'T'), (30, 'G'), (20, 'M'), (10, 'K')] {
        if bytes != 0 && bytes % (1 << shift) == 0 {
            return format!("{}{suffix}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// Parses a decimal number of `unit_ns` nanoseconds exactly.
fn parse_decimal_ns(number: &str, unit_ns: u128, whole: &str) -> Result<u128, String> {
    let bad = || format!("`{whole}` is not a duration (e.g. 500ms, 1.5s, 10us, 1m)");
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    let digits = |d: &str| d.bytes().all(|b| b.is_ascii_digit());
    if int.is_empty() || !digits(int) || !digits(frac) || number.ends_with('.') {
        return Err(bad());
    }
    let too_long = || format!("`{whole}` is too long");
    let int: u128 = int.parse().map_err(|_| too_long())?;
    let mut ns = int.checked_mul(unit_ns).ok_or_else(too_long)?;
    let mut scale = unit_ns;
    for d in frac.bytes() {
        if scale % 10 != 0 {
            return Err(format!("`{whole}` is finer than a nanosecond"));
        }
        scale /= 10;
        ns += u128::from(d - b'0') * scale;
    }
    Ok(ns)
}

/// Parses `500ms`, `2s`, `1.5s`, `10us`, `1m` or `1h`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| format!("`{s}` has no unit (ns, us, ms, s, m or h)"))?;
    let (number, unit) = s.split_at(split);
    if number.is_empty() {
        return Err(format!(
            "`{s}` is not a duration (e.g. 500ms, 1.5s, 10us, 1m)"
        ));
    }
    let unit_ns: u128 = match unit {
        "ns" => 1,
        "us" | "µs" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        _ => return Err(format!("`{unit}` is not a unit (ns, us, ms, s, m or h)")),
    };
    let ns = parse_decimal_ns(number, unit_ns, s)?;
    let secs = u64::try_from(ns / 1_000_000_000).map_err(|_| format!("`{s}` is too long"))?;
    Ok(Duration::new(secs, (ns % 1_000_000_000) as u32))
}

/// Parses a duration that must not be zero.
pub fn parse_positive_duration(s: &str) -> Result<Duration, String> {
    match parse_duration(s)? {
        Duration::ZERO => Err(format!("`{s}` must be more than zero")),
        d => Ok(d),
    }
}

/// Parses seconds as a plain decimal (`0.2`, what `bm -t` takes) or a
/// duration with a unit (`200ms`).
pub fn parse_seconds(s: &str) -> Result<Duration, String> {
    if s.contains(|c: char| c.is_ascii_alphabetic() || c == 'µ') {
        return parse_duration(s);
    }
    let ns = parse_decimal_ns(s, 1_000_000_000, s)?;
    let secs = u64::try_from(ns / 1_000_000_000).map_err(|_| format!("`{s}` is too long"))?;
    Ok(Duration::new(secs, (ns % 1_000_000_000) as u32))
}

/// Like [`parse_seconds`], above zero (a run of no time measures nothing).
pub fn parse_positive_seconds(s: &str) -> Result<Duration, String> {
    let d = parse_seconds(s)?;
    if d.is_zero() {
        return Err(format!("`{s}`: must be above zero"));
    }
    Ok(d)
}

/// `d` in seconds as a plain decimal with no trailing zeros (`0.2`, `1`,
/// `0.000001`): the form `bm -t` takes.
pub fn format_seconds(d: Duration) -> String {
    let frac = format!("{:09}", d.subsec_nanos());
    let frac = frac.trim_end_matches('0');
    if frac.is_empty() {
        d.as_secs().to_string()
    } else {
        format!("{}.{frac}", d.as_secs())
    }
}

/// `d` as written on the command line (`500ms`, `2s`, `1.5s`, `10us`).
pub fn format_duration(d: Duration) -> String {
    let ns = d.as_nanos();
    for (unit_ns, unit) in [(1_000_000_000u128, "s"), (1_000_000, "ms"), (1_000, "us")] {
        if ns >= unit_ns {
            let whole = ns / unit_ns;
            let rest = format!(
                "{:0width$}",
                ns % unit_ns,
                width = unit_ns.ilog10() as usize
            );
            let rest = rest.trim_end_matches('0');
            return if rest.is_empty() {
                format!("{whole}{unit}")
            } else {
                format!("{whole}.{rest}{unit}")
            };
        }
    }
    format!("{ns}ns")
}

/// Virtual cycles in `d` (rounded down).
pub fn duration_to_cycles(d: Duration) -> u64 {
    let cycles = d.as_nanos() * u128::from(hv::CYCLES_PER_SECOND) / 1_000_000_000;
    u64::try_from(cycles).unwrap_or(u64::MAX)
}

/// Virtual seconds in `cycles`.
pub fn cycles_to_secs(cycles: u64) -> f64 {
    cycles as f64 / hv::CYCLES_PER_SECOND as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_parsed_strictly() {
        assert_eq!(parse_size("256M"), Ok(256 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("1T"), parse_size("1024G"));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("8k"), Ok(8192));
        for bad in ["", "lots", "M", "-1M", "+1M", " 1M", "1.5G", "1MB", "0x10"] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
        assert!(parse_size("99999999999G").is_err());
        assert!(parse_nonzero_size("0").is_err());
        assert_eq!(parse_nonzero_size("1"), Ok(1));
        for n in [8 << 20, 3 << 30, 4097 << 10, 123, 0, 1 << 40] {
            assert_eq!(parse_size(&format_size(n)), Ok(n), "{n}");
        }
        assert_eq!(format_size(8 << 20), "8M");
    }

    #[test]
    fn durations_are_parsed_strictly_and_exactly() {
        let ok = |s: &str| parse_duration(s).unwrap();
        assert_eq!(ok("500ms"), Duration::from_millis(500));
        assert_eq!(ok("2s"), Duration::from_secs(2));
        assert_eq!(ok("1.5s"), Duration::from_millis(1500));
        assert_eq!(ok("10us"), Duration::from_micros(10));
        assert_eq!(ok("10µs"), Duration::from_micros(10));
        assert_eq!(ok("1m"), Duration::from_secs(60));
        assert_eq!(ok("1h"), Duration::from_secs(3600));
        assert_eq!(ok("0.000000001s"), Duration::from_nanos(1));
        for bad in [
            "",
            "2",
            "s",
            "1.s",
            ".5s",
            "-1s",
            "+1s",
            "1e3ms",
            "1 s",
            "1sec",
            "1.5ns",
            "0.0000000001s",
            "abc",
            "1.2.3s",
            "99999999999999999999999h",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
        assert!(parse_positive_duration("0s").is_err());
        for s in ["500ms", "2s", "1.5s", "10us", "7ns", "1.000001s"] {
            assert_eq!(format_duration(ok(s)), s);
        }
    }

    #[test]
    fn seconds_take_plain_decimals_or_units() {
        assert_eq!(parse_seconds("0.2"), Ok(Duration::from_millis(200)));
        assert_eq!(parse_seconds("200ms"), Ok(Duration::from_millis(200)));
        assert_eq!(parse_seconds("1"), Ok(Duration::from_secs(1)));
        for bad in ["abc", "", ".2", "0.2.", "-1", "1e3"] {
            assert!(parse_seconds(bad).is_err(), "{bad:?}");
        }
        assert_eq!(format_seconds(Duration::from_millis(200)), "0.2");
        assert_eq!(format_seconds(Duration::from_secs(3)), "3");
        assert_eq!(format_seconds(Duration::from_micros(1)), "0.000001");
    }

    #[test]
    fn virtual_cycles() {
        assert_eq!(
            duration_to_cycles(Duration::from_secs(1)),
            hv::CYCLES_PER_SECOND
        );
        assert_eq!(cycles_to_secs(hv::CYCLES_PER_SECOND / 2), 0.5);
    }
}
