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

#[test]
fn three_hundred_xsave_sequences_match_the_host_cpu() {
    if !(std::arch::is_x86_feature_detected!("xsave")
        && std::arch::is_x86_feature_detected!("xsaveopt"))
    {
        eprintln!("host has no XSAVE/XSAVEOPT: nothing to compare");
        return;
    }
    panics::install_quiet_hook();
    let config = GenConfig {
        groups: vec![Group::Xsave],
        ..GenConfig::for_host()
    };
    // The cases run XSAVE, XSAVEOPT and XRSTOR (not only their neighbours).
    let mut family = std::collections::BTreeMap::new();
    for index in 0..300 {
        let case = machine::difftest::gen::generate_case(0x75a, index, &config);
        let mut decoder =
            iced_x86::Decoder::with_ip(64, &case.code, 0, iced_x86::DecoderOptions::NONE);
        for insn in &mut decoder {
            let name = format!("{:?}", insn.mnemonic());
            if name.starts_with("Xsave") || name.starts_with("Xrstor") {
                *family.entry(name).or_insert(0u32) += 1;
            }
        }
    }
    for m in [
        "Xsave",
        "Xsave64",
        "Xsaveopt",
        "Xsaveopt64",
        "Xrstor",
        "Xrstor64",
    ] {
        assert!(family.get(m).copied().unwrap_or(0) > 10, "{m}: {family:?}");
    }
    let report = run_campaign(0x75a, 0, 300, &config, |_, _| {}).expect("native runner");
    assert_eq!(report.cases, 300);
    for stop in ["finished", "#GP/#PF/SIGSEGV"] {
        assert!(
            report.native_stops.get(stop).copied().unwrap_or(0) > 0,
            "{stop}: {:?}",
            report.native_stops
        );
    }
    assert_no_mismatches(&report);
}
