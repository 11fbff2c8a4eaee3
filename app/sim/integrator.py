"""Integrator: semi-implicit (symplectic) Euler on the solved velocities, and free rotation that keeps angular
momentum.

    v_{n+1} = solved velocity (gravity was added before the solve: v_n + g dt + contact impulses / m)
    x_{n+1} = x_n + (v_{n+1} + v_pseudo) dt
    q_{n+1} = exp(dt (w_mid + w_pseudo)) q_n,   w_{n+1} = R_{n+1} I^-1 R_{n+1}^T L,   L = R_n I R_n^T w_solved

The rotation carries the solved angular momentum L through the step unchanged (rotate_keeping_momentum): that is
the torque-free part of Euler's equations (the gyroscopic term), exact for L, with the orientation advanced by the
angular velocity at the half step (explicit midpoint on the rotation group), which keeps a free body's kinetic
energy to O(dt^2) per step without drift. The pseudo velocities come from the split-impulse position correction
and are dropped after this update. A sleeping body (app.sim.state.asleep) stays where it is; every other body counts
how long it has been slower than model.sleep_speed. The integration pass also checks every body for NaN and explosions
(app.sim.diagnostics.check_body).
"""

import taichi as ti

from app.sim.contacts import skipping
from app.sim.diagnostics import check_body
from app.sim.math3d import quat_mul_as, quat_to_mat_as
from app.sim.solver_records import unpack_motion
from app.sim.state import HELD, asleep


@ti.func
def quat_step(q, w, dt, dtype: ti.template()):
    """q turned by the rotation vector w dt (w in rad/s, world frame): exp(w dt / 2) q, normalised; in dtype."""
    theta = w.norm() * dt
    half = ti.cast(0.5 * dt, dtype)
    dq = ti.Vector([1.0, half * w[0], half * w[1], half * w[2]], dt=dtype)   # (the first order: exact here)
    if theta > 1e-6:
        axis = w / w.norm()
        s = ti.sin(0.5 * theta)
        dq = ti.Vector([ti.cos(0.5 * theta), s * axis[0], s * axis[1], s * axis[2]], dt=dtype)
    return quat_mul_as(dq, q, dtype).normalized()


@ti.func
def rotate_keeping_momentum(q, w, w_pseudo, inv_inertia_body, dt):
    """(orientation, angular velocity) after dt of torque-free rotation from orientation q (unit quaternion) with
    angular velocity w (world frame, rad/s) of a body with diagonal body-frame inverse inertia inv_inertia_body
    (1/(kg m^2)); w_pseudo (rad/s) turns the body without being momentum (position correction).

    The world angular momentum L = R I R^T w is kept exactly: the angular velocity at any orientation is
    R I^-1 R^T L. The orientation advances by the angular velocity at the half step (explicit midpoint on the
    rotation group: the kinetic energy 1/2 w.L then holds to ~1e-7 over 5 s of tumbling at dt = 2 ms, where a
    first-order step gains 2-4%). Without this, w stays constant in the world while the inertia turns with the
    body, so a free asymmetric body's angular momentum drifts (and an intermediate-axis spin never tumbles).
    Bodies with equal principal inertias (spheres, cubes; L parallel to w) and bodies with an infinite inertia
    about some axis keep w."""
    d = inv_inertia_body
    q_out = quat_step(q, w + w_pseudo, dt, ti.f32)
    w_out = w
    if d.min() > 0.0 and not (d[0] == d[1] and d[1] == d[2]):
        # in f64: in f32 the rounding of the three rotations adds up to a 0.15% energy gain over 5 s of tumbling
        qd = ti.cast(q, ti.f64)
        wd = ti.cast(w, ti.f64)
        dd = ti.cast(d, ti.f64)
        R = quat_to_mat_as(qd, ti.f64)
        L = R @ ((R.transpose() @ wd) / dd)
        R_half = quat_to_mat_as(quat_step(qd, wd, 0.5 * dt, ti.f64), ti.f64)
        w_half = R_half @ (dd * (R_half.transpose() @ L))
        q_new = quat_step(qd, w_half + ti.cast(w_pseudo, ti.f64), dt, ti.f64)
        R_out = quat_to_mat_as(q_new, ti.f64)
        q_out = ti.cast(q_new, ti.f32)
        w_out = ti.cast(R_out @ (dd * (R_out.transpose() @ L)), ti.f32)
    return q_out, w_out


@ti.func
def kinematic_step(model: ti.template(), i, x, q, dt):
    """(position, orientation, velocity, angular velocity) after dt of kinematic body i at x, q: the exact rigid
    motion that turns it at model.body_kin_omega about its pivot (model.body_kin_pivot, in its frame) while the
    pivot moves at model.body_kin_velocity. Its velocity is its centre's, as the contacts see it."""
    w = model.body_kin_omega[i]
    pivot_local = model.body_kin_pivot[i]
    pivot = x + quat_to_mat_as(q, ti.f32) @ pivot_local + model.body_kin_velocity[i] * dt
    q_new = quat_step(q, w, dt, ti.f32)
    x_new = pivot - quat_to_mat_as(q_new, ti.f32) @ pivot_local
    return x_new, q_new, model.body_kin_velocity[i] + w.cross(x_new - pivot), w


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
        slow = state_in.body_slow_time[i]
        if asleep(model, state_in, i):
            v = ti.Vector([0.0, 0.0, 0.0])
            w = ti.Vector([0.0, 0.0, 0.0])
            slow = ti.min(slow + dt, 2.0 * model.sleep_time[None])
        elif model.body_inv_mass[i] > 0.0:
            x = x + (v + mo.pv) * dt
            q, w = rotate_keeping_momentum(q, w, mo.pw, model.body_inv_inertia[i], dt)
            # sleeping: slow for sleep_time (a woken body starts counting again). A held one (HELD) counts on, up
            # to sleep_time: it may sleep next step, and it is not taken for one that slept through this step
            # (app.sim.state.still_since_last_step: a clock past sleep_time by half a step)
            moving = v.norm() + w.norm() * model.body_radius[i] >= model.sleep_speed[None]
            cap = ti.select(state_in.body_woken[i] == HELD, 1.0, 2.0) * model.sleep_time[None]
            slow = ti.select(moving or state_in.body_woken[i] > 0, 0.0, ti.min(slow + dt, cap))
        elif model.body_kinematic[i] != 0:
            x, q, v, w = kinematic_step(model, i, x, q, dt)
        else:
            v = ti.Vector([0.0, 0.0, 0.0])
            w = ti.Vector([0.0, 0.0, 0.0])
        state_out.body_slow_time[i] = slow
        state_out.body_pos[i] = x
        state_out.body_quat[i] = q
        state_out.body_vel[i] = v
        state_out.body_omega[i] = w
        check_body(diagnostics, i, step_index, x, v, w, model.body_radius[i], vmax)
