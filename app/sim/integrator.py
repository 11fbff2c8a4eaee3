"""Integrator: semi-implicit (symplectic) Euler on the solved velocities, and the health check.

    v_{n+1} = solved velocity (gravity was added before the solve: v_n + g dt + contact impulses / m)
    x_{n+1} = x_n + (v_{n+1} + v_pseudo) dt
    q_{n+1} = normalize(q_n + dt/2 (0, w_{n+1} + w_pseudo) q_n)

The pseudo velocities come from the split-impulse position correction and are dropped after this update.
The gyroscopic term of Euler's equations is integrated with gravity, before the solve (gyroscopic_step).
"""

import taichi as ti

from app.atomics import atomic_max_rare, atomic_min_rare
from app.math3d import diag3, quat_mul
from app.contacts import skipping
from app.solver_body import unpack_motion

# Sentinel for "no bad body seen" in Health.error_body / error_step (atomic_min keeps the first).
NO_ERROR = 2 ** 31 - 1


@ti.data_oriented
class Health:
    """error_body: 0-d i32, the body of lowest stored index that went NaN or faster than max_speed (NO_ERROR
    if none; Simulation.check names it by its scene index).
    error_step: 0-d i32, the earliest step at which it happened. error_kind: 0-d i32, 1 NaN, 2 too fast."""

    def __init__(self):
        self.error_body = ti.field(ti.i32, ())
        self.error_step = ti.field(ti.i32, ())
        self.error_kind = ti.field(ti.i32, ())
        self.reset()

    def reset(self):
        self.error_body[None] = NO_ERROR
        self.error_step[None] = NO_ERROR
        self.error_kind[None] = 0


@ti.func
def gyroscopic_step(w, R, inv_inertia_body, dt):
    """Angular velocity w (world frame, rad/s) after dt of torque-free rotation of a body with orientation R and
    diagonal body-frame inverse inertia inv_inertia_body (1/(kg m^2)): Euler's equations I dw/dt = -w x I w in
    the body frame, by implicit Euler with one Newton step (Catto, "Numerical Methods", GDC 2015; Bullet's
    btRigidBody::computeGyroscopicImpulseImplicit_Body), then scaled back to the step's kinetic energy. Implicit,
    so a fast spin about an unstable axis cannot gain energy (explicit Euler does); the little it loses instead
    is put back by the scaling. Without this term w stays constant in the
    world while the inertia turns with the body, so a free asymmetric body's angular momentum R I R^T w drifts
    (and an intermediate-axis spin never tumbles). Bodies with equal principal inertias (spheres, cubes) have no
    gyroscopic torque and are left as they are, as are bodies with an infinite inertia about some axis."""
    out = w
    d = inv_inertia_body
    if d.min() > 0.0 and not (d[0] == d[1] and d[1] == d[2]):
        inertia = 1.0 / d
        I = diag3(inertia)
        wb = R.transpose() @ w
        Iw = inertia * wb
        residual = dt * wb.cross(Iw)   # of I (wb' - wb) + dt wb' x I wb' = 0 at wb' = wb
        # its Jacobian: I + dt (skew(wb) I - skew(I wb))
        J = I + dt * (_skew(wb) @ I - _skew(Iw))
        wn = wb - J.inverse() @ residual
        # The gyroscopic torque does no work, but implicit Euler damps it (2-3% of a free spin's energy in 3 s
        # at dt = 2 ms). Projecting back onto the energy surface (Hairer, Lubich, Wanner, "Geometric Numerical
        # Integration", IV.4: projection methods) removes that drift; the scale is 1 + O(dt^2) and never
        # adds energy the spin did not have before the step.
        e_old = wb.dot(Iw)
        e_new = wn.dot(inertia * wn)
        out = R @ (wn * ti.select(e_new > 0.0, ti.sqrt(e_old / e_new), 1.0))
    return out


@ti.func
def _skew(a):
    """The matrix of a x ."""
    return ti.Matrix([[0.0, -a[2], a[1]], [a[2], 0.0, -a[0]], [-a[1], a[0], 0.0]], dt=ti.f32)


@ti.func
def _finite3(v):
    # NaN fails every comparison; inf fails the bound
    return (ti.abs(v[0]) < 1e30) and (ti.abs(v[1]) < 1e30) and (ti.abs(v[2]) < 1e30)


