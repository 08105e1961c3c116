#!/usr/bin/env bash
# Release workflow, macOS build job (.github/build-setup.yml): makes a real
# signing identity available to dist/macos/sign.sh when the repository has
# one configured, else leaves the ad-hoc default.
#   BOXDESK_CODESIGN_IDENTITY              secret: the identity's name
#   BOXDESK_CODESIGN_CERTIFICATE           secret: the .p12, base64
#   BOXDESK_CODESIGN_CERTIFICATE_PASSWORD  secret: its password
# Imports the certificate into a throw-away keychain under $RUNNER_TEMP and
# exports BOXDESK_CODESIGN_IDENTITY and BOXDESK_CODESIGN_KEYCHAIN to the
# later steps ($GITHUB_ENV).
set -euo pipefail

if [ -z "${BOXDESK_CODESIGN_IDENTITY:-}" ]; then
  echo "no BOXDESK_CODESIGN_IDENTITY secret: boxdesk is signed ad-hoc"
  exit 0
fi
: "${BOXDESK_CODESIGN_CERTIFICATE:?the identity needs BOXDESK_CODESIGN_CERTIFICATE (base64 .p12)}"
keychain=$RUNNER_TEMP/boxdesk-signing.keychain-db
password=$(uuidgen)
cert=$RUNNER_TEMP/boxdesk-signing.p12
trap 'rm -f "$cert"' EXIT
printf '%s' "$BOXDESK_CODESIGN_CERTIFICATE" | base64 --decode >"$cert"
security create-keychain -p "$password" "$keychain"
security set-keychain-settings -lut 21600 "$keychain"
security unlock-keychain -p "$password" "$keychain"
security import "$cert" -k "$keychain" -P "${BOXDESK_CODESIGN_CERTIFICATE_PASSWORD:-}" \
  -t cert -f pkcs12 -T /usr/bin/codesign
security set-key-partition-list -S apple-tool:,apple:,codesign: -k "$password" "$keychain" >/dev/null
# codesign finds the identity only in a keychain on the search list.
mapfile -t others < <(security list-keychains -d user | sed 's/^ *"//; s/"$//')
security list-keychains -d user -s "$keychain" "${others[@]}"
{
  echo "BOXDESK_CODESIGN_IDENTITY=$BOXDESK_CODESIGN_IDENTITY"
  echo "BOXDESK_CODESIGN_KEYCHAIN=$keychain"
} >>"$GITHUB_ENV"
echo "boxdesk will be signed by the configured identity"
