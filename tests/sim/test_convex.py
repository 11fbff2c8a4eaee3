"""Convex hulls: the hull and its mass properties against analytic boxes and tetrahedra, contact geometry against a
brute-force search over support directions (numpy), the scene keys' checks, and hulls in motion (a box modelled as a
hull behaves as the box shape)."""
import os

import numpy as np
import pytest

ti = pytest.importorskip("taichi")

from app.errors import UserError  # noqa: E402
from app.runtime import taichi_options  # noqa: E402
from manifold_probe import random_rotation, store_manifold  # noqa: E402  (tests/sim, on the path)
from app.scene import scene_from_dict  # noqa: E402
from app.scene.hull import HullError, box_hull, hull_of  # noqa: E402
from app.sim.convex import HullTable, collide_capsule_poly, collide_poly_sphere, collide_polytopes  # noqa: E402


@pytest.fixture(scope="module")
def arch():
    ti.init(arch=ti.cpu, log_level=ti.WARN, **taichi_options("cpu"))
    yield


def _mat(a, p):
    R = ti.Matrix.zero(ti.f32, 3, 3)
    for r, c in ti.static(ti.ndrange(3, 3)):
        R[r, c] = a[p, r, c]
    return R


def _v3(a, p, k):
    return ti.Vector([a[p, k, 0], a[p, k, 1], a[p, k, 2]])


@ti.kernel
def _polytopes(hulls: ti.template(), ids: ti.types.ndarray(), vec: ti.types.ndarray(), rot: ti.types.ndarray(),
               depth: ti.types.ndarray(), normal: ti.types.ndarray(), count: ti.types.ndarray()):
    """Pair p: polytopes (ids[p, 0], scale vec[p, 0]) at vec[p, 1] turned by rot[p, 0], and (ids[p, 1], vec[p, 2]) at
    vec[p, 3] turned by rot[p, 1]."""
    for p in range(ids.shape[0]):
        Ra = ti.Matrix.zero(ti.f32, 3, 3)
        Rb = ti.Matrix.zero(ti.f32, 3, 3)
        for r, c in ti.static(ti.ndrange(3, 3)):
            Ra[r, c] = rot[p, 0, r, c]
            Rb[r, c] = rot[p, 1, r, c]
        v = [ti.Vector([vec[p, k, 0], vec[p, k, 1], vec[p, k, 2]]) for k in ti.static(range(4))]
        m = collide_polytopes(hulls, ids[p, 0], v[0], v[1], Ra, ids[p, 1], v[2], v[3], Rb, 0.05, 10.0)
        store_manifold(m, p, depth, normal, count)


def reference_gap(support_a, support_b, rng, samples=4000, rounds=120):
    """(signed gap m, unit direction from A to B) of two convex sets given by their support functions (max over the
    set of u . x): the maximum over unit u of min_B u.x - max_A u.x, the distance when they are apart and minus the
    penetration depth when they overlap. Dense random directions, then a shrinking random search around the best."""
    def gap(u):
        return -support_b(-u) - support_a(u)

    U = rng.normal(size=(samples, 3))
    U /= np.linalg.norm(U, axis=1, keepdims=True)
    g = np.array([gap(u) for u in U])
    best = [U[k] for k in np.argsort(-g)[:8]]
    out = (-np.inf, None)
    for u in best:
        gu = gap(u)
        step = 0.05
        for _ in range(rounds):
            cand = u[None] + step * rng.normal(size=(32, 3))
            cand /= np.linalg.norm(cand, axis=1, keepdims=True)
            gc = np.array([gap(c) for c in cand])
            k = int(np.argmax(gc))
            if gc[k] > gu:
                u, gu = cand[k], gc[k]
            else:
                step *= 0.8
        if gu > out[0]:
            out = (gu, u)
    return out


@ti.kernel
def _poly_sphere(hulls: ti.template(), ids: ti.types.ndarray(), vec: ti.types.ndarray(), rot: ti.types.ndarray(),
                 depth: ti.types.ndarray(), normal: ti.types.ndarray(), count: ti.types.ndarray()):
    """Pair p: polytope (ids[p], scale vec[p, 0]) at vec[p, 1] turned by rot[p]; sphere at vec[p, 2], radius
    vec[p, 3][0]."""
    for p in range(ids.shape[0]):
        R = ti.Matrix.zero(ti.f32, 3, 3)
        for r, c in ti.static(ti.ndrange(3, 3)):
            R[r, c] = rot[p, r, c]
        v = [ti.Vector([vec[p, k, 0], vec[p, k, 1], vec[p, k, 2]]) for k in ti.static(range(4))]
        m = collide_poly_sphere(hulls, ids[p], v[0], v[1], R, v[2], v[3][0], 10.0)
        store_manifold(m, p, depth, normal, count)


