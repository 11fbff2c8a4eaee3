"""Drawing a simulation (or a recorded trajectory) into a GGUI scene. Shared by the interactive window, the
offscreen recorder, replay and the benchmark.

    source = SimSource(sim)                  # or PoseSource(...) for replay / state.npz
    renderer = Renderer(source, aspect=width / height)
    renderer.update()                        # device kernels: instance transforms (+ contact glyphs)
    renderer.draw(window.get_scene(), camera)
    canvas.scene(scene)

A *source* exposes the device fields the kernels read (body_pos, body_quat, body_half_extents, body_shape,
body_material), `body_count`, `capacity`, `generation` (changes when fields are reallocated), `statics`
(the scene's static list) and, for a live simulation, `contact_lists()` -> (lists, base) or None.
The renderer reads those fields and never writes them.
"""
from __future__ import annotations

import math

import numpy as np
import taichi as ti

from app.scene.hull import box_hull
from app.scene.schema import SHAPE_BOX, SHAPE_CAPSULE, SHAPE_CONVEX, SHAPE_SPHERE
from app.viewer import kernels as rk
from app.viewer import meshes as rm
from app.viewer import upload as up
from app.viewer.display import COLOR_MODES

BACKGROUND = (0.11, 0.12, 0.15)
FLOOR_COLORS = ((0.40, 0.42, 0.46), (0.33, 0.35, 0.39))
GROUND_COLORS = ((0.22, 0.23, 0.26), (0.19, 0.20, 0.23))
RAMP_COLORS = ((0.50, 0.45, 0.38), (0.42, 0.38, 0.32))
WALL_LINE_COLOR = (0.42, 0.55, 0.68)
CONTACT_POINT_COLOR = (1.0, 0.95, 0.25)
CONTACT_NORMAL_COLOR = (1.0, 0.35, 0.25)


# --------------------------------------------------------------------------------------------------------------
# sources
# --------------------------------------------------------------------------------------------------------------
class SimSource:
    """A live app.sim.Simulation: the kernels read its State and Model fields directly (no host copy)."""

    def __init__(self, sim):
        self.sim = sim

    @property
    def body_pos(self):
        return self.sim.state.body_pos

    @property
    def body_quat(self):
        return self.sim.state.body_quat

    @property
    def body_half_extents(self):
        return self.sim.model.body_half_extents

    @property
    def body_shape(self):
        return self.sim.model.body_shape

    @property
    def body_material(self):
        return self.sim.model.body_material

    @property
    def body_count(self) -> int:
        return self.sim.body_count

    @property
    def capacity(self) -> int:
        return self.sim.capacity

    @property
    def generation(self):
        # (the builder: a new scene of the same size may bring other hulls)
        return (self.sim.generation_id, self.sim.body_count, id(self.sim.builder))

    @property
    def statics(self):
        return self.sim.static_geometry()

    @property
    def material_names(self):
        return [m["name"] for m in self.sim.scene.materials]

    def host_shapes(self) -> dict:
        return self.sim.shapes()

    @property
    def body_hull(self):
        return self.sim.model.body_hull

    def hull_geometry(self):
        """The hulls body_hull indexes (app.scene.hull.Hull: the unit cube, then the scene's), or None."""
        return [box_hull()] + self.sim.builder.hulls if self.sim.builder.hulls else None

    def host_positions(self) -> np.ndarray:
        return self.sim.positions()

    def contact_lists(self):
        c = self.sim.contacts
        return c.lists, c.base

    def live_fields(self):
        """(model, state) of a live simulation: what the sleep and speed colourings read."""
        return self.sim.model, self.sim.state

    def weight_impulse(self) -> float:
        """The impulse (N s) of the median body's weight over one step: the scale of the contact arrows."""
        key = (self.generation, self.sim.dt)
        if getattr(self, "_weight_key", None) != key:
            b = self.sim.builder.bodies
            movable = b["mass"][: self.sim.body_count][b["inv_mass"][: self.sim.body_count] > 0]
            g = float(np.linalg.norm(self.sim.model.gravity[None].to_numpy()))
            self._weight = float(np.median(movable)) * max(g, 1.0) * self.sim.dt if movable.size else 1.0
            self._weight_key = key
        return max(self._weight, 1e-12)


