"""Convex hulls in the narrowphase: their geometry in VLAs, and the contact geometry of every pair with a hull.

A HullTable holds the distinct hulls of a scene (app.scene.hull.Hull), one list per hull in each of five VLAs: its
vertices, its face planes, its edges (two vertices and the two faces that meet there), the arcs its edges span on
the Gauss map, and its faces' vertex loops.
Hulls have their own numbers of each, which is what a VLA is for; a body's hull is model.body_hull. Hull 0 is the
unit cube: a box meeting a hull is that cube scaled by its half extents (a polytope below is a hull and a scale), so
one routine serves hull-hull and hull-box.

Pairs: a hull against a plane (its deepest vertices, reduced to 4), a sphere (the closest point of the hull's
surface, or the face of least penetration for a centre inside), a capsule (the segment's deepest point, or both ends
of its part over a face it lies along: as capsule-box) and a hull or box: the separating-axis test over the face
normals of both and the edge pairs whose arcs cross on the Gauss map (Gregorius, "The Separating Axis Test between
Convex Polyhedra", GDC 2013), then Sutherland-Hodgman clipping of the incident face against the reference face's
sides, reduced to 4 points (as box-box), or one point for an edge pair. Everything is computed in one body's frame.
"""
import numpy as np
import taichi as ti

from app.scene.hull import MAX_FACE_VERTICES, box_hull
from app.sim.capsule import GOLDEN_STEPS, INV_PHI, PARALLEL_SIN, closest_on_segment, segments_closest
from app.sim.manifold import EDGE_ABS_TOL, EDGE_REL_TOL, manifold_add, manifold_empty, plane_accepts
from vla import VLA

vec3 = ti.types.vector(3, ti.f32)
vec4 = ti.types.vector(4, ti.f32)
ivec4 = ti.types.vector(4, ti.i32)
mat3 = ti.types.matrix(3, 3, ti.f32)

# Rows of a clipping buffer: an incident face of at most MAX_FACE_VERTICES, clipped by as many sides, each adding at
# most one vertex.
CLIP_ROWS = 2 * MAX_FACE_VERTICES
# Feature ids of hull contacts (warm-start keys; below app.sim.contacts.FEATURE_ID_BITS): a face contact is
# 1 + 16 * (64 * (reference on the pair's second body) + reference face) + its index in the manifold; an edge pair
# EDGE_FEATURE + 256 * (first body's edge) + second body's edge.
EDGE_FEATURE = 1 << 20


# HullTable.inradius of a hull without volume: a static triangle (app.scene.hull.triangle_hull).
FLAT_INRADIUS = 1e30


