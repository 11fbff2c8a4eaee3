"""Viewer kernels: sphere particles, box instance transforms and contact glyphs, filled on the device from the State.

Spheres are GGUI particles (impostors: a sphere shaded per pixel from one point), one draw for all of them with a
colour and a radius each; a capsule is an instanced cylinder and two such particles at its ends. Boxes and the
capsules' cylinders are instanced meshes, and GGUI's ``scene.mesh_instance`` takes one colour per call,
so they are drawn in colour buckets: every frame a counting sort on the device orders the bodies by key = shape *
COLOR_BUCKETS + bucket (bucket: material, contact count or sleep state) and writes each body's 4x4 transform into
its slot; the host then issues one ``mesh_instance`` call per non-empty box or capsule bucket. The only per-frame
read-back is the bucket counts (SHAPE_KINDS * COLOR_BUCKETS int32), never the bodies.

Kernels read the simulator's fields (state.body_pos, state.body_quat, model.body_half_extents,
model.body_shape, model.body_material, the contact lists) and write only the viewer's own fields.
"""
import taichi as ti

from app.scene.schema import SHAPE_CAPSULE, SHAPE_CONVEX, SHAPE_SPHERE
from app.sim.contacts import first_copy, record_normal
from app.sim.math3d import quat_to_mat
from app.sim.state import asleep_by_time

vec3 = ti.types.vector(3, ti.f32)

CONTACT_RAMP_TOP = 6  # contact-count buckets 0..6 (6 = six or more); matches render_meshes.CONTACT_RAMP


@ti.kernel
def kernel_keys_material(body_shape: ti.template(), body_material: ti.template(), body_count: ti.i32,
                         buckets: ti.i32, body_key: ti.template()):
    """body_key[i] = shape * buckets + material mod buckets."""
    for i in range(body_count):
        body_key[i] = body_shape[i] * buckets + body_material[i] % buckets


@ti.kernel
def kernel_keys_contacts(body_shape: ti.template(), lists: ti.template(), list_base: ti.i32, body_count: ti.i32,
                         buckets: ti.i32, body_key: ti.template()):
    """body_key[i] = shape * buckets + min(contacts in body i's list, CONTACT_RAMP_TOP)."""
    for i in range(body_count):
        body_key[i] = body_shape[i] * buckets + ti.min(lists.length(list_base + i), CONTACT_RAMP_TOP)


@ti.kernel
def kernel_keys_sleep(body_shape: ti.template(), model: ti.template(), state: ti.template(), body_count: ti.i32,
                      buckets: ti.i32, body_key: ti.template()):
    """body_key[i] = shape * buckets + (1 if body i sleeps else 0) (app.sim.state.asleep_by_time)."""
    for i in range(body_count):
        body_key[i] = body_shape[i] * buckets + ti.select(asleep_by_time(model, state, i), 1, 0)


@ti.kernel
def kernel_keys_speed(body_shape: ti.template(), body_vel: ti.template(), body_count: ti.i32, buckets: ti.i32,
                      edges: ti.template(), body_key: ti.template()):
    """body_key[i] = shape * buckets + the number of speed edges (m/s, ascending) that |v| of body i reaches."""
    for i in range(body_count):
        s = body_vel[i].norm()
        b = 0
        for k in range(edges.shape[0]):
            if s >= edges[k]:
                b = k + 1
        body_key[i] = body_shape[i] * buckets + b


@ti.kernel
def kernel_sphere_particles(body_key: ti.template(), body_shape: ti.template(), body_pos: ti.template(),
                            body_quat: ti.template(), body_half_extents: ti.template(), body_count: ti.i32,
                            radius_scale: ti.f32, bucket_color: ti.template(), buckets: ti.i32,
                            sphere_count: ti.template(), center: ti.template(), radius: ti.template(),
                            color: ti.template()):
    """The spheres, and both ends of each capsule, as particles: centre (m), radius (m, times radius_scale: see
    app.viewer.render.Renderer) and colour (bucket_color of the body's key), packed in the first sphere_count[None]
    entries (in no particular order: each is drawn on its own)."""
    sphere_count[None] = 0
    for i in range(body_count):
        if body_shape[i] == SHAPE_SPHERE:
            s = ti.atomic_add(sphere_count[None], 1)
            center[s] = body_pos[i]
            radius[s] = body_half_extents[i][0] * radius_scale
            color[s] = bucket_color[body_key[i] % buckets]
        elif body_shape[i] == SHAPE_CAPSULE:
            h = body_half_extents[i]
            R = quat_to_mat(body_quat[i])
            axis = ti.Vector([R[0, 1], R[1, 1], R[2, 1]]) * (h[1] - h[0])
            s = ti.atomic_add(sphere_count[None], 2)
            for e in ti.static(range(2)):
                center[s + e] = body_pos[i] + (2 * e - 1) * axis
                radius[s + e] = h[0] * radius_scale
                color[s + e] = bucket_color[body_key[i] % buckets]


