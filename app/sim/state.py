"""State: what changes every step (positions, orientations, velocities), on the device."""
from __future__ import annotations

import numpy as np
import taichi as ti


BODY_FIELDS = ("body_pos", "body_quat", "body_vel", "body_omega", "body_slow_time")


@ti.data_oriented
class State:
    """Per-body dynamic state, shape (body_capacity,), valid for indices < model.body_count[None].

    body_pos: vec3 f32, m, world position of the centre of mass.
    body_quat: vec4 f32, unit quaternion (w, x, y, z), body-to-world rotation.
    body_vel: vec3 f32, m/s, linear velocity of the centre of mass.
    body_omega: vec3 f32, rad/s, angular velocity in world coordinates.
    body_slow_time: f32, s, how long the body has been slower than model.sleep_speed; at model.sleep_time or more it
        sleeps (asleep(), app.sim.integrator): it keeps still and is not solved until something moving
        touches it or Simulation.wake() is called.
    step: host int, the steps taken to reach this state (the solver sets state_out.step = state_in.step + 1).

    The viewer reads body_pos/body_quat directly in its own kernels to fill instance transforms.
    """

    def __init__(self, body_capacity: int):
        self.body_capacity = int(body_capacity)
        n = self.body_capacity
        self.body_pos = ti.Vector.field(3, ti.f32, n)
        self.body_quat = ti.Vector.field(4, ti.f32, n)
        self.body_vel = ti.Vector.field(3, ti.f32, n)
        self.body_omega = ti.Vector.field(3, ti.f32, n)
        self.body_slow_time = ti.field(ti.f32, n)
        # this step's wake-ups (> 0: a moving body touches this sleeping one; app.sim.state.HELD: an awake one
        # that does not wake it holds it awake, its clock running on): cleared by the broadphase, set by its wake pass
        # and the narrowphase, read by the solver and the integrator of the same step; not state between steps
        self.body_woken = ti.field(ti.i32, n)
        self.woken_count = ti.field(ti.i32, 8)   # bodies each round of app.sim.broadphase.kernel_wake_touched woke
        # An external force on one body, applied in every step until cleared (Simulation.set_external_force: the
        # viewer's drag): the body's stored index (-1: none), the force (N) and its point of application (world, m).
        self.ext_body = ti.field(ti.i32, ())
        self.ext_force = ti.Vector.field(3, ti.f32, ())
        self.ext_point = ti.Vector.field(3, ti.f32, ())
        self.ext_body[None] = -1
        self.step = 0

    def set_rows(self, start: int, position, orientation, velocity, angular_velocity):
        """Write rows [start, start+len) from numpy arrays, awake; keeps rows < start (read back first)."""
        k = len(position)
        cur = self.to_numpy(start) if start > 0 else None
        slow = np.zeros(self.body_capacity, np.float32)
        if cur is not None:
            slow[:start] = cur["body_slow_time"]
        self.body_slow_time.from_numpy(slow)
        for name, new, width in (("body_pos", position, 3), ("body_quat", orientation, 4), ("body_vel", velocity, 3),
                                 ("body_omega", angular_velocity, 3)):
            out = np.zeros((self.body_capacity, width), np.float32)
            if cur is not None:
                out[:start] = cur[name]
            out[start:start + k] = np.asarray(new, np.float32).reshape(k, width)
            if name == "body_quat":
                out[start + k:, 0] = 1.0
            getattr(self, name).from_numpy(out)

    def set_slow_time(self, slow_time):
        """body_slow_time of rows [0, len(slow_time)) (s); the others 0."""
        out = np.zeros(self.body_capacity, np.float32)
        out[:len(slow_time)] = slow_time
        self.body_slow_time.from_numpy(out)

    def to_numpy(self, count: int) -> dict:
        return {name: getattr(self, name).to_numpy()[:count] for name in BODY_FIELDS}


# state.body_woken of a sleeper-by-time that an awake body holds awake for the step (app.sim.broadphase.kernel_wake_touched)
HELD = -1


@ti.func
def asleep_by_time(model, state, i):
    """Whether movable body i has been slower than model.sleep_speed for model.sleep_time (sleep_speed 0: never).
    Asleep this step unless woken (asleep())."""
    return model.sleep_speed[None] > 0.0 and state.body_slow_time[i] >= model.sleep_time[None] and \
        model.body_inv_mass[i] > 0.0


@ti.func
def still_since_last_step(model, state, b, dt):
    """Body b (or plane -1 - b) is where it was at last step's narrowphase: a plane, a fixed body, or a body that
    slept through the whole of the last step (app.sim.integrator leaves a sleeper where it is and adds dt to its
    sleep clock, which reached sleep_time at the end of the step the body last moved in)."""
    out = True
    if b >= 0:
        if model.body_inv_mass[b] > 0.0:
            out = asleep_by_time(model, state, b) and \
                state.body_slow_time[b] >= model.sleep_time[None] + 0.5 * dt
        else:
            out = model.body_kinematic[b] == 0
    return out


@ti.func
def moves_itself(model, i):
    """Body i moves by its own velocity: a dynamic body, or a kinematic one (a fixed body does not); one that does
    can wake a sleeper it touches."""
    return model.body_inv_mass[i] > 0.0 or model.body_kinematic[i] != 0


@ti.func
def asleep(model, state, i):
    """Body i sleeps this step: asleep by time, and neither woken by a moving body touching it nor held awake by an
    awake one (the wake pass and the narrowphase decide, so valid from the solver on). A sleeping body keeps still
    and counts as fixed for the bodies touching it."""
    return asleep_by_time(model, state, i) and state.body_woken[i] == 0
