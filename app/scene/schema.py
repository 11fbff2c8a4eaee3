"""The scene schema: what a scene file may hold, its defaults, the validated Scene, and the checks that name the
file, the key and what was expected. Nothing here imports Taichi."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from app.errors import UserError

SHAPE_SPHERE = 0
SHAPE_BOX = 1
# A capsule: the points within `radius` of a segment of half length `half_length` along the body's local y axis.
# Its row stores radius = the capsule's radius and half_extents = (radius, half_length + radius, radius), its local
# bounding box, as a box's half_extents are.
SHAPE_CAPSULE = 2
# A convex hull (app.scene.hull): the Scene's hulls[hull] in the body's frame (centre of mass at the origin, principal
# axes along x, y, z). Its row stores radius = its bounding radius and half_extents = its local bounding box.
SHAPE_CONVEX = 3
SHAPES = {"sphere": SHAPE_SPHERE, "box": SHAPE_BOX, "capsule": SHAPE_CAPSULE, "convex": SHAPE_CONVEX}
# Which local axis a capsule's segment lies along (`axis:`): the rotation (w, x, y, z) that takes local y there,
# applied before the body's orientation.
CAPSULE_AXES = {"y": (1.0, 0.0, 0.0, 0.0), "x": (math.sqrt(0.5), 0.0, 0.0, -math.sqrt(0.5)),
                "z": (math.sqrt(0.5), math.sqrt(0.5), 0.0, 0.0)}
CONTACT_STORAGES = ("vla", "padded", "dynamic")
ARCHS = ("auto", "cpu", "cuda")

# Defaults for every `sim` key. The first seven are the schema; the rest are solver knobs
# a scene may set (documented in scenes/README.md). None means "derived from the bodies" (see
# Scene.resolved_sim).
SIM_DEFAULTS = {
    "dt": 0.002,
    "substeps": 8,
    "gravity": [0.0, -9.81, 0.0],
    "solver_iterations": 10,
    "contacts": "vla",
    "seed": 0,
    "arch": "auto",
    "restitution_threshold": 0.5,   # m/s: slower approaches do not bounce (resting contacts stay quiet)
    "slop": None,                   # m: penetration left uncorrected; default min(5e-4, 0.5% of smallest size)
    "contact_margin": None,         # m: speculative gap; default min(2e-3, 5% of smallest size)
    "torsional_friction": None,     # m: contact patch radius resisting spin about the normal; default min(1e-3, 2% of smallest size)
    "position_correction": 0.2,     # split-impulse fraction of (depth - slop) removed per step
    "warm_start": 1.0,              # fraction of last step's impulses applied first (1: full; less loses support in tall stacks)
    "padded_capacity": 32,          # contacts per body for `contacts: padded` (and the dynamic max)
    "max_speed": 1000.0,            # m/s: faster than this is an explosion
    "penetration_limit": 1.0,       # a contact deeper than this x the smaller half-size of its pair is reported
    "resort_interval": 500,         # steps between re-sorts of large scenes' bodies in memory (0: never)
    "large_body_factor": 4.0,       # bodies above this x the median bounding radius skip the grid (0: none do)
    "load_path_ratio": 50.0,        # the load-path correction runs when the heaviest movable body is this x the lightest (0: always), and for stacks 8 deep (app.sim.load_paths.STACK_SHARE)
    "sleep_speed": 0.05,            # m/s: a body slower than this (|v| + |w| r) for sleep_time sleeps once no awake body touches it (0: never)
    "sleep_time": 0.5,              # s
}

MATERIAL_KEYS = {"density": 1000.0, "friction": 0.5, "restitution": 0.1}


TOP_KEYS = {"name", "description", "sim", "materials", "static", "bodies", "camera"}
BODY_KEYS = {"shape", "radius", "half_extents", "half_length", "axis", "vertices", "mesh", "position", "velocity", "angular_velocity",
             "orientation", "material", "fixed", "kinematic", "pivot"}
GEN_COMMON = {"generate", "shape", "radius", "half_extents", "half_length", "axis", "vertices", "mesh", "material",
              "velocity", "angular_velocity", "fixed"}
GEN_KEYS = {
    "grid": GEN_COMMON | {"count", "origin", "spacing", "jitter", "random_orientation"},
    "random": GEN_COMMON | {"count", "min", "max", "box_fraction", "size_jitter", "materials",
                            "random_orientation", "hull_points", "variants"},
    "pyramid": GEN_COMMON | {"levels", "origin", "gap", "copies", "copy_spacing"},
    "stack": GEN_COMMON | {"count", "origin", "gap"},
}


# Bounds on what a scene may ask for, so that a typo (count: 1e9) or a hostile file fails at once with a message
# instead of filling memory or running for days. Each can be raised for a run: SMOLVLA_LIMITS="bodies=50000000,
# substeps=5000" in the environment (scenes/README.md).
LIMITS = {
    "bodies": 20_000_000,          # bodies a scene expands to (generators included)
    "substeps": 10_000,            # sim.substeps
    "solver_iterations": 10_000,   # sim.solver_iterations
    "file_bytes": 64 * 2**20,      # size of a scene or sweep file
    "aliases": 1_000,              # YAML aliases (*name) in one document
    "runs": 100_000,               # runs one batch expands to (scenes x seeds x values)
}


def limit(name: str) -> int:
    """LIMITS[name], or its value in SMOLVLA_LIMITS ("name=value,name=value"; every entry is checked: a known name
    and a positive whole number, such as 50000000 or 5e7)."""
    import math
    import os

    value = LIMITS[name]
    for item in os.environ.get("SMOLVLA_LIMITS", "").split(","):
        if not item.strip():
            continue
        key, _, text = item.partition("=")
        key = key.strip()
        if key not in LIMITS:
            raise UserError(f"SMOLVLA_LIMITS: {item.strip()!r}: unknown limit {key!r}; expected one of "
                            f"{', '.join(LIMITS)}")
        try:
            number = float(text)
        except ValueError:
            number = math.nan
        if not (math.isfinite(number) and number == int(number) and number >= 1):
            raise UserError(f"SMOLVLA_LIMITS: {item.strip()!r}: expected {key}=N with N a whole number >= 1")
        if key == name:
            value = int(number)
    return value


def _short_repr(value, width=80) -> str:
    """repr(value), cut to `width` characters: a message must stay one line, whatever a file holds."""
    import reprlib

    r = reprlib.Repr()
    r.maxstring = r.maxother = width
    r.maxlist = r.maxdict = r.maxtuple = 8
    r.maxlevel = 3
    text = r.repr(value)
    return text if len(text) <= width else text[:width - 3] + "..."


class Ctx:
    """Where we are while validating: the file name, for messages, and the bodies the scene may still add."""

    def __init__(self, path):
        self.path = path
        self.bodies_left = limit("bodies")

    def fail(self, key, expected, got=None, have_got=True):
        msg = f"{self.path}: {key}: expected {expected}"
        if have_got:
            msg += f", got {_short_repr(got)}"
        raise UserError(msg)

    def take_bodies(self, key, n):
        """Count n more bodies against LIMITS["bodies"], before they are made."""
        if n > self.bodies_left:
            total = limit("bodies")
            self.fail(key, f"at most {total:,} bodies in a scene (SMOLVLA_LIMITS=bodies=N raises the limit); this "
                           f"entry adds {n:,} to {total - self.bodies_left:,}", have_got=False)
        self.bodies_left -= n


@dataclass
class Scene:
    """A validated, expanded scene.

    Attributes:
        path: the file it came from ("<dict>" when built in code).
        name, description: strings.
        sim: every sim key, defaults filled (see SIM_DEFAULTS); `slop`/`contact_margin` may be None
            until resolved_sim() derives them.
        materials: list of dicts {name, density kg/m^3, friction, restitution}; index = material id.
        material_index: name -> material id.
        statics: list of dicts {type: plane, normal, offset, material} and {type: container, size,
            center, material}.
        bodies: dict of numpy arrays, one row per body in scene order: shape (N,) int32 (SHAPES), radius (N,)
            m (a sphere's or a capsule's radius; a box's bounding radius), half_extents (N,3) m (the local
            bounding box: a box's half extents, (r, r, r) for a sphere, (r, half_length + r, r) for a capsule), position (N,3) m, orientation (N,4) w,x,y,z, velocity (N,3) m/s,
            angular_velocity (N,3) rad/s, material (N,) int32, fixed (N,) bool, kinematic (N,) bool (it moves as
            its velocity and angular velocity say, rigidly about its pivot, whatever touches it), pivot (N,3) m
            (the point its angular velocity turns it about, at the start; its position if none was given). A
            kinematic body's velocity row is its centre's: the pivot's velocity + w x (position - pivot). hull (N,)
            int32: a convex body's index into `hulls` (-1 for the other shapes); its position is its centre of mass.
        hulls: list of app.scene.hull.Hull, the distinct convex shapes (bodies with equal hulls share one).
        camera: dict or None.
        raw: the validated mapping (after overrides), for metrics and batch tooling.
    """

    path: str
    name: str
    description: str
    sim: dict
    materials: list
    material_index: dict
    statics: list
    bodies: dict
    camera: dict | None = None
    raw: dict = field(default_factory=dict)
    hulls: list = field(default_factory=list)

    @property
    def body_count(self) -> int:
        return int(self.bodies["shape"].shape[0])

    def resolved_sim(self) -> dict:
        """sim with derived defaults filled: slop, contact_margin and torsional_friction scale with the smallest
        body, so that tiny bodies are not allowed to sink a large fraction of their size (nor stop spinning at
        once)."""
        s = dict(self.sim)
        sizes = body_bounding_radius(self.bodies)
        smallest = float(np.min(smallest_extent(self.bodies, self.hulls))) if sizes.size else 0.1
        if s["slop"] is None:
            s["slop"] = min(5e-4, 0.005 * smallest)
        if s["contact_margin"] is None:
            s["contact_margin"] = min(2e-3, 0.05 * smallest)
        if s["torsional_friction"] is None:
            s["torsional_friction"] = min(1e-3, 0.02 * smallest)
        return s


def smallest_extent(bodies, hulls=()):
    """Each body's smallest half size (m): a sphere's or capsule's radius, a box's smallest half extent, a convex
    hull's distance from its centre of mass to its nearest face."""
    out = np.where(bodies["shape"] == SHAPE_SPHERE, bodies["radius"], bodies["half_extents"].min(axis=1))
    convex = np.flatnonzero(bodies["shape"] == SHAPE_CONVEX)
    if convex.size:   # (a static triangle has no thickness: it does not count)
        inradius = np.array([h.inradius if h.volume > 0 else np.inf for h in hulls], np.float64)
        out = out.astype(np.float64)
        out[convex] = inradius[bodies["hull"][convex]]
    return out


def body_bounding_radius(bodies) -> np.ndarray:
    """Radius (m) of each body's bounding sphere: r for spheres, |half_extents| for boxes, half_length + r for
    capsules, the farthest vertex for convex hulls (their radius row)."""
    shape = bodies["shape"]
    h = bodies["half_extents"]
    return np.select([shape == SHAPE_SPHERE, shape == SHAPE_CAPSULE, shape == SHAPE_CONVEX],
                     [bodies["radius"], h[:, 1], bodies["radius"]], np.linalg.norm(h, axis=1)).astype(np.float64)


# A body's mass (kg) and principal moments of inertia (kg m^2) must lie in this range: the solver works in float32
# (largest 3.4e38), and inverse masses times impulses, and masses times speeds squared, must stay finite.
MASS_RANGE = (1e-30, 1e30)


def quat_matrices(q) -> np.ndarray:
    """(K, 3, 3) float64 rotation matrices of quaternions (K, 4) (w, x, y, z), unit length."""
    q = np.asarray(q, np.float64).reshape(-1, 4)
    w, x, y, z = q[:, 0], q[:, 1], q[:, 2], q[:, 3]
    return np.stack([
        np.stack([1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)], -1),
        np.stack([2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)], -1),
        np.stack([2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)], -1)], 1)


