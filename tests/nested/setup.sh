#!/usr/bin/env bash
# Prepares the nested KVM harness (README.md beside this file), skipping
# whatever is already there:
#   tests/nested/setup.sh [--refresh] [x86_64] [aarch64]   (no arch: both)
#
# Installs qemu-system-x86 / qemu-system-arm, cpio and gdb, then fetches (apt-get
# download, never install) the L1 kernel and busybox-static of each arch into
# $BOXDESK_CACHE/nested and writes $BOXDESK_CACHE/nested/<arch>.env, which
# run.sh reads. The kernel package is resolved through the meta package
# (linux-image-amd64, linux-image-arm64:arm64) so a Debian ABI bump keeps
# working; the version found is recorded in that env file (first verified:
# linux-image-6.1.0-57-{amd64,arm64} 6.1.192-3, busybox-static
# 1:1.35.0-4+deb12u1+b1).
#
# Only a trimmed module tree is kept: the closure of the modules the harness
# loads (KVM, 9p over virtio-pci, vhost-vsock), with a modules.dep made for
# exactly those files, so busybox modprobe works inside L1.
# `apt-get update` runs only when a package or an apt list is missing. Warm,
# nothing asks apt anything (each apt-cache call costs ~1 s here): an arch
# whose env file is under a week old and whose files exist is ready as is;
# older, or with --refresh, the meta package is resolved again and a newer
# kernel fetched if Debian has one.
set -euo pipefail

say() { printf '[nested-setup] %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

refresh=0
arches=()
for a in "$@"; do
  case "$a" in --refresh) refresh=1 ;; *) arches+=("$a") ;; esac
done
[ ${#arches[@]} -gt 0 ] || arches=(x86_64 aarch64)
for a in "${arches[@]}"; do
  case "$a" in x86_64 | aarch64) ;; *) die "unknown arch $a (x86_64 | aarch64)" ;; esac
done

cache=${BOXDESK_CACHE:-/var/cache/boxdesk}/nested
host_deb_arch=$(dpkg --print-architecture)

updated=0
apt_update() {
  [ "$updated" = 1 ] && return 0
  say "apt-get update"
  apt-get update -qq >/dev/null
  updated=1
}
as_root() {
  [ "$(id -u)" -eq 0 ] || die "$* needs root (run this script as root once)"
}

# --- host packages ---------------------------------------------------------
# gdb: run.sh takes qemu's backtraces when an L1 freezes.
pkgs=(cpio gdb)
for a in "${arches[@]}"; do
  case "$a" in
    x86_64) pkgs+=(qemu-system-x86) ;;
    aarch64) pkgs+=(qemu-system-arm) ;;
  esac
done
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  as_root "installing ${missing[*]}"
  apt_update
  say "apt-get install ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# zig builds the static KVM probes (build-probe.sh) and links cross test
# binaries (cargo-test.sh); scripts/setup.sh installs it too.
if ! python3 -c 'import ziglang' 2>/dev/null; then
  say "pip install ziglang"
  python3 -m pip install -q --disable-pip-version-check ziglang
fi

# --- Debian package resolution ---------------------------------------------
# deb_arch ARCH -> Debian architecture name
deb_arch() { case "$1" in x86_64) echo amd64 ;; aarch64) echo arm64 ;; esac; }

ensure_foreign_arch() { # debarch
  [ "$1" = "$host_deb_arch" ] && return 0
  dpkg --print-foreign-architectures | grep -qx "$1" && return 0
  as_root "dpkg --add-architecture $1"
  say "dpkg --add-architecture $1"
  dpkg --add-architecture "$1"
  updated=0
  apt_update
}

# candidate PKG[:ARCH] -> version apt would fetch ('' when apt knows none)
candidate() {
  apt-cache policy "$1" 2>/dev/null | awk '/Candidate:/ { if ($2 != "(none)") print $2; exit }'
}

