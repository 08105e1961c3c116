#!/usr/bin/env bash
# What the VM helper's jail costs, inside an L1 (real KVM under qemu TCG):
#   tests/nested/jail-bench.sh [x86_64|aarch64] [ROUNDS]
# In the same L1, alternating round by round: `boxdesk bench boot --runs 1`
# and 64 MiB guest → host over vsock (`exec head -c 64M /dev/zero`), once
# with the seccomp filters (the default), once with BOXDESK_SECCOMP=off
# (the helper's own view of the file system and the process steps only)
# and once with BOXDESK_JAIL=off (no jail at all). Prints every figure and each side's median;
# asserts nothing. Needs the image and a static boxdesk of ARCH.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd -P)
arch=x86_64
case "${1:-}" in x86_64 | aarch64) arch=$1; shift ;; esac
rounds=${1:-4}
img=$root/target/images/$arch
bin=$root/target/static/$arch/boxdesk
for f in "$img/initramfs.cpio.gz" "$bin"; do
  [ -f "$f" ] || { echo "jail-bench: missing $f" >&2; exit 2; }
done
read -r -d '' script <<EOF || true
set -e
export XDG_RUNTIME_DIR=/tmp/rt HOME=/tmp/h BOXDESK_IMAGE_DIR=/run/host$img
mkdir -p -m 700 /tmp/rt /tmp/h
B=/run/host$bin
now() { cut -d' ' -f1 /proc/uptime | tr -d .; }
one() { # label, then env assignments
  label=\$1; shift
  boot=\$(env "\$@" \$B bench boot --backend kvm --runs 1 2>&1 | sed -n 's/.*ready \([0-9.]*\) ms.*/\1/p' | head -1)
  env "\$@" \$B run --backend kvm -d --name jb >/dev/null
  t0=\$(now); \$B exec jb -- head -c 67108864 /dev/zero | wc -c >/dev/null; t1=\$(now)
  \$B stop jb >/dev/null
  echo "\$label boot_ms \$boot vsock_64MiB_ms \$(( (t1 - t0) * 10 ))"
}
i=0
while [ \$i -lt $rounds ]; do
  one filtered BOXDESK_X=1
  one unfiltered BOXDESK_SECCOMP=off
  one unjailed BOXDESK_JAIL=off
  i=\$((i + 1))
done
EOF
bash "$here/run.sh" "$arch" --hostroot --timeout 1800 -- /bin/sh -c "$script" | tee /tmp/jail-bench.$arch.out
for side in filtered unfiltered unjailed; do
  for field in boot_ms vsock_64MiB_ms; do
    med=$(awk -v s="$side" -v f="$field" '$1 == s { for (i = 2; i < NF; i++) if ($i == f) print $(i+1) }' "/tmp/jail-bench.$arch.out" | sort -n | awk '{ a[NR] = $1 } END { if (NR) print a[int((NR + 1) / 2)] }')
    echo "median $side $field: ${med:-?}"
  done
done
