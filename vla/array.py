"""The VLA: ``num_arrays`` variable-length lists on the device that kernels grow with ``append``.

Its parts, one module each: where elements live and how an element is found (vla.layout), appending and the
overflow area (vla.append), commit, growth and trim (vla.growth), flat iteration and the warp's read (vla.iteration),
host transfer (vla.transfer), choosing the sizes (vla.tuning), Taichi's limits (vla.taichi_compat), and running
kernels so that no append is lost (vla.launch). This module holds the constructor and what spans the parts.
"""
import weakref

import numpy as np
import taichi as ti
from taichi._lib import core as _ti_core
from taichi.lang import impl

from . import layout as _layout
from . import taichi_compat
from .append import Appending
from .errors import VLACapacityError
from .growth import QUIET_COMMITS, Growth, check_reserve
from .iteration import Iteration
from .layout import Addressing, check_dtype, element_bytes, leaves, storage_words
from .scan import Scanner
from .transfer import Transfer
from .tuning import AUTO_START, check_runs, tune

# Every live VLA, so that launch() can find the ones a kernel touched when its arguments do not say.
LIVE: "weakref.WeakSet[VLA]" = weakref.WeakSet()


def _check_int(what, val, low):
    if isinstance(val, bool) or not isinstance(val, (int, np.integer)):
        raise TypeError(f"VLA {what} must be an int, got {type(val).__name__} {val!r}")
    if val < low:
        raise ValueError(f"VLA {what} must be >= {low}, got {val}")


