"""Picking and dragging bodies with the mouse: the ray under the cursor, the body it hits, and the spring that pulls
the grabbed point toward the cursor (numpy, on the host; the force goes to the simulation through
Simulation.set_external_force).

The drag is MuJoCo's perturbation: a spring from the grabbed point to the cursor's point on the plane through the
grab facing the camera, critically damped at DRAG_HZ and scaled by the body's mass (every body follows alike),
plus the body's weight (it hangs at the cursor). Releasing the button removes the force: the body keeps its
velocity, so a quick drag throws it.
"""
from __future__ import annotations

import math

import numpy as np

from app.scene.schema import quat_matrices

DRAG_HZ = 2.0   # the spring's natural frequency (1/s)


def cursor_ray(position, lookat, up, fov_deg, aspect, cx, cy):
    """(origin, unit direction) of the ray through cursor (cx, cy) in [0, 1]^2 (x right, y up, GGUI's cursor
    coordinates) of a pinhole camera at `position` looking at `lookat` with vertical field of view fov_deg."""
    from app.viewer.render import look_at_matrix   # (the camera basis the renderer's projection uses)

    o = np.asarray(position, np.float64)
    v = look_at_matrix(position, lookat, up)
    r, u, f = v[0, :3], v[1, :3], -v[2, :3]
    t = math.tan(math.radians(fov_deg) / 2)
    d = f + (2 * cx - 1) * t * aspect * r + (2 * cy - 1) * t * u
    return o, d / np.linalg.norm(d)


def pick(origin, direction, positions, orientations, shape, half_extents, hull=None, hulls=()):
    """(body, distance along the ray) of the first body the ray hits, or (None, inf). shape: 0 sphere (radius
    half_extents[:, 0]), 1 box (half extents, in the body frame of `orientations`), 2 capsule (radius
    half_extents[:, 0] about its local y axis, half length half_extents[:, 1] - radius), 3 convex (hulls[hull[k]],
    app.scene.hull.Hull; without them, its bounding box)."""
    c = np.asarray(positions, np.float64)
    h = np.asarray(half_extents, np.float64)
    n = len(c)
    hit = np.full(n, np.inf)
    oc = origin[None, :] - c
    sph = np.asarray(shape) == 0
    if sph.any():   # |o + s d - c|^2 = r^2
        b = (oc[sph] @ direction)
        disc = b * b - ((oc[sph] ** 2).sum(1) - h[sph, 0] ** 2)
        s = -b - np.sqrt(np.maximum(disc, 0.0))
        hit[np.flatnonzero(sph)] = np.where((disc >= 0) & (s > 0), s, np.inf)
    cap = np.asarray(shape) == 2
    if cap.any():
        hit[np.flatnonzero(cap)] = _ray_capsules(origin, direction, c[cap], np.asarray(orientations)[cap], h[cap])
    cvx = (np.asarray(shape) == 3) & (hull is not None and len(hulls) > 0)
    if cvx.any():
        for h in np.unique(np.asarray(hull)[cvx]):
            k = np.flatnonzero(cvx & (np.asarray(hull) == h))
            hit[k] = _ray_hulls(origin, direction, c[k], np.asarray(orientations)[k], hulls[h].planes)
    box = ~(sph | cap | cvx)
    if box.any():   # slabs in the box's frame
        R = quat_matrices(np.asarray(orientations)[box])
        lo = np.einsum("kji,kj->ki", R, oc[box])          # R^T (o - c)
        ld = np.einsum("kji,j->ki", R, direction)          # R^T d
        with np.errstate(divide="ignore", invalid="ignore"):
            t1 = (-h[box] - lo) / ld
            t2 = (h[box] - lo) / ld
        near = np.nanmax(np.minimum(t1, t2), axis=1)
        far = np.nanmin(np.maximum(t1, t2), axis=1)
        hit[np.flatnonzero(box)] = np.where((near <= far) & (far > 0), np.maximum(near, 0.0), np.inf)
    k = int(np.argmin(hit)) if n else 0
    return (k, float(hit[k])) if n and np.isfinite(hit[k]) else (None, math.inf)


