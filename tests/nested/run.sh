#!/usr/bin/env bash
# Runs one command inside an L1 Linux guest under qemu TCG, where /dev/kvm is
# a real, complete KVM (README.md beside this file):
#
#   tests/nested/run.sh ARCH [OPTIONS] -- CMD [ARGS...]
#   tests/nested/run.sh ARCH --check
#
# ARCH is x86_64 or aarch64. CMD is exec'd inside L1 (use `sh -c '…'` for
# shell syntax) with stdin /dev/null; its stdout and stderr, merged, are
# streamed to our stdout. Exit status: CMD's own; 124 when CMD was killed at
# its deadline; 125 when the harness failed (not set up, L1 did not boot,
# qemu died or was killed before the end marker) — the reason goes to stderr.
#
# Options:
#   --file SRC:DST     put SRC (a file or a directory) at DST in L1; repeatable
#   --hostroot         share the host's / read-only (9p) at /run/host, and at
#                      /host with L1's /proc /sys /dev /tmp /run mounted over
#                      it, for `chroot /host PROG`
#   --modprobe MOD     load MOD in L1 as well (vhost_vsock is there); repeatable
#   --env NAME=VALUE   set in CMD's environment; repeatable
#   --cwd DIR          CMD's working directory in L1 (default /)
#   --timeout SECS     CMD's deadline, counted in L1 (default 600)
#   --boot-timeout S   host allowance for boot and power-off on top (default 300)
#   --stall SECS       L1 counts as frozen when its heartbeat (one a minute,
#                      once CMD runs) stops for this long (default 300, or
#                      $BOXDESK_NESTED_STALL): the freeze is examined (see
#                      below), qemu is killed, the exit is 125 and stderr says
#                      "stopped responding"
#   --kick SECS        press Shift on L1's keyboard every SECS seconds (default
#                      2, or $BOXDESK_NESTED_KICK; 0: never): qemu's TCG now
#                      and then leaves a halted x86 vCPU asleep with its timer
#                      interrupt pending, and any interrupt wakes it
#                      (docs/NESTED-FREEZE.md)
#   --mem MIB          L1 memory (default 2048)
#   --smp N            L1 vCPUs (default 1; a benchmark may ask for the
#                      host's cores, so a VMM's threads and its vCPU run
#                      side by side as on any real host)
#   --out DIR          keep console.log, output, result, qemu.stderr there
#                      (default: a temporary directory, kept only on failure)
#   --quiet            do not stream CMD's output
#   --check            exit 0 when ARCH can run here, else say what is missing
#
# L1's kernel logs to a port of its own (kernel.log beside console.log, which
# carries only the markers and CMD's output). When L1 freezes, before qemu is
# killed, freeze.txt records (and stderr summarises) what the host and qemu
# can still see: qemu's threads (CPU time, kernel stacks, gdb backtraces
# where gdb is installed), its monitor's view of the vCPUs, the L1 kernel's
# sysrq dumps (w, l, t, q) and, on x86_64, its panic on an NMI (the stack of
# whatever runs with interrupts off, and all tasks).
#
# The base initramfs (busybox, modules, init) is cached by content in
# $BOXDESK_CACHE/nested/initramfs; per run only CMD and the --file's are
# packed, as a second cpio appended to it. One L1 runs at a time on a host
# (a lock in the cache): L1 is single-vCPU TCG and these hosts are small.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache=${BOXDESK_CACHE:-/var/cache/boxdesk}/nested
prog="nested"

say() { printf '%s: %s\n' "$prog" "$*" >&2; }
usage() { sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "$0" >&2; exit 125; }
fail() { say "$*"; exit 125; }

[ $# -ge 1 ] || usage
arch=$1
shift
case "$arch" in
  x86_64 | aarch64) qemu="qemu-system-$arch" ;;
  -h | --help) usage ;;
  *) fail "unknown arch '$arch' (x86_64 | aarch64)" ;;
esac
prog="nested[$arch]"

