"""Viewer kernels: occlusion culling, sphere particles, box instance transforms, hull meshes and contact glyphs,
filled on the device from the State into the frame buffer that goes to GGUI (app.viewer.upload).

Spheres are GGUI particles (impostors: a sphere shaded per pixel from one point), one draw for all of them with a
colour and a radius each; a capsule is an instanced cylinder and two such particles at its ends. Boxes and the
capsules' cylinders are instanced meshes, and GGUI's ``scene.mesh_instance`` takes one colour per call,
so they are drawn in colour buckets: every frame a counting sort on the device orders the bodies by key = shape *
COLOR_BUCKETS + bucket (bucket: material, contact count, sleep state or speed; culled bodies last) and writes each
drawn body's 4x4 transform into its slot; the host then issues one ``mesh_instance`` call per non-empty box or
capsule bucket. The bucket counts are the only other read-back.

Kernels read the simulator's fields (state.body_pos, state.body_quat, model.body_half_extents,
model.body_shape, model.body_material, the contact lists) and write only the viewer's own fields.
"""
import taichi as ti

from app.scene.schema import SHAPE_BOX, SHAPE_CAPSULE, SHAPE_CONVEX, SHAPE_SPHERE
from app.sim.contacts import first_copy, record_normal
from app.sim.math3d import quat_to_mat
from app.sim.state import asleep
from app.viewer.upload import TRANSFORM_FLOATS, VERTEX_FLOATS

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
    """body_key[i] = shape * buckets + (1 if body i slept in the last step else 0) (app.sim.state.asleep)."""
    for i in range(body_count):
        body_key[i] = body_shape[i] * buckets + ti.select(asleep(model, state, i), 1, 0)


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


# --------------------------------------------------------------------------------------------------------------
# occlusion culling
# --------------------------------------------------------------------------------------------------------------
# A body is drawn when some pixel centre of the image may see it. Each body's inscribed sphere is solid: at a
# pixel centre that it covers, the rasteriser keeps a depth no deeper than the sphere's centre depth plus its
# radius, whatever the body's shape and however GGUI shades a sphere (an impostor particle is a circle of
# radius f r / distance around the projected centre, not the true elliptic outline). The first pass writes, per
# pixel centre, the smallest such bound over the bodies whose inscribed sphere surely covers it (its ray meets
# the sphere and it lies inside the impostor's circle); the second pass keeps a body when some pixel centre
# it may cover (its ray meets the bounding sphere, or it lies inside the bounding impostor's circle) sees its
# bounding sphere in front of that bound. Conservative, independent of the order of the bodies, with margins:
CULL_SHRINK = 0.95     # an occluder's radii shrink by 5%, a body's bounding radii grow by 5% (pixel rounding,
CULL_GROW = 1.05       # float32 depth at tens of metres)
CULL_MAX_PIXELS = 4096  # a body that may cover more pixels is drawn (and occludes nothing): near bodies are few
CULL_FAR = 1e30

# Level of detail: a box whose bounding sphere spans fewer than this many pixels (radius) is drawn as a particle
# (a 2-pixel box and a 2-pixel sphere look alike) of the radius of the sphere of its volume, with the spheres:
# pile_1m seen whole has no instanced boxes left. body_visible: 0 culled, 1 drawn, DRAWN_AS_POINT as a particle.
LOD_POINT_PIXELS = 2.0
DRAWN_AS_POINT = 2


@ti.func
def _ray_sphere_depth(q, r, dx, dy):
    """View depth (m, along the view axis) where the ray through image-plane point (dx, dy, -1) (view space, the
    camera looking down -z) first meets the sphere of radius r at view-space centre q; -1 when it misses."""
    d = ti.Vector([dx, dy, -1.0])
    inv = 1.0 / d.norm()
    b = (d * inv).dot(q)
    c2 = q.dot(q) - b * b
    z = -1.0
    if b > 0 and c2 <= r * r:
        z = (b - ti.sqrt(r * r - c2)) * inv
    return z


@ti.func
def _cull_radii(shape, h):
    """(inscribed, bounding) radius (m) of a body of `shape` with half extents h; a convex body's are (0, -1):
    it neither occludes nor is culled (its half extents need not bound it about its origin)."""
    r_in = 0.0
    r_b = -1.0
    if shape == SHAPE_SPHERE:
        r_in = h[0]
        r_b = h[0]
    elif shape == SHAPE_CAPSULE:
        r_in = h[0]
        r_b = h[1]
    elif shape != SHAPE_CONVEX:
        r_in = ti.min(h[0], ti.min(h[1], h[2]))
        r_b = h.norm()
    return r_in, r_b


@ti.func
def _project(q, focal, width, height):
    """Pixel coordinates (x right, y down) of view-space point q."""
    return ti.Vector([0.5 * width + focal * q[0] / -q[2], 0.5 * height - focal * q[1] / -q[2]])


