"""Capsules: contact geometry against dense sampling in numpy, mass properties against a voxel integration, and the
scene keys' checks. The physics of capsules in motion is in test_physics.py."""
import numpy as np
import pytest

ti = pytest.importorskip("taichi")

from app.errors import UserError  # noqa: E402
from app.runtime import taichi_options  # noqa: E402
from manifold_probe import random_rotation, store_manifold  # noqa: E402  (tests/sim, on the path)
from app.scene import SHAPE_CAPSULE, scene_from_dict  # noqa: E402
from app.scene.schema import body_mass_properties  # noqa: E402
from app.sim.capsule import PARALLEL_SIN  # noqa: E402
from app.sim.narrowphase import collide_capsule_box, collide_capsule_capsule  # noqa: E402

# Dense sampling: 2,001 points along each segment. The sampled minimum distance exceeds the true one by at most
# (segment length / 2,000)^2 / 8 / distance-ish for a smooth minimum, and by half a sample spacing times the sine of
# the angle at an end: with segments of at most 1 m, 2.5e-4 m bounds both. The kernel works in float32 (1e-6
# relative on coordinates of about 1 m) and its golden-section search stops at 1e-4 of the segment (capsule-box:
# the depth error is second order in it, or first order times the sine of the segment's angle to the face, 1e-4 m).
SAMPLES = 2001
DEPTH_TOL_M = 4e-4
NORMAL_TOL = 2e-2   # |n - n_ref| where the closest points are well apart (distance > 5 cm)


@pytest.fixture(scope="module")
def arch():
    ti.init(arch=ti.cpu, log_level=ti.WARN, **taichi_options("cpu"))
    yield


@ti.kernel
def _capsules(seg: ti.types.ndarray(), radii: ti.types.ndarray(), depth: ti.types.ndarray(),
              normal: ti.types.ndarray(), count: ti.types.ndarray()):
    for p in range(seg.shape[0]):
        a0 = ti.Vector([seg[p, 0, 0], seg[p, 0, 1], seg[p, 0, 2]])
        a1 = ti.Vector([seg[p, 1, 0], seg[p, 1, 1], seg[p, 1, 2]])
        b0 = ti.Vector([seg[p, 2, 0], seg[p, 2, 1], seg[p, 2, 2]])
        b1 = ti.Vector([seg[p, 3, 0], seg[p, 3, 1], seg[p, 3, 2]])
        m = collide_capsule_capsule(a0, a1, radii[p, 0], b0, b1, radii[p, 1], 10.0)
        store_manifold(m, p, depth, normal, count)


@ti.kernel
def _capsule_box(seg: ti.types.ndarray(), rc: ti.types.ndarray(), box: ti.types.ndarray(), rot: ti.types.ndarray(),
                 depth: ti.types.ndarray(), normal: ti.types.ndarray(), count: ti.types.ndarray()):
    for p in range(seg.shape[0]):
        a = ti.Vector([seg[p, 0, 0], seg[p, 0, 1], seg[p, 0, 2]])
        b = ti.Vector([seg[p, 1, 0], seg[p, 1, 1], seg[p, 1, 2]])
        pb = ti.Vector([box[p, 0, 0], box[p, 0, 1], box[p, 0, 2]])
        h = ti.Vector([box[p, 1, 0], box[p, 1, 1], box[p, 1, 2]])
        R = ti.Matrix.zero(ti.f32, 3, 3)
        for r, c in ti.static(ti.ndrange(3, 3)):
            R[r, c] = rot[p, r, c]
        m = collide_capsule_box(a, b, rc[p], pb, R, h, 10.0)
        store_manifold(m, p, depth, normal, count)


def _segment_points(a, b, n=SAMPLES):
    t = np.linspace(0.0, 1.0, n)[:, None]
    return a[None] + t * (b - a)[None]


def _box_sdf(x, h):
    """Signed distance of local points x (N, 3) to the box of half extents h: exact, in float64."""
    q = np.abs(x) - h
    return np.linalg.norm(np.maximum(q, 0.0), axis=1) + np.minimum(q.max(axis=1), 0.0)


