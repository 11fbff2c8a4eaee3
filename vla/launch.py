"""Running kernels so that no append is ever lost: launch(), and Batch for launches checked with one host read."""
import inspect
import weakref

import numpy as np
import taichi as ti
from taichi.lang.kernel_impl import _BoundedDifferentiableMethod

from . import taichi_compat
from .array import LIVE, VLA
from .errors import VLAOverflowError
from .growth import bucket, k_clear_all, k_commit_device, k_nd_to_lengths

_i32_nd = ti.types.ndarray(dtype=ti.i32, ndim=1)


@ti.kernel
def _k_snapshot(v: ti.template(), out: _i32_nd):
    """Every length, and at [num_arrays] the overflowed appends not yet committed."""
    for i in range(v.num_arrays):
        out[i] = v.length_field[i]
    out[v.num_arrays] = v._scalars[0]


@ti.kernel
def _k_count_nonempty(v: ti.template()) -> ti.i32:
    """Lists with a length above 0, plus appends waiting in the overflow area."""
    c = v._scalars[0]
    for i in range(v.num_arrays):
        if v.length_field[i] != 0:
            c += 1
    return c


@ti.kernel
def _k_pending(v: ti.template(), out: _i32_nd):
    """The overflowed appends not yet committed, at out[0]."""
    out[0] = v._scalars[0]


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


# What a kernel can reach beyond its arguments: the globals and closure cells its code names (VLAs there, or held one
# attribute or container level down), and the same for every @ti.func / @ti.kernel / Python function it names. The
# walk over code runs once per function (_ROOTS); the names are looked up again at every launch, so a global rebound
# to another VLA is seen.
_ROOTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_SKIP_MODULES = ("taichi", "numpy", "vla.", "builtins")


def _python_function(fn):
    """(the Python function behind fn or None, the object a kernel method is bound to or None)."""
    owner = None
    if isinstance(fn, _BoundedDifferentiableMethod):
        owner, fn = fn._kernel_owner, fn._primal.func
    elif inspect.ismethod(fn):
        owner, fn = fn.__self__, fn.__func__
    if hasattr(fn, "_primal"):                            # @ti.kernel
        fn = fn._primal.func
    elif getattr(fn, "_is_taichi_function", False):       # @ti.func
        fn = fn.func.func
    if not inspect.isfunction(fn) and callable(fn) and inspect.ismethod(getattr(fn, "__call__", None)):
        return _python_function(fn.__call__)
    return (fn if inspect.isfunction(fn) else None), owner


def _code_names(code):
    names = set(code.co_names)
    for c in code.co_consts:
        if inspect.iscode(c):
            names |= _code_names(c)
    return names


def _roots(func, seen):
    """(places, attribute names): the (dict, key) pairs and closure cells whose values func's code can reach."""
    if func in _ROOTS:
        return _ROOTS[func]
    places, attrs = [], set()
    _ROOTS[func] = (places, attrs)   # (a recursion through func itself ends here)
    names = _code_names(func.__code__)
    attrs |= names
    spaces = [func.__globals__]
    for cell in func.__closure__ or ():
        places.append(cell)
    while spaces:
        space = spaces.pop()
        for name in names:
            if name not in space:
                continue
            obj = space[name]
            if inspect.ismodule(obj):
                if not obj.__name__.startswith(_SKIP_MODULES) and obj.__dict__ not in spaces and len(seen) < 64:
                    seen.add(id(obj))
                    spaces.append(obj.__dict__)
                continue
            if inspect.isclass(obj):
                continue
            inner, _ = _python_function(obj) if callable(obj) else (None, None)
            if inner is not None:
                if not (inner.__module__ or "").startswith(_SKIP_MODULES) and id(inner) not in seen:
                    seen.add(id(inner))
                    p, a = _roots(inner, seen)
                    places.extend(p)
                    attrs |= a
                continue
            places.append((space, name))
    return places, attrs