@ti.data_oriented
class HullTable:
    """The hulls of a Model: hull 0 the unit cube, then a scene's hulls in its order (model.body_hull = scene index +
    1). Lists (one per hull): vertices vec3 m (body frame), planes vec4 (outward unit normal, offset m), edges ivec4
    (v0, v1, f0, f1), loops i32 (F + 1 offsets, then the faces' vertex indices: face f is entries F + 1 + loops[f]
    .. F + 1 + loops[f + 1] - 1, counter-clockwise seen from outside)."""

    def __init__(self, capacity: int):
        self.capacity = int(capacity)
        # Sizes fixed, so that writing another scene's hulls never recompiles the narrowphase.
        kw = dict(inline_capacity=0, chunk_size=4, runs="bump")
        self.vertices = VLA(self.capacity, vec3, name="hull_vertices", **kw)
        self.planes = VLA(self.capacity, vec4, name="hull_planes", **kw)
        self.edges = VLA(self.capacity, ivec4, name="hull_edges", **kw)
        self.loops = VLA(self.capacity, ti.i32, name="hull_loops", **kw)
        # per edge, the arc it spans on the Gauss map: rows f0's normal, f1's normal, f1's x f0's (one load a pair in
        # the separating-axis test's edge loop instead of the edge and its two planes)
        self.arcs = VLA(self.capacity, mat3, name="hull_arcs", **kw)
        # m: each hull's distance from its centre to its nearest face, its smallest half size (diagnostics)
        self.inradius = ti.field(ti.f32, self.capacity)
        self.one_sided = ti.field(ti.i32, self.capacity)   # 1: a static triangle touched from its front only
        self.count = 0

    def write(self, hulls):
        """Hold the unit cube and `hulls` (a list of app.scene.hull.Hull); the rest of the lists empty."""
        table = [box_hull()] + list(hulls)
        if len(table) > self.capacity:
            raise ValueError(f"HullTable: {len(table)} hulls exceed its capacity {self.capacity}")
        pad = self.capacity - len(table)

        def csr(rows, width, dtype):
            lens = [len(r) for r in rows] + [0] * pad
            offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
            values = np.concatenate([np.asarray(r, dtype).reshape(-1, width) for r in rows], 0)
            return offsets, (values[:, 0] if width == 1 else values)

        self.vertices.from_csr(*csr([h.vertices for h in table], 3, np.float32))
        self.planes.from_csr(*csr([h.planes for h in table], 4, np.float32))
        self.edges.from_csr(*csr([h.edges for h in table], 4, np.int32))
        arcs = []
        for h in table:
            n0 = h.planes[h.edges[:, 2], :3]
            n1 = h.planes[h.edges[:, 3], :3]
            arcs.append(np.stack([n0, n1, np.cross(n1, n0)], 1).reshape(-1, 9))
        offsets, values = csr(arcs, 9, np.float32)
        self.arcs.from_csr(offsets, values.reshape(-1, 3, 3))
        loops = []
        for h in table:
            starts = np.concatenate([[0], np.cumsum([len(f) for f in h.faces])])
            loops.append(np.concatenate([starts, np.concatenate(h.faces)]).astype(np.int32))
        self.loops.from_csr(*csr(loops, 1, np.int32))
        inradius = np.zeros(self.capacity, np.float32)
        # (a static triangle, of no thickness, leaves the pair's size to the other body)
        inradius[:len(table)] = [h.inradius if h.volume > 0 else FLAT_INRADIUS for h in table]
        self.inradius.from_numpy(inradius)
        one_sided = np.zeros(self.capacity, np.int32)
        one_sided[:len(table)] = [int(h.one_sided) for h in table]
        self.one_sided.from_numpy(one_sided)
        self.count = len(table)


# ---------------------------------------------------------------------------------------------------- polytopes
# A polytope is hull h of the table scaled by s (vec3; (1, 1, 1) for a hull body, a box's half extents for hull 0).
@ti.func
def poly_vertex(hulls: ti.template(), h, s, k):
    return hulls.vertices.get(h, k) * s


@ti.func
def poly_plane(hulls: ti.template(), h, s, f):
    """(outward unit normal, offset m) of face f of the polytope (a scale maps n to n / s, renormalised)."""
    p = hulls.planes.get(h, f)
    n = vec3(p[0], p[1], p[2]) / s
    ln = n.norm()
    return n / ln, p[3] / ln


@ti.func
def poly_normal_dir(hulls: ti.template(), h, s, f):
    """Face f's outward normal direction, not normalised (for the Gauss map's sign tests)."""
    p = hulls.planes.get(h, f)
    return vec3(p[0], p[1], p[2]) / s


@ti.func
def poly_loop(hulls: ti.template(), h, f):
    """(first entry, vertex count) of face f's loop in hulls.loops[h]."""
    nf = hulls.planes.length(h)
    a = hulls.loops.get(h, f)
    return nf + 1 + a, hulls.loops.get(h, f + 1) - a


@ti.func
def poly_support_min(hulls: ti.template(), h, s, d):
    """min over the polytope's vertices of d . v (m)."""
    lo = 3.0e38
    for k in range(hulls.vertices.length(h)):
        lo = ti.min(lo, d.dot(poly_vertex(hulls, h, s, k)))
    return lo


