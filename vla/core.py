"""Tiered-storage variable-length arrays (VLAs) for Taichi.

A :class:`VLA` holds ``num_arrays`` lists that kernels grow with :meth:`VLA.append`. Storage tiers:

* **inline** (tier 1): the first ``inline_capacity`` elements of every list, packed list after list
  (``[i, k]``): neighbouring threads (lists ``i``, ``i+1``) read neighbouring addresses, and a thread's
  first load brings its whole inline part into cache, so reading the rest costs cache hits instead of
  more trips to memory (the ``[k, i]`` order also coalesces, but needs one memory trip per k: measured
  10% slower for thread-per-list reads on an H200). No indirection.
* **pool** (tier 2): fixed-size chunks of ``chunk_size`` elements. A list's chunks are contiguous, and
  its chunk table is the pair ``table_start[i], table_chunks[i]``, so element ``k`` is at
  ``pool[table_start[i] * cs + k - ic]``: O(1), no chain walk.
* **block shared memory** (tier 3, CUDA): see :mod:`vla.shared`.

Tiers 1 and 2 are one field, ``store`` (inline slots first, then the pool), and an element's address is
a *select* between the two formulas rather than a branch between two fields. That keeps get() and
append() branch-free, so a loop over a list compiles to straight-line code whose invariant loads (field
base pointers, the list's table entry) are hoisted out of the loop: measured on an H200 this made the
append path 1.3x faster than two fields behind a branch (0.25 vs 0.34 ms).

Why no element is ever lost, without compare-and-swap (Taichi 1.7.4 has only atomic add/min/max/...):
an append takes its slot with one ``atomic_add`` on the list's length. If the slot lies inside the
list's inline part or its already-owned chunks, the element goes home directly. Otherwise it goes to
an overflow area through an atomic bump, tagged with (list, slot). :meth:`VLA.commit` then gives each
list that ran out a new, larger run of chunks at the end of the pool (its old chunks become a hole,
reclaimed by the next compaction), so a commit costs in proportion to the lists that grew, not to the
pool, and moves the overflowed elements home. A list that grows gets 25% (whole chunks) more than it
needs, so a list creeping upwards frame after frame grows O(log) times. Only when the
pool is full does it compact, and grow if the demand leaves less than ~10% of it free (to 1.1-1.2x the
demand).
If even the overflow area was too small, ``commit`` grows everything to the demand it saw and raises
:class:`VLAOverflowError`; :func:`vla.launch` catches that, rolls the lengths back and runs the kernel
again, so a caller that uses ``launch`` never loses an element.

With ``runs="ordered"`` the runs lie in list order instead (a list's run ends where the next one's starts),
which drops the per-list run length and the per-chunk owner table (8 bytes a list and 4 per hint_every chunks of
metadata instead of 12 and 4 a chunk) at the price of growth: any list that grows re-lays out the whole pool,
on the host's side of commit.

Capacity is memoised: ``clear`` sets a length to 0 and keeps the chunks, so refilling allocates
nothing. :meth:`VLA.trim` compacts the pool and releases what the current lengths do not need.

Growing the pool replaces a Taichi SNode tree. Compiled kernels address a tree through the runtime's
root table by tree id, and Taichi hands a destroyed tree's id to the next tree; so when the new tree
gets the old id, every kernel already compiled against this VLA stays valid and nothing recompiles.
When it does not (or in debug mode, where bounds checks bake field shapes into code), all compiled
kernels are dropped and recompile on next use: slower, never wrong.
"""

import math
import weakref

import numpy as np
import taichi as ti
from taichi.lang.util import to_numpy_type
from taichi._lib import core as _ti_core
from taichi.lang import impl
from taichi.lang.field import ScalarField
from taichi.lang.matrix import MatrixType
from taichi.lang.struct import StructType

from .errors import VLACapacityError, VLAOverflowError
from . import warp
from .scan import Scanner
from .words import Words

_I32_MAX = 2**31 - 1
# A pool that must be compacted to make room grows if less than ~10% of it would stay free, to 1.1x the
# demand rounded up along 2^(k/8) (1.1-1.2x). H200, landed 1M-body pile: 1.2x rounded along 2^(k/4) left the
# pool 1.2x larger (contact memory 0.64x padded instead of ~0.56x) for no measurable speed (25.4 vs 25.5 ms).
_POOL_HEADROOM = 1.1
_POOL_STEPS_PER_OCTAVE = 8
# runs="ordered": table_owner holds the owner of every hint_every-th chunk only (a search hint for
# flat_index), by default 4 bytes per 64 chunks instead of 4 per chunk.
_HINT_EVERY = 64
_nd = ti.types.ndarray()
_i32_nd = ti.types.ndarray(dtype=ti.i32, ndim=1)

# Taichi 1.7.4's LLVM backends (CPU, CUDA) keep the roots of SNode trees (each VLA holds a few: the lists' table, the
# store per scalar component, the overflow area, ...) in a fixed table of 512 (kMaxNumSnodeTreesLlvm) and do not check
# a new tree's id: the 513th live tree is written past the table, into the runtime's own state, and a later kernel
# launch segfaults (measured: a loop of FieldsBuilder trees dies at id 512, silently). A growth reuses the id it
# frees, so the count only rises with trees made and never destroyed: VLAs and Batches created again and again
# without release(). The VLA stops short of the limit with an error that says so, leaving a few ids to the
# application's own fields.
SNODE_TREE_LIMIT = 512
SNODE_TREE_MARGIN = 12


def _finalize(fb, what: str):
    """fb.finalize(), refusing the tree (VLACapacityError) when its id comes near Taichi's limit (SNODE_TREE_LIMIT)."""
    tree = fb.finalize()
    if tree.id >= SNODE_TREE_LIMIT - SNODE_TREE_MARGIN:
        tree.ptr.destroy_snode_tree(impl.get_runtime().prog)   # (no kernel uses it yet: nothing to recompile)
        tree.destroyed = True
        raise VLACapacityError(
            f"{what}: this Taichi program already holds {SNODE_TREE_LIMIT - SNODE_TREE_MARGIN} SNode trees, and "
            f"Taichi 1.7's CPU/CUDA backends corrupt memory beyond {SNODE_TREE_LIMIT}. Every VLA holds a few and "
            f"every Batch() without failed_at one, until release(): reuse them, or release() those no longer used")
    return tree


# Every live VLA, so that launch() can find the ones a kernel touched when its arguments do not say.
_LIVE: "weakref.WeakSet[VLA]" = weakref.WeakSet()

# Scratch ndarrays of VLAs that outlived their Taichi program (ti.reset / a new ti.init). Taichi's
# Ndarray.__del__ frees its memory through the *current* program, so letting them die under a newer
# program would free that program's memory instead (seen as wrong results and segfaults). They are
# kept here, inert, until the interpreter exits.
_GRAVEYARD: list = []


# ----------------------------------------------------------------------------------------------------
# dtype helpers
# ----------------------------------------------------------------------------------------------------
def _check_hint_every(hint_every):
    if isinstance(hint_every, bool) or not isinstance(hint_every, (int, np.integer)) or hint_every < 1 \
            or hint_every & (hint_every - 1):
        raise ValueError(f"VLA hint_every must be a power of two (1, 2, 4, ...), got {hint_every!r}")


def _is_primitive(dtype) -> bool:
    return isinstance(dtype, _ti_core.DataType)


def _check_dtype(dtype):
    if _is_primitive(dtype) or isinstance(dtype, (MatrixType, StructType)):
        return
    raise TypeError(
        f"VLA dtype must be a Taichi scalar type (ti.i32, ti.f32, ...), ti.types.vector/matrix or "
        f"ti.types.struct; got {dtype!r}"
    )


def _leaves(dtype, path=()):
    """Scalar/matrix leaves of a dtype as (path, leaf dtype); path () for non-struct dtypes."""
    if isinstance(dtype, StructType):
        out = []
        for name, member in dtype.members.items():
            out += _leaves(member, path + (name,))
        return out
    return [(path, dtype)]


def _leaf_bytes(dtype) -> int:
    if isinstance(dtype, MatrixType):
        return dtype.n * (dtype.m if dtype.ndim == 2 else 1) * _ti_core.data_type_size(dtype.dtype)
    return _ti_core.data_type_size(dtype)


def element_bytes(dtype) -> int:
    """Bytes of one element of ``dtype`` (sum over struct members, no padding)."""
    return sum(_leaf_bytes(dt) for _, dt in _leaves(dtype))


def _new_unplaced(dtype):
    return ti.field(dtype) if _is_primitive(dtype) else dtype.field()


def _leaf_field(field, path):
    """The member field of a (struct) field at ``path``; evaluated at kernel compile time."""
    for name in path:
        field = field.field_dict[name]
    return field


def _bucket(n, steps_per_octave=4) -> int:
    """Smallest size of the series 2^(k/steps_per_octave) that is >= n (steps of 19% for 4, 9% for 8): few
    distinct sizes, so that Taichi's offline kernel cache (whose key includes field shapes) hits
    across runs whose demands differ a little (other seeds, other scenes)."""
    k = math.ceil(steps_per_octave * math.log2(max(1.0, n)))
    return int(math.ceil(2 ** (k / steps_per_octave)))


# ----------------------------------------------------------------------------------------------------
# Internal kernels (free functions; ``v`` is the VLA, compiled once per VLA instance)
# ----------------------------------------------------------------------------------------------------
@ti.kernel
def _k_lengths_to_nd(v: ti.template(), out: _i32_nd):
    for i in range(v.num_arrays):
        out[i] = v.length_field[i]


@ti.kernel
def _k_snapshot(v: ti.template(), out: _i32_nd):
    """launch(): every length, and at [num_arrays] the overflowed appends not yet committed."""
    for i in range(v.num_arrays):
        out[i] = v.length_field[i]
    out[v.num_arrays] = v._scalars[0]


@ti.kernel
def _k_nd_to_lengths(v: ti.template(), src: _i32_nd):
    for i in range(v.num_arrays):
        v.length_field[i] = src[i]