def reachable_vlas(fn) -> dict:
    """The VLAs fn can reach other than through its arguments: {id: VLA} (see _ROOTS above)."""
    found = {}
    func, owner = _python_function(fn)
    if owner is not None:
        _find_vlas(owner, found)
    if func is None:
        return found
    places, attrs = _roots(func, set())
    for place in places:
        try:
            obj = place.cell_contents if not isinstance(place, tuple) else place[0].get(place[1])
        except ValueError:   # (an empty cell)
            continue
        if obj is None or isinstance(obj, (int, float, str, bytes, np.ndarray)):
            continue
        _find_vlas(obj, found)
        fields = getattr(obj, "__dict__", None)
        if isinstance(fields, dict):
            for a in attrs:
                x = fields.get(a)
                if x is not None and not isinstance(x, (int, float, str)):
                    _find_vlas(x, found)
    return found


def _affected_vlas(fn, args, vlas):
    """The VLAs a launch commits: `vlas` if given, else those among args, else every live one; and in every case
    the VLAs fn reaches beyond its arguments (reachable_vlas), so that none of them gets an append twice."""
    found = {}
    if vlas is None:
        for a in args:
            _find_vlas(a, found)
    else:
        found = {id(v): v for v in vlas}
    found.update(reachable_vlas(fn))
    if not found and vlas is None:
        prog = taichi_compat.program()
        return [v for v in LIVE if v._prog is prog]
    return list(found.values())