@ti.kernel
def _capsule_poly(hulls: ti.template(), ids: ti.types.ndarray(), vec: ti.types.ndarray(), rot: ti.types.ndarray(),
                  depth: ti.types.ndarray(), normal: ti.types.ndarray(), count: ti.types.ndarray()):
    """Pair p: a capsule (segment vec[p, 2]-vec[p, 3], radius vec[p, 4][0]) and polytope (ids[p], scale vec[p, 0]) at
    vec[p, 1] turned by rot[p]."""
    for p in range(ids.shape[0]):
        R = ti.Matrix.zero(ti.f32, 3, 3)
        for r, c in ti.static(ti.ndrange(3, 3)):
            R[r, c] = rot[p, r, c]
        v = [ti.Vector([vec[p, k, 0], vec[p, k, 1], vec[p, k, 2]]) for k in ti.static(range(5))]
        m = collide_capsule_poly(hulls, v[2], v[3], v[4][0], ids[p], v[0], v[1], R, 10.0)
        store_manifold(m, p, depth, normal, count)


def _table(seed=3, count=3):
    rng = np.random.default_rng(seed)
    hulls = [hull_of(rng.normal(size=(12, 3)) * [0.3, 0.2, 0.25])[0] for _ in range(count)]
    table = HullTable(16)
    table.write(hulls)
    return table, [box_hull()] + hulls


def _polytope(rng, table_hulls):
    """(hull id, scale, vertices function of (p, R)) of a random polytope: a hull, or hull 0 as a random box."""
    h = int(rng.integers(0, len(table_hulls)))
    s = rng.uniform(0.08, 0.3, 3) if h == 0 else np.ones(3)
    return h, s, table_hulls[h].vertices * s


def _support(V, p, R):
    W = V @ R.T + p
    return lambda u: float((W @ u).max())


def _place_at_gap(support_a, make_b, direction, gap, rng):
    """Distance t along `direction` at which B (make_b(t): its support) has reference gap `gap` with A (bisection)."""
    lo, hi = 0.0, 2.0
    for _ in range(28):
        mid = 0.5 * (lo + hi)
        g, _u = reference_gap(support_a, make_b(mid), rng, samples=300, rounds=12)
        lo, hi = (mid, hi) if g < gap else (lo, mid)
    return 0.5 * (lo + hi)


def test_hull_of_box_and_tetrahedron_mass_properties():
    """A box's hull: 8 vertices, 6 faces of 4, 12 edges, volume 8 h^3-product and the box's moments; the unit right
    tetrahedron: volume 1/6, centre (1/4, 1/4, 1/4), principal moments 1/96, 1/96, 1/60 (per unit density; Tonon's
    closed form: I = 1/80 on the diagonal, products 1/480); every input point inside every face plane."""
    h = np.array([0.5, 1.0, 1.5])
    box = box_hull(h)
    assert (len(box.vertices), len(box.faces), len(box.edges)) == (8, 6, 12)
    assert all(len(f) == 4 for f in box.faces)
    m = box.volume
    assert m == pytest.approx(8 * h.prod(), rel=1e-12)
    assert box.inertia == pytest.approx(m / 3 * np.array([h[1] ** 2 + h[2] ** 2, h[0] ** 2 + h[2] ** 2,
                                                          h[0] ** 2 + h[1] ** 2]), rel=1e-12)
    assert box.inradius == pytest.approx(0.5)
    tet, com, rot = hull_of([[0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1]])
    assert tet.volume == pytest.approx(1 / 6, rel=1e-12)
    assert com == pytest.approx([0.25, 0.25, 0.25], abs=1e-12)
    assert sorted(tet.inertia) == pytest.approx([1 / 96, 1 / 96, 1 / 60], rel=1e-9)
    tensor = rot @ np.diag(tet.inertia) @ rot.T
    assert tensor == pytest.approx(np.full((3, 3), 1 / 480) + np.eye(3) * (1 / 80 - 1 / 480), abs=1e-12)
    rng = np.random.default_rng(0)
    for n in (8, 30, 300):
        pts = rng.normal(size=(n, 3))
        hull, com, rot = hull_of(pts)
        local = (pts - com) @ rot
        assert (local @ hull.planes[:, :3].T - hull.planes[:, 3]).max() < 1e-9
        assert len(hull.vertices) - len(hull.edges) + len(hull.faces) == 2