@ti.func
def _pixel_box(q, r, focal, width, height):
    """Pixel-centre index range (x0, x1, y0, y1) that a sphere (view-space centre q, radius r, in front of the
    camera) can cover, as its true outline or as an impostor circle of radius focal r / |q| (grown by CULL_GROW):
    the projected corners of its view-space bounding box (x right, y down), and that circle's box."""
    zs = ti.Vector([-q[2] - r, -q[2] + r])
    c = _project(q, focal, width, height)
    rc = CULL_GROW * focal * r / q.norm()
    lo = c - rc
    hi = c + rc
    for k in ti.static(range(2)):
        for sx in ti.static((-1.0, 1.0)):
            x = 0.5 * width + focal * (q[0] + sx * r) / zs[k]
            y = 0.5 * height - focal * (q[1] + sx * r) / zs[k]
            lo = ti.min(lo, ti.Vector([x, y]))
            hi = ti.max(hi, ti.Vector([x, y]))
    x0 = ti.max(0, ti.cast(ti.ceil(lo[0] - 0.5), ti.i32))
    x1 = ti.min(width - 1, ti.cast(ti.floor(hi[0] - 0.5), ti.i32))
    y0 = ti.max(0, ti.cast(ti.ceil(lo[1] - 0.5), ti.i32))
    y1 = ti.min(height - 1, ti.cast(ti.floor(hi[1] - 0.5), ti.i32))
    return x0, x1, y0, y1


@ti.kernel
def kernel_cull(body_shape: ti.template(), body_pos: ti.template(), body_half_extents: ti.template(),
                body_count: ti.i32, view: ti.types.matrix(4, 4, ti.f32), focal: ti.f32, z_near: ti.f32,
                point_pixels: ti.f32, depth: ti.types.ndarray(dtype=ti.f32, ndim=2), body_visible: ti.template()):
    """body_visible[i] = 1 when body i can show in the image, else 0 (see above), DRAWN_AS_POINT for a box whose
    bounding sphere's image has a radius under point_pixels. view: world -> view space
    (app.viewer.render.look_at_matrix); focal: the image's focal length in pixels (height / (2 tan(fov / 2)));
    depth: a (height, width) f32 scratch array, one entry per pixel centre (an ndarray: a window resized to a
    new size compiles nothing new)."""
    height, width = depth.shape[0], depth.shape[1]
    for I in ti.grouped(depth):
        depth[I] = CULL_FAR
    for i in range(body_count):
        r_in, _ = _cull_radii(body_shape[i], body_half_extents[i])
        r = r_in * CULL_SHRINK
        q = _to_view(view, body_pos[i])
        if r > 0 and -q[2] - r > z_near:
            x0, x1, y0, y1 = _pixel_box(q, r, focal, width, height)
            if (x1 - x0 + 1) * (y1 - y0 + 1) <= CULL_MAX_PIXELS:
                c = _project(q, focal, width, height)
                rc2 = (focal * r / q.norm()) ** 2
                bound = -q[2] + r_in   # (the inscribed sphere's far side: no covered pixel keeps a deeper depth)
                for py in range(y0, y1 + 1):
                    for px in range(x0, x1 + 1):
                        z = _ray_sphere_depth(q, r, (px + 0.5 - 0.5 * width) / focal,
                                              (0.5 * height - py - 0.5) / focal)
                        if z > 0 and (px + 0.5 - c[0]) ** 2 + (py + 0.5 - c[1]) ** 2 <= rc2:
                            ti.atomic_min(depth[py, px], bound)
    for i in range(body_count):
        _, r_b = _cull_radii(body_shape[i], body_half_extents[i])
        r = r_b * CULL_GROW
        q = _to_view(view, body_pos[i])
        vis = 1
        if r > 0 and -q[2] - r > z_near:
            x0, x1, y0, y1 = _pixel_box(q, r, focal, width, height)
            if (x1 - x0 + 1) * (y1 - y0 + 1) <= CULL_MAX_PIXELS:
                vis = 0   # (an empty range: outside the image)
                c = _project(q, focal, width, height)
                rc2 = (focal * r / q.norm()) ** 2
                near = -q[2] - r   # (no point of the body is nearer the camera)
                for py in range(y0, y1 + 1):
                    for px in range(x0, x1 + 1):
                        if vis == 0 and near < depth[py, px]:
                            z = _ray_sphere_depth(q, r, (px + 0.5 - 0.5 * width) / focal,
                                                  (0.5 * height - py - 0.5) / focal)
                            if z > 0 or (px + 0.5 - c[0]) ** 2 + (py + 0.5 - c[1]) ** 2 <= rc2:
                                vis = 1
        if vis == 1 and body_shape[i] == SHAPE_BOX and r > 0 and -q[2] - r > z_near and \
                focal * r_b / -q[2] < point_pixels:
            vis = DRAWN_AS_POINT
        body_visible[i] = vis


