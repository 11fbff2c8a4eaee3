"""``python run.py filter IMAGE (--radius-map MAP | --radius R) --out OUT [options]``

A spatially varying blur: every pixel is filtered with the kernel of its own radius, taken from a VLA of
weight lists (one list per radius, see app/filter/engine.py). Radius maps drive for example a
depth-of-field blur (``--kernel disk``) or a variable Gaussian blur (``--kernel gaussian``).

Images are read and written through imageio: grayscale, RGB or RGBA; 8-bit, 16-bit or float. Filtering
happens in float32 on linear values (8-bit images are scaled to [0, 1] and rounded back on output).
Radius maps are single-channel images whose values are radii in pixels, multiplied by --radius-scale and
rounded to the nearest integer; ``.npy`` files are accepted for both images and maps.
Bad input raises app.errors.UserError (one line, exit 2).
"""
from __future__ import annotations

import argparse
import os

import numpy as np

from app.errors import UserError
from app.files import write_named_atomic

#: arch names accepted by --arch (Taichi's own names for them are looked up at init)
ARCHS = ("cpu", "cuda")
#: the largest radius the CLI accepts unless --max-radius is raised: a radius-64 window has 16641 taps
DEFAULT_MAX_RADIUS = 64
_INTEGER_SCALES = {np.dtype(np.uint8): 255.0, np.dtype(np.uint16): 65535.0}
OUT_DTYPES = ("same", "uint8", "uint16", "float32")


def init_taichi(arch: str = "cpu") -> None:
    """ti.init for ``arch`` unless Taichi already runs on it (tests initialise once per module)."""
    import taichi as ti

    if arch not in ARCHS:
        raise UserError(f"unknown --arch {arch!r}; expected one of {list(ARCHS)}")
    want = getattr(ti, arch)
    prog = ti.lang.impl.get_runtime().prog
    if prog is not None and ti.lang.impl.current_cfg().arch == want:
        return
    from app.frontend_cache import install

    install()   # (only with SMOLVLA_FRONTEND_CACHE=1: app.frontend_cache)
    ti.init(arch=want, offline_cache=True)
    if ti.lang.impl.current_cfg().arch != want:
        raise UserError(f"--arch {arch}: Taichi could not start on {arch} (no device?); use --arch cpu")


# -- image IO ----------------------------------------------------------------------------------------
def _read_array(path: str, what: str) -> np.ndarray:
    if not os.path.exists(path):
        raise UserError(f"{what} {path!r}: no such file")
    if not os.path.isfile(path):   # a pipe or a device could block or never end
        raise UserError(f"{what} {path!r}: not a regular file (a directory, pipe or device?)")
    try:
        if path.lower().endswith(".npy"):
            header = np.load(path, mmap_mode="r", allow_pickle=False)   # the size from the header first
            memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
            if header.nbytes > memory // 2:
                raise UserError(f"{what} {path!r}: {header.nbytes / 2**30:.1f} GiB, more than half this machine's "
                                f"memory")
            return np.array(header)
        import imageio.v3 as iio

        return np.asarray(iio.imread(path))
    except UserError:
        raise
    except Exception as e:  # imageio raises many types for unreadable files; their messages run over lines
        reason = " ".join(str(e).split())[:200]
        raise UserError(f"{what} {path!r}: cannot read it as an image ({type(e).__name__}: {reason})") from None


def read_image(path: str) -> tuple[np.ndarray, np.dtype]:
    """Returns (float32 (H, W, C) with C in 1..4, the file's dtype). Integer images are scaled to [0, 1]."""
    raw = _read_array(path, "image")
    if raw.ndim == 2:
        raw = raw[:, :, None]
    if raw.ndim != 3 or raw.shape[2] not in (1, 2, 3, 4) or raw.shape[0] == 0 or raw.shape[1] == 0:
        raise UserError(f"image {path!r}: expected a grayscale, RGB or RGBA image (H, W[, C<=4]), got shape {raw.shape}")
    dtype = raw.dtype
    if dtype in _INTEGER_SCALES:
        img = raw.astype(np.float32) / _INTEGER_SCALES[dtype]
    elif np.issubdtype(dtype, np.floating):
        img = raw.astype(np.float32)
    else:
        raise UserError(f"image {path!r}: unsupported pixel type {dtype}; expected uint8, uint16 or float")
    if not np.all(np.isfinite(img)):
        raise UserError(f"image {path!r}: contains NaN or infinite values")
    return np.ascontiguousarray(img), dtype


def read_radius_map(path: str, scale: float = 1.0) -> np.ndarray:
    """Returns int32 (H, W) radii: the map's values (one channel; RGB maps must be gray) times ``scale``,
    rounded. Negative radii are an error."""
    raw = _read_array(path, "radius map")
    if raw.ndim == 3:
        if raw.shape[2] >= 3 and np.array_equal(raw[:, :, 0], raw[:, :, 1]) and np.array_equal(raw[:, :, 0], raw[:, :, 2]):
            raw = raw[:, :, 0]  # a gray map saved as RGB(A)
        elif raw.shape[2] == 1:
            raw = raw[:, :, 0]
        else:
            raise UserError(f"radius map {path!r}: expected one channel (or gray RGB), got shape {raw.shape}")
    if raw.ndim != 2:
        raise UserError(f"radius map {path!r}: expected a 2-D map, got shape {raw.shape}")
    if not (np.issubdtype(raw.dtype, np.integer) or np.issubdtype(raw.dtype, np.floating)):
        raise UserError(f"radius map {path!r}: unsupported value type {raw.dtype}")
    values = raw.astype(np.float64) * scale
    if not np.all(np.isfinite(values)):
        raise UserError(f"radius map {path!r}: contains NaN or infinite values")
    radii = np.rint(values)
    if radii.min() < 0:
        y, x = np.unravel_index(int(np.argmin(radii)), radii.shape)
        raise UserError(f"radius map {path!r}: negative radius {values[y, x]:g} at row {y}, column {x}; radii must be >= 0")
    return radii.astype(np.int32)


