//! Live migration, pre-copy, between two real faultline processes over
//! loopback TCP: the guest's results survive (pagetag's 0 bad pages, with
//! overcommit on either side), the destination's output continues the
//! source's, the same migration repeats its figures, a dropped
//! connection leaves the source running and reporting, and the
//! destination refuses a damaged or hostile stream cleanly.
#![cfg(bundled_kernel)]

mod common;
use common::{faultline, stderr, stdout, SMALL_OVERCOMMIT, SMALL_PAGETAG};

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Output};

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: stdout is not JSON: {text}"))
}

/// A destination listening on a free loopback port, and its address.
fn destination(extra: &[&str]) -> (Child, String, std::thread::JoinHandle<String>) {
    let mut args = vec!["--stats", "json", "--timeout", "30s"];
    args.extend_from_slice(extra);
    common::incoming(&args)
}

fn source(args: &[&str], to: &str, at: &str, extra: &[&str], program: &[&str]) -> Output {
    let mut all = vec!["run", "--stats", "json"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--migrate-to", to, "--migrate-at", at]);
    all.extend_from_slice(extra);
    all.push("--");
    all.extend_from_slice(program);
    faultline(&all)
}

struct Migration {
    source: serde_json::Value,
    destination: serde_json::Value,
}

/// Migrates `program` from a source run with `args` to a destination run
/// with `dest_extra`; both must succeed.
fn migrate(
    args: &[&str],
    at: &str,
    extra: &[&str],
    dest_extra: &[&str],
    program: &[&str],
) -> Migration {
    let (child, addr, dest_err) = destination(dest_extra);
    let src = source(args, &addr, at, extra, program);
    let dst = child.wait_with_output().expect("destination");
    let dst_err = dest_err.join().expect("stderr thread");
    let src_text = stdout(&src);
    assert!(src.status.success(), "source: {src_text}\n{}", stderr(&src));
    let source = json(&src_text);
    assert_eq!(
        source["stop"]["reason"],
        "migrated",
        "source: {src_text}\n{}",
        stderr(&src)
    );
    let dst_text = stdout(&dst);
    assert!(
        dst.status.success(),
        "destination: {dst_text}\n{dst_err}\nsource: {}",
        stderr(&src)
    );
    Migration {
        source,
        destination: json(&dst_text),
    }
}

fn console(v: &serde_json::Value) -> &str {
    v["console"].as_str().expect("console")
}

/// Two runs of one migration printed the same figures: the source's
/// migration report (but the destination's address, a free port each
/// time), the destination's output, virtual time and post-copy figures.
fn assert_same_figures(first: &Migration, second: &Migration, what: &str) {
    let mut a = first.source["migration"].clone();
    let mut b = second.source["migration"].clone();
    a["to"] = serde_json::Value::Null;
    b["to"] = serde_json::Value::Null;
    assert_eq!(a, b, "the same {what} migration printed other figures");
    assert_eq!(
        console(&first.destination),
        console(&second.destination),
        "{what}"
    );
    assert_eq!(
        first.destination["virtual_cycles"], second.destination["virtual_cycles"],
        "{what}"
    );
    assert_eq!(
        first.destination["postcopy"], second.destination["postcopy"],
        "{what}"
    );
}

#[test]
fn pagetag_migrates_with_0_bad_pages_and_overcommit_on_either_side() {
    // Overcommitted at the source, at the destination, at both.
    let cases: [(&[&str], &[&str]); 3] = [
        (&SMALL_OVERCOMMIT, &["--host-mem", "48M"]),
        (
            &["--vcpus", "2", "--mem", "48M", "--swap-device", "nvme"],
            &["--host-mem", "8M"],
        ),
        (&SMALL_OVERCOMMIT, &[]),
    ];
    for (apf, (args, dest)) in [
        ["pv", "x86"],
        ["pv", "event"],
        ["halt", "x86"],
        ["off", "x86"],
    ]
    .iter()
    .zip(cases.iter().cycle())
    {
        let mut args = args.to_vec();
        args.extend_from_slice(&["--apf", apf[0], "--apf-protocol", apf[1]]);
        // pagetag ends near 7.7 ms of virtual time: at 3 ms a pre-copy of
        // about 4.7 ms (nvme, no overcommit at the source) ended with it
        // by tens of microseconds, so the migration is started earlier.
        let at = if args.contains(&"8M") { "100ms" } else { "2ms" };
        let m = migrate(&args, at, &[], dest, &SMALL_PAGETAG);
        let out = console(&m.destination);
        assert!(
            out.contains(" 0 bad pages"),
            "{apf:?} {args:?} -> {dest:?}: {out}"
        );
        // The destination's output continues the source's: the source
        // printed the boot, the destination the program's result.
        assert!(console(&m.source).contains("smp: 2 cpu(s) online"));
        assert!(!console(&m.destination).contains("smp: 2 cpu(s) online"));
        let report = &m.source["migration"];
        assert!(report["pages_sent"].as_u64().unwrap() > 1000, "{report}");
        assert!(report["failed"].is_null(), "{report}");
    }
}

#[test]
fn pagetag_migrates_under_shadow_paging() {
    for apf in [["pv", "event"], ["halt", "x86"]] {
        let mut args = SMALL_OVERCOMMIT.to_vec();
        args.extend_from_slice(&["--mmu", "shadow", "--apf", apf[0], "--apf-protocol", apf[1]]);
        // A slower link and a tight limit: more than one round.
        let extra = ["--link-bandwidth", "1G", "--downtime-limit", "2ms"];
        let m = migrate(&args, "100ms", &extra, &[], &SMALL_PAGETAG);
        let out = console(&m.destination);
        assert!(out.contains(" 0 bad pages"), "{apf:?}: {out}");
        assert_eq!(m.destination["mmu"], "shadow");
        assert!(m.source["migration"]["rounds"].as_u64().unwrap() >= 2);
    }
}

#[test]
fn bm_migrates_over_several_rounds_and_repeats_its_figures() {
    let program = ["bm", "-f", "2", "-w", "2", "-m", "16M", "-t", "0.2"];
    let args = ["--vcpus", "2", "--mem", "64M"];
    // A link and a downtime limit the writers never let converge: the
    // round cap ends pre-copy.
    let extra = [
        "--link-bandwidth",
        "1G",
        "--downtime-limit",
        "1ms",
        "--max-rounds",
        "3",
    ];
    let first = migrate(&args, "20ms", &extra, &[], &program);
    let second = migrate(&args, "20ms", &extra, &[], &program);
    let report = &first.source["migration"];
    assert_eq!(report["rounds"], 3, "{report}");
    assert!(report["final_pages"].as_u64().unwrap() > 0, "{report}");
    assert!(report["downtime_ms"].as_f64().unwrap() > 0.0, "{report}");
    assert!(console(&first.destination).contains("total: "));
    assert_same_figures(&first, &second, "pre-copy");
    assert_eq!(console(&first.source), console(&second.source));
}

/// Pre-copy reads the swapped-out half of an overcommitted guest through
/// the swap device (hdd: one read at a time, 4-17 ms each), so its round
/// lasts until the last read is done, and the guest's own page-ins queue
/// behind those reads: the summary says how long the guest stalled during
/// pre-copy beside the short downtime, and its vCPU time adds up.
#[test]
fn precopy_reports_the_guest_stalled_behind_its_swap_reads() {
    let args = [
        "--vcpus",
        "2",
        "--mem",
        "48M",
        "--host-mem",
        "8M",
        "--swap-device",
        "hdd",
    ];
    let m = migrate(&args, "100ms", &[], &[], &SMALL_PAGETAG);
    let report = &m.source["migration"];
    let swap_reads = m.source["memory"]["swap_reads"].as_u64().unwrap();
    let precopy_ms = report["precopy_ms"].as_f64().unwrap();
    assert!(
        swap_reads > 1000,
        "pages came from swap: {}",
        m.source["memory"]
    );
    // At least the device's shortest latency for each read, one at a time.
    assert!(precopy_ms >= swap_reads as f64 * 4.0, "{report}");
    assert!(report["downtime_ms"].as_f64().unwrap() < 1.0, "{report}");
    let guest = &report["guest_during_precopy"];
    let part = |key: &str| {
        guest[key]
            .as_f64()
            .unwrap_or_else(|| panic!("{key}: {guest}"))
    };
    let vcpu_ms = 2.0 * precopy_ms;
    let sum = part("busy_ms") + part("stalled_ms") + part("idle_ms");
    assert!(
        (sum - vcpu_ms).abs() <= vcpu_ms * 0.01,
        "{sum} of {vcpu_ms}: {guest}"
    );
    assert!(part("stalled_ms") > 0.9 * vcpu_ms, "{guest}");
    assert!(console(&m.destination).contains(" 0 bad pages"));
}

#[test]
fn hello_output_continues_unbroken() {
    let whole = faultline(&["run", "--vcpus", "2", "--stats", "json", "--", "hello"]);
    let whole = json(&stdout(&whole));
    for mode in ["precopy", "postcopy", "hybrid"] {
        let extra = ["--migrate-mode", mode];
        let m = migrate(&["--vcpus", "2"], "300us", &extra, &[], &["hello"]);
        assert_eq!(
            format!("{}{}", console(&m.source), console(&m.destination)),
            console(&whole),
            "{mode}"
        );
    }
}

/// A destination that takes the hello and some pages, then drops the
/// connection.
fn dropping_destination() -> (String, std::thread::JoinHandle<u64>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let handle = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().expect("accept");
        let mut buf = vec![0u8; 1 << 20];
        let mut got = 0u64;
        while got < (1 << 20) {
            match stream.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => got += n as u64,
            }
        }
        drop(stream);
        got
    });
    (addr, handle)
}

