"""Scene files: reading, ``--set`` overrides, validation and expansion.

A scene is read in four stages, each of which can only fail with :class:`app.errors.UserError`
(one line naming the file, the key path and what was expected; run.py turns it into exit code 2):

1. ``read_yaml``: the file exists, is not empty, parses (syntax errors carry the line number);
2. ``apply_overrides``: ``key.path=value`` strings from ``--set`` patch the raw mapping (values are
   parsed as YAML scalars or lists, so ``sim.gravity=[0,-1.6,0]`` works);
3. ``validate``: every key is known (app.scene.schema), every value has the right type and range, no NaN, every
   material and shape name exists; defaults are filled in here and only here;
4. generators (app.scene.generators: grid, random, pyramid, stack) expand in place into per-body numpy arrays in
   scene order.

The result is a :class:`app.scene.schema.Scene`; nothing in this package imports Taichi.
"""
from __future__ import annotations

import copy
import os

import numpy as np
import yaml

from app.errors import UserError
from app.scene import yamlio
from app.scene.generators import Bodies, expand_generator, quat_mul, shape_size
from app.scene.hull import HullError, heightfield_triangles, mesh_triangles_checked, read_obj, triangle_hull
from app.scene.schema import (SHAPE_CONVEX, ARCHS, BODY_KEYS, CONTACT_STORAGES, MASS_RANGE, MATERIAL_KEYS, SIM_DEFAULTS, TOP_KEYS,
                              Ctx, Scene, body_mass_properties, bodies_pinned, quat_matrices, bool_ as _bool,
                              check_keys as _check_keys, limit,
                              mapping as _mapping, material as _material, num as _num, quat as _quat, str_ as _str,
                              vec as _vec)


def read_yaml(path) -> dict:
    path = str(path)
    if not os.path.exists(path):
        raise UserError(f"{path}: scene file not found (expected a YAML file; shipped scenes are in scenes/)")
    data = yamlio.load_file(path, "scene file")
    if data is None:
        raise UserError(f"{path}: the scene file is empty (expected a mapping with name, sim, materials, bodies)")
    if not isinstance(data, dict):
        raise UserError(f"{path}: top level: expected a mapping (name, sim, materials, bodies), got "
                        f"{type(data).__name__}")
    return data


def parse_override(text: str):
    """'a.b.0.c=value' -> (['a', 'b', 0, 'c'], parsed value). Raises UserError if malformed."""
    if "=" not in text:
        raise UserError(f"--set {text!r}: expected key.path=value (e.g. sim.seed=3)")
    key, _, value = text.partition("=")
    key = key.strip()
    if not key or any(not p for p in key.split(".")):
        raise UserError(f"--set {text!r}: expected key.path=value with a non-empty dotted key")
    try:
        parsed = yamlio.load(value) if value.strip() else ""
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


