//! A small differential run as part of the test suite: random instruction
//! sequences on the host CPU and in the interpreter must agree exactly.
//! (Runs natively, so only on x86-64 Linux.)
#![cfg(all(target_arch = "x86_64", target_os = "linux"))]

use machine::difftest::compare::text_report;
use machine::difftest::gen::Group;
use machine::difftest::{panics, run_campaign, CampaignReport, GenConfig};

#[test]
fn three_hundred_random_sequences_match_the_host_cpu() {
    panics::install_quiet_hook();
    let report =
        run_campaign(0x5eed, 0, 300, &GenConfig::for_host(), |_, _| {}).expect("native runner");
    assert_eq!(report.cases, 300);
    // The generator must exercise both ways of stopping.
    assert!(
        report.native_stops.get("finished").copied().unwrap_or(0) > 200,
        "{:?}",
        report.native_stops
    );
    assert!(
        report.native_stops.get("#DE/SIGFPE").copied().unwrap_or(0) > 0,
        "{:?}",
        report.native_stops
    );
    assert_no_mismatches(&report);
}

/// Fails with the first mismatching cases' reports, if any.
fn assert_no_mismatches(report: &CampaignReport) {
    let shown: Vec<String> = report
        .mismatches
        .iter()
        .take(5)
        .map(|o| text_report(&o.case, &o.native, &o.interp, &o.differences))
        .collect();
    assert!(
        report.mismatches.is_empty(),
        "{} of {} cases mismatch; first ones:\n{}",
        report.mismatches.len(),
        report.cases,
        shown.join("\n")
    );
}

#[test]
fn three_hundred_sse_sequences_match_the_host_cpu() {
    panics::install_quiet_hook();
    let config = GenConfig {
        groups: vec![Group::Sse],
        ..GenConfig::for_host()
    };
    let report = run_campaign(0x55e, 0, 300, &config, |_, _| {}).expect("native runner");
    assert_eq!(report.cases, 300);
    // Finishing, SIMD floating-point exceptions (#XM) and alignment or
    // page faults all occur.
    for stop in ["finished", "#XM/#MF/SIGFPE", "#GP/#PF/SIGSEGV"] {
        assert!(
            report.native_stops.get(stop).copied().unwrap_or(0) > 0,
            "{stop}: {:?}",
            report.native_stops
        );
    }
    assert_no_mismatches(&report);
}
