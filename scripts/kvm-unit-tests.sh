#!/usr/bin/env bash
# Runs kvm-unit-tests' x86 tests on faultline (and, with --qemu, on QEMU TCG
# side by side) and prints one row per test: the verdict and PASS/FAIL/SKIP
# counts on each, the unassigned-MMIO accesses faultline counted, and
# faultline's first failing line. See docs/conformance.md.
#
#   scripts/kvm-unit-tests.sh DIR [--qemu] [--timeout SECONDS] [--only REGEX]
#                                 [--faultline BIN] [--out DIR] [-- FAULTLINE-OPTIONS...]
#
# DIR is a kvm-unit-tests tree built for x86_64 (`./configure && make`);
# nothing of it enters this repository. Each test runs as x86/unittests.cfg
# says: `file`, `smp` (--vcpus), `test_args` (the kernel command line),
# `-m` in `qemu_params`/`extra_params` (--mem), `arch` (i386-only tests are
# SKIP on an x86_64 build), `timeout` (capped by --timeout, default 90 s);
# `accel = kvm` tests are SKIP on QEMU TCG, as the suite's runner has them.
# `-device edu` and `-device intel-iommu,...` in the QEMU options become
# `--device edu` and `--iommu intel`. A `check = PATH=VALUE ...` line (a KVM
# module parameter or host setting the test needs) is answered for
# faultline by faultline_param below; a check that fails is SKIP on
# faultline's side, as the suite's runner skips it on a host that fails it.
# Other QEMU options (-cpu models, other devices) have no faultline
# equivalent: faultline always offers its one CPU model. FAULTLINE-OPTIONS go
# to every `faultline run` (e.g. `--mmu shadow`, `--engine interp`).
#
# Verdicts: PASS (the test exited with success and printed no FAIL line),
# FAIL, SKIP (the test's "skipped" exit, status 77 as kvm-unit-tests' own
# runner reads it, or only SKIP lines), TIMEOUT, ERROR (anything else: an
# unhandled exception in the test, a VM stopped on an error).
set -uo pipefail

usage() {
    sed -n '7,9p' "$0" | sed 's/^# *//' >&2
    exit 2
}

[ $# -ge 1 ] || usage
KUT=$(cd "$1" && pwd) || usage
shift
QEMU=0
CAP=90
ONLY=""
OUT=""
FAULTLINE=""
EXTRA=()
while [ $# -gt 0 ]; do
    case "$1" in
        --qemu) QEMU=1 ;;
        --timeout) CAP=$2; shift ;;
        --only) ONLY=$2; shift ;;
        --out) OUT=$2; shift ;;
        --faultline) FAULTLINE=$2; shift ;;
        --) shift; EXTRA=("$@"); break ;;
        *) usage ;;
    esac
    shift
done

ROOT=$(cd "$(dirname "$0")/.." && pwd)
if [ -z "$FAULTLINE" ]; then
    (cd "$ROOT" && cargo build --release --quiet --bin faultline) || exit 1
    FAULTLINE=$ROOT/target/release/faultline
fi
CFG=$KUT/x86/unittests.cfg
[ -f "$CFG" ] || { echo "no $CFG" >&2; exit 2; }
[ -n "$OUT" ] || OUT=$(mktemp -d /tmp/kvm-unit-tests.XXXXXX)
mkdir -p "$OUT"
if [ "$QEMU" = 1 ] && ! command -v qemu-system-x86_64 >/dev/null; then
    echo "--qemu: qemu-system-x86_64 not found" >&2
    exit 2
fi

# counts LOG -> "PASS FAIL SKIP" (XFAIL counts as PASS, XPASS as FAIL).
counts() {
    local p f s
    p=$(grep -cE '^(PASS|XFAIL): ' "$1")
    f=$(grep -cE '^(FAIL|XPASS): ' "$1")
    s=$(grep -cE '^SKIP: ' "$1")
    echo "$p $f $s"
}

