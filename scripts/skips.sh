#!/usr/bin/env bash
# Fails a test stage whose tests skipped for a reason the stage does not
# allow: a stage that is meant to have a resource (root, bubblewrap, podman,
# the static agent, Xvfb…) must not pass with tests that printed
# `skipped: WHY` for lack of it.
#
#   bash scripts/skips.sh LOG ALLOWED_ERE
#
# LOG is the stage's output (cargo test --show-output prints each passing
# test's output under `---- NAME stdout ----`); ALLOWED_ERE matches the
# reasons this stage may skip for (a test's own name before the reason is
# ignored). Prints every skip that is not allowed, with its test, and exits 1
# when there is one.
set -euo pipefail
log=$1 allowed=$2
# Through the environment: `awk -v` would read the ERE's backslashes as
# escapes.
bad=$(ALLOWED=$allowed awk '
  BEGIN { allowed = ENVIRON["ALLOWED"] }
  /^---- .* stdout ----$/ { name = $2; next }
  /^(successes|failures):$/ || /^test result: / { name = "" }
  /^skipped: / {
    why = substr($0, 10)
    # Many tests print their own name first: `skipped: NAME: WHY`.
    sub(/^[a-z0-9_]+: /, "", why)
    if (why !~ allowed) print (name != "" ? name : "?") ": " why
  }' "$log")
if [ -n "$bad" ]; then
  echo "tests skipped for a reason this stage must not have (allowed: $allowed):" >&2
  echo "$bad" >&2
  exit 1
fi