@pytest.mark.parametrize("points, reason", [
    ([[0, 0, 0]] * 5, "at least 4 distinct points"),
    ([[0, 0, 0], [1, 0, 0], [2, 0, 0], [3, 0, 0]], "collinear"),
    ([[0, 0, 0], [1, 0, 0], [0, 1, 0], [1, 1, 0], [0.5, 0.5, 0]], "coplanar"),
    ([[0, 0, 0], [1, 0, 0], [0, 1, 0]], "at least 4 points"),
])
def test_hull_of_degenerate_points(points, reason):
    with pytest.raises(HullError, match=reason):
        hull_of(points)


def test_polytopes_depth_and_normal_against_support_search(arch):
    """Random hulls and boxes, turned at random, placed along a random direction at a reference gap from -20 mm
    (overlapping) to +5 mm: the manifold's deepest depth equals minus the gap, and its normal the direction of the
    support search, within the face-over-edge preference (EDGE_REL_TOL, EDGE_ABS_TOL x 50 mm). Measured: 38 of 40
    within 0.1 mm, normals within 0.999 where overlapping."""
    table, table_hulls = _table()
    rng = np.random.default_rng(11)
    P = 40
    ids = np.zeros((P, 2), np.int32)
    vec = np.zeros((P, 4, 3), np.float32)
    rot = np.zeros((P, 2, 3, 3), np.float32)
    gaps = rng.uniform(-0.02, 0.005, P)
    for p in range(P):
        ha, sa, Va = _polytope(rng, table_hulls)
        hb, sb, Vb = _polytope(rng, table_hulls)
        Ra, Rb = random_rotation(rng), random_rotation(rng)
        d = rng.normal(size=3)
        d /= np.linalg.norm(d)
        t = _place_at_gap(_support(Va, np.zeros(3), Ra), lambda t: _support(Vb, t * d, Rb), d, gaps[p], rng)
        ids[p] = ha, hb
        vec[p] = sa, np.zeros(3), sb, t * d
        rot[p] = Ra, Rb
    depth = np.zeros(P, np.float32)
    normal = np.zeros((P, 3), np.float32)
    count = np.zeros(P, np.int32)
    _polytopes(table, ids, vec, rot, depth, normal, count)
    from app.sim.manifold import EDGE_ABS_TOL, EDGE_REL_TOL
    for p in range(P):
        g, u = reference_gap(_support(table_hulls[ids[p, 0]].vertices * vec[p, 0], vec[p, 1], rot[p, 0]),
                             _support(table_hulls[ids[p, 1]].vertices * vec[p, 2], vec[p, 3], rot[p, 1]), rng)
        assert count[p] >= 1, p
        tol = (1 - EDGE_REL_TOL) * abs(g) + EDGE_ABS_TOL * 0.05 + 2e-5
        assert depth[p] == pytest.approx(-g, abs=tol), p
        if g < 0 and abs(depth[p] + g) < 1e-4:   # overlapping, the same axis: the same direction (apart, the
            # separating axes bound the gap from below, and the nearest points need not lie on one of them)
            assert float(normal[p] @ u) > 0.999, p