# kernel_pkg DEBARCH -> e.g. linux-image-6.1.0-57-arm64 (what the meta package depends on)
kernel_pkg() {
  apt-cache depends "linux-image-$1:$1" 2>/dev/null |
    awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ { sub(/:.*/, "", $2); print $2; exit }'
}

# resolve DEBARCH: sets kpkg kver bbver, running apt-get update once if apt
# does not know the packages yet.
resolve() {
  local try
  for try in 1 2; do
    kpkg=$(kernel_pkg "$1")
    kver=
    [ -n "$kpkg" ] && kver=$(candidate "$kpkg:$1")
    bbver=$(candidate "busybox-static:$1")
    [ -n "$kver" ] && [ -n "$bbver" ] && return 0
    [ "$try" = 1 ] && { as_root "apt-get update"; apt_update; }
  done
  die "apt knows no linux-image-$1 / busybox-static:$1 (is the $1 architecture enabled?)"
}

# fetch PKG:DEBARCH VERSION -> path of the .deb in the cache (downloaded once)
fetch() {
  local name=${1%%:*} debarch=${1##*:} ver=$2 file
  file=$cache/debs/${name}_${ver//:/%3a}_${debarch}.deb
  if [ ! -s "$file" ]; then
    say "apt-get download $1=$2"
    mkdir -p "$cache/debs"
    # apt-get download writes into the cwd; _apt cannot write the cache, which
    # apt reports as a harmless "unsandboxed" notice.
    (cd "$cache/debs" && apt-get download -qq "$1=$2" 2>&1 | grep -v '^W: Download is performed unsandboxed' >&2 || true)
    [ -s "$file" ] || die "apt-get download $1=$2 did not produce $file"
  fi
  echo "$file"
}

# --- busybox for the host (runs depmod on the trimmed module trees) --------
host_busybox() {
  local ver deb dir
  ver=$(candidate "busybox-static:$host_deb_arch")
  [ -n "$ver" ] || { apt_update; ver=$(candidate "busybox-static:$host_deb_arch"); }
  dir=$cache/busybox/$host_deb_arch-${ver//:/_}
  if [ ! -x "$dir/busybox" ]; then
    deb=$(fetch "busybox-static:$host_deb_arch" "$ver")
    extract_busybox "$deb" "$dir"
  fi
  echo "$dir/busybox"
}

extract_busybox() { # deb dir
  local tmp
  tmp=$(mktemp -d "$cache/tmp.XXXXXX")
  dpkg-deb -x "$1" "$tmp"
  mkdir -p "$2"
  install -m 0755 "$tmp/bin/busybox" "$2/busybox.part"
  mv "$2/busybox.part" "$2/busybox"
  rm -rf "$tmp"
}

# Modules L1 may load. kvm-amd pulls irqbypass, ccp and kvm; on arm64 KVM is
# built in. 9p over virtio-pci is for --hostroot; vhost_vsock for --modprobe;
# on arm64 the output port is a virtio console and sysrq comes from a virtio
# keyboard (x86_64's are the 8250 and the i8042, built in).
wanted_modules() {
  case "$1" in
    x86_64) echo "kvm_amd irqbypass ccp kvm virtio_pci 9pnet_virtio 9p vhost_vsock" ;;
    aarch64) echo "virtio_pci 9pnet_virtio 9p vhost_vsock virtio_console virtio_input" ;;
  esac
}
kvm_modules() { case "$1" in x86_64) echo "irqbypass ccp kvm kvm_amd" ;; aarch64) echo "" ;; esac; }
hostroot_modules() { echo "virtio_pci 9pnet_virtio 9p"; }
out_modules() { case "$1" in x86_64) echo "" ;; aarch64) echo "virtio_pci virtio_console virtio_input" ;; esac; }

