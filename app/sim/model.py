"""Model: the static definition of a simulation, built on the host by a ModelBuilder and written to the device.

Everything a step reads but does not change lives in the Model: per-body shape, size, mass and inertia, materials,
static planes, and the parameters (gravity, thresholds). Parameters are 0-d fields rather than Python constants
so that the viewer can change them live without recompiling a kernel.

The ModelBuilder holds the definition in scene order (numpy) and is the only writer of a Model: it writes the
whole definition when a scene is loaded, the bodies again when bodies are added at run time, and a parameter or a
material when the user changes one; when the Simulation stores the bodies in another order (app.sim.reorder), the
builder moves their rows on the device (store_in_order), which changes where a body's row lives, never what it
holds. No kernel of a step writes the Model. Capacities (bodies, materials, planes) are fixed when the Model is allocated;
a builder whose definition fits writes into it again, so a new scene of the same size reuses every compiled
kernel.
"""

import numpy as np
import taichi as ti

from app.scene import Scene, body_bounding_radius
from app.scene.schema import body_mass_properties, quat_matrices
from app.sim.manifold import NO_CLIP
from app.sim.permute import permute_field

vec3 = ti.types.vector(3, ti.f32)
vec4 = ti.types.vector(4, ti.f32)

# Container walls generate contacts only for bodies at most this many (largest) bounding radii behind the wall
# plane, and each body only while its centre is less than half its own bounding radius behind it
# (app.sim.narrowphase.plane_accepts): a body that left the container over the top is not dragged back through the
# wall.
WALL_THICKNESS_RADII = 4.0

# Large bodies: those whose bounding radius exceeds LARGE_RADIUS_FACTOR x the median, at most MAX_LARGE_BODIES of
# the largest. The grid's cells are sized for the other bodies, and each large body meets every body in a pass of
# its own (app.sim.broadphase): one big box among small spheres would otherwise widen every cell to its size, putting
# (factor)^3 times the bodies in each cell (a 4x radius: 64x the neighbours tested). The pass costs a test per
# body and large body, so at most 64 of them: more large bodies than that widen the cells instead.
LARGE_RADIUS_FACTOR = 4.0
MAX_LARGE_BODIES = 64


def grid_radius(radius: np.ndarray, factor: float = LARGE_RADIUS_FACTOR) -> float:
    """The bounding radius (m) the grid's cells are sized for: the largest of the bodies that are not large, those
    above `factor` x the median (the scene's sim.large_body_factor; 0: no body is large); every body whose radius
    exceeds it is large."""
    r = np.asarray(radius, np.float64)
    n_large = 0 if factor <= 0 else min(int((r > factor * np.median(r)).sum()), MAX_LARGE_BODIES, r.size - 1)
    # the (n_large + 1)-th largest radius, by a partition rather than a sort (start-up: 12 ms against 45 at 1M bodies)
    return float(r.max() if n_large == 0 else np.partition(r, r.size - 1 - n_large)[r.size - 1 - n_large])


def static_mask(bodies) -> np.ndarray:
    """bool (N,): which of validated scene bodies are static: fixed and not kinematic (Model.body_static_rank)."""
    fixed = np.asarray(bodies["fixed"], bool)
    return fixed & ~np.asarray(bodies.get("kinematic", np.zeros(fixed.shape, bool)), bool)


def has_static_bodies(bodies) -> bool:
    return bool(static_mask(bodies).any())


def plane_rows(statics, bounding_radius_max: float):
    """Expand static geometry into half-space rows (normal, offset, material, clip normal, clip offset,
    thickness). A container becomes five rows: the floor and four inward-facing walls whose contacts are
    clipped to points below the container's top."""
    rows = []
    for s in statics:
        if s["type"] == "plane":
            rows.append((s["normal"], s["offset"], s["material"], [0.0, 1.0, 0.0], NO_CLIP, NO_CLIP))
            continue
        c = np.asarray(s["center"], np.float64)
        h = np.asarray(s["size"], np.float64) / 2
        top = float(c[1] + h[1])
        thick = max(WALL_THICKNESS_RADII * bounding_radius_max, 0.05 * float(min(h[0], h[2])))
        rows.append(([0.0, 1.0, 0.0], float(c[1] - h[1]), s["material"], [0.0, 1.0, 0.0], NO_CLIP, NO_CLIP))
        for axis in (0, 2):
            for sign in (1.0, -1.0):
                n = [0.0, 0.0, 0.0]
                n[axis] = sign
                # inward normal n; the wall plane is at c[axis] - sign*h[axis]: dot(n, p) = offset
                rows.append((n, float(sign * c[axis] - h[axis]), s["material"], [0.0, 1.0, 0.0], top, thick))
    return rows


