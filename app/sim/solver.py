"""Contact solver: Jacobi iterations with mass splitting, gathered from each body's own contact list.

Method: Tonge, Benevolenski and Voroshilov, "Mass splitting for jitter-free parallel rigid body
simulation", ACM SIGGRAPH 2012, with one sub-body per touching pair rather than per contact point. Each body
touching n others is split into n sub-bodies of mass m/n, one per pair; every pair is solved against its
sub-bodies in parallel from the previous iteration's velocities (Jacobi), its points one after the other
(Gauss-Seidel within the pair, forwards and backwards in turn), and the sub-body velocities are averaged back,
which comes to

    v_i += inv_mass_i * sum_c dP_c,    w_i += I_i^-1 sum_c r_c x dP_c,

with each contact's effective mass built from n_i * inv_mass_i (and n_i * I_i^-1). The averaging makes
Jacobi converge where plain Jacobi over-shoots, so stacks stand without a sequential sweep over the bodies or a
graph colouring. Split per point, a box resting on a box splits 8 ways, and a column of boxes converges slowly: at
10 iterations a 20-box column sagged 11 mm, still moving at 0.02 m/s after 3 s, and a box 100 times as dense as the
two below it sank up to 23 mm; split per pair, 4 mm at 1.3e-3 m/s, and at most 4.9 mm (docs/benchmarks.md).

Gather, not scatter: a thread owns one body, walks that body's own list (contacts are stored in both
bodies' lists with mirrored normals), and writes only that body's velocity, so there are no atomics
in the iterations. The two copies of a pair contact see the same inputs and so compute the same
impulse (with opposite sign), keeping Newton's third law.

Per contact: a normal impulse (accumulated, clamped >= 0), a Coulomb friction impulse (accumulated
tangential vector, clamped to |P_t| <= mu * P_n with mu = sqrt(mu_a mu_b)), restitution in an impact pass
before the iterations (impact_pass: contacts closing faster than restitution_threshold collide, and an
impact travels along chains of touching bodies), and position correction by split impulses (Catto 2006; Bullet's
"split impulse"): a separate pseudo-velocity solve removes position_correction * (depth - slop) per
step and is discarded after integration, so correcting penetration adds no kinetic energy (a
Baumgarte bias would make balls bounce higher than they fell). Last step's impulses warm-start this
step (matched by other body and feature id; a pair whose manifold changed starts from the normal impulse it ended
last step with: app.sim.narrowphase._pair_warm_scale); the narrowphase sets them, and each speculative target, once
per pair when it appends the pair's two copies (app.sim.narrowphase._emit_contacts), and marks the bodies of
contacts that collide for the impact pass.
"""

import numpy as np
import taichi as ti

from app.sim.contacts import first_copy, first_copy_feature, pair_place, record_normal, skipping
from app.sim.integrator import kernel_integrate
from app.sim.load_paths import NORMAL_WARM, PASS_CHUNK, LoadPaths, StackProbe
from app.sim.state import asleep
from app.sim.math3d import contact_tangents, quat_to_mat, tangent_coords, tangent_vector, world_inv_inertia
from app.sim.solver_records import (BODY_WORDS, MOTION_WORDS, Motion, SolverBody, pack_body, pack_motion,
                                    unpack_body, unpack_motion)

vec3 = ti.types.vector(3, ti.f32)

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


# Sums over a contact list in fixed point, so that they do not depend on the order of the list. Threads
# append contacts in whatever order they race, and a float sum's rounding depends on its order; an integer
# sum does not. So the motion is bit-identical whichever order the appends took, on any backend and with any
# storage, without sorting the lists (an insertion sort per list, in a loop of its own, took 3.46 ms of a
# landed pile_1m step on the H200; prepare without it 2.3 ms). This needs each term rounded the same wherever
# its record sits in the list: Taichi's fast math lets the compiler round a term's float operations
# differently in different code paths (on the CPU most likely a vectorized loop body and its scalar
# remainder), so the app runs with fast_math=False (app.runtime.TAICHI_OPTIONS).
# Each body sums its impulses scaled by FIXED_ONE * inverse mass, i.e. its velocity changes in units of
# 2^-32 m/s, and its torques r x P scaled by FIXED_ONE * the largest diagonal element of its world inverse
# inertia, i.e. angular velocity changes in units of about 2^-32 rad/s whatever the body's size (with the mass
# scale, a 1 mm sphere's quantum would be 6e-4 rad/s). Each term is truncated: a bias below one quantum per
# term. Range: 2^31 m/s (rad/s) per term and per sum; a larger term converts to the saturated or most negative
# integer, a speed the health check reports. A NaN or infinite term would become some integer (0 on CUDA),
# so each body also keeps a float check sum of its terms, tested on its bits (flag_non_finite): under fast
# math (Taichi's default) the compiler may assume floats are finite and fold a float test such as x != x.
FIXED_ONE = 2.0 ** 32
ivec3 = ti.types.vector(3, ti.i64)
# A speed the health check reports as non-finite (it treats |v| >= 1e30 as NaN or infinity).
NON_FINITE_SPEED = 1e35


