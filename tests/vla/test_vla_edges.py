"""The VLA at its edges: sizes near 2^31 and beyond the machine, values that do not fit the element type, appends
lost outside launch, VLAs a kernel reaches outside its arguments, VLAs whose Taichi program has ended. Each is a
clear error or a correct result, never wrong data, a crash or a broken process."""
import os

import numpy as np
import pytest
import taichi as ti

import vla.taichi_compat
from peek import peek_lists
from vla import VLA, VLACapacityError, VLAOverflowError, launch

ARCH = os.environ.get("SMOLVLA_TEST_ARCH", "cpu")
CPU_OPTIONS = {"cpu": {"advanced_optimization": False}}   # (as in test_vla.py: half the compile time on the CPU)
I32_MAX = 2**31 - 1


def _init():
    ti.init(arch=getattr(ti, ARCH), **CPU_OPTIONS.get(ARCH, {}))


@pytest.fixture(scope="module", autouse=True)
def taichi_runtime():
    _init()
    yield
    ti.reset()


@ti.kernel
def k_fill(v: ti.template(), m: ti.i32):
    """m appends to every list: list i gets 1000 i + k, k < m."""
    for i, k in ti.ndrange(v.num_arrays, m):
        v.append(i, 1000 * i + k)


@ti.kernel
def k_nothing(v: ti.template()):
    pass


def small(name, n=3, **kw):
    """A VLA that overflows at once: one inline slot, chunks of one, an overflow area of four."""
    kw = {"inline_capacity": 1, "chunk_size": 1, "overflow_capacity": 4, **kw}
    return VLA(n, ti.i32, name=name, **kw)


def expected(n, m):
    return [[1000 * i + k for k in range(m)] for i in range(n)]


def sorted_lists(v):
    return [sorted(l) for l in v.to_lists()]


# ------------------------------------------------------------------------------------------------ sizes
@pytest.mark.parametrize("kwargs, says", [
    ({"num_arrays": I32_MAX, "inline_capacity": 0}, "num_arrays = 2147483647 exceeds the 32-bit index space"),
    ({"num_arrays": 2**40}, "num_arrays"),
    ({"num_arrays": 2**30}, "num_arrays \\* inline_capacity"),
    ({"num_arrays": 10, "reserve": 2**31}, "a reserve of 2147483648 elements"),
    ({"num_arrays": 10, "reserve": np.full(10, 2**30)}, "a reserve of 10737418240 elements"),
    ({"num_arrays": 10, "chunk_size": 2**31}, "chunk_size 2147483648"),
    ({"num_arrays": 10, "overflow_capacity": 2**31}, "overflow_capacity"),
])
def test_sizes_beyond_32_bit_indexing_are_refused_and_the_process_stays_usable(kwargs, says):
    with pytest.raises(VLACapacityError, match=says):
        VLA(dtype=ti.i32, name="huge", **kwargs)
    v = small("after_huge")
    launch(k_fill, v, 5)
    assert sorted_lists(v) == expected(3, 5)


def test_sizes_beyond_the_machine_are_refused_before_taichi_sees_them(monkeypatch):
    # Taichi's CPU backend stays broken for the whole process once the OS refuses it memory; here the machine is
    # made to look small (64 MiB), so the refusal is tested without asking the OS for anything.
    if ARCH != "cpu":
        pytest.skip("the memory check is the CPU backend's")
    monkeypatch.setattr(vla.taichi_compat, "host_memory_bytes", lambda: 64 * 2**20)
    with pytest.raises(VLACapacityError, match="more than this machine's 0.1 GiB"):
        VLA(10_000_000, ti.i32, name="too_big")
    v = VLA(10, ti.i32, inline_capacity=1, chunk_size=1, name="grows_too_big")
    with pytest.raises(VLACapacityError, match="more than this machine"):
        v.reserve(np.full(10, 2_000_000))
    monkeypatch.undo()
    launch(k_fill, v, 7)   # the refused growth left the VLA as it was
    assert sorted_lists(v) == expected(10, 7)


