#!/usr/bin/env bash
# boxdesk as the OCI runtime of real engines, as root: Debian's podman
# (through conmon) and containerd (ctr, the runc v2 shim with its runc
# binary pointed at boxdesk), on an image imported from a rootfs tarball
# built here (Debian's static busybox; no registry). Then the benchmark:
# `podman run --rm IMG true` with boxdesk and with runc, alternating, the
# medians and their ratio.
#
#   bash tests/oci/engines.sh [BOXDESK_BINARY] [ROUNDS]
#
# BOXDESK_BINARY defaults to target/debug/boxdesk (which runs containers
# with the guest image's static agent); the benchmark wants a static
# release build (target/static/<arch>/boxdesk, images/build-agent.sh ARCH
# boxdesk). Prints `skipped: …` and exits 0 where it cannot run (not root,
# no podman).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=$(realpath "${1:-$root/target/debug/boxdesk}")
rounds=${2:-10}
if [ "$(id -u)" -ne 0 ]; then
  echo "skipped: the engines run rootful here (run as root)"; exit 0
fi
for tool in podman ctr containerd runc; do
  command -v "$tool" >/dev/null || { echo "skipped: $tool is not installed (scripts/setup.sh installs it)"; exit 0; }
done

work=$(mktemp -d /tmp/boxdesk-engines.XXXXXX)
ctrd_pid=
cleanup() {
  podman rm -af >/dev/null 2>&1 || true
  [ -n "$ctrd_pid" ] && kill "$ctrd_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
pass() { echo "ok: $*"; }

# The runtime binary under the name engines start it by.
ln -s "$bin" "$work/boxdesk-oci"
rt="$work/boxdesk-oci"
# This machine's hard open-file limit is below podman's default: runc
# needs the same flags.
lim=(--ulimit "nofile=1024:1024" --ulimit "nproc=1024:1024")
podman_run() { podman --runtime "$rt" run --network none "${lim[@]}" "$@"; }

# --- the image ----------------------------------------------------------
mkdir -p "$work/rootfs"/{bin,etc,proc,sys,dev,tmp,root,run}
cp "$(readlink -f /bin/busybox)" "$work/rootfs/bin/busybox"
for a in $("$work/rootfs/bin/busybox" --list); do
  [ "$a" = busybox ] || ln -s busybox "$work/rootfs/bin/$a"
done
tar -C "$work/rootfs" -cf "$work/rootfs.tar" .
img=localhost/boxdesk-oci-test:latest
podman rmi -f "$img" >/dev/null 2>&1 || true
podman import -q "$work/rootfs.tar" "$img" >/dev/null

# --- podman ---------------------------------------------------------------
out=$(podman_run --rm "$img" sh -c 'echo hi; exit 3') && rc=0 || rc=$?
[ "$out" = hi ] && [ "$rc" = 3 ] || fail "podman run: printed '$out', exit $rc (want hi, 3)"
pass "podman run --rm IMG sh -c 'echo hi; exit 3' printed hi and exited 3"

# podman's own network (netavark's bridge): the container joins the
# network namespace podman made, by path.
out=$(podman --runtime "$rt" run --rm "${lim[@]}" "$img" ip -4 addr show eth0 2>&1) ||
  fail "podman run on podman's bridge network: $out"
echo "$out" | grep -q 'inet 10\.' || fail "no address on podman's bridge: $out"
pass "podman run on podman's default network: joins its namespace ($(echo "$out" | grep -o 'inet [0-9./]*'))"

id=$(podman_run -d --name bx-detached "$img" sh -c 'echo up; sleep 300')
podman --runtime "$rt" ps --format '{{.Names}} {{.Status}}' | grep -q '^bx-detached Up' ||
  fail "podman ps does not show the running container"
pass "podman ps shows it running"
out=$(podman --runtime "$rt" exec bx-detached sh -c 'echo in-exec; exit 4') && rc=0 || rc=$?
[ "$out" = in-exec ] && [ "$rc" = 4 ] || fail "podman exec: '$out', exit $rc"
pass "podman exec printed and exited 4"
echo piped | podman --runtime "$rt" exec -i bx-detached cat | grep -qx piped || fail "podman exec -i: stdin"
pass "podman exec -i carries stdin"
podman --runtime "$rt" exec -d bx-detached sh -c 'echo detached > /dev/shm/d' >/dev/null
for _ in $(seq 50); do podman --runtime "$rt" exec bx-detached cat /dev/shm/d 2>/dev/null | grep -q detached && break; sleep 0.1; done
podman --runtime "$rt" exec bx-detached cat /dev/shm/d | grep -qx detached || fail "podman exec -d did not run"
pass "podman exec -d runs in a monitor of its own"
out=$(podman --runtime "$rt" run --rm --network container:bx-detached "${lim[@]}" "$img" cat /proc/net/dev) ||
  fail "podman run --network container:: $out"
mine=$(podman --runtime "$rt" exec bx-detached cat /proc/net/dev)
[ "$(echo "$out" | cut -d: -f1 | sort)" = "$(echo "$mine" | cut -d: -f1 | sort)" ] ||
  fail "--network container: is another network namespace"
pass "podman run --network container:X joins X's sandbox's network namespace"
podman --runtime "$rt" stop -t 5 bx-detached >/dev/null
[ "$(podman --runtime "$rt" inspect bx-detached --format '{{.State.Status}}')" = exited ] ||
  fail "podman stop: not exited"
podman --runtime "$rt" rm bx-detached >/dev/null
[ ! -e "/run/boxdesk-oci/$id" ] || fail "podman rm left /run/boxdesk-oci/$id"
left() { ls /run/boxdesk-oci/.run/boxdesk /run/boxdesk-oci/.state/boxdesk 2>/dev/null | grep -- "-${1:0:12}" || true; }
[ -z "$(left "$id")" ] || fail "podman rm left $(left "$id")"
pass "podman run -d / stop / rm, nothing left behind"

# A process that ignores SIGTERM is killed after the grace, and cleaned up.
id=$(podman_run -d --name bx-stubborn "$img" sh -c 'trap "" TERM; while true; do sleep 0.2; done')
podman --runtime "$rt" stop -t 1 bx-stubborn >/dev/null 2>&1
code=$(podman --runtime "$rt" inspect bx-stubborn --format '{{.State.ExitCode}}')
[ "$code" = 137 ] || fail "podman stop of a TERM-ignoring process: exit $code, want 137"
podman --runtime "$rt" rm bx-stubborn >/dev/null
[ -z "$(left "$id")" ] || fail "a killed container left $(left "$id")"
pass "podman stop of a process ignoring SIGTERM: SIGKILL after the grace (137), nothing left"

# -it: a terminal through the console socket.
out=$(script -qec "podman --runtime $rt run --rm -it --network none ${lim[*]} $img sh -c 'tty; stty size'" /dev/null </dev/null | tr -d '\r' | sed 's/\^@//g')
echo "$out" | grep -q '/dev/pts/' || fail "podman run -it: no terminal: $out"
pass "podman run -it: the process has a terminal ($(echo "$out" | head -1), $(echo "$out" | sed -n 2p))"

# A memory limit is enforced: a process holding 200 MiB under 32 MiB dies.
# Either the shell goes on and says so, or (cgroup v1 may kill again after
# the biggest process: the agent is the next biggest) the whole container
# ends as OOM-killed, 137, and the runtime says why; never a runtime error.
rc=0
out=$(podman_run --rm --memory 32m "$img" sh -c 'head -c 200000000 /dev/zero | tail >/dev/null; echo "status $?"' 2>"$work/oom.err") || rc=$?
if [ "$out" != "status 137" ] && ! { [ "$rc" = 137 ] && grep -q 'out-of-memory killer' "$work/oom.err"; }; then
  # Which processes the kernel killed, for the report.
  dmesg 2>/dev/null | grep -E 'invoked oom-killer|Killed process' | tail -n 6 >&2 || true
  cat "$work/oom.err" >&2
  fail "--memory 32m: printed '$out', exit $rc (want the memory hog killed: status 137)"
fi
pass "podman run --memory 32m: a 200 MB process is OOM-killed (${out:-the container OOM-killed, exit $rc})"

# --- containerd -----------------------------------------------------------
ctrd=$work/containerd
mkdir -p "$ctrd"
containerd --root "$ctrd/root" --state "$ctrd/state" --address "$ctrd/sock" >"$ctrd/log" 2>&1 &
ctrd_pid=$!
for _ in $(seq 100); do [ -S "$ctrd/sock" ] && break; sleep 0.1; done
ctr=(ctr -a "$ctrd/sock")
podman save -q --format oci-archive -o "$work/img.oci" "$img"
"${ctr[@]}" images import --base-name localhost/boxdesk-oci-test "$work/img.oci" >/dev/null 2>&1
cimg=localhost/boxdesk-oci-test:latest
crt=(--runtime io.containerd.runc.v2 --runc-binary "$rt")
out=$("${ctr[@]}" run --rm "${crt[@]}" "$cimg" c1 sh -c 'echo hi; exit 3') && rc=0 || rc=$?
[ "$out" = hi ] && [ "$rc" = 3 ] || fail "ctr run: printed '$out', exit $rc"
pass "ctr run --runtime io.containerd.runc.v2 (runc binary: boxdesk) printed hi and exited 3"
"${ctr[@]}" run -d "${crt[@]}" "$cimg" c2 sleep 300 >/dev/null
out=$("${ctr[@]}" task exec --exec-id e1 c2 sh -c 'echo in-exec; exit 5') && rc=0 || rc=$?
[ "$out" = in-exec ] && [ "$rc" = 5 ] || fail "ctr task exec: '$out', exit $rc"
"${ctr[@]}" task kill c2
for _ in $(seq 100); do "${ctr[@]}" task ls | grep -q 'c2.*STOPPED' && break; sleep 0.1; done
"${ctr[@]}" task rm c2 >/dev/null
"${ctr[@]}" containers rm c2
pass "ctr run -d / task exec (exit 5) / kill / rm"

# --- benchmark ------------------------------------------------------------
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
runc_ms=() bx_ms=()
for _ in $(seq "$rounds"); do
  for which in runc boxdesk; do
    r=$rt; [ $which = runc ] && r=runc
    t0=$(date +%s%N)
    podman --runtime "$r" run --rm --network none "${lim[@]}" "$img" true
    t1=$(date +%s%N)
    ms=$(( (t1 - t0) / 1000000 ))
    if [ $which = runc ]; then runc_ms+=("$ms"); else bx_ms+=("$ms"); fi
  done
done
r=$(printf '%s\n' "${runc_ms[@]}" | median)
b=$(printf '%s\n' "${bx_ms[@]}" | median)
echo "bench: podman run --rm IMG true, $rounds rounds alternating, binary $bin:"
echo "bench:   runc    p50 ${r} ms  (${runc_ms[*]})"
echo "bench:   boxdesk p50 ${b} ms  (${bx_ms[*]})"
echo "bench:   boxdesk/runc = $(awk -v b="$b" -v r="$r" 'BEGIN {printf "%.2f", b / r}')"
echo "engines: all passed"
