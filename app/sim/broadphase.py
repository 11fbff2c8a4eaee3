"""Broadphase: a uniform grid whose cell lists are a VLA, rebuilt every step, and the body order it gives.

Each body is appended to the list of the one cell that holds its centre. The cell edge
(model.grid_cell_size) is at least twice the largest bounding radius plus the contact margin, so any
two bodies that can touch have centres in the same or adjacent cells: a pair's two bodies are in one of
the 27 cells around either of them, and kernel_candidate_pairs visits half of those (14 buckets) per
body so that each pair is found once. Cost O(n) per step; there is no O(n^2) pass.

Large bodies (app.sim.model.grid_radius: bounding radius above 4x the median, at most 64 of them) do not size the
cells: the largest radius above is that of the other bodies (model.grid_large_radius). Each step lists them
(grid.large_ids), the cell search skips every pair that involves one, and a pass of its own tests every body
against every large body: O(n) per large body instead of cells as wide as the largest body.

Static bodies (fixed in the scene: walls, posts, the triangles of static meshes and heightfields) neither sit in the
cells nor size them. Each is listed, once, in the bucket of every cell within one cell of its bounding box
(static_cells, built on the host when the bodies are written, with a bucket layout of its own sized to the static
bodies' extent: static_bucket), and a moving body looks there from its own cell: a
terrain of triangles larger than the bodies, or thousands of fixed bodies, costs the moving bodies a bucket's list
each instead of cells as wide as the largest triangle.

Buckets are the Morton (Z-order) code of the cell coordinates taken modulo a period of P = 2^b cells per
axis (table_size = P^3): the world wraps around every P cells, so two far-apart cells can share a bucket,
which only costs extra bounding-sphere tests. Because P >= 3 (the grid uses P >= 4), the 27 cells around
any cell always fall in 27 distinct buckets (no duplicate visits to filter out), and a true neighbour's
cell cannot alias another visited offset.

Why Z-order and not a scrambling hash: bucket order then follows space, and the grid hands out
`body_order`, the bodies sorted by bucket (a counting sort: each body's slot in its cell plus the
prefix sum of the cell lengths). The narrowphase and the solver process bodies in that order, so the
threads of a warp work on neighbouring bodies and read the same neighbour cells, positions and
velocities: cache hits instead of one memory trip per neighbour. Body indices are untouched (they are
the stored order, which app.sim.Simulation sets to the Z-order of the initial positions; see
Simulation.scene_of).
"""

import taichi as ti

from app.sim.model import MAX_LARGE_BODIES
from app.sim.state import HELD, asleep_by_time, moves_itself, still_since_last_step
from vla.scan import exclusive_scan, scan_scratch_size

# Candidate-pair classes by cost of their contact geometry: 0 sphere-sphere / sphere-plane, 1 sphere-box /
# box-plane, 2 box-box and every pair with a capsule, 3 every pair with a convex hull (pair_class). Class 3 exists
# only in a Grid made with hull_class (a scene with convex bodies): the others pay nothing for it.
PAIR_CLASSES = 3
HULL_CLASS = 3
# Classes whose pairs the narrowphase first packs densely (the costly geometry: box-sphere/box-plane, box-box and
# hulls): walked through the pairs VLA's flat slots, their threads met empty slots and other classes' pairs.
COMPACT_CLASSES = (1, 2)


@ti.func
def pair_class(grid: ti.template(), shape_a, shape_b):
    """Pair class of bodies of shapes shape_a and shape_b (app.scene.schema.SHAPES: sphere 0, box 1, capsule 2,
    convex 3), or of a body of shape_a with a plane (shape_b = 0): the number of boxes, and a capsule counts as two;
    any pair with a hull is class 3. Capsules are rare beside the spheres and boxes of large scenes, so they share the
    costly class rather than add a list per body."""
    c = ti.min(shape_a + shape_b, 2)
    if ti.static(grid.pair_classes > HULL_CLASS):
        c = ti.select(shape_a == HULL_CLASS or shape_b == HULL_CLASS, HULL_CLASS, c)
    return c


@ti.func
def grid_cell_of(p, cell_size):
    """Integer cell coordinates (vec3 i32) of world point p (m)."""
    return ti.floor(p / cell_size).cast(ti.i32)