@ti.func
def _to_view(view, p):
    return ti.Vector([view[r, 0] * p[0] + view[r, 1] * p[1] + view[r, 2] * p[2] + view[r, 3] for r in range(3)])


@ti.kernel
def kernel_all_visible(body_count: ti.i32, body_visible: ti.template()):
    for i in range(body_count):
        body_visible[i] = 1


@ti.func
def _draw_key(body_key, body_visible, i, hidden_key):
    """The key a body is sorted and drawn by: its colour key, the sphere key of its colour when drawn as a point,
    or hidden_key (after every other) when culled."""
    k = body_key[i]
    buckets = hidden_key // (SHAPE_CONVEX + 1)
    if body_visible[i] == 0:
        k = hidden_key
    elif body_visible[i] == DRAWN_AS_POINT:
        k = SHAPE_SPHERE * buckets + k % buckets
    return k


@ti.func
def _put_vec3(frame: ti.template(), at, v):
    for c in ti.static(range(3)):
        frame[at + c] = v[c]


@ti.func
def _put_particle(frame: ti.template(), s, centre, radius, color):
    """GGUI particle record s (12 floats): centre, radius in float 3, colour with alpha 1."""
    at = s * VERTEX_FLOATS
    _put_vec3(frame, at, centre)
    frame[at + 3] = radius
    _put_vec3(frame, at + 8, color)
    frame[at + 11] = 1.0


@ti.kernel
def kernel_sphere_particles(body_key: ti.template(), body_visible: ti.template(), body_shape: ti.template(),
                            body_pos: ti.template(),
                            body_quat: ti.template(), body_half_extents: ti.template(), body_count: ti.i32,
                            radius_scale: ti.f32, bucket_color: ti.template(), buckets: ti.i32,
                            sphere_count: ti.template(), frame: ti.types.ndarray(ndim=1)):
    """The spheres, and both ends of each capsule, as GGUI particle records at the start of frame (app.viewer.upload):
    centre (m), radius (m, times radius_scale: see app.viewer.render.Renderer) and colour (bucket_color of the
    body's key), packed in the first sphere_count[None] records (in no particular order: each is drawn on its
    own)."""
    sphere_count[None] = 0
    for i in range(body_count):
        if body_visible[i] == 0:
            continue
        if body_shape[i] == SHAPE_SPHERE:
            s = ti.atomic_add(sphere_count[None], 1)
            _put_particle(frame, s, body_pos[i], body_half_extents[i][0] * radius_scale,
                          bucket_color[body_key[i] % buckets])
        elif body_visible[i] == DRAWN_AS_POINT:
            h = body_half_extents[i]
            s = ti.atomic_add(sphere_count[None], 1)
            _put_particle(frame, s, body_pos[i], ti.pow(h[0] * h[1] * h[2] * (6.0 / 3.14159265), 1.0 / 3.0) *
                          radius_scale, bucket_color[body_key[i] % buckets])
        elif body_shape[i] == SHAPE_CAPSULE:
            h = body_half_extents[i]
            R = quat_to_mat(body_quat[i])
            axis = ti.Vector([R[0, 1], R[1, 1], R[2, 1]]) * (h[1] - h[0])
            s = ti.atomic_add(sphere_count[None], 2)
            for e in ti.static(range(2)):
                _put_particle(frame, s + e, body_pos[i] + (2 * e - 1) * axis, h[0] * radius_scale,
                              bucket_color[body_key[i] % buckets])


@ti.kernel
def kernel_count_keys(body_key: ti.template(), body_visible: ti.template(), body_count: ti.i32,
                      key_count: ti.template(), key_cursor: ti.template()):
    """key_count[k] = bodies drawn with key k (the last key: the culled ones); key_cursor[k] = bodies with a
    smaller key (the counting sort's starts)."""
    hidden = key_count.shape[0] - 1
    for k in key_count:
        key_count[k] = 0
    for i in range(body_count):
        ti.atomic_add(key_count[_draw_key(body_key, body_visible, i, hidden)], 1)
    for _ in range(1):  # serial exclusive prefix over a few dozen keys
        acc = 0
        for k in range(key_count.shape[0]):
            key_cursor[k] = acc
            acc += key_count[k]


