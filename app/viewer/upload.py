"""Handing a frame's geometry to GGUI: one device buffer, one copy to the host, GGUI draws from host memory.

Taichi 1.7.4's GGUI takes vertex data from the host whenever the simulation runs on another backend than its own
Vulkan device (CUDA, CPU): ``scene.particles(field)`` and friends allocate a host array per call, copy the field
into it with a kernel that receives it as an external array (on CUDA that moves it host to device and back), and
``mesh_instance`` reads the whole transform field back with ``to_numpy()``, again per call. For 100k bodies that
was most of a frame.

Here the viewer's kernels write everything the bodies need into one ``ti.ndarray`` laid out as GGUI's vertex
records (:data:`VERTEX_FLOATS` floats: position, normal, texture coordinates, RGBA; a particle keeps its radius
in the fourth float) and 4x4 instance transforms; :meth:`FrameBuffer.host` brings exactly the live part to the
host once per frame, and the ``draw_*`` functions give GGUI numpy views into it (GGUI's host-pointer path: one
memcpy into its staging buffer per draw, no conversion). The copy to the host:

* CPU: none. The ndarray's memory is host memory; the views point into it.
* CUDA: one device-to-host copy by the CUDA driver into page-locked memory, which moves at the bus's speed
  (pageable memory, what Taichi's own copies use, runs at a fraction of it).
* other backends: ``to_numpy()``.
"""
from __future__ import annotations

import ctypes
import ctypes.util

import numpy as np
import taichi as ti

VERTEX_FLOATS = 12      # GGUI's Vertex: pos (3), normal (3), tex coords (2), colour (4)
TRANSFORM_FLOATS = 16   # a row-major 4x4 instance transform


