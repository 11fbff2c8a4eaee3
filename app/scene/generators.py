"""Generators of a scene's bodies (grid, random, pyramid, stack), expanded into per-body numpy rows in scene
order."""
from __future__ import annotations

import numpy as np

import os

from app.scene.hull import HullError, hull_of, read_obj
from app.scene.schema import (CAPSULE_AXES, GEN_KEYS, SHAPE_BOX, SHAPE_CAPSULE, SHAPE_CONVEX, SHAPE_SPHERE, SHAPES,
                              quat_matrices, bool_ as _bool, material as _material,
                              num as _num, str_ as _str, vec as _vec, check_keys as _check_keys)

# A mesh is convex when no vertex lies further than this fraction of its size on the far side of a face's plane from
# the others (`shape: convex, mesh: ...` takes the hull of the mesh's vertices, which would fill a dent silently).
CONVEX_TOLERANCE = 1e-3


def nonconvex_face(points, triangles):
    """(triangle, vertex, distance m) of a face whose plane has mesh vertices on both sides (beyond the tolerance; the
    farther side's farthest vertex), or None for a convex mesh. Either orientation of the faces is accepted."""
    tol = CONVEX_TOLERANCE * float(np.ptp(points, axis=0).max())
    for start in range(0, len(triangles), 256):
        t = triangles[start:start + 256]
        a, b, c = points[t[:, 0]], points[t[:, 1]], points[t[:, 2]]
        n = np.cross(b - a, c - a)
        ln = np.linalg.norm(n, axis=1)
        ok = ln > 1e-12 * max(tol, 1e-30)
        n = n[ok] / ln[ok, None]
        side = points @ n.T - (a[ok] * n).sum(axis=1)[None, :]   # (V, T')
        hi, lo = side.max(axis=0), side.min(axis=0)
        mixed = (hi > tol) & (lo < -tol)
        if mixed.any():
            k = int(np.argmax(mixed))
            far = side[:, k] if hi[k] <= -lo[k] else -side[:, k]
            v = int(np.argmin(far))
            return int(np.flatnonzero(ok)[k]) + start, v, float(-far[v])
    return None


class Bodies:
    """Accumulates bodies row by row (scene order)."""

    def __init__(self):
        self.rows = {k: [] for k in ("shape", "radius", "half_extents", "position", "orientation", "velocity",
                                     "angular_velocity", "material", "fixed", "kinematic", "pivot", "hull")}
        self.blocks = []
        self.hulls = []          # distinct hulls, in the order first met
        self._hull_keys = {}

    def hull_index(self, hull) -> int:
        """Index of `hull` in self.hulls, adding it if no equal hull is there."""
        key = hull.key()
        if key not in self._hull_keys:
            self._hull_keys[key] = len(self.hulls)
            self.hulls.append(hull)
        return self._hull_keys[key]

    def add(self, shape, radius, half, pos, quat, vel, omega, mat, fixed, kinematic=False, pivot=None, hull=-1):
        r = self.rows
        r["hull"].append(hull)
        r["kinematic"].append(kinematic)
        r["pivot"].append(pos if pivot is None else pivot)
        r["shape"].append(shape)
        r["radius"].append(radius)
        r["half_extents"].append(half)
        r["position"].append(pos)
        r["orientation"].append(quat)
        r["velocity"].append(vel)
        r["angular_velocity"].append(omega)
        r["material"].append(mat)
        r["fixed"].append(fixed)

    def add_many(self, shape, radius, half, pos, quat, vel, omega, mat, fixed, hull=None):
        """Append a block of rows (numpy arrays); keeps scene order."""
        self._flush()
        self.blocks.append({"shape": shape, "radius": radius, "half_extents": half, "position": pos,
                            "orientation": quat, "velocity": vel, "angular_velocity": omega, "material": mat,
                            "fixed": fixed, "kinematic": np.zeros(len(shape), bool), "pivot": pos,
                            "hull": np.full(len(shape), -1, np.int32) if hull is None else hull})

    _WIDTH = {"half_extents": 3, "position": 3, "orientation": 4, "velocity": 3, "angular_velocity": 3, "pivot": 3}
    _DTYPE = {"shape": np.int32, "material": np.int32, "fixed": bool, "kinematic": bool, "hull": np.int32}

    def _flush(self):
        r = self.rows
        n = len(r["shape"])
        if n:
            self.blocks.append({k: np.asarray(v, self._DTYPE.get(k, np.float64)).reshape(
                (n, self._WIDTH[k]) if k in self._WIDTH else (n,)) for k, v in r.items()})
            for v in r.values():
                v.clear()

    @property
    def count(self) -> int:
        """Bodies added so far."""
        return len(self.rows["shape"]) + sum(len(b["shape"]) for b in self.blocks)

    def arrays(self):
        self._flush()
        out = {}
        for k in self.rows:
            shape = (0, self._WIDTH[k]) if k in self._WIDTH else (0,)
            parts = [np.asarray(b[k], self._DTYPE.get(k, np.float64)) for b in self.blocks]
            out[k] = np.concatenate(parts, 0) if parts else np.zeros(shape, self._DTYPE.get(k, np.float64))
        return out


