"""Small @ti.func helpers for quaternions (w, x, y, z) and rotations, shared by the physics modules."""
import taichi as ti

vec3 = ti.types.vector(3, ti.f32)
mat3 = ti.types.matrix(3, 3, ti.f32)


@ti.func
def quat_to_mat(q):
    """Rotation matrix (columns = body axes in world) of a unit quaternion q = (w, x, y, z)."""
    return quat_to_mat_as(q, ti.f32)


@ti.func
def quat_to_mat_as(q, dtype: ti.template()):
    """quat_to_mat in `dtype` (ti.f32 or ti.f64)."""
    w, x, y, z = q[0], q[1], q[2], q[3]
    return ti.Matrix([
        [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
        [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
        [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
    ], dt=dtype)


@ti.func
def quat_mul(a, b):
    return quat_mul_as(a, b, ti.f32)


@ti.func
def quat_mul_as(a, b, dtype: ti.template()):
    """The quaternion product a b in `dtype` (ti.f32 or ti.f64)."""
    return ti.Vector([
        a[0] * b[0] - a[1] * b[1] - a[2] * b[2] - a[3] * b[3],
        a[0] * b[1] + a[1] * b[0] + a[2] * b[3] - a[3] * b[2],
        a[0] * b[2] - a[1] * b[3] + a[2] * b[0] + a[3] * b[1],
        a[0] * b[3] + a[1] * b[2] - a[2] * b[1] + a[3] * b[0],
    ], dt=dtype)


@ti.func
def sign_nz(x):
    """+1 for x >= 0, -1 otherwise (never 0: a support point must pick a corner)."""
    return 1.0 if x >= 0 else -1.0


@ti.func
def diag3(d):
    """The 3x3 f32 matrix diag(d)."""
    return ti.Matrix([[d[0], 0.0, 0.0], [0.0, d[1], 0.0], [0.0, 0.0, d[2]]], dt=ti.f32)


@ti.func
def world_inv_inertia(R, inv_inertia_body):
    """R diag(inv_inertia_body) R^T, 1/(kg m^2), for the body orientation R (quat_to_mat)."""
    return R @ diag3(inv_inertia_body) @ R.transpose()


@ti.func
def contact_tangents(n):
    """Two unit tangents (t1, t2) that with the unit normal n form an orthonormal basis, such that the basis
    of -n is exactly (-t1, t2) bit for bit. A pair contact is stored in both bodies' lists with mirrored
    normals, and each copy keeps its friction impulse as coordinates in its own basis: this symmetry makes
    the two copies' impulses exact negatives (Newton's third law without rounding).

    Method: flip n to a canonical hemisphere (y > 0, ties broken on x, then z; s = +-1 is the flip), build
    the branchless basis of Duff et al., "Building an Orthonormal Basis, Revisited" (JCGT 2017) for s n, and
    return (s u1, u2). The basis jumps where the canonical side changes; callers keep a basis within one step
    and carry impulses across steps in 3-D (the warm start re-expresses them)."""
    flip = n[1] < 0.0 or (n[1] == 0.0 and (n[0] < 0.0 or (n[0] == 0.0 and n[2] < 0.0)))
    s = ti.select(flip, -1.0, 1.0)
    m = s * n
    sz = ti.select(m[2] >= 0.0, 1.0, -1.0)
    a = -1.0 / (sz + m[2])
    b = m[0] * m[1] * a
    u1 = vec3(1.0 + sz * m[0] * m[0] * a, sz * b, -sz * m[0])
    u2 = vec3(b, sz + m[1] * m[1] * a, -m[1])
    return s * u1, u2


@ti.func
def tangent_coords(v, t1, t2):
    """Coordinates (vec2) of the in-plane vector v along the tangents (t1, t2) of contact_tangents."""
    return ti.Vector([v.dot(t1), v.dot(t2)])


@ti.func
def tangent_vector(c, t1, t2):
    """The vector with coordinates c (vec2) along the tangents (t1, t2): inverse of tangent_coords."""
    return c[0] * t1 + c[1] * t2


# A unit normal in one 32-bit word: octahedral coordinates (Cigolle et al., "A Survey of Efficient
# Representations for Independent Unit Vectors", JCGT 2014) as two 16-bit signed integers (x in the low
# half). Worst angular error 6.4e-5 rad (2M random normals); the six axis directions come back exactly. A
# contact record stores its normal so (app.sim.contacts), 8 bytes less than a vec3: the Jacobi iterations stream
# every record from memory each pass (H200, landed pile_1m: 56 -> 48-byte records, one iteration 0.747 ->
# 0.716 ms with the vla storage, 0.99 -> 0.92 ms with padded, which loads each member on its own).
NORMAL_CODE_SCALE = 32767.0


@ti.func
def encode_normal(n):
    """The i32 code of the unit vec3 n (see NORMAL_CODE_SCALE). A NaN normal has no code (it comes out as some
    direction): one comes only from a NaN pose, which the health check reports through the contact's point and
    the bodies' state."""
    inv_l1 = 1.0 / (ti.abs(n[0]) + ti.abs(n[1]) + ti.abs(n[2]))
    px = n[0] * inv_l1
    py = n[1] * inv_l1
    if n[2] < 0.0:   # the lower hemisphere folds over the diagonals
        fx = (1.0 - ti.abs(py)) * sign_nz(px)
        fy = (1.0 - ti.abs(px)) * sign_nz(py)
        px = fx
        py = fy
    qx = ti.cast(ti.round(ti.math.clamp(px, -1.0, 1.0) * NORMAL_CODE_SCALE), ti.i32)
    qy = ti.cast(ti.round(ti.math.clamp(py, -1.0, 1.0) * NORMAL_CODE_SCALE), ti.i32)
    return (qx & 0xFFFF) | (qy << 16)


@ti.func
def decode_normal(code):
    """The unit vec3 of an encode_normal code."""
    px = ti.cast((code << 16) >> 16, ti.f32) / NORMAL_CODE_SCALE   # (arithmetic shifts: sign-extended halves)
    py = ti.cast(code >> 16, ti.f32) / NORMAL_CODE_SCALE
    z = 1.0 - ti.abs(px) - ti.abs(py)
    x = px
    y = py
    if z < 0.0:
        x = (1.0 - ti.abs(py)) * sign_nz(px)
        y = (1.0 - ti.abs(px)) * sign_nz(py)
    v = vec3(x, y, z)
    return v / ti.sqrt(v.dot(v))
