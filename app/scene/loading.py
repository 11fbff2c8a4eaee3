"""Scene files: YAML loading, strict validation, generators and ``--set`` overrides.

A scene is read in four stages, each of which can only fail with :class:`app.errors.UserError`
(one line naming the file, the key path and what was expected; run.py turns it into exit code 2):

1. ``read_yaml``: the file exists, is not empty, parses (syntax errors carry the line number);
2. ``apply_overrides``: ``key.path=value`` strings from ``--set`` patch the raw mapping (values are
   parsed as YAML scalars or lists, so ``sim.gravity=[0,-1.6,0]`` works);
3. ``validate``: every key is known, every value has the right type and range, no NaN, every
   material and shape name exists; defaults are filled in here and only here;
4. ``expand_bodies``: generators (grid, random, pyramid, stack) expand in place into per-body
   numpy arrays in scene order.

The result is a :class:`Scene`; nothing in this module imports Taichi.
"""
from __future__ import annotations

import copy
import math
import os
from dataclasses import dataclass, field

import numpy as np
import yaml

from app.errors import UserError

SHAPE_SPHERE = 0
SHAPE_BOX = 1
SHAPES = {"sphere": SHAPE_SPHERE, "box": SHAPE_BOX}
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
    "position_correction": 0.2,     # split-impulse fraction of (depth - slop) removed per step
    "warm_start": 1.0,              # fraction of last step's impulses applied first (1: full; less loses support in tall stacks)
    "padded_capacity": 32,          # contacts per body for `contacts: padded` (and the dynamic max)
    "max_speed": 1000.0,            # m/s: faster than this is an explosion
    "resort_interval": 500,         # steps between re-sorts of large scenes' bodies in memory (0: never)
    "large_body_factor": 4.0,       # bodies above this x the median bounding radius skip the grid (0: none do)
}

MATERIAL_KEYS = {"density": 1000.0, "friction": 0.5, "restitution": 0.1}


class _Ctx:
    """Where we are while validating: the file name, for messages."""

    def __init__(self, path):
        self.path = path

    def fail(self, key, expected, got=None, have_got=True):
        msg = f"{self.path}: {key}: expected {expected}"
        if have_got:
            msg += f", got {got!r}"
        raise UserError(msg)


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
        bodies: dict of numpy arrays, one row per body in scene order: shape (N,) int32, radius (N,)
            m, half_extents (N,3) m, position (N,3) m, orientation (N,4) w,x,y,z, velocity (N,3) m/s,
            angular_velocity (N,3) rad/s, material (N,) int32, fixed (N,) bool.
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

    @property
    def body_count(self) -> int:
        return int(self.bodies["shape"].shape[0])

    def resolved_sim(self) -> dict:
        """sim with derived defaults filled: slop and contact_margin scale with the smallest body so
        that tiny bodies are not allowed to sink a large fraction of their size."""
        s = dict(self.sim)
        sizes = body_bounding_radius(self.bodies)
        smallest = float(np.min(_smallest_extent(self.bodies))) if sizes.size else 0.1
        if s["slop"] is None:
            s["slop"] = min(5e-4, 0.005 * smallest)
        if s["contact_margin"] is None:
            s["contact_margin"] = min(2e-3, 0.05 * smallest)
        return s


def _smallest_extent(bodies):
    return np.where(bodies["shape"] == SHAPE_SPHERE, bodies["radius"], bodies["half_extents"].min(axis=1))


def body_bounding_radius(bodies) -> np.ndarray:
    """Radius (m) of each body's bounding sphere: r for spheres, |half_extents| for boxes."""
    return np.where(bodies["shape"] == SHAPE_SPHERE, bodies["radius"],
                    np.linalg.norm(bodies["half_extents"], axis=1)).astype(np.float64)


