"""Reading a contact manifold out of a test kernel (tests/sim/test_capsule.py, test_convex.py)."""
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
