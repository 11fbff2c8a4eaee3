"""Diagnostics: what a step reports about itself, on the device, and the one read a frame makes of it.

A step records, without a host read: the first body that went NaN or faster than sim.max_speed (health), the
contact points it found and the deepest penetration. kernel_frame_readout gathers these with the kinetic energy
into one small field, so that the host pays one round trip a frame for all of them (app.sim.simulation).
"""
import taichi as ti

from app.sim.math3d import quat_mul

# Sentinel for "no bad body seen" in error_body / error_step (atomic_min keeps the first).
NO_ERROR = 2 ** 31 - 1

# What kernel_frame_readout writes, by index (Simulation.read_frame reads it).
READOUT_FIELDS = ("error_step", "error_body", "error_kind", "failed_step", "contacts", "max_depth", "dropped",
                  "kinetic_energy")


@ti.data_oriented
class Diagnostics:
    """0-d fields a step writes:

    error_body: i32, the body of lowest stored index that went NaN or faster than max_speed (NO_ERROR if none;
        Simulation.check names it by its scene index). error_step: i32, the earliest step at which it happened.
        error_kind: i32, 1 NaN, 2 too fast.
    contact_total: i32, contact points found in the last step (a pair contact counts once).
    max_depth: f32 m, deepest penetration seen since the last reset_max_depth().
    readout: f64 (len(READOUT_FIELDS),), kernel_frame_readout's output.
    """

    def __init__(self):
        self.error_body = ti.field(ti.i32, ())
        self.error_step = ti.field(ti.i32, ())
        self.error_kind = ti.field(ti.i32, ())
        self.contact_total = ti.field(ti.i32, ())
        self.max_depth = ti.field(ti.f32, ())
        self.readout = ti.field(ti.f64, shape=len(READOUT_FIELDS))
        self.reset()

    def reset(self):
        self.error_body[None] = NO_ERROR
        self.error_step[None] = NO_ERROR
        self.error_kind[None] = 0
        self.contact_total[None] = 0
        self.max_depth[None] = 0.0

    def reset_max_depth(self):
        self.max_depth[None] = 0.0


# Taichi turns an atomic on a 0-d field whose result is unused into a per-thread reduction: every thread of the
# kernel then does the atomic at its end, on one address, whether or not it ever reached the atomic (1.96 ms of a
# 1M-body step on an H200 for three such atomics in the integrator; 0.04 ms without). Loading the field first
# disqualifies that pass, and skips the atomic when it cannot change anything.
@ti.func
def atomic_max_rare(field: ti.template(), value):
    """field[None] = max(field[None], value), with an atomic only when value is larger."""
    if value > field[None]:
        ti.atomic_max(field[None], value)


@ti.func
def atomic_min_rare(field: ti.template(), value):
    """field[None] = min(field[None], value), with an atomic only when value is smaller."""
    if value < field[None]:
        ti.atomic_min(field[None], value)


@ti.func
def _finite3(v):
    # NaN fails every comparison; inf fails the bound
    return (ti.abs(v[0]) < 1e30) and (ti.abs(v[1]) < 1e30) and (ti.abs(v[2]) < 1e30)


@ti.func
def check_body(diagnostics: ti.template(), i, step_index, x, v, w, bounding_radius, max_speed):
    """Record body i (stored index) in the health fields if its position x (m), velocity v (m/s) or angular
    velocity w (rad/s) is not finite (kind 1), or if it moves faster than max_speed (m/s; its surface at
    |w| * bounding_radius) (kind 2)."""
    bad = 0
    if not (_finite3(x) and _finite3(v) and _finite3(w)):
        bad = 1
    elif v.norm() > max_speed or w.norm() * bounding_radius > max_speed:
        bad = 2
    if bad > 0:
        atomic_min_rare(diagnostics.error_step, step_index)
        atomic_min_rare(diagnostics.error_body, i)
        atomic_max_rare(diagnostics.error_kind, bad)


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


@ti.kernel
def kernel_frame_readout(model: ti.template(), state: ti.template(), diagnostics: ti.template(),
                         contacts: ti.template()):
    """What the end of a frame reads, into diagnostics.readout (READOUT_FIELDS), so that the host pays one round
    trip for all of it: the health fields, contacts.failed_step (Simulation.advance), contact points of the last
    step, the deepest penetration (m), the appends the padded / dynamic storage dropped (0 for a VLA), and the
    total kinetic energy (J). i32 values are exact in f64."""
    out = ti.static(diagnostics.readout)
    out[0] = diagnostics.error_step[None]
    out[1] = diagnostics.error_body[None]
    out[2] = diagnostics.error_kind[None]
    out[3] = contacts.failed_step[None]
    out[4] = diagnostics.contact_total[None]
    out[5] = diagnostics.max_depth[None]
    out[6] = 0.0
    if ti.static(hasattr(contacts.lists, "dropped_total")):
        out[6] = contacts.lists.dropped_total()
    total = ti.f64(0.0)
    for i in range(model.body_count[None]):
        total += body_kinetic_energy(model, state, i)
    out[7] = total
