#!/usr/bin/env bash
# The desktops people run, as layouts of this machine: each in a private
# mount and network namespace (nothing real changes; where /nix or /opt is
# missing an empty mount point is made and removed again), boxdesk checked in
# each as root and as an unprivileged user:
#
#   bash tests/desktops/run.sh [BOXDESK] [TESTS_BIN]
#
# Layouts: `resolved` (Ubuntu, Fedora: /etc/resolv.conf ->
# ../run/systemd/resolve/stub-resolv.conf, a resolver on 127.0.0.53 and
# its varlink socket beside), `networkmanager` (/etc/resolv.conf ->
# /run/NetworkManager/resolv.conf, a resolver on 127.0.0.1), `nixos`
# (/etc/hosts -> /etc/static/hosts -> /nix/store/…, /run/current-system,
# tools only in /nix/store). Every layout has a tool in /opt and one in
# /nix/store. The resolver of each is tests/desktops/dns.py on loopback.
#
# Checked in each (tests/desktops/layout.sh): a name resolves inside
# `run --net` as on the host, /etc/resolv.conf and /etc/hosts read as the
# host's, the copy follows the host's file when the network changes, nothing
# else of the resolver's directory shows, /opt and /nix/store programs run,
# `info` lists what was bound; with TESTS_BIN (the root package's `tests`
# binary), its `desktop_` tests (ignored elsewhere): a cowork spawn
# resolves the name through boxdesk's resolver. BOXDESK_DESKTOP_BACKEND=kvm
# (the nested L1) adds a `--root host` VM's view. Prints `skipped: …` and
# exits 0 where it cannot run (not root, no unshare).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bin=$(realpath "${1:-$root/target/debug/boxdesk}")
tests=${2:-}
[ -z "$tests" ] || tests=$(realpath "$tests")
if [ "$(id -u)" -ne 0 ]; then
  echo "skipped: the desktop layouts need root to lay this machine out (run as root)"; exit 0
fi
for tool in unshare runuser python3 getent ip; do
  command -v "$tool" >/dev/null || { echo "skipped: $tool is not installed"; exit 0; }
done
# Mount points the layouts need, made empty where missing, removed after.
made=()
for d in /nix /opt; do
  if [ ! -e "$d" ]; then mkdir "$d"; made+=("$d"); fi
done
cleanup() { for d in "${made[@]+"${made[@]}"}"; do rmdir "$d" 2>/dev/null || true; done; }
trap cleanup EXIT
user=${BOXDESK_TEST_USER:-nobody}
start=$SECONDS
for layout in ${BOXDESK_DESKTOPS:-resolved networkmanager nixos}; do
  for who in root "$user"; do
    unshare --mount --net --propagation private -- \
      bash "$here/layout.sh" "$layout" "$who" "$bin" "$tests"
  done
done
echo "desktops: all passed ($((SECONDS - start)) s)"