@ti.func
def fixed(x, scale):
    """The vec3 x * scale, truncated to 64-bit integers (terms of an order-independent sum)."""
    return ti.cast(x * scale, ti.i64)


@ti.func
def unfixed(a, scale):
    """Back from fixed(): the f32 vec3 a / scale (scale > 0)."""
    return ti.cast(a, ti.f32) / scale


@ti.func
def non_finite(x):
    """x (f32) is NaN or infinite, decided on its exponent bits, which fast math cannot assume away."""
    return (ti.bit_cast(x, ti.u32) & ti.u32(0x7F800000)) == ti.u32(0x7F800000)


@ti.func
def flag_non_finite(v, check):
    """v, or a velocity the health check reports as non-finite if the check sum of the terms behind v is NaN
    or infinite: a non-finite impulse reaches the health check through the fixed-point sums (which would
    have hidden it), as it would through a float sum."""
    out = v
    if non_finite(check):
        out = vec3(NON_FINITE_SPEED)
    return out


@ti.func
def fixed_scale(inv):
    """Fixed-point scale for a body's sums (see FIXED_ONE) from its inverse mass (linear) or the largest
    diagonal element of its inverse inertia (angular); 1 for a fixed body, whose sums are multiplied by 0."""
    return ti.select(inv > 0.0, FIXED_ONE * inv, 1.0)


@ti.func
def angular_scale(inv_inertia_d):
    return fixed_scale(ti.max(inv_inertia_d[0], ti.max(inv_inertia_d[1], inv_inertia_d[2])))


@ti.func
def torsional_impulse(model: ti.template(), state: ti.template(), lists: ti.template(), base, i, spin_i, friction_i,
                      rec, normal, patch):
    """Torsional friction of contact rec of body i (its normal `normal` pushes i): the angular impulse (N m s,
    about the normal) that resists the pair's relative spin about the normal, once per step, before the iterations:
    at most mu * patch * the contact's warm-start normal impulse (a contact patch of radius `patch`, m, under
    Coulomb friction mu = sqrt(mu_i mu_j); MuJoCo's torsional friction, condim 4), and at most what stops the
    relative spin. Only for pairs that touch at one point (a sphere, a capsule's end, an edge on an edge): at a
    manifold's several points their friction already resists the spin, as a patch does. Without it nothing stops a
    sphere spinning about the normal of its one contact, and a settled pile with a spinning ball in it never
    sleeps.

    Mass splitting as the iterations: each body counts as split among all its records (spin_i: i's record count
    times the largest diagonal element of its body-frame inverse inertia, an upper bound of n . I^-1 n in any
    orientation), so that a body's contacts together never reverse its spin. Both copies of a pair contact compute
    the same impulse from the same inputs, in the same order up to the commutative sum spin_i + spin_j, and apply
    it with opposite normals. The other body's spin is the start of the step's (a kinematic body's own; a fixed
    body or a plane does not turn)."""
    j = rec.other
    wj = vec3(0.0)
    spin_j = 0.0
    friction_j = 0.0
    if j >= 0:
        wj = state.body_omega[j]
        if model.body_inv_mass[j] > 0.0:
            spin_j = ti.cast(lists.length(base + j), ti.f32) * model.body_inv_inertia[j].max()
        friction_j = model.material_friction[model.body_material[j]]
    else:
        friction_j = model.material_friction[model.plane_material[-1 - j]]
    limit = ti.sqrt(friction_i * friction_j) * patch * rec.impulse_n
    spin = (state.body_omega[i] - wj).dot(normal)
    return ti.math.clamp(-spin / (spin_i + spin_j), -limit, limit)


