"""Convex hulls for `shape: convex` bodies: the hull of a point set (given inline or read from an OBJ file), its
polygon faces, edges and mass properties, in the body's own frame (centre of mass at the origin, principal axes
along x, y, z). numpy only; the narrowphase reads the result from the Model's hull VLAs (app.sim.model).

The hull is built incrementally (each point outside the current hull replaces the faces it sees by a fan to the
horizon; Barber, Dobkin and Huhdanpaa's Quickhull without its outside sets, which the sizes here do not need), then
coplanar triangles are merged into polygons: a box is 6 faces and 12 edges, not 12 triangles, so its contact
manifolds clip against whole faces. Mass properties sum signed tetrahedra over a fan of each face (Tonon 2004,
"Explicit exact formulas for the 3-D tetrahedron inertia tensor", through the canonical covariance)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Bounds that keep the narrowphase's per-pair work and its local buffers small (a pair of hulls tests every face
# of each against the other's vertices and every edge pair: app.sim.convex). Larger meshes must be simplified.
MAX_HULL_VERTICES = 64
MAX_FACE_VERTICES = 16
MAX_POINTS = 100_000       # points one hull may be built from (an OBJ file's vertices)


class HullError(ValueError):
    """Why a point set has no usable hull; the scene loader adds the file and key."""


@dataclass(frozen=True)
class Hull:
    """A convex polyhedron in its body frame (centre of mass at the origin, principal axes of inertia along x, y, z).

    vertices: (V, 3) float64 m. faces: tuple of int arrays, each a face's vertex indices counter-clockwise seen from
    outside. planes: (F, 4) outward unit normal n and offset d (n . x = d on the face). edges: (E, 4) int (v0, v1, f0,
    f1): each edge once, f0 the face whose loop runs v0 -> v1, f1 the other. volume m^3; inertia (3,) kg m^2 per
    kg/m^3 of density (principal moments)."""

    vertices: np.ndarray
    faces: tuple
    planes: np.ndarray
    edges: np.ndarray
    volume: float
    inertia: np.ndarray
    one_sided: bool = False   # a static triangle that only its front side touches (triangle_hull)

    @property
    def inradius(self) -> float:
        """Distance (m) from the centre of mass to the nearest face plane: the hull's smallest half size."""
        return float(self.planes[:, 3].min())

    def key(self):
        """Identity for de-duplication: equal keys, equal hulls."""
        return (self.vertices.round(9).tobytes(), tuple(tuple(f) for f in self.faces), self.one_sided)


def _initial_simplex(P, tol):
    i0 = int(np.argmin(P[:, 0]))
    d = np.linalg.norm(P - P[i0], axis=1)
    i1 = int(np.argmax(d))
    if d[i1] <= tol:
        raise HullError("all points coincide (a hull needs 4 points that are not coplanar)")
    u = (P[i1] - P[i0]) / d[i1]
    off = P - P[i0]
    line = np.linalg.norm(off - np.outer(off @ u, u), axis=1)
    i2 = int(np.argmax(line))
    if line[i2] <= tol:
        raise HullError("the points are collinear (a hull needs 4 points that are not coplanar)")
    n = np.cross(P[i1] - P[i0], P[i2] - P[i0])
    n /= np.linalg.norm(n)
    h = off @ n
    i3 = int(np.argmax(np.abs(h)))
    if abs(h[i3]) <= tol:
        raise HullError("the points are coplanar: the hull has zero volume")
    return [i0, i1, i2, i3]


def _plane(P, f):
    a, b, c = P[f[0]], P[f[1]], P[f[2]]
    n = np.cross(b - a, c - a)
    n /= np.linalg.norm(n)
    return n, float(n @ a)


