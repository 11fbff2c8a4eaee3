"""Choosing inline_capacity and chunk_size for a length distribution: VLA.tune."""
import numpy as np
import taichi as ti

from . import layout
from .layout import element_bytes, storage_bytes

RUNS = ("bump", "ordered")


def check_runs(runs, what="VLA"):
    if runs not in RUNS:
        raise ValueError(f"{what}: runs must be 'bump' or 'ordered', got {runs!r}")


def tune(lengths, dtype=ti.i32, runs="bump", inline_options=(0, 1, 2, 3, 4, 6, 8, 12, 16),
         chunk_options=(1, 2, 4, 8, 16, 32, 64)) -> dict:
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
    lens = lens.astype(np.int64)
    vals, counts = np.unique(lens, return_counts=True)
    live = float((vals * counts).sum()) * element_bytes(dtype)
    eb = storage_bytes(dtype)
    list_meta, chunk_meta = (8, 4 / layout.HINT_EVERY) if runs == "ordered" else (12, 4)
    best = None
    for ic in inline_options:
        for cs in chunk_options:
            chunks = ((np.maximum(0, vals - ic) + cs - 1) // cs * counts).sum()
            reserved = lens.size * (ic * eb + list_meta) + chunks * (cs * eb + chunk_meta)
            if best is None or reserved < best[0]:
                best = (reserved, ic, cs)
    reserved, ic, cs = best
    return {"inline_capacity": int(ic), "chunk_size": int(cs), "runs": runs, "reserved_bytes": int(reserved),
            "live_bytes": int(live), "ratio": float(reserved / live) if live else float("inf")}
