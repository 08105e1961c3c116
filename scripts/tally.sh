#!/usr/bin/env bash
# The closing line of a test run: totals of every `test result:` line in
# LOG, with the tests that printed `skipped: WHY` and returned moved from
# passed to skipped (their output is under `---- NAME stdout ----`, which
# `--show-output` prints for passing tests), then those tests and why.
#
#   bash scripts/tally.sh LOG
set -euo pipefail
awk '
  /^---- .* stdout ----$/ { name = $2; counted = 0; next }
  /^(successes|failures):$/ || /^test result: / { name = "" }
  /^skipped: / && name != "" && !counted {
    counted = 1; k++; why[k] = name ": " substr($0, 10)
  }
  /^test result: / {
    for (i = 1; i < NF; i++) {
      if ($(i+1) ~ /^passed/) p += $i
      if ($(i+1) ~ /^failed/) f += $i
      if ($(i+1) ~ /^ignored/) ig += $i
    }
  }
  END {
    for (i = 1; i <= k; i++) print "skipped at run time: " why[i]
    printf "all: %d passed, %d failed, %d skipped (%d ignored, %d skipped at run time)\n", p - k, f, ig + k, ig, k
  }' "$1"