def test_reserve_lengths_beyond_int32_are_refused_not_wrapped():
    v = small("reserve_wrap")
    for lengths in (np.array([2**32, 0, 0]), np.array([I32_MAX, 0, 0])):
        with pytest.raises(VLACapacityError, match="32-bit index space"):
            v.reserve(lengths)
    launch(k_fill, v, 3)
    assert sorted_lists(v) == expected(3, 3)


# ------------------------------------------------------------------------------------------------ from_csr
@pytest.mark.parametrize("dtype, values, says", [
    (ti.i32, [1.7], "values\\[0\\] = .*1.7.* is not an integer"),
    (ti.i32, [1e10], "outside the range of the int32 element type"),
    (ti.i32, [np.nan], "is not an integer"),
    (ti.i32, [2**31], "outside the range"),
    (ti.u8, [-1], "outside the range of the uint8 element type"),
    (ti.f32, [1e39], "beyond the range of the float32 element type"),
    (ti.i32, ["7"], "must hold numbers"),
])
def test_from_csr_refuses_values_the_element_type_would_change(dtype, values, says):
    v = VLA(2, dtype, name="csr_exact")
    v.from_csr(np.array([0, 1, 1]), np.array([3], dtype=np.int64))
    with pytest.raises((ValueError, TypeError), match=says):
        v.from_csr(np.array([0, 1, 1]), np.array(values))
    assert v.to_lists() == [[3], []]   # refused before anything was replaced


def test_from_csr_takes_what_fits_exactly():
    v = VLA(2, ti.i32, name="csr_fits")
    v.from_csr(np.array([0, 2, 3]), np.array([2.0, -3.0, 2**31 - 1]))
    assert v.to_lists() == [[2, -3], [I32_MAX]]
    f = VLA(1, ti.f32, name="csr_float")
    f.from_csr(np.array([0, 2]), np.array([0.1, 3e38]))
    np.testing.assert_allclose(f.to_lists()[0], [0.1, 3e38], rtol=1e-7)


# ------------------------------------------------------------------------------------------------ lost appends
def test_appends_parked_before_a_launch_survive_its_overflow():
    """A kernel run without launch leaves appends in the overflow area (within its capacity); a launch that then
    overflows the area rolls back to the lengths before its call, which count them: they must be home."""
    v = small("parked_before", overflow_capacity=8)
    k_fill(v, 3)               # two a list parked: 6 of 8
    launch(k_fill, v, 10)      # 27 beyond capacity: lost, rolled back, grown, run again
    assert sorted_lists(v) == [sorted(list(range(1000 * i, 1000 * i + 3)) + list(range(1000 * i, 1000 * i + 10)))
                               for i in range(3)]


def test_a_vla_that_lost_appends_stays_unreadable_until_refilled():
    v = small("lost_flag", n=4)
    k_fill(v, 10)
    with pytest.raises(VLAOverflowError, match="clear_all\\(\\) \\(or from_csr\\(\\)\\) and fill it again"):
        v.commit()
    launch(k_nothing, v)       # a launch that refills nothing does not make it complete
    with pytest.raises(VLAOverflowError, match="refill it before reading it back: clear_all"):
        v.to_lists()
    launch(k_fill, v, 2)       # nor does one that appends to what is left
    with pytest.raises(VLAOverflowError, match="refill"):
        v.lengths()
    v.clear_all()              # what the message says
    launch(k_fill, v, 10)
    assert sorted_lists(v) == expected(4, 10)


def test_a_list_that_lost_nothing_keeps_everything():
    """Only the lists that lost appends are cut: a list whose overflowed appends are all parked keeps them."""
    v = VLA(2, ti.i32, inline_capacity=1, chunk_size=1, overflow_capacity=4, name="cut_only_losers")
    k_fill_list(v, 1, 20)      # list 1: 19 beyond capacity, 4 parked, 15 lost
    k_fill_list(v, 0, 3)       # list 0: 2 beyond capacity, not parked (the area is full)
    with pytest.raises(VLAOverflowError):
        v.commit()
    shown = peek_lists(v)
    assert len(shown[1]) == 1 and shown[1][0] in range(1000, 1020)   # cut to its capacity: what reached storage
    assert shown[0] == [0]     # (its two parked appends came after the area was full: lost, cut too)
    w = VLA(2, ti.i32, inline_capacity=1, chunk_size=1, overflow_capacity=4, name="keeps_winner")
    k_fill_list(w, 0, 3)       # list 0: 2 parked
    k_fill_list(w, 1, 20)      # list 1: 2 parked, 17 lost
    with pytest.raises(VLAOverflowError):
        w.commit()
    shown = peek_lists(w)
    assert sorted(shown[0]) == [0, 1, 2] and len(shown[1]) == 1


