"""Capsule geometry for the narrowphase: a capsule is the set of points within radius r of a segment, its body's
local y axis from -half_length to +half_length (app.scene.schema.SHAPE_CAPSULE; the model stores half_extents =
(r, half_length + r, r)). Closest points between segments follow Ericson, "Real-Time Collision Detection" (2005),
5.1.9; a segment against a box minimises the box's signed distance along the segment, which is convex (the signed
distance of a convex set is a convex function), so a golden-section search finds its deepest point. Free functions
of vectors; app.sim.narrowphase builds the manifolds from them."""

import taichi as ti

vec3 = ti.types.vector(3, ti.f32)

# Golden-section steps of segment_box_deepest: the bracket shrinks by 0.618 a step, to 1e-4 of the segment's length
# after 20 steps (a 1 m capsule: 0.1 mm along its axis; the depth error is second order in that).
GOLDEN_STEPS = 20
INV_PHI = 0.6180339887
# A segment closer to parallel with a face (or another segment) than this |cos| of the angle between the segment and
# the face's plane (or the other segment) rests on it along a line: two contact points instead of one (a capsule
# lying on a floor, a log on a log). sin(~8 deg) away from parallel.
PARALLEL_SIN = 0.14


@ti.func
def capsule_segment(p, R, half_extents):
    """World endpoints (a, b) of the segment of a capsule at p (m) turned by R: a at local -y, b at local +y."""
    axis = ti.Vector([R[0, 1], R[1, 1], R[2, 1]]) * (half_extents[1] - half_extents[0])
    return p - axis, p + axis


@ti.func
def closest_on_segment(a, b, c):
    """Parameter t in [0, 1] of the point a + t (b - a) closest to c."""
    d = b - a
    dd = d.dot(d)
    t = 0.0
    if dd > 1e-20:
        t = ti.math.clamp((c - a).dot(d) / dd, 0.0, 1.0)
    return t


@ti.func
def segments_closest(p1, q1, p2, q2):
    """Parameters (s, t) in [0, 1] of the closest points p1 + s (q1 - p1) and p2 + t (q2 - p2) of two segments
    (Ericson 5.1.9; parallel segments: s = 0 and its closest t, or the clamped projections)."""
    d1 = q1 - p1
    d2 = q2 - p2
    r = p1 - p2
    a = d1.dot(d1)
    e = d2.dot(d2)
    f = d2.dot(r)
    s = 0.0
    t = 0.0
    eps = 1e-20
    if a <= eps and e <= eps:
        s = 0.0
        t = 0.0
    elif a <= eps:
        t = ti.math.clamp(f / e, 0.0, 1.0)
    else:
        c = d1.dot(r)
        if e <= eps:
            s = ti.math.clamp(-c / a, 0.0, 1.0)
        else:
            b = d1.dot(d2)
            denom = a * e - b * b
            if denom > 1e-12 * a * e:
                s = ti.math.clamp((b * f - c * e) / denom, 0.0, 1.0)
            t = (b * s + f) / e
            if t < 0.0:
                t = 0.0
                s = ti.math.clamp(-c / a, 0.0, 1.0)
            elif t > 1.0:
                t = 1.0
                s = ti.math.clamp((b - c) / a, 0.0, 1.0)
    return s, t


@ti.func
def box_signed_distance(x, h):
    """Signed distance (m) from local point x to the box of half extents h (negative inside)."""
    q = ti.abs(x) - h
    outside = ti.max(q, 0.0).norm()
    inside = ti.min(ti.max(q[0], ti.max(q[1], q[2])), 0.0)
    return outside + inside


@ti.func
def box_closest(x, h):
    """(n, s, face): for local point x against the box of half extents h, the outward unit normal n (from the box
    towards x), the signed distance s along it (negative inside) and, when the closest feature is a face (x outside
    across one face, or inside), that face's axis (0-2), else -1. Inside, the face of least penetration."""
    clamped = ti.math.clamp(x, -h, h)
    diff = x - clamped
    dist = diff.norm()
    n = vec3(0.0, 1.0, 0.0)
    s = 0.0
    face = -1
    if dist > 1e-7:
        n = diff / dist
        s = dist
        outside_axes = 0
        for a in ti.static(range(3)):
            if ti.abs(x[a]) > h[a]:
                outside_axes += 1
                face = a
        if outside_axes != 1:
            face = -1
    else:
        best = 0
        best_gap = h[0] - ti.abs(x[0])
        for a in ti.static(range(1, 3)):
            g = h[a] - ti.abs(x[a])
            if g < best_gap:
                best_gap = g
                best = a
        n = vec3(0.0)
        n[best] = 1.0 if x[best] >= 0.0 else -1.0
        s = -best_gap
        face = best
    return n, s, face


@ti.func
def segment_box_deepest(a, b, h):
    """Parameter t in [0, 1] of the point of segment a-b (local to the box of half extents h) deepest in the box, or
    closest to it: the minimum of the box's signed distance along the segment, by golden section."""
    lo = 0.0
    hi = 1.0
    x1 = hi - INV_PHI * (hi - lo)
    x2 = lo + INV_PHI * (hi - lo)
    f1 = box_signed_distance(a + x1 * (b - a), h)
    f2 = box_signed_distance(a + x2 * (b - a), h)
    for _ in range(GOLDEN_STEPS):   # (a loop, not unrolled: the pair class compiles smaller)
        if f1 <= f2:
            hi = x2
            x2 = x1
            f2 = f1
            x1 = hi - INV_PHI * (hi - lo)
            f1 = box_signed_distance(a + x1 * (b - a), h)
        else:
            lo = x1
            x1 = x2
            f1 = f2
            x2 = lo + INV_PHI * (hi - lo)
            f2 = box_signed_distance(a + x2 * (b - a), h)
    t = 0.5 * (lo + hi)
    # the ends: the search brackets the minimum inside (0, 1) and never evaluates them
    ft = box_signed_distance(a + t * (b - a), h)
    if box_signed_distance(a, h) < ft:
        t = 0.0
        ft = box_signed_distance(a, h)
    if box_signed_distance(b, h) < ft:
        t = 1.0
    return t


@ti.func
def clip_segment_to_face(a, b, h, face):
    """(t0, t1, ok): the part t0 <= t <= t1 of segment a-b (local to the box of half extents h) whose projection
    along axis `face` falls on the box's face (inside its rectangle in the two other axes); ok is False when none
    does."""
    t0 = 0.0
    t1 = 1.0
    d = b - a
    for k in ti.static(range(3)):
        if k != face:
            if ti.abs(d[k]) < 1e-12:
                if ti.abs(a[k]) > h[k]:
                    t0 = 1.0
                    t1 = 0.0
            else:
                u = (-h[k] - a[k]) / d[k]
                v = (h[k] - a[k]) / d[k]
                t0 = ti.max(t0, ti.min(u, v))
                t1 = ti.min(t1, ti.max(u, v))
    return t0, t1, t0 <= t1
