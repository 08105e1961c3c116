#!/usr/bin/env bash
# Benchmark, not a test: host wall time from starting qemu to CMD running in
# L1 (the init's start marker seen on the console), per arch.
#   tests/nested/bench.sh [RUNS] [ARCH...]     (default: 3 runs, both arches)
# Prints one line per run and the median per arch. Nothing is asserted:
# timing depends on the host's load (L1 is single-vCPU TCG).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
runs=3
if [[ "${1:-}" =~ ^[0-9]+$ ]]; then runs=$1; shift; fi
arches=("$@")
[ ${#arches[@]} -gt 0 ] || arches=(x86_64 aarch64)

out=$(mktemp -d "${TMPDIR:-/tmp}/nested-bench.XXXXXX")
trap 'rm -rf "$out"' EXIT
field() { sed -n "s/^$1=//p" "$out/result"; }

for arch in "${arches[@]}"; do
  bash "$here/run.sh" "$arch" --check >/dev/null
  # One untimed run first: it builds the cached base initramfs if needed.
  bash "$here/run.sh" "$arch" --quiet -- true
  starts=()
  for i in $(seq 1 "$runs"); do
    bash "$here/run.sh" "$arch" --quiet --out "$out" -- true
    start=$(field cmd_started_ms) wall=$(field wall_ms)
    starts+=("$start")
    printf 'nested-bench %s run %d: CMD running after %d ms, L1 powered off after %d ms\n' \
      "$arch" "$i" "$start" "$wall"
  done
  median=$(printf '%s\n' "${starts[@]}" | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')
  printf 'nested-bench %s: median %d ms from qemu start to CMD running (%d runs, load %s)\n' \
    "$arch" "$median" "$runs" "$(cut -d' ' -f1 /proc/loadavg)"
done
