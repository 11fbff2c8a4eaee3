"""Contact solver: Jacobi iterations with mass splitting, gathered from each body's own contact list.

Method: Tonge, Benevolenski and Voroshilov, "Mass splitting for jitter-free parallel rigid body
simulation", ACM SIGGRAPH 2012. Each body with n contacts is split into n sub-bodies of mass m/n, one
per contact; every contact is solved against its sub-bodies in parallel from the previous iteration's
velocities (Jacobi), and the sub-body velocities are averaged back, which comes to

    v_i += inv_mass_i * sum_c dP_c,    w_i += I_i^-1 sum_c r_c x dP_c,

with each contact's effective mass built from n_i * inv_mass_i (and n_i * I_i^-1). The averaging makes
Jacobi converge where plain Jacobi over-shoots, so stacks stand without a sequential (Gauss-Seidel)
sweep or a graph colouring.

Gather, not scatter: a thread owns one body, walks that body's own list (contacts are stored in both
bodies' lists with mirrored normals), and writes only that body's velocity, so there are no atomics
in the iterations. The two copies of a pair contact see the same inputs and so compute the same
impulse (with opposite sign), keeping Newton's third law.

Per contact: a normal impulse (accumulated, clamped >= 0), a Coulomb friction impulse (accumulated
tangential vector, clamped to |P_t| <= mu * P_n with mu = sqrt(mu_a mu_b)), restitution as a target
normal velocity -e * v_n0 with e = max(e_a, e_b) when the approach is faster than
restitution_threshold, and position correction by split impulses (Catto 2006; Bullet's
"split impulse"): a separate pseudo-velocity solve removes position_correction * (depth - slop) per
step and is discarded after integration, so correcting penetration adds no kinetic energy (a
Baumgarte bias would make balls bounce higher than they fell). Last step's impulses warm-start this
step (matched by other body and feature id).
"""

import taichi as ti

from app.contacts import GEOMETRY_MEMBERS
from app.integrator import kernel_integrate
from app.math3d import world_inv_inertia

vec3 = ti.types.vector(3, ti.f32)

# A body's constants for one step (filled by kernel_prepare's first loop): what the body's own thread needs each
# iteration, and what prepare gathers of a contact's other body to build the pair constants in the record.
#   pos: vec3 m; inv_mass: 1/kg (0 fixed); inv_inertia_d, inv_inertia_o: the world-frame inverse inertia
#   R diag(I^-1) R^T (1/(kg m^2)) at the start of the step, symmetric, so 6 numbers (diagonal xx, yy, zz and
#   off-diagonal xy, xz, yz; see sym_mul) instead of 9; split: contacts in the body's list (mass-splitting
#   factor); friction: the body material's mu.
SolverBody = ti.types.struct(pos=vec3, inv_mass=ti.f32, inv_inertia_d=vec3, inv_inertia_o=vec3, split=ti.f32,
                             friction=ti.f32)
# Velocity and split-impulse pseudo velocity of a body (m/s, rad/s), one 48-byte record per body and buffer.
Motion = ti.types.struct(v=vec3, w=vec3, pv=vec3, pw=vec3)


@ti.func
def sym_pack(M):
    """(diagonal, off-diagonal xy xz yz) of a symmetric 3x3 matrix."""
    return vec3(M[0, 0], M[1, 1], M[2, 2]), vec3(M[0, 1], M[0, 2], M[1, 2])


@ti.func
def sym_mul(d, o, x):
    """S @ x for the symmetric S packed as (d, o) by sym_pack."""
    return vec3(d[0] * x[0] + o[0] * x[1] + o[1] * x[2],
                o[0] * x[0] + d[1] * x[1] + o[2] * x[2],
                o[1] * x[0] + o[2] * x[1] + d[2] * x[2])


@ti.func
def _material_of_other(model: ti.template(), other):
    m = 0
    if other >= 0:
        m = model.body_material[other]
    else:
        m = model.plane_material[-1 - other]
    return m


@ti.func
def _key_less(other_a, feature_a, other_b, feature_b):
    """Order of contact records inside one list: by other body, then by feature (determinism)."""
    return other_a < other_b or (other_a == other_b and feature_a < feature_b)


@ti.func
def _key_less_at(lists: ti.template(), li, a, other_b, feature_b):
    """Record a of list li before the key (other_b, feature_b)? Loads the two key members only, not the
    60-byte record."""
    return _key_less(lists.get_member(li, a, "other"), lists.get_member(li, a, "feature"), other_b, feature_b)


@ti.func
def _move_geometry(lists: ti.template(), li, src, dst):
    """Copy the members the narrowphase wrote (GEOMETRY_MEMBERS) of record src to record dst of list li."""
    for name in ti.static(GEOMETRY_MEMBERS):
        lists.set_member(li, dst, name, lists.get_member(li, src, name))


