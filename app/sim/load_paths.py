"""Load-path correction: a coarse (two-level) step for the Jacobi contact solver, for heavy bodies resting on light ones
and for deep stacks.

Why: Jacobi with mass splitting (app.sim.solver) moves a body only through the sub-bodies of the bodies it touches. A
heavy body of mass M on a light one of mass m changes its velocity by about m / (2 M) of the error per iteration,
whatever the diagonal scaling: the mode "every contact down the stack pushes the same extra amount" is nearly in the
null space of J M^-1 J^T (it moves only the top body), so its convergence rate is about m / M per iteration. Three
0.5 m boxes, the top one 1000 times as dense: the heavy box sinks to the floor at 10 iterations (it stands at 100).
A deep stack of equal bodies converges as slowly: a load crosses one body an iteration, and each level of a 40-level
pyramid of boxes sank 2 mm under the load above it (its top box 79 mm).

What: one coarse correction per step, before the Jacobi iterations. The bodies are put in levels from the ground up:
level 1 rests on the ground (a plane, a fixed or sleeping body), level L on a body of level L - 1 and on none lower (a
"support" contact: the normal pushing the upper body within 18 degrees of up, the body under it on the ground or of a
lower level). A body may add impulse along its load path, shared over its support points, and each supporting body
passes everything it receives, plus its own share, on to its own supports. The shares put the resultant under the loads'
resultant (its own share at its centre, the loads from above where they press: the least-squares change from equal
shares, clipped at zero), so the impulses along a whole path cancel on the bodies in between, force and torque (equal
shares turned an off-centre light box: three boxes each 1 cm further along x, the top one 100 times as dense, rocked and
rose 32 mm). The path's coarse matrix p^T A p is about the top body's own n^T M^-1 n; the coarse residual p^T r
telescopes to the top body's approach velocity to the ground along the path (resting contacts only: one with a gap, or
closing faster than restitution_threshold, adds no residual, or a landing body would stop the one above it). So each
body takes D_i = p_i^T r / (p_i^T A p_i), at once, for the velocity and for the split-impulse pseudo velocity (a
Galerkin coarse correction with the paths as its basis; a body more than SHALLOW levels up takes DEEP_STEP of it).
D_i < 0 pulls: the warm start may carry last step's correction into a step that needs less. The flows are summed from
the top level down and added to the contacts' accumulated impulses (both copies the same: Newton's third law holds; a
pull takes back at most what a contact pushes), and to the bodies' velocities; the Jacobi iterations go on from there.

Shock propagation (Guendelman, Bridson and Fedkiw, "Nonconvex rigid bodies with stacking", SIGGRAPH 2003: each
level of a stack solved with the levels under it frozen), after the Jacobi iterations: the coarse step is a Jacobi
step over paths that overlap, and in a 100-level pyramid the levels still sank in bursts from about step 50 (every
level sinking at 0.5 m/s by step 100, the pyramid fallen by step 300). So the levels found are swept
from the ground up (kernel_shock, a level a pass), and a body more than SHALLOW levels up that still approaches its
final supports on average (a plane, a fixed or sleeping body, a lower level) is lifted by that mean: a translation
along up, in velocity and in pseudo velocity apart, never down and never turning, and not stored in the contacts:
the supports do not feel it (stored in both copies for the warm start, with or without pulls down to what a contact
pushes, the pyramid kept moving at 0.3 m/s). A rocking body's pushes are averaged with its pulls, so noise is not
rectified into a climb (lifting each point alone set a 12-level pyramid rising 0.14 m/s at its top). The base-100
pyramid then stands: its top box 1.8 mm down and every box asleep at step 250, on the CPU and on an H200 (there 1.8 mm
after 10,000 steps). Awake (sleeping off, CPU) every box stays under 0.03 m/s for 3,000 steps while its top box
creeps down, 11.3 mm by then (NORMAL_WARM).

Gather as in the solver: thread i writes only body i's fields and its own records; sums in fixed point (the list
order does not change the result)."""

import taichi as ti
from taichi.lang import impl

from app.sim.contacts import record_normal as _record_normal, skipping
from app.sim.math3d import contact_tangents
from app.sim.solver_records import SolverBody, pack_motion, unpack_body, unpack_motion

vec2 = ti.types.vector(2, ti.f32)
vec3 = ti.types.vector(3, ti.f32)
ivec2 = ti.types.vector(2, ti.i64)
ivec3 = ti.types.vector(3, ti.i64)

