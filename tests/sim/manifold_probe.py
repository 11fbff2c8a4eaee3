"""Helpers of the contact geometry tests (tests/sim/test_capsule.py, test_convex.py): reading a contact manifold
out of a test kernel, and random rotations."""
import numpy as np
import taichi as ti


@ti.func
def store_manifold(m, p, depth: ti.template(), normal: ti.template(), count: ti.template()):
    """Manifold m's point count, deepest depth and normal into row p of the result arrays."""
    count[p] = m.count
    deepest = -1e30
    for q in range(m.count):
        deepest = ti.max(deepest, m.depth[q])
    depth[p] = deepest
    for d in ti.static(range(3)):
        normal[p, d] = m.normal[d]


def random_rotation(rng):
    """A uniformly random rotation matrix (3, 3), float64, from a normalised Gaussian quaternion."""
    q = rng.normal(size=4)
    q /= np.linalg.norm(q)
    w, x, y, z = q
    return np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
                     [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
                     [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)]])
