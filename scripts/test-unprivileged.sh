#!/usr/bin/env bash
# Runs the root package's end-to-end tests (namespace backend, control
# socket, CLI, cowork) a second time as an unprivileged user, so the
# user-namespace path of bubblewrap is what they exercise. CI runs as root,
# users don't. The binaries are copied where that user can read them.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
user=${BOXDESK_TEST_USER:-nobody}
if [ "$(id -u)" -ne 0 ]; then
  echo "skipped: already unprivileged ($(id -un)); the cargo test run above was the unprivileged run"
  exit 0
fi

# test_bin CARGO_ARGS... TARGET_NAME: the test executable cargo builds.
test_bin() {
  local name=${*: -1}
  cargo test "${@:1:$#-1}" --no-run --locked --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == sys.argv[1] and m.get("executable"):
        print(m["executable"])' "$name"
}
tests_bin=$(test_bin -p boxdesk --test tests tests)
# The VM helper's own view (a user namespace of its own) as a user too.
view_bin=$(test_bin -p boxdesk-vmm --lib boxdesk_vmm)
cargo build -q --locked -p boxdesk --bin boxdesk
[ -n "$tests_bin" ] && [ -n "$view_bin" ] || { echo "test-unprivileged: no test binary found"; exit 1; }

d=$(mktemp -d /tmp/boxdesk-unpriv.XXXXXX)
trap 'rm -rf "$d"' EXIT
install -m 0755 "$tests_bin" "$d/tests"
install -m 0755 "$view_bin" "$d/vmm-tests"
install -m 0755 target/debug/boxdesk "$d/boxdesk"
# The OCI tests' containers run the static guest agent (the debug boxdesk
# is dynamic).
agent=target/images/$(uname -m)/boxdesk-guest-agent
oci_agent=()
if [ -f "$agent" ]; then
  install -m 0755 "$agent" "$d/boxdesk-guest-agent"
  oci_agent=(BOXDESK_OCI_AGENT="$d/boxdesk-guest-agent")
fi
mkdir -p "$d/home"
chown "$user" "$d/home"
chmod 0700 "$d/home"
chmod 0755 "$d"
uid=$(id -u "$user")
echo "running $(basename "$tests_bin") as $user (uid $uid)"
cd "$d"
runuser -u "$user" -- env -i PATH=/usr/local/bin:/usr/bin:/bin TMPDIR=/tmp "$d/vmm-tests" jail::view
# TMPDIR stays /tmp: the tests' sockets must fit the 107-byte socket path
# limit with a 64-character sandbox name.
runuser -u "$user" -- env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$d/home" TMPDIR=/tmp \
  BOXDESK_BIN="$d/boxdesk" BOXDESK_NESTED=0 RUST_BACKTRACE=1 "${oci_agent[@]}" \
  ${BOXDESK_CLAUDE:+BOXDESK_CLAUDE="$BOXDESK_CLAUDE"} "$d/tests" --test-threads=2 --show-output |
  tee "$d/log"
# A user lacks root and, without delegation, a memory cgroup; what only the
# nested L1 has stays skipped too. Anything else skipped fails the step.
bash "$root/scripts/skips.sh" "$d/log" \
  "^(needs root|no cgroup for the sandbox.s memory here|needs hardware KVM|BOXDESK_NESTED=0\$|cowork runs on namespaces here)${BOXDESK_HOST_SKIPS:+|$BOXDESK_HOST_SKIPS}"
