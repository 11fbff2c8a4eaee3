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

from app.integrator import kernel_integrate
from app.math3d import world_inv_inertia

vec3 = ti.types.vector(3, ti.f32)


@ti.func
def _material_of_other(model: ti.template(), other):
    m = 0
    if other >= 0:
        m = model.body_material[other]
    else:
        m = model.plane_material[-1 - other]
    return m


@ti.func
def _key_less(a, b):
    """Order of contact records inside one list: by other body, then by feature (determinism)."""
    return a.other < b.other or (a.other == b.other and a.feature < b.feature)


@ti.kernel
def kernel_prepare(model: ti.template(), state: ti.template(), lists: ti.template(), base: ti.i32,
                   prev_base: ti.i32, solver: ti.template(), contacts: ti.template(), order: ti.template(),
                   dt: ti.f32):
    """Per body: sort its list, warm-start from last step's list, compute restitution targets, apply
    gravity and the warm-start impulses into solver buffer 0, and count contacts.

    Reads state (poses and velocities at the start of the step), model, lists[prev_base + i], order (every
    body once; neighbours next to each other, see JacobiSolver.step).
    Writes lists[base + i] (impulses, bias), solver.vel/omega/pvel/pomega[0, i], solver.inv_inertia_world[i],
    contacts.contact_total (each pair counted once)."""
    g = model.gravity[None]
    warm = model.warm_start[None]
    threshold = model.restitution_threshold[None]
    n_bodies = model.body_count[None]
    contacts.contact_total[None] = 0
    for i in range(n_bodies):
        solver.inv_inertia_world[i] = world_inv_inertia(state.body_quat[i], model.body_inv_inertia[i])
    for t in range(n_bodies):
        i = order[t]
        li = base + i
        n = lists.length(li)
        # insertion sort: lists are short, and a fixed order makes the float sums (and therefore the motion)
        # independent of the order in which parallel threads appended
        for a in range(1, n):
            rec = lists.get(li, a)
            b = a - 1
            while b >= 0 and _key_less(rec, lists.get(li, b)):
                lists.set(li, b + 1, lists.get(li, b))
                b -= 1
            lists.set(li, b + 1, rec)
        inv_m = model.body_inv_mass[i]
        Iw = solver.inv_inertia_world[i]
        xi = state.body_pos[i]
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
            rec = lists.get(li, k)
            if rec.other > i or rec.other < 0:
                counted += 1
            while p < n_prev and _key_less(lists.get(lp, p), rec):
                p += 1
            rec.impulse_n = 0.0
            rec.impulse_t = vec3(0.0)
            rec.impulse_p = 0.0
            if p < n_prev:
                old = lists.get(lp, p)
                if old.other == rec.other and old.feature == rec.feature:
                    rec.impulse_n = warm * old.impulse_n
                    # the tangent plane turned a little since last step: keep the in-plane part
                    jt = old.impulse_t - old.impulse_t.dot(rec.normal) * rec.normal
                    rec.impulse_t = warm * jt
            # restitution target from the approach velocity before any impulse of this step
            j = rec.other
            vj = vec3(0.0)
            wj = vec3(0.0)
            xj = vec3(0.0)
            if j >= 0:
                vj = state.body_vel[j]
                if model.body_inv_mass[j] > 0.0:
                    vj = vj + g * dt
                wj = state.body_omega[j]
                xj = state.body_pos[j]
            ri = rec.point - xi
            rj = rec.point - xj
            vn0 = ((vi + wi.cross(ri)) - (vj + wj.cross(rj))).dot(rec.normal)
            e = ti.max(model.material_restitution[mi], model.material_restitution[_material_of_other(model, j)])
            bias = ti.min(rec.depth, 0.0) / dt   # speculative: may approach by the gap, no further
            if vn0 < -threshold and rec.depth > vn0 * dt:
                # it touches within this step: bounce
                bias = -e * vn0
            rec.bias = bias
            lists.set(li, k, rec)
            P = rec.impulse_n * rec.normal + rec.impulse_t
            P_sum += P
            L_sum += ri.cross(P)
        ti.atomic_add(contacts.contact_total[None], counted)
        solver.vel[0, i] = vi + inv_m * P_sum
        solver.omega[0, i] = wi + Iw @ L_sum
        solver.pvel[0, i] = vec3(0.0)
        solver.pomega[0, i] = vec3(0.0)