@ti.kernel
def kernel_scatter_instances(body_key: ti.template(), body_visible: ti.template(), body_pos: ti.template(),
                             body_quat: ti.template(), body_half_extents: ti.template(), body_count: ti.i32,
                             buckets: ti.i32, key_cursor: ti.template(), first_slot: ti.i32, slots: ti.i32,
                             base: ti.i32, frame: ti.types.ndarray(ndim=1)):
    """The counting sort's scatter (key_cursor from kernel_count_keys, advanced here): body i of sorted slot s
    writes its transform T = [R diag(s) | pos] (row-major, 16 floats) to frame[base + 16 (s - first_slot)] when
    first_slot <= s < first_slot + slots, with s the half extents of a box, (r, half_length, r) of a capsule.
    Slots run in key order (shape * buckets + bucket), so the instanced shapes' slots are one range. The unit
    meshes (box [-1,1]^3, app.viewer.meshes.unit_cylinder) become the body's box or its capsule's cylinder
    under T."""
    hidden = key_cursor.shape[0] - 1
    for i in range(body_count):
        slot = ti.atomic_add(key_cursor[_draw_key(body_key, body_visible, i, hidden)], 1) - first_slot
        if 0 <= slot < slots:
            R = quat_to_mat(body_quat[i])
            h = body_half_extents[i]
            if body_key[i] // buckets == SHAPE_CAPSULE:
                h[1] -= h[0]   # a capsule's cylinder: its half length
            p = body_pos[i]
            at = base + TRANSFORM_FLOATS * slot
            for r in ti.static(range(3)):
                for c in ti.static(range(3)):
                    frame[at + 4 * r + c] = R[r, c] * h[c]
                frame[at + 4 * r + 3] = p[r]
                frame[at + 12 + r] = 0.0
            frame[at + 15] = 1.0


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
                     bucket_color: ti.template(), buckets: ti.i32, vertex_count: ti.template(), vertices: ti.i32,
                     base: ti.i32, frame: ti.types.ndarray(ndim=1)):
    """Every convex body's hull triangles in world space as GGUI vertex records from frame[base] on, one mesh for
    all of them (each hull its own shape: no instancing): 3 corners a triangle, flat normals, the body's bucket
    colour, packed in the first vertex_count[None] records (in no particular order; at most `vertices`)."""
    vertex_count[None] = 0
    for i in range(body_count):
        if body_shape[i] == SHAPE_CONVEX:
            h = body_hull[i]
            t0 = tri_start[h]
            nt = tri_start[h + 1] - t0
            first = ti.atomic_add(vertex_count[None], 3 * nt)
            if first + 3 * nt > vertices:
                nt = 0   # (sized for the bodies at the last sync: never past the end)
            R = quat_to_mat(body_quat[i])
            p = body_pos[i]
            c = bucket_color[body_key[i] % buckets]
            for t in range(nt):
                n = R @ tri_normal[t0 + t]
                for k in ti.static(range(3)):
                    at = base + VERTEX_FLOATS * (first + 3 * t + k)
                    _put_vec3(frame, at, p + R @ tri_corner[3 * (t0 + t) + k])
                    _put_vec3(frame, at + 3, n)
                    _put_vec3(frame, at + 8, c)
                    frame[at + 11] = 1.0


@ti.kernel
def kernel_box_mesh(body_key: ti.template(), body_visible: ti.template(), body_shape: ti.template(),
                    body_pos: ti.template(), body_quat: ti.template(), body_half_extents: ti.template(),
                    body_count: ti.i32, corner: ti.template(), normal: ti.template(), bucket_color: ti.template(),
                    buckets: ti.i32, vertex_count: ti.template(), vertices: ti.i32, base: ti.i32,
                    frame: ti.types.ndarray(ndim=1)):
    """Every drawn box as triangles in world space (the unit box's corner / normal tables, 3 entries a triangle)
    with its bucket colour, from frame[base] on: the boxes join the one mesh draw of the static geometry and the
    hulls (few boxes: a draw call costs more than their vertices). vertex_count[None] ends as the number written
    (at most `vertices`)."""
    vertex_count[None] = 0
    per_box = corner.shape[0]
    for i in range(body_count):
        if body_visible[i] == 1 and body_shape[i] == SHAPE_BOX:
            first = ti.atomic_add(vertex_count[None], per_box)
            if first + per_box <= vertices:
                R = quat_to_mat(body_quat[i])
                h = body_half_extents[i]
                p = body_pos[i]
                c = bucket_color[body_key[i] % buckets]
                for k in range(per_box):
                    at = base + VERTEX_FLOATS * (first + k)
                    _put_vec3(frame, at, p + R @ (corner[k] * h))
                    _put_vec3(frame, at + 3, R @ normal[k])
                    _put_vec3(frame, at + 8, c)
                    frame[at + 11] = 1.0


@ti.kernel
def kernel_put_records(records: ti.types.ndarray(ndim=1), count: ti.i32, base: ti.i32,
                       frame: ti.types.ndarray(ndim=1)):
    """frame[base:base + count] = records[:count]: host-built vertex records (the static geometry) placed once."""
    for k in range(count):
        frame[base + k] = records[k]