@ti.func
def _insertion_sort(lists: ti.template(), li, n):
    """Sort records 0..n-1 of list li by (other, feature) in place. Only the members the narrowphase wrote
    move (36 of the record's bytes): kernel_prepare writes all the others after the sort. Keys are compared
    member by member; records move only when one is out of place. Measured against a sort by rank (keys and
    ranks in local memory, each record moved at most once): kernel_prepare 4.25 ms with this, 6.52 ms with
    that (H200, landed pile_1m, ~10 records per list); the local arrays cost more than the moves they save."""
    for a in range(1, n):
        o_a = lists.get_member(li, a, "other")
        f_a = lists.get_member(li, a, "feature")
        b = a - 1
        # (a break, not `b >= 0 and ...`: Taichi evaluates both operands, which would read element -1)
        while b >= 0:
            if not _key_less(o_a, f_a, lists.get_member(li, b, "other"), lists.get_member(li, b, "feature")):
                break
            b -= 1
        if b + 1 < a:
            point = lists.get_member(li, a, "point")
            normal = lists.get_member(li, a, "normal")
            depth = lists.get_member(li, a, "depth")
            for c in range(a - b - 1):
                _move_geometry(lists, li, a - c - 1, a - c)
            lists.set_member(li, b + 1, "point", point)
            lists.set_member(li, b + 1, "normal", normal)
            lists.set_member(li, b + 1, "depth", depth)
            lists.set_member(li, b + 1, "other", o_a)
            lists.set_member(li, b + 1, "feature", f_a)


@ti.func
def arm_mass(r, d, o):
    """[r]x^T S [r]x packed like sym_pack, for the symmetric S packed as (d, o): the inverse effective mass
    that a unit impulse at arm r (m) adds through the inverse inertia S (1/(kg m^2)); for a unit direction u,
    u . arm_mass(r, S) u = (r x u) . S (r x u)."""
    S = ti.Matrix([[d[0], o[0], o[1]], [o[0], d[1], o[2]], [o[1], o[2], d[2]]], dt=ti.f32)
    R = ti.Matrix([[0.0, -r[2], r[1]], [r[2], 0.0, -r[0]], [-r[1], r[0], 0.0]], dt=ti.f32)
    return sym_pack(R.transpose() @ S @ R)


