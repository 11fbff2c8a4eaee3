"""Commit, growth and trim: how a VLA's lists get the room their appends need, and give it back.

A commit gives each list that ran out a new, larger run of chunks at the end of the pool (its old chunks become a
hole, reclaimed by the next compaction), so it costs in proportion to the lists that grew, not to the pool, and
moves the parked elements home (vla.append). A list that grows gets 25% (whole chunks) more than it needs, so a list
creeping upwards frame after frame grows O(log) times. Only when the pool is full does it compact, and grow if the
demand leaves less than ~10% of it free (to 1.1-1.2x the demand). With ``runs="ordered"`` every growth is such a
compaction, on the host's side of commit.

Capacity is memoised: ``clear`` sets a length to 0 and keeps the chunks, so refilling allocates nothing. ``trim``
compacts the pool and releases what the current lengths do not need.
"""
import math

import numpy as np
import taichi as ti

from . import taichi_compat
from .append import k_move_overflow_home, move_overflow_home
from .errors import VLACapacityError, VLAOverflowError
from .taichi_compat import I32_MAX
from .tuning import CHUNK_OPTIONS, INLINE_OPTIONS, RETUNE_GAIN, histogram, modeled_bytes

# Commits in a row that found nothing to grow before a VLA that chooses its layout settles into runs="ordered"
# (Growth._settle); doubled each time it has to grow again, and after SETTLE_REVERTS such growths it stays "bump".
QUIET_COMMITS = 3
SETTLE_REVERTS = 2
# A pool that must be compacted to make room grows if less than ~10% of it would stay free, to 1.1x the demand
# rounded up along 2^(k/8) (1.1-1.2x): on an H200's 1M-body pile, 1.2x rounded along 2^(k/4) left the pool 1.2x
# larger for no measurable speed.
POOL_HEADROOM = 1.1
POOL_STEPS_PER_OCTAVE = 8
_i32_nd = ti.types.ndarray(dtype=ti.i32, ndim=1)


def bucket(n, steps_per_octave=4) -> int:
    """Smallest size of the series 2^(k/steps_per_octave) that is >= n (steps of 19% for 4, 9% for 8): few distinct
    sizes, so that Taichi's offline kernel cache (whose key includes field shapes) hits across runs whose demands
    differ a little (other seeds, other scenes)."""
    k = math.ceil(steps_per_octave * math.log2(max(1.0, n)))
    return int(math.ceil(2 ** (k / steps_per_octave)))


# ----------------------------------------------------------------------------------------------------
# Kernels (free functions; ``v`` is the VLA, compiled once per VLA instance)
# ----------------------------------------------------------------------------------------------------
@ti.kernel
def k_clear_all(v: ti.template()):
    for i in range(v.num_arrays):
        v.length_field[i] = 0


@ti.kernel
def _k_complete_lengths(v: ti.template(), parked: _i32_nd, kept: _i32_nd):
    """After appends overflowed the overflow area (Growth._commit_lost): kept[i], the length list i can show without
    a slot that was never written. A list whose appends beyond its capacity are all parked (each in its own slot of
    the area) keeps its length; any other list is cut to its capacity (the elements in its own storage)."""
    for i in range(v.num_arrays):
        parked[i] = 0
    for o in range(ti.min(v._scalars[0], v._scalars[1])):
        meta = v.ovf_meta[o]
        if v.capacity(meta[0]) <= meta[1] < v.length_field[meta[0]]:
            ti.atomic_add(parked[meta[0]], 1)
    for i in range(v.num_arrays):
        n = v.length_field[i]
        cap = v.capacity(i)
        kept[i] = n if n <= cap or parked[i] == n - cap else cap


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
    """Give list i the run of m chunks starting at chunk `new`, copy its elements there, and leave its old chunks as
    a hole (owner -1)."""
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
    """List i takes a new run of m > 0 chunks at the pool's bump (an atomic add: no prefix sum, no host round trip)
    and moves there, counting itself in _scalars[5]. If the pool is full it counts itself in _scalars[4] instead;
    its claim has then pushed the bump past the pool, which the host repairs (Growth._after_claims) before anything
    reads it. Run between _claims_begin and _claims_end."""
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
    """The claims' outcome in one scalar, so that the host learns it with one read (Growth._after_claims): -1 if
    some list found the pool full, else the number of lists that moved."""
    v._scalars[7] = ti.select(v._scalars[4] > 0, -1, v._scalars[5])


