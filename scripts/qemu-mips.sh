#!/usr/bin/env bash
# qemu-mips.sh [ROUNDS]: the `mips` workload's ELF, byte for byte, under
# QEMU's TCG and under faultline (`mips`, both engines), in alternating runs.
#
# A benchmark, not a test (nothing in scripts/test.sh calls it). Needs
# qemu-system-x86_64, gcc (with -m32), python3 and a release build
# (`cargo build --release --locked -p machine --bin mips`).
#
# How the workload boots under QEMU: scripts/qemu-mips-boot.S is a 32-bit
# multiboot kernel (`-kernel`) that builds a 4 KiB identity map, enters long
# mode and jumps to the ELF's entry point; the ELF is loaded by QEMU's generic
# loader (`-device loader,file=...`). COM1 prints the checksum and
# isa-debug-exit at port 0xf4 ends the run, as on faultline's bare machine.
#
# QEMU's time includes its start-up (firmware, the multiboot loader), so its
# rate is taken from two runs, the one-round and the twelve-round workload:
# (instructions(full) - instructions(small)) / (time(full) - time(small)),
# the instruction counts being faultline's (the same bytes run the same
# instructions). Wall time and CPU time (user + system, all of QEMU's threads)
# give two rates. faultline's figures are `mips --json`'s `bare` setup (4 KiB
# pages, no EPT): MIPS per wall second and per CPU second of the running
# thread. Each round prints all of them and the ratios within the round;
# the last line is the median over the rounds.
set -euo pipefail

rounds=${1:-3}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
mips=target/release/mips
[ -x "$mips" ] || { echo "build first: cargo build --release --locked -p machine --bin mips" >&2; exit 2; }
full=$(ls -t target/release/build/machine-*/out/mips_workload.elf 2>/dev/null | head -1)
[ -n "$full" ] || { echo "no mips_workload.elf under target/release/build" >&2; exit 2; }
small=$(dirname "$full")/mips_workload_small.elf

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
entry=$(readelf -h "$full" | awk '/Entry point address/ {print $4}')
gcc -m32 -nostdlib -static -no-pie -DENTRY="$entry" -Wl,-N -Wl,-Ttext=0x100000 \
    -Wl,--build-id=none -Wl,--no-warn-rwx-segments -o "$tmp/boot.elf" scripts/qemu-mips-boot.S

qemu_run() { # ELF -> "wall cpu checksum"
    /usr/bin/time -f "%e %U %S" -o "$tmp/time" \
        qemu-system-x86_64 -machine pc -accel tcg -m 64M -display none -serial stdio \
        -monitor none -no-reboot -device isa-debug-exit,iobase=0xf4,iosize=4 \
        -kernel "$tmp/boot.elf" -device loader,file="$1" >"$tmp/out" 2>"$tmp/err" || true
    # isa-debug-exit(0) makes QEMU exit with status 1: success.
    local sum
    sum=$(sed -n 's/^mips_workload checksum //p' "$tmp/out" | tr -d '\r')
    [ -n "$sum" ] || { echo "QEMU run of $1 printed no checksum:" >&2; cat "$tmp/out" "$tmp/err" >&2; exit 1; }
    # (time adds a "Command exited with non-zero status" line first.)
    tail -1 "$tmp/time" | awk -v s="$sum" '{printf "%s %s %s\n", $1, $2 + $3, s}'
}

"$mips" --quick --json --engine interp >"$tmp/small.json"
qemu-system-x86_64 --version | head -1
echo "rounds: $rounds; $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-6s %12s %12s | %12s %12s | %12s %12s | %9s %9s\n' round qemu_wall qemu_cpu \
    interp_wall interp_cpu jit_wall jit_cpu jit/qemu jit/qemu
printf '%-6s %12s %12s | %12s %12s | %12s %12s | %9s %9s\n' "" MIPS MIPS MIPS MIPS MIPS MIPS wall cpu
for r in $(seq 1 "$rounds"); do
    qemu_run "$small" >"$tmp/qs"
    qemu_run "$full" >"$tmp/qf"
    "$mips" --json >"$tmp/full.json"
    python3 - "$r" "$tmp" <<'PY'
import json, sys
r, tmp = sys.argv[1], sys.argv[2]
small = json.load(open(f"{tmp}/small.json"))
full = json.load(open(f"{tmp}/full.json"))
qs = open(f"{tmp}/qs").read().split()
qf = open(f"{tmp}/qf").read().split()
def count(doc):
    return next(x["instructions"] for x in doc["results"] if x["key"] == "bare_paging_4k")
for name, q, doc in (("small", qs, small), ("full", qf, full)):
    if q[2] != doc["checksum"]:
        sys.exit(f"checksum differs on the {name} workload: QEMU {q[2]}, faultline {doc['checksum']}")
n = count(full) - count(small)
q_wall = n / (float(qf[0]) - float(qs[0])) / 1e6
q_cpu = n / (float(qf[1]) - float(qs[1])) / 1e6
e = full["engines"]
row = [q_wall, q_cpu, e["interp"]["bare_mips"], e["interp"]["bare_cpu_mips"],
       e["jit"]["bare_mips"], e["jit"]["bare_cpu_mips"]]
row += [row[4] / row[0], row[5] / row[1]]
print(f"{r:<6} {row[0]:12.1f} {row[1]:12.1f} | {row[2]:12.1f} {row[3]:12.1f} | "
      f"{row[4]:12.1f} {row[5]:12.1f} | {row[6]:9.2f} {row[7]:9.2f}")
with open(f"{tmp}/rows", "a") as f:
    f.write(" ".join(str(x) for x in row) + "\n")
PY
done
python3 - "$tmp" <<'PY'
import statistics, sys
rows = [list(map(float, l.split())) for l in open(f"{sys.argv[1]}/rows")]
med = [statistics.median(c) for c in zip(*rows)]
print(f"{'median':<6} {med[0]:12.1f} {med[1]:12.1f} | {med[2]:12.1f} {med[3]:12.1f} | "
      f"{med[4]:12.1f} {med[5]:12.1f} | {med[6]:9.2f} {med[7]:9.2f}")
PY
