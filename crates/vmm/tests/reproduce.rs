//! `faultline reproduce`: its figures do not drift. The runs are
//! deterministic, so `reproduce --quick` gives, figure for figure, what
//! `docs/results.md` keeps of it; a change that moves one updates the
//! document in the same commit, with the reason in the message.

mod common;

use common::{faultline, stderr, stdout};

/// The fenced block of `docs/results.md` after the line that names it.
fn reference() -> String {
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/results.md"
    ))
    .expect("read docs/results.md");
    let start = doc
        .find("```text reproduce-quick-figures\n")
        .expect("docs/results.md has a ```text reproduce-quick-figures block");
    let body = &doc[start..];
    let body = &body[body.find('\n').unwrap() + 1..];
    body[..body.find("```").expect("the block ends")].to_string()
}

#[test]
fn quick_figures_match_docs_results() {
    let linux = common::linux_image().is_some();
    let mut args = vec!["reproduce", "--quick", "--figures", "--jobs", "2"];
    if !linux {
        args.push("--no-linux");
    }
    let out = faultline(&args);
    assert!(out.status.success(), "reproduce failed: {}", stderr(&out));
    let got = stdout(&out);
    let reference = reference();
    let want: Vec<&str> = reference
        .lines()
        // Without the kernel (outside CI) the Linux rows are not run.
        .filter(|l| linux || !l.contains("| Linux "))
        .collect();
    let got: Vec<&str> = got.lines().collect();
    let moved: Vec<String> = want
        .iter()
        .zip(&got)
        .filter(|(w, g)| w != g)
        .map(|(w, g)| format!("  docs: {w}\n  now:  {g}"))
        .collect();
    assert!(
        moved.is_empty() && want.len() == got.len(),
        "figures moved ({} in docs/results.md, {} now):\n{}\nIf the change is meant, regenerate the block with \
         `cargo run --release --bin faultline -- reproduce --quick --figures`, rerun the tables above \
         it (`faultline reproduce --jobs 2`) if the full run moves too, and give the reason in the \
         commit message.",
        want.len(),
        got.len(),
        moved.join("\n")
    );
}

#[test]
fn list_runs_prints_one_bench_command_per_experiment() {
    let out = faultline(&["reproduce", "--quick", "--list-runs", "--no-linux", "004"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(
        lines[0].contains("bench ctxsw --rounds 1000 --kvm-2007 --json"),
        "{text}"
    );
    assert!(
        lines[1].contains("bench hackbench --loops 10 --kvm-2007 --json"),
        "{text}"
    );
}

#[test]
fn from_builds_the_tables_of_listed_runs() {
    let dir = std::env::temp_dir().join(format!("faultline-reproduce-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("ctxsw.json");
    let run = faultline(&["bench", "ctxsw", "--rounds", "200", "--json"]);
    assert!(run.status.success(), "{}", stderr(&run));
    std::fs::write(&file, &run.stdout).unwrap();
    let out = faultline(&["reproduce", "--quick", "--no-linux", "004", "--from"]);
    assert!(!out.status.success(), "--from needs files");
    let hack = faultline(&[
        "bench",
        "hackbench",
        "--loops",
        "2",
        "--groups",
        "1",
        "--json",
    ]);
    assert!(hack.status.success(), "{}", stderr(&hack));
    let hack_file = dir.join("hackbench.json");
    std::fs::write(&hack_file, &hack.stdout).unwrap();
    let out = faultline(&[
        "reproduce",
        "--quick",
        "--no-linux",
        "004",
        "--from",
        file.to_str().unwrap(),
        hack_file.to_str().unwrap(),
    ]);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("## Seed 004"), "{text}");
    assert!(text.contains("| ctxsw -n 200 "), "{text}");
    // hackbench 5 was not in --groups: not comparable, with the reason.
    assert!(
        text.contains("not comparable: 5 group(s) not in --groups"),
        "{text}"
    );
    assert!(
        text.contains("2-task context switch, CR3 cache (4 targets) / native"),
        "{text}"
    );
}
