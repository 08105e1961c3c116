#!/usr/bin/env bash
# File-sharing figures inside an L1 (real KVM under qemu TCG):
#   tests/nested/fs-bench.sh [x86_64|aarch64] [MIB] [FILES]
# One workload (sequential write and read of MIB MiB with dd and 1 MiB
# buffers, FILES small files
# created then stat'ed by `ls -l`) run four ways in the same L1 run:
#   native  — on the L1's own file system (its tmpfs /tmp);
#   boxdesk — in a boxdesk VM, through `run --share` (our virtio-fs,
#             through its DAX window);
#   nodax   — the same with BOXDESK_DAX=off (no window: every byte
#             through requests), same build, same L1 run;
#   guest   — in the same VM on its own tmpfs: what nested TCG costs the
#             L2 without any file server, so boxdesk/guest is virtio-fs's
#             own share of the gap to native;
#   qemu    — x86_64 only: qemu -M microvm booting the same image with the
#             host's virtiofsd (Debian's qemu 7.2 ships it) on the same
#             directory. aarch64: not run — that L1 cannot run the host's
#             x86_64 qemu.
# Each runs the workload twice and times the second pass (the first warms
# up the guest's memory and page cache). Timed inside each guest from
# /proc/uptime (10 ms resolution). Under
# TCG the absolute figures are meaningless; the ratios are what to read.
# Prints, asserts nothing.
#
# Needs: the image (images/build.sh ARCH) and a static boxdesk
# (images/build-agent.sh ARCH boxdesk → target/static/ARCH/boxdesk).
# BOXDESK_BASELINE_BIN=<another static boxdesk> adds a `baseline` row: the
# same VM work with that build, in the same L1 run (before/after a change).
# FS_BENCH_QEMU=0 skips the qemu row. FS_BENCH_SMP=N gives the L1 N vCPUs
# (default 1, as the test harness runs it; 2 measured the same).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd -P)
arch=x86_64
case "${1:-}" in x86_64 | aarch64) arch=$1; shift ;; esac
mib=${1:-16}
files=${2:-100}
img=$root/target/images/$arch
bin=$root/target/static/$arch/boxdesk
case "$arch" in
  x86_64) kernel=$img/vmlinux baseline=1 ;;
  aarch64) kernel=$img/Image baseline=0 ;;
esac
base_bin=${BOXDESK_BASELINE_BIN:-}
[ "${FS_BENCH_QEMU:-1}" = 0 ] && baseline=0
for f in "$kernel" "$img/initramfs.cpio.gz" "$bin" ${base_bin:+"$base_bin"}; do
  [ -f "$f" ] || { echo "fs-bench: missing $f" >&2; exit 2; }
done
virtiofsd=/usr/lib/qemu/virtiofsd
if [ "$baseline" = 1 ] && [ ! -x "$virtiofsd" ]; then
  echo "fs-bench: no $virtiofsd on this host (Debian's qemu-system-common): qemu baseline skipped"
  baseline=0
fi

