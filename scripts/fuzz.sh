#!/usr/bin/env bash
# The fuzz targets of fuzz/ (cargo-fuzz, nightly):
#   scripts/fuzz.sh replay [SECONDS]   CI: each target replays its saved
#       inputs (fuzz/regressions/TARGET), then runs SECONDS (default 10)
#       from them; any crash, leak or timeout fails.
#   scripts/fuzz.sh campaign [SECONDS] [TARGET...]   a long run per target
#       (default 600 s) into fuzz/corpus/TARGET (not committed), then the
#       corpus minimised into fuzz/regressions/TARGET; prints each target's
#       executions and edges.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
mode=${1:-replay}
secs=${2:-}
shift $(( $# < 2 ? $# : 2 ))
targets=("$@")
if [ ${#targets[@]} = 0 ]; then
  mapfile -t targets < <(sed -n 's/^name = "\(.*\)"$/\1/p' Cargo.toml | grep -v '^boxdesk-fuzz$')
fi
cargo +nightly fuzz build -O >/dev/null 2>&1 || cargo +nightly fuzz build -O
opts=(-timeout=10 -rss_limit_mb=2048 -print_final_stats=1)
for t in "${targets[@]}"; do
  saved=regressions/$t
  [ -d "$saved" ] || { echo "fuzz: $t has no $saved" >&2; exit 1; }
  case "$mode" in
    replay)
      n=$(find "$saved" -type f | wc -l)
      cargo +nightly fuzz run -O "$t" "$saved" -- -runs=0 >/tmp/fuzz-$t.log 2>&1 \
        || { tail -40 /tmp/fuzz-$t.log; echo "fuzz: $t failed on a saved input" >&2; exit 1; }
      work=$(mktemp -d)
      cp "$saved"/* "$work"/
      cargo +nightly fuzz run -O "$t" "$work" -- -max_total_time="${secs:-10}" "${opts[@]}" \
        >/tmp/fuzz-$t.log 2>&1 \
        || { tail -60 /tmp/fuzz-$t.log; echo "fuzz: $t found a crash" >&2; rm -rf "$work"; exit 1; }
      rm -rf "$work"
      runs=$(sed -n 's/^stat::number_of_executed_units: *//p' /tmp/fuzz-$t.log)
      cov=$(grep -o 'cov: [0-9]*' /tmp/fuzz-$t.log | tail -1 | cut -d' ' -f2)
      echo "fuzz $t: $n saved inputs replayed; ${secs:-10} s: $runs runs, $cov edges, no crash"
      ;;
    campaign)
      corpus=corpus/$t
      mkdir -p "$corpus"
      cp -n "$saved"/* "$corpus"/ 2>/dev/null || true
      cargo +nightly fuzz run -O "$t" "$corpus" -- -max_total_time="${secs:-600}" "${opts[@]}" \
        >/tmp/fuzz-$t.log 2>&1 || { tail -60 /tmp/fuzz-$t.log; echo "fuzz: $t crashed" >&2; exit 1; }
      runs=$(sed -n 's/^stat::number_of_executed_units: *//p' /tmp/fuzz-$t.log)
      cov=$(grep -o 'cov: [0-9]*' /tmp/fuzz-$t.log | tail -1 | cut -d' ' -f2)
      rm -rf "$saved.min" && mkdir "$saved.min"
      cargo +nightly fuzz run -O "$t" "$saved.min" "$corpus" -- -merge=1 >/dev/null 2>&1
      rm -rf "$saved" && mv "$saved.min" "$saved"
      echo "fuzz $t: ${secs:-600} s: $runs runs, $cov edges, no crash; $(ls "$saved" | wc -l) inputs kept"
      ;;
    *) echo "usage: scripts/fuzz.sh replay|campaign [SECONDS] [TARGET...]" >&2; exit 2 ;;
  esac
done