@ti.kernel
def kernel_scatter_instances(body_key: ti.template(), body_pos: ti.template(), body_quat: ti.template(),
                             body_half_extents: ti.template(), body_count: ti.i32, buckets: ti.i32,
                             key_count: ti.template(),
                             key_cursor: ti.template(), instance_transform: ti.template()):
    """Counting sort of bodies by key, writing each body's transform T = [R diag(s) | pos] into its slot, with s
    the half extents of a box, (r, half_length, r) of a capsule. key_count (K,) i32 ends holding the bodies per key;
    instance_transform (capacity,) mat4 f32. The unit meshes (box [-1,1]^3, app.viewer.meshes.unit_cylinder) become
    the body's box or its capsule's cylinder under T."""
    for k in key_count:
        key_count[k] = 0
    for i in range(body_count):
        ti.atomic_add(key_count[body_key[i]], 1)
    for _ in range(1):  # serial exclusive prefix over a few dozen keys
        acc = 0
        for k in range(key_count.shape[0]):
            key_cursor[k] = acc
            acc += key_count[k]
    for i in range(body_count):
        slot = ti.atomic_add(key_cursor[body_key[i]], 1)
        R = quat_to_mat(body_quat[i])
        h = body_half_extents[i]
        if body_key[i] >= SHAPE_CAPSULE * buckets:
            h[1] -= h[0]   # a capsule's cylinder: its half length
        p = body_pos[i]
        m = ti.Matrix.identity(ti.f32, 4)
        for r in ti.static(range(3)):
            for c in ti.static(range(3)):
                m[r, c] = R[r, c] * h[c]
            m[r, 3] = p[r]
        instance_transform[slot] = m


@ti.kernel
def kernel_contact_glyphs(lists: ti.template(), list_base: ti.i32, body_count: ti.i32, normal_length: ti.f32,
                          impulse_ref: ti.f32, glyph_point: ti.template(), glyph_line: ti.template(),
                          glyph_count: ti.template()):
    """Every contact point once (from the first body's copy of a pair, or the body's of a plane contact):
    glyph_point[k] = point, glyph_line[2k], glyph_line[2k+1] = point, point + length * normal (the normal pushing
    the owner), an arrow of the contact's normal impulse: length = normal_length * impulse_n / impulse_ref (N s;
    a typical body's weight over a step), at most 4 normal_lengths; a speculative contact (no impulse) is a point.
    glyph_count[None] ends as the number found (may exceed the capacity: only the first glyph_point.shape[0]
    are written)."""
    glyph_count[None] = 0
    cap = glyph_point.shape[0]
    for i in range(body_count):
        for k in range(lists.length(list_base + i)):
            c = lists.get(list_base + i, k)
            if first_copy(c):
                slot = ti.atomic_add(glyph_count[None], 1)
                if slot < cap:
                    glyph_point[slot] = c.point
                    glyph_line[2 * slot] = c.point
                    length = normal_length * ti.min(c.impulse_n / impulse_ref, 4.0)
                    glyph_line[2 * slot + 1] = c.point + length * record_normal(c)


@ti.kernel
def kernel_body_glyphs(lists: ti.template(), list_base: ti.i32, body: ti.i32, normal_length: ti.f32,
                       impulse_ref: ti.f32, glyph_point: ti.template(), glyph_line: ti.template(),
                       glyph_count: ti.template()):
    """The contacts of one body (its own list), as kernel_contact_glyphs draws them, with the normal that pushes
    this body."""
    glyph_count[None] = 0
    for k in range(ti.min(lists.length(list_base + body), glyph_point.shape[0])):
        c = lists.get(list_base + body, k)
        n = record_normal(c)
        slot = ti.atomic_add(glyph_count[None], 1)
        glyph_point[slot] = c.point
        glyph_line[2 * slot] = c.point
        glyph_line[2 * slot + 1] = c.point + normal_length * ti.min(c.impulse_n / impulse_ref, 4.0) * n


@ti.kernel
def kernel_upload_poses(src_pos: ti.types.ndarray(dtype=vec3, ndim=1), src_quat: ti.types.ndarray(ndim=2),
                        body_count: ti.i32, body_pos: ti.template(), body_quat: ti.template()):
    """Replay: copy one recorded frame (N,3) / (N,4) into the viewer's own pose fields."""
    for i in range(body_count):
        body_pos[i] = src_pos[i]
        body_quat[i] = ti.Vector([src_quat[i, 0], src_quat[i, 1], src_quat[i, 2], src_quat[i, 3]], dt=ti.f32)


@ti.kernel
def kernel_hull_mesh(body_key: ti.template(), body_shape: ti.template(), body_hull: ti.template(),
                     body_pos: ti.template(), body_quat: ti.template(), body_count: ti.i32,
                     tri_start: ti.template(), tri_corner: ti.template(), tri_normal: ti.template(),
                     bucket_color: ti.template(), buckets: ti.i32, vertex_count: ti.template(),
                     out_v: ti.template(), out_n: ti.template(), out_c: ti.template()):
    """Every convex body's hull triangles in world space, one mesh for all of them (each hull its own shape: no
    instancing): 3 corners a triangle, flat normals, the body's bucket colour, packed in the first
    vertex_count[None] entries (in no particular order)."""
    vertex_count[None] = 0
    for i in range(body_count):
        if body_shape[i] == SHAPE_CONVEX:
            h = body_hull[i]
            t0 = tri_start[h]
            nt = tri_start[h + 1] - t0
            base = ti.atomic_add(vertex_count[None], 3 * nt)
            if base + 3 * nt > out_v.shape[0]:
                nt = 0   # (sized for the bodies at the last sync: never past the end)
            R = quat_to_mat(body_quat[i])
            p = body_pos[i]
            c = bucket_color[body_key[i] % buckets]
            for t in range(nt):
                n = R @ tri_normal[t0 + t]
                for k in ti.static(range(3)):
                    out_v[base + 3 * t + k] = p + R @ tri_corner[3 * (t0 + t) + k]
                    out_n[base + 3 * t + k] = n
                    out_c[base + 3 * t + k] = c