/// A source whose migration failed ran its guest to the end here, with
/// no page lost, and reported the failure: status 3, the run did not do
/// what was asked.
fn source_kept_running(out: &std::process::Output) {
    let text = stdout(out);
    assert_eq!(out.status.code(), Some(3), "{text}\n{}", stderr(out));
    let v = json(&text);
    assert_eq!(
        v["stop"]["reason"], "shutdown",
        "the guest ran to its end here"
    );
    assert!(console(&v).contains(" 0 bad pages"), "{}", console(&v));
    assert!(v["migration"]["failed"].is_string(), "{}", v["migration"]);
}

#[test]
fn a_dropped_connection_leaves_the_source_running() {
    let (addr, handle) = dropping_destination();
    let out = source(&SMALL_OVERCOMMIT, &addr, "100ms", &[], &SMALL_PAGETAG);
    let got = handle.join().expect("fake destination");
    assert!(got > 0, "the source sent nothing");
    source_kept_running(&out);
    assert!(stderr(&out).contains("migration to"), "{}", stderr(&out));
}

#[test]
fn no_destination_is_a_reported_failure() {
    // A port nobody listens on: bind one, then free it.
    let addr = {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").to_string()
    };
    let out = source(&["--vcpus", "2"], &addr, "300us", &[], &["hello"]);
    let v = json(&stdout(&out));
    assert_eq!(
        out.status.code(),
        Some(3),
        "a failed migration fails the run"
    );
    assert_eq!(v["stop"]["reason"], "shutdown");
    assert!(v["migration"]["failed"]
        .as_str()
        .unwrap()
        .contains("connecting"));
}

