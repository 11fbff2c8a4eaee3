"""Weights, the plain numpy reference and the scipy baseline of the variable-radius filter.

The filter (the same maths in every variant, see docs/filter.md):

    out[y, x, c] = sum_{dy=-r..r} sum_{dx=-r..r} w_r[dy + r, dx + r] * img[clamp(y + dy), clamp(x + dx), c]

with r = radius_map[y, x], coordinates clamped to the image (edge replication, scipy's mode="nearest"),
and w_r a normalised (2r+1) x (2r+1) weight table. No variant filters separably: every one gathers the
full 2-D window, so that arbitrary (non-separable) kernels such as a bokeh disk stay exact.
Nothing in this module uses Taichi.
"""
from __future__ import annotations

import numpy as np

#: sigma of the Gaussian of radius r, in pixels: r / GAUSSIAN_RADIUS_SIGMAS, so that the window
#: covers +-3 sigma (scipy.ndimage.gaussian_filter's default truncate=4 would need a wider window).
GAUSSIAN_RADIUS_SIGMAS = 3.0


def _gaussian_weights(radius: int) -> np.ndarray:
    if radius == 0:
        return np.ones((1, 1))
    sigma = radius / GAUSSIAN_RADIUS_SIGMAS
    x = np.arange(-radius, radius + 1, dtype=np.float64)
    g = np.exp(-0.5 * (x / sigma) ** 2)
    g /= g.sum()  # normalise in 1-D first, exactly as scipy.ndimage.gaussian_filter1d does
    return np.outer(g, g)


def _disk_weights(radius: int) -> np.ndarray:
    """Uniform disk (the bokeh of a round aperture): taps with dx^2 + dy^2 <= (r + 0.5)^2."""
    x = np.arange(-radius, radius + 1, dtype=np.float64)
    inside = (x[:, None] ** 2 + x[None, :] ** 2) <= (radius + 0.5) ** 2
    w = inside.astype(np.float64)
    return w / w.sum()


#: kernel shapes by name; an unknown name is an error that lists these
KERNEL_SHAPES = {"gaussian": _gaussian_weights, "disk": _disk_weights}


def kernel_weights(radius: int, shape: str = "gaussian") -> np.ndarray:
    """Normalised weight table of one radius: float64, shape (2r+1, 2r+1), row = dy + r, column = dx + r."""
    if shape not in KERNEL_SHAPES:
        raise ValueError(f"unknown kernel shape {shape!r}; expected one of {sorted(KERNEL_SHAPES)}")
    if radius < 0:
        raise ValueError(f"radius must be >= 0, got {radius}")
    return KERNEL_SHAPES[shape](int(radius))


def weight_lists(max_radius: int, shape: str = "gaussian") -> list[np.ndarray]:
    """One flat float32 weight list per radius 0..max_radius (list r has (2r+1)^2 entries, row-major in
    (dy, dx)): the layout every Taichi variant reads, so that all of them sum the same numbers in the same
    order."""
    return [kernel_weights(r, shape).astype(np.float32).ravel() for r in range(max_radius + 1)]


def reference_filter(image: np.ndarray, radius_map: np.ndarray, shape: str = "gaussian") -> np.ndarray:
    """Plain numpy, pixel by pixel, in float64. image: (H, W, C) float; radius_map: (H, W) int >= 0.
    Slow (a Python loop per pixel): for small test images only."""
    img = np.asarray(image, dtype=np.float64)
    height, width, _ = img.shape
    out = np.empty_like(img)
    tables = {}
    for y in range(height):
        for x in range(width):
            r = int(radius_map[y, x])
            if r not in tables:
                tables[r] = kernel_weights(r, shape)
            ys = np.clip(np.arange(y - r, y + r + 1), 0, height - 1)
            xs = np.clip(np.arange(x - r, x + r + 1), 0, width - 1)
            window = img[ys[:, None], xs[None, :], :]  # (2r+1, 2r+1, C)
            out[y, x, :] = np.tensordot(tables[r], window, axes=([0, 1], [0, 1]))
    return out


def scipy_filter(image: np.ndarray, radius_map: np.ndarray, shape: str = "gaussian") -> np.ndarray:
    """Baseline (c): scipy.ndimage.correlate once per distinct radius, each on the bounding box of that
    radius's mask (plus its halo), the result kept where the mask is set. Same 2-D weights, float32 in and
    out (scipy accumulates in float64)."""
    from scipy import ndimage

    img = np.asarray(image, dtype=np.float32)
    height, width, channels = img.shape
    out = np.empty_like(img)
    for r in np.unique(radius_map):
        r = int(r)
        mask = radius_map == r
        rows = np.flatnonzero(mask.any(axis=1))
        cols = np.flatnonzero(mask.any(axis=0))
        y0, y1 = max(rows[0] - r, 0), min(rows[-1] + r + 1, height)
        x0, x1 = max(cols[0] - r, 0), min(cols[-1] + r + 1, width)
        # a crop edge that is not an image edge lies >= r away from every masked pixel, so the
        # crop's "nearest" padding never reaches a masked pixel's window
        crop = img[y0:y1, x0:x1]
        w = kernel_weights(r, shape)
        blurred = np.empty_like(crop)
        for c in range(channels):
            ndimage.correlate(crop[:, :, c], w, output=blurred[:, :, c], mode="nearest")
        sub = mask[y0:y1, x0:x1]
        out[y0:y1, x0:x1][sub] = blurred[sub]
    return out