def bodies_pinned(bodies) -> np.ndarray:
    """(N,) bool: the bodies no contact moves, fixed or kinematic (infinite mass: zero inverse mass and inertia)."""
    fixed = np.asarray(bodies["fixed"], bool)
    return fixed | np.asarray(bodies.get("kinematic", np.zeros_like(fixed)), bool)


def body_mass_properties(bodies, materials, hulls=()):
    """(mass kg (N,), inverse mass 1/kg (N,), body-frame inverse inertia diagonal 1/(kg m^2) (N,3), inertia diagonal
    kg m^2 (N,3)) from shape and density (convex bodies: their hull's volume and principal moments, `hulls`); fixed
    bodies get zero inverse mass and inertia. In float64: a value out of MASS_RANGE (validate refuses it) comes out
    as it is, inf included, without a warning."""
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        dens = np.asarray([m["density"] for m in materials], np.float64)[bodies["material"]]
        r = bodies["radius"]
        h = bodies["half_extents"]
        sphere = bodies["shape"] == SHAPE_SPHERE
        capsule = bodies["shape"] == SHAPE_CAPSULE
        seg = h[:, 1] - h[:, 0]   # a capsule's half length
        cylinder = np.pi * r ** 2 * 2.0 * seg
        ball = 4.0 / 3.0 * np.pi * r ** 3
        vol = np.select([sphere, capsule], [ball, cylinder + ball], 8.0 * h.prod(axis=1))
        mass = dens * vol
        inertia = np.empty((len(r), 3))
        inertia[sphere] = (0.4 * mass[sphere] * r[sphere] ** 2)[:, None]
        # capsule (axis y): the cylinder, and the two hemispheres moved out to the cylinder's ends (each hemisphere's
        # centre of mass sits 3r/8 from its flat face: I = m_ball (2r^2/5 + hl^2 + 3 hl r / 4) across the axis)
        rc, sc = r[capsule], seg[capsule]
        m_cyl = dens[capsule] * cylinder[capsule]
        m_ball = dens[capsule] * ball[capsule]
        axial = m_cyl * rc ** 2 / 2.0 + m_ball * 0.4 * rc ** 2
        across = m_cyl * (rc ** 2 / 4.0 + (2.0 * sc) ** 2 / 12.0) + m_ball * (0.4 * rc ** 2 + sc ** 2 + 0.75 * sc * rc)
        inertia[capsule] = np.stack([across, axial, across], 1)
        convex = bodies["shape"] == SHAPE_CONVEX
        if convex.any():
            which = bodies["hull"][convex]
            vol[convex] = np.array([hl.volume for hl in hulls], np.float64)[which]
            mass = dens * vol
            inertia[convex] = dens[convex, None] * np.array([hl.inertia for hl in hulls], np.float64)[which]
        bx = ~(sphere | capsule | convex)
        hx, hy, hz = h[bx, 0], h[bx, 1], h[bx, 2]
        m = mass[bx]
        inertia[bx] = np.stack([m / 3 * (hy * hy + hz * hz), m / 3 * (hx * hx + hz * hz), m / 3 * (hx * hx + hy * hy)],
                               1)
        pinned = bodies_pinned(bodies)
        inv_mass = np.where(pinned, 0.0, 1.0 / mass)
        inv_inertia = np.where(pinned[:, None], 0.0, 1.0 / inertia)
    return mass, inv_mass, inv_inertia, inertia


