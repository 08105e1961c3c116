#!/usr/bin/env bash
# Builds the guest image for one arch:
#   images/build.sh x86_64
# Output, in target/images/<arch>/: vmlinux, bzImage, initramfs.cpio.gz,
# manifest (key=value lines), next to the agent from images/build-agent.sh.
#
# The kernel is Debian's linux-source-6.1 with tinyconfig + images/<arch>/
# kernel.config (../shared/TOOLCHAIN.md, "Guest kernel"). The source is
# unpacked once per package version under $BOXDESK_CACHE/images/src; the
# kernel is built out of tree in $BOXDESK_CACHE/images/<arch>/<key>, where
# <key> hashes the fragment, the package version and this script, so a run
# with nothing changed reuses it and takes seconds. The initramfs (agent as
# /init, Debian's busybox-static) is rebuilt whenever its inputs change; it
# is reproducible (fixed mtimes, sorted, gzip -n).
set -euo pipefail

arch=${1:-}
case "$arch" in
  x86_64) ;;
  aarch64) echo "not yet: the aarch64 image is another issue" >&2; exit 2 ;;
  *) echo "usage: $0 x86_64" >&2; exit 2 ;;
esac

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
cache=${BOXDESK_CACHE:-/var/cache/boxdesk}
out=$root/target/images/$arch
fragment=$here/$arch/kernel.config
src_pkg=linux-source-6.1
src_tarball=/usr/src/$src_pkg.tar.xz
start=$SECONDS

