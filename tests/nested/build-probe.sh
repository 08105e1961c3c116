#!/usr/bin/env bash
# Builds the static KVM probe for one arch and prints its path:
#   tests/nested/build-probe.sh x86_64|aarch64
# The probe (kvm_probe_<arch>.c) is a tiny C program run inside L1 by the
# self-tests. zig (pip install ziglang) is the cross C compiler and supplies
# musl; the binary is cached in $BOXDESK_CACHE/nested/probe by the hash of
# the source and the zig version, so a warm run costs nothing (cold, zig
# builds musl for the target once: about a minute here).
set -euo pipefail

arch=${1:-}
case "$arch" in
  x86_64 | aarch64) ;;
  *) echo "usage: $0 x86_64|aarch64" >&2; exit 2 ;;
esac
here=$(cd "$(dirname "$0")" && pwd)
src=$here/kvm_probe_$arch.c
cache=${BOXDESK_CACHE:-/var/cache/boxdesk}/nested/probe

zig_dir=$(python3 -c 'import ziglang, os; print(os.path.dirname(ziglang.__file__))' 2>/dev/null) || {
  echo "build-probe: zig is missing: pip install ziglang (tests/nested/setup.sh does)" >&2
  exit 1
}
zig=$zig_dir/zig
key=$({ "$zig" version; cat "$src"; } | sha256sum | cut -c1-16)
bin=$cache/kvm-probe-$arch-$key
if [ ! -x "$bin" ]; then
  mkdir -p "$cache"
  # zig's own cache (musl built per target) is the one cargo-zigbuild uses.
  (cd "$cache" && "$zig" cc -target "$arch-linux-musl" -static -O2 -Wall -Werror -o "$bin.$$" "$src")
  mv "$bin.$$" "$bin"
fi
echo "$bin"