# ----------------------------------------------------------------------------------------------------
# validation helpers: each returns the checked value or fails with one line naming the key
# ----------------------------------------------------------------------------------------------------
def num(ctx, key, v, positive=False, nonneg=False, integer=False, low=None, high=None):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        ctx.fail(key, "an integer" if integer else "a number", v)
    if integer and isinstance(v, float):   # 1e3 and 20.0 are the integers they look like
        if not (math.isfinite(v) and v.is_integer()):
            ctx.fail(key, "an integer", v)
        v = int(v)
    if not math.isfinite(v):
        ctx.fail(key, "a finite number (not NaN or inf)", v)
    if positive and v <= 0:
        ctx.fail(key, "a number > 0", v)
    if nonneg and v < 0:
        ctx.fail(key, "a number >= 0", v)
    if low is not None and v < low:
        ctx.fail(key, f"a number >= {low}", v)
    if high is not None and v > high:
        ctx.fail(key, f"a number <= {high}", v)
    return v


def vec(ctx, key, v, n=3, positive=False, nonneg=False, integer=False):
    if not isinstance(v, (list, tuple)) or len(v) != n:
        ctx.fail(key, f"a list of {n} {'integers' if integer else 'numbers'}", v)
    return [num(ctx, f"{key}[{k}]", x, positive=positive, nonneg=nonneg, integer=integer) for k, x in enumerate(v)]


