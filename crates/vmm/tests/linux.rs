//! `faultline run --guest linux`: Debian's cloud kernel, unmodified, boots
//! to the project's /init and runs `hello` (issue 15). The kernel comes from
//! the cache `scripts/fetch-linux.sh` fills; without it these tests print a
//! loud SKIP, unless the environment variable `CI` is set (the CI fetches
//! the kernel first), where a missing kernel fails them.

mod common;
use common::{faultline, linux_image, stderr, stdout};

/// Boots Linux with `extra` options and `hello`; returns the JSON summary
/// and the raw stdout.
fn boot_hello(image: &std::path::Path, extra: &[&str]) -> (serde_json::Value, Vec<u8>) {
    boot_program(image, extra, &["hello", "from-the-test"])
}

/// Boots Linux with `extra` options and runs `program` (its name and
/// arguments); asserts the run exits 0 and returns the JSON summary and
/// the raw stdout.
fn boot_program(
    image: &std::path::Path,
    extra: &[&str],
    program: &[&str],
) -> (serde_json::Value, Vec<u8>) {
    let image = image.to_str().unwrap();
    let mut args = vec![
        "run",
        "--guest",
        "linux",
        "--kernel-image",
        image,
        "--stats",
        "json",
        "--wall-limit",
        "300s",
    ];
    args.extend_from_slice(extra);
    args.push("--");
    args.extend_from_slice(program);
    let out = faultline(&args);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    (v, out.stdout)
}

/// What every successful boot shows: hello's output with its argument,
/// init's report, power-off, kvm-clock registered and kept as the
/// clocksource on any number of vCPUs (no invariant TSC: `hv::cpuid`),
/// the CPU count.
fn check_boot(v: &serde_json::Value, cpus: u32) {
    assert_eq!(v["stop"]["reason"], "power_off", "{v}");
    let console = v["console"].as_str().unwrap();
    assert!(
        !console.contains("Switched to clocksource tsc"),
        "Linux left kvm-clock:\n{console}"
    );
    for line in [
        "Hypervisor detected: KVM".to_string(),
        "kvm-clock: Using msrs 4b564d01 and 4b564d00".to_string(),
        "clocksource: Switched to clocksource kvm-clock".to_string(),
        "ttyS0 at I/O 0x3f8".to_string(),
        "Run /init as init process".to_string(),
        "hello from Linux user space: Linux 6.1".to_string(),
        format!("on x86_64, {cpus} CPUs online"),
        "argv[1] = from-the-test".to_string(),
        "faultline-init: hello exited with status 0".to_string(),
        "reboot: Power down".to_string(),
    ] {
        assert!(console.contains(&line), "missing {line:?} in:\n{console}");
    }
    if cpus > 1 {
        let up = format!("smp: Brought up 1 node, {cpus} CPUs");
        assert!(console.contains(&up), "missing {up:?} in:\n{console}");
    }
}

#[test]
fn linux_boots_to_init_and_runs_hello_on_one_vcpu_and_runs_repeat() {
    let Some(image) = linux_image() else { return };
    let (v, stdout) = boot_hello(&image, &["--vcpus", "1"]);
    check_boot(&v, 1);
    let (_, again) = boot_hello(&image, &["--vcpus", "1"]);
    assert!(stdout == again, "the same boot repeats byte for byte");
}

/// Also with a command line of the user's that has a word the kernel
/// hands to /init (`nokaslr`): the program still runs with its arguments.
#[test]
fn linux_boots_on_four_vcpus_under_ept() {
    let Some(image) = linux_image() else { return };
    let cmdline = format!("{} nokaslr", vmm::linux::DEFAULT_OPTIONS);
    let (v, _) = boot_hello(&image, &["--vcpus", "4", "--cmdline", &cmdline]);
    check_boot(&v, 4);
    let console = v["console"].as_str().unwrap();
    assert!(console.contains("KASLR disabled"), "{console}");
}

#[test]
fn linux_boots_under_shadow_paging_on_one_vcpu() {
    let Some(image) = linux_image() else { return };
    let (v, _) = boot_hello(&image, &["--vcpus", "1", "--mmu", "shadow"]);
    check_boot(&v, 1);
    assert_eq!(v["mmu"], "shadow");
}