@ti.kernel
def kernel_prepare(model: ti.template(), state: ti.template(), lists: ti.template(), base: ti.i32,
                   solver: ti.template(), contacts: ti.template(), diagnostics: ti.template(), dt: ti.f32):
    """Per body (a sleeping one stays still and counts as fixed: app.sim.state.asleep): apply gravity, the
    warm-start impulses its contacts already carry (the narrowphase set them, and each speculative target, from
    last step's lists: app.sim.narrowphase) and their torsional friction (torsional_impulse) into solver buffers 0
    and 1, and count contacts; then the impact pass (impact_pass). The lists stay in the order the narrowphase
    appended them (any order gives the same motion: see FIXED_ONE).

    Reads state (poses and velocities at the start of the step), model, lists[base + i] (and the lengths of the
    other bodies' lists). Thread i takes body i (see JacobiSolver.step).
    Writes solver.motion[0, i] and [1, i], solver.body[i], diagnostics.contact_total (each pair counted once), and for the
    padded and dynamic storages moves the fill's dropped appends into lists.overflow_count. Nothing while
    contacts.skipping() (see app.sim.contacts.ContactSet.failed_step)."""
    g = model.gravity[None]
    torsional = model.torsional_friction[None]
    run = not contacts.skipping()
    n_bodies = ti.select(run, model.body_count[None], 0)
    if run:
        diagnostics.contact_total[None] = 0
        if ti.static(hasattr(lists, "dropped_now")):   # padded / dynamic: the drops of the fill this step solves
            lists.overflow_count[None] += lists.dropped_now[None]
            lists.dropped_now[None] = 0
    for i in range(n_bodies):
        # (one loop: a thread writes only its own body's records here, and reads only the state of the others)
        li = base + i
        n = lists.length(li)
        R = quat_to_mat(state.body_quat[i])
        d, o = sym_pack(world_inv_inertia(R, model.body_inv_inertia[i]))
        inv_mass = model.body_inv_mass[i]
        vi = state.body_vel[i]
        wi = state.body_omega[i]
        sleeping = asleep(model, state, i)
        if sleeping:   # still, and fixed for the bodies it touches (app.sim.state.asleep)
            inv_mass = 0.0
            d = vec3(0.0)
            o = vec3(0.0)
            vi = vec3(0.0)
            wi = vec3(0.0)
        bi = SolverBody(pos=state.body_pos[i], inv_mass=inv_mass, inv_inertia_d=d, inv_inertia_o=o,
                        split=0.0, friction=model.material_friction[model.body_material[i]])
        inv_m = bi.inv_mass
        xi = bi.pos
        if inv_m > 0.0:
            vi = vi + g * dt
            if i == state.ext_body[None]:   # an external force (Simulation.set_external_force)
                f = state.ext_force[None]
                vi = vi + inv_m * dt * f
                wi = wi + sym_mul(d, o, (state.ext_point[None] - xi).cross(f) * dt)
        scale = fixed_scale(inv_m)
        scale_w = angular_scale(bi.inv_inertia_d)
        P_sum = ivec3(0)
        L_sum = ivec3(0)
        check = 0.0
        counted = 0
        pairs = 0   # touching pairs: mass splitting makes one sub-body of each (solve_iteration)
        spin_i = ti.cast(n, ti.f32) * model.body_inv_inertia[i].max()   # (torsional friction, below)
        # A sleeper's impulses move nothing (no mass, no velocity: its motion is exactly zero either way), so it
        # only counts its records, one member each: in a settled pile that is most of this loop's bodies.
        n_moving = n
        if sleeping:
            n_moving = 0
            for k in range(n):
                feature = lists.get_member(li, k, "feature")
                counted += ti.select(first_copy_feature(feature), 1, 0)
                pairs += ti.select(pair_place(feature)[0] == 0, 1, 0)
        for k in range(n_moving):
            rec = lists.get(li, k)
            if first_copy(rec):
                counted += 1
            rank, count = pair_place(rec.feature)
            if rank == 0:
                pairs += 1
            normal = record_normal(rec)
            t1, t2 = contact_tangents(normal)
            P = rec.impulse_n * normal + tangent_vector(rec.impulse_t, t1, t2)
            L = (rec.point - xi).cross(P)
            if torsional > 0.0 and inv_m > 0.0 and count == 1:
                L += torsional_impulse(model, state, lists, base, i, spin_i, bi.friction, rec, normal,
                                       torsional) * normal
            P_sum += fixed(P, scale)
            L_sum += fixed(L, scale_w)
            check += P.sum() + L.sum()
        bi.split = ti.cast(pairs, ti.f32)
        solver.body[i] = pack_body(bi)
        ti.atomic_add(diagnostics.contact_total[None], counted)
        packed = pack_motion(Motion(v=flag_non_finite(vi + inv_m * unfixed(P_sum, scale), check),
                                    w=wi + sym_mul(bi.inv_inertia_d, bi.inv_inertia_o, unfixed(L_sum, scale_w)),
                                    pv=vec3(0.0), pw=vec3(0.0)))
        solver.motion[0, i] = packed
        solver.motion[1, i] = packed   # (the impact pass writes only the bodies it moves: impact_pass)
    impact_pass(model, lists, base, solver, contacts, dt)