def write_image(path: str, image: np.ndarray, dtype: np.dtype) -> None:
    """image: float32 (H, W, C); written as ``dtype`` (integers rounded from [0, 1], clipped)."""
    dtype = np.dtype(dtype)
    if dtype in _INTEGER_SCALES:
        data = np.clip(np.rint(image * _INTEGER_SCALES[dtype]), 0, _INTEGER_SCALES[dtype]).astype(dtype)
    else:
        data = image.astype(np.float32)
    if data.shape[2] == 1:
        data = data[:, :, 0]
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise UserError(f"--out {path!r}: directory {parent!r} does not exist")
    def save(tmp):
        if path.lower().endswith(".npy"):
            np.save(tmp, data)
            return
        import imageio.v3 as iio

        iio.imwrite(tmp, data)

    try:
        write_named_atomic(path, save)
    except UserError:
        raise
    except Exception as e:
        hint = " (float images need .tiff or .npy, or pass --out-dtype uint8)" if data.dtype.kind == "f" else ""
        raise UserError(f"--out {path!r}: cannot write a {data.dtype} image with {image.shape[2]} channel(s){hint}: {type(e).__name__}: {e}") from None


# -- CLI ---------------------------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one-line UserError instead of argparse's usage dump + SystemExit
        raise UserError(f"{self.prog}: {message} (see --help)")


def build_parser() -> argparse.ArgumentParser:
    from app.filter.engine import METHODS
    from app.filter.reference import KERNEL_SHAPES

    p = _Parser(prog="run.py filter", description=__doc__.split("\n\n")[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("image", help="input image (png, jpg, tiff, ... or .npy)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--radius-map", metavar="MAP", help="per-pixel radius in pixels, same size as IMAGE")
    src.add_argument("--radius", type=float, metavar="R", help="one radius for every pixel")
    p.add_argument("--radius-scale", type=float, default=1.0, help="multiply map values by this before rounding (default 1)")
    p.add_argument("--out", required=True, help="output image; its format follows the extension")
    p.add_argument("--kernel", default="gaussian", choices=sorted(KERNEL_SHAPES), help="kernel shape of every radius (default gaussian, sigma = r/3)")
    p.add_argument(
        "--method", default="auto", choices=["auto", *METHODS],
        help="implementation (default auto: vla-shared on CUDA, vla-flat elsewhere; per-radius, padded and scipy are the benchmark's baselines)",
    )
    p.add_argument("--arch", default="cpu", choices=list(ARCHS), help="Taichi backend (default cpu)")
    p.add_argument("--max-radius", type=int, default=DEFAULT_MAX_RADIUS, help=f"refuse radii above this (default {DEFAULT_MAX_RADIUS})")
    p.add_argument("--out-dtype", default="same", choices=list(OUT_DTYPES), help="pixel type of OUT (default: that of IMAGE)")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    image, in_dtype = read_image(args.image)
    height, width, channels = image.shape
    if args.radius_map is not None:
        radius_map = read_radius_map(args.radius_map, args.radius_scale)
        if radius_map.shape != (height, width):
            raise UserError(
                f"radius map {args.radius_map!r} is {radius_map.shape[1]}x{radius_map.shape[0]} (WxH) but image "
                f"{args.image!r} is {width}x{height}; they must be the same size"
            )
    else:
        r = args.radius * args.radius_scale
        if not np.isfinite(r) or r < 0:
            raise UserError(f"--radius {args.radius:g}: radius must be >= 0")
        radius_map = np.full((height, width), int(np.rint(r)), dtype=np.int32)
    max_r = int(radius_map.max())
    if args.max_radius < 0:
        raise UserError(f"--max-radius {args.max_radius}: must be >= 0")
    if max_r > args.max_radius:
        raise UserError(f"radius {max_r} exceeds --max-radius {args.max_radius}; raise --max-radius or lower the radii")
    out_dtype = in_dtype if args.out_dtype == "same" else np.dtype(args.out_dtype)

    if args.method == "scipy":
        from app.filter.reference import scipy_filter

        result = scipy_filter(image, radius_map, args.kernel)
    else:
        init_taichi(args.arch)
        from app.filter.engine import FilterEngine

        engine = FilterEngine(height, width, channels, max_r, args.kernel)
        try:
            result = engine.filter(image, radius_map, args.method)
        except ValueError as e:  # e.g. vla-shared without CUDA
            raise UserError(f"--method {args.method}: {e}") from None
    write_image(args.out, result, out_dtype)
    print(f"filtered {args.image} ({width}x{height}, {channels} channel(s), radii {int(radius_map.min())}..{max_r}) -> {args.out}")
    return 0