/// The APs start in real mode (INIT/SIPI) and run Linux's trampoline on
/// the shadow MMU's paging-off root before they turn paging on.
#[test]
fn linux_boots_under_shadow_paging_on_four_vcpus() {
    let Some(image) = linux_image() else { return };
    let (v, _) = boot_hello(&image, &["--vcpus", "4", "--mmu", "shadow"]);
    check_boot(&v, 4);
}

/// `segcheck` (guest/linux/segcheck.c): modify_ldt and LDT selector
/// loads, arch_prctl GS base and its replacement by a selector load, INT
/// 0x80 from compatibility mode, single-step and INT3 SIGTRAPs at the
/// right RIP, on every CPU, on 1 and 2 vCPUs under EPT and shadow
/// paging; the kernel never oopses.
#[test]
fn linux_segment_and_debug_trap_checks_pass_on_one_and_two_vcpus_under_both_mmus() {
    let Some(image) = linux_image() else { return };
    for (vcpus, mmu) in [("1", "ept"), ("2", "ept"), ("1", "shadow"), ("2", "shadow")] {
        let extra = ["--vcpus", vcpus, "--mmu", mmu];
        let (v, _) = boot_program(&image, &extra, &["segcheck", "-n", "3"]);
        let what = format!("{vcpus} vCPUs, {mmu}");
        let console = v["console"].as_str().unwrap();
        assert_eq!(v["stop"]["reason"], "power_off", "{what}: {console}");
        assert!(
            console.contains("faultline-init: segcheck exited with status 0"),
            "{what}: {console}"
        );
        for bad in ["Oops", "BUG:", "general protection fault", "Call Trace"] {
            assert!(!console.contains(bad), "{what}: {bad:?} in {console}");
        }
        let cpus: u64 = vcpus.parse().unwrap();
        // 15 checks per CPU and round.
        let want = format!(
            "segcheck: {} checks on {cpus} CPUs, 0 failures",
            15 * 3 * cpus
        );
        assert!(
            console.contains(&want),
            "{what}: missing {want:?} in {console}"
        );
    }
}

/// Needs no kernel: bad images and unknown programs are clear
/// configuration errors (exit status 2), never a panic.
#[test]
fn bad_linux_images_and_programs_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk");
    std::fs::write(&junk, vec![0x5a; 4096]).unwrap();
    let config_error = |image: &std::path::Path, program: &str, message: &str| {
        let out = faultline(&[
            "run",
            "--guest",
            "linux",
            "--kernel-image",
            image.to_str().unwrap(),
            "--",
            program,
        ]);
        assert_eq!(out.status.code(), Some(2), "{program}: {}", stderr(&out));
        assert!(stderr(&out).contains(message), "{}", stderr(&out));
    };
    config_error(&junk, "hello", "not a Linux kernel image");
    config_error(
        &junk,
        "no-such-program",
        "unknown Linux guest program `no-such-program`",
    );
    let missing = dir.path().join("missing");
    config_error(&missing, "hello", "cannot read --kernel-image");
}

/// A kernel panic ends the run (issue 32): with the default command line
/// (`panic=-1 reboot=t`: Linux reboots by a triple fault) and with one of
/// the user's that lacks them (Linux prints the panic's end and spins:
/// the vmm reads it on the console). Stop reason `panic`, status 3, long
/// before the wall limit.
#[test]
fn a_linux_kernel_panic_ends_the_run_with_its_message() {
    let Some(image) = linux_image() else { return };
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("garbage.cpio");
    // Not a cpio archive: Linux finds no root file system and panics.
    let bytes: Vec<u8> = (0u32..65536)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(&garbage, bytes).unwrap();
    for cmdline in [None, Some("console=ttyS0")] {
        let mut args = vec![
            "run",
            "--guest",
            "linux",
            "--kernel-image",
            image.to_str().unwrap(),
            "--initrd",
            garbage.to_str().unwrap(),
            "--stats",
            "json",
            "--wall-limit",
            "300s",
        ];
        if let Some(cmdline) = cmdline {
            args.extend_from_slice(&["--cmdline", cmdline]);
        }
        args.extend_from_slice(&["--", "hello"]);
        let out = faultline(&args);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        assert_eq!(out.status.code(), Some(3), "{cmdline:?}: {}", v["stop"]);
        assert_eq!(v["stop"]["reason"], "panic", "{cmdline:?}: {}", v["stop"]);
        let message = v["stop"]["message"].as_str().unwrap();
        assert!(
            message.contains("Unable to mount root fs"),
            "{cmdline:?}: {message}"
        );
        assert!(
            v["virtual_seconds"].as_f64().unwrap() < 2.0,
            "{cmdline:?}: stopped at the panic, not later"
        );
    }
}