files=() modprobe=() envs=() hostroot=0 cwd=/ deadline=600 boot_timeout=300 stall=${BOXDESK_NESTED_STALL:-300} kick=${BOXDESK_NESTED_KICK:-2} mem=2048 smp=1
out='' quiet=0 check=0
while [ $# -gt 0 ]; do
  case "$1" in
    --file) files+=("$2"); shift 2 ;;
    --hostroot) hostroot=1; shift ;;
    --modprobe) modprobe+=("$2"); shift 2 ;;
    --env) envs+=("$2"); shift 2 ;;
    --cwd) cwd=$2; shift 2 ;;
    --timeout) deadline=$2; shift 2 ;;
    --boot-timeout) boot_timeout=$2; shift 2 ;;
    --stall) stall=$2; shift 2 ;;
    --kick) kick=$2; shift 2 ;;
    --mem) mem=$2; shift 2 ;;
    --smp) smp=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --quiet) quiet=1; shift ;;
    --check) check=1; shift ;;
    -h | --help) usage ;;
    --) shift; break ;;
    *) fail "unknown option '$1' (see $0 --help)" ;;
  esac
done
for n in "$deadline" "$boot_timeout" "$stall" "$mem"; do
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || fail "'$n' is not a positive whole number"
done
[[ "$kick" =~ ^[0-9]+$ ]] || fail "--kick '$kick' is not a whole number of seconds"


# --- prerequisites ----------------------------------------------------------
not_set_up() { fail "nested harness not set up (run tests/nested/setup.sh): $*"; }
env_file=$cache/$arch.env
command -v cpio >/dev/null || not_set_up "no cpio"
[ -f "$env_file" ] || not_set_up "no $env_file"
# shellcheck disable=SC1090
. "$env_file"
command -v "$qemu" >/dev/null || not_set_up "no $qemu"
qemu_version=$("$qemu" --version | head -n 1)
kernel=${NESTED_KERNEL:-}
[ -f "$kernel" ] || not_set_up "no $kernel"
[ -d "$NESTED_KERNEL_DIR/lib/modules" ] || not_set_up "no $NESTED_KERNEL_DIR/lib/modules"
[ -x "$NESTED_BUSYBOX" ] || not_set_up "no $NESTED_BUSYBOX"
if [ "$check" = 1 ]; then
  echo "$arch: $qemu_version, $NESTED_KERNEL_PKG $NESTED_KERNEL_VERSION, busybox-static $NESTED_BUSYBOX_VERSION"
  exit 0
