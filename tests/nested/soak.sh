#!/usr/bin/env bash
# Runs one nested VM stage (vm-stage.sh) again and again, never retried, to
# measure how often L1 freezes or a test fails:
#
#   tests/nested/soak.sh ARCH RUNS [--keep DIR] [VM-STAGE ARGS...]
#
# Each run's whole output (with run.sh's freeze report, if L1 froze) is kept
# in DIR (default: a new directory under $TMPDIR), one line a run is printed
# as it ends, and the last line sums up:
#   soak[x86_64]: 10 runs: 10 passed, 0 froze, 0 failed otherwise
# Exit status: 0 when every run passed, 1 otherwise. Environment reaches the
# stage as it is (BOXDESK_DAX=off, BOXDESK_JAIL=off, PATH with another
# qemu... for bisecting).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
arch=${1:-} runs=${2:-}
case "$arch" in x86_64 | aarch64) ;; *) echo "usage: $0 x86_64|aarch64 RUNS [--keep DIR] [VM-STAGE ARGS...]" >&2; exit 2 ;; esac
[[ "$runs" =~ ^[1-9][0-9]*$ ]] || { echo "soak: RUNS must be a positive number" >&2; exit 2; }
shift 2
keep=''
if [ "${1:-}" = --keep ]; then keep=$2; shift 2; fi
[ -n "$keep" ] || keep=$(mktemp -d "${TMPDIR:-/tmp}/boxdesk-soak-$arch.XXXXXX")
mkdir -p "$keep"
passed=0 froze=0 failed=0
for i in $(seq "$runs"); do
  log=$keep/run-$i.log
  t0=$SECONDS rc=0
  BOXDESK_NESTED_RETRY=0 bash "$here/vm-stage.sh" "$arch" "$@" >"$log" 2>&1 || rc=$?
  if [ "$rc" = 0 ]; then
    passed=$((passed + 1)) what=passed
  elif grep -q 'L1 stopped responding' "$log"; then
    # (the test running when the heartbeat stopped: the freeze report's
    # last lines, since L1 may go on once sysrq woke it)
    froze=$((froze + 1))
    what="L1 FROZE during: $(sed -n '/freeze: --- the last lines CMD printed/,/freeze: ---/p' "$log" | grep -E 'test .* \.\.\. ' | tail -n 1 | sed 's/^ *freeze: //' | cut -c1-140)"
  else
    failed=$((failed + 1)) what="FAILED (exit $rc): $(grep -E '^(test .* FAILED|nested\[|cargo-test\[)' "$log" | head -n 2 | paste -sd' ' - | cut -c1-200)"
  fi
  printf 'soak[%s]: run %d/%d in %d s: %s (%s)\n' "$arch" "$i" "$runs" $((SECONDS - t0)) "$what" "$log"
done
printf 'soak[%s]: %d runs: %d passed, %d froze, %d failed otherwise\n' "$arch" "$runs" "$passed" "$froze" "$failed"
[ "$passed" = "$runs" ]
