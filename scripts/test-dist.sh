#!/usr/bin/env bash
# Checks the release (cargo-dist) configuration with the pinned dist:
#   bash scripts/test-dist.sh [--install-only]
# 1. `dist plan` succeeds (so dist-workspace.toml parses and the committed
#    .github/workflows/release.yml is what `dist generate` writes) and lists
#    the archive of every release target, the installer, the Homebrew
#    formula and the guest image archives — and no guest-agent archive;
# 2. `dist build --artifacts=local` for this host's target, with the
#    environment the release workflow's Linux build-setup step exports
#    (.github/build-setup.yml), makes an archive whose checksum holds and
#    whose boxdesk is static-pie on a glibc host and prints a full `--version`;
# 3. for each guest arch whose image was built (test.sh's image step),
#    dist/images.sh packs the archive `boxdesk images fetch` installs under
#    $XDG_DATA_HOME/boxdesk/images, with a checksum that holds and a
#    manifest naming this version.
#
# dist is installed once per machine into $BOXDESK_CACHE/tools/cargo-dist-
# <version> (a cold install compiles ~400 crates: many minutes). The build
# uses its own target dir ($BOXDESK_DIST_TARGET_DIR, default
# $BOXDESK_CACHE/dist/target) so it never waits on the workspace's lock and
# a warm run recompiles only boxdesk.
set -euo pipefail

dist_version=0.34.0
targets=(x86_64-unknown-linux-gnu aarch64-unknown-linux-gnu x86_64-unknown-linux-musl
  aarch64-unknown-linux-musl aarch64-apple-darwin)

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
cache=${BOXDESK_CACHE:-/var/cache/boxdesk}
tools=$cache/tools/cargo-dist-$dist_version
dist=$tools/bin/dist
start=$SECONDS
say() { printf 'test-dist [%3ds] %s\n' "$((SECONDS - start))" "$*"; }
die() { echo "test-dist: FAILED: $*" >&2; exit 1; }

if [ "$("$dist" --version 2>/dev/null)" != "cargo-dist $dist_version" ]; then
  say "cargo install cargo-dist@$dist_version --root $tools"
  mkdir -p "$tools"
  # One install at a time (test.sh starts one early in the background).
  exec 8>"$tools.lock"
  flock 8
  if [ "$("$dist" --version 2>/dev/null)" != "cargo-dist $dist_version" ]; then
    nice -n 10 cargo install -q --locked "cargo-dist@$dist_version" --root "$tools"
  fi
  flock -u 8
fi
[ "${1:-}" != --install-only ] || exit 0

# --- plan ---------------------------------------------------------------------
say "dist plan"
plan=$("$dist" plan 2>&1) || { echo "$plan" >&2; die "dist plan failed"; }
echo "$plan"
want=(boxdesk-installer.sh boxdesk.rb boxdesk-images-x86_64.tar.gz boxdesk-images-x86_64.tar.gz.sha256
  boxdesk-images-aarch64.tar.gz boxdesk-images-aarch64.tar.gz.sha256)
for t in "${targets[@]}"; do want+=("boxdesk-$t.tar.xz"); done
for a in "${want[@]}"; do
  grep -qE "(^|[ /])$a\$" <<<"$plan" || die "dist plan does not list $a"
done
! grep -q guest-agent <<<"$plan" || die "dist plan releases the guest agent on its own"
n=$(grep -cE '^ +boxdesk-[a-z0-9_]+-[a-z0-9_-]+\.tar\.xz$' <<<"$plan")
[ "$n" -eq "${#targets[@]}" ] || die "dist plan lists $n target archives, want ${#targets[@]}"
say "plan: all ${#targets[@]} targets, installer, formula, images"

# --- build for this host --------------------------------------------------------
host=$(rustc -vV | sed -n 's/^host: //p')
crate_version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
say "dist build --artifacts=local --target $host"
manifest=$(mktemp /tmp/boxdesk-dist-manifest.XXXXXX)
unpacked=$(mktemp -d /tmp/boxdesk-dist.XXXXXX)
trap 'rm -rf "$manifest" "$unpacked"' EXIT
# What the release workflow's build-setup step exports on Linux, read from
# that file, so this build is the one users download.
flags=$(sed -n 's/^ *run: echo "RUSTFLAGS=\([^"]*\)" >> "\$GITHUB_ENV"$/\1/p' .github/build-setup.yml)
[ -n "$flags" ] || die ".github/build-setup.yml sets no RUSTFLAGS for the Linux builds"
RUSTFLAGS=$flags CARGO_TARGET_DIR=${BOXDESK_DIST_TARGET_DIR:-$cache/dist/target} nice -n 10 \
  "$dist" build --artifacts=local --target "$host" --output-format=json >"$manifest" ||
  die "dist build failed"
archive=$(python3 -c 'import json, sys
m = json.load(open(sys.argv[1]))
print(next(a["path"] for a in m["artifacts"].values()
           if a["kind"] == "executable-zip" and a["target_triples"] == [sys.argv[2]]))' "$manifest" "$host") ||
  die "dist build made no archive for $host"
(cd "$(dirname "$archive")" && sha256sum --quiet -c "$(basename "$archive").sha256") ||
  die "$archive does not match its .sha256"
tar -xf "$archive" -C "$unpacked"
bin=$unpacked/boxdesk-$host/boxdesk
[ -x "$bin" ] || die "$(basename "$archive") has no boxdesk-$host/boxdesk"
if [[ $host == *-linux-gnu ]]; then
  # A static-pie ELF has no PT_INTERP (no dynamic loader to run first).
  python3 -c 'import struct, sys
d = open(sys.argv[1], "rb").read()
off, = struct.unpack_from("<Q", d, 32); size, n = struct.unpack_from("<HH", d, 54)
sys.exit(any(struct.unpack_from("<I", d, off + i * size)[0] == 3 for i in range(n)))' "$bin" ||
    die "the archive's boxdesk is dynamically linked, not static-pie"
fi
version=$("$bin" --version) || die "boxdesk --version from the archive failed"
echo "$version"
re="^boxdesk $crate_version \\(commit ([0-9a-f]{7,}(-dirty)?|unknown), target $host, backends: namespace kvm\\)\$"
[[ $version =~ $re ]] || die "unexpected --version output (want /$re/)"
say "$(basename "$archive"): $(stat -c %s "$archive") bytes, boxdesk --version ok"

# --- guest image archives -----------------------------------------------------
for arch in x86_64 aarch64; do
  kernel=vmlinux
  [ "$arch" = x86_64 ] || kernel=Image
  name=boxdesk-images-$arch.tar.gz
  if [ ! -f "target/images/$arch/manifest" ]; then
    say "no target/images/$arch (images/build.sh $arch): $name not checked"
    continue
  fi
  bash dist/images.sh "$arch"
  (cd target/images && sha256sum --quiet -c "$name.sha256") || die "$name does not match its .sha256"
  listing=$(tar -tzf "target/images/$name" | LC_ALL=C sort)
  expected=$(printf '%s\n' "$arch/$kernel" "$arch/initramfs.cpio.gz" "$arch/manifest" | LC_ALL=C sort)
  [ "$listing" = "$expected" ] || die "$name holds: $listing"
  # `boxdesk images fetch` refuses the image of another release.
  tar -xzOf "target/images/$name" "$arch/manifest" | grep -qx "boxdesk_version=$crate_version" ||
    die "$name: its manifest does not say boxdesk_version=$crate_version"
  say "$name: $arch/{$kernel,initramfs.cpio.gz,manifest}"
done
say "ok"
