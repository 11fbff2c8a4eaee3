"""Contacts: per-body contact lists behind one kernel-side interface, and the contact record.

Every storage offers the same ``@ti.func`` methods, so the narrowphase and solver kernels take the storage
as ``ti.template()`` and compile against whichever one the scene picked (``sim.contacts``):

    slot = lists.append(i, x)   # thread-safe; returns x's index in list i
    lists.length(i); lists.get(i, k); lists.set(i, k, x); lists.clear(i)
    lists.get_member(i, k, "impulse_n"); lists.set_member(i, k, "impulse_n", x)   # one member of a record
    lists.set_members(i, k, rec, ("impulse_n", "impulse_t"))   # those members of the record value rec

and the host methods ``commit()``, ``clear_all()``, ``lengths()``, ``stats()``.

* ``vla``: :class:`vla.VLA` itself (inline tier + chunk pool; never loses an element when appends run
  through :func:`vla.launch`).
* ``padded``: :class:`PaddedLists`, a fixed per-list maximum with an atomic counter. Appends past the
  maximum are dropped and *counted* (``overflow_count``); the simulation reports them on stderr and in
  metrics.
* ``dynamic``: :class:`DynamicLists`, Taichi's ``dynamic`` SNode (memory allocated chunk by chunk as a
  list grows, up to a maximum). Writes past the maximum would silently go nowhere in Taichi, so they are
  counted the same way.

Warm starting needs last step's contacts while this step's are built, so a :class:`ContactSet` keeps two
generations in one storage of ``2 * body_capacity`` lists: body i's list in generation g is
``g * body_capacity + i``. Kernels receive the two bases as runtime integers, so flipping generations
never recompiles anything.
"""

import numpy as np
import taichi as ti

from app.errors import UserError
from app.sim.math3d import decode_normal
from vla import VLA, Batch

NO_FAILURE = Batch.NO_FAILURE

vec3 = ti.types.vector(3, ti.f32)
vec2 = ti.types.vector(2, ti.f32)

# One contact as seen from the body that owns the list.
#   point: vec3 m, world contact point (shared by both bodies' copies of a pair contact)
#   normal_code: i32, app.sim.math3d.encode_normal of the pair's normal as it pushes the pair's first body (the
#       lower body id, app.sim.model.Model.body_id; the body, for a plane contact): the same code in both copies.
#       record_normal(rec) gives the unit normal that pushes the list's owner (away from `other`); the second
#       body's copy's is the exact negative of the first's
#   depth: f32 m, penetration (> 0) or speculative gap (< 0, within the contact margin)
#   other: i32, the other body (stored index), or -1 - plane for a static plane
#   feature: i32, which geometric feature pair produced it (its low FEATURE_ID_BITS bits), with SECOND_COPY set in
#       the second body's copy: feature_key(feature) and other are the warm-start key. The 4 bits above the id:
#       its place among its pair's points (pair_place)
#   impulse_n: f32 N s, accumulated normal impulse
#   impulse_t: vec2 N s, accumulated friction impulse as coordinates along the tangents (t1, t2) that
#       app.sim.math3d.contact_tangents(normal) gives (2 floats instead of a vec3)
#   impulse_p: f32 N s, accumulated split (position) impulse; bias: f32 m/s, target normal velocity
# 48 bytes. Member order matters to the vla storage, which packs a record into six 64-bit words in this order
# (VLA layout "words"): (point.x, .y) (point.z, depth) (normal_code, bias) (other, feature)
# (impulse_n, impulse_t.x) (impulse_t.y, impulse_p). The solver's accumulated impulses then fill the last two
# words, which each iteration writes without reading them back, and the warm-start key (other, feature) is
# one load.
ContactRecord = ti.types.struct(point=vec3, depth=ti.f32, normal_code=ti.i32, bias=ti.f32, other=ti.i32,
                                feature=ti.i32, impulse_n=ti.f32, impulse_t=vec2, impulse_p=ti.f32)
CONTACT_RECORD_BYTES = 4 * (3 + 1 + 1 + 1 + 1 + 1 + 1 + 2 + 1)

# Set in `feature` of the second body's copy of a pair contact. Which copy a record is, not which of the two
# stored indices is lower, orients its normal: stored indices change when the bodies are re-sorted
# (app.sim.reorder), and a record read in the solver needs no body id loaded to know its sign.
SECOND_COPY = 1 << 30