def _random_quat(rng):
    q = rng.normal(size=4)
    return (q / np.linalg.norm(q)).tolist()


def quat_of_matrix(R):
    """Unit quaternion (w, x, y, z) of the rotation matrix R (Shepperd's method)."""
    R = np.asarray(R, np.float64)
    t = np.trace(R)
    if t > 0:
        s = 2.0 * np.sqrt(1.0 + t)
        q = [0.25 * s, (R[2, 1] - R[1, 2]) / s, (R[0, 2] - R[2, 0]) / s, (R[1, 0] - R[0, 1]) / s]
    else:
        k = int(np.argmax(np.diag(R)))
        i, j = (k + 1) % 3, (k + 2) % 3
        s = 2.0 * np.sqrt(1.0 + R[k, k] - R[i, i] - R[j, j])
        q = [0.0, 0.0, 0.0, 0.0]
        q[0] = (R[j, i] - R[i, j]) / s
        q[1 + k] = 0.25 * s
        q[1 + i] = (R[i, k] + R[k, i]) / s
        q[1 + j] = (R[j, k] + R[k, j]) / s
    q = np.asarray(q)
    return (q / np.linalg.norm(q)).tolist()


def convex_hull_of(ctx, key, b):
    """(hull, com (3,), rotation (3,3)) of a convex body or generator entry: the hull of its `vertices` (m, in the
    body's frame) or of its `mesh` (an OBJ file, relative to the scene file's folder), app.scene.hull.hull_of."""
    if ("vertices" in b) == ("mesh" in b):
        ctx.fail(f"{key}.vertices", "either vertices: [[x, y, z], ...] or mesh: file.obj for a convex shape",
                 have_got=False)
    if "vertices" in b:
        v = b["vertices"]
        if not isinstance(v, list) or len(v) < 4:
            ctx.fail(f"{key}.vertices", "a list of at least 4 points [x, y, z] that are not coplanar", v)
        points = [_vec(ctx, f"{key}.vertices[{k}]", p) for k, p in enumerate(v)]
        where = f"{key}.vertices"
    else:
        mesh = _str(ctx, f"{key}.mesh", b["mesh"])
        base = os.path.dirname(ctx.path) if ctx.path not in ("<dict>", "") else ""
        path = mesh if os.path.isabs(mesh) else os.path.join(base, mesh)
        where = f"{key}.mesh ({path})"
        if not os.path.isfile(path):
            ctx.fail(f"{key}.mesh", f"an OBJ file (relative to the scene's folder); {path} does not exist", mesh)
        try:
            points, tris, face_line = read_obj(path)
        except HullError as e:
            ctx.fail(where, f"a readable OBJ file: {e}", have_got=False)
    try:
        hull, com, rot = hull_of(points)
    except HullError as e:
        ctx.fail(where, f"points with a convex hull: {e}", have_got=False)
    if "mesh" in b and tris is not None:
        bad = nonconvex_face(np.asarray(points, np.float64), tris)
        if bad is not None:
            ctx.fail(where, f"a convex mesh: vertices lie on both sides of the plane of the face on line "
                            f"{face_line[bad[0]]} (vertex {bad[1] + 1} is {bad[2]:.4g} m out); split the mesh into "
                            f"convex parts", have_got=False)
    return hull, com, rot


