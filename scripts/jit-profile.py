#!/usr/bin/env python3
"""Where translated code spends its host instructions, by kind.

    python3 scripts/jit-profile.py [--faultline BIN] [--top N] -- RUN-ARGS...

runs `BIN run RUN-ARGS` (default `target/release/faultline`; e.g.
`-- --guest linux --mem 512M -- hello`) under callgrind with per-
instruction counts, with `FAULTLINE_PERF_MAP=1` (where each translation
lies) and `FAULTLINE_JIT_DISASM=all` (its host instructions), and sums
the host instructions executed in translated blocks by what each host
instruction does: the first-level TLB probes of inline accesses, guest
registers loaded from and stored to the `Cpu`, the chaining lookups,
the counters and cycle checks of the exits, the guest flags kept across
checks, jumps, and the rest (the guest's own work); with `--top N`
also the N translations that run the most, each with its guest RIP and
its own split by kind. The classification
is by the instruction's text (`classify`); the `Cpu` offsets come from
the disassembly's header lines. Everything is written to a temporary
directory, removed at the end. Translation is made on the vCPU thread
(`FAULTLINE_JIT_SYNC=1`), so the counts repeat. Callgrind makes the run about 50 times
slower; the printing of the disassembly adds host instructions outside
the blocks, so only the blocks' own counts are reported.
"""

import argparse
import bisect
import collections
import os
import re
import signal
import subprocess
import sys
import tempfile


def classify(text, fields):
    """The kind of one host instruction of a block body."""
    if re.match(r"(lahf|sahf|seto|pushfq|popfq)\b", text) or "r15d" in text or text == "add al,7Fh":
        return "guest flags kept across checks"
    if re.match(r"j[a-z]+ ", text):
        return "jumps (probe, chain and guest branches)"
    rbx = [int(d, 16) for d in re.findall(r"\[rbx\+([0-9A-F]+)h\]", text)]
    if any(d in fields["exit"] for d in rbx):
        return "exit counters and cycle checks"
    if re.search(
        r"\[r10\+|r10,\[r14|\[r14\+20h\]|\[r14\+28h\]|jmp qword ptr|mov \[rsp\],rcx|imul r10|"
        r"r11,rdx|shr r11|\[rcx\+r11\*4\]|\[rbp\+[0-9A-F]*2[0-9A-F]{3}h\]",
        text,
    ):
        return "chaining lookup"
    if re.search(
        r"\[rbp\+rcx\+|lea rcx,\[rax\+1000h\]|shr rcx,7$|and ecx,7E0h|shr rdx,0Ch|"
        r"lea rdx,\[rax\+[0-9A-F]+h?\]|add rdx,rax|\[r14\+18h\]|cmp byte ptr \[rdx\],0",
        text,
    ):
        return "first-level TLB probes"
    if any(fields["gpr"] <= d < fields["gpr"] + 16 * 8 for d in rbx):
        return "guest registers loaded and stored"
    if re.match(r"mov (r[a-z0-9]+|e[a-z]+),[0-9A-F]+h?$", text):
        return "constants (exit RIPs, counts)"
    if re.match(r"(call|ret|push|pop)\b", text):
        return "calls (slow paths)"
    return "the rest (the guest's own work)"


def read_translations(map_path, dis_path):
    """The translations in the order they were made: (start, size) from
    the perf map, {offset: (text, is_entry)} and the fields from the
    disassembly."""
    spans = []
    with open(map_path) as f:
        for line in f:
            start, size, _ = line.split()
            spans.append((int(start, 16), int(size, 16)))
    bodies, fields = [], []
    body = None
    with open(dis_path, errors="replace") as f:
        for line in f:
            if line.startswith("jit: block"):
                body = {}
                bodies.append(body)
                rip = int(line.split()[2].rstrip(":"), 16)
                m = re.search(r"gpr (0x[0-9a-f]+) cycles (0x[0-9a-f]+) instructions (0x[0-9a-f]+) "
                              r"deadline (0x[0-9a-f]+) chain_rip (0x[0-9a-f]+)", line)
                if not m:
                    sys.exit("jit-profile: the disassembly has no field offsets (an older build?)")
                gpr, cycles, instructions, deadline, chain_rip = (int(x, 16) for x in m.groups())
                fields.append({"gpr": gpr, "exit": {cycles, instructions, deadline, chain_rip}, "entry": 0,
                               "rip": rip})
                continue
            m = re.match(r"^([ >]) *([0-9a-f]+)  (.*)$", line)
            if body is not None and m and not line.startswith("  guest"):
                off, is_entry = int(m.group(2), 16), m.group(1) == ">"
                body[off] = (m.group(3).strip(), is_entry)
                if is_entry:
                    fields[-1]["entry"] = off
    if len(spans) != len(bodies):
        sys.exit(f"jit-profile: {len(spans)} translations in the map, {len(bodies)} disassembled")
    return spans, bodies, fields


