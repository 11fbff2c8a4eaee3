"""Model: the static (non-time-varying) definition of a simulation, on the device.

Everything a step reads but does not change lives here: per-body shape, size, mass and inertia,
materials, static planes, and the runtime parameters (gravity, thresholds). Parameters are 0-d fields
rather than Python constants so that the viewer can change them live without recompiling a kernel.

Capacities (bodies, materials, planes) are fixed when the Model is built; `Model.load` refills a model
whose capacity suffices, so a new scene of the same size reuses every compiled kernel.
"""
from __future__ import annotations

import numpy as np
import taichi as ti

from app.scene import SHAPE_SPHERE, Scene, body_bounding_radius

vec3 = ti.types.vector(3, ti.f32)
vec4 = ti.types.vector(4, ti.f32)

# Container walls generate contacts only for bodies at most this many (largest) bounding radii behind the wall
# plane, and each body only while its centre is less than half its own bounding radius behind it
# (app.narrowphase.plane_accepts): a body that left the container over the top is not dragged back through the
# wall.
WALL_THICKNESS_RADII = 4.0
NO_CLIP = 3.0e38

# Large bodies: those whose bounding radius exceeds LARGE_RADIUS_FACTOR x the median, at most MAX_LARGE_BODIES of
# the largest. The grid's cells are sized for the other bodies, and each large body meets every body in a pass of
# its own (app.broadphase): one big box among small spheres would otherwise widen every cell to its size, putting
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


def body_mass_properties(bodies, materials):
    """(mass kg (N,), body-frame inverse inertia diagonal 1/(kg m^2) (N,3)) from shape and density;
    fixed bodies get zero inverse mass and inertia."""
    dens = np.asarray([m["density"] for m in materials], np.float64)[bodies["material"]]
    r = bodies["radius"]
    h = bodies["half_extents"]
    sphere = bodies["shape"] == SHAPE_SPHERE
    vol = np.where(sphere, 4.0 / 3.0 * np.pi * r ** 3, 8.0 * h.prod(axis=1))
    mass = dens * vol
    inertia = np.empty((len(r), 3))
    inertia[sphere] = (0.4 * mass[sphere] * r[sphere] ** 2)[:, None]
    bx = ~sphere
    hx, hy, hz = h[bx, 0], h[bx, 1], h[bx, 2]
    m = mass[bx]
    inertia[bx] = np.stack([m / 3 * (hy * hy + hz * hz), m / 3 * (hx * hx + hz * hz), m / 3 * (hx * hx + hy * hy)], 1)
    inv_mass = np.where(bodies["fixed"], 0.0, 1.0 / mass)
    inv_inertia = np.where(bodies["fixed"][:, None], 0.0, 1.0 / inertia)
    return mass, inv_mass, inv_inertia


# Per-body fields of the Model (device) and keys of its host mirror, in stored order: what a re-sort of the
# bodies permutes (app.reorder).
BODY_FIELDS = ("body_shape", "body_radius", "body_half_extents", "body_mass", "body_inv_mass", "body_inv_inertia",
               "body_material", "body_id")
HOST_BODY_KEYS = ("shape", "radius", "half_extents", "mass", "inv_mass", "inv_inertia", "material", "fixed", "id")