def launch(fn, *args, vlas=None, rollback=True, max_retries=8):
    """Run ``fn(*args)`` (a Taichi kernel, or a Python function launching kernels) without losing appends.

    After the call every affected VLA is committed. If any of them had to drop elements, all of them
    are rolled back to their lengths before the call (capacity has already grown to the demand) and
    ``fn`` runs again. ``fn`` must therefore be idempotent apart from its appends: it may read anything
    and append, but must not depend on state it modified itself during a failed attempt.

    The affected VLAs are ``vlas`` if given, else those found among the arguments (also inside
    containers and data-oriented objects, two levels deep), else every live VLA; with, in every case, those fn
    reaches through globals and closures (its own code's and that of the functions it names: reachable_vlas), so
    that a re-run appends to none of them twice.

    ``rollback=False``: for an ``fn`` that empties every list it appends to before appending (a per-frame
    rebuild). Re-running it is then safe as it is, so no snapshot of the lengths is taken (one number per VLA
    instead of every length).
    Returns what ``fn`` returned.
    """
    vlas = _affected_vlas(fn, args, vlas)
    # Snapshot on the device (no host sync): lengths (rollback only), and the appends still waiting in the overflow
    # area from before the call (they are moved home by the commit below, like the call's own).
    # A VLA that is empty before the call rolls back by emptying it: no snapshot, whose buffer (a length per list)
    # would stay with the VLA. Only a VLA that may be empty (constructed or clear_all()'d, nothing committed since)
    # is asked, with one device reduction and read: a kernel run since without a commit may have appended to it.
    snaps = []
    empties = []
    for v in vlas:
        v._check_program()
        empties.append(rollback and v._known_empty and _k_count_nonempty(v) == 0)
        if rollback and not empties[-1]:
            snap = v._scratch_nd("launch_snapshot", v.num_arrays + 1)  # reused: launch allocates nothing
            _k_snapshot(v, snap)
            snaps.append((snap, v.num_arrays, v._caps["ovf_value"], v._lost))
        else:
            snap = v._scratch_nd("launch_pending", 1)
            _k_pending(v, snap)
            snaps.append((snap, 0, v._caps["ovf_value"], v._lost))
    for attempt in range(max_retries + 1):
        result = fn(*args)
        lost = []
        for v, (snap, at, ovf_cap, _) in zip(vlas, snaps):
            try:
                v.commit()  # one host read per VLA when nothing overflowed
            except VLAOverflowError as e:
                if int(snap[at]) > ovf_cap:
                    raise VLAOverflowError(
                        f"vla.launch: VLA {v.name!r} had already lost appends made before this call (outside "
                        f"launch), which re-running {getattr(fn, '__name__', fn)} cannot restore: {e}",
                        appended=e.appended, overflow_capacity=e.overflow_capacity, lost=e.lost) from None
                lost.append(e)
        if not lost:
            # Rolled back and run again (or emptied and refilled by fn): as complete as before the call; a VLA
            # that had lost appends before stays unreadable until refilled.
            for v, (_, _, ovf_cap, was_lost) in zip(vlas, snaps):
                v._lost = was_lost
                # The overflow area grew to hold the failed run's appends (a first fill from empty parks them all:
                # 5.9M slots, a third of the VLA's memory on the heavy tail), and the lists grew to the demand. Give
                # it back once in the VLA's life (again after a trim): a VLA whose later launches overflow again
                # keeps what they needed, rather than re-running them frame after frame.
                if attempt and not v._overflow_given_back and v._shrink_overflow(max(ovf_cap,
                                                                                       bucket(2 * v._last_parked))):
                    v._overflow_given_back = True
                # A first fill from empty knows every length: a VLA that chooses its layout settles into ordered
                # runs now (lazy release, vla.growth.Growth._settle) rather than after the quiet refills.
                if not v._ever_filled and v._auto_runs and v.runs == "bump" and not v._lost:
                    v._settle()
                v._ever_filled = True
            return result
        if rollback:
            for v, (snap, _, _, _), empty in zip(vlas, snaps, empties):
                if empty:
                    k_clear_all(v)
                else:
                    k_nd_to_lengths(v, snap)
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
    three VLAs paid five such round trips (H200, landed 1M-body pile: 0.4 ms of an 11 ms step, measured by
    leaving them out). A Batch commits on the device instead: lists that
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
    next kernel (H200, landed 1M-body pile: 0.3 ms of a 10.4 ms step, measured by leaving the read out). So a caller may run several batches back to back and check them all with
    one read. ``begin(tag)`` labels a batch; a failed device commit records the smallest such tag in
    ``failed_at`` (a 0-d i32 field, ``Batch.NO_FAILURE`` when none), which stays set until ``clear_failure()``.
    Kernels that must not build on a failed batch (they would read its short lists, or overwrite what a
    redo needs) test ``failed_at[None] == Batch.NO_FAILURE`` on the device and skip their work; ``first_failure()``
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

    NO_FAILURE = NO_FAILURE

    def __init__(self, failed_at=None):
        """failed_at: a 0-d i32 field to record failures in (kernels elsewhere may already be compiled
        against it), or None for a field of the batch's own (a Taichi SNode tree of its own, held until
        release(): make one Batch and reuse it, see vla.taichi_compat). Set to NO_FAILURE here."""
        self._status = None
        self._prog = taichi_compat.require_program("vla.Batch")
        self._entries = []   # (vla, status slot, snapshot ndarray or None), in launch order
        self.failed = []     # after done() returned False: (VLA name, appends that overflowed) of each failure
        self._tree = None
        if failed_at is None:
            failed_at = ti.field(ti.i32)
            fb = ti.FieldsBuilder()
            fb.place(failed_at)
            self._tree = taichi_compat.finalize(fb, "vla.Batch")
        self.failed_at = failed_at
        self.failed_at[None] = NO_FAILURE
        self._tag = 0

    def __del__(self):
        try:   # an ndarray must not be freed through a later Taichi program (vla.taichi_compat.bury)
            if taichi_compat.program() is not self._prog:
                taichi_compat.bury(self._status)
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
        vlas = _affected_vlas(fn, args, vlas)
        snaps = []
        for v in vlas:
            v._check_program()
            snap = None
            if rollback:
                snap = v._scratch_nd(f"batch_snapshot_{len(self._entries) + len(snaps)}", v.num_arrays + 1)
                _k_snapshot(v, snap)
            snaps.append(snap)
        result = fn(*args)
        for v in vlas:
            v._known_empty = False
        need = len(self._entries) + len(vlas)
        if self._status is None or self._status.shape[0] < need:
            self._status = ti.ndarray(ti.i32, shape=max(16, 2 * need))
        for v, snap in zip(vlas, snaps):
            k = len(self._entries)
            k_commit_device(v, v._caps["pool_chunks"], self._status, k, self.failed_at, self._tag)
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
                k_nd_to_lengths(v, snap)
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
