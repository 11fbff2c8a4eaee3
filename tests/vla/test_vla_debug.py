"""Index checks of the kernel-side API, active in Taichi's debug mode (ti.init(debug=True))."""
import os

import numpy as np
import pytest
import taichi as ti

from vla import VLA, launch
from vla import layout as vla_layout

ARCH = os.environ.get("SMOLVLA_TEST_ARCH", "cpu")
CPU_OPTIONS = {"cpu": {"advanced_optimization": False}}   # (as in test_vla.py: half the compile time on the CPU)


@pytest.fixture(scope="module", autouse=True)
def taichi_debug_runtime():
    ti.init(arch=getattr(ti, ARCH), debug=True, **CPU_OPTIONS.get(ARCH, {}))
    yield
    ti.reset()


@ti.kernel
def k_get(v: ti.template(), i: ti.i32, k: ti.i32) -> ti.i32:
    return v.get(i, k)


@ti.kernel
def k_append(v: ti.template(), i: ti.i32, x: ti.i32):
    v.append(i, x)


@ti.kernel
def k_fill(v: ti.template(), n: ti.i32):
    for j in range(n):
        v.append(j % v.num_arrays, j)


def test_out_of_range_index_is_reported_in_debug_mode():
    v = VLA(3, ti.i32, inline_capacity=1, chunk_size=2, name="dbg")
    v.from_csr(np.array([0, 2, 2, 3]), np.array([5, 6, 7], np.int32))
    assert k_get(v, 0, 1) == 6
    with pytest.raises(ti.TaichiAssertionError, match="index out of range"):
        k_get(v, 0, 2)  # k == length
    with pytest.raises(ti.TaichiAssertionError, match="index out of range"):
        k_get(v, 3, 0)  # list index == num_arrays
    with pytest.raises(ti.TaichiAssertionError, match="list index out of range"):
        k_append(v, -1, 0)


@pytest.mark.parametrize("runs", ["bump", "ordered"])
def test_growth_in_debug_mode_recompiles_and_stays_correct(runs):
    # Debug bounds checks bake field shapes into the code, so growth must drop compiled kernels. (runs="ordered"
    # reads table_start[i + 1] and the hint after the block: both inside their fields, which the checks verify.)
    v = VLA(4, ti.i32, inline_capacity=1, chunk_size=2, runs=runs, name="dbg-grow")
    launch(k_fill, v, 400)
    assert v.stats()["recompile_events"] >= 1
    assert sorted(v.to_lists()[1]) == list(range(1, 400, 4))


@ti.kernel
def k_walk_sum(v: ti.template()) -> ti.i64:
    # one thread walks every slot in order through _flat_index_after (flat_reduce's walker) (the owner of each slot the next one's start)
    acc = ti.i64(0)
    ti.loop_config(serialize=True)
    for _ in range(1):
        prev = -1
        for e in range(v.flat_size()):
            i, k, o = v._flat_index_after(e, prev)
            prev = o
            if i >= 0:
                acc += v.flat_value(e) + 0 * k
    return acc


@ti.func
def _sum_x(acc, i, k, x):
    return acc + x + 0 * (i + k)


@ti.kernel
def k_flat_reduce_sum(v: ti.template(), seg: ti.template()) -> ti.i64:
    # flat_reduce, `seg` slots a thread: every thread's loads, steps and searches bounds-checked
    acc = ti.i64(0)
    n = v.flat_size()
    for g in range((n + seg - 1) // seg):
        acc += v.flat_reduce(g * seg, seg, _sum_x, ti.i64(0))
    return acc


@pytest.mark.parametrize("runs", ["bump", "ordered"])
@pytest.mark.parametrize("last", [0, 7])
def test_flat_walk_stays_inside_its_fields_in_debug_mode(runs, last, monkeypatch):
    # _flat_index_after steps to table_start[owner + 1] and, past the last list, to table_start[num_arrays] (the
    # pool's end, ordered) and the last hint: the debug checks verify each index on every slot of a whole walk,
    # empty lists (runs of no chunks) at the start and in the middle included, the last list empty or not.
    lens = np.array([0, 5, 0, 0, 9, 1, 0, 12, last], np.int64)
    monkeypatch.setattr(vla_layout, "HINT_EVERY", 2)   # (ordered: several hint blocks in a small pool)
    v = VLA(lens.size, ti.i32, inline_capacity=1, chunk_size=2, runs=runs, name=f"dbg-walk-{runs}-{last}")
    offsets = np.concatenate([[0], np.cumsum(lens)])
    vals = np.arange(1, offsets[-1] + 1, dtype=np.int32) * 3
    v.from_csr(offsets, vals)
    assert k_walk_sum(v) == int(vals.sum())
    assert k_flat_reduce_sum(v, 4) == int(vals.sum())   # (33 or 39 slots: the last thread takes one or three)
