#!/usr/bin/env bash
# The whole test suite: the vmm's layering (product code imports nothing
# from its benchmarks), formatting, lints, the guest's host-side unit tests,
# and every Rust unit and integration test (which include booting the guest
# kernel, a differential test of the interpreter against this machine's CPU,
# and no-panic fuzzing of the decoder/interpreter).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/check-layers.sh
cargo fmt --all -- --check
cargo clippy --release --workspace --all-targets --all-features --locked -- -D warnings
make -C guest test
cargo test --release --workspace --all-features --locked