/// Frames as the source sends them.
fn frame(kind: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&kind.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

fn hello(mem: u64, vcpus: u32) -> Vec<u8> {
    let mut p = b"FLTMIGR\0".to_vec();
    p.extend_from_slice(&1u32.to_le_bytes());
    p.extend_from_slice(&mem.to_le_bytes());
    p.extend_from_slice(&vcpus.to_le_bytes());
    frame(1, &p)
}

/// A `Pending` / `Need` payload.
fn gfn_list(gfns: &[u64]) -> Vec<u8> {
    let mut p = (gfns.len() as u32).to_le_bytes().to_vec();
    for g in gfns {
        p.extend_from_slice(&g.to_le_bytes());
    }
    p
}

/// A `LinkModel` payload.
fn link_model(bandwidth: u64, latency_ns: u64) -> Vec<u8> {
    let mut p = bandwidth.to_le_bytes().to_vec();
    p.extend_from_slice(&latency_ns.to_le_bytes());
    p
}

#[test]
fn the_destination_refuses_bad_streams() {
    let page_outside = {
        let mut p = 1u32.to_le_bytes().to_vec();
        p.extend_from_slice(&(1u64 << 40).to_le_bytes());
        p.extend_from_slice(&[0u8; 4096]);
        frame(2, &p)
    };
    let corrupted = {
        let mut f = hello(64 << 20, 2);
        let last = f.len() - 1;
        f[last] ^= 1;
        f
    };
    let huge = {
        let mut f = frame(3, &[]);
        f[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        f
    };
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("garbage", b"GET / HTTP/1.1\r\n\r\n".to_vec()),
        ("corrupted hello", corrupted),
        ("a hostile guest size", hello(!0x1f_ffff, 2)),
        (
            "a page outside the guest",
            [hello(64 << 20, 2), page_outside].concat(),
        ),
        ("a huge state", [hello(64 << 20, 2), huge].concat()),
        (
            "a state that is not one",
            [hello(64 << 20, 2), frame(3, b"nonsense")].concat(),
        ),
        ("closed early", hello(64 << 20, 2)),
        (
            "pages to come without a link model",
            [hello(64 << 20, 2), frame(6, &gfn_list(&[1, 2]))].concat(),
        ),
        (
            "a link of no bandwidth",
            [hello(64 << 20, 2), frame(11, &[0u8; 16])].concat(),
        ),
        (
            "a page to come outside the guest",
            [
                hello(64 << 20, 2),
                frame(11, &link_model(1 << 30, 25_000)),
                frame(6, &gfn_list(&[1 << 40])),
            ]
            .concat(),
        ),
        (
            "a page list that lies about its count",
            [
                hello(64 << 20, 2),
                frame(11, &link_model(1 << 30, 25_000)),
                frame(6, &[9, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]),
            ]
            .concat(),
        ),
    ];
    for (what, bytes) in cases {
        let (child, addr, err) = destination(&[]);
        let mut stream = TcpStream::connect(&addr).expect("connect");
        stream.write_all(&bytes).expect("send");
        let _ = stream.shutdown(std::net::Shutdown::Write);
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer);
        let out = child.wait_with_output().expect("destination");
        let err = err.join().expect("stderr");
        assert!(!out.status.success(), "{what}: accepted");
        assert!(err.contains("incoming migration from"), "{what}: {err}");
        assert!(!err.contains("panicked"), "{what}: {err}");
    }
}

