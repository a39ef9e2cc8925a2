//! Builds the bare-mode test programs of `guest-tests/` with the host gcc.
//!
//! Each program is a static ELF64 linked at 2 MiB by `guest-tests/link.ld`,
//! written to `$OUT_DIR/<name>.elf` and embedded by `src/programs.rs`. The
//! mips workload is also compiled natively for the host (`-DHOSTED`), so the
//! tests can compare the checksum the machine computes with the real CPU's.
//!
//! The compiler is `gcc`, or `$FAULTLINE_GUEST_CC` if set; it must target
//! x86-64. Without it the build fails with an explanation.

use std::path::PathBuf;
use std::process::Command;

/// Code generation for the guest: what the machine's CPU implements
/// (integer instructions only, no red zone because interrupts use the
/// current stack, nothing from a hosted runtime).
const GUEST_FLAGS: &[&str] = &[
    "-O2",
    "-ffreestanding",
    "-mgeneral-regs-only",
    "-mno-red-zone",
    "-nostdlib",
    "-static",
    "-fno-pie",
    "-no-pie",
    "-fno-stack-protector",
    "-fno-asynchronous-unwind-tables",
    // Keeps gcc from turning rt.c's own memset/memcpy loops into calls to
    // themselves.
    "-fno-tree-loop-distribute-patterns",
    "-mcmodel=small",
    "-std=gnu11",
    "-Wall",
    "-Wextra",
    "-Wl,--build-id=none",
    "-Wl,-z,max-page-size=4096",
];

/// The runtime every guest program links with.
const RUNTIME: &[&str] = &["start.S", "isr.S", "rt.c"];

struct Program {
    /// Output name: `$OUT_DIR/<name>.elf`.
    name: &'static str,
    source: &'static str,
    defines: &'static [&'static str],
    /// Also build `$OUT_DIR/<name>_host`, a native executable.
    host: bool,
    /// Code generation with gcc's defaults (SSE2 on) at this optimisation
    /// level, instead of `-O2 -mgeneral-regs-only`; the host build uses
    /// the same level.
    sse_opt: Option<&'static str>,
}

const PROGRAMS: &[Program] = &[
    Program {
        name: "hello",
        source: "hello.c",
        defines: &[],
        host: false,
        sse_opt: None,
    },
    Program {
        name: "exceptions",
        source: "exceptions.c",
        defines: &[],
        host: false,
        sse_opt: None,
    },
    Program {
        name: "usermode",
        source: "usermode.c",
        defines: &[],
        host: false,
        sse_opt: None,
    },
    Program {
        name: "timer",
        source: "timer.c",
        defines: &[],
        host: false,
        sse_opt: None,
    },
    Program {
        name: "stringops",
        source: "stringops.c",
        defines: &[],
        host: false,
        sse_opt: None,
    },
    Program {
        name: "realmode",
        source: "realmode.c",
        defines: &[],
        host: false,
        sse_opt: None,
    },
    Program {
        name: "mips_workload",
        source: "mips_workload.c",
        defines: &[],
        host: true,
        sse_opt: None,
    },
    // One round of the same workload: fast enough for the test suite in the
    // dev profile.
    Program {
        name: "mips_workload_small",
        source: "mips_workload.c",
        defines: &["WORKLOAD_ROUNDS=1"],
        host: true,
        sse_opt: None,
    },
    // Floating point and auto-vectorised loops with SSE on, compared with
    // the same program run natively.
    Program {
        name: "fpmath_o2",
        source: "fpmath.c",
        defines: &[],
        host: true,
        sse_opt: Some("-O2"),
    },
    Program {
        name: "fpmath_o3",
        source: "fpmath.c",
        defines: &[],
        host: true,
        sse_opt: Some("-O3"),
    },
    // long double arithmetic in the x87 unit, compared the same way.
    Program {
        name: "x87math",
        source: "x87math.c",
        defines: &[],
        host: true,
        sse_opt: Some("-O2"),
    },
];

fn main() {
    let manifest = PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"),
    );
    let src = manifest.join("guest-tests");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed={}", src.display());
    println!("cargo:rerun-if-env-changed=FAULTLINE_GUEST_CC");

    let cc = std::env::var("FAULTLINE_GUEST_CC").unwrap_or_else(|_| "gcc".to_string());
    check_compiler(&cc);

    for p in PROGRAMS {
        let elf = out.join(format!("{}.elf", p.name));
        let mut cmd = Command::new(&cc);
        match p.sse_opt {
            None => cmd.args(GUEST_FLAGS),
            Some(opt) => cmd
                .args(
                    GUEST_FLAGS
                        .iter()
                        .filter(|f| !matches!(**f, "-O2" | "-mgeneral-regs-only")),
                )
                .arg(opt),
        };
        cmd.arg("-T")
            .arg(src.join("link.ld"))
            .arg(format!("-I{}", src.display()));
        for d in p.defines {
            cmd.arg(format!("-D{d}"));
        }
        for f in RUNTIME.iter().chain([&p.source]) {
            cmd.arg(src.join(f));
        }
        cmd.arg("-o").arg(&elf);
        run(&mut cmd, &format!("guest program {}", p.name));

        if p.host {
            let exe = out.join(format!("{}_host", p.name));
            let mut cmd = Command::new(&cc);
            cmd.arg(p.sse_opt.unwrap_or("-O2")).args([
                "-std=gnu11",
                "-Wall",
                "-Wextra",
                "-DHOSTED",
            ]);
            for d in p.defines {
                cmd.arg(format!("-D{d}"));
            }
            cmd.arg(src.join(p.source)).arg("-o").arg(&exe);
            run(&mut cmd, &format!("host build of {}", p.name));
        }
    }
}

/// Fails the build with instructions if the compiler cannot be run.
fn check_compiler(cc: &str) {
    match Command::new(cc).arg("--version").output() {
        Ok(o) if o.status.success() => {}
        Ok(o) => fail(&format!(
            "`{cc} --version` failed ({}); the machine's test programs need gcc for x86-64",
            o.status
        )),
        Err(e) => fail(&format!(
            "cannot run `{cc}` ({e}). The machine crate compiles its bare-mode test programs \
             (crates/machine/guest-tests) with the host gcc: install gcc for x86-64 \
             (e.g. `apt-get install gcc`) or point FAULTLINE_GUEST_CC at one"
        )),
    }
}

fn run(cmd: &mut Command, what: &str) {
    let output = cmd
        .output()
        .unwrap_or_else(|e| fail(&format!("{what}: cannot run {cmd:?}: {e}")));
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        fail(&format!(
            "{what}: {cmd:?} failed ({}):\n{stderr}",
            output.status
        ));
    }
    for line in stderr.lines().filter(|l| !l.trim().is_empty()) {
        println!("cargo:warning={what}: {line}");
    }
}

/// Stops the build; cargo shows the build script's stderr on failure.
fn fail(msg: &str) -> ! {
    eprintln!("error: {msg}");
    std::process::exit(1);
}