phase() { printf 'build.sh [%3ds] %s\n' "$((SECONDS - start))" "$*"; }
die() { echo "build.sh: $*" >&2; exit 1; }
sha() { sha256sum "$1" | cut -d' ' -f1; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# --- packages ---------------------------------------------------------------
phase "packages"
need=()
for p in "$src_pkg" bc flex bison libelf-dev libssl-dev busybox-static cpio gzip xz-utils make gcc libc6-dev file; do
  dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$' || need+=("$p")
done
if [ "${#need[@]}" -gt 0 ]; then
  phase "  apt-get install ${need[*]}"
  if ! as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null; then
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  fi
fi
src_ver=$(dpkg-query -W -f='${Version}' "$src_pkg")
[ -f "$src_tarball" ] || die "$src_tarball is missing (is $src_pkg installed?)"
busybox=/bin/busybox
file -b "$busybox" | grep -q 'statically linked' || die "$busybox is not static (busybox-static?)"

# --- cache key and lock -----------------------------------------------------
key=$(printf '%s\n' "$arch" "$src_pkg=$src_ver" "$(sha "$fragment")" "$(sha "$here/build.sh")" |
  sha256sum | cut -c1-16)
work=$cache/images/$arch/$key
kbuild=$work/build
log=$work/build.log
mkdir -p "$work" "$out"
exec 9>"$cache/images/$arch/.lock"
flock 9

# --- kernel -----------------------------------------------------------------
src=$cache/images/src/${src_pkg}_$src_ver
if [ -f "$work/kernel.done" ]; then
  phase "kernel: cached ($work)"
else
  if [ ! -d "$src" ]; then
    phase "unpack $src_tarball -> $src"
    rm -rf "$src.tmp"
    mkdir -p "$src.tmp"
    tar -xJf "$src_tarball" -C "$src.tmp"
    mv "$src.tmp/$src_pkg" "$src"
    rmdir "$src.tmp"
  fi
  kmake() { make -C "$src" O="$kbuild" ARCH=x86_64 "$@" >>"$log" 2>&1; }
  fail() {
    echo "---- tail of $log ----" >&2
    tail -n 40 "$log" >&2
    die "$1"
  }
  mkdir -p "$kbuild"
  : >"$log"
  phase "kernel config: tinyconfig + ${fragment#"$root"/} (log: $log)"
  kmake tinyconfig || fail "make tinyconfig failed"
  (cd "$src" && ARCH=x86_64 scripts/kconfig/merge_config.sh -m -O "$kbuild" \
    "$kbuild/.config" "$fragment") >>"$log" 2>&1 || fail "merge_config.sh failed"
  kmake olddefconfig || fail "make olddefconfig failed"

  # Every line of the fragment must have survived olddefconfig.
  missing=()
  while IFS= read -r line; do
    case "$line" in
      CONFIG_*=*)
        grep -qxF "$line" "$kbuild/.config" || missing+=("$line")
        ;;
      "# CONFIG_"*" is not set")
        opt=${line#"# "}
        opt=${opt%" is not set"}
        ! grep -q "^$opt=" "$kbuild/.config" || missing+=("$line")
        ;;
    esac
  done <"$fragment"
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "build.sh: options of ${fragment#"$root"/} not in the final .config:" >&2
    for m in "${missing[@]}"; do
      opt=${m#"# "}
      opt=${opt%%[= ]*}
      echo "  want $m, got: $(grep -E "^(# )?${opt}[= ]" "$kbuild/.config" || echo '(absent: a dependency is off)')" >&2
    done
    exit 1
  fi

  phase "kernel build: make -j$(nproc) bzImage (log: $log)"
  kmake -j"$(nproc)" bzImage || fail "kernel build failed"
  make -s -C "$src" O="$kbuild" ARCH=x86_64 kernelrelease >"$work/kernelrelease" ||
    fail "make kernelrelease failed"
  touch "$work/kernel.done"
fi
krel=$(cat "$work/kernelrelease")
install -m 0644 "$kbuild/vmlinux" "$out/vmlinux"
install -m 0644 "$kbuild/arch/x86/boot/bzImage" "$out/bzImage"

# Keep the three most recent kernel builds of this arch, drop older ones.
find "$cache/images/$arch" -mindepth 1 -maxdepth 1 -type d -regextype posix-extended \
  -regex '.*/[0-9a-f]{16}' \
  -printf '%T@ %p\n' | sort -rn | tail -n +4 | cut -d' ' -f2- |
  while IFS= read -r old; do
    [ "$old" = "$work" ] || { phase "  prune old kernel build $old"; rm -rf "$old"; }
  done

# --- agent ------------------------------------------------------------------
phase "agent (images/build-agent.sh $arch)"
agent_log=$cache/images/$arch/agent.log
if ! bash "$here/build-agent.sh" "$arch" >"$agent_log" 2>&1; then
  tail -n 30 "$agent_log" >&2
  die "agent build failed (log: $agent_log)"
fi
agent=$out/boxdesk-guest-agent
phase "  $(tail -n 1 "$agent_log")"

# --- initramfs --------------------------------------------------------------
ikey=$(printf '%s\n' "$(sha "$agent")" "$(sha "$busybox")" "$(sha "$here/build.sh")" | sha256sum | cut -c1-16)
initramfs=$work/initramfs-$ikey.cpio.gz
if [ -f "$initramfs" ]; then
  phase "initramfs: cached"
else
  phase "initramfs: agent as /init, busybox $(dpkg-query -W -f='${Version}' busybox-static)"
  stage=$(mktemp -d "$work/stage.XXXXXX")
  trap 'rm -rf "$stage"' EXIT
  (
    cd "$stage"
    mkdir -p bin sbin usr/bin usr/sbin usr/local/bin usr/local/sbin \
      dev proc sys tmp run root work results etc
    chmod 1777 tmp
    chmod 0700 root
    install -m 0755 "$agent" init
    ln init usr/local/bin/guest-agent
    install -m 0755 "$busybox" bin/busybox
    "$busybox" --list | while IFS= read -r applet; do
      case "$applet" in
        busybox | init | linuxrc) ;;
        *) [ -e "bin/$applet" ] || ln -s busybox "bin/$applet" ;;
      esac
    done
    [ -L bin/sh ] || die "busybox has no sh applet"
    printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >etc/passwd
    printf 'root:x:0:\nnogroup:x:65534:\n' >etc/group
    printf '127.0.0.1\tlocalhost boxdesk\n::1\tlocalhost\n' >etc/hosts
    # The kernel opens /dev/console for init's stdio before anything is
    # mounted; without the node (non-root builds) the agent opens it later.
    if [ "$(id -u)" -eq 0 ]; then
      mknod -m 0600 dev/console c 5 1
      mknod -m 0666 dev/null c 1 3
    fi
    find . -exec touch -h -d @0 {} +
    find . -mindepth 1 -printf '%P\n' | LC_ALL=C sort |
      cpio --quiet -o -H newc --reproducible --owner=0:0 | gzip -9 -n >"$initramfs.tmp"
  )
  mv "$initramfs.tmp" "$initramfs"
  rm -rf "$stage"
  trap - EXIT
  find "$work" -maxdepth 1 -name 'initramfs-*.cpio.gz' ! -name "${initramfs##*/}" -delete
fi
install -m 0644 "$initramfs" "$out/initramfs.cpio.gz"

# --- manifest ---------------------------------------------------------------
phase "manifest"
{
  echo "arch=$arch"
  echo "kernel_version=$krel"
  echo "linux_source_package=$src_pkg=$src_ver"
  echo "cache_key=$key"
  echo "kernel_fragment_sha256=$(sha "$fragment")"
  echo "kernel_config_sha256=$(sha "$kbuild/.config")"
  echo "vmlinux_sha256=$(sha "$out/vmlinux")"
  echo "bzImage_sha256=$(sha "$out/bzImage")"
  echo "initramfs_sha256=$(sha "$out/initramfs.cpio.gz")"
  echo "agent_sha256=$(sha "$agent")"
  echo "busybox_version=$(dpkg-query -W -f='${Version}' busybox-static)"
  echo "build_date=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
} >"$out/manifest.tmp"
mv "$out/manifest.tmp" "$out/manifest"

for f in vmlinux bzImage initramfs.cpio.gz; do
  phase "  $out/$f $(stat -c %s "$out/$f") bytes"
done
phase "done: $arch image, kernel $krel"