def shape_size(ctx, key, b, acc=None):
    """(shape id, radius, half extents, axis rotation, hull, com) of a body or generator entry; the unused size is
    filled from the used one so that every body has both (radius = bounding radius for boxes and hulls; half extents
    = the local bounding box). The axis rotation (w, x, y, z) turns a capsule's segment from local y to its `axis`,
    and a hull's principal axes to the axes its vertices were given in (identity otherwise). hull: a convex shape's
    index in acc.hulls (-1 otherwise); com (3,): where a hull's centre of mass lies in the frame its vertices were
    given in (zero otherwise)."""
    shape = _str(ctx, f"{key}.shape", b.get("shape"), tuple(SHAPES)) if "shape" in b else ctx.fail(
        f"{key}.shape", "this key (" + " | ".join(SHAPES) + ")", have_got=False)
    ident = CAPSULE_AXES["y"]
    for k, only in (("half_length", "capsule"), ("axis", "capsule"), ("vertices", "convex"), ("mesh", "convex")):
        if k in b and shape != only:
            ctx.fail(f"{key}.{k}", f"no {k} on a {shape} (only {only} shapes have one)" if only == "convex" else
                     f"no {k} on a {shape} (only {only}s have one)", have_got=False)
    if shape == "convex":
        for k in ("radius", "half_extents"):
            if k in b:
                ctx.fail(f"{key}.{k}", "no " + k + " on a convex shape (its vertices or mesh give its size)",
                         have_got=False)
        hull, com, rot = convex_hull_of(ctx, key, b)
        v = hull.vertices
        return (SHAPE_CONVEX, float(np.linalg.norm(v, axis=1).max()), np.abs(v).max(axis=0).tolist(),
                quat_of_matrix(rot), acc.hull_index(hull), com)
    if shape in ("sphere", "capsule"):
        if "radius" not in b:
            ctx.fail(f"{key}.radius", f"this key (a number > 0) for a {shape}", have_got=False)
        if "half_extents" in b:
            ctx.fail(f"{key}.half_extents", f"no half_extents on a {shape} (use radius"
                     + (" and half_length)" if shape == "capsule" else ")"), have_got=False)
        r = _num(ctx, f"{key}.radius", b["radius"], positive=True)
        if shape == "sphere":
            return SHAPE_SPHERE, r, [r, r, r], ident, -1, np.zeros(3)
        if "half_length" not in b:
            ctx.fail(f"{key}.half_length", "this key (a number > 0: half the length of the capsule's segment) for a "
                                            "capsule", have_got=False)
        hl = _num(ctx, f"{key}.half_length", b["half_length"], positive=True)
        axis = _str(ctx, f"{key}.axis", b.get("axis", "y"), tuple(CAPSULE_AXES))
        return SHAPE_CAPSULE, r, [r, hl + r, r], CAPSULE_AXES[axis], -1, np.zeros(3)
    if "half_extents" not in b:
        ctx.fail(f"{key}.half_extents", "this key (a list of 3 numbers > 0) for a box", have_got=False)
    if "radius" in b:
        ctx.fail(f"{key}.radius", "no radius on a box (use half_extents)", have_got=False)
    h = _vec(ctx, f"{key}.half_extents", b["half_extents"], 3, positive=True)
    return SHAPE_BOX, float(np.linalg.norm(h)), h, ident, -1, np.zeros(3)


def quat_mul(a, b):
    """Hamilton product a b of quaternions (w, x, y, z): rotation b, then a."""
    aw, ax, ay, az = a
    bw, bx, by, bz = b
    return [aw * bw - ax * bx - ay * by - az * bz, aw * bx + ax * bw + ay * bz - az * by,
            aw * by - ax * bz + ay * bw + az * bx, aw * bz + ax * by - ay * bx + az * bw]


def _rotated_extent(half, q):
    """Half size (m) along world x, y, z of the box `half` turned by the quaternion q (w, x, y, z)."""
    return np.abs(quat_matrices(q)[0]) @ np.asarray(half, np.float64)