@ti.kernel
def kernel_solve_iteration(model: ti.template(), state: ti.template(), lists: ti.template(), base: ti.i32,
                           solver: ti.template(), order: ti.template(), src: ti.i32, dt: ti.f32):
    """One Jacobi + mass-splitting iteration: reads solver buffers [src], writes [1 - src] and each body's
    own contact records (accumulated impulses)."""
    dst = 1 - src
    slop = model.slop[None]
    beta = model.position_correction[None]
    for t in range(model.body_count[None]):
        i = order[t]
        li = base + i
        n_i = lists.length(li)
        inv_m = model.body_inv_mass[i]
        v = solver.vel[src, i]
        w = solver.omega[src, i]
        pv = solver.pvel[src, i]
        pw = solver.pomega[src, i]
        if inv_m > 0.0 and n_i > 0:
            Iw = solver.inv_inertia_world[i]
            xi = state.body_pos[i]
            mu_i = model.material_friction[model.body_material[i]]
            split_i = ti.cast(n_i, ti.f32)
            P_sum = vec3(0.0)
            L_sum = vec3(0.0)
            Pp_sum = vec3(0.0)
            Lp_sum = vec3(0.0)
            for k in range(n_i):
                rec = lists.get(li, k)
                j = rec.other
                n = rec.normal
                ri = rec.point - xi
                vj = vec3(0.0)
                wj = vec3(0.0)
                pvj = vec3(0.0)
                pwj = vec3(0.0)
                rj = vec3(0.0)
                inv_mj = 0.0
                Iwj = ti.Matrix.zero(ti.f32, 3, 3)
                split_j = 0.0
                if j >= 0:
                    vj = solver.vel[src, j]
                    wj = solver.omega[src, j]
                    pvj = solver.pvel[src, j]
                    pwj = solver.pomega[src, j]
                    rj = rec.point - state.body_pos[j]
                    inv_mj = model.body_inv_mass[j]
                    Iwj = solver.inv_inertia_world[j]
                    split_j = ti.cast(lists.length(base + j), ti.f32)
                mu = ti.sqrt(mu_i * model.material_friction[_material_of_other(model, j)])
                # effective inverse masses with split (n-times lighter) bodies; same value in both copies
                rin = ri.cross(n)
                rjn = rj.cross(n)
                k_i = split_i * (inv_m + rin.dot(Iw @ rin))
                k_j = split_j * (inv_mj + rjn.dot(Iwj @ rjn))
                kn = k_i + k_j
                vrel = (v + w.cross(ri)) - (vj + wj.cross(rj))
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
                    rit = ri.cross(tdir)
                    rjt = rj.cross(tdir)
                    kt = split_i * (inv_m + rit.dot(Iw @ rit)) + split_j * (inv_mj + rjt.dot(Iwj @ rjt))
                    jt = jt_old - vt / kt
                jt_len = jt.norm()
                jt_max = mu * jn
                if jt_len > jt_max:
                    jt = jt * (jt_max / jt_len)
                # split impulse: pseudo velocities remove (depth - slop), never feed back into v
                vpn = ((pv + pw.cross(ri)) - (pvj + pwj.cross(rj))).dot(n)
                target_p = beta * ti.max(rec.depth - slop, 0.0) / dt
                jp_old = rec.impulse_p
                jp = ti.max(jp_old + (target_p - vpn) / kn, 0.0)
                rec.impulse_n = jn
                rec.impulse_t = jt
                rec.impulse_p = jp
                lists.set(li, k, rec)
                dP = (jn - jn_old) * n + (jt - jt_old)
                P_sum += dP
                L_sum += ri.cross(dP)
                dPp = (jp - jp_old) * n
                Pp_sum += dPp
                Lp_sum += ri.cross(dPp)
            v = v + inv_m * P_sum
            w = w + Iw @ L_sum
            pv = pv + inv_m * Pp_sum
            pw = pw + Iw @ Lp_sum
        solver.vel[dst, i] = v
        solver.omega[dst, i] = w
        solver.pvel[dst, i] = pv
        solver.pomega[dst, i] = pw


@ti.data_oriented
class JacobiSolver:
    """Owns the iteration buffers and launches the kernels; `step(state_in, state_out, contacts, order, dt)`.

    vel, omega, pvel, pomega: vec3 f32 fields of shape (2, body_capacity): ping-pong buffers of velocity
        (m/s, rad/s) and split-impulse pseudo velocity; the buffer index is a runtime argument, so both
        directions share one compiled kernel.
    inv_inertia_world: mat3 f32 (body_capacity,), world-frame inverse inertia at the start of the step.
    iterations: host int, runtime (sim.solver_iterations; the viewer may change it).
    """

    def __init__(self, model, iterations: int = 10):
        self.model = model
        self.iterations = int(iterations)
        n = model.body_capacity
        self.vel = ti.Vector.field(3, ti.f32, (2, n))
        self.omega = ti.Vector.field(3, ti.f32, (2, n))
        self.pvel = ti.Vector.field(3, ti.f32, (2, n))
        self.pomega = ti.Vector.field(3, ti.f32, (2, n))
        self.inv_inertia_world = ti.Matrix.field(3, 3, ti.f32, n)

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
            kernel_solve_iteration(self.model, state_in, contacts.lists, contacts.base, self, order, src, dt)
            src = 1 - src
        kernel_integrate(self.model, state_in, state_out, self, src, dt, step_index, health)