# The Model's per-body fields: what store_in_order moves.
BODY_FIELDS = ("body_shape", "body_radius", "body_half_extents", "body_mass", "body_inv_mass", "body_inv_inertia",
               "body_material", "body_id", "body_kinematic", "body_kin_pivot", "body_kin_velocity", "body_kin_omega",
               "body_hull", "body_static_rank")


@ti.kernel
def _kernel_store_in_order(model: ti.template(), scratch: ti.template(), order: ti.template()):
    n = model.body_count[None]
    for name in ti.static(BODY_FIELDS):
        permute_field(ti.static(getattr(model, name)), scratch, order, n)


@ti.data_oriented
class Model:
    """The bodies, materials, planes and parameters on the device; written by ModelBuilder.write only.

    Per-body fields, shape (body_capacity,), valid for indices < body_count[None]:
        body_shape: i32, 0 sphere, 1 box.
        body_radius: f32 m, sphere radius; for boxes the bounding-sphere radius |half_extents|.
        body_half_extents: vec3 f32 m, box half extents (spheres: r, r, r).
        body_mass: f32 kg. body_inv_mass: f32 1/kg, 0 for fixed bodies.
        body_inv_inertia: vec3 f32 1/(kg m^2), body-frame diagonal of the inverse inertia tensor.
        body_material: i32 material index.
        body_id: i32, the body's persistent id: its scene index (bodies added at run time continue the count).
            Stored indices change when the Simulation re-sorts the bodies (Simulation.resort); ids do not, so
            every convention that must hold from step to step (which body of a pair comes first: the
            box-box feature ids and the warm-start keys) is decided by id, never by stored index.
        body_kinematic: i32, 1 for a kinematic body (zero inverse mass and inertia, as a fixed body, but moving):
            it turns at body_kin_omega (rad/s, world) about the point body_kin_pivot (m, in its own frame), which
            moves at body_kin_velocity (m/s), whatever touches it (app.sim.integrator.kinematic_step).
        body_hull: i32, a convex body's hull in `hulls` (its scene hull index + 1; 0 for the other shapes).
        body_static_rank: i32, a static body's rank among the static bodies (0 .. static_count - 1), -1 for the
            others. Static: fixed in the scene and not kinematic (static triangles included); the broadphase finds
            them through a table of their own (app.sim.broadphase, static cells) and they do not size its cells.
    hulls: app.sim.convex.HullTable of hull_capacity hulls (hull 0 the unit cube), or None when hull_capacity is 0
        (a Model for scenes without convex bodies: the narrowphase then compiles no hull code).
    Materials, shape (material_capacity,): material_friction (Coulomb mu), material_restitution (e),
        material_density kg/m^3 (informational after load: masses are computed at load).
    Planes (static half-spaces), shape (plane_capacity,): plane_normal (unit vec3, pointing out of the
        solid), plane_offset m (points p with dot(n, p) = offset lie on the plane), plane_material,
        plane_clip_normal / plane_clip_offset (contacts only where dot(clip_n, p) <= clip_offset: container
        walls end at the top), plane_thickness m (deeper penetration is ignored: the wall's back side).
    Runtime parameters, 0-d fields: body_count, material_count, plane_count, gravity m/s^2,
        restitution_threshold m/s, slop m, contact_margin m, torsional_friction m (app.sim.solver.kernel_prepare),
        position_correction (split-impulse beta),
        warm_start (fraction), max_speed m/s, penetration_limit (fraction of a half-size: app.sim.diagnostics),
        grid_cell_size m, grid_large_radius m (bodies of a larger
        bounding radius are large: app.sim.broadphase finds their pairs apart from the grid), static_count.
    """

    def __init__(self, body_capacity: int, material_capacity: int = 64, plane_capacity: int = 32,
                 hull_capacity: int = 0):
        self.body_capacity = int(body_capacity)
        self.hull_capacity = int(hull_capacity)
        self.material_capacity = int(material_capacity)
        self.plane_capacity = int(plane_capacity)
        n = self.body_capacity
        self.body_shape = ti.field(ti.i32, n)
        self.body_radius = ti.field(ti.f32, n)
        self.body_half_extents = ti.Vector.field(3, ti.f32, n)
        self.body_mass = ti.field(ti.f32, n)
        self.body_inv_mass = ti.field(ti.f32, n)
        self.body_inv_inertia = ti.Vector.field(3, ti.f32, n)
        self.body_material = ti.field(ti.i32, n)
        self.body_id = ti.field(ti.i32, n)
        self.body_kinematic = ti.field(ti.i32, n)
        self.body_kin_pivot = ti.Vector.field(3, ti.f32, n)
        self.body_kin_velocity = ti.Vector.field(3, ti.f32, n)
        self.body_kin_omega = ti.Vector.field(3, ti.f32, n)
        self.body_hull = ti.field(ti.i32, n)
        self.body_static_rank = ti.field(ti.i32, n)
        self.hulls = None
        if self.hull_capacity:
            from app.sim.convex import HullTable

            self.hulls = HullTable(self.hull_capacity)
        m = self.material_capacity
        self.material_friction = ti.field(ti.f32, m)
        self.material_restitution = ti.field(ti.f32, m)
        self.material_density = ti.field(ti.f32, m)
        p = self.plane_capacity
        self.plane_normal = ti.Vector.field(3, ti.f32, p)
        self.plane_offset = ti.field(ti.f32, p)
        self.plane_material = ti.field(ti.i32, p)
        self.plane_clip_normal = ti.Vector.field(3, ti.f32, p)
        self.plane_clip_offset = ti.field(ti.f32, p)
        self.plane_thickness = ti.field(ti.f32, p)
        self.body_count = ti.field(ti.i32, ())
        self.material_count = ti.field(ti.i32, ())
        self.plane_count = ti.field(ti.i32, ())
        self.gravity = ti.Vector.field(3, ti.f32, ())
        self.restitution_threshold = ti.field(ti.f32, ())
        self.slop = ti.field(ti.f32, ())
        self.contact_margin = ti.field(ti.f32, ())
        self.torsional_friction = ti.field(ti.f32, ())
        self.position_correction = ti.field(ti.f32, ())
        self.warm_start = ti.field(ti.f32, ())
        self.max_speed = ti.field(ti.f32, ())
        self.penetration_limit = ti.field(ti.f32, ())
        self.sleep_speed = ti.field(ti.f32, ())
        self.sleep_time = ti.field(ti.f32, ())
        self.grid_cell_size = ti.field(ti.f32, ())
        self.grid_large_radius = ti.field(ti.f32, ())
        self.static_count = ti.field(ti.i32, ())
        self.host_body_count = 0   # body_count[None] on the host (reading the field would sync the device)


