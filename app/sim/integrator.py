"""Integrator: semi-implicit (symplectic) Euler on the solved velocities.

    v_{n+1} = solved velocity (gravity was added before the solve: v_n + g dt + contact impulses / m)
    x_{n+1} = x_n + (v_{n+1} + v_pseudo) dt
    q_{n+1} = normalize(q_n + dt/2 (0, w_{n+1} + w_pseudo) q_n)

The pseudo velocities come from the split-impulse position correction and are dropped after this update.
The gyroscopic term of Euler's equations is integrated with gravity, before the solve (gyroscopic_step). The
integration pass also checks every body for NaN and explosions (app.sim.diagnostics.check_body).
"""

import taichi as ti

from app.sim.contacts import skipping
from app.sim.diagnostics import check_body
from app.sim.math3d import diag3, quat_mul
from app.sim.solver_records import unpack_motion


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


@ti.kernel
def kernel_integrate(model: ti.template(), state_in: ti.template(), state_out: ti.template(), solver: ti.template(),
                     src: ti.i32, dt: ti.f32, step_index: ti.i32, diagnostics: ti.template(),
                     failed_step: ti.template()):
    """Reads solver buffers [src] and state_in poses; writes state_out; records NaN/explosions in diagnostics
    (app.sim.diagnostics.check_body). Nothing while skipping(failed_step) (app.sim.contacts.ContactSet.failed_step:
    the step is to be redone from state_in, so state_in = state_out must stay as it is)."""
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
        check_body(diagnostics, i, step_index, x, v, w, model.body_radius[i], vmax)
