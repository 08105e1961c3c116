#!/usr/bin/env bash
# One real exec through each static guest agent over a Unix socket: the
# x86_64 one natively, the aarch64 one under qemu-aarch64-static.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
cargo build -q --locked -p boxdesk-channel --example agch
client=$root/target/debug/examples/agch

smoke() { # arch runner...
  local arch=$1; shift
  local d; d=$(mktemp -d)
  mkdir -p "$d/root" "$d/results"
  "$@" "target/images/$arch/boxdesk-guest-agent" --listen "unix:$d/agent.sock" \
    --root "$d/root" --results "$d/results" 2>"$d/agent.log" &
  local pid=$!
  for _ in $(seq 100); do [ -S "$d/agent.sock" ] && break; sleep 0.05; done
  local out rc=0
  out=$("$client" "unix:$d/agent.sock" sh -c 'echo "hello from $0"; exit 7' agent) || rc=$?
  kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true
  if [ "$out" != "hello from agent" ] || [ "$rc" -ne 7 ]; then
    echo "agent-smoke $arch: FAILED (output '$out', status $rc)"; cat "$d/agent.log"; rm -rf "$d"; return 1
  fi
  echo "agent-smoke $arch: ok ($(head -1 "$d/agent.log"))"
  rm -rf "$d"
}

smoke x86_64
smoke aarch64 qemu-aarch64-static
