# Sourced by the nested scripts that run the build machine's own Debian
# inside an x86_64 L1 (run.sh --hostroot shares it read-only at /run/host).
# host_root_exec prints the L1 shell lines that make it the root, then exec
# `env -i` with a plain PATH, HOME and TMPDIR /tmp and XDG_RUNTIME_DIR
# /tmp/rt; the caller appends its own variables and command to that line.
#
# /tmp is a fresh tmpfs; /dev, /proc and /sys are the L1's. bubblewrap makes
# its namespaces as the subordinate id root drops to, so user namespaces are
# allowed. The root is moved over / and then chrooted into, as switch_root
# does: the kernel refuses user namespaces to a process whose root is not
# its mount namespace's, which a plain chroot would be.
host_root_exec() {
  cat <<'SH'
set -e
R=/run/host
mount -t tmpfs tmpfs $R/tmp
for d in dev proc sys; do mount --rbind /$d $R/$d; done
mkdir -p -m 700 $R/tmp/rt
echo 10000 >/proc/sys/user/max_user_namespaces
mount --make-rprivate /
cd $R
mount --move . /
SH
  printf '%s' 'exec chroot . env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/tmp TMPDIR=/tmp XDG_RUNTIME_DIR=/tmp/rt'
}
