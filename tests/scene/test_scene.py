"""Scene loading: strict validation (one clear message naming file, key path and expectation), overrides,
generators. No Taichi here."""
import math
import os
import time
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from app.errors import UserError
from app.scene.schema import limit as schema_limit
from app.scene import SHAPE_BOX, SHAPE_SPHERE, apply_overrides, load_scene, scene_from_dict

ROOT = Path(__file__).resolve().parents[2]
SCENES = sorted((ROOT / "scenes").glob("*.yaml"))


def _base():
    return {"name": "t", "materials": {"steel": {"density": 7800, "friction": 0.4, "restitution": 0.3}},
            "static": [{"type": "plane", "normal": [0, 1, 0], "offset": 0, "material": "steel"}],
            "bodies": [{"shape": "sphere", "radius": 0.5, "position": [0, 1, 0], "material": "steel"}]}


def _write(tmp_path, text, name="s.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def _err(tmp_path, data_or_text):
    text = data_or_text if isinstance(data_or_text, str) else yaml.safe_dump(data_or_text)
    p = _write(tmp_path, text)
    with pytest.raises(UserError) as ei:
        load_scene(p)
    msg = str(ei.value)
    assert str(p) in msg, msg          # names the file
    assert "\n" not in msg, msg         # one line
    assert ei.value.exit_code == 2
    return msg


def test_all_shipped_scenes_validate():
    names = {p.stem for p in SCENES}
    assert {"default", "pyramid", "ramp", "cradle", "bounce", "pile_100k", "pile_1m"} <= names
    counts = {p.stem: load_scene(p).body_count for p in SCENES if p.stem != "pile_1m"}
    assert counts["pyramid"] == 55 and counts["pile_100k"] == 100_000 and 2000 <= counts["default"] <= 5000


def test_pile_1m_expands_to_a_million_bodies():
    s = load_scene(ROOT / "scenes" / "pile_1m.yaml")
    assert s.body_count == 1_000_000
    b = s.bodies
    # the random generator places bodies on distinct lattice slots: no two centres closer than the slot
    slot = 2 * max(0.05, float(np.linalg.norm([0.045, 0.04, 0.045]))) * 1.05
    sample = b["position"][:20000]
    d = np.linalg.norm(sample[1:] - sample[:-1], axis=1)
    assert d.min() >= slot * 0.999
    assert set(np.unique(b["shape"])) == {SHAPE_SPHERE, SHAPE_BOX}


@pytest.mark.parametrize("mutate,key,expected", [
    (lambda d: d.update(colour="red"), "colour", "unknown key"),
    (lambda d: d["bodies"][0].update(radius=-1), "bodies[0].radius", "> 0"),
    (lambda d: d["bodies"][0].update(radius=0), "bodies[0].radius", "> 0"),
    (lambda d: d["bodies"][0].update(radius="big"), "bodies[0].radius", "a number"),
    (lambda d: d["bodies"][0].update(radius=float("nan")), "bodies[0].radius", "finite"),
    (lambda d: d["bodies"][0].update(material="gold"), "bodies[0].material", "steel"),
    (lambda d: d["bodies"][0].update(shape="cone"), "bodies[0].shape", "sphere | box"),
    (lambda d: d["materials"]["steel"].update(density=0), "materials.steel.density", "> 0"),
    (lambda d: d["materials"]["steel"].update(density=-5), "materials.steel.density", "> 0"),
    (lambda d: d["materials"]["steel"].update(restitution=1.5), "materials.steel.restitution", "<= 1"),
    (lambda d: d.update(sim={"dt": "fast"}), "sim.dt", "a number"),
    (lambda d: d.update(sim={"contacts": "linked"}), "sim.contacts", "vla | padded | dynamic"),
    (lambda d: d.update(sim={"substeps": 2.5}), "sim.substeps", "an integer"),
    (lambda d: d.update(sim={"gravity": [0, -9.81]}), "sim.gravity", "a list of 3"),
    (lambda d: d.update(sim={"solverIterations": 3}), "sim.solverIterations", "unknown key"),
    (lambda d: d.update(sim={"resort_interval": -1}), "sim.resort_interval", ">= 0"),
    (lambda d: d.update(sim={"large_body_factor": 0.5}), "sim.large_body_factor", "0 (no large bodies) or a number >= 1"),
    (lambda d: d.update(sim={"large_body_factor": -2}), "sim.large_body_factor", ">= 0"),
    (lambda d: d.update(sim={"resort_interval": 0.5}), "sim.resort_interval", "an integer"),
    (lambda d: d["bodies"][0].pop("position"), "bodies[0].position", "required"),
    (lambda d: d["bodies"].append({"shape": "box", "half_extents": [1, 0, 1], "position": [0, 0, 0],
                                   "material": "steel"}), "bodies[1].half_extents[1]", "> 0"),
    (lambda d: d["static"].append({"type": "wall"}), "static[1].type", "plane | container"),
    (lambda d: d["static"][0].update(normal=[0, 0, 0]), "static[0].normal", "non-zero"),
    (lambda d: d["bodies"].append({"generate": "spiral", "shape": "sphere"}), "bodies[1].generate", "grid"),
    (lambda d: d["bodies"].append({"generate": "grid", "shape": "sphere", "radius": 0.1, "count": [2, 2],
                                   "material": "steel"}), "bodies[1].count", "a list of 3"),
    (lambda d: d.update(bodies=[]), "bodies", "at least one body"),
])
def test_bad_values_name_key_and_expectation(tmp_path, mutate, key, expected):
    d = _base()
    mutate(d)
    msg = _err(tmp_path, d)
    assert f": {key}:" in msg, msg
    assert expected in msg, msg


def test_yaml_syntax_error_names_line(tmp_path):
    msg = _err(tmp_path, "name: t\nmaterials:\n  steel: {density: 1\nbodies: []\n")
    assert "YAML error at line" in msg


def test_empty_and_missing_files(tmp_path):
    assert "empty" in _err(tmp_path, "")
    assert "empty" in _err(tmp_path, "# only a comment\n")
    with pytest.raises(UserError, match="not found"):
        load_scene(tmp_path / "nope.yaml")
    assert "top level" in _err(tmp_path, "- 1\n- 2\n")


def test_overrides_patch_values_and_are_validated(tmp_path):
    p = _write(tmp_path, yaml.safe_dump(_base()))
    s = load_scene(p, ["sim.seed=3", "materials.steel.friction=0.25", "sim.gravity=[0, -1.62, 0]",
                       "bodies.0.radius=0.25", "sim.contacts=padded"])
    assert s.sim["seed"] == 3 and s.sim["contacts"] == "padded"
    assert s.materials[0]["friction"] == 0.25 and s.sim["gravity"] == [0, -1.62, 0]
    assert s.bodies["radius"][0] == 0.25
    with pytest.raises(UserError, match=r"sim\.dt: expected a number > 0"):
        load_scene(p, ["sim.dt=-1"])
    with pytest.raises(UserError, match="key.path=value"):
        load_scene(p, ["sim.seed"])
    with pytest.raises(UserError, match=r"bodies\.5: expected a list index"):
        load_scene(p, ["bodies.5.radius=1"])
    assert apply_overrides({"a": {"b": 1}}, ["a.c.d=x"]) == {"a": {"b": 1, "c": {"d": "x"}}}


def test_generators_expand_in_place_in_order():
    d = _base()
    d["bodies"] = [
        {"shape": "sphere", "radius": 0.1, "position": [9, 9, 9], "material": "steel"},
        {"generate": "grid", "shape": "box", "half_extents": [0.1, 0.2, 0.1], "count": [2, 3, 4],
         "origin": [0, 1, 0], "spacing": 0.5, "material": "steel"},
        {"generate": "stack", "shape": "box", "half_extents": [0.5, 0.25, 0.5], "count": 4, "origin": [5, 0, 0],
         "gap": 0.0, "material": "steel"},
        {"generate": "pyramid", "shape": "box", "half_extents": [0.2, 0.2, 0.2], "levels": 4, "gap": 0.02,
         "material": "steel"},
        {"generate": "random", "shape": "mixed", "count": 50, "min": [-1, 0, -1], "max": [1, 2, 1], "radius": 0.05,
         "half_extents": [0.04, 0.04, 0.04], "material": "steel"},
    ]
    s = scene_from_dict(d)
    b = s.bodies
    assert s.body_count == 1 + 24 + 4 + 10 + 50
    assert np.allclose(b["position"][0], [9, 9, 9])
    grid = b["position"][1:25]
    assert np.allclose(grid[0], [0, 1, 0]) and np.allclose(grid.max(0), [0.5, 2.0, 1.5])
    stack = b["position"][25:29]
    assert np.allclose(stack[:, 1], [0.25, 0.75, 1.25, 1.75])  # resting exactly on each other from the floor
    pyr = b["position"][29:39]
    assert np.allclose(sorted(set(np.round(pyr[:, 1], 6))), [0.2, 0.6, 1.0, 1.4])
    assert abs(pyr[:4, 0].mean()) < 1e-12 and np.isclose(pyr[1, 0] - pyr[0, 0], 0.42)
    rnd = b["position"][39:]
    assert (rnd.min(0) >= [-1, 0, -1]).all() and (rnd.max(0) <= [1, 2, 1]).all()
    # the same seed gives the same scene; another seed another one
    assert np.array_equal(scene_from_dict(d).bodies["position"], b["position"])
    assert not np.array_equal(scene_from_dict(d, ["sim.seed=1"]).bodies["position"], b["position"])


def test_container_center_defaults_to_floor_at_zero():
    d = _base()
    d["static"] = [{"type": "container", "size": [4, 2, 6], "material": "steel"}]
    s = scene_from_dict(d)
    assert s.statics[0]["center"] == [0.0, 1.0, 0.0]


def test_quaternions_are_normalised():
    d = _base()
    d["bodies"][0] = {"shape": "box", "half_extents": [1, 1, 1], "position": [0, 0, 0], "orientation": [2, 0, 0, 0],
                      "material": "steel"}
    q = scene_from_dict(d).bodies["orientation"][0]
    assert np.allclose(q, [1, 0, 0, 0]) and math.isclose(np.linalg.norm(q), 1.0)


def test_run_py_bad_scene_exit_code_2_without_traceback(tmp_path):
    p = _write(tmp_path, "name: t\nmaterials: {m: {}}\nbodies:\n  - {shape: sphere, radius: -1, position: [0,0,0], "
                         "material: m}\n")
    r = subprocess.run([sys.executable, str(ROOT / "run.py"), str(p), "--headless", "--frames", "1",
                        "--out", str(tmp_path / "o")], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert "bodies[0].radius: expected a number > 0, got -1" in r.stderr
    r = subprocess.run([sys.executable, str(ROOT / "run.py"), str(tmp_path / "missing.yaml"), "--headless"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2 and "not found" in r.stderr and "Traceback" not in r.stderr


# ------------------------------------------------------------------------------------- hostile and odd input
_SCENE_TEXT = """name: t
sim: {dt: 2e-3, substeps: 2}
materials: {steel: {density: 7.8e3}}
bodies:
  - {shape: sphere, radius: 5e-1, position: [0, 1, 0], material: steel}
"""


def test_exponent_numbers_are_floats():
    # YAML 1.1 reads 2e-3 (no dot) as a string; scenes read it as the number everyone means
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        s = load_scene(_write(Path(d), _SCENE_TEXT))
    assert s.sim["dt"] == 0.002 and s.materials[0]["density"] == 7800.0 and s.bodies["radius"][0] == 0.5
    assert apply_overrides({"sim": {}}, ["sim.dt=1e-3"])["sim"]["dt"] == 0.001


def test_duplicate_keys_are_an_error(tmp_path):
    msg = _err(tmp_path, "name: t\nmaterials: {steel: {}}\nmaterials: {wood: {}}\nbodies: []\n")
    assert "duplicate key 'materials'" in msg and "line 3" in msg
    msg = _err(tmp_path, _SCENE_TEXT.replace("substeps: 2}", "substeps: 2, dt: 1.0e-3}"))
    assert "duplicate key 'dt'" in msg
    # a merge (<<: *base) brings keys the mapping may override, as YAML intends; its own keys still may not repeat
    merged = ("name: t\nmaterials:\n  base: &b {density: 1000, friction: 0.5}\n"
              "  steel: {<<: *b, friction: 0.3}\n"
              "bodies: [{shape: sphere, radius: 0.1, position: [0, 1, 0], material: steel}]\n")
    s = load_scene(_write(tmp_path, merged))
    assert {m["name"]: m["friction"] for m in s.materials} == {"base": 0.5, "steel": 0.3}
    assert s.materials[1]["density"] == 1000
    msg = _err(tmp_path, merged.replace("friction: 0.3}", "friction: 0.3, friction: 0.2}"))
    assert "duplicate key 'friction'" in msg


def test_alias_bomb_fails_fast_with_one_line(tmp_path):
    # 11 levels of 10 aliases each: 10^11 elements if expanded. Aliases are shared, not copied, and the message shows
    # a cut repr, so this fails at once with one short line.
    levels = ["&a0 [x, x, x, x, x, x, x, x, x, x]"] + [f"&a{k} [" + ", ".join([f"*a{k - 1}"] * 10) + "]"
                                                       for k in range(1, 12)]
    t0 = time.monotonic()
    body = "[{shape: sphere, radius: 0.1, position: [0, 1, 0], material: m}]"
    msg = _err(tmp_path, f"name: t\nmaterials: {{m: {{}}}}\nbodies: {body}\ncamera: {{position: [" + ", ".join(levels) + "]}\n")
    assert time.monotonic() - t0 < 2.0
    assert "camera.position: expected a list of 3 numbers" in msg and len(msg) < 300
    # a document of more aliases than LIMITS["aliases"] is refused as it is read
    many = "name: t\nmaterials: {m: {}}\nbodies: []\ndescription: &d x\nsim: {seed: 0}\nlist: [" + \
        ", ".join(["*d"] * 1001) + "]\n"
    msg = _err(tmp_path, many)
    assert "more than 1000 aliases" in msg


def test_huge_sizes_are_refused_before_anything_is_made(tmp_path, monkeypatch):
    base = "name: t\nmaterials: {m: {}}\nbodies:\n"
    t0 = time.monotonic()
    for gen, key in [("{generate: random, shape: sphere, radius: 0.01, count: 1000000000, min: [0, 0, 0], "
                      "max: [1000, 1000, 1000], material: m}", "bodies[0].count"),
                     ("{generate: grid, shape: sphere, radius: 0.01, count: [100000, 100000, 10], material: m}",
                      "bodies[0].count"),
                     ("{generate: pyramid, shape: box, half_extents: [1, 1, 1], levels: 1000000, material: m}",
                      "bodies[0].levels"),
                     ("{generate: pyramid, shape: box, half_extents: [1, 1, 1], levels: 100, copies: [100, 100], "
                      "copy_spacing: [300, 3], material: m}", "bodies[0].levels")]:
        msg = _err(tmp_path, base + "  - " + gen + "\n")
        assert f"{key}: expected at most 20,000,000 bodies" in msg and "SMOLVLA_LIMITS" in msg
    for key in ("substeps", "solver_iterations"):
        msg = _err(tmp_path, f"name: t\nsim: {{{key}: 1000000000}}\nmaterials: {{m: {{}}}}\nbodies: []\n")
        assert f"sim.{key}: expected a number <= 10000" in msg
    assert time.monotonic() - t0 < 5.0
    monkeypatch.setenv("SMOLVLA_LIMITS", "bodies=3")   # limits can be raised or lowered for a run
    msg = _err(tmp_path, base + "  - {generate: stack, shape: sphere, radius: 0.1, count: 4, material: m}\n")
    assert "at most 3 bodies" in msg
    monkeypatch.setenv("SMOLVLA_LIMITS", "bodies=5e7")
    assert schema_limit("bodies") == 50_000_000
    for bad, says in (("bodies=inf", "whole number >= 1"), ("bodies=-5", "whole number >= 1"),
                      ("bodies=2.5", "whole number >= 1"), ("bodies=lots", "whole number >= 1"),
                      ("body=5", "unknown limit 'body'")):
        monkeypatch.setenv("SMOLVLA_LIMITS", bad)
        with pytest.raises(UserError, match=f"SMOLVLA_LIMITS: '{bad}': .*{says}"):
            load_scene(_write(tmp_path, base + "  - {shape: sphere, radius: 0.1, position: [0, 1, 0], material: m}\n"))


def test_a_pipe_or_a_device_is_not_read(tmp_path):
    fifo = tmp_path / "scene.yaml"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    for path in (fifo, Path("/dev/zero")):
        with pytest.raises(UserError, match="not a regular file") as ei:
            load_scene(path)
        assert str(path) in str(ei.value)
    assert time.monotonic() - t0 < 1.0


def test_a_long_bad_value_is_cut_in_the_message(tmp_path):
    msg = _err(tmp_path, {"name": "t", "materials": {"m": {}}, "bodies": "x" * 10_000})
    assert len(msg) < 300 and "bodies: expected a list" in msg


def test_masses_out_of_float32_range_are_refused(tmp_path):
    body = "{shape: sphere, radius: %s, position: [0, 1, 0], material: m}"
    for density, radius, says in (("1e308", "0.5", "mass 5.24e+307 kg"), ("1e-300", "0.5", "mass 5.24e-301 kg"),
                                  ("1000", "1e30", "mass 4.19e+93 kg")):
        text = (f"name: t\nmaterials: {{ok: {{}}, m: {{density: {density}}}}}\nbodies: "
                f"[{(body % '0.1').replace('material: m', 'material: ok')}, {body % radius}]\n")
        msg = _err(tmp_path, text)
        assert "bodies[1]: expected a mass and moments of inertia within [1e-30, 1e+30]" in msg and says in msg, msg
        assert "body 1 (material 'm'" in msg
    # a generator's body is named by its generator, and a fixed body's mass does not matter
    msg = _err(tmp_path, "name: t\nmaterials: {m: {}, heavy: {density: 1e40}}\nbodies:\n"
               "  - {generate: stack, shape: box, half_extents: [0.1, 0.1, 0.1], count: 3, material: m}\n"
               "  - {shape: sphere, radius: 0.5, position: [0, 1, 0], material: heavy}\n")
    assert "bodies[1]:" in msg and "body 3 (material 'heavy'" in msg
    load_scene(_write(tmp_path, "name: t\nmaterials: {m: {density: 1e308}}\nbodies: "
                      "[{shape: box, half_extents: [1, 1, 1], position: [0, 0, 0], material: m, fixed: true}]\n"))


def test_deep_nesting_is_one_line_not_a_recursion_error(tmp_path):
    t0 = time.monotonic()
    msg = _err(tmp_path, "name: t\nmaterials: {m: {}}\nbodies: []\ncamera: {position: " + "[" * 2000 + "]" * 2000 + "}\n")
    assert "nested more than 64 deep" in msg and "line 4" in msg and time.monotonic() - t0 < 2.0
    # 64 levels (the document's mapping and 63 lists) holding a value: within the limit, read
    deep = "name: t\nmaterials: {m: {}}\nbodies: []\nx: " + "[" * 63 + "1" + "]" * 63 + "\n"
    assert "x: expected a known key" in _err(tmp_path, deep)
    deeper = "name: t\nmaterials: {m: {}}\nbodies: []\nx: " + "[" * 64 + "1" + "]" * 64 + "\n"
    assert "nested more than 64 deep" in _err(tmp_path, deeper)


def test_pyramid_copies_are_laid_out_apart_or_refused(tmp_path):
    base = "name: t\nmaterials: {m: {}}\nbodies:\n  - "
    p = tmp_path / "p.yaml"
    p.write_text(base + "{generate: pyramid, shape: box, half_extents: [0.5, 0.5, 0.5], levels: 3, copies: [2, 3], "
                        "copy_spacing: [4, 2], material: m}\n")
    pos = load_scene(str(p)).bodies["position"]
    assert len(pos) == 6 * 6
    # six pyramids of 6 boxes: x centres -2 and 2 (+ within the base), z at -2, 0, 2
    assert sorted(set(np.round(pos[:, 2], 6))) == [-2.0, 0.0, 2.0]
    assert np.allclose(sorted(set(np.round(pos[pos[:, 1] > 2.4, 0], 6))), [-2.0, 2.0])   # the tops
    msg = _err(tmp_path, base + "{generate: pyramid, shape: box, half_extents: [0.5, 0.5, 0.5], levels: 3, "
                                "copies: [2, 1], copy_spacing: [2, 2], material: m}\n")
    assert "bodies[0].copy_spacing: expected at least the pyramid's base (3 m)" in msg
