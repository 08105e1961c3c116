#!/usr/bin/env bash
# Builds a crate's tests as static musl binaries and runs them inside an L1
# guest of that arch (README.md beside this file):
#
#   tests/nested/cargo-test.sh ARCH [--timeout SECS] [--mem MIB] [--no-run] [--as-nobody] CARGO_ARGS... [-- TEST_ARGS...]
#   e.g. tests/nested/cargo-test.sh aarch64 -p boxdesk-channel
#
# CARGO_ARGS select what to build, as for `cargo test` (-p, --test, --lib,
# --features…). Each test binary runs in one L1, one after the other, with
# --test-threads=1 and TEST_ARGS, from its package's directory and with
# CARGO_MANIFEST_DIR set, as cargo would. The workspace and the target dir are
# visible in L1 read-only at their host paths (9p), so fixtures and
# env!("CARGO_BIN_EXE_…") resolve. Each binary's output, its `test result:`
# line included, streams through; the last line sums up. Exit status: 0 when
# every binary passed, 101 when one failed (as cargo test), 124 when L1's
# deadline (--timeout, default 1800 s) hit, 125 when the harness failed.
# --mem sets L1's memory (run.sh's default, 2048 MiB, unless given).
# --as-nobody (x86_64) runs the tests as uid/gid 65534 with no groups, as a
# desktop user would run boxdesk: /dev/kvm is made usable by all (as a
# distribution's kvm group or uaccess does for the seated user), TMPDIR and
# HOME are a directory of theirs; setpriv is the build machine's own.
# --no-run only builds, and prints the static executables: `test PATH` per
# test binary and `bin PATH` per binary built beside them (an integration
# test's CARGO_BIN_EXE_*: `-p boxdesk` gives a static `boxdesk`).
#
# Build: where rustup has the musl std for the target, plain cargo; otherwise
# (these build machines) Debian's Rust builds std for it with zig as the
# linker, as images/build-agent.sh does, in $BOXDESK_CACHE/cross. Tests need
# unwinding, so this is the dev profile with -Zbuild-std=std,panic_unwind,test,
# at opt-level 1 (debug assertions and overflow checks stay): under TCG an
# unoptimised VMM's device emulation and file server cost tens of times what
# they cost built, and every VM test waits on them.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd -P)
cache=${BOXDESK_CACHE:-/var/cache/boxdesk}

say() { printf 'cargo-test[%s]: %s\n' "${arch:-?}" "$*" >&2; }
arch=${1:-}
case "$arch" in
  x86_64 | aarch64) shift ;;
  *) echo "usage: $0 x86_64|aarch64 [--timeout SECS] [--mem MIB] CARGO_ARGS... [-- TEST_ARGS...]" >&2; exit 2 ;;
esac
timeout=1800 no_run=0 mem=() as_nobody=0
cargo_args=() test_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --timeout) timeout=$2; shift 2 ;;
    --mem) mem=(--mem "$2"); shift 2 ;;
    --no-run) no_run=1; shift ;;
    --as-nobody) as_nobody=1; shift ;;
    --) shift; test_args=("$@"); break ;;
    *) cargo_args+=("$1"); shift ;;
  esac
done
target=$arch-unknown-linux-musl
if [ "$as_nobody" = 1 ] && [ "$arch" != x86_64 ]; then
  say "--as-nobody needs the build machine's setpriv, which only an x86_64 L1 can run"
  exit 2
fi

bash "$here/run.sh" "$arch" --check >/dev/null

# --- build -----------------------------------------------------------------
json=$(mktemp "${TMPDIR:-/tmp}/cargo-test.XXXXXX")
trap 'rm -f "$json"' EXIT
say "building tests for $target: ${cargo_args[*]}"
if rustup target list --installed 2>/dev/null | grep -qx "$target"; then
  target_dir=$root/target
  (cd "$root" && CARGO_PROFILE_DEV_OPT_LEVEL=1 cargo build --locked --tests --target "$target" \
    --message-format=json-render-diagnostics "${cargo_args[@]}") >"$json"
