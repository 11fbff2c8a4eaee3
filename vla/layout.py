"""Where a VLA keeps its elements, and how an element's address is found.

Tiers 1 and 2 are one field, ``store``: the inline slots first, then the pool.

* **inline** (tier 1): the first ``inline_capacity`` elements of every list, packed list after list
  (``[i, k]``): neighbouring threads (lists ``i``, ``i+1``) read neighbouring addresses, and a thread's first
  load brings its whole inline part into cache, so reading the rest costs cache hits instead of more trips to
  memory (the ``[k, i]`` order also coalesces, but needs one memory trip per k: 10% slower for thread-per-list
  reads on an H200). No indirection.
* **pool** (tier 2): fixed-size chunks of ``chunk_size`` elements. A list's chunks are one contiguous run, so
  element ``k`` is at ``pool[table_start[i] * chunk_size + k - inline_capacity]``: O(1), no chain walk.

An element's address is a *select* between the two formulas rather than a branch between two fields. That keeps
get() and append() branch-free, so a loop over a list compiles to straight-line code whose invariant loads
(field base pointers, the list's table entry) are hoisted out of the loop (on an H200 this made the append
path 1.3x faster than two fields behind a branch).

Runs: with ``runs="bump"`` a list's run is ``table_start[i], table_chunks[i]`` and a per-chunk owner table maps
a pool chunk back to its list. With ``runs="ordered"`` the runs lie in list order (a list's run ends where the
next one's starts), so ``table_chunks`` is not needed and the owner table keeps only every ``HINT_EVERY``-th
chunk's owner, a hint for a short binary search over the run starts.

Element layout follows from the dtype: a struct of 32-bit members (scalars, vectors, matrices) is stored as
64-bit words (vla.words), which moves a record in half the load instructions of Taichi's member-by-member
copy; any other dtype is stored whole, as Taichi places it.
"""
import taichi as ti
from taichi._lib import core as _ti_core
from taichi.lang.matrix import MatrixType
from taichi.lang.struct import StructType

from .taichi_compat import is_primitive
from .words import Words, words_fit

# runs="ordered": chunks per entry of the owner hint (4 bytes per 64 chunks). A denser hint shortens the
# search a flat slot makes by a step or two: on an H200 hint 16 read no faster than 64 within the noise.
HINT_EVERY = 64


def check_dtype(dtype):
    if is_primitive(dtype) or isinstance(dtype, (MatrixType, StructType)):
        if isinstance(dtype, StructType):
            if not dtype.members:
                raise TypeError("VLA dtype: a ti.types.struct needs at least one member")
            for _, leaf in leaves(dtype):
                check_dtype(leaf)
        elif isinstance(dtype, MatrixType) and (dtype.n < 1 or (dtype.ndim == 2 and dtype.m < 1)):
            raise TypeError("VLA dtype: a ti.types.vector/matrix needs at least one component")
        return
    raise TypeError(f"VLA dtype must be a Taichi scalar type (ti.i32, ti.f32, ...), ti.types.vector/matrix or "
                    f"ti.types.struct; got {dtype!r}")


def leaves(dtype, path=()):
    """Scalar/matrix leaves of a dtype as (path, leaf dtype); path () for non-struct dtypes."""
    if isinstance(dtype, StructType):
        out = []
        for name, member in dtype.members.items():
            out += leaves(member, path + (name,))
        return out
    return [(path, dtype)]


def _leaf_bytes(dtype) -> int:
    if isinstance(dtype, MatrixType):
        return dtype.n * (dtype.m if dtype.ndim == 2 else 1) * _ti_core.data_type_size(dtype.dtype)
    return _ti_core.data_type_size(dtype)


def element_bytes(dtype) -> int:
    """Bytes of one element of ``dtype`` (sum over struct members, no padding)."""
    return sum(_leaf_bytes(dt) for _, dt in leaves(dtype))


def storage_words(dtype):
    """The 64-bit word packing a VLA of ``dtype`` stores its elements in (a vla.words.Words), or None when it
    stores them whole."""
    return Words(dtype) if words_fit(dtype) else None