@ti.data_oriented
class VLA(Addressing, Appending, Growth, Iteration, Transfer):
    """``num_arrays`` variable-length lists of ``dtype`` elements on the device.

    Args:
        num_arrays: number of lists (> 0).
        dtype: a Taichi scalar type, ``ti.types.vector``/``matrix``, or ``ti.types.struct``. A struct of 32-bit
            members is stored as 64-bit words (half the load instructions of a record); anything else whole.
        inline_capacity: elements per list stored inline (tier 1, compile-time constant, >= 0). None (default): the
            VLA chooses it from the lengths it sees (vla.tuning), and may change it when it grows.
        chunk_size: elements per pool chunk (tier 2, compile-time constant, a power of two). None (default): chosen
            as inline_capacity is.
        reserve: ``None``; an int, pool elements to pre-allocate (assigned to lists as they need them); or an array
            of ``num_arrays`` expected lengths, pre-assigned to each list.
        runs: ``"bump"`` (default): a list that outgrows its chunks takes a new run at the pool's end on the device,
            in the commit; 12 bytes of metadata a list and 4 a chunk. ``"ordered"``: the runs lie in list order, 8
            bytes a list and 4 per 64 chunks, but any growth re-lays the whole pool out on the host (a Batch's
            device commit reports it as a failure) and permute() is not available: for lists whose lengths settle
            after a first fill, where memory counts most.
        overflow_capacity: elements the overflow area holds before a commit must grow it (default
            ``max(1024, num_arrays // 64)``); it grows on demand.
        name: used in error messages.

    Kernel side (``@ti.func``, the VLA passed as ``ti.template()``): append, length, get, set, clear, get_member,
    set_member, set_members, capacity; flat_size, flat_index, flat_value, flat_reduce; reduce_warp.
    Host side: commit, clear_all, trim, reserve, permute, lengths, to_csr, from_csr, to_lists, stats, release,
    VLA.tune. vla/API.md is the reference.
    """

    tune = staticmethod(tune)

    def __init__(self, num_arrays, dtype, inline_capacity=None, chunk_size=None, reserve=None, runs=None,
                 overflow_capacity=None, name="vla"):
        taichi_compat.require_program(f"VLA {name!r}")
        _check_int("num_arrays", num_arrays, 1)
        # (None: chosen by the VLA; _retune keeps a size the caller gave)
        self._auto_inline = inline_capacity is None
        self._auto_chunk = chunk_size is None
        # runs None: the VLA starts with "bump" and settles into "ordered" while its lengths stay (vla.growth), if it
        # also chooses its sizes
        self._auto_runs = runs is None and self._auto_inline and self._auto_chunk
        runs = "bump" if runs is None else runs
        if inline_capacity is not None:
            _check_int("inline_capacity", inline_capacity, 0)
        if chunk_size is not None:
            _check_int("chunk_size", chunk_size, 1)
            if chunk_size & (chunk_size - 1):
                raise ValueError(f"VLA chunk_size must be a power of two (1, 2, 4, ...), got {chunk_size}")
        check_dtype(dtype)
        check_runs(runs)
        inline_capacity, chunk_size = self._first_layout(num_arrays, dtype, runs, inline_capacity, chunk_size,
                                                         reserve)
        if overflow_capacity is not None:
            _check_int("overflow_capacity", overflow_capacity, 1)
        if num_arrays >= taichi_compat.I32_MAX:   # (the lists' tables have num_arrays + 1 entries)
            raise VLACapacityError(f"VLA {name!r}: num_arrays = {num_arrays} exceeds the 32-bit index space (at "
                                   f"most {taichi_compat.I32_MAX - 1}); split the lists over several VLAs")
        if num_arrays * max(inline_capacity, 1) > taichi_compat.I32_MAX:
            raise VLACapacityError(
                f"VLA {name!r}: num_arrays * inline_capacity = {num_arrays * inline_capacity} exceeds the "
                f"32-bit index space; lower inline_capacity or split the VLA")

        self.name = name
        self.num_arrays = int(num_arrays)
        self.dtype = dtype
        self.runs = runs
        self._hint_shift = _layout.HINT_EVERY.bit_length() - 1
        self.inline_capacity = int(inline_capacity)
        self.chunk_size = int(chunk_size)
        self._chunk_shift = int(chunk_size).bit_length() - 1
        self._leaves = leaves(dtype)
        self.element_bytes = element_bytes(dtype)
        # What one element takes in storage: itself, or whole 64-bit words (vla.words).
        self._words = storage_words(dtype)
        self._packed = self._words is not None
        self._store_dtype = self._words.store_dtype if self._words else dtype
        self.storage_bytes = element_bytes(self._store_dtype)
        self._debug = bool(impl.current_cfg().debug)

        n = self.num_arrays
        self._n_inline = self.inline_capacity * n
        reserve_lengths = None
        reserve_elems = 0
        if reserve is not None:
            if isinstance(reserve, (int, np.integer)) and not isinstance(reserve, bool):
                if reserve < 0:
                    raise ValueError(f"VLA reserve must be >= 0, got {reserve}")
                reserve_elems = int(reserve)
            else:
                reserve_lengths = np.asarray(reserve)
                if reserve_lengths.shape != (n,) or not np.issubdtype(reserve_lengths.dtype, np.integer):
                    raise ValueError(f"VLA reserve as per-array lengths must be integers of shape ({n},), got "
                                     f"{reserve_lengths.dtype} {reserve_lengths.shape}")
                if (reserve_lengths < 0).any():
                    raise ValueError("VLA reserve lengths must be >= 0")
        # Every size is checked before the first tree is made: a refused VLA leaves nothing behind.
        check_reserve(name, n, self.inline_capacity, self.chunk_size,
                      reserve_elems if reserve_lengths is None else reserve_lengths)
        pool_chunks = max(1, -(-reserve_elems // self.chunk_size))
        ovf = int(overflow_capacity) if overflow_capacity is not None else max(1024, n // 64)
        if ovf > taichi_compat.I32_MAX:
            raise VLACapacityError(f"VLA {name!r}: overflow_capacity = {ovf} exceeds the 32-bit index space")
        taichi_compat.check_allocation(
            4 * (3 * n + 17) + (self._n_inline + pool_chunks * self.chunk_size) * self.storage_bytes
            + 4 * self._owner_len(pool_chunks) + ovf * (self.storage_bytes + 8), f"VLA {name!r}")

        # Fixed part: never reallocated. table_start[i], table_chunks[i]: list i's run of pool chunks (runs="ordered":
        # table_chunks is not used (one entry) and table_start[n] closes the last run). _scalars: vla.append.
        ordered = runs == "ordered"
        fb = ti.FieldsBuilder()
        self.length_field = ti.field(ti.i32)
        self.table_start = ti.field(ti.i32)
        self._scalars = ti.field(ti.i32)
        fb.dense(ti.i, n).place(self.length_field)
        fb.dense(ti.i, n + 1).place(self.table_start)
        fb.dense(ti.i, 16).place(self._scalars)
        self._fixed_tree = taichi_compat.finalize(fb, f"VLA {name!r}")

        # Growable part: one field per SNode tree, so that a tree can be replaced without moving the others.
        self._trees = {}
        self._caps = {}
        self.store = self.table_owner = self.table_chunks = self.ovf_value = self.ovf_meta = self.relayout_tmp = None
        self.grow_events = 0
        self.compact_events = 0
        self.overflow_events = 0
        self.recompile_events = 0
        self.retune_events = 0
        # True while every list is known to be empty (constructed, clear_all()): launch then needs no snapshot of the
        # lengths to roll back to. Any commit, refill or Batch launch ends it.
        self._known_empty = True
        self._lost = 0   # appends lost by a kernel run without launch, since the last refill (Growth._commit_lost)
        self._last_parked = 0   # appends the last commit found in the overflow area
        self._overflow_given_back = False   # launch gave a grown overflow area back (once; trim resets it)
        self._quiet = 0   # commits in a row that found nothing to grow (vla.growth.Growth._settle)
        self._quiet_needed = QUIET_COMMITS   # (0: it does not settle any more)
        self._settle_reverts = 0   # times it grew out of ordered runs again
        self._ever_filled = False   # a launch has filled it (the first one may settle it at once)

        self._alloc("store", self._store_dtype, self._n_inline + pool_chunks * self.chunk_size)
        self._caps["pool_chunks"] = pool_chunks
        # what reserve= asked for, in elements (the chunk size may change): the lazy release, trim(slack), keeps it
        self._reserved_elements = pool_chunks * self.chunk_size
        self._alloc("table_owner", ti.i32, self._owner_len(pool_chunks))
        # (its own tree: a VLA that settles into runs="ordered" gives it back)
        self._alloc("table_chunks", ti.i32, 1 if ordered else n)
        self._default_ovf = ovf
        self._alloc("ovf_value", self._store_dtype, ovf)
        self._alloc("ovf_meta", ti.types.vector(2, ti.i32), ovf)
        self._alloc("relayout_tmp", self._store_dtype, 1)  # staging for re-layouts; its own tree, so its id is stable
        _k_init(self, ovf)   # (one kernel: a field's fill() and an element write would compile one each)
        self._scanner = Scanner(n + 1)
        self._scratch = {}
        self._prog = taichi_compat.program()
        LIVE.add(self)
        if reserve_lengths is not None:
            self._reserve_for(reserve_lengths)

    @property
    def slot_capacity(self) -> int:
        """Flat slots the storage holds now (inline tier + every pool chunk, handed out or not): an upper bound of
        flat_size() until the pool next changes size (commit, reserve, from_csr, trim), known on the host without a
        device read."""
        return self._n_inline + self._caps["pool_chunks"] * self.chunk_size

    def stats(self) -> dict:
        """Live and reserved sizes. reserved_bytes: element storage (inline tier, pool, overflow area) and all
        metadata (per list, per chunk, per overflow slot). scratch_bytes: the work buffers the VLA keeps for reuse
        (launch's and Batch's rollback snapshots, permute()'s buffer, the prefix sum's
        block sums, the re-layout staging; trim() frees them); device_bytes: both, all the device memory it holds."""
        self._check_program()
        live = int(_k_sum_lengths(self))
        eb = self.element_bytes
        pool_chunks = self._caps["pool_chunks"]
        holes = int(self._scalars[3])
        bump = int(self._scalars[2])
        reserved_elems = self._n_inline + pool_chunks * self.chunk_size
        ovf = self._caps["ovf_value"]
        # per list: length, run start (and run length, bump); the closing run start; 16 scalars; the owner table
        # (bump) or hint (ordered); per overflow slot its (list, slot)
        table_entries = self.num_arrays + 1 + self._caps["table_chunks"]
        meta = 4 * (self.num_arrays + table_entries) + 64 + 4 * self._caps["table_owner"] + 8 * ovf
        element_reserved_bytes = (reserved_elems + ovf) * self.storage_bytes  # (padding included)
        scratch = self._scratch_bytes()
        return {
            "arrays": self.num_arrays,
            "live_elements": live,
            "reserved_elements": reserved_elems,
            "live_bytes": live * eb,
            "reserved_bytes": element_reserved_bytes + meta,
            "element_reserved_bytes": element_reserved_bytes,
            "metadata_bytes": meta,
            "scratch_bytes": scratch,
            "device_bytes": element_reserved_bytes + meta + scratch,
            "inline_elements": self._n_inline,
            "inline_capacity": self.inline_capacity,
            "chunk_size": self.chunk_size,
            "runs": self.runs,
            "pool_chunks_used": bump - holes,
            "pool_chunks_holes": holes,
            "pool_chunks_total": pool_chunks,
            "overflow_capacity": ovf,
            "overflow_events": self.overflow_events + int(self._scalars[8]),
            "grow_events": self.grow_events + int(self._scalars[9]),
            "compact_events": self.compact_events,
            "recompile_events": self.recompile_events,
            "retune_events": self.retune_events,
            "layout_chosen_by_vla": self._auto_inline or self._auto_chunk,
        }

    def release(self):
        """Free the device memory now (the VLA is unusable afterwards; Taichi drops compiled kernels). After
        ti.init()/ti.reset() the memory has gone with its program: then this only forgets the VLA's trees."""
        if self._prog is not None and taichi_compat.program() is self._prog:
            for tree in self._trees.values():
                tree.destroy()
            self._fixed_tree.destroy()
        elif self._prog is not None:   # its ndarrays must not be freed through a later program (__del__)
            taichi_compat.bury((self._scratch, self._scanner))
        self._trees = {}
        self._prog = None   # (every host operation refuses from now on: _check_program)
        LIVE.discard(self)

    def __del__(self):
        try:
            if self._prog is not None and taichi_compat.program() is not self._prog:
                taichi_compat.bury((self._scratch, self._scanner))
        except Exception:  # interpreter shutdown: nothing to protect any more
            pass

    def __repr__(self):
        return (f"VLA(name={self.name!r}, num_arrays={self.num_arrays}, inline_capacity="
                f"{self.inline_capacity}, chunk_size={self.chunk_size}, runs={self.runs!r})")

    # ------------------------------------------------------------------ host-side internals
    @staticmethod
    def _first_layout(num_arrays, dtype, runs, inline_capacity, chunk_size, reserve):
        """(inline_capacity, chunk_size) to start with: those given; for a size left to the VLA, tune's choice for
        reserved lengths when given, else AUTO_START's."""
        auto_ic, auto_cs = inline_capacity is None, chunk_size is None
        if not (auto_ic or auto_cs):
            return inline_capacity, chunk_size
        lens = None if reserve is None or np.ndim(reserve) == 0 else np.asarray(reserve)
        if lens is not None and lens.shape == (num_arrays,) and np.issubdtype(lens.dtype, np.integer) \
                and lens.size and lens.min() >= 0 and lens.any():
            kw = {}
            if not auto_ic:
                kw["inline_options"] = (inline_capacity,)
            if not auto_cs:
                kw["chunk_options"] = (chunk_size,)
            t = tune(lens, dtype, runs, **kw)
            return t["inline_capacity"], t["chunk_size"]
        return (AUTO_START[0] if auto_ic else inline_capacity), (AUTO_START[1] if auto_cs else chunk_size)

    def _check_program(self):
        if self._prog is None:
            raise RuntimeError(f"VLA {self.name!r} was released (VLA.release()); create a new one")
        if taichi_compat.program() is not self._prog:
            raise RuntimeError(f"VLA {self.name!r} belongs to a Taichi program that ti.init()/ti.reset() has "
                               f"ended; create the VLA again after ti.init()")

    def _scratch_nd(self, key, n, dtype=ti.i32):
        nd = self._scratch.get(key)
        if nd is None or nd.shape[0] < n:
            nd = ti.ndarray(dtype, shape=max(n, 1))
            self._scratch[key] = nd
        return nd

    def _scratch_bytes(self) -> int:
        total = sum(int(np.prod(nd.shape)) * _ti_core.data_type_size(nd.dtype) for nd in self._scratch.values())
        total += self._scanner.scratch_bytes()
        return total + self._caps["relayout_tmp"] * self.storage_bytes

    def _alloc(self, attr, dtype, length):
        """Allocate field ``attr`` of ``length`` entries in an SNode tree of its own (vla.taichi_compat)."""
        field, tree = taichi_compat.place(dtype, length, f"VLA {self.name!r}: {attr}")
        setattr(self, attr, field)
        self._trees[attr] = tree
        self._caps[attr] = length


@ti.kernel
def _k_init(v: ti.template(), overflow_capacity: ti.i32):
    """A new VLA: every chunk unowned (-1), the overflow area's capacity in _scalars[1]."""
    for t in v.table_owner:
        v.table_owner[t] = -1
    v._scalars[1] = overflow_capacity


@ti.kernel
def _k_sum_lengths(v: ti.template()) -> ti.i64:
    s = ti.i64(0)
    for i in range(v.num_arrays):
        s += v.length_field[i]
    return s
