#!/usr/bin/env bash
# qemu-linux.sh [ROUNDS] [PROGRAM ARGS...]
# qemu-linux.sh --seeds [ROUNDS]
# qemu-linux.sh --phases [ROUNDS]
#
# Debian's cloud kernel with
# faultline's initramfs (its /init and Linux programs) under QEMU's TCG and
# under faultline, alternating, on 1 and 4 vCPUs; wall and CPU time (user +
# system, all threads) from start to the process's exit, which is the
# program's end (init powers the machine off). Each round prints both and
# the ratios; the last lines are the medians. Default: 3 rounds of `hello`.
#
# --seeds: the seed programs as Linux workloads on 1 vCPU, each with a
# fixed amount of work (sized so QEMU's TCG takes a few seconds on it):
# ctxsw, hackbench, bm (-n: fixed iterations) and apfcalc, alternating
# QEMU and faultline per program. Besides the whole run, each times the
# program's part: host wall time from the kernel's "Run /init as init
# process" line to init's "PROGRAM exited" line, both read from the
# console as it streams (so boot is left out). The throughput ratio is
# QEMU's part over faultline's (same work: above 1 is faultline faster).
#
# --phases: `hello` on 1 vCPU, alternating, with the host time at which
# each of a few console lines both print appeared (`PHASES`): per phase
# (from the line before), the medians of both and faultline's share of
# QEMU's time, to see where in a boot one is faster than the other.
#
# A benchmark, not a test (nothing in scripts/test.sh calls it). Needs
# qemu-system-x86_64, python3, the kernel (`bash scripts/fetch-linux.sh`)
# and a release build (`cargo build --release --locked -p vmm`).
#
# Both boot the same bzImage and the same initramfs file: it is written
# here from the programs the build compiled (crates/vmm's OUT_DIR/linux),
# laid out as `faultline run --guest linux` lays out its own (directories,
# /dev/console, /init, /bin/NAME), and passed to faultline with --initrd.
# Both get 512 MiB and the same command line. QEMU: `-machine
# q35,accel=tcg -cpu max`, its default TCG threading (MTTCG: one host
# thread per vCPU).
set -euo pipefail

seeds=0
if [ "${1:-}" = --seeds ]; then
    seeds=1
    shift
elif [ "${1:-}" = --phases ]; then
    seeds=2
    shift
