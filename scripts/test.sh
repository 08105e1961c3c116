#!/usr/bin/env bash
# Runs every boxdesk test, installing what is missing first:
#   bash scripts/test.sh
# Steps: setup, fmt, no tracked file pointing outside the repository, error
# messages that print each cause once (scripts/check-error-sources.py), clippy
# (workspace), the workspace's tests as root, static musl agents for x86_64
# and aarch64 (the aarch64 one runs under qemu-aarch64-static for one real
# exec), the guest images of both arches (images/build.sh) booted under qemu
# TCG (images/check-qemu.sh), the nested-KVM harness on both arches, the
# namespace/cowork/OCI end-to-end tests again as an unprivileged user, the
# desktop layouts (tests/desktops/run.sh: DNS, toolchains as on Ubuntu,
# Fedora, NixOS),
# boxdesk oci under podman and containerd (tests/oci/engines.sh), the
# release configuration (scripts/test-dist.sh: cargo-dist's plan and a host
# archive) and every fuzz target (scripts/fuzz.sh replay: its regressions,
# then a short run).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export BOXDESK_CACHE=${BOXDESK_CACHE:-/var/cache/boxdesk}
export CARGO_TERM_COLOR=never
# Each step's wall time, printed in a table at the end (and on failure).
stage_names=() stage_secs=() stage_start=$SECONDS
step() {
  stage_end
  stage_names+=("$*") stage_start=$SECONDS
  printf '\n=== %s\n' "$*"
}
stage_end() {
  [ ${#stage_names[@]} -gt ${#stage_secs[@]} ] || return 0
  stage_secs+=($((SECONDS - stage_start)))
}
stage_times() {
  stage_end
  printf '\n=== time per step (total %dm%02ds)\n' $((SECONDS / 60)) $((SECONDS % 60))
  for i in "${!stage_secs[@]}"; do
    printf '%4dm%02ds  %s\n' $((stage_secs[i] / 60)) $((stage_secs[i] % 60)) "${stage_names[i]:0:100}"
  done
}

# Everything printed is also kept, so the closing line can total every test
# runner's summary.
log=$(mktemp /tmp/boxdesk-test.XXXXXX.log)
exec > >(tee "$log") 2>&1
trap 'rc=$?; stage_times; exit $rc' EXIT

step setup
bash scripts/setup.sh
# cargo-dist takes many minutes to compile on a fresh machine: let it use
# the CPU the single-threaded qemu steps below leave idle. The release
# step waits for it.
dist_install_log=$(mktemp /tmp/boxdesk-dist-install.XXXXXX.log)
nice -n 19 bash scripts/test-dist.sh --install-only >"$dist_install_log" 2>&1 &
dist_install=$!

step "cargo fmt --check"
cargo fmt --all --check

step "no tracked file points outside the repository"
# The docs are the project's own (docs/); fuzz inputs are arbitrary bytes.
if git grep -nIE -e '\.\./shared' -e '/work/[s]hared' -- . ':!fuzz/regressions' ':!fuzz/corpus'; then
  echo "the lines above point outside the repository: write it in docs/ instead" >&2
  exit 1
fi

step "error messages print each cause once"
python3 scripts/check-error-sources.py

step "AppArmor profile compiles (dist/apparmor/boxdesk)"
bash scripts/check-apparmor.sh

step "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "static guest agents"
# Before the tests: an OCI container's sandbox runs the static agent.
bash images/build-agent.sh x86_64
bash images/build-agent.sh aarch64
bash scripts/agent-smoke.sh

step "Claude Code (pinned, for tests/claude)"
# Cached after the first fetch: no network once warm.
BOXDESK_CLAUDE=$(bash scripts/claude-code.sh)
export BOXDESK_CLAUDE

step "guest images (kernel + initramfs), x86_64 and aarch64"
# Before the tests: the x86_64 loader's tests load the real kernels.
for arch in x86_64 aarch64; do
  bash images/build.sh "$arch"
done

step "cargo test (as $(id -un))"
# The nested-KVM self-tests run in their own step below, with their setup.
# --show-output: a passing test's output is printed under its name, so a
# test that printed `skipped:` and returned is counted as skipped, not
# passed, in the closing line; and a skip for want of anything this step
# has (root, bubblewrap, the agent, Xvfb, podman…) fails it.
stage_log=$(mktemp /tmp/boxdesk-stage.XXXXXX.log)
kernels=$root/target/images/x86_64/vmlinux:$root/target/images/x86_64/bzImage
BOXDESK_NESTED=0 BOXDESK_TEST_KERNELS=$kernels cargo test --workspace --locked -- --show-output |
  tee "$stage_log"
# What only the nested L1 has (a KVM that boots Linux), what cannot apply
# to this arch or run, and what the machine's kernel or limits decide
# ($host_skips, shared with the run as a user).
export BOXDESK_HOST_SKIPS='this KVM can boot|KVM can boot; the refusal|no kvm here|no usable /dev/kvm|no Landlock in this kernel|has no abstract-socket scope here|no IA-32 emulation|^the hard open-file limit is|^cannot bind 127\.0\.0\.2|^uid 65534 cannot run this test binary|^nobody cannot run|^user namespaces are not allowed here|^as root with AppArmor active'
bash scripts/skips.sh "$stage_log" \
  "^(needs hardware KVM|BOXDESK_NESTED=0\$|cowork runs on namespaces here)|psci is aarch64 only\$|^the fork bomb was stopped from outside|$BOXDESK_HOST_SKIPS"
rm -f "$stage_log"

step "boxdesk-hv and boxdesk for aarch64-apple-darwin (HVF, macOS) and aarch64-unknown-linux-gnu (KVM arm64): check + clippy"
bash hv/check-cross.sh

step "guest images under qemu TCG, x86_64 and aarch64"
for arch in x86_64 aarch64; do
  bash images/check-qemu.sh "$arch"
done

step "nested KVM harness: real KVM for x86_64 and aarch64 under qemu TCG"
bash scripts/test-nested.sh

step "end-to-end tests as an unprivileged user"
bash scripts/test-unprivileged.sh

step "desktop layouts (systemd-resolved, NetworkManager, NixOS-like), as root and as a user"
tests_bin=$(cargo test -p boxdesk --test tests --no-run --locked --message-format=json 2>/dev/null |
  python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "tests" and m.get("executable"):
        print(m["executable"])')
bash tests/desktops/run.sh target/debug/boxdesk "$tests_bin"

step "boxdesk oci under podman and containerd, and podman run --rm IMG true against runc"
# A static release build (cached in $BOXDESK_CACHE): what releases ship,
# and what the benchmark against runc should measure.
bash images/build-agent.sh "$(uname -m)" boxdesk
bash tests/oci/engines.sh "target/static/$(uname -m)/boxdesk" 10

step "release: dist plan (every target), the host's dist archive and its --version, the image archive"
wait "$dist_install" || { cat "$dist_install_log"; echo "installing cargo-dist failed" >&2; exit 1; }
bash scripts/test-dist.sh

step "fuzz: every target replays its regressions, then runs ${FUZZ_SECONDS:-10} s"
if rustup toolchain list | grep -q '^nightly' && command -v cargo-fuzz >/dev/null; then
  bash scripts/fuzz.sh replay "${FUZZ_SECONDS:-10}"
else
  echo "skipped: no nightly toolchain or cargo-fuzz here; the device and loader targets' regressions were replayed by cargo test above (boxdesk-devices *::fuzzing, boxdesk-vmm arch::fuzzing)"
fi
bash scripts/tally.sh "$log"
