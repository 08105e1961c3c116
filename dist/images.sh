#!/usr/bin/env bash
# Packs one guest arch's image as release artifacts (cargo-dist's extra
# artifacts, dist-workspace.toml; built in the release's global job):
#   dist/images.sh x86_64|aarch64
# Output, in target/images/:
#   boxdesk-images-<arch>.tar.gz         <arch>/{vmlinux|Image, initramfs.cpio.gz, manifest}
#   boxdesk-images-<arch>.tar.gz.sha256  `sha256sum` format
# `boxdesk images fetch` installs it into
# ${XDG_DATA_HOME:-~/.local/share}/boxdesk/images/<arch>, where boxdesk
# looks (README, "Install"; users without curl unpack it there by hand).
# The packed manifest is the image's with one line added,
# `boxdesk_version=<the workspace's version>`: fetch refuses the image of
# another release. (It is added here, not by images/build.sh, whose own
# hash keys the kernel cache.)
#
# The image is target/images/<arch> from images/build.sh. When its manifest
# is missing it is built first: here when this is Debian 12 (the kernel
# comes from Debian's linux-source-6.1), otherwise in a debian:12 container
# (docker), which is what happens on the release workflow's Ubuntu runner.
# The archive is reproducible for a given image (sorted, fixed owner and
# mtime, gzip -n).
set -euo pipefail

arch=${1:-}
case "$arch" in
  x86_64) kernel=vmlinux ;;
  aarch64) kernel=Image ;;
  --in-container) ;;
  *) echo "usage: $0 x86_64|aarch64" >&2; exit 2 ;;
esac
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
say() { echo "images.sh: $*" >&2; }
die() { say "$*"; exit 1; }

# Inside the debian:12 container: what images/build.sh cannot install
# itself (a Rust with the musl std for the agent), then the build.
if [ "$arch" = --in-container ]; then
  arch=$2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends ca-certificates curl gcc libc6-dev file git >/dev/null
  curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs |
    sh -s -- -y -q --profile minimal --target "$arch-unknown-linux-musl"
  export PATH=$HOME/.cargo/bin:$PATH
  [ "$arch" != aarch64 ] || export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_LINKER=aarch64-linux-gnu-gcc
  exec bash images/build.sh "$arch"
fi

dir=target/images/$arch
if [ ! -f "$dir/manifest" ]; then
  if grep -qs '^VERSION_ID="12"' /etc/os-release && grep -qs '^ID=debian' /etc/os-release; then
    say "no image in $dir: images/build.sh $arch"
    bash images/build.sh "$arch"
  elif command -v docker >/dev/null; then
    say "no image in $dir and this is not Debian 12: building it in a debian:12 container"
    docker run --rm -v "$root:/src" -w /src debian:12 bash dist/images.sh --in-container "$arch"
  else
    die "no image in $dir, and neither Debian 12 nor docker here to build one"
  fi
fi
for f in "$kernel" initramfs.cpio.gz manifest; do
  [ -f "$dir/$f" ] || die "$dir/$f is missing (images/build.sh $arch)"
done

version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
[ -n "$version" ] || die "no [workspace.package] version in Cargo.toml"

name=boxdesk-images-$arch.tar.gz
tmp=$(mktemp "target/images/.$name.XXXXXX")
stage=$(mktemp -d "target/images/.stage-$arch.XXXXXX")
trap 'rm -f "$tmp"; rm -rf "$stage"' EXIT
mkdir "$stage/$arch"
cp "$dir/$kernel" "$dir/initramfs.cpio.gz" "$stage/$arch/"
{ grep -v '^boxdesk_version=' "$dir/manifest"; echo "boxdesk_version=$version"; } >"$stage/$arch/manifest"
printf '%s\n' "$arch/$kernel" "$arch/initramfs.cpio.gz" "$arch/manifest" | LC_ALL=C sort |
  tar -C "$stage" --owner=0 --group=0 --numeric-owner --mtime=@0 --mode=u+rw,go+r,go-w \
    -cf - --verbatim-files-from -T - | gzip -9 -n >"$tmp"
mv "$tmp" "target/images/$name"
rm -rf "$stage"
trap - EXIT
(cd target/images && sha256sum "$name" >"$name.sha256")
say "target/images/$name: $(stat -c %s "target/images/$name") bytes, sha256 $(cut -d' ' -f1 "target/images/$name.sha256")"