fi
[ $# -ge 1 ] || fail "no command given (… -- CMD [ARGS...])"

# --- scratch space (same filesystem as the cache: cheap renames) ------------
mkdir -p "$cache/tmp" "$cache/initramfs"
# What runs killed outright left behind, and bases of older inits.
find "$cache/tmp" -mindepth 1 -maxdepth 1 -mmin +1440 -exec rm -rf {} + 2>/dev/null || true
find "$cache/initramfs" -name "$arch-*.cpio" -mtime +7 -delete 2>/dev/null || true
work=$(mktemp -d "$cache/tmp/run.XXXXXX")
keep_out=0
if [ -n "$out" ]; then
  mkdir -p "$out"
  out=$(cd "$out" && pwd)
  keep_out=1
else
  out=$(mktemp -d "${TMPDIR:-/tmp}/boxdesk-nested.XXXXXX")
fi
qpid='' streamer='' kicker=''
# shellcheck disable=SC2317 # (run by the EXIT trap)
cleanup() {
  if [ -n "$qpid" ]; then kill -KILL "$qpid" 2>/dev/null || true; fi
  if [ -n "$streamer" ]; then kill "$streamer" 2>/dev/null || true; fi
  if [ -n "$kicker" ]; then kill "$kicker" 2>/dev/null || true; fi
  rm -rf "$work"
  [ "$keep_out" = 1 ] || rm -rf "$out"
}
trap cleanup EXIT
trap 'exit 125' INT TERM HUP

# --- the machine -------------------------------------------------------------
# Two output ports: L1's kernel logs to one (kernel.log, from early boot, at
# warning level and up, sysrq dumps included), init writes the markers and
# CMD's output to the other (console.log), so neither garbles the other.
# Kernel arguments for a frozen L1's post-mortem: sysrq from the (virtual)
# keyboard whatever kernel.sysrq says; on x86_64 an NMI from the monitor
# panics, printing the interrupted stack, all tasks and the timers.
log=$out/console.log klog=$out/kernel.log
case "$arch" in
  x86_64)
    machine=(-accel tcg -cpu "EPYC,+svm,+npt")
    ports=(-serial "file:$log" -serial "file:$klog")
    append="console=ttyS1 loglevel=5 panic=-1 sysrq_always_enabled unknown_nmi_panic panic_print=5"
    out_tty=/dev/ttyS0 out_modules=''
    ;;
  aarch64)
    # pauth-impdef: the same pointer authentication with a cheaper hash;
    # emulating QARMA5 tripled the boot here (10-12 s to /init, not 3-3.6 s).
    # virt has one UART (the kernel's); CMD's output takes a virtio console
    # and sysrq a virtio keyboard (qemu has no NMI for virt).
    machine=(-accel tcg -M "virt,virtualization=on,gic-version=3" -cpu "max,pauth-impdef=on")
    ports=(-serial "file:$klog" -device virtio-serial-pci
      -chardev "file,id=out,path=$log" -device "virtconsole,chardev=out"
      -device virtio-keyboard-pci)
    append="console=ttyAMA0 loglevel=5 panic=-1 sysrq_always_enabled"
    out_tty=/dev/hvc0 out_modules=${NESTED_OUT_MODULES:-}
    ;;
esac

# --- base initramfs, cached by content --------------------------------------
key=$({ echo "format 1"; cat "$here/init" "$env_file"; } | sha256sum | cut -c1-16)
base=$cache/initramfs/$arch-$key.cpio
if [ -f "$base" ]; then
  touch "$base" 2>/dev/null || true # (a cache another user made: read-only)
else
  stage=$work/base
  mkdir -p "$stage"/{bin,sbin,usr/bin,usr/sbin,lib,proc,sys,dev,tmp,run,root,etc,nested,host}
  install -m 0755 "$NESTED_BUSYBOX" "$stage/bin/busybox"
  install -m 0755 "$here/init" "$stage/init"
  cp -a "$NESTED_KERNEL_DIR/lib/modules" "$stage/lib/"
  (cd "$stage" && find . | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet) >"$base.$$"
  mv "$base.$$" "$base"
fi