# ----------------------------------------------------------------------------------------------------
# stage 1: reading
# ----------------------------------------------------------------------------------------------------
def read_yaml(path) -> dict:
    path = str(path)
    if not os.path.exists(path):
        raise UserError(f"{path}: scene file not found (expected a YAML file; shipped scenes are in scenes/)")
    if os.path.isdir(path):
        raise UserError(f"{path}: is a directory, expected a YAML scene file")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: cannot read scene file ({e})") from None
    if not text.strip():
        raise UserError(f"{path}: the scene file is empty (expected a mapping with name, sim, materials, bodies)")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "unknown line"
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise UserError(f"{path}: YAML syntax error at {where}: {problem}") from None
    if data is None:
        raise UserError(f"{path}: the scene file is empty (expected a mapping with name, sim, materials, bodies)")
    if not isinstance(data, dict):
        raise UserError(f"{path}: top level: expected a mapping (name, sim, materials, bodies), got "
                        f"{type(data).__name__}")
    return data


# ----------------------------------------------------------------------------------------------------
# stage 2: overrides
# ----------------------------------------------------------------------------------------------------
def parse_override(text: str):
    """'a.b.0.c=value' -> (['a', 'b', 0, 'c'], parsed value). Raises UserError if malformed."""
    if "=" not in text:
        raise UserError(f"--set {text!r}: expected key.path=value (e.g. sim.seed=3)")
    key, _, value = text.partition("=")
    key = key.strip()
    if not key or any(not p for p in key.split(".")):
        raise UserError(f"--set {text!r}: expected key.path=value with a non-empty dotted key")
    try:
        parsed = yaml.safe_load(value) if value.strip() else ""
    except yaml.YAMLError:
        raise UserError(f"--set {text!r}: the value is not a YAML scalar or list") from None
    parts = [int(p) if p.lstrip("-").isdigit() else p for p in key.split(".")]
    return parts, parsed


def apply_overrides(data: dict, overrides, path="<scene>") -> dict:
    """Return a deep copy of `data` with each 'key.path=value' applied (intermediate mappings are
    created; list indices must exist)."""
    data = copy.deepcopy(data)
    for text in overrides or ():
        parts, value = parse_override(text)
        node = data
        for depth, p in enumerate(parts):
            last = depth == len(parts) - 1
            shown = ".".join(str(x) for x in parts[: depth + 1])
            if isinstance(node, list):
                if not isinstance(p, int) or not -len(node) <= p < len(node):
                    raise UserError(f"--set {text!r}: {shown}: expected a list index in [0, {len(node)}), "
                                    f"got {p!r}")
            elif isinstance(node, dict):
                if isinstance(p, int):
                    p = str(p)
                if not last and p not in node:
                    node[p] = {}
            else:
                raise UserError(f"--set {text!r}: {shown}: cannot index into a {type(node).__name__}")
            if last:
                node[p] = value
            else:
                node = node[p]
    return data


# ----------------------------------------------------------------------------------------------------
# stage 3: validation helpers
# ----------------------------------------------------------------------------------------------------
def _num(ctx, key, v, positive=False, nonneg=False, integer=False, low=None, high=None):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        ctx.fail(key, "an integer" if integer else "a number", v)
    if integer and not isinstance(v, int):
        ctx.fail(key, "an integer", v)
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


def _vec(ctx, key, v, n=3, positive=False, nonneg=False, integer=False):
    if not isinstance(v, (list, tuple)) or len(v) != n:
        ctx.fail(key, f"a list of {n} {'integers' if integer else 'numbers'}", v)
    return [_num(ctx, f"{key}[{k}]", x, positive=positive, nonneg=nonneg, integer=integer) for k, x in enumerate(v)]


def _str(ctx, key, v, choices=None):
    if not isinstance(v, str):
        ctx.fail(key, "a string" if choices is None else "one of " + " | ".join(choices), v)
    if choices is not None and v not in choices:
        ctx.fail(key, "one of " + " | ".join(choices), v)
    return v


def _bool(ctx, key, v):
    if not isinstance(v, bool):
        ctx.fail(key, "true or false", v)
    return v


def _mapping(ctx, key, v):
    if not isinstance(v, dict):
        ctx.fail(key, "a mapping", v)
    return v