def _ray_spheres(o, d, c, r):
    """Distance along the unit ray o + s d to each sphere (centres c (K, 3), radii r (K,)), inf where it misses or
    starts inside."""
    oc = o[None, :] - c
    b = oc @ d
    disc = b * b - ((oc ** 2).sum(1) - r ** 2)
    s = -b - np.sqrt(np.maximum(disc, 0.0))
    return np.where((disc >= 0) & (s > 0), s, np.inf)


def _ray_capsules(o, d, c, q, h):
    """Distance along the unit ray o + s d to each capsule (centres c, orientations q, half extents h (K, 3)): the
    nearest of its side (a cylinder about local y, within the half length) and its two end spheres."""
    R = quat_matrices(q)
    lo = np.einsum("kji,kj->ki", R, o[None, :] - c)    # R^T (o - c)
    ld = np.einsum("kji,j->ki", R, d)                   # R^T d
    r, hl = h[:, 0], h[:, 1] - h[:, 0]
    a = ld[:, 0] ** 2 + ld[:, 2] ** 2
    b = lo[:, 0] * ld[:, 0] + lo[:, 2] * ld[:, 2]
    disc = b * b - a * (lo[:, 0] ** 2 + lo[:, 2] ** 2 - r * r)
    with np.errstate(divide="ignore", invalid="ignore"):
        s = (-b - np.sqrt(np.maximum(disc, 0.0))) / a
    y = lo[:, 1] + s * ld[:, 1]
    side = np.where((a > 1e-12) & (disc >= 0) & (s > 0) & (np.abs(y) <= hl), s, np.inf)
    axis = np.einsum("kij,j->ki", R, [0.0, 1.0, 0.0]) * hl[:, None]
    return np.minimum(side, np.minimum(_ray_spheres(o, d, c + axis, r), _ray_spheres(o, d, c - axis, r)))


def _ray_hulls(o, d, c, q, planes):
    """Distance along the unit ray o + s d to each body (centres c, orientations q) of one hull (its face planes
    (F, 4): outward unit normal, offset): where the ray enters the intersection of the faces' half-spaces."""
    R = quat_matrices(q)
    lo = np.einsum("kji,kj->ki", R, o[None, :] - c)    # R^T (o - c)
    ld = np.einsum("kji,j->ki", R, d)                   # R^T d
    n, off = planes[:, :3], planes[:, 3]
    num = off[None, :] - lo @ n.T                       # (K, F): >= 0 where o is inside face f's half-space
    den = ld @ n.T
    with np.errstate(divide="ignore", invalid="ignore"):
        t = num / den
    enter = np.where(den < 0, t, -np.inf).max(axis=1)
    leave = np.where(den > 0, t, np.inf).min(axis=1)
    parallel_out = ((np.abs(den) < 1e-12) & (num < 0)).any(axis=1)
    ok = (enter <= leave) & (leave > 0) & ~parallel_out
    return np.where(ok, np.maximum(enter, 0.0), np.inf)


def drag_force(mass, grab_point, grab_velocity, target, gravity):
    """The spring force (N) on the grabbed point: mass (w^2 (target - grab) - 2 w grab_velocity - gravity),
    w = 2 pi DRAG_HZ (critically damped, the weight held)."""
    w = 2 * math.pi * DRAG_HZ
    return mass * (w * w * (np.asarray(target) - grab_point) - 2 * w * np.asarray(grab_velocity)
                   - np.asarray(gravity, np.float64))


def plane_point(origin, direction, point, normal):
    """Where the ray meets the plane through `point` with `normal` (None when parallel or behind)."""
    den = float(direction @ normal)
    if abs(den) < 1e-9:
        return None
    s = float((np.asarray(point) - origin) @ normal) / den
    return origin + s * direction if s > 0 else None
