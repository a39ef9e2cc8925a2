//! The translator (`--engine jit`) gives exactly the interpreter's results
//! through the whole stack: the same program output, statistics and
//! virtual time from `run`, and the same JSON from the benchmarks.

mod common;

use common::*;

/// Runs `args` with `--engine interp` and `--engine jit` (inserted after
/// the subcommand words `lead`), checks both succeed, and returns both
/// standard outputs.
fn on_both_engines(lead: &[&str], rest: &[&str]) -> (String, String) {
    let run = |engine: &str| {
        let mut args: Vec<&str> = lead.to_vec();
        args.extend(["--engine", engine]);
        args.extend(rest);
        let out = faultline(&args);
        assert!(out.status.success(), "{engine}: {}", stderr(&out));
        stdout(&out)
    };
    (run("interp"), run("jit"))
}

#[test]
fn run_bm_and_ctxsw_are_identical_on_both_engines() {
    for program in [
        &["bm", "-f", "2", "-w", "2", "-m", "8M", "-t", "0.002"][..],
        &["ctxsw", "-n", "200"],
    ] {
        let mut rest = vec!["--vcpus", "2", "--mem", "64M", "--"];
        rest.extend(program);
        let (interp, jit) = on_both_engines(&["run"], &rest);
        assert!(!interp.is_empty());
        assert_eq!(interp, jit, "{program:?}");
    }
}

#[test]
fn bench_apf_and_apf_calc_json_are_identical_on_both_engines() {
    let (interp, jit) = on_both_engines(
        &["bench", "apf"],
        &[
            "--json",
            "--vcpus",
            "2",
            "--host-mem",
            "8M",
            "--duration",
            "0.01",
            "--fault-threads",
            "2",
            "--work-threads",
            "2",
            "--swap-device",
            "nvme",
        ],
    );
    assert!(interp.contains("\"modes\""), "{interp}");
    assert_eq!(interp, jit, "bench apf");
    let (interp, jit) = on_both_engines(
        &["bench", "apf-calc"],
        &[
            "--json",
            "--host-mem",
            "8M",
            "--array",
            "8M",
            "--loops",
            "1",
            "--swap-device",
            "nvme",
        ],
    );
    assert!(interp.contains("with_calc"), "{interp}");
    assert_eq!(interp, jit, "bench apf-calc");
}

#[test]
fn an_unknown_engine_is_a_usage_error() {
    let out = faultline(&["run", "--engine", "qemu", "--", "ctxsw"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("is not `interp` or `jit`"),
        "{}",
        stderr(&out)
    );
}