def _triangles(P, tol):
    """Outward triangles (list of [a, b, c]) of the hull of points P (an incremental hull)."""
    simplex = _initial_simplex(P, tol)
    centre = P[simplex].mean(axis=0)
    faces = []
    for k in range(4):
        f = [simplex[j] for j in range(4) if j != k]
        n, d = _plane(P, f)
        if n @ centre > d:
            f = [f[0], f[2], f[1]]
        faces.append(f)
    normals = []
    offsets = []
    for f in faces:
        n, d = _plane(P, f)
        normals.append(n)
        offsets.append(d)
    normals = np.array(normals)
    offsets = np.array(offsets)
    # far points first: they put most of the others inside at once
    order = np.argsort(-np.linalg.norm(P - centre, axis=1), kind="stable")
    used = set(simplex)
    for p in order:
        if p in used:
            continue
        visible = np.flatnonzero(normals @ P[p] - offsets > tol)
        if visible.size == 0:
            continue
        vis = set(visible.tolist())
        directed = set()
        for k in vis:
            a, b, c = faces[k]
            directed.update(((a, b), (b, c), (c, a)))
        horizon = [(a, b) for (a, b) in directed if (b, a) not in directed]
        keep = [k for k in range(len(faces)) if k not in vis]
        faces = [faces[k] for k in keep]
        normals = list(normals[keep])
        offsets = list(offsets[keep])
        for a, b in horizon:
            f = [a, b, int(p)]
            v1, v2 = P[b] - P[a], P[p] - P[a]
            n = np.cross(v1, v2)
            ln = np.linalg.norm(n)
            if ln <= tol * max(np.linalg.norm(v1), np.linalg.norm(v2), tol):
                continue   # a sliver: p lies on the horizon edge's line (merged away below)
            n = n / ln
            faces.append(f)
            normals.append(n)
            offsets.append(float(n @ P[a]))
        normals = np.array(normals)
        offsets = np.array(offsets)
        used.add(int(p))
    return faces, normals


def _polygon_2d(points, normal):
    """Indices (into points) of the convex polygon of coplanar points, counter-clockwise about normal, collinear
    points dropped (Andrew's monotone chain in the plane)."""
    u = np.cross(normal, [1.0, 0.0, 0.0] if abs(normal[0]) < 0.9 else [0.0, 1.0, 0.0])
    u /= np.linalg.norm(u)
    v = np.cross(normal, u)
    q = np.stack([points @ u, points @ v], 1)
    idx = sorted(range(len(q)), key=lambda k: (q[k, 0], q[k, 1]))
    scale = max(float(np.ptp(q[:, 0])), float(np.ptp(q[:, 1])), 1e-30)

    def cross(o, a, b):
        return (q[a, 0] - q[o, 0]) * (q[b, 1] - q[o, 1]) - (q[a, 1] - q[o, 1]) * (q[b, 0] - q[o, 0])

    def chain(seq):
        out = []
        for k in seq:
            while len(out) >= 2 and cross(out[-2], out[-1], k) <= 1e-9 * scale * scale:
                out.pop()
            out.append(k)
        return out

    lower = chain(idx)
    upper = chain(idx[::-1])
    return lower[:-1] + upper[:-1]


def _merge_faces(P, tris, normals, tol):
    """Polygon faces (lists of point indices, counter-clockwise from outside) from the hull's triangles: triangles
    sharing an edge and a plane (normals within 1e-5 rad... and every vertex within tol of the plane) are one face."""
    parent = list(range(len(tris)))

    def find(a):
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    edge_face = {}
    for k, (a, b, c) in enumerate(tris):
        for e in ((a, b), (b, c), (c, a)):
            edge_face[e] = k
    for (a, b), k in edge_face.items():
        other = edge_face.get((b, a))
        if other is None or find(other) == find(k):
            continue
        if normals[k] @ normals[other] > 1.0 - 1e-9:
            parent[find(other)] = find(k)
    groups = {}
    for k in range(len(tris)):
        groups.setdefault(find(k), []).append(k)
    faces = []
    for members in groups.values():
        pts = sorted({v for k in members for v in tris[k]})
        n = normals[members].sum(axis=0)
        n /= np.linalg.norm(n)
        loop = _polygon_2d(P[pts], n)
        faces.append([pts[k] for k in loop])
    return faces