def _random_hulls(ctx, key, g, acc, rng):
    """[(hull index, bounding radius, half extents, axis rotation)] of a random generator's convex shapes: the hull of
    its vertices or mesh, or `variants` (default 8) hulls of `hull_points` random points on the ellipsoid of semi-axes
    `half_extents` (rocks)."""
    if "hull_points" not in g:
        return [_one_hull(ctx, key, g, acc)]
    if "vertices" in g or "mesh" in g:
        ctx.fail(f"{key}.hull_points", "either hull_points (random hulls) or vertices / mesh, not both",
                 have_got=False)
    n = _num(ctx, f"{key}.hull_points", g["hull_points"], integer=True, low=4, high=1000)
    variants = _num(ctx, f"{key}.variants", g.get("variants", 8), integer=True, low=1, high=1000)
    if "half_extents" not in g:
        ctx.fail(f"{key}.half_extents", "this key (the semi-axes of the ellipsoid the random points lie on) with "
                                        "hull_points", have_got=False)
    semi = np.asarray(_vec(ctx, f"{key}.half_extents", g["half_extents"], 3, positive=True), np.float64)
    out = []
    for _ in range(variants):
        p = rng.normal(size=(n, 3))
        p = p / np.linalg.norm(p, axis=1, keepdims=True) * semi
        try:
            hull, _, rot = hull_of(p)
        except HullError as e:
            ctx.fail(f"{key}.hull_points", f"points with a convex hull: {e}", have_got=False)
        v = hull.vertices
        out.append((acc.hull_index(hull), float(np.linalg.norm(v, axis=1).max()), np.abs(v).max(axis=0),
                    quat_of_matrix(rot)))
    return out


def _one_hull(ctx, key, g, acc):
    for k in ("radius", "half_extents"):
        if k in g:
            ctx.fail(f"{key}.{k}", "no " + k + " with shape: convex and vertices / mesh", have_got=False)
    hull, _, rot = convex_hull_of(ctx, key, g)
    v = hull.vertices
    return acc.hull_index(hull), float(np.linalg.norm(v, axis=1).max()), np.abs(v).max(axis=0), quat_of_matrix(rot)