def hull_capacity_for(hull_count: int) -> int:
    """Hulls a Model needs for a scene of `hull_count` distinct hulls: 0 without convex bodies, else room for the unit
    cube and them (at least 16, so that a scene with a few more hulls reuses the Model)."""
    return 0 if not hull_count else max(16, 1 << int(hull_count).bit_length())


# Runtime parameters: the sim keys a Model holds in 0-d fields of the same name.
PARAM_KEYS = ("gravity", "restitution_threshold", "slop", "contact_margin", "torsional_friction", "position_correction",
              "warm_start", "max_speed", "penetration_limit", "sleep_speed", "sleep_time")


class ModelBuilder:
    """A simulation's definition on the host, in scene order, and the one writer of Models.

    bodies: dict of numpy rows in scene order (bodies added at run time after them): shape (N,) int32, radius (N,)
        m (bounding radius), half_extents (N,3) m, mass (N,) kg, inv_mass (N,) 1/kg, inv_inertia (N,3)
        1/(kg m^2) (body frame), material (N,) int32, fixed (N,) bool, kinematic (N,) bool, kin_pivot, kin_velocity,
        kin_omega (N,3) (Model.body_kinematic), static (N,) bool (fixed and not kinematic: Model.body_static_rank),
        box_lo, box_hi (N,3) m: a static body's world bounding box (zero for the others).
    materials: list of dicts {name, density, friction, restitution} (index = material id).
    statics: the scene's static geometry as validated; plane_rows: its half-space rows (plane_rows()).
    params: the runtime parameters (PARAM_KEYS), resolved from the scene's sim mapping.
    large_body_factor: sim.large_body_factor (app.sim.broadphase's large bodies; 0: none).
    """

    def __init__(self, scene: Scene):
        sim = scene.resolved_sim()
        self.params = {key: sim[key] for key in PARAM_KEYS}
        self.params["gravity"] = [float(x) for x in sim["gravity"]]
        self.large_body_factor = float(sim.get("large_body_factor", LARGE_RADIUS_FACTOR))
        self.materials = [dict(m) for m in scene.materials]
        self.hulls = list(scene.hulls)
        self.statics = [dict(x) for x in scene.statics]
        # the walls' reach is sized from the scene's own bodies (bodies added later do not move the walls)
        self.plane_rows = plane_rows(scene.statics, float(body_bounding_radius(scene.bodies).max()))
        self.bodies = {}
        self._freed = {}   # body -> (inverse mass, inverse inertia) from before set_fixed fixed it
        self.add_bodies(scene.bodies)

    @property
    def body_count(self) -> int:
        return int(self.bodies["shape"].shape[0])

    def add_bodies(self, bodies):
        """Append body rows (a validated Scene's bodies: shape, radius, half_extents, material, fixed; positions and
        velocities belong to the State) after the others, with their mass properties."""
        mass, inv_mass, inv_inertia, _ = body_mass_properties(bodies, self.materials, self.hulls)
        count = len(bodies["shape"])
        kinematic = np.asarray(bodies.get("kinematic", np.zeros(count, bool)), bool)
        kin = {name: np.zeros((count, 3)) for name in ("kin_pivot", "kin_velocity", "kin_omega")}
        if kinematic.any():
            # a kinematic body's pivot in its own frame, and the pivot's velocity (its row's velocity is its centre's)
            k = np.flatnonzero(kinematic)
            pos = np.asarray(bodies["position"], np.float64)[k]
            pivot = np.asarray(bodies["pivot"], np.float64)[k]
            omega = np.asarray(bodies["angular_velocity"], np.float64)[k]
            kin["kin_pivot"][k] = np.einsum("kji,kj->ki", quat_matrices(np.asarray(bodies["orientation"])[k]),
                                            pivot - pos)
            kin["kin_velocity"][k] = np.asarray(bodies["velocity"], np.float64)[k] - np.cross(omega, pos - pivot)
            kin["kin_omega"][k] = omega
        radius = body_bounding_radius(bodies)
        static = static_mask(bodies)
        box_lo, box_hi = np.zeros((count, 3)), np.zeros((count, 3))
        if static.any():
            # a static body never moves: its world bounding box, the tighter of its rotated local box and its sphere
            k = np.flatnonzero(static)
            pos = np.asarray(bodies["position"], np.float64)[k]
            half = np.abs(quat_matrices(np.asarray(bodies["orientation"], np.float64)[k])) @ \
                np.asarray(bodies["half_extents"], np.float64)[k][:, :, None]
            half = np.minimum(half[:, :, 0], np.asarray(radius, np.float64)[k][:, None])
            box_lo[k], box_hi[k] = pos - half, pos + half
        new = {"shape": bodies["shape"], "radius": radius, "half_extents": bodies["half_extents"],
               "mass": mass, "inv_mass": inv_mass, "inv_inertia": inv_inertia, "material": bodies["material"],
               "fixed": bodies["fixed"], "kinematic": kinematic, "static": static, "box_lo": box_lo, "box_hi": box_hi,
               "hull": np.asarray(bodies.get("hull", np.full(count, -1)), np.int32) + 1, **kin}
        for key, arr in new.items():
            arr = np.asarray(arr)
            self.bodies[key] = arr.copy() if key not in self.bodies else np.concatenate([self.bodies[key], arr], 0)

    def _moving_radius(self) -> np.ndarray:
        """Bounding radii (m) of the bodies that are not static (all of them when every body is)."""
        r = self.bodies["radius"]
        moving = r[~self.bodies["static"]]
        return moving if moving.size else r

    def grid_radius(self) -> float:
        """The bounding radius (m) the broadphase's cells are sized for (grid_radius) over the bodies that are not
        static: static bodies sit in the cells their bounding box covers (static_cells), whatever their size."""
        return grid_radius(self._moving_radius(), self.large_body_factor)

    def large_body_count(self) -> int:
        """Bodies whose bounding radius exceeds grid_radius(): the broadphase pairs them apart from the grid."""
        return int((self._moving_radius().astype(np.float32) > np.float32(self.grid_radius())).sum())

    @property
    def static_count(self) -> int:
        return int(self.bodies["static"].sum())

    def static_cells(self, cell_size: float, table_bits: int):
        """(offsets (2^table_bits + 1,), ranks, axis_bits (3,)): a CSR of the static bodies by bucket, a static body
        named by its rank (Model.body_static_rank), listed once in the bucket of every cell its world bounding box,
        grown by one cell_size on every side, overlaps (a body whose centre lies in a cell finds there every static
        body within a cell of it: a body that is not large reaches at most half a cell beyond its centre, plus its
        reach over the step). The bucket of cell (x, y, z) is static_bucket: each axis's coordinate modulo
        2^axis_bits, packed x lowest. The bits follow the static bodies' extent in cells along each axis, so that a
        terrain fits the table without two of its cells sharing a bucket when it can (a flat one needs few bits
        along y); when the extent needs more than table_bits, the widest axes give up bits first."""
        table = 1 << table_bits
        k = np.flatnonzero(self.bodies["static"])
        if k.size == 0:
            return np.zeros(table + 1, np.int64), np.zeros(0, np.int32), np.zeros(3, np.int64)
        cs = np.float64(np.float32(cell_size))
        lo = np.floor((self.bodies["box_lo"][k] - cs) / cs).astype(np.int64)
        hi = np.floor((self.bodies["box_hi"][k] + cs) / cs).astype(np.int64)
        extent = hi.max(axis=0) - lo.min(axis=0) + 1
        bits = np.array([int(e - 1).bit_length() for e in extent], np.int64)
        while bits.sum() > table_bits:
            bits[int(np.argmax(bits))] -= 1
        period = np.int64(1) << bits
        # cells a period or more apart share a bucket: a range that wide covers every bucket along that axis
        span = np.minimum(hi - lo + 1, period)
        count = span.prod(axis=1)
        rank = np.repeat(np.arange(k.size, dtype=np.int64), count)
        local = np.arange(int(count.sum()), dtype=np.int64) - np.repeat(np.cumsum(count) - count, count)
        sx, sy = np.repeat(span[:, 0], count), np.repeat(span[:, 1], count)
        cell = [np.repeat(lo[:, 0], count) + local % sx, np.repeat(lo[:, 1], count) + (local // sx) % sy,
                np.repeat(lo[:, 2], count) + local // (sx * sy)]
        bucket = (cell[0] & (period[0] - 1)) | ((cell[1] & (period[1] - 1)) << bits[0]) | \
            ((cell[2] & (period[2] - 1)) << (bits[0] + bits[1]))
        key = np.unique(bucket * k.size + rank)
        bucket, rank = key // k.size, key % k.size
        offsets = np.zeros(table + 1, np.int64)
        offsets[1:] = np.cumsum(np.bincount(bucket, minlength=table))
        return offsets, rank.astype(np.int32), bits

    def hull_capacity(self) -> int:
        """Hulls a Model needs for this definition (hull_capacity_for)."""
        return hull_capacity_for(len(self.hulls))

    def fits(self, model: Model) -> bool:
        return (self.body_count <= model.body_capacity and len(self.materials) <= model.material_capacity
                and len(self.plane_rows) <= model.plane_capacity
                and (not self.hulls or len(self.hulls) + 1 <= model.hull_capacity))

    def finalize(self, body_capacity: int | None = None, order=None) -> Model:
        """A new Model of body_capacity (default: the body count) holding this definition (see write)."""
        model = Model(max(int(body_capacity or 0), self.body_count), hull_capacity=self.hull_capacity())
        self.write(model, order)
        return model

    def write(self, model: Model, order=None):
        """Write the whole definition into `model` (it must fit): parameters, materials, planes and bodies, the
        bodies stored in `order` (see write_bodies)."""
        if not self.fits(model):
            raise ValueError(f"ModelBuilder.write: {self.body_count} bodies, {len(self.materials)} materials and "
                             f"{len(self.plane_rows)} planes do not fit a Model of capacity {model.body_capacity}, "
                             f"{model.material_capacity}, {model.plane_capacity}")
        self.write_params(model)
        self.write_materials(model)
        self._write_planes(model)
        if model.hulls is not None:
            model.hulls.write(self.hulls)
        self.write_bodies(model, order)

    def write_params(self, model: Model):
        """The runtime parameters (no recompilation)."""
        for key in PARAM_KEYS:
            getattr(model, key)[None] = self.params[key]

    def read_live(self, model: Model):
        """Take the runtime parameters and the materials' friction and restitution from `model`: a user may write
        those fields directly (docs/simulator.md), and a rewrite (a capacity growth) must keep what they wrote."""
        for key in PARAM_KEYS:
            value = getattr(model, key)[None]
            self.params[key] = [float(x) for x in value] if key == "gravity" else value
        friction = model.material_friction.to_numpy()
        restitution = model.material_restitution.to_numpy()
        for k, mat in enumerate(self.materials):
            mat["friction"], mat["restitution"] = float(friction[k]), float(restitution[k])

    def set_param(self, model: Model, key: str, value):
        """Change runtime parameter `key` (PARAM_KEYS) here and in `model`."""
        self.params[key] = value
        getattr(model, key)[None] = value

    def write_materials(self, model: Model):
        m = model.material_capacity
        fr = np.zeros(m, np.float32)
        re = np.zeros(m, np.float32)
        de = np.zeros(m, np.float32)
        for k, mat in enumerate(self.materials):
            fr[k], re[k], de[k] = mat["friction"], mat["restitution"], mat["density"]
        model.material_friction.from_numpy(fr)
        model.material_restitution.from_numpy(re)
        model.material_density.from_numpy(de)
        model.material_count[None] = len(self.materials)

    def set_material(self, model: Model, index: int, friction=None, restitution=None):
        """Change material `index`'s friction / restitution here and in `model` (takes effect next step)."""
        if friction is not None:
            self.materials[index]["friction"] = float(friction)
            model.material_friction[index] = float(friction)
        if restitution is not None:
            self.materials[index]["restitution"] = float(restitution)
            model.material_restitution[index] = float(restitution)

    def _write_planes(self, model: Model):
        p = model.plane_capacity
        pn = np.zeros((p, 3), np.float32)
        po = np.zeros(p, np.float32)
        pm = np.zeros(p, np.int32)
        cn = np.zeros((p, 3), np.float32)
        co = np.zeros(p, np.float32)
        th = np.zeros(p, np.float32)
        for k, (n, off, mat, cnorm, coff, thick) in enumerate(self.plane_rows):
            pn[k], po[k], pm[k], cn[k], co[k], th[k] = n, off, mat, cnorm, coff, thick
        model.plane_normal.from_numpy(pn)
        model.plane_offset.from_numpy(po)
        model.plane_material.from_numpy(pm)
        model.plane_clip_normal.from_numpy(cn)
        model.plane_clip_offset.from_numpy(co)
        model.plane_thickness.from_numpy(th)
        model.plane_count[None] = len(self.plane_rows)

    def store_in_order(self, model: Model, scratch, order):
        """Move the bodies' rows on the device so that the body stored at order[k] (an i32 field of old stored
        indices, a permutation of the first body_count) is stored at k: what write_bodies would write for the new
        order, without a host round trip (a resort of 1M bodies on an H200: 13 ms in all, against 185 ms through the host).
        scratch: gather buffers scratch_i32, scratch_f32, scratch_vec (app.sim.reorder.Reorder)."""
        _kernel_store_in_order(model, scratch, order)

    def set_fixed(self, model: Model, body: int, stored: int, fixed: bool):
        """Fix (zero inverse mass and inertia) or free again scene body `body`, stored at index `stored`, here and
        in `model`, from the next step. A body fixed in the scene cannot be freed (its mass was never kept)."""
        b = self.bodies
        if b["kinematic"][body]:
            return   # (a kinematic body moves as it was told, held or not)
        if fixed and not b["fixed"][body]:
            self._freed[body] = (float(b["inv_mass"][body]), np.array(b["inv_inertia"][body]))
            inv_m, inv_i = 0.0, np.zeros(3)
        elif not fixed and body in self._freed:
            inv_m, inv_i = self._freed.pop(body)
        else:
            return
        b["fixed"][body] = fixed
        b["inv_mass"][body] = inv_m
        b["inv_inertia"][body] = inv_i
        model.body_inv_mass[stored] = inv_m
        model.body_inv_inertia[stored] = [float(x) for x in inv_i]

    def write_bodies(self, model: Model, order=None):
        """Write every body into `model`, body order[k] (a scene index) at stored index k (default: scene order),
        with its id (body_id = its scene index), and the body count and grid sizes that follow from the bodies:
        the cell size is 2 x the largest bounding radius of the bodies that are not large (grid_radius), so that
        such bodies that overlap are in adjacent cells."""
        n = self.body_count
        if n > model.body_capacity:
            raise ValueError(f"{n} bodies exceed the model's capacity {model.body_capacity}")
        order = np.arange(n) if order is None else np.asarray(order, np.int64)
        if order.shape != (n,):
            raise ValueError(f"ModelBuilder.write_bodies: an order of {order.shape} for {n} bodies")
        b = self.bodies
        cap = model.body_capacity

        def stored(a, dtype):
            out = np.zeros((cap,) + a.shape[1:], dtype)
            out[:n] = a[order]
            return out

        model.body_shape.from_numpy(stored(b["shape"], np.int32))
        model.body_radius.from_numpy(stored(b["radius"], np.float32))
        model.body_half_extents.from_numpy(stored(b["half_extents"], np.float32))
        model.body_mass.from_numpy(stored(b["mass"], np.float32))
        model.body_inv_mass.from_numpy(stored(b["inv_mass"], np.float32))
        model.body_inv_inertia.from_numpy(stored(b["inv_inertia"], np.float32))
        model.body_material.from_numpy(stored(b["material"], np.int32))
        model.body_id.from_numpy(stored(np.arange(n), np.int32))
        model.body_kinematic.from_numpy(stored(b["kinematic"], np.int32))
        model.body_kin_pivot.from_numpy(stored(b["kin_pivot"], np.float32))
        model.body_kin_velocity.from_numpy(stored(b["kin_velocity"], np.float32))
        model.body_kin_omega.from_numpy(stored(b["kin_omega"], np.float32))
        model.body_hull.from_numpy(stored(b["hull"], np.int32))
        static_rank = np.where(b["static"], np.cumsum(b["static"]) - 1, -1)
        model.body_static_rank.from_numpy(np.where(np.arange(cap) < n, stored(static_rank, np.int32), -1)
                                          .astype(np.int32))
        model.static_count[None] = self.static_count
        model.body_count[None] = n
        model.host_body_count = n
        r_grid = self.grid_radius()
        # (the contact margin as the f32 field holds it)
        margin = float(np.float32(self.params["contact_margin"]))
        model.grid_cell_size[None] = float(2.0 * r_grid * 1.02 + 2 * margin + 1e-6)
        model.grid_large_radius[None] = r_grid
