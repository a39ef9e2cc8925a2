//! The bundled guest's programs and kernel as a user meets them: strict
//! option parsing, unknown or missing programs, running out of memory,
//! and the boot option seed=S (`--seed`).
#![cfg(bundled_kernel)]

mod common;
use common::faultline;

use std::process::Output;

/// stdout and stderr together (the guest's console may go to either).
fn console(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn run(program: &[&str]) -> Output {
    let mut args = vec!["run", "--vcpus", "2", "--mem", "64M", "--"];
    args.extend_from_slice(program);
    faultline(&args)
}

#[test]
fn bad_option_values_are_usage_errors() {
    for (program, says) in [
        (&["memtouch", "-p", "4294967296"][..], "out of range"),
        (&["memtouch", "-m", "-1"], "is not a number"),
        (&["memtouch", "-p"], "needs a value"),
        (&["memtouch", "-x"], "usage: memtouch"),
        (&["bm", "-f", "99999999999999999999"], "is not a number"),
        (&["bm", "-f", "40", "-w", "40"], "usage: bm"),
        (&["bm", "-t", "abc"], "is not a number of seconds"),
        (&["pagetag", "-t", "0"], "out of range"),
        (&["apfcalc", "-s", "12"], "not a multiple of 8"),
        (&["ctxsw", "-n", "1"], "out of range"),
        (&["fault", "x"], "usage: fault"),
        (&["touchloop", "-p", "0"], "out of range"),
        (&["touchloop", "-x"], "usage: touchloop"),
    ] {
        let out = run(program);
        let text = console(&out);
        assert_eq!(out.status.code(), Some(2), "{program:?}: {text}");
        assert!(text.contains(says), "{program:?}: {text}");
        assert!(!text.contains("panic"), "{program:?}: {text}");
    }
}

/// The guest kernel's own answer: with `--kernel` the vmm does not check
/// program names against the bundled list, so the guest sees them.
#[test]
fn the_guest_answers_unknown_and_missing_programs_with_127() {
    let kernel = env!("FAULTLINE_GUEST_KERNEL");
    for (program, says) in [
        ("nosuch", "unknown program 'nosuch'; available: hello bm"),
        ("", "no program named on the command line"),
    ] {
        let out = faultline(&["run", "--mem", "64M", "--kernel", kernel, "--", program]);
        let text = console(&out);
        assert_eq!(out.status.code(), Some(127), "{program:?}: {text}");
        assert!(text.contains(says), "{program:?}: {text}");
        assert!(!text.contains("panic"), "{program:?}: {text}");
    }
}

/// The guest's usable pages, from its boot line "mem: F pages free of T".
fn guest_pages() -> u64 {
    let out = run(&["hello"]);
    let text = console(&out);
    let line = text
        .lines()
        .find(|l| l.starts_with("mem: "))
        .unwrap_or_else(|| panic!("no mem: line in {text}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

#[test]
fn asking_for_more_memory_than_the_guest_has_fails_cleanly() {
    // More than all of RAM: mmap refuses it.
    let out = run(&["bm", "-m", "100G", "-t", "0"]);
    let text = console(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("bm: cannot map 107374182400 bytes"), "{text}");
    // Less than RAM, but more than is free once the kernel, page tables
    // and stacks took theirs: the OOM killer ends the program (137, as a
    // shell reports SIGKILL) and the kernel shuts down normally.
    let bytes = format!("{}K", (guest_pages() - 2) * 4);
    let out = run(&["memtouch", "-m", &bytes]);
    let text = console(&out);
    assert_eq!(out.status.code(), Some(137), "{text}");
    assert!(
        text.contains("out of memory: killed program 'memtouch'"),
        "{text}"
    );
    assert!(text.contains("oom_killed=memtouch"), "{text}");
    assert!(!text.contains("panic"), "{text}");
}

/// bm's output (seed, page writes, total) with `--seed` and bm's own `-s`.
fn bm_result(seed: Option<&str>, bm_seed: Option<&str>) -> String {
    let mut args = vec!["run", "--vcpus", "2", "--mem", "64M"];
    if let Some(s) = seed {
        args.extend(["--seed", s]);
    }
    args.extend(["--", "bm", "-f", "2", "-w", "1", "-m", "8M", "-t", "0.005"]);
    if let Some(s) = bm_seed {
        args.extend(["-s", s]);
    }
    let out = faultline(&args);
    let text = console(&out);
    assert!(out.status.success(), "{text}");
    assert!(!text.contains("unknown boot option"), "{text}");
    text.lines()
        .filter(|l| {
            l.starts_with("bm: ") || l.starts_with("faulting threads:") || l.starts_with("total:")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn seed_option_reaches_the_programs_random_streams() {
    let three = bm_result(Some("3"), None);
    assert!(three.contains(", seed 3\n"), "{three}");
    assert!(three.contains("page writes"), "{three}");
    // The same command repeats exactly.
    assert_eq!(three, bm_result(Some("3"), None));
    // Another seed, another stream; bm's -s overrides the boot seed; no
    // seed at all is seed 1 (bm's default before seed=S existed).
    let one = bm_result(Some("1"), None);
    assert!(one.contains(", seed 1\n"), "{one}");
    assert_ne!(three, one);
    assert!(bm_result(Some("3"), Some("5")).contains(", seed 5\n"));
    assert!(bm_result(None, None).contains(", seed 1\n"));
}

/// Every program runs under shadow paging as under EPT: the same exit
/// status and the same result lines (times aside).
#[test]
fn every_program_runs_the_same_under_shadow_paging() {
    for program in [
        &["hello", "a", "b"][..],
        &["memtouch", "-m", "8M", "-p", "2"],
        &["ctxsw", "-n", "200"],
        &["ctxsw", "-t", "-x", "-n", "200"],
        &["fault", "ud"],
        &["fault"],
        &["fault", "thread"],
        &["pagetag", "-m", "8M", "-p", "2"],
        &["apfcalc", "-m", "2M", "-l", "1", "-c"],
        &["bm", "-f", "2", "-w", "2", "-m", "8M", "-t", "0.01"],
    ] {
        let outputs: Vec<Output> = ["ept", "shadow"]
            .iter()
            .map(|mmu| {
                let mut args = vec!["run", "--mmu", mmu, "--vcpus", "2", "--mem", "64M", "--"];
                args.extend_from_slice(program);
                faultline(&args)
            })
            .collect();
        let (ept, shadow) = (&outputs[0], &outputs[1]);
        let text = console(shadow);
        assert_eq!(
            shadow.status.code(),
            ept.status.code(),
            "{program:?}: {text}"
        );
        assert!(text.contains("mmu:          shadow"), "{program:?}: {text}");
        // Lines without timing or counters are identical.
        let stable = |out: &Output| {
            console(out)
                .lines()
                .filter(|l| {
                    (l.starts_with("memtouch:")
                        || l.starts_with("pagetag:")
                        || l.starts_with("hello"))
                        && !l.contains("ns")
                })
                .map(str::to_string)
                .collect::<Vec<_>>()
        };
        assert_eq!(stable(shadow), stable(ept), "{program:?}");
    }
}

/// Issue 10's acceptance, smaller: bm under shadow paging on 4 vCPUs runs
/// and repeats exactly.
#[test]
fn bm_under_shadow_paging_repeats_exactly() {
    let args = [
        "run", "--mmu", "shadow", "--vcpus", "4", "--mem", "64M", "--stats", "json", "--", "bm",
        "-f", "4", "-w", "4", "-m", "32M", "-t", "0.02",
    ];
    let a = faultline(&args);
    let b = faultline(&args);
    assert!(a.status.success(), "{}", console(&a));
    assert_eq!(a.stdout, b.stdout, "same command, same output and counters");
    assert!(console(&a).contains("total: "));
}
