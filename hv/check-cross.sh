#!/usr/bin/env bash
# Type-checks and lints boxdesk-hv for the targets this machine cannot run:
#
#   aarch64-apple-darwin        the Hypervisor.framework backend (never runs here)
#   aarch64-unknown-linux-gnu   the KVM arm64 half
#
# rustup here has only the x86_64 std, so Debian's Rust builds std for each
# target from source (-Zbuild-std; /work/shared/TOOLCHAIN.md). Nothing is
# linked or run. Idempotent: installs what is missing, keeps the std builds in
# $BOXDESK_CACHE/cross-check (default /var/cache/boxdesk) between runs.
#
#   hv/check-cross.sh                 both targets, lib + tests + bench
#   hv/check-cross.sh TARGET...       just those
#
# Exit status: 0 when cargo check and cargo clippy -D warnings pass for every
# target.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${BOXDESK_CACHE:-/var/cache/boxdesk}
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(aarch64-apple-darwin aarch64-unknown-linux-gnu)
say() { printf 'check-cross: %s\n' "$*" >&2; }

missing=()
for pkg in rustc-web cargo-web rust-web-src rust-web-clippy; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]}"
  sudo=()
  [ "$(id -u)" = 0 ] || sudo=(sudo)
  "${sudo[@]}" apt-get install -y "${missing[@]}" >/dev/null ||
    { "${sudo[@]}" apt-get update >/dev/null && "${sudo[@]}" apt-get install -y "${missing[@]}" >/dev/null; }
fi

mkdir -p "$cache/cross-check"
cd "$root"
for target in "${targets[@]}"; do
  for tool in check clippy; do
    lints=()
    [ "$tool" = clippy ] && lints=(-- -D warnings)
    say "cargo $tool --target $target -p boxdesk-hv"
    # Debian's cargo (with its std source) must shadow rustup's, only here.
    PATH=/usr/bin:$PATH RUSTC_BOOTSTRAP=1 cargo "$tool" \
      -Zbuild-std=std,panic_unwind,test --target "$target" -p boxdesk-hv --all-targets \
      --target-dir "$cache/cross-check" "${lints[@]}"
  done
done
say "ok: ${targets[*]}"
