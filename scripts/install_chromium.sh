#!/usr/bin/env bash
# Installs Debian's headless-capable Chromium, which the report.html test opens the analysis
# report in (tests/pipelines/test_report_html.py). Idempotent: does nothing when installed.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install_chromium: no apt-get; install Debian's 'chromium' package by hand" >&2
    exit 1
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q >/dev/null
$SUDO apt-get install -y -q --no-install-recommends chromium >/dev/null
