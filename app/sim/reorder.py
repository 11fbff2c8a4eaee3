"""Storing the bodies in memory by where they are, keeping every contact and the motion bit for bit.

Why: the kernels read a body's data from every thread that touches one of its contacts, and process bodies in grid
order (app.sim.broadphase.Grid.body_order), so that the threads of a warp work on neighbours. That pays only while
neighbours are also near in memory. The Simulation stores bodies by shape, then in Z-order of their initial
positions (storage_order); a pile poured from a height ends far from that order, so every `resort_interval` steps
it stores them again in the order of where they are (H200, pile_1m: a Jacobi iteration 12% cheaper per contact once
the landed bodies are stored in Z-order again; 0.713 -> 0.630 ms with a re-sort every 500 steps).

By shape first: the solver's thread i takes body i (app.sim.solver), and a warp lasts as long as its longest contact
list. A box in a pile has more contacts than a sphere (up to four per face contact), so warps of one shape waste
fewer lanes (H200, landed pile_1m: 11.6-11.8 -> 10.9-11.0 ms a step).

What a re-sort moves: body k of the new order is body order[k] of the old, where order is grid.body_order (the
bodies sorted by grid bucket, which follows space in Z-order) split by shape, spheres first, each part keeping its
order (kernel_order_by_shape). The State's per-body fields are gathered into that order on the device, the Model's
rows by its builder (app.sim.model.ModelBuilder.store_in_order), and so are both generations of contact lists, with
`other` renumbered in the current one (the other is emptied first: the next step rebuilds it). Nothing is read
back: the host learns the new order from Model.body_id when it next needs it. A VLA storage permutes its lists in
place (vla.VLA.permute): each list's chunks go with it, so the capacity each body's lists have grown to stays
theirs and a re-sort allocates nothing. The padded and dynamic storages copy the records into the other generation
instead and make it current.

Nothing else holds a body index across steps: the grid and the solver's buffers are rebuilt every step, and the
pair conventions follow app.sim.model.Model.body_id, which moves with its body. So a re-sort changes no bit of the
motion (tests/sim).
"""

import numpy as np
import taichi as ti

from app.sim.contacts import kernel_clear_lists
from app.sim.diagnostics import NO_ERROR, NO_PAIR, PAIR_STRIDE
from app.sim.permute import permute_field
from app.sim.state import BODY_FIELDS as STATE_BODY_FIELDS
from vla.scan import exclusive_scan, scan_scratch_size


def spatial_order(position: np.ndarray) -> np.ndarray:
    """Permutation that sorts bodies along a Z-order (Morton) curve of their positions (10 bits per axis over
    the bounding box), stable: order[k] is the body that goes to slot k.

    Why: a body's data (pose, velocity, mass) is read by every thread that touches one of its contacts, and
    the threads of a warp work on neighbouring bodies (grid.body_order). With bodies stored in scene order
    (random, for a generated pile) those neighbours sit in as many cache lines as there are bodies; in
    Z-order they share lines, and the kernels' own-body reads become contiguous."""
    p = np.asarray(position, np.float64).reshape(-1, 3)
    if p.shape[0] < 2:
        return np.arange(p.shape[0], dtype=np.int64)
    lo = p.min(axis=0)
    span = np.maximum(p.max(axis=0) - lo, 1e-12)
    q = np.clip(((p - lo) / span * 1023.0).astype(np.int64), 0, 1023)
    key = np.zeros(p.shape[0], np.int64)
    for b in range(10):
        for a in range(3):
            key |= ((q[:, a] >> b) & 1) << (3 * b + a)
    return np.argsort(key, kind="stable")


def storage_order(position: np.ndarray, shape: np.ndarray) -> np.ndarray:
    """The order a Simulation stores bodies in at load: by shape (spheres, then boxes), each shape in Z-order of the
    positions (spatial_order over all bodies, so both runs follow the same curve); stable."""
    z = spatial_order(position)
    shape = np.asarray(shape).reshape(-1)
    return z[np.argsort(shape[z], kind="stable")]


@ti.data_oriented
class Reorder:
    """Scratch for a re-sort of up to `capacity` bodies: the new order, the inverse permutation, the shape
    split's prefix sum and one gather buffer per element kind (i32, f32, vec4 f32), 40 bytes a body. Each
    per-body field of the State is gathered into its kind's buffer and copied back, one field after the other, so
    the fields keep their identity (a viewer binds them)."""

    def __init__(self, capacity: int):
        n = max(1, int(capacity))
        self.capacity = n
        self.order = ti.field(ti.i32, n)      # order[k] = old stored index of the body that goes to k
        self.inverse = ti.field(ti.i32, n)    # inverse[old stored index] = new stored index
        self.sphere_rank = ti.field(ti.i32, n + 1)   # spheres before order position t (exclusive scan)
        self.scan_scratch = ti.field(ti.i32, scan_scratch_size(n))
        self.scratch_i32 = ti.field(ti.i32, n)
        self.scratch_f32 = ti.field(ti.f32, n)
        self.scratch_vec = ti.Vector.field(4, ti.f32, n)