@ti.data_oriented
class PoseSource:
    """Bodies whose poses come from the host: a recorded trajectory (replay) or a state.npz. Owns its fields.

    shapes: dict with shape (N,) (app.scene.schema.SHAPES), half_extents (N,3) m, material (N,) (as in state.npz).
    statics: the scene's static list (may be empty). material_names: for colours (optional)."""

    def __init__(self, shapes: dict, statics=(), material_names=None):
        self.material_names = list(material_names or ())
        n = int(np.asarray(shapes["shape"]).shape[0])
        self._count = n
        cap = max(n, 1)
        self._capacity = cap
        self.body_pos = ti.Vector.field(3, ti.f32, cap)
        self.body_quat = ti.Vector.field(4, ti.f32, cap)
        self.body_half_extents = ti.Vector.field(3, ti.f32, cap)
        self.body_shape = ti.field(ti.i32, cap)
        self.body_material = ti.field(ti.i32, cap)
        self._shapes = {k: np.asarray(v) for k, v in shapes.items() if k != "hulls"}

        def pad(a, dtype, width=None):
            out = np.zeros((cap,) if width is None else (cap, width), dtype)
            out[:n] = a
            return out

        self.body_half_extents.from_numpy(pad(shapes["half_extents"], np.float32, 3))
        self.body_shape.from_numpy(pad(shapes["shape"], np.int32))
        self.body_material.from_numpy(pad(shapes["material"], np.int32))
        # convex bodies: their hulls (shapes["hulls"], as shapes["hull"] indexes them), else their bounding boxes
        self._hulls = list(shapes.get("hulls", ())) if "hull" in shapes else []
        self.body_hull = ti.field(ti.i32, cap)
        if self._hulls:
            self.body_hull.from_numpy(pad(np.asarray(shapes["hull"]) + 1, np.int32))
        self.statics = list(statics)
        self._pos = np.zeros((n, 3), np.float32)

    body_count = property(lambda self: self._count)
    capacity = property(lambda self: self._capacity)

    def hull_geometry(self):
        """The hulls body_hull indexes (the unit cube, then the run's), or None."""
        return [box_hull()] + self._hulls if self._hulls else None
    generation = property(lambda self: (0, self._count))

    def set_poses(self, position, orientation):
        """Upload one frame: position (N,3) m, orientation (N,4) w,x,y,z."""
        self._pos = np.ascontiguousarray(position, np.float32).reshape(self._count, 3)
        quat = np.ascontiguousarray(orientation, np.float32).reshape(self._count, 4)
        if self._count:
            rk.kernel_upload_poses(self._pos, quat, self._count, self.body_pos, self.body_quat)

    def host_shapes(self) -> dict:
        return self._shapes

    def host_positions(self) -> np.ndarray:
        return self._pos

    def contact_lists(self):
        return None

    def live_fields(self):
        return None


# --------------------------------------------------------------------------------------------------------------
# camera
# --------------------------------------------------------------------------------------------------------------
def scene_bounds(positions: np.ndarray, radii: np.ndarray, statics) -> tuple:
    """(lo (3,), hi (3,)) of the bodies and containers: what a default camera should frame."""
    if len(positions):
        lo = (positions - radii[:, None]).min(axis=0)
        hi = (positions + radii[:, None]).max(axis=0)
    else:
        lo, hi = np.array([-1.0, 0.0, -1.0]), np.array([1.0, 1.0, 1.0])
    for s in statics:
        if s["type"] == "container":
            c = np.asarray(s["center"], np.float64)
            h = np.asarray(s["size"], np.float64) / 2
            lo, hi = np.minimum(lo, c - h), np.maximum(hi, c + h)
    return np.asarray(lo, np.float64), np.asarray(hi, np.float64)


def default_camera(lo, hi, fov=45.0, aspect=16 / 9):
    """A three-quarter view from above the front-right that fits the box [lo, hi]: returns dict(position,
    lookat, up, fov)."""
    lo, hi = np.asarray(lo, np.float64), np.asarray(hi, np.float64)
    center = (lo + hi) / 2
    radius = max(float(np.linalg.norm(hi - lo)) / 2, 1e-3)
    direction = np.array([0.55, 0.55, 1.0])
    direction /= np.linalg.norm(direction)
    half = math.radians(fov) / 2
    half = min(half, math.atan(math.tan(half) * aspect))
    dist = radius / math.sin(half) * 1.05
    lookat = center - np.array([0.0, 0.15 * (hi[1] - lo[1]), 0.0])
    return {"position": (lookat + direction * dist).tolist(), "lookat": lookat.tolist(), "up": [0.0, 1.0, 0.0],
            "fov": float(fov)}