/// Runs `faultline run --guest linux` with `args` then `-- program`,
/// expecting a clean power-off with status 0; returns the JSON summary.
fn run_linux_json(image: &std::path::Path, args: &[&str], program: &[&str]) -> serde_json::Value {
    let mut all = vec![
        "run",
        "--guest",
        "linux",
        "--kernel-image",
        image.to_str().unwrap(),
        "--stats",
        "json",
        "--wall-limit",
        "600s",
    ];
    all.extend_from_slice(args);
    all.push("--");
    all.extend_from_slice(program);
    let out = faultline(&all);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("no JSON ({e}); stderr:\n{}", stderr(&out));
    });
    assert_eq!(out.status.code(), Some(0), "{args:?}: {v}");
    assert_eq!(v["stop"]["reason"], "power_off", "{v}");
    v
}

/// A report value (`key=N`) from the run's report lines.
fn report_value(v: &serde_json::Value, key: &str) -> Option<u64> {
    v["reports"].as_array()?.iter().find_map(|r| {
        r["line"]
            .as_str()?
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
    })
}

/// Issue 15's lost wake-up: Linux enables async PF on its boot CPU before
/// its local APIC, and the hv used to write the wake-all into the token
/// slot and drop its interrupt, so the first task of vCPU 0 that took a
/// page-not-present slept forever. memtouch under memory pressure must end,
/// with every page-not-present answered, both sides agreeing.
#[test]
fn linux_async_pf_under_memory_pressure_wakes_every_task() {
    let Some(image) = linux_image() else { return };
    let v = run_linux_json(
        &image,
        &[
            "--vcpus",
            "2",
            "--mem",
            "128M",
            "--host-mem",
            "40M",
            "--swap-device",
            "ssd",
            "--apf",
            "pv",
        ],
        &["memtouch", "-m", "48M", "-p", "2", "-t", "2"],
    );
    let console = v["console"].as_str().unwrap();
    assert!(
        console.contains("memtouch: 48 MiB, 2 passes, 2 threads:")
            && console.contains(", 0 bad pages"),
        "{console}"
    );
    let apf = &v["apf"];
    let not_present = apf["not_present_sent"].as_u64().unwrap();
    let ready = apf["ready_sent"].as_u64().unwrap();
    let wake_all = apf["wake_all_sent"].as_u64().unwrap();
    assert!(not_present > 100, "Linux's async PF at work: {apf}");
    assert_eq!(wake_all, 2, "one per CPU at enable: {apf}");
    assert_eq!(ready, not_present + wake_all, "every one answered: {apf}");
    assert_eq!(
        apf["acks_received"].as_u64(),
        Some(ready),
        "Linux acked each: {apf}"
    );
    // Linux's own count (/proc/interrupts HYP), read by init when memtouch
    // has ended: init's own last steps may still take a few.
    let hyp = report_value(&v, "linux_hyp_interrupts").expect("HYP line");
    assert!(hyp <= ready && hyp + 64 > ready, "HYP {hyp}, hv {ready}");
}

