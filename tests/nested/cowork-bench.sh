#!/usr/bin/env bash
# Cowork on a VM against cowork on namespaces, inside an L1 (real KVM under
# qemu TCG):
#   tests/nested/cowork-bench.sh [x86_64|aarch64]
# Runs benches/cowork_bench.rs with BOXDESK_BENCH_BACKENDS (startVM →
# isGuestConnected, spawn `true` → exit p50, 64 MiB of stdout through
# events, the server's RSS outside guest RAM; ratios printed) in one L1 run.
#
# x86_64: both backends, on the build machine's own Debian as the root
# (read-only over 9p, a tmpfs /tmp, switched to as switch_root does):
# bubblewrap is there for the namespace backend, and the VM's root is that
# same system (`--root host`).
# aarch64: the VM only (that L1 cannot run the host's x86_64 system, so it
# has no bubblewrap); the VM's root is the L1's busybox system.
# Under TCG the absolute figures are meaningless; the ratios are what to
# read. Prints, asserts nothing.
#
# Needs: the image (images/build.sh ARCH).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd -P)
arch=${1:-x86_64}
img=$root/target/images/$arch
[ -f "$img/initramfs.cpio.gz" ] || { echo "cowork-bench: no image at $img (images/build.sh $arch)" >&2; exit 2; }

built=$(bash "$here/cargo-test.sh" "$arch" --no-run -p boxdesk --bench cowork_bench)
bench=$(awk '$2 ~ /cowork_bench-/ { print $2 }' <<<"$built" | head -1)
bin=$(awk '$1 == "bin" && $2 ~ /\/boxdesk$/ { print $2 }' <<<"$built" | head -1)
[ -n "$bench" ] && [ -n "$bin" ] || { echo "cowork-bench: not built: $built" >&2; exit 2; }

case "$arch" in
  x86_64)
    # shellcheck source=host-root.sh
    . "$here/host-root.sh"
    script="$(host_root_exec) BOXDESK_BIN=$bin BOXDESK_IMAGE_DIR=$img \
  BOXDESK_BENCH_BACKENDS=namespace,kvm $bench"
    ;;
  aarch64)
    read -r -d '' script <<EOF || true
set -e
mkdir -p -m 700 /tmp/rt
export HOME=/tmp XDG_RUNTIME_DIR=/tmp/rt BOXDESK_BIN=/run/host$bin BOXDESK_IMAGE_DIR=/run/host$img
BOXDESK_BENCH_BACKENDS=kvm /run/host$bench
EOF
    ;;
  *) echo "usage: $0 [x86_64|aarch64]" >&2; exit 2 ;;
esac
bash "$here/run.sh" "$arch" --hostroot --mem 3072 --timeout 1500 -- /bin/sh -c "$script"