# verdict STATUS LOG -> verdict. STATUS is the exit status of the run
# (isa-debug-exit's (code << 1) | 1, modulo 256), 124 after a timeout.
verdict() {
    local status=$1 log=$2 p f s
    read -r p f s < <(counts "$log")
    if [ "$status" = 124 ]; then echo TIMEOUT
    # QEMU refusing its options (e.g. -cpu host without KVM) also exits 1.
    elif [ "$p$s" = 00 ] && grep -q '^qemu-system-x86_64: ' "$log"; then echo ERROR
    elif [ "$status" = 77 ]; then echo SKIP
    elif [ "$status" = 1 ] && [ "$f" = 0 ]; then
        if [ "$p" = 0 ] && [ "$s" != 0 ]; then echo SKIP; else echo PASS; fi
    elif [ "$f" != 0 ] || [ "$status" = 3 ]; then echo FAIL
    else echo ERROR
    fi
}

# first_failure LOG STATUS -> the first line that explains a non-pass (for
# a SKIP, the first SKIP line).
first_failure() {
    local log=$1 status=$2 line
    line=$(grep -m1 -E '^(FAIL|XPASS): |Unhandled exception|^faultline: .*(error|outside|refused|not)|^stopped: *error' "$log")
    [ -n "$line" ] || line=$(grep -m1 -E '^SKIP: ' "$log")
    if [ -z "$line" ] && [ "$status" = 124 ]; then
        line="(timeout) last line: $(grep -v '^$' "$log" | tail -n1)"
    fi
    if [ -z "$line" ] && [ "$status" != 1 ]; then
        line="(exit $status) last line: $(grep -v '^$' "$log" | tail -n1)"
    fi
    printf '%s' "$line" | tr '|' '/' | cut -c1-140
}

# faultline_param PATH -> what faultline answers for a cfg `check` path:
# the value the KVM module parameter (or host setting) would have on a KVM
# host that offers what faultline offers. Empty: no such parameter (the
# check fails, as the suite's runner fails it for a missing file).
# docs/conformance.md gives the reasons.
faultline_param() {
    case "$1" in
        # No VMware backdoor I/O ports (0x5658/0x5659) or their #GP bypass.
        /sys/module/kvm/parameters/enable_vmware_backdoor) echo N ;;
        # No architectural PMU (CPUID leaf 0xA reports version 0).
        /sys/module/kvm/parameters/enable_pmu) echo N ;;
        # Unknown MSRs #GP; they are never silently ignored.
        /sys/module/kvm/parameters/ignore_msrs) echo N ;;
        # One CPU model with one MAXPHYADDR: no guest MAXPHYADDR smaller
        # than the machine's can be configured.
        /sys/module/kvm_intel/parameters/allow_smaller_maxphyaddr) echo N ;;
        # No host NMI watchdog shares counters with the guest.
        /proc/sys/kernel/nmi_watchdog) echo 0 ;;
        # Guest time comes from the virtual TSC (kvmclock is built on it).
        /sys/devices/system/clocksource/clocksource0/current_clocksource) echo tsc ;;
        *) echo "" ;;
    esac
}

