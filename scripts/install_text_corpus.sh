#!/usr/bin/env bash
# Installs the real English text the interactive n-gram analysis reads (Debian's fortunes
# quotations under /usr/share/games/fortunes). Idempotent: does nothing when already installed.
set -euo pipefail
if [ -f /usr/share/games/fortunes/fortunes ] && [ -f /usr/share/games/fortunes/literature ] \
    && [ -f /usr/share/games/fortunes/computers ]; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install_text_corpus: no apt-get; install Debian's 'fortunes' package by hand" >&2
    exit 1
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q >/dev/null
$SUDO apt-get install -y -q --no-install-recommends fortunes fortunes-min >/dev/null
