#!/usr/bin/env bash
# Checks the guest image independent of boxdesk's VMM:
#   images/check-qemu.sh x86_64|aarch64
# Boots target/images/<arch> (images/build.sh) under qemu TCG (x86_64: the
# bzImage on the microvm machine, console ttyS0; aarch64: the Image on the
# virt machine with a GICv3 and a cortex-a72, console ttyAMA0) with a
# vhost-user vsock device served by vhost-device-vsock (the same hybrid
# `CONNECT <port>\n` -> `OK <port>\n` socket the VMM serves;
# docs/BUILDING.md, "Guest images"), waits for the guest
# agent on vsock port 1024 and runs `uname -m` through the channel client
# example (channel/examples/agch.rs); it must print the arch. Fails,
# printing the serial console, if that does not work within
# $CHECK_TIMEOUT seconds (120). With $CHECK_CONSOLE set, the serial console
# is also copied to that file when the script ends, pass or fail.
#
# Tools it installs when missing: qemu-system-x86 or qemu-system-arm (apt),
# vhost-device-vsock (cargo install into $BOXDESK_CACHE/tools). agch is
# built with its own target dir ($BOXDESK_IMAGES_TARGET_DIR, default
# $BOXDESK_CACHE/images/host-target) so it never waits on the workspace's
# target lock.
set -euo pipefail

arch=${1:-}
# qemu_pkg: the Debian package with qemu-system-$arch; kernel: the file
# booted; machine: qemu's machine and CPU; console: the serial tty.
# x86_64, acpi=off: qemu then announces the virtio-mmio devices on the
# kernel command line (virtio_mmio.device=...), which is how our kernel
# finds them. aarch64: the device tree qemu generates describes them.
# vhost-user needs guest RAM in shared memory (memory-backend=mem: memfd,
# share=on).
case "$arch" in
  x86_64)
    qemu_pkg=qemu-system-x86 kernel=bzImage console=ttyS0
    machine=(-M "microvm,acpi=off,memory-backend=mem")
    cmdline="console=$console reboot=k panic=-1"
    ;;
  aarch64)
    qemu_pkg=qemu-system-arm kernel=Image console=ttyAMA0
    machine=(-M "virt,gic-version=3,memory-backend=mem" -cpu cortex-a72 -nic none)
    cmdline="console=$console panic=-1"
    ;;
  *) echo "usage: $0 x86_64|aarch64" >&2; exit 2 ;;
esac
qemu=qemu-system-$arch

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${BOXDESK_CACHE:-/var/cache/boxdesk}
images=$root/target/images/$arch
timeout=${CHECK_TIMEOUT:-120}
host_target=${BOXDESK_IMAGES_TARGET_DIR:-$cache/images/host-target}
start=$EPOCHREALTIME

say() { echo "check-qemu: $*"; }
die() { echo "check-qemu: $*" >&2; exit 1; }
as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}
# Seconds since $1 (an $EPOCHREALTIME), one decimal.
since() {
  local now=${EPOCHREALTIME/./} then=${1/./}
  local ds=$(((now - then) / 100000))
  echo "$((ds / 10)).$((ds % 10))"
}

for f in "$kernel" initramfs.cpio.gz; do
  [ -f "$images/$f" ] || die "$images/$f is missing: run images/build.sh $arch first"
done

# --- tools ------------------------------------------------------------------
if ! command -v "$qemu" >/dev/null; then
  say "apt-get install $qemu_pkg"
  if ! as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$qemu_pkg" >/dev/null; then
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$qemu_pkg" >/dev/null
  fi
fi
vhu=$(command -v vhost-device-vsock || echo "$cache/tools/bin/vhost-device-vsock")
if [ ! -x "$vhu" ]; then
  say "cargo install vhost-device-vsock --root $cache/tools"
  cargo install -q vhost-device-vsock --locked --root "$cache/tools"
fi
say "building agch (target dir $host_target)"
cargo build -q --manifest-path "$root/Cargo.toml" -p boxdesk-channel --example agch \
  --target-dir "$host_target"
agch=$host_target/debug/examples/agch
[ -x "$agch" ] || die "$agch was not built"

# --- boot -------------------------------------------------------------------
dir=$(mktemp -d "${TMPDIR:-/tmp}/boxdesk-check-qemu.XXXXXX")
console_log=$dir/console.log
vhu_pid=
qemu_pid=
cleanup() {
  [ -z "$qemu_pid" ] || kill "$qemu_pid" 2>/dev/null || true
  [ -z "$vhu_pid" ] || kill "$vhu_pid" 2>/dev/null || true
  wait 2>/dev/null || true
  [ -z "${CHECK_CONSOLE:-}" ] || cp "$console_log" "$CHECK_CONSOLE" 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
fail() {
  echo "check-qemu: FAILED: $*" >&2
  echo "---- serial console ($arch, $(since "$start") s) ----" >&2
  cat "$console_log" >&2 2>/dev/null || true
  echo "---- vhost-device-vsock ----" >&2
  cat "$dir/vhu.log" >&2 2>/dev/null || true
  exit 1
}

"$vhu" --guest-cid 3 --socket "$dir/vhu.sock" --uds-path "$dir/vm.vsock" >"$dir/vhu.log" 2>&1 &
vhu_pid=$!
for _ in $(seq 50); do
  [ -S "$dir/vhu.sock" ] && break
  sleep 0.1
done
[ -S "$dir/vhu.sock" ] || fail "vhost-device-vsock did not create its socket"

say "booting $images/$kernel under $qemu -accel tcg ${machine[*]} (console $console)"
boot=$EPOCHREALTIME
"$qemu" -accel tcg "${machine[@]}" \
  -object memory-backend-memfd,id=mem,size=512M,share=on -m 512M -smp 1 \
  -display none -monitor none -serial "file:$console_log" -no-reboot \
  -chardev socket,id=c0,path="$dir/vhu.sock" -device vhost-user-vsock-device,chardev=c0 \
  -kernel "$images/$kernel" -initrd "$images/initramfs.cpio.gz" \
  -append "$cmdline" >"$dir/qemu.log" 2>&1 &
qemu_pid=$!

deadline=$((SECONDS + timeout))
ready=
while [ "$SECONDS" -lt "$deadline" ]; do
  if ! kill -0 "$qemu_pid" 2>/dev/null; then
    cat "$dir/qemu.log" >&2
    fail "qemu exited before the agent answered"
  fi
  # Readiness: a connection through the hybrid socket that gets an exec done.
  if [ -S "$dir/vm.vsock" ] && timeout 10 "$agch" "hybrid:$dir/vm.vsock" true >/dev/null 2>&1; then
    ready=$(since "$boot")
    break
  fi
  sleep 0.5
done
[ -n "$ready" ] || fail "the agent did not answer on vsock port 1024 within ${timeout} s"
say "agent answered after $ready s"

left=$((deadline - SECONDS))
[ "$left" -gt 0 ] || left=1
set +e
got=$(timeout "$left" "$agch" "hybrid:$dir/vm.vsock" uname -m 2>"$dir/agch.err")
status=$?
set -e
if [ "$status" -ne 0 ] || [ "$got" != "$arch" ]; then
  cat "$dir/agch.err" >&2
  fail "uname -m: status $status, output '$got' (want status 0, '$arch')"
fi
say "uname -m -> $got (status 0)"
echo "image check: ok (agent ready after $ready s under TCG)"