@ti.func
def _flag_at(flags: ti.template(), t):
    """Item t of exclusive_scan over a field of 0/1 flags."""
    return flags[t]


@ti.kernel
def kernel_order_by_shape(model: ti.template(), grid_order: ti.template(), reorder: ti.template()):
    """reorder.order = grid_order[:body_count] with the spheres first, then the boxes, each in grid order (a
    stable split: the rank of a sphere is the number of spheres before it, from a prefix sum)."""
    n = model.body_count[None]
    for t in range(n):
        reorder.scratch_i32[t] = ti.select(model.body_shape[grid_order[t]] == 0, 1, 0)
    exclusive_scan(reorder.scratch_i32, _flag_at, n, reorder.scan_scratch, reorder.sphere_rank)
    for t in range(n):
        spheres_before = reorder.sphere_rank[t]
        k = spheres_before
        if reorder.scratch_i32[t] == 0:
            k = reorder.sphere_rank[n] + t - spheres_before
        reorder.order[k] = grid_order[t]


@ti.kernel
def kernel_permute_state(model: ti.template(), state: ti.template(), diagnostics: ti.template(),
                         reorder: ti.template(), order: ti.template()):
    """Store body order[k] at index k (k < model.body_count) in every per-body field of the state, fill
    reorder.inverse, and renumber diagnostics.error_body and deep_pair. order: i32 field, a permutation of 0..body_count-1.
    The top-level loops run one after the other (a field is gathered completely before it is copied back)."""
    n = model.body_count[None]
    for k in range(n):
        reorder.inverse[order[k]] = k
    for name in ti.static(STATE_BODY_FIELDS):
        permute_field(ti.static(getattr(state, name)), reorder, order, n)
    if diagnostics.error_body[None] != NO_ERROR:
        diagnostics.error_body[None] = reorder.inverse[diagnostics.error_body[None]]
    if state.ext_body[None] >= 0:
        state.ext_body[None] = reorder.inverse[state.ext_body[None]]
    pair = diagnostics.deep_pair[None]
    if pair != ti.i64(NO_PAIR):
        i = reorder.inverse[ti.cast(pair // ti.i64(PAIR_STRIDE), ti.i32)]
        j = ti.cast(pair % ti.i64(PAIR_STRIDE), ti.i32) - 1
        if j >= 0:
            j = reorder.inverse[j]
        diagnostics.deep_pair[None] = ti.cast(i, ti.i64) * ti.i64(PAIR_STRIDE) + ti.cast(j + 1, ti.i64)


@ti.kernel
def kernel_permute_lists(lists: ti.template(), src_base: ti.i32, dst_base: ti.i32, n: ti.i32,
                         reorder: ti.template(), order: ti.template()):
    """lists[dst_base + k] = lists[src_base + order[k]] for k < n, record by record in the same order, with
    `other` (a stored body index, or -1 - plane) renumbered through reorder.inverse. For the padded and dynamic
    storages: a destination list receives no more records than its source held, so no append can be dropped."""
    for k in range(n):
        dst = dst_base + k
        src = src_base + order[k]
        lists.clear(dst)
        for q in range(lists.length(src)):
            rec = lists.get(src, q)
            if rec.other >= 0:
                rec.other = reorder.inverse[rec.other]
            lists.append(dst, rec)


@ti.kernel
def kernel_renumber_others(lists: ti.template(), base: ti.i32, n: ti.i32, reorder: ti.template()):
    """In lists[base + k] (k < n) set every record's `other` body to its new index (reorder.inverse)."""
    for k in range(n):
        li = base + k
        for q in range(lists.length(li)):
            o = lists.get_member(li, q, "other")
            if o >= 0:
                lists.set_member(li, q, "other", reorder.inverse[o])


def resort_bodies(builder, model, state, contacts, diagnostics, reorder, grid_order, body_count: int):
    """Re-sort the first body_count bodies by shape, then in grid_order (see the module docstring): the model's rows
    (through builder), the state, diagnostics' error body, and both generations of contact lists, on the device.
    The caller updates its host bookkeeping (Simulation.resort)."""
    n = int(body_count)
    kernel_order_by_shape(model, grid_order, reorder)
    order = reorder.order
    kernel_permute_state(model, state, diagnostics, reorder, order)
    builder.store_in_order(model, reorder, order)
    lists = contacts.lists
    if contacts.kind == "vla":
        # The previous generation's records hold old indices and the next step rebuilds them: emptied first,
        # its lists move only their chunks (their capacity), not their inline records.
        kernel_clear_lists(lists, contacts.prev_base, contacts.prev_base + n)
        lists.permute(order, (contacts.base, contacts.prev_base), n)
        kernel_renumber_others(lists, contacts.base, n, reorder)
    else:
        kernel_permute_lists(lists, contacts.base, contacts.prev_base, n, reorder, order)
        contacts.flip()