@ti.kernel
def _k_clear_all(v: ti.template()):
    for i in range(v.num_arrays):
        v.length_field[i] = 0


@ti.kernel
def _k_grow_targets(v: ti.template(), demand: _i32_nd, headroom: ti.i32, moved: _i32_nd) -> ti.i32:
    """moved[i]: the chunks list i must grow to (0: it has room); returns how many lists must grow."""
    grow = 0
    for i in range(v.num_arrays):
        m = v._grow_target(i, demand[i], headroom)
        moved[i] = m
        if m > 0:
            grow += 1
    return grow


@ti.func
def _move_list(v: ti.template(), i, new, m):
    """Give list i the run of m chunks starting at chunk `new`, copy its elements there, and leave its old
    chunks as a hole (owner -1)."""
    old = v.table_start[i]
    have = v.table_chunks[i]
    src = v._n_inline + (old << v._chunk_shift)
    dst = v._n_inline + (new << v._chunk_shift)
    for e in range(have << v._chunk_shift):
        v.store[dst + e] = v.store[src + e]
    for c in range(have):
        v.table_owner[old + c] = -1
    for c in range(m):
        v.table_owner[new + c] = i
    v.table_start[i] = new
    v.table_chunks[i] = m
    ti.atomic_add(v._scalars[3], have)


@ti.func
def _claim_run(v: ti.template(), i, m, pool_chunks):
    """List i takes a new run of m > 0 chunks at the pool's bump (an atomic add: no prefix sum, no host
    round trip) and moves there, counting itself in _scalars[5]. If the pool is full it counts itself in
    _scalars[4] instead; its claim has then pushed the bump past the pool, which the host repairs
    (VLA._after_claims) before anything reads it. Run between _claims_begin and _claims_end."""
    new = ti.atomic_add(v._scalars[2], m)
    if new + m <= pool_chunks:
        _move_list(v, i, new, m)
        ti.atomic_add(v._scalars[5], 1)
    else:
        ti.atomic_add(v._scalars[4], 1)


@ti.func
def _claims_begin(v: ti.template()):
    v._scalars[5] = 0


@ti.func
def _claims_end(v: ti.template()):
    """The claims' outcome in one scalar, so that the host learns it with one read (VLA._after_claims):
    -1 if some list found the pool full, else the number of lists that moved."""
    v._scalars[7] = ti.select(v._scalars[4] > 0, -1, v._scalars[5])


@ti.kernel
def _k_commit(v: ti.template(), pool_chunks: ti.i32):
    """commit() after appends overflowed, in one launch (the path of a simulation step, where some list
    among millions outgrows its chunks almost every step): every list whose length outgrew its chunks
    claims a new run with headroom (_claim_run), then the parked elements move home and the overflow area
    empties (_move_overflow_home), and the outcome goes to _scalars[7] (_claims_end)."""
    _claims_begin(v)
    for i in range(v.num_arrays):
        m = v._grow_target(i, v.length_field[i], 1)
        if m > 0:
            _claim_run(v, i, m, pool_chunks)
    _move_overflow_home(v)
    _claims_end(v)


@ti.kernel
def _k_commit_device(v: ti.template(), pool_chunks: ti.i32, status: _i32_nd, slot: ti.i32, failed_at: ti.template(),
                     tag: ti.i32):
    """commit() decided on the device, for Batch: no host read. Lists that outgrew their chunks claim new runs
    at the pool's bump and the parked elements move home, as in _k_commit. What only the host can fix is left
    to it, with every list left readable: if some list found the pool full, or more appends overflowed than
    the overflow area holds (then nothing is claimed), every list keeps only the elements in its own storage
    (length clamped to capacity(i): each element it then shows is one that was appended) and the overflow area
    empties. status[slot] = 0 when every append is home, else the number of appends that overflowed, and then
    failed_at[None] (a 0-d i32 field) = min(itself, tag). The bump is repaired as VLA._after_claims does.
    With runs="ordered" a list can grow only through a re-layout of the whole pool, on the host: any overflow
    is then a failure, handled as a full pool."""
    v._scalars[6] = v._scalars[0]
    _claims_begin(v)
    if ti.static(v.runs == "ordered"):
        if v._scalars[6] > 0:
            v._scalars[4] = 1
    else:
        for i in range(v.num_arrays):
            if v._scalars[6] > 0 and v._scalars[6] <= v._scalars[1]:
                m = v._grow_target(i, v.length_field[i], 1)
                if m > 0:
                    _claim_run(v, i, m, pool_chunks)
    for o in range(ti.min(v._scalars[6], v._scalars[1])):
        if v._scalars[6] <= v._scalars[1]:
            meta = v.ovf_meta[o]
            i = meta[0]
            # home only if the list has room for it now (a list that found the pool full has not), and drop a
            # slot past the length (the list was emptied since), as _move_overflow_home does
            if meta[1] < ti.min(v.length_field[i], v.capacity(i)):
                v.store[v._addr(i, meta[1])] = v.ovf_value[o]
    for i in range(v.num_arrays):
        if v._scalars[4] > 0 or v._scalars[6] > v._scalars[1]:
            v.length_field[i] = ti.min(v.length_field[i], v.capacity(i))
    failed = v._scalars[4] > 0 or v._scalars[6] > v._scalars[1]
    status[slot] = ti.select(failed, v._scalars[6], 0)
    if failed:
        ti.atomic_min(failed_at[None], tag)
    if v._scalars[6] > 0:
        v._scalars[8] += 1
    if v._scalars[5] > 0:
        v._scalars[9] += 1
    if v._scalars[4] > 0:
        if ti.static(v.runs != "ordered"):  # (ordered: nothing was claimed, the bump is the runs' end)
            v._scalars[2] = pool_chunks
        v._scalars[4] = 0
    v._scalars[0] = 0
    v._scalars[7] = 0


@ti.kernel
def _k_claim_runs(v: ti.template(), moved: _i32_nd, pool_chunks: ti.i32):
    """reserve()/from_csr() and commit's slow path: every list with moved[i] > 0 claims that many chunks."""
    _claims_begin(v)
    for i in range(v.num_arrays):
        if moved[i] > 0:
            _claim_run(v, i, moved[i], pool_chunks)
    _claims_end(v)


@ti.kernel
def _k_target_trim(v: ti.template(), target: _i32_nd):
    for i in range(v.num_arrays):
        target[i] = ti.min(v._chunks_of(i), v._chunks_for(v.length_field[i]))


@ti.kernel
def _k_target_keep(v: ti.template(), moved: _i32_nd, target: _i32_nd):
    for i in range(v.num_arrays):
        target[i] = ti.max(moved[i], v._chunks_of(i))


@ti.kernel
def _k_relayout_to_tmp(v: ti.template(), n_old: ti.i32, target: _i32_nd, new_start: _i32_nd, tmp_base: ti.i32):
    """Copy every list's first target[i] chunks to their place in the compacted layout (list order),
    whole elements at a time: one kernel whatever the dtype, so a growth compiles nothing new."""
    for t, j in ti.ndrange(n_old, v.chunk_size):
        o = v._owner_of_chunk(t)
        if o >= 0:
            r = t - v.table_start[o]
            if r < target[o]:
                v.relayout_tmp[tmp_base + ((new_start[o] + r) << v._chunk_shift) + j] = \
                    v.store[v._n_inline + (t << v._chunk_shift) + j]


@ti.kernel
def _k_inline_to_tmp(v: ti.template()):
    for e in range(v._n_inline):
        v.relayout_tmp[e] = v.store[e]


@ti.kernel
def _k_tmp_to_store(v: ti.template(), tmp_begin: ti.i32, store_begin: ti.i32, n: ti.i32):
    for e in range(n):
        v.store[store_begin + e] = v.relayout_tmp[tmp_begin + e]


@ti.kernel
def _k_relayout_table(v: ti.template(), new_start: _i32_nd, target: _i32_nd, total: ti.i32, cap: ti.i32):
    if ti.static(v.runs == "ordered"):
        # runs in list order: the run starts are the whole table (list i's chunk count is the gap to the
        # next start; new_start[n] = total closes the last), and table_owner the owner of every hint_every-th chunk.
        for i in range(v.num_arrays + 1):
            v.table_start[i] = new_start[i]
        sh = ti.static(v._hint_shift)
        for b in range((cap >> sh) + 2):
            v.table_owner[b] = v.num_arrays - 1
        for i in range(v.num_arrays):
            s = new_start[i]
            b = (s + (1 << sh) - 1) >> sh
            while (b << sh) < s + target[i]:
                v.table_owner[b] = i
                b += 1
    else:
        for i in range(v.num_arrays):
            s = new_start[i]
            for c in range(target[i]):
                v.table_owner[s + c] = i
            v.table_start[i] = s
            v.table_chunks[i] = target[i]
        for c in range(total, cap):
            v.table_owner[c] = -1
    v._scalars[3] = 0


@ti.kernel
def _k_permute(v: ti.template(), order: ti.template(), first: ti.i32, count: ti.i32, meta: _i32_nd):
    """Lists first + k take lists first + order[k] (k < count): length, chunk run and inline elements. The
    old values are staged first (meta: 3 * count entries, relayout_tmp: count * inline_capacity elements);
    the launch's loops run one after the other."""
    ic = ti.static(v.inline_capacity)
    for k in range(count):
        s = first + order[k]
        n = v.length_field[s]
        meta[3 * k] = n
        meta[3 * k + 1] = v.table_start[s]
        meta[3 * k + 2] = v.table_chunks[s]
        if ti.static(ic > 0):
            for e in range(ti.min(n, ic)):
                v.relayout_tmp[k * ic + e] = v.store[s * ic + e]
    for k in range(count):
        d = first + k
        n = meta[3 * k]
        start = meta[3 * k + 1]
        chunks = meta[3 * k + 2]
        v.length_field[d] = n
        v.table_start[d] = start
        v.table_chunks[d] = chunks
        if ti.static(ic > 0):
            for e in range(ti.min(n, ic)):
                v.store[d * ic + e] = v.relayout_tmp[k * ic + e]
        for c in range(chunks):
            v.table_owner[start + c] = d


