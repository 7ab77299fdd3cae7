#!/usr/bin/env bash
# Provision the browser that tests/test_demo.py drives: Debian's `chromium` (plus a font, for legible screenshots).
# Playwright (a Python package in the dev extra) drives it through executable_path=/usr/bin/chromium and never
# downloads a browser of its own (`playwright install` fetches from a CDN that CI cannot reach).
# Idempotent: returns at once when Chromium is already there. Needs root or password-less sudo, and apt.
#   bash scripts/ci_browser.sh          # CI calls it before scripts/test.sh; the test also calls it when needed
set -euo pipefail
CHROMIUM=${KANI_CHROMIUM:-/usr/bin/chromium}
if [ -x "$CHROMIUM" ]; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "ci_browser: no apt-get here; install Chromium at $CHROMIUM (or set KANI_CHROMIUM) to run tests/test_demo.py" >&2
  exit 1
fi
if [ "$(id -u)" -eq 0 ]; then
  sudo=()
elif sudo -n true 2>/dev/null; then
  sudo=(sudo -n)
else
  echo "ci_browser: need root or password-less sudo to apt-get install chromium" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
echo "ci_browser: installing chromium with apt-get (about a minute)" >&2
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq chromium fonts-dejavu-core >/dev/null
"$CHROMIUM" --version
