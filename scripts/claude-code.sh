#!/usr/bin/env bash
# Installs the pinned Claude Code (npm's @anthropic-ai/claude-code, its
# native executable: @anthropic-ai/claude-code-linux-<x64|arm64>) into the
# cache, once, and prints the binary's path — what tests/claude runs:
#
#   bash scripts/claude-code.sh [x86_64|aarch64]
#
# The package's tarball comes from the npm registry and is checked against
# the sha512 pinned here (npm's `integrity`) before anything is unpacked;
# a warm cache needs no network. The pinned version is tests/claude's
# VERSION. Cache: $BOXDESK_CACHE/claude-code/<version>/.
set -euo pipefail
version=2.1.332
declare -A integrity=(
  [x64]=sha512-f4JWhzwYutJIHScC7/dYOPX6s28tt7ZADhsOi8zwOHq5fFPEuUeChh2NMfinSg0GrUckYxaeebC4h0DqiKzLcw==
  [arm64]=sha512-BlHNEtK38KBPWU31F4lUSS9sHclCyfWbThT1CErvxxH8+XcljYLZlQwdyXBkTD62rw1TgfE1u1a+quMWS0NSJg==
)
arch=${1:-$(uname -m)}
case "$arch" in
  x86_64) npm_arch=x64 ;;
  aarch64) npm_arch=arm64 ;;
  *) echo "usage: $0 [x86_64|aarch64]" >&2; exit 2 ;;
esac
cache=${BOXDESK_CACHE:-/var/cache/boxdesk}/claude-code/$version
pkg=@anthropic-ai/claude-code-linux-$npm_arch
bin=$cache/node_modules/$pkg/claude
if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9
[ -x "$bin" ] && { echo "$bin"; exit 0; }
tmp=$(mktemp -d "$cache/.fetch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
url=${NPM_REGISTRY:-https://registry.npmjs.org}/$pkg/-/claude-code-linux-$npm_arch-$version.tgz
echo "claude-code.sh: fetching $url" >&2
curl -fsSL --retry 3 -o "$tmp/pkg.tgz" "$url"
want=${integrity[$npm_arch]}
got=sha512-$(python3 -c 'import base64, hashlib, sys; print(base64.b64encode(hashlib.sha512(open(sys.argv[1], "rb").read()).digest()).decode())' "$tmp/pkg.tgz")
if [ "$got" != "$want" ]; then
  echo "claude-code.sh: $url has $got, not the pinned $want" >&2
  exit 1
fi
mkdir -p "$tmp/x"
tar -xzf "$tmp/pkg.tgz" -C "$tmp/x" package/claude package/package.json
[ -x "$tmp/x/package/claude" ] || { echo "claude-code.sh: no executable package/claude in $url" >&2; exit 1; }
mkdir -p "$(dirname "$bin")"
mv "$tmp/x/package/claude" "$tmp/x/package/package.json" "$(dirname "$bin")/"
chmod -R a+rX "$cache"
echo "$bin"
