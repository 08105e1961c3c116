#!/usr/bin/env bash
# One nested VM stage: boxdesk's VM tests (tests/vm) and the cowork suite on
# the VM backend (tests/cowork, BOXDESK_TEST_BACKEND=kvm), built static and
# run in one L1 of ARCH, as CI runs them (scripts/test-nested.sh):
#
#   tests/nested/vm-stage.sh ARCH [--as-nobody] [-- TEST_ARGS...]
#
# Needs the image of images/build.sh ARCH (target/images/ARCH). Makes the
# small ext4 root file system the --rootfs test boots (the initramfs's files
# plus /marker). --as-nobody (x86_64) runs them as uid 65534 (cargo-test.sh).
# TEST_ARGS replace the default test filter (vm:: cowork::). Exit status:
# cargo-test.sh's (0, 101 a test failed, 124 deadline, 125 the harness
# failed, L1 frozen included).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
arch=${1:-}
case "$arch" in
  x86_64 | aarch64) shift ;;
  *) echo "usage: $0 x86_64|aarch64 [--as-nobody] [-- TEST_ARGS...]" >&2; exit 2 ;;
esac
nobody=()
if [ "${1:-}" = --as-nobody ]; then nobody=(--as-nobody); shift; fi
[ "${1:-}" != -- ] || shift
filter=("$@")
[ ${#filter[@]} -gt 0 ] || filter=(vm:: cowork::)

images=$root/target/images/$arch
if [ ! -f "$images/initramfs.cpio.gz" ]; then
  echo "vm-stage: no $arch image (bash images/build.sh $arch)" >&2
  exit 125
fi
rootfs=$images/test-rootfs.ext4
tree=$(mktemp -d)
(cd "$tree" && zcat "$images/initramfs.cpio.gz" | cpio -id --quiet)
echo boxdesk-rootfs >"$tree/marker"
rm -f "$rootfs"
/sbin/mke2fs -q -t ext4 -d "$tree" "$rootfs" 64M
rm -rf "$tree"

# The cowork suite's sandboxes in VMs; the image for cowork's static
# boxdesk, which lives outside the checkout.
timeout=2700
[ ${#nobody[@]} = 0 ] || timeout=2100
BOXDESK_TEST_BACKEND=kvm BOXDESK_IMAGE_DIR="$images" \
  exec bash tests/nested/cargo-test.sh "$arch" "${nobody[@]+"${nobody[@]}"}" --timeout "$timeout" --mem 3072 \
  -p boxdesk --test tests -- "${filter[@]}" --nocapture