def _check_keys(ctx, key, d, allowed, required=()):
    for k in d:
        if k not in allowed:
            ctx.fail(f"{key}.{k}" if key else str(k),
                     "a known key (unknown key; valid keys: " + ", ".join(sorted(allowed)) + ")", have_got=False)
    for k in required:
        if k not in d:
            ctx.fail(f"{key}.{k}" if key else str(k), "this key (it is required)", have_got=False)


def _material(ctx, key, v, names):
    if not isinstance(v, str) or v not in names:
        ctx.fail(key, "a material defined under materials (" + ", ".join(sorted(names)) + ")", v)
    return v


def _quat(ctx, key, v):
    q = _vec(ctx, key, v, 4)
    n = math.sqrt(sum(x * x for x in q))
    if n < 1e-9:
        ctx.fail(key, "a non-zero quaternion [w, x, y, z]", v)
    return [x / n for x in q]


# ----------------------------------------------------------------------------------------------------
# stage 3+4: validate and expand
# ----------------------------------------------------------------------------------------------------
TOP_KEYS = {"name", "description", "sim", "materials", "static", "bodies", "camera"}
BODY_KEYS = {"shape", "radius", "half_extents", "position", "velocity", "angular_velocity", "orientation",
             "material", "fixed"}
GEN_COMMON = {"generate", "shape", "radius", "half_extents", "material", "velocity", "angular_velocity",
              "fixed"}
GEN_KEYS = {
    "grid": GEN_COMMON | {"count", "origin", "spacing", "jitter", "random_orientation"},
    "random": GEN_COMMON | {"count", "min", "max", "box_fraction", "size_jitter", "materials",
                            "random_orientation"},
    "pyramid": GEN_COMMON | {"levels", "origin", "gap"},
    "stack": GEN_COMMON | {"count", "origin", "gap"},
}


class _Bodies:
    """Accumulates bodies row by row (scene order)."""

    def __init__(self):
        self.rows = {k: [] for k in ("shape", "radius", "half_extents", "position", "orientation", "velocity",
                                     "angular_velocity", "material", "fixed")}
        self.blocks = []

    def add(self, shape, radius, half, pos, quat, vel, omega, mat, fixed):
        r = self.rows
        r["shape"].append(shape)
        r["radius"].append(radius)
        r["half_extents"].append(half)
        r["position"].append(pos)
        r["orientation"].append(quat)
        r["velocity"].append(vel)
        r["angular_velocity"].append(omega)
        r["material"].append(mat)
        r["fixed"].append(fixed)

    def add_many(self, shape, radius, half, pos, quat, vel, omega, mat, fixed):
        """Append a block of rows (numpy arrays); keeps scene order."""
        self._flush()
        self.blocks.append({"shape": shape, "radius": radius, "half_extents": half, "position": pos,
                            "orientation": quat, "velocity": vel, "angular_velocity": omega, "material": mat,
                            "fixed": fixed})

    _WIDTH = {"half_extents": 3, "position": 3, "orientation": 4, "velocity": 3, "angular_velocity": 3}
    _DTYPE = {"shape": np.int32, "material": np.int32, "fixed": bool}

    def _flush(self):
        r = self.rows
        n = len(r["shape"])
        if n:
            self.blocks.append({k: np.asarray(v, self._DTYPE.get(k, np.float64)).reshape(
                (n, self._WIDTH[k]) if k in self._WIDTH else (n,)) for k, v in r.items()})
            for v in r.values():
                v.clear()

    def arrays(self):
        self._flush()
        out = {}
        for k in self.rows:
            shape = (0, self._WIDTH[k]) if k in self._WIDTH else (0,)
            parts = [np.asarray(b[k], self._DTYPE.get(k, np.float64)) for b in self.blocks]
            out[k] = np.concatenate(parts, 0) if parts else np.zeros(shape, self._DTYPE.get(k, np.float64))
        return out


def _random_quat(rng):
    q = rng.normal(size=4)
    return (q / np.linalg.norm(q)).tolist()