@ti.func
def _move_overflow_home(v: ti.template()):
    """Store the parked elements at home, then empty the overflow area. Does nothing while _scalars[4] says
    that some list found no room (commit() grows the pool and moves them with _k_move_overflow_home). Call
    at a kernel's top level (its loop runs in parallel there)."""
    for o in range(ti.min(v._scalars[0], v._scalars[1])):
        meta = v.ovf_meta[o]
        # A slot at or past the list's length is dead (the list was emptied since): drop it, as its home
        # may lie outside the list's chunks.
        if v._scalars[4] == 0 and meta[1] < v.length_field[meta[0]]:
            v.store[v._addr(meta[0], meta[1])] = v.ovf_value[o]
    if v._scalars[4] == 0:
        v._scalars[0] = 0


@ti.kernel
def _k_move_overflow_home(v: ti.template()):
    _move_overflow_home(v)


@ti.kernel
def _k_gather_leaf(v: ti.template(), path: ti.template(), offsets: _i32_nd, out: _nd):
    """Pack every live element's leaf into out, list by list (to_csr). Flat and coalesced."""
    for e in range(v.flat_size()):
        i, k = v.flat_index(e)
        if i >= 0:
            out[offsets[i] + k] = v._leaf_at(e, path)


@ti.kernel
def _k_scatter_leaf(v: ti.template(), path: ti.template(), offsets: _i32_nd, owner: _i32_nd, src: _nd, total: ti.i32):
    """Write packed CSR values home (from_csr); capacity was reserved beforehand."""
    for e in range(total):
        i = owner[e]
        v._set_leaf_at(v._addr(i, e - offsets[i]), path, src[e])


@ti.kernel
def _k_sum_lengths(v: ti.template()) -> ti.i64:
    s = ti.i64(0)
    for i in range(v.num_arrays):
        s += v.length_field[i]
    return s


