"""Diagnostics: what a step reports about itself, on the device, and the one read a frame makes of it.

A step records, without a host read: the first body that went NaN or faster than sim.max_speed (health), the
contact points it found, the deepest penetration, and the deepest as a fraction of the pair's size (a pair deeper
than sim.penetration_limit is named). kernel_frame_readout gathers these with the kinetic energy into one small
field, so that the host pays one round trip a frame for all of them (app.sim.simulation), and starts the next
frame's penetration record. OverlapWatch follows deep penetration from frame to frame on the host.
"""
import taichi as ti

from app.sim.math3d import quat_mul
from vla import Batch

# Sentinel for "no bad body seen" in error_body / error_step (atomic_min keeps the first).
NO_ERROR = 2 ** 31 - 1

# Sentinel for "no pair deeper than the limit" in deep_pair (atomic_min keeps the pair of lowest stored indices).
NO_PAIR = 2 ** 62
# deep_pair = i * PAIR_STRIDE + (j + 1): bodies i, j (stored indices; j = -1: static geometry) in one i64
PAIR_STRIDE = 2 ** 32

# What kernel_frame_readout writes, by index (Simulation.read_frame reads it).
READOUT_FIELDS = ("error_step", "error_body", "error_kind", "failed_step", "contacts", "max_depth", "dropped",
                  "kinetic_energy", "max_depth_fraction", "deep_body", "deep_other")
# The fields read_frame keeps as floats (the others are integers).
READOUT_FLOATS = ("max_depth", "kinetic_energy", "max_depth_fraction")


@ti.data_oriented
class Diagnostics:
    """0-d fields a step writes:

    error_body: i32, the body of lowest stored index that went NaN or faster than max_speed (NO_ERROR if none;
        Simulation.check names it by its scene index). error_step: i32, the earliest step at which it happened.
        error_kind: i32, 1 NaN, 2 too fast.
    contact_total: i32, contact points found in the last step (a pair contact counts once).
    max_depth: f32 m, deepest penetration seen since the last readout (kernel_frame_readout starts it again).
    max_depth_fraction: f32, the largest penetration / size of a pair since the last readout; size: the smaller
        of the two bodies' half-sizes (sphere radius, a box's smallest half extent; static geometry has none).
    deep_pair: i64, the pair of lowest stored indices deeper than model.penetration_limit since the last readout,
        as i * PAIR_STRIDE + (j + 1) (NO_PAIR if none).
    readout: f64 (len(READOUT_FIELDS),), kernel_frame_readout's output.
    """

    def __init__(self):
        self.error_body = ti.field(ti.i32, ())
        self.error_step = ti.field(ti.i32, ())
        self.error_kind = ti.field(ti.i32, ())
        self.contact_total = ti.field(ti.i32, ())
        self.max_depth = ti.field(ti.f32, ())
        self.max_depth_fraction = ti.field(ti.f32, ())
        self.deep_pair = ti.field(ti.i64, ())
        self.readout = ti.field(ti.f64, shape=len(READOUT_FIELDS))
        self.reset()

    def reset(self):
        self.error_body[None] = NO_ERROR
        self.error_step[None] = NO_ERROR
        self.error_kind[None] = 0
        self.contact_total[None] = 0
        self.max_depth[None] = 0.0
        self.max_depth_fraction[None] = 0.0
        self.deep_pair[None] = NO_PAIR


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
def record_penetration(model: ti.template(), diagnostics: ti.template(), i, j, depth, size):
    """Record the deepest penetration depth (m) of pair (i, j) (stored indices; j < 0: static geometry) in
    diagnostics.max_depth, and depth / size (size m: the smaller half-size of the pair) in max_depth_fraction and,
    past model.penetration_limit, deep_pair."""
    atomic_max_rare(diagnostics.max_depth, depth)
    if depth > 0.0:
        fraction = depth / size
        atomic_max_rare(diagnostics.max_depth_fraction, fraction)
        if fraction > model.penetration_limit[None]:
            # (every plane, -1 - k, is "the static geometry", -1: j + 1 must not go below 0, or the pair's
            # decoding borrows from i)
            pair = ti.cast(i, ti.i64) * ti.i64(PAIR_STRIDE) + ti.cast(ti.max(j, -1) + 1, ti.i64)
            atomic_min_rare(diagnostics.deep_pair, pair)


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
    step, the deepest penetration (m), the appends the padded / dynamic storage dropped (0 for a VLA), the
    total kinetic energy (J), the largest penetration fraction and the pair deeper than the limit (bodies i and j,
    NO_ERROR when none). i32 values are exact in f64. The penetration record starts again for the next frame, unless a
    step failed (it and the steps after it are redone and read again)."""
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
    out[8] = diagnostics.max_depth_fraction[None]
    pair = diagnostics.deep_pair[None]
    out[9] = NO_ERROR
    out[10] = NO_ERROR
    if pair != ti.i64(NO_PAIR):
        out[9] = ti.cast(pair // ti.i64(PAIR_STRIDE), ti.f64)
        out[10] = ti.cast(pair % ti.i64(PAIR_STRIDE) - 1, ti.f64)
    if contacts.failed_step[None] == ti.static(Batch.NO_FAILURE):
        # the frame's steps are final: the next frame's record starts here. (After a failed step the host redoes the
        # steps from it and reads again: the record of the steps before it must stay.)
        diagnostics.max_depth[None] = 0.0
        diagnostics.max_depth_fraction[None] = 0.0
        diagnostics.deep_pair[None] = ti.i64(NO_PAIR)
    total = ti.f64(0.0)
    for i in range(model.body_count[None]):
        total += body_kinetic_energy(model, state, i)
    out[7] = total


class OverlapWatch:
    """Deep penetration over a run, followed on the host from each frame's readout (no extra device read).

    A frame is deep when a contact went deeper than sim.penetration_limit times the pair's size (see Diagnostics).
    observe() returns the events to report: "deep" at the first deep frame, "persistent" when deep frames have
    followed each other for PERSIST_S seconds of simulated time (bodies that start inside each other and stay so,
    a body pushed through another).

    max_fraction: the largest penetration fraction seen. deep_frames: frames that were deep. longest_deep_s: the
    longest run of deep frames (s). first_deep: {"time": s, "bodies": [i, j or -1]} or None, the bodies as the
    frame's "deep_body" and "deep_other" named them (Simulation passes scene indices).
    """

    PERSIST_S = 0.5

    def __init__(self):
        self.max_fraction = 0.0
        self.deep_frames = 0
        self.longest_deep_s = 0.0
        self.first_deep = None
        self._since = None          # start (s) of the current run of deep frames
        self._persistent = False    # reported once

    def observe(self, frame: dict, t_start: float, t_end: float) -> list[str]:
        """Take the readout `frame` of the frame that simulated [t_start, t_end] (s)."""
        self.max_fraction = max(self.max_fraction, frame["max_depth_fraction"])
        if frame["deep_body"] == NO_ERROR:
            self._since = None
            return []
        events = []
        self.deep_frames += 1
        if self.first_deep is None:
            self.first_deep = {"time": t_end, "bodies": [frame["deep_body"], frame["deep_other"]]}
            events.append("deep")
        if self._since is None:
            self._since = t_start
        self.longest_deep_s = max(self.longest_deep_s, t_end - self._since)
        if t_end - self._since >= self.PERSIST_S - 1e-9 and not self._persistent:
            self._persistent = True
            events.append("persistent")
        return events