def test_polytope_beside_a_static_triangle_gets_no_contact(arch):
    """A static triangle (zero thickness, no edge axes: app.scene.hull.triangle_hull) against random hulls and boxes
    placed all around it, over and beside it, above and below its plane, either as the pair's first or second body:
    a body the support search finds apart from it (by 2 mm) gets no penetrating point (a body beside the triangle and
    below the plane of its face overlaps it on every axis the pair tests, and once got points as deep as its
    distance below that plane, tens of mm), and one that overlaps it gets a contact. (Overlapping, the depth is
    along the face normal, which can exceed the shortest way out, off an edge: the mesh's internal edges push
    nothing sideways.)"""
    from app.scene.hull import triangle_hull

    rng = np.random.default_rng(5)
    tri = np.array([[0.0, 0.0, 0.0], [0.6, 0.15, 0.0], [0.1, -0.1, 0.5]])
    hull_t, centroid = triangle_hull(*tri)
    hulls = [hull_of(rng.normal(size=(12, 3)) * [0.12, 0.08, 0.1])[0] for _ in range(2)]
    table = HullTable(16)
    table.write(hulls + [hull_t])
    table_hulls = [box_hull()] + hulls + [hull_t]
    t_id = len(table_hulls) - 1
    n = np.cross(tri[1] - tri[0], tri[2] - tri[0])
    n /= np.linalg.norm(n)
    P = 80
    ids = np.zeros((P, 2), np.int32)
    vec = np.zeros((P, 4, 3), np.float32)
    rot = np.zeros((P, 2, 3, 3), np.float32)
    for p in range(P):
        h, sc, _V = _polytope(rng, table_hulls[:-1])
        # over or beside the triangle (barycentric -0.4 .. 1.4), -60 .. +60 mm from its plane
        w = rng.uniform(-0.4, 1.4, 2)
        pos = tri[0] + w[0] * (tri[1] - tri[0]) + w[1] * (tri[2] - tri[0]) * 0.5 + n * rng.uniform(-0.06, 0.06)
        body = (h, sc, pos, random_rotation(rng))
        flat = (t_id, np.ones(3), centroid, np.eye(3))
        a, b = (body, flat) if p % 2 else (flat, body)
        ids[p] = a[0], b[0]
        vec[p] = a[1], a[2], b[1], b[2]
        rot[p] = a[3], b[3]
    depth = np.zeros(P, np.float32)
    normal = np.zeros((P, 3), np.float32)
    count = np.zeros(P, np.int32)
    _polytopes(table, ids, vec, rot, depth, normal, count)
    overlapping_over_face = 0
    for p in range(P):
        g, _u = reference_gap(_support(table_hulls[ids[p, 0]].vertices * vec[p, 0], vec[p, 1], rot[p, 0]),
                              _support(table_hulls[ids[p, 1]].vertices * vec[p, 2], vec[p, 3], rot[p, 1]), rng,
                              samples=1500, rounds=60)
        if g > 2e-3:   # apart: nothing, or a speculative point
            assert count[p] == 0 or depth[p] <= 0.0, (p, depth[p], g)
        if g < -2e-3:
            overlapping_over_face += 1
            assert count[p] >= 1 and depth[p] > 0.0, (p, g)
    assert overlapping_over_face >= 10


def test_poly_sphere_and_capsule_against_support_search(arch):
    """A sphere or a capsule against random hulls and boxes at reference gaps from -20 mm to +20 mm (apart, a sphere
    meets an edge or a vertex as often as a face): depth = -gap within 0.1 mm (capsules: the golden-section search's
    1e-4 of the segment), normal along the search's direction."""
    table, table_hulls = _table()
    rng = np.random.default_rng(5)
    P = 30
    ids = np.zeros(P, np.int32)
    vs = np.zeros((P, 4, 3), np.float32)
    vc = np.zeros((P, 5, 3), np.float32)
    rot = np.zeros((P, 3, 3), np.float32)
    gaps = rng.uniform(-0.02, 0.02, P)
    for p in range(P):
        h, s, V = _polytope(rng, table_hulls)
        R = random_rotation(rng)
        d = rng.normal(size=3)
        d /= np.linalg.norm(d)
        r = rng.uniform(0.05, 0.15)
        axis = rng.normal(size=3)
        axis *= rng.uniform(0.05, 0.2) / np.linalg.norm(axis)
        ts = _place_at_gap(_support(V, np.zeros(3), R), lambda t: (lambda u: t * d @ u + r), d, gaps[p], rng)
        tc = _place_at_gap(_support(V, np.zeros(3), R),
                           lambda t: (lambda u: t * d @ u + abs(axis @ u) + r), d, gaps[p], rng)
        ids[p] = h
        rot[p] = R
        vs[p] = s, np.zeros(3), ts * d, [r, 0, 0]
        vc[p] = s, np.zeros(3), tc * d - axis, tc * d + axis, [r, 0, 0]
    for kernel, vec in ((_poly_sphere, vs), (_capsule_poly, vc)):
        depth = np.zeros(P, np.float32)
        normal = np.zeros((P, 3), np.float32)
        count = np.zeros(P, np.int32)
        kernel(table, ids, vec, rot, depth, normal, count)
        for p in range(P):
            V = table_hulls[ids[p]].vertices * vec[p, 0]
            if kernel is _poly_sphere:
                other = (lambda c, r: (lambda u: c @ u + r))(vec[p, 2].astype(np.float64), float(vec[p, 3, 0]))
            else:
                a, b, r = vec[p, 2].astype(np.float64), vec[p, 3].astype(np.float64), float(vec[p, 4, 0])
                other = (lambda a, b, r: (lambda u: max(a @ u, b @ u) + r))(a, b, r)
            g, u = reference_gap(_support(V, vec[p, 1], rot[p]), other, rng)
            assert count[p] >= 1, p
            assert depth[p] == pytest.approx(-g, abs=1e-4), p
            n = normal[p] if kernel is _poly_sphere else -normal[p]   # (capsule-poly: from the capsule)
            assert float(n @ u) > 0.99, p


