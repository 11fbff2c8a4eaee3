"""FilterEngine: owns the device arrays of one image size and launches the filter kernels.

Methods (the same output, see app/filter/kernels.py):
    "vla"         one kernel, weight lists in a VLA (array r = weights of radius r), read per tap
    "vla-flat"    the same after a staging pass that copies all weight lists into one flat buffer
    "vla-shared"  CUDA: the same, each 32x8 tile's block stages the weight lists and its image tile
                  (plus halo) into block shared memory
    "vla-shared-x4"  CUDA: the same with 32x32 tiles, each thread filtering a vertical run of 4 pixels
    "per-radius"  baseline (a): one kernel specialised per radius, launched per radius over its mask
    "padded"      baseline (b): one kernel, zero-padded table of the maximum radius
    "scipy"       baseline (c): scipy.ndimage on the CPU (host arrays, no Taichi)

Taichi must be initialised before an engine is made (app.filter.cli.init_taichi).
"""
from __future__ import annotations

import numpy as np
import taichi as ti

from app.filter import kernels as fk
from app.filter.reference import scipy_filter, weight_lists

#: radii up to this get a compile-time path inside the staged VLA kernels (more costs compile time)
DEFAULT_SPECIALISE = 16

METHODS = ("vla", "vla-flat", "vla-shared", "vla-shared-x4", "per-radius", "padded", "scipy")


def method_unavailable(method: str, max_radius: int, channels: int):
    """Why ``method`` cannot run on the current arch (a str), or None when it can."""
    arch = current_arch()
    if method in ("vla-shared", "vla-shared-x4"):
        if arch != ti.cuda:
            return f"needs block shared memory (--arch cuda); this run has {arch.name}"
        tile = (fk.TILE_X, fk.TILE_Y) if method == "vla-shared" else (fk.RUN_TILE, fk.RUN_TILE)
        need = fk.staged_shared_bytes(max_radius, channels, *tile)
        if need > fk.SHARED_BYTES_LIMIT:
            return f"needs {need} B of shared memory per block for radius {max_radius}, above the {fk.SHARED_BYTES_LIMIT} B limit"
    return None


def current_arch():
    return ti.lang.impl.current_cfg().arch