# Jacobi iterations per kernel launch, unrolled at compile time. Taichi runs a kernel's top-level loops one
# after the other, each finished everywhere before the next starts, which is all an iteration needs of the
# one before it; and a launch costs the host more than a small scene's iteration costs the device (CPU,
# 3-body bounce scene, Simulation.step in a loop: 1.97 -> 1.50 ms per step with 10 iterations in two launches
# instead of ten). Iterations beyond a multiple of the batch run one per launch, so any iteration count (the
# viewer's slider) uses the same two compiled kernels.
ITERATION_BATCH = 5
# Probes of the stacks' depth while the load-path correction is off (StackProbe: PASS_CHUNK passes over the
# contacts, about as much as one Jacobi iteration; the probing step is checked at once): each of a scene's first
# PROBE_FIRST steps, then every PROBE_STEPS steps (a stack that builds up is found within 0.13 s at the default dt).
PROBE_FIRST = 16
PROBE_STEPS = 64



@ti.kernel
def kernel_solve_iterations(model: ti.template(), lists: ti.template(), base: ti.i32, solver: ti.template(),
                            src: ti.i32, count: ti.template(), dt: ti.f32, failed_step: ti.template()):
    """`count` (compile time) Jacobi iterations, the first reading solver.motion[src]; iteration c writes
    buffer (src + c + 1) % 2. None while skipping(failed_step) (app.sim.contacts.ContactSet.failed_step:
    the lists at `base` may then be last step's, which a redo needs unchanged)."""
    n = ti.select(skipping(failed_step), 0, model.body_count[None])
    for c in ti.static(range(count)):
        solve_iteration(model, lists, base, solver, (src + c) % 2, dt, n)


@ti.func
def _sub_body_kick(v, w, split_inv_m, split, Id, Io, r, dP):
    """A sub-body's (mass m / split) velocities after impulse dP at arm r."""
    return v + split_inv_m * dP, w + split * sym_mul(Id, Io, r.cross(dP))