def instruction_costs(cg_path):
    """Ir per instruction address from a callgrind file with
    `--dump-instr=yes` (positions `instr line`), calls' inclusive lines
    left out."""
    cost = collections.Counter()
    last, after_calls = 0, False
    with open(cg_path) as f:
        for line in f:
            if line.startswith("calls="):
                after_calls = True
                continue
            if not line or line[0] not in "0123456789+-*":
                after_calls = False
                continue
            parts = line.split()
            p = parts[0]
            if p.startswith("0x"):
                addr = int(p, 16)
            elif p[0] in "+-":
                addr = last + int(p, 0)
            elif p == "*":
                addr = last
            else:
                addr = int(p)
            last = addr
            if after_calls:
                after_calls = False
                continue
            if len(parts) >= 3:
                cost[addr] += int(parts[2])
    return cost


def stop(signum, frame):
    """SIGTERM as Ctrl-C: the run under callgrind is stopped and the
    temporary directory removed."""
    raise KeyboardInterrupt


def main():
    signal.signal(signal.SIGTERM, stop)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--faultline", default="target/release/faultline")
    ap.add_argument("--top", type=int, default=0, metavar="N",
                    help="also list the N translations that run the most host instructions")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="-- then the arguments of `faultline run`")
    a = ap.parse_args()
    args = a.args[1:] if a.args[:1] == ["--"] else a.args
    if not args:
        ap.error("no arguments for `faultline run` (after --)")
    if not os.access(a.faultline, os.X_OK):
        ap.error(f"{a.faultline} is not an executable (cargo build --release first?)")
    with tempfile.TemporaryDirectory(prefix="jit-profile-") as tmp:
        cg = os.path.join(tmp, "callgrind.out")
        dis = os.path.join(tmp, "disassembly.txt")
        env = dict(os.environ, FAULTLINE_PERF_MAP="1", FAULTLINE_JIT_DISASM="all", FAULTLINE_JIT_SYNC="1")
        print(f"jit-profile: callgrind of `{a.faultline} run {' '.join(args)}` (slow)...", file=sys.stderr)
        with open(dis, "w") as err:
            p = subprocess.Popen(
                ["valgrind", "--tool=callgrind", "--dump-instr=yes", f"--callgrind-out-file={cg}",
                 a.faultline, "run", *args],
                env=env, stdout=subprocess.DEVNULL, stderr=err)
            try:
                p.wait()
            except KeyboardInterrupt:
                p.terminate()
                p.wait()
                if os.path.exists(f"/tmp/perf-{p.pid}.map"):
                    os.unlink(f"/tmp/perf-{p.pid}.map")
                sys.exit("jit-profile: stopped")
        if p.returncode != 0:
            print(f"jit-profile: the run exited with status {p.returncode}", file=sys.stderr)
        map_path = f"/tmp/perf-{p.pid}.map"
        if not os.path.exists(map_path):
            sys.exit(f"jit-profile: no perf map {map_path} (did the run translate anything?)")
        try:
            spans, bodies, fields = read_translations(map_path, dis)
        finally:
            os.unlink(map_path)
        cost = instruction_costs(cg)
    order = sorted(range(len(spans)), key=lambda i: spans[i][0])
    starts = [spans[i][0] for i in order]
    by_kind = collections.Counter()
    by_block = collections.defaultdict(collections.Counter)
    total = 0
    for addr, ir in cost.items():
        # The translation starting closest below the address, if it holds
        # it (code memory reused by a later translation would be counted
        # as that one's).
        j = bisect.bisect_right(starts, addr) - 1
        if j < 0 or addr >= spans[order[j]][0] + spans[order[j]][1]:
            continue
        owner = order[j]
        entry = bodies[owner].get(addr - spans[owner][0])
        total += ir
        if entry is None:
            by_kind["(not at an instruction start)"] += ir
            continue
        text, _ = entry
        kind = (
            "prologue (entry from Rust)"
            if addr - spans[owner][0] < fields[owner]["entry"]
            else classify(text, fields[owner])
        )
        by_kind[kind] += ir
        by_block[owner][kind] += ir
    print(f"host instructions in translated blocks: {total:,} ({len(spans)} translations)")
    print(f"{'host instructions':>18}  {'share':>6}  kind")
    for kind, ir in by_kind.most_common():
        print(f"{ir:>18,}  {100 * ir / max(total, 1):5.1f}%  {kind}")
    if a.top:
        # Short names for the kinds, in the order of the table above.
        kinds = [k for k, _ in by_kind.most_common()]
        print(f"\nthe {a.top} translations that run the most (share of all blocks; "
              "then of the translation's own instructions by kind, in the order above)")
        hot = sorted(by_block, key=lambda i: -sum(by_block[i].values()))[: a.top]
        for i in hot:
            n = sum(by_block[i].values())
            split = " ".join(f"{100 * by_block[i][k] / n:.0f}" for k in kinds)
            print(f"{fields[i]['rip']:#018x} {n:>15,} {100 * n / max(total, 1):5.1f}%  [{split}]")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit("jit-profile: stopped")
