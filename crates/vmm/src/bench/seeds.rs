//! The seeds' reference figures, in one table, and faultline's figure
//! compared with each: every bench prints its comparisons from here
//! and `faultline reproduce` collects them into one table per seed.
//!
//! A comparison's status is computed, never written down: **met** when
//! faultline's figure lies within the seed's value (or range) widened by
//! [`TOLERANCE`] of its magnitude, **not met** otherwise (with the cause
//! the bench measured, or "cause not measured"), **not comparable** when
//! faultline has no figure for it (with the reason).

use serde::Serialize;
use serde_json::json;
use std::fmt::Write as _;

/// How far from the seed's figure (a fraction of its magnitude, on each
/// side of its range) faultline's still counts as met.
pub const TOLERANCE: f64 = 0.10;

/// What a figure measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Unit {
    /// One time or throughput over another (`x`).
    Ratio,
    /// A change in percent of the baseline (`%`).
    Percent,
}

/// One figure a seed reports.
#[derive(Debug, Serialize)]
pub struct SeedFigure {
    /// `004.ctxsw.shadow_over_cache4`: stable, for the JSON.
    pub key: &'static str,
    /// `000` to `004`.
    pub seed: &'static str,
    pub what: &'static str,
    /// The seed's value, or the ends of its range (`low` <= `high`).
    pub low: f64,
    pub high: f64,
    pub unit: Unit,
    /// Where the figure comes from: the seed file and its section, or
    /// the later posting.
    pub source: &'static str,
}

impl SeedFigure {
    /// The middle of the seed's range.
    pub fn value(&self) -> f64 {
        (self.low + self.high) / 2.0
    }

    /// `1.91x`, `-47.5 % to -53.5 %`.
    pub fn show(&self) -> String {
        if self.low == self.high {
            show(self.low, self.unit)
        } else {
            format!(
                "{} to {}",
                show(self.low, self.unit),
                show(self.high, self.unit)
            )
        }
    }

    /// Whether `v` lies within the range widened by [`TOLERANCE`].
    pub fn holds(&self, v: f64) -> bool {
        let margin = TOLERANCE * self.low.abs().max(self.high.abs());
        v >= self.low - margin && v <= self.high + margin
    }
}

/// `v` in `unit`.
pub fn show(v: f64, unit: Unit) -> String {
    match unit {
        Unit::Ratio => format!("{v:.2}x"),
        Unit::Percent => format!("{v:+.1} %"),
    }
}

/// `(after - before) / before`, in percent.
pub fn change_pct(before: f64, after: f64) -> f64 {
    (after - before) / before * 100.0
}

