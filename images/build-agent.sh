#!/usr/bin/env bash
# Builds the guest agent as a static musl binary for one guest arch:
#   images/build-agent.sh x86_64|aarch64
# Output: target/images/<arch>/boxdesk-guest-agent (statically linked).
# `images/build-agent.sh ARCH boxdesk` builds the boxdesk binary itself the
# same way, into target/static/<arch>/boxdesk (for the nested harness's L1
# and for release builds).
#
# Where rustup has the musl std for the target (a developer laptop, release
# CI) plain cargo is used. Otherwise (these build machines: rustup cannot
# fetch that std) Debian's Rust and its std source build std for the target,
# with zig as the musl linker (docs/BUILDING.md). The cross target dir
# lives in $BOXDESK_CACHE so std is built once per machine, not per clone.
set -euo pipefail

arch=${1:-}
case "$arch" in
  x86_64 | aarch64) ;;
  *) echo "usage: $0 x86_64|aarch64" >&2; exit 2 ;;
esac
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${BOXDESK_CACHE:-/var/cache/boxdesk}
pkg=${2:-boxdesk-guest-agent}
case "$pkg" in
  boxdesk-guest-agent) out=$root/target/images/$arch ;;
  boxdesk) out=$root/target/static/$arch ;;
  *) echo "usage: $0 x86_64|aarch64 [boxdesk-guest-agent|boxdesk]" >&2; exit 2 ;;
esac
target=$arch-unknown-linux-musl
mkdir -p "$out"

if rustup target list --installed 2>/dev/null | grep -qx "$target"; then
  cargo build --manifest-path "$root/Cargo.toml" --release --locked \
    --target "$target" -p "$pkg" --bin "$pkg"
  bin=$root/target/$target/release/$pkg
else
  zig_dir=$(python3 -c 'import ziglang, os; print(os.path.dirname(ziglang.__file__))' 2>/dev/null) || {
    echo "build-agent: zig is missing: pip install ziglang (scripts/setup.sh does)" >&2
    exit 1
  }
  zigbuild=$(command -v cargo-zigbuild || echo "$HOME/.cargo/bin/cargo-zigbuild")
  [ -x /usr/bin/rustc ] && [ -x "$zigbuild" ] || {
    echo "build-agent: needs Debian's rustc-web/cargo-web/rust-web-src and cargo-zigbuild (scripts/setup.sh)" >&2
    exit 1
  }
  mkdir -p "$cache/cross"
  # /usr/bin first only here: Debian's cargo (with its std source) must
  # shadow rustup's for -Zbuild-std.
  (cd "$root" && PATH="$zig_dir:/usr/bin:$PATH" RUSTC=/usr/bin/rustc RUSTC_BOOTSTRAP=1 \
    RUSTFLAGS="-C link-self-contained=no" \
    "$zigbuild" zigbuild --release --locked -Zbuild-std=std,panic_abort \
    --target "$target" -p "$pkg" --bin "$pkg" --target-dir "$cache/cross")
  bin=$cache/cross/$target/release/$pkg
fi

install -m 0755 "$bin" "$out/$pkg"
if ! file -b "$out/$pkg" | grep -q 'statically linked\|static-pie linked'; then
  echo "build-agent: $out/$pkg is not statically linked:" >&2
  file "$out/$pkg" >&2
  exit 1
fi
echo "$out/$pkg: $(file -b "$out/$pkg" | cut -d, -f1-2), $(stat -c %s "$out/$pkg") bytes"
