"""Load-path correction: a coarse (two-level) step for the Jacobi contact solver, for heavy bodies resting on light ones.

Why: Jacobi with mass splitting (app.sim.solver) moves a body only through the sub-bodies of the bodies it touches. A
heavy body of mass M on a light one of mass m changes its velocity by about m / (2 M) of the error per iteration,
whatever the diagonal scaling: the mode "every contact down the stack pushes the same extra amount" is nearly in the
null space of J M^-1 J^T (it moves only the top body), so its convergence rate is about m / M per iteration. Three
0.5 m boxes, the top one 1000 times as dense: the heavy box sinks to the floor at 10 iterations (it stands at 100).

What: one coarse correction per step, before the Jacobi iterations. A body resting on others (a "support" contact:
the normal pushing it within 18 degrees of up, and the body under it fixed, asleep, a plane or itself supported,
found in COARSE_PASSES parallel passes from the ground up) may add impulse along its load path: equal shares over
its support points, and each supporting body passes everything it receives, plus its own share, on to its own
supports. Impulses along a whole path cancel on the bodies in between (force; torque only where the points line
up), so the path's coarse matrix p^T A p is about the top body's own n^T M^-1 n; the coarse residual p^T r
telescopes to the top body's approach velocity to the ground along the path (resting contacts only: one with a gap,
or closing faster than restitution_threshold, adds no residual, or a landing body would stop the one above it). So each body takes
D_i = max(0, p_i^T r) / (p_i^T A p_i), at once, for the velocity and for the split-impulse pseudo velocity
(a Galerkin coarse correction with the paths as its basis; only pushes, never pulls). The flows are summed from
the top down in COARSE_PASSES passes and added to the contacts' accumulated impulses (both copies the same:
Newton's third law holds), and to the bodies' velocities; the Jacobi iterations go on from there.

Gather as in the solver: thread i writes only body i's fields and its own records; sums in fixed point (the list
order does not change the result)."""

import taichi as ti

from app.sim.contacts import record_normal as _record_normal, skipping
from app.sim.solver_records import pack_motion, unpack_body, unpack_motion

vec2 = ti.types.vector(2, ti.f32)
vec3 = ti.types.vector(3, ti.f32)
ivec2 = ti.types.vector(2, ti.i64)
ivec3 = ti.types.vector(3, ti.i64)

# Passes from the ground up (a stack deeper than this gets no correction above that level) and from the top down.
COARSE_PASSES = 6
# A support contact: its normal (pushing the upper body) within 18 degrees of up (at 45 degrees, tumbler and
# convex_pile had deep overlaps: the paths through tilted contacts do not cancel on the bodies in between).
SUPPORT_COS = 0.95
FIXED_ONE = 2.0 ** 32


@ti.func
def _sym_mul(d, o, x):
    return vec3(d[0] * x[0] + o[0] * x[1] + o[1] * x[2],
                o[0] * x[0] + d[1] * x[1] + o[2] * x[2],
                o[1] * x[0] + o[2] * x[1] + d[2] * x[2])


