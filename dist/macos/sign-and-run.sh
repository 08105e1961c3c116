#!/usr/bin/env bash
# cargo's runner for aarch64-apple-darwin (.cargo/config.toml): signs the
# binary cargo is about to run (a test harness, an example, `cargo run`)
# ad-hoc with the hypervisor entitlement, then runs it, so `cargo test`
# reaches Hypervisor.framework on a Mac:
#   dist/macos/sign-and-run.sh BINARY [ARGS...]
# Always ad-hoc, whatever BOXDESK_CODESIGN_IDENTITY says: a test binary is
# never shipped, and the hardened runtime would only get in its way.
set -euo pipefail
bin=$1
shift
BOXDESK_CODESIGN_IDENTITY='' "$(dirname "$0")/sign.sh" "$bin"
exec "$bin" "$@"