/// A temporary path for a bench's plot (`tag` tells the benches apart).
fn temp_plot(tag: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("faultline-test-{}-{tag}.svg", std::process::id()))
}

/// The plot at `path`, checked to be an SVG, and removed.
fn take_plot(path: &std::path::Path) -> String {
    let svg = std::fs::read_to_string(path).expect("the plot");
    assert!(svg.contains("<svg"), "not an SVG");
    let _ = std::fs::remove_file(path);
    svg
}

/// Runs a `--json` bench twice: it succeeds and prints the same both
/// times; its JSON.
fn bench_json_twice(args: &[&str]) -> serde_json::Value {
    let first = faultline(args);
    let second = faultline(args);
    assert!(first.status.success(), "{}", stderr(&first));
    assert_eq!(
        stdout(&first),
        stdout(&second),
        "same command, other figures"
    );
    json(&stdout(&first))
}

#[test]
fn bench_migrate_repeats_and_measures_the_fast_page_fault() {
    let plot = temp_plot("precopy");
    let plot_arg = plot.to_str().expect("utf-8 path").to_string();
    let args = [
        "bench",
        "migrate",
        "--json",
        "--duration",
        "0.06",
        "--at",
        "10ms",
        "--max-rounds",
        "2",
        "--plot",
        &plot_arg,
    ];
    let v = bench_json_twice(&args);
    let rows = v["results"].as_array().expect("results");
    // EPT and shadow paging (seed 001's two autotest cases), fast PF on
    // then off for each.
    assert_eq!(rows.len(), 4);
    for (pair, mmu) in rows.chunks(2).zip(["ept", "shadow"]) {
        let (on, off) = (&pair[0], &pair[1]);
        assert_eq!(on["mmu"], mmu, "{on}");
        assert_eq!(off["mmu"], mmu, "{off}");
        assert_eq!(on["fast_pf"], true);
        assert_eq!(off["fast_pf"], false);
        assert_eq!(on["rounds"], 2, "{on}");
        for r in pair {
            assert!(r["dirty_log_faults"].as_i64().unwrap() > 0, "{r}");
            assert!(r["guest_total"].as_u64().unwrap() > 0, "{r}");
        }
        assert_eq!(off["fast_pf_fixed"], 0, "{off}");
    }
    assert!(
        rows[0]["fast_pf_fixed"].as_u64().unwrap() > 0,
        "{}",
        rows[0]
    );
    // Both totals are compared with the seed's.
    let keys: Vec<&str> = v["comparisons"]
        .as_array()
        .expect("comparisons")
        .iter()
        .filter(|c| c["faultline"].is_f64())
        .map(|c| c["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["001.migrate.total_ept", "001.migrate.total_shadow"]);
    let svg = take_plot(&plot);
    assert!(svg.contains("shadow, fast PF on"), "a bar per row");
}

#[test]
fn a_destination_killed_during_precopy_leaves_the_source_running() {
    // The real destination is frozen (SIGSTOP) once it listens: the
    // source connects (the kernel accepts into the backlog) and its
    // pre-copy blocks once the socket buffers are full (the guest's
    // 20+ MiB cannot fit); then the destination is killed (SIGKILL), and
    // the source's next write fails.
    let (mut child, addr, _err) = destination(&[]);
    let pid = child.id() as libc::pid_t;
    // SAFETY: kill(2) on the pid of a child this test spawned and has not
    // reaped; no memory is involved.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    let source = std::thread::spawn(move || {
        source(
            &["--vcpus", "2", "--mem", "64M"],
            &addr,
            "5ms",
            &[],
            &["pagetag", "-m", "32M", "-p", "2", "-t", "2"],
        )
    });
    std::thread::sleep(std::time::Duration::from_secs(2));
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let _ = child.wait();
    let out = source.join().expect("source thread");
    source_kept_running(&out);
}

