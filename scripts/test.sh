#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit and integration tests, and a
# short differential test of the interpreter against this machine's CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fmt --all -- --check
cargo clippy --release --workspace --all-targets --locked -- -D warnings
cargo test --release --workspace --locked
