#!/usr/bin/env bash
# The vmm's product code imports nothing from its experiments: the
# benchmarks (crates/vmm/src/bench/, in the binary) may use the product
# (the `vmm` library), never the other way round, so a bench can change
# or go without touching `faultline run`. The compiler already keeps the
# library from naming the binary's modules; this also catches a product
# file pulled into the binary by #[path]. main.rs is the one exception:
# it declares the bench module and hands `faultline bench` to it.
set -euo pipefail
cd "$(dirname "$0")/.."

src=crates/vmm/src
# A path into the experiments, their module declared, or a file of theirs
# pulled in by #[path].
pattern='crate::bench\b|\bbench::|\bmod bench\b|#\[path *= *"[^"]*bench'
main_may_say='^(mod bench;|        Command::Bench\(command\) => bench::main\(\*command\),)$'

violations=()
while IFS= read -r -d '' file; do
    while IFS= read -r hit; do
        text=${hit#*:}
        if [[ $file == "$src/main.rs" && $text =~ $main_may_say ]]; then
            continue
        fi
        violations+=("$file:$hit")
    done < <(grep -nE "$pattern" "$file" || true)
done < <(find "$src" -name '*.rs' ! -path "$src/bench/*" ! -path "$src/bench.rs" -print0 | sort -z)

if ((${#violations[@]})); then
    echo "check-layers: the vmm's product code refers to its experiments ($src/bench/):" >&2
    printf '  %s\n' "${violations[@]}" >&2
    echo "check-layers: move what the product needs out of bench/ into a product module; the benches import it from there." >&2
    exit 1
fi
echo "check-layers: vmm product code imports nothing from bench/"