# --------------------------------------------------------------------------------------------------------------
# device -> host
# --------------------------------------------------------------------------------------------------------------
class _CudaDriver:
    """The few CUDA driver calls the copy needs, through ctypes (Taichi does not expose a one-way copy)."""

    def __init__(self):
        name = ctypes.util.find_library("cuda") or "libcuda.so.1"
        self.lib = ctypes.CDLL(name)
        self.lib.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t]
        self.lib.cuMemHostAlloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_uint]
        self.lib.cuMemFreeHost.argtypes = [ctypes.c_void_p]
        self.lib.cuCtxGetCurrent.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        # Taichi's context is current on the thread that initialised it (the copy runs in it); Taichi's pool memory
        # reports no context of its own to cuPointerGetAttribute, so there is no other way to name it
        ctx = ctypes.c_void_p()
        self.check(self.lib.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
        if not ctx.value:
            raise RuntimeError("CUDA driver: no current context")

    def check(self, result, what):
        if result != 0:
            raise RuntimeError(f"CUDA driver: {what} failed with error {result}")

    def host_alloc(self, nbytes: int) -> int:
        p = ctypes.c_void_p()
        self.check(self.lib.cuMemHostAlloc(ctypes.byref(p), nbytes, 0), "cuMemHostAlloc")
        return p.value

    def free_host(self, p: int):
        self.lib.cuMemFreeHost(p)

    def copy_to_host(self, host_ptr: int, device_ptr: int, nbytes: int):
        self.check(self.lib.cuMemcpyDtoH_v2(host_ptr, device_ptr, nbytes), "cuMemcpyDtoH")


class FrameBuffer:
    """A device array of float32 the viewer's kernels fill every frame (``.array``, a 1-d ``ti.ndarray`` passed to
    them as ``ti.types.ndarray()``), and its host copy. ``host(ranges)`` brings the (first, count) float ranges
    to the host and returns the whole array there (outside the ranges: stale), valid until the next call;
    ``path`` says how ('cpu: shared', 'cuda: pinned copy', 'to_numpy')."""

    def __init__(self, floats: int):
        self.floats = max(int(floats), VERTEX_FLOATS)
        self.array = ti.ndarray(ti.f32, self.floats)
        arch = ti.lang.impl.current_cfg().arch
        prog = ti.lang.impl.get_runtime().prog
        self._ptr = int(prog.get_ndarray_data_ptr_as_int(self.array.arr))
        self._pinned = None
        self._cuda = None
        if arch == ti.cpu:
            self.path = "cpu: shared"
            self._view = np.ctypeslib.as_array((ctypes.c_float * self.floats).from_address(self._ptr))
        elif arch == ti.cuda:
            try:
                self._cuda = _CudaDriver()
                self._pinned = self._cuda.host_alloc(4 * self.floats)
                self._view = np.ctypeslib.as_array((ctypes.c_float * self.floats).from_address(self._pinned))
                self.path = "cuda: pinned copy"
            except (OSError, AttributeError, RuntimeError):
                self._cuda = None
                self.path = "to_numpy"
        else:
            self.path = "to_numpy"

    def host(self, ranges) -> np.ndarray:
        ti.sync()
        if self.path == "cpu: shared":
            return self._view
        if self._cuda is not None:
            try:
                for first, count in ranges:
                    count = min(int(count), self.floats - int(first))
                    if count > 0:
                        self._cuda.copy_to_host(self._pinned + 4 * int(first), self._ptr + 4 * int(first), 4 * count)
                return self._view
            except RuntimeError:
                self.close()   # (a driver that refuses the copy: Taichi's own, from now on)
                self._cuda = None
                self.path = "to_numpy"
        return self.array.to_numpy()

    def close(self):
        if self._pinned is not None:
            self._cuda.free_host(self._pinned)
            self._pinned = None

    def __del__(self):
        try:
            self.close()
        except Exception:   # (interpreter shutdown: the driver may be gone)
            pass


def vertex_records(positions, normals=None, colors=None) -> np.ndarray:
    """GGUI vertex records (N, VERTEX_FLOATS) float32 built on the host: for static meshes and lines."""
    p = np.asarray(positions, np.float32).reshape(-1, 3)
    out = np.zeros((p.shape[0], VERTEX_FLOATS), np.float32)
    out[:, 0:3] = p
    if normals is not None:
        out[:, 3:6] = np.asarray(normals, np.float32).reshape(-1, 3)
    out[:, 8:11] = 1.0 if colors is None else np.asarray(colors, np.float32).reshape(-1, 3)
    out[:, 11] = 1.0
    return out


# --------------------------------------------------------------------------------------------------------------
# draws (a GGUI scene from window.get_scene(); every array float32 / int32, C-contiguous, read during the call)
# --------------------------------------------------------------------------------------------------------------
def _info(array):
    from taichi.ui.utils import get_field_info

    return get_field_info(array)


def _no_info():
    from taichi.ui.utils import get_field_info

    return get_field_info(None)


def draw_particles(scene, records: np.ndarray):
    """Spheres from (K, VERTEX_FLOATS) records: centre (m), radius (m, GGUI's particle scale) in float 3, colour."""
    k = records.shape[0]
    if k:
        scene.scene.particles(_info(records), True, True, (0.5, 0.5, 0.5), 1.0, k, 0)


def draw_mesh(scene, records: np.ndarray, indices: np.ndarray | None = None, two_sided=False):
    """Triangles from per-vertex records (positions, normals, colours), indexed or three records a triangle."""
    v = records.shape[0]
    if not v:
        return
    count = v if indices is None else indices.shape[0]
    scene.scene.mesh(_info(records), True, _info(indices) if indices is not None else _no_info(),
                     (0.5, 0.5, 0.5), two_sided, count, 0, v, 0, False)


def draw_instances(scene, records: np.ndarray, indices: np.ndarray, color, transforms: np.ndarray):
    """One mesh (records + indices, unit size) drawn once per (K, 16) row-major 4x4 transform, in one colour."""
    k = transforms.shape[0]
    if k:
        scene.scene.mesh_instance(_info(records), False, _info(indices), tuple(float(x) for x in color), False,
                                  _info(transforms), k, 0, indices.shape[0], 0, records.shape[0], 0, False)


def draw_lines(scene, records: np.ndarray, width: float, color):
    """Line segments between records 2j and 2j + 1, in one colour, `width` pixels wide."""
    v = records.shape[0] - records.shape[0] % 2
    if v:
        scene.scene.lines(_info(records), _no_info(), False, tuple(float(x) for x in color), float(width), v, 0, v, 0)