@ti.func
def poly_closest(hulls: ti.template(), h, s, x):
    """(n, sd, face) for point x (polytope frame): the outward unit normal n from the surface towards x, the signed
    distance sd along it (negative inside) and the face (when the closest feature is a face's interior, or x is
    inside: the face of least penetration), else -1. Outside: the nearest of the faces' interiors (x's projection
    inside the face's loop) and the edges (which cover the vertices)."""
    nf = hulls.planes.length(h)
    best_sep = -3.0e38
    best_f = 0
    for f in range(nf):
        n, d = poly_plane(hulls, h, s, f)
        sep = n.dot(x) - d
        if sep > best_sep:
            best_sep = sep
            best_f = f
    n_out, d_best = poly_plane(hulls, h, s, best_f)
    sd = best_sep
    face = best_f
    if best_sep > 0.0:
        dist2 = 3.0e38
        for f in range(nf):
            n, d = poly_plane(hulls, h, s, f)
            sep = n.dot(x) - d
            if sep > 0.0 and sep * sep < dist2:
                y = x - n * sep
                first, cnt = poly_loop(hulls, h, f)
                inside = True
                for q in range(cnt):
                    a = poly_vertex(hulls, h, s, hulls.loops.get(h, first + q))
                    b = poly_vertex(hulls, h, s, hulls.loops.get(h, first + (q + 1) % cnt))
                    if (b - a).cross(n).dot(y - a) > 0.0:
                        inside = False
                if inside:
                    dist2 = sep * sep
                    n_out = n
                    face = f
        for e in range(hulls.edges.length(h)):
            ed = hulls.edges.get(h, e)
            a = poly_vertex(hulls, h, s, ed[0])
            b = poly_vertex(hulls, h, s, ed[1])
            y = a + closest_on_segment(a, b, x) * (b - a)
            dd = (x - y).norm_sqr()
            if dd < dist2:
                dist2 = dd
                face = -1
                n_out = (x - y) / ti.max(ti.sqrt(dd), 1e-20)
        sd = ti.sqrt(dist2)
    return n_out, sd, face


@ti.func
def poly_signed_distance(hulls: ti.template(), h, s, x):
    _n, sd, _f = poly_closest(hulls, h, s, x)
    return sd


@ti.func
def segment_poly_deepest(hulls: ti.template(), h, s, a, b):
    """Parameter t in [0, 1] of the point of segment a-b (polytope frame) deepest in the polytope, or closest to it:
    the minimum of its signed distance (convex along the segment) by golden section, as capsule.segment_box_deepest."""
    lo = 0.0
    hi = 1.0
    x1 = hi - INV_PHI * (hi - lo)
    x2 = lo + INV_PHI * (hi - lo)
    f1 = poly_signed_distance(hulls, h, s, a + x1 * (b - a))
    f2 = poly_signed_distance(hulls, h, s, a + x2 * (b - a))
    for _ in range(GOLDEN_STEPS):
        if f1 <= f2:
            hi = x2
            x2 = x1
            f2 = f1
            x1 = hi - INV_PHI * (hi - lo)
            f1 = poly_signed_distance(hulls, h, s, a + x1 * (b - a))
        else:
            lo = x1
            x1 = x2
            f1 = f2
            x2 = lo + INV_PHI * (hi - lo)
            f2 = poly_signed_distance(hulls, h, s, a + x2 * (b - a))
    t = 0.5 * (lo + hi)
    ft = poly_signed_distance(hulls, h, s, a + t * (b - a))
    fa = poly_signed_distance(hulls, h, s, a)
    if fa < ft:
        t = 0.0
        ft = fa
    if poly_signed_distance(hulls, h, s, b) < ft:
        t = 1.0
    return t


@ti.func
def clip_segment_to_poly_face(hulls: ti.template(), h, s, f, n, a, b):
    """(t0, t1, ok): the part of segment a-b (polytope frame) whose projection along face f's normal n falls inside
    the face's loop; ok is False when none does."""
    t0 = 0.0
    t1 = 1.0
    d = b - a
    first, cnt = poly_loop(hulls, h, f)
    for q in range(cnt):
        va = poly_vertex(hulls, h, s, hulls.loops.get(h, first + q))
        vb = poly_vertex(hulls, h, s, hulls.loops.get(h, first + (q + 1) % cnt))
        m = (vb - va).cross(n)   # the side's outward normal in the face's plane
        da = m.dot(a - va)
        dd = m.dot(d)
        if ti.abs(dd) < 1e-12:
            if da > 0.0:
                t0 = 1.0
                t1 = 0.0
        else:
            u = -da / dd
            if dd > 0.0:
                t1 = ti.min(t1, u)
            else:
                t0 = ti.max(t0, u)
    return t0, t1, t0 <= t1