CUBE = [[x, y, z] for x in (-0.1, 0.1) for y in (-0.1, 0.1) for z in (-0.1, 0.1)]


def _slide_scene(shape):
    body = {"shape": "box", "half_extents": [0.1, 0.1, 0.1]} if shape == "box" else \
        {"shape": "convex", "vertices": CUBE}
    return scene_from_dict({
        "name": "slide", "sim": {"dt": 0.002, "substeps": 1},
        "materials": {"m": {"density": 500, "friction": 0.4, "restitution": 0.0}},
        "static": [{"type": "plane", "normal": [0, 1, 0], "offset": 0, "material": "m"}],
        "bodies": [dict(body, position=[0, 0.1, 0], velocity=[2.0, 0, 0], material="m"),
                   dict(body, position=[1, 0.35, 0], orientation=[0.9, 0.3, 0.2, 0.1], material="m")]})


def test_box_as_hull_slides_and_rests_as_the_box(arch):
    """A box given as the hull of its 8 corners: the same mass, the same sliding distance (v0^2 / (2 mu g) = 0.51 m)
    and the same rest pose after a tumbling drop as the box shape, side by side."""
    from app.sim import Simulation
    out = {}
    for shape in ("box", "convex"):
        scene = _slide_scene(shape)
        sim = Simulation(scene, verbose=False)
        for _ in range(800):
            sim.step()
        out[shape] = (sim.positions().astype(np.float64), sim.velocities(), sim.model.body_mass.to_numpy()[:2])
    (pb, vb, mb), (ph, vh, mh) = out["box"], out["convex"]
    assert mh == pytest.approx(mb, rel=1e-6)
    assert pb[0, 0] == pytest.approx(4.0 / (2 * 0.4 * 9.81), rel=0.02)
    assert ph[0, 0] == pytest.approx(pb[0, 0], abs=2e-3)
    assert ph[1] == pytest.approx(pb[1], abs=5e-3)
    assert ph[1, 1] == pytest.approx(0.1, abs=1e-3)   # resting on a face
    assert np.abs(vh).max() < 1e-2 and np.abs(vb).max() < 1e-2


def _convex_scene(**body):
    return {"name": "t", "materials": {"m": {}}, "bodies": [dict({"shape": "convex", "position": [0, 1, 0],
                                                                "material": "m"}, **body)]}


@pytest.mark.parametrize("body, message", [
    ({"vertices": [[0, 0, 0], [1, 0, 0], [0, 1, 0]]}, "bodies[0].vertices: expected a list of at least 4 points"),
    ({"vertices": [[0, 0, 0], [1, 0, 0], [0, 1, 0], [1, 1, 0]]}, "coplanar"),
    ({"vertices": CUBE, "mesh": "x.obj"}, "either vertices"),
    ({}, "either vertices"),
    ({"vertices": CUBE, "radius": 1.0}, "no radius on a convex shape"),
    ({"mesh": "missing.obj"}, "does not exist"),
])
def test_convex_keys_are_checked(body, message):
    with pytest.raises(UserError, match=message.replace("[", r"\[").replace("]", r"\]")):
        scene_from_dict(_convex_scene(**body))