@ti.func
def solve_iteration(model: ti.template(), lists: ti.template(), base, solver: ti.template(), src, dt, n_bodies):
    """One Jacobi + mass-splitting iteration over bodies 0 .. n_bodies - 1: reads solver.motion[src] and
    solver.body, writes solver.motion[1 - src] and the accumulated impulses of each body's own contact records
    (those three members only: the rest of a record is read-only here). Call at a kernel's top level (its loop
    must stay a top-level loop to run in parallel)."""
    for i in range(n_bodies):
        dst = 1 - src
        slop = model.slop[None]
        beta_per_dt = model.position_correction[None] / dt
        li = base + i
        n_i = lists.length(li)
        bi = unpack_body(solver.body[i])
        mo = unpack_motion(solver.motion[src, i])
        v = mo.v
        w = mo.w
        pv = mo.pv
        pw = mo.pw
        if bi.inv_mass > 0.0 and n_i > 0:
            inv_m = bi.inv_mass
            Id = bi.inv_inertia_d
            Io = bi.inv_inertia_o
            xi = bi.pos
            split_i = bi.split
            scale = fixed_scale(inv_m)
            scale_w = angular_scale(Id)
            P_sum = ivec3(0)
            L_sum = ivec3(0)
            Pp_sum = ivec3(0)
            Lp_sum = ivec3(0)
            check = 0.0
            # One sub-body per touching pair (Tonge et al. split a body per contact point; a box resting on a box
            # would split 8 ways and converge as slowly as Jacobi over 8 bodies). A pair's points sit in consecutive
            # slots of the list, in the same order in both copies (app.sim.narrowphase._emit_contacts), and are
            # solved one after the other against the pair's own copies of its two sub-bodies: forwards in one
            # iteration and backwards in the next (a sweep in one direction alone tilts the pair, its first point
            # taking more than its share). The loop stays one pass over the list, a record a turn, so that a warp's
            # threads keep in step whatever their pairs' sizes; the other body is loaded once per pair.
            down = src == 1
            mj = Motion(v=vec3(0.0), w=vec3(0.0), pv=vec3(0.0), pw=vec3(0.0))
            bj = SolverBody(pos=xi, inv_mass=0.0, inv_inertia_d=vec3(0.0), inv_inertia_o=vec3(0.0), split=0.0,
                            friction=0.0)
            mu = 0.0
            vi_l = v
            wi_l = w
            pvi_l = pv
            pwi_l = pw
            vj_l = v
            wj_l = w
            pvj_l = pv
            pwj_l = pw
            for k in range(n_i):
                # backwards: the whole list from its end, which walks each pair's points in reverse (the order of
                # the pairs does not matter: each starts from the bodies' velocities, and the sums are exact)
                q = ti.select(down, n_i - 1 - k, k)
                rec = lists.get(li, q)
                j = rec.other
                rank, count = pair_place(rec.feature)
                step = ti.select(down, count - 1 - rank, rank)   # the point's turn within its pair this iteration
                if step == 0:   # a new pair: its sub-bodies start from the bodies' velocities
                    mj = Motion(v=vec3(0.0), w=vec3(0.0), pv=vec3(0.0), pw=vec3(0.0))
                    bj = SolverBody(pos=xi, inv_mass=0.0, inv_inertia_d=vec3(0.0), inv_inertia_o=vec3(0.0),
                                    split=0.0, friction=0.0)
                    if j >= 0:
                        mj = unpack_motion(solver.motion[src, j])
                        bj = unpack_body(solver.body[j])
                    else:
                        bj.friction = model.material_friction[model.plane_material[-1 - j]]
                    mu = ti.sqrt(bi.friction * bj.friction)
                    vi_l = v
                    wi_l = w
                    pvi_l = pv
                    pwi_l = pw
                    vj_l = mj.v
                    wj_l = mj.w
                    pvj_l = mj.pv
                    pwj_l = mj.pw
                inv_mj = bj.inv_mass
                split_j = bj.split
                n = record_normal(rec)
                ri = rec.point - xi
                rj = rec.point - ti.select(j >= 0, bj.pos, rec.point)
                # effective inverse masses with split (n-times lighter) bodies; same value in both copies
                rin = ri.cross(n)
                rjn = rj.cross(n)
                k_i = split_i * (inv_m + rin.dot(sym_mul(Id, Io, rin)))
                k_j = split_j * (inv_mj + rjn.dot(sym_mul(bj.inv_inertia_d, bj.inv_inertia_o, rjn)))
                kn = k_i + k_j
                inv_kn = 1.0 / kn  # (one division for the normal and the split impulse)
                vrel = (vi_l + wi_l.cross(ri)) - (vj_l + wj_l.cross(rj))
                vn = vrel.dot(n)
                jn_old = rec.impulse_n
                jn = ti.max(jn_old + (rec.bias - vn) * inv_kn, 0.0)
                # friction: drive the tangential slip to zero, inside the Coulomb cone (accumulated in 3-D,
                # stored as coordinates along this contact's tangents)
                vt = vrel - vn * n
                t1, t2 = contact_tangents(n)
                jt_old = tangent_vector(rec.impulse_t, t1, t2)
                jt = jt_old
                vt_len2 = vt.dot(vt)
                if vt_len2 > 1e-18:
                    tdir = vt * ti.rsqrt(vt_len2)
                    rit = ri.cross(tdir)
                    rjt = rj.cross(tdir)
                    kt = split_i * (inv_m + rit.dot(sym_mul(Id, Io, rit))) + \
                        split_j * (inv_mj + rjt.dot(sym_mul(bj.inv_inertia_d, bj.inv_inertia_o, rjt)))
                    jt = jt_old - vt * (1.0 / kt)
                jt_len2 = jt.dot(jt)
                jt_max = mu * jn
                if jt_len2 > jt_max * jt_max:
                    jt = jt * (jt_max * ti.rsqrt(jt_len2))
                # split impulse: pseudo velocities remove (depth - slop), never feed back into v
                vpn = ((pvi_l + pwi_l.cross(ri)) - (pvj_l + pwj_l.cross(rj))).dot(n)
                target_p = beta_per_dt * ti.max(rec.depth - slop, 0.0)
                jp_old = rec.impulse_p
                jp = ti.max(jp_old + (target_p - vpn) * inv_kn, 0.0)
                rec.impulse_n = jn
                rec.impulse_t = tangent_coords(jt, t1, t2)
                jt = tangent_vector(rec.impulse_t, t1, t2)   # (apply what is stored, to the last bit)
                rec.impulse_p = jp
                lists.set_members(li, q, rec, ("impulse_n", "impulse_t", "impulse_p"))
                djn = jn - jn_old
                djt = jt - jt_old
                djp = jp - jp_old
                # (r x n is rin: the normal parts' torques need no cross product of their own)
                dP = djn * n + djt
                dL = djn * rin + ri.cross(djt)
                P_sum += fixed(dP, scale)
                L_sum += fixed(dL, scale_w)
                Pp_sum += fixed(djp * n, scale)
                Lp_sum += fixed(djp * rin, scale_w)
                check += dP.sum() + dL.sum() + djp
                if step < count - 1:
                    # the pair's sub-bodies move on for its next point (each copy moves both the same way: j's
                    # copy sees -dP, an exact negation). A plane or a fixed body does not move, and a point that
                    # changed no split impulse (not deeper than the slop) moves no pseudo velocity.
                    vi_l, wi_l = _sub_body_kick(vi_l, wi_l, split_i * inv_m, split_i, Id, Io, ri, dP)
                    if inv_mj > 0.0:
                        vj_l, wj_l = _sub_body_kick(vj_l, wj_l, split_j * inv_mj, split_j, bj.inv_inertia_d,
                                                    bj.inv_inertia_o, rj, -dP)
                    if djp != 0.0:
                        pvi_l, pwi_l = _sub_body_kick(pvi_l, pwi_l, split_i * inv_m, split_i, Id, Io, ri, djp * n)
                        if inv_mj > 0.0:
                            pvj_l, pwj_l = _sub_body_kick(pvj_l, pwj_l, split_j * inv_mj, split_j,
                                                          bj.inv_inertia_d, bj.inv_inertia_o, rj, -(djp * n))
            v = flag_non_finite(v + inv_m * unfixed(P_sum, scale), check)
            w = w + sym_mul(Id, Io, unfixed(L_sum, scale_w))
            pv = pv + inv_m * unfixed(Pp_sum, scale)
            pw = pw + sym_mul(Id, Io, unfixed(Lp_sum, scale_w))
        solver.motion[dst, i] = pack_motion(Motion(v=v, w=w, pv=pv, pw=pw))


