#!/usr/bin/env bash
# Installs what building and testing boxdesk needs on Debian 12 (as root),
# skipping whatever is already there. Heavy artifacts stay outside the
# clone: Debian packages in apt's cache, pip's wheel cache, cargo-installed
# tools in ~/.cargo/bin, cross builds in $BOXDESK_CACHE.
set -euo pipefail

say() { printf '[setup] %s\n' "$*"; }

# Debian packages: bubblewrap (namespace backend), qemu-user-static (run
# the aarch64 agent), file, Debian's Rust 1.96 with its std source (build
# std for musl targets), dtc (the aarch64 FDT tests decompile our blobs),
# busybox-static (its nc drives the cowork proxy tests inside sandboxes;
# the x86_64 guest image takes its busybox from it too), xvfb, x11-apps
# (xwd) and xdotool (the `boxdesk view` test's X server, screen dump and
# typing; the viewer itself needs no X library), podman, runc and
# containerd (the engines `boxdesk oci` runs under, runc its baseline;
# netavark and iptables: podman's bridge network, a recommendation only),
# iproute2 (the desktop layouts bring their loopback up: tests/desktops),
# apparmor (its apparmor_parser compiles dist/apparmor/boxdesk:
# scripts/check-apparmor.sh).
pkgs=(bubblewrap qemu-user-static file rustc-web cargo-web rust-web-src device-tree-compiler busybox-static
  xvfb x11-apps xdotool podman runc containerd netavark iptables iproute2 apparmor)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    say "missing Debian packages: ${missing[*]} (run as root to install)"; exit 1
  fi
  say "apt-get install ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# zig: the musl linker for static agents.
if ! python3 -c 'import ziglang' 2>/dev/null; then
  say "pip install ziglang"
  python3 -m pip install -q --disable-pip-version-check ziglang
fi

# cargo tools, pinned so a warm machine never rebuilds them.
need_tool() { # name version
  local have
  have=$("$1" --version 2>/dev/null || "$HOME/.cargo/bin/$1" --version 2>/dev/null || true)
  case "$have" in *"$2"*) return 1 ;; esac
  return 0
}
if need_tool cargo-zigbuild 0.24.1; then
  say "cargo install cargo-zigbuild"
  cargo install -q --locked cargo-zigbuild@0.24.1
fi
if rustup toolchain list 2>/dev/null | grep -q '^nightly' && need_tool cargo-fuzz 0.13.2; then
  say "cargo install cargo-fuzz"
  cargo install -q --locked cargo-fuzz@0.13.2
fi
rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy rustfmt
say "ready"