def test_obj_meshes(tmp_path):
    """mesh: file.obj, relative to the scene's folder: a convex mesh loads (its hull's volume), a non-convex one, a
    malformed line or a face naming a missing vertex fail naming the file and the reason."""
    from app.scene import load_scene
    cube = "".join(f"v {x} {y} {z}\n" for x, y, z in CUBE)
    quads = [(1, 2, 4, 3), (5, 7, 8, 6), (1, 5, 6, 2), (3, 4, 8, 7), (1, 3, 7, 5), (2, 6, 8, 4)]
    faces = "".join("f " + " ".join(map(str, q)) + "\n" for q in quads)
    (tmp_path / "cube.obj").write_text(cube + faces)
    # an L-shaped prism: convex hull 25% larger than the mesh
    L = [(0, 0), (2, 0), (2, 1), (1, 1), (1, 2), (0, 2)]
    v = "".join(f"v {x} {y} {z}\n" for z in (0, 1) for x, y in L)
    f = "f 6 5 4 3 2 1\nf 7 8 9 10 11 12\n" + "".join(f"f {k + 1} {(k + 1) % 6 + 1} {(k + 1) % 6 + 7} {k + 7}\n"
                                                          for k in range(6))
    (tmp_path / "ell.obj").write_text(v + f)
    (tmp_path / "bad.obj").write_text("v 0 0 0\nv 1 0\n")
    (tmp_path / "hole.obj").write_text(cube + "f 1 2 9\n")
    scene = tmp_path / "s.yaml"
    for name, message in (("cube.obj", None), ("ell.obj", "a convex mesh: vertices lie on both sides"), ("bad.obj", "line 2"),
                          ("hole.obj", "line 9")):
        scene.write_text(f"name: t\nmaterials: {{m: {{}}}}\nbodies:\n  - {{shape: convex, mesh: {name}, "
                         f"position: [0, 1, 0], material: m}}\n")
        if message is None:
            s = load_scene(str(scene))
            assert s.hulls[0].volume == pytest.approx(0.008, rel=1e-9)
        else:
            with pytest.raises(UserError, match=message) as e:
                load_scene(str(scene))
            assert str(scene) in str(e.value) and name in str(e.value)


def _ramp_obj(path, angle):
    """A 4 x 2 m ramp of two triangles, tilted `angle` (rad) about z (down towards +x), through the origin."""
    c, s = np.cos(angle), np.sin(angle)
    pts = [(-2 * c, 2 * s, -1), (2 * c, -2 * s, -1), (2 * c, -2 * s, 1), (-2 * c, 2 * s, 1)]
    path.write_text("".join(f"v {x} {y} {z}\n" for x, y, z in pts) + "f 1 4 3\nf 1 3 2\n")


def test_sphere_rolls_down_a_static_mesh_and_a_box_rests_on_a_heightfield(arch, tmp_path):
    """A static OBJ mesh (two triangles, 20 degrees): a sphere rolls down it at 5/7 g sin(theta) (within 1%, from
    its speed after 0.6 s), meeting triangle faces and the diagonal edge between them. A heightfield with a flat
    part: a box lands and rests at its half height, and a sphere dropped on its 0.5 m plateau rests on it."""
    from app.scene import load_scene
    from app.sim import Simulation
    theta = np.radians(20.0)
    _ramp_obj(tmp_path / "ramp.obj", theta)
    n = np.array([np.sin(theta), np.cos(theta), 0.0])
    start = np.array([-1.2 * np.cos(theta), 1.2 * np.sin(theta), 0.0]) + 0.1 * n
    (tmp_path / "ramp.yaml").write_text(
        "name: ramp\nsim: {dt: 0.001, substeps: 1}\nmaterials: {m: {friction: 0.8, restitution: 0.0}}\n"
        "static: [{type: mesh, file: ramp.obj, material: m}]\n"
        f"bodies: [{{shape: sphere, radius: 0.1, position: [{start[0]}, {start[1]}, {start[2]}], material: m}}]\n")
    scene = load_scene(str(tmp_path / "ramp.yaml"))
    assert scene.body_count == 3 and scene.bodies["fixed"][1:].all()   # the sphere, then the two triangles
    sim = Simulation(scene, verbose=False)
    for _ in range(600):
        sim.step()
    v = sim.velocities()[0]
    assert np.linalg.norm(v) == pytest.approx(5.0 / 7.0 * 9.81 * np.sin(theta) * 0.6, rel=0.01)
    assert abs(float((sim.positions()[0] - start) @ n)) < 1e-3   # on the surface all the way
    heights = [[0.0, 0.0, 0.0, 0.5, 0.5]] * 5   # flat, a 26.6 degree slope, a plateau 0.5 m up (x >= 0.75)
    scene = scene_from_dict({
        "name": "field", "sim": {"dt": 0.002, "substeps": 1}, "materials": {"m": {"restitution": 0.0}},
        "static": [{"type": "heightfield", "heights": heights, "size": [3, 3], "center": [0, 0, 0],
                    "material": "m"}],
        "bodies": [{"shape": "box", "half_extents": [0.2, 0.1, 0.15], "position": [-0.7, 0.3, -0.3],
                    "material": "m"},
                   {"shape": "sphere", "radius": 0.1, "position": [1.1, 0.7, 0.2], "material": "m"}]})
    sim = Simulation(scene, verbose=False)
    for _ in range(500):
        sim.step()
    p = sim.positions()
    assert p[0, 1] == pytest.approx(0.1, abs=1e-3) and np.abs(sim.velocities()[:2]).max() < 1e-2
    assert p[1, 1] == pytest.approx(0.6, abs=1e-3)