def _shape_size(ctx, key, b):
    """(shape id, radius, half extents) of a body or generator entry; the unused size is filled from the
    used one so that every body has both (radius = bounding radius for boxes)."""
    shape = _str(ctx, f"{key}.shape", b.get("shape"), tuple(SHAPES)) if "shape" in b else ctx.fail(
        f"{key}.shape", "this key (sphere | box)", have_got=False)
    if shape == "sphere":
        if "radius" not in b:
            ctx.fail(f"{key}.radius", "this key (a number > 0) for a sphere", have_got=False)
        if "half_extents" in b:
            ctx.fail(f"{key}.half_extents", "no half_extents on a sphere (use radius)", have_got=False)
        r = _num(ctx, f"{key}.radius", b["radius"], positive=True)
        return SHAPE_SPHERE, r, [r, r, r]
    if "half_extents" not in b:
        ctx.fail(f"{key}.half_extents", "this key (a list of 3 numbers > 0) for a box", have_got=False)
    if "radius" in b:
        ctx.fail(f"{key}.radius", "no radius on a box (use half_extents)", have_got=False)
    h = _vec(ctx, f"{key}.half_extents", b["half_extents"], 3, positive=True)
    return SHAPE_BOX, float(np.linalg.norm(h)), h


def validate(data: dict, path="<dict>") -> Scene:
    """Validate a raw scene mapping strictly and expand its generators. Raises UserError."""
    ctx = _Ctx(path)
    _mapping(ctx, "top level", data)
    _check_keys(ctx, "", data, TOP_KEYS, required=("name", "materials", "bodies"))
    name = _str(ctx, "name", data["name"])
    description = _str(ctx, "description", data.get("description", ""))

    sim_raw = _mapping(ctx, "sim", data.get("sim", {}) if data.get("sim") is not None else {})
    _check_keys(ctx, "sim", sim_raw, set(SIM_DEFAULTS))
    sim = dict(SIM_DEFAULTS)
    sim["gravity"] = list(SIM_DEFAULTS["gravity"])
    for k, v in sim_raw.items():
        key = f"sim.{k}"
        if k == "dt":
            sim[k] = float(_num(ctx, key, v, positive=True, high=0.1))
        elif k in ("substeps", "solver_iterations"):
            sim[k] = _num(ctx, key, v, integer=True, low=1)
        elif k == "padded_capacity":
            sim[k] = _num(ctx, key, v, integer=True, low=1, high=4096)
        elif k in ("seed", "resort_interval"):
            sim[k] = _num(ctx, key, v, integer=True, nonneg=True)
        elif k == "gravity":
            sim[k] = [float(x) for x in _vec(ctx, key, v, 3)]
        elif k == "contacts":
            sim[k] = _str(ctx, key, v, CONTACT_STORAGES)
        elif k == "arch":
            sim[k] = _str(ctx, key, v, ARCHS)
        elif k in ("slop", "contact_margin"):
            sim[k] = None if v is None else float(_num(ctx, key, v, nonneg=True))
        elif k in ("position_correction", "warm_start"):
            sim[k] = float(_num(ctx, key, v, nonneg=True, high=1.0))
        elif k in ("restitution_threshold",):
            sim[k] = float(_num(ctx, key, v, nonneg=True))
        elif k == "max_speed":
            sim[k] = float(_num(ctx, key, v, positive=True))
        elif k == "large_body_factor":
            sim[k] = float(_num(ctx, key, v, nonneg=True))
            if 0 < sim[k] < 1:
                ctx.fail(key, "0 (no large bodies) or a number >= 1", v)

    mats_raw = _mapping(ctx, "materials", data["materials"])
    if not mats_raw:
        ctx.fail("materials", "at least one material", mats_raw)
    materials, material_index = [], {}
    for mname, m in mats_raw.items():
        key = f"materials.{mname}"
        if not isinstance(mname, str):
            ctx.fail(key, "a material name (string)", mname)
        _mapping(ctx, key, m)
        _check_keys(ctx, key, m, set(MATERIAL_KEYS))
        mat = {"name": mname}
        for k, dflt in MATERIAL_KEYS.items():
            v = m.get(k, dflt)
            if k == "density":
                mat[k] = float(_num(ctx, f"{key}.{k}", v, positive=True))
            else:
                mat[k] = float(_num(ctx, f"{key}.{k}", v, nonneg=True, high=(1.0 if k == "restitution" else None)))
        material_index[mname] = len(materials)
        materials.append(mat)
    names = set(material_index)

    statics = []
    st_raw = data.get("static", []) or []
    if not isinstance(st_raw, list):
        ctx.fail("static", "a list of planes and containers", st_raw)
    for k, s in enumerate(st_raw):
        key = f"static[{k}]"
        _mapping(ctx, key, s)
        t = _str(ctx, f"{key}.type", s.get("type"), ("plane", "container"))
        if t == "plane":
            _check_keys(ctx, key, s, {"type", "normal", "offset", "material"}, required=("normal", "material"))
            n = np.asarray(_vec(ctx, f"{key}.normal", s["normal"]), np.float64)
            if np.linalg.norm(n) < 1e-9:
                ctx.fail(f"{key}.normal", "a non-zero vector", s["normal"])
            statics.append({"type": "plane", "normal": (n / np.linalg.norm(n)).tolist(),
                            "offset": float(_num(ctx, f"{key}.offset", s.get("offset", 0.0))),
                            "material": material_index[_material(ctx, f"{key}.material", s["material"], names)]})
        else:
            _check_keys(ctx, key, s, {"type", "size", "center", "material"}, required=("size", "material"))
            size = _vec(ctx, f"{key}.size", s["size"], 3, positive=True)
            center = _vec(ctx, f"{key}.center", s.get("center", [0.0, size[1] / 2, 0.0]), 3)
            statics.append({"type": "container", "size": [float(x) for x in size],
                            "center": [float(x) for x in center],
                            "material": material_index[_material(ctx, f"{key}.material", s["material"], names)]})

    bodies_raw = data["bodies"]
    if not isinstance(bodies_raw, list):
        ctx.fail("bodies", "a list of bodies and generators", bodies_raw)
    rng = np.random.default_rng(sim["seed"])
    acc = _Bodies()
    for k, b in enumerate(bodies_raw):
        key = f"bodies[{k}]"
        _mapping(ctx, key, b)
        if "generate" in b:
            _expand_generator(ctx, key, b, acc, material_index, rng)
        else:
            _check_keys(ctx, key, b, BODY_KEYS, required=("shape", "position", "material"))
            shape, r, h = _shape_size(ctx, key, b)
            acc.add(shape, r, h, _vec(ctx, f"{key}.position", b["position"]),
                    _quat(ctx, f"{key}.orientation", b.get("orientation", [1, 0, 0, 0])),
                    _vec(ctx, f"{key}.velocity", b.get("velocity", [0, 0, 0])),
                    _vec(ctx, f"{key}.angular_velocity", b.get("angular_velocity", [0, 0, 0])),
                    material_index[_material(ctx, f"{key}.material", b["material"], names)],
                    _bool(ctx, f"{key}.fixed", b.get("fixed", False)))
    bodies = acc.arrays()
    if bodies["shape"].shape[0] == 0:
        ctx.fail("bodies", "at least one body", bodies_raw)

    camera = data.get("camera")
    if camera is not None:
        _mapping(ctx, "camera", camera)
        _check_keys(ctx, "camera", camera, {"position", "lookat", "fov", "up"})
        camera = dict(camera)
        for ck in ("position", "lookat", "up"):
            if ck in camera:
                camera[ck] = _vec(ctx, f"camera.{ck}", camera[ck])
        if "fov" in camera:
            camera["fov"] = _num(ctx, "camera.fov", camera["fov"], positive=True, high=179)
    return Scene(path=str(path), name=name, description=description, sim=sim, materials=materials,
                 material_index=material_index, statics=statics, bodies=bodies, camera=camera, raw=data)


