"""A contact manifold: up to 4 points of one pair sharing a normal, as every collide_* function of the narrowphase
(app.sim.narrowphase, app.sim.convex) fills it, and which plane contacts a container wall accepts."""
import taichi as ti

vec3 = ti.types.vector(3, ti.f32)

# A plane row's clip offset and thickness when it has none (floors, ramps: app.sim.model.plane_rows).
NO_CLIP = 3.0e38

# Polytope pairs (box-box, hulls) prefer a face axis over an edge axis unless the edge separates clearly more:
# relative and absolute tolerances (fractions of the separation / of the smallest half size). Without the bias,
# nearly parallel resting boxes flip between face and edge manifolds from step to step.
EDGE_REL_TOL = 0.95
EDGE_ABS_TOL = 0.01

Manifold = ti.types.struct(count=ti.i32, normal=vec3, point=ti.types.matrix(4, 3, ti.f32),
                           depth=ti.types.vector(4, ti.f32), feature=ti.types.vector(4, ti.i32), size=ti.f32)
"""Up to 4 contact points sharing one normal. For pairs the normal points from body i towards body j; for
planes it is the plane normal. Every collide_* function fills one; a single emit loop per kernel appends
them, so the storage's append is inlined in few places (compile time). size (m): the smaller half-size of the
pair (sphere radius, a box's smallest half extent), which penetration is measured against (diagnostics);
_pair_manifold sets it from the sizes it loaded anyway."""


@ti.func
def manifold_empty():
    return Manifold(count=0, normal=vec3(0.0, 1.0, 0.0), point=ti.Matrix.zero(ti.f32, 4, 3),
                    depth=ti.Vector.zero(ti.f32, 4), feature=ti.Vector.zero(ti.i32, 4), size=1.0)


@ti.func
def manifold_add(m: ti.template(), point, depth, feature):
    if m.count < 4:
        for d in ti.static(range(3)):
            m.point[m.count, d] = point[d]
        m.depth[m.count] = depth
        m.feature[m.count] = feature
        m.count += 1


@ti.func
def plane_accepts(model: ti.template(), k, point, depth, centre_behind, radius):
    """Container walls: only points below the top and not deeper than the wall's thickness, and only while the
    body's centre is less than half its bounding radius `radius` behind the wall plane (centre_behind m,
    positive behind). A body whose centre is further behind came from outside, over the top: it is left
    there rather than pushed back in through the wall (the thickness alone, 4 of the largest bounding radii, let
    a body that came down just outside a wall be pushed in through it: default.yaml, 370 mm "deep"). From inside,
    a centre crosses the plane only after a penetration deeper than the body's radius, far more than a body
    moves in a step. Planes that are not walls (floors, ramps) have no thickness: what sinks into them is always
    pushed out."""
    ok = (depth <= model.plane_thickness[k]) and (model.plane_clip_normal[k].dot(point) <= model.plane_clip_offset[k])
    if model.plane_thickness[k] < NO_CLIP:
        ok = ok and centre_behind < 0.5 * radius
    return ok