def camera_spec(scene_camera, lo, hi, aspect) -> dict:
    """The scene's camera where it gives one (missing keys from the default), else the default."""
    spec = default_camera(lo, hi, (scene_camera or {}).get("fov", 45.0), aspect)
    for k in ("position", "lookat", "up", "fov"):
        if scene_camera and scene_camera.get(k) is not None:
            spec[k] = [float(x) for x in scene_camera[k]] if k != "fov" else float(scene_camera[k])
    return spec


def apply_camera(camera, spec: dict, extent: float):
    camera.position(*spec["position"])
    camera.lookat(*spec["lookat"])
    camera.up(*spec["up"])
    camera.fov(spec["fov"])
    dist = float(np.linalg.norm(np.subtract(spec["position"], spec["lookat"])))
    camera.z_near(max(1e-4, 0.002 * min(dist, extent)))
    camera.z_far(max(100.0, 50.0 * (dist + extent)))


def view_of(camera, fov, size) -> tuple:
    """What Renderer.update(view=...) culls for: a GGUI camera's pose, its fov (degrees: GGUI does not report it)
    and the image size (width, height) in pixels."""
    return (tuple(float(x) for x in camera.curr_position), tuple(float(x) for x in camera.curr_lookat),
            tuple(float(x) for x in camera.curr_up), float(fov), int(size[0]), int(size[1]))


def look_at_matrix(position, lookat, up) -> np.ndarray:
    """World -> camera (right-handed, camera looks down -z), 4x4 row-major for column vectors."""
    eye = np.asarray(position, np.float64)
    f = np.asarray(lookat, np.float64) - eye
    f /= np.linalg.norm(f)
    s = np.cross(f, np.asarray(up, np.float64))
    s /= np.linalg.norm(s)
    u = np.cross(s, f)
    m = np.eye(4)
    m[0, :3], m[1, :3], m[2, :3] = s, u, -f
    m[:3, 3] = -m[:3, :3] @ eye
    return m


def project(points, spec: dict, width: int, height: int) -> np.ndarray:
    """Pixel coordinates (K, 2) (x right, y down, origin top-left) of world points under a pinhole camera with
    vertical field of view spec['fov'] degrees: the projection the viewer's camera performs."""
    p = np.atleast_2d(np.asarray(points, np.float64))
    v = look_at_matrix(spec["position"], spec["lookat"], spec.get("up", (0, 1, 0)))
    cam = (v[:3, :3] @ p.T).T + v[:3, 3]
    t = math.tan(math.radians(spec["fov"]) / 2)
    aspect = width / height
    ndc_x = cam[:, 0] / (-cam[:, 2] * t * aspect)
    ndc_y = cam[:, 1] / (-cam[:, 2] * t)
    return np.stack([(ndc_x + 1) / 2 * width, (1 - ndc_y) / 2 * height], axis=1)


# --------------------------------------------------------------------------------------------------------------
# renderer
# --------------------------------------------------------------------------------------------------------------
# Occlusion culling pays from about this many bodies: below, drawing them all costs less than the culling's two
# passes over the image (2,000 bodies on a 2-core CPU: 3.6 ms a frame to cull 1.6% of them).
CULL_MIN_BODIES = 10_000

# Up to this many drawn boxes are triangles in the one mesh draw of the static geometry and the hulls (36 vertex
# records, 1.7 KB, a box), above it instances (a 64-byte transform a box, one draw per colour): a GGUI draw call
# costs about 1.3 ms on an H100 machine, the time to copy ~10 MB.
BOX_MESH_MAX = 2048

# The picked body's contacts: at most this many, drawn in this colour.
PICK_GLYPHS = 256
PICK_COLOR = (0.25, 0.95, 0.45)


def _field_from(array, n_components=None, dtype=ti.f32):
    a = np.ascontiguousarray(array)
    if n_components is None:
        f = ti.field(dtype, a.shape[0])
    else:
        f = ti.Vector.field(n_components, dtype, a.shape[0])
    f.from_numpy(a.astype(np.float32 if dtype == ti.f32 else np.int32))
    return f