def _mass_properties(V, faces):
    """(volume m^3, centre of mass (3,), inertia tensor (3,3) about it, per unit density) of the closed polyhedron."""
    ref = V.mean(axis=0)
    canon = np.array([[2.0, 1.0, 1.0], [1.0, 2.0, 1.0], [1.0, 1.0, 2.0]]) / 120.0
    vol = 0.0
    first = np.zeros(3)
    cov = np.zeros((3, 3))
    for f in faces:
        for k in range(1, len(f) - 1):
            A = np.stack([V[f[0]] - ref, V[f[k]] - ref, V[f[k + 1]] - ref], 1)   # columns a, b, c
            det = float(np.linalg.det(A))
            vol += det / 6.0
            first += det / 6.0 * A.sum(axis=1) / 4.0
            cov += det * A @ canon @ A.T
    com_rel = first / vol
    cov -= vol * np.outer(com_rel, com_rel)
    inertia = np.trace(cov) * np.eye(3) - cov
    return vol, ref + com_rel, inertia


def hull_of(points, tol_rel=1e-7):
    """(hull, centre of mass (3,), rotation (3,3)) of a point set given in some frame: the hull's body frame is the
    given frame moved to the centre of mass and turned by `rotation` (columns: its principal axes), so a point x of
    the given frame is at rotation.T @ (x - com) in the body frame. Raises HullError with the reason."""
    P = np.asarray(points, np.float64)
    if P.ndim != 2 or P.shape[1] != 3:
        raise HullError(f"expected a list of [x, y, z] points, got an array of shape {P.shape}")
    if len(P) < 4:
        raise HullError(f"a hull needs at least 4 points that are not coplanar, got {len(P)}")
    if len(P) > MAX_POINTS:
        raise HullError(f"at most {MAX_POINTS:,} points, got {len(P):,}")
    if not np.isfinite(P).all():
        raise HullError("a point is not finite (NaN or inf)")
    P = np.unique(P, axis=0)
    extent = float(np.ptp(P, axis=0).max())
    tol = max(tol_rel * extent, 1e-12)
    if len(P) < 4:
        raise HullError(f"a hull needs at least 4 distinct points that are not coplanar, got {len(P)}")
    tris, normals = _triangles(P, tol)
    faces = _merge_faces(P, tris, normals, tol)
    used = sorted({v for f in faces for v in f})
    if len(used) > MAX_HULL_VERTICES:
        raise HullError(f"its hull has {len(used)} vertices; at most {MAX_HULL_VERTICES} (simplify the mesh)")
    big = max(len(f) for f in faces)
    if big > MAX_FACE_VERTICES:
        raise HullError(f"its hull has a face of {big} vertices; at most {MAX_FACE_VERTICES} (simplify the mesh)")
    remap = {v: k for k, v in enumerate(used)}
    V = P[used]
    faces = [[remap[v] for v in f] for f in faces]
    vol, com, inertia = _mass_properties(V, faces)
    if not vol > tol * extent * extent:
        raise HullError(f"the hull has zero volume ({vol:.3g} m^3)")
    # principal axes; a tensor already diagonal keeps the given axes (a box stays axis-aligned, whatever the
    # order of its equal moments)
    off = np.abs(inertia - np.diag(np.diag(inertia))).max()
    if off <= 1e-9 * np.trace(inertia):
        rot = np.eye(3)
        moments = np.diag(inertia).copy()
    else:
        moments, rot = np.linalg.eigh(inertia)
        if np.linalg.det(rot) < 0:
            rot[:, 2] = -rot[:, 2]
    Vb = (V - com) @ rot
    return _assemble(Vb, faces, vol, moments), com, rot