def expand_generator(ctx, key, g, acc, material_index, rng):
    kind = _str(ctx, f"{key}.generate", g["generate"], tuple(GEN_KEYS))
    _check_keys(ctx, key, g, GEN_KEYS[kind])
    names = set(material_index)
    vel = _vec(ctx, f"{key}.velocity", g.get("velocity", [0, 0, 0]))
    omega = _vec(ctx, f"{key}.angular_velocity", g.get("angular_velocity", [0, 0, 0]))
    fixed = _bool(ctx, f"{key}.fixed", g.get("fixed", False))
    ident = [1.0, 0.0, 0.0, 0.0]

    if kind == "random":
        # Non-overlapping by construction: bodies take distinct slots of a lattice over [min, max], each
        # slot wide enough for the largest body, so the pile never starts interpenetrated.
        if "materials" in g and "material" in g:
            ctx.fail(f"{key}.materials", "either material or materials, not both", have_got=False)
        if "materials" in g:
            ml = g["materials"]
            if not isinstance(ml, list) or not ml:
                ctx.fail(f"{key}.materials", "a non-empty list of material names", ml)
            mats = [material_index[_material(ctx, f"{key}.materials[{i}]", m, names)] for i, m in enumerate(ml)]
        else:
            if "material" not in g:
                ctx.fail(f"{key}.material", "this key (or materials: [..])", have_got=False)
            mats = [material_index[_material(ctx, f"{key}.material", g["material"], names)]]
        count = _num(ctx, f"{key}.count", g.get("count"), integer=True, low=1)
        ctx.take_bodies(f"{key}.count", count)
        lo = np.asarray(_vec(ctx, f"{key}.min", g.get("min")), np.float64)
        hi = np.asarray(_vec(ctx, f"{key}.max", g.get("max")), np.float64)
        if np.any(hi <= lo):
            ctx.fail(f"{key}.max", "max > min on every axis", g.get("max"))
        shape_name = g.get("shape", "sphere")
        _str(ctx, f"{key}.shape", shape_name, ("sphere", "box", "capsule", "convex", "mixed"))
        for k in ("hull_points", "variants"):
            if k in g and shape_name != "convex":
                ctx.fail(f"{key}.{k}", "only with shape: convex", have_got=False)
        hulls = None
        if shape_name == "capsule":
            _, r, cap_half, axis, _, _ = shape_size(ctx, key, g)
            h = None
        elif shape_name == "convex":
            hulls = _random_hulls(ctx, key, g, acc, rng)
            r = h = None
        else:
            for k in ("half_length", "axis", "vertices", "mesh"):
                if k in g:
                    ctx.fail(f"{key}.{k}", "only with shape: " + ("capsule" if k in ("half_length", "axis")
                                                                   else "convex"), have_got=False)
            r = _num(ctx, f"{key}.radius", g["radius"], positive=True) if "radius" in g else None
            h = _vec(ctx, f"{key}.half_extents", g["half_extents"], 3, positive=True) if "half_extents" in g else None
        if shape_name in ("sphere", "mixed") and r is None:
            ctx.fail(f"{key}.radius", "this key for spheres", have_got=False)
        if shape_name in ("box", "mixed") and h is None:
            ctx.fail(f"{key}.half_extents", "this key for boxes", have_got=False)
        box_fraction = {"sphere": 0.0, "box": 1.0, "capsule": 0.0, "convex": 0.0}.get(shape_name)
        if box_fraction is None:
            box_fraction = _num(ctx, f"{key}.box_fraction", g.get("box_fraction", 0.5), nonneg=True, high=1.0)
        sj = _num(ctx, f"{key}.size_jitter", g.get("size_jitter", 0.0), nonneg=True, high=0.9)
        if sj and hulls is not None:
            ctx.fail(f"{key}.size_jitter", "no size_jitter with shape: convex (variants give hulls of different "
                                           "shapes and sizes)", have_got=False)
        rand_orient = _bool(ctx, f"{key}.random_orientation", g.get("random_orientation", True))
        bound = max(r or 0.0, float(np.linalg.norm(h)) if h is not None else 0.0)
        if shape_name == "capsule":
            bound = cap_half[1]
        if hulls is not None:
            bound = max(hr for (_, hr, _, _) in hulls)
        cell = 2.0 * bound * 1.05
        dims = np.maximum(1, np.floor((hi - lo) / cell).astype(np.int64))
        slots = int(np.prod(dims))
        if slots < count:
            ctx.fail(f"{key}.count", f"at most {slots} bodies (the region [min, max] holds {slots} "
                                     f"non-overlapping slots of {cell:.4g} m)", count)
        pick = rng.choice(slots, size=count, replace=False) if slots > count else rng.permutation(slots)
        pick.sort()  # fill from the bottom up (y is the slowest index below)
        ix = pick % dims[0]
        iz = (pick // dims[0]) % dims[2]
        iy = pick // (dims[0] * dims[2])
        pos = lo + (np.stack([ix, iy, iz], 1) + 0.5) * cell
        scale = 1.0 - sj * rng.random(count)
        mat = np.asarray(mats, np.int32)[rng.integers(len(mats), size=count)]
        if rand_orient:
            q = rng.normal(size=(count, 4))
            q /= np.linalg.norm(q, axis=1, keepdims=True)
        else:
            q = np.tile(axis if shape_name == "capsule" else ident, (count, 1))
        if hulls is not None:
            which = rng.integers(len(hulls), size=count)
            index = np.array([hx for (hx, _, _, _) in hulls], np.int32)[which]
            radius = np.array([hr for (_, hr, _, _) in hulls])[which]
            half = np.array([hh for (_, _, hh, _) in hulls])[which]
            axes = np.array([ha for (_, _, _, ha) in hulls])[which]
            q = np.array([quat_mul(q[k], axes[k]) for k in range(count)]) if rand_orient else axes
            acc.add_many(np.full(count, SHAPE_CONVEX), radius, half, pos, q, np.tile(vel, (count, 1)),
                         np.tile(omega, (count, 1)), mat, np.full(count, fixed), hull=index)
            return
        if shape_name == "capsule":
            acc.add_many(np.full(count, SHAPE_CAPSULE), r * scale, np.asarray(cap_half)[None] * scale[:, None], pos, q,
                         np.tile(vel, (count, 1)), np.tile(omega, (count, 1)), mat, np.full(count, fixed))
            return
        is_box = rng.random(count) < box_fraction
        half = np.where(is_box[:, None], np.asarray(h if h is not None else [1, 1, 1], np.float64)[None] * scale[:, None],
                        (r or 1.0) * scale[:, None] * np.ones((1, 3)))
        radius = np.where(is_box, np.linalg.norm(half, axis=1), (r or 1.0) * scale)
        acc.add_many(np.where(is_box, SHAPE_BOX, SHAPE_SPHERE), radius, half, pos, q,
                     np.tile(vel, (count, 1)), np.tile(omega, (count, 1)), mat, np.full(count, fixed))
        return

    shape, r, h, axis, hull, _com = shape_size(ctx, key, g, acc)
    if "material" not in g:
        ctx.fail(f"{key}.material", "this key", have_got=False)
    mat = material_index[_material(ctx, f"{key}.material", g["material"], names)]
    ext = _rotated_extent(h, axis)  # half size along world x, y, z (spheres: r, r, r)
    ident = list(axis)   # (a capsule's axis turned into place; the identity for the other shapes)
    bound = r if shape in (SHAPE_SPHERE, SHAPE_CONVEX) else (h[1] if shape == SHAPE_CAPSULE else float(np.linalg.norm(h)))

    if kind == "grid":
        count = _vec(ctx, f"{key}.count", g.get("count"), 3, positive=True, integer=True)
        ctx.take_bodies(f"{key}.count", count[0] * count[1] * count[2])
        origin = np.asarray(_vec(ctx, f"{key}.origin", g.get("origin", [0, 0, 0])), np.float64)
        min_spacing = 2 * bound
        spacing = _num(ctx, f"{key}.spacing", g.get("spacing", min_spacing * 1.05), positive=True)
        jitter = _num(ctx, f"{key}.jitter", g.get("jitter", 0.0), nonneg=True)
        rand_orient = _bool(ctx, f"{key}.random_orientation", g.get("random_orientation", False))
        if spacing - 2 * jitter < 2 * float(np.max(ext)) and not rand_orient:
            ctx.fail(f"{key}.spacing", "spacing - 2*jitter >= the body's size so bodies do not start "
                                       "overlapping", spacing)
        for iy in range(count[1]):
            for iz in range(count[2]):
                for ix in range(count[0]):
                    p = origin + spacing * np.array([ix, iy, iz], np.float64)
                    if jitter:
                        p = p + rng.uniform(-jitter, jitter, 3)
                    q = _random_quat(rng) if rand_orient else ident
                    acc.add(shape, r, h, p.tolist(), q, vel, omega, mat, fixed, hull=hull)
    elif kind == "stack":
        count = _num(ctx, f"{key}.count", g.get("count"), integer=True, low=1)
        ctx.take_bodies(f"{key}.count", count)
        origin = np.asarray(_vec(ctx, f"{key}.origin", g.get("origin", [0, 0, 0])), np.float64)
        gap = _num(ctx, f"{key}.gap", g.get("gap", 0.0), nonneg=True)
        # origin is the bottom centre of the stack (on the floor when origin.y = 0).
        for k in range(count):
            p = origin + np.array([0.0, ext[1] + k * (2 * ext[1] + gap), 0.0])
            acc.add(shape, r, h, p.tolist(), ident, vel, omega, mat, fixed, hull=hull)
    elif kind == "pyramid":
        levels = _num(ctx, f"{key}.levels", g.get("levels"), integer=True, low=1)
        origin = np.asarray(_vec(ctx, f"{key}.origin", g.get("origin", [0, 0, 0])), np.float64)
        gap = _num(ctx, f"{key}.gap", g.get("gap", 0.0), nonneg=True)
        # copies: [nx, nz] pyramids on a grid in the x-z plane, copy_spacing apart (m, centre to centre; default:
        # the base's width plus one body, along x, and 4 bodies along z)
        copies = _vec(ctx, f"{key}.copies", g.get("copies", [1, 1]), 2, positive=True, integer=True)
        w = 2 * ext[0] + gap
        base = levels * w
        default_spacing = [base + 2 * ext[0], 8 * ext[2]]
        spacing = _vec(ctx, f"{key}.copy_spacing", g.get("copy_spacing", default_spacing), 2, positive=True)
        if copies[0] > 1 and spacing[0] < base or copies[1] > 1 and spacing[1] < 2 * ext[2]:
            ctx.fail(f"{key}.copy_spacing", f"at least the pyramid's base ({base:.4g} m) along x and one body "
                                            f"({2 * ext[2]:.4g} m) along z, so that copies do not overlap", spacing)
        ctx.take_bodies(f"{key}.levels", levels * (levels + 1) // 2 * copies[0] * copies[1])
        # A 2-D pyramid in the x-y plane: level k has levels-k bodies, offset by half a body. `gap` separates
        # neighbours within a level; levels rest exactly on each other.
        for cz in range(copies[1]):
            for cx in range(copies[0]):
                o = origin + np.array([(cx - (copies[0] - 1) / 2.0) * spacing[0], 0.0,
                                       (cz - (copies[1] - 1) / 2.0) * spacing[1]])
                for k in range(levels):
                    n = levels - k
                    for c in range(n):
                        x = (c - (n - 1) / 2.0) * w
                        p = o + np.array([x, ext[1] + k * 2 * ext[1], 0.0])
                        acc.add(shape, r, h, p.tolist(), ident, vel, omega, mat, fixed, hull=hull)