def test_capsule_capsule_depth_and_normal_match_dense_sampling(arch):
    rng = np.random.default_rng(3)
    n = 300
    seg = np.empty((n, 4, 3))
    for p in range(n):
        ca, cb = rng.uniform(-0.3, 0.3, 3), rng.uniform(-0.3, 0.3, 3)
        da, db = rng.normal(size=3), rng.normal(size=3)
        if p % 5 == 0:   # parallel and near-parallel pairs: the two-point manifolds
            db = da + rng.normal(size=3) * 0.02 * (p % 2)
        da *= rng.uniform(0.05, 0.5) / np.linalg.norm(da)
        db *= rng.uniform(0.05, 0.5) / np.linalg.norm(db)
        seg[p] = [ca - da, ca + da, cb - db, cb + db]
    radii = rng.uniform(0.02, 0.2, (n, 2))
    depth, normal, count = np.zeros(n, np.float32), np.zeros((n, 3), np.float32), np.zeros(n, np.int32)
    _capsules(seg.astype(np.float32), radii.astype(np.float32), depth, normal, count)
    two = 0
    for p in range(n):
        pa, pb = _segment_points(seg[p, 0], seg[p, 1]), _segment_points(seg[p, 2], seg[p, 3])
        d2 = ((pa[:, None, :] - pb[None, :, :]) ** 2).sum(-1)
        k = np.unravel_index(np.argmin(d2), d2.shape)
        dist = np.sqrt(d2[k])
        assert abs(depth[p] - (radii[p].sum() - dist)) < DEPTH_TOL_M, (p, depth[p], radii[p].sum() - dist)
        if dist > 0.05:
            ref = (pb[k[1]] - pa[k[0]]) / dist
            assert np.linalg.norm(normal[p] - ref) < NORMAL_TOL, (p, normal[p], ref)
        ua = (seg[p, 1] - seg[p, 0]) / np.linalg.norm(seg[p, 1] - seg[p, 0])
        ub = (seg[p, 3] - seg[p, 2]) / np.linalg.norm(seg[p, 3] - seg[p, 2])
        two += count[p] == 2
        if count[p] == 2:
            assert np.linalg.norm(np.cross(ua, ub)) < PARALLEL_SIN + 1e-6
    assert two >= 10, two


def test_capsule_box_depth_and_normal_match_dense_sampling(arch):
    rng = np.random.default_rng(5)
    n = 300
    seg = np.empty((n, 2, 3))
    box = np.empty((n, 2, 3))
    rot = np.empty((n, 3, 3))
    for p in range(n):
        box[p] = [rng.uniform(-0.2, 0.2, 3), rng.uniform(0.05, 0.4, 3)]
        rot[p] = random_rotation(rng)
        c = box[p, 0] + rng.uniform(-0.6, 0.6, 3)
        d = rng.normal(size=3)
        if p % 4 == 0:   # lying along a face: the two-point manifolds
            axis = rng.integers(3)
            d = rot[p] @ np.where(np.arange(3) == axis, 0.0, rng.normal(size=3))
        d *= rng.uniform(0.05, 0.5) / np.linalg.norm(d)
        seg[p] = [c - d, c + d]
    rc = rng.uniform(0.02, 0.2, n)
    depth, normal, count = np.zeros(n, np.float32), np.zeros((n, 3), np.float32), np.zeros(n, np.int32)
    _capsule_box(seg.astype(np.float32), rc.astype(np.float32), box.astype(np.float32), rot.astype(np.float32),
                 depth, normal, count)
    two = inside = 0
    for p in range(n):
        local = (_segment_points(seg[p, 0], seg[p, 1]) - box[p, 0]) @ rot[p]
        sdf = _box_sdf(local, box[p, 1])
        k = np.argmin(sdf)
        if sdf[k] >= 0.0:   # the segment outside the box: the depth is the radius less their distance
            assert abs(depth[p] - (rc[p] - sdf[k])) < DEPTH_TOL_M, (p, depth[p], rc[p] - sdf[k])
        else:   # inside: a two-point manifold measures its ends along its face's normal, never shallower
            assert depth[p] > rc[p] - sdf[k] - DEPTH_TOL_M, (p, depth[p], rc[p] - sdf[k])
            inside += 1
        if sdf[k] > 0.05:   # outside: the normal from the capsule towards the box is minus the closest point's
            x = local[k]
            ref = rot[p] @ -((x - np.clip(x, -box[p, 1], box[p, 1])) / sdf[k])
            assert np.linalg.norm(normal[p] - ref) < NORMAL_TOL, (p, normal[p], ref)
        two += count[p] == 2
    assert two >= 10 and n - inside >= 200, (two, inside)


