"""Choosing inline_capacity and chunk_size for a length distribution: VLA.tune, and the choice a VLA makes itself.

A VLA constructed without ``inline_capacity`` / ``chunk_size`` chooses them: whenever it grows through the host (the
first fill from empty, a pool that must be compacted, reserve, from_csr) it knows every list's demand, asks the
model below for the layout that reserves least, and re-lays itself out when that saves at least
``RETUNE_GAIN`` of what its current layout would reserve for the same lengths (vla.growth.Growth._retune).
"""
import numpy as np
import taichi as ti

from . import layout
from .layout import element_bytes, storage_bytes

RUNS = ("bump", "ordered")
INLINE_OPTIONS = (0, 1, 2, 3, 4, 6, 8, 12, 16)
CHUNK_OPTIONS = (1, 2, 4, 8, 16, 32, 64)
# The layout a VLA that chooses its own starts with, before it has seen any length: small, because its inline part
# is reserved for every list at once; the first growth through the host replaces it if another saves more.
AUTO_START = (2, 4)
# A re-layout copies every element and makes every kernel compiled against the VLA compile again, so the VLA changes
# its layout only when the new one reserves at most 1/1.15 of the current one for the demand it sees.
RETUNE_GAIN = 1.15


def check_runs(runs, what="VLA"):
    if runs not in RUNS:
        raise ValueError(f"{what}: runs must be 'bump' or 'ordered', got {runs!r}")


def histogram(lengths):
    """(values, counts) of non-negative integer lengths: bincount when the longest is moderate, else unique."""
    lens = np.asarray(lengths).astype(np.int64, copy=False)
    top = int(lens.max()) if lens.size else 0
    if top <= (1 << 20):
        counts = np.bincount(lens)
        vals = np.nonzero(counts)[0]
        return vals, counts[vals]
    return np.unique(lens, return_counts=True)


def modeled_bytes(vals, counts, ic, cs, dtype, runs) -> int:
    """Bytes a VLA of ``dtype`` with this layout reserves for lists of these lengths (vals, counts), without growth
    headroom: every list's inline slots and metadata, each list's whole chunks and their metadata."""
    eb = storage_bytes(dtype)
    list_meta, chunk_meta = (8, 4 / layout.HINT_EVERY) if runs == "ordered" else (12, 4)
    chunks = ((np.maximum(0, vals - ic) + cs - 1) // cs * counts).sum()
    return int(counts.sum() * (ic * eb + list_meta) + chunks * (cs * eb + chunk_meta))


def tune(lengths, dtype=ti.i32, runs="bump", inline_options=INLINE_OPTIONS, chunk_options=CHUNK_OPTIONS) -> dict:
    """(inline_capacity, chunk_size) that minimise the bytes a VLA of ``dtype`` reserves for lists of these lengths.

    ``lengths``: observed per-list lengths. The model counts what the VLA really reserves: inline slots for every
    list, whole chunks for the rest of each list (elements in their storage size: a struct stored as 64-bit words
    with its padding), and the metadata of ``runs``: "bump", 12 bytes a list (length, run start and length) and 4 a
    chunk (its owner, for flat iteration); "ordered", 8 bytes a list and 4 per HINT_EVERY chunks. A list's chunks
    are contiguous, so the choice hardly changes the speed of reads. Returns a dict: inline_capacity, chunk_size,
    runs, reserved_bytes, live_bytes and their ratio."""
    lens = np.asarray(lengths)
    if lens.ndim != 1 or lens.size == 0 or not np.issubdtype(lens.dtype, np.integer) or (lens < 0).any():
        raise ValueError("VLA.tune: lengths must be a non-empty 1-D array of non-negative ints")
    check_runs(runs, "VLA.tune")
    vals, counts = histogram(lens)
    live = float((vals * counts).sum()) * element_bytes(dtype)
    best = None
    for ic in inline_options:
        for cs in chunk_options:
            reserved = modeled_bytes(vals, counts, ic, cs, dtype, runs)
            if best is None or reserved < best[0]:
                best = (reserved, ic, cs)
    reserved, ic, cs = best
    return {"inline_capacity": int(ic), "chunk_size": int(cs), "runs": runs, "reserved_bytes": int(reserved),
            "live_bytes": int(live), "ratio": float(reserved / live) if live else float("inf")}
