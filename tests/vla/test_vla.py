"""VLA behaviour against plain-Python references. One ti.init for the module (Taichi compiles every
kernel once per VLA instance, so tests share a few VLAs where they can)."""
import os
from collections import Counter

import numpy as np
import pytest
import taichi as ti
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from peek import peek_lists
from vla import VLA, Batch, VLACapacityError, VLAOverflowError, launch
from vla import layout as vla_layout

NO_FAILURE = Batch.NO_FAILURE

ARCH = os.environ.get("SMOLVLA_TEST_ARCH", "cpu")
# On the CPU without Taichi's own IR optimisations, as the app runs there (app.runtime.CPU_OPTIONS): the module's
# time is compiling kernels, about half of it in those passes, and LLVM still optimises the code.
CPU_OPTIONS = {"cpu": {"advanced_optimization": False}}


@pytest.fixture(scope="module", autouse=True)
def taichi_runtime():
    ti.init(arch=getattr(ti, ARCH), random_seed=0, **CPU_OPTIONS.get(ARCH, {}))
    yield
    ti.reset()


# ---------------------------------------------------------------------------------------------- kernels
_i32_nd = ti.types.ndarray(dtype=ti.i32, ndim=1)


@ti.kernel
def k_append_pairs(v: ti.template(), owner: _i32_nd, value: _i32_nd, n: ti.i32):
    for j in range(n):
        v.append(owner[j], value[j])


@ti.kernel
def k_append_pairs_slots(v: ti.template(), owner: _i32_nd, value: _i32_nd, n: ti.i32, slot: _i32_nd):
    for j in range(n):
        slot[j] = v.append(owner[j], value[j])


@ti.kernel
def k_clear_some(v: ti.template(), ids: _i32_nd, n: ti.i32):
    for j in range(n):
        v.clear(ids[j])


@ti.kernel
def k_set(v: ti.template(), i: ti.i32, k: ti.i32, x: ti.i32):
    v.set(i, k, x)


@ti.kernel
def k_get(v: ti.template(), i: ti.i32, k: ti.i32) -> ti.i32:
    return v.get(i, k)


@ti.kernel
def k_length(v: ti.template(), i: ti.i32) -> ti.i32:
    return v.length(i)


@ti.kernel
def k_read_all(v: ti.template(), out: _i32_nd):
    for i in range(v.num_arrays):
        s = 0
        for k in range(v.length(i)):
            s += v.get(i, k)
        out[i] = s


@ti.kernel
def k_flat_sum(v: ti.template(), out: _i32_nd):
    for e in range(v.flat_size()):
        i, k = v.flat_index(e)
        if i >= 0:
            ti.atomic_add(out[i], v.flat_value(e) + 0 * k)