@ti.data_oriented
class Renderer:
    """Owns the viewer's device data (meshes, instance transforms, contact glyphs, static geometry) for one
    source and draws it.

    aspect: width / height of the image it draws into. color_mode: 'material' | 'contacts'. show_contacts: draw
    contact points and normals (live sims only).
    """

    GLYPH_CAPACITY_MAX = 1 << 20

    def __init__(self, source, aspect, color_mode="material", show_contacts=False):
        self.source = source
        # GGUI's particle shader (Taichi 1.7.4, Particles_vk.vert) sizes a particle's quad r / (tan(fov/2) d) across
        # and that times the aspect ratio up, where r / (tan(fov/2) d aspect) and r / (tan(fov/2) d) would be its
        # projection: every particle comes out `aspect` times its radius. The radii it is given are divided by it.
        self.particle_scale = 1.0 / float(aspect)
        self.color_mode = color_mode
        self.show_contacts = show_contacts
        self._generation = None
        self._static_key = None
        self._keys_dirty = True
        self._host_counts = None
        self.contact_glyphs = 0
        self.pick_glyphs = 0
        self.highlight = -1   # stored index of a body whose contacts are drawn (the viewer's picked body), or -1
        self._build_body_meshes()
        self._build_statics()
        self._sync_capacity()

    # ------------------------------------------------------------------ setup
    def _build_body_meshes(self):
        # (spheres are particles: no mesh; the box and cylinder meshes are host records, made once)
        if getattr(self, "body_meshes", None) is not None:
            return
        self.body_meshes = {}
        for shape, (v, n, i) in ((SHAPE_BOX, rm.unit_box()), (SHAPE_CAPSULE, rm.unit_cylinder())):
            self.body_meshes[shape] = (up.vertex_records(v, n), np.ascontiguousarray(i, np.int32))
        v, n, i = rm.unit_box()
        self._box_triangles = (_field_from(v[i], 3), _field_from(n[i], 3))   # (36 corners, 3 a triangle)
        # A source without hull geometry (a recording) draws a convex body as its bounding box.
        self.body_meshes[SHAPE_CONVEX] = self.body_meshes[SHAPE_BOX]

    def _sync_capacity(self):
        """(Re)allocate per-body fields when the source's fields were reallocated or grew."""
        gen = self.source.generation
        if gen == self._generation:
            return
        cap = self.source.capacity
        if getattr(self, "_capacity", None) != cap:
            self._capacity = cap
            self.body_key = ti.field(ti.i32, cap)
            self.body_visible = ti.field(ti.i32, cap)
            k = rm.SHAPE_KINDS * rm.COLOR_BUCKETS + 1   # (the last key: bodies culled this frame)
            self.key_count = ti.field(ti.i32, k)
            self.key_cursor = ti.field(ti.i32, k)
            gcap = int(min(self.GLYPH_CAPACITY_MAX, max(1024, 8 * cap)))
            self.glyph_point = ti.Vector.field(3, ti.f32, gcap)
            self.glyph_line = ti.Vector.field(3, ti.f32, 2 * gcap)
            self.glyph_count = ti.field(ti.i32, ())
            self.sphere_count = ti.field(ti.i32, ())
            self.mesh_count = ti.field(ti.i32, ())
            self.bucket_color = ti.Vector.field(3, ti.f32, rm.COLOR_BUCKETS)
            self.pick_point = ti.Vector.field(3, ti.f32, PICK_GLYPHS)
            self.pick_line = ti.Vector.field(3, ti.f32, 2 * PICK_GLYPHS)
            self.pick_count = ti.field(ti.i32, ())
            self._bucket_colors_for = None
        self._generation = gen
        self._keys_dirty = True
        self._build_body_meshes()
        shapes = self.source.host_shapes()
        he = np.asarray(shapes["half_extents"], np.float64)
        self.size_hint = float(np.median(he.min(axis=1))) if len(he) else 0.1
        self._sync_hulls()
        self._sync_layout()

    def _sync_hulls(self):
        """Hull triangle tables and the size of the world-space hull mesh (kernels.kernel_hull_mesh), for a source
        with hulls."""
        geometry = getattr(self.source, "hull_geometry", lambda: None)()
        self.hull_vertices = 0
        if geometry is None:
            self._hull_tables = None
            return
        start, corners, normals = rm.hull_triangles(geometry)
        self._hull_tables = (_field_from(start, dtype=ti.i32), _field_from(corners, 3), _field_from(normals, 3))
        n = self.source.body_count
        hull_of = self.source.body_hull.to_numpy()[:n]
        convex = self.source.body_shape.to_numpy()[:n] == SHAPE_CONVEX
        self.hull_vertices = 3 * int(np.diff(start)[hull_of[convex]].sum())

    def _sync_layout(self):
        """The frame buffer's layout for this body set (shapes do not change within a generation): the particle
        records of spheres and capsule ends, then the instance transforms of boxes and capsule cylinders (and
        of convex bodies drawn as boxes), then the one mesh: the static geometry's records (placed once), the
        hulls', and the boxes' when few are drawn."""
        n = self.source.body_count
        shape = np.asarray(self.source.host_shapes()["shape"])[:n]
        count = np.bincount(shape, minlength=rm.SHAPE_KINDS)
        hulls_as_mesh = self._hull_tables is not None
        # (a box may be drawn as a point: kernels.LOD_POINT_PIXELS)
        self.particle_records = int(count[SHAPE_SPHERE] + 2 * count[SHAPE_CAPSULE] + count[SHAPE_BOX])
        self.instances = int(count[SHAPE_BOX] + count[SHAPE_CAPSULE] + (0 if hulls_as_mesh else count[SHAPE_CONVEX]))
        self._instance_base = up.VERTEX_FLOATS * self.particle_records
        self._mesh_base = self._instance_base + up.TRANSFORM_FLOATS * self.instances
        self._static_vertices = self.static_records.shape[0]
        box_vertices = self._box_triangles[0].shape[0] * min(int(count[SHAPE_BOX]), BOX_MESH_MAX)
        self._frame_floats = self._mesh_base + up.VERTEX_FLOATS * (self._static_vertices + self.hull_vertices +
                                                                  box_vertices)
        if getattr(self, "frame", None) is None or self.frame.floats < self._frame_floats:
            if getattr(self, "frame", None) is not None:
                self.frame.close()
            self.frame = up.FrameBuffer(self._frame_floats)
        if self._static_vertices:
            flat = np.ascontiguousarray(self.static_records.ravel())
            rk.kernel_put_records(flat, flat.shape[0], self._mesh_base, self.frame.array)
        self._frame_host = None

    def scene_bounds(self):
        shapes = self.source.host_shapes()
        he = np.asarray(shapes["half_extents"], np.float64)
        radii = np.linalg.norm(he, axis=1) if len(he) else np.zeros(0)
        # spheres: half_extents = (r, r, r); their bounding radius is r, not r*sqrt(3)
        sphere = np.asarray(shapes["shape"]) == 0
        radii = np.where(sphere, he[:, 0] if len(he) else radii, radii)
        return scene_bounds(self.source.host_positions(), radii, self.source.statics)

    def _build_statics(self):
        """Static geometry as host-built meshes: a checker quad per plane (ground planes wide, ramps around the
        bodies), a container's floor as a lighter checker plus its walls as lines."""
        statics = self.source.statics
        lo, hi = self.scene_bounds()
        center = (lo + hi) / 2
        extent = max(float(np.linalg.norm(hi - lo)) / 2, 1e-3)
        self.extent = extent
        self.center = center
        meshes, lines = [], []
        has_container = any(s["type"] == "container" for s in statics)
        for s in statics:
            if s["type"] == "plane":
                n = np.asarray(s["normal"], np.float64)
                n /= np.linalg.norm(n)
                p0 = center - (n @ center - float(s["offset"])) * n
                ground = n[1] > 0.99
                half = (4.0 if ground else 1.2) * extent
                cells = 2 * max(4, min(20, int(round(half / _nice_cell(extent)))))
                cols = GROUND_COLORS if ground and has_container else (FLOOR_COLORS if ground else RAMP_COLORS)
                # a ground under a container floor sits a hair lower so the two do not fight for depth
                lift = -0.002 * extent if (ground and has_container) else 0.0
                meshes.append(rm.checker_quad(p0, n, half, half, cells, cells, *cols, lift=lift))
            elif s["type"] == "container":
                size = np.asarray(s["size"], np.float64)
                c = np.asarray(s["center"], np.float64)
                floor_c = c - np.array([0.0, size[1] / 2, 0.0])
                cell = _nice_cell(max(size[0], size[2]) / 2)
                cu = max(2, min(40, int(round(size[0] / cell))))
                cw = max(2, min(40, int(round(size[2] / cell))))
                meshes.append(rm.checker_quad(floor_c, [0, 1, 0], size[0] / 2, size[2] / 2, cu, cw, *FLOOR_COLORS))
                lines.append(rm.container_lines(size, c))
                if not any(t["type"] == "plane" for t in statics):
                    g = 4.0 * extent
                    cells = 2 * max(4, min(20, int(round(g / _nice_cell(extent)))))
                    meshes.append(rm.checker_quad(floor_c, [0, 1, 0], g, g, cells, cells, *GROUND_COLORS,
                                                  lift=-0.002 * extent))
        # triangles (3 records each), placed once at the head of the frame's one mesh (_sync_layout)
        self.static_records = np.zeros((0, up.VERTEX_FLOATS), np.float32)
        if meshes:
            starts = np.cumsum([0] + [len(v) for v, _n, _i, _c in meshes[:-1]])
            v, n, c = (np.concatenate([m[k] for m in meshes]) for k in (0, 1, 3))
            i = np.concatenate([m[2] + start for m, start in zip(meshes, starts)]).astype(np.int32)
            self.static_records = up.vertex_records(v[i], n[i], c[i])
        self.static_lines = up.vertex_records(np.concatenate(lines)) if lines else None
        self.lights = [
            (center + np.array([0.6, 2.5, 1.2]) * extent * 2.0, (0.95, 0.90, 0.82)),
            (center + np.array([-1.5, 1.0, -0.8]) * extent * 2.0, (0.22, 0.26, 0.34)),
        ]

    # ------------------------------------------------------------------ per frame
    def set_color_mode(self, mode):
        if mode not in COLOR_MODES:
            raise ValueError(f"color mode {mode!r}: expected {' | '.join(COLOR_MODES)}")
        if mode != self.color_mode:
            self.color_mode = mode
            self._keys_dirty = True

    def update(self, view=None):
        """Fill the frame buffer (particles, instance transforms, hull vertices; contact glyphs when drawn) from
        the source's fields with device kernels, and bring its live part to the host (app.viewer.upload).

        view: the camera and image this frame is drawn for, (position, lookat, up, fov degrees, width px,
        height px) (view_of()); with it, and CULL_MIN_BODIES bodies or more, bodies that no pixel can see are not
        drawn (kernels.kernel_cull). The bucket counts are read back when they can have changed: every frame when
        culling."""
        src = self.source
        self._sync_capacity()
        n = src.body_count
        self.culled = 0
        if n == 0:   # (the static geometry alone)
            self._host_counts = np.zeros(rm.SHAPE_KINDS * rm.COLOR_BUCKETS, np.int32)
            self.drawn_particles = self.drawn_instances = self.pick_glyphs = self.contact_glyphs = 0
            self.boxes_meshed, self.mesh_vertices = False, self._static_vertices
            self._frame_host = self.frame.host([(self._mesh_base, up.VERTEX_FLOATS * self.mesh_vertices)])
            return
        lists = src.contact_lists() if self.color_mode == "contacts" else None
        sleep = src.live_fields() if self.color_mode == "sleep" else None
        speed = src.live_fields() if self.color_mode == "speed" else None
        per_frame = lists is not None or sleep is not None or speed is not None   # keys that change every frame
        if lists is not None:
            rk.kernel_keys_contacts(src.body_shape, lists[0], lists[1], n, rm.COLOR_BUCKETS, self.body_key)
        elif sleep is not None:
            rk.kernel_keys_sleep(src.body_shape, sleep[0], sleep[1], n, rm.COLOR_BUCKETS, self.body_key)
        elif speed is not None:
            if getattr(self, "_speed_edges", None) is None:
                self._speed_edges = _field_from(rm.SPEED_EDGES)
            rk.kernel_keys_speed(src.body_shape, speed[1].body_vel, n, rm.COLOR_BUCKETS, self._speed_edges,
                                 self.body_key)
        elif self._keys_dirty:
            rk.kernel_keys_material(src.body_shape, src.body_material, n, rm.COLOR_BUCKETS, self.body_key)
        if view is not None:
            # (GGUI draws a particle the current image's aspect times its radius: a resized window changes it)
            self.particle_scale = float(view[5]) / float(view[4])
        if n < CULL_MIN_BODIES:
            view = None
        per_frame = per_frame or view is not None
        if view is not None:
            position, lookat, up_, fov, width, height = view
            if getattr(self, "cull_depth", None) is None or tuple(self.cull_depth.shape) != (int(height), int(width)):
                self.cull_depth = ti.ndarray(ti.f32, (int(height), int(width)))
            focal = 0.5 * height / math.tan(math.radians(fov) / 2)
            # apply_camera's near plane is at most this far (a moving camera keeps it): a body nearer may be clipped,
            # so it hides nothing and is always drawn
            z_near = max(1e-4, 0.002 * self.extent)
            rk.kernel_cull(src.body_shape, src.body_pos, src.body_half_extents, n,
                           ti.Matrix(look_at_matrix(position, lookat, up_).astype(np.float32)), focal, z_near,
                           rk.LOD_POINT_PIXELS, self.cull_depth, self.body_visible)
        else:
            rk.kernel_all_visible(n, self.body_visible)
        rk.kernel_count_keys(self.body_key, self.body_visible, n, self.key_count, self.key_cursor)
        if per_frame or self._keys_dirty or self._host_counts is None:
            counts = self.key_count.to_numpy()
            self._host_counts, self.culled = counts[:-1], int(counts[-1])
            self._keys_dirty = per_frame
        if self._bucket_colors_for != self.color_mode:
            self.bucket_color.from_numpy(rm.bucket_colors(self.color_mode, getattr(src, "material_names", None)))
            self._bucket_colors_for = self.color_mode
        # what is drawn this frame (culled bodies sit in the last key, the instanced shapes' keys follow the spheres')
        B, c = rm.COLOR_BUCKETS, self._host_counts
        spheres, capsules = int(c[:B].sum()), int(c[SHAPE_CAPSULE * B:(SHAPE_CAPSULE + 1) * B].sum())
        self.drawn_particles = spheres + 2 * capsules
        self.drawn_instances = int(c[B:(SHAPE_CONVEX if self._hull_tables is not None else SHAPE_CONVEX + 1) * B].sum())
        boxes = int(c[SHAPE_BOX * B:(SHAPE_BOX + 1) * B].sum())
        self.boxes_meshed = 0 < boxes <= BOX_MESH_MAX
        mesh_boxes = self._mesh_base + up.VERTEX_FLOATS * (self._static_vertices + self.hull_vertices)
        self.mesh_vertices = self._static_vertices + self.hull_vertices + \
            (self._box_triangles[0].shape[0] * boxes if self.boxes_meshed else 0)
        frame = self.frame.array
        if self.drawn_instances:
            rk.kernel_scatter_instances(self.body_key, self.body_visible, src.body_pos, src.body_quat,
                                        src.body_half_extents, n, B, self.key_cursor, spheres,
                                        self.drawn_instances, self._instance_base, frame)
        if self.drawn_particles:
            rk.kernel_sphere_particles(self.body_key, self.body_visible, src.body_shape, src.body_pos,
                                       src.body_quat, src.body_half_extents, n, self.particle_scale,
                                       self.bucket_color, B, self.sphere_count, frame)
        if self.hull_vertices:
            start, corners, normals = self._hull_tables
            rk.kernel_hull_mesh(self.body_key, src.body_shape, src.body_hull, src.body_pos, src.body_quat, n,
                                start, corners, normals, self.bucket_color, B, self.mesh_count,
                                self.hull_vertices, self._mesh_base + up.VERTEX_FLOATS * self._static_vertices,
                                frame)
        if self.boxes_meshed:
            rk.kernel_box_mesh(self.body_key, self.body_visible, src.body_shape, src.body_pos, src.body_quat,
                               src.body_half_extents, n, *self._box_triangles, self.bucket_color, B,
                               self.mesh_count, self._box_triangles[0].shape[0] * boxes, mesh_boxes, frame)
        # the frame's copy to the host (app.viewer.upload), the drawn part of each segment: what GGUI draws from
        self._frame_host = self.frame.host(
            [(0, up.VERTEX_FLOATS * self.drawn_particles),
             (self._instance_base, up.TRANSFORM_FLOATS * self.drawn_instances),
             (self._mesh_base, up.VERTEX_FLOATS * self.mesh_vertices)])
        self.pick_glyphs = 0
        picked = src.contact_lists() if self.highlight >= 0 else None
        if picked is not None and self.highlight < n:
            rk.kernel_body_glyphs(picked[0], picked[1], self.highlight, 1.5 * self.size_hint, src.weight_impulse(),
                                  self.pick_point, self.pick_line, self.pick_count)
            self.pick_glyphs = min(int(self.pick_count[None]), PICK_GLYPHS)
        self.contact_glyphs = 0
        cl = src.contact_lists() if self.show_contacts else None
        if cl is not None:
            rk.kernel_contact_glyphs(cl[0], cl[1], n, 1.5 * self.size_hint, src.weight_impulse(),
                                     self.glyph_point, self.glyph_line, self.glyph_count)
            self.contact_glyphs = int(self.glyph_count[None])

    def host_particles(self):
        """This frame's particle records as GGUI draws them: centre (K, 3) m, radius (K,) (times particle_scale),
        colour (K, 3)."""
        rec = self._frame_host[:up.VERTEX_FLOATS * self.drawn_particles].reshape(-1, up.VERTEX_FLOATS)
        return rec[:, 0:3], rec[:, 3], rec[:, 8:11]

    def host_mesh(self) -> np.ndarray:
        """This frame's one mesh as GGUI vertex records (K, 12): static geometry, hulls, boxes when meshed."""
        return self._frame_host[self._mesh_base:self._mesh_base + up.VERTEX_FLOATS * self.mesh_vertices].reshape(
            -1, up.VERTEX_FLOATS)

    def host_transforms(self) -> np.ndarray:
        """This frame's instance transforms (K, 4, 4), in key order (boxes, then capsule cylinders)."""
        return self._frame_host[self._instance_base:self._instance_base + 16 * self.drawn_instances].reshape(-1, 4, 4)

    def draw(self, scene, camera):
        """Declare everything for this frame into a GGUI scene (call update() first)."""
        scene.set_camera(camera)
        scene.ambient_light((0.30, 0.31, 0.34))
        for pos, col in self.lights:
            scene.point_light(pos=tuple(float(x) for x in pos), color=col)
        if self.static_lines is not None:
            up.draw_lines(scene, self.static_lines, 1.5, WALL_LINE_COLOR)
        counts, host = self._host_counts, self._frame_host
        if counts is not None and host is not None:
            B = rm.COLOR_BUCKETS
            # spheres and the capsules' ends: one particle draw
            up.draw_particles(scene, host[:up.VERTEX_FLOATS * self.drawn_particles].reshape(-1, up.VERTEX_FLOATS))
            # boxes and capsule cylinders: one instanced draw per colour bucket, its slice of the sorted transforms
            colors = rm.bucket_colors(self.color_mode, getattr(self.source, "material_names", None))
            transforms = host[self._instance_base:self._instance_base + up.TRANSFORM_FLOATS * self.drawn_instances]
            transforms = transforms.reshape(-1, up.TRANSFORM_FLOATS)
            offset = 0
            for key in range(B, len(counts)):
                if key // B == SHAPE_CONVEX and self._hull_tables is not None:
                    break   # (hulls are in the mesh; the last shape's keys)
                cnt = int(counts[key])
                if cnt and not (key // B == SHAPE_BOX and self.boxes_meshed):
                    v, i = self.body_meshes[key // B]
                    up.draw_instances(scene, v, i, colors[key % B], transforms[offset:offset + cnt])
                offset += cnt
        # the one mesh: static geometry (with its back faces), hulls, and the boxes when few
        if host is not None and self.mesh_vertices:
            mesh = host[self._mesh_base:self._mesh_base + up.VERTEX_FLOATS * self.mesh_vertices]
            up.draw_mesh(scene, mesh.reshape(-1, up.VERTEX_FLOATS))
        if self.pick_glyphs:
            k = self.pick_glyphs
            scene.particles(self.pick_point, radius=0.3 * self.size_hint, color=PICK_COLOR, index_count=k)
            scene.lines(self.pick_line, width=2.0, color=PICK_COLOR, vertex_count=2 * k)
        if self.contact_glyphs:
            k = min(self.contact_glyphs, self.glyph_point.shape[0])
            scene.particles(self.glyph_point, radius=0.25 * self.size_hint, color=CONTACT_POINT_COLOR,
                            index_count=k)
            scene.lines(self.glyph_line, width=1.0, color=CONTACT_NORMAL_COLOR, vertex_count=2 * k)


def _nice_cell(extent: float) -> float:
    """A round checker cell size (1, 2 or 5 x 10^k m) giving about ten cells across `extent`."""
    raw = max(extent / 5.0, 1e-4)
    p = 10.0 ** math.floor(math.log10(raw))
    for m in (1.0, 2.0, 5.0, 10.0):
        if raw <= m * p:
            return m * p
    return 10 * p


def image_rgb8(window) -> np.ndarray:
    """The window's current image as (H, W, 3) uint8, top row first. Ends the frame (draw again after)."""
    img = window.get_image_buffer_as_numpy()  # (W, H, 4) float, y up: GGUI's RGBA8 bytes / 255
    # in place, in one contiguous pass each (the frame's slowest host work after the capture): the values are
    # bytes / 255, so x * 255 + 0.5 rounds back to the byte without a clip
    np.multiply(img, np.float32(255.0), out=img)
    np.add(img, np.float32(0.5), out=img)
    return np.ascontiguousarray(img.astype(np.uint8)[:, ::-1, :3].transpose(1, 0, 2))
