#!/usr/bin/env bash
# Builds the guest image for one arch:
#   images/build.sh x86_64|aarch64
# Output, in target/images/<arch>/: the kernel (x86_64: vmlinux and bzImage;
# aarch64: the raw arm64 Image the VMM loads), initramfs.cpio.gz, manifest
# (key=value lines), next to the agent from images/build-agent.sh.
#
# The kernel is Debian's linux-source-6.1 with tinyconfig + images/<arch>/
# kernel.config (docs/BUILDING.md, "Guest images"), cross-built when
# the host differs (aarch64 on x86_64: ARCH=arm64
# CROSS_COMPILE=aarch64-linux-gnu-, gcc-aarch64-linux-gnu). The source is
# unpacked once per package version under $BOXDESK_CACHE/images/src; the
# kernel is built out of tree in $BOXDESK_CACHE/images/<arch>/<key>, where
# <key> hashes the arch, the fragment, the package version and this script,
# so a run with nothing changed reuses it and takes seconds. The initramfs
# (agent as /init, Debian's busybox-static of the guest arch) is rebuilt
# whenever its inputs change; it is reproducible (fixed mtimes, sorted,
# gzip -n). A foreign-arch busybox (busybox-static:arm64 on an amd64 host)
# is fetched with apt-get download into $BOXDESK_CACHE/images/busybox and
# listed under qemu-user (qemu-aarch64-static) for its applet links.
set -euo pipefail

arch=${1:-}
# karch: the kernel's ARCH; ktarget: what make builds; kfiles: what is
# copied out of the build tree; deb_arch: Debian's name; cross and
# cross_pkg: CROSS_COMPILE and its compiler, used when the host differs.
case "$arch" in
  x86_64)
    karch=x86_64 ktarget=bzImage deb_arch=amd64
    kfiles=(vmlinux arch/x86/boot/bzImage)
    cross=x86_64-linux-gnu- cross_pkg=gcc-x86-64-linux-gnu
    ;;
  aarch64)
    karch=arm64 ktarget=Image deb_arch=arm64
    kfiles=(arch/arm64/boot/Image)
    cross=aarch64-linux-gnu- cross_pkg=gcc-aarch64-linux-gnu
    ;;
  *) echo "usage: $0 x86_64|aarch64" >&2; exit 2 ;;
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
host_deb_arch=$(dpkg --print-architecture)
native=0
[ "$deb_arch" != "$host_deb_arch" ] || native=1
# Runs a binary of the guest arch: natively, or under qemu-user.
run_guest() {
  if [ "$native" = 1 ]; then "$@"; else "qemu-$arch-static" "$@"; fi
}
# candidate PKG:ARCH -> the version apt would fetch ('' when apt knows none)
candidate() {
  apt-cache policy "$1" 2>/dev/null | awk '/Candidate:/ { if ($2 != "(none)") print $2; exit }'
}

# --- packages ---------------------------------------------------------------
phase "packages"
pkgs=("$src_pkg" bc flex bison libelf-dev libssl-dev cpio gzip xz-utils make gcc libc6-dev file)
if [ "$native" = 1 ]; then
  pkgs+=(busybox-static)
else
  pkgs+=("$cross_pkg" qemu-user-static)
fi
need=()
for p in "${pkgs[@]}"; do
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

# --- busybox of the guest arch ----------------------------------------------
# The host's busybox-static when the arches match; otherwise Debian's
# busybox-static:<deb_arch> (the candidate apt knows), downloaded once and
# unpacked into $cache/images/busybox/<deb_arch>-<version>/busybox.
if [ "$native" = 1 ]; then
  busybox=/bin/busybox
  busybox_version=$(dpkg-query -W -f='${Version}' busybox-static)
