#!/usr/bin/env bash
# Which system calls each thread of a VM helper makes, inside the x86_64 L1
# (real KVM): the helper runs unfiltered (BOXDESK_SECCOMP=off) under the
# host's strace (through chroot /host) through boots, execs, copies both
# ways, a virtio-fs share, a display and its screenshot, a --rootfs disk,
# --root host, stop, a guest reboot and a guest panic; the output is one
# line per thread kind with the calls it made. This is how the allowlists
# of vmm/src/jail/allow.rs were found (then read against the code):
#   tests/nested/jail-trace.sh
# Needs: strace on the host, the x86_64 image and static boxdesk.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd -P)
img=$root/target/images/x86_64
bin=$root/target/static/x86_64/boxdesk
command -v strace >/dev/null || { echo "jail-trace: no strace on the host" >&2; exit 2; }
read -r -d '' script <<EOF || true
set -e
export XDG_RUNTIME_DIR=/tmp/rt HOME=/tmp/h BOXDESK_IMAGE_DIR=$img BOXDESK_SECCOMP=off
mkdir -p -m 700 /tmp/rt /tmp/h /tmp/sh
echo in > /tmp/sh/in
B=$bin
T="strace -f -qq -e signal=none -o"
# strace waits for every process it traces: the detached helper too, so
# it runs in the background until the helper ends at stop.
\$T /tmp/st.1 \$B run --backend kvm -d --name t1 --share /tmp/sh:/mnt/d --display=320x200 >/dev/null &
n=0
until \$B exec t1 -- true 2>/dev/null; do sleep 1; n=\$((n + 1)); [ \$n -lt 600 ] || { echo "t1 never came up"; exit 1; }; done
\$B exec t1 -- sh -c 'cat /mnt/d/in; for i in 1 2 3 4 5 6 7 8; do echo \$i > /mnt/d/f\$i; done; ln /mnt/d/f1 /mnt/d/l1; mv /mnt/d/f2 /mnt/d/f3; rm /mnt/d/f4; mkdir /mnt/d/d; ls -la /mnt/d >/dev/null; chmod 600 /mnt/d/f5; touch -d 2020-01-01 /mnt/d/f6; truncate -s 100 /mnt/d/f7; df /mnt/d >/dev/null; sync'
head -c 4194304 /dev/urandom > /tmp/big
\$B cp /tmp/big t1:/tmp/big
\$B cp t1:/tmp/big /tmp/back
\$B exec t1 -- head -c 8388608 /dev/zero | wc -c
\$B screenshot t1 /tmp/shot.png
\$B stop t1
wait
\$T /tmp/st.2 \$B run --backend kvm --root host -- sh -c 'ls /usr/bin >/dev/null; echo x > /work/x'
\$T /tmp/st.3 \$B run --backend kvm -- reboot -f || true
\$T /tmp/st.4 \$B run --backend kvm -- sh -c 'echo c > /proc/sysrq-trigger' || true
truncate -s 16M /tmp/disk.img && mkfs.ext4 -q /tmp/disk.img 2>/dev/null || true
\$T /tmp/st.5 \$B run --backend kvm --rootfs /tmp/disk.img --rootfs-rw -- sh -c 'echo y > /y; sync' || true
cat /tmp/st.* | awk '
  / prctl\(PR_SET_NAME, "/ { n = \$0; sub(/.*PR_SET_NAME, "/, "", n); sub(/".*/, "", n); name[\$1] = n }
  { pid = \$1; s = \$2; sub(/\(.*/, "", s); if (s ~ /^[a-z_0-9]+\$/) calls[pid] = calls[pid] " " s }
  END {
    for (p in calls) {
      k = (p in name) ? name[p] : "main";
      gsub(/[0-9]+\$/, "", k); gsub(/-[0-9]+\$/, "", k);
      nc = split(calls[p], a, " ");
      for (i = 1; i <= nc; i++) seen[k " " a[i]] = 1
    }
    for (x in seen) print x
  }' | sort | awk '{ if (\$1 != last) { if (last != "") print line; line = \$1 ":"; last = \$1 } line = line " " \$2 } END { print line }'
EOF
bash "$here/run.sh" x86_64 --hostroot --timeout 1500 -- chroot /host /bin/sh -c "$script"
