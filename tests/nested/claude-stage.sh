#!/usr/bin/env bash
# The real Claude Code through boxdesk cowork on the VM backend, inside the
# x86_64 L1 (real KVM under qemu TCG): tests/claude's scenarios with
# BOXDESK_TEST_BACKEND=kvm, in one L1 run (CI's nested step): all of them
# as the eight sessions of one profile's VM; with the
# filter `claude::bench`, its benchmark instead (the same binary straight
# in L1 against it through a VM, BOXDESK_BENCH_ROUNDS rounds, 3 here):
#
#   tests/nested/claude-stage.sh [TEST_FILTER...]
#
# L1 switches its root to the build machine's own Debian (read-only over
# 9p, a tmpfs /tmp; as switch_root makes it, so user namespaces work), so
# the host-built test binary, boxdesk and Claude Code (glibc) run there,
# and a cowork VM's root (`--root host`) is that same system. Needs: the
# image (images/build.sh x86_64), the binary (scripts/claude-code.sh), the
# test binary (cargo test -p boxdesk --test tests --no-run). Exit status:
# the tests' (125: the harness failed).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd -P)
img=$root/target/images/x86_64
[ -f "$img/initramfs.cpio.gz" ] || { echo "claude-stage: no image at $img (images/build.sh x86_64)" >&2; exit 125; }
claude=$(bash "$root/scripts/claude-code.sh" x86_64)
tests=$(cd "$root" && cargo test -p boxdesk --test tests --no-run --locked --message-format=json 2>/dev/null |
  python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "tests" and m.get("executable"):
        print(m["executable"])')
(cd "$root" && cargo build -q --locked -p boxdesk --bin boxdesk)
bin=$root/target/debug/boxdesk
filter=("$@")
# Every scenario side by side as eight sessions of one VM (each Claude Code
# start costs ~13 s of emulated CPU here: the scenarios alone would start
# it 13 times); the benchmark (claude::bench, ignored) when asked for.
[ ${#filter[@]} -gt 0 ] || filter=(claude::tools::eight_sessions_at_once)
args=""
for a in "${filter[@]}"; do args="$args '$a'"; done
# shellcheck source=host-root.sh
. "$here/host-root.sh"
script="$(host_root_exec) BOXDESK_BIN=$bin BOXDESK_IMAGE_DIR=$img BOXDESK_CLAUDE=$claude \
  BOXDESK_TEST_BACKEND=kvm BOXDESK_NESTED=0 BOXDESK_BENCH_ROUNDS=\${BOXDESK_BENCH_ROUNDS:-3} sh -c 'cd $root && exec $tests --test-threads=1 --include-ignored --show-output $args'"
exec bash "$here/run.sh" x86_64 --hostroot --mem 6144 --timeout 1500 -- /bin/sh -c "$script"