/// Every seed figure faultline compares itself with.
pub static FIGURES: &[SeedFigure] = &[
    SeedFigure {
        key: "000.apf.pv_over_off",
        seed: "000",
        what: "bm total work, PV async PF / master",
        low: 234.351846135 / 122.789420615,
        high: 234.351846135 / 122.789420615,
        unit: Unit::Ratio,
        source: "seed 000 file, bm results: master 122.8G, pv 234.4G",
    },
    SeedFigure {
        key: "000.apf.halt_over_off",
        seed: "000",
        what: "bm total work, halt (non-PV) / master",
        low: 138.455939001 / 122.789420615,
        high: 138.455939001 / 122.789420615,
        unit: Unit::Ratio,
        source: "seed 000 file, bm results: master 122.8G, nonpv 138.5G",
    },
    SeedFigure {
        key: "001.fastpf.x11perf_ept",
        seed: "001",
        what: "frame-buffer throughput, fast PF on vs off, EPT",
        low: (7150.0 - 7060.0) / 7060.0 * 100.0,
        high: (7150.0 - 7060.0) / 7060.0 * 100.0,
        unit: Unit::Percent,
        source: "seed 001 file, Performance: x11perf -comppixwin500 7060.0 -> 7150.0 (ept)",
    },
    SeedFigure {
        key: "001.fastpf.x11perf_shadow",
        seed: "001",
        what: "frame-buffer throughput, fast PF on vs off, shadow",
        low: (7490.0 - 6980.0) / 6980.0 * 100.0,
        high: (7490.0 - 6980.0) / 6980.0 * 100.0,
        unit: Unit::Percent,
        source: "seed 001 file, Performance: x11perf -comppixwin500 6980.0 -> 7490.0 (soft MMU)",
    },
    SeedFigure {
        key: "001.migrate.total_ept",
        seed: "001",
        what: "migration total time, fast PF on vs off, EPT",
        low: (825.0 - 873.0) / 873.0 * 100.0,
        high: (825.0 - 873.0) / 873.0 * 100.0,
        unit: Unit::Percent,
        source: "seed 001 file, autotest migration (ept): totals 309+275+289 -> 295+259+271 s",
    },
    SeedFigure {
        key: "001.migrate.total_shadow",
        seed: "001",
        what: "migration total time, fast PF on vs off, shadow",
        low: (905.0 - 967.0) / 967.0 * 100.0,
        high: (905.0 - 967.0) / 967.0 * 100.0,
        unit: Unit::Percent,
        source: "seed 001 file, autotest migration (shadow): totals 368+292+307 -> 341+289+275 s",
    },
    SeedFigure {
        key: "001.dirty_log.resume",
        seed: "001",
        what: "dirty-log resume (dirty) time, fast PF on vs off",
        low: (250.0 - 538.0) / 538.0 * 100.0,
        high: (269.0 - 512.0) / 512.0 * 100.0,
        unit: Unit::Percent,
        source: "later postings of the fast page fault: 512 -> 269 ms (v5), 538 -> 250 ms (v7)",
    },
    SeedFigure {
        key: "002.apf_calc.with_calc",
        seed: "002",
        what: "writer's time with the calculation thread, APF on vs off",
        low: -42.0,
        high: -40.5,
        unit: Unit::Percent,
        source: "seed 002 file, Testing (a): -40.5 % to -42.0 % (\"drops by ~40%\")",
    },
    SeedFigure {
        key: "002.apf_calc.without_calc",
        seed: "002",
        what: "writer's time without the calculation thread, APF on vs off",
        low: 2.8,
        high: 3.5,
        unit: Unit::Percent,
        source: "seed 002 file, Testing (a): +2.8 % to +3.5 %",
    },
    SeedFigure {
        key: "002.postcopy.with_load",
        seed: "002",
        what: "writer's time across a migration, with load, APF on vs off",
        low: -7.1,
        high: -3.3,
        unit: Unit::Percent,
        source: "seed 002 file, Testing (b): -3.3 % to -7.1 %",
    },
    SeedFigure {
        key: "002.postcopy.without_load",
        seed: "002",
        what: "writer's time across a migration, without load, APF on vs off",
        low: 13.6,
        high: 14.7,
        unit: Unit::Percent,
        source: "seed 002 file, Testing (b): +13.6 % to +14.7 %",
    },
    SeedFigure {
        key: "003.memslot.slow_over_fast",
        seed: "003",
        what: "memslot delete + re-add time, slow zap / fast zap",
        low: 46_078_825.0 / 21_558_774.0,
        high: 46_078_825.0 / 21_558_774.0,
        unit: Unit::Ratio,
        source: "seed 003 file, Performance (6 vCPUs, 2048M): 46078825 ns -> 21558774 ns",
    },
    SeedFigure {
        key: "003.memslot.slow_over_seed",
        seed: "003",
        what: "memslot delete + re-add time, slow zap / the seed's v2 zap (--zap seed)",
        low: 46_078_825.0 / 21_558_774.0,
        high: 46_078_825.0 / 21_558_774.0,
        unit: Unit::Ratio,
        source: "seed 003 file, Performance (6 vCPUs, 2048M): 46078825 ns -> 21558774 ns",
    },
    SeedFigure {
        key: "004.ctxsw.shadow_over_cache4",
        seed: "004",
        what: "2-task context switch, shadow / CR3 cache (4 targets)",
        low: 6.36 / 1.60,
        high: 6.36 / 1.60,
        unit: Unit::Ratio,
        source: "seed 004 file: KVM trunk 6.36 us, trunk+paravirt/cr3 1.60 us",
    },
    SeedFigure {
        key: "004.ctxsw.trunk2007_over_trunk2007_cache4",
        seed: "004",
        what: "2-task context switch, KVM trunk of 2007 / with the CR3 cache (4 targets), both without unsync (--kvm-2007)",
        low: 6.36 / 1.60,
        high: 6.36 / 1.60,
        unit: Unit::Ratio,
        source: "seed 004 file: KVM trunk 6.36 us, trunk+paravirt/cr3 1.60 us",
    },
    SeedFigure {
        key: "004.ctxsw.cache4_over_native",
        seed: "004",
        what: "2-task context switch, CR3 cache (4 targets) / native",
        low: 1.60 / 1.11,
        high: 1.60 / 1.11,
        unit: Unit::Ratio,
        source: "seed 004 file: trunk+paravirt/cr3 1.60 us, native 1.11 us",
    },
    SeedFigure {
        key: "004.hackbench.g1_shadow_over_cache4",
        seed: "004",
        what: "hackbench 1, shadow / CR3 cache (4 targets)",
        low: 0.55 / 0.36,
        high: 0.55 / 0.36,
        unit: Unit::Ratio,
        source: "seed 004 file, \"hackbench 1\": KVM trunk 0.55 s, paravirt/cr3 0.36 s",
    },
    SeedFigure {
        key: "004.hackbench.g5_shadow_over_cache4",
        seed: "004",
        what: "hackbench 5, shadow / CR3 cache (4 targets)",
        low: 2.8 / 2.2,
        high: 2.8 / 2.2,
        unit: Unit::Ratio,
        source: "seed 004 file, \"hackbench 5\": KVM trunk 2.8 s, paravirt/cr3 2.2 s",
    },
    SeedFigure {
        key: "004.hackbench.g1_trunk2007_over_trunk2007_cache4",
        seed: "004",
        what: "hackbench 1, KVM trunk of 2007 / with the CR3 cache (4 targets), both without unsync (--kvm-2007)",
        low: 0.55 / 0.36,
        high: 0.55 / 0.36,
        unit: Unit::Ratio,
        source: "seed 004 file, \"hackbench 1\": KVM trunk 0.55 s, paravirt/cr3 0.36 s",
    },
    SeedFigure {
        key: "004.hackbench.g5_trunk2007_over_trunk2007_cache4",
        seed: "004",
        what: "hackbench 5, KVM trunk of 2007 / with the CR3 cache (4 targets), both without unsync (--kvm-2007)",
        low: 2.8 / 2.2,
        high: 2.8 / 2.2,
        unit: Unit::Ratio,
        source: "seed 004 file, \"hackbench 5\": KVM trunk 2.8 s, paravirt/cr3 2.2 s",
    },
];