def str_(ctx, key, v, choices=None):
    if not isinstance(v, str):
        ctx.fail(key, "a string" if choices is None else "one of " + " | ".join(choices), v)
    if choices is not None and v not in choices:
        ctx.fail(key, "one of " + " | ".join(choices), v)
    return v


def bool_(ctx, key, v):
    if not isinstance(v, bool):
        ctx.fail(key, "true or false", v)
    return v


def mapping(ctx, key, v):
    if not isinstance(v, dict):
        ctx.fail(key, "a mapping", v)
    return v


def check_keys(ctx, key, d, allowed, required=()):
    for k in d:
        if k not in allowed:
            ctx.fail(f"{key}.{k}" if key else str(k),
                     "a known key (unknown key; valid keys: " + ", ".join(sorted(allowed)) + ")", have_got=False)
    for k in required:
        if k not in d:
            ctx.fail(f"{key}.{k}" if key else str(k), "this key (it is required)", have_got=False)


def material(ctx, key, v, names):
    if not isinstance(v, str) or v not in names:
        ctx.fail(key, "a material defined under materials (" + ", ".join(sorted(names)) + ")", v)
    return v


def quat(ctx, key, v):
    q = vec(ctx, key, v, 4)
    n = math.sqrt(sum(x * x for x in q))
    if n < 1e-9:
        ctx.fail(key, "a non-zero quaternion [w, x, y, z]", v)
    return [x / n for x in q]