# extract_kernel ARCH DEB DIR: DIR/vmlinuz, DIR/lib/modules/<release>/...
extract_kernel() {
  local arch=$1 deb=$2 dir=$3 bb=$4 tmp release mdir m path
  tmp=$(mktemp -d "$cache/tmp.XXXXXX")
  say "extracting $(basename "$deb")"
  dpkg-deb -x "$deb" "$tmp/full"
  release=$(ls "$tmp/full/lib/modules")
  mdir=$tmp/full/lib/modules/$release
  "$bb" depmod -b "$tmp/full" "$release"

  # Closure of the wanted modules over modules.dep, skipping built-ins.
  declare -A seen=()
  local queue=()
  for m in $(wanted_modules "$arch"); do queue+=("$m"); done
  local out=$tmp/part/lib/modules/$release
  mkdir -p "$out"
  while [ ${#queue[@]} -gt 0 ]; do
    m=${queue[0]}
    queue=("${queue[@]:1}")
    m=${m//-/_}
    [ -n "${seen[$m]:-}" ] && continue
    seen[$m]=1
    # the modules.dep line whose file name (with - or _) is this module
    path=$(awk -v m="$m" -F: '{ n = $1; sub(/.*\//, "", n); sub(/\.ko.*/, "", n); gsub(/-/, "_", n); if (n == m) { print $1; exit } }' "$mdir/modules.dep")
    if [ -z "$path" ]; then
      awk -v m="$m" '{ n = $0; sub(/.*\//, "", n); sub(/\.ko.*/, "", n); gsub(/-/, "_", n); if (n == m) f = 1 } END { exit !f }' \
        "$mdir/modules.builtin" || die "$release has no module $m"
      continue # built in
    fi
    mkdir -p "$out/$(dirname "$path")"
    case "$path" in
      *.ko.xz) xz -dc "$mdir/$path" >"$out/${path%.xz}" ;;
      *.ko.zst) zstd -qdc "$mdir/$path" >"$out/${path%.zst}" ;;
      *.ko.gz) gzip -dc "$mdir/$path" >"$out/${path%.gz}" ;;
      *) cp "$mdir/$path" "$out/$path" ;;
    esac
    for dep in $(awk -v p="$path" -F': *' '$1 == p { print $2; exit }' "$mdir/modules.dep"); do
      dep=${dep##*/}
      queue+=("${dep%%.ko*}")
    done
  done
  cp "$mdir/modules.builtin" "$mdir/modules.order" "$out/"
  [ -f "$mdir/modules.builtin.modinfo" ] && cp "$mdir/modules.builtin.modinfo" "$out/"
  "$bb" depmod -b "$tmp/part" "$release"
  rm -f "$out/modules.symbols" "$out/modules.alias"
  cp "$tmp/full/boot/vmlinuz-$release" "$tmp/part/vmlinuz"
  echo "$release" >"$tmp/part/release"
  rm -rf "$dir"
  mkdir -p "$(dirname "$dir")"
  mv "$tmp/part" "$dir"
  rm -rf "$tmp"
}

# boot_kernel ARCH KDIR -> the file qemu boots. x86_64: the ELF vmlinux out
# of the bzImage when it has a PVH entry note (Debian's has: CONFIG_PVH), so
# L1 skips decompressing itself under TCG, about 3 s of a 6 s boot here;
# otherwise the bzImage. aarch64: the Image as shipped (uncompressed).
boot_kernel() {
  local kdir=$2 off
  if [ "$1" = x86_64 ]; then
    if [ ! -f "$kdir/vmlinux" ] && [ ! -f "$kdir/no-pvh" ]; then
      # The xz stream starts at its magic; what follows it is not ours.
      off=$(LC_ALL=C grep -m 1 -obUaP '\xfd7zXZ\x00' "$kdir/vmlinuz" | cut -d: -f1 | head -n 1 || true)
      if [ -n "$off" ] && { tail -c +$((off + 1)) "$kdir/vmlinuz" || true; } |
        xz -dc --single-stream >"$kdir/vmlinux.part" 2>/dev/null &&
        readelf -n "$kdir/vmlinux.part" 2>/dev/null | grep -q 'Unknown note type: (0x00000012)'; then
        mv "$kdir/vmlinux.part" "$kdir/vmlinux"
      else
        rm -f "$kdir/vmlinux.part"
        say "no PVH vmlinux in $kdir/vmlinuz; booting the bzImage (slower)"
        : >"$kdir/no-pvh"
      fi
    fi
    [ -f "$kdir/vmlinux" ] && { echo "$kdir/vmlinux"; return; }
  fi
  echo "$kdir/vmlinuz"
}

