#!/usr/bin/env bash
# The vmm's product code imports nothing from its experiments. The product
# is the `vmm` library (crates/vmm/src/lib.rs and the modules it declares);
# the `faultline` binary adds the command line (main.rs) and the
# experiments: the benchmarks (bench/), `faultline reproduce`
# (reproduce.rs) and their plots (plot.rs). They may use the library,
# never the other way round, so an experiment can change or go without
# touching `faultline run`. The compiler already keeps the library from
# naming the binary's modules; this also catches a product file that
# names them in a path or pulls one in with #[path].
set -euo pipefail
cd "$(dirname "$0")/.."

src=crates/vmm/src
experiments='bench|reproduce|plot'
pattern="crate::($experiments)\\b|\\b($experiments)::|\\bmod ($experiments)\\b|#\\[path *= *\"[^\"]*($experiments)"

violations=()
while IFS= read -r -d '' file; do
    while IFS= read -r hit; do
        violations+=("$file:$hit")
    done < <(grep -nE "$pattern" "$file" || true)
done < <(find "$src" -name '*.rs' ! -path "$src/main.rs" ! -path "$src/bench/*" \
    ! -path "$src/bench.rs" ! -path "$src/reproduce.rs" ! -path "$src/reproduce/*" \
    ! -path "$src/plot.rs" -print0 | sort -z)

if ((${#violations[@]})); then
    echo "check-layers: the vmm's product code (the library) refers to its experiments (bench/, reproduce, plot):" >&2
    printf '  %s\n' "${violations[@]}" >&2
    echo "check-layers: move what the product needs into a library module; the experiments import it from there." >&2
    exit 1
fi
echo "check-layers: vmm product code imports nothing from bench/, reproduce or plot"