# ---------------------------------------------------------------------------------------------------- clipping
@ti.func
def _row(m, k):
    """Row k (runtime) of a matrix of points, a vec3."""
    return vec3(m[k, 0], m[k, 1], m[k, 2])


@ti.func
def clip_polygon(poly, count, m, o):
    """Sutherland-Hodgman: keep the part of polygon (rows 0..count-1 of an R x 3 matrix, R at compile time) with
    m . x <= o; at most R rows of the result."""
    rows = ti.static(poly.n)
    out = ti.Matrix.zero(ti.f32, rows, 3)
    n_out = 0
    for a in range(count):
        b = (a + 1) % count
        xa = _row(poly, a)
        xb = _row(poly, b)
        da = m.dot(xa) - o
        db = m.dot(xb) - o
        if da <= 0 and n_out < rows:
            for d in ti.static(range(3)):
                out[n_out, d] = xa[d]
            n_out += 1
        if (da < 0 and db > 0) or (da > 0 and db < 0):
            if n_out < rows:
                x = xa + (xb - xa) * (da / (da - db))
                for d in ti.static(range(3)):
                    out[n_out, d] = x[d]
                n_out += 1
    return out, n_out


@ti.func
def reduce_to_four(poly, depth, keep, nr):
    """Indices (vec4 i32, -1 unused) of at most 4 of the first `keep` rows of poly: the deepest, the farthest from
    it, then the two spanning the largest triangles on either side of that diagonal (about normal nr): the support
    polygon's area is kept (as box-box)."""
    sel = ti.Vector([-1, -1, -1, -1])
    if keep <= 4:
        for m in range(keep):
            sel[m] = m
    else:
        s0 = 0
        for m in range(keep):
            if depth[m] > depth[s0]:
                s0 = m
        x0 = _row(poly, s0)
        s1 = -1
        far = -1.0
        for m in range(keep):
            dd = (_row(poly, m) - x0).norm_sqr()
            if m != s0 and dd > far:
                far = dd
                s1 = m
        x1 = _row(poly, s1)
        s2 = -1
        s3 = -1
        amax = 0.0
        amin = 0.0
        for m in range(keep):
            if m != s0 and m != s1:
                area = (x1 - x0).cross(_row(poly, m) - x0).dot(nr)
                if s2 < 0 or area > amax:
                    amax = area
                    s2 = m
                if s3 < 0 or area < amin:
                    amin = area
                    s3 = m
        sel = ti.Vector([s0, s1, s2, s3])
        if s3 == s2:
            sel[3] = -1
    return sel


# ---------------------------------------------------------------------------------------------------- pairs
@ti.func
def _hull_plane_point(model: ti.template(), hulls: ti.template(), h, v, p, R, nl, base, radius, k, margin):
    """(point m, depth m, accepted) of vertex v of hull h (at p turned by R) against plane k: nl the plane's normal
    in the hull's frame, base the depth of the hull's centre; accepted when within the margin and where the plane
    takes contacts (plane_accepts)."""
    x = hulls.vertices.get(h, v)
    d = base - nl.dot(x)
    n = model.plane_normal[k]
    point = p + R @ x + 0.5 * d * n
    return point, d, d > -margin and plane_accepts(model, k, point, d, base, radius)