@ti.kernel
def kernel_prepare(model: ti.template(), state: ti.template(), lists: ti.template(), base: ti.i32,
                   prev_base: ti.i32, solver: ti.template(), contacts: ti.template(), order: ti.template(),
                   dt: ti.f32):
    """Per body: sort its list, warm-start from last step's list, compute restitution targets and the
    pair constants the iterations read (other arm, inverse effective mass matrix, friction), apply gravity
    and the warm-start impulses into solver buffer 0, and count contacts.

    Reads state (poses and velocities at the start of the step), model, lists[prev_base + i], order (every
    body once; neighbours next to each other, see JacobiSolver.step).
    Writes lists[base + i] (all members but the geometry, which it only reorders), solver.motion[0, i],
    solver.body[i], contacts.contact_total (each pair counted once).

    Three loops (each its own GPU kernel): the solver records; the sorts, whose lengths vary most from
    thread to thread; then the per-contact work, which needs every body's solver record."""
    g = model.gravity[None]
    warm = model.warm_start[None]
    threshold = model.restitution_threshold[None]
    n_bodies = model.body_count[None]
    contacts.contact_total[None] = 0
    for i in range(n_bodies):
        d, o = sym_pack(world_inv_inertia(state.body_quat[i], model.body_inv_inertia[i]))
        solver.body[i] = SolverBody(pos=state.body_pos[i], inv_mass=model.body_inv_mass[i], inv_inertia_d=d,
                                    inv_inertia_o=o, split=ti.cast(lists.length(base + i), ti.f32),
                                    friction=model.material_friction[model.body_material[i]])
    for t in range(n_bodies):
        # Sort the list by key (other body, feature): a fixed order makes the float sums (and therefore the
        # motion) independent of the order in which parallel threads appended, and lets the warm start
        # merge-walk last step's list.
        li = base + order[t]
        _insertion_sort(lists, li, lists.length(li))
    for t in range(n_bodies):
        i = order[t]
        li = base + i
        n = lists.length(li)
        bi = solver.body[i]
        inv_m = bi.inv_mass
        xi = bi.pos
        vi = state.body_vel[i]
        wi = state.body_omega[i]
        if inv_m > 0.0:
            vi = vi + g * dt
        mi = model.body_material[i]
        # merge-walk the previous (sorted) list
        lp = prev_base + i
        n_prev = lists.length(lp)
        p = 0
        P_sum = vec3(0.0)
        L_sum = vec3(0.0)
        counted = 0
        for k in range(n):
            j = lists.get_member(li, k, "other")
            feature = lists.get_member(li, k, "feature")
            normal = lists.get_member(li, k, "normal")
            point = lists.get_member(li, k, "point")
            depth = lists.get_member(li, k, "depth")
            if j > i or j < 0:
                counted += 1
            while p < n_prev:  # (a break for the same reason: no read past the previous list's end)
                if not _key_less_at(lists, lp, p, j, feature):
                    break
                p += 1
            impulse_n = 0.0
            impulse_t = vec3(0.0)
            if p < n_prev:
                if lists.get_member(lp, p, "other") == j and lists.get_member(lp, p, "feature") == feature:
                    impulse_n = warm * lists.get_member(lp, p, "impulse_n")
                    # the tangent plane turned a little since last step: keep the in-plane part
                    old_t = lists.get_member(lp, p, "impulse_t")
                    impulse_t = warm * (old_t - old_t.dot(normal) * normal)
            # the other body (a plane: fixed, no arm), its share of the pair constants
            vj = vec3(0.0)
            wj = vec3(0.0)
            bj = SolverBody(pos=point, inv_mass=0.0, inv_inertia_d=vec3(0.0), inv_inertia_o=vec3(0.0), split=0.0,
                            friction=0.0)
            if j >= 0:
                bj = solver.body[j]  # filled by the first loop
                vj = state.body_vel[j]
                if bj.inv_mass > 0.0:
                    vj = vj + g * dt
                wj = state.body_omega[j]
            else:
                bj.friction = model.material_friction[model.plane_material[-1 - j]]
            ri = point - xi
            rj = point - bj.pos
            # K = split_i (inv_m_i 1 + [ri]x^T I_i^-1 [ri]x) + split_j (same for j): mass splitting makes each
            # body n times lighter for each of its n contacts (same value in both copies of a pair contact)
            Ki_d, Ki_o = arm_mass(ri, bi.inv_inertia_d, bi.inv_inertia_o)
            Kj_d, Kj_o = arm_mass(rj, bj.inv_inertia_d, bj.inv_inertia_o)
            mass_d = bi.split * (inv_m + Ki_d) + bj.split * (bj.inv_mass + Kj_d)
            mass_o = bi.split * Ki_o + bj.split * Kj_o
            # restitution target from the approach velocity before any impulse of this step
            vn0 = ((vi + wi.cross(ri)) - (vj + wj.cross(rj))).dot(normal)
            e = ti.max(model.material_restitution[mi], model.material_restitution[_material_of_other(model, j)])
            bias = ti.min(depth, 0.0) / dt   # speculative: may approach by the gap, no further
            if vn0 < -threshold and depth > vn0 * dt:
                # it touches within this step: bounce
                bias = -e * vn0
            # (the members this kernel owns; the geometry stays as the narrowphase wrote it)
            lists.set_member(li, k, "impulse_n", impulse_n)
            lists.set_member(li, k, "impulse_t", impulse_t)
            lists.set_member(li, k, "impulse_p", 0.0)
            lists.set_member(li, k, "bias", bias)
            lists.set_member(li, k, "arm_other", rj)
            lists.set_member(li, k, "mass_d", mass_d)
            lists.set_member(li, k, "mass_o", mass_o)
            lists.set_member(li, k, "friction", ti.sqrt(bi.friction * bj.friction))
            P = impulse_n * normal + impulse_t
            P_sum += P
            L_sum += ri.cross(P)
        ti.atomic_add(contacts.contact_total[None], counted)
        solver.motion[0, i] = Motion(v=vi + inv_m * P_sum, w=wi + sym_mul(bi.inv_inertia_d, bi.inv_inertia_o, L_sum),
                                     pv=vec3(0.0), pw=vec3(0.0))