/// The destination's post-copy figures, checked for a migration that
/// really went by post-copy: pages came after the switch-over, some were
/// asked for by a first touch, every one arrived.
fn postcopy_happened(m: &Migration, what: &str) {
    let dst = &m.destination["postcopy"];
    let src = &m.source["migration"];
    assert!(src["failed"].is_null(), "{what}: {src}");
    let pages = dst["pages"].as_u64().unwrap_or(0);
    assert!(pages > 1000, "{what}: {dst}");
    assert_eq!(
        src["postcopy"]["pages"].as_u64(),
        Some(pages),
        "{what}: {src}"
    );
    assert!(dst["requested"].as_u64().unwrap() > 0, "{what}: {dst}");
    assert!(dst["waited"].as_u64().unwrap() > 0, "{what}: {dst}");
    assert!(dst["complete_ms"].as_f64().unwrap() > 0.0, "{what}: {dst}");
}

/// MMU, `--apf`, protocol, the source's options, the destination's.
type Case<'a> = (&'a str, &'a str, &'a str, &'a [&'a str], &'a [&'a str]);

#[test]
fn pagetag_survives_postcopy_under_ept_and_shadow_each_apf_mode_and_overcommit() {
    let cases: [Case; 6] = [
        (
            "ept",
            "pv",
            "x86",
            &SMALL_OVERCOMMIT,
            &["--host-mem", "48M"],
        ),
        (
            "ept",
            "halt",
            "x86",
            &["--vcpus", "2", "--mem", "48M", "--swap-device", "nvme"],
            &["--host-mem", "8M"],
        ),
        ("ept", "off", "x86", &SMALL_OVERCOMMIT, &[]),
        (
            "shadow",
            "pv",
            "event",
            &["--vcpus", "2", "--mem", "48M", "--swap-device", "nvme"],
            &["--host-mem", "8M"],
        ),
        ("shadow", "halt", "x86", &SMALL_OVERCOMMIT, &[]),
        (
            "shadow",
            "off",
            "x86",
            &SMALL_OVERCOMMIT,
            &["--host-mem", "48M"],
        ),
    ];
    for (mmu, apf, protocol, args, dest) in cases {
        let mut args = args.to_vec();
        args.extend_from_slice(&["--mmu", mmu, "--apf", apf, "--apf-protocol", protocol]);
        let at = if args.contains(&"8M") { "100ms" } else { "3ms" };
        let what = format!("{mmu} {apf} {protocol} {args:?} -> {dest:?}");
        let m = migrate(
            &args,
            at,
            &["--migrate-mode", "postcopy"],
            dest,
            &SMALL_PAGETAG,
        );
        let out = console(&m.destination);
        assert!(out.contains(" 0 bad pages"), "{what}: {out}");
        assert!(console(&m.source).contains("smp: 2 cpu(s) online"));
        assert_eq!(m.source["migration"]["mode"], "postcopy");
        assert_eq!(m.destination["mmu"], mmu);
        postcopy_happened(&m, &what);
    }
}