def test_capsule_mass_properties_match_a_voxel_integration():
    # A capsule of radius r and half length hl along y, density 1000: mass and principal moments against a sum over
    # a 160^3 grid of cells inside its bounding box (the cells' own inertia included: 1/12 of a cell's side^2 each way).
    r, hl, rho = 0.1, 0.25, 1000.0
    bodies = {"shape": np.array([SHAPE_CAPSULE], np.int32), "radius": np.array([r]),
              "half_extents": np.array([[r, hl + r, r]]), "material": np.array([0], np.int32),
              "fixed": np.array([False])}
    mass, _inv_mass, _inv_inertia, inertia = body_mass_properties(bodies, [{"density": rho}])
    n = 160
    ex = np.array([r, hl + r, r])
    axes = [np.linspace(-e, e, n, endpoint=False) + e / n for e in ex]
    x, y, z = np.meshgrid(*axes, indexing="ij")
    inside = x ** 2 + z ** 2 + np.maximum(np.abs(y) - hl, 0.0) ** 2 <= r * r
    cell = np.prod(2 * ex / n)
    m = rho * cell * inside.sum()
    sides2 = (2 * ex / n) ** 2
    ixx = rho * cell * ((y ** 2 + z ** 2)[inside].sum()) + m * (sides2[1] + sides2[2]) / 12
    iyy = rho * cell * ((x ** 2 + z ** 2)[inside].sum()) + m * (sides2[0] + sides2[2]) / 12
    assert abs(mass[0] - m) < 5e-3 * m, (mass[0], m)
    assert np.allclose(inertia[0], [ixx, iyy, ixx], rtol=1e-2), (inertia[0], [ixx, iyy, ixx])


@pytest.mark.parametrize("body,key,words", [
    ({"shape": "capsule", "radius": 0.1}, "bodies[0].half_length", "this key"),
    ({"shape": "capsule", "radius": 0.1, "half_length": 0}, "bodies[0].half_length", "> 0"),
    ({"shape": "capsule", "half_length": 0.2}, "bodies[0].radius", "this key"),
    ({"shape": "capsule", "radius": 0.1, "half_length": 0.2, "half_extents": [1, 1, 1]}, "bodies[0].half_extents",
     "no half_extents on a capsule"),
    ({"shape": "capsule", "radius": 0.1, "half_length": 0.2, "axis": "w"}, "bodies[0].axis", "one of y | x | z"),
    ({"shape": "sphere", "radius": 0.1, "half_length": 0.2}, "bodies[0].half_length", "only capsules"),
    ({"shape": "box", "half_extents": [1, 1, 1], "axis": "x"}, "bodies[0].axis", "only capsules"),
])
def test_capsule_keys_are_checked(body, key, words):
    raw = {"name": "t", "materials": {"m": {"density": 1000}},
           "bodies": [{**body, "position": [0, 1, 0], "material": "m"}]}
    with pytest.raises(UserError) as e:
        scene_from_dict(raw)
    assert key in str(e.value) and words in str(e.value), str(e.value)


def test_capsule_axis_turns_the_segment():
    # axis: x lays the segment along world x (the local y axis turned there), whatever it was built along
    raw = {"name": "t", "materials": {"m": {"density": 1000}},
           "bodies": [{"shape": "capsule", "radius": 0.1, "half_length": 0.3, "axis": a, "position": [0, 1, 0],
                       "material": "m"} for a in ("x", "y", "z")]}
    scene = scene_from_dict(raw)
    for q, want in zip(scene.bodies["orientation"], np.eye(3)):
        w, x, y, z = q
        local_y = np.array([2 * (x * y - w * z), 1 - 2 * (x * x + z * z), 2 * (y * z + w * x)])
        assert np.allclose(np.abs(local_y), want, atol=1e-12), (q, local_y)


@pytest.mark.parametrize("body,key,words", [
    ({"fixed": True, "kinematic": True}, "bodies[0].kinematic", "not both fixed and kinematic"),
    ({"pivot": [0, 0, 0]}, "bodies[0].pivot", "only on a kinematic body"),
    ({"kinematic": "yes"}, "bodies[0].kinematic", "true or false"),
])
def test_kinematic_keys_are_checked(body, key, words):
    raw = {"name": "t", "materials": {"m": {"density": 1000}},
           "bodies": [{"shape": "sphere", "radius": 0.1, "position": [0, 1, 0], "material": "m", **body}]}
    with pytest.raises(UserError) as e:
        scene_from_dict(raw)
    assert key in str(e.value) and words in str(e.value), str(e.value)