# A pair's contact points (up to 4, one manifold) sit in consecutive slots of each of its two lists, in the same
# order in both (the narrowphase appends them with append_n), and are solved one after the other
# (app.sim.solver.solve_iteration). Each record says where in its pair it sits: its rank (0 .. count - 1) and
# the pair's count, in the two 2-bit fields above the feature id.
FEATURE_ID_BITS = 24
RANK_SHIFT = FEATURE_ID_BITS
COUNT_SHIFT = FEATURE_ID_BITS + 2
FEATURE_KEY_MASK = SECOND_COPY | ((1 << FEATURE_ID_BITS) - 1)


@ti.func
def feature_key(feature):
    """The warm-start part of a record's `feature` (the feature id and SECOND_COPY), without its place in its pair."""
    return feature & FEATURE_KEY_MASK


@ti.func
def pair_place(feature):
    """(rank, count): where a record sits among its pair's consecutive points, and how many the pair has."""
    return (feature >> RANK_SHIFT) & 3, ((feature >> COUNT_SHIFT) & 3) + 1


@ti.func
def with_place(feature, rank, count):
    """`feature` marked as point `rank` of a pair of `count` (1-4) points."""
    return feature | (rank << RANK_SHIFT) | ((count - 1) << COUNT_SHIFT)


@ti.func
def copy_normal(code, feature):
    """Unit vec3 normal, pushing the list's owner, of a record holding normal_code `code` and `feature`."""
    return ti.select((feature & SECOND_COPY) != 0, -1.0, 1.0) * decode_normal(code)


@ti.func
def record_normal(rec):
    """Unit vec3 normal of contact record rec: it pushes the owner of the list that holds rec."""
    return copy_normal(rec.normal_code, rec.feature)


@ti.func
def first_copy(rec):
    """True for a plane contact and for the first body's copy of a pair contact: counting these counts every
    contact point once."""
    return first_copy_feature(rec.feature)


@ti.func
def first_copy_feature(feature):
    """first_copy of the record whose feature member is `feature`."""
    return (feature & SECOND_COPY) == 0


def dynamic_pool_gb(num_arrays: int, max_length: int, chunk_size: int = 8,
                    element_bytes: int = CONTACT_RECORD_BYTES) -> float:
    """GB of Taichi's preallocated sparse-data pool (ti.init's ``device_memory_GB``, CUDA) that
    ``num_arrays`` dynamic lists of at most ``max_length`` elements may need: every list full (chunk-rounded),
    doubled for the allocator's own bookkeeping and granularity, plus Taichi's default 1 GB. The dynamic
    SNode's chunks come from that pool, which does not grow: when it runs dry the device asserts (pile_1m
    with the default 1 GB, H200). The bound is generous because it is taken up front and an undersized pool
    is a crash, not a slowdown."""
    return 1.0 + _doubled_full_gb(num_arrays, max_length, chunk_size, element_bytes)