#[test]
fn postcopy_pv_lets_the_guest_run_other_tasks_while_pages_come() {
    // With --apf pv a vCPU whose first touch waits for a page gets a
    // page-not-present and schedules another task: the async-PF counters
    // at the destination move.
    let mut args = SMALL_OVERCOMMIT.to_vec();
    args.extend_from_slice(&["--apf", "pv"]);
    let m = migrate(
        &args,
        "100ms",
        &["--migrate-mode", "postcopy"],
        &["--host-mem", "48M"],
        &SMALL_PAGETAG,
    );
    postcopy_happened(&m, "pv");
    let apf = &m.destination["apf"];
    let before = &m.source["apf"];
    assert!(
        apf["not_present_sent"].as_u64() > before["not_present_sent"].as_u64(),
        "destination {apf}\nsource {before}"
    );
}

#[test]
fn the_same_postcopy_migration_repeats_its_figures() {
    let mut args = SMALL_OVERCOMMIT.to_vec();
    args.extend_from_slice(&["--apf", "pv"]);
    let extra = ["--migrate-mode", "postcopy", "--link-bandwidth", "1G"];
    let first = migrate(&args, "100ms", &extra, &[], &SMALL_PAGETAG);
    let second = migrate(&args, "100ms", &extra, &[], &SMALL_PAGETAG);
    postcopy_happened(&first, "first");
    assert_same_figures(&first, &second, "post-copy");
    assert_eq!(first.destination["apf"], second.destination["apf"]);
}

/// A hybrid migration's options: at most two pre-copy rounds on a link
/// of `bandwidth` with a downtime limit of `limit`, then post-copy.
fn hybrid<'a>(bandwidth: &'a str, limit: &'a str) -> [&'a str; 8] {
    [
        "--migrate-mode",
        "hybrid",
        "--max-rounds",
        "2",
        "--link-bandwidth",
        bandwidth,
        "--downtime-limit",
        limit,
    ]
}

/// The hybrid matrix: EPT and shadow paging, each `--apf` mode, both
/// async-PF protocols, and `--host-mem` overcommit at the source only, at
/// the destination only, on both sides and on neither (the acceptance's
/// matrix; post-copy and pre-copy have theirs above). Each case is small:
/// two pre-copy rounds on a slow link, then post-copy.
#[test]
fn pagetag_survives_hybrid_migration_across_the_matrix() {
    const NOT_OVERCOMMITTED: [&str; 6] = ["--vcpus", "2", "--mem", "48M", "--swap-device", "nvme"];
    // The destination's `--host-mem`: 48M is the whole guest (no
    // overcommit there), 8M overcommits it, none keeps the source's.
    let cases: [Case; 8] = [
        ("ept", "pv", "x86", &SMALL_OVERCOMMIT, &[]),
        (
            "ept",
            "pv",
            "event",
            &NOT_OVERCOMMITTED,
            &["--host-mem", "8M"],
        ),
        (
            "ept",
            "halt",
            "x86",
            &SMALL_OVERCOMMIT,
            &["--host-mem", "48M"],
        ),
        ("ept", "off", "event", &NOT_OVERCOMMITTED, &[]),
        ("shadow", "pv", "event", &SMALL_OVERCOMMIT, &[]),
        (
            "shadow",
            "pv",
            "x86",
            &SMALL_OVERCOMMIT,
            &["--host-mem", "48M"],
        ),
        (
            "shadow",
            "halt",
            "event",
            &NOT_OVERCOMMITTED,
            &["--host-mem", "8M"],
        ),
        ("shadow", "off", "x86", &NOT_OVERCOMMITTED, &[]),
    ];
    for (mmu, apf, protocol, args, dest) in cases {
        let mut args = args.to_vec();
        args.extend_from_slice(&["--mmu", mmu, "--apf", apf, "--apf-protocol", protocol]);
        // A slow link and a tight limit: two pre-copy rounds, then the
        // pages dirtied meanwhile go by post-copy. Without overcommit the
        // guest runs 9 ms in all: earlier, on a faster link with a tighter
        // limit (two rounds of ~1,500 pages, then ~300 by post-copy), or
        // it ends during pre-copy.
        let (at, bandwidth, limit) = if args.contains(&"8M") {
            ("100ms", "256M", "1ms")
        } else {
            ("2ms", "4G", "100us")
        };
        let extra = hybrid(bandwidth, limit);
        let what = format!("{mmu} {apf} {protocol} {args:?} -> {dest:?}");
        let m = migrate(&args, at, &extra, dest, &SMALL_PAGETAG);
        let out = console(&m.destination);
        assert!(out.contains(" 0 bad pages"), "{what}: {out}");
        assert!(
            console(&m.source).contains("smp: 2 cpu(s) online"),
            "{what}"
        );
        assert!(!out.contains("smp: 2 cpu(s) online"), "{what}: {out}");
        assert_eq!(m.destination["mmu"], mmu, "{what}");
        let src = &m.source["migration"];
        assert_eq!(src["mode"], "hybrid", "{what}: {src}");
        assert_eq!(src["rounds"], 2, "{what}: {src}");
        let after = src["postcopy"]["pages"].as_u64().unwrap();
        assert!(after > 0, "{what}: {src}");
        assert!(src["pages_sent"].as_u64().unwrap() > after, "{what}: {src}");
        assert_eq!(
            m.destination["postcopy"]["pages"].as_u64(),
            Some(after),
            "{what}"
        );
    }
}