# failed_check "PATH=VALUE ..." -> the first check faultline fails, as
# "PATH=VALUE (faultline: ANSWER)"; nothing if all hold.
failed_check() {
    local c path want have
    for c in $1; do
        path=${c%%=*} want=${c#*=}
        have=$(faultline_param "$path")
        if [ -z "$have" ] || [ "$have" != "$want" ]; then
            echo "$path=$want (faultline: ${have:-absent})"
            return
        fi
    done
}

# faultline_devices QEMU-PARAMS -> the faultline options for the devices
# the cfg asks QEMU for (one per line).
faultline_devices() {
    local q
    read -r -a q <<<"$1"
    for ((i = 0; i + 1 < ${#q[@]}; i++)); do
        [ "${q[i]}" = -device ] || continue
        case "${q[i + 1]}" in
            edu | edu,*) printf '%s\n' --device edu ;;
            intel-iommu | intel-iommu,*) printf '%s\n' --iommu intel ;;
        esac
    done
}

# Runs one test on faultline; prints "VERDICT P F S UNASSIGNED FIRST".
# DEVICE_OPTS holds the device options for the test.
run_faultline() {
    local name=$1 file=$2 smp=$3 mem=$4 secs=$5 log=$OUT/$name.faultline
    shift 5
    local args=(run --kernel "$KUT/x86/$file" --vcpus "$smp" --wall-limit "${secs}s")
    [ -n "$mem" ] && args+=(--mem "$mem")
    args+=("${DEVICE_OPTS[@]}")
    # asyncpf needs host memory smaller than the guest's (on KVM: a memory
    # cgroup around QEMU); faultline's is --host-mem.
    [ "$file" = asyncpf.flat ] && args+=(--host-mem 512M --apf pv)
    # The multiboot command line starts with the kernel's name, as QEMU
    # (and GRUB) pass it: the suite's setup takes the first word as argv[0].
    args+=("--cmdline=$KUT/x86/$file${*:+ $*}")
    timeout -k 5 $((secs + 10)) "$FAULTLINE" "${args[@]}" "${EXTRA[@]}" >"$log" 2>&1 </dev/null
    local status=$?
    # faultline's own wall limit ends the run like a timeout.
    if grep -q '^stopped: *wall' "$log"; then status=124; fi
    local v p f s un
    v=$(verdict "$status" "$log")
    read -r p f s < <(counts "$log")
    un=$(sed -n 's/^unassigned MMIO: \([0-9]*\).*/\1/p' "$log")
    local first=""
    [ "$v" = PASS ] || first=$(first_failure "$log" "$status")
    echo "$v $p $f $s ${un:-0} $first"
}

# Runs one test on QEMU TCG; prints "VERDICT P F S".
run_qemu() {
    local name=$1 file=$2 smp=$3 secs=$4 qparams=$5 log=$OUT/$name.qemu
    shift 5
    local cmd=(qemu-system-x86_64 --no-reboot -nodefaults -device pc-testdev
        -device isa-debug-exit,iobase=0xf4,iosize=0x4 -display none -serial stdio
        -device pci-testdev -machine accel=tcg -kernel "$KUT/x86/$file" -smp "$smp")
    # QEMU's options from the cfg; -cpu max unless they name a model.
    local q
    read -r -a q <<<"$qparams"
    [[ " $qparams " == *" -cpu "* ]] || cmd+=(-cpu max)
    cmd+=("${q[@]}")
    [ $# -gt 0 ] && cmd+=(-append "$*")
    timeout -k 5 "$secs" "${cmd[@]}" >"$log" 2>&1 </dev/null
    local status=$?
    local v p f s
    v=$(verdict "$status" "$log")
    read -r p f s < <(counts "$log")
    echo "$v $p $f $s"
}

if [ "$QEMU" = 1 ]; then
    echo "| test | faultline | PASS/FAIL/SKIP | QEMU TCG | PASS/FAIL/SKIP | unassigned MMIO | faultline's first failing line |"
    echo "|---|---|---|---|---|---|---|"
else
    echo "| test | faultline | PASS/FAIL/SKIP | unassigned MMIO | first failing line |"
    echo "|---|---|---|---|---|"
fi

# kvmclock's wall clock at boot on faultline, in seconds (2026-01-01).
FAULTLINE_WALL_CLOCK=1767225600

declare -A TOTAL
row() {
    local name=$1 file=$2 smp=${3:-1} args=$4 params=$5 arch=$6 timeout=$7 accel=$8 check=$9
    [ -n "$name" ] || return 0
    if [ -n "$ONLY" ] && ! [[ $name =~ $ONLY ]]; then return 0; fi
    local secs=${timeout:-90}
    secs=${secs%s}
    [ "$secs" -gt "$CAP" ] && secs=$CAP
    local mem=""
    if [[ " $params " =~ \ -m\ ([0-9]+)([MGmg]?)\  ]]; then
        mem=${BASH_REMATCH[1]}
        case "${BASH_REMATCH[2]}" in
            g | G) mem=${mem}G ;;
            *) mem=${mem}M ;;
        esac
    fi
    # test_args as the shell would split them (the cfg is the suite's
    # own, and kvm-unit-tests' runner evaluates it the same way).
    local argv=() fl_argv=()
    set -f
    eval "argv=($args)"
    # faultline's guest wall clock starts at a fixed time so that runs
    # repeat (hv::DEFAULT_WALL_CLOCK_AT_BOOT_NS): `date` in test_args
    # (kvmclock_test's wall-clock check) gives that time on faultline's side.
    date() { echo "$FAULTLINE_WALL_CLOCK"; }
    eval "fl_argv=($args)"
    unset -f date
    set +f
    local fl q="" failed
    mapfile -t DEVICE_OPTS < <(faultline_devices "$params")
    failed=$(failed_check "$check")
    if [ "$arch" = i386 ]; then
        fl="SKIP 0 0 0 0 i386-only test (x86_64 build)"
        [ "$QEMU" = 1 ] && q="SKIP 0 0 0"
    elif [ ! -f "$KUT/x86/$file" ]; then
        fl="SKIP 0 0 0 0 $file not built"
        [ "$QEMU" = 1 ] && q="SKIP 0 0 0"
    else
        if [ -n "$failed" ]; then
            fl="SKIP 0 0 0 0 check: $failed"
        else
            fl=$(run_faultline "$name" "$file" "$smp" "$mem" "$secs" "${fl_argv[@]}")
        fi
        if [ "$QEMU" = 1 ] && [ "$accel" = kvm ]; then
            q="SKIP 0 0 0" # accel = kvm: the suite's runner skips it on TCG
        elif [ "$QEMU" = 1 ]; then
            q=$(run_qemu "$name" "$file" "$smp" "$secs" "$params" "${argv[@]}")
        fi
    fi
    local v p f s un first qv qp qf qs
    read -r v p f s un first <<<"$fl"
    TOTAL[f_$v]=$((${TOTAL[f_$v]:-0} + 1))
    if [ "$QEMU" = 1 ]; then
        read -r qv qp qf qs <<<"$q"
        TOTAL[q_$qv]=$((${TOTAL[q_$qv]:-0} + 1))
        echo "| $name | $v | $p/$f/$s | $qv | $qp/$qf/$qs | $un | $first |"
    else
        echo "| $name | $v | $p/$f/$s | $un | $first |"
    fi
}

name="" file="" smp="" args="" params="" arch="" tmo="" accel="" check=""
while IFS= read -r line || [ -n "$line" ]; do
    if [[ $line =~ ^\[(.*)\]$ ]]; then
        next=${BASH_REMATCH[1]}
        row "$name" "$file" "$smp" "$args" "$params" "$arch" "$tmo" "$accel" "$check"
        name=$next file="" smp="" args="" params="" arch="" tmo="" accel="" check=""
    elif [[ $line =~ ^file\ *=\ *(.*)$ ]]; then file=${BASH_REMATCH[1]}
    elif [[ $line =~ ^smp\ *=\ *(.*)$ ]]; then smp=${BASH_REMATCH[1]}
    elif [[ $line =~ ^(test_args|extra_params)\ *=\ *(.*)$ ]]; then
        key=${BASH_REMATCH[1]} value=${BASH_REMATCH[2]}
        # Old configs: extra_params = ... -append 'ARGS'.
        if [[ $value =~ -append\ *[\"\']([^\"\']*)[\"\'] ]]; then
            args=${BASH_REMATCH[1]}
            params="$params ${value%%-append*}"
        elif [ "$key" = test_args ]; then args=$value
        else params="$params $value"
        fi
    elif [[ $line =~ ^qemu_params\ *=\ *(.*)$ ]]; then params="$params ${BASH_REMATCH[1]}"
    elif [[ $line =~ ^arch\ *=\ *(.*)$ ]]; then arch=${BASH_REMATCH[1]}
    elif [[ $line =~ ^timeout\ *=\ *(.*)$ ]]; then tmo=${BASH_REMATCH[1]}
    elif [[ $line =~ ^accel\ *=\ *(.*)$ ]]; then accel=${BASH_REMATCH[1]}
    elif [[ $line =~ ^check\ *=\ *(.*)$ ]]; then check=${BASH_REMATCH[1]}
    fi
done <"$CFG"
row "$name" "$file" "$smp" "$args" "$params" "$arch" "$tmo" "$accel" "$check"

summary="faultline:"
for v in PASS FAIL SKIP TIMEOUT ERROR; do summary+=" $v ${TOTAL[f_$v]:-0}"; done
if [ "$QEMU" = 1 ]; then
    summary+="; QEMU TCG:"
    for v in PASS FAIL SKIP TIMEOUT ERROR; do summary+=" $v ${TOTAL[q_$v]:-0}"; done
fi
echo
echo "$summary"
echo "suite: $(git -C "$KUT" rev-parse HEAD 2>/dev/null || echo unknown); logs in $OUT"