def _expand_generator(ctx, key, g, acc, material_index, rng):
    kind = _str(ctx, f"{key}.generate", g["generate"], tuple(GEN_KEYS))
    _check_keys(ctx, key, g, GEN_KEYS[kind])
    names = set(material_index)
    vel = _vec(ctx, f"{key}.velocity", g.get("velocity", [0, 0, 0]))
    omega = _vec(ctx, f"{key}.angular_velocity", g.get("angular_velocity", [0, 0, 0]))
    fixed = _bool(ctx, f"{key}.fixed", g.get("fixed", False))
    ident = [1.0, 0.0, 0.0, 0.0]

    if kind == "random":
        # Non-overlapping by construction: bodies take distinct slots of a lattice over [min, max], each
        # slot wide enough for the largest body, so the pile never starts interpenetrated.
        if "materials" in g and "material" in g:
            ctx.fail(f"{key}.materials", "either material or materials, not both", have_got=False)
        if "materials" in g:
            ml = g["materials"]
            if not isinstance(ml, list) or not ml:
                ctx.fail(f"{key}.materials", "a non-empty list of material names", ml)
            mats = [material_index[_material(ctx, f"{key}.materials[{i}]", m, names)] for i, m in enumerate(ml)]
        else:
            if "material" not in g:
                ctx.fail(f"{key}.material", "this key (or materials: [..])", have_got=False)
            mats = [material_index[_material(ctx, f"{key}.material", g["material"], names)]]
        count = _num(ctx, f"{key}.count", g.get("count"), integer=True, low=1)
        lo = np.asarray(_vec(ctx, f"{key}.min", g.get("min")), np.float64)
        hi = np.asarray(_vec(ctx, f"{key}.max", g.get("max")), np.float64)
        if np.any(hi <= lo):
            ctx.fail(f"{key}.max", "max > min on every axis", g.get("max"))
        shape_name = g.get("shape", "sphere")
        _str(ctx, f"{key}.shape", shape_name, ("sphere", "box", "mixed"))
        r = _num(ctx, f"{key}.radius", g["radius"], positive=True) if "radius" in g else None
        h = _vec(ctx, f"{key}.half_extents", g["half_extents"], 3, positive=True) if "half_extents" in g else None
        if shape_name in ("sphere", "mixed") and r is None:
            ctx.fail(f"{key}.radius", "this key for spheres", have_got=False)
        if shape_name in ("box", "mixed") and h is None:
            ctx.fail(f"{key}.half_extents", "this key for boxes", have_got=False)
        box_fraction = {"sphere": 0.0, "box": 1.0}.get(shape_name)
        if box_fraction is None:
            box_fraction = _num(ctx, f"{key}.box_fraction", g.get("box_fraction", 0.5), nonneg=True, high=1.0)
        sj = _num(ctx, f"{key}.size_jitter", g.get("size_jitter", 0.0), nonneg=True, high=0.9)
        rand_orient = _bool(ctx, f"{key}.random_orientation", g.get("random_orientation", True))
        bound = max(r or 0.0, float(np.linalg.norm(h)) if h is not None else 0.0)
        cell = 2.0 * bound * 1.05
        dims = np.maximum(1, np.floor((hi - lo) / cell).astype(np.int64))
        slots = int(np.prod(dims))
        if slots < count:
            ctx.fail(f"{key}.count", f"at most {slots} bodies (the region [min, max] holds {slots} "
                                     f"non-overlapping slots of {cell:.4g} m)", count)
        pick = rng.choice(slots, size=count, replace=False) if slots > count else rng.permutation(slots)
        pick.sort()  # fill from the bottom up (y is the slowest index below)
        ix = pick % dims[0]
        iz = (pick // dims[0]) % dims[2]
        iy = pick // (dims[0] * dims[2])
        pos = lo + (np.stack([ix, iy, iz], 1) + 0.5) * cell
        scale = 1.0 - sj * rng.random(count)
        mat = np.asarray(mats, np.int32)[rng.integers(len(mats), size=count)]
        if rand_orient:
            q = rng.normal(size=(count, 4))
            q /= np.linalg.norm(q, axis=1, keepdims=True)
        else:
            q = np.tile(ident, (count, 1))
        is_box = rng.random(count) < box_fraction
        half = np.where(is_box[:, None], np.asarray(h if h is not None else [1, 1, 1], np.float64)[None] * scale[:, None],
                        (r or 1.0) * scale[:, None] * np.ones((1, 3)))
        radius = np.where(is_box, np.linalg.norm(half, axis=1), (r or 1.0) * scale)
        acc.add_many(np.where(is_box, SHAPE_BOX, SHAPE_SPHERE), radius, half, pos, q,
                     np.tile(vel, (count, 1)), np.tile(omega, (count, 1)), mat, np.full(count, fixed))
        return

    shape, r, h = _shape_size(ctx, key, g)
    if "material" not in g:
        ctx.fail(f"{key}.material", "this key", have_got=False)
    mat = material_index[_material(ctx, f"{key}.material", g["material"], names)]
    ext = np.asarray(h, np.float64)  # half size along x, y, z (spheres: r, r, r)

    if kind == "grid":
        count = _vec(ctx, f"{key}.count", g.get("count"), 3, positive=True, integer=True)
        origin = np.asarray(_vec(ctx, f"{key}.origin", g.get("origin", [0, 0, 0])), np.float64)
        min_spacing = 2 * (r if shape == SHAPE_SPHERE else float(np.linalg.norm(h)))
        spacing = _num(ctx, f"{key}.spacing", g.get("spacing", min_spacing * 1.05), positive=True)
        jitter = _num(ctx, f"{key}.jitter", g.get("jitter", 0.0), nonneg=True)
        rand_orient = _bool(ctx, f"{key}.random_orientation", g.get("random_orientation", False))
        if spacing - 2 * jitter < (2 * r if shape == SHAPE_SPHERE else 2 * float(np.max(h))) and not rand_orient:
            ctx.fail(f"{key}.spacing", f"spacing - 2*jitter >= the body's size so bodies do not start "
                                       f"overlapping", spacing)
        for iy in range(count[1]):
            for iz in range(count[2]):
                for ix in range(count[0]):
                    p = origin + spacing * np.array([ix, iy, iz], np.float64)
                    if jitter:
                        p = p + rng.uniform(-jitter, jitter, 3)
                    q = _random_quat(rng) if rand_orient else ident
                    acc.add(shape, r, h, p.tolist(), q, vel, omega, mat, fixed)
    elif kind == "stack":
        count = _num(ctx, f"{key}.count", g.get("count"), integer=True, low=1)
        origin = np.asarray(_vec(ctx, f"{key}.origin", g.get("origin", [0, 0, 0])), np.float64)
        gap = _num(ctx, f"{key}.gap", g.get("gap", 0.0), nonneg=True)
        # origin is the bottom centre of the stack (on the floor when origin.y = 0).
        for k in range(count):
            p = origin + np.array([0.0, ext[1] + k * (2 * ext[1] + gap), 0.0])
            acc.add(shape, r, h, p.tolist(), ident, vel, omega, mat, fixed)
    elif kind == "pyramid":
        levels = _num(ctx, f"{key}.levels", g.get("levels"), integer=True, low=1)
        origin = np.asarray(_vec(ctx, f"{key}.origin", g.get("origin", [0, 0, 0])), np.float64)
        gap = _num(ctx, f"{key}.gap", g.get("gap", 0.0), nonneg=True)
        # A 2-D pyramid in the x-y plane: level k has levels-k bodies, offset by half a body. `gap` separates
        # neighbours within a level; levels rest exactly on each other.
        w = 2 * ext[0] + gap
        for k in range(levels):
            n = levels - k
            for c in range(n):
                x = (c - (n - 1) / 2.0) * w
                p = origin + np.array([x, ext[1] + k * 2 * ext[1], 0.0])
                acc.add(shape, r, h, p.tolist(), ident, vel, omega, mat, fixed)


def load_scene(path, overrides=()) -> Scene:
    """Read, override, validate and expand a scene file. Raises UserError on any bad input."""
    data = read_yaml(path)
    data = apply_overrides(data, overrides, path)
    return validate(data, str(path))


def scene_from_dict(data: dict, overrides=(), path="<dict>") -> Scene:
    """Same as load_scene for a mapping built in code (tests, batch sweeps)."""
    return validate(apply_overrides(data, overrides, path), path)