#[test]
fn the_same_hybrid_migration_repeats_its_figures() {
    let mut args = SMALL_OVERCOMMIT.to_vec();
    args.extend_from_slice(&["--apf", "pv"]);
    let extra = hybrid("256M", "1ms");
    let dest = ["--host-mem", "48M"];
    let m = migrate(&args, "100ms", &extra, &dest, &SMALL_PAGETAG);
    let again = migrate(&args, "100ms", &extra, &dest, &SMALL_PAGETAG);
    assert!(console(&m.destination).contains(" 0 bad pages"));
    assert!(m.source["migration"]["postcopy"]["pages"].as_u64() > Some(0));
    assert_same_figures(&m, &again, "hybrid");
}

/// A TCP proxy in front of `to` (the test's way to cut a connection):
/// forwards each connection both ways; the first is cut, both ways, once
/// `cut_after` bytes went from the client (the source) to the server;
/// with `refuse_later`, every later connection is closed at once.
fn cutting_proxy(to: String, cut_after: u64, refuse_later: bool) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    std::thread::spawn(move || {
        for (n, client) in listener.incoming().enumerate() {
            let Ok(client) = client else { continue };
            if n > 0 && refuse_later {
                drop(client);
                continue;
            }
            let Ok(server) = TcpStream::connect(&to) else {
                continue;
            };
            let limit = if n == 0 { cut_after } else { u64::MAX };
            let (mut c_in, mut s_out) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            let (mut s_in, mut c_out) = (server, client);
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 64 << 10];
                let mut passed = 0u64;
                loop {
                    let want = buf.len().min((limit - passed).min(1 << 30) as usize);
                    if want == 0 {
                        break;
                    }
                    match c_in.read(&mut buf[..want]) {
                        Ok(0) | Err(_) => break,
                        Ok(k) => {
                            if s_out.write_all(&buf[..k]).is_err() {
                                break;
                            }
                            passed += k as u64;
                        }
                    }
                }
                let _ = c_in.shutdown(std::net::Shutdown::Both);
                let _ = s_out.shutdown(std::net::Shutdown::Both);
            });
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut s_in, &mut c_out);
                let _ = s_in.shutdown(std::net::Shutdown::Both);
                let _ = c_out.shutdown(std::net::Shutdown::Both);
            });
        }
    });
    addr
}