# The workload, busybox sh: DIR MIB FILES → one line of milliseconds.
read -r -d '' work <<'EOF' || true
D=$1 MIB=$2 FILES=$3
ms() { read -r up _ < /proc/uptime; f=${up#*.}; echo $(( ${up%.*} * 1000 + 10 * (1$f - 100) )); }
one() {
  t0=$(ms); dd if=/dev/zero of="$D/big" bs=1M count="$MIB" conv=fsync 2>"$D.dd" || { echo "fs-bench: write failed: $(cat "$D.dd")"; exit 1; }; t1=$(ms)
  [ "$(wc -c < "$D/big")" = $((MIB * 1048576)) ] || { echo "fs-bench: $D/big is short"; exit 1; }
  echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
  # Read into a buffer, as the write writes from one: `cat` to /dev/null
  # would be a splice, which on the L1's tmpfs moves no bytes at all.
  t2=$(ms); dd if="$D/big" of=/dev/null bs=1M 2>/dev/null; t3=$(ms)
  mkdir "$D/small"; t4=$(ms)
  i=0; while [ $i -lt "$FILES" ]; do : > "$D/small/f$i"; i=$((i + 1)); done
  ls -l "$D/small" > /dev/null; t5=$(ms)
  rm -rf "$D/big" "$D/small"
}
# A first pass warms up what is not the file system's (the guest's page
# cache pages faulted in for the first time, the first exec of dd); the
# second is measured.
one; one
echo "fs-bench: write_ms=$((t1 - t0)) read_ms=$((t3 - t2)) small_ms=$((t5 - t4))"
EOF

# The qemu guest's init: the same workload over its virtio-fs, then off.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/cpio"
{
  echo '#!/bin/sh'
  echo 'mount -t devtmpfs dev /dev; mount -t proc proc /proc; mount -t sysfs sys /sys; mkdir -p /mnt/q'
  echo 'mount -t virtiofs q /mnt/q || echo "fs-bench: qemu guest: no virtio-fs"'
  echo "sh /mnt/q/work.sh /mnt/q $mib $files"
  echo 'echo fs-bench-qemu-done; reboot -f'
} > "$tmp/cpio/fsbench"
chmod 755 "$tmp/cpio/fsbench"
(cd "$tmp/cpio" && echo fsbench | cpio -o -H newc --quiet | gzip -n) > "$tmp/extra.cpio.gz"
cat "$img/initramfs.cpio.gz" "$tmp/extra.cpio.gz" > "$tmp/qemu-initrd.cpio.gz"
printf '%s\n' "$work" > "$tmp/work.sh"

read -r -d '' script <<EOF || true
set -e
export XDG_RUNTIME_DIR=/tmp/rt HOME=/tmp/h BOXDESK_IMAGE_DIR=/run/host$img
mkdir -p -m 700 /tmp/rt /tmp/h
# qemu and virtiofsd run under chroot /host, which shares L1's /dev (not
# its /tmp): their directory, socket, initrd and serial log live in L1's
# devtmpfs.
mkdir -p /tmp/native /tmp/share /dev/boxdesk-qshare
cp /run/host$tmp/work.sh /tmp/work.sh
cp /tmp/work.sh /tmp/share/work.sh
cp /tmp/work.sh /dev/boxdesk-qshare/work.sh
cp /run/host$tmp/qemu-initrd.cpio.gz /dev/boxdesk-q.initrd
B=/run/host$bin
echo "native: \$(sh /tmp/work.sh /tmp/native $mib $files)"
\$B run --backend kvm -d --name fb --mem 1024 --share /tmp/share:/mnt/b >/dev/null
echo "boot with a DAX window: \$(\$B info fb | grep boot_ms)"
echo "boxdesk: \$(\$B exec fb -- sh /mnt/b/work.sh /mnt/b $mib $files)"
echo "guest: \$(\$B exec fb -- sh -c "mkdir -p /tmp/g && sh /mnt/b/work.sh /tmp/g $mib $files")"
\$B stop fb || true
BOXDESK_DAX=off \$B run --backend kvm -d --name fn --mem 1024 --share /tmp/share:/mnt/b >/dev/null
echo "boot without: \$(\$B info fn | grep boot_ms)"
echo "nodax: \$(\$B exec fn -- sh /mnt/b/work.sh /mnt/b $mib $files)"
\$B stop fn || true
if [ -n "$base_bin" ]; then
  O=/run/host$base_bin
  \$O run --backend kvm -d --name fo --mem 1024 --share /tmp/share:/mnt/b >/dev/null
  echo "baseline: \$(\$O exec fo -- sh /mnt/b/work.sh /mnt/b $mib $files)"
  \$O stop fo || true
fi
if [ $baseline = 1 ]; then
  chroot /host $virtiofsd --socket-path=/dev/boxdesk-vfsd.sock -o source=/dev/boxdesk-qshare -o cache=auto >/tmp/vfsd.log 2>&1 &
  v=\$!
  # virtiofsd starts slowly under nested TCG: up to 5 minutes for its socket.
  n=0; while [ ! -S /dev/boxdesk-vfsd.sock ] && kill -0 \$v 2>/dev/null && [ \$n -lt 3000 ]; do sleep 0.1; n=\$((n + 1)); done
  echo "qemu: virtiofsd socket after \$((n / 10)) s"; cat /tmp/vfsd.log || true
  chroot /host qemu-system-x86_64 -enable-kvm -M microvm,acpi=off,memory-backend=mem -cpu host -smp 1 -m 1024 \
    -object memory-backend-memfd,id=mem,size=1024M,share=on \
    -chardev socket,id=vfs,path=/dev/boxdesk-vfsd.sock -device vhost-user-fs-device,chardev=vfs,tag=q \
    -global virtio-mmio.force-legacy=false \
    -nodefaults -no-user-config -display none -no-reboot -serial file:/dev/boxdesk-q.log \
    -kernel $kernel -initrd /dev/boxdesk-q.initrd \
    -append "console=ttyS0 reboot=k panic=-1 quiet rdinit=/fsbench" >/tmp/q.out 2>&1 &
  q=\$!
  n=0
  while ! grep -q fs-bench-qemu-done /dev/boxdesk-q.log 2>/dev/null && kill -0 \$q 2>/dev/null && [ \$n -lt 30000 ]; do sleep 0.02; n=\$((n + 1)); done
  kill \$q 2>/dev/null || true
  wait \$q 2>/dev/null || true
  if grep -q "fs-bench: write_ms" /dev/boxdesk-q.log; then
    echo "qemu: \$(grep 'fs-bench: write_ms' /dev/boxdesk-q.log | tr -d '\r')"
  else
    echo "qemu: no result; qemu said:"; cat /tmp/q.out; grep 'fs-bench' /dev/boxdesk-q.log; tail -5 /dev/boxdesk-q.log 2>/dev/null || true; cat /tmp/vfsd.log
  fi
fi
EOF
bash "$here/run.sh" "$arch" --hostroot --smp "${FS_BENCH_SMP:-1}" --timeout 1500 -- /bin/sh -c "$script" | tee "$tmp/out" || true

# The ratios, from the three lines.
python3 - "$tmp/out" "$mib" "$files" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
mib, files = int(sys.argv[2]), int(sys.argv[3])
rows = {}
for who in ("native", "guest", "boxdesk", "nodax", "baseline", "qemu"):
    m = re.search(who + r": fs-bench: write_ms=(\d+) read_ms=(\d+) small_ms=(\d+)", text)
    if m:
        w, r, s = (max(int(x), 10) for x in m.groups())
        rows[who] = (mib * 1000 / w, mib * 1000 / r, files * 1000 / s)
names = ("seq write MB/s", "seq read MB/s", "small create+stat ops/s")
for i, name in enumerate(names):
    line = f"{name}: " + ", ".join(f"{who} {v[i]:.1f}" for who, v in rows.items())
    if "native" in rows and "boxdesk" in rows:
        line += f"; boxdesk/native {rows['boxdesk'][i] / rows['native'][i]:.2f}"
    if "guest" in rows and "boxdesk" in rows:
        line += f"; boxdesk/guest-tmpfs {rows['boxdesk'][i] / rows['guest'][i]:.2f}"
    if "nodax" in rows and "boxdesk" in rows:
        line += f"; boxdesk/nodax {rows['boxdesk'][i] / rows['nodax'][i]:.2f}"
    if "nodax" in rows and "native" in rows:
        line += f"; nodax/native {rows['nodax'][i] / rows['native'][i]:.2f}"
    if "baseline" in rows and "boxdesk" in rows:
        line += f"; boxdesk/baseline {rows['boxdesk'][i] / rows['baseline'][i]:.2f}"
    if "qemu" in rows and "boxdesk" in rows:
        line += f"; boxdesk/qemu+virtiofsd {rows['boxdesk'][i] / rows['qemu'][i]:.2f}"
    print(line)
PY
