"""Export of a VLA's packed CSR through DLPack (vla.dlpack): consumers (numpy here; PyTorch where installed) see the
lists of a numpy reference, share the packed memory instead of copying it, and release it when done."""
import ctypes
import gc
import os

import numpy as np
import pytest
import taichi as ti

from vla import VLA, launch
from vla.dlpack import dlpack, exported_count

ARCH = os.environ.get("SMOLVLA_TEST_ARCH", "cpu")
_i32_nd = ti.types.ndarray(dtype=ti.i32, ndim=1)
vec3 = ti.types.vector(3, ti.f32)
contact = ti.types.struct(body=ti.i32, depth=ti.f32, normal=vec3)


@pytest.fixture(scope="module", autouse=True)
def taichi_runtime():
    ti.init(arch=getattr(ti, ARCH), random_seed=0, **({"advanced_optimization": False} if ARCH == "cpu" else {}))
    yield
    ti.reset()


@ti.kernel
def k_fill(v: ti.template(), lens: _i32_nd):
    """List i gets lens[i] elements i * 4096 + k, from two threads a list (so their order within a list varies)."""
    for i, j in ti.ndrange(v.num_arrays, 2):
        for q in range((lens[i] - j + 1) // 2):
            v.append(i, i * 4096 + j + 2 * q)


@ti.kernel
def k_fill_vec(v: ti.template(), lens: _i32_nd):
    for i in range(v.num_arrays):
        for k in range(lens[i]):
            v.append(i, vec3(i, k, -0.5 * k))


@ti.kernel
def k_fill_struct(v: ti.template(), lens: _i32_nd):
    for i in range(v.num_arrays):
        for k in range(lens[i]):
            v.append(i, contact(body=i * 10 + k, depth=0.25 * k, normal=vec3(0.0, 1.0, i)))


def nd(a):
    x = ti.ndarray(ti.i32, shape=len(a))
    x.from_numpy(np.asarray(a, dtype=np.int32))
    return x


def heavy_tail(n, seed):
    rng = np.random.default_rng(seed)
    lens = rng.integers(0, 9, size=n)
    long = rng.random(n) < 0.01
    lens[long] = rng.integers(64, 300, size=int(long.sum()))
    return lens


def check_lists(offsets, values, lens, element_of):
    """offsets and values describe the lists element_of(i, k) for k < lens[i], each list in any order."""
    np.testing.assert_array_equal(offsets, np.concatenate([[0], np.cumsum(lens)]))
    for i in range(len(lens)):
        got = values[offsets[i]:offsets[i + 1]]
        ref = np.array([element_of(i, k) for k in range(lens[i])]).reshape((lens[i],) + values.shape[1:])
        np.testing.assert_array_equal(np.sort(got, axis=0) if got.ndim == 1 else got, ref)


@pytest.mark.parametrize("layout", ["settled", "bump"])
def test_numpy_takes_the_packed_csr_without_a_copy(layout):
    """A settled VLA (its storage is CSR: copied on the device) and a bump one (packed by the flat gather) give the
    lists of the reference; the consumer's array is the exported memory (a write through one is seen by another
    view of the same export)."""
    lens = heavy_tail(3000, seed=1)
    kw = {} if layout == "settled" else {"inline_capacity": 2, "chunk_size": 4, "runs": "bump"}
    v = VLA(len(lens), ti.i32, name=layout, **kw)
    launch(k_fill, v, nd(lens))
    assert v._store_is_csr() == (layout == "settled")
    before = exported_count()
    offsets_x, values_x = v.to_dlpack()
    offsets, values = np.from_dlpack(offsets_x), np.from_dlpack(values_x)
    assert offsets.dtype == np.int32 and values.dtype == np.int32 and values.shape == (lens.sum(),)
    check_lists(offsets, values, lens, lambda i, k: i * 4096 + k)
    again = np.from_dlpack(values_x)
    # the consumer's arrays are the packed ndarray's memory, not copies of it
    assert again.ctypes.data == values.ctypes.data == values_x._ptr
    assert offsets.ctypes.data == offsets_x._ptr
    assert exported_count() == before + 3
    del offsets, values, again
    gc.collect()
    assert exported_count() == before
    v.release()


def test_vectors_and_structs_export_by_member():
    lens = np.random.default_rng(2).integers(0, 6, size=500)
    v = VLA(len(lens), vec3, name="vec")
    launch(k_fill_vec, v, nd(lens))
    offsets, values = (np.from_dlpack(x) for x in v.to_dlpack())
    assert values.shape == (lens.sum(), 3) and values.dtype == np.float32
    check_lists(offsets, values, lens, lambda i, k: (i, k, -0.5 * k))
    s = VLA(len(lens), contact, name="contacts")
    launch(k_fill_struct, s, nd(lens))
    offsets, members = s.to_dlpack()
    assert sorted(members) == ["body", "depth", "normal"]
    offsets = np.from_dlpack(offsets)
    ref_off, ref = s.to_csr()
    np.testing.assert_array_equal(offsets, ref_off)
    for key, x in members.items():
        np.testing.assert_array_equal(np.from_dlpack(x), ref[key])
    np.testing.assert_array_equal(np.from_dlpack(members["body"])[offsets[7]:offsets[8]],
                                  [70 + k for k in range(lens[7])])
    v.release()
    s.release()


def test_an_unconsumed_export_releases_its_memory_and_an_empty_vla_exports_nothing():
    v = VLA(100, ti.i32, name="empty")
    before = exported_count()
    offsets, values = v.to_dlpack()
    capsule = values.__dlpack__()
    assert exported_count() == before + 1
    # (another module changing the shared ctypes.pythonapi prototypes must not break the destructor)
    shared = ctypes.pythonapi.PyCapsule_GetPointer
    saved = shared.argtypes
    shared.argtypes = [ctypes.py_object, ctypes.c_char_p]
    try:
        del capsule                           # never consumed: the next export or count releases it
        gc.collect()
    finally:
        shared.argtypes = saved
    assert exported_count() == before
    assert np.from_dlpack(values).shape == (0,)
    np.testing.assert_array_equal(np.from_dlpack(offsets), np.zeros(101, np.int32))
    with pytest.raises(ZeroDivisionError):   # a capsule dropped while an exception is raised: released, not leaked
        [values.__dlpack__(), 1 / 0]
    assert exported_count() == before
    with pytest.raises(BufferError, match="copy=True"):
        values.__dlpack__(copy=True)
    with pytest.raises(ValueError, match="1-d ndarray"):
        dlpack(ti.ndarray(ti.f32, shape=(2, 2)))
    v.release()


def test_pytorch_shares_the_packed_csr():
    torch = pytest.importorskip("torch")
    lens = heavy_tail(2000, seed=3)
    v = VLA(len(lens), ti.i32, name="torch")
    launch(k_fill, v, nd(lens))
    offsets, values = v.to_torch()
    assert offsets.dtype == torch.int32 and values.dtype == torch.int32
    assert values.device.type == ("cuda" if ARCH == "cuda" else "cpu")
    check_lists(offsets.cpu().numpy(), values.cpu().numpy(), lens, lambda i, k: i * 4096 + k)
    values_x = v.to_dlpack()[1]
    shared = torch.from_dlpack(values_x)
    assert shared.data_ptr() == values_x._ptr and torch.equal(shared, values)   # the tensor is the packed memory
    shared[0] = -7                                                               # and writable
    assert torch.from_dlpack(values_x)[0] == -7
    v.release()


def test_an_export_of_an_ended_program_is_refused():
    v = VLA(10, ti.i32, name="ended")
    launch(k_fill, v, nd(np.full(10, 3)))
    offsets, values = v.to_dlpack()
    ti.reset()
    ti.init(arch=getattr(ti, ARCH), random_seed=0, **({"advanced_optimization": False} if ARCH == "cpu" else {}))
    with pytest.raises(BufferError, match="program .* has ended"):
        np.from_dlpack(values)