@ti.data_oriented
class Model:
    """Static description of the bodies, materials and planes.

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
    Materials, shape (material_capacity,): material_friction (Coulomb mu), material_restitution (e),
        material_density kg/m^3 (informational after load: masses are computed at load).
    Planes (static half-spaces), shape (plane_capacity,): plane_normal (unit vec3, pointing out of the
        solid), plane_offset m (points p with dot(n, p) = offset lie on the plane), plane_material,
        plane_clip_normal / plane_clip_offset (contacts only where dot(clip_n, p) <= clip_offset: container
        walls end at the top), plane_thickness m (deeper penetration is ignored: the wall's back side).
    Runtime parameters, 0-d fields: body_count, material_count, plane_count, gravity m/s^2,
        restitution_threshold m/s, slop m, contact_margin m, position_correction (split-impulse beta),
        warm_start (fraction), max_speed m/s, grid_cell_size m, grid_large_radius m (bodies of a larger
        bounding radius are large: app.broadphase finds their pairs apart from the grid).
    """

    def __init__(self, body_capacity: int, material_capacity: int = 64, plane_capacity: int = 32):
        self.body_capacity = int(body_capacity)
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
        self.position_correction = ti.field(ti.f32, ())
        self.warm_start = ti.field(ti.f32, ())
        self.max_speed = ti.field(ti.f32, ())
        self.grid_cell_size = ti.field(ti.f32, ())
        self.grid_large_radius = ti.field(ti.f32, ())
        self.large_body_factor = LARGE_RADIUS_FACTOR   # host: sim.large_body_factor, read by set_bodies
        # host mirrors (numpy) of what was loaded, for accessors and growth
        self.host = {}
        self.host_body_count = 0

    def fits(self, scene: Scene, extra_bodies: int = 0) -> bool:
        return (scene.body_count + extra_bodies <= self.body_capacity and len(scene.materials) <= self.material_capacity
                and len(plane_rows(scene.statics, 1.0)) <= self.plane_capacity)

    def load(self, scene: Scene, bodies=None, ids=None):
        """Fill every field from a validated scene (capacity must suffice: see fits). bodies: the scene's
        body rows in the order to store them (default scene.bodies; the Simulation passes them in Z-order),
        ids: their scene indices (default 0, 1, ...); the planes' reach is computed from all of the scene's
        bodies either way."""
        sim = scene.resolved_sim()
        self.set_params(sim)  # first: the grid cell size below depends on the contact margin
        self.set_materials(scene.materials)
        self.set_bodies(scene.bodies if bodies is None else bodies, scene.materials, start=0, ids=ids)
        rows = plane_rows(scene.statics, float(body_bounding_radius(scene.bodies).max()))
        if len(rows) > self.plane_capacity:
            raise ValueError(f"{len(rows)} static planes exceed the model's plane capacity {self.plane_capacity}")
        self.host["statics"] = list(scene.statics)
        self.host["plane_rows"] = rows
        pn = np.zeros((self.plane_capacity, 3), np.float32)
        po = np.zeros(self.plane_capacity, np.float32)
        pm = np.zeros(self.plane_capacity, np.int32)
        cn = np.zeros((self.plane_capacity, 3), np.float32)
        co = np.zeros(self.plane_capacity, np.float32)
        th = np.zeros(self.plane_capacity, np.float32)
        for k, (n, off, mat, cnorm, coff, thick) in enumerate(rows):
            pn[k], po[k], pm[k], cn[k], co[k], th[k] = n, off, mat, cnorm, coff, thick
        self.plane_normal.from_numpy(pn)
        self.plane_offset.from_numpy(po)
        self.plane_material.from_numpy(pm)
        self.plane_clip_normal.from_numpy(cn)
        self.plane_clip_offset.from_numpy(co)
        self.plane_thickness.from_numpy(th)
        self.plane_count[None] = len(rows)

    def set_params(self, sim: dict):
        """Runtime parameters from a (resolved) sim mapping; no recompilation."""
        self.gravity[None] = sim["gravity"]
        self.large_body_factor = float(sim.get("large_body_factor", LARGE_RADIUS_FACTOR))
        self.restitution_threshold[None] = sim["restitution_threshold"]
        if sim.get("slop") is not None:
            self.slop[None] = sim["slop"]
        if sim.get("contact_margin") is not None:
            self.contact_margin[None] = sim["contact_margin"]
        self.position_correction[None] = sim["position_correction"]
        self.warm_start[None] = sim["warm_start"]
        self.max_speed[None] = sim["max_speed"]

    def set_materials(self, materials):
        if len(materials) > self.material_capacity:
            raise ValueError(f"{len(materials)} materials exceed the model's capacity {self.material_capacity}")
        m = self.material_capacity
        fr = np.zeros(m, np.float32)
        re = np.zeros(m, np.float32)
        de = np.zeros(m, np.float32)
        for k, mat in enumerate(materials):
            fr[k], re[k], de[k] = mat["friction"], mat["restitution"], mat["density"]
        self.material_friction.from_numpy(fr)
        self.material_restitution.from_numpy(re)
        self.material_density.from_numpy(de)
        self.material_count[None] = len(materials)
        self.host["materials"] = [dict(x) for x in materials]

    def set_bodies(self, bodies, materials, start: int, ids=None):
        """Write bodies [start, start+len) (numpy rows as in Scene.bodies; ids: their persistent ids, default
        start, start+1, ...) and update body_count and the grid cell size (2 x the largest bounding radius of the
        bodies that are not large, so that such bodies that overlap are in adjacent cells; see grid_radius). The
        host mirror `host` holds the rows in stored order."""
        k = int(bodies["shape"].shape[0])
        if start + k > self.body_capacity:
            raise ValueError(f"{start + k} bodies exceed the model's capacity {self.body_capacity}")
        ids = np.arange(start, start + k) if ids is None else np.asarray(ids)
        if ids.shape != (k,):
            raise ValueError(f"set_bodies: {ids.shape[0] if ids.ndim else 0} ids for {k} bodies")
        mass, inv_mass, inv_inertia = body_mass_properties(bodies, materials)
        h = self.host
        new = {"shape": bodies["shape"], "radius": body_bounding_radius(bodies), "half_extents": bodies["half_extents"],
               "mass": mass, "inv_mass": inv_mass, "inv_inertia": inv_inertia, "material": bodies["material"],
               "fixed": bodies["fixed"], "id": ids}
        for key, arr in new.items():
            if start == 0 or key not in h:
                h[key] = np.asarray(arr).copy()
            else:
                h[key] = np.concatenate([h[key][:start], np.asarray(arr)], axis=0)
        n_total = start + k
        cap = self.body_capacity

        def pad(a, dtype):
            out = np.zeros((cap,) + a.shape[1:], dtype)
            out[: a.shape[0]] = a
            return out

        self.body_shape.from_numpy(pad(h["shape"], np.int32))
        self.body_radius.from_numpy(pad(h["radius"], np.float32))
        self.body_half_extents.from_numpy(pad(h["half_extents"], np.float32))
        self.body_mass.from_numpy(pad(h["mass"], np.float32))
        self.body_inv_mass.from_numpy(pad(h["inv_mass"], np.float32))
        self.body_inv_inertia.from_numpy(pad(h["inv_inertia"], np.float32))
        self.body_material.from_numpy(pad(h["material"], np.int32))
        self.body_id.from_numpy(pad(h["id"], np.int32))
        self.body_count[None] = n_total
        self.host_body_count = n_total  # host copy: reading body_count[None] would sync the device
        r_grid = grid_radius(h["radius"][:n_total], self.large_body_factor)
        self.grid_cell_size[None] = float(2.0 * r_grid * 1.02 + 2 * self.contact_margin[None] + 1e-6)
        self.grid_large_radius[None] = r_grid
        self.host["large_bodies"] = int((h["radius"][:n_total].astype(np.float32) > np.float32(r_grid)).sum())
        smallest = float(np.where(h["shape"] == SHAPE_SPHERE, h["radius"], h["half_extents"].min(axis=1)).min())
        self.host["smallest_extent"] = smallest