def _assemble(V, faces, volume, moments):
    planes = []
    for f in faces:
        # Newell's normal: robust for any planar polygon
        n = np.zeros(3)
        for k in range(len(f)):
            a, b = V[f[k]], V[f[(k + 1) % len(f)]]
            n += np.cross(a, b)
        n /= np.linalg.norm(n)
        planes.append([*n, float(np.mean(V[f] @ n))])
    owner = {}
    for fi, f in enumerate(faces):
        for k in range(len(f)):
            owner[(f[k], f[(k + 1) % len(f)])] = fi
    edges = []
    for (a, b), fa in owner.items():
        fb = owner.get((b, a))
        if fb is None:
            raise HullError("the hull is not closed (an edge has one face): the points are degenerate")
        if a < b:
            edges.append([a, b, fa, fb])
    E = np.array(edges, np.int32).reshape(-1, 4)
    if len(V) - len(E) + len(faces) != 2:
        raise HullError("the hull is not a closed polyhedron (Euler's formula fails): the points are degenerate")
    return Hull(vertices=V, faces=tuple(np.asarray(f, np.int32) for f in faces), planes=np.array(planes),
                edges=E, volume=float(volume), inertia=np.asarray(moments, np.float64))


def box_hull(half_extents=(1.0, 1.0, 1.0)) -> Hull:
    """The box of these half extents as a hull (its own body frame)."""
    h = np.asarray(half_extents, np.float64)
    corners = np.array([[x, y, z] for x in (-1, 1) for y in (-1, 1) for z in (-1, 1)], np.float64) * h
    hull, _, _ = hull_of(corners)
    return hull


def read_obj(path):
    """(vertices (V,3), triangles (T,3) int or None, the line of each triangle's face (T,)) of a Wavefront OBJ file: its
    `v` lines, and its `f` lines fanned into triangles (1-based and negative indices, `v/vt/vn` forms). Raises
    HullError naming the line."""
    verts = []
    tris = []
    lines_of = []
    try:
        with open(path, encoding="utf-8", errors="strict") as fh:
            lines = fh.readlines()
    except UnicodeDecodeError:
        raise HullError("not a text OBJ file (it is not UTF-8)") from None
    for no, line in enumerate(lines, 1):
        parts = line.split("#", 1)[0].split()
        if not parts:
            continue
        if parts[0] == "v":
            try:
                xyz = [float(x) for x in parts[1:4]]
            except ValueError:
                xyz = []
            if len(xyz) != 3 or not all(np.isfinite(xyz)):
                raise HullError(f"line {no}: expected 'v x y z' with 3 finite numbers, got {line.strip()[:60]!r}")
            verts.append(xyz)
            if len(verts) > MAX_POINTS:
                raise HullError(f"more than {MAX_POINTS:,} vertices")
        elif parts[0] == "f":
            idx = []
            for token in parts[1:]:
                try:
                    k = int(token.split("/")[0])
                except ValueError:
                    raise HullError(f"line {no}: expected 'f i j k ...' with vertex indices, got "
                                    f"{line.strip()[:60]!r}") from None
                k = k - 1 if k > 0 else len(verts) + k
                if not 0 <= k < len(verts):
                    raise HullError(f"line {no}: face vertex {token!r} does not name one of the {len(verts)} "
                                    f"vertices before it")
                idx.append(k)
            if len(idx) < 3:
                raise HullError(f"line {no}: a face needs at least 3 vertices, got {len(idx)}")
            tris += [[idx[0], idx[k], idx[k + 1]] for k in range(1, len(idx) - 1)]
            lines_of += [no] * (len(idx) - 2)
    if not verts:
        raise HullError("no vertices ('v x y z' lines)")
    return np.array(verts, np.float64), (np.array(tris, np.int64) if tris else None), np.array(lines_of, np.int64)