@ti.kernel
def k_flat_walk_sum(v: ti.template(), out: _i32_nd, seg: ti.i32, stride: ti.i32):
    # each thread walks `seg` slots, `stride` apart, through _flat_index_after (flat_reduce's walker: the list found
    # for one slot is the next one's start; runs="ordered" steps forward, or searches when the walk jumped more than
    # a few lists);
    # strides 1..3 with seg 7 cover every slot exactly once: thread g of residue r takes r + stride*(seg*g + j)
    n = v.flat_size()
    for g in range(stride * ((n + seg * stride - 1) // (seg * stride))):
        r = g % stride
        e = r + stride * seg * (g // stride)
        prev = -1
        for _j in range(seg):
            if e < n:
                i, k, o = v._flat_index_after(e, prev)
                prev = o
                if i >= 0:
                    ti.atomic_add(out[i], v.flat_value(e) + 0 * k)
            e += stride


_i64_nd = ti.types.ndarray(dtype=ti.i64, ndim=1)


@ti.func
def _flat_term(acc, i, k, x):
    # one element's term in flat_reduce's check: a wrong list or index, a wrong value, a lost or a doubled element
    # changes the sum (terms are positive: x > -100 in these tests, the hypothesis sequences' values included)
    return acc + ti.cast(i * 40503 + k * 97 + 1, ti.i64) * ti.cast(x + 100, ti.i64)


@ti.func
def _flat_one(acc, i, k, x):
    return acc + 1


@ti.kernel
def k_flat_reduce_check(v: ti.template(), out: _i64_nd, seg: ti.template()):
    # each thread folds `seg` neighbouring slots (the last thread's run past flat_size(): the one-at-a-time path)
    n = v.flat_size()
    for g in range((n + seg - 1) // seg):
        ti.atomic_add(out[0], v.flat_reduce(g * seg, seg, _flat_term, ti.i64(0)))
        ti.atomic_add(out[1], v.flat_reduce(g * seg, seg, _flat_one, ti.i64(0)))


def assert_flat_reduce_exact(v, segs=(8,)):
    """flat_reduce over every slot, `seg` slots a thread, against the (list, index, value) of every element as
    to_lists() reports them."""
    lists = v.to_lists()
    i = np.repeat(np.arange(len(lists), dtype=np.int64), [len(l) for l in lists])
    k = np.concatenate([np.arange(len(l), dtype=np.int64) for l in lists] + [np.zeros(0, np.int64)])
    x = np.concatenate([np.asarray(l, np.int64) for l in lists] + [np.zeros(0, np.int64)])
    assert x.size == 0 or x.min() > -100
    expect = [int(((i * 40503 + k * 97 + 1) * (x + 100)).sum()), int(x.size)]
    out = ti.ndarray(ti.i64, 2)
    for seg in segs:
        out.fill(0)
        k_flat_reduce_check(v, out, seg)
        assert out.to_numpy().tolist() == expect, f"flat_reduce, {seg} slots a thread"


@ti.func
def _poly(acc, x):
    return acc * 3 + x  # order-sensitive, so a wrong visiting order is caught


@ti.kernel
def k_fold_in_order(v: ti.template(), out: ti.types.ndarray(dtype=ti.i64, ndim=1)):
    for i in range(v.num_arrays):
        acc = ti.i64(0)
        for k in range(v.length(i)):
            acc = _poly(acc, v.get(i, k))
        out[i] = acc


@ti.func
def _sum_sq(acc, x):
    return acc + x * x


@ti.func
def _add(a, b):
    return a + b


@ti.func
def _max_f(acc, x):
    return ti.max(acc, ti.cast(x, ti.f32) * 0.5)


@ti.func
def _max2(a, b):
    return ti.max(a, b)


@ti.kernel
def k_reduce_warp(v: ti.template(), sums: ti.types.ndarray(dtype=ti.i32, ndim=1),
                  maxes: ti.types.ndarray(dtype=ti.f32, ndim=1), branch: ti.types.ndarray(dtype=ti.i32, ndim=1)):
    for i in range(v.num_arrays):
        sums[i] = v.reduce_warp(i, _sum_sq, 0, _add)
        maxes[i] = v.reduce_warp(i, _max_f, -1e30, _max2)
        if i % 3 != 0:   # a call that some threads of a warp skip: each thread then reads its list alone
            branch[i] = v.reduce_warp(i, _sum_sq, 0, _add)


@ti.kernel
def k_dump(v: ti.template(), dense: ti.template(), lens: ti.template()):
    for i in range(v.num_arrays):
        lens[i] = v.length(i)
        for k in range(v.length(i)):
            dense[i, k] = v.get(i, k)


@ti.kernel
def k_contend(v: ti.template(), n: ti.i32):
    for j in range(n):
        v.append(0, j)


@ti.kernel
def k_fill_mod(v: ti.template(), n: ti.i32):
    for j in range(n):
        v.append(j % v.num_arrays, j)


@ti.kernel
def k_refill_pairs(v: ti.template(), owner: _i32_nd, value: _i32_nd, n: ti.i32):
    """Empty every list, then append: a rebuild, safe to run again as a whole (like the simulator's kernels)."""
    for i in range(v.num_arrays):
        v.clear(i)
    for j in range(n):
        v.append(owner[j], value[j])


@ti.kernel
def k_copy_lists(src: ti.template(), dst: ti.template()):
    """dst's lists := src's (a launch that reads what an earlier launch of a Batch appended)."""
    for i in range(dst.num_arrays):
        dst.clear(i)
    for i in range(src.num_arrays):
        for k in range(src.length(i)):
            dst.append(i, src.get(i, k) + 1)


def _pairs_nd(owner, value):
    owner = np.asarray(owner, np.int32)
    value = np.asarray(value, np.int32)
    o = ti.ndarray(ti.i32, shape=max(len(owner), 1))
    x = ti.ndarray(ti.i32, shape=max(len(owner), 1))
    if len(owner):
        o.from_numpy(owner)
        x.from_numpy(value)
    return o, x, len(owner)


def append_pairs(v, owner, value, use_launch=True):
    owner = np.asarray(owner, np.int32)
    value = np.asarray(value, np.int32)
    n = len(owner)
    o = ti.ndarray(ti.i32, shape=max(n, 1))
    x = ti.ndarray(ti.i32, shape=max(n, 1))
    if n:
        o.from_numpy(owner)
        x.from_numpy(value)
    if use_launch:
        launch(k_append_pairs, v, o, x, n)
    else:
        k_append_pairs(v, o, x, n)


def sorted_lists(v):
    return [sorted(l) for l in v.to_lists()]


# ---------------------------------------------------------------------------------------------- basics
def test_append_get_length_set_clear():
    v = VLA(5, ti.i32, inline_capacity=2, chunk_size=4, name="basic")
    s = ti.ndarray(ti.i32, shape=3)
    o = ti.ndarray(ti.i32, shape=3)
    x = ti.ndarray(ti.i32, shape=3)
    o.from_numpy(np.array([1, 1, 1], np.int32))
    x.from_numpy(np.array([10, 11, 12], np.int32))
    launch(k_append_pairs_slots, v, o, x, 3, s)
    assert sorted(s.to_numpy().tolist()) == [0, 1, 2]  # append returns distinct indices 0..n-1
    slots = s.to_numpy()
    for j in range(3):  # the returned slot is where the value lives
        assert k_get(v, 1, int(slots[j])) == 10 + j
    assert k_length(v, 1) == 3 and k_length(v, 0) == 0
    # grow list 1 into the pool (inline 2, chunk 4) and across a chunk boundary
    append_pairs(v, [1] * 7, range(100, 107))
    assert k_length(v, 1) == 10
    assert sorted_lists(v)[1] == sorted([10, 11, 12] + list(range(100, 107)))
    k_set(v, 1, 0, -5)   # inline slot
    k_set(v, 1, 9, -9)   # pool slot, second chunk
    assert k_get(v, 1, 0) == -5 and k_get(v, 1, 9) == -9
    ids = ti.ndarray(ti.i32, shape=1)
    ids.from_numpy(np.array([1], np.int32))
    chunks = v.stats()["pool_chunks_used"]
    k_clear_some(v, ids, 1)
    assert k_length(v, 1) == 0
    assert v.stats()["pool_chunks_used"] == chunks  # lazy release: clear keeps the chunks
    assert v.lengths().tolist() == [0, 0, 0, 0, 0]


@ti.kernel
def k_append_runs(v: ti.template(), owner: _i32_nd, start: _i32_nd, size: _i32_nd, n: ti.i32):
    # run j: size[j] values start[j], start[j] + 1, ... into list owner[j], through append_n and put; a run of
    # size 1 through append (both kinds race on the same lists)
    for j in range(n):
        if size[j] == 1:
            v.append(owner[j], start[j])
        else:
            first = v.append_n(owner[j], size[j])
            for q in range(size[j]):
                v.put(owner[j], first + q, start[j] + q)


_RUNS_VLA = None


@given(st.lists(st.tuples(st.integers(0, 7), st.integers(1, 6)), min_size=1, max_size=120))
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_append_n_keeps_each_run_together_and_in_order(runs):
    # Reference: each list holds exactly its runs' values, and every run of append_n sits in consecutive slots in
    # its own order, wherever the runs of other threads landed (small inline part and chunks: most of them go
    # through the overflow area and the commit's growth).
    global _RUNS_VLA
    if _RUNS_VLA is None:   # (one VLA for every example: its kernels compile once)
        _RUNS_VLA = VLA(8, ti.i32, inline_capacity=1, chunk_size=2, name="runs")
    v = _RUNS_VLA
    v.clear_all()
    owner = np.array([o for o, _ in runs], np.int32)
    size = np.array([k for _, k in runs], np.int32)
    start = (np.arange(len(runs), dtype=np.int32) * 100)
    args = []
    for a in (owner, start, size):
        nd = ti.ndarray(ti.i32, shape=len(runs))
        nd.from_numpy(a)
        args.append(nd)
    launch(k_append_runs, v, *args, len(runs))
    lists = v.to_lists()
    for i in range(8):
        want = sorted(int(start[j]) + q for j in range(len(runs)) if owner[j] == i for q in range(size[j]))
        assert sorted(lists[i]) == want
        for j in np.flatnonzero(owner == i):
            at = lists[i].index(int(start[j]))
            assert lists[i][at:at + size[j]] == [int(start[j]) + q for q in range(size[j])], (i, j, lists[i])


def test_csr_roundtrip_lists_and_read_paths():
    rng = np.random.default_rng(1)
    lens = rng.integers(0, 40, size=50)
    lens[3] = 0
    offsets = np.concatenate([[0], np.cumsum(lens)])
    values = rng.integers(-1000, 1000, size=offsets[-1]).astype(np.int32)
    v = VLA(50, ti.i32, inline_capacity=3, chunk_size=8, name="csr")
    v.from_csr(offsets, values)
    off2, val2 = v.to_csr()
    assert off2.dtype == np.int32 and off2.shape == (51,)
    np.testing.assert_array_equal(off2, offsets)
    np.testing.assert_array_equal(val2, values)  # from_csr keeps order; to_csr returns it
    lists = v.to_lists()
    assert lists[7] == values[offsets[7]:offsets[8]].tolist()
    out = ti.ndarray(ti.i32, shape=50)
    k_read_all(v, out)
    expect = np.array([values[offsets[i]:offsets[i + 1]].sum() for i in range(50)])
    np.testing.assert_array_equal(out.to_numpy(), expect)
    flat = ti.ndarray(ti.i32, shape=50)
    flat.fill(0)
    k_flat_sum(v, flat)
    np.testing.assert_array_equal(flat.to_numpy(), expect)


@pytest.mark.parametrize("ic,cs", [(0, 1), (4, 4)])
def test_reduce_warp_matches_numpy(ic, cs):
    """reduce_warp's combination of partial folds gives the numpy result: a sum of squares (f and combine
    differ), a max over f32, and a call under a branch, on a heavy-tailed distribution (many lists of a few
    elements, a few of hundreds: on CUDA those are read by their warp together) with a partial last warp
    (1,000 lists). On the CPU this checks the serial fold; SMOLVLA_TEST_ARCH=cuda checks the warp path."""
    rng = np.random.default_rng(7 + ic)
    n = 1000
    lens = rng.integers(0, 9, size=n)
    long = rng.random(n) < 0.05
    lens[long] = rng.integers(9, 700, size=int(long.sum()))
    lens[31], lens[32], lens[999] = 1000, 40, 333   # a warp's last lane, the next warp's first, the last list
    offsets = np.concatenate([[0], np.cumsum(lens)])
    values = rng.integers(-50, 51, size=offsets[-1]).astype(np.int32)
    v = VLA(n, ti.i32, inline_capacity=ic, chunk_size=cs, name=f"warp{ic}{cs}")
    v.from_csr(offsets, values)
    sums = ti.ndarray(ti.i32, shape=n)
    maxes = ti.ndarray(ti.f32, shape=n)
    branch = ti.ndarray(ti.i32, shape=n)
    branch.fill(-7)
    k_reduce_warp(v, sums, maxes, branch)
    segs = [values[offsets[i]:offsets[i + 1]].astype(np.int64) for i in range(n)]
    expect_sum = np.array([int((s * s).sum()) for s in segs])
    expect_max = np.array([(s.max() * 0.5 if len(s) else -1e30) for s in segs], dtype=np.float32)
    np.testing.assert_array_equal(sums.to_numpy(), expect_sum)
    np.testing.assert_array_equal(maxes.to_numpy(), expect_max)
    skipped = np.arange(n) % 3 == 0
    np.testing.assert_array_equal(branch.to_numpy()[~skipped], expect_sum[~skipped])
    assert (branch.to_numpy()[skipped] == -7).all()


@pytest.mark.parametrize("ic,cs", [(0, 1), (3, 4), (2, 32)])
def test_get_loop_visits_in_order(ic, cs):
    rng = np.random.default_rng(ic + cs)
    lens = rng.integers(0, 150, size=20)
    lens[0], lens[1] = 0, 149
    offsets = np.concatenate([[0], np.cumsum(lens)])
    values = rng.integers(-3, 4, size=offsets[-1]).astype(np.int32)
    v = VLA(20, ti.i32, inline_capacity=ic, chunk_size=cs, name=f"red{ic}{cs}")
    v.from_csr(offsets, values)
    out = ti.ndarray(ti.i64, shape=20)
    k_fold_in_order(v, out)
    expect = []
    for i in range(20):
        acc = 0
        for x in values[offsets[i]:offsets[i + 1]]:
            acc = acc * 3 + int(x)
        expect.append(((acc + 2**63) % 2**64) - 2**63)  # i64 wrap-around, as on the device
    assert out.to_numpy().tolist() == expect


def test_vector_elements():
    v = VLA(4, ti.types.vector(3, ti.f32), inline_capacity=1, chunk_size=2, name="vec")
    offsets = np.array([0, 2, 2, 7, 8])
    vals = np.arange(24, dtype=np.float32).reshape(8, 3)
    v.from_csr(offsets, vals)
    off2, val2 = v.to_csr()
    np.testing.assert_array_equal(val2, vals)
    assert [len(l) for l in v.to_lists()] == [2, 0, 5, 1]


Contact = ti.types.struct(point=ti.types.vector(3, ti.f32), depth=ti.f32, other=ti.i32)


@ti.kernel
def k_struct_fill(v: ti.template(), n: ti.i32):
    for j in range(n):
        v.append(j % v.num_arrays, Contact(point=ti.Vector([j, 2.0 * j, -1.0]), depth=0.5 * j, other=j))


@ti.kernel
def k_struct_depth_sum(v: ti.template(), out: ti.types.ndarray(dtype=ti.f32, ndim=1)):
    for i in range(v.num_arrays):
        s = 0.0
        for k in range(v.length(i)):
            c = v.get(i, k)
            s += c.depth + c.point[1]
        out[i] = s


@ti.kernel
def k_struct_bump_depth(v: ti.template()):
    """depth += point.y through the member accessors (other members must stay untouched)."""
    for i in range(v.num_arrays):
        for k in range(v.length(i)):
            v.set_member(i, k, "depth", v.get_member(i, k, "depth") + v.get_member(i, k, "point")[1])


@ti.kernel
def k_struct_set_members(v: ti.template()):
    """depth -> -depth, other -> other + 1000 through set_members; the point changed in the value only."""
    for i in range(v.num_arrays):
        for k in range(v.length(i)):
            r = v.get(i, k)
            r.depth = -r.depth
            r.other = r.other + 1000
            r.point = ti.Vector([0.0, 0.0, 0.0])
            v.set_members(i, k, r, ("depth", "other"))


@ti.func
def _depth_and_list(acc, i, k, x):
    return acc + ti.Vector([x.depth, ti.cast(i, ti.f32) * x.point[1]])


@ti.kernel
def k_struct_flat_reduce(v: ti.template()) -> ti.types.vector(2, ti.f32):
    # flat_reduce over struct elements: the record's members reach the fold
    acc = ti.Vector([0.0, 0.0])
    for g in range((v.flat_size() + 7) // 8):
        acc += v.flat_reduce(g * 8, 8, _depth_and_list, ti.Vector([0.0, 0.0]))
    return acc


# The same record with a 64-bit member: stored whole, where Contact (32-bit members only) is stored as 64-bit words.
Contact64 = ti.types.struct(point=ti.types.vector(3, ti.f32), depth=ti.f64, other=ti.i32)


@pytest.mark.parametrize("dtype", [Contact, Contact64], ids=["words", "whole"])
def test_struct_elements(dtype):
    words = dtype is Contact
    v = VLA(7, dtype, inline_capacity=2, chunk_size=4, name=f"contacts_{words}")
    assert (v._words is not None) == words
    launch(k_struct_fill, v, 200)
    offsets, vals = v.to_csr()
    assert set(vals) == {"point", "depth", "other"}
    assert vals["point"].shape == (200, 3)
    for i in range(7):
        other = vals["other"][offsets[i]:offsets[i + 1]]
        assert sorted(other.tolist()) == list(range(i, 200, 7))
        order = np.argsort(other)
        pts = vals["point"][offsets[i]:offsets[i + 1]][order]
        np.testing.assert_allclose(pts[:, 1], 2.0 * np.arange(i, 200, 7))
        np.testing.assert_allclose(vals["depth"][offsets[i]:offsets[i + 1]][order], 0.5 * np.arange(i, 200, 7))
    out = ti.ndarray(ti.f32, shape=7)
    k_struct_depth_sum(v, out)
    expect = [sum(2.5 * j for j in range(i, 200, 7)) for i in range(7)]
    np.testing.assert_allclose(out.to_numpy(), expect, rtol=1e-5)
    owner = np.repeat(np.arange(7), np.diff(offsets))
    np.testing.assert_allclose(k_struct_flat_reduce(v), [vals["depth"].sum(), (owner * vals["point"][:, 1]).sum()],
                               rtol=1e-5)
    k_struct_bump_depth(v)  # member write: depth 0.5 j -> 2.5 j, point and other unchanged
    o2, after = v.to_csr()
    np.testing.assert_array_equal(o2, offsets)
    np.testing.assert_allclose(after["depth"], vals["depth"] + vals["point"][:, 1])
    np.testing.assert_array_equal(after["point"], vals["point"])
    np.testing.assert_array_equal(after["other"], vals["other"])
    st = v.stats()  # live bytes count the members (20 or 24 per element), reserved bytes what storage takes
    assert st["live_bytes"] == 200 * (20 if words else 24)
    slot_bytes = 24   # words: 5 members -> 3 u64 words, padding included; whole: 12 + 8 + 4 bytes
    assert st["element_reserved_bytes"] == (st["reserved_elements"] + st["overflow_capacity"]) * slot_bytes
    k_struct_set_members(v)
    o4, sm = v.to_csr()
    np.testing.assert_array_equal(sm["depth"], -after["depth"])
    np.testing.assert_array_equal(sm["other"], after["other"] + 1000)
    np.testing.assert_array_equal(sm["point"], after["point"])
    v2 = VLA(7, dtype, inline_capacity=0, chunk_size=2, name=f"contacts2_{words}")  # no inline tier
    v2.from_csr(offsets, vals)
    o3, v3 = v2.to_csr()
    for key in vals:
        np.testing.assert_array_equal(v3[key], vals[key])


Packed = ti.types.struct(a=ti.types.vector(2, ti.f32), b=ti.i32, c=ti.u32, d=ti.f32)   # 5 slots: 3 words


@ti.kernel
def k_rewrite_words(v: ti.template()):
    """Every element through get/set and every member through get_member/set_member: bits must survive."""
    for i in range(v.num_arrays):
        for k in range(v.length(i)):
            v.set(i, k, v.get(i, k))
            v.set_member(i, k, "b", v.get_member(i, k, "b"))
            v.set_member(i, k, "a", v.get_member(i, k, "a"))
            v.set_member(i, k, "d", v.get_member(i, k, "d"))
            v.set_member(i, k, "c", v.get_member(i, k, "c"))
            v.set_members(i, k, v.get(i, k), ("b", "d"))   # one word read back (c's half), one blind
            v.set_members(i, k, v.get(i, k), ("a",))


_WORDS = {}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lens=st.lists(st.integers(0, 9), min_size=5, max_size=5), seed=st.integers(0, 2**31 - 1))
def test_words_keep_every_bit(lens, seed):
    """A struct of 32-bit members is stored two members to a 64-bit word: any bit pattern (NaN payloads, -0.0,
    denormals) comes back unchanged through the host transfer and through kernel-side
    get/set/get_member/set_member."""
    if "v" not in _WORDS:
        _WORDS["v"] = VLA(5, Packed, inline_capacity=2, chunk_size=2, name="words")
    v = _WORDS["v"]
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    bits = np.random.default_rng(seed).integers(0, 2**32, size=(offsets[-1], 5), dtype=np.uint64).astype(np.uint32)
    vals = {"a": bits[:, 0:2].copy().view(np.float32), "b": bits[:, 2].copy().view(np.int32), "c": bits[:, 3].copy(),
            "d": bits[:, 4].copy().view(np.float32)}
    v.from_csr(offsets, vals)
    k_rewrite_words(v)
    o2, got = v.to_csr()
    np.testing.assert_array_equal(o2, offsets)
    for key in vals:
        assert got[key].tobytes() == vals[key].tobytes(), key


# ---------------------------------------------------------------------------------------------- contention / overflow
def test_contention_one_list_every_value_once():
    v = VLA(3, ti.i32, inline_capacity=4, chunk_size=16, name="contend")
    launch(k_contend, v, 100_000)
    offsets, vals = v.to_csr()
    assert offsets.tolist() == [0, 100_000, 100_000, 100_000]
    np.testing.assert_array_equal(np.sort(vals), np.arange(100_000))


def test_overflow_through_launch_loses_nothing():
    v = VLA(10, ti.i32, inline_capacity=2, chunk_size=8, reserve=100, overflow_capacity=64, name="small")
    assert v.stats()["pool_chunks_total"] * 8 + 20 <= 140  # really reserved for ~100 elements
    launch(k_fill_mod, v, 1_000_000)
    offsets, vals = v.to_csr()
    assert offsets[-1] == 1_000_000
    for i in (0, 3, 9):
        np.testing.assert_array_equal(np.sort(vals[offsets[i]:offsets[i + 1]]), np.arange(i, 1_000_000, 10))
    st_ = v.stats()
    assert st_["overflow_events"] >= 1 and st_["grow_events"] >= 1


def test_a_launch_that_ran_again_gives_the_overflow_area_back():
    """A fill from (nearly) empty parks almost every append: the overflow area grows to hold them and the lists to
    the demand; the run that fits parks none, so launch shrinks the area back (on the heavy tail it was a third of
    the VLA's memory), never below what it had before the call. Once in the VLA's life, again after trim()."""
    v = VLA(10, ti.i32, inline_capacity=2, chunk_size=8, overflow_capacity=64, name="giveback")
    launch(k_fill_mod, v, 100_000)
    st = v.stats()
    assert st["overflow_events"] >= 1 and st["overflow_capacity"] == 64
    assert sorted_lists(v)[3] == list(range(3, 100_000, 10))
    launch(k_fill_mod, v, 300_000)   # past the room again, appended to what is there: nothing lost; the area kept
    assert v.stats()["overflow_capacity"] > 300_000 - 100_000
    assert sorted_lists(v)[3] == sorted(list(range(3, 100_000, 10)) + list(range(3, 300_000, 10)))
    v.trim()
    v.clear_all()
    v.trim()
    assert v.stats()["overflow_capacity"] == 64
    launch(k_fill_mod, v, 50_000)   # emptied and trimmed: a fill from empty gives the area back again
    assert v.stats()["overflow_capacity"] == 64 and sorted_lists(v)[7] == list(range(7, 50_000, 10))
    # an area grown by a commit outside launch stays as large through a launch that runs again
    w = VLA(4, ti.i32, inline_capacity=1, chunk_size=2, overflow_capacity=8, name="kept")
    k_fill_mod(w, 400)
    with pytest.raises(VLAOverflowError):
        w.commit()
    grown = w.stats()["overflow_capacity"]
    assert grown > 8
    w.clear_all()
    launch(k_fill_mod, w, 40_000)
    assert w.stats()["overflow_capacity"] == grown and sorted_lists(w)[1] == list(range(1, 40_000, 4))


@ti.kernel
def k_rebuild(v: ti.template(), lens: _i32_nd):
    for i in range(v.num_arrays):
        v.clear(i)
        for k in range(lens[i]):
            v.append(i, k)


def test_per_frame_rebuilds_of_changing_lengths_do_not_run_again_every_frame():
    """The overflow area is given back once: a per-frame rebuild whose lengths change from frame to frame re-runs
    at its first fill and when it first outgrows the area given back, not frame after frame."""
    n = 2000
    v = VLA(n, ti.i32, name="rebuild")
    rng = np.random.default_rng(3)
    calls = []

    def frame(lens):
        calls.append(1)
        k_rebuild(v, lens)

    for f in range(12):
        lens = np.where(rng.random(n) < 0.05, rng.integers(20, 200, n), rng.integers(0, 9, n)).astype(np.int32)
        before = len(calls)
        launch(frame, lens, vlas=[v], rollback=False)
        assert v.lengths().tolist() == lens.tolist(), f
        if f >= 2:
            assert len(calls) - before == 1, f"frame {f} ran again"
    assert len(calls) <= 12 + 2


def test_commit_raises_on_loss_and_grows():
    v = VLA(4, ti.i32, inline_capacity=1, chunk_size=2, overflow_capacity=8, name="raise")
    k_fill_mod(v, 400)  # 100 per list, 1 inline each; overflow area of 8 cannot hold 396
    with pytest.raises(VLAOverflowError) as err:
        v.commit()
    assert err.value.appended == 396 and err.value.lost == 388 and "vla.launch" in str(err.value)
    # the VLA never returns wrong data: host reads refuse, naming the refill; a second commit raises nothing but the
    # reads still refuse; kernel reads see only appended values (each list cut to what reached its storage)
    v.commit()
    for read in (v.to_csr, v.to_lists, v.lengths):
        with pytest.raises(VLAOverflowError, match="lost by a kernel run without vla.launch"):
            read()
    dense = ti.field(ti.i32, shape=(4, 400))
    lens = ti.field(ti.i32, shape=4)
    k_dump(v, dense, lens)
    d, n = dense.to_numpy(), lens.to_numpy()
    assert 0 < n.sum() < 400
    for i in range(4):
        got = d[i, :n[i]].tolist()
        assert len(set(got)) == len(got) and all(x % 4 == i and 0 <= x < 400 for x in got), i
    # it grew to the demand: the same kernel now fits without overflow
    v.clear_all()
    k_fill_mod(v, 400)
    v.commit()
    assert sorted_lists(v)[2] == list(range(2, 400, 4))


def test_commit_moves_overflow_home_without_error():
    v = VLA(4, ti.i32, inline_capacity=1, chunk_size=2, overflow_capacity=1000, name="home")
    k_fill_mod(v, 400)
    v.commit()  # overflow area large enough: nothing lost, no error
    assert sorted_lists(v) == [list(range(i, 400, 4)) for i in range(4)]


@ti.kernel
def k_subset_walk(v: ti.template(), a: ti.i32, b: ti.i32, caps: _i32_nd, flat_sum: _i32_nd, flat_count: _i32_nd,
                  read_sum: _i32_nd) -> ti.i32:
    """For lists a..b-1: sums and counts over their inline slot range plus the pool's slots (flat walk of a
    subset, from the documented slot order: list i's inline slots are i * inline_capacity ..., then the pool), and
    sums of get(i, k) for k < min(length, capacity) (readable before a commit). Returns flat_size()."""
    for i in range(v.num_arrays):
        caps[i] = v.capacity(i)
    ic = v.inline_capacity
    n_inline = (b - a) * ic
    pool_begin = v.num_arrays * ic
    for e in range(n_inline + v.flat_size() - pool_begin):
        s = a * ic + e
        if e >= n_inline:
            s = pool_begin + e - n_inline
        i, k = v.flat_index(s)
        if i >= a and i < b:
            ti.atomic_add(flat_sum[i], v.flat_value(s) + 0 * k)
            ti.atomic_add(flat_count[i], 1)
    for i in range(a, b):
        t = 0
        for k in range(ti.min(v.length(i), v.capacity(i))):
            t += v.get(i, k)
        read_sum[i] = t
    return v.flat_size()


@pytest.mark.parametrize("runs", ["bump", "ordered"])
def test_capacity_and_flat_walk_of_a_list_subset_before_commit(runs):
    # capacity(i): whole chunks beyond the inline part, at least the committed length; the inline slots of
    # lists a..b-1 plus the pool's slots hold exactly their readable elements (k < capacity), which get()
    # also reads before the commit; the rest are pending. slot_capacity bounds flat_size() from the host.
    v = VLA(6, ti.i32, inline_capacity=2, chunk_size=4, overflow_capacity=1000, runs=runs, name="subset")
    lengths = [0, 3, 9, 2, 14, 5]
    ref = [list(range(100 * i, 100 * i + n)) for i, n in enumerate(lengths)]
    v.from_csr(np.concatenate([[0], np.cumsum(lengths)]), np.concatenate([np.array(r, np.int32) for r in ref]))
    owner = np.array([1, 1, 1, 1, 1, 2, 3, 3, 0, 4] * 3, np.int32)  # appends past some lists' room
    value = np.arange(5000, 5000 + owner.size, dtype=np.int32)
    k_append_pairs(v, owner, value, owner.size)
    for i, x in zip(owner, value):
        ref[i].append(int(x))
    caps, fs, fc, rs = (np.zeros(6, np.int32) for _ in range(4))
    flat_size = k_subset_walk(v, 1, 5, caps, fs, fc, rs)
    assert v.stats()["overflow_events"] == 0  # not committed yet
    assert all(c >= n and (c - 2) % 4 == 0 for c, n in zip(caps, lengths))
    for i in range(1, 5):
        readable = ref[i][: min(len(ref[i]), caps[i])]
        assert fc[i] == len(readable) and fs[i] == sum(readable) == rs[i], i
        assert len(ref[i]) > caps[i] or i == 4  # lists 1-3 really had pending elements
    assert fc[0] == fc[5] == 0  # outside the subset
    st = v.stats()
    assert v.slot_capacity == st["inline_elements"] + st["pool_chunks_total"] * 4 >= flat_size
    v.commit()
    assert v.to_lists() == ref


# ---------------------------------------------------------------------------------------------- memory
def test_memory_reuse_100_cycles():
    v = VLA(64, ti.i32, inline_capacity=2, chunk_size=4, name="reuse")
    runtime = ti.lang.impl.get_runtime()
    launch(k_fill_mod, v, 5000)
    v.clear_all()
    launch(k_fill_mod, v, 5000)
    before = v.stats()
    compiled = runtime.get_num_compiled_functions()
    for _ in range(100):
        v.clear_all()
        launch(k_fill_mod, v, 5000)
    after = v.stats()
    for key in ("grow_events", "overflow_events", "pool_chunks_total", "pool_chunks_used", "reserved_bytes",
                "recompile_events", "scratch_bytes", "device_bytes"):
        assert after[key] == before[key], key
    assert runtime.get_num_compiled_functions() == compiled  # nothing allocated, nothing recompiled
    assert sorted_lists(v)[5] == list(range(5, 5000, 64))


def test_scratch_is_counted_and_the_growth_buffers_are_given_back():
    """stats() counts the work buffers a VLA keeps (scratch_bytes; device_bytes = reserved + scratch): after a
    launch whose kernel overflowed, grew the pool through the host and ran again, and a trim, exactly the
    launch snapshot (num_arrays + 1 i32), the prefix sum's block sums and the one-element re-layout staging,
    i.e. the four list-sized growth buffers are given back; trim() frees the rest and the VLA works on (the next
    launch allocates its snapshot again)."""
    n = 3000
    v = VLA(n, ti.i32, inline_capacity=1, chunk_size=2, name="scratch")
    launch(k_fill_mod, v, 40 * n)   # more than the pool holds: the host compacts and grows it
    assert v.stats()["grow_events"] > 0
    st_ = v.stats()
    snapshot = 4   # (filled from empty: no snapshot of the lengths, only the count of appends parked before it)
    block_sums = v._scanner.scratch_bytes()
    assert block_sums > 0
    assert st_["scratch_bytes"] == snapshot + block_sums + 1 * 4
    assert st_["device_bytes"] == st_["reserved_bytes"] + st_["scratch_bytes"]
    for key in ("demand", "moved", "target", "new_start"):
        assert key not in v._scratch
    v.trim()
    assert v.stats()["scratch_bytes"] == 4   # the staging element
    v.clear_all()
    launch(k_fill_mod, v, 40 * n)
    assert v.stats()["scratch_bytes"] == snapshot + 4
    assert sorted_lists(v)[7] == list(range(7, 40 * n, n))
    launch(k_fill_mod, v, n)   # on lists that hold elements: a snapshot of every length to roll back to
    assert v._scratch["launch_snapshot"].shape == (n + 1,)


def test_trim_releases_and_keeps_contents():
    v = VLA(16, ti.i32, inline_capacity=2, chunk_size=4, name="trim")
    launch(k_fill_mod, v, 16 * 50)
    big = v.stats()["pool_chunks_total"]
    offsets = np.arange(17) * 3
    vals = np.arange(48, dtype=np.int32)
    v.from_csr(offsets, vals)
    v.trim()
    st_ = v.stats()
    assert st_["pool_chunks_total"] < big
    assert st_["pool_chunks_used"] == 16  # one chunk each for the 3rd element
    np.testing.assert_array_equal(v.to_csr()[1], vals)
    launch(k_fill_mod, v, 16 * 10)  # grows again after trim, nothing lost
    lists = sorted_lists(v)
    assert lists[4] == sorted([12, 13, 14] + list(range(4, 160, 16)))


def test_trim_with_slack_releases_what_lists_refilled_lower_leave_unused():
    # The lazy release, trim(slack): lists that met a peak and are refilled lower give their chunks back, the pool
    # keeping its growth headroom (1.1-1.2x what the lengths need, at least the pool it was made with); every element
    # stays in its list, in order; asked again it finds nothing to release, and a refill to the same lengths grows
    # nothing. Under the slack it moves nothing.
    n = 64
    v = VLA(n, ti.i32, inline_capacity=2, chunk_size=4, reserve=40, name="lazy")
    launch(k_fill_mod, v, n * 40)   # the peak: 40 a list
    v.clear_all()
    launch(k_fill_mod, v, n * 6)    # then 6 a list: 2 inline and one chunk
    before = v.stats()
    assert before["pool_chunks_total"] > 10 * n
    assert v.trim(slack=1.25)
    after = v.stats()
    assert n <= after["pool_chunks_total"] <= 1.2 * n + 1   # one chunk a list, with the headroom (rounded up)
    released = (before["pool_chunks_total"] - after["pool_chunks_total"]) * 4 * 4   # chunks of 4 int32
    assert before["reserved_bytes"] - after["reserved_bytes"] >= released
    assert sorted_lists(v) == [list(range(i, 6 * n, n)) for i in range(n)]
    assert not v.trim(slack=1.25)
    assert v.stats()["compact_events"] == after["compact_events"]
    v.clear_all()
    launch(k_fill_mod, v, n * 6)
    assert v.stats()["overflow_events"] == after["overflow_events"]   # nothing had to grow
    with pytest.raises(ValueError, match="slack"):
        v.trim(slack=1.0)
    # the pool it was made with is kept: emptied, the lists release down to it, no further
    v.clear_all()
    assert v.trim(slack=1.25)
    assert v.stats()["pool_chunks_total"] == 10   # reserve=40: 10 chunks


def test_permute_moves_lists_with_their_capacity():
    # permute(order, first, count): list first + k becomes list first + order[k], elements and chunks: the
    # same contents as a Python reference, nothing allocated, and refilling every list to its old length in
    # its new place grows nothing (the capacity went with the data). The flat walk (table_owner) names the
    # new owners.
    rng = np.random.default_rng(4)
    v = VLA(40, ti.i32, inline_capacity=2, chunk_size=4, name="perm")
    lens = rng.integers(0, 30, 40)
    lens[:3] = [0, 2, 29]
    ref = [list(rng.integers(-1000, 1000, n)) for n in lens]
    offsets = np.concatenate([[0], np.cumsum(lens)])
    v.from_csr(offsets, np.concatenate(ref).astype(np.int32))
    first, count = 5, 30
    order = rng.permutation(count)
    before = v.stats()
    v.permute(_order_field(order), first, count)
    want = ref[:first] + [ref[first + x] for x in order] + ref[first + count:]
    assert [list(map(int, l)) for l in v.to_lists()] == [list(map(int, l)) for l in want]
    out = ti.ndarray(ti.i32, shape=40)
    out.fill(0)
    k_flat_sum(v, out)
    assert out.to_numpy().tolist() == [int(sum(l)) for l in want]
    after = v.stats()
    for key in ("pool_chunks_total", "pool_chunks_used", "reserved_bytes", "grow_events", "overflow_events"):
        assert after[key] == before[key], key
    # refill each list to its length: within its own (moved) chunks, no growth
    new_lens = np.array([len(l) for l in want], np.int32)
    v.clear_all()
    owner = np.repeat(np.arange(40, dtype=np.int32), new_lens)
    append_pairs(v, owner.tolist(), list(range(owner.size)), use_launch=False)
    v.commit()
    assert v.stats()["grow_events"] == before["grow_events"] and v.lengths().tolist() == new_lens.tolist()
    with pytest.raises(ValueError, match="permute"):
        v.permute(_order_field(order), 20, 30)
    with pytest.raises(ValueError, match="overlap"):
        v.permute(_order_field(order[:8]), (0, 5), 8)
    # two ranges by one order, as a simulator's two contact generations
    cur = v.to_lists()
    order8 = rng.permutation(8)
    v.permute(_order_field(order8), (20, 2), 8)
    want = list(cur)
    for f in (2, 20):
        want[f:f + 8] = [cur[f + x] for x in order8]
    assert [list(map(int, l)) for l in v.to_lists()] == [list(map(int, l)) for l in want]


def test_growth_moves_only_the_lists_that_grew():
    """With room left in the pool, commit gives a list that ran out a larger run of chunks at the end of
    the pool (its old run becomes a hole) instead of re-laying the whole pool out; get(), flat
    iteration and to_csr all see the moved lists, the holes are skipped, and trim() reclaims them."""
    n = 64
    v = VLA(n, ti.i32, inline_capacity=2, chunk_size=4, reserve=np.full(n, 6, np.int32), name="move")
    v.reserve(np.full(n, 6))  # no-op: every list already holds 6
    spare = v.stats()["pool_chunks_total"] - v.stats()["pool_chunks_used"]
    assert spare > 0 and v.stats()["compact_events"] == 1
    ref = [[] for _ in range(n)]
    owner = np.repeat(np.arange(n), 5)
    append_pairs(v, owner, owner * 100 + np.tile(np.arange(5), n))
    for i in range(n):
        ref[i] += [i * 100 + j for j in range(5)]
    grow = [3, 17, 40]  # these outgrow their 6 slots: 2 inline + one chunk
    owner = np.repeat(grow, 4)
    vals = 10_000 + np.arange(len(owner))
    append_pairs(v, owner, vals)
    for o, x in zip(owner, vals):
        ref[o].append(int(x))
    st_ = v.stats()
    assert st_["compact_events"] == 1 and st_["grow_events"] == 2 and st_["pool_chunks_holes"] == 3
    assert sorted_lists(v) == [sorted(r) for r in ref]
    out = ti.ndarray(ti.i32, shape=n)
    k_read_all(v, out)
    np.testing.assert_array_equal(out.to_numpy(), [sum(r) for r in ref])
    out64 = ti.ndarray(ti.i64, shape=n)
    k_fold_in_order(v, out64)  # order-sensitive fold, against the slot order to_lists() reports
    expect = []
    for lst in v.to_lists():
        acc = 0
        for x in lst:
            acc = acc * 3 + x
        expect.append(acc)
    np.testing.assert_array_equal(out64.to_numpy(), expect)
    out.fill(0)
    k_flat_sum(v, out)
    np.testing.assert_array_equal(out.to_numpy(), [sum(r) for r in ref])
    out.fill(0)
    k_flat_walk_sum(v, out, 7, 1)   # runs="bump": the same owners, holes (-1) between walks' slots included
    np.testing.assert_array_equal(out.to_numpy(), [sum(r) for r in ref])
    assert_flat_reduce_exact(v, (3, 8))   # a chunk's owner once per chunk, the holes' chunks skipped
    v.trim()
    assert v.stats()["pool_chunks_holes"] == 0
    assert sorted_lists(v) == [sorted(r) for r in ref]


def test_commit_with_pool_full_midway_keeps_every_element():
    """In one commit some lists still find room at the pool's end (device-side claims) and the rest find
    it full (the pool is then compacted and grown on the host's side): every element ends up home, and
    the pool's accounting (chunks used + holes <= total) stays consistent for later growth."""
    n = 12
    v = VLA(n, ti.i32, inline_capacity=1, chunk_size=2, reserve=10, name="midway")
    total = v.stats()["pool_chunks_total"]
    assert total < 2 * n  # not enough for every list's 2 chunks: some claims must fail
    ref = [[] for _ in range(n)]
    owner = np.repeat(np.arange(n), 5)  # 1 inline + 4 in the pool: 2 chunks each (+25% rounds down to 0)
    vals = np.arange(len(owner)) + 1000
    append_pairs(v, owner, vals, use_launch=False)
    v.commit()
    for o, x in zip(owner, vals):
        ref[o].append(int(x))
    st_ = v.stats()
    assert st_["compact_events"] >= 1 and st_["overflow_events"] == 1
    assert st_["pool_chunks_used"] + st_["pool_chunks_holes"] <= st_["pool_chunks_total"]
    assert sorted_lists(v) == [sorted(r) for r in ref]
    out = ti.ndarray(ti.i32, shape=n)
    k_flat_sum(v, out)
    np.testing.assert_array_equal(out.to_numpy(), [sum(r) for r in ref])
    # and again: lists grow on the device into the grown pool
    owner = np.repeat([0, 5, 11], 9)
    vals = np.arange(len(owner)) + 5000
    append_pairs(v, owner, vals)
    for o, x in zip(owner, vals):
        ref[o].append(int(x))
    assert sorted_lists(v) == [sorted(r) for r in ref]
    out.fill(0)
    k_flat_sum(v, out)
    np.testing.assert_array_equal(out.to_numpy(), [sum(r) for r in ref])


def test_dead_overflow_is_dropped_and_counts_no_growth():
    """Appends past a list's room that a clear() made dead before the commit: dropped, nothing grows."""
    v = VLA(3, ti.i32, inline_capacity=1, chunk_size=2, name="dead")
    append_pairs(v, [1] * 6, range(6), use_launch=False)  # 5 parked in the overflow area
    ids = ti.ndarray(ti.i32, shape=1)
    ids.from_numpy(np.array([1], np.int32))
    k_clear_some(v, ids, 1)
    v.commit()
    st_ = v.stats()
    assert st_["overflow_events"] == 1 and st_["grow_events"] == 0 and st_["pool_chunks_used"] == 0
    assert v.to_lists() == [[], [], []]
    append_pairs(v, [1] * 6, range(10, 16))  # now it grows (once) and keeps all six
    assert v.stats()["grow_events"] == 1 and sorted(v.to_lists()[1]) == list(range(10, 16))


def test_growth_keeps_compiled_kernels_valid():
    """Growing the pool replaces its SNode tree; a kernel compiled before must be reused as it is (not
    recompiled) and see the new storage."""
    v = VLA(8, ti.i32, inline_capacity=1, chunk_size=2, name="grow")
    out = ti.ndarray(ti.i32, shape=8)
    k_read_all(v, out)  # compile against the initial tiny pool
    compiled = dict(k_read_all._primal.compiled_kernels)
    launch(k_fill_mod, v, 8 * 300)
    assert v.stats()["grow_events"] >= 1 and v.stats()["recompile_events"] == 0
    k_read_all(v, out)
    after = k_read_all._primal.compiled_kernels
    assert list(after) == list(compiled) and all(after[k] is compiled[k] for k in compiled)
    np.testing.assert_array_equal(out.to_numpy(), [sum(range(i, 2400, 8)) for i in range(8)])


def test_repeated_growth_compiles_nothing_new():
    """Growth (pool re-layout, tree replacement) reuses the kernels it compiled the first time, whatever
    the dtype: a simulation whose contact lists grow must not stall on compiles."""
    v = VLA(16, Contact, inline_capacity=1, chunk_size=2, overflow_capacity=8, name="growc")
    runtime = ti.lang.impl.get_runtime()
    for n in (100, 400, 1600):  # warm-up: growth with and without loss (roll-back) paths compiled once
        v.clear_all()
        launch(k_struct_fill, v, n)
    grows = v.stats()["grow_events"]
    compiled = runtime.get_num_compiled_functions()
    fill_kernel = dict(k_struct_fill._primal.compiled_kernels)
    for n in (6400, 25600):
        v.clear_all()
        launch(k_struct_fill, v, n)
    assert v.stats()["grow_events"] > grows
    assert v.stats()["recompile_events"] == 0
    assert runtime.get_num_compiled_functions() == compiled
    assert all(k_struct_fill._primal.compiled_kernels[k] is fill_kernel[k] for k in fill_kernel)
    offsets, vals = v.to_csr()
    assert sorted(vals["other"][offsets[5]:offsets[6]].tolist()) == list(range(5, 25600, 16))


def test_tune_minimises_reserved_bytes():
    lens = np.full(1000, 3)
    t = VLA.tune(lens)
    assert t["inline_capacity"] == 3  # everything inline: no chunk, no table entry
    heavy = np.concatenate([np.random.default_rng(0).integers(0, 9, 5000), [200, 500, 1000]])
    t = VLA.tune(heavy)
    v = VLA(len(heavy), ti.i32, inline_capacity=t["inline_capacity"], chunk_size=t["chunk_size"], name="tuned")
    v.from_csr(np.concatenate([[0], np.cumsum(heavy)]), np.zeros(heavy.sum(), np.int32))
    v.trim()
    st_ = v.stats()
    slots = st_["reserved_elements"]
    assert slots == len(heavy) * t["inline_capacity"] + sum(
        -(-max(0, l - t["inline_capacity"]) // t["chunk_size"]) * t["chunk_size"] for l in heavy)
    worse = VLA.tune(heavy, inline_options=(8,), chunk_options=(64,))
    assert t["reserved_bytes"] <= worse["reserved_bytes"]
    # a struct stored as 64-bit words reserves whole words per element (Contact: 5 members -> 24 bytes, not 20);
    # live bytes stay the members'
    words = VLA.tune(heavy, dtype=Contact, inline_options=(2,), chunk_options=(4,))
    n_slots = len(heavy) * 2 + sum(-(-max(0, l - 2) // 4) * 4 for l in heavy)
    n_chunks = sum(-(-max(0, l - 2) // 4) for l in heavy)
    assert words["reserved_bytes"] == 24 * n_slots + 12 * len(heavy) + 4 * n_chunks
    assert words["live_bytes"] == 20 * heavy.sum()


def _heavy_lengths(n, seed):
    """Contact-like list lengths: most 0-8, one list in 500 long (up to 1024)."""
    rng = np.random.default_rng(seed)
    lens = rng.integers(0, 9, n)
    long_ = rng.random(n) < 0.002
    lens[long_] = rng.integers(9, 1025, long_.sum())
    return lens


def test_ordered_runs_keep_8_bytes_a_list_and_find_every_chunks_list():
    # runs="ordered": the reserved bytes are the elements' slots plus 8 bytes a list and 4 per 64 chunks
    # (what tune() predicts, to the byte, apart from the overflow area and a few constants), which for a
    # contact-like histogram is under 1.5x live where runs="bump" (12 a list, 4 a chunk) needs more at its
    # own best parameters. The flat walk's chunk -> list search (across many 64-chunk hint blocks) finds
    # every element, also after lists grew through a re-layout.
    lens = _heavy_lengths(6000, 7)
    t = VLA.tune(lens, runs="ordered")
    tb = VLA.tune(lens)
    assert t["ratio"] < 1.5 < tb["ratio"]
    v = VLA(lens.size, ti.i32, inline_capacity=t["inline_capacity"], chunk_size=t["chunk_size"], runs="ordered",
            overflow_capacity=64, name="ordered")
    offsets = np.concatenate([[0], np.cumsum(lens)])
    vals = np.arange(offsets[-1], dtype=np.int32)
    v.from_csr(offsets, vals)
    v.trim()
    st_ = v.stats()
    assert st_["runs"] == "ordered" and st_["pool_chunks_holes"] == 0
    cs, ic = t["chunk_size"], t["inline_capacity"]
    chunks = sum(-(-max(0, l - ic) // cs) for l in lens)
    assert st_["pool_chunks_total"] == chunks > 64 * 20
    hint = (chunks >> 6) + 2
    # (per list 8 bytes, the closing run start, one unused run-length entry, 16 scalars, the hint, the overflow area)
    assert st_["metadata_bytes"] == 8 * lens.size + 4 + 4 + 64 + 4 * hint + 8 * 64
    assert st_["element_reserved_bytes"] == 4 * (lens.size * ic + chunks * cs + 64)
    # tune's model, plus the overflow area (64 slots: 4 + 8 bytes each), the hint's rounding and 72 bytes of scalars
    # and table ends
    assert abs(st_["reserved_bytes"] - (t["reserved_bytes"] + 12 * 64 + 72 + 4 * hint - chunks / 16)) < 1
    np.testing.assert_array_equal(v.to_csr()[1], vals)
    out = ti.ndarray(ti.i32, lens.size)
    out.fill(0)
    k_flat_sum(v, out)
    list_of = np.repeat(np.arange(lens.size), lens)
    np.testing.assert_array_equal(out.to_numpy(), np.bincount(list_of, weights=vals, minlength=lens.size))
    # grow one list in ten by 1-40 elements through launch: a re-layout; every element kept, in place
    rng = np.random.default_rng(8)
    grown = np.flatnonzero(rng.random(lens.size) < 0.1)
    owner = np.repeat(grown, rng.integers(1, 41, grown.size)).astype(np.int32)
    extra = np.arange(10**6, 10**6 + owner.size, dtype=np.int32)
    grows = v.stats()["grow_events"]
    launch(k_append_pairs, v, owner, extra, owner.size)
    assert v.stats()["grow_events"] > grows
    ref = [vals[offsets[i]:offsets[i + 1]].tolist() for i in range(lens.size)]
    for i, x in zip(owner, extra):
        ref[i].append(int(x))
    assert sorted_lists(v) == [sorted(r) for r in ref]
    with pytest.raises(ValueError, match="runs='bump'"):
        v.permute(_order_field([1, 0]), 0, 2)


@pytest.mark.parametrize("hint_every", [1, 4])
def test_ordered_runs_hint_every_sets_the_hint_table_and_keeps_the_flat_walk_exact(hint_every, monkeypatch):
    # A denser hint (vla.layout.HINT_EVERY chunks per entry, 64 as shipped; set denser here to reach the search's
    # block boundaries in a small VLA) is one table_owner entry per hint_every chunks, in the bytes and in tune()'s
    # model, and the flat walk still finds every element's list: hint_every=1 makes every search zero steps (the
    # hint is the owner of the last list starting at or before the chunk), 4 a short one.
    lens = _heavy_lengths(1500, 11)
    t64 = VLA.tune(lens, runs="ordered")
    monkeypatch.setattr(vla_layout, "HINT_EVERY", hint_every)
    t = VLA.tune(lens, runs="ordered", chunk_options=(t64["chunk_size"],), inline_options=(t64["inline_capacity"],))
    v = VLA(lens.size, ti.i32, inline_capacity=t["inline_capacity"], chunk_size=t["chunk_size"], runs="ordered",
            overflow_capacity=64, name=f"hint{hint_every}")
    offsets = np.concatenate([[0], np.cumsum(lens)])
    vals = (np.arange(offsets[-1], dtype=np.int32) * 7) % 1001
    v.from_csr(offsets, vals)
    v.trim()
    chunks = v.stats()["pool_chunks_total"]
    assert v.stats()["metadata_bytes"] == 8 * lens.size + 4 + 4 + 64 + 4 * ((chunks // hint_every) + 2) + 8 * 64
    assert abs(t["reserved_bytes"] - t64["reserved_bytes"] - chunks * (4 / hint_every - 4 / 64)) < 1  # int bytes
    out = ti.ndarray(ti.i32, lens.size)
    out.fill(0)
    k_flat_sum(v, out)
    list_of = np.repeat(np.arange(lens.size), lens)
    expect = np.bincount(list_of, weights=vals, minlength=lens.size)
    np.testing.assert_array_equal(out.to_numpy(), expect)
    # the walk through _flat_index_after: neighbouring slots (steps), slots 3 apart (some jumps past 4 lists: searches)
    for stride in (1, 3):
        out.fill(0)
        k_flat_walk_sum(v, out, 7, stride)
        np.testing.assert_array_equal(out.to_numpy(), expect)
    assert_flat_reduce_exact(v, (3, 8))   # steps within a thread's slots, a search for each thread's first


# ---------------------------------------------------------------------------------------------- bad input
def test_bad_arguments():
    with pytest.raises(ValueError, match="num_arrays"):
        VLA(0, ti.i32)
    with pytest.raises(ValueError, match="num_arrays"):
        VLA(-3, ti.i32)
    with pytest.raises(TypeError, match="num_arrays"):
        VLA(2.5, ti.i32)
    with pytest.raises(ValueError, match="chunk_size"):
        VLA(4, ti.i32, chunk_size=0)
    with pytest.raises(ValueError, match="power of two"):
        VLA(4, ti.i32, chunk_size=12)
    with pytest.raises(ValueError, match="inline_capacity"):
        VLA(4, ti.i32, inline_capacity=-1)
    with pytest.raises(TypeError, match="at least one member"):
        VLA(4, ti.types.struct())
    with pytest.raises(TypeError, match="at least one component"):
        VLA(4, ti.types.vector(0, ti.f32))
    with pytest.raises(TypeError, match="at least one component"):
        VLA(4, ti.types.struct(a=ti.i32, b=ti.types.vector(0, ti.f32)))
    with pytest.raises(TypeError, match="unexpected keyword argument 'layout'"):
        VLA(4, ti.i32, layout="soa")
    with pytest.raises(TypeError, match="dtype"):
        VLA(4, np.float32)
    with pytest.raises(TypeError, match="dtype"):
        VLA(4, "int")
    with pytest.raises(ValueError, match="reserve"):
        VLA(4, ti.i32, reserve=-1)
    with pytest.raises(ValueError, match="runs must be 'bump' or 'ordered'"):
        VLA(4, ti.i32, runs="sorted")
    with pytest.raises(ValueError, match="runs must be 'bump' or 'ordered'"):
        VLA.tune([1, 2], runs="sorted")


def test_from_csr_validation():
    v = VLA(3, ti.i32, name="val")
    with pytest.raises(ValueError, match="non-decreasing"):
        v.from_csr([0, 2, 1, 3], np.zeros(3, np.int32))
    with pytest.raises(ValueError, match="num_arrays"):
        v.from_csr([0, 1, 2], np.zeros(2, np.int32))
    with pytest.raises(ValueError, match="expected"):
        v.from_csr([0, 1, 2, 3], np.zeros(5, np.int32))
    with pytest.raises(TypeError, match="integers"):
        v.from_csr(np.array([0, 1.0, 2, 3]), np.zeros(3, np.int32))
    w = VLA(2, Contact, name="valc")
    with pytest.raises(TypeError, match="dict"):
        w.from_csr([0, 1, 1], np.zeros(1))
    with pytest.raises(ValueError, match="keys"):
        w.from_csr([0, 1, 1], {"depth": np.zeros(1)})


# ---------------------------------------------------------------------------------------------- property-based
# ---------------------------------------------------------------------------------------------- Batch
def _lists_from(owner, vals, n):
    ref = [[] for _ in range(n)]
    for o, x in zip(owner, vals):
        ref[int(o)].append(int(x))
    return ref


def test_batch_commits_on_the_device_and_reads_once():
    """Lists outgrow their chunks inside a Batch: they grow into the pool's free chunks on the device, every
    element is home after done(), and the pool was not grown by the host. A second fill of the same lengths
    fits the memoised capacity."""
    n = 8
    v = VLA(n, ti.i32, inline_capacity=1, chunk_size=2, reserve=400, name="batch_ok")
    pool0 = v.stats()["pool_chunks_total"]
    owner = np.repeat(np.arange(n), np.arange(n) * 3)          # lengths 0, 3, ..., 21
    vals = np.arange(len(owner)) * 7 + 1
    ref = [sorted(r) for r in _lists_from(owner, vals, n)]
    o, x, m = _pairs_nd(owner, vals)
    batch = Batch()
    for cycle in range(2):
        batch.begin()
        batch.launch(k_refill_pairs, v, o, x, m, vlas=[v], rollback=False)
        assert batch.done() and batch.failed == []
        assert sorted_lists(v) == ref
        st_ = v.stats()
        assert st_["pool_chunks_total"] == pool0 and st_["compact_events"] == 0
        assert st_["overflow_events"] == 1 and st_["grow_events"] == 1, f"cycle {cycle}: {st_}"
    out = ti.ndarray(ti.i32, shape=n)
    k_flat_sum(v, out)
    np.testing.assert_array_equal(out.to_numpy(), [sum(r) for r in ref])


@pytest.mark.parametrize("why", ["pool full", "overflow area full"])
def test_batch_failure_leaves_readable_lists_then_launch_completes(why):
    """When only the host can grow a VLA (its pool, or its overflow area, is too small), done() says False and
    each list shows only elements that were appended to it, each once; the work run again through launch()
    then holds every element."""
    n = 6
    if why == "pool full":
        v = VLA(n, ti.i32, inline_capacity=1, chunk_size=2, reserve=4, name="batch_pool")
    else:
        v = VLA(n, ti.i32, inline_capacity=1, chunk_size=2, reserve=400, overflow_capacity=3, name="batch_ovf")
    owner = np.repeat(np.arange(n), [6, 1, 9, 0, 4, 12])
    vals = np.arange(len(owner)) + 100
    ref = _lists_from(owner, vals, n)
    o, x, m = _pairs_nd(owner, vals)
    batch = Batch()
    batch.begin()
    batch.launch(k_refill_pairs, v, o, x, m, vlas=[v], rollback=False)
    assert not batch.done()
    assert [name for name, _ in batch.failed] == [v.name] and batch.failed[0][1] > 0
    got = v.to_lists()
    for i in range(n):
        assert len(set(got[i])) == len(got[i]) and set(got[i]) <= set(ref[i]), i
    assert sum(map(len, got)) < len(owner), "some appends could not be kept"
    launch(k_refill_pairs, v, o, x, m, vlas=[v], rollback=False)
    assert sorted_lists(v) == [sorted(r) for r in ref]
    # and now the batch path fits
    batch.begin()
    batch.launch(k_refill_pairs, v, o, x, m, vlas=[v], rollback=False)
    assert batch.done() and sorted_lists(v) == [sorted(r) for r in ref]


@ti.kernel
def k_add_lengths_unless_failed(v: ti.template(), failed_at: ti.template(), out: _i32_nd):
    """out[i] += length(i), unless a batch has failed (a consumer that must not build on a failed batch)."""
    for i in range(ti.select(failed_at[None] == NO_FAILURE, v.num_arrays, 0)):
        out[i] += v.length(i)


def test_batch_checked_later_records_the_first_failed_tag_and_gates_kernels():
    """Batches run back to back, checked with one read at the end: a failed device commit records its batch's
    tag in failed_at, the earliest one wins, it stays set through later batches (which may succeed), kernels
    that test it do nothing from the failure on, and clear_failure() lets them run again."""
    n = 6
    v = VLA(n, ti.i32, inline_capacity=1, chunk_size=2, reserve=4, name="batch_later")
    small = np.repeat(np.arange(n), [1, 1, 1, 0, 1, 1])          # inline only: fits
    large = np.repeat(np.arange(n), [6, 1, 9, 0, 4, 12])         # needs more chunks than the pool has
    fills = {t: _pairs_nd(own, np.arange(len(own)) + 10 * t) for t, own in
             ((3, small), (4, large), (5, small), (6, large))}
    out = ti.ndarray(ti.i32, shape=n)
    batch = Batch()
    assert batch.first_failure() is None
    for tag in (3, 4, 5, 6):
        batch.begin(tag)
        batch.launch(k_refill_pairs, v, *fills[tag], vlas=[v], rollback=False)
        k_add_lengths_unless_failed(v, batch.failed_at, out)
    assert batch.first_failure() == 4
    np.testing.assert_array_equal(out.to_numpy(), [1, 1, 1, 0, 1, 1])   # batch 3's fill only
    batch.clear_failure()
    assert batch.first_failure() is None
    launch(k_refill_pairs, v, *fills[6], vlas=[v], rollback=False)      # the redo grows the pool
    assert sorted_lists(v) == [sorted(r) for r in _lists_from(large, np.arange(len(large)) + 60, n)]
    k_add_lengths_unless_failed(v, batch.failed_at, out)
    np.testing.assert_array_equal(out.to_numpy(), [7, 2, 10, 0, 5, 13])
    with pytest.raises(ValueError, match="tag"):
        batch.begin(-1)


def test_batch_rolls_back_and_later_launches_read_earlier_appends():
    """Two launches in one batch, the second reading what the first appended (before done()). On success both
    are complete. When the first needs the host, the VLAs given rollback=True are back to their contents
    before the batch."""
    n = 5
    a = VLA(n, ti.i32, inline_capacity=2, chunk_size=2, reserve=200, name="batch_a")
    b = VLA(n, ti.i32, inline_capacity=1, chunk_size=4, reserve=200, name="batch_b")
    owner = np.repeat(np.arange(n), [3, 0, 7, 2, 5])
    vals = np.arange(len(owner)) + 10
    ref = _lists_from(owner, vals, n)
    o, x, m = _pairs_nd(owner, vals)
    batch = Batch()
    batch.begin()
    batch.launch(k_append_pairs, a, o, x, m)          # rollback=True (the default)
    batch.launch(k_copy_lists, a, b, vlas=[b])
    assert batch.done()
    assert sorted_lists(a) == [sorted(r) for r in ref]
    assert sorted_lists(b) == [sorted(y + 1 for y in r) for r in ref]
    before_a, before_b = a.to_lists(), b.to_lists()
    # a second round that cannot fit a's overflow area (1 slot): rolled back, both VLAs as before the batch
    small = VLA(n, ti.i32, inline_capacity=0, chunk_size=1, reserve=100, overflow_capacity=1, name="batch_small")
    small.from_csr(np.array([0, 1, 1, 3, 3, 3], np.int64), np.array([7, 8, 9], np.int32))
    before_small = small.to_lists()
    batch.begin()
    batch.launch(k_append_pairs, small, o, x, m)
    batch.launch(k_append_pairs, a, o, x, m)
    assert not batch.done()
    assert small.to_lists() == before_small and a.to_lists() == before_a and b.to_lists() == before_b
    launch(k_append_pairs, small, o, x, m)
    assert sorted_lists(small) == [sorted(p + r) for p, r in zip(before_small, ref)]


_PROP = {}


def _prop_vla(config):
    if config not in _PROP:
        ic, cs, runs = config
        _PROP[config] = VLA(6, ti.i32, inline_capacity=ic, chunk_size=cs, overflow_capacity=4, runs=runs,
                            name=f"prop{config}")
    return _PROP[config]


def _closure_appender(v):
    """A kernel that appends pairs to v without v among its arguments (held in its closure; another VLA is its
    argument): launch must find v there, or a re-run after an overflow would append twice. One per VLA (a kernel
    compiles once per closure)."""
    key = ("closure", v.name)
    if key not in _PROP:
        @ti.kernel
        def k_append_to_captured(other: ti.template(), owner: _i32_nd, value: _i32_nd, n: ti.i32):
            for j in range(n):
                v.append(owner[j], value[j] + 0 * other.length(0))
        _PROP[key] = k_append_to_captured
    if "other" not in _PROP:
        _PROP["other"] = VLA(1, ti.i32, name="prop_other")
    return _PROP[key], _PROP["other"]


_pairs = st.lists(st.tuples(st.integers(0, 5), st.integers(-99, 99)), max_size=40)
op = st.one_of(
    st.tuples(st.just("append"), _pairs, st.booleans()),
    st.tuples(st.just("append"), st.lists(st.tuples(st.integers(0, 5), st.integers(-99, 99)), min_size=8,
                                          max_size=40), st.just(False)),   # (past the overflow area: lost)
    st.tuples(st.just("append_captured"), st.lists(st.tuples(st.integers(0, 5), st.integers(-99, 99)), min_size=8,
                                                   max_size=40)),
    st.tuples(st.just("clear"), st.lists(st.integers(0, 5), max_size=3)),
    st.tuples(st.just("commit")),
    st.tuples(st.just("trim")),
    st.tuples(st.just("clear_all")),
    st.tuples(st.just("from_csr"), st.lists(st.lists(st.integers(-99, 99), max_size=12), min_size=6, max_size=6)),
    st.tuples(st.just("set"), st.integers(0, 5), st.integers(0, 30), st.integers(-99, 99)),
    st.tuples(st.just("permute"), st.integers(0, 5), st.permutations(range(6))),
    st.tuples(st.just("batch"), st.lists(st.tuples(st.integers(0, 5), st.integers(-99, 99)), max_size=40)),
    st.tuples(st.just("refills_checked_later"),
              st.lists(st.lists(st.tuples(st.integers(0, 5), st.integers(-99, 99)), max_size=40), min_size=1,
                       max_size=3)),
)


def _shared_batch():
    """One Batch for the hypothesis sequences: each Batch() holds a Taichi SNode tree (its failed_at), and a
    new one per example would exhaust Taichi's 512 trees (dict.setdefault(k, Batch()) makes one every call)."""
    if "batch" not in _PROP:
        _PROP["batch"] = Batch()
    return _PROP["batch"]


_ORDER = {}


def _order_field(order):
    """An i32 field (one for the module: fields made between kernels cost a new SNode tree) holding order."""
    if "f" not in _ORDER:
        _ORDER["f"] = ti.field(ti.i32, 64)
    f = _ORDER["f"]
    a = np.zeros(64, np.int32)
    a[:len(order)] = order
    f.from_numpy(a)
    return f


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=st.sampled_from([(0, 1, "bump"), (1, 2, "bump"), (4, 4, "bump"), (0, 1, "ordered"),
                               (1, 2, "ordered"), (4, 4, "ordered")]), ops=st.lists(op, max_size=12))
def test_random_operation_sequences_match_list_reference(config, ops):
    """Random sequences of appends (through launch or not; past the overflow area, lost and caught), commits,
    clears, refills, batches, permutations and launches of a kernel that reaches its VLA through a closure, against
    plain Python lists. No read is ever wrong: while the VLA has lost appends every host read raises, and each list
    shows only elements that were appended to it; once refilled it equals the reference."""
    v = _prop_vla(config)
    v.from_csr(np.zeros(7, np.int64), np.zeros(0, np.int32))
    v.trim()   # (capacity back to nothing: appends overflow, and past the area of 4 are lost)
    ref = [[] for _ in range(6)]
    lost = False

    def refill_from_ref():
        offsets = np.concatenate([[0], np.cumsum([len(l) for l in ref])])
        v.from_csr(offsets, np.array([x for l in ref for x in l], np.int32))

    for o in ops:
        kind = o[0]
        if kind == "append":
            pairs, via_launch = o[1], o[2]
            for i, x in pairs:
                ref[i].append(x)
            try:
                append_pairs(v, [p[0] for p in pairs], [p[1] for p in pairs], use_launch=via_launch)
                v.commit()
            except VLAOverflowError as e:
                # Without launch, appends beyond the overflow area are lost *and reported*; the VLA then refuses
                # reads until refilled.
                assert not via_launch and e.lost > 0
                lost = True
        elif kind == "append_captured":
            pairs = o[1]
            for i, x in pairs:
                ref[i].append(x)
            kernel, other = _closure_appender(v)
            launch(kernel, other, *_pairs_nd([p[0] for p in pairs], [p[1] for p in pairs]))
        elif kind == "clear":
            ids = o[1]
            for i in ids:
                ref[i] = []
            n = ti.ndarray(ti.i32, shape=max(1, len(ids)))
            if ids:
                n.from_numpy(np.array(ids, np.int32))
            k_clear_some(v, n, len(ids))
        elif kind == "commit":
            v.commit()
        elif kind == "trim":
            v.trim()
        elif kind == "clear_all":
            ref = [[] for _ in range(6)]
            v.clear_all()
            lost = False
        elif kind == "from_csr":
            ref = [list(l) for l in o[1]]
            refill_from_ref()
            lost = False
        elif kind == "set":
            _, i, k, x = o
            if k < len(ref[i]) and not lost:
                # order within a list after parallel appends is the device's: align the reference first
                ref[i] = v.to_lists()[i]
                ref[i][k] = x
                k_set(v, i, k, x)
        elif kind == "batch":
            # appends through a Batch (rollback=True): either all of them are in, or none and launch() adds them
            pairs = o[1]
            before = peek_lists(v)
            o_nd, x_nd, m = _pairs_nd([p[0] for p in pairs], [p[1] for p in pairs])
            batch = _shared_batch()
            batch.begin()
            batch.launch(k_append_pairs, v, o_nd, x_nd, m)
            if not batch.done():
                assert peek_lists(v) == before, "a failed batch rolls back"
                launch(k_append_pairs, v, o_nd, x_nd, m)
            for i, x in pairs:
                ref[i].append(x)
        elif kind == "refills_checked_later":
            # refills through tagged Batches (rollback=False), checked once at the end; from the first failed
            # one on, redo it through launch() and run the later ones again, until none fails
            fills = o[1]
            nds = [_pairs_nd([p[0] for p in f], [p[1] for p in f]) for f in fills]
            batch = _shared_batch()
            start = 0
            while True:
                for t in range(start, len(fills)):
                    batch.begin(t)
                    batch.launch(k_refill_pairs, v, *nds[t], vlas=[v], rollback=False)
                failed = batch.first_failure()
                if failed is None:
                    break
                assert start <= failed < len(fills)
                batch.clear_failure()
                launch(k_refill_pairs, v, *nds[failed], vlas=[v], rollback=False)
                start = failed + 1
            ref = _lists_from([p[0] for p in fills[-1]], [p[1] for p in fills[-1]], 6)
        elif kind == "permute":
            first, perm = o[1], o[2]
            order = [x for x in perm if x < 6 - first]   # a permutation of 0..count-1
            if v.runs == "ordered":
                with pytest.raises(ValueError, match="runs='bump'"):
                    v.permute(_order_field(order), first, 6 - first)
            else:
                ref = ref[:first] + [ref[first + x] for x in order]
                v.permute(_order_field(order), first, 6 - first)
        if lost:
            for read in (v.lengths, v.to_csr, v.to_lists):
                with pytest.raises(VLAOverflowError, match="refill"):
                    read()
            for i, (shown, appended) in enumerate(zip(peek_lists(v), ref)):
                assert not Counter(shown) - Counter(appended), f"after {kind}: list {i} shows what was not appended"
        else:
            got = v.to_lists()
            assert [sorted(l) for l in got] == [sorted(l) for l in ref], f"after {kind}"
            assert v.lengths().tolist() == [len(l) for l in ref]
    if lost:
        refill_from_ref()
    # the flat iteration, strided and walked through _flat_index_after, sees every element once
    v.commit()
    sums = np.array([sum(l) for l in ref], np.int64)
    out = _PROP.setdefault("out", ti.ndarray(ti.i32, 6))
    out.fill(0)
    k_flat_sum(v, out)
    assert out.to_numpy().tolist() == sums.tolist()
    out.fill(0)
    k_flat_walk_sum(v, out, 5, 1)
    assert out.to_numpy().tolist() == sums.tolist()
    assert_flat_reduce_exact(v, (3, 8))


def test_capacity_error_names_the_knob():
    v = VLA(2, ti.i32, name="cap")
    with pytest.raises(VLACapacityError, match="32-bit"):
        v._alloc("pool_probe", ti.i32, 2**31)


@pytest.mark.parametrize("n", [0, 1, 511, 512, 513, 512 * 64 * 3 + 17])
def test_scan_matches_numpy_cumsum(n):
    # n spans 0, one partial block, exact blocks, and several super-blocks (the hierarchical middle pass)
    from vla.scan import Scanner

    rng = np.random.default_rng(n)
    src_np = rng.integers(0, 9, size=max(n, 1)).astype(np.int32)
    src = ti.ndarray(ti.i32, max(n, 1))
    src.from_numpy(src_np)
    dst = ti.ndarray(ti.i32, n + 1)
    Scanner(n).exclusive(src, n, dst)
    expect = np.concatenate([[0], np.cumsum(src_np[:n])])
    assert np.array_equal(dst.to_numpy(), expect)
