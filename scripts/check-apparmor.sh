#!/usr/bin/env bash
# Checks that boxdesk's AppArmor profile compiles with this machine's
# apparmor_parser (Debian/Ubuntu package `apparmor`):
#   bash scripts/check-apparmor.sh [PROFILE]   # default: dist/apparmor/boxdesk
# PROFILE may be one `boxdesk apparmor show` printed (with an added path).
#
# With AppArmor 4's parser (Ubuntu 24.04) the file is compiled as it is,
# everything but loading it into the kernel (`-Q`, no cache).
#
# AppArmor 3's parser (Debian 12: 3.0.8) knows neither `abi <abi/4.0>,`
# (it has no abi/4.0 file) nor the `userns,` rule (a syntax error). For it
# the check is partial, and says so: the file must hold each of those two
# lines exactly once, as written; they are taken out (the abi line becomes
# `abi <abi/3.0>,`, the `userns,` line is dropped) and the rest -- the
# preamble, the @{boxdesk_exe} variable and its expansion, the attachment,
# the flags, the includes -- is compiled. Whether AppArmor 4 accepts the
# two lines themselves is not checked there.
#
# Either way, a copy with its closing brace removed must be refused, so an
# `ok` comes from a parser that really reads the file. Prints `skipped:
# WHY` and exits 0 when there is no apparmor_parser.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
profile=${1:-$root/dist/apparmor/boxdesk}
die() { echo "check-apparmor: FAILED: $*" >&2; exit 1; }

parser=$(PATH=$PATH:/usr/sbin:/sbin command -v apparmor_parser || true)
if [ -z "$parser" ]; then
  echo "skipped: no apparmor_parser here (the Debian/Ubuntu package apparmor has it)"
  exit 0
fi
[ -r "$profile" ] || die "cannot read $profile"
version=$("$parser" --version | sed -n '1s/^AppArmor parser version //p')
major=${version%%.*}
[[ $major =~ ^[0-9]+$ ]] || die "cannot tell $parser's version from: $("$parser" --version | head -1)"

work=$(mktemp -d /tmp/boxdesk-apparmor.XXXXXX)
trap 'rm -rf "$work"' EXIT
# -Q: everything but loading into the kernel; -K: no cache; the includes
# come from /etc/apparmor.d as on an installed system. (Without AppArmor in
# the kernel the parser notes that it cannot use its cache: not an error.)
compiles() {
  local out
  out=$("$parser" -Q -K "$1" 2>&1) && return 0
  grep -v '^Cache read/write disabled' <<<"$out" >&2
  return 1
}

if [ "$major" -ge 4 ]; then
  cp "$profile" "$work/boxdesk"
  what="the whole profile (AppArmor $version)"
else
  abi_line='abi <abi/4.0>,'
  userns_re='^[[:space:]]*userns,[[:space:]]*$'
  n_abi=$(grep -cxF "$abi_line" "$profile" || true)
  n_userns=$(grep -cE "$userns_re" "$profile" || true)
  [ "$n_abi" = 1 ] || die "$profile holds \`$abi_line\` $n_abi times, want once"
  [ "$n_userns" = 1 ] || die "$profile holds a \`userns,\` line $n_userns times, want once"
  sed -e "s|^abi <abi/4.0>,\$|abi <abi/3.0>,|" -e "/$userns_re/d" "$profile" >"$work/boxdesk"
  what="the profile without its two AppArmor 4.0 lines (\`$abi_line\` read as abi 3.0, \`userns,\` left out; both checked only as text) (AppArmor $version)"
fi
compiles "$work/boxdesk" || die "$parser refuses $what"
# The same file without its closing brace must be refused.
sed '/^}$/d' "$work/boxdesk" >"$work/broken"
if compiles "$work/broken" 2>/dev/null; then
  die "$parser accepted a copy with no closing brace: its ok proves nothing here"
fi
echo "ok: $parser compiled $what"
