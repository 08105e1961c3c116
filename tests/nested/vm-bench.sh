#!/usr/bin/env bash
# Boot figures of boxdesk's VMM inside an L1 (real KVM under qemu TCG):
#   tests/nested/vm-bench.sh [x86_64|aarch64] [RUNS]
# Plain boots, then boots with `--root host` (what mounting the host's
# system over virtio-fs and switching root costs), in the same L1.
# x86_64: beside qemu's own boot of the same image in the same L1 (the
# host's qemu, run through /host). aarch64: ours only — L1 there cannot run
# the host's x86_64 qemu. Under TCG absolute times are meaningless (every
# L2 instruction is emulated); the ratio to qemu and the RSS overhead
# (which does not depend on CPU speed) are what to read. Prints, asserts
# nothing.
#
# Needs: the image (images/build.sh ARCH) and a static boxdesk
# (images/build-agent.sh ARCH boxdesk → target/static/ARCH/boxdesk).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd -P)
arch=x86_64
case "${1:-}" in x86_64 | aarch64) arch=$1; shift ;; esac
runs=${1:-3}
img=$root/target/images/$arch
bin=$root/target/static/$arch/boxdesk
case "$arch" in
  x86_64) kernel=$img/vmlinux baseline=1 ;;
  aarch64) kernel=$img/Image baseline=0 ;;
esac
for f in "$kernel" "$img/initramfs.cpio.gz" "$bin"; do
  [ -f "$f" ] || { echo "vm-bench: missing $f" >&2; exit 2; }
done

# Runs in L1 (busybox sh). Times from /proc/uptime (10 ms resolution: the
# boots take seconds here).
read -r -d '' script <<EOF || true
set -e
export XDG_RUNTIME_DIR=/tmp/rt HOME=/tmp/h BOXDESK_IMAGE_DIR=/run/host$img
mkdir -p -m 700 /tmp/rt /tmp/h
B=/run/host$bin
now() { cut -d' ' -f1 /proc/uptime | tr -d .; }
\$B bench boot --backend kvm --runs $runs
\$B bench boot --backend kvm --runs $runs --root host
\$B run --backend kvm -d --name b1 >/dev/null
t0=\$(now); \$B exec b1 -- head -c 67108864 /dev/zero | wc -c; t1=\$(now)
echo "ours: vsock guest->host 64 MiB in \$(( (t1 - t0) * 10 )) ms"
\$B stop b1
i=0
while [ $baseline = 1 ] && [ \$i -lt $runs ]; do
  rm -f /host/tmp/q.log
  t0=\$(now)
  chroot /host qemu-system-x86_64 -enable-kvm -M microvm -cpu host -smp 1 -m 512 -nodefaults -no-user-config -display none -no-reboot \
    -serial file:/tmp/q.log -kernel $kernel -initrd $img/initramfs.cpio.gz \
    -append "console=ttyS0 reboot=k panic=-1 quiet rdinit=/init" >/tmp/q.out 2>&1 &
  q=\$!
  n=0
  while ! grep -q "guest-agent ready" /host/tmp/q.log 2>/dev/null && kill -0 \$q 2>/dev/null && [ \$n -lt 3000 ]; do sleep 0.02; n=\$((n + 1)); done
  t1=\$(now)
  if grep -q "guest-agent ready" /host/tmp/q.log 2>/dev/null; then
    echo "qemu: start to agent ready: \$(( (t1 - t0) * 10 )) ms"
  else
    echo "qemu: no ready line; qemu said:"; cat /tmp/q.out; tail -5 /host/tmp/q.log 2>/dev/null
  fi
  kill \$q 2>/dev/null; wait \$q 2>/dev/null || true
  i=\$((i + 1))
done
EOF
bash "$here/run.sh" "$arch" --hostroot --timeout 1200 -- /bin/sh -c "$script"