@pytest.mark.parametrize("entry, message", [
    ({"type": "heightfield", "heights": [[0, 0], [0]], "size": [1, 1], "material": "m"}, "rows of heights"),
    ({"type": "heightfield", "heights": [[0, 0], [0, 0]], "size": [1, -1], "material": "m"}, r"size\[1\]"),
    ({"type": "mesh", "file": "none.obj", "material": "m"}, "does not exist"),
])
def test_static_mesh_keys_are_checked(entry, message):
    with pytest.raises(UserError, match=message):
        scene_from_dict({"name": "t", "materials": {"m": {}}, "static": [entry],
                         "bodies": [{"shape": "sphere", "radius": 0.1, "position": [0, 1, 0], "material": "m"}]})


def test_static_mesh_files_are_checked(tmp_path):
    """A degenerate triangle, an edge of three triangles, a mesh without faces: one line naming the file and why."""
    from app.scene import load_scene
    quad = "v 0 0 0\nv 1 0 0\nv 1 0 1\nv 0 0 1\nv 0 1 0\n"
    for name, text, message in (("flat.obj", quad + "f 1 2 2\n", "zero area"),
                                ("fan.obj", quad + "f 1 2 3\nf 2 1 4\nf 1 2 5\n", "non-manifold"),
                                ("points.obj", quad, "no faces")):
        (tmp_path / name).write_text(text)
        (tmp_path / "s.yaml").write_text(
            f"name: t\nmaterials: {{m: {{}}}}\nstatic: [{{type: mesh, file: {name}, material: m}}]\n"
            "bodies: [{shape: sphere, radius: 0.1, position: [0, 1, 0], material: m}]\n")
        with pytest.raises(UserError, match=message) as e:
            load_scene(str(tmp_path / "s.yaml"))
        assert name in str(e.value) and "static[0].file" in str(e.value)


@pytest.mark.parametrize("two_sided", [True, False])
def test_one_sided_meshes_let_bodies_through_from_behind(arch, two_sided):
    """A horizontal heightfield 1 m up: a sphere rising into it from below stops under it when the field is two-sided
    (its back faces push), and passes through when it is one-sided (`two_sided: false`); from above, both hold a
    sphere dropped on them."""
    from app.sim import Simulation
    scene = scene_from_dict({
        "name": "sides", "sim": {"dt": 0.002, "substeps": 1, "gravity": [0, 0, 0]},
        "materials": {"m": {"restitution": 0.0}},
        "static": [{"type": "heightfield", "heights": [[1.0] * 3] * 3, "size": [2, 2], "material": "m",
                    "two_sided": two_sided}],
        "bodies": [{"shape": "sphere", "radius": 0.1, "position": [0.2, 0.5, 0.1], "velocity": [0, 2, 0],
                    "material": "m"},
                   {"shape": "sphere", "radius": 0.1, "position": [-0.3, 1.5, 0.2], "velocity": [0, -2, 0],
                    "material": "m"}]})
    sim = Simulation(scene, verbose=False)
    for _ in range(500):
        sim.step()
    p = sim.positions()
    assert p[1, 1] == pytest.approx(1.1, abs=1e-3)   # from above: held on the front faces
    if two_sided:
        assert p[0, 1] == pytest.approx(0.9, abs=1e-3)   # from below: held by the back faces
    else:
        assert p[0, 1] > 2.0   # through, still rising at 2 m/s
