"""Handing a Taichi ndarray to other libraries without a copy: the DLPack protocol.

:func:`dlpack` wraps a ``ti.ndarray`` in an object with ``__dlpack__`` / ``__dlpack_device__``, which any DLPack
consumer takes over in place: ``torch.from_dlpack``, ``numpy.from_dlpack`` (CPU), ``cupy.from_dlpack``,
``jax.dlpack.from_dlpack``. The consumer's array points into the ndarray's memory (on CUDA, device memory): nothing
is copied, and the ndarray stays alive until the consumer's last array is gone.

Taichi 1.7.4 exposes the address of an ndarray's memory (``Program.get_ndarray_data_ptr_as_int``) but has no
DLPack export of its own, so the DLPack structures are built here with ctypes. Taichi's fields have no address
Taichi tells, which is why a VLA exports through ndarrays it packs on the device (:meth:`vla.VLA.to_dlpack`).

The memory belongs to the Taichi program: after ``ti.reset()`` or a new ``ti.init()`` the consumer's arrays point
at freed memory, as a field read after the program ended would.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import itertools
import sys

import taichi as ti
from taichi._lib import core as _ti_core

from . import taichi_compat

KDL_CPU = 1
KDL_CUDA = 2
_KDL_INT, _KDL_UINT, _KDL_FLOAT = 0, 1, 2


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]

# Every exported tensor's keep-alive (the program, the ndarray, the ctypes structures and, until a consumer takes it,
# the capsule), by the key in its manager_ctx, until the consumer calls the deleter or the capsule is dropped unused.
_EXPORTED: dict[int, list] = {}
_KEYS = itertools.count(1)
_CAPSULE = 5   # the entry's slot of the capsule


def _release(key: int):
    entry = _EXPORTED.pop(key, None)
    if entry is not None and taichi_compat.program() is not entry[0]:
        taichi_compat.bury(entry)   # an ndarray must not die under a newer program (vla.taichi_compat)


@_DELETER
def _deleter(managed):
    try:
        _release(int(managed.contents.manager_ctx or 0))
    except Exception:   # (a consumer freeing its tensor at interpreter exit, after this module's globals went)
        pass


_CAPSULE_NAME = b"dltensor"
# Private prototypes of the C API calls: ctypes.pythonapi's function objects are shared by every module of the
# process, so argtypes set on them here or elsewhere would apply to all.
_capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)(
    ("PyCapsule_New", ctypes.pythonapi))
_capsule_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_IsValid", ctypes.pythonapi))


def _sweep():
    """Release the exports whose capsule was dropped without a consumer taking it, and let go of the capsules
    consumers took (renamed "used_dltensor": the consumer owns the tensor and calls the deleter).

    The capsules carry no destructor: one written in Python (ctypes) cannot run while an exception is being raised
    (a consumer refusing a capsule), where it would replace that exception with a SystemError and leak the export;
    this sweep runs at the next export or count instead."""
    for key, entry in list(_EXPORTED.items()):
        capsule = entry[_CAPSULE]
        if capsule is None:
            continue
        if not _capsule_valid(capsule, _CAPSULE_NAME):
            entry[_CAPSULE] = None
        elif sys.getrefcount(capsule) <= 3:   # the entry, `capsule` here and getrefcount's argument: nobody else
            _release(key)
        del capsule


def _dl_dtype(dt) -> _DLDataType:
    for code, names in ((_KDL_INT, ("i8", "i16", "i32", "i64")), (_KDL_UINT, ("u8", "u16", "u32", "u64")),
                        (_KDL_FLOAT, ("f16", "f32", "f64"))):
        for name in names:
            if dt == getattr(ti, name):
                return _DLDataType(code, 8 * _ti_core.data_type_size(dt), 1)
    raise TypeError(f"dlpack: element type {dt} has no DLPack equivalent")


_driver = None


def _cuda_device_id() -> int:
    """The ordinal of the device of Taichi's current CUDA context (the thread that initialised Taichi holds it)."""
    global _driver
    if _driver is None:
        _driver = ctypes.CDLL(ctypes.util.find_library("cuda") or "libcuda.so.1")
        _driver.cuCtxGetDevice.argtypes = [ctypes.POINTER(ctypes.c_int)]
    dev = ctypes.c_int(0)
    if _driver.cuCtxGetDevice(ctypes.byref(dev)) != 0:
        raise RuntimeError("dlpack: the CUDA driver names no current device (is Taichi initialised on this thread?)")
    return dev.value