fi
rounds=${1:-3}
shift || true
program=("$@")
[ $seeds = 0 ] || [ ${#program[@]} = 0 ] || { echo "qemu-linux.sh: --seeds and --phases take only ROUNDS" >&2; exit 2; }
[ ${#program[@]} -gt 0 ] || program=(hello)
case "$rounds" in
    '' | *[!0-9]* | 0) echo "qemu-linux.sh: ROUNDS must be a positive number" >&2; exit 2 ;;
esac

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
faultline=target/release/faultline
[ -x "$faultline" ] || { echo "build first: cargo build --release --locked -p vmm" >&2; exit 2; }
command -v qemu-system-x86_64 >/dev/null || { echo "qemu-system-x86_64 is missing (apt-get install qemu-system-x86)" >&2; exit 2; }
kernel=$(bash scripts/fetch-linux.sh 2>/dev/null) || { echo "no kernel: bash scripts/fetch-linux.sh" >&2; exit 2; }
progs=$(ls -td target/release/build/vmm-*/out/linux 2>/dev/null | head -1)
[ -n "$progs" ] && [ -x "$progs/init" ] || { echo "no Linux programs under target/release/build/vmm-*/out/linux" >&2; exit 2; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
initrd="$tmp/initramfs.cpio"

python3 - "$progs" "$initrd" "$faultline" "$kernel" "$rounds" "$seeds" "${program[@]}" <<'EOF'
import os, resource, statistics, subprocess, sys, threading, time

progs, initrd, faultline, kernel, rounds, seeds = sys.argv[1:7]
program = sys.argv[7:]
rounds = int(rounds)
phases = seeds == "2"
seeds = seeds == "1"

# The seed programs with a fixed amount of work each (--seeds).
SEEDS = [
    ["ctxsw", "-n", "20000"],
    ["hackbench", "1", "-l", "300"],
    ["bm", "-f", "1", "-w", "1", "-m", "64M", "-n", "6000000"],
    ["apfcalc", "-m", "160M", "-l", "20"],
]

def newc(entries):
    """A cpio archive in the kernel's `newc` format."""
    out = bytearray()
    def pad():
        out.extend(b"\0" * (-len(out) % 4))
    for ino, (name, mode, data, rdev) in enumerate(entries + [("TRAILER!!!", 0, b"", (0, 0))], 1):
        name_b = name.encode() + b"\0"
        fields = [ino, mode, 0, 0, 1, 0, len(data), 0, 0, rdev[0], rdev[1], len(name_b), 0]
        out.extend(b"070701" + b"".join(b"%08X" % f for f in fields))
        out.extend(name_b)
        pad()
        out.extend(data)
        pad()
    return bytes(out)

entries = [(d, 0o040755, b"", (0, 0)) for d in ["dev", "proc", "sys", "tmp", "bin"]]
entries.append(("dev/console", 0o020600, b"", (5, 1)))
entries.append(("init", 0o100755, open(os.path.join(progs, "init"), "rb").read(), (0, 0)))
for name in sorted(os.listdir(progs)):
    if name != "init":
        entries.append(("bin/" + name, 0o100755, open(os.path.join(progs, name), "rb").read(), (0, 0)))
with open(initrd, "wb") as f:
    f.write(newc(entries))

OPTIONS = "console=ttyS0 panic=-1 reboot=t"

# A run longer than this is stopped and reported (QEMU's TCG has been seen
# to hang booting 4 vCPUs on this host, once in many rounds).
TIMEOUT_S = 180

# Console lines both machines print on the way through a boot (Linux
# 6.1), in order, for --phases; the phase ending at each is named by it.
PHASES = [
    "smpboot: Allowing",
    "clocksource: Switched to clocksource",
    "Trying to unpack rootfs",
    "Key type encrypted registered",
    "Freeing unused decrypted memory",
    "Run /init as init process",
    "faultline-init: hello exited",
]

def timed(argv, name, marks=None):
    """Wall and CPU seconds of one run to its exit, the wall seconds from
    init's start to `name`'s end (None if either line is missing), its
    output; with `marks` (console lines), also fills it with the wall
    seconds from the start at which each first appeared."""
    start_line, end_line = b"Run /init as init process", f"faultline-init: {name} exited".encode()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    watchdog = threading.Timer(TIMEOUT_S, p.kill)
    watchdog.start()
    out, t_init, t_end = [], None, None
    for line in p.stdout:
        if t_init is None and start_line in line:
            t_init = time.monotonic()
        if t_end is None and end_line in line:
            t_end = time.monotonic()
        if marks is not None:
            for m in PHASES:
                if m not in marks and m.encode() in line:
                    marks[m] = time.monotonic() - start
        out.append(line)
    p.wait()
    watchdog.cancel()
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    out = b"".join(out).decode(errors="replace")
    if wall >= TIMEOUT_S:
        sys.exit(f"qemu-linux.sh: {argv[0]} did not end in {TIMEOUT_S} s (stopped):\n{out[-2000:]}")
    if p.returncode != 0:
        sys.exit(f"qemu-linux.sh: {argv[0]} exited with {p.returncode}:\n{out[-2000:]}")
    part = t_end - t_init if t_init is not None and t_end is not None else None
    return wall, cpu, part, out

def qemu(vcpus, program):
    cmdline = OPTIONS + " -- " + " ".join(program)
    return ["qemu-system-x86_64", "-machine", "q35,accel=tcg", "-cpu", "max", "-m", "512M",
            "-smp", str(vcpus), "-kernel", kernel, "-initrd", initrd, "-append", cmdline,
            "-nographic", "-no-reboot", "-monitor", "none", "-serial", "stdio"]

def ours(vcpus, program):
    return [faultline, "run", "--guest", "linux", "--kernel-image", kernel, "--initrd", initrd,
            "--vcpus", str(vcpus), "--mem", "512M", "--cmdline", OPTIONS, "--"] + program

def both(vcpus, program):
    """One alternating round: QEMU's then faultline's (wall, CPU, part)."""
    qw, qc, qp, qout = timed(qemu(vcpus, program), program[0])
    fw, fc, fp, fout = timed(ours(vcpus, program), program[0])
    end = f"faultline-init: {program[0]} exited with status 0"
    if end not in qout or end not in fout or qp is None or fp is None:
        sys.exit(f"qemu-linux.sh: {program[0]} did not end with status 0 after init's start:\n"
                 f"--- qemu\n{qout[-1500:]}\n--- faultline\n{fout[-1500:]}")
    return (qw, qc, qp), (fw, fc, fp)

loadavg = lambda: " ".join(f"{x:.2f}" for x in os.getloadavg())

if phases:
    print(f"qemu-linux.sh --phases: hello, 1 vCPU; kernel {os.path.basename(kernel)}; {rounds} rounds; "
          f"load average {loadavg()}")
    spans = {"qemu": [], "faultline": []}
    for r in range(rounds):
        for who, argv in (("qemu", qemu(1, ["hello"])), ("faultline", ours(1, ["hello"]))):
            marks = {}
            wall, _, _, out = timed(argv, "hello", marks)
            missing = [m for m in PHASES if m not in marks]
            if missing:
                sys.exit(f"qemu-linux.sh: {who} printed no line with {missing[0]!r}:\n{out[-1500:]}")
            at = [0.0] + [marks[m] for m in PHASES] + [wall]
            spans[who].append([b - a for a, b in zip(at, at[1:])])
    names = [f"to '{m}'" for m in PHASES] + ["to the process's end"]
    q = [statistics.median(col) for col in zip(*spans["qemu"])]
    f = [statistics.median(col) for col in zip(*spans["faultline"])]
    print(f"{'phase (from the line before)':48} {'qemu s':>8} {'faultline s':>12} {'faultline/qemu':>15}")
    for name, qs, fs in zip(names, q, f):
        print(f"{name[:48]:48} {qs:8.3f} {fs:12.3f} {fs / qs:14.2f}x")
    print(f"{'whole run':48} {sum(q):8.3f} {sum(f):12.3f} {sum(f) / sum(q):14.2f}x")
    sys.exit(0)

if seeds:
    print(f"qemu-linux.sh --seeds: 1 vCPU; kernel {os.path.basename(kernel)}; {rounds} rounds; "
          f"load average {loadavg()}")
    medians = []
    for program in SEEDS:
        name = " ".join(program)
        rows = []
        for r in range(rounds):
            (qw, qc, qp), (fw, fc, fp) = both(1, program)
            rows.append((qw, qp, fw, fp))
            print(f"{name} round {r + 1}: qemu {qw:.2f} s wall, program {qp:.2f} s; "
                  f"faultline {fw:.2f} s wall, program {fp:.2f} s; "
                  f"faultline/qemu wall {fw / qw:.2f}x; throughput (qemu/faultline program) {qp / fp:.2f}x")
        medians.append((name, [statistics.median(col) for col in zip(*rows)]))
    print(f"load average {loadavg()}")
    for name, (qw, qp, fw, fp) in medians:
        print(f"{name} median: qemu {qw:.2f} s wall, program {qp:.2f} s; "
              f"faultline {fw:.2f} s wall, program {fp:.2f} s; "
              f"faultline/qemu wall {fw / qw:.2f}x; throughput (qemu/faultline program) {qp / fp:.2f}x")
    sys.exit(0)

print(f"qemu-linux.sh: {' '.join(program)}; kernel {os.path.basename(kernel)}; {rounds} rounds")
for vcpus in (1, 4):
    rows = []
    for r in range(rounds):
        (qw, qc, _), (fw, fc, _) = both(vcpus, program)
        rows.append((qw, qc, fw, fc))
        print(f"{vcpus} vCPU(s) round {r + 1}: qemu {qw:.2f} s wall {qc:.2f} s CPU; "
              f"faultline {fw:.2f} s wall {fc:.2f} s CPU; faultline/qemu wall {fw / qw:.2f}x CPU {fc / qc:.2f}x")
    med = [statistics.median(col) for col in zip(*rows)]
    print(f"{vcpus} vCPU(s) median: qemu {med[0]:.2f} s wall {med[1]:.2f} s CPU; "
          f"faultline {med[2]:.2f} s wall {med[3]:.2f} s CPU; faultline/qemu wall {med[2] / med[0]:.2f}x CPU {med[3] / med[1]:.2f}x")
EOF