def triangle_hull(a, b, c, one_sided=False):
    """(hull, centroid (3,)) of the triangle a, b, c (m) as a polytope of zero thickness: its front face (normal
    (b - a) x (c - a), counter-clockwise a, b, c) and its back face, its three edges between them. The separating
    axes of a pair with a triangle are then the two faces' normal and the other body's faces: an edge between the
    front and the back spans no arc of the Gauss map, so no edge pair is tested, and a body sliding over the edge
    between two triangles of a flat mesh meets no sideways axis there (the internal-edge problem of triangle
    meshes); spheres and capsules meet the edges through the closest points (app.sim.convex.poly_closest). Vertices
    about the centroid; no volume (a static triangle has no mass). one_sided: only a body whose centre is in front
    of the triangle's plane touches it (a mesh's back faces are ignored). Raises HullError for a triangle of zero
    area."""
    P = np.asarray([a, b, c], np.float64)
    n = np.cross(P[1] - P[0], P[2] - P[0])
    area2 = float(np.linalg.norm(n))
    scale = max(float(np.ptp(P, axis=0).max()), 1e-30)
    if not area2 > 1e-9 * scale * scale:
        raise HullError("a triangle of zero area (its vertices coincide or are collinear)")
    n /= area2
    centroid = P.mean(axis=0)
    V = P - centroid
    faces = (np.array([0, 1, 2], np.int32), np.array([0, 2, 1], np.int32))
    planes = np.array([[*n, 0.0], [*(-n), 0.0]])
    edges = np.array([[0, 1, 0, 1], [1, 2, 0, 1], [0, 2, 1, 0]], np.int32)   # (the front loop runs 0 -> 1 -> 2)
    return Hull(vertices=V, faces=faces, planes=planes, edges=edges, volume=0.0, inertia=np.zeros(3),
                one_sided=bool(one_sided)), centroid


def heightfield_triangles(heights, size, center):
    """(T, 3, 3) triangles (m) of a heightfield: heights[j][i] (m) over a grid of len(heights[0]) points along x and
    len(heights) along z spanning size = (x, z) about center (x, y, z); two triangles a cell, counter-clockwise seen
    from above."""
    H = np.asarray(heights, np.float64)
    nz, nx = H.shape
    x = center[0] - size[0] / 2 + np.arange(nx) * (size[0] / (nx - 1))
    z = center[2] - size[1] / 2 + np.arange(nz) * (size[1] / (nz - 1))
    P = np.stack(np.broadcast_arrays(x[None, :], center[1] + H, z[:, None]), -1)   # (nz, nx, 3)
    a, b, c, d = P[:-1, :-1], P[:-1, 1:], P[1:, 1:], P[1:, :-1]   # (z, x), (z, x+1), (z+1, x+1), (z+1, x)
    # seen from +y, x to the right and z towards the viewer: a, d, c and a, c, b are counter-clockwise
    t1 = np.stack([a, d, c], -2).reshape(-1, 3, 3)
    t2 = np.stack([a, c, b], -2).reshape(-1, 3, 3)
    return np.concatenate([t1, t2], 0)


def mesh_triangles_checked(vertices, triangles):
    """The mesh's triangles (T, 3, 3) m, after checking it: no triangle of zero area, no edge shared by more than two
    triangles. Raises HullError naming the triangle."""
    if triangles is None or not len(triangles):
        raise HullError("no faces ('f i j k' lines): a static mesh is its triangles")
    T = vertices[triangles]
    n = np.cross(T[:, 1] - T[:, 0], T[:, 2] - T[:, 0])
    scale = float(np.ptp(vertices, axis=0).max()) or 1.0
    bad = np.flatnonzero(np.linalg.norm(n, axis=1) <= 1e-9 * scale * scale)
    if bad.size:
        raise HullError(f"triangle {int(bad[0])} (vertices {', '.join(str(int(v) + 1) for v in triangles[bad[0]])}) "
                        f"has zero area")
    edges = np.sort(np.concatenate([triangles[:, [0, 1]], triangles[:, [1, 2]], triangles[:, [2, 0]]]), axis=1)
    uniq, counts = np.unique(edges, axis=0, return_counts=True)
    if (counts > 2).any():
        e = uniq[int(np.argmax(counts > 2))]
        raise HullError(f"non-manifold: the edge between vertices {int(e[0]) + 1} and {int(e[1]) + 1} belongs to "
                        f"{int(counts.max())} triangles")
    return T