def validate(data: dict, path="<dict>") -> Scene:
    """Validate a raw scene mapping strictly and expand its generators. Raises UserError."""
    ctx = Ctx(path)
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
            sim[k] = _num(ctx, key, v, integer=True, low=1, high=limit(k))
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
        elif k in ("slop", "contact_margin", "torsional_friction"):
            sim[k] = None if v is None else float(_num(ctx, key, v, nonneg=True))
        elif k in ("position_correction", "warm_start"):
            sim[k] = float(_num(ctx, key, v, nonneg=True, high=1.0))
        elif k in ("restitution_threshold", "sleep_speed", "sleep_time"):
            sim[k] = float(_num(ctx, key, v, nonneg=True))
        elif k in ("max_speed", "penetration_limit"):
            sim[k] = float(_num(ctx, key, v, positive=True))
        elif k == "load_path_ratio":
            sim[k] = float(_num(ctx, key, v, nonneg=True))
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
    triangle_sets = []   # static meshes and heightfields: (key, (triangles (T, 3, 3) m, material))
    st_raw = data.get("static", []) or []
    if not isinstance(st_raw, list):
        ctx.fail("static", "a list of planes and containers", st_raw)
    for k, s in enumerate(st_raw):
        key = f"static[{k}]"
        _mapping(ctx, key, s)
        t = _str(ctx, f"{key}.type", s.get("type"), ("plane", "container", "mesh", "heightfield"))
        if t == "plane":
            _check_keys(ctx, key, s, {"type", "normal", "offset", "material"}, required=("normal", "material"))
            n = np.asarray(_vec(ctx, f"{key}.normal", s["normal"]), np.float64)
            if np.linalg.norm(n) < 1e-9:
                ctx.fail(f"{key}.normal", "a non-zero vector", s["normal"])
            statics.append({"type": "plane", "normal": (n / np.linalg.norm(n)).tolist(),
                            "offset": float(_num(ctx, f"{key}.offset", s.get("offset", 0.0))),
                            "material": material_index[_material(ctx, f"{key}.material", s["material"], names)]})
        elif t == "container":
            _check_keys(ctx, key, s, {"type", "size", "center", "material"}, required=("size", "material"))
            size = _vec(ctx, f"{key}.size", s["size"], 3, positive=True)
            center = _vec(ctx, f"{key}.center", s.get("center", [0.0, size[1] / 2, 0.0]), 3)
            statics.append({"type": "container", "size": [float(x) for x in size],
                            "center": [float(x) for x in center],
                            "material": material_index[_material(ctx, f"{key}.material", s["material"], names)]})
        else:
            triangle_sets.append((key, static_triangles(ctx, key, s, names, material_index)))

    bodies_raw = data["bodies"]
    if not isinstance(bodies_raw, list):
        ctx.fail("bodies", "a list of bodies and generators", bodies_raw)
    rng = np.random.default_rng(sim["seed"])
    acc = Bodies()
    ends = []   # the first body after bodies[k], for messages about a body of a generator
    for k, b in enumerate(bodies_raw):
        if k:
            ends.append(acc.count)
        key = f"bodies[{k}]"
        _mapping(ctx, key, b)
        if "generate" in b:
            expand_generator(ctx, key, b, acc, material_index, rng)
        else:
            _check_keys(ctx, key, b, BODY_KEYS, required=("shape", "position", "material"))
            ctx.take_bodies(key, 1)
            shape, r, h, axis, hull, com = shape_size(ctx, key, b, acc)
            pos = _vec(ctx, f"{key}.position", b["position"])
            vel = _vec(ctx, f"{key}.velocity", b.get("velocity", [0, 0, 0]))
            omega = _vec(ctx, f"{key}.angular_velocity", b.get("angular_velocity", [0, 0, 0]))
            fixed = _bool(ctx, f"{key}.fixed", b.get("fixed", False))
            kinematic = _bool(ctx, f"{key}.kinematic", b.get("kinematic", False))
            if fixed and kinematic:
                ctx.fail(f"{key}.kinematic", "not both fixed and kinematic (a kinematic body moves as its velocity "
                                             "says; a fixed one stays)", have_got=False)
            if "pivot" in b and not kinematic:
                ctx.fail(f"{key}.pivot", "a pivot only on a kinematic body (kinematic: true)", have_got=False)
            pivot = _vec(ctx, f"{key}.pivot", b.get("pivot", pos))
            if kinematic:   # the row holds the centre's velocity; `velocity` is the pivot's
                vel = (np.asarray(vel) + np.cross(omega, np.asarray(pos) - np.asarray(pivot))).tolist()
            q_user = _quat(ctx, f"{key}.orientation", b.get("orientation", [1, 0, 0, 0]))
            if hull >= 0:   # the body's state is its centre of mass: position names its vertices' origin
                pos = (np.asarray(pos) + quat_matrices(q_user)[0] @ com).tolist()
            acc.add(shape, r, h, pos, quat_mul(q_user, axis),
                    vel, omega, material_index[_material(ctx, f"{key}.material", b["material"], names)], fixed,
                    kinematic=kinematic, pivot=pivot, hull=hull)
    if acc.count == 0:
        ctx.fail("bodies", "at least one body", bodies_raw)
    # static triangles: fixed convex bodies of zero thickness after the scene's own bodies (their indices stay)
    for key, (tris, mat, one_sided) in triangle_sets:
        ctx.take_bodies(key, len(tris))
        for tri in tris:
            hull, centroid = triangle_hull(*tri, one_sided=one_sided)
            v = hull.vertices
            acc.add(SHAPE_CONVEX, float(np.linalg.norm(v, axis=1).max()), np.abs(v).max(axis=0).tolist(),
                    centroid.tolist(), [1.0, 0.0, 0.0, 0.0], [0.0] * 3, [0.0] * 3, mat, True, hull=acc.hull_index(hull))
    bodies = acc.arrays()
    _check_mass(ctx, bodies, materials, ends, acc.hulls)

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
                 material_index=material_index, statics=statics, bodies=bodies, camera=camera, raw=data,
                 hulls=acc.hulls)