# ----------------------------------------------------------------------------------------------------
# The container
# ----------------------------------------------------------------------------------------------------
@ti.data_oriented
class VLA:
    """``num_arrays`` variable-length lists of ``dtype`` elements on the device.

    Args:
        num_arrays: number of lists (> 0).
        dtype: a Taichi scalar type, ``ti.types.vector``/``matrix``, or ``ti.types.struct``.
        inline_capacity: elements per list stored inline (tier 1, compile-time constant, >= 0).
        chunk_size: elements per pool chunk (tier 2, compile-time constant, a power of two).
        reserve: ``None``; an int, pool elements to pre-allocate (assigned to lists as they need
            them); or an array of ``num_arrays`` expected lengths, pre-assigned to each list.
        overflow_capacity: elements the overflow area holds before commit must grow it
            (default ``max(1024, num_arrays // 64)``); it grows on demand.
        layout: struct/vector elements only. ``"soa"`` (default): each scalar component in an array of its
            own, for kernels that read a few members of many elements (a warp's loads of one member
            coalesce). ``"aos"``: whole elements stored contiguously, for kernels in which a thread reads
            or appends whole records of its own list: a 60-byte record is then 2 memory sectors instead of
            16 (measured on the H200 with the simulator's contact records: see docs/benchmarks.md).
            ``"words"``: whole elements stored contiguously as 64-bit words (a flat struct of 32-bit members,
            padded to an even number of them), read and written with 64-bit loads and stores: Taichi moves a
            struct one scalar at a time, so this halves the load instructions of a record. set_member of a
            member that shares a word with another member reads and rewrites that word, so two threads must
            not set members of one element at once (with "soa"/"aos" they may, if the members differ).
        runs: how the lists' chunk runs are kept. ``"bump"`` (default): a list that outgrows its run takes a
            new one at the pool's end on the device, in the commit (cost: its own elements; its old run is
            a hole until the next compaction); metadata 12 bytes a list (length, run start, run length) and
            4 a chunk (its owner, for flat_index). ``"ordered"``: the runs lie in list order, so a list's run
            ends where the next list's starts: metadata 8 bytes a list (length, run start) and 4 per
            ``hint_every`` chunks (a search hint for flat_index, which then finds a chunk's list by a binary
            search over the run starts, a few steps inside the hint's range). The price is growth: any list that outgrows
            its run re-lays the whole pool out, on the host's side of commit (Batch's device commit
            reports it as a failure), and permute() is not available. For lists whose lengths settle after
            a first fill (memoised capacity), where memory counts most.
        hint_every: runs="ordered" only, a power of two: chunks per entry of flat_index's search hint
            (default 64). Fewer chunks per entry shorten the search each flat slot makes (about
            log2 of the lists a hint block spans, dependent loads) for 4 bytes per entry.
        name: used in error messages.

    Kernel-side methods (``@ti.func``): :meth:`append`, :meth:`length`, :meth:`get`, :meth:`set`,
    :meth:`get_member`, :meth:`set_member`, :meth:`set_members` (struct elements), :meth:`clear`,
    :meth:`reduce`, :meth:`reduce_warp`, :meth:`for_each`, :meth:`capacity`, :meth:`flat_size`,
    :meth:`flat_index`, :meth:`flat_index_after`, :meth:`flat_value`, :meth:`flat_inline_begin`, :meth:`flat_pool_begin`,
    :meth:`flat_pool_size`, :meth:`pending_size`, :meth:`pending_index`, :meth:`pending_value`, :meth:`get_inline`.
    """

    def __init__(self, num_arrays, dtype, inline_capacity=4, chunk_size=16, reserve=None,
                 overflow_capacity=None, layout="soa", runs="bump", hint_every=_HINT_EVERY, name="vla"):
        for arg, val, low in (("num_arrays", num_arrays, 1), ("inline_capacity", inline_capacity, 0),
                              ("chunk_size", chunk_size, 1)):
            if isinstance(val, bool) or not isinstance(val, (int, np.integer)):
                raise TypeError(f"VLA {arg} must be an int, got {type(val).__name__} {val!r}")
            if val < low:
                raise ValueError(f"VLA {arg} must be >= {low}, got {val}")
        if chunk_size & (chunk_size - 1):
            raise ValueError(f"VLA chunk_size must be a power of two (1, 2, 4, ...), got {chunk_size}")
        _check_dtype(dtype)
        if layout not in ("soa", "aos", "words"):
            raise ValueError(f"VLA layout must be 'soa', 'aos' or 'words', got {layout!r}")
        if runs not in ("bump", "ordered"):
            raise ValueError(f"VLA runs must be 'bump' or 'ordered', got {runs!r}")
        _check_hint_every(hint_every)
        if overflow_capacity is not None and (not isinstance(overflow_capacity, (int, np.integer))
                                              or overflow_capacity < 1):
            raise ValueError(f"VLA overflow_capacity must be a positive int, got {overflow_capacity!r}")
        if num_arrays * max(inline_capacity, 1) > _I32_MAX:
            raise VLACapacityError(
                f"VLA {name!r}: num_arrays * inline_capacity = {num_arrays * inline_capacity} exceeds the "
                f"32-bit index space; lower inline_capacity or split the VLA")

        self.name = name
        # Pool elements whose loads reduce() keeps in flight at once (compile time; set before first use).
        # H200, heavy-tailed 2M lists (bench vla --reduce-unrolls): 16 -> 1.21x padded, 32 -> 1.47x, 64 -> 1.14x.
        self.reduce_unroll = 32
        self.num_arrays = int(num_arrays)
        self.dtype = dtype
        self.layout = layout
        self.runs = runs
        self.hint_every = int(hint_every)
        self._hint_shift = self.hint_every.bit_length() - 1
        self.inline_capacity = int(inline_capacity)
        self.chunk_size = int(chunk_size)
        self._chunk_shift = int(chunk_size).bit_length() - 1
        self._leaves = _leaves(dtype)
        self.element_bytes = element_bytes(dtype)
        # What one element takes in storage: element_bytes, or whole 64-bit words for layout "words".
        self._words = Words(dtype) if layout == "words" else None
        self._store_dtype = self._words.store_dtype if self._words else dtype
        self.storage_bytes = element_bytes(self._store_dtype)
        self._debug = bool(impl.current_cfg().debug)

        n = self.num_arrays
        self._n_inline = self.inline_capacity * n
        # Fixed part: never reallocated. table_start[i], table_chunks[i]: list i's run of pool chunks
        # (runs="ordered": no table_chunks; table_start has a closing entry [n], the end of the last run).
        ordered = runs == "ordered"
        fb = ti.FieldsBuilder()
        self.length_field = ti.field(ti.i32)
        self.table_start = ti.field(ti.i32)
        self.table_chunks = None if ordered else ti.field(ti.i32)
        # [0] overflow count, [1] overflow capacity, [2] chunks handed out (bump), [3] chunks in holes,
        # [4] lists that found the pool full (until the host repairs the bump), [5] lists moved by the last
        # claiming kernel, [6] the overflow count the last device commit saw, [7] the claims' outcome
        # (_claims_end), [8] / [9] device commits (Batch) that found parked appends / moved lists (counted
        # into stats()'s overflow_events / grow_events)
        self._scalars = ti.field(ti.i32)
        fb.dense(ti.i, n).place(self.length_field)
        fb.dense(ti.i, n + 1 if ordered else n).place(self.table_start)
        if not ordered:
            fb.dense(ti.i, n).place(self.table_chunks)
        fb.dense(ti.i, 16).place(self._scalars)
        self._fixed_tree = _finalize(fb, f"VLA {name!r}")

        # Growable part: one field per SNode tree so a tree can be replaced without moving the others.
        self._trees = {}
        self._caps = {}
        self.store = self.table_owner = self.ovf_value = self.ovf_meta = self.relayout_tmp = None
        self.grow_events = 0
        self.compact_events = 0
        self.overflow_events = 0
        self.recompile_events = 0

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

        pool_chunks = max(1, -(-reserve_elems // self.chunk_size))
        self._alloc("store", self._store_dtype, self._n_inline + pool_chunks * self.chunk_size)
        self._caps["pool_chunks"] = pool_chunks
        self._alloc("table_owner", ti.i32, self._owner_len(pool_chunks))
        self.table_owner.fill(-1)
        ovf = int(overflow_capacity) if overflow_capacity is not None else max(1024, n // 64)
        self._default_ovf = ovf
        self._alloc("ovf_value", self._store_dtype, ovf)
        self._alloc("ovf_meta", ti.types.vector(2, ti.i32), ovf)
        self._alloc("relayout_tmp", self._store_dtype, 1)  # staging for re-layouts; its own tree, so its id is stable
        self._scalars[1] = ovf
        self._scanner = Scanner(n + 1)
        self._scratch = {}
        self._prog = impl.get_runtime().prog
        _LIVE.add(self)
        if reserve_lengths is not None:
            self._reserve_for(reserve_lengths.astype(np.int32))

    # ------------------------------------------------------------------ kernel-side API
    @ti.func
    def append(self, i, x):
        """Append x to list i (thread-safe). Returns x's index in list i."""
        if ti.static(self._debug):  # a bare assert costs ~6x on get-heavy loops even with debug off
            assert i >= 0 and i < self.num_arrays, "VLA.append: list index out of range"
        # The chunk-table entry is loaded before the atomic so its latency overlaps the atomic's: on a GPU
        # a thread appending many elements is bound by this dependency chain, not by bandwidth.
        t_start = self.table_start[i]
        t_chunks = self._chunks_of(i)
        slot = ti.atomic_add(self.length_field[i], 1)
        if slot < self.inline_capacity + (t_chunks << self._chunk_shift):
            self._put(self._addr_at(i, slot, t_start), x)
        else:
            # Beyond this list's chunks: park it in the overflow area; commit() moves it home.
            o = ti.atomic_add(self._scalars[0], 1)
            if o < self._scalars[1]:
                self.ovf_value[o] = self._pack(x)
                self.ovf_meta[o] = ti.Vector([i, slot])
        return slot

    @ti.func
    def length(self, i):
        """Number of elements in list i."""
        return self.length_field[i]

    @ti.func
    def get(self, i, k):
        """Element k of list i (0 <= k < length(i)); O(1), no chain walk, no branch."""
        if ti.static(self._debug):
            assert i >= 0 and i < self.num_arrays and k >= 0 and k < self.length_field[i], "VLA.get: index out of range"
        return self._load(self._addr(i, k))

    @ti.func
    def get_inline(self, i, k):
        """Fast path for callers that know k < inline_capacity statically: no table load."""
        ti.static_assert(self.inline_capacity > 0, "VLA.get_inline needs inline_capacity > 0")
        return self._load(i * self.inline_capacity + k)

    @ti.func
    def reduce(self, i, f: ti.template(), init):
        """Fold ``acc = f(acc, x)`` over list i in order, and return acc.

        The inline part is unrolled (static), then the pool part ``reduce_unroll`` elements at a time
        (then 16 at a time, then one by one) so that their loads are all in flight at once: a thread
        reading a long list waits for one memory round trip per group instead of one per element. In a
        thread-per-list read of a heavy-tailed length distribution the kernel lasts as long as its
        longest lists, so this is what decides its time.
        """
        n = self.length_field[i]
        acc = init
        for k in ti.static(range(self.inline_capacity)):
            if k < n:
                acc = f(acc, self._load(i * self.inline_capacity + k))
        rem = n - self.inline_capacity
        if rem > 0:
            base = self._n_inline + (self.table_start[i] << self._chunk_shift)
            U = ti.static(self.reduce_unroll)
            for g in range(rem // U):
                for j in ti.static(range(U)):
                    acc = f(acc, self._load(base + g * U + j))
            done = rem - rem % U
            if ti.static(U > 16):
                for g in range((rem - done) >> 4):
                    for j in ti.static(range(16)):
                        acc = f(acc, self._load(base + done + g * 16 + j))
                done += ((rem - done) >> 4) << 4
            for j in range(done, rem):
                acc = f(acc, self._load(base + j))
        return acc

    @ti.func
    def reduce_warp(self, i, f: ti.template(), init, combine: ti.template()):
        """Fold list i like reduce(), with the warp's help for a long list (vla.warp.fold_segments): on CUDA,
        the lanes of a warp read together the pool part of every list in the warp that has more than
        vla.warp.SHORT elements there, coalesced, so a warp no longer lasts as long as its longest list.

        ``acc = f(acc, x)`` folds an element in, ``combine(a, b)`` joins two partial folds; the pair must be
        associative and commutative, ``init`` its identity (0 for a sum), and the accumulator an i32 or f32
        scalar. It is fastest called by every thread of the loop; under a branch that some threads of a warp skip
        it stays correct, each thread then reading its own list alone. Off CUDA it is reduce() without the
        unrolling."""
        n = self.length_field[i]
        acc = init
        # every list has its inline slots and a table entry: load them with the length, not after it (one
        # round trip fewer for a warp of short lists; H200: 0.046 -> 0.041 ms on the bench's heavy tail)
        start = self.table_start[i]
        for k in ti.static(range(self.inline_capacity)):
            x = self._load(i * self.inline_capacity + k)
            if k < n:
                acc = f(acc, x)
        rem = ti.max(n - self.inline_capacity, 0)
        base = ti.select(rem > 0, self._n_inline + (start << self._chunk_shift), 0)
        acc = combine(acc, warp.fold_segments(self, base, rem, f, init, combine))
        return acc

    @ti.func
    def _segment_load(self, base, k):
        """Element k of the pool segment that starts at store slot base (vla.warp's view of a list)."""
        return self._load(base + k)

    @ti.func
    def for_each(self, i, f: ti.template(), ctx: ti.template()):
        """Call ``f(ctx, i, k, x)`` for every element x = list i's k-th, tier by tier like reduce()."""
        n = self.length_field[i]
        for k in ti.static(range(self.inline_capacity)):
            if k < n:
                f(ctx, i, k, self._load(i * self.inline_capacity + k))
        rem = n - self.inline_capacity
        if rem > 0:
            base = self._n_inline + (self.table_start[i] << self._chunk_shift)
            for j in range(rem):
                f(ctx, i, self.inline_capacity + j, self._load(base + j))

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
        """Overwrite member ``name`` of struct element k of list i, leaving the other members untouched: a
        kernel that updates a few members of each record (a solver's accumulated impulses) writes those
        bytes only ("soa"/"aos"). With layout "words" it writes whole 64-bit words: a word the member shares
        with another is read and written back with that member's half unchanged, so no other thread may set
        members of the same element meanwhile."""
        if ti.static(self._debug):
            assert i >= 0 and i < self.num_arrays and k >= 0 and k < self.length_field[i], \
                "VLA.set_member: index out of range"
        self._set_leaf_at(self._addr(i, k), (name,), x)

    @ti.func
    def set_members(self, i, k, x, names: ti.template()):
        """Overwrite the members `names` (a tuple of str) of struct element k of list i with those of the
        struct value x, leaving the others untouched. With layout "words", words that these members fill
        together are written without being read first (set_member one at a time may read a word back)."""
        if ti.static(self._debug):
            assert i >= 0 and i < self.num_arrays and k >= 0 and k < self.length_field[i], \
                "VLA.set_members: index out of range"
        a = self._addr(i, k)
        if ti.static(self.layout == "words"):
            self._write_words(a, names, x, True)
        else:
            for name in ti.static(names):
                self._set_leaf_at(a, (name,), x[name])

    @ti.func
    def clear(self, i):
        """Empty list i; its storage stays reserved for the next fill.

        Appends parked in the overflow area before the clear are dropped by the next commit() only where
        their slot lies at or past the list's new length. So commit (or use vla.launch) between a kernel
        whose appends to list i overflowed and a later clear-and-refill of list i past its room: otherwise
        an old parked value and a new one share a slot, and either may end up there."""
        self.length_field[i] = 0

    @ti.func
    def flat_size(self):
        """Number of storage slots (inline + chunks handed out) that flat_index() maps."""
        return self._n_inline + self.flat_pool_size()

    @ti.func
    def capacity(self, i):
        """Elements list i holds in its own storage (inline + its chunks). Appends at index >= capacity(i)
        wait in the overflow area until commit() (pending_*); below it, get(i, k) is valid even before a
        commit, which lets a kernel read what an earlier kernel of the same vla.launch appended."""
        return self.inline_capacity + (self._chunks_of(i) << self._chunk_shift)

    @ti.func
    def flat_inline_begin(self, i):
        """Flat slot of list i's first inline element: list i's inline slots are flat_inline_begin(i) ..
        flat_inline_begin(i) + inline_capacity - 1, so the inline slots of lists a..b-1 form one range
        (a caller can walk a subset of lists, e.g. one class of them, without touching the others)."""
        return i * self.inline_capacity

    @ti.func
    def flat_pool_begin(self):
        """First flat slot of the pool tier (= num_arrays * inline_capacity)."""
        return self._n_inline

    @ti.func
    def flat_pool_size(self):
        """Number of pool slots handed out: flat slots flat_pool_begin() .. flat_pool_begin() + this - 1."""
        return self._scalars[2] << self._chunk_shift

    @ti.func
    def flat_index(self, e):
        """(list, index) of storage slot e, or (-1, -1) when slot e holds no live element.

        Slots run over the inline tier (list by list) then over the pool's chunks, so a loop over
        range(flat_size()) is load-balanced and reads memory in order. The element is flat_value(e).
        """
        i, k, o = self.flat_index_after(e, -1)
        return i, k

    @ti.func
    def flat_index_after(self, e, prev):
        """flat_index(e) for a walk that visits slots in increasing order: returns (list, index, owner), where
        owner is what to pass as ``prev`` with the walk's next slot (-1 the first time). runs="ordered" then
        steps forward from the previous slot's list (a load or two for neighbouring slots) instead of
        searching from the hint; runs="bump" looks the owner up either way (one load)."""
        i = -1
        k = -1
        o = -1
        if e < self._n_inline:
            ii = e // self.inline_capacity
            kk = e - ii * self.inline_capacity
            if kk < self.length_field[ii]:
                i = ii
                k = kk
        else:
            q = e - self._n_inline
            t = q >> self._chunk_shift
            rs = 0
            if ti.static(self.runs == "ordered"):
                hi_t = 0
                if prev >= 0:
                    rs = self.table_start[prev]
                    hi_t = self.table_start[prev + 1]
                o, rs, hi_t = self._advance_run(prev, rs, hi_t, t)
            else:
                o = self._owner_of_chunk(t)
                if o >= 0:
                    rs = self.table_start[o]
            if o >= 0:
                kk = self.inline_capacity + ((t - rs) << self._chunk_shift) + (q & (self.chunk_size - 1))
                if kk < self.length_field[o]:
                    i = o
                    k = kk
        return i, k, o

    @ti.func
    def flat_reduce(self, first, seg: ti.template(), f: ti.template(), init):
        """Fold ``acc = f(acc, i, k, x)`` over the live elements x (list i, index k) in storage slots first ..
        first + seg - 1 that lie below flat_size(), in slot order, and return acc. ``seg`` is a compile-time int.

        The fast flat read: ``for g in range((v.flat_size() + SEG - 1) // SEG)`` with first = g * SEG visits
        every live element once, load-balanced, each thread SEG neighbouring slots (4 or 8 is a good SEG; see
        docs/benchmarks.md). Against a walk through flat_index_after it issues the SEG value loads first, all in
        flight together (every slot below flat_size() is readable), and keeps the current list's run and
        length in registers: a slot then costs a compare, and a new list one or two loads (runs="ordered":
        steps forward, searching from the hint only for the first slot or past 4 lists; runs="bump": the
        chunk's owner, once per chunk). A thread whose slots run past flat_size() takes them one at a time.
        Like flat_index it sees the elements in their lists' own storage: appends still pending (before a
        commit) are in pending_index/pending_value.
        """
        n = self.flat_size()
        acc = init
        if first + seg <= n:
            # (each _load is a call whose value is a variable: the loads are issued here, before the walk)
            xs = [self._load(first + j) for j in ti.static(range(seg))]
            o = -1        # the current pool list: its run starts at chunk rs, its length is ln
            rs = 0
            ln = -1
            hi_t = 0      # ordered: the next list's run start (table_start[o + 1])
            cur_t = -1    # bump: the chunk whose owner o is
            for j in ti.static(range(seg)):
                e = first + j
                pool = True
                if ti.static(self.inline_capacity > 0):
                    pool = e >= self._n_inline
                    if not pool:
                        ii = e // self.inline_capacity
                        kk = e - ii * self.inline_capacity
                        if kk < self.length_field[ii]:
                            acc = f(acc, ii, kk, xs[j])
                if pool:
                    q = e - self._n_inline
                    t = q >> self._chunk_shift
                    if ti.static(self.runs == "ordered"):
                        if o < 0 or t >= hi_t:
                            o, rs, hi_t = self._advance_run(o, rs, hi_t, t)
                            ln = self.length_field[o]
                    else:
                        if t != cur_t:
                            cur_t = t
                            o = self._owner_of_chunk(t)
                            ln = -1   # (a hole: no list owns chunk t)
                            if o >= 0:
                                rs = self.table_start[o]
                                ln = self.length_field[o]
                    kk = self.inline_capacity + ((t - rs) << self._chunk_shift) + (q & (self.chunk_size - 1))
                    if kk < ln:
                        acc = f(acc, o, kk, xs[j])
        else:
            prev = -1
            for j in range(seg):
                e = first + j
                if e < n:
                    i, k, o = self.flat_index_after(e, prev)
                    prev = o
                    if i >= 0:
                        acc = f(acc, i, k, self._load(e))
        return acc

    @ti.func
    def flat_value(self, e):
        """The element in storage slot e (valid when flat_index(e) gave i >= 0)."""
        return self._load(e)

    @ti.func
    def pending_size(self):
        """Appends waiting in the overflow area for the next commit() (0 right after a commit).

        Flat iteration over range(flat_size()) sees committed slots only; a kernel that runs after an
        appending kernel but before commit() (e.g. the second kernel of a function run through vla.launch,
        which commits once at the end) also walks range(pending_size()) with pending_index/pending_value
        to see every element. Elements the overflow area could not hold are not there: launch re-runs."""
        return ti.min(self._scalars[0], self._scalars[1])

    @ti.func
    def pending_index(self, o):
        """(list, index) of pending append o (0 <= o < pending_size())."""
        m = self.ovf_meta[o]
        return m[0], m[1]

    @ti.func
    def pending_value(self, o):
        """The element of pending append o."""
        return self._unpack(self.ovf_value[o])

    # ------------------------------------------------------------------ kernel-side internals
    @ti.func
    def _load(self, a):
        """The element in store slot a."""
        return self._unpack(self.store[a])

    @ti.func
    def _put(self, a, x):
        self.store[a] = self._pack(x)

    @ti.func
    def _pack(self, x):
        """An element as stored: itself, or its words (layout "words", vla.words)."""
        if ti.static(self.layout == "words"):
            return self._words.pack(x)
        else:
            return x

    @ti.func
    def _unpack(self, s):
        """Inverse of _pack."""
        if ti.static(self.layout == "words"):
            return self._words.unpack(s)
        else:
            return s

    @ti.func
    def _write_words(self, a, names: ti.template(), x, whole: ti.template()):
        """Layout "words": write members `names` into the element in store slot a; x is the struct value
        (whole) or the single member's value. A word is read back only to keep another member's half."""
        for plan in ti.static(self._words.plans(names)):
            old = ti.u64(0)
            if ti.static(plan[3]):
                old = self.store[a][plan[0]]
            self.store[a][plan[0]] = self._words.join(self._words.new_half(x, old, plan[1], 0, whole),
                                                      self._words.new_half(x, old, plan[2], 1, whole))

    @ti.func
    def _leaf_at(self, a, path: ti.template()):
        """Member `path` (a tuple of names) of the element in store slot a, loading only its own words."""
        if ti.static(self.layout == "words"):
            return self._words.member(self.store[a], path[0])
        else:
            return ti.static(_leaf_field(self.store, path))[a]

    @ti.func
    def _set_leaf_at(self, a, path: ti.template(), x):
        """Overwrite member `path` of the element in store slot a (layout "words": see _write_words)."""
        if ti.static(self.layout == "words"):
            self._write_words(a, path, x, False)
        else:
            ti.static(_leaf_field(self.store, path))[a] = x

    @ti.func
    def _zero(self):
        if ti.static(_is_primitive(self.dtype)):
            return ti.cast(0, self.dtype)
        else:
            return self.dtype(0)

    @ti.func
    def _chunks_for(self, n):
        return (ti.max(0, n - self.inline_capacity) + self.chunk_size - 1) >> self._chunk_shift

    @ti.func
    def _grow_target(self, i, demand, headroom):
        """Chunks list i gets if it must grow to hold ``demand`` elements, else 0. With headroom, a growing
        list gets 25% (rounded down to whole chunks) more than it needs, so that a list that creeps upwards
        frame after frame grows O(log) times once it holds 4 chunks or more (before that, once per chunk),
        not every frame. No minimum of one extra chunk: for the short
        lists that dominate (a contact list needs 1-3 chunks) that minimum doubled the reserved memory, and
        a list that grows is moved on the device without a host round trip (_k_commit)."""
        need = self._chunks_for(demand)
        m = 0
        if need > self._chunks_of(i):
            m = need
            if headroom:
                m = need + need // 4
        return m

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
    def _owner_of_chunk(self, t):
        """The list whose run holds chunk t (t below the bump), or -1 (bump: a hole). runs="ordered": the
        last list whose run starts at or before t (lists with empty runs share their start with the next
        list, so the last one is the owner), searched between the owners of the hint_every-chunk blocks around t."""
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
    def _addr_at(self, i, k, t_start):
        """store index of element k of list i whose chunk run starts at chunk t_start. A select, not a
        branch: both formulas are cheap, and straight-line code lets loops hoist their invariant loads."""
        pool = self._n_inline + (t_start << self._chunk_shift) + k - self.inline_capacity
        a = pool
        if ti.static(self.inline_capacity > 0):
            a = ti.select(k < self.inline_capacity, i * self.inline_capacity + k, pool)
        return a

    @ti.func
    def _addr(self, i, k):
        return self._addr_at(i, k, self.table_start[i])

    # ------------------------------------------------------------------ host-side API
    def commit(self):
        """Make every element appended since the last commit readable; grow capacity as needed.

        Costs one scalar read when nothing overflowed, else one launch and a second read (unless some list
        found the pool full: then the host compacts and grows the pool). Raises VLAOverflowError (after
        growing to the demand) if the overflow area could not hold all overflowed elements.
        """
        self._check_program()
        n_ovf = int(self._scalars[0])
        if n_ovf == 0:
            return
        ovf_cap = self._caps["ovf_value"]
        self.overflow_events += 1
        # bump: one launch and one scalar read; lists grow at the pool's end on the device, then the parked
        # elements move home (and the overflow area empties) unless some list found the pool full.
        # ordered: a list grows only through a re-layout of the pool, on the host's side.
        if self.runs == "ordered" or not self._commit_on_device():
            # (bump: the pool was full) compact and grow the pool on the host's side, then move the parked
            # elements home.
            demand = self._scratch_nd("demand", self.num_arrays)
            _k_lengths_to_nd(self, demand)
            self._grow_to(demand, headroom=True)  # (counts the growth)
            _k_move_overflow_home(self)
            self._release_transient_scratch()
        if n_ovf > ovf_cap:
            new_cap = _bucket(n_ovf * 1.1)
            self._regrow("ovf_value", self._store_dtype, new_cap)
            self._regrow("ovf_meta", ti.types.vector(2, ti.i32), new_cap)
            self._scalars[1] = new_cap
            raise VLAOverflowError(
                f"VLA {self.name!r}: a kernel appended {n_ovf} elements beyond the lists' reserved chunks, but "
                f"the overflow area holds {ovf_cap}; {n_ovf - ovf_cap} were lost. Capacity has grown to the "
                f"demand: run the kernel through vla.launch() (which rolls back and re-runs), or clear and refill.",
                appended=n_ovf, overflow_capacity=ovf_cap, lost=n_ovf - ovf_cap)

    def _commit_on_device(self) -> bool:
        _k_commit(self, self._caps["pool_chunks"])
        return self._after_claims()

    def clear_all(self):
        """Empty every list; reserved chunks stay with their lists (lazy release)."""
        _k_clear_all(self)

    def trim(self):
        """Compact the pool and release every chunk the current lengths do not need."""
        self.commit()
        target = self._scratch_nd("target", self.num_arrays)
        _k_target_trim(self, target)
        self._relayout(target, shrink=True)
        self._release_transient_scratch()
        if self._caps["ovf_value"] > self._default_ovf:
            self._regrow("ovf_value", self._store_dtype, self._default_ovf)
            self._regrow("ovf_meta", ti.types.vector(2, ti.i32), self._default_ovf)
            self._scalars[1] = self._default_ovf

    def permute(self, order, first=0, count=None):
        """Reorder lists in place: list first + k becomes what list first + order[k] was (k < count), with
        its elements and its capacity (the chunks it owns go with it, so memoised capacity follows the data
        and nothing is allocated). order: i32 Taichi field holding a permutation of 0..count-1 in its first
        count entries. first: an int, or a sequence of ints to permute several disjoint ranges of count lists
        by the same order (one staging buffer for all). Cost: the lists' inline parts and chunk tables; pool
        elements do not move. Appends still in the overflow area are committed first."""
        firsts = [int(first)] if isinstance(first, (int, np.integer)) else [int(f) for f in first]
        count = self.num_arrays - firsts[0] if count is None else int(count)
        ends = sorted((f, f + count) for f in firsts)
        for f, e in ends:
            if f < 0 or count < 0 or e > self.num_arrays:
                raise ValueError(f"VLA {self.name!r}.permute: lists [{f}, {e}) outside [0, {self.num_arrays})")
        if any(a[1] > b[0] for a, b in zip(ends, ends[1:])):
            raise ValueError(f"VLA {self.name!r}.permute: ranges of {count} lists from {firsts} overlap")
        if self.runs == "ordered":
            raise ValueError(f"VLA {self.name!r}.permute: lists with runs='ordered' keep their runs in list order, "
                             f"which a permutation would break; create the VLA with runs='bump' to permute it")
        if count == 0:
            return
        self.commit()
        meta = self._scratch_nd("permute_meta", 3 * count)
        staged = count * self.inline_capacity
        # The staging for the inline parts is the re-layout's (its own tree, so a regrow usually recompiles
        # nothing: see the module docstring); it is given back afterwards, as after a re-layout. Allocating it
        # costs more than the permutation (H200, 1M lists of 5 inline 48-byte records: ~12 ms of host time per
        # allocation and release, against 0.7-1 ms of kernels), hence several ranges per call.
        if self._caps["relayout_tmp"] < staged:
            self._regrow("relayout_tmp", self._store_dtype, staged)
        for f in firsts:
            _k_permute(self, order, f, count, meta)
        if self._caps["relayout_tmp"] > 1:
            self._regrow("relayout_tmp", self._store_dtype, 1)

    def lengths(self) -> np.ndarray:
        """Lengths of all lists, np.int32 (num_arrays,)."""
        out = self._scratch_nd("lengths_out", self.num_arrays)
        _k_lengths_to_nd(self, out)
        return out.to_numpy()

    def to_csr(self):
        """(offsets int64 (num_arrays+1,), values): values is an ndarray, or a dict of ndarrays keyed by
        struct member ('a.b' for nested members). Compacted on the device; only live elements are copied."""
        self.commit()
        n = self.num_arrays
        lens = self._scratch_nd("lengths_out", n)
        _k_lengths_to_nd(self, lens)
        offs = self._scratch_nd("csr_offsets", n + 1)
        self._scanner.exclusive(lens, n, offs)
        offsets = offs.to_numpy().astype(np.int64)
        total = int(offsets[-1])
        values = {}
        for path, ldt in self._leaves:
            out = ti.ndarray(ldt, shape=max(total, 1))
            if total:
                _k_gather_leaf(self, path, offs, out)
            values[".".join(path)] = out.to_numpy()[:total]
        if not isinstance(self.dtype, StructType):
            values = values[""]
        return offsets, values

    def from_csr(self, offsets, values):
        """Replace every list's contents with a CSR description (the inverse of to_csr)."""
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
        if total > _I32_MAX:
            raise VLACapacityError(f"VLA {self.name!r}.from_csr: {total} elements exceed the 32-bit index space")
        leaf_values = self._check_values(values, total)
        self.commit()
        _k_clear_all(self)
        self._reserve_for(lens.astype(np.int32))
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
        _k_nd_to_lengths(self, lens_nd)
        self._release_transient_scratch()

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

    def reserve(self, lengths):
        """Pre-assign capacity so each list i can hold lengths[i] elements without overflow."""
        lengths = np.asarray(lengths)
        if lengths.shape != (self.num_arrays,) or (lengths < 0).any():
            raise ValueError(f"VLA {self.name!r}.reserve: need {self.num_arrays} non-negative lengths, "
                             f"got shape {lengths.shape}")
        self._reserve_for(lengths.astype(np.int32))

    @property
    def slot_capacity(self) -> int:
        """Flat slots the storage holds now (inline tier + every pool chunk, handed out or not): an upper
        bound of flat_size() until the pool next changes size (commit, reserve, from_csr, trim), known on the
        host without a device read."""
        return self._n_inline + self._caps["pool_chunks"] * self.chunk_size

    def stats(self) -> dict:
        """Live and reserved sizes. reserved_bytes: element storage (inline tier, pool, overflow area) and all
        metadata (per list, per chunk, per overflow slot). scratch_bytes: the work buffers the VLA keeps for
        reuse (scratch_bytes()); device_bytes: both, all the device memory the VLA holds."""
        live = int(_k_sum_lengths(self))
        eb = self.element_bytes
        pool_chunks = self._caps["pool_chunks"]
        holes = int(self._scalars[3])
        bump = int(self._scalars[2])
        reserved_elems = self._n_inline + pool_chunks * self.chunk_size
        ovf = self._caps["ovf_value"]
        # per list: length, run start (and run length, bump); ordered: the closing run start; 16 scalars; the
        # owner table (bump) or hint (ordered); per overflow slot its (list, slot)
        table_entries = self.num_arrays + 1 if self.runs == "ordered" else 2 * self.num_arrays
        meta = 4 * (self.num_arrays + table_entries) + 64 + 4 * self._caps["table_owner"] + 8 * ovf
        element_reserved_bytes = (reserved_elems + ovf) * self.storage_bytes  # (padding included)
        scratch = self.scratch_bytes()
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
        }

    @staticmethod
    def tune(lengths, dtype=ti.i32, inline_options=(0, 1, 2, 3, 4, 6, 8, 12, 16),
             chunk_options=(1, 2, 4, 8, 16, 32, 64), min_chunk_size=1, layout="soa", runs="bump",
             hint_every=_HINT_EVERY):
        """Choose (inline_capacity, chunk_size) that minimise reserved bytes for a length histogram.

        ``lengths``: observed per-list lengths. The model counts what the VLA really reserves: inline
        slots for every list, whole chunks for the rest of each list, and the metadata of ``runs`` (as the
        VLA's): "bump", 12 bytes per list (length, chunk table start and count) and 4 per chunk (its owner,
        for flat iteration); "ordered", 8 bytes per list and 4 per ``hint_every`` chunks. Speed hardly depends on the choice
        (a list's chunks are contiguous, so there is no per-chunk load); ``min_chunk_size`` can still
        exclude tiny chunks, which make growth re-layouts more frequent. ``layout``: as the VLA's; "words"
        stores an element in whole 64-bit words (its padding is reserved, not live). Returns the choice and
        its predicted reserved/live ratio.
        """
        lens = np.asarray(lengths, dtype=np.int64)
        if lens.ndim != 1 or lens.size == 0 or (lens < 0).any():
            raise ValueError("VLA.tune: lengths must be a non-empty 1-D array of non-negative ints")
        vals, counts = np.unique(lens, return_counts=True)
        live = float((vals * counts).sum()) * element_bytes(dtype)
        eb = Words(dtype).storage_bytes if layout == "words" else element_bytes(dtype)
        if runs not in ("bump", "ordered"):
            raise ValueError(f"VLA.tune: runs must be 'bump' or 'ordered', got {runs!r}")
        _check_hint_every(hint_every)
        list_meta, chunk_meta = (8, 4 / hint_every) if runs == "ordered" else (12, 4)
        best = None
        for ic in inline_options:
            for cs in chunk_options:
                if cs < min_chunk_size:
                    continue
                chunks = ((np.maximum(0, vals - ic) + cs - 1) // cs * counts).sum()
                # per list: inline slots + length + chunk table entry; per chunk: elements + owner id (bump)
                reserved = lens.size * (ic * eb + list_meta) + chunks * (cs * eb + chunk_meta)
                if best is None or reserved < best[0]:
                    best = (reserved, ic, cs)
        reserved, ic, cs = best
        return {"inline_capacity": int(ic), "chunk_size": int(cs), "runs": runs, "reserved_bytes": int(reserved),
                "live_bytes": int(live), "ratio": float(reserved / live) if live else float("inf")}

    def __del__(self):
        try:
            if impl.get_runtime().prog is not self._prog:
                _GRAVEYARD.append((self._scratch, self._scanner))
        except Exception:  # interpreter shutdown: nothing to protect any more
            pass

    def _check_program(self):
        if impl.get_runtime().prog is not self._prog:
            raise RuntimeError(f"VLA {self.name!r} belongs to a Taichi program that ti.init()/ti.reset() has "
                               f"ended; create the VLA again after ti.init()")

    def release(self):
        """Free the device memory now (the VLA is unusable afterwards; Taichi drops compiled kernels)."""
        for trees in self._trees.values():
            for tree in trees:
                tree.destroy()
        self._trees = {}
        self._fixed_tree.destroy()
        _LIVE.discard(self)

    # ------------------------------------------------------------------ host-side internals
    def _scratch_nd(self, key, n, dtype=ti.i32):
        nd = self._scratch.get(key)
        if nd is None or nd.shape[0] < n:
            nd = ti.ndarray(dtype, shape=max(n, 1))
            self._scratch[key] = nd
        return nd

    # Work buffers of the rare host-side paths (growth through the host, compaction, trim, reserve, from_csr):
    # a list's worth of i32 each (4 bytes a list apiece; 16 for the four), given back when the operation ends,
    # because those paths allocate and copy far more than these anyway. The others stay for reuse: launch's and
    # Batch's snapshots (every call), lengths()/to_csr()'s and permute()'s buffers.
    _TRANSIENT_SCRATCH = ("demand", "moved", "target", "new_start")

    def _release_transient_scratch(self):
        for key in self._TRANSIENT_SCRATCH:
            self._scratch.pop(key, None)

    def scratch_bytes(self) -> int:
        """Bytes of the work buffers this VLA holds for reuse (the snapshots of vla.launch and Batch with
        rollback, the buffers of lengths(), to_csr() and permute(), the prefix sum's block sums, the re-layout
        staging), which stats() reports apart from the lists' own storage; release_scratch() frees them."""
        total = sum(int(np.prod(nd.shape)) * _ti_core.data_type_size(nd.dtype) for nd in self._scratch.values())
        total += self._scanner.scratch_bytes()
        return total + self._caps["relayout_tmp"] * self.storage_bytes

    def release_scratch(self):
        """Free the work buffers scratch_bytes() counts (each is allocated again when next needed)."""
        self._scratch.clear()
        self._scanner.release()

    def _alloc(self, attr, dtype, length, replace=None):
        """Allocate field ``attr`` of ``length`` entries in tree(s) of its own; ``replace``: the trees it
        replaces, each freed just before its successor is built so that the successor takes its id.

        With layout "soa" the store of a struct/vector dtype is a structure of arrays (each scalar component
        an array of its own, so a warp reading one member of neighbouring lists reads neighbouring
        addresses), with one tree per component: within one tree the second array's offset would depend on
        the length, which compiled kernels bake in, while a tree's first array always sits at offset 0.
        With "aos" the whole struct is placed under one dense node: one array of records, one tree."""
        if length > _I32_MAX:
            raise VLACapacityError(
                f"VLA {self.name!r}: {attr} would need {length} entries, beyond the 32-bit index space; "
                f"use a larger chunk_size or fewer elements per VLA")
        field = _new_unplaced(dtype)
        if attr == "store" and not _is_primitive(dtype) and self.layout == "soa":
            parts = [ScalarField(m) for m in field._get_field_members()]
        else:
            parts = [field]
        runtime = impl.get_runtime()
        trees = []
        for j, part in enumerate(parts):
            if replace is not None:
                old = replace[j]
                # SNodeTree.destroy() also drops every compiled kernel of the program (Taichi cannot know
                # that the next tree will take the same id and layout); we free the tree itself.
                old.ptr.destroy_snode_tree(runtime.prog)
                old.destroyed = True
            fb = ti.FieldsBuilder()
            fb.dense(ti.i, length).place(part)
            try:
                trees.append(_finalize(fb, f"VLA {self.name!r}: {attr}"))
            except RuntimeError as e:  # device allocation failure
                nbytes = length * element_bytes(dtype)
                raise VLACapacityError(
                    f"VLA {self.name!r}: could not allocate {attr} of {length} elements ({nbytes / 2**20:.1f} MiB): "
                    f"{e}. Give Taichi more device memory (ti.init(device_memory_GB=...)), lower reserve, or trim()"
                ) from None
        setattr(self, attr, field)
        self._trees[attr] = trees
        self._caps[attr] = length
        return trees

    def _owner_len(self, pool_chunks):
        """Entries of table_owner: one per chunk (bump), or one per hint_every chunks and one past the last (ordered)."""
        return (pool_chunks >> self._hint_shift) + 2 if self.runs == "ordered" else pool_chunks

    def _regrow(self, attr, dtype, new_len):
        """Replace field ``attr`` with an empty one of ``new_len`` entries (callers copy what they keep)."""
        # Finalise pending ti.root fields now, so they cannot take the ids we are about to free.
        runtime = impl.get_runtime()
        runtime.materialize()
        old = self._trees[attr]
        old_ids = [t.id for t in old]
        trees = self._alloc(attr, dtype, new_len, replace=old)
        if [t.id for t in trees] != old_ids or self._debug:
            runtime.clear_compiled_functions()
            self.recompile_events += 1

    def _reserve_for(self, lengths_np):
        demand = self._scratch_nd("demand", self.num_arrays)
        demand.from_numpy(lengths_np)
        self._grow_to(demand, headroom=False)
        self._release_transient_scratch()

    def _after_claims(self) -> bool:
        """After a kernel that ran claims (_k_commit, _k_claim_runs): one scalar read of their outcome; counts
        a growth if any list moved. Returns False when some list found the pool full; the bump is then set
        back to the pool's end (the chunks between the last successful run and the end were never assigned:
        owner -1, skipped by every walk) and the caller must compact."""
        outcome = int(self._scalars[7])
        if outcome < 0:
            self._scalars[4] = 0
            self._scalars[2] = self._caps["pool_chunks"]
            self._scalars[7] = 0
            return False
        if outcome > 0:
            self.grow_events += 1
        return True

    def _grow_to(self, demand, headroom):
        """Give every list the chunks it needs to hold demand[i] elements (device-side).

        Lists that must grow claim a new run of chunks at the end of the pool (cost: their own elements);
        only when the pool is full does everything compact into a larger pool (cost: the whole pool).
        runs="ordered": every growth is such a compaction. Counts one growth event if any list grew."""
        n = self.num_arrays
        moved = self._scratch_nd("moved", n)
        if _k_grow_targets(self, demand, int(headroom), moved) == 0:
            return
        if self.runs == "bump":
            _k_claim_runs(self, moved, self._caps["pool_chunks"])
            grown = self.grow_events
            if self._after_claims():  # (counts the growth)
                return
            self.grow_events = grown + 1  # the lists grow through the compaction (once with those that moved)
        else:
            self.grow_events += 1
        target = self._scratch_nd("target", n)
        _k_target_keep(self, moved, target)
        self._relayout(target, shrink=False)

    def _relayout(self, target, shrink):
        """Compact the pool: target[i] chunks for list i, in list order, keeping every list's data (up to
        target[i] chunks). The pool grows (to 1.1-1.2x the demand) if less than ~10% of it would stay free,
        or shrinks to fit if asked. Each growth copies the whole store: a pool whose demand keeps rising
        re-lays itself out about every 10% of growth (more often than with x1.5 steps, for less memory)."""
        n = self.num_arrays
        self.compact_events += 1
        new_start = self._scratch_nd("new_start", n + 1)
        self._scanner.exclusive(target, n, new_start)
        total = int(new_start[n])
        n_old = int(self._scalars[2])   # chunks handed out: [0, n_old); holes among them have owner -1
        cs = self.chunk_size
        cap = self._caps["pool_chunks"]
        # Grow before the pool is full, so that a compaction leaves room for the growths that follow.
        regrow = total > cap or (shrink and total < cap) or (not shrink and total * _POOL_HEADROOM > cap)
        # Staging: the pool's new content, and the inline tier too when the store tree is replaced.
        tmp_base = self._n_inline if regrow else 0
        if n_old and total:
            self._regrow("relayout_tmp", self._store_dtype, tmp_base + total * cs)
            _k_relayout_to_tmp(self, n_old, target, new_start, tmp_base)
        elif regrow and tmp_base:
            self._regrow("relayout_tmp", self._store_dtype, tmp_base)
        if regrow and tmp_base:
            _k_inline_to_tmp(self)
        if regrow:
            cap = max(1, total if shrink else _bucket(total * _POOL_HEADROOM, _POOL_STEPS_PER_OCTAVE))
            self._regrow("store", self._store_dtype, self._n_inline + cap * cs)
            self._regrow("table_owner", ti.i32, self._owner_len(cap))
            self._caps["pool_chunks"] = cap
            if tmp_base:
                _k_tmp_to_store(self, 0, 0, tmp_base)
        if n_old and total:
            _k_tmp_to_store(self, tmp_base, self._n_inline, total * cs)
        if self._caps["relayout_tmp"] > 1:
            self._regrow("relayout_tmp", self._store_dtype, 1)
        _k_relayout_table(self, new_start, target, total, cap)
        self._scalars[2] = total

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
            leaves.append(np.ascontiguousarray(arr, dtype=to_numpy_type(base)))
        return leaves

    def __repr__(self):
        return (f"VLA(name={self.name!r}, num_arrays={self.num_arrays}, inline_capacity={self.inline_capacity}, "
                f"chunk_size={self.chunk_size}, layout={self.layout!r}, runs={self.runs!r})")


# ----------------------------------------------------------------------------------------------------
# launch: run a kernel so that no append is ever lost
# ----------------------------------------------------------------------------------------------------
def _find_vlas(obj, found, depth=0):
    if isinstance(obj, VLA):
        found[id(obj)] = obj
    elif depth < 2:
        if isinstance(obj, (list, tuple, set)):
            for x in obj:
                _find_vlas(x, found, depth + 1)
        elif isinstance(obj, dict):
            for x in obj.values():
                _find_vlas(x, found, depth + 1)
        elif hasattr(obj, "_data_oriented") and not isinstance(obj, type):
            for x in vars(obj).values():
                if isinstance(x, (VLA, list, tuple, dict)) or hasattr(x, "_data_oriented"):
                    _find_vlas(x, found, depth + 1)


def _affected_vlas(args, vlas):
    """The VLAs a launch commits: `vlas` if given, else those among args, else every live one."""
    if vlas is None:
        found = {}
        for a in args:
            _find_vlas(a, found)
        prog = impl.get_runtime().prog
        vlas = list(found.values()) or [v for v in _LIVE if v._prog is prog]
    return list(vlas)


def launch(fn, *args, vlas=None, rollback=True, max_retries=8):
    """Run ``fn(*args)`` (a Taichi kernel, or a Python function launching kernels) without losing appends.

    After the call every affected VLA is committed. If any of them had to drop elements, all of them
    are rolled back to their lengths before the call (capacity has already grown to the demand) and
    ``fn`` runs again. ``fn`` must therefore be idempotent apart from its appends: it may read anything
    and append, but must not depend on state it modified itself during a failed attempt.

    The affected VLAs are ``vlas`` if given, else those found among the arguments (also inside
    containers and data-oriented objects, two levels deep), else every live VLA.

    ``rollback=False``: for an ``fn`` that empties every list it appends to before appending (a per-frame
    rebuild). Re-running it is then safe as it is, so no snapshot of the lengths is taken: one launch per
    VLA less on every call.
    Returns what ``fn`` returned.
    """
    vlas = _affected_vlas(args, vlas)
    # Snapshot on the device (no host sync): lengths, and the appends still waiting in the overflow area
    # from before the call (they are moved home by the commit below, like the call's own).
    snaps = []
    for v in vlas:
        v._check_program()
        if rollback:
            snap = v._scratch_nd("launch_snapshot", v.num_arrays + 1)  # reused: launch allocates nothing
            _k_snapshot(v, snap)
            snaps.append((snap, v._caps["ovf_value"]))
        else:
            snaps.append((None, v._caps["ovf_value"]))
    for attempt in range(max_retries + 1):
        result = fn(*args)
        lost = []
        for v, (snap, ovf_cap) in zip(vlas, snaps):
            try:
                v.commit()  # one host read per VLA when nothing overflowed
            except VLAOverflowError as e:
                if snap is not None and int(snap[v.num_arrays]) > ovf_cap:
                    raise VLAOverflowError(
                        f"vla.launch: VLA {v.name!r} had already lost appends made before this call (outside "
                        f"launch), which re-running {getattr(fn, '__name__', fn)} cannot restore: {e}",
                        appended=e.appended, overflow_capacity=e.overflow_capacity, lost=e.lost) from None
                lost.append(e)
        if not lost:
            return result
        for v, (snap, _) in zip(vlas, snaps):
            if snap is not None:
                _k_nd_to_lengths(v, snap)
    raise VLAOverflowError(
        f"vla.launch: {getattr(fn, '__name__', fn)} still overflowed after {max_retries} retries "
        f"(its appends are not deterministic in count?): {lost[0]}")


# ----------------------------------------------------------------------------------------------------
# Batch: several launches, committed on the device, checked with one host read
# ----------------------------------------------------------------------------------------------------
# Batch.failed_at when no launch has failed since the last clear_failure() (the largest i32: failures are
# recorded with atomic_min, so the earliest tag wins).
NO_FAILURE = 2 ** 31 - 1


class Batch:
    """Launches whose VLAs commit on the device, then one host read for all of them (:meth:`done`).

    Why: :func:`launch` reads a scalar back after each call (whether anything overflowed, and whether the
    lists that grew found room), and while the host reads and decides, the GPU idles. A simulation step with
    three VLAs paid five such round trips (H200, landed 1M-body pile: 0.4 ms of a 11 ms step, measured by
    leaving them out; docs/benchmarks.md, session 15). A Batch commits on the device instead: lists that
    outgrew their chunks take new ones from the pool's free chunks there and the parked elements move home,
    which is what a commit does on almost every call. done() then reads one small array.

    What the device cannot do is grow the pool or the overflow area. If a launch needed that, done() returns
    False and the caller runs the work again through :func:`launch`, which grows on the host. Until then the
    VLAs are readable, never wrong: each list shows only elements that were appended to it (those that did not
    fit are dropped), and the VLAs of launches given ``rollback=True`` are back to their lengths before the
    batch. Later launches of the same batch may have read the short lists, so their results must be redone too.

        batch = vla.Batch()
        batch.begin()
        batch.launch(kernel_a, x, vlas=[a], rollback=False)   # a kernel that empties what it appends to
        batch.launch(kernel_b, y)                              # the VLAs among y, rolled back on failure
        if not batch.done():
            vla.launch(kernel_a, x, vlas=[a], rollback=False)
            vla.launch(kernel_b, y)

    The kernels have the same duty as under launch(): idempotent apart from their appends.

    Checking later: even one host read per batch leaves the GPU idle while the host reads and launches the
    next kernel (H200, landed 1M-body pile: 0.3 ms of a 10.4 ms step, measured by leaving the read out;
    docs/benchmarks.md, session 20). So a caller may run several batches back to back and check them all with
    one read. ``begin(tag)`` labels a batch; a failed device commit records the smallest such tag in
    ``failed_at`` (a 0-d i32 field, ``NO_FAILURE`` when none), which stays set until ``clear_failure()``.
    Kernels that must not build on a failed batch (they would read its short lists, or overwrite what a
    redo needs) test ``failed_at[None] == NO_FAILURE`` on the device and skip their work; ``first_failure()``
    reads the tag on the host, and the caller redoes the work from that batch on::

        for s in range(8):
            batch.begin(tag=s)
            batch.launch(fill, lists, vlas=[lists], rollback=False)
            use(lists, batch.failed_at)         # does nothing once failed_at is set
        f = batch.first_failure()               # the one host read
        if f is not None:
            batch.clear_failure()
            ...                                 # back to the state before batch f, redo f through launch()

    Deferred checking suits launches given ``rollback=False`` (kernels that empty what they fill): a roll
    back happens only in done().
    """

    def __init__(self, failed_at=None):
        """failed_at: a 0-d i32 field to record failures in (kernels elsewhere may already be compiled
        against it), or None for a field of the batch's own (a Taichi SNode tree of its own, held until
        release(): make one Batch and reuse it, see SNODE_TREE_LIMIT). Set to NO_FAILURE here."""
        self._status = None
        self._prog = impl.get_runtime().prog
        self._entries = []   # (vla, status slot, snapshot ndarray or None), in launch order
        self.failed = []     # after done() returned False: (VLA name, appends that overflowed) of each failure
        self._tree = None
        if failed_at is None:
            failed_at = ti.field(ti.i32)
            fb = ti.FieldsBuilder()
            fb.place(failed_at)
            self._tree = _finalize(fb, "vla.Batch")
        self.failed_at = failed_at
        self.failed_at[None] = NO_FAILURE
        self._tag = 0

    def __del__(self):
        try:   # an ndarray must not be freed through a later Taichi program (see _GRAVEYARD)
            if impl.get_runtime().prog is not self._prog:
                _GRAVEYARD.append(self._status)
        except Exception:
            pass

    def release(self):
        """Free the batch's own failed_at field (if it made one; Taichi drops compiled kernels). The batch is
        unusable afterwards."""
        if self._tree is not None and not self._tree.destroyed:
            self._tree.destroy()

    def begin(self, tag: int = 0):
        """Start a batch (forgets the last one's launches); `tag` (0 <= tag < NO_FAILURE) is what its failed
        commits record in failed_at."""
        if not 0 <= int(tag) < NO_FAILURE:
            raise ValueError(f"Batch.begin: tag must be in [0, {NO_FAILURE}), got {tag}")
        self._entries = []
        self.failed = []
        self._tag = int(tag)

    def launch(self, fn, *args, vlas=None, rollback=True):
        """Run ``fn(*args)`` and commit the affected VLAs on the device (no host read). ``vlas`` and ``rollback``
        as for :func:`launch`. Returns what ``fn`` returned."""
        vlas = _affected_vlas(args, vlas)
        snaps = []
        for v in vlas:
            v._check_program()
            snap = None
            if rollback:
                snap = v._scratch_nd(f"batch_snapshot_{len(self._entries) + len(snaps)}", v.num_arrays + 1)
                _k_snapshot(v, snap)
            snaps.append(snap)
        result = fn(*args)
        need = len(self._entries) + len(vlas)
        if self._status is None or self._status.shape[0] < need:
            self._status = ti.ndarray(ti.i32, shape=max(16, 2 * need))
        for v, snap in zip(vlas, snaps):
            k = len(self._entries)
            _k_commit_device(v, v._caps["pool_chunks"], self._status, k, self.failed_at, self._tag)
            self._entries.append((v, k, snap))
        return result

    def done(self) -> bool:
        """One host read. True: every append of the batch's launches is readable, as after launch(). False: some
        VLA needed the host to grow it (see the class docstring); the VLAs given ``rollback=True`` have been
        rolled back, failed_at is cleared, and the work must run again through launch()."""
        if not self._entries:
            return True
        status = self._status.to_numpy()[:len(self._entries)]
        if not status.any():
            return True
        for v, _, snap in reversed(self._entries):
            if snap is not None:
                _k_nd_to_lengths(v, snap)
        self.failed = [(v.name, int(status[k])) for v, k, _ in self._entries if status[k]]
        self.clear_failure()
        return False

    def first_failure(self):
        """One host read: the smallest tag of the batches whose device commits failed since the last
        clear_failure(), or None. Their VLAs are readable but short, as after done() returned False."""
        tag = int(self.failed_at[None])
        return None if tag == NO_FAILURE else tag

    def clear_failure(self):
        """Forget recorded failures (before redoing the work: gated kernels run again)."""
        self.failed_at[None] = NO_FAILURE
