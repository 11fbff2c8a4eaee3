"""Small @ti.func helpers for quaternions (w, x, y, z) and rotations, shared by the physics modules."""
import taichi as ti

vec3 = ti.types.vector(3, ti.f32)
mat3 = ti.types.matrix(3, 3, ti.f32)


@ti.func
def quat_to_mat(q):
    """Rotation matrix (columns = body axes in world) of a unit quaternion q = (w, x, y, z)."""
    w, x, y, z = q[0], q[1], q[2], q[3]
    return ti.Matrix([
        [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
        [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
        [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
    ], dt=ti.f32)


@ti.func
def quat_mul(a, b):
    return ti.Vector([
        a[0] * b[0] - a[1] * b[1] - a[2] * b[2] - a[3] * b[3],
        a[0] * b[1] + a[1] * b[0] + a[2] * b[3] - a[3] * b[2],
        a[0] * b[2] - a[1] * b[3] + a[2] * b[0] + a[3] * b[1],
        a[0] * b[3] + a[1] * b[2] - a[2] * b[1] + a[3] * b[0],
    ], dt=ti.f32)


@ti.func
def sign_nz(x):
    """+1 for x >= 0, -1 otherwise (never 0: a support point must pick a corner)."""
    return 1.0 if x >= 0 else -1.0


@ti.func
def world_inv_inertia(q, inv_inertia_body):
    """R diag(inv_inertia_body) R^T, 1/(kg m^2)."""
    R = quat_to_mat(q)
    D = ti.Matrix([[inv_inertia_body[0], 0.0, 0.0], [0.0, inv_inertia_body[1], 0.0], [0.0, 0.0, inv_inertia_body[2]]],
                  dt=ti.f32)
    return R @ D @ R.transpose()
