#!/usr/bin/env bash
# cargo's linker for aarch64-apple-darwin (.cargo/config.toml): links with
# `cc` exactly as rustc would, then signs an executable output with the
# hypervisor entitlement (sign.sh). This is how the release archive gets a
# signed boxdesk: cargo-dist has no hook between `cargo build` and packing
# the archive, and its own macOS signing takes no entitlements, so the
# signature has to be made while cargo builds.
#
# rustc strips after linking when the profile says `strip` (Cargo's default
# for profiles without debuginfo), and that rewrites the signature without
# the entitlements. So a `dist`-profile build must run with
# CARGO_PROFILE_DIST_STRIP=none (the release workflow's build setup,
# .github/build-setup.yml, sets it); this script refuses to link one that
# does not, rather than let an archive ship a boxdesk that cannot boot a VM.
# A plain `cargo build --release` is stripped after this runs: sign it
# again with dist/macos/sign.sh. Dynamic libraries (proc-macros when the
# host is a Mac) are linked unsigned-by-us, as rustc would.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
"${BOXDESK_MACOS_CC:-cc}" "$@"

# The output and the kind of output, from the arguments or from the
# response file rustc passes instead when the command line is too long
# (one argument per line, backslash-escaped).
args=()
for a in "$@"; do
  if [ "${a#@}" != "$a" ] && [ -f "${a#@}" ]; then
    while IFS= read -r line; do
      args+=("$(printf '%s' "$line" | sed 's/\\\(.\)/\1/g')")
    done <"${a#@}"
  else
    args+=("$a")
  fi
done
out=a.out
prev=
for a in "${args[@]}"; do
  case "$a" in -dynamiclib | -bundle | -shared | -r) exit 0 ;; esac
  [ "$prev" != -o ] || out=$a
  prev=$a
done

if [ "$(uname -s)" != Darwin ]; then
  echo "link-and-sign.sh: not on macOS, $out is left unsigned" >&2
  exit 0
fi
case "$out" in
  */dist/deps/*)
    case "${CARGO_PROFILE_DIST_STRIP:-}" in
      none | false) ;;
      *)
        echo "link-and-sign.sh: a dist-profile build on macOS needs CARGO_PROFILE_DIST_STRIP=none:" >&2
        echo "  rustc's strip after this link would drop the hypervisor entitlement" >&2
        exit 1
        ;;
    esac
    ;;
esac
"$here/sign.sh" "$out"