mkdir -p "$cache"
bb_host=
# The env file's format: a file of another (an older harness's) is redone.
env_format=4
# fresh ARCH: its env file is of this format, under a week old and names
# files that exist.
fresh() {
  local env_file=$cache/$1.env
  [ "$refresh" = 0 ] && [ -n "$(find "$env_file" -mtime -7 2>/dev/null)" ] || return 1
  (
    # shellcheck disable=SC1090
    . "$env_file"
    [ "${NESTED_ENV_FORMAT:-}" = "$env_format" ] && [ -f "${NESTED_KERNEL:-}" ] && [ -x "$NESTED_BUSYBOX" ] &&
      say "$1 ready: $NESTED_KERNEL_PKG $NESTED_KERNEL_VERSION, busybox-static $NESTED_BUSYBOX_VERSION (cached)"
  )
}

for arch in "${arches[@]}"; do
  fresh "$arch" && continue
  da=$(deb_arch "$arch")
  ensure_foreign_arch "$da"
  resolve "$da"
  # (the trimmed module tree is keyed by the modules it holds)
  kdir=$cache/kernel/${kpkg}_${kver//:/_}-$(wanted_modules "$arch" | sha256sum | cut -c1-8)
  bdir=$cache/busybox/$da-${bbver//:/_}
  env_file=$cache/$arch.env
  if [ -f "$kdir/vmlinuz" ] && [ -x "$bdir/busybox" ] && [ -f "$env_file" ] &&
    grep -qx "NESTED_KERNEL=$(boot_kernel "$arch" "$kdir")" "$env_file" &&
    grep -qx "NESTED_BUSYBOX=$bdir/busybox" "$env_file" && grep -qx "NESTED_ENV_FORMAT=$env_format" "$env_file"; then
    touch "$env_file"
    say "$arch ready: $kpkg $kver, busybox-static $bbver"
    continue
  fi
  [ -n "$bb_host" ] || bb_host=$(host_busybox)
  if [ ! -f "$kdir/vmlinuz" ]; then
    deb=$(fetch "$kpkg:$da" "$kver")
    extract_kernel "$arch" "$deb" "$kdir" "$bb_host"
  fi
  if [ ! -x "$bdir/busybox" ]; then
    deb=$(fetch "busybox-static:$da" "$bbver")
    extract_busybox "$deb" "$bdir"
  fi
  cat >"$env_file.part" <<EOF
# written by tests/nested/setup.sh; read by tests/nested/run.sh
NESTED_ENV_FORMAT=$env_format
NESTED_ARCH=$arch
NESTED_KERNEL_PKG=$kpkg
NESTED_KERNEL_VERSION=$kver
NESTED_KERNEL_RELEASE=$(cat "$kdir/release")
NESTED_KERNEL_DIR=$kdir
NESTED_KERNEL=$(boot_kernel "$arch" "$kdir")
NESTED_BUSYBOX=$bdir/busybox
NESTED_BUSYBOX_VERSION=$bbver
NESTED_KVM_MODULES="$(kvm_modules "$arch")"
NESTED_HOSTROOT_MODULES="$(hostroot_modules "$arch")"
NESTED_OUT_MODULES="$(out_modules "$arch")"
EOF
  mv "$env_file.part" "$env_file"
  say "$arch ready: $kpkg $kver, busybox-static $bbver"
done