@ti.kernel
def kernel_solve_iteration(model: ti.template(), lists: ti.template(), base: ti.i32, solver: ti.template(),
                           order: ti.template(), src: ti.i32, dt: ti.f32):
    """One Jacobi + mass-splitting iteration: reads solver.motion[src], the body's own solver record and
    contact list, and of each other body only its velocities (solver.motion[src, j]: the rest of what a
    contact needs of it, kernel_prepare put in the record); writes solver.motion[1 - src] and the
    accumulated impulses of each body's own contact records (those three members only)."""
    dst = 1 - src
    slop = model.slop[None]
    beta = model.position_correction[None]
    for t in range(model.body_count[None]):
        i = order[t]
        li = base + i
        n_i = lists.length(li)
        bi = solver.body[i]
        mo = solver.motion[src, i]
        v = mo.v
        w = mo.w
        pv = mo.pv
        pw = mo.pw
        if bi.inv_mass > 0.0 and n_i > 0:
            xi = bi.pos
            P_sum = vec3(0.0)
            L_sum = vec3(0.0)
            Pp_sum = vec3(0.0)
            Lp_sum = vec3(0.0)
            for k in range(n_i):
                rec = lists.get(li, k)
                j = rec.other
                n = rec.normal
                ri = rec.point - xi
                rj = rec.arm_other
                mj = Motion(v=vec3(0.0), w=vec3(0.0), pv=vec3(0.0), pw=vec3(0.0))
                if j >= 0:
                    mj = solver.motion[src, j]
                kn = n.dot(sym_mul(rec.mass_d, rec.mass_o, n))
                vrel = (v + w.cross(ri)) - (mj.v + mj.w.cross(rj))
                vn = vrel.dot(n)
                jn_old = rec.impulse_n
                jn = ti.max(jn_old + (rec.bias - vn) / kn, 0.0)
                # friction: drive the tangential slip to zero, inside the Coulomb cone
                vt = vrel - vn * n
                jt_old = rec.impulse_t
                jt = jt_old
                vt_len = vt.norm()
                if vt_len > 1e-9:
                    tdir = vt / vt_len
                    kt = tdir.dot(sym_mul(rec.mass_d, rec.mass_o, tdir))
                    jt = jt_old - vt / kt
                jt_len = jt.norm()
                jt_max = rec.friction * jn
                if jt_len > jt_max:
                    jt = jt * (jt_max / jt_len)
                # split impulse: pseudo velocities remove (depth - slop), never feed back into v
                vpn = ((pv + pw.cross(ri)) - (mj.pv + mj.pw.cross(rj))).dot(n)
                target_p = beta * ti.max(rec.depth - slop, 0.0) / dt
                jp_old = rec.impulse_p
                jp = ti.max(jp_old + (target_p - vpn) / kn, 0.0)
                lists.set_member(li, k, "impulse_n", jn)
                lists.set_member(li, k, "impulse_t", jt)
                lists.set_member(li, k, "impulse_p", jp)
                dP = (jn - jn_old) * n + (jt - jt_old)
                P_sum += dP
                L_sum += ri.cross(dP)
                dPp = (jp - jp_old) * n
                Pp_sum += dPp
                Lp_sum += ri.cross(dPp)
            v = v + bi.inv_mass * P_sum
            w = w + sym_mul(bi.inv_inertia_d, bi.inv_inertia_o, L_sum)
            pv = pv + bi.inv_mass * Pp_sum
            pw = pw + sym_mul(bi.inv_inertia_d, bi.inv_inertia_o, Lp_sum)
        solver.motion[dst, i] = Motion(v=v, w=w, pv=pv, pw=pw)


@ti.data_oriented
class JacobiSolver:
    """Owns the iteration buffers and launches the kernels; `step(state_in, state_out, contacts, order, dt)`.

    motion: Motion (v, w, pv, pw: vec3 f32) field of shape (2, body_capacity): ping-pong buffers of velocity
        (m/s, rad/s) and split-impulse pseudo velocity; the buffer index is a runtime argument, so both
        directions share one compiled kernel. One record per body: a contact gathers the other body's four
        vectors from one place.
    body: SolverBody (body_capacity,): position, inverse mass, world-frame inverse inertia, contact count and
        friction of each body at the start of the step (kernel_prepare).
    iterations: host int, runtime (sim.solver_iterations; the viewer may change it).
    """

    def __init__(self, model, iterations: int = 10):
        self.model = model
        self.iterations = int(iterations)
        n = model.body_capacity
        self.motion = Motion.field(shape=(2, n))
        self.body = SolverBody.field(shape=n)

    def step(self, state_in, state_out, contacts, order, dt: float, step_index: int = 0, health=None):
        """Solve this step's contacts (already in contacts.lists[contacts.base + i]) and integrate
        state_in -> state_out. state_in may be state_out: integration reads and writes only each body's
        own slots.

        order: i32 field holding every body index once, in the order threads take them (app.broadphase.Grid
        .body_order: sorted by grid cell, so a warp gathers neighbours that share contacts: the other body's
        velocity is then mostly in cache). Any permutation gives the same result: each thread writes only
        its own body, from the previous iteration's buffers."""
        kernel_prepare(self.model, state_in, contacts.lists, contacts.base, contacts.prev_base, self, contacts,
                       order, dt)
        src = 0
        for _ in range(self.iterations):
            kernel_solve_iteration(self.model, contacts.lists, contacts.base, self, order, src, dt)
            src = 1 - src
        kernel_integrate(self.model, state_in, state_out, self, src, dt, step_index, health)
