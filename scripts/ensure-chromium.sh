#!/usr/bin/env bash
# Headless Chromium for the Airflow UI plugin's browser tests and screenshots: Debian's
# `chromium` package (driven over the DevTools protocol; no Selenium, no browser download).
set -euo pipefail
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

if ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null; then
    $SUDO apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
        chromium fonts-dejavu-core >/dev/null
fi
echo "chromium: $( (command -v chromium || command -v chromium-browser) | head -1) \
$( (chromium --version || chromium-browser --version) 2>/dev/null | head -1)"