def static_triangles(ctx, key, s, names, material_index):
    """(triangles (T, 3, 3) m, material id, one-sided) of a static `mesh` (an OBJ file's faces, moved by `offset`) or
    `heightfield` (a grid of heights over `size` about `center`); `two_sided: false` ignores their back faces (a
    heightfield's default; a mesh's is true)."""
    mat = material_index[_material(ctx, f"{key}.material", s.get("material"), names)]
    # a heightfield is ground (nothing belongs under it): one-sided unless asked; a mesh may be met from either side
    one_sided = not _bool(ctx, f"{key}.two_sided", s.get("two_sided", s["type"] == "mesh"))
    if s["type"] == "mesh":
        _check_keys(ctx, key, s, {"type", "file", "offset", "material", "two_sided"}, required=("file", "material"))
        name = _str(ctx, f"{key}.file", s["file"])
        base = os.path.dirname(ctx.path) if ctx.path not in ("<dict>", "") else ""
        path = name if os.path.isabs(name) else os.path.join(base, name)
        if not os.path.isfile(path):
            ctx.fail(f"{key}.file", f"an OBJ file (relative to the scene's folder); {path} does not exist", name)
        offset = np.asarray(_vec(ctx, f"{key}.offset", s.get("offset", [0, 0, 0])), np.float64)
        try:
            verts, tris, _lines = read_obj(path)
            return mesh_triangles_checked(verts + offset, tris), mat, one_sided
        except HullError as e:
            ctx.fail(f"{key}.file ({path})", f"a closed or open triangle mesh: {e}", have_got=False)
    _check_keys(ctx, key, s, {"type", "heights", "size", "center", "material", "two_sided"},
                required=("heights", "size", "material"))
    h = s["heights"]
    if not (isinstance(h, list) and len(h) >= 2 and all(isinstance(r, list) for r in h)
            and len({len(r) for r in h}) == 1 and len(h[0]) >= 2):
        ctx.fail(f"{key}.heights", "rows of heights (m), at least 2 rows of the same length >= 2 (a row along x, "
                                   "one row per z)", h)
    heights = [[_num(ctx, f"{key}.heights[{j}][{i}]", v) for i, v in enumerate(r)] for j, r in enumerate(h)]
    size = _vec(ctx, f"{key}.size", s["size"], 2, positive=True)
    center = _vec(ctx, f"{key}.center", s.get("center", [0, 0, 0]), 3)
    return heightfield_triangles(heights, size, center), mat, one_sided


def _check_mass(ctx, bodies, materials, ends, hulls):
    """Every moving body's mass and moments of inertia within MASS_RANGE (a density of 1e308, or a radius of 1e30,
    would give an infinite mass in the solver's float32)."""
    mass, _, _, inertia = body_mass_properties(bodies, materials, hulls)
    low, high = MASS_RANGE
    with np.errstate(invalid="ignore"):
        within = ((mass >= low) & (mass <= high)) & ((inertia >= low) & (inertia <= high)).all(1)
        bad = ~bodies_pinned(bodies) & ~within
    if bad.any():
        i = int(np.argmax(bad))
        k = int(np.searchsorted(ends, i, side="right"))
        mat = materials[int(bodies["material"][i])]
        ctx.fail(f"bodies[{k}]", f"a mass and moments of inertia within [{low:g}, {high:g}] (kg, kg m^2; the solver "
                 f"computes in float32): body {i} (material {mat['name']!r}, density {mat['density']:g} kg/m^3) has "
                 f"mass {mass[i]:.3g} kg and moments {', '.join(f'{x:.3g}' for x in inertia[i])}", have_got=False)


# The project's root: shipped scenes are found from any working directory.
PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def find_scene(path) -> str:
    """`path` when it exists; else, for a relative path, the same path under the project's root, or a shipped scene
    of that name (scenes/NAME, NAME with or without .yaml); else `path` (read_yaml then says it is missing)."""
    path = str(path)
    if os.path.exists(path) or os.path.isabs(path):
        return path
    for candidate in (os.path.join(PROJECT_ROOT, path), os.path.join(PROJECT_ROOT, "scenes", path),
                      os.path.join(PROJECT_ROOT, "scenes", path + ".yaml")):
        if os.path.isfile(candidate):
            return candidate
    return path


def load_scene(path, overrides=()) -> Scene:
    """Read, override, validate and expand a scene file (found by find_scene). Raises UserError on any bad input."""
    path = find_scene(path)
    data = read_yaml(path)
    data = apply_overrides(data, overrides, path)
    return validate(data, str(path))


def scene_from_dict(data: dict, overrides=(), path="<dict>") -> Scene:
    """Same as load_scene for a mapping built in code (tests, batch sweeps)."""
    return validate(apply_overrides(data, overrides, path), path)