@ti.kernel
def k_fill_list(v: ti.template(), i: ti.i32, m: ti.i32):
    for k in range(m):
        v.append(i, 1000 * i + k)


# ------------------------------------------------------------------------------------------------ launch's reach
GLOBAL_VLA = None


@ti.kernel
def k_fill_global(other: ti.template(), m: ti.i32):
    """Appends to GLOBAL_VLA, which is not an argument (other is)."""
    for i, k in ti.ndrange(GLOBAL_VLA.num_arrays, m):
        GLOBAL_VLA.append(i, 1000 * i + k + 0 * other.length(0))


@ti.data_oriented
class Holder:
    def __init__(self):
        self.lists = small("held")

    @ti.kernel
    def fill(self, other: ti.template(), m: ti.i32):
        for i, k in ti.ndrange(3, m):
            self.lists.append(i, 1000 * i + k + 0 * other.length(0))


def test_launch_rolls_back_vlas_the_kernel_reaches_outside_its_arguments():
    """A VLA held in a module global, a closure, or the object of a kernel method: launch finds each, so the re-run
    after an overflow appends to none of them twice."""
    global GLOBAL_VLA
    other = VLA(1, ti.i32, name="the_argument")
    GLOBAL_VLA = small("global")
    launch(k_fill_global, other, 20)
    assert sorted_lists(GLOBAL_VLA) == expected(3, 20)

    captured = small("captured")

    @ti.kernel
    def k_fill_captured(other: ti.template(), m: ti.i32):
        for i, k in ti.ndrange(3, m):
            captured.append(i, 1000 * i + k + 0 * other.length(0))

    launch(k_fill_captured, other, 20)
    assert sorted_lists(captured) == expected(3, 20)

    def python_step(m):   # a Python function launching a kernel that reaches the global
        k_fill_global(other, m)

    GLOBAL_VLA.clear_all()
    GLOBAL_VLA.trim()   # (capacity back to nothing: the launch overflows again)
    launch(python_step, 20, vlas=[other])
    assert sorted_lists(GLOBAL_VLA) == expected(3, 20)

    h = Holder()
    launch(h.fill, other, 20)
    assert sorted_lists(h.lists) == expected(3, 20)


# ------------------------------------------------------------------------------------------------ ended programs
def test_a_vla_of_an_ended_program_raises_instead_of_crashing():
    v = small("old_program")
    launch(k_fill, v, 5)
    released = small("released")
    released.release()
    ops = {"lengths": (), "to_csr": (), "to_lists": (), "commit": (), "clear_all": (), "trim": (), "stats": (),
           "reserve": (np.zeros(3, np.int64),), "from_csr": (np.zeros(4, np.int64), np.zeros(0, np.int32))}
    for name, args in ops.items():
        with pytest.raises(RuntimeError, match="released"):
            getattr(released, name)(*args)
    ti.reset()
    try:
        for name, args in ops.items():
            with pytest.raises(RuntimeError, match="ended; create the VLA again after ti.init"):
                getattr(v, name)(*args)
        _init()
        for name, args in ops.items():   # a new program: still not this VLA's
            with pytest.raises(RuntimeError, match="ended"):
                getattr(v, name)(*args)
        with pytest.raises(RuntimeError, match="ended"):
            launch(k_fill, v, 5)
        v.release()                      # (its memory went with its program: nothing to free, no crash)
        w = small("new_program")
        launch(k_fill, w, 5)
        assert sorted_lists(w) == expected(3, 5)
    finally:
        if vla.taichi_compat.program() is None:
            _init()