# Impact iterations a step: how far an impact travels along a chain of touching bodies (one contact an
# iteration: a five-ball Newton's cradle needs four). Even, so that the pass ends in motion buffer 0.
IMPACT_ITERATIONS = 6


@ti.func
def _impact_colliding(model: ti.template(), solver: ti.template(), contacts: ti.template(), src, bi, mi, material_i,
                      rec, dt):
    """(colliding, vn, n, ri, rj, bj, e) of a contact rec of a marked body (bi, mi: its SolverBody and motion) with the
    velocities of motion[src]: it collides in this impact iteration if it closes faster than the restitution threshold
    and within this step, and the other body (if not a plane) is marked too, so that both copies take part."""
    j = rec.other
    n = record_normal(rec)
    mj = Motion(v=vec3(0.0), w=vec3(0.0), pv=vec3(0.0), pw=vec3(0.0))
    bj = SolverBody(pos=rec.point, inv_mass=0.0, inv_inertia_d=vec3(0.0), inv_inertia_o=vec3(0.0),
                    split=0.0, friction=0.0)
    mat_j = 0
    if j >= 0:
        mj = unpack_motion(solver.motion[src, j])
        bj = unpack_body(solver.body[j])
        mat_j = model.body_material[j]
    else:
        mat_j = model.plane_material[-1 - j]
    ri = rec.point - bi.pos
    rj = rec.point - bj.pos
    vn = ((mi.v + mi.w.cross(ri)) - (mj.v + mj.w.cross(rj))).dot(n)
    e = ti.max(model.material_restitution[material_i], model.material_restitution[mat_j])
    colliding = vn < -model.restitution_threshold[None] and rec.depth > vn * dt and e > 0.0 and \
        (j < 0 or contacts.impact_dirty[src, j] != 0)
    return colliding, vn, n, ri, rj, bj, e