else
  if ! dpkg --print-foreign-architectures | grep -qx "$deb_arch"; then
    phase "  dpkg --add-architecture $deb_arch"
    as_root dpkg --add-architecture "$deb_arch"
    as_root apt-get update -qq
  fi
  busybox_version=$(candidate "busybox-static:$deb_arch")
  if [ -z "$busybox_version" ]; then
    as_root apt-get update -qq
    busybox_version=$(candidate "busybox-static:$deb_arch")
  fi
  [ -n "$busybox_version" ] || die "apt knows no busybox-static:$deb_arch"
  bbdir=$cache/images/busybox/$deb_arch-${busybox_version//:/_}
  busybox=$bbdir/busybox
  if [ ! -x "$busybox" ]; then
    phase "  apt-get download busybox-static:$deb_arch=$busybox_version"
    bbtmp=$(mktemp -d "${TMPDIR:-/tmp}/boxdesk-busybox.XXXXXX")
    # apt-get download writes into the cwd; _apt cannot write to this
    # private temp dir, which apt reports as a harmless "unsandboxed" notice.
    (cd "$bbtmp" && apt-get download -qq "busybox-static:$deb_arch=$busybox_version" 2>&1 |
      { grep -v '^W: Download is performed unsandboxed' >&2 || true; })
    deb=$(find "$bbtmp" -maxdepth 1 -name 'busybox-static_*.deb' | head -n 1)
    [ -n "$deb" ] || die "apt-get download busybox-static:$deb_arch=$busybox_version produced no .deb"
    dpkg-deb -x "$deb" "$bbtmp/x"
    mkdir -p "$bbdir"
    install -m 0755 "$bbtmp/x/bin/busybox" "$busybox.part"
    mv "$busybox.part" "$busybox"
    rm -rf "$bbtmp"
  fi
fi
case "$arch" in x86_64) elf_machine=x86-64 ;; aarch64) elf_machine=aarch64 ;; esac
file -b "$busybox" | grep -q 'statically linked' || die "$busybox is not static (busybox-static?)"
file -b "$busybox" | grep -q "$elf_machine" || die "$busybox is not an $arch binary: $(file -b "$busybox")"

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
kvars=(ARCH="$karch")
[ "$native" = 1 ] || kvars+=(CROSS_COMPILE="$cross")
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
  kmake() { make -C "$src" O="$kbuild" "${kvars[@]}" "$@" >>"$log" 2>&1; }
  fail() {
    echo "---- tail of $log ----" >&2
    tail -n 40 "$log" >&2
    die "$1"
  }
  mkdir -p "$kbuild"
  : >"$log"
  phase "kernel config: tinyconfig + ${fragment#"$root"/} (log: $log)"
  kmake tinyconfig || fail "make tinyconfig failed"
  (cd "$src" && env "${kvars[@]}" scripts/kconfig/merge_config.sh -m -O "$kbuild" \
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

  phase "kernel build: make ${kvars[*]} -j$(nproc) $ktarget (log: $log)"
  kmake -j"$(nproc)" "$ktarget" || fail "kernel build failed"
  make -s -C "$src" O="$kbuild" "${kvars[@]}" kernelrelease >"$work/kernelrelease" ||
    fail "make kernelrelease failed"
  touch "$work/kernel.done"
fi
krel=$(cat "$work/kernelrelease")
outs=()
for f in "${kfiles[@]}"; do
  install -m 0644 "$kbuild/$f" "$out/${f##*/}"
  outs+=("${f##*/}")
done

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
  phase "initramfs: agent as /init, busybox-static:$deb_arch $busybox_version"
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
    applets=$(run_guest "$busybox" --list) || die "$busybox --list failed"
    printf '%s\n' "$applets" | while IFS= read -r applet; do
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
  for f in "${outs[@]}"; do
    echo "${f}_sha256=$(sha "$out/$f")"
  done
  echo "initramfs_sha256=$(sha "$out/initramfs.cpio.gz")"
  echo "agent_sha256=$(sha "$agent")"
  echo "busybox_version=$busybox_version"
  echo "build_date=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
} >"$out/manifest.tmp"
mv "$out/manifest.tmp" "$out/manifest"

for f in "${outs[@]}" initramfs.cpio.gz; do
  phase "  $out/$f $(stat -c %s "$out/$f") bytes"
done
phase "done: $arch image, kernel $krel"