class FilterEngine:
    """Device state for images of one size (height, width, channels) and radii 0..max_radius.

    image_in, image_out: ti.ndarray float32 (H, W, C); radius: ti.ndarray int32 (H, W);
    weights: VLA of float32 with max_radius + 1 arrays, array r of length (2r+1)^2;
    weights_padded: ti.ndarray float32 (max_radius + 1, (2 max_radius + 1)^2), baseline (b);
    weights_by_radius: list of ti.ndarray float32 ((2r+1)^2,), baseline (a).
    """

    def __init__(self, height: int, width: int, channels: int, max_radius: int, shape: str = "gaussian", specialise: int = DEFAULT_SPECIALISE):
        if channels not in (1, 2, 3, 4):
            raise ValueError(f"channels must be 1..4, got {channels}")
        self.height, self.width, self.channels = int(height), int(width), int(channels)
        self.max_radius = int(max_radius)
        # radii <= this get compile-time paths inside the one vla-flat / vla-shared kernel (-1: none)
        self.specialise = min(int(specialise), self.max_radius)
        self.shape = shape
        self.image_in = ti.ndarray(ti.f32, shape=(height, width, channels))
        self.image_out = ti.ndarray(ti.f32, shape=(height, width, channels))
        self.radius = ti.ndarray(ti.i32, shape=(height, width))
        self._host_image = None
        self._host_radius = None

        lists = weight_lists(self.max_radius, shape)
        self._weight_lists = lists
        self.weights = None  # the VLA, built on first use by a "vla*" method (see weights_vla)
        offsets = np.zeros(len(lists) + 1, dtype=np.int64)
        np.cumsum([len(w) for w in lists], out=offsets[1:])
        self.weight_offset = ti.ndarray(ti.i32, shape=(len(lists) + 1,))
        self.weight_offset.from_numpy(offsets.astype(np.int32))
        self.weight_total = int(offsets[-1])

        side = 2 * self.max_radius + 1
        padded = np.zeros((self.max_radius + 1, side, side), dtype=np.float32)
        for r, w in enumerate(lists):
            m = self.max_radius
            padded[r, m - r : m + r + 1, m - r : m + r + 1] = w.reshape(2 * r + 1, 2 * r + 1)
        self.weights_padded = ti.ndarray(ti.f32, shape=(self.max_radius + 1, side * side))
        self.weights_padded.from_numpy(padded.reshape(self.max_radius + 1, side * side))
        self.weights_by_radius = []
        for w in lists:
            nd = ti.ndarray(ti.f32, shape=(len(w),))
            nd.from_numpy(w)
            self.weights_by_radius.append(nd)
        self.radii_present = []
        self._flat = None  # float32 (weight_total,), vla-flat's staging buffer, made on first use
        self._no_emulation = None

    def weights_vla(self):
        """The VLA of weight lists (array r = the (2r+1)^2 weights of radius r), made on first use with
        the inline capacity and chunk size that VLA.tune picks for these lengths."""
        if self.weights is None:
            from vla import VLA

            lengths = np.array([len(w) for w in self._weight_lists], dtype=np.int64)
            offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])
            tuned = VLA.tune(lengths, dtype=ti.f32)
            self.weights = VLA(
                len(lengths), ti.f32, inline_capacity=tuned["inline_capacity"], chunk_size=tuned["chunk_size"], name="filter_weights"
            )
            self.weights.from_csr(offsets, np.concatenate(self._weight_lists).astype(np.float32))
        return self.weights

    # -- inputs --------------------------------------------------------------------------------------
    def set_image(self, image: np.ndarray) -> None:
        """image: float32 (H, W, C)."""
        image = np.ascontiguousarray(image, dtype=np.float32)
        assert image.shape == (self.height, self.width, self.channels), image.shape
        self._host_image = image
        self.image_in.from_numpy(image)

    def set_radius_map(self, radius_map: np.ndarray) -> None:
        """radius_map: int (H, W), 0 <= r <= max_radius (validated by the caller)."""
        radius_map = np.ascontiguousarray(radius_map, dtype=np.int32)
        assert radius_map.shape == (self.height, self.width), radius_map.shape
        assert radius_map.min() >= 0 and radius_map.max() <= self.max_radius
        self._host_radius = radius_map
        self.radius.from_numpy(radius_map)
        # baseline (a) launches one kernel per radius present: finding them is host work done once per
        # map, like the mask building of a real per-radius pipeline, and it is not timed
        self.radii_present = [int(r) for r in np.unique(radius_map)]

    # -- filtering -----------------------------------------------------------------------------------
    def best_vla_method(self) -> str:
        """The fastest VLA method this arch runs: vla-shared on CUDA when the tile fits, else vla-flat."""
        for m in ("vla-shared", "vla-flat"):
            if self.unavailable(m) is None:
                return m
        return "vla"

    def unavailable(self, method: str):
        return method_unavailable(method, self.max_radius, self.channels)

    def _emulation_buffers(self, method: str, emulate: bool):
        """(weights, image) buffers for the shared-memory kernels: one element each on CUDA (unused);
        under emulation, a private copy of the block's shared memory for every thread."""
        if not emulate:
            if self._no_emulation is None:
                self._no_emulation = (ti.ndarray(ti.f32, shape=(1,)), ti.ndarray(ti.f32, shape=(1,)))
            return self._no_emulation
        if method == "vla-shared":
            tx, ty, block = fk.TILE_X, fk.TILE_Y, fk.TILE_X * fk.TILE_Y
        else:
            tx, ty, block = fk.RUN_TILE, fk.RUN_TILE, fk.RUN_TILE * fk.RUN_TILE // fk.RUN
        threads = -(-self.height // ty) * -(-self.width // tx) * block
        halo = (tx + 2 * self.max_radius) * (ty + 2 * self.max_radius)
        return (
            ti.ndarray(ti.f32, shape=(threads * self.weight_total,)),
            ti.ndarray(ti.f32, shape=(threads * halo * self.channels,)),
        )

    def run(self, method: str, emulate_shared: bool = False) -> None:
        """Filter image_in into image_out (device) with one method; asynchronous on CUDA (call ti.sync()).
        emulate_shared: run vla-shared / vla-shared-x4 on the CPU with every thread staging a private copy
        of its block's shared memory (a test of their indexing; slow, small images only)."""
        C = self.channels
        emulate = bool(emulate_shared) and method in ("vla-shared", "vla-shared-x4")
        why = self.unavailable(method) if method in METHODS and not emulate else None
        if why:
            raise ValueError(f"method {method!r} {why}")
        if method == "vla":
            fk.kernel_filter_vla(self.image_in, self.radius, self.weights_vla(), self.image_out, C)
        elif method == "vla-flat":
            if self._flat is None:
                self._flat = ti.ndarray(ti.f32, shape=(self.weight_total,))
            fk.kernel_stage_weights(self.weights_vla(), self.weight_offset, self._flat)
            fk.kernel_filter_flat(self.image_in, self.radius, self._flat, self.weight_offset, self.image_out, C, self.specialise)
        elif method == "vla-shared":
            fk.kernel_filter_vla_shared(
                self.image_in, self.radius, self.weights_vla(), self.weight_offset, self.image_out, C, self.max_radius, self.weight_total,
                self.specialise, emulate, *self._emulation_buffers(method, emulate),
            )
        elif method == "vla-shared-x4":
            fk.kernel_filter_vla_shared_runs(
                self.image_in, self.radius, self.weights_vla(), self.weight_offset, self.image_out, C, self.max_radius, self.weight_total,
                self.specialise, emulate, *self._emulation_buffers(method, emulate),
            )
        elif method == "per-radius":
            for r in self.radii_present:
                fk.kernel_filter_fixed_radius(self.image_in, self.radius, self.weights_by_radius[r], self.image_out, C, r)
        elif method == "padded":
            fk.kernel_filter_padded(self.image_in, self.radius, self.weights_padded, self.image_out, C, self.max_radius)
        elif method == "scipy":
            self._scipy_out = scipy_filter(self._host_image, self._host_radius, self.shape)
        else:
            raise ValueError(f"unknown filter method {method!r}; expected one of {list(METHODS)}")

    def result(self, method: str) -> np.ndarray:
        """float32 (H, W, C) output of the last run of ``method``."""
        if method == "scipy":
            return self._scipy_out
        return self.image_out.to_numpy()

    def filter(self, image: np.ndarray, radius_map: np.ndarray, method: str = "auto") -> np.ndarray:
        """Filter on the device and return float32 (H, W, C); method "auto" is best_vla_method()."""
        self.set_image(image)
        self.set_radius_map(radius_map)
        if method == "auto":
            method = self.best_vla_method()
        self.run(method)
        return self.result(method)
