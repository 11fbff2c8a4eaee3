"""Re-sorting the bodies in memory by where they are now, keeping every contact and the motion bit for bit.

Why: the kernels read a body's data from every thread that touches one of its contacts, and process bodies
in grid order (app.broadphase.Grid.body_order), so that the threads of a warp work on neighbours. That pays
only while neighbours are also near in memory. The Simulation stores bodies in Z-order of their initial
positions; a pile poured from a height ends far from that order (H200, pile_1m after 1055 steps: with the
bodies stored again in Z-order of their landed positions, a Jacobi iteration cost 12% less per contact,
session 13; with this re-sort every 500 steps, 0.713 -> 0.630 ms, session 14: docs/benchmarks.md).

What a re-sort moves: body k of the new order is body order[k] of the old, where order is grid.body_order (the
bodies sorted by grid bucket, which follows space in Z-order) split by shape, spheres first, each part keeping
its order (kernel_order_by_shape): the solver's warps then take bodies of one shape, whose lists have similar
lengths (app.sim.storage_order says why). Every per-body field of the Model and the
State is gathered into that order, and so are both generations of contact lists, with `other` renumbered in
the current one (the other is emptied first: the next step rebuilds it). The next step warm-starts from the
current generation as from any step's. A VLA storage permutes its lists in place (vla.VLA.permute): each
list's chunks go with it, so the capacity each body's lists have grown to stays theirs and a re-sort
allocates nothing (copying the records into the other generation instead left each body with the capacity
of another: pile_1m's contact memory grew from 1,824 to 2,139 MiB over two re-sorts). The padded and dynamic
storages copy the records into the other generation instead and make it current.

Nothing else holds a body index across steps: the grid and the solver's buffers are rebuilt every step, and
the pair conventions follow app.model.Model.body_id, which moves with its body. So a re-sort changes no bit
of the motion (tests/test_sim.py).
"""

import taichi as ti

from app.contacts import kernel_clear_lists
from app.integrator import NO_ERROR
from app.model import BODY_FIELDS as MODEL_BODY_FIELDS
from app.state import BODY_FIELDS as STATE_BODY_FIELDS
from vla.scan import exclusive_scan, scan_scratch_size


# Store bodies by shape, then by place (here and in app.sim.storage_order). A switch for measuring it: with
# the solver's threads taking bodies in stored order, the split made landed pile_1m 0.7 ms a step faster on the
# H200 (docs/results/h200/shape_split_s15.txt).
SPLIT_BY_SHAPE = True


@ti.data_oriented
class Reorder:
    """Scratch for a re-sort of up to `capacity` bodies: the new order, the inverse permutation, the shape
    split's prefix sum and one gather buffer per element kind (i32, f32, vec4 f32), 40 bytes a body. Each
    per-body field is gathered into its kind's buffer and copied back, one field after the other, so the fields
    keep their identity (a viewer binds them)."""

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


@ti.func
def _permute_field(f: ti.template(), reorder: ti.template(), order: ti.template(), n):
    """f[k] = old f[order[k]] for k < n, through the scratch buffer of f's kind."""
    if ti.static(hasattr(f, "n")):   # a vector field: through the vec4 buffer
        for k in range(n):
            v = f[order[k]]
            w = ti.Vector([0.0, 0.0, 0.0, 0.0])
            for c in ti.static(range(f.n)):
                w[c] = v[c]
            reorder.scratch_vec[k] = w
        for k in range(n):
            w = reorder.scratch_vec[k]
            f[k] = ti.Vector([w[c] for c in ti.static(range(f.n))])
    elif ti.static(f.dtype == ti.i32):
        for k in range(n):
            reorder.scratch_i32[k] = f[order[k]]
        for k in range(n):
            f[k] = reorder.scratch_i32[k]
    else:
        for k in range(n):
            reorder.scratch_f32[k] = f[order[k]]
        for k in range(n):
            f[k] = reorder.scratch_f32[k]


@ti.kernel
def kernel_permute_bodies(model: ti.template(), state: ti.template(), health: ti.template(),
                          reorder: ti.template(), order: ti.template()):
    """Store body order[k] at index k (k < model.body_count) in every per-body field of model and state, fill
    reorder.inverse, and renumber health.error_body. order: i32 field, a permutation of 0..body_count-1.
    The top-level loops run one after the other (a field is gathered completely before it is copied back)."""
    n = model.body_count[None]
    for k in range(n):
        reorder.inverse[order[k]] = k
    for name in ti.static(MODEL_BODY_FIELDS):
        _permute_field(ti.static(getattr(model, name)), reorder, order, n)
    for name in ti.static(STATE_BODY_FIELDS):
        _permute_field(ti.static(getattr(state, name)), reorder, order, n)
    if health.error_body[None] != NO_ERROR:
        health.error_body[None] = reorder.inverse[health.error_body[None]]


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


def resort_bodies(model, state, contacts, health, reorder, grid_order, body_count: int):
    """Re-sort the first body_count bodies by shape, then in grid_order (see the module docstring): model,
    state, health's error body, and both generations of contact lists. The caller updates its host bookkeeping
    (app.sim.Simulation.resort)."""
    n = int(body_count)
    order = grid_order
    if SPLIT_BY_SHAPE:
        kernel_order_by_shape(model, grid_order, reorder)
        order = reorder.order
    kernel_permute_bodies(model, state, health, reorder, order)
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