@ti.func
def collide_hull_plane(model: ti.template(), hulls: ti.template(), h, p, R, radius, k, margin):
    """Hull h at p turned by R (bounding radius `radius`) against plane k: its vertices below the plane (within the
    margin), reduced to 4 as reduce_to_four does, streaming over the vertices instead of buffering them."""
    m = manifold_empty()
    n = model.plane_normal[k]
    m.normal = n
    base = model.plane_offset[k] - n.dot(p)   # the depth of the body's centre (positive behind the plane)
    nl = R.transpose() @ n
    nv = hulls.vertices.length(h)
    s0 = -1
    best = -3.0e38
    accepted = 0
    for v in range(nv):
        _x, d, ok = _hull_plane_point(model, hulls, h, v, p, R, nl, base, radius, k, margin)
        if ok:
            accepted += 1
            if d > best:
                best = d
                s0 = v
    if accepted > 0 and accepted <= 4:
        for v in range(nv):
            x, d, ok = _hull_plane_point(model, hulls, h, v, p, R, nl, base, radius, k, margin)
            if ok:
                manifold_add(m, x, d, v)
    elif accepted > 4:
        x0 = hulls.vertices.get(h, s0)
        s1 = -1
        far = -1.0
        for v in range(nv):
            _x, _d, ok = _hull_plane_point(model, hulls, h, v, p, R, nl, base, radius, k, margin)
            dd = (hulls.vertices.get(h, v) - x0).norm_sqr()
            if v != s0 and dd > far and ok:
                far = dd
                s1 = v
        x1 = hulls.vertices.get(h, s1)
        s2 = -1
        s3 = -1
        amax = 0.0
        amin = 0.0
        for v in range(nv):
            _x, _d, ok = _hull_plane_point(model, hulls, h, v, p, R, nl, base, radius, k, margin)
            if v != s0 and v != s1 and ok:
                area = (x1 - x0).cross(hulls.vertices.get(h, v) - x0).dot(nl)
                if s2 < 0 or area > amax:
                    amax = area
                    s2 = v
                if s3 < 0 or area < amin:
                    amin = area
                    s3 = v
        for q in ti.static(range(4)):
            v = s0
            if ti.static(q == 1):
                v = s1
            elif ti.static(q == 2):
                v = s2
            elif ti.static(q == 3):
                v = ti.select(s3 == s2, -1, s3)
            if v >= 0:
                x, d, _ok = _hull_plane_point(model, hulls, h, v, p, R, nl, base, radius, k, margin)
                manifold_add(m, x, d, v)
    return m


@ti.func
def collide_poly_sphere(hulls: ti.template(), h, s, p, R, c, r, margin):
    """Polytope (h, s) at p turned by R against a sphere (centre c, radius r); normal from the polytope towards the
    sphere."""
    m = manifold_empty()
    n_l, sd, _face = poly_closest(hulls, h, s, R.transpose() @ (c - p))
    depth = r - sd
    if depth > -margin:
        n = R @ n_l
        m.normal = n
        manifold_add(m, c - n * (r - 0.5 * depth), depth, 0)
    return m


@ti.func
def collide_capsule_poly(hulls: ti.template(), a, b, rc, h, s, p, R, margin):
    """A capsule (segment a-b, radius rc) and polytope (h, s) at p turned by R: the segment's point deepest in the
    polytope (or closest to it), or, for a segment within PARALLEL_SIN of parallel to the face it meets, the two
    ends of its part over that face (as narrowphase.collide_capsule_box). Normal from the capsule towards the
    polytope."""
    m = manifold_empty()
    Rt = R.transpose()
    al = Rt @ (a - p)
    bl = Rt @ (b - p)
    d = bl - al
    x = al + segment_poly_deepest(hulls, h, s, al, bl) * d
    n_l, sd, face = poly_closest(hulls, h, s, x)
    depth = rc - sd
    if depth > -margin:
        m.normal = -(R @ n_l)
        two = False
        if face >= 0 and ti.abs(d.dot(n_l)) < PARALLEL_SIN * d.norm():
            nf, df = poly_plane(hulls, h, s, face)
            t0, t1, ok = clip_segment_to_poly_face(hulls, h, s, face, nf, al, bl)
            if ok and t1 - t0 > 1e-3:
                two = True
                for e in ti.static(range(2)):
                    te = t0
                    if ti.static(e == 1):
                        te = t1
                    xe = al + te * d
                    dep = rc - (nf.dot(xe) - df)
                    if dep > -margin:
                        manifold_add(m, p + R @ (xe - nf * (rc - 0.5 * dep)), dep, 2 + 2 * face + e)
        if not two:
            manifold_add(m, p + R @ (x - n_l * (rc - 0.5 * depth)), depth, 1)
    return m