@ti.data_oriented
class LoadPaths:
    """Per-body fields of the load-path correction (see the module docstring); `apply(model, lists, base, solver,
    dt, failed_step)` runs it on solver.motion[0] and writes solver.motion[1]."""

    def __init__(self, body_capacity: int):
        n = body_capacity
        self.ground = ti.field(ti.i32, shape=(2, n))   # supported from the ground, per pass (ping-pong)
        self.G = ti.Vector.field(2, ti.f32, shape=(2, n))   # path residual (velocity, pseudo velocity), m/s
        self.T = ti.Vector.field(2, ti.f32, shape=(2, n))   # flow through the body (N s), top down
        self.D = ti.Vector.field(2, ti.f32, shape=n)        # the body's own coarse impulse
        self.s = ti.field(ti.i32, shape=n)                  # its support points

    @ti.func
    def _support_lower(self, solver: ti.template(), j, src):
        """(j may carry a load, j's G) for the lower body j (or plane j < 0) of a support contact, pass src."""
        ok = j < 0
        Gj = vec2(0.0)
        if j >= 0:
            bj = unpack_body(solver.body[j])
            if bj.inv_mass <= 0.0:
                ok = True
            elif self.ground[src, j] != 0:
                ok = True
                Gj = self.G[src, j]
        return ok, Gj

    @ti.kernel
    def kernel_apply(self, model: ti.template(), lists: ti.template(), base: ti.i32, solver: ti.template(),
                     dt: ti.f32, failed_step: ti.template()):
        g = model.gravity[None]
        glen = g.norm()
        n_bodies = ti.select(skipping(failed_step) or glen <= 0.0, 0, model.body_count[None])
        up = -g / ti.max(glen, 1e-30)
        slop = model.slop[None]
        beta_per_dt = model.position_correction[None] / dt
        for i in range(n_bodies):
            self.ground[0, i] = 0
            self.G[0, i] = vec2(0.0)
            self.D[i] = vec2(0.0)
            self.s[i] = 0
        # from the ground up: which bodies are supported, and each one's path residual
        for p in ti.static(range(COARSE_PASSES)):
            src = p % 2
            dst = 1 - src
            for i in range(n_bodies):
                bi = unpack_body(solver.body[i])
                s = 0
                acc = ivec2(0)
                nsum = ivec3(0)
                asum = ivec3(0)
                li = base + i
                rad = ti.max(model.body_radius[i], 1e-6)
                if bi.inv_mass > 0.0:
                    mi = unpack_motion(solver.motion[0, i])
                    for k in range(lists.length(li)):
                        rec = lists.get(li, k)
                        nrm = _record_normal(rec)
                        if nrm.dot(up) >= SUPPORT_COS:
                            j = rec.other
                            ok, Gj = self._support_lower(solver, j, src)
                            if ok:
                                ri = rec.point - bi.pos
                                vj = vec3(0.0)
                                pvj = vec3(0.0)
                                if j >= 0:
                                    mj = unpack_motion(solver.motion[0, j])
                                    rj = rec.point - unpack_body(solver.body[j]).pos
                                    vj = mj.v + mj.w.cross(rj)
                                    pvj = mj.pv + mj.pw.cross(rj)
                                vn = (mi.v + mi.w.cross(ri) - vj).dot(nrm)
                                vpn = (mi.pv + mi.pw.cross(ri) - pvj).dot(nrm)
                                # resting contacts only: touching, and not closing as fast as an impact (a path
                                # through a gap or a landing body would stop the top body for the whole path)
                                if rec.depth < 0.0 or vn < -model.restitution_threshold[None]:
                                    vn = rec.bias   # (no residual from this contact)
                                    vpn = beta_per_dt * ti.max(rec.depth - slop, 0.0)
                                    Gj = vec2(0.0)
                                r = vec2(rec.bias - vn, beta_per_dt * ti.max(rec.depth - slop, 0.0) - vpn) + Gj
                                acc += ti.cast(r * FIXED_ONE, ti.i64)
                                nsum += ti.cast(nrm * FIXED_ONE, ti.i64)
                                asum += ti.cast(ri.cross(nrm) * (FIXED_ONE / rad), ti.i64)
                                s += 1
                self.ground[dst, i] = ti.select(s > 0, 1, 0)
                Gi = vec2(0.0)
                Di = vec2(0.0)
                if s > 0:
                    inv_s = 1.0 / ti.cast(s, ti.f32)
                    Gi = ti.cast(acc, ti.f32) / FIXED_ONE * inv_s
                    nbar = ti.cast(nsum, ti.f32) / FIXED_ONE * inv_s
                    abar = ti.cast(asum, ti.f32) * (rad / FIXED_ONE) * inv_s
                    K = bi.inv_mass * nbar.dot(nbar) + abar.dot(_sym_mul(bi.inv_inertia_d, bi.inv_inertia_o, abar))
                    if K > 0.0:
                        Di = Gi / K
                self.G[dst, i] = Gi
                self.D[i] = Di
                self.s[i] = s
        lower = (COARSE_PASSES - 1) % 2   # the ground flags the last pass read: a contact supports with these
        for i in range(n_bodies):
            self.T[0, i] = self.D[i]
        # from the top down: the flow each body passes to its supports
        for p in ti.static(range(COARSE_PASSES)):
            src = p % 2
            dst = 1 - src
            for i in range(n_bodies):
                bi = unpack_body(solver.body[i])
                Ti = self.D[i]
                if bi.inv_mass > 0.0 and self.ground[lower, i] != 0:
                    scale = FIXED_ONE * bi.inv_mass
                    acc = ivec2(0)
                    li = base + i
                    for k in range(lists.length(li)):
                        rec = lists.get(li, k)
                        j = rec.other
                        if j >= 0 and -_record_normal(rec).dot(up) >= SUPPORT_COS:
                            if self.s[j] > 0 and unpack_body(solver.body[j]).inv_mass > 0.0:
                                acc += ti.cast(self.T[src, j] / ti.cast(self.s[j], ti.f32) * scale, ti.i64)
                    Ti += ti.cast(acc, ti.f32) / scale
                self.T[dst, i] = Ti
        final = COARSE_PASSES % 2
        # apply: each support contact takes its upper body's flow share, in both copies
        for i in range(n_bodies):
            bi = unpack_body(solver.body[i])
            mo = unpack_motion(solver.motion[0, i])
            if bi.inv_mass > 0.0:
                scale = FIXED_ONE * bi.inv_mass
                scale_w = FIXED_ONE * ti.max(bi.inv_inertia_d[0], ti.max(bi.inv_inertia_d[1], bi.inv_inertia_d[2]))
                P = ivec3(0)
                L = ivec3(0)
                Pp = ivec3(0)
                Lp = ivec3(0)
                li = base + i
                for k in range(lists.length(li)):
                    rec = lists.get(li, k)
                    j = rec.other
                    nrm = _record_normal(rec)
                    F = vec2(0.0)
                    if nrm.dot(up) >= SUPPORT_COS and self.s[i] > 0:
                        ok, _Gj = self._support_lower(solver, j, lower)
                        if ok:
                            F = self.T[final, i] / ti.cast(self.s[i], ti.f32)
                    elif j >= 0 and -nrm.dot(up) >= SUPPORT_COS and self.ground[lower, i] != 0:
                        if self.s[j] > 0 and unpack_body(solver.body[j]).inv_mass > 0.0:
                            F = self.T[final, j] / ti.cast(self.s[j], ti.f32)
                    # (a pull takes back at most what the contact pushes: both copies clamp alike)
                    F = ti.max(F, -vec2(rec.impulse_n, rec.impulse_p))
                    if F[0] != 0.0 or F[1] != 0.0:
                        rec.impulse_n += F[0]
                        rec.impulse_p += F[1]
                        lists.set_members(li, k, rec, ("impulse_n", "impulse_p"))
                        ri = rec.point - bi.pos
                        rin = ri.cross(nrm)
                        P += ti.cast(F[0] * nrm * scale, ti.i64)
                        L += ti.cast(F[0] * rin * scale_w, ti.i64)
                        Pp += ti.cast(F[1] * nrm * scale, ti.i64)
                        Lp += ti.cast(F[1] * rin * scale_w, ti.i64)
                Id = bi.inv_inertia_d
                Io = bi.inv_inertia_o
                mo.v = mo.v + bi.inv_mass * ti.cast(P, ti.f32) / scale
                mo.w = mo.w + _sym_mul(Id, Io, ti.cast(L, ti.f32) / scale_w)
                mo.pv = mo.pv + bi.inv_mass * ti.cast(Pp, ti.f32) / scale
                mo.pw = mo.pw + _sym_mul(Id, Io, ti.cast(Lp, ti.f32) / scale_w)
            solver.motion[1, i] = pack_motion(mo)