class DLPackArray:
    """A ``ti.ndarray`` (or its first ``rows`` rows) as a DLPack producer. ``shape`` is what consumers see:
    (rows,) for scalar elements, (rows, n) / (rows, n, m) for vector / matrix elements."""

    def __init__(self, nd, rows=None):
        prog = taichi_compat.require_program("dlpack")
        arch = ti.lang.impl.current_cfg().arch
        if arch not in (ti.cpu, ti.cuda):
            raise NotImplementedError(f"dlpack: exports from the CPU and CUDA backends, not {arch}")
        if len(nd.shape) != 1:
            raise ValueError(f"dlpack: a 1-d ndarray is expected, got shape {nd.shape}")
        rows = nd.shape[0] if rows is None else int(rows)
        if not 0 <= rows <= nd.shape[0]:
            raise ValueError(f"dlpack: rows must lie in [0, {nd.shape[0]}], got {rows}")
        dt = nd.dtype   # a vector/matrix ndarray's dtype is its scalar type; element_shape its element's shape
        self.shape = (rows,) + tuple(getattr(nd, "element_shape", ()) or ())
        self._nd = nd
        self._program = prog
        self._dtype = _dl_dtype(dt)
        self._device = (KDL_CUDA, _cuda_device_id()) if arch == ti.cuda else (KDL_CPU, 0)
        self._ptr = int(prog.get_ndarray_data_ptr_as_int(nd.arr))

    def __dlpack_device__(self):
        return self._device

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        """A "dltensor" capsule (DLPack 0.8 ABI, which every current consumer takes). Taichi's kernels are finished
        first (ti.sync()), so any stream the consumer reads on sees the data: ``stream`` needs no event."""
        if copy:
            raise BufferError("dlpack: this export shares memory; copy=True is not offered")
        if taichi_compat.program() is not self._program:
            raise BufferError("dlpack: the Taichi program that held this array has ended (ti.reset() or a new "
                              "ti.init()); export again from the live program")
        if dl_device is not None and tuple(dl_device) != self._device:
            raise BufferError(f"dlpack: the data lives on device {self._device}, not {tuple(dl_device)}")
        ti.sync()
        ndim = len(self.shape)
        shape = (ctypes.c_int64 * ndim)(*self.shape)
        strides = (ctypes.c_int64 * ndim)()
        step = 1
        for d in reversed(range(ndim)):   # compact row-major, in elements
            strides[d] = step
            step *= self.shape[d]
        _sweep()
        key = next(_KEYS)
        managed = _DLManagedTensor()
        managed.dl_tensor = _DLTensor(self._ptr, _DLDevice(*self._device), ndim, self._dtype,
                                      ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64)),
                                      ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64)), 0)
        managed.manager_ctx = key
        managed.deleter = _deleter
        capsule = _capsule_new(ctypes.addressof(managed), _CAPSULE_NAME, None)
        _EXPORTED[key] = [self._program, self._nd, managed, shape, strides, capsule]
        return capsule


def dlpack(nd, rows=None) -> DLPackArray:
    """``nd`` (a 1-d ``ti.ndarray`` on the CPU or CUDA backend), or its first ``rows`` rows, as an object any
    DLPack consumer takes without a copy: ``torch.from_dlpack(dlpack(nd))``."""
    return DLPackArray(nd, rows)


def exported_count() -> int:
    """Tensors handed out and not yet released by their consumers (for tests); sweeps first."""
    _sweep()
    return len(_EXPORTED)