@ti.func
def flat_side_separation(hulls: ti.template(), hf, sf, ho, so, R, t):
    """How far (m) polytope (ho, so), moved into flat polytope hf's frame by x -> R x + t, lies beyond the nearest
    of the planes through hf's edges that hold its face normal (positive: wholly outside the triangle's prism).

    A static triangle's edges span no arc of the Gauss map (app.scene.hull.triangle_hull), so no edge axis of a pair
    with a triangle is tested, and a body beside a triangle, below the plane of its face, overlaps it on every axis
    left: its face normal and the body's faces. These side planes are separating axes too (the triangle lies inside
    each), and a pair they separate has no contact. They never become the contact normal: a body resting across the
    edge between two triangles of a flat mesh straddles the edge's plane, and one over the neighbour is that
    triangle's."""
    n, _d = poly_plane(hulls, hf, sf, 0)
    first, count = poly_loop(hulls, hf, 0)
    best = -3.0e38
    for q in range(count):
        va = poly_vertex(hulls, hf, sf, hulls.loops.get(hf, first + q))
        vb = poly_vertex(hulls, hf, sf, hulls.loops.get(hf, first + (q + 1) % count))
        side = (vb - va).cross(n)   # (outward: the loop runs counter-clockwise about n)
        side = side / side.norm()
        lo = 3.0e38
        for k in range(hulls.vertices.length(ho)):
            lo = ti.min(lo, side.dot(R @ poly_vertex(hulls, ho, so, k) + t - va))
        best = ti.max(best, lo)
    return best