/// The figure `key`; a key not in [`FIGURES`] is a bug.
pub fn figure(key: &str) -> &'static SeedFigure {
    FIGURES
        .iter()
        .find(|f| f.key == key)
        .unwrap_or_else(|| panic!("no seed figure `{key}`"))
}

/// How faultline's figure compares with the seed's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Met,
    NotMet,
    NotComparable,
}

/// faultline's figure beside a seed's.
#[derive(Debug, Clone)]
pub struct Comparison {
    pub figure: &'static SeedFigure,
    /// What faultline ran for it (guest, MMU, sizes).
    pub setup: String,
    /// faultline's figure; `None`: not run (`cause` says why).
    pub faultline: Option<f64>,
    /// For a figure not met, what the bench measured that the difference
    /// comes from; for one not comparable, the reason.
    pub cause: Option<String>,
}

impl Comparison {
    /// faultline's `value` for the figure `key`, measured in `setup`.
    pub fn measured(key: &str, setup: impl Into<String>, value: f64) -> Comparison {
        Comparison {
            figure: figure(key),
            setup: setup.into(),
            faultline: Some(value).filter(|v| v.is_finite()),
            cause: None,
        }
    }

    /// A figure faultline did not produce, and why.
    pub fn not_run(key: &str, setup: impl Into<String>, reason: impl Into<String>) -> Comparison {
        Comparison {
            figure: figure(key),
            setup: setup.into(),
            faultline: None,
            cause: Some(reason.into()),
        }
    }

