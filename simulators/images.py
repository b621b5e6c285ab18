"""Images whose pixels are a population: each unit of luminosity is one respondent (esa-privacy-revisited
Section VII-B, Table II).

Three real images ship inside scikit-image (``horse``, ``camera``, ``moon`` from ``skimage.data``;
``pip install .[images]``); two small patterns (``disc``, ``gradient``) are generated here and need
nothing; any other name is read as an image file (PNG, JPEG, ... through Pillow). Every loader returns a
2-D ``uint8`` luminosity array resized to the requested grid.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

BUNDLED_IMAGES = ("horse", "camera", "moon")
GENERATED_IMAGES = ("disc", "gradient")
DEFAULT_GENERATED_SHAPE = (64, 64)


def parse_grid(text: str) -> tuple[int, int]:
    """``"64x48"`` -> ``(64, 48)`` (rows x columns)."""
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(part.strip().isdigit() for part in parts):
        raise ValueError(f"image size must look like ROWSxCOLS (e.g. 64x64), got {text!r}")
    rows, cols = (int(part) for part in parts)
    if rows < 1 or cols < 1:
        raise ValueError(f"image size must be at least 1x1, got {text!r}")
    return rows, cols


def generated_image(name: str, shape: tuple[int, int] = DEFAULT_GENERATED_SHAPE) -> np.ndarray:
    """A synthetic luminosity pattern of ``shape`` that needs no optional package.

    ``disc``: a bright disc on a dim, radially fading background (a dense centre and a flat tail);
    ``gradient``: luminosity rising linearly from the top-left to the bottom-right corner.
    """
    rows, cols = _check_shape(shape)
    y, x = np.mgrid[0:rows, 0:cols].astype(np.float64)
    if name == "disc":
        cy, cx = (rows - 1) / 2.0, (cols - 1) / 2.0
        radius = np.hypot((y - cy) / max(rows / 2.0, 1.0), (x - cx) / max(cols / 2.0, 1.0))
        image = np.where(radius <= 0.5, 255.0, 60.0 * np.clip(1.0 - radius, 0.0, 1.0))
    elif name == "gradient":
        image = 255.0 * (y + x) / max(rows + cols - 2, 1)
    else:
        raise ValueError(
            f"unknown generated image {name!r}; choose from {', '.join(GENERATED_IMAGES)}"
        )
    return np.rint(image).astype(np.uint8)


def bundled_image(name: str) -> np.ndarray:
    """One of scikit-image's bundled images as a ``uint8`` luminosity array (native size).

    ``horse`` is a binary silhouette; it is inverted so that the horse is bright on a black
    background, like the majority-black horse dataset of esa-privacy-revisited Section VII-B.
    """
    if name not in BUNDLED_IMAGES:
        raise ValueError(f"unknown bundled image {name!r}; choose from {', '.join(BUNDLED_IMAGES)}")
    try:
        import skimage.data  # optional: imported only when asked for
    except ImportError as error:
        raise ValueError(
            f"image {name!r} needs scikit-image: pip install '.[images]' ({error})"
        ) from error
    image = np.asarray(getattr(skimage.data, name)())
    if name == "horse":
        image = ~image.astype(bool)
    return _to_luminosity(image)


def read_image_file(path: str | Path) -> np.ndarray:
    """An image file as a ``uint8`` luminosity array (Pillow's 'L' conversion)."""
    from PIL import Image, UnidentifiedImageError

    path = Path(path)
    try:
        with Image.open(path) as opened:
            return np.asarray(opened.convert("L"), dtype=np.uint8)
    except (OSError, UnidentifiedImageError, ValueError) as error:
        raise ValueError(f"cannot read image {str(path)!r}: {error}") from error


def resize_luminosity(image: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """Resize a ``uint8`` luminosity array to ``shape`` (rows, cols) with antialiased bilinear."""
    from PIL import Image

    rows, cols = _check_shape(shape)
    if image.shape == (rows, cols):
        return image
    resized = Image.fromarray(image, mode="L").resize((cols, rows), Image.Resampling.BILINEAR)
    return np.asarray(resized, dtype=np.uint8)


def load_image(name: str, shape: tuple[int, int] | None = None) -> np.ndarray:
    """Luminosity of a generated, bundled or file image, resized to ``shape`` when given."""
    if name in GENERATED_IMAGES:
        return generated_image(name, shape or DEFAULT_GENERATED_SHAPE)
    if name in BUNDLED_IMAGES:
        image = bundled_image(name)
    elif Path(name).suffix:
        image = read_image_file(name)
    else:
        known = ", ".join(GENERATED_IMAGES + BUNDLED_IMAGES)
        raise ValueError(f"unknown image {name!r}: use one of {known} or a path to an image file")
    if image.ndim != 2 or image.size == 0:
        raise ValueError(f"image {name!r} is not a non-empty 2-D picture (shape {image.shape})")
    return resize_luminosity(image, shape) if shape is not None else image


def _to_luminosity(image: np.ndarray) -> np.ndarray:
    if image.dtype == bool:
        return image.astype(np.uint8) * np.uint8(255)
    if image.ndim == 3:
        image = image[..., :3].mean(axis=2)
    if np.issubdtype(image.dtype, np.floating) and image.max(initial=0.0) <= 1.0:
        image = image * 255.0
    return np.clip(np.rint(image), 0, 255).astype(np.uint8)


def _check_shape(shape: tuple[int, int]) -> tuple[int, int]:
    rows, cols = (int(v) for v in shape)
    if rows < 1 or cols < 1:
        raise ValueError(f"image shape must be at least 1x1, got {shape}")
    return rows, cols