# Levels are taken one after the other, PASS_CHUNK to a launch (unrolled at compile time), as many launches as the
# deepest support chain needs (a stack deeper than the levels searched gets no correction above them: a 40-level
# pyramid, cut at 6, sagged 2 mm a level). Each level's bodies are listed as it is found (order, start, count), so a
# level's pass reads the lists of its own bodies only: each body's list is read a few times a step (the search, up,
# down, the impulses, the shock), not a few times a level (a Jacobi pass over every body for each level read them
# 2 x 112 times a step in pyramid_100: 212 against 85 ms/step on the 2-core CPU, the same motion to the bit).
# LoadPaths.passes follows the depth of the stacks (LoadPaths.apply, read_depth), up to MAX_PASSES.
PASS_CHUNK = 8
# A level's pass runs LEVEL_LANES threads, each taking every LEVEL_LANES-th body of the level. Its bound is then a
# constant: a loop bounded by a field (the level's count) is a launch of its own before the loop's, where Taichi
# computes the bound, and a deep pyramid's step on a GPU is bound by its launches, not by its work. So a level takes
# four launches a step (up: the search and the bodies found; down; shock). A GPU level of up to LEVEL_LANES_GPU
# bodies takes one a thread (a pyramid's widest level is its base; many_pyramids' level 1, 1,000); a CPU has a few
# cores to keep busy.
LEVEL_LANES_GPU = 4096
LEVEL_LANES_CPU = 64
# A body more than SHALLOW bodies above the ground takes DEEP_STEP of its coarse impulse D_i = G_i / K_i. K_i counts
# the body's own mass only, but a path's flow also turns the bodies it passes through, where it enters one side of a
# body and leaves through supports under the other (a box on two boxes of a pyramid): the deeper the path, the more
# K_i falls short, and the full step overshoots. And the paths overlap: a residual low in a stack enters the G of
# every body above it, and each of them corrects it again. At the full step a 40-level pyramid swung every other step
# between free fall and its load. The step set how long a deep stack stayed calm while awake, when a contact point
# that lost its warm-start match restarted from zero and set off bursts (app.sim.narrowphase._pair_warm_scale):
# pyramid_100 with sleeping off, its boxes moved by N(0, 10 um) at the start (three seeds, CPU), first had a box over
# 0.05 m/s at steps 525, 700 and 500 at 0.5; past 1,000, past 1,000 and at 1,300 at 0.3; at 1,450 and 1,775 (two
# seeds) at 0.15; at 225 without the deep step (0). Asleep at step 250, it stands (top box 0.9 mm down in pyramid_40 at 0.3 and at 0.5).
# A stack of three boxes takes the full step: the heavy top box on light ones settles faster.
SHALLOW = 4
DEEP_STEP = 0.3
# While the correction runs, a support contact (its normal within SUPPORT_COS of up) starts from NORMAL_WARM of last
# step's normal impulse (times sim.warm_start; ContactSet.normal_warm, app.sim.narrowphase._emit_contacts). The
# correction carries each step's load down its paths by itself; starting from all of last step's impulse as well, a
# stack's support contacts were an integrator without a leak: three boxes, the top one 100 times as dense, each 1 cm
# further along x than the one under it (sleeping off), breathed, their impulses swinging between 0 and 5 times the
# load over about 25 steps, and the heavy box hopped 1.9 mm, the boxes up to 0.18 m/s; at 0.98 they rest (0.05 m/s at
# most, no rise; 0.99 still hopped). Awake pyramid_100 (CPU) stays calm for 3,000 steps where at 1.0 it breathed from
# step 600 (0.055 m/s at step 1,200) and sagged in bursts; awake pyramid_40 ends 3,000 steps 3.5 mm down, its fastest
# box at 1.5e-3 m/s (9.1 mm and 0.023 m/s at 1.0). The cost, in a pile 15 bodies deep with the correction
# forced on: the median body moves at 3-6 mm/s instead of 2-3, and fewer sleep. Other contacts, and every contact
# without the correction, start from all of it: so leaking, that pile without the correction kept sinking (its median
# body at 0.045 m/s). Damping the friction's warm start instead made the stack hop higher.
NORMAL_WARM = 0.98
MAX_PASSES = 256
# Deep stacks turn the correction on (StackProbe) where the bodies PASS_CHUNK up a support chain number at least
# STACK_SHARE of those on the ground: 93 for 100 in the base-100 pyramid, 3 for 10 in each 10-level pyramid of
# many_pyramids, 1 for 1 in a column. A pile has a few chains that deep, its load going down tilted contacts that the
# correction does not take: at most 2 for 110 (0.018) in 39 probes of a 15-layer pile (5,000 of pile_1m's bodies in a
# 1.5 m container, CPU), where the correction changed neither the contacts' depth nor the settling, while its passes
# (tens of small launches a step) made pile_1m's step 42% longer on an H100.
STACK_SHARE = 0.1
# A support contact: its normal (pushing the upper body) within 18 degrees of up (at 45 degrees, tumbler and
# convex_pile had deep overlaps: the paths through tilted contacts do not cancel on the bodies in between).
SUPPORT_COS = 0.95
FIXED_ONE = 2.0 ** 32
UNSUPPORTED = 2 ** 30   # the level of a body no support chain reaches


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
        # level: the length of the shortest support chain down to the ground (UNSUPPORTED: none), found from the
        # ground up, a level a pass; the bodies of level L are order[start[L] : start[L] + count[L]]
        self.level = ti.field(ti.i32, shape=n)
        self.order = ti.field(ti.i32, shape=n)
        self.count = ti.field(ti.i32, shape=MAX_PASSES + 2)
        self.start = ti.field(ti.i32, shape=MAX_PASSES + 2)
        self.G = ti.Vector.field(2, ti.f32, shape=n)   # path residual (velocity, pseudo velocity), m/s
        self.T = ti.Vector.field(2, ti.f32, shape=n)   # flow through the body (N s), top down
        self.D = ti.Vector.field(2, ti.f32, shape=n)   # the body's own coarse impulse
        self.s = ti.field(ti.i32, shape=n)             # its support points
        # where its supports take the flow: point k's share is max(1/s + (q_k - pbar) . mu, 0) / wsum, q_k the
        # point across the up axis relative to the body's centre (m)
        self.pbar = ti.Vector.field(2, ti.f32, shape=n)   # support points' mean q (m)
        self.cinv = ti.Vector.field(3, ti.f32, shape=n)   # inverse of their covariance (xx, xz, zz; 1/m^2)
        self.mu = ti.Vector.field(2, ti.f32, shape=n)     # 1/m
        self.wsum = ti.field(ti.f32, shape=n)
        self.reached = ti.field(ti.i32, shape=())        # the highest level found
        self.passes = PASS_CHUNK                          # levels searched (a multiple of PASS_CHUNK)
        self.deepening = True                             # (see apply)
        self.lanes = LEVEL_LANES_GPU if impl.current_cfg().arch == ti.cuda else LEVEL_LANES_CPU

    @ti.func
    def _holds(self, solver: ti.template(), j, lv):
        """Whether the lower body j of a support contact (j < 0: a plane) can carry a load for a body of level lv: a
        plane, a fixed or sleeping body, or a body of a lower level."""
        out = _unmoved(solver, j)
        if not out:
            out = self.level[j] < lv
        return out

    def apply(self, model, lists, base: int, solver, dt: float, failed_step):
        """The correction, motion[0] -> motion[1]: levels from the ground up, then from the top down (PASS_CHUNK levels
        a launch). Their number is self.passes, read back from the steps (read_depth); while it is not known to cover
        the stacks (`deepening`: a new scene, or a stack that grew past it), the search goes on, a host read after
        each launch, until a launch finds no new level: a correction cut short of a stack's top let a 100-level
        pyramid collapse in its first steps."""
        passes = 0
        while passes < MAX_PASSES:
            self.kernel_up(model, lists, base, solver, dt, failed_step, passes, passes == 0)
            passes += PASS_CHUNK
            if passes >= self.passes and (not self.deepening or int(self.reached[None]) < passes):
                break
        self.passes = passes
        self.deepening = False
        for p0 in range(0, passes, PASS_CHUNK):
            self.kernel_down(model, lists, base, solver, failed_step, passes - p0)
        self.kernel_apply(model, lists, base, solver, failed_step)

    def read_depth(self):
        """After a checked step (its one host read): the levels for the next steps, from the highest level found:
        that plus one, rounded up to PASS_CHUNK, and a launch more for the stacks to grow into before the next check;
        or, if the last level searched had bodies (a stack grew past it), deepening at the next step. Levels beyond
        a stack's height are empty, so the motion does not depend on when the host reads, unless a stack grows by
        more than PASS_CHUNK bodies between two checks (CHECK_STEPS apart at most)."""
        reached = int(self.reached[None])
        if reached >= self.passes:
            self.deepening = True
        else:
            self.passes = min(-(-(reached + 1) // PASS_CHUNK) * PASS_CHUNK + PASS_CHUNK, MAX_PASSES)
        return reached

    @ti.kernel
    def kernel_up(self, model: ti.template(), lists: ti.template(), base: ti.i32, solver: ti.template(), dt: ti.f32,
                  failed_step: ti.template(), p0: ti.i32, first: ti.template()):
        """Levels p0 + 1 .. p0 + PASS_CHUNK from the ground up: level 1 the bodies resting on the ground (a plane, a
        fixed or sleeping body), level L the bodies resting on one of level L - 1 that no lower level holds, found
        from the lists of level L - 1 (each body's list is read once for the search, not once a level); then each
        new body's supports (the contacts under it with a plane, a fixed or sleeping body or a lower level), its
        path residual and coarse impulse, and its support points' spread. self.reached: the highest level found."""
        n_bodies, _n_all, up = _bodies(model, failed_step)
        slop = model.slop[None]
        beta_per_dt = model.position_correction[None] / dt
        t1, t2 = contact_tangents(up)
        if ti.static(first):
            self.reached[None] = 0
            self.start[1] = 0
            for lv in range(MAX_PASSES + 2):
                self.count[lv] = 0
            for i in range(n_bodies):
                self.level[i] = UNSUPPORTED
                self.G[i] = vec2(0.0)
                self.D[i] = vec2(0.0)
                self.s[i] = 0
        # (the level is computed inside each loop: a statement between two loops is a launch of its own)
        for p in ti.static(range(PASS_CHUNK)):
            # level 1 (the first launch's first pass): every body's list; above: the lists of the level under it
            if ti.static(first and p == 0):
                for i in range(n_bodies):
                    if unpack_body(solver.body[i]).inv_mass > 0.0:
                        li = base + i
                        g = 0
                        for k in range(lists.length(li)):
                            if _support_under(solver, lists.get(li, k), up) == ON_GROUND:
                                g = 1
                        if g != 0:
                            self.level[i] = 1
                            self.order[ti.atomic_add(self.count[1], 1)] = i
            else:
                for t in range(self.lanes):
                    lv = p0 + p + 1
                    below = self.start[lv - 1]
                    start = below + self.count[lv - 1]
                    if t == 0:
                        self.start[lv] = start
                    e = t
                    while e < self.count[lv - 1]:
                        self._search(solver, lists, base, self.order[below + e], lv, start, up)
                        e += self.lanes
            for t in range(self.lanes):
                lv = p0 + p + 1
                if t == 0 and self.count[lv] > 0:
                    self.reached[None] = lv
                e = t
                while e < self.count[lv]:
                    self._resting(model, lists, base, solver, self.order[self.start[lv] + e], lv, up, t1, t2, slop,
                                  beta_per_dt)
                    e += self.lanes

    @ti.func
    def _search(self, solver: ti.template(), lists: ti.template(), base, j, lv, start, up):
        """The movable bodies that body j (of level lv - 1) holds up and that no lower level holds: level lv, listed
        from order[start]."""
        lj = base + j
        for k in range(lists.length(lj)):
            rec = lists.get(lj, k)
            i = rec.other
            if i >= 0 and -_record_normal(rec).dot(up) >= SUPPORT_COS:
                if unpack_body(solver.body[i]).inv_mass > 0.0:
                    # (the first to reach i claims it: levels only go down, and one thread sees the old UNSUPPORTED)
                    if ti.atomic_min(self.level[i], lv) == UNSUPPORTED:
                        self.order[start + ti.atomic_add(self.count[lv], 1)] = i

    @ti.func
    def _resting(self, model: ti.template(), lists: ti.template(), base, solver: ti.template(), i, lv, up, t1, t2,
                 slop, beta_per_dt):
        """Body i of level lv: its supports, path residual G (the mean over its supports of the contact's shortfall
        plus the lower body's G), coarse impulse D and its support points' spread (pbar, cinv)."""
        bi = unpack_body(solver.body[i])
        mi = unpack_motion(solver.motion[0, i])
        s = 0
        acc = ivec2(0)
        nsum = ivec3(0)
        asum = ivec3(0)
        q1 = ivec2(0)
        q2 = ivec3(0)
        li = base + i
        rad = ti.max(model.body_radius[i], 1e-6)
        for k in range(lists.length(li)):
            rec = lists.get(li, k)
            nrm = _record_normal(rec)
            if nrm.dot(up) >= SUPPORT_COS:
                j = rec.other
                if self._holds(solver, j, lv):
                    Gj = vec2(0.0)   # (0 for a fixed or sleeping body: G starts at 0 and they have no level)
                    if j >= 0:
                        Gj = self.G[j]
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
                    # resting contacts only: touching, and not closing as fast as an impact (a path through a gap
                    # or a landing body would stop the top body for the whole path)
                    if rec.depth < 0.0 or vn < -model.restitution_threshold[None]:
                        vn = rec.bias   # (no residual from this contact)
                        vpn = beta_per_dt * ti.max(rec.depth - slop, 0.0)
                        Gj = vec2(0.0)
                    r = vec2(rec.bias - vn, beta_per_dt * ti.max(rec.depth - slop, 0.0) - vpn) + Gj
                    acc += ti.cast(r * FIXED_ONE, ti.i64)
                    nsum += ti.cast(nrm * FIXED_ONE, ti.i64)
                    asum += ti.cast(ri.cross(nrm) * (FIXED_ONE / rad), ti.i64)
                    q = _across(ri, t1, t2) / rad
                    q1 += ti.cast(q * FIXED_ONE, ti.i64)
                    q2 += ti.cast(vec3(q[0] * q[0], q[0] * q[1], q[1] * q[1]) * FIXED_ONE, ti.i64)
                    s += 1
        Gi = vec2(0.0)
        Di = vec2(0.0)
        pbar = vec2(0.0)
        cinv = vec3(0.0)
        if s > 0:
            inv_s = 1.0 / ti.cast(s, ti.f32)
            Gi = ti.cast(acc, ti.f32) / FIXED_ONE * inv_s
            nbar = ti.cast(nsum, ti.f32) / FIXED_ONE * inv_s
            abar = ti.cast(asum, ti.f32) * (rad / FIXED_ONE) * inv_s
            K = bi.inv_mass * nbar.dot(nbar) + abar.dot(_sym_mul(bi.inv_inertia_d, bi.inv_inertia_o, abar))
            if K > 0.0:
                Di = ti.select(lv > SHALLOW, DEEP_STEP, 1.0) * Gi / K
            if s > 1:
                m = ti.cast(q1, ti.f32) / FIXED_ONE * inv_s
                c = ti.cast(q2, ti.f32) / FIXED_ONE * inv_s - vec3(m[0] * m[0], m[0] * m[1], m[1] * m[1])
                c += vec3(1e-4, 0.0, 1e-4)   # (two points on a line, or one: the shares stay defined)
                det = c[0] * c[2] - c[1] * c[1]
                pbar = m * rad
                cinv = vec3(c[2], -c[1], c[0]) / (det * rad * rad)
        self.G[i] = Gi
        self.D[i] = Di
        self.s[i] = s
        self.pbar[i] = pbar
        self.cinv[i] = cinv

    @ti.kernel
    def kernel_down(self, model: ti.template(), lists: ti.template(), base: ti.i32, solver: ti.template(),
                    failed_step: ti.template(), top: ti.i32):
        """Levels top, top - 1, .. top - PASS_CHUNK + 1 from the top down: the flow each body passes to its supports
        (its own coarse impulse and the flows of the bodies it carries, all of higher levels), and where."""
        n_bodies, _n_all, up = _bodies(model, failed_step)
        t1, t2 = contact_tangents(up)
        # the supports' shares put the resultant of a body's flow under the loads' resultant (its own share at its
        # centre, the loads from above where they press), so that the correction turns no body (equal shares turned
        # an off-centre light box)
        for p in ti.static(range(PASS_CHUNK)):
            for t in range(self.lanes):
                lv = top - p   # (in the loop: see kernel_up)
                e = t
                while e < ti.select(n_bodies > 0, self.count[lv], 0):
                    self._down(model, lists, base, solver, self.order[self.start[lv] + e], lv, up, t1, t2)
                    e += self.lanes

    @ti.func
    def _down(self, model: ti.template(), lists: ti.template(), base, solver: ti.template(), i, lv, up, t1, t2):
        """Body i of level lv: its flow T (its own coarse impulse and the flows of the bodies it carries) and its
        supports' shares of it (mu, wsum)."""
        bi = unpack_body(solver.body[i])
        Ti = self.D[i]
        mu = vec2(0.0)
        wsum = 1.0
        rad = ti.max(model.body_radius[i], 1e-6)
        scale = FIXED_ONE * bi.inv_mass
        acc = ivec2(0)
        mom = ivec2(0)
        li = base + i
        for k in range(lists.length(li)):
            rec = lists.get(li, k)
            j = self._carried(solver, rec, up, lv)
            if j >= 0:
                f = self.T[j] * self._share(j, rec.point - unpack_body(solver.body[j]).pos, t1, t2)
                acc += ti.cast(f * scale, ti.i64)
                q = _across(rec.point - bi.pos, t1, t2)
                mom += ti.cast((f[0] + f[1]) * q * (scale / rad), ti.i64)
        Ti += ti.cast(acc, ti.f32) / scale
        total = Ti[0] + Ti[1]
        if self.s[i] > 1 and total > 0.0:
            aim = ti.cast(mom, ti.f32) * (rad / scale) / total   # the loads' resultant (m)
            d = aim - self.pbar[i]
            ci = self.cinv[i]
            inv_s = 1.0 / ti.cast(self.s[i], ti.f32)
            # sum_k w_k q_k = pbar + s C mu: the shares' resultant at aim (C the points' covariance)
            mu = vec2(ci[0] * d[0] + ci[1] * d[1], ci[1] * d[0] + ci[2] * d[1]) * inv_s
            ws = ti.i64(0)
            for k in range(lists.length(li)):
                rec = lists.get(li, k)
                if self._is_support(solver, rec, up, lv):
                    q = _across(rec.point - bi.pos, t1, t2)
                    w = ti.max(inv_s + (q - self.pbar[i]).dot(mu), 0.0)
                    ws += ti.cast(w * FIXED_ONE, ti.i64)
            wsum = ti.max(ti.cast(ws, ti.f32) / FIXED_ONE, 1e-6)
        self.T[i] = Ti
        self.mu[i] = mu
        self.wsum[i] = wsum

    @ti.kernel
    def kernel_apply(self, model: ti.template(), lists: ti.template(), base: ti.i32, solver: ti.template(),
                     failed_step: ti.template()):
        """Each support contact takes its share of its upper body's flow, in both copies; motion[0] -> motion[1]
        with the bodies' changes."""
        n_bodies, n_all, up = _bodies(model, failed_step)
        t1, t2 = contact_tangents(up)
        for i in range(n_all):
            bi = unpack_body(solver.body[i])
            mo = unpack_motion(solver.motion[0, i])
            lv = self.level[i]
            # (n_bodies compared here, not a bool made before the loop: a bool that crosses from a kernel's serial
            # part into its parallel loop is stored in Taichi's global temporaries, and on CUDA that load faulted
            # with CUDA_ERROR_MISALIGNED_ADDRESS)
            if bi.inv_mass > 0.0 and n_bodies > 0 and lv != UNSUPPORTED:
                scale = FIXED_ONE * bi.inv_mass
                scale_w = FIXED_ONE * ti.max(bi.inv_inertia_d[0], ti.max(bi.inv_inertia_d[1], bi.inv_inertia_d[2]))
                P = ivec3(0)
                L = ivec3(0)
                Pp = ivec3(0)
                Lp = ivec3(0)
                li = base + i
                for k in range(lists.length(li)):
                    rec = lists.get(li, k)
                    nrm = _record_normal(rec)
                    F = vec2(0.0)
                    if self.s[i] > 0 and self._is_support(solver, rec, up, lv):
                        F = self.T[i] * self._share(i, rec.point - bi.pos, t1, t2)
                    else:
                        j = self._carried(solver, rec, up, lv)
                        if j >= 0:
                            F = self.T[j] * self._share(j, rec.point - unpack_body(solver.body[j]).pos, t1, t2)
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

    def shock(self, model, lists, base: int, solver, src: int, dt: float, failed_step):
        """After the Jacobi iterations, on solver.motion[src] in place: shock propagation over the levels found
        (kernel_shock), PASS_CHUNK levels a launch."""
        for p0 in range(0, self.passes, PASS_CHUNK):
            self.kernel_shock(model, lists, base, solver, src, dt, failed_step, p0)

    @ti.kernel
    def kernel_shock(self, model: ti.template(), lists: ti.template(), base: ti.i32, solver: ti.template(),
                     src: ti.i32, dt: ti.f32, failed_step: ti.template(), p0: ti.i32):
        """Levels p0 + 1 .. p0 + PASS_CHUNK above SHALLOW, one after the other: a body that still approaches its final
        support points on average (its relative normal velocity below the contact's target, m/s; its pseudo velocity
        below the split-impulse target) moves up by that mean, in velocity and pseudo velocity apart. Reads and
        writes solver.motion[src]: a level reads only lower levels, which no thread writes meanwhile."""
        n_bodies, _n_all, up = _bodies(model, failed_step)
        slop = model.slop[None]
        beta_per_dt = model.position_correction[None] / dt
        for p in ti.static(range(PASS_CHUNK)):
            for t in range(self.lanes):
                lv = p0 + p + 1   # (in the loop: see kernel_up)
                e = t
                while e < ti.select(n_bodies > 0 and lv > SHALLOW, self.count[lv], 0):
                    self._shock(model, lists, base, solver, src, self.order[self.start[lv] + e], lv, up, slop,
                                beta_per_dt)
                    e += self.lanes

    @ti.func
    def _shock(self, model: ti.template(), lists: ti.template(), base, solver: ti.template(), src, i, lv, up, slop,
               beta_per_dt):
        """Body i of level lv (above SHALLOW): lifted by its mean approach to its supports, if positive."""
        bi = unpack_body(solver.body[i])
        pos = bi.pos
        mo = unpack_motion(solver.motion[src, i])
        li = base + i
        count = 0
        approach = ivec2(0)   # (fixed point: the list order changes no bit)
        for k in range(lists.length(li)):
            rec = lists.get(li, k)
            nrm = _record_normal(rec)
            j = rec.other
            if nrm.dot(up) >= SUPPORT_COS and self._holds(solver, j, lv):
                vj = vec3(0.0)
                pvj = vec3(0.0)
                if j >= 0:
                    mj = unpack_motion(solver.motion[src, j])
                    rj = rec.point - unpack_body(solver.body[j]).pos
                    vj = mj.v + mj.w.cross(rj)
                    pvj = mj.pv + mj.pw.cross(rj)
                ri = rec.point - pos
                vn = (mo.v + mo.w.cross(ri) - vj).dot(nrm)
                vpn = (mo.pv + mo.pw.cross(ri) - pvj).dot(nrm)
                short = vec2(rec.bias - vn, beta_per_dt * ti.max(rec.depth - slop, 0.0) - vpn)
                approach += ti.cast(short * FIXED_ONE, ti.i64)
                count += 1
        if count > 0:
            lift = ti.max(ti.cast(approach, ti.f32) / (FIXED_ONE * ti.cast(count, ti.f32)), 0.0)
            if lift[0] > 0.0 or lift[1] > 0.0:
                mo.v += lift[0] * up
                mo.pv += lift[1] * up
                solver.motion[src, i] = pack_motion(mo)

    @ti.func
    def _is_support(self, solver: ti.template(), rec, up, lv):
        """Whether contact rec, in the list of an upper body of level lv, is one of its support points: its normal
        within SUPPORT_COS of up, the body under it a plane, fixed, asleep or of a lower level."""
        ok = False
        if _record_normal(rec).dot(up) >= SUPPORT_COS:
            ok = self._holds(solver, rec.other, lv)
        return ok

    @ti.func
    def _carried(self, solver: ti.template(), rec, up, lv):
        """The movable, supported body of a higher level than lv that contact rec, in the list of a lower body of
        level lv, holds up (its normal pushing the other body within SUPPORT_COS of up), or -1."""
        out = -1
        j = rec.other
        if j >= 0 and -_record_normal(rec).dot(up) >= SUPPORT_COS:
            if self.s[j] > 0 and self.level[j] > lv and self.level[j] != UNSUPPORTED:
                if unpack_body(solver.body[j]).inv_mass > 0.0:
                    out = j
        return out

    @ti.func
    def _share(self, j, r, t1, t2):
        """The share of body j's flow that its support point at r (from j's centre) takes."""
        inv_s = 1.0 / ti.cast(self.s[j], ti.f32)
        q = _across(r, t1, t2)
        return ti.max(inv_s + (q - self.pbar[j]).dot(self.mu[j]), 0.0) / self.wsum[j]


# _support_under's answers
NOT_SUPPORT = 0
ON_GROUND = 1
ON_BODY = 2


@ti.func
def _support_under(solver: ti.template(), rec, up):
    """What contact rec, in an upper body's list, rests it on: ON_GROUND (a plane, a fixed or sleeping body), ON_BODY
    (a movable body, rec.other) or NOT_SUPPORT (its normal further than SUPPORT_COS from up)."""
    out = NOT_SUPPORT
    if _record_normal(rec).dot(up) >= SUPPORT_COS:
        out = ti.select(_unmoved(solver, rec.other), ON_GROUND, ON_BODY)
    return out


@ti.func
def _unmoved(solver: ti.template(), j):
    """Whether j, the other side of a contact, carries a load without moving: a plane (j < 0), or a fixed or sleeping
    body (both packed with inverse mass 0 by the solver's kernel_prepare)."""
    out = j < 0
    if j >= 0:   # (not `or`: Taichi evaluates both sides, and solver.body[-1] is out of range)
        out = unpack_body(solver.body[j]).inv_mass <= 0.0
    return out


@ti.func
def _bodies(model: ti.template(), failed_step: ti.template()):
    """(bodies the passes take: none without gravity or while skipping, all bodies while not skipping, up)"""
    g = model.gravity[None]
    glen = g.norm()
    n_all = ti.select(skipping(failed_step), 0, model.body_count[None])
    return ti.select(glen > 0.0, n_all, 0), n_all, -g / ti.max(glen, 1e-30)


@ti.data_oriented
class StackProbe:
    """How deep the scene's stacks are, for scenes that run without the correction: PASS_CHUNK passes of the
    ground flags alone (kernel_depth), now and then; `deep` once support chains reach PASS_CHUNK bodies in a
    STACK_SHARE of the places where they start. Two bytes a body, where the correction's fields take 68."""

    def __init__(self, body_capacity: int):
        self.ground = ti.field(ti.i8, shape=(2, body_capacity))
        self.reached = ti.field(ti.i32, shape=())
        self.joined = ti.field(ti.i32, shape=PASS_CHUNK)   # bodies that became supported at each pass

    def deep(self) -> bool:
        """(a host read) The last probe found support chains of PASS_CHUNK bodies, and as many bodies at that depth
        as STACK_SHARE of those on the ground: stacks, not a pile's few vertical chains."""
        joined = self.joined.to_numpy()
        return int(joined[PASS_CHUNK - 1]) >= STACK_SHARE * max(int(joined[0]), 1)

    @ti.kernel
    def kernel_depth(self, model: ti.template(), lists: ti.template(), base: ti.i32, solver: ti.template(),
                     failed_step: ti.template()):
        """Reads solver.body (kernel_prepare's), the lists; writes self.ground, self.joined (how many bodies became
        supported at each pass) and self.reached (the last pass in which one did, as LoadPaths.kernel_up)."""
        n_bodies, _n_all, up = _bodies(model, failed_step)
        self.reached[None] = 0
        for p in range(PASS_CHUNK):
            self.joined[p] = 0
        for i in range(n_bodies):
            self.ground[0, i] = ti.i8(0)
        for p in ti.static(range(PASS_CHUNK)):
            src = p % 2
            for i in range(n_bodies):
                g = 0
                if unpack_body(solver.body[i]).inv_mass > 0.0:
                    li = base + i
                    for k in range(lists.length(li)):
                        rec = lists.get(li, k)
                        under = _support_under(solver, rec, up)
                        if under == ON_GROUND:
                            g = 1
                        elif under == ON_BODY:
                            if self.ground[src, rec.other] != 0:
                                g = 1
                self.ground[1 - src, i] = ti.cast(g, ti.i8)
                if g != 0 and self.ground[src, i] == 0:
                    ti.atomic_max(self.reached[None], p + 1)
                    ti.atomic_add(self.joined[p], 1)


@ti.func
def _across(r, t1, t2):
    """r's coordinates across the up axis (in the plane of t1, t2)."""
    return vec2(r.dot(t1), r.dot(t2))