def _doubled_full_gb(num_arrays, max_length, chunk_size, element_bytes) -> float:
    full = int(num_arrays) * (-(-int(max_length) // int(chunk_size)) * int(chunk_size)) * int(element_bytes)
    return 2.0 * full / 2**30


def _dtype_bytes(dtype) -> int:
    if dtype is ContactRecord:
        return CONTACT_RECORD_BYTES
    return 4


@ti.data_oriented
class _CountedLists:
    """What the padded and dynamic storages share: an atomic counter per list, a runtime maximum
    (``limit``, lowered without reallocating) and a count of appends dropped past it. Subclasses place
    ``data`` (indexed [list, slot]) and may extend ``clear``."""

    def _init_counters(self, num_arrays: int, dtype, max_length: int, name: str):
        self.num_arrays = int(num_arrays)
        self.max_length = int(max_length)
        self.dtype = dtype
        self.name = name
        self.element_bytes = _dtype_bytes(dtype)
        self.count = ti.field(ti.i32, self.num_arrays)
        self.overflow_count = ti.field(ti.i32, ())   # appends dropped by the fills a solver step consumed (cumulative)
        # appends dropped by the latest fill (kernel_narrowphase resets it as it starts, so a fill run again, see
        # app.sim.simulation.Simulation.advance, is not counted twice; kernel_prepare moves it into overflow_count)
        self.dropped_now = ti.field(ti.i32, ())
        self.limit = ti.field(ti.i32, ())            # runtime maximum <= max_length (lower it without reallocating)
        self.limit[None] = self.max_length

    @ti.func
    def append(self, i, x):
        slot = ti.atomic_add(self.count[i], 1)
        self.put(i, slot, x)
        return slot

    @ti.func
    def append_n(self, i, n):
        """n consecutive slots of list i (vla.VLA.append_n); the first one's index."""
        return ti.atomic_add(self.count[i], n)

    @ti.func
    def put(self, i, slot, x):
        """x into a slot append_n reserved, or dropped (and counted) past the maximum."""
        if slot < self.limit[None]:
            self.data[i, slot] = x
        else:
            ti.atomic_add(self.dropped_now[None], 1)

    @ti.func
    def length(self, i):
        return ti.min(self.count[i], self.limit[None])

    @ti.func
    def get(self, i, k):
        return self.data[i, k]

    @ti.func
    def set(self, i, k, x):
        self.data[i, k] = x

    @ti.func
    def get_member(self, i, k, name: ti.template()):
        return ti.static(self.data.field_dict[name])[i, k]

    @ti.func
    def set_member(self, i, k, name: ti.template(), x):
        ti.static(self.data.field_dict[name])[i, k] = x

    @ti.func
    def set_members(self, i, k, x, names: ti.template()):
        for name in ti.static(names):
            ti.static(self.data.field_dict[name])[i, k] = x[name]

    def commit(self):
        pass

    def lengths(self) -> np.ndarray:
        return np.minimum(self.count.to_numpy(), int(self.limit[None])).astype(np.int32)

    def overflowed(self) -> int:
        return int(self.overflow_count[None]) + int(self.dropped_now[None])

    @ti.func
    def dropped_total(self):
        """overflowed() inside a kernel (app.sim.diagnostics.kernel_frame_readout)."""
        return self.overflow_count[None] + self.dropped_now[None]


@ti.data_oriented
class PaddedLists(_CountedLists):
    """``num_arrays`` lists of at most ``max_length`` elements each: data[num_arrays, max_length] and an atomic
    counter per list. Memory is num_arrays * max_length * element bytes whatever the lists hold."""

    kind = "padded"

    def __init__(self, num_arrays: int, dtype, max_length: int, name="padded"):
        self._init_counters(num_arrays, dtype, max_length, name)
        self.data = dtype.field(shape=(self.num_arrays, self.max_length)) if dtype is ContactRecord else \
            ti.field(dtype, shape=(self.num_arrays, self.max_length))

    @ti.func
    def clear(self, i):
        self.count[i] = 0

    def clear_all(self):
        self.count.fill(0)

    def stats(self) -> dict:
        live = int(self.lengths().sum())
        reserved = self.num_arrays * self.max_length
        return {"arrays": self.num_arrays, "live_elements": live, "reserved_elements": reserved,
                "live_bytes": live * self.element_bytes,
                "reserved_bytes": reserved * self.element_bytes + 4 * self.num_arrays,
                "max_length": self.max_length, "overflow_total": self.overflowed()}


@ti.data_oriented
class DynamicLists(_CountedLists):
    """Lists in a Taichi ``dynamic`` SNode under a dense axis: each list's memory is allocated in chunks of
    ``chunk_size`` as it grows, up to ``max_length``. Our own atomic counter gives the slot (Taichi's
    ``ti.append`` handles only a single scalar field) and counts writes past the maximum, which the
    SNode would drop without a word."""

    kind = "dynamic"

    def __init__(self, num_arrays: int, dtype, max_length: int, chunk_size: int = 8, name="dynamic"):
        self.chunk_size = int(chunk_size)
        self._init_counters(num_arrays, dtype, max_length, name)
        _check_sparse_pool(self.num_arrays, self.max_length, self.chunk_size, self.element_bytes)
        self.data = dtype.field() if dtype is ContactRecord else ti.field(dtype)
        self.block = ti.root.dense(ti.i, self.num_arrays).dynamic(ti.j, self.max_length, chunk_size=self.chunk_size)
        self.block.place(self.data)

    @ti.func
    def clear(self, i):
        # Taichi's dynamic SNode keeps the chunks of a deactivated list in its allocator for reuse.
        ti.deactivate(self.block, ti.cast(i, ti.i32))
        self.count[i] = 0

    def clear_all(self):
        kernel_clear_lists(self, 0, self.num_arrays)

    def stats(self) -> dict:
        lengths = self.lengths()
        live = int(lengths.sum())
        # Chunks the live lists occupy: a lower bound on what the SNode allocator holds (it keeps freed chunks).
        chunks = int(np.ceil(lengths / self.chunk_size).sum())
        return {"arrays": self.num_arrays, "live_elements": live, "reserved_elements": chunks * self.chunk_size,
                "live_bytes": live * self.element_bytes,
                "reserved_bytes": chunks * self.chunk_size * self.element_bytes + 4 * self.num_arrays
                + 8 * self.num_arrays,  # + our counter + the SNode's per-list chunk pointer/length
                "reserved_bytes_note": "estimate: chunks needed by the current lengths",
                "max_length": self.max_length, "chunk_size": self.chunk_size, "overflow_total": self.overflowed()}


def sparse_pool_problem(num_arrays, max_length, chunk_size, element_bytes, pool_gb) -> str | None:
    """Why a sparse-data pool of pool_gb GB may be too small for these dynamic lists, naming the knob; None
    if it holds twice their worst case (the size run.py picks, dynamic_pool_gb, adds 1 GB on top: a small
    scene runs under Taichi's default 1 GB)."""
    if pool_gb >= _doubled_full_gb(num_arrays, max_length, chunk_size, element_bytes):
        return None
    need = dynamic_pool_gb(num_arrays, max_length, chunk_size, element_bytes)
    return (f"sim.contacts: dynamic: {num_arrays} lists of up to {max_length} contacts may need {need:.1f} GB of "
            f"Taichi's sparse-data pool, but Taichi was started with {pool_gb:g} GB (ti.init's "
            f"device_memory_GB). Start it with device_memory_GB >= {need:.1f} (or set the environment variable "
            f"TI_DEVICE_MEMORY_GB={need:.1f}); run.py does this itself when it starts Taichi for a dynamic scene.")


def _check_sparse_pool(num_arrays, max_length, chunk_size, element_bytes):
    """Raise UserError if Taichi's sparse-data pool (CUDA) may be too small for these dynamic lists: better
    than the device-side assert that its exhaustion gives, thousands of steps later."""
    from taichi.lang import impl

    cfg = impl.current_cfg()
    if cfg.arch != ti.cuda or cfg.device_memory_fraction > 0:  # CPU: host memory; a fraction: the user sized it
        return
    problem = sparse_pool_problem(num_arrays, max_length, chunk_size, element_bytes, cfg.device_memory_GB)
    if problem:
        raise UserError(problem)


# A VLA storage's pool is compacted (ContactSet.release_unused) when it holds more than this times what the lists'
# current records need with the pool's growth headroom. A 5,000-body slice of pile_1m (CPU), landed: the pool held
# 2.1x what its records needed, 2.31x the live bytes in all.
RELEASE_SLACK = 1.25


@ti.kernel
def kernel_clear_lists(lists: ti.template(), start: ti.i32, stop: ti.i32):
    """Empty lists[start:stop] (capacity kept)."""
    for i in range(start, stop):
        lists.clear(i)


def make_lists(kind: str, num_arrays: int, dtype, max_length: int, pool_per_list: float = 1.0, name="lists"):
    """Build a list storage by name; an unknown name raises ValueError listing the valid ones.
    pool_per_list: VLA only, pool elements pre-allocated per list on average (beyond the inline ones)."""
    if kind == "vla":
        # Most bodies have a handful of contacts: keep 5 inline (a sphere on a floor, a box face on the floor) and
        # the rest in 4-element chunks, given out as lists need them (a landed pile has ~10 per body). A list that
        # outgrows its chunks is moved to a larger run at the end of the pool, a cost in proportion to the lists
        # that grew (the pool is re-laid out only when full), so no list is given chunks up front. The pool starts
        # with room for `pool_per_list` elements per list on average (unassigned), so a pile that forms does not
        # re-lay the pool out over and over while it grows from nothing (20 re-layouts in the first 250 steps of
        # pile_1m from a 1-chunk pool). ContactRecord is stored as 64-bit words (its members are 32-bit): the
        # narrowphase appends, and the solver reads, a record at a time, in 6 loads instead of 12. Why 5 inline:
        # neighbouring threads' lists 4 x 64 = 256 bytes apart were slower than 5 x 64 = 320 with 64-byte records
        # (a power-of-two stride between threads is the slow case); with the 48-byte record 6 and 8 inline were
        # not faster on the H200's pile_1m, and 4 spills more lists into the pool.
        return VLA(num_arrays, dtype, inline_capacity=5, chunk_size=4,
                   reserve=int(num_arrays * pool_per_list), name=name)
    if kind == "padded":
        return PaddedLists(num_arrays, dtype, max_length, name=name)
    if kind == "dynamic":
        return DynamicLists(num_arrays, dtype, max_length, name=name)
    raise ValueError(f"unknown contact storage {kind!r}; valid: vla | padded | dynamic")


@ti.func
def skipping(failed_step: ti.template()):
    """True while failed_step (ContactSet.failed_step, a 0-d i32 field) names a failed step awaiting its redo:
    the narrowphase and solver kernels then do nothing."""
    return failed_step[None] != NO_FAILURE


def lists_overflowed(lists) -> int:
    """Appends lost so far (0 for a VLA, which never loses one when driven through vla.launch)."""
    return lists.overflowed() if hasattr(lists, "overflowed") else 0


@ti.data_oriented
class ContactSet:
    """Two generations of per-body contact lists in one storage (see module docstring).

    lists: the storage (vla.VLA | PaddedLists | DynamicLists) of 2 * body_capacity ContactRecord lists.
    generation: 0 or 1, the generation being built this step; `base` / `prev_base` are its list offsets.
    failed_step: 0-d i32, the first step whose VLA commits failed on the device and that the host has not yet
        redone (vla.Batch.failed_at of the Simulation's batch), or Batch.NO_FAILURE. The narrowphase and the
        solver kernels do nothing while it is set (`skipping`), so that the steps launched after a failed one,
        before the host reads it, leave the state and last step's contacts as the redo needs them
        (app.sim.simulation.Simulation.advance).
    normal_warm: 0-d f32, the fraction of last step's normal impulse (times sim.warm_start) a support contact (its
        normal within app.sim.load_paths.SUPPORT_COS of up) starts from (app.sim.narrowphase._emit_contacts): 1, or
        app.sim.load_paths.NORMAL_WARM while the load-path correction runs (the solver sets it:
        JacobiSolver._switch_load_paths).
    """

    def __init__(self, kind: str, body_capacity: int, max_per_body: int = 32, pool_per_body: float = 1.0):
        self.kind = kind
        self.body_capacity = int(body_capacity)
        self.lists = make_lists(kind, 2 * self.body_capacity, ContactRecord, max_per_body,
                                pool_per_list=pool_per_body, name="contacts")
        self.generation = 0
        self.failed_step = ti.field(ti.i32, ())
        self.failed_step[None] = NO_FAILURE
        # impacts this step (app.sim.solver.impact_pass): bodies whose velocity an impact may change, per
        # impact iteration (ping-pong), their approaching contacts, and whether any contact impacts at all
        self.impact_dirty = ti.field(ti.i32, (2, self.body_capacity))
        self.impact_active = ti.field(ti.i32, self.body_capacity)
        self.impact_any = ti.field(ti.i32, ())
        self.normal_warm = ti.field(ti.f32, ())
        self.normal_warm[None] = 1.0

    @ti.func
    def skipping(self):
        """True while a failed step waits for its redo (see failed_step): kernels then do nothing."""
        return skipping(self.failed_step)

    @property
    def base(self) -> int:
        return self.generation * self.body_capacity

    @property
    def prev_base(self) -> int:
        return (1 - self.generation) * self.body_capacity

    def flip(self):
        """Make the other generation the one this step builds (host only; kernels get the bases as args).
        kernel_narrowphase empties that generation's lists itself; last step's stay for warm starting."""
        self.generation = 1 - self.generation

    def begin_step(self, body_count: int):
        """flip() and empty the new generation's lists, for callers that fill them without the narrowphase."""
        self.flip()
        kernel_clear_lists(self.lists, self.base, self.base + body_count)

    def set_limit(self, max_per_body: int):
        """Padded/dynamic: the per-body maximum in use (<= the allocated one); no effect on a VLA."""
        if hasattr(self.lists, "limit"):
            self.lists.limit[None] = min(int(max_per_body), self.lists.max_length)

    def reset(self):
        kernel_clear_lists(self.lists, 0, 2 * self.body_capacity)
        self.failed_step[None] = NO_FAILURE
        self.impact_dirty.fill(0)
        self.impact_any[None] = 0

    def lengths(self, body_count: int) -> np.ndarray:
        """Contacts per body in the current generation, (body_count,) int32."""
        lens = self.lists.lengths()
        return lens[self.base:self.base + body_count].astype(np.int32)

    def overflowed(self) -> int:
        return lists_overflowed(self.lists)

    def release_unused(self) -> bool:
        """The lazy release of a VLA storage (vla.VLA.trim with RELEASE_SLACK); True if it released. Between releases
        a list keeps the capacity it once needed: a settling pile's lists met higher counts while bodies landed,
        and moved to larger runs, leaving holes. Both generations are live (last step's contacts are the warm
        start), so each list keeps room for its own current records. Releasing keeps every record where it is in
        its list: the motion stays the same to the bit."""
        if self.kind != "vla":
            return False
        return self.lists.trim(slack=RELEASE_SLACK)

    def stats(self) -> dict:
        s = dict(self.lists.stats())
        s["kind"] = self.kind
        s["element_bytes"] = CONTACT_RECORD_BYTES   # the members; a vla stores each record in as many (6 words)
        return s