@ti.kernel
def _k_commit(v: ti.template(), pool_chunks: ti.i32):
    """commit() after appends overflowed, in one launch (the path of a simulation step, where some list among
    millions outgrows its chunks almost every step): every list whose length outgrew its chunks claims a new run
    with headroom (_claim_run), then the parked elements move home and the overflow area empties
    (move_overflow_home), and the outcome goes to _scalars[7] (_claims_end)."""
    _claims_begin(v)
    for i in range(v.num_arrays):
        m = v._grow_target(i, v.length_field[i], 1)
        if m > 0:
            _claim_run(v, i, m, pool_chunks)
    move_overflow_home(v)
    _claims_end(v)


@ti.kernel
def k_commit_device(v: ti.template(), pool_chunks: ti.i32, status: _i32_nd, slot: ti.i32, failed_at: ti.template(),
                    tag: ti.i32):
    """commit() decided on the device, for Batch: no host read. Lists that outgrew their chunks claim new runs at the
    pool's bump and the parked elements move home, as in _k_commit. What only the host can fix is left to it, with
    every list left readable: if some list found the pool full, or more appends overflowed than the overflow area
    holds (then nothing is claimed), every list keeps only the elements in its own storage (length clamped to
    capacity(i): each element it then shows is one that was appended) and the overflow area empties. status[slot]
    = 0 when every append is home, else the number of appends that overflowed, and then failed_at[None] (a 0-d i32
    field) = min(itself, tag). The bump is repaired as Growth._after_claims does. With runs="ordered" a list can
    grow only through a re-layout of the whole pool, on the host: any overflow is then a failure, handled as a
    full pool."""
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
            # home only if the list has room for it now (a list that found the pool full has not), and drop a slot
            # past the length (the list was emptied since), as move_overflow_home does
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
def _k_chunks_needed(v: ti.template()) -> ti.i32:
    """Pool chunks the lists' current lengths need (what trim() keeps)."""
    total = 0
    for i in range(v.num_arrays):
        total += ti.min(v._chunks_of(i), v._chunks_for(v.length_field[i]))
    return total


@ti.kernel
def _k_target_keep(v: ti.template(), moved: _i32_nd, target: _i32_nd):
    for i in range(v.num_arrays):
        target[i] = ti.max(moved[i], v._chunks_of(i))


@ti.kernel
def _k_relayout_to_tmp(v: ti.template(), n_old: ti.i32, target: _i32_nd, new_start: _i32_nd, tmp_base: ti.i32):
    """Copy every list's first target[i] chunks to their place in the compacted layout (list order), whole elements
    at a time: one kernel whatever the dtype, so a growth compiles nothing new."""
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
        # runs in list order: the run starts are the whole table (list i's chunk count is the gap to the next start;
        # new_start[n] = total closes the last), and table_owner the owner of every HINT_EVERY-th chunk.
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
def _k_held(v: ti.template(), held: _i32_nd):
    """held[i]: the elements list i holds in its own storage (the rest, if any, wait in the overflow area)."""
    for i in range(v.num_arrays):
        held[i] = ti.min(v.length_field[i], v.capacity(i))


@ti.kernel
def _k_pack_to_tmp(v: ti.template(), offsets: _i32_nd, held: _i32_nd):
    """Every held element to relayout_tmp in list order (CSR), a flat coalesced pass over the storage."""
    for e in range(v.flat_size()):
        i, k = v.flat_index(e)
        if i >= 0 and k < held[i]:
            v.relayout_tmp[offsets[i] + k] = v.store[e]