#[test]
fn a_connection_cut_during_postcopy_pauses_and_a_reconnect_completes_it() {
    for apf in ["pv", "off"] {
        let (child, dest_addr, dest_err) = destination(&[]);
        // 2 MiB in: past the state (tens of KiB), a few hundred pages into
        // the 20 MiB still to come.
        let proxy = cutting_proxy(dest_addr, 2 << 20, false);
        let mut args = SMALL_OVERCOMMIT.to_vec();
        args.extend_from_slice(&["--apf", apf]);
        let src = source(
            &args,
            &proxy,
            "100ms",
            &["--migrate-mode", "postcopy"],
            &SMALL_PAGETAG,
        );
        let dst = child.wait_with_output().expect("destination");
        let dst_err = dest_err.join().expect("stderr");
        assert!(
            src.status.success(),
            "{apf}: {}\n{}",
            stdout(&src),
            stderr(&src)
        );
        assert!(dst.status.success(), "{apf}: {}\n{dst_err}", stdout(&dst));
        let (s, d) = (json(&stdout(&src)), json(&stdout(&dst)));
        assert!(
            console(&d).contains(" 0 bad pages"),
            "{apf}: {}",
            console(&d)
        );
        assert_eq!(
            s["migration"]["postcopy"]["reconnects"], 1,
            "{}",
            s["migration"]
        );
        assert_eq!(d["postcopy"]["reconnects"], 1, "{}", d["postcopy"]);
        assert!(dst_err.contains("the source is back"), "{dst_err}");
        assert!(stderr(&src).contains("reconnected to"), "{}", stderr(&src));
    }
}

#[test]
fn a_destination_whose_pages_never_come_stops_with_an_error() {
    let (child, dest_addr, dest_err) = destination(&["--reconnect-timeout", "3s"]);
    let proxy = cutting_proxy(dest_addr, 2 << 20, true);
    let extra = ["--migrate-mode", "postcopy", "--reconnect-timeout", "3s"];
    let src = source(&SMALL_OVERCOMMIT, &proxy, "100ms", &extra, &SMALL_PAGETAG);
    let dst = child.wait_with_output().expect("destination");
    let dst_err = dest_err.join().expect("stderr");
    // The source cannot go on (the destination ran the VM) and says so.
    assert!(!src.status.success(), "{}", stderr(&src));
    let s = json(&stdout(&src));
    assert!(s["migration"]["failed"].is_string(), "{}", s["migration"]);
    // The destination never ran on a page it did not have: it stopped
    // with an error and a nonzero status.
    assert!(!dst.status.success(), "{}\n{dst_err}", stdout(&dst));
    assert!(!dst_err.contains("panicked"), "{dst_err}");
    assert!(dst_err.contains("did not come back"), "{dst_err}");
    let d = json(&stdout(&dst));
    assert!(!console(&d).contains("bad pages"), "{}", console(&d));
}

#[test]
fn bench_migrate_postcopy_repeats_and_measures_seed_002s_case() {
    let plot = temp_plot("postcopy");
    let plot_arg = plot.to_str().expect("utf-8 path").to_string();
    let args = [
        "bench",
        "migrate",
        "--postcopy",
        "--json",
        "--mem",
        "32M",
        "--array",
        "8M",
        "--loops",
        "20",
        "--at",
        "25ms",
        "--link-bandwidth",
        "64M",
        "--plot",
        &plot_arg,
    ];
    let v = bench_json_twice(&args);
    let rows = v["results"].as_array().expect("results");
    // With the calculation thread, then without (seed 002's no-load
    // case), async PF off then on for each.
    assert_eq!(rows.len(), 4);
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(r["load"], i < 2, "{r}");
        assert_eq!(r["apf"], if i % 2 == 0 { "off" } else { "pv" }, "{r}");
        assert!(r["pages"].as_u64().unwrap() > 0, "{r}");
        assert!(r["waited"].as_u64().unwrap() > 0, "{r}");
        assert_eq!(r["calc"].as_u64().unwrap() > 0, i < 2, "{r}");
        assert!(
            r["during_instructions_unmigrated"].as_u64().unwrap() > 0,
            "{r}"
        );
    }
    // The writer alone ends sooner: it migrates earlier, at the same
    // point of its run.
    let at = |r: &serde_json::Value| r["at_ms"].as_f64().unwrap();
    assert_eq!(at(&rows[0]), 25.0);
    assert!(at(&rows[2]) > 0.0 && at(&rows[2]) < 25.0, "{}", rows[2]);
    // Only with async PF does the guest get page-not-present
    // notifications to run its calculation while pages come.
    let (off, pv) = (&rows[0], &rows[1]);
    assert_eq!(off["not_present"], 0, "{off}");
    assert!(pv["not_present"].as_u64().unwrap() > 0, "{pv}");
    // Both of the seed's figures have faultline's beside them.
    let measured = v["comparisons"]
        .as_array()
        .expect("comparisons")
        .iter()
        .filter(|c| c["faultline"].is_f64())
        .count();
    assert_eq!(measured, 2, "{}", v["comparisons"]);
    take_plot(&plot);
}
