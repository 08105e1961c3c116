#!/usr/bin/env bash
# A VM boots from an image `boxdesk images fetch` installed: the release's
# archive served on loopback, fetched into a fresh data dir (nothing else
# where boxdesk looks), and `boxdesk run --backend kvm -- echo booted` on it.
#
#   tests/nested/fetch-boot.sh BOXDESK RELEASE_DIR
#
# BOXDESK: the boxdesk binary to test. RELEASE_DIR: a directory holding
# boxdesk-images-$(uname -m).tar.gz and its .sha256, as dist/images.sh
# writes them (target/images after `bash dist/images.sh ARCH`). Needs a KVM
# that boots Linux (a nested L1), curl (boxdesk fetches with it), and
# python3 (else busybox httpd) to serve RELEASE_DIR. Writes only under a
# temporary directory, removed at the end. Exit status: 0 when the VM
# booted from the fetched image, 1 when a step failed (said on stderr), 2
# on bad usage.
#
# From the build machine, in the x86_64 L1 through the host's own root
# (the aarch64 L1 has no curl or python3 of its arch):
#   bash dist/images.sh x86_64
#   tests/nested/run.sh x86_64 --hostroot --timeout 600 -- \
#     chroot /host /bin/bash "$PWD/tests/nested/fetch-boot.sh" \
#     "$PWD/target/release/boxdesk" "$PWD/target/images"
set -euo pipefail
say() { echo "fetch-boot: $*" >&2; }
die() { say "$*"; exit 1; }
[ $# = 2 ] || { echo "usage: $0 BOXDESK RELEASE_DIR" >&2; exit 2; }
bin=$1 release=$2
arch=$(uname -m)
name=boxdesk-images-$arch.tar.gz
[ -x "$bin" ] || die "$bin is not an executable"
for f in "$name" "$name.sha256"; do
  [ -f "$release/$f" ] || die "$release/$f is missing (bash dist/images.sh $arch)"
done
command -v curl >/dev/null || die "no curl here: boxdesk images fetch needs it"

work=$(mktemp -d /tmp/fetch-boot.XXXXXX)
server=
cleanup() {
  [ -z "$server" ] || kill "$server" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# A copy of the binary away from any checkout: a boxdesk under
# <checkout>/target also looks in <checkout>/target/images.
mkdir -p "$work/bin"
cp "$bin" "$work/bin/boxdesk"
bin=$work/bin/boxdesk

# --- the release, on loopback ------------------------------------------------
if command -v python3 >/dev/null; then
  python3 -u -m http.server --bind 127.0.0.1 --directory "$release" 0 >"$work/server.log" 2>&1 &
  server=$!
  port=
  for _ in $(seq 100); do
    port=$(sed -n 's/^Serving HTTP on .* port \([0-9][0-9]*\).*/\1/p' "$work/server.log")
    [ -z "$port" ] || break
    kill -0 "$server" 2>/dev/null || die "python3 -m http.server failed: $(cat "$work/server.log")"
    sleep 0.1
  done
  [ -n "$port" ] || die "python3 -m http.server said no port: $(cat "$work/server.log")"
elif command -v busybox >/dev/null && busybox httpd --help >/dev/null 2>&1; then
  port=$((20000 + $$ % 20000))
  busybox httpd -f -p "127.0.0.1:$port" -h "$release" &
  server=$!
  sleep 0.5
else
  die "neither python3 nor busybox httpd here to serve $release"
fi
url=http://127.0.0.1:$port/
say "serving $release at $url"

# --- a fresh user: nothing installed, nothing inherited ----------------------
for d in data state run home; do mkdir -m 700 "$work/$d"; done
export XDG_DATA_HOME=$work/data XDG_STATE_HOME=$work/state XDG_RUNTIME_DIR=$work/run HOME=$work/home
unset BOXDESK_IMAGE_DIR BOXDESK_RELEASE_URL BOXDESK_BACKEND http_proxy HTTP_PROXY all_proxy ALL_PROXY
cd "$work"

# --- fetch ---------------------------------------------------------------------
timeout 300 "$bin" images fetch --from "$url" --arch "$arch" ||
  die "boxdesk images fetch failed (exit $?)"
installed=$XDG_DATA_HOME/boxdesk/images/$arch
[ -f "$installed/manifest" ] || die "nothing was installed at $installed"
leftover=$(find "$XDG_DATA_HOME/boxdesk" -mindepth 1 -maxdepth 1 ! -name images)
[ -z "$leftover" ] || die "the fetch left $leftover"
used=$("$bin" images path --arch "$arch") || die "boxdesk finds no $arch image after the fetch"
[ "$used" = "$installed" ] || die "boxdesk would boot $used, not the fetched $installed"
say "installed at $installed: $(tr '\n' ' ' <"$installed/manifest")"

# --- boot ----------------------------------------------------------------------
out=$(timeout 300 "$bin" run --backend kvm -- echo booted 2>"$work/run.err") || {
  rc=$?
  cat "$work/run.err" >&2
  die "boxdesk run --backend kvm failed (exit $rc)"
}
[ "$out" = booted ] || { cat "$work/run.err" >&2; die "the VM said '$out', not 'booted'"; }
say "ok: a $arch VM booted from the image boxdesk images fetch installed"