@ti.kernel
def _k_unpack_from_tmp(v: ti.template(), offsets: _i32_nd, held: _i32_nd):
    """The inverse of _k_pack_to_tmp, into the VLA's (new) layout."""
    for i in range(v.num_arrays):
        for k in range(held[i]):
            v.store[v._addr(i, k)] = v.relayout_tmp[offsets[i] + k]


@ti.kernel
def _k_permute(v: ti.template(), order: ti.template(), first: ti.i32, count: ti.i32, meta: _i32_nd):
    """Lists first + k take lists first + order[k] (k < count): length, chunk run and inline elements. The old
    values are staged first (meta: 3 * count entries, relayout_tmp: count * inline_capacity elements); the launch's
    loops run one after the other."""
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


@ti.kernel
def k_nd_to_lengths(v: ti.template(), src: _i32_nd):
    for i in range(v.num_arrays):
        v.length_field[i] = src[i]


@ti.kernel
def k_lengths_to_nd(v: ti.template(), out: _i32_nd):
    for i in range(v.num_arrays):
        out[i] = v.length_field[i]


# ----------------------------------------------------------------------------------------------------
# The host side
# ----------------------------------------------------------------------------------------------------
def check_reserve(name, num_arrays, inline_capacity, chunk_size, lengths) -> np.ndarray:
    """Per-list lengths to reserve as int32, refused (VLACapacityError) before anything is allocated when the slots
    they need (inline tier and whole chunks) exceed the 32-bit index space; an int is a pool reserve."""
    if np.ndim(lengths) == 0:
        pool = -(-int(lengths) // chunk_size) * chunk_size
        total = int(lengths)
    else:
        lengths = np.asarray(lengths, dtype=np.int64)
        pool = int(np.sum(-(-np.maximum(lengths - inline_capacity, 0) // chunk_size))) * chunk_size
        total = int(lengths.sum())
    pool = max(pool, chunk_size)   # (the pool holds at least one chunk)
    if num_arrays * inline_capacity + pool > I32_MAX:
        raise VLACapacityError(
            f"VLA {name!r}: {num_arrays} lists x {inline_capacity} inline slots and a pool of {pool} slots (chunk_size "
            f"{chunk_size}, a reserve of {total} elements) exceed the 32-bit index space ({I32_MAX} slots); lower "
            f"chunk_size or the reserve, or split the lists over several VLAs")
    return None if np.ndim(lengths) == 0 else lengths.astype(np.int32)


class Growth:
    """commit, clear_all, trim, reserve and permute of :class:`vla.VLA` (a mixin)."""

    # Work buffers of the host-side paths (growth through the host, compaction, trim, reserve, the transfers): a
    # list's worth of i32 each, given back when the operation ends, because those paths allocate and copy far more
    # than these anyway, and a VLA read back once would otherwise hold 8 bytes a list for good. The others stay for
    # reuse: launch's and Batch's snapshots (every call) and permute()'s buffer.
    _TRANSIENT_SCRATCH = ("demand", "moved", "target", "new_start", "parked", "kept", "held", "retune_offsets",
                          "lengths_out", "csr_offsets")

    def commit(self):
        """Make every element appended since the last commit readable; grow capacity as needed.

        Costs one scalar read when nothing overflowed, else one launch and a second read (unless some list found
        the pool full: then the host compacts and grows the pool). Raises VLAOverflowError (after growing to the
        demand) if the overflow area could not hold all overflowed elements; the VLA's lists then hold only part of
        what was appended: run the kernel again (vla.launch does) or clear and refill.
        """
        self._check_program()
        self._known_empty = False
        n_ovf = int(self._scalars[0])
        self._last_parked = n_ovf
        if n_ovf == 0:
            self._quiet += 1
            if self._auto_runs and self.runs == "bump" and self._quiet == self._quiet_needed and not self._lost \
                    and self._quiet_needed:
                self._settle()
            return
        self._quiet = 0
        ovf_cap = self._caps["ovf_value"]
        self.overflow_events += 1
        if n_ovf > ovf_cap:
            self._commit_lost(n_ovf, ovf_cap)
        # bump: one launch and one scalar read; lists grow at the pool's end on the device, then the parked elements
        # move home (and the overflow area empties) unless some list found the pool full.
        # ordered: a list grows only through a re-layout of the pool, on the host's side.
        if self.runs == "ordered" or not self._commit_on_device():
            demand = self._scratch_nd("demand", self.num_arrays)
            k_lengths_to_nd(self, demand)
            self._grow_to(demand, headroom=True)  # (counts the growth)
            k_move_overflow_home(self)
            self._release_transient_scratch()

    def _commit_lost(self, n_ovf, ovf_cap):
        """commit() after more appends overflowed than the overflow area holds. Which slots the lost ones had is not
        known, so a list that lost any keeps only the elements in its own storage (its length cut to its capacity:
        each element it then shows is one that was appended); the others keep everything. Capacity and the overflow
        area grow to the demand, so that running the kernel again fits. Host reads raise until the whole VLA is
        refilled (clear_all, from_csr): vla.launch never gets here, it rolls back and re-runs. Raises
        VLAOverflowError."""
        demand = self._scratch_nd("demand", self.num_arrays)
        k_lengths_to_nd(self, demand)
        parked = self._scratch_nd("parked", self.num_arrays)
        kept = self._scratch_nd("kept", self.num_arrays)
        _k_complete_lengths(self, parked, kept)
        # No per-list headroom: this is a fill that outran the overflow area (a first fill from empty, typically),
        # whose demand is the lengths themselves; the pool keeps its headroom for lists that grow later.
        self._grow_to(demand, headroom=False)
        # Every parked append goes home, those of cut lists too: launch() rolls lengths back to before its call, and
        # appends parked before the call (always among those kept: they came first) must then be there.
        k_move_overflow_home(self)
        k_nd_to_lengths(self, kept)
        self._release_transient_scratch()
        new_cap = bucket(n_ovf * 1.1)
        self._regrow("ovf_value", self._store_dtype, new_cap)
        self._regrow("ovf_meta", ti.types.vector(2, ti.i32), new_cap)
        self._scalars[1] = new_cap
        self._lost = n_ovf - ovf_cap
        raise VLAOverflowError(
            f"VLA {self.name!r}: a kernel appended {n_ovf} elements beyond the lists' reserved chunks, but the "
            f"overflow area holds {ovf_cap}; {n_ovf - ovf_cap} were lost, and the lists keep only what reached their "
            f"storage; reads raise until it is refilled. Capacity has grown to the demand: clear_all() (or from_csr()) "
            f"and fill it again, through vla.launch(), which rolls back and re-runs a kernel instead of losing "
            f"appends.", appended=n_ovf, overflow_capacity=ovf_cap, lost=n_ovf - ovf_cap)

    def _check_complete(self, what: str):
        """Refuse to read back a VLA that lost appends (see _commit_lost)."""
        if self._lost:
            raise VLAOverflowError(
                f"VLA {self.name!r}.{what}: {self._lost} appends to this VLA were lost by a kernel run without "
                f"vla.launch, so its lists are incomplete; refill it before reading it back: clear_all() and run the "
                f"kernel again through vla.launch, or from_csr()", lost=self._lost)

    def clear_all(self):
        """Empty every list; reserved chunks stay with their lists (lazy release)."""
        self._check_program()
        k_clear_all(self)
        self._lost = 0
        self._known_empty = True

    def trim(self, slack=None) -> bool:
        """Compact the pool, release every chunk the current lengths do not need, shrink the overflow area back to
        its initial size and free the kept work buffers (allocated again when next needed). Returns True.

        slack (a number > 1): the lazy release. Only when the pool holds more than `slack` times what the current
        lengths need with the pool's growth headroom (1.1-1.2x), or than the pool the VLA was made with (reserve=),
        and then keeping the larger of the two, so that lists refilled to about the same lengths do not grow the
        pool again at once. For lists refilled again and again, whose capacity creeps up with the peaks they met
        (a simulator's contact lists): a caller may ask as often as it likes, as each time it finds nothing to
        release costs a commit, one reduction and one read. Returns whether it released."""
        self.commit()
        if slack is not None:
            if not slack > 1.0:
                raise ValueError(f"VLA {self.name!r}.trim: slack must be > 1, got {slack!r}")
            if self._caps["pool_chunks"] <= slack * self._roomy_pool(int(_k_chunks_needed(self))):
                return False
        target = self._scratch_nd("target", self.num_arrays)
        _k_target_trim(self, target)
        self._relayout(target, shrink=True, headroom=slack is not None)
        self._release_transient_scratch()
        self._shrink_overflow(self._default_ovf)
        self._overflow_given_back = False
        self._scratch.clear()
        self._scanner.release()
        return True

    def _roomy_pool(self, chunks) -> int:
        """The pool a lazy release keeps for lists that need `chunks` chunks: with the growth headroom, and at least
        what reserve= asked for (held in elements: the chunk size may change)."""
        reserved = -(-self._reserved_elements // self.chunk_size)
        return max(bucket(chunks * POOL_HEADROOM, POOL_STEPS_PER_OCTAVE), reserved)

    def _shrink_overflow(self, cap) -> bool:
        """Give the overflow area back down to `cap` slots (never below its initial size) when it is larger; True if
        it did. Only right after a commit, when it is empty."""
        cap = max(self._default_ovf, int(cap))
        if self._caps["ovf_value"] <= cap:
            return False
        self._regrow("ovf_value", self._store_dtype, cap)
        self._regrow("ovf_meta", ti.types.vector(2, ti.i32), cap)
        self._scalars[1] = cap
        return True

    def reserve(self, lengths):
        """Pre-assign capacity so each list i can hold lengths[i] elements without overflow."""
        self._check_program()
        lengths = np.asarray(lengths)
        if lengths.shape != (self.num_arrays,) or not np.issubdtype(lengths.dtype, np.integer) or (lengths < 0).any():
            raise ValueError(f"VLA {self.name!r}.reserve: need {self.num_arrays} non-negative integer lengths, "
                             f"got {lengths.dtype} {lengths.shape}")
        self._reserve_for(lengths)

    def permute(self, order, first=0, count=None):
        """Reorder lists in place: list first + k becomes what list first + order[k] was (k < count), with its
        elements and its capacity (the chunks it owns go with it, so memoised capacity follows the data and nothing
        is allocated). order: i32 Taichi field holding a permutation of 0..count-1 in its first count entries. first:
        an int, or a sequence of ints to permute several disjoint ranges of count lists by the same order (one
        staging buffer for all). Cost: the lists' inline parts and chunk tables; pool elements do not move. Appends
        still in the overflow area are committed first. Not available with runs="ordered"."""
        self._check_program()
        firsts = [int(first)] if isinstance(first, (int, np.integer)) else [int(f) for f in first]
        count = self.num_arrays - firsts[0] if count is None else int(count)
        ends = sorted((f, f + count) for f in firsts)
        for f, e in ends:
            if f < 0 or count < 0 or e > self.num_arrays:
                raise ValueError(f"VLA {self.name!r}.permute: lists [{f}, {e}) outside [0, {self.num_arrays})")
        if any(a[1] > b[0] for a, b in zip(ends, ends[1:])):
            raise ValueError(f"VLA {self.name!r}.permute: ranges of {count} lists from {firsts} overlap")
        if self.runs == "ordered" and self._auto_runs:   # (it settled into ordered runs: back to bump for this)
            self.commit()
            held = self._scratch_nd("held", self.num_arrays)
            k_lengths_to_nd(self, held)
            held_np = held.to_numpy()[:self.num_arrays]
            best = self._best_layout(held_np, "bump")
            self._quiet = 0
            self._relayout_as(best[1], best[2], "bump", held_np, held)
            self._release_transient_scratch()
        if self.runs == "ordered":
            raise ValueError(f"VLA {self.name!r}.permute: lists with runs='ordered' keep their runs in list order, "
                             f"which a permutation would break; create the VLA with runs='bump' to permute it")
        if count == 0:
            return
        self.commit()
        meta = self._scratch_nd("permute_meta", 3 * count)
        staged = count * self.inline_capacity
        # The staging for the inline parts is the re-layout's (its own tree, so a regrow usually recompiles nothing:
        # vla.taichi_compat); it is given back afterwards, as after a re-layout. Allocating it costs more than the
        # permutation (H200, 1M lists of 5 inline 48-byte records: ~12 ms of host time per allocation and release,
        # against 0.7-1 ms of kernels), hence several ranges per call.
        if self._caps["relayout_tmp"] < staged:
            self._regrow("relayout_tmp", self._store_dtype, staged)
        for f in firsts:
            _k_permute(self, order, f, count, meta)
        if self._caps["relayout_tmp"] > 1:
            self._regrow("relayout_tmp", self._store_dtype, 1)

    # ------------------------------------------------------------------ kernel-side internals
    @ti.func
    def _grow_target(self, i, demand, headroom):
        """Chunks list i gets if it must grow to hold ``demand`` elements, else 0. With headroom, a growing list gets
        25% (rounded down to whole chunks) more than it needs, so that a list that creeps upwards frame after frame
        grows O(log) times once it holds 4 chunks or more (before that, once per chunk), not every frame. No minimum
        of one extra chunk: for the short lists that dominate (a contact list needs 1-3 chunks) that minimum doubled
        the reserved memory, and a list that grows is moved on the device without a host round trip (_k_commit)."""
        need = self._chunks_for(demand)
        m = 0
        if need > self._chunks_of(i):
            m = need
            if headroom:
                m = need + need // 4
        return m

    # ------------------------------------------------------------------ host-side internals
    def _release_transient_scratch(self):
        for key in self._TRANSIENT_SCRATCH:
            self._scratch.pop(key, None)

    def _owner_len(self, pool_chunks):
        """Entries of table_owner: one per chunk (bump), or one per HINT_EVERY chunks and one past the last (ordered)."""
        return (pool_chunks >> self._hint_shift) + 2 if self.runs == "ordered" else pool_chunks

    def _regrow(self, attr, dtype, new_len):
        """Replace field ``attr`` with an empty one of ``new_len`` entries (callers copy what they keep)."""
        field, tree, recompiled = taichi_compat.replace(self._trees[attr], dtype, new_len,
                                                        f"VLA {self.name!r}: {attr}", self._debug)
        setattr(self, attr, field)
        self._trees[attr] = tree
        self._caps[attr] = new_len
        if recompiled:
            self.recompile_events += 1

    def _commit_on_device(self) -> bool:
        _k_commit(self, self._caps["pool_chunks"])
        return self._after_claims()

    def _reserve_for(self, lengths_np):
        lengths_np = check_reserve(self.name, self.num_arrays, self.inline_capacity, self.chunk_size, lengths_np)
        demand = self._scratch_nd("demand", self.num_arrays)
        demand.from_numpy(lengths_np)
        self._grow_to(demand, headroom=False)
        self._release_transient_scratch()

    def _after_claims(self) -> bool:
        """After a kernel that ran claims (_k_commit, _k_claim_runs): one scalar read of their outcome; counts a
        growth if any list moved. Returns False when some list found the pool full; the bump is then set back to
        the pool's end (the chunks between the last successful run and the end were never assigned: owner -1,
        skipped by every walk) and the caller must compact."""
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

        Lists that must grow claim a new run of chunks at the end of the pool (cost: their own elements); only when
        the pool is full does everything compact into a larger pool (cost: the whole pool). runs="ordered": every
        growth is such a compaction. Counts one growth event if any list grew."""
        n = self.num_arrays
        moved = self._scratch_nd("moved", n)
        if _k_grow_targets(self, demand, int(headroom), moved) == 0:
            return
        if self._retune(demand):
            self.grow_events += 1
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

    def _retuned_layout(self, demand_np):
        """(inline_capacity, chunk_size) the VLA should change to for these demanded lengths, or None: it keeps its
        layout if it chose none of its sizes, or if the best layout (vla.tuning's model, keeping any size the caller
        gave) saves less than RETUNE_GAIN."""
        if not (self._auto_inline or self._auto_chunk):
            return None
        vals, counts = histogram(demand_np)
        now = modeled_bytes(vals, counts, self.inline_capacity, self.chunk_size, self.dtype, self.runs)
        best = self._best_layout(demand_np, self.runs)
        if best[0] * RETUNE_GAIN > now:
            return None
        return best[1], best[2]

    def _retune(self, demand) -> bool:
        """Re-lay the VLA out with the inline capacity and chunk size that suit the demanded lengths (demand, an i32
        ndarray of num_arrays), if it chooses its own and the gain is worth it (_retuned_layout); returns whether it
        did (see _relayout_as). A VLA that settled into runs="ordered" (_settle) goes back to "bump" here: its lists
        grow again."""
        n = self.num_arrays
        if not (self._auto_inline or self._auto_chunk):
            return False
        # (a reserve may ask for less than a list holds, or has parked: the new layout keeps room for all of it)
        held = self._scratch_nd("held", n)
        k_lengths_to_nd(self, held)
        demand_np = np.maximum(demand.to_numpy()[:n], held.to_numpy()[:n])
        if self._auto_runs and self.runs == "ordered":
            # it grows again: settle later next time, and not at all once its lengths proved to vary twice (each
            # change of runs compiles every kernel again)
            self._settle_reverts += 1
            self._quiet_needed = 0 if self._settle_reverts >= SETTLE_REVERTS else 2 * self._quiet_needed
            self._quiet = 0
            choice = self._best_layout(demand_np, "bump")
            return self._relayout_as(choice[1], choice[2], "bump", demand_np, held)
        choice = self._retuned_layout(demand_np)
        if choice is None:
            self._scratch.pop("held", None)
            return False
        return self._relayout_as(choice[0], choice[1], self.runs, demand_np, held)

    def _best_layout(self, demand_np, runs):
        """(modeled bytes, inline_capacity, chunk_size) of the layout that reserves least for these lengths with
        these runs, keeping any size the caller gave (vla.tuning's model)."""
        vals, counts = histogram(demand_np)
        best = None
        for ic in INLINE_OPTIONS if self._auto_inline else (self.inline_capacity,):
            for cs in CHUNK_OPTIONS if self._auto_chunk else (self.chunk_size,):
                b = modeled_bytes(vals, counts, ic, cs, self.dtype, runs)
                if best is None or b < best[0]:
                    best = (b, ic, cs)
        return best

    def _relayout_as(self, ic, cs, runs, demand_np, held) -> bool:
        """Re-lay the VLA out with these sizes and runs: every list gets exactly the chunks its demand (demand_np,
        numpy, at least what it holds) needs, in list order, and the pool ~10-20% headroom (POOL_HEADROOM, bucketed;
        none for runs="ordered", whose lists grow only through another re-layout). `held`: the lists' stored lengths
        (an i32 ndarray, k_lengths_to_nd). The elements in the lists' own storage go through relayout_tmp in list
        order; those parked in the overflow area stay there, for the caller's move home. The sizes and runs are
        compile-time constants of every kernel that uses the VLA, so all compiled kernels are dropped and compile
        again on their next launch. Returns False, changing nothing, if the layout would not fit 32-bit indices."""
        n = self.num_arrays
        # the new layout's tables first: a size past 32-bit indices keeps the current layout, untouched
        need = (np.maximum(demand_np.astype(np.int64) - ic, 0) + cs - 1) // cs
        chunks = int(need.sum())
        cap = max(1, chunks if runs == "ordered" else bucket(chunks * POOL_HEADROOM, POOL_STEPS_PER_OCTAVE))
        try:
            check_reserve(self.name, n, ic, cs, demand_np)
        except VLACapacityError:
            self._scratch.pop("held", None)
            return False
        if n * ic + cap * cs > I32_MAX:
            self._scratch.pop("held", None)
            return False
        target = self._scratch_nd("target", n)
        target.from_numpy(need.astype(np.int32))
        new_start = self._scratch_nd("new_start", n + 1)
        self._scanner.exclusive(target, n, new_start)
        _k_held(self, held)
        offsets = self._scratch_nd("retune_offsets", n + 1)
        self._scanner.exclusive(held, n, offsets)
        total = int(offsets[n])
        self._regrow("relayout_tmp", self._store_dtype, max(1, total))
        if total:
            _k_pack_to_tmp(self, offsets, held)
        # the new storage is allocated before the sizes change, so that a refused allocation leaves them as
        # they were
        self._regrow("store", self._store_dtype, n * ic + cap * cs)
        runs_changed = runs != self.runs
        self.runs = runs
        self._regrow("table_owner", ti.i32, self._owner_len(cap))
        if runs_changed:
            self._regrow("table_chunks", ti.i32, 1 if runs == "ordered" else n)
        self.inline_capacity, self.chunk_size = int(ic), int(cs)
        self._chunk_shift = self.chunk_size.bit_length() - 1
        self._n_inline = self.inline_capacity * n
        self._caps["pool_chunks"] = cap
        taichi_compat.program_kernels_changed()
        self.recompile_events += 1
        self.retune_events += 1
        self.compact_events += 1
        _k_relayout_table(self, new_start, target, chunks, cap)
        self._scalars[2] = chunks
        if total:
            _k_unpack_from_tmp(self, offsets, held)
        self._regrow("relayout_tmp", self._store_dtype, 1)
        return True

    def _settle(self):
        """Lazy release (a commit that found nothing to grow, QUIET_COMMITS in a row): a VLA that chooses its own
        layout and runs re-lays itself out with runs="ordered" and no headroom when the model says that reserves at
        most 1/RETUNE_GAIN of what it holds now: its lists keep their lengths, so the growth headroom and the bump
        runs' per-list and per-chunk metadata (8 bytes a list, 4 a chunk) go back. Also right after the first fill
        from empty (vla.launch), which knows every length. A later growth goes back to "bump" (_retune), and the next
        settling waits twice as long; after SETTLE_REVERTS such growths it stays "bump"."""
        n = self.num_arrays
        held = self._scratch_nd("held", n)
        k_lengths_to_nd(self, held)
        held_np = held.to_numpy()[:n]
        best = self._best_layout(held_np, "ordered")
        now = self.stats()["reserved_bytes"]
        if best[0] * RETUNE_GAIN > now or not self._relayout_as(best[1], best[2], "ordered", held_np, held):
            self._scratch.pop("held", None)
        self._release_transient_scratch()

    def _relayout(self, target, shrink, headroom=False):
        """Compact the pool: target[i] chunks for list i, in list order, keeping every list's data (up to target[i]
        chunks). The pool grows (to 1.1-1.2x the demand) if less than ~10% of it would stay free, or shrinks if
        asked: to fit, or with headroom to 1.1-1.2x the demand (at least the pool it was made with). Each growth
        copies the whole store: a pool whose demand keeps rising re-lays itself out about every 10% of growth (more
        often than with x1.5 steps, for less memory)."""
        n = self.num_arrays
        self.compact_events += 1
        new_start = self._scratch_nd("new_start", n + 1)
        self._scanner.exclusive(target, n, new_start)
        total = int(new_start[n])
        n_old = int(self._scalars[2])   # chunks handed out: [0, n_old); holes among them have owner -1
        cs = self.chunk_size
        cap = self._caps["pool_chunks"]
        # Grow before the pool is full, so that a compaction leaves room for the growths that follow.
        roomy = bucket(total * POOL_HEADROOM, POOL_STEPS_PER_OCTAVE)
        fit = self._roomy_pool(total) if headroom else total
        regrow = total > cap or (shrink and fit < cap) or (not shrink and total * POOL_HEADROOM > cap)
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
            cap = max(1, fit if shrink else roomy)
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