# --- this run's cpio: CMD, its config, the --file's -------------------------
nonce=$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')
q() { # single-quote for sh
  printf "'%s'" "$(printf '%s' "$1" | sed "s/'/'\\\\''/g")"
}
stage=$work/run
mkdir -p "$stage/nested"
kvm_mods=${NESTED_KVM_MODULES:-}
{
  echo "NONCE=$nonce"
  echo "DEADLINE=$deadline"
  echo "KVM_MODULES=$(q "$kvm_mods")"
  echo "HOSTROOT=$hostroot"
  echo "HOSTROOT_MODULES=$(q "${NESTED_HOSTROOT_MODULES:-}")"
  echo "MODPROBE=$(q "${modprobe[*]:-}")"
  echo "CWD=$(q "$cwd")"
  echo "OUT_TTY=$out_tty"
  echo "OUT_MODULES=$(q "$out_modules")"
} >"$stage/nested/config"
{
  for e in "${envs[@]+"${envs[@]}"}"; do
    [[ "$e" =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || fail "--env '$e' is not NAME=VALUE"
    echo "export ${e%%=*}=$(q "${e#*=}")"
  done
  printf 'exec'
  for a in "$@"; do printf ' %s' "$(q "$a")"; done
  echo
} >"$stage/nested/cmd"
for f in "${files[@]+"${files[@]}"}"; do
  src=${f%%:*} dst=${f#*:}
  if [ "$src" = "$f" ] || [ -z "$src" ]; then fail "--file '$f' is not SRC:DST"; fi
  [[ "$dst" == /* ]] || fail "--file '$f': DST must be an absolute path in L1"
  [ -e "$src" ] || fail "--file '$f': no $src"
  mkdir -p "$stage$(dirname "$dst")"
  # A symlink that cpio -L follows: SRC is read once, straight into the archive.
  ln -sfn "$(realpath "$src")" "$stage$dst"
done
initrd=$work/initrd.cpio
cp "$base" "$initrd"
(cd "$stage" && find -L . | LC_ALL=C sort | cpio -o -H newc -L -R 0:0 --quiet) >>"$initrd"

# --- boot ------------------------------------------------------------------
qemu_args=("${machine[@]}" -smp "$smp" -m "$mem" -nodefaults -no-user-config -display none
  -no-reboot "${ports[@]}" -qmp "unix:$work/qmp.sock,server=on,wait=off"
  -qmp "unix:$work/kick.sock,server=on,wait=off"
  -kernel "$kernel" -initrd "$initrd" -append "$append")
if [ "$hostroot" = 1 ]; then
  qemu_args+=(-virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap")
fi

exec 9>"$cache/qemu.lock"
if ! flock -n 9; then
  say "waiting for another nested run to finish"
  flock 9
fi
: >"$log"
: >"$klog"
start=${EPOCHREALTIME/./}
# If this script is killed outright, qemu goes with it.
setpriv --pdeathsig KILL -- "$qemu" "${qemu_args[@]}" >"$out/qemu.stderr" 2>&1 </dev/null &
qpid=$!

# The wake-up kick: a key press every few seconds. qemu's TCG (7.2 and
# 10.0 alike) now and then leaves L1's halted vCPU asleep with its LAPIC
# timer interrupt pending; any other interrupt wakes it, and the timer's
# is taken then (docs/NESTED-FREEZE.md). Shift alone types nothing.
if [ "$kick" != 0 ]; then
  # (a monitor of its own: a QMP socket serves one client at a time, and
  # the freeze report needs the other)
  python3 "$here/qmp.py" "$work/kick.sock" --every "$kick" "sendkey shift" >/dev/null 2>&1 &
  kicker=$!
fi

start_marker="@@boxdesk-nested:$nonce:start@@"
end_marker="@@boxdesk-nested:$nonce:end "
beat_marker="@@boxdesk-nested:$nonce:beat "
# CMD's output: the lines between the markers, less the CR a console adds
# and L1's heartbeats.
extract='{ sub(/\r$/, "") }
  !on { if (index($0, s)) on = 1; next }
  index($0, b) { next }
  { i = index($0, e); if (i) { if (i > 1) printf "%s", substr($0, 1, i - 1); exit } print; fflush() }'
if [ "$quiet" = 0 ]; then
  # mawk (Debian's awk) reads a pipe 4 KiB at a time unless interactive: the
  # output would come in lumps, or not at all before qemu exits.
  stream=(awk)
  if awk -W version 2>&1 | grep -q '^mawk'; then stream=(awk -W interactive); fi
  tail -s 0.1 -n +1 -F --pid="$qpid" "$log" 2>/dev/null | "${stream[@]}" -v s="$start_marker" -v e="$end_marker" -v b="$beat_marker" "$extract" &
  streamer=$!
fi

# freeze_report: what a frozen L1 still shows, into $out/freeze.txt, before
# qemu is killed. The host's view first (nothing of L1's disturbed yet), then
# qemu's monitor, then L1's own kernel: sysrq (needs L1 to take interrupts;
# an L1 that only lost a wake-up comes back from it, which the heartbeat
# then says), and last, on x86_64, an NMI, which panics L1 and prints even
# with interrupts off.
qemu_threads() { # name, state, CPU ticks (user+system), kernel wait channel
  local t
  for t in /proc/"$qpid"/task/*; do
    printf '  %s %s %s ticks=%s wchan=%s\n' "${t##*/}" "$(cat "$t/comm" 2>/dev/null)" \
      "$(awk '{ sub(/.*\) /, ""); print $1 }' "$t/stat" 2>/dev/null)" \
      "$(awk '{ sub(/.*\) /, ""); print $12 + $13 }' "$t/stat" 2>/dev/null)" "$(cat "$t/wchan" 2>/dev/null)"
  done
}
freeze_report() ( # (a subshell without errexit: a look that fails, e.g.
  # a kernel stack a user may not read, must not end the report)
  set +e
  local f=$out/freeze.txt qmp=(python3 "$here/qmp.py" "$work/qmp.sock") regs klines t
  local beats_before
  beats_before=$(grep -cF "$beat_marker" "$log" || true)
  klines=$(wc -l <"$klog")
  {
    echo "=== L1 froze: no heartbeat for $stall s, $(date -u +%FT%TZ), under $qemu_version"
    echo "--- the last lines CMD printed"
    awk -v s="$start_marker" -v e="$end_marker" -v b="$beat_marker" "$extract" "$log" | tail -n 15
    echo "--- qemu's threads (host tid, name, state, CPU ticks, wait channel), 5 s apart"
    qemu_threads
    sleep 5
    qemu_threads
    echo "--- qemu's threads' kernel stacks"
    for t in /proc/"$qpid"/task/*; do
      echo "  thread ${t##*/} $(cat "$t/comm" 2>/dev/null)"
      sed 's/^/    /' "$t/stack" 2>/dev/null
    done
    if command -v gdb >/dev/null; then
      echo "--- gdb: qemu's threads' backtraces"
      timeout 60 gdb -p "$qpid" -batch -nx -ex 'set pagination off' -ex 'thread apply all bt 30' 2>&1 |
        grep -v '^\[New LWP\|^warning: ' | head -n 400
    else
      echo "--- (no gdb here: apt-get install gdb for qemu's backtraces)"
    fi
    echo "--- qemu's monitor: the vCPUs, three looks 2 s apart"
    regs="info registers -a"
    [ "$arch" = x86_64 ] && regs="$regs;info lapic;info pic"
    for t in 1 2 3; do
      IFS=';' read -ra cmds <<<"info status;info cpus;$regs"
      "${qmp[@]}" "${cmds[@]}" || break
      sleep 2
    done
    echo "--- sysrq w (blocked tasks), l (backtraces of the CPUs), t (all tasks), q (timers) through L1's keyboard"
    for t in w l t q; do
      "${qmp[@]}" "sendkey alt-sysrq-$t" >/dev/null || break
      sleep 3
    done
    sleep 5
    if [ "$(grep -cF "$beat_marker" "$log" || true)" != "$beats_before" ]; then
      echo "--- L1 beat again after the keyboard's interrupts: it had lost a wake-up, not hung"
    fi
    if [ "$arch" = x86_64 ]; then
      echo "--- NMI (L1 panics, printing the stack it interrupted, all tasks, the timers)"
      "${qmp[@]}" "nmi" >/dev/null || true
      for t in $(seq 20); do kill -0 "$qpid" 2>/dev/null || break; sleep 1; done
    fi
    echo "--- L1's kernel log since the freeze was found"
    tail -n +"$((klines + 1))" "$klog"
    echo "--- L1's kernel log before that, the last 60 lines"
    head -n "$klines" "$klog" | tail -n 60
  } >"$f" 2>&1
)

limit=$((start + (deadline + boot_timeout) * 1000000))
started_ms='' host_killed=0 stalled=0 beats=0 beat_at=0 tick=0
while kill -0 "$qpid" 2>/dev/null; do
  now=${EPOCHREALTIME/./}
  if [ -z "$started_ms" ] && grep -qF "$start_marker" "$log"; then
    started_ms=$(((now - start) / 1000))
    beat_at=$now
  fi
  if [ "$now" -gt "$limit" ]; then
    kill -KILL "$qpid" 2>/dev/null || true
    host_killed=1
    break
  fi
  # Every 5 s once CMD runs: has L1 beaten since?
  tick=$((tick + 1))
  if [ -n "$started_ms" ] && [ $((tick % 100)) = 0 ]; then
    n=$(grep -cF "$beat_marker" "$log" || true)
    if [ "$n" != "$beats" ]; then
      beats=$n beat_at=$now
    elif [ $((now - beat_at)) -gt $((stall * 1000000)) ] && ! grep -qF "$end_marker" "$log"; then
      say "L1 stopped responding: examining it before qemu is killed (about a minute)"
      freeze_report
      kill -KILL "$qpid" 2>/dev/null || true
      stalled=1
      break
    fi
  fi
  sleep 0.05
done
# (braces: bash would report a qemu we killed as "Killed" on stderr)
{ wait "$qpid"; } 2>/dev/null && qrc=0 || qrc=$?
qpid=
if [ -n "$kicker" ]; then
  kill "$kicker" 2>/dev/null || true
  wait "$kicker" 2>/dev/null || true
  kicker=
fi
wall_ms=$(((${EPOCHREALTIME/./} - start) / 1000))
exec 9>&-
if [ -n "$streamer" ]; then
  wait "$streamer" || true
  streamer=
fi
if [ -z "$started_ms" ] && grep -qF "$start_marker" "$log"; then
  started_ms=$wall_ms # seen only after qemu was gone: at most this
fi

awk -v s="$start_marker" -v e="$end_marker" -v b="$beat_marker" "$extract" "$log" >"$out/output"
end=$(awk -v e="$end_marker" '{ i = index($0, e); if (i) { r = substr($0, i + length(e)); sub(/@@.*/, "", r); print r; exit } }' "$log")

status=failed rc='' reason=''
case "$end" in
  rc=*) status=exited rc=${end#rc=} ;;
  timeout) status=timeout reason="CMD killed at its ${deadline} s deadline" ;;
  setup-failed*) reason="L1 setup failed:${end#setup-failed:}" ;;
  *)
    if [ "$stalled" = 1 ]; then
      last=$(grep -F "$beat_marker" "$log" | tail -n 3 | sed "s/.*:beat //; s/@@.*//" | paste -sd, - || true)
      reason="L1 stopped responding: no heartbeat for $stall s ($beats beats; the last said: ${last:-none}); qemu killed"
    elif [ "$host_killed" = 1 ]; then
      reason="no end marker after $((deadline + boot_timeout)) s; qemu killed"
    else
      reason="qemu exited ($qrc) without the end marker"
    fi
    if [ -z "$started_ms" ]; then reason="$reason; CMD never started"; fi
    ;;
esac
{
  echo "status=$status"
  echo "rc=$rc"
  echo "reason=$reason"
  echo "cmd_started_ms=$started_ms"
  echo "wall_ms=$wall_ms"
  echo "kernel=$NESTED_KERNEL_PKG $NESTED_KERNEL_VERSION"
  echo "qemu=$qemu_version"
} >"$out/result"

case "$status" in
  exited) exit "$rc" ;;
  timeout)
    keep_out=1
    say "timed out: $reason (console log: $log)"
    exit 124
    ;;
  *)
    keep_out=1
    say "failed: $reason"
    say "console log: $log"
    grep -v "TCG doesn't support requested feature" "$out/qemu.stderr" | sed 's/^/  qemu: /' >&2 || true
    tail -n 20 "$log" | sed 's/^/  console: /' >&2
    if [ -f "$out/freeze.txt" ]; then
      say "what the frozen L1 showed ($out/freeze.txt, its kernel's log in $klog):"
      head -n 3000 "$out/freeze.txt" | sed 's/^/  freeze: /' >&2
    else
      tail -n 40 "$klog" | sed 's/^/  kernel: /' >&2
    fi
    exit 125
    ;;
esac