@ti.func
def impact_pass(model: ti.template(), lists: ti.template(), base, solver: ti.template(), contacts: ti.template(),
                dt):
    """Restitution, before the contact iterations: IMPACT_ITERATIONS Jacobi iterations of collisions on
    solver.motion (buffer 0 -> 1 -> 0 ...). Runs at the end of kernel_prepare (a launch of its own would cost a
    small scene's step more than the pass); call at a kernel's top level.

    In each iteration, every contact closing faster than the restitution threshold (and within the step) is
    resolved as a collision of its own: the relative normal velocity vn becomes -e vn, with e = max(e_a, e_b),
    each body's mass split among its contacts that collide in this iteration (Tonge's mass splitting, over the
    colliding contacts only). A body an impact changed makes itself and every body it touches take part in the
    next iteration, so an impact travels along a chain of touching bodies one contact an iteration: the first
    ball of a Newton's cradle stops, the impact crosses the row, the last ball leaves (Guendelman, Bridson and
    Fedkiw 2003 separate collisions from contacts the same way). A collision target fixed from the velocities
    before the solve (Box2D's restitution pass) treats a chain's resting contacts as inelastic and sends the first
    ball back. The contact iterations after this see the separating velocities and keep them.

    Work: only the bodies the narrowphase marked (contacts.impact_dirty) and those an impact reaches, none when no
    contact collides (contacts.impact_any). Only marked bodies write their motion: kernel_prepare writes both
    buffers, and a body an impact changed is marked for the next iteration, which writes the other buffer, so an
    unmarked body's two buffers agree and the pass ends in buffer 0 for every body. The same gather as the
    contact iterations: both copies of a pair compute the same impulse, sums in fixed point (bit-identical
    reruns)."""
    n_bodies = ti.select(contacts.skipping() or contacts.impact_any[None] == 0, 0, model.body_count[None])
    for c in ti.static(range(IMPACT_ITERATIONS)):
        src = c % 2
        dst = 1 - src
        for i in range(n_bodies):   # colliding contacts of each marked body
            active = 0
            contacts.impact_dirty[dst, i] = 0
            if contacts.impact_dirty[src, i] != 0:
                li = base + i
                bi = unpack_body(solver.body[i])
                mi = unpack_motion(solver.motion[src, i])
                material_i = model.body_material[i]
                for k in range(lists.length(li)):
                    rec = lists.get(li, k)
                    colliding, _vn, _n, _ri, _rj, _bj, _e = _impact_colliding(model, solver, contacts, src, bi, mi,
                                                                              material_i, rec, dt)
                    if colliding:
                        active += 1
            contacts.impact_active[i] = active
        for i in range(n_bodies):   # collide them
            if contacts.impact_dirty[src, i] == 0:
                continue   # (its two buffers hold the same motion: see below)
            mo = unpack_motion(solver.motion[src, i])
            bi = unpack_body(solver.body[i])
            n_i = contacts.impact_active[i]
            if n_i > 0 and bi.inv_mass > 0.0:
                li = base + i
                scale = fixed_scale(bi.inv_mass)
                scale_w = angular_scale(bi.inv_inertia_d)
                P_sum = ivec3(0)
                L_sum = ivec3(0)
                check = 0.0
                material_i = model.body_material[i]
                for k in range(lists.length(li)):
                    rec = lists.get(li, k)
                    j = rec.other
                    colliding, vn, nrm, ri, rj, bj, e = _impact_colliding(model, solver, contacts, src, bi, mo,
                                                                          material_i, rec, dt)
                    if colliding:
                        n_j = 0.0
                        if j >= 0:
                            n_j = ti.cast(contacts.impact_active[j], ti.f32)
                        rin = ri.cross(nrm)
                        rjn = rj.cross(nrm)
                        k_i = ti.cast(n_i, ti.f32) * (bi.inv_mass + rin.dot(sym_mul(bi.inv_inertia_d,
                                                                                      bi.inv_inertia_o, rin)))
                        k_j = n_j * (bj.inv_mass + rjn.dot(sym_mul(bj.inv_inertia_d, bj.inv_inertia_o, rjn)))
                        dj = -(1.0 + e) * vn / (k_i + k_j)
                        P_sum += fixed(dj * nrm, scale)
                        L_sum += fixed(dj * rin, scale_w)
                        check += dj
                # it takes part in the next iteration, and so does every body it touches
                contacts.impact_dirty[dst, i] = 1
                for k in range(lists.length(li)):
                    j = lists.get_member(li, k, "other")
                    if j >= 0:
                        contacts.impact_dirty[dst, j] = 1
                mo.v = flag_non_finite(mo.v + bi.inv_mass * unfixed(P_sum, scale), check)
                mo.w = mo.w + sym_mul(bi.inv_inertia_d, bi.inv_inertia_o, unfixed(L_sum, scale_w))
            solver.motion[dst, i] = pack_motion(mo)