else
  zig_dir=$(python3 -c 'import ziglang, os; print(os.path.dirname(ziglang.__file__))' 2>/dev/null) || {
    say "zig is missing: pip install ziglang (tests/nested/setup.sh does)"
    exit 125
  }
  zigbuild=$(command -v cargo-zigbuild || echo "$HOME/.cargo/bin/cargo-zigbuild")
  if [ ! -x /usr/bin/rustc ] || [ ! -x "$zigbuild" ]; then
    say "needs Debian's rustc-web/cargo-web/rust-web-src and cargo-zigbuild (scripts/setup.sh)"
    exit 125
  fi
  target_dir=$cache/cross
  mkdir -p "$target_dir"
  # /usr/bin first only here: Debian's cargo (with its std source) must
  # shadow rustup's for -Zbuild-std.
  (cd "$root" && PATH="$zig_dir:/usr/bin:$PATH" RUSTC=/usr/bin/rustc RUSTC_BOOTSTRAP=1 \
    CARGO_PROFILE_DEV_OPT_LEVEL=1 RUSTFLAGS="-C link-self-contained=no" \
    "$zigbuild" zigbuild --locked --tests -Zbuild-std=std,panic_unwind,test \
    --target "$target" --target-dir "$target_dir" \
    --message-format=json-render-diagnostics "${cargo_args[@]}") >"$json"
fi

# test|bin <TAB> executable <TAB> package dir <TAB> target name
built=$(python3 -c '
import json, os, sys
for line in open(sys.argv[1]):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") != "compiler-artifact" or not m.get("executable"):
        continue
    kind = "test" if m.get("profile", {}).get("test") else "bin"
    print(kind, m["executable"], os.path.dirname(m["manifest_path"]), m["target"]["name"], sep="\t")
' "$json")
tests=$(awk -F'\t' -v OFS='\t' '$1 == "test" { print $2, $3, $4 }' <<<"$built")
[ -n "$tests" ] || { say "cargo built no test binary for: ${cargo_args[*]}"; exit 125; }
if [ "$no_run" = 1 ]; then
  cut -f1,2 <<<"$built" | tr '\t' ' '
  exit 0
fi

# --- the script L1 runs ------------------------------------------------------
q() { printf "'%s'" "$(printf '%s' "$1" | sed "s/'/'\\\\''/g")"; }
script=$(mktemp "${TMPDIR:-/tmp}/cargo-test-l1.XXXXXX")
trap 'rm -f "$json" "$script"' EXIT
targs=""
for a in "${test_args[@]+"${test_args[@]}"}"; do targs="$targs $(q "$a")"; done
{
  echo "# generated by tests/nested/cargo-test.sh"
  echo "set -u"
  # The VM file tests' full sizes (tests/vm/fs.rs), when asked for.
  [ -z "${BOXDESK_FS_FULL:-}" ] || echo "export BOXDESK_FS_FULL=$(q "$BOXDESK_FS_FULL")"
  # The cowork suite on the VM backend (tests/cowork), and the image its
  # static boxdesk boots (it lives outside the checkout's target/).
  [ -z "${BOXDESK_TEST_BACKEND:-}" ] || echo "export BOXDESK_TEST_BACKEND=$(q "$BOXDESK_TEST_BACKEND")"
  [ -z "${BOXDESK_IMAGE_DIR:-}" ] || echo "export BOXDESK_IMAGE_DIR=$(q "$BOXDESK_IMAGE_DIR")"
  for d in "$root" "$(realpath "$target_dir")"; do
    echo "mkdir -p $(q "$d") && mount -o bind $(q "/run/host$d") $(q "$d") || exit 125"
  done
  run_as=""
  if [ "$as_nobody" = 1 ]; then
    lib=/run/host/usr/lib/x86_64-linux-gnu
    echo "chmod 666 /dev/kvm && mkdir -m 700 /tmp/nobody && chown 65534:65534 /tmp/nobody || exit 125"
    echo "export TMPDIR=/tmp/nobody HOME=/tmp/nobody"
    run_as="$lib/ld-linux-x86-64.so.2 --library-path $lib /run/host/usr/bin/setpriv --reuid=65534 --regid=65534 --clear-groups "
  fi
  echo "n=0 failed=0"
  while IFS=$'\t' read -r exe pkg name; do
    echo "n=\$((n + 1))"
    echo "echo; echo \"== \$n: $name ($(basename "$exe"))\""
    echo "cd $(q "$pkg") && CARGO_MANIFEST_DIR=$(q "$pkg") $run_as$(q "$exe") --test-threads=1$targs || failed=\$((failed + 1))"
  done <<<"$tests"
  echo 'echo; echo "== $n test binaries, $failed failed (L1 '"$arch"')"'
  echo '[ "$failed" = 0 ] || exit 101'
} >"$script"

say "running $(wc -l <<<"$tests") test binaries in L1"
rc=0
bash "$here/run.sh" "$arch" --hostroot --timeout "$timeout" "${mem[@]+"${mem[@]}"}" \
  --file "$script:/nested/cargo-test.sh" -- sh /nested/cargo-test.sh || rc=$?
exit "$rc"