    /// With the measured cause of a difference (shown when not met).
    pub fn because(mut self, cause: impl Into<String>) -> Comparison {
        self.cause = Some(cause.into());
        self
    }

    pub fn status(&self) -> Status {
        match self.faultline {
            None => Status::NotComparable,
            Some(v) if self.figure.holds(v) => Status::Met,
            Some(_) => Status::NotMet,
        }
    }

    /// faultline's figure over the seed's (the middle of its range).
    pub fn ratio(&self) -> Option<f64> {
        self.faultline.map(|v| v / self.figure.value())
    }

    /// The status with its cause: `met`, `not met: ...`, `not
    /// comparable: ...`.
    pub fn verdict(&self) -> String {
        match (self.status(), &self.cause) {
            (Status::Met, _) => "met".into(),
            (Status::NotMet, Some(cause)) => format!("not met: {cause}"),
            (Status::NotMet, None) => "not met: cause not measured".into(),
            (Status::NotComparable, cause) => format!(
                "not comparable: {}",
                cause.as_deref().unwrap_or("no figure")
            ),
        }
    }

    pub fn faultline_text(&self) -> String {
        self.faultline
            .map_or("-".into(), |v| show(v, self.figure.unit))
    }

    pub fn ratio_text(&self) -> String {
        self.ratio().map_or("-".into(), |r| format!("{r:.2}"))
    }

    pub fn to_json(&self) -> serde_json::Value {
        json!({
            "key": self.figure.key,
            "seed": self.figure.seed,
            "what": self.figure.what,
            "setup": self.setup,
            "unit": self.figure.unit,
            "seed_low": self.figure.low,
            "seed_high": self.figure.high,
            "source": self.figure.source,
            "faultline": self.faultline,
            "ratio": self.ratio(),
            "status": self.status(),
            "cause": self.cause,
        })
    }
}

/// The lines a bench prints under its table: one per comparison.
pub fn render_lines(comparisons: &[Comparison]) -> String {
    let mut s = String::new();
    for c in comparisons {
        let _ = writeln!(
            s,
            "seed {} {} ({}): faultline {}, seed {} ({}); ratio {}; {}",
            c.figure.seed,
            c.figure.what,
            c.setup,
            c.faultline_text(),
            c.figure.show(),
            c.figure.source,
            c.ratio_text(),
            c.verdict()
        );
    }
    s
}

/// A bench's output with its comparisons: appended lines to a table, a
/// `comparisons` array in a JSON object.
pub fn attach(output: String, json: bool, comparisons: &[Comparison]) -> String {
    if comparisons.is_empty() {
        return output;
    }
    if json {
        if let Ok(serde_json::Value::Object(mut map)) =
            serde_json::from_str::<serde_json::Value>(&output)
        {
            map.insert(
                "comparisons".into(),
                comparisons.iter().map(Comparison::to_json).collect(),
            );
            return super::json_text(&serde_json::Value::Object(map));
        }
        return output;
    }
    output + &render_lines(comparisons)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_follows_the_tolerance() {
        let cache = Comparison::measured("004.ctxsw.cache4_over_native", "x", 1.41);
        assert_eq!(cache.status(), Status::Met);
        let shadow = Comparison::measured("004.ctxsw.shadow_over_cache4", "x", 2.27);
        assert_eq!(shadow.status(), Status::NotMet);
        assert_eq!(shadow.verdict(), "not met: cause not measured");
        // A range: -47.5 % to -53.5 %, widened by 10 % of 53.5.
        let f = figure("001.dirty_log.resume");
        assert!(f.holds(-58.0) && f.holds(-43.0) && !f.holds(-42.0) && !f.holds(-59.0));
        let none = Comparison::not_run("002.postcopy.without_load", "x", "not run");
        assert_eq!(none.status(), Status::NotComparable);
        assert_eq!(none.verdict(), "not comparable: not run");
    }

    #[test]
    fn keys_are_unique_and_ranges_ordered() {
        for (i, f) in FIGURES.iter().enumerate() {
            assert!(f.low <= f.high, "{}", f.key);
            assert!(f.key.starts_with(f.seed), "{}", f.key);
            assert!(FIGURES[..i].iter().all(|g| g.key != f.key), "{}", f.key);
        }
    }
}