@ti.data_oriented
class JacobiSolver:
    """Owns the iteration buffers and launches the kernels; `step(state_in, state_out, contacts, dt)`.

    model: the app.sim.model.Model it solves; diagnostics: the app.sim.diagnostics.Diagnostics its steps write
    (contact count, health).

    motion: Motion records (v, w, pv, pw: vec3 f32) packed as six u64 words (app.sim.solver_records.pack_motion),
        shape (2, body_capacity): ping-pong buffers of velocity (m/s, rad/s) and split-impulse pseudo
        velocity; the starting buffer index is a runtime argument, so any iteration count runs on the same
        two compiled kernels (ITERATION_BATCH iterations, and one). One record per body: a contact gathers the
        other body's four vectors from one place, in six loads.
    body: SolverBody records packed the same way (pack_body), (body_capacity,): position, inverse mass,
        world-frame inverse inertia, contact count and friction of each body at the start of the step
        (kernel_prepare).
    iterations: host int, runtime (sim.solver_iterations; the viewer may change it).
    normal_warm: the contact set's 0-d field (ContactSet.normal_warm, 1 when made, as the correction is off), which
        the solver sets to app.sim.load_paths.NORMAL_WARM while the load-path correction runs and back to 1.
    """

    def __init__(self, model, diagnostics, normal_warm, iterations: int = 10):
        self.model = model
        self.diagnostics = diagnostics
        self.normal_warm = normal_warm
        self.iterations = int(iterations)
        n = model.body_capacity
        self.motion = MOTION_WORDS.store_dtype.field(shape=(2, n))   # packed Motion (pack_motion)
        self.body = BODY_WORDS.store_dtype.field(shape=n)            # packed SolverBody (pack_body)
        # the load-path correction (app.sim.load_paths), for scenes whose movable bodies span sim.load_path_ratio:
        # set by set_mass_range, its fields allocated the first time a scene needs them
        self.load_paths = None
        self.use_load_paths = False
        self.mass_spread = False   # the movable bodies span sim.load_path_ratio
        self.deep_stacks = False   # stacks of PASS_CHUNK bodies or more (StackProbe.deep)
        self.stack_probe = None
        self.probed = False   # a step launched since the last check probed the stacks (read it: after_check)

    def set_mass_range(self, masses, ratio: float):
        """The masses (kg) of the movable bodies and sim.load_path_ratio: the load-path correction runs when the
        heaviest is at least `ratio` times the lightest (app.sim.load_paths), or when the stacks are deep (after_check).
        Below the default 50 the Jacobi iterations hold a heavy body at the default 10 iterations (a 100:1 stack sinks
        4.9 mm without the correction, the sink growing with the ratio), and scenes of similar bodies without deep
        stacks skip its passes over the contacts (pile_1m's steel and wood bodies span 31:1). Call after a load or a
        change of the bodies or of fixed ones."""
        masses = np.asarray(masses, dtype=np.float64)
        masses = masses[masses > 0]
        self.mass_spread = bool(masses.size) and masses.max() >= ratio * masses.min()
        self._switch_load_paths()

    def forget_stacks(self):
        """A new scene: its stacks are probed from its first step (after_check)."""
        self.deep_stacks = False
        self.probed = False
        if self.load_paths is not None:
            self.load_paths.passes = PASS_CHUNK
            self.load_paths.deepening = True

    def _switch_load_paths(self):
        use = self.mass_spread or self.deep_stacks
        if use != self.use_load_paths:
            self.normal_warm[None] = NORMAL_WARM if use else 1.0
        self.use_load_paths = use
        if self.use_load_paths and self.load_paths is None:
            self.load_paths = LoadPaths(self.model.body_capacity)

    def redoing(self):
        """Steps that did nothing (their lists had to grow) are about to run again: the load-path correction deepens
        its passes again at the first of them, whose stacks a skipped step's read could not see (LoadPaths.apply)."""
        if self.load_paths is not None:
            self.load_paths.deepening = True

    def after_check(self):
        """After the host read that makes the launched steps final (app.sim.simulation.Simulation._settle): the
        load-path correction's passes follow the stacks' depth (LoadPaths.read_depth), and it runs for deep stacks
        as for a spread of masses: on from a probe that found stacks PASS_CHUNK bodies deep (StackProbe.deep, see
        PROBE_STEPS), until another scene is loaded (forget_stacks)."""
        probed, self.probed = self.probed, False   # (cleared whatever runs: a flag left set would check every step)
        if self.use_load_paths:
            self.load_paths.read_depth()
        elif probed and self.stack_probe.deep():
            self.deep_stacks = True
            self._switch_load_paths()

    def step(self, state_in, state_out, contacts, dt: float):
        """Solve this step's contacts (already in contacts.lists[contacts.base + i]) and integrate state_in ->
        state_out (dt in s); state_out.step = state_in.step + 1. state_in may be state_out: integration reads and
        writes only each body's own slots.

        Thread i takes body i, so the order bodies are stored in is the order warps take them. The Simulation
        stores them by shape, then by place (app.sim.reorder): a warp's bodies are then
        neighbours, whose data the contacts gather from shared cache lines, and of one shape, so that its
        lists have similar lengths (a box has more contacts than a sphere, and a warp lasts as long as its
        longest list). Any order gives the same result: each thread writes only its own body, from the
        previous iteration's buffers."""
        kernel_prepare(self.model, state_in, contacts.lists, contacts.base, self, contacts, self.diagnostics, dt)
        # (by the step's number: a step redone while the lists grow probes again; every step at first, so that a
        # pyramid gets the correction from its second step)
        if not self.use_load_paths and (state_in.step < PROBE_FIRST or state_in.step % PROBE_STEPS == 0):
            if self.stack_probe is None:
                self.stack_probe = StackProbe(self.model.body_capacity)
            self.stack_probe.kernel_depth(self.model, contacts.lists, contacts.base, self, contacts.failed_step)
            self.probed = True
        src = 0
        if self.use_load_paths:   # motion[0] -> motion[1]
            self.load_paths.apply(self.model, contacts.lists, contacts.base, self, dt, contacts.failed_step)
            src = 1
        left = self.iterations
        while left > 0:
            count = ITERATION_BATCH if left >= ITERATION_BATCH else 1
            kernel_solve_iterations(self.model, contacts.lists, contacts.base, self, src, count, dt,
                                    contacts.failed_step)
            src = (src + count) % 2
            left -= count
        if self.use_load_paths:   # (shock propagation: stacks the iterations left sinking)
            self.load_paths.shock(self.model, contacts.lists, contacts.base, self, src, dt, contacts.failed_step)
        kernel_integrate(self.model, state_in, state_out, self, src, dt, state_in.step, self.diagnostics,
                         contacts.failed_step)
        state_out.step = state_in.step + 1