@ti.func
def collide_polytopes(hulls: ti.template(), ha, sa, pa, Ra, hb, sb, pb, Rb, size, margin):
    """Polytopes (ha, sa) at pa turned by Ra and (hb, sb) at pb turned by Rb: separating axes (faces of both, edge
    pairs that form a face of the Minkowski difference), then a face manifold clipped and reduced to 4 points, or one
    point for an edge pair. Normal from the first towards the second. size: the pair's smaller half size (m), for
    the face/edge tolerances. Computed in the first body's frame."""
    mf = manifold_empty()
    Rab = Ra.transpose() @ Rb   # B's frame to A's: x_A = Rab x_B + tab
    tab = Ra.transpose() @ (pb - pa)
    separated = False
    fa_best = -1
    fa_sep = -3.0e38
    # A static triangle's two faces: only the one whose side the other body's centre is on can push it (a body pressed
    # deep into a two-sided triangle, or beside it below the plane of its face, would otherwise find the far face's
    # axis the shallower and be pushed through)
    flat_a = hulls.inradius[ha] > 0.5 * FLAT_INRADIUS
    flat_b = hulls.inradius[hb] > 0.5 * FLAT_INRADIUS
    cb_in_a = tab                             # B's centre in A's frame
    ca_in_b = -(Rab.transpose() @ tab)        # A's centre in B's frame
    for f in range(hulls.planes.length(ha)):
        if not separated:
            n, d = poly_plane(hulls, ha, sa, f)
            sep = poly_support_min(hulls, hb, sb, Rab.transpose() @ n) + n.dot(tab) - d
            if sep > fa_sep and (not flat_a or n.dot(cb_in_a) >= d):
                fa_sep = sep
                fa_best = f
            if sep > margin:
                separated = True
    fb_best = -1
    fb_sep = -3.0e38
    for f in range(hulls.planes.length(hb)):
        if not separated:
            n, d = poly_plane(hulls, hb, sb, f)
            na = Rab @ n
            sep = poly_support_min(hulls, ha, sa, na) - na.dot(tab) - d
            if sep > fb_sep and (not flat_b or n.dot(ca_in_b) >= d):
                fb_sep = sep
                fb_best = f
            if sep > margin:
                separated = True
    if not separated and flat_b:
        separated = flat_side_separation(hulls, hb, sb, ha, sa, Rab.transpose(), ca_in_b) > 0.0
    if not separated and flat_a:
        separated = flat_side_separation(hulls, ha, sa, hb, sb, Rab, tab) > 0.0
    e_best = -1
    e_sep = -3.0e38
    e_axis = vec3(0.0)
    nea = hulls.edges.length(ha)
    # B's edges outside: each is moved into A's frame once, then met by every edge of A (loaded as stored)
    for eb in range(hulls.edges.length(hb)):
        if not separated:
            eb_ = hulls.edges.get(hb, eb)
            q0 = Rab @ poly_vertex(hulls, hb, sb, eb_[0]) + tab
            ub = Rab @ poly_vertex(hulls, hb, sb, eb_[1]) + tab - q0
            # (the arcs' tests take signs only: the normals need no normalising)
            c = -(Rab @ poly_normal_dir(hulls, hb, sb, eb_[2]))   # B's Gauss map is negated in A - B
            dd = -(Rab @ poly_normal_dir(hulls, hb, sb, eb_[3]))
            dxc = dd.cross(c)
            for ea in range(nea):
                # A's arc, scaled: a normal n becomes n / s, and n1 x n0 then (n1 x n0) * s / (sx sy sz), whose
                # sign the product keeps
                arc = hulls.arcs.get(ha, ea)
                na0 = vec3(arc[0, 0], arc[0, 1], arc[0, 2]) / sa
                na1 = vec3(arc[1, 0], arc[1, 1], arc[1, 2]) / sa
                bxa = vec3(arc[2, 0], arc[2, 1], arc[2, 2]) * sa
                cba = c.dot(bxa)
                dba = dd.dot(bxa)
                adc = na0.dot(dxc)
                bdc = na1.dot(dxc)
                if cba * dba < 0.0 and adc * bdc < 0.0 and cba * bdc > 0.0:
                    ed = hulls.edges.get(ha, ea)
                    p0 = poly_vertex(hulls, ha, sa, ed[0])
                    ua = poly_vertex(hulls, ha, sa, ed[1]) - p0
                    axis = ua.cross(ub)
                    ln = axis.norm()
                    if ln > 1e-5 * ua.norm() * ub.norm():
                        axis = axis / ln
                        if axis.dot(p0) < 0.0:   # (A's centre is its frame's origin)
                            axis = -axis
                        sep = axis.dot(q0 - p0)
                        if sep > e_sep:
                            e_sep = sep
                            e_best = ea * 256 + eb
                            e_axis = axis
                        if sep > margin:
                            separated = True
    if not separated and fa_best >= 0 and fb_best >= 0:
        f_sep = ti.max(fa_sep, fb_sep)
        if e_best >= 0 and e_sep > EDGE_REL_TOL * f_sep + EDGE_ABS_TOL * size:
            ea = e_best // 256
            eb = e_best % 256
            ed = hulls.edges.get(ha, ea)
            eb_ = hulls.edges.get(hb, eb)
            a0 = poly_vertex(hulls, ha, sa, ed[0])
            a1 = poly_vertex(hulls, ha, sa, ed[1])
            b0 = Rab @ poly_vertex(hulls, hb, sb, eb_[0]) + tab
            b1 = Rab @ poly_vertex(hulls, hb, sb, eb_[1]) + tab
            u, t = segments_closest(a0, a1, b0, b1)
            x = 0.5 * (a0 + u * (a1 - a0) + b0 + t * (b1 - b0))
            mf.normal = Ra @ e_axis
            manifold_add(mf, pa + Ra @ x, -e_sep, EDGE_FEATURE + e_best)
        else:
            # reference face: A's unless B's separates clearly more (a small preference keeps it from flipping)
            ref_b = fb_sep > fa_sep + 1e-4 * size
            hr, sr, fr, hi, si = ha, sa, fa_best, hb, sb
            Rir = Rab          # incident frame to reference frame
            tir = tab
            if ref_b:
                hr, sr, fr, hi, si = hb, sb, fb_best, ha, sa
                Rir = Rab.transpose()
                tir = -(Rab.transpose() @ tab)
            nr, dr = poly_plane(hulls, hr, sr, fr)
            # incident face: the incident polytope's face most anti-parallel to the reference normal
            fi = 0
            low = 3.0e38
            for f in range(hulls.planes.length(hi)):
                n, _d = poly_plane(hulls, hi, si, f)
                c = (Rir @ n).dot(nr)
                if c < low:
                    low = c
                    fi = f
            poly = ti.Matrix.zero(ti.f32, CLIP_ROWS, 3)
            first, count = poly_loop(hulls, hi, fi)
            for q in range(count):
                x = Rir @ poly_vertex(hulls, hi, si, hulls.loops.get(hi, first + q)) + tir
                for k in ti.static(range(3)):
                    poly[q, k] = x[k]
            rfirst, rcount = poly_loop(hulls, hr, fr)
            for q in range(rcount):
                va = poly_vertex(hulls, hr, sr, hulls.loops.get(hr, rfirst + q))
                vb = poly_vertex(hulls, hr, sr, hulls.loops.get(hr, rfirst + (q + 1) % rcount))
                side = (vb - va).cross(nr)
                if count > 0:
                    poly, count = clip_polygon(poly, count, side, side.dot(va))
            depth = ti.Vector.zero(ti.f32, CLIP_ROWS)
            keep = 0
            for q in range(count):
                x = _row(poly, q)
                sep = nr.dot(x) - dr
                if sep < margin:
                    xm = x - nr * (0.5 * sep)
                    for k in ti.static(range(3)):
                        poly[keep, k] = xm[k]
                    depth[keep] = -sep
                    keep += 1
            if keep == 0:
                # Nothing of the incident face lies over the reference face: one point, the incident polytope's
                # vertex nearest the reference plane among those over the reference face (the deepest vertex of a
                # polytope meeting a small face through a vertex whose faces are all steep), else among all of them
                # if it is above the plane (polytopes apart, nearest at a vertex or an edge: a speculative point).
                # With a static triangle, a vertex beside the reference face and below its plane touches nothing
                # there: a body beside the triangle, below the plane of its face, is outside it (flat_side_separation;
                # two solids overlap wherever the axes say so).
                flat = flat_a or flat_b
                lo = 3.0e38
                lo_over = 3.0e38
                x_lo = vec3(0.0)
                x_over = vec3(0.0)
                for v in range(hulls.vertices.length(hi)):
                    x = Rir @ poly_vertex(hulls, hi, si, v) + tir
                    sep = nr.dot(x) - dr
                    if sep < lo:
                        lo = sep
                        x_lo = x
                    if flat and sep < lo_over:
                        over = True
                        for q in range(rcount):
                            va = poly_vertex(hulls, hr, sr, hulls.loops.get(hr, rfirst + q))
                            vb = poly_vertex(hulls, hr, sr, hulls.loops.get(hr, rfirst + (q + 1) % rcount))
                            over = over and (vb - va).cross(nr).dot(x - va) <= 0.0
                        if over:
                            lo_over = sep
                            x_over = x
                if not flat:   # (two solids: every axis was tested, so the deepest vertex is a contact)
                    lo_over = lo
                    x_over = x_lo
                if lo_over >= margin and 0.0 <= lo < margin:
                    lo_over = lo
                    x_over = x_lo
                if lo_over < margin:
                    for k in ti.static(range(3)):
                        poly[0, k] = x_over[k] - nr[k] * (0.5 * lo_over)
                    depth[0] = -lo_over
                    keep = 1
            sel = reduce_to_four(poly, depth, keep, nr)
            pr = pa
            Rr = Ra
            sign = 1.0
            if ref_b:
                pr = pb
                Rr = Rb
                sign = -1.0
            mf.normal = sign * (Rr @ nr)
            code = 1 + 16 * (64 * ti.select(ref_b, 1, 0) + fr)
            for q in range(4):
                if sel[q] >= 0:
                    mf_point = pr + Rr @ _row(poly, sel[q])
                    manifold_add(mf, mf_point, depth[sel[q]], code + q)
    return mf
