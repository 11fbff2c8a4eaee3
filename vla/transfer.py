"""Moving a VLA's contents between the device and the host: packed CSR (offsets, values) both ways.

``to_csr`` packs the live elements on the device (a prefix sum of the lengths, then one flat, coalesced gather per
member), so only live bytes cross to the host; ``from_csr`` reserves each list's room and scatters the values home.
"""
import numpy as np
import taichi as ti
from taichi.lang.matrix import MatrixType
from taichi.lang.struct import StructType
from taichi.lang.util import to_numpy_type

from .errors import VLACapacityError, VLAOverflowError
from .growth import k_clear_all, k_lengths_to_nd, k_nd_to_lengths
from .taichi_compat import I32_MAX, is_primitive

_nd = ti.types.ndarray()
_i32_nd = ti.types.ndarray(dtype=ti.i32, ndim=1)


@ti.kernel
def _k_gather_leaf(v: ti.template(), path: ti.template(), offsets: _i32_nd, out: _nd):
    """Pack every live element's leaf into out, list by list (to_csr). Flat and coalesced."""
    for e in range(v.flat_size()):
        i, k = v.flat_index(e)
        if i >= 0:
            out[offsets[i] + k] = v._leaf_at(e, path)


@ti.kernel
def _k_copy_leaf(v: ti.template(), path: ti.template(), out: _nd, total: ti.i32):
    """A store that already is CSR (Transfer._store_is_csr): its first total slots, in order."""
    for e in range(total):
        out[e] = v._leaf_at(e, path)


@ti.kernel
def _k_copy_run_starts(v: ti.template(), out: _i32_nd):
    for i in range(v.num_arrays + 1):
        out[i] = v.table_start[i]


@ti.kernel
def _k_scatter_leaf(v: ti.template(), path: ti.template(), offsets: _i32_nd, owner: _i32_nd, src: _nd, total: ti.i32):
    """Write packed CSR values home (from_csr); capacity was reserved beforehand."""
    for e in range(total):
        i = owner[e]
        v._set_leaf_at(v._addr(i, e - offsets[i]), path, src[e])


@ti.kernel
def _k_count_short_lists(v: ti.template()) -> ti.i32:
    """Lists holding fewer elements than their run has chunks (runs="ordered", no inline part, chunks of one)."""
    short = 0
    for i in range(v.num_arrays):
        if v.length_field[i] != v._chunks_of(i):
            short += 1
    return short


