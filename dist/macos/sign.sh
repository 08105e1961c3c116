#!/usr/bin/env bash
# Signs macOS executables with boxdesk's entitlements:
#   dist/macos/sign.sh FILE...
# Hypervisor.framework refuses a process whose signature lacks
# com.apple.security.hypervisor (boxdesk.entitlements, beside this script):
# the first hv_vm_create fails. Every boxdesk binary that should boot a VM
# on a Mac goes through here: the release build (link-and-sign.sh, cargo's
# linker for aarch64-apple-darwin), `cargo test`/`cargo run`
# (sign-and-run.sh, cargo's runner) and by hand after a plain
# `cargo build --release`.
#
# Identity: ad-hoc (`codesign -s -`) unless BOXDESK_CODESIGN_IDENTITY names
# one (a "Developer ID Application: …" certificate in the keychain, or in
# $BOXDESK_CODESIGN_KEYCHAIN); a real identity also gets the hardened
# runtime and a secure timestamp, which notarization requires. An ad-hoc
# signature is enough for binaries fetched by the shell installer or
# Homebrew (curl sets no quarantine attribute); a browser download needs
# `xattr -d com.apple.quarantine` or a real identity.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
entitlements=$here/boxdesk.entitlements
die() { echo "sign.sh: $*" >&2; exit 1; }

[ $# -gt 0 ] || die "usage: $0 FILE..."
command -v codesign >/dev/null || die "codesign not found: signing needs macOS (Xcode command line tools)"

args=(--force --entitlements "$entitlements")
identity=${BOXDESK_CODESIGN_IDENTITY:-}
if [ -n "$identity" ]; then
  args+=(--sign "$identity" --options runtime --timestamp)
  [ -z "${BOXDESK_CODESIGN_KEYCHAIN:-}" ] || args+=(--keychain "$BOXDESK_CODESIGN_KEYCHAIN")
else
  args+=(--sign -)
fi

for f in "$@"; do
  # codesign chats on stderr even on success ("replacing existing
  # signature"); show it only when something went wrong.
  if ! out=$(codesign "${args[@]}" "$f" 2>&1); then
    echo "$out" >&2
    die "codesign failed for $f"
  fi
  codesign -d --entitlements - "$f" 2>/dev/null | grep -q 'com.apple.security.hypervisor' ||
    die "$f: the hypervisor entitlement is not in its signature"
done