/// pagetag in Linux with host memory a quarter of guest memory: no page
/// lost, mixed up or stale under pv, halt and off (the three run at once).
#[test]
fn linux_pagetag_with_a_quarter_of_guest_memory_has_no_bad_pages() {
    let Some(image) = linux_image() else { return };
    let runs: Vec<serde_json::Value> = std::thread::scope(|scope| {
        let handles: Vec<_> = ["pv", "halt", "off"]
            .iter()
            .map(|&apf| {
                let image = &image;
                scope.spawn(move || {
                    run_linux_json(
                        image,
                        &[
                            "--vcpus",
                            "2",
                            "--mem",
                            "128M",
                            "--host-mem",
                            "32M",
                            "--swap-device",
                            "ssd",
                            "--apf",
                            apf,
                        ],
                        &["pagetag", "-m", "48M", "-p", "2"],
                    )
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (apf, v) in ["pv", "halt", "off"].iter().zip(&runs) {
        assert_eq!(report_value(v, "pagetag_pages"), Some(12288), "{apf}");
        assert_eq!(
            report_value(v, "pagetag_bad"),
            Some(0),
            "{apf}: {}",
            v["console"]
        );
        assert!(
            v["memory"]["pager"]["swap_ins"].as_u64().unwrap() > 1000,
            "{apf}: pages came back from swap"
        );
        let not_present = v["apf"]["not_present_sent"].as_u64().unwrap();
        assert_eq!(not_present > 0, *apf == "pv", "{apf}: {}", v["apf"]);
    }
}

/// PV send-IPI and PV EOI under memory pressure: on 4 vCPUs Linux sends
/// its multicast IPIs through KVM_HC_SEND_IPI and ends interrupts through
/// the PV EOI flag, and the hv's EOIs for it are no more than the entries
/// it set the flag at. With PV send-IPI offered this run stalled at boot
/// until the hv kept a kick that reaches a vCPU before its HLT
/// (`kvm_wait`, interrupts off) across a page-in stall or an APF halt.
#[test]
fn linux_uses_pv_send_ipi_and_pv_eoi_under_memory_pressure() {
    let Some(image) = linux_image() else { return };
    let v = run_linux_json(
        &image,
        &[
            "--vcpus",
            "4",
            "--mem",
            "128M",
            "--host-mem",
            "32M",
            "--swap-device",
            "ssd",
            "--apf",
            "pv",
        ],
        &["pagetag", "-m", "32M", "-p", "2"],
    );
    let console = v["console"].as_str().unwrap();
    assert!(console.contains("kvm-guest: setup PV IPIs"), "{console}");
    assert_eq!(report_value(&v, "pagetag_bad"), Some(0), "{console}");
    let vcpus = v["vcpus"].as_array().unwrap();
    let sum = |key: &str| -> u64 { vcpus.iter().map(|c| c["pv"][key].as_u64().unwrap()).sum() };
    assert!(sum("send_ipi_calls") > 0, "Linux's multicast IPIs: {v}");
    assert!(sum("eois") > 0, "Linux took the PV EOI flag: {v}");
    assert!(sum("eois") <= sum("eoi_offered"));
    assert!(
        v["memory"]["pager"]["swap_ins"].as_u64().unwrap() > 1000,
        "under memory pressure"
    );
}

/// `bench apf --guest linux` at a small scale: every run ends, Linux's
/// async PF engages under pv (and only there), and the counts of both
/// sides agree in every run (hv sent = Linux acked = Linux's own HYP count
/// = not-present + wake-alls).
#[test]
fn bench_apf_in_linux_counts_async_pf_alike_on_both_sides() {
    let Some(image) = linux_image() else { return };
    let dir = tempfile::tempdir().unwrap();
    let plot = dir.path().join("apf.svg");
    let out = faultline(&[
        "bench",
        "apf",
        "--guest",
        "linux",
        "--kernel-image",
        image.to_str().unwrap(),
        "--json",
        "--vcpus",
        "2",
        "--fault-threads",
        "2",
        "--work-threads",
        "2",
        "--mem",
        "128M",
        "--host-mem",
        "48M",
        "--duration",
        "0.05",
        "--swap-device",
        "ssd",
        "--plot",
        plot.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["config"]["guest"], "linux");
    // Sized from what Linux reports available, less the headroom, with
    // the kernel's version beside.
    let available = v["config"]["linux_mem_available"].as_u64().unwrap();
    let array = v["config"]["array"].as_u64().unwrap();
    assert!(
        array > 48 << 20 && array + (16 << 20) <= available,
        "{}",
        v["config"]
    );
    assert!(
        v["config"]["linux_version"]
            .as_str()
            .unwrap()
            .starts_with("6."),
        "{}",
        v["config"]
    );
    for mode in ["off", "halt", "pv", "ideal"] {
        let m = &v["modes"][mode];
        assert!(m["total"].as_u64().unwrap_or(0) > 0, "{mode}: {m}");
        let ready = apf_sides_agree(m, mode);
        // Read by init before its own last steps: at most the hv's count.
        assert!(
            m["linux_hyp_interrupts"].as_u64().unwrap_or(0) <= ready,
            "{mode}: {m}"
        );
    }
    let pv = &v["modes"]["pv"];
    assert!(pv["not_present_sent"].as_u64().unwrap() > 0, "{pv}");
    assert_eq!(pv["wake_all_sent"].as_u64(), Some(2), "one per CPU");
    for mode in ["off", "halt"] {
        assert_eq!(
            v["modes"][mode]["ready_sent"].as_u64(),
            Some(0),
            "{mode}: not offered"
        );
    }
    assert!(plot.is_file());
}

/// One bench run's async-PF counts agree on both sides: every page-ready
/// the hv sent is a page-not-present or a wake-all, and Linux acknowledged
/// each. Returns the page-ready count.
fn apf_sides_agree(run: &serde_json::Value, what: &str) -> u64 {
    let count = |key: &str| {
        run[key]
            .as_u64()
            .unwrap_or_else(|| panic!("{what} {key}: {run}"))
    };
    let ready = count("ready_sent");
    assert_eq!(
        ready,
        count("not_present_sent") + count("wake_all_sent"),
        "{what}: {run}"
    );
    assert_eq!(count("acks_received"), ready, "{what}: {run}");
    ready
}

/// Runs `faultline bench ARGS --guest linux --json` and returns its JSON.
fn bench_linux_json(image: &std::path::Path, args: &[&str]) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let plot = dir.path().join("plot.svg");
    let mut all = vec!["bench"];
    all.extend_from_slice(args);
    all.extend_from_slice(&[
        "--guest",
        "linux",
        "--kernel-image",
        image.to_str().unwrap(),
        "--json",
    ]);
    let takes_plot = !args.contains(&"apf-calc");
    if takes_plot {
        all.extend_from_slice(&["--plot", plot.to_str().unwrap()]);
    }
    let out = faultline(&all);
    assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["config"]["guest"], "linux", "{v}");
    assert_eq!(plot.is_file(), takes_plot, "{args:?}: the plot");
    v
}

/// The row of a `bench ctxsw` or `bench hackbench` JSON named `name`.
fn result_row<'a>(v: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    v["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["config"] == name)
        .unwrap_or_else(|| panic!("no row {name}: {v}"))
}

/// `bench ctxsw --guest linux` and `bench hackbench --guest linux` at a
/// small scale: the Linux builds run under EPT, shadow and shadow with
/// prev_roots (and nothing else: the CR3 cache needs faultline's guest,
/// which the output says), report their figures, and the MMU counters
/// show what each row is: no CR3 exits under EPT, CR3 exits and shadow
/// roots under shadow paging, ctxsw's switches no dearer with prev_roots.
#[test]
fn bench_ctxsw_and_hackbench_in_linux_run_under_ept_shadow_and_prev_roots() {
    let Some(image) = linux_image() else { return };
    let (ctxsw, hackbench) = std::thread::scope(|scope| {
        let image = &image;
        let ctxsw = scope.spawn(move || bench_linux_json(image, &["ctxsw", "--rounds", "300"]));
        let hackbench = scope.spawn(move || {
            bench_linux_json(image, &["hackbench", "--groups", "1", "--loops", "5"])
        });
        (ctxsw.join().unwrap(), hackbench.join().unwrap())
    });
    for v in [&ctxsw, &hackbench] {
        let rows: Vec<&str> = v["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["config"].as_str().unwrap())
            .collect();
        assert_eq!(rows, ["ept", "shadow", "shadow-prev-roots"], "{v}");
        assert!(v["not_run"].as_str().unwrap().contains("CR3 cache"), "{v}");
        let count = |name: &str, key: &str| result_row(v, name)[key].as_u64().unwrap();
        assert_eq!(count("ept", "cr3_exits"), 0, "{v}");
        assert_eq!(count("ept", "roots_built"), 0, "{v}");
        for shadow in ["shadow", "shadow-prev-roots"] {
            assert!(count(shadow, "cr3_exits") > 100, "{shadow}: {v}");
            assert!(count(shadow, "roots_built") > 0, "{shadow}: {v}");
        }
    }
    // prev_roots makes a CR3 switch cheaper (no root lookup), never
    // dearer: ctxsw's ping-pong on one vCPU switches as often in both rows.
    // (Not hackbench's: on two vCPUs the rows schedule differently.)
    let us = |name: &str| result_row(&ctxsw, name)["switch_us"].as_f64().unwrap();
    assert!(us("shadow-prev-roots") <= us("shadow"), "{ctxsw}");
    for r in ctxsw["results"].as_array().unwrap() {
        let us = r["switch_us"].as_f64().unwrap();
        assert!(us > 0.1 && us < 1000.0, "{r}");
    }
    for r in hackbench["results"].as_array().unwrap() {
        let s = r["seconds"].as_f64().unwrap();
        assert!(s > 0.0 && s < 10.0, "{r}");
        assert_eq!(r["groups"], 1, "{r}");
    }
}

/// `bench apf-calc --guest linux` at a small scale: seed 002's four runs
/// end (each checks its writer's words: a wrong one fails the run), the
/// calculation thread counts in the two runs with it, Linux's async PF
/// engages in the APF-on runs only, and both sides' counts agree.
#[test]
fn bench_apf_calc_in_linux_runs_the_seeds_four_cases() {
    let Some(image) = linux_image() else { return };
    let v = bench_linux_json(
        &image,
        &[
            "apf-calc",
            "--host-mem",
            "48M",
            "--mem",
            "128M",
            "--array",
            "32M",
            "--loops",
            "1",
        ],
    );
    for case in ["with_calc", "without_calc"] {
        for key in ["off", "on"] {
            let run = &v[case]["runs"][key];
            let count = |k: &str| {
                run[k]
                    .as_u64()
                    .unwrap_or_else(|| panic!("{case} {key} {k}: {run}"))
            };
            assert!(count("swap_ins") > 1000, "{case} {key}: pressure: {run}");
            apf_sides_agree(run, &format!("{case} {key}"));
            assert_eq!(
                count("not_present_sent") > 0,
                key == "on",
                "{case} {key}: {run}"
            );
        }
    }
    for key in ["calc_off", "calc_on"] {
        assert!(v["with_calc"][key].as_u64().unwrap() > 0, "{key}: {v}");
    }
}

/// `bench apf-calc --guest linux` sizes the writer by what Linux leaves
/// to programs, as `bench apf` sizes bm's array: a given `--array` that
/// does not fit is refused with the figures after one probe boot, before
/// the four runs (which would each end with Linux's OOM killer).
#[test]
fn bench_apf_calc_in_linux_refuses_a_writer_that_does_not_fit() {
    let Some(image) = linux_image() else { return };
    let out = faultline(&[
        "bench",
        "apf-calc",
        "--guest",
        "linux",
        "--kernel-image",
        image.to_str().unwrap(),
        "--host-mem",
        "48M",
        "--mem",
        "128M",
        "--array",
        "100M",
    ]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--array 100M: does not fit"), "{err}");
    assert!(err.contains("MemAvailable"), "{err}");
    assert!(!err.contains("OOM"), "refused before the runs: {err}");
}

/// One `USER_HZ` tick of /proc/stat in nanoseconds (x86's `USER_HZ` is 100).
const USER_HZ_TICK_NS: u64 = 10_000_000;

/// How far Linux's steal may trail the hv's for one vCPU: five ticks, more
/// than the one tick rounding alone would explain. Measured (one run, the
/// test's command): Linux trails by 1.4 and 3.6 ticks; after
/// rounding, this is steal the hv wrote into the area that Linux had not
/// accounted when memtouch read /proc/stat (steal reaches cpustat only at
/// the CPU's next tick or idle exit) or that came after the read (init's
/// power-off wakes the other CPU: `stop_other_cpus`). Not proven which:
/// docs/linux.md, "Not there yet".
const STEAL_GAP_NS: u64 = 5 * USER_HZ_TICK_NS;

/// memtouch's /proc/stat lines: `(name, steal ticks)` for `cpu` (the sum)
/// then `cpu0`, `cpu1`, ... (`steal` is the eighth value).
fn linux_steal_ticks(console: &str) -> Vec<(String, u64)> {
    console
        .lines()
        .filter_map(|line| line.trim_end().strip_prefix("memtouch: /proc/stat "))
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let steal = fields
                .get(8)
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(|| panic!("no steal in {line:?}"));
            (fields[0].to_string(), steal)
        })
        .collect()
}

/// Steal time and PV TLB flush against Linux's own code (issue 15): two
/// vCPUs on one host CPU, four memtouch threads that write-protect their
/// shares after every pass (TLB shootdowns, `-s`). Linux's steal in
/// /proc/stat, read by memtouch, is at most what the hv wrote into each
/// vCPU's steal-time area and trails it by less than `STEAL_GAP_NS`; and
/// Linux's
/// `kvm_flush_tlb_multi` set `KVM_VCPU_FLUSH_TLB` in the `preempted` byte
/// of preempted vCPUs instead of sending them IPIs, which the hv honoured
/// at their next entry.
#[test]
fn linux_steal_time_matches_the_hv_and_pv_tlb_flush_reaches_preempted_vcpus() {
    let Some(image) = linux_image() else { return };
    // 192M: Debian 6.1.192 leaves 78 MiB of a 128M guest available, too
    // little for 64 MiB of memtouch (the OOM killer ended it in CI).
    let v = run_linux_json(
        &image,
        &["--vcpus", "2", "--host-cpus", "1", "--mem", "192M"],
        &["memtouch", "-m", "64M", "-p", "16", "-t", "4", "-s"],
    );
    let console = v["console"].as_str().unwrap();
    assert!(
        console.contains("kvm-guest: KVM setup pv remote TLB flush"),
        "{console}"
    );
    assert_eq!(v["host_cpus"], 1, "{v}");
    let vcpus = v["vcpus"].as_array().unwrap();
    let hv_ns: Vec<u64> = vcpus
        .iter()
        .map(|c| c["steal"]["reported_ns"].as_u64().unwrap())
        .collect();
    let total_ns: Vec<u64> = vcpus
        .iter()
        .map(|c| c["steal"]["steal_ns"].as_u64().unwrap())
        .collect();
    let linux = linux_steal_ticks(console);
    assert_eq!(linux.len(), 3, "cpu, cpu0, cpu1: {linux:?}");
    assert!(linux[0].1 > 10, "Linux saw steal: {linux:?}");
    eprintln!("steal: Linux {linux:?} ticks, hv reported {hv_ns:?} ns of {total_ns:?} ns");
    for (cpu, &hv) in hv_ns.iter().enumerate() {
        let (name, ticks) = &linux[cpu + 1];
        assert_eq!(name, &format!("cpu{cpu}"));
        let linux_ns = ticks * USER_HZ_TICK_NS;
        // Linux rounds its nanoseconds down to ticks (STEAL_GAP_NS).
        assert!(
            linux_ns <= hv && hv - linux_ns < STEAL_GAP_NS,
            "cpu{cpu}: Linux {ticks} ticks, hv {hv} ns"
        );
    }
    let flushes: u64 = vcpus
        .iter()
        .map(|c| c["steal"]["pv_tlb_flushes"].as_u64().unwrap())
        .sum();
    assert!(flushes > 0, "kvm_flush_tlb_multi set the flag: {v}");
}

/// The Linux programs take sizes as the project guest's do (issue 32):
/// bytes with K, M or G, a usage error (status 2) for a bad value, never a
/// crash (`bm -m 64` read 64 bytes and died of a division by 0 pages).
/// They are static Linux executables: run here on the host, no kernel
/// needed.
#[cfg(linux_programs)]
#[test]
fn linux_programs_take_sizes_with_units_and_refuse_bad_values() {
    let run = |program: &str, args: &[&str]| {
        let path = format!("{}/{program}", env!("FAULTLINE_LINUX_PROGRAMS"));
        // Report lines go to fd 3 (report.h): /dev/null here, not whatever
        // the test runner has open there (cargo's jobserver pipe).
        let out = std::process::Command::new("sh")
            .args(["-c", "exec \"$0\" \"$@\" 3>/dev/null", &path])
            .args(args)
            .output()
            .expect("run the Linux program on the host");
        (out.status.code(), stdout(&out) + &stderr(&out))
    };
    for (program, args, says) in [
        ("bm", &["-m", "64"][..], "'64' is not a number from 4096"),
        ("bm", &["-m", "64X"][..], "is not a number"),
        ("bm", &["-f", "-1"][..], "is not a number"),
        ("bm", &["-t", "soon"][..], "is not a number of seconds"),
        ("bm", &["-f", "0", "-w", "0"][..], "Usage"),
        (
            "memtouch",
            &["-m", "32"][..],
            "'32' is not a number from 4096",
        ),
        ("memtouch", &["-p", "0"][..], "is not a number"),
        ("pagetag", &["-m", "1Q"][..], "usage"),
    ] {
        let (code, text) = run(program, args);
        assert_eq!(code, Some(2), "{program} {args:?}: {text}");
        assert!(text.contains(says), "{program} {args:?}: {text}");
    }
    let (code, text) = run("bm", &["-f", "1", "-w", "1", "-m", "1M", "-t", "0.01"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("total: "), "{text}");
    let (code, text) = run("memtouch", &["-m", "1M", "-p", "1"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("memtouch: 1 MiB, 1 passes"), "{text}");
}