class Transfer:
    """lengths, to_csr, from_csr and to_lists of :class:`vla.VLA` (a mixin)."""

    def lengths(self) -> np.ndarray:
        """Lengths of all lists, np.int32 (num_arrays,)."""
        self._check_program()
        self._check_complete("lengths")
        out = self._scratch_nd("lengths_out", self.num_arrays)
        k_lengths_to_nd(self, out)
        lengths = out.to_numpy()
        self._release_transient_scratch()
        return lengths

    def to_csr(self):
        """(offsets int32 (num_arrays+1,), values): values is an ndarray, or a dict of ndarrays keyed by struct
        member ('a.b' for nested members). Commits first; packed on the device, so only live elements are copied.
        (A VLA's slots are 32-bit indices, so int32 offsets hold any VLA; they come from the device as they are,
        without a conversion on the host.)"""
        self.commit()
        self._check_complete("to_csr")
        if self._store_is_csr():
            # the pool already is the CSR values and the run starts its offsets: one copy each, nothing packed
            offsets = self.table_start.to_numpy()
            return offsets, self.store.to_numpy()[:int(offsets[-1])]
        offs, leaves, total = self._csr_on_device(scratch_offsets=True)
        offsets = offs.to_numpy()[:self.num_arrays + 1]
        values = {key: nd.to_numpy()[:total] for key, nd in leaves.items()}
        self._release_transient_scratch()
        return offsets, self._values_of(values)

    def to_dlpack(self):
        """(offsets, values) packed on the device as DLPack producers (vla.dlpack): ``torch.from_dlpack``,
        ``cupy.from_dlpack``, ``numpy.from_dlpack`` (CPU) take them without a copy. offsets: int32 (num_arrays+1,);
        values: (total,) or (total, n[, m]) for vector/matrix elements, a dict keyed by member for structs. The packed
        arrays are new device memory of their own (the VLA can change after), freed when the consumer's last array
        is gone; nothing goes through the host."""
        from .dlpack import dlpack
        self.commit()
        self._check_complete("to_dlpack")
        offs, leaves, total = self._csr_on_device(scratch_offsets=False)
        self._release_transient_scratch()
        return dlpack(offs), self._values_of({key: dlpack(nd, total) for key, nd in leaves.items()})

    def to_torch(self):
        """(offsets, values) as PyTorch tensors on the VLA's device (CUDA or CPU) sharing the packed arrays of
        :meth:`to_dlpack`: no copy, nothing through the host. Needs PyTorch (``pip install -e '.[torch]'``)."""
        try:
            import torch
        except ImportError:
            raise ImportError(f"VLA {self.name!r}.to_torch needs PyTorch: pip install -e '.[torch]' "
                              f"(or use to_dlpack with any DLPack consumer)") from None
        offsets, values = self.to_dlpack()
        if isinstance(values, dict):
            return torch.from_dlpack(offsets), {key: torch.from_dlpack(x) for key, x in values.items()}
        return torch.from_dlpack(offsets), torch.from_dlpack(values)

    def _values_of(self, leaf_values: dict):
        """A struct's leaves as the dict, any other element type's one leaf alone."""
        return leaf_values if isinstance(self.dtype, StructType) else leaf_values[""]

    def _csr_on_device(self, scratch_offsets: bool):
        """(offsets ndarray (num_arrays+1 int32, or more when it is scratch), {leaf key: values ndarray}, total):
        the committed lists packed on the device. The value ndarrays are new; the offsets are too unless
        scratch_offsets (then the VLA's work buffer, valid until the next transfer)."""
        n = self.num_arrays
        offs = self._scratch_nd("csr_offsets", n + 1) if scratch_offsets else ti.ndarray(ti.i32, shape=n + 1)
        csr = self._store_is_csr()
        if csr:
            _k_copy_run_starts(self, offs)   # the run starts are the offsets
        else:
            lens = self._scratch_nd("lengths_out", n)
            k_lengths_to_nd(self, lens)
            self._scanner.exclusive(lens, n, offs)
        total = int(offs[n])
        leaves = {}
        for path, ldt in self._leaves:
            out = ti.ndarray(ldt, shape=max(total, 1))
            if total:
                if csr:
                    _k_copy_leaf(self, path, out, total)
                else:
                    _k_gather_leaf(self, path, offs, out)
            leaves[".".join(path)] = out
        return offs, leaves, total

    def _store_is_csr(self) -> bool:
        """Whether the storage holds exactly a CSR layout: ordered runs with no inline part and chunks of one element
        (what a VLA that settles into ordered runs takes for short lists, vla.growth.Growth._settle), each list
        filling its run, elements stored as themselves. One scalar read when the layout qualifies."""
        return (self.runs == "ordered" and self.inline_capacity == 0 and self.chunk_size == 1 and not self._packed
                and is_primitive(self.dtype) and int(_k_count_short_lists(self)) == 0)

    def from_csr(self, offsets, values):
        """Replace every list's contents with a CSR description (the inverse of to_csr). Values must fit the element
        type exactly: no fraction or out-of-range value into an integer type, nothing beyond a float type's range."""
        self._check_program()
        offsets = np.asarray(offsets)
        n = self.num_arrays
        if offsets.ndim != 1 or offsets.shape[0] != n + 1:
            raise ValueError(f"VLA {self.name!r}.from_csr: offsets must have num_arrays+1 = {n + 1} entries, "
                             f"got shape {offsets.shape}")
        if not np.issubdtype(offsets.dtype, np.integer):
            raise TypeError(f"VLA {self.name!r}.from_csr: offsets must be integers, got {offsets.dtype}")
        if offsets[0] != 0:
            raise ValueError(f"VLA {self.name!r}.from_csr: offsets[0] must be 0, got {offsets[0]}")
        lens = np.diff(offsets)
        if (lens < 0).any():
            bad = int(np.argmax(lens < 0))
            raise ValueError(f"VLA {self.name!r}.from_csr: offsets must be non-decreasing; offsets[{bad + 1}] = "
                             f"{offsets[bad + 1]} < offsets[{bad}] = {offsets[bad]}")
        total = int(offsets[-1])
        if total > I32_MAX:
            raise VLACapacityError(f"VLA {self.name!r}.from_csr: {total} elements exceed the 32-bit index space")
        leaf_values = self._check_values(values, total)
        try:
            self.commit()
        except VLAOverflowError:   # (what the VLA held is replaced below)
            pass
        k_clear_all(self)
        self._lost = 0
        self._reserve_for(lens)
        if total:
            offs_nd = self._scratch_nd("csr_offsets", n + 1)
            offs_nd.from_numpy(offsets.astype(np.int32))
            owner = ti.ndarray(ti.i32, shape=total)
            owner.from_numpy(np.repeat(np.arange(n, dtype=np.int32), lens))
            for (path, ldt), arr in zip(self._leaves, leaf_values):
                src = ti.ndarray(ldt, shape=total)
                src.from_numpy(arr)
                _k_scatter_leaf(self, path, offs_nd, owner, src, total)
        lens_nd = self._scratch_nd("demand", n)
        lens_nd.from_numpy(lens.astype(np.int32))
        k_nd_to_lengths(self, lens_nd)
        self._release_transient_scratch()
        self._known_empty = not total

    def to_lists(self):
        """Python lists (scalars), lists of numpy rows (vectors), or lists of dicts (structs)."""
        offsets, values = self.to_csr()
        out = []
        for i in range(self.num_arrays):
            a, b = offsets[i], offsets[i + 1]
            if isinstance(values, dict):
                out.append([{key: val[j] for key, val in values.items()} for j in range(a, b)])
            elif values.ndim == 1:
                out.append(values[a:b].tolist())
            else:
                out.append([values[j] for j in range(a, b)])
        return out

    def _check_values(self, values, total):
        leaves = []
        if isinstance(self.dtype, StructType):
            if not isinstance(values, dict):
                raise TypeError(f"VLA {self.name!r}.from_csr: struct dtype needs values as a dict of arrays keyed "
                                f"by member, got {type(values).__name__}")
            keys = {".".join(p) for p, _ in self._leaves}
            if set(values) != keys:
                raise ValueError(f"VLA {self.name!r}.from_csr: values keys {sorted(values)} != members {sorted(keys)}")
            items = [(".".join(p), dt, values[".".join(p)]) for p, dt in self._leaves]
        else:
            items = [("values", self._leaves[0][1], values)]
        for key, ldt, arr in items:
            arr = np.asarray(arr)
            shape = (total,)
            if isinstance(ldt, MatrixType):
                shape = (total, ldt.n) if ldt.ndim == 1 else (total, ldt.n, ldt.m)
            if arr.shape != shape:
                raise ValueError(f"VLA {self.name!r}.from_csr: {key} has shape {arr.shape}, but the offsets say "
                                 f"{total} elements: expected {shape}")
            base = ldt.dtype if isinstance(ldt, MatrixType) else ldt
            leaves.append(self._exact_cast(key, arr, to_numpy_type(base)))
        return leaves

    def _exact_cast(self, key, arr, np_type):
        """arr as np_type, refusing what the cast would change without a word: a fraction or an out-of-range value
        into an integer type (numpy turns 1.7 into 1 and 1e10 into -2147483648), a finite value beyond a float type's
        range (it would become inf). Rounding to the nearest float is a float's nature and passes."""
        def fail(why, where):
            j = int(np.flatnonzero(where.reshape(-1))[0])
            raise ValueError(f"VLA {self.name!r}.from_csr: {key}[{j}] = {arr.reshape(-1)[j]!r} {why}")
        if arr.dtype.kind not in "biuf":
            raise TypeError(f"VLA {self.name!r}.from_csr: {key} must hold numbers, got dtype {arr.dtype}")
        target = np.dtype(np_type)
        if target.kind in "iu":
            info = np.iinfo(target)
            if arr.dtype.kind == "f":
                bad = ~np.isfinite(arr) | (arr != np.trunc(arr))
                if bad.any():
                    fail(f"is not an integer, which the {target} element type needs", bad)
            if arr.size and arr.dtype.kind != "b":
                bad = (arr < info.min) | (arr > info.max)
                if bad.any():
                    fail(f"is outside the range of the {target} element type [{info.min}, {info.max}]", bad)
        elif target.kind == "f" and arr.dtype.kind == "f" and arr.dtype.itemsize > target.itemsize:
            bad = np.isfinite(arr) & (np.abs(arr) > np.finfo(target).max)
            if bad.any():
                fail(f"is beyond the range of the {target} element type (it would become inf)", bad)
        return np.ascontiguousarray(arr, dtype=target)
