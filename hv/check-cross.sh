#!/usr/bin/env bash
# Type-checks and lints, for the targets this machine cannot run, boxdesk-hv
# (its tests and bench too), boxdesk-sandbox, boxdesk-vmm and boxdesk-cowork
# (their unit tests too) and the root package boxdesk (bin, tests, benches;
# checking it checks every workspace crate it depends on):
#
#   aarch64-apple-darwin        the Hypervisor.framework backend (never runs
#                               here) and boxdesk on macOS, where the
#                               Linux-only parts (namespace backend, cowork)
#                               are gated off
#   aarch64-unknown-linux-gnu   the KVM arm64 half and the aarch64 VMM
#
# rustup here has only the x86_64 std, so Debian's Rust builds std for each
# target from source (-Zbuild-std; docs/BUILDING.md). Nothing is
# linked or run. Idempotent: installs what is missing, keeps the std builds in
# $BOXDESK_CACHE/cross-check (default /var/cache/boxdesk) between runs.
#
#   hv/check-cross.sh                 both targets, every target kind
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
    say "cargo $tool --target $target -p boxdesk-hv -p boxdesk-sandbox -p boxdesk-vmm -p boxdesk-cowork -p boxdesk"
    # Debian's cargo (with its std source) must shadow rustup's, only here.
    PATH=/usr/bin:$PATH RUSTC_BOOTSTRAP=1 cargo "$tool" \
      -Zbuild-std=std,panic_unwind,test --target "$target" \
      -p boxdesk-hv -p boxdesk-sandbox -p boxdesk-vmm -p boxdesk-cowork -p boxdesk \
      --all-targets --target-dir "$cache/cross-check" "${lints[@]}"
  done
done
say "ok: ${targets[*]}"