@ti.kernel
def kernel_integrate(model: ti.template(), state_in: ti.template(), state_out: ti.template(), solver: ti.template(),
                     src: ti.i32, dt: ti.f32, step_index: ti.i32, health: ti.template(), failed_step: ti.template()):
    """Reads solver buffers [src] and state_in poses; writes state_out; flags NaN/explosions in health. Nothing
    while skipping(failed_step) (app.contacts.ContactSet.failed_step: the step is to be redone from
    state_in, so state_in = state_out must stay as it is)."""
    vmax = model.max_speed[None]
    for i in range(ti.select(skipping(failed_step), 0, model.body_count[None])):
        mo = unpack_motion(solver.motion[src, i])
        v = mo.v
        w = mo.w
        x = state_in.body_pos[i]
        q = state_in.body_quat[i]
        if model.body_inv_mass[i] > 0.0:
            x = x + (v + mo.pv) * dt
            wt = w + mo.pw
            dq = quat_mul(ti.Vector([0.0, wt[0], wt[1], wt[2]]), q)
            q = (q + 0.5 * dt * dq).normalized()
        else:
            v = ti.Vector([0.0, 0.0, 0.0])
            w = ti.Vector([0.0, 0.0, 0.0])
        state_out.body_pos[i] = x
        state_out.body_quat[i] = q
        state_out.body_vel[i] = v
        state_out.body_omega[i] = w
        bad = 0
        if not (_finite3(x) and _finite3(v) and _finite3(w)):
            bad = 1
        elif v.norm() > vmax or w.norm() * model.body_radius[i] > vmax:
            bad = 2
        if bad > 0:
            atomic_min_rare(health.error_step, step_index)
            atomic_min_rare(health.error_body, i)
            atomic_max_rare(health.error_kind, bad)


@ti.func
def body_kinetic_energy(model: ti.template(), state: ti.template(), i):
    """Kinetic energy (J, f64) of body i: translational + rotational (body-frame diagonal inertia); 0 if fixed."""
    total = ti.f64(0.0)
    im = model.body_inv_mass[i]
    if im > 0.0:
        v = state.body_vel[i]
        q = state.body_quat[i]
        # body-frame angular velocity: R^T w, via q* w q
        w = state.body_omega[i]
        qc = ti.Vector([q[0], -q[1], -q[2], -q[3]])
        wb4 = quat_mul(quat_mul(qc, ti.Vector([0.0, w[0], w[1], w[2]])), q)
        ii = model.body_inv_inertia[i]
        e = 0.5 * v.norm_sqr() / im
        for a in ti.static(range(3)):
            if ii[a] > 0.0:
                e += 0.5 * wb4[a + 1] * wb4[a + 1] / ii[a]
        total = ti.cast(e, ti.f64)
    return total


@ti.kernel
def kernel_kinetic_energy(model: ti.template(), state: ti.template()) -> ti.f64:
    """Total kinetic energy (J)."""
    total = ti.f64(0.0)
    for i in range(model.body_count[None]):
        total += body_kinetic_energy(model, state, i)
    return total


# What kernel_frame_readout writes, by index (app.sim.Simulation.read_frame reads it).
READOUT_FIELDS = ("error_step", "error_body", "error_kind", "failed_step", "contacts", "max_depth", "dropped",
                  "kinetic_energy")


@ti.kernel
def kernel_frame_readout(model: ti.template(), state: ti.template(), health: ti.template(), contacts: ti.template(),
                         out: ti.template()):
    """What the end of a frame reads, into one f64 field (READOUT_FIELDS), so that the host pays one round trip
    for all of it: the health flags, contacts.failed_step (app.sim.Simulation.advance), contact points of the
    last step, the deepest penetration (m), the appends the padded / dynamic storage dropped (0 for a VLA),
    and the total kinetic energy (J). i32 values are exact in f64."""
    out[0] = health.error_step[None]
    out[1] = health.error_body[None]
    out[2] = health.error_kind[None]
    out[3] = contacts.failed_step[None]
    out[4] = contacts.contact_total[None]
    out[5] = contacts.max_depth[None]
    out[6] = 0.0
    if ti.static(hasattr(contacts.lists, "dropped_total")):
        out[6] = contacts.lists.dropped_total()
    total = ti.f64(0.0)
    for i in range(model.body_count[None]):
        total += body_kinetic_energy(model, state, i)
    out[7] = total