@ti.func
def neighbour_cell(c, nb):
    """Cell nb (0..26) of the 3 x 3 x 3 block around integer cell c, x fastest; nb = 13 is c itself."""
    return c + ti.Vector([nb % 3 - 1, (nb // 3) % 3 - 1, nb // 9 - 1])


@ti.func
def _spread_bits3(x):
    """Bits 0..9 of x moved to bits 0, 3, 6, ..., 27 (Morton interleave helper)."""
    x = x & 0x3FF
    x = (x | (x << 16)) & 0x030000FF
    x = (x | (x << 8)) & 0x0300F00F
    x = (x | (x << 4)) & 0x030C30C3
    x = (x | (x << 2)) & 0x09249249
    return x


@ti.func
def grid_bucket(c, axis_mask):
    """Bucket of integer cell c: Morton code of (c mod P) with P = axis_mask + 1 a power of two (<= 1024).
    i32 coordinates wrap (two's complement & mask), which is the intended periodicity."""
    return _spread_bits3(c[0] & axis_mask) | (_spread_bits3(c[1] & axis_mask) << 1) | \
        (_spread_bits3(c[2] & axis_mask) << 2)


@ti.func
def _cell_length(cells: ti.template(), h):
    return cells.length(h)


@ti.kernel
def kernel_grid_insert(model: ti.template(), state: ti.template(), grid: ti.template(), dt: ti.f32):
    """Empty every cell, append every body index to its cell's list (grid.cells: VLA of i32 with
    grid.table_size lists), then sort the bodies by cell into grid.body_order.

    The loops of one launch run one after the other. The order needs only each body's bucket and the slot
    its append returned plus the cell lengths, all of which are right even when an append overflowed the
    VLA (vla.launch then re-runs the whole kernel after growing it). Also each body's reach over the step
    (grid.body_reach), and which buckets hold a body that moved, or that wakes or holds its sleeping neighbours
    (grid.cell_flags)."""
    for c in range(grid.table_size):
        grid.cells.clear(c)
        grid.cell_flags[c] = 0
    grid.large_count[None] = 0
    cs = model.grid_cell_size[None]
    large_r = model.grid_large_radius[None]
    n = model.body_count[None]
    for i in range(n):
        p = state.body_pos[i]
        r = model.body_radius[i]
        grid.body_sphere[i] = ti.Vector([p[0], p[1], p[2], r])
        reach = 0.0
        if model.body_inv_mass[i] > 0.0:
            reach = dt * (state.body_vel[i].norm() + model.gravity[None].norm() * dt + state.body_omega[i].norm() * r)
        elif model.body_kinematic[i] != 0:   # (it moves as told: no gravity)
            reach = dt * (state.body_vel[i].norm() + state.body_omega[i].norm() * r)
        grid.body_reach[i] = reach
        state.body_woken[i] = 0
        if _static_rank(model, grid, i) < 0:
            h = grid_bucket(grid_cell_of(p, cs), grid.axis_mask)
            grid.body_bucket[i] = h
            grid.body_slot[i] = grid.cells.append(h, i)
            _mark_cell(model, state, grid, h, i, dt)
            if r > large_r:  # (grid_radius makes them at most MAX_LARGE_BODIES)
                grid.large_ids[ti.atomic_add(grid.large_count[None], 1)] = i
    exclusive_scan(grid.cells, _cell_length, grid.table_size, grid.scan_scratch, grid.bucket_start)
    for i in range(n):
        rank = _static_rank(model, grid, i)
        if rank < 0:
            grid.body_order[grid.bucket_start[grid.body_bucket[i]] + grid.body_slot[i]] = i
        else:   # static bodies last, by rank (static_order_start)
            grid.body_order[_static_order_start(model) + rank] = i


@ti.func
def _mark_cell(model: ti.template(), state: ti.template(), grid: ti.template(), h, i, dt):
    """Mark bucket h in grid.cell_flags if body i, in it, wakes (CELL_WAKES) or holds (CELL_HOLDS) the sleepers it
    touches in round 0 of kernel_wake_touched, or has moved since last step (CELL_MOVING). Nothing when sleeping is
    off."""
    if model.sleep_speed[None] > 0.0:
        f = ti.select(still_since_last_step(model, state, i, dt), 0, CELL_MOVING)
        if not asleep_by_time(model, state, i):
            if model.body_inv_mass[i] > 0.0:
                f |= CELL_HOLDS
            if moves_itself(model, i) and state.body_vel[i].norm() + state.body_omega[i].norm() * \
                    model.body_radius[i] > model.sleep_speed[None]:
                f |= CELL_WAKES
        if f != 0 and (grid.cell_flags[h] & f) != f:   # (most bodies share a bucket with an awake one: skip the atomic)
            ti.atomic_or(grid.cell_flags[h], f)


@ti.func
def _static_rank(model: ti.template(), grid: ti.template(), i):
    """Body i's rank among the static bodies (model.body_static_rank), -1 for the others and in a Grid without
    static cells (every body then sits in the cells)."""
    rank = -1
    if ti.static(grid.has_static):
        rank = model.body_static_rank[i]
    return rank


@ti.func
def _static_order_start(model: ti.template()):
    """Position in grid.body_order of the static body of rank 0 (they follow the others, by rank)."""
    return model.body_count[None] - model.static_count[None]


# Rounds of waking per step (kernel_wake_touched): a sleeping body touched by a moving one wakes, and so do up to
# WAKE_ROUNDS - 1 layers of sleeping bodies touching it, in the same step (a hit on a resting row of balls reaches
# its far end within the step, where a sleeper left asleep would stand as a wall); deeper layers wake in the
# steps after, as the motion reaches them.
# A sleeper-by-time that touches an awake dynamic body, slow or not, is held awake for the step (state.body_woken =
# HELD): solved and integrated, its clock not restarted. So a body falls asleep only with the bodies it touches, and a
# stack sleeps from its still parts inwards, never as sleepers scattered among awake bodies: a sleeper counts as fixed,
# and scattered ones turned pyramid_100 violent (CPU: the clocks of a random 82% of its boxes restarted at step 150,
# the other 919 asleep at step 250; 25 steps later 1,738 boxes over 0.05 m/s; held, they move as with sleeping off),
# where a clean boundary stands.
WAKE_ROUNDS = 4
# grid.cell_flags, a bucket's bits: whether a body in it wakes the sleepers it touches in round 0 (CELL_WAKES), holds
# them (CELL_HOLDS), or was woken in round r - 1 (1 << (CELL_WOKEN_SHIFT + r), round r >= 1). A sleeper reads the
# bodies of a neighbouring bucket only if the bucket has the bit its round looks for: in a settled pile nearly every
# bucket has none, and a sleeper's test is 27 flag loads instead of the bodies of 27 cells.
CELL_WAKES = 1
CELL_HOLDS = 2
CELL_WOKEN_SHIFT = 1
# and whether a body in it has moved since last step (app.sim.state.still_since_last_step): a still body looks for
# candidate pairs only in the buckets that have one, when still pairs keep their records (Grid.keeps_still_pairs)
CELL_MOVING = 1 << (CELL_WOKEN_SHIFT + WAKE_ROUNDS + 1)
# and whether a bucket within one cell of it has a body woken in round r - 1 (1 << (CELL_NEAR_WOKEN_SHIFT + r), round
# r >= 1): set by the woken body on its 27 buckets, so that in a round after the first a sleeper reads its own bucket's
# bit and, in most of a pile, no more (the bucket neighbourhood is symmetric, also where the hashed grid wraps)
CELL_NEAR_WOKEN_SHIFT = CELL_WOKEN_SHIFT + WAKE_ROUNDS + 2


@ti.func
def _touching(model: ti.template(), grid: ti.template(), i, j):
    """Whether the bounding spheres of bodies i and j come within the larger of the contact margin and their two
    reaches (the candidate-pair test)."""
    si = grid.body_sphere[i]
    sj = grid.body_sphere[j]
    d = ti.Vector([sj[0] - si[0], sj[1] - si[1], sj[2] - si[2]]).norm()
    return d <= si[3] + sj[3] + ti.max(model.contact_margin[None], grid.body_reach[i] + grid.body_reach[j])


@ti.func
def _wake_from_neighbours(model: ti.template(), state: ti.template(), grid: ti.template(), i, r: ti.template()):
    """Sleeping body i, not woken yet: wake it (state.body_woken = r + 1) if a body it touches (its grid
    neighbours and the large bodies) moves faster than model.sleep_speed, awake (r = 0), or was woken in round r
    (r > 0); in round 0, hold it (HELD) if it touches an awake dynamic body that does not wake it."""
    si = grid.body_sphere[i]
    c = grid_cell_of(ti.Vector([si[0], si[1], si[2]]), model.grid_cell_size[None])
    woken = False
    held = False
    wanted = ti.static(CELL_WAKES | CELL_HOLDS if r == 0 else 1 << (CELL_WOKEN_SHIFT + r))
    near = True
    if ti.static(r > 0):
        near = (grid.cell_flags[grid.body_bucket[i]] & (1 << (CELL_NEAR_WOKEN_SHIFT + r))) != 0
    for nb in range(ti.select(near, 27, 0)):
        h = grid_bucket(neighbour_cell(c, nb), grid.axis_mask)
        # Once woken, the rest cannot change the outcome (woken wins over held); once held, only a bucket that can
        # wake it can. Where most bodies are awake nearly every bucket holds, and a held sleeper that read on through
        # the bodies of all 27 cells made this round 1.5-1.8x as slow (a 15-layer pile on the CPU, 816 of its 5,000
        # bodies asleep or held).
        want = wanted
        if ti.static(r == 0):
            want = ti.select(held, CELL_WAKES, wanted)
        n_h = ti.select(not woken and (grid.cell_flags[h] & want) != 0, grid.cells.length(h), 0)
        for s in range(n_h):
            j = grid.cells.get(h, s)
            if not woken and j != i and _touching(model, grid, i, j):
                woken = woken or _wakes(model, state, grid, j, r)
                if ti.static(r == 0):
                    held = held or _holds(model, state, j)
    for q in range(ti.select(woken, 0, grid.large_count[None])):
        j = grid.large_ids[q]
        if j != i and _touching(model, grid, i, j):
            woken = woken or _wakes(model, state, grid, j, r)
            if ti.static(r == 0):
                held = held or _holds(model, state, j)
    if woken:
        state.body_woken[i] = r + 1
        ti.atomic_add(state.woken_count[r], 1)
        if ti.static(r + 1 < WAKE_ROUNDS):
            ti.atomic_or(grid.cell_flags[grid.body_bucket[i]], 1 << (CELL_WOKEN_SHIFT + r + 1))
            for nb in range(27):
                ti.atomic_or(grid.cell_flags[grid_bucket(neighbour_cell(c, nb), grid.axis_mask)],
                             1 << (CELL_NEAR_WOKEN_SHIFT + r + 1))
    elif held:
        state.body_woken[i] = HELD


@ti.func
def _wakes(model: ti.template(), state: ti.template(), grid: ti.template(), j, r: ti.template()):
    """Whether body j wakes the sleepers it touches in round r (see _wake_from_neighbours)."""
    out = False
    if ti.static(r == 0):
        out = moves_itself(model, j) and not asleep_by_time(model, state, j) and \
            state.body_vel[j].norm() + state.body_omega[j].norm() * grid.body_sphere[j][3] > model.sleep_speed[None]
    else:
        out = state.body_woken[j] == r
    return out


@ti.func
def _holds(model: ti.template(), state: ti.template(), j):
    """Whether body j holds awake the sleepers-by-time it touches (HELD): a dynamic body, awake by its clock."""
    return model.body_inv_mass[j] > 0.0 and not asleep_by_time(model, state, j)


@ti.kernel
def kernel_wake_touched(model: ti.template(), state: ti.template(), grid: ti.template()):
    """Wake, for this step, the sleeping bodies that a moving body touches (app.sim.state.asleep): in round 0 each
    sleeping body looks for an awake neighbour faster than model.sleep_speed, in round r for a neighbour round
    r - 1 woke (state.body_woken = round + 1), WAKE_ROUNDS rounds (its top-level loops run one after the other).
    Seen from the sleeping side, so that a scene with few sleepers pays a flag test a body; a round after one that
    woke nobody loops over nothing (state.woken_count). A woken body is solved and integrated this step (its
    contacts, kept while it slept, still carry their impulses). Nothing when sleeping is off."""
    n = ti.select(model.sleep_speed[None] > 0.0, model.body_count[None], 0)
    for r in range(WAKE_ROUNDS):
        state.woken_count[r] = 0
    for r in ti.static(range(WAKE_ROUNDS)):
        m = n
        if ti.static(r > 0):
            m = ti.select(state.woken_count[r - 1] > 0, n, 0)
        for i in range(m):
            if state.body_woken[i] <= 0 and asleep_by_time(model, state, i):   # (a held body may still wake)
                _wake_from_neighbours(model, state, grid, i, r)


@ti.func
def static_bucket(grid: ti.template(), c):
    """Bucket of integer cell c in grid.static_cells: each coordinate modulo 2^bits of its axis (grid.static_bits,
    app.sim.model.ModelBuilder.static_cells), x in the lowest bits."""
    b = grid.static_bits[None]
    return (c[0] & ((1 << b[0]) - 1)) | ((c[1] & ((1 << b[1]) - 1)) << b[0]) | \
        ((c[2] & ((1 << b[2]) - 1)) << (b[0] + b[1]))


@ti.func
def _near_static(model: ti.template(), grid: ti.template(), i, j, rank, reach_i):
    """Whether moving body i's bounding sphere comes within the larger of the contact margin and its reach of both
    the bounding sphere and the bounding box (grid.static_lo / static_hi) of static body j of rank `rank`: each
    holds all of j, so a pair that fails either cannot touch in the step, and a flat triangle's box is far tighter
    than its sphere."""
    si = grid.body_sphere[i]
    sj = grid.body_sphere[j]
    p = ti.Vector([si[0], si[1], si[2]])
    reach = si[3] + ti.max(model.contact_margin[None], reach_i)
    d = ti.max(grid.static_lo[rank] - p, p - grid.static_hi[rank], 0.0)
    return d.norm() <= reach and (ti.Vector([sj[0], sj[1], sj[2]]) - p).norm() <= reach + sj[3]


@ti.func
def _static_candidate(model: ti.template(), grid: ti.template(), t, i, rank, reach_i):
    """List the static body of rank `rank` as a candidate pair of moving body i (order position t) if it is near
    (_near_static)."""
    j = grid.body_order[_static_order_start(model) + rank]
    if _near_static(model, grid, i, j, rank, reach_i):
        grid.pairs.append(grid.pair_list(pair_class(grid, model.body_shape[i], model.body_shape[j]), t), j)


@ti.func
def _static_candidates(model: ti.template(), grid: ti.template(), t, i, c, reach_i):
    """The pairs of moving body i (order position t, in cell c, not large) with the static bodies.

    A static body is listed in every cell within one cell of its bounding box (ModelBuilder.static_cells), so the
    bucket of i's own cell lists every static body i can touch when i reaches no further than a cell from its
    centre (radius, then the larger of margin and reach: a body slower than about a cell a step). A faster body
    looks in the 27 cells around its own, which reaches two cells, and takes a static body from the first of those
    buckets that lists it (a body listed in several of them, or a bucket met twice, pairs once)."""
    ri = grid.body_sphere[i][3]
    if ri + ti.max(model.contact_margin[None], reach_i) <= model.grid_cell_size[None]:
        h = static_bucket(grid, c)
        for s in range(grid.static_cells.length(h)):
            _static_candidate(model, grid, t, i, grid.static_cells.get(h, s), reach_i)
    else:
        for nb in range(27):
            h = static_bucket(grid, neighbour_cell(c, nb))
            for s in range(grid.static_cells.length(h)):
                rank = grid.static_cells.get(h, s)
                seen = False
                for nb2 in range(nb):
                    h2 = static_bucket(grid, neighbour_cell(c, nb2))
                    for s2 in range(grid.static_cells.length(h2)):
                        seen = seen or grid.static_cells.get(h2, s2) == rank
                if not seen:
                    _static_candidate(model, grid, t, i, rank, reach_i)


@ti.kernel
def kernel_candidate_pairs(model: ti.template(), state: ti.template(), grid: ti.template(), dt: ti.f32):
    """Candidate pairs of this step, from the grid (build() first): grid.pairs[t] lists bodies j whose
    bounding spheres come within the larger of the contact margin and the two bodies' reach over the step
    (grid.body_reach: speculative contacts, below) of body i = grid.body_order[t], each pair once (in the
    list of whichever body finds it, see the half-neighbourhood below; j may be < i), and -1 - k for each
    plane k within reach of i's bounding sphere (never for fixed bodies, nor for two fixed bodies).

    A cheap, uniform pass: finding candidates and computing contact geometry are separate kernels because
    in one thread per body the warp's 32 threads meet their heavy box-box pairs at different loop
    iterations and run them one after the other. Lists are indexed by order position t (not body i) so
    that the narrowphase walks them in Z-order, and by pair class (grid.pair_list) so that it can run one
    loop per class (each compiled for its class's geometry, classes 1-2 packed densely first; see
    app.sim.narrowphase.kernel_narrowphase): a warp then runs one collide_* function, never paying for a
    box-box lane among sphere pairs.

    Pairs with a large body (radius > model.grid_large_radius) come from the last loop instead: every order
    position t against every large body, listed under t; two large bodies, under the one of lower index.

    With grid.keeps_still_pairs and sleeping on, a pair of two bodies still since last step keeps last step's
    records (app.sim.narrowphase._keeps_still_pairs): a still body lists no planes and reads only the buckets that
    hold a body that moved (CELL_MOVING), so a settled pile costs a flag load a bucket. (Its pairs with still bodies
    that a moving one's bucket brings along are listed; the narrowphase skips them.)"""
    n = model.body_count[None]
    for t in range(n):  # lists from n on stay empty: Grid.reset() empties all of them when a scene loads
        for c in ti.static(range(grid.pair_classes)):
            grid.pairs.clear(grid.pair_list(c, t))
    cs = model.grid_cell_size[None]
    margin = model.contact_margin[None]
    large_r = model.grid_large_radius[None]
    for t in range(n):
        i = grid.body_order[t]
        si = grid.body_sphere[i]
        pi_ = ti.Vector([si[0], si[1], si[2]])
        ri = si[3]
        shape_i = model.body_shape[i]
        # Sleeping bodies keep their contacts and the impulses those carry: a sleeper woken under load starts warm
        # (without them a heavy box woken on a light one fell onto cold contacts and sank three times as deep); the
        # solver and the integrator skip them. A still body's pairs with still bodies keep last step's records
        # without being listed here (the docstring's last paragraph); its other pairs are listed as any body's.
        fixed_i = model.body_inv_mass[i] == 0.0
        reach_i = grid.body_reach[i]
        still_i = False
        if ti.static(grid.keeps_still_pairs):
            if model.sleep_speed[None] > 0.0 and model.warm_start[None] == 1.0:
                still_i = still_since_last_step(model, state, i, dt)
        if not fixed_i and not still_i:
            for k in range(model.plane_count[None]):
                # no point of the body can be deeper than its bounding sphere
                if model.plane_offset[k] - model.plane_normal[k].dot(pi_) + ri > -ti.max(margin, reach_i):
                    grid.pairs.append(grid.pair_list(pair_class(grid, shape_i, 0), t), -1 - k)
        c = grid_cell_of(pi_, cs)
        static_i = _static_rank(model, grid, i) >= 0
        if ti.static(grid.has_static):
            if not fixed_i and ri <= large_r:
                _static_candidates(model, grid, t, i, c, reach_i)
        # Half the neighbourhood: the own cell (pairs j > i) and the 13 cells whose offset (dz, dy, dx) is
        # lexicographically positive (all their bodies). A pair in two different cells is seen from exactly
        # one of them, the one whose positive half holds the other's cell: half the cells and distance tests
        # of visiting all 27 with j > i. (The 27 buckets are distinct: the grid's period is >= 4 cells.)
        for nb in range(13, ti.select(static_i, 13, 27)):   # (a static body's pairs: the pass above)
            h = grid_bucket(neighbour_cell(c, nb), grid.axis_mask)
            for s in range(ti.select(still_i and (grid.cell_flags[h] & CELL_MOVING) == 0, 0, grid.cells.length(h))):
                j = grid.cells.get(h, s)
                sj = grid.body_sphere[j]
                near = (ti.Vector([sj[0], sj[1], sj[2]]) - pi_).norm() <= ri + sj[3] + \
                    ti.max(margin, reach_i + grid.body_reach[j])
                # (pairs with a large body come from the last loop)
                if near and (nb > 13 or j > i) and ti.max(ri, sj[3]) <= large_r:
                    ok = True
                    if fixed_i:   # (a branch: Taichi evaluates both sides of `and`)
                        ok = model.body_inv_mass[j] != 0.0
                    if ok:
                        grid.pairs.append(grid.pair_list(pair_class(grid, shape_i, model.body_shape[j]), t), j)
    for t, q in ti.ndrange(n, grid.large_count[None]):
        i = grid.body_order[t]
        big = grid.large_ids[q]
        si = grid.body_sphere[i]
        sb = grid.body_sphere[big]
        # each pair once: a body that is not large (or static: static bodies are never in large_ids) lists its pairs
        # with every large one; of two large bodies, the one of lower index
        rank = _static_rank(model, grid, i)
        if i != big and (si[3] <= large_r or i < big or rank >= 0):
            near = (ti.Vector([sb[0] - si[0], sb[1] - si[1], sb[2] - si[2]])).norm() <= si[3] + sb[3] + \
                ti.max(margin, grid.body_reach[i] + grid.body_reach[big])
            if ti.static(grid.has_static):
                if rank >= 0:
                    near = _near_static(model, grid, big, i, rank, grid.body_reach[big])
            if near:
                if model.body_inv_mass[i] != 0.0 or model.body_inv_mass[big] != 0.0:
                    grid.pairs.append(grid.pair_list(pair_class(grid, model.body_shape[i], model.body_shape[big]), t), big)


@ti.data_oriented
class Grid:
    """Owns the cell lists and the body order.

    cells: vla.VLA(table_size, ti.i32) of body indices per bucket; table_size = P^3 buckets (P = 2^b >= 4
        cells per axis, the smallest with table_size >= body capacity); axis_mask = P - 1.
    body_order: i32 (body_capacity,): body indices sorted by bucket (Z-order); body_bucket, body_slot: each
        body's bucket and its index in that bucket's list; bucket_start: i32 (table_size + 1,), first
        position of each bucket in body_order. Valid after build() until the bodies move.
    pairs: vla.VLA(pair_classes * body_capacity, ti.i32): candidate pairs per pair class and order position,
        list pair_list(c, t) = c * body_capacity + t (kernel_candidate_pairs), class c = pair_class(...).
    pair_classes: PAIR_CLASSES, one more with hull_class; compact_classes: the classes packed densely.
    static_cells: vla.VLA(table_size, ti.i32) of static body ranks per bucket (set_static), or None. Static bodies
        (app.sim.model.Model.body_static_rank) are not in `cells`; they come last in body_order, by rank.
        static_lo, static_hi: vec3 (m) by rank, their world bounding boxes; static_bits: static_bucket's layout.
    """

    def __init__(self, body_capacity: int, hull_class: bool = False, static_cells: bool = False,
                 keeps_still_pairs: bool = False):
        import numpy as np

        from vla import VLA

        bits = 2
        while (1 << (3 * bits)) < body_capacity:
            bits += 1
        if bits > 10:
            raise ValueError(f"Grid: {body_capacity} bodies need more than 2^30 buckets")
        self.axis_mask = (1 << bits) - 1
        self.table_bits = 3 * bits
        self.table_size = 1 << self.table_bits
        # Every bucket owns room for 12 centres up front (4 inline + one 8-element chunk): a dense pile puts
        # up to ~8 centres in a cell, and each pool growth mid-run re-lays the pool out (measured: 96 growths
        # in 40 frames of the default scene with a shared, unassigned reserve).
        self.cells = VLA(self.table_size, ti.i32, inline_capacity=4, chunk_size=8,
                         reserve=np.full(self.table_size, 12, np.int32), name="grid_cells")
        n = max(1, int(body_capacity))
        self.body_order = ti.field(ti.i32, n)
        self.body_bucket = ti.field(ti.i32, n)
        self.body_slot = ti.field(ti.i32, n)
        # (position m, bounding radius m) of each body, written with its bucket: the candidate-pair pass tests
        # ~40 neighbours a body, and reads each one's sphere in one 16-byte load instead of two fields
        self.body_sphere = ti.Vector.field(4, ti.f32, n)
        # How far any point of a body can move in the step (m): dt (|v| + |g| dt + |w| r), 0 for fixed bodies. A
        # pair is a candidate, and its manifold keeps speculative contacts, out to the larger of the contact
        # margin and the two reaches together (no closer pair can meet within the step), so a fast body meets what
        # lies in its path before it can pass through it (a 5 cm sphere at 50 m/s moves 10 cm a step at dt = 2
        # ms), while bodies slower than a margin a step get no more contacts than the margin gives (the sum
        # instead made a landed 1M-body pile 12% more contacts and 9% slower on an H100). The grid's cells do not
        # grow with it: a pair of small bodies further apart than the neighbouring cells is not found.
        self.body_reach = ti.field(ti.f32, n)
        self.bucket_start = ti.field(ti.i32, self.table_size + 1)
        self.cell_flags = ti.field(ti.i32, self.table_size)   # a bucket's bodies, in bits: CELL_WAKES, CELL_MOVING, ...
        # still pairs keep their records (the narrowphase's _keeps_still_pairs: VLA contact lists), so the candidate
        # pass may leave them out (kernel_candidate_pairs); compile time
        self.keeps_still_pairs = bool(keeps_still_pairs)
        # the large bodies of this step (kernel_grid_insert; app.sim.model.grid_radius), stored indices
        self.large_ids = ti.field(ti.i32, MAX_LARGE_BODIES)
        self.large_count = ti.field(ti.i32, ())
        self.scan_scratch = ti.field(ti.i32, scan_scratch_size(self.table_size))
        # Candidate pairs per order position: ~6 in a settled pile (half of ~12 neighbours, plus the floor),
        # ~2 per class list: 2 inline and 4-element chunks; the pool starts with room for two more per body.
        self.pair_stride = n
        self.pair_classes = PAIR_CLASSES + (1 if hull_class else 0)
        self.compact_classes = COMPACT_CLASSES + ((HULL_CLASS,) if hull_class else ())
        self.pairs = VLA(self.pair_classes * n, ti.i32, inline_capacity=2, chunk_size=4, reserve=2 * n,
                         name="candidate_pairs")
        # The narrowphase packs the pairs of the classes in compact_classes densely, class by class in
        # Z-order (see app.sim.narrowphase.kernel_narrowphase): compact_start is the exclusive prefix sum of the
        # readable pairs of their lists (contiguous: classes 1 and 2, each pair_stride lists; lists of order
        # positions >= body_count are empty), so list pair_list(compact_classes[k], t) starts at entry
        # compact_start[k * pair_stride + t] of compact_pairs (an ndarray of (t, j), sized on the host).
        cc = self.compact_classes
        assert list(cc) == list(range(cc[0], cc[0] + len(cc)))
        n_compact_lists = len(cc) * n
        self.compact_start = ti.field(ti.i32, n_compact_lists + 1)
        self.compact_scan_scratch = ti.field(ti.i32, scan_scratch_size(n_compact_lists))
        self.compact_pairs = None
        # Static bodies by bucket (ranks, ModelBuilder.static_cells; set_static), in a Grid made for scenes with
        # static bodies: the others compile no static pass and every body sits in the cells.
        self.has_static = bool(static_cells)
        self.static_cells = VLA(self.table_size, ti.i32, name="static_cells") if static_cells else None
        self.static_bits = self.static_lo = self.static_hi = None
        if static_cells:
            self.static_bits = ti.Vector.field(3, ti.i32, ())   # (static_bucket)
            # each static body's world bounding box (m), by rank: a moving body meets it when its sphere comes near
            self.static_lo = ti.Vector.field(3, ti.f32, n)
            self.static_hi = ti.Vector.field(3, ti.f32, n)

    def compact_pairs_size(self, n: int) -> int:
        """Entries the compacted-pair buffer needs before a narrowphase of n bodies: every readable
        candidate pair of a compacted class sits in a distinct flat slot of grid.pairs (its lists' inline
        slots or the pool), so this bound holds until the pairs VLA's pool changes size: at a commit (or a
        reserve/from_csr/trim), never inside the launch that runs the candidate pairs and the narrowphase;
        find_contacts checks it before every attempt of that launch."""
        return len(self.compact_classes) * n * self.pairs.inline_capacity + \
            (self.pairs.slot_capacity - self.pairs.num_arrays * self.pairs.inline_capacity)

    def ensure_compact_pairs(self, n: int):
        """(Re)allocate compact_pairs when it may be too small (an ndarray: kernels take its size at run
        time, so this costs no recompilation). Room for 25% more than needed, so that it rarely happens.
        It never shrinks: a smaller scene loaded later keeps the larger buffer (4 bytes x 2 per entry)."""
        need = self.compact_pairs_size(n)
        if self.compact_pairs is None or self.compact_pairs.shape[0] < need:
            self.compact_pairs = ti.ndarray(ti.math.ivec2, shape=need + need // 4 + 16)
        return self.compact_pairs

    @ti.func
    def pair_list(self, c, t):
        """List of grid.pairs holding the class-c candidate pairs of order position t."""
        return c * self.pair_stride + t

    def set_static(self, builder, model):
        """List the static bodies of `builder` (app.sim.model.ModelBuilder, just written into `model`) in the buckets
        around them, for the cell size the model was given. Needed after every write of the bodies: the cell size
        follows the moving bodies. A Grid without static cells takes a definition without static bodies only."""
        import numpy as np

        if not self.has_static:
            if builder.static_count:
                raise ValueError("Grid.set_static: static bodies for a Grid made without static cells")
            return
        offsets, ranks, bits = builder.static_cells(float(model.grid_cell_size[None]), self.table_bits)
        self.static_cells.from_csr(offsets, ranks)
        self.static_bits[None] = [int(b) for b in bits]
        k = np.flatnonzero(builder.bodies["static"])   # (rank order)
        for field, key in ((self.static_lo, "box_lo"), (self.static_hi, "box_hi")):
            box = np.zeros((field.shape[0], 3), np.float32)
            box[:k.size] = builder.bodies[key][k]
            field.from_numpy(box)

    def reset(self):
        """Empty the candidate-pair lists (a newly loaded scene may have fewer bodies than the last one: the
        narrowphase's class-0 loop walks every pool chunk, whichever list owns it, and kernel_candidate_pairs
        empties only the first body_count lists of each class)."""
        self.pairs.clear_all()

    def build(self, model, state, dt, batch=None):
        """Rebuild the cell lists and body_order from the current positions (through vla.launch: no body is
        ever lost; the kernel empties the cells before filling them, so a re-run needs no roll back). With a
        vla.Batch, through it instead: the caller checks the batch (done(), or first_failure() several steps
        later, see app.sim.Simulation.advance) and builds again without one if it failed."""
        from vla import launch

        (batch.launch if batch is not None else launch)(kernel_grid_insert, model, state, self, dt,
                                                         vlas=[self.cells], rollback=False)
        kernel_wake_touched(model, state, self)

    def stats(self) -> dict:
        s = dict(self.cells.stats())
        s["table_size"] = self.table_size
        return s