def storage_bytes(dtype) -> int:
    """Bytes one element of ``dtype`` takes in a VLA's storage (its words' padding included)."""
    w = storage_words(dtype)
    return w.storage_bytes if w else element_bytes(dtype)


def leaf_field(field, path):
    """The member field of a (struct) field at ``path``; evaluated at kernel compile time."""
    for name in path:
        field = field.field_dict[name]
    return field


class Addressing:
    """Kernel-side element access of :class:`vla.VLA` (a mixin: the VLA's fields and constants are its own)."""

    @ti.func
    def length(self, i):
        """Number of elements in list i."""
        return self.length_field[i]

    @ti.func
    def get(self, i, k):
        """Element k of list i (0 <= k < length(i)); O(1), no chain walk, no branch."""
        if ti.static(self._debug):  # a bare assert costs ~6x on get-heavy loops even with debug off
            assert i >= 0 and i < self.num_arrays and k >= 0 and k < self.length_field[i], "VLA.get: index out of range"
        return self._load(self._addr(i, k))

    @ti.func
    def set(self, i, k, x):
        """Overwrite element k (< length(i)) of list i."""
        if ti.static(self._debug):
            assert i >= 0 and i < self.num_arrays and k >= 0 and k < self.length_field[i], "VLA.set: index out of range"
        self._put(self._addr(i, k), x)

    @ti.func
    def get_member(self, i, k, name: ti.template()):
        """Member ``name`` (a str) of struct element k of list i: one member's load instead of the record's."""
        if ti.static(self._debug):
            assert i >= 0 and i < self.num_arrays and k >= 0 and k < self.length_field[i], \
                "VLA.get_member: index out of range"
        return self._leaf_at(self._addr(i, k), (name,))

    @ti.func
    def set_member(self, i, k, name: ti.template(), x):
        """Overwrite member ``name`` of struct element k of list i, leaving the other members untouched. An element
        stored as 64-bit words (a struct of 32-bit members) is written a word at a time: a word the member shares
        with another member is read and written back with that member's half unchanged, so no other thread may
        set members of the same element meanwhile."""
        if ti.static(self._debug):
            assert i >= 0 and i < self.num_arrays and k >= 0 and k < self.length_field[i], \
                "VLA.set_member: index out of range"
        self._set_leaf_at(self._addr(i, k), (name,), x)

    @ti.func
    def set_members(self, i, k, x, names: ti.template()):
        """Overwrite the members `names` (a tuple of str) of struct element k of list i with those of the struct
        value x, leaving the others untouched. Words that these members fill together are written without being
        read first (set_member one at a time may read a word back)."""
        if ti.static(self._debug):
            assert i >= 0 and i < self.num_arrays and k >= 0 and k < self.length_field[i], \
                "VLA.set_members: index out of range"
        a = self._addr(i, k)
        if ti.static(self._packed):
            self._write_words(a, names, x, True)
        else:
            for name in ti.static(names):
                self._set_leaf_at(a, (name,), x[name])

    @ti.func
    def capacity(self, i):
        """Elements list i holds in its own storage (inline + its chunks). Appends at index >= capacity(i) wait in
        the overflow area until commit(); below it, get(i, k) is valid even before a commit."""
        return self.inline_capacity + (self._chunks_of(i) << self._chunk_shift)

    # ------------------------------------------------------------------ internals
    @ti.func
    def _load(self, a):
        """The element in store slot a."""
        return self._unpack(self.store[a])

    @ti.func
    def _put(self, a, x):
        self.store[a] = self._pack(x)

    @ti.func
    def _pack(self, x):
        """An element as stored: itself, or its words (vla.words)."""
        if ti.static(self._packed):
            return self._words.pack(x)
        else:
            return x

    @ti.func
    def _unpack(self, s):
        """Inverse of _pack."""
        if ti.static(self._packed):
            return self._words.unpack(s)
        else:
            return s

    @ti.func
    def _write_words(self, a, names: ti.template(), x, whole: ti.template()):
        """Write members `names` into the element (stored as words) in store slot a; x is the struct value (whole)
        or the single member's value. A word is read back only to keep another member's half."""
        for plan in ti.static(self._words.plans(names)):
            old = ti.u64(0)
            if ti.static(plan[3]):
                old = self.store[a][plan[0]]
            self.store[a][plan[0]] = self._words.join(self._words.new_half(x, old, plan[1], 0, whole),
                                                      self._words.new_half(x, old, plan[2], 1, whole))

    @ti.func
    def _leaf_at(self, a, path: ti.template()):
        """Member `path` (a tuple of names) of the element in store slot a, loading only its own words."""
        if ti.static(self._packed):
            return self._words.member(self.store[a], path[0])
        else:
            return ti.static(leaf_field(self.store, path))[a]

    @ti.func
    def _set_leaf_at(self, a, path: ti.template(), x):
        """Overwrite member `path` of the element in store slot a (words: see _write_words)."""
        if ti.static(self._packed):
            self._write_words(a, path, x, False)
        else:
            ti.static(leaf_field(self.store, path))[a] = x

    @ti.func
    def _zero(self):
        if ti.static(is_primitive(self.dtype)):
            return ti.cast(0, self.dtype)
        else:
            return self.dtype(0)

    @ti.func
    def _chunks_for(self, n):
        return (ti.max(0, n - self.inline_capacity) + self.chunk_size - 1) >> self._chunk_shift

    @ti.func
    def _chunks_of(self, i):
        """Chunks in list i's run."""
        c = 0
        if ti.static(self.runs == "ordered"):
            c = self.table_start[i + 1] - self.table_start[i]
        else:
            c = self.table_chunks[i]
        return c

    @ti.func
    def _owner_of_chunk(self, t):
        """The list whose run holds chunk t (t below the bump), or -1 (bump: a hole). runs="ordered": the last list
        whose run starts at or before t (lists with empty runs share their start with the next list, so the last
        one is the owner), searched between the owners of the HINT_EVERY-chunk blocks around t."""
        o = -1
        if ti.static(self.runs == "ordered"):
            b = t >> ti.static(self._hint_shift)
            lo = self.table_owner[b]
            hi = self.table_owner[b + 1]
            while lo < hi:
                mid = (lo + hi + 1) >> 1
                if self.table_start[mid] <= t:
                    lo = mid
                else:
                    hi = mid - 1
            o = lo
        else:
            o = self.table_owner[t]
        return o

    @ti.func
    def _advance_run(self, o, rs, hi_t, t):
        """runs="ordered": (owner, run start, next run start) of chunk t, given those of the owner o of an earlier
        chunk (o < 0: none), as a walk over increasing slots passes them on. Steps forward while the next run
        starts at or before t, at most 4 lists (neighbouring slots cross a few); a walk that jumped further, went
        back, or has no owner yet searches from the hint. (Stepping stays below num_arrays: table_start[num_arrays],
        the pool's end, is above every slot's chunk.)"""
        if o >= 0:
            steps = 0
            while steps < 4 and hi_t <= t:
                o += 1
                rs = hi_t
                hi_t = self.table_start[o + 1]
                steps += 1
        if o < 0 or hi_t <= t or rs > t:
            o = self._owner_of_chunk(t)
            rs = self.table_start[o]
            hi_t = self.table_start[o + 1]
        return o, rs, hi_t

    @ti.func
    def _addr_at(self, i, k, t_start):
        """store index of element k of list i whose chunk run starts at chunk t_start. A select, not a branch: both
        formulas are cheap, and straight-line code lets loops hoist their invariant loads."""
        pool = self._n_inline + (t_start << self._chunk_shift) + k - self.inline_capacity
        a = pool
        if ti.static(self.inline_capacity > 0):
            a = ti.select(k < self.inline_capacity, i * self.inline_capacity + k, pool)
        return a

    @ti.func
    def _addr(self, i, k):
        return self._addr_at(i, k, self.table_start[i])
