"""Simulation-level tests: the three contact storages agree, every shipped scene runs headless with a
scene-specific final check, runtime body addition, explosion detection, contact geometry by hand.

One Taichi runtime for the module. Headless runs share cached Simulations (app.headless.get_simulation),
so kernels compile once per contact storage.
"""
import json
import math
from pathlib import Path

import numpy as np
import pytest

ti = pytest.importorskip("taichi")

from app.sim.contacts import COUNT_SHIFT, FEATURE_KEY_MASK, RANK_SHIFT, SECOND_COPY  # noqa: E402
from app.sim.contacts import NO_FAILURE  # noqa: E402
from app.sim.diagnostics import NO_ERROR, NO_PAIR, PAIR_STRIDE  # noqa: E402
from app.errors import UserError  # noqa: E402
from app.runtime import taichi_options  # noqa: E402
from app.sim.math3d import quat_to_mat  # noqa: E402
from app.sim.narrowphase import collide_box_box  # noqa: E402
from app.scene import scene_from_dict  # noqa: E402
from app.sim import simulation as simulation_module  # noqa: E402
from app.sim.simulation import SimulationCapacityError  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SCENES = ROOT / "scenes"

# Storages agree: the solver's sums over a list are order-independent (fixed point), so the motion does not
# depend on the order in which threads appended. This module runs Taichi as the app does, with fast_math=False
# (app.runtime.TAICHI_OPTIONS), so that each storage's differently compiled kernels round identically; the
# three storages must then give bit-identical motion (tolerance 0). With fast-math (the default elsewhere) LLVM
# may contract floats differently per kernel and a pile amplifies the 1-ulp differences: measured 3.6e-5 m
# in position and 4.7e-4 in quaternion components after 300 steps, with identical contact counts.
STORAGE_AGREE_TOL_M = 0.0


# One shared VLA simulation big enough for the default scene (3000 bodies), so every headless scene run
# reuses its compiled kernels.
CAPACITY = 4096


def _small_pile(kind):
    return scene_from_dict({
        "name": "agree", "sim": {"dt": 0.002, "substeps": 5, "contacts": kind, "padded_capacity": 32},
        "materials": {"a": {"density": 1000, "friction": 0.5, "restitution": 0.3},
                      "b": {"density": 500, "friction": 0.8, "restitution": 0.1}},
        "static": [{"type": "container", "size": [1.2, 1.0, 1.2], "material": "a"}],
        "bodies": [{"generate": "random", "shape": "mixed", "count": 40, "min": [-0.55, 0.05, -0.55],
                    "max": [0.55, 1.6, 0.55], "radius": 0.08, "half_extents": [0.07, 0.05, 0.06],
                    "materials": ["a", "b"]},
                   # capsules too: their pairs (one or two points) go through every storage's append_n / put
                   {"generate": "random", "shape": "capsule", "count": 12, "min": [-0.5, 1.75, -0.5],
                    "max": [0.5, 2.4, 0.5], "radius": 0.05, "half_length": 0.07, "materials": ["a", "b"]},
                   # and convex hulls (pair class 3: hull-plane, -sphere, -box, -capsule, -hull)
                   {"generate": "random", "shape": "convex", "hull_points": 10, "variants": 3, "count": 12,
                    "half_extents": [0.07, 0.05, 0.06], "min": [-0.5, 2.5, -0.5], "max": [0.5, 2.9, 0.5],
                    "materials": ["a", "b"]}]})


@pytest.fixture(scope="module")
def sim():
    """The module's VLA Simulation; tests load their scenes into it, and run_headless reuses it."""
    ti.init(arch=ti.cpu, log_level=ti.WARN, **taichi_options("cpu"))  # as the app runs; see STORAGE_AGREE_TOL_M
    from app import headless
    from app.runtime import taichi_program
    from app.sim import Simulation

    # made with a fixed body, so that its grid has static cells from the start: the scenes with fixed bodies below
    # then load into it without a reallocation (Taichi's SNode trees run short in a module of this many simulations)
    raw = dict(_small_pile("vla").raw)
    raw["bodies"] = raw["bodies"] + [{"shape": "box", "half_extents": [0.1, 0.1, 0.1], "position": [3, 0.1, 0],
                                      "material": "a", "fixed": True}]
    s = Simulation(scene_from_dict(raw), capacity=CAPACITY)
    s.load(_small_pile("vla"))
    headless._SIM_CACHE["vla"] = (taichi_program(), s)
    yield s


@pytest.fixture(scope="module")
def padded_sim(sim):
    from app.sim import Simulation

    return Simulation(_small_pile("padded"), capacity=64)


def test_three_contact_storages_agree(sim, padded_sim):
    from app.sim import Simulation

    results = {}
    for kind in ("vla", "padded", "dynamic"):
        s = {"vla": sim, "padded": padded_sim}.get(kind) or Simulation(_small_pile(kind), capacity=64)
        s.load(_small_pile(kind))
        for _ in range(60):  # 300 steps: the pile lands and collides
            s.step_frame()
        results[kind] = (s.positions(), s.orientations(), s.contact_counts(), s.contacts.overflowed(),
                         int(s.diagnostics.contact_total[None]))
    ref = results["vla"]
    assert ref[4] > 30, "the pile must be in contact for the comparison to mean anything"
    for kind in ("padded", "dynamic"):
        pos, quat, counts, overflow, total = results[kind]
        assert overflow == 0
        assert np.array_equal(counts, ref[2]) and total == ref[4]
        assert np.abs(pos - ref[0]).max() <= STORAGE_AGREE_TOL_M, kind
        assert np.abs(quat - ref[1]).max() <= STORAGE_AGREE_TOL_M, kind


def test_sleepers_keep_their_contacts_in_every_storage(sim, padded_sim):
    # A block of 48 boxes on the floor, asleep. With VLA contact lists a pair of two still bodies is not listed again
    # (its records are copied: app.sim.narrowphase._keeps_still_pairs); padded lists may have dropped a record, so
    # there every pair is found and computed each step. Both keep the same contacts, step after step.
    h = 0.05
    boxes = [{"shape": "box", "half_extents": [h, h, h], "position": [(ix - 1.5) * 2.1 * h, h + iy * 2 * h,
                                                                     (iz - 1.5) * 2.1 * h], "material": "a"}
             for iy in range(3) for iz in range(4) for ix in range(4)]
    counts = {}
    for kind, s in (("vla", sim), ("padded", padded_sim)):
        s.load(scene_from_dict({"name": "block", "sim": {"dt": 0.002, "contacts": kind, "padded_capacity": 32},
                                "materials": {"a": {"density": 1000, "friction": 0.5, "restitution": 0.0}},
                                "static": [{"type": "plane", "normal": [0, 1, 0], "offset": 0.0, "material": "a"}],
                                "bodies": boxes}))
        for _ in range(750):
            s.step()
        assert s.sleeping().all(), kind
        s.step()
        counts[kind] = (s.contact_counts(), int(s.diagnostics.contact_total[None]))
        pairs = int(s.grid.pairs.to_csr()[0][-1])
        assert pairs == 0 if kind == "vla" else pairs >= len(boxes), (kind, pairs)   # (16 on the floor, 32 stacked)
        s.step()
        assert np.array_equal(s.contact_counts(), counts[kind][0]), kind
    assert counts["vla"][1] > len(boxes) and np.array_equal(counts["vla"][0], counts["padded"][0])
    assert counts["vla"][1] == counts["padded"][1]


def _frame_read_field_by_field(sim):
    """What Simulation.read_frame() gathers in one read, read here one field at a time."""
    h, c = sim.diagnostics, sim.contacts
    return {"error_step": int(h.error_step[None]), "error_body": int(h.error_body[None]),
            "error_kind": int(h.error_kind[None]), "failed_step": int(c.failed_step[None]),
            "contacts": int(h.contact_total[None]), "max_depth": float(h.max_depth[None]),
            "dropped": c.overflowed(), "kinetic_energy": sim.kinetic_energy(),
            "max_depth_fraction": float(h.max_depth_fraction[None]),
            **({"deep_body": NO_ERROR, "deep_other": NO_ERROR} if h.deep_pair[None] == NO_PAIR else
               {"deep_body": int(h.deep_pair[None]) // PAIR_STRIDE, "deep_other": int(h.deep_pair[None]) % PAIR_STRIDE - 1})}


def test_padded_overflow_is_counted_and_reported(padded_sim, capsys):
    sim = padded_sim
    sim.load(scene_from_dict(_small_pile("padded").raw, ["sim.padded_capacity=2"]))  # a runtime limit
    for _ in range(60):
        sim.step_frame()
    assert sim.contacts.overflowed() > 0
    assert sim.overflow_events and sim.overflow_events[0]["lost"] > 0
    assert "dropped" in capsys.readouterr().err
    # step_frame's one read (read_frame) holds what the fields hold; the kinetic energy sums in another order
    sim.step()
    ref = _frame_read_field_by_field(sim)
    frame = sim.read_frame()
    assert frame["dropped"] == sim.contacts.overflowed() > 0 and frame["contacts"] > 0 and frame["max_depth"] > 0
    assert frame["kinetic_energy"] == pytest.approx(ref.pop("kinetic_energy"), rel=1e-12)
    assert {k: v for k, v in frame.items() if k != "kinetic_energy"} == ref
    # and starts the next frame's penetration record
    h = sim.diagnostics
    assert (h.max_depth[None], h.max_depth_fraction[None], h.deep_pair[None]) == (0.0, 0.0, NO_PAIR)
    # A step whose broadphase and narrowphase run twice (Simulation.step does when a VLA must grow on the host)
    # counts its drops once: the second fill replaces the first's count, and the solver step books it.
    from app.sim.narrowphase import find_contacts

    before = sim.contacts.overflowed()
    sim.contacts.flip()
    sim.grid.build(sim.model, sim.state, sim.dt)
    find_contacts(sim.model, sim.state, sim.grid, sim.contacts, sim.diagnostics, sim.dt)
    once = sim.contacts.overflowed() - before
    assert once > 0
    find_contacts(sim.model, sim.state, sim.grid, sim.contacts, sim.diagnostics, sim.dt)
    assert sim.contacts.overflowed() - before == once
    sim.solver.step(sim.state, sim.state, sim.contacts, sim.dt)
    assert sim.contacts.overflowed() - before == once
    sim.step()
    assert sim.contacts.overflowed() > before + once   # the next step's drops add to it


def test_contact_geometry_by_hand(sim):
    """Two spheres of radius 0.2 and 0.11 with centres 0.3 apart: depth 0.01 along +x; box on plane: 4
    corners at the box's sinking depth."""
    scene = scene_from_dict({"name": "geo", "sim": {"gravity": [0, 0, 0], "contact_margin": 0.0},
                             "materials": {"m": {}},
                             "static": [{"type": "plane", "normal": [0, 1, 0], "offset": 0, "material": "m"}],
                             "bodies": [{"shape": "sphere", "radius": 0.2, "position": [0, 1, 0], "material": "m"},
                                        {"shape": "sphere", "radius": 0.11, "position": [0.3, 1, 0], "material": "m"},
                                        {"shape": "box", "half_extents": [0.5, 0.25, 0.5], "position": [3, 0.24, 0],
                                         "material": "m"}]})
    sim.load(scene)
    sim.contacts.begin_step(sim.body_count)
    sim.grid.build(sim.model, sim.state, sim.dt)
    from app.sim.narrowphase import find_contacts
    find_contacts(sim.model, sim.state, sim.grid, sim.contacts, sim.diagnostics, sim.dt)
    offsets, values = sim.contacts.lists.to_csr()
    # lists and `other` use stored body indices (Z-order of the initial positions): map scene bodies 0, 1, 2
    s0, s1, s2 = (int(sim.internal_of[k]) for k in range(3))
    base = sim.contacts.base
    a = slice(offsets[base + s0], offsets[base + s0 + 1])
    assert values["depth"][a].tolist() == pytest.approx([0.01], abs=1e-6)
    assert values["other"][a].tolist() == [s1]
    # pushes sphere 0 away from 1 (an axis: its code decodes exactly)
    assert _record_normal_ref(values["normal_code"][a][0], values["feature"][a][0]).tolist() == [-1, 0, 0]
    b = slice(offsets[base + s1], offsets[base + s1 + 1])
    assert values["other"][b].tolist() == [s0]
    assert _record_normal_ref(values["normal_code"][b][0], values["feature"][b][0]).tolist() == [1, 0, 0]
    # scene body 0 has the lower id: its copy is the first, the normal code pushes it (both copies hold it)
    assert values["feature"][b][0] == values["feature"][a][0] | SECOND_COPY
    assert values["normal_code"][a][0] == values["normal_code"][b][0]
    c = slice(offsets[base + s2], offsets[base + s2 + 1])
    assert values["depth"][c].tolist() == pytest.approx([0.01] * 4, abs=1e-6), values["depth"][c]
    assert sorted((values["feature"][c] & FEATURE_KEY_MASK).tolist()) == [0, 1, 4, 5]  # 4 bottom corners (y bit clear)
    assert (values["other"][c] == -1).all()


def test_box_box_face_manifold_has_four_points(sim):
    scene = scene_from_dict({"name": "bb", "sim": {"gravity": [0, -9.81, 0]}, "materials": {"m": {}},
                             "static": [{"type": "plane", "normal": [0, 1, 0], "offset": 0, "material": "m"}],
                             "bodies": [{"shape": "box", "half_extents": [0.5, 0.5, 0.5], "position": [0, 0.5, 0],
                                         "material": "m"},
                                        {"shape": "box", "half_extents": [0.3, 0.3, 0.3], "position": [0.1, 1.3, 0],
                                         "orientation": [0.9238795, 0, 0.3826834, 0], "material": "m"}]})
    sim.load(scene)
    sim.step()
    counts = sim.contact_counts()
    assert counts[1] == 4          # the small box, rotated 45 deg about y, lies flat on the big one
    assert counts[0] == 4 + 4      # 4 on the floor + the same 4 pair contacts
    for _ in range(200):
        sim.step()
    assert abs(sim.positions()[1, 1] - 1.3) < 0.01 * 0.3


_nd2 = ti.types.ndarray(dtype=ti.f32, ndim=2)
_nd1i = ti.types.ndarray(dtype=ti.i32, ndim=1)


@ti.kernel
def _k_box_box(pa: _nd2, qa: _nd2, ha: _nd2, pb: _nd2, qb: _nd2, hb: _nd2, margin: ti.f32, count: _nd1i,
               normal: _nd2):
    for p in range(pa.shape[0]):
        m = collide_box_box(ti.Vector([pa[p, 0], pa[p, 1], pa[p, 2]]),
                            quat_to_mat(ti.Vector([qa[p, 0], qa[p, 1], qa[p, 2], qa[p, 3]])),
                            ti.Vector([ha[p, 0], ha[p, 1], ha[p, 2]]), ti.Vector([pb[p, 0], pb[p, 1], pb[p, 2]]),
                            quat_to_mat(ti.Vector([qb[p, 0], qb[p, 1], qb[p, 2], qb[p, 3]])),
                            ti.Vector([hb[p, 0], hb[p, 1], hb[p, 2]]), margin)
        count[p] = m.count
        for d in ti.static(range(3)):
            normal[p, d] = m.normal[d]


def _quat_to_mat_ref(q):
    w, x, y, z = q
    return np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
                     [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
                     [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)]])


def _box_box_axis_ref(pa, Ra, ha, pb, Rb, hb, margin, tie):
    """Plain float64 separating-axis test over the 15 world-frame axes, with the narrowphase's preferences
    (B's faces need 1e-4 * smallest half extent more than A's; an edge axis wins only past EDGE_REL_TOL x the
    face's separation + EDGE_ABS_TOL x the smallest half extent). Returns (separated, normal from A to B, axis
    code: 0-5 faces, 6-14 edges), or None when a decision is within `tie` of flipping (float32 may round it
    either way)."""
    from app.sim.narrowphase import EDGE_ABS_TOL, EDGE_REL_TOL

    t = pb - pa
    lmin = min(ha.min(), hb.min())
    axes = [Ra[:, k] for k in range(3)] + [Rb[:, k] for k in range(3)]
    axes += [np.cross(Ra[:, i], Rb[:, j]) for i in range(3) for j in range(3)]
    seps, normals = [], []
    for code, L in enumerate(axes):
        ln = np.linalg.norm(L)
        if code >= 6 and ln <= 1e-5:
            seps.append(None)
            normals.append(None)
            continue
        L = L / ln
        tl = t @ L
        seps.append(abs(tl) - (ha @ np.abs(Ra.T @ L) + hb @ np.abs(Rb.T @ L)))
        normals.append(L * (1.0 if tl >= 0 else -1.0))
    valid = [s for s in seps if s is not None]
    if min(abs(s - margin) for s in valid) < tie:
        return None
    if max(valid) > margin:
        return True, None, -1
    face = [s - (1e-4 * lmin if code >= 3 else 0.0) for code, s in enumerate(seps[:6])]   # B's faces handicapped
    order = np.argsort(face)[::-1]
    best_face = int(order[0])
    if face[order[0]] - face[order[1]] < tie:
        return None
    edge = [(s, code) for code, s in enumerate(seps) if code >= 6 and s is not None]
    best_edge_s, best_edge = max(edge) if edge else (-1e30, -1)
    line = EDGE_REL_TOL * seps[best_face] + EDGE_ABS_TOL * lmin
    if abs(best_edge_s - line) < tie:
        return None
    if best_edge_s > line:
        others = sorted(s for s, _ in edge)
        if len(others) > 1 and others[-1] - others[-2] < tie:
            return None
        return False, normals[best_edge], best_edge
    return False, normals[best_face], best_face


def test_box_box_separating_axes_match_a_float64_reference(sim):
    # collide_box_box runs its separating-axis test in box A's frame on C = Ra^T Rb; a plain
    # float64 test over the 15 world-frame axes must agree on every random pair: separated or not, and which
    # axis (the manifold's normal) when they touch. Pairs whose decision lies within TIE of flipping are
    # skipped (float32 vs float64 rounding). Tolerance on the normal: 1e-4 (float32 axes of unit length).
    TIE = 1e-4
    rng = np.random.default_rng(11)
    n = 3000
    q = rng.normal(size=(2, n, 4))
    q /= np.linalg.norm(q, axis=2, keepdims=True)
    h = rng.uniform(0.05, 0.5, size=(2, n, 3))
    pa = rng.uniform(-1, 1, size=(n, 3))
    d = rng.normal(size=(n, 3))
    d /= np.linalg.norm(d, axis=1, keepdims=True)
    reach = np.linalg.norm(h[0], axis=1) + np.linalg.norm(h[1], axis=1)
    pb = pa + d * (reach * rng.uniform(0.2, 1.1, size=n))[:, None]
    # some pairs exactly aligned (resting stacks): parallel edges, whose cross products vanish
    aligned = rng.random(n) < 0.15
    q[1][aligned] = q[0][aligned]
    margin = 0.01
    count = np.zeros(n, np.int32)
    normal = np.zeros((n, 3), np.float32)
    f32 = np.float32
    _k_box_box(pa.astype(f32), q[0].astype(f32), h[0].astype(f32), pb.astype(f32), q[1].astype(f32),
               h[1].astype(f32), margin, count, normal)
    kinds = {"separated": 0, "face": 0, "edge": 0, "skipped": 0}
    for p in range(n):
        # the reference sees the float32 inputs the kernel saw
        a = [x.astype(f32).astype(np.float64) for x in (pa[p], q[0][p], h[0][p], pb[p], q[1][p], h[1][p])]
        ref = _box_box_axis_ref(a[0], _quat_to_mat_ref(a[1]), a[2], a[3], _quat_to_mat_ref(a[4]), a[5], margin, TIE)
        if ref is None:
            kinds["skipped"] += 1
            continue
        separated, nrm, code = ref
        if separated:
            kinds["separated"] += 1
            assert count[p] == 0, p
            continue
        if count[p] == 0:   # overlapping by the axes, but every clipped point more than the margin apart
            kinds["skipped"] += 1
            continue
        assert np.abs(normal[p] - nrm).max() < 1e-4, (p, normal[p], nrm)
        kinds["edge" if code >= 6 else "face"] += 1
    assert kinds["separated"] > 300 and kinds["face"] > 300 and kinds["edge"] > 100, kinds
    assert kinds["skipped"] < n // 10, kinds


def test_explosion_is_detected_with_body_and_step(sim):
    from app.sim import SimulationError

    scene = scene_from_dict({"name": "boom", "sim": {"max_speed": 50.0, "gravity": [0, 0, 0]}, "materials": {"m": {}},
                             "bodies": [{"shape": "sphere", "radius": 0.1, "position": [5, 0, 0],
                                         "velocity": [0, 60, 0], "material": "m"},
                                        {"shape": "sphere", "radius": 0.1, "position": [0, 0, 0], "material": "m"}]})
    sim.load(scene)
    assert sim.scene_of.tolist() == [1, 0]  # stored in Z-order: the culprit is stored body 1, scene body 0
    with pytest.raises(SimulationError) as ei:
        sim.step_frame()
    assert "body 0" in str(ei.value) and "step 0" in str(ei.value)
    assert ei.value.exit_code == 1 and isinstance(ei.value, UserError)


def _inside_scene(limit=None):
    """A sphere (r 0.1, scene body 1) at the centre of a fixed box (half 1, scene body 0): 1.1 m deep, 11 x its
    radius (no gravity)."""
    sim_keys = {"gravity": [0, 0, 0]} if limit is None else {"gravity": [0, 0, 0], "penetration_limit": limit}
    return scene_from_dict({"name": "inside", "sim": sim_keys, "materials": {"m": {}}, "bodies": [
        {"shape": "box", "half_extents": [1, 1, 1], "position": [0, 0, 0], "material": "m", "fixed": True},
        {"shape": "sphere", "radius": 0.1, "position": [0, 0, 0], "material": "m"}]})


def test_deep_penetration_is_named_in_health_and_strict_stops(sim, capsys):
    from app.sim import SimulationError

    sim.load(_inside_scene())
    sim.step_frame()
    h = sim.health()
    # the first step sees the start: 1.1 m over the sphere's radius 0.1 (the box is larger)
    assert h["max_penetration_fraction"] == pytest.approx(11.0, rel=1e-5)
    assert h["deep_frames"] == 1 and h["first_deep"]["bodies"] == [0, 1] and h["penetration_limit"] == 1.0
    err = capsys.readouterr().err
    assert err.count("warning:") == 1 and "bodies 0 and 1 (scene order) overlap deeper than sim.penetration_limit" \
        in err and h["warnings"] == [err.strip()[len("warning: "):]]
    assert sim.last_frame["max_depth"] == pytest.approx(1.1, rel=1e-5)
    # a readout after a failed step (to be redone from there, and read again) keeps the record of the steps before
    sim.load(_inside_scene())
    sim.step()
    sim.contacts.failed_step[None] = 5
    assert sim.read_frame()["max_depth"] == pytest.approx(1.1, rel=1e-5)
    sim.contacts.failed_step[None] = NO_FAILURE
    assert sim.read_frame()["max_depth"] == pytest.approx(1.1, rel=1e-5)   # (the frame is final: the record restarts)
    assert sim.read_frame()["max_depth"] == 0.0 and sim.read_frame()["max_depth_fraction"] == 0.0
    capsys.readouterr()
    # under the limit nothing is reported; the fraction is still measured
    sim.load(_inside_scene(limit=20.0))
    sim.step_frame()
    assert sim.health()["deep_frames"] == 0 and sim.health()["max_penetration_fraction"] == pytest.approx(11.0, 1e-5)
    assert capsys.readouterr().err == ""
    sim.strict = True
    try:
        sim.load(_inside_scene())
        with pytest.raises(SimulationError, match=r"bodies 0 and 1 \(scene order\) overlap .*--strict stops the run"):
            sim.step_frame()
    finally:
        sim.strict = False
    # a resting body: penetration within the solver's slop, far below the limit
    sim.load(scene_from_dict({"name": "rest", "materials": {"m": {}},
                              "static": [{"type": "plane", "normal": [0, 1, 0], "offset": 0, "material": "m"}],
                              "bodies": [{"shape": "box", "half_extents": [0.2, 0.05, 0.2], "position": [0, 0.05, 0],
                                          "material": "m"}]}))
    for _ in range(30):
        sim.step_frame()
    assert sim.health()["deep_frames"] == 0 and 0 < sim.health()["max_penetration_fraction"] < 0.05


def test_a_body_deep_in_a_container_wall_is_named_with_the_static_geometry(sim, capsys):
    # A contact with plane k is recorded with other = -1 - k; a wall (k >= 1) once decoded into a body index past
    # the bodies (an IndexError from check, a traceback for the user). A sphere 0.14 m into the wall at x = +0.6.
    sim.load(scene_from_dict({"name": "wall", "materials": {"m": {}},
                              "static": [{"type": "container", "size": [1.2, 1.0, 1.2], "material": "m"}],
                              "bodies": [{"shape": "sphere", "radius": 0.1, "position": [0.64, 0.5, 0],
                                          "material": "m", "fixed": False}],
                              "sim": {"gravity": [0, 0, 0]}}))
    sim.step_frame()
    h = sim.health()
    assert h["deep_frames"] == 1 and h["first_deep"]["bodies"] == [0, None], h
    assert "body 0 and the static geometry" in capsys.readouterr().err


def test_deep_pair_is_renumbered_by_a_resort(sim):
    # the pair recorded by a step, then a resort before the frame's readout: still the same scene bodies (a small
    # sphere inside a fixed large one among 30 apart; the resort moves both, from stored 23, 24 to 12, 13)
    at = [6.6, 0.6, 0.6]
    bodies = [{"shape": "sphere", "radius": 0.5, "position": at, "material": "m", "fixed": True},
              {"shape": "sphere", "radius": 0.1, "position": [at[0] + 0.01, at[1], at[2]], "material": "m"}]
    bodies += [{"shape": "sphere", "radius": 0.1, "position": [(k % 6) * 1.3, (k // 6) * 1.3, 0.5 * (k % 3)],
                "material": "m"} for k in range(30)]
    sim.load(scene_from_dict({"name": "resorted", "sim": {"gravity": [0, 0, 0]}, "materials": {"m": {}},
                              "bodies": bodies}))
    sim.resort_interval = 0
    try:
        before = sim.internal_of[[0, 1]].copy()
        sim.step()
        sim.resort()
        assert not np.array_equal(sim.internal_of[[0, 1]], before)
        frame = sim.read_frame()
        assert sorted([int(sim.scene_of[frame["deep_body"]]), int(sim.scene_of[frame["deep_other"]])]) == [0, 1]
        # the run's record names them in scene order, and keeps naming them after later resorts
        sim.check(frame)
        assert sim.health()["first_deep"]["bodies"] == [0, 1] and "bodies 0 and 1" in sim.health()["warnings"][0]
        for _ in range(3):
            sim.step()
        sim.resort()
        assert sim.health()["first_deep"]["bodies"] == [0, 1]
    finally:
        sim.resort_interval = sim.RESORT_INTERVAL


def test_overlap_watch_reports_the_first_deep_frame_and_a_persistent_overlap():
    from app.sim.diagnostics import NO_ERROR, OverlapWatch

    w = OverlapWatch()
    clean = {"max_depth_fraction": 0.1, "deep_body": NO_ERROR, "deep_other": NO_ERROR}
    deep = {"max_depth_fraction": 2.0, "deep_body": 4, "deep_other": -1}
    dt = 0.1
    events = [w.observe(f, k * dt, (k + 1) * dt) for k, f in enumerate([clean, deep, clean] + [deep] * 6)]
    # deep at frame 1 (first); frames 3.. deep again: 0.5 s of them at frame 7 (persistent, once)
    assert events == [[], ["deep"], [], [], [], [], [], ["persistent"], []]
    assert w.deep_frames == 7 and w.max_fraction == 2.0 and w.first_deep == {"time": 0.2, "bodies": [4, -1]}
    assert w.longest_deep_s == pytest.approx(0.6)


def test_batched_iterations_match_one_per_launch(sim, monkeypatch):
    # The solver runs ITERATION_BATCH Jacobi iterations per launch (then single ones): the ping-pong between
    # the two velocity buffers must come out the same as one iteration per launch, for an iteration count
    # that is not a multiple of the batch, with odd and even batches: bit-identical motion.
    import app.sim.solver

    def run():
        sim.load(_small_pile("vla"))
        sim.solver_iterations = 7
        for _ in range(150):
            sim.step()
        return sim.positions(), sim.orientations(), int(sim.diagnostics.contact_total[None])

    monkeypatch.setattr(app.sim.solver, "ITERATION_BATCH", 1)
    single = run()
    assert single[2] > 10  # in contact, or the iterations would do nothing
    for batch in (5, 4, 2):  # 5 + 1 + 1, 4 + 1 + 1 + 1, 2 + 2 + 2 + 1: odd and even batches
        monkeypatch.setattr(app.sim.solver, "ITERATION_BATCH", batch)
        batched = run()
        assert np.array_equal(batched[0], single[0]) and np.array_equal(batched[1], single[1]), batch
    sim.load(_small_pile("vla"))


def test_dynamic_storage_sizes_taichis_sparse_pool_or_says_which_knob():
    # Taichi's dynamic SNode takes its chunks from a pool fixed at ti.init (1 GB by default on CUDA); pile_1m
    # ran it dry (a device-side assert). run.py now sizes the pool for a dynamic scene, and a Simulation made
    # under a smaller pool is refused with the knob's name instead of crashing thousands of steps later.
    from app.sim.contacts import CONTACT_RECORD_BYTES, dynamic_pool_gb, sparse_pool_problem
    from app.sim.simulation import taichi_pool_gb

    # every list full, chunk-rounded (32 -> 32, 33 -> 40 with chunks of 8), doubled, + Taichi's default 1 GB
    assert dynamic_pool_gb(2**20, 32, 8, 60) == pytest.approx(1 + 2 * 2**20 * 32 * 60 / 2**30)
    assert dynamic_pool_gb(1000, 33, 8, 4) == pytest.approx(1 + 2 * 1000 * 40 * 4 / 2**30)
    assert taichi_pool_gb(_small_pile("vla")) is None and taichi_pool_gb(_small_pile("padded")) is None
    # 40 bodies -> capacity 64, two generations of lists, padded_capacity 32 records each
    assert taichi_pool_gb(_small_pile("dynamic")) == pytest.approx(dynamic_pool_gb(128, 32, 8, CONTACT_RECORD_BYTES))
    # a Simulation given more capacity (the viewer's headroom for dropped bodies) gets a pool for it
    assert taichi_pool_gb(_small_pile("dynamic"), capacity=100) == pytest.approx(
        dynamic_pool_gb(200, 32, 8, CONTACT_RECORD_BYTES))
    need = dynamic_pool_gb(2 * 2**20, 32, 8, CONTACT_RECORD_BYTES)   # pile_1m: 7.0 GB (48-byte records)
    assert 6.5 < need < 10
    assert sparse_pool_problem(2 * 2**20, 32, 8, CONTACT_RECORD_BYTES, need) is None
    assert sparse_pool_problem(2 * 2**20, 32, 8, CONTACT_RECORD_BYTES, need - 1.0) is None   # twice the worst case
    assert sparse_pool_problem(2 * 2**20, 32, 8, CONTACT_RECORD_BYTES, need - 1.01) is not None
    assert sparse_pool_problem(8192, 32, 8, CONTACT_RECORD_BYTES, 1.0) is None   # a small scene, Taichi's default
    msg = sparse_pool_problem(2 * 2**20, 32, 8, CONTACT_RECORD_BYTES, 1.0)
    assert "sim.contacts" in msg and "device_memory_GB" in msg and f"TI_DEVICE_MEMORY_GB={need:.1f}" in msg


def test_nan_contact_is_reported_through_fixed_point_sums():
    # The solver sums impulses as integers (app.sim.solver.FIXED_ONE), where a NaN would become some number (0 on
    # CUDA, the most negative integer on x86: a huge but finite speed). A contact whose point turns NaN,
    # before kernel_prepare or between it and the Jacobi iterations, must still reach the health check as a
    # NaN (error kind 1), naming the body, as a float sum would have. Run with fast math (Taichi's default; the app
    # and this module turn it off), which may fold float tests such as x != x: in a subprocess.
    import subprocess
    import sys

    out = subprocess.run([sys.executable, str(ROOT / "tests" / "sim" / "nan_probe.py"), "prepare", "iterations"],
                         capture_output=True, text=True, timeout=900, cwd=ROOT)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith(("prepare:", "iterations:"))]
    assert len(lines) == 2, out.stdout + out.stderr
    for line in lines:
        assert "a NaN" in line and "body 0" in line, line


# ------------------------------------------------------------------------------------ shipped scenes
def _peak_after_first_bounce(y):
    lo = int(np.argmin(y[: len(y) // 2]))
    return float(y[lo:].max())


def _check_default(m, st, tr):
    p = st["position"]
    assert (np.abs(p[:, [0, 2]]) < 3.0 + 1e-3).all(), "everything stays inside the 6 x 6 m container walls"
    assert p[:, 1].min() > -1e-3
    assert m["contacts"]["final"] > 100 and m["overflow_total"] == 0


def _check_pyramid(m, st, tr):
    moved = np.linalg.norm(tr["position"][-1] - tr["position"][0], axis=1)
    assert moved.max() < 0.02, moved.max()


def _check_ramp(m, st, tr):
    d = np.linalg.norm(tr["position"][-1] - tr["position"][0], axis=1)
    assert d[0] > 0.2 and d[1] > 0.05, d      # pair mu 0.2 and 0.35 < tan 25 deg = 0.47: slide
    assert d[2] < 0.02 and d[3] < 0.02, d     # pair mu 0.6 and 0.9: stay
    assert d[4] > 0.5, d                      # the ball rolls


def _check_cradle(m, st, tr):
    v = st["linear_velocity"][:, 0]
    assert v[-1] > 0.95 and np.abs(v[:-1]).max() < 0.05, v
    # momentum of equal balls (frictionless rail)
    assert abs(v.sum() - 1.0) < 5e-3


def _check_bounce(m, st, tr):
    y = tr["position"][:, :, 1] - 0.1
    for k, e in enumerate((0.0, 0.5, 0.9)):
        peak = _peak_after_first_bounce(y[:, k])
        assert abs(peak - e * e) <= 0.03 and peak - e * e <= 0.02, (e, peak)


def _check_capsules(m, st, tr):
    p = st["position"]
    pile = p[:2000]
    assert (np.abs(pile[:, [0, 2]]) < 2.5 + 1e-3).all(), "the poured bodies stay inside the 5 x 5 m container walls"
    assert p[:, 1].min() > -1e-3 and m["contacts"]["final"] > 100 and m["overflow_total"] == 0
    # the pyramid of capsule logs (6 levels, radius 0.1 m, between two chocks) settles into its grooves: level k
    # rests at r + k sqrt(3) r (it starts with the levels 2r apart), every log where it started across
    logs = tr["position"][:, 2000:2021]
    level = np.repeat(np.arange(6), np.arange(6, 0, -1))
    assert np.abs(logs[-1, :, 0] - logs[0, :, 0]).max() < 0.01
    assert np.abs(logs[-1, :, 1] - (0.1 + level * np.sqrt(3) * 0.1)).max() < 0.01, logs[-1, :, 1]


def _check_tumbler(m, st, tr):
    # the drum (9 kinematic walls) turned by 0.5 rad/s x t about its tilted axis, and every body is still inside it
    from app.scene.schema import quat_matrices

    q0, q1 = tr["orientation"][0, 0].astype(np.float64), tr["orientation"][-1, 0].astype(np.float64)
    turned = 2 * np.arccos(min(1.0, abs(float(q0 @ q1))))
    assert abs(turned - 0.5 * (tr["time"][-1] - tr["time"][0])) < 1e-3, turned
    R = quat_matrices(q1)[0]
    local = (st["position"][9:] - np.array([0.0, 2.0, 0.0])) @ R
    assert (np.abs(local) < [1.5, 1.5, 1.25]).all(), np.abs(local).max(0)
    assert m["overflow_total"] == 0


def _check_card_house(m, st, tr):
    moved = np.linalg.norm(tr["position"][-1] - tr["position"][0], axis=1)
    assert moved.max() < 0.005, moved.max()   # 15 cards held by friction (4.8 s on the CPU: 0.3 mm at most)
    assert m["health"]["deep_frames"] == 0


def _check_convex_pile(m, st, tr):
    p = st["position"]
    assert (np.abs(p[:1200, [0, 2]]) < 2.0 + 1e-3).all() and p[:, 1].min() > -1e-3 and m["overflow_total"] == 0
    # beside the pile, at rest on a face: the tetrahedron (height 0.33 m: its centre at a quarter of it), the prism
    # (0.3 m tall) on its hexagon; the octahedron (0.25 m to a vertex) dropped nearly vertex-down, still falling over
    assert p[-3, 1] == pytest.approx(0.33 / 4, abs=1e-3) and p[-1, 1] == pytest.approx(0.15, abs=1e-3)
    assert 0.25 / np.sqrt(3) - 1e-3 < p[-2, 1] < 0.25 + 1e-3


def _terrain_height(heights, size, x, z):
    """Height (m) of the heightfield (centred on the origin) under (x, z), on its triangles (a, d, c) and (a, c,
    b) of each cell, as app.scene.hull.heightfield_triangles makes them."""
    H = np.asarray(heights, np.float64)
    nz, nx = H.shape
    fx = (x + size[0] / 2) / size[0] * (nx - 1)
    fz = (z + size[1] / 2) / size[1] * (nz - 1)
    i = np.clip(np.floor(fx).astype(int), 0, nx - 2)
    j = np.clip(np.floor(fz).astype(int), 0, nz - 2)
    u, v = fx - i, fz - j
    a, b, c, d = H[j, i], H[j, i + 1], H[j + 1, i + 1], H[j + 1, i]
    return np.where(v >= u, a + v * (d - a) + u * (c - d), a + u * (b - a) + v * (c - b))


def _coarse_heights():
    """junkyard_100k's heights at every fourth point (25 x 25), as YAML."""
    import yaml

    heights = np.asarray(yaml.safe_load((SCENES / "junkyard_100k.yaml").read_text())["static"][1]["heights"])
    return json.dumps(heights[::4, ::4].tolist())


def _check_junkyard(m, st, tr, name="junkyard", heights=None):
    from app.scene import load_scene

    field = dict(load_scene(SCENES / f"{name}.yaml").raw["static"][1])
    if heights is not None:
        field["heights"] = json.loads(heights)
    p = st["position"]
    moving = ~st["fixed"]
    inside = np.asarray(field["size"], np.float64) / 2 - 0.1
    over = moving & (np.abs(p[:, 0]) < inside[0]) & (np.abs(p[:, 2]) < inside[1])
    ground = _terrain_height(field["heights"], field["size"], p[over, 0], p[over, 2])
    # every body over the terrain has its centre above it (the smallest bodies reach 3 cm below their centre)
    assert (p[over, 1] > ground + 0.02).all(), (p[over, 1] - ground).min()
    assert over.sum() > 0.9 * moving.sum() and m["overflow_total"] == 0
    ke = np.asarray(m["kinetic_energy"])
    assert ke[-1] < 0.5 * ke.max()   # landed: the rain's energy mostly gone (spheres still roll into the valleys)


def _check_hills(m, st, tr):
    from app.scene import load_scene

    field = load_scene(SCENES / "hills.yaml").raw["static"][1]
    p = st["position"]
    moving = ~st["fixed"]
    over = moving & (np.abs(p[:, 0]) < 23.9) & (np.abs(p[:, 2]) < 23.9)
    ground = _terrain_height(field["heights"], field["size"], p[over, 0], p[over, 2])
    # every sphere (0.1 m) over the 4 m triangles has its centre above them, none has sunk or fallen through
    assert over.sum() == moving.sum() and (p[over, 1] > ground + 0.07).all(), (p[over, 1] - ground).min()
    assert m["overflow_total"] == 0 and m["contacts"]["final"] >= moving.sum()


def _check_rain(m, st, tr):
    p = st["position"]
    assert p[:, 1].min() > -1e-3 and m["overflow_total"] == 0
    fixed = st["fixed"]
    assert np.abs(tr["position"][-1, fixed] - tr["position"][0, fixed]).max() == 0.0   # posts and ramp stay
    ke = np.asarray(m["kinetic_energy"])
    assert ke[-1] < 0.2 * ke.max()   # the rain has landed


def _check_pile(m, st, tr):
    p = st["position"]
    assert np.isfinite(p).all() and m["overflow_total"] == 0
    assert m["contacts"]["final"] > 0
    assert m["kinetic_energy"][-1] < m["kinetic_energy"][len(m["kinetic_energy"]) // 2] * 10


def _check_boulders(m, st, tr):
    p = st["position"]
    assert (np.abs(p[:, [0, 2]]) < 3.0 + 1e-3).all() and p[:, 1].min() > -1e-3
    assert m["contacts"]["final"] > 1000 and m["overflow_total"] == 0
    small = p[3:]
    # no small body inside the fixed rock (radius 1 m): the smallest small body's half extent is 0.028 m
    assert np.linalg.norm(small - p[2], axis=1).min() > 1.0 + 0.028 - BOULDER_PENETRATION_TOL_M
    # the second rock box (0.55 m cube, axis-aligned) holds small bodies up on its top: the large-body pass found
    # their pairs (without it they would fall through it)
    box = p[1]
    on_top = ((np.abs(small[:, [0, 2]] - box[[0, 2]]) < 0.55).all(axis=1) & (small[:, 1] > box[1] + 0.55)
              & (small[:, 1] < box[1] + 0.55 + 0.15))
    assert on_top.sum() > 20, on_top.sum()
    assert np.linalg.norm(tr["position"][-1, :2] - tr["position"][0, :2], axis=1).max() < 0.05


# Penetration allowed into a large body in boulders.yaml: the solver's slop plus the depth a 9 m/s impact reaches
# in a step before its contact acts (measured: the run's deepest contact 24.5 mm, 4 mm at its end; the nearest small
# body ends 1.040 m from the rock's centre).
BOULDER_PENETRATION_TOL_M = 0.01

# scene -> (frames, overrides, check). The piles run in CI at 3000 bodies (their full size is GPU work, see
# bench/sim_bench.py); test_scene.py checks that the full files expand to 100k and 1M bodies.
SCENE_RUNS = {
    "default": (40, (), _check_default),
    "pyramid": (40, (), _check_pyramid),
    "ramp": (40, (), _check_ramp),
    "cradle": (80, (), _check_cradle),
    "bounce": (80, (), _check_bounce),
    "boulders": (100, (), _check_boulders),
    # the Box2D/Box3D suite's pyramids, smaller (their full size is GPU work: bench sim --scenes pyramid_100,...)
    "pyramid_40": (30, ("bodies.0.levels=12",), _check_pyramid),
    "pyramid_100": (30, ("bodies.0.levels=8",), _check_pyramid),
    "many_pyramids": (30, ("bodies.0.copies=[2, 2]",), _check_pyramid),
    "pile_100k": (20, ("bodies.0.count=3000", "static.0.size=[3, 4, 3]", "bodies.0.min=[-1.45, 0.1, -1.45]",
                       "bodies.0.max=[1.45, 8, 1.45]"), _check_pile),
    "capsules": (40, (), _check_capsules),
    "tumbler": (40, (), _check_tumbler),
    "card_house": (60, (), _check_card_house),
    "capsule_pile_100k": (20, ("bodies.0.count=1000", "bodies.1.count=2000", "static.0.size=[3, 4, 3]",
                               "bodies.0.min=[-1.45, 0.1, -1.45]", "bodies.0.max=[1.45, 4, 1.45]",
                               "bodies.1.min=[-1.45, 4.2, -1.45]", "bodies.1.max=[1.45, 9, 1.45]"), _check_pile),
    "convex_pile": (40, (), _check_convex_pile),
    "rain": (150, ("bodies.0.count=600", "bodies.1.count=300", "bodies.2.count=300"), _check_rain),
    # (seed 1: seed 0's rain drops a stone box at 4 m/s onto a wood rock wedged among three triangles, which sinks
    # 1.2 of its inradius into the terrain for 32 ms, the solver's heavy-impact limit: docs/simulator.md)
    "junkyard": (90, ("bodies.0.count=150", "bodies.1.count=150", "bodies.2.count=100", "sim.seed=1"),
                 _check_junkyard),
    # its terrain at every fourth height (1,152 triangles of 2 m, 10 to 20 times the bodies' size) under 400 bodies
    # rained onto 10 x 10 m of it (seed 1: in seed 0's a rock sliding across a crease meets the next triangle 1.01
    # of its inradius deep for one frame, the triangles' missing edge axes: docs/simulator.md)
    "junkyard_100k": (100, (f"static.1.heights={_coarse_heights()}", "sim.seed=1", "bodies.0.count=150",
                            "bodies.1.count=150",
                            "bodies.2.count=100", "bodies.0.min=[-5, 2.6, -5]", "bodies.0.max=[5, 5, 5]",
                            "bodies.1.min=[-5, 5.2, -5]", "bodies.1.max=[5, 6.4, 5]", "bodies.2.min=[-5, 6.6, -5]",
                            "bodies.2.max=[5, 7.7, 5]"),
                      lambda m, st, tr: _check_junkyard(m, st, tr, "junkyard_100k", _coarse_heights())),
    "hills": (60, ("bodies.0.count=400", "bodies.0.min=[-5, 2.6, -5]", "bodies.0.max=[5, 4, 5]"), _check_hills),
    "convex_pile_100k": (20, ("bodies.0.count=2000", "bodies.1.count=1000", "bodies.0.variants=4",
                              "static.0.size=[3, 4, 3]", "bodies.0.min=[-1.45, 0.1, -1.45]",
                              "bodies.0.max=[1.45, 4, 1.45]", "bodies.1.min=[-1.45, 4.2, -1.45]",
                              "bodies.1.max=[1.45, 9, 1.45]"), _check_pile),
    "pile_1m": (20, ("bodies.0.count=3000", "static.0.size=[3, 6, 3]", "bodies.0.min=[-1.45, 0.1, -1.45]",
                     "bodies.0.max=[1.45, 8, 1.45]"), _check_pile),
}


def test_an_interrupted_run_writes_whole_files_marked_interrupted(sim, tmp_path):
    """Ctrl-C or SIGTERM (app.errors.Terminated, raised where the run is) mid-run: the state at that frame and
    metrics.json with status "interrupted", each file whole; an earlier run's files in the directory are gone
    first, so they cannot pass for this run's. The exception goes on to run.py (exit 130 / 143)."""
    from app.errors import Terminated
    from app.headless import run_headless

    out = tmp_path / "out"
    out.mkdir()
    (out / "metrics.json").write_text('{"status": "complete", "frames": 999}')   # left by an earlier run
    (out / "trajectory.npz").write_bytes(b"stale")

    def stop_at_frame_3(s, f):
        if f == 3:
            raise Terminated()

    with pytest.raises(Terminated):
        run_headless(SCENES / "bounce.yaml", 50, out, arch="cpu", progress=False, on_frame=stop_at_frame_3)
    disk = json.loads((out / "metrics.json").read_text())
    assert disk["status"] == "interrupted" and disk["frames"] == 3
    assert np.load(out / "state.npz")["position"].shape == (disk["bodies"], 3)
    assert not (out / "trajectory.npz").exists()   # not recorded this time: the stale one is gone
    assert sorted(p.name for p in out.iterdir()) == ["metrics.json", "state.npz"]   # no temporary file left


def test_every_shipped_scene_has_a_ci_run():
    assert {p.stem for p in SCENES.glob("*.yaml")} == set(SCENE_RUNS)


@pytest.mark.parametrize("name", list(SCENE_RUNS))
def test_shipped_scene_headless(sim, name, tmp_path, monkeypatch):
    from app.headless import run_headless

    frames, overrides, check = SCENE_RUNS[name]
    out = tmp_path / name
    monkeypatch.chdir(tmp_path)   # the scene by its name, from elsewhere: metrics.json names the file found
    m = run_headless(name, frames, out, arch="cpu", record=True, overrides=overrides, progress=False)
    disk = json.loads((out / "metrics.json").read_text())
    assert disk["status"] == "complete" and Path(disk["scene_path"]) == SCENES / f"{name}.yaml"
    for key in ("scene", "arch", "bodies", "frames", "steps", "sim_time", "wall_time", "steps_per_second", "contacts",
                "max_penetration", "kinetic_energy", "vla", "overflow_events"):
        assert key in disk, key
    assert disk["frames"] == frames and len(disk["kinetic_energy"]) == frames
    # no contact as deep as the smaller half-size of its pair (sim.penetration_limit): nothing reported
    assert disk["health"]["deep_frames"] == 0 and disk["health"]["warnings"] == [], disk["health"]
    assert 0 <= disk["health"]["max_penetration_fraction"] < 1
    assert disk["steps"] == frames * m["substeps"] and math.isclose(disk["sim_time"], disk["steps"] * m["dt"])
    first = disk["first_frame_wall_time"]
    assert 0 < first <= disk["wall_time"]
    after = disk["steps_per_second_after_first_frame"]
    if frames > 1:  # the other frames' steps over the other frames' time
        assert math.isclose(after, (disk["steps"] - m["substeps"]) / (disk["wall_time"] - first))
    else:
        assert after is None
    st = np.load(out / "state.npz")
    tr = np.load(out / "trajectory.npz")
    n = m["bodies"]
    assert st["position"].shape == (n, 3) and st["orientation"].shape == (n, 4)
    assert st["linear_velocity"].shape == (n, 3) and st["angular_velocity"].shape == (n, 3)
    assert tr["position"].shape == (frames, n, 3) and tr["orientation"].shape == (frames, n, 4)
    assert tr["time"].shape == (frames,)
    assert np.allclose(np.linalg.norm(st["orientation"], axis=1), 1, atol=1e-5)
    check(m, st, tr)


def _run_recording(sim, scene, steps, resort_at=()):
    """Load scene, run `steps` steps (a resort after each step in resort_at) with no automatic resort;
    return the scene-order state after every step and the stored orders the run went through."""
    sim.load(scene)
    sim.resort_interval = 0
    out, orders = [], [sim.scene_of.copy()]
    for s in range(steps):
        sim.step()
        if s in resort_at:
            sim.resort()
            orders.append(sim.scene_of.copy())
        out.append((sim.positions(), sim.orientations(), sim.velocities(), sim.angular_velocities(),
                    sim.contact_counts()))
    sim.resort_interval = sim.RESORT_INTERVAL
    return out, orders


def test_advance_with_resorts_and_redone_steps_ends_where_checked_steps_end(sim):
    # advance() checks its steps every few steps, settles before each automatic resort, and redoes a failed
    # step with the steps launched after it. A falling pile whose VLA pools start at one chunk (so commits fail
    # as its contacts grow) advanced 300 steps in one call with a resort every 37 steps must end, in scene
    # order, where 300 checked steps without resorts end: to the last bit (resorts change no motion:
    # test_resort_changes_no_motion_bit_for_bit; redos change none: test_steps_checked_later_are_redone_...).
    scene = _small_pile("vla")
    ref, _ = _run_recording(sim, scene, 300)
    min_bodies = sim.resort_min_bodies
    try:
        sim.load(scene)
        for v in (sim.contacts.lists, sim.grid.pairs):
            v.clear_all()
            v.trim()
        sim.resort_interval = 37
        sim.resort_min_bodies = 0
        resorts = []
        real_resort = type(sim).resort
        sim.resort = lambda: (resorts.append(sim.step_count), real_resort(sim))
        sim.advance(300)
    finally:
        sim.__dict__.pop("resort", None)
        sim.resort_interval = sim.RESORT_INTERVAL
        sim.resort_min_bodies = min_bodies
    assert resorts == list(range(37, 300, 37)) and sim.step_count == 300
    assert sim.vla_regrowths > 0, "some commits must have failed for the redo to be tested"
    got = (sim.positions(), sim.orientations(), sim.velocities(), sim.angular_velocities(), sim.contact_counts())
    for x, y in zip(ref[-1], got):
        assert np.array_equal(x, y)


def test_a_failed_step_and_a_resort_in_one_advance(sim):
    # A resort renumbers the bodies and their contacts (advance() checks its steps before one). Here step 313
    # fails (the pairs' pool cut to one chunk just before it; from step 313 on two bodies' pairs outgrow their
    # inline part, so one chunk cannot hold them) and the resort comes after step 314: 317 steps in one
    # advance() must end where checked steps with the same resort end, to the last bit.
    scene = _small_pile("vla")
    ref, _ = _run_recording(sim, scene, 317, resort_at=(314,))
    min_bodies = sim.resort_min_bodies
    try:
        sim.load(scene)
        sim.resort_interval = 0
        sim.advance(311)
        sim.resort_interval = 315
        sim.resort_min_bodies = 0
        sim._check_every = sim.CHECK_STEPS
        regrowths = sim.vla_regrowths
        real_launch = type(sim)._launch_step

        def launch():
            if sim.step_count == 313:
                sim.grid.pairs.clear_all()
                sim.grid.pairs.trim()
            real_launch(sim)

        sim._launch_step = launch
        sim.advance(6)
    finally:
        sim.__dict__.pop("_launch_step", None)
        sim.resort_interval = sim.RESORT_INTERVAL
        sim.resort_min_bodies = min_bodies
    # (>= 1: the pool regrown for step 313 may leave step 314's device commit short too, since a list that
    # grows moves its chunk run to the pool's bump)
    assert sim.vla_regrowths >= regrowths + 1 and sim.step_count == 317
    got = (sim.positions(), sim.orientations(), sim.velocities(), sim.angular_velocities(), sim.contact_counts())
    for x, y in zip(ref[-1], got):
        assert np.array_equal(x, y)


def _stored_lists(sim):
    """Current generation's records per body in stored order, each a list of (other, feature, point,
    impulse_n) tuples in list order."""
    lists, base = sim.contacts.lists, sim.contacts.base
    if hasattr(lists, "to_csr"):
        offsets, v = lists.to_csr()
        rows = [range(offsets[base + i], offsets[base + i + 1]) for i in range(sim.body_count)]
    else:   # padded: rows of the (list, slot) array, flattened
        v = {key: a.reshape((-1,) + a.shape[2:]) for key, a in lists.data.to_numpy().items()}
        lengths, m = lists.lengths(), lists.max_length
        rows = [range((base + i) * m, (base + i) * m + lengths[base + i]) for i in range(sim.body_count)]
    return [[(int(v["other"][r]), int(v["feature"][r]), tuple(v["point"][r].tolist()), float(v["impulse_n"][r]))
             for r in rs] for rs in rows]


@pytest.mark.parametrize("kind", ["vla", "padded"])
def test_resort_changes_no_motion_bit_for_bit(sim, padded_sim, kind):
    # Simulation.resort stores the bodies again in grid order of where they are, renumbering every contact
    # record's `other` and keeping its impulses. Pair conventions follow body ids, which move with their
    # bodies, so the motion must be the same to the last bit as without resorts (tolerance 0), whatever the
    # storage. The pile falls from up to 1.6 m: by step 120 its bodies are far from their initial Z-order.
    s = sim if kind == "vla" else padded_sim
    scene = _small_pile(kind)
    ref, _ = _run_recording(s, scene, 300)
    got, orders = _run_recording(s, scene, 300, resort_at=(120, 121, 200))
    assert not np.array_equal(orders[0], orders[1]), "the first resort must change the stored order"
    assert int(s.diagnostics.contact_total[None]) > 30, "the pile must be in contact for this to mean anything"
    for step, (a, b) in enumerate(zip(ref, got)):
        for x, y in zip(a, b):
            assert np.array_equal(x, y), f"step {step}: differs after a resort"

    # the lists themselves: body k of the new order holds old body order[k]'s records, `other` renumbered
    s.resort_interval = 0
    s.step()
    old_scene_of = s.scene_of.copy()
    before = _stored_lists(s)   # the lists this step built and solved
    s.resort()
    after = _stored_lists(s)
    new_internal = s.internal_of
    old_internal = np.empty_like(old_scene_of)
    old_internal[old_scene_of] = np.arange(old_scene_of.size)
    for k, recs in enumerate(after):
        old = old_internal[s.scene_of[k]]
        want = [((int(new_internal[old_scene_of[o]]) if o >= 0 else o), f, p, jn) for o, f, p, jn in before[old]]
        assert recs == want, k
    s.resort_interval = s.RESORT_INTERVAL


def test_resort_keeps_host_views_errors_and_added_bodies(sim):
    # After resorts: host accessors (read back lazily from the device ids), the shapes and masses of bodies
    # added later (within the capacity; past it: test_add_bodies_grows_capacity_without_loss), and the body
    # named by an explosion, all in scene order.
    from app.sim import SimulationError

    pile = _small_pile("vla")
    sim.load(pile)
    sim.resort_interval = 0
    for _ in range(150):
        sim.step()
    ref_shapes = sim.shapes()
    ref_pos = sim.positions()
    order0 = sim.scene_of.copy()
    n = sim.body_count
    grid_order = sim.grid.body_order.to_numpy()[:n]   # this step's grid order (old stored indices)
    is_sphere = sim.model.body_shape.to_numpy()[:n][grid_order] == 0
    assert 0 < is_sphere.sum() < n
    sim.resort()
    assert not np.array_equal(sim.scene_of, order0)
    # the new order is the grid order split by shape, spheres first, each part in grid order
    want = np.concatenate([grid_order[is_sphere], grid_order[~is_sphere]])
    assert np.array_equal(sim.scene_of, order0[want])
    assert np.array_equal(sim.internal_of[sim.scene_of], np.arange(sim.body_count))
    assert np.array_equal(sim.model.body_id.to_numpy()[:sim.body_count], sim.scene_of)
    assert np.array_equal(sim.positions(), ref_pos)
    for key, val in sim.shapes().items():
        assert np.array_equal(val, ref_shapes[key]), key
    # the model's device fields are the builder's rows (scene order), row by row in the new stored order
    rows = sim.builder.bodies
    assert np.array_equal(sim.model.body_shape.to_numpy()[:sim.body_count], rows["shape"][sim.scene_of])
    assert np.array_equal(sim.model.body_mass.to_numpy()[:sim.body_count],
                          rows["mass"][sim.scene_of].astype(np.float32))

    # add bodies after a resort: the new ones keep their own shapes; the old ones theirs
    sim.resort()
    n0 = sim.body_count
    sim.add_bodies([{"shape": "box", "half_extents": [0.3, 0.02, 0.3], "position": [0, 3, 0], "material": "b"}])
    sh = sim.shapes()
    assert sh["shape"][n0] == 1 and np.allclose(sh["half_extents"][n0], [0.3, 0.02, 0.3])
    for key in ref_shapes:
        assert np.array_equal(sh[key][:n0], ref_shapes[key]), key
    stored = sim.internal_of[n0]
    assert sim.model.body_shape[stored] == 1 and sim.model.body_id[stored] == n0
    assert np.isclose(sim.model.body_half_extents[stored][0], 0.3)

    # an explosion found before a resort is reported by scene index after it
    sim.resort()
    victim = 7
    sim.diagnostics.error_body[None] = int(sim.internal_of[victim])
    sim.diagnostics.error_step[None] = 151
    sim.diagnostics.error_kind[None] = 1
    sim.resort()
    with pytest.raises(SimulationError) as ei:
        sim.check()
    assert f"body {victim} (scene order)" in str(ei.value)
    sim.resort_interval = sim.RESORT_INTERVAL
    sim.load(pile)


def test_step_resorts_large_scenes_every_interval(sim):
    # step() calls resort() every sim.resort_interval steps (the scene's key) once the scene has
    # resort_min_bodies bodies.
    pile = _small_pile("vla")
    sim.load(scene_from_dict(pile.raw, ["sim.resort_interval=7"]))
    assert sim.resort_interval == 7
    calls = []
    sim.resort = lambda: calls.append(sim.step_count)
    try:
        n = sim.body_count
        sim.resort_min_bodies = n + 1
        for _ in range(30):
            sim.step()
        assert calls == []   # n bodies < n + 1
        sim.resort_min_bodies = n
        for _ in range(30):
            sim.step()
        assert calls == [35, 42, 49, 56]
    finally:
        del sim.resort
        sim.resort_min_bodies = sim.RESORT_MIN_BODIES
        sim.load(pile)
    assert sim.resort_interval == sim.RESORT_INTERVAL == 500   # the default, back with a scene that sets none


def test_add_bodies_grows_capacity_without_loss(sim, monkeypatch):
    """Last in the module: it grows the shared simulation (reallocation, one recompilation). A growth that fails
    changes nothing; one that succeeds keeps what was written straight into the Model's live fields."""
    scene = scene_from_dict({"name": "grow", "materials": {"m": {}},
                             "static": [{"type": "plane", "normal": [0, 1, 0], "offset": 0, "material": "m"}],
                             "bodies": [{"generate": "grid", "shape": "sphere", "radius": 0.1, "count": [4, 1, 4],
                                         "origin": [0, 0.1, 0], "spacing": 0.3, "material": "m"}]})
    sim.load(scene)
    sim.add_bodies([{"generate": "grid", "shape": "sphere", "radius": 0.1, "count": [CAPACITY - 16, 1, 1],
                     "origin": [-2000, 0.1, 5], "spacing": 0.3, "material": "m"}])  # fill to capacity
    assert sim.body_count == CAPACITY and sim.capacity == CAPACITY
    sim.step_frame()
    before = sim.positions().copy()
    sim.resort()   # the growth below then starts from re-sorted bodies (host rows read back lazily)
    assert np.array_equal(sim.positions(), before)
    boxes = [{"generate": "grid", "shape": "box", "half_extents": [0.1, 0.1, 0.1], "count": [3, 1, 3],
              "origin": [2, 0.5, 0], "spacing": 0.3, "material": "m"}]

    def no_room():
        raise SimulationCapacityError("no room (test)")

    with monkeypatch.context() as m:
        m.setattr(simulation_module, "_check_tree_room", no_room)
        with pytest.raises(SimulationCapacityError, match="no room"):
            sim.add_bodies(boxes)
    assert sim.body_count == CAPACITY and sim.capacity == CAPACITY and len(sim.shapes()["shape"]) == CAPACITY
    assert np.array_equal(sim.positions(), before) and len(sim.scene_of) == CAPACITY
    sim.model.gravity[None] = [0.0, -1.6, 0.0]          # written straight into the live fields
    sim.model.material_friction[0] = 0.25
    sim.add_bodies(boxes)
    assert sim.body_count == CAPACITY + 9 and sim.capacity >= CAPACITY + 9
    assert np.allclose(sim.model.gravity[None].to_numpy(), [0, -1.6, 0]) and sim.model.material_friction[0] == 0.25
    sim.set_gravity([0.0, -9.81, 0.0])
    assert np.array_equal(sim.positions()[:CAPACITY], before)
    assert (sim.shapes()["shape"][:CAPACITY] == 0).all() and (sim.shapes()["shape"][CAPACITY:] == 1).all()
    assert np.array_equal(sim.model.body_id.to_numpy()[:sim.body_count], sim.scene_of)
    for _ in range(50):  # 0.8 s: 0.29 s of fall, then the landing settles
        sim.step_frame()
    p = sim.positions()
    assert np.allclose(p[CAPACITY:, 1], 0.1, atol=2e-3), "the added boxes fell and rest on the floor"
    assert np.allclose(p[:CAPACITY, 1], 0.1, atol=2e-3)


def test_bodies_stored_by_shape_and_z_order_read_back_in_scene_order(sim):
    # Bodies listed in an order that scatters them in space are stored by shape (spheres first), each shape
    # along a Z-order curve (storage_order), yet every host accessor, and the body named in an error, speak
    # scene order.
    from app.sim.reorder import spatial_order, storage_order

    rng = np.random.default_rng(3)
    lattice = np.stack(np.meshgrid(np.arange(5), np.arange(3), np.arange(4), indexing="ij"), -1).reshape(-1, 3)
    pos = (lattice * 0.5 + [0.0, 1.0, 0.0])[rng.permutation(60)]  # 0.5 m apart: no contacts, shuffled
    bodies = [{"shape": "sphere" if k % 2 else "box", "radius": 0.05 + 0.001 * k,
               "half_extents": [0.05, 0.04 + 0.0005 * k, 0.05], "position": pos[k].tolist(),
               "velocity": [0.01 * k, 0, 0], "material": "m"} for k in range(60)]
    for b in bodies:
        b.pop("half_extents" if b["shape"] == "sphere" else "radius")
    sim.load(scene_from_dict({"name": "z", "sim": {"gravity": [0, 0, 0]}, "materials": {"m": {}}, "bodies": bodies}))
    shape = np.array([0 if k % 2 else 1 for k in range(60)])
    order = storage_order(pos, shape)
    assert np.array_equal(sim.scene_of, order) and not np.array_equal(order, np.arange(60))
    assert np.array_equal(sim.internal_of[sim.scene_of], np.arange(60))
    # reference: spheres (odd scene indices) first, then boxes, each in the Z-order of all bodies
    z = spatial_order(pos).tolist()
    assert order.tolist() == [k for k in z if k % 2] + [k for k in z if k % 2 == 0]
    assert sim.model.body_shape.to_numpy()[:60].tolist() == [0] * 30 + [1] * 30
    stored = sim.state.body_pos.to_numpy()[:60]
    assert np.allclose(stored, pos[order], atol=1e-6)  # really stored in that order
    # Z-order within each shape: stored neighbours are closer than the same shape's neighbours in scene order
    # (each shape holds every other lattice site, so the curve gains less than on a full lattice: 0.67 / 0.75)
    def mean_step(p):
        return np.linalg.norm(np.diff(p, axis=0), axis=1).mean()

    for run, scene_rows in ((stored[:30], pos[1::2]), (stored[30:], pos[0::2])):
        assert mean_step(run) < 0.8 * mean_step(scene_rows)
    assert np.allclose(sim.positions(), pos, atol=1e-6)
    assert np.allclose(sim.velocities()[:, 0], 0.01 * np.arange(60), atol=1e-6)
    sh = sim.shapes()
    assert sh["shape"].tolist() == [0 if k % 2 else 1 for k in range(60)]  # odd: sphere (0), even: box (1)
    assert np.allclose(sh["half_extents"][0::2, 1], 0.04 + 0.0005 * np.arange(0, 60, 2), atol=1e-7)
    sim.step()
    assert np.allclose(sim.positions(), pos + sim.dt * sim.velocities(), atol=1e-5)


def test_contact_counts_in_scene_order(sim):
    # Spheres listed in shuffled order, every other one resting on the floor: contact_counts() (stored lists
    # put in scene order) says 1 exactly for the resting ones.
    rng = np.random.default_rng(8)
    xs = rng.permutation(24) * 0.5
    bodies = [{"shape": "sphere", "radius": 0.1, "position": [float(xs[k]), 0.0999 if k % 2 else 1.0, 0.0],
               "material": "m"} for k in range(24)]
    sim.load(scene_from_dict({"name": "cc", "sim": {"gravity": [0, 0, 0]}, "materials": {"m": {}},
                              "static": [{"type": "plane", "normal": [0, 1, 0], "offset": 0, "material": "m"}],
                              "bodies": bodies}))
    assert not np.array_equal(sim.scene_of, np.arange(24))
    sim.step()
    assert sim.contact_counts().tolist() == [k % 2 for k in range(24)]


def test_grid_body_order_is_a_permutation_sorted_by_bucket(sim):
    # body_order is what the narrowphase and solver threads walk: every body exactly once, grouped by bucket
    # in bucket (Z-order) order, and each bucket's bodies are the ones whose cell maps to it.
    sim.load(_small_pile("vla"))
    for _ in range(20):
        sim.step()
    g = sim.grid
    n = sim.body_count
    order = g.body_order.to_numpy()[:n]
    assert sorted(order.tolist()) == list(range(n))
    bucket = g.body_bucket.to_numpy()[:n]
    assert np.all(np.diff(bucket[order]) >= 0)
    start = g.bucket_start.to_numpy()
    lengths = g.cells.lengths()
    assert np.array_equal(start, np.concatenate([[0], np.cumsum(lengths)]))
    # reference bucket: Morton code of (floor(p / cell) mod P) computed in numpy
    pos = sim.state.body_pos.to_numpy()[:n]  # stored order, like body_order and body_bucket
    cell = np.floor(pos.astype(np.float32) / np.float32(sim.model.grid_cell_size[None])).astype(np.int64) & g.axis_mask

    def spread(x):
        out = np.zeros_like(x)
        for b in range(10):
            out |= ((x >> b) & 1) << (3 * b)
        return out
    ref = spread(cell[:, 0]) | (spread(cell[:, 1]) << 1) | (spread(cell[:, 2]) << 2)
    assert np.array_equal(bucket, ref)


def _contact_set(sim):
    """Grid, candidate pairs and narrowphase on the current state into a fresh contact generation: the set of
    (stored body, other, feature, depth) of every record."""
    from app.sim.narrowphase import find_contacts

    sim.contacts.begin_step(sim.body_count)
    sim.grid.build(sim.model, sim.state, sim.dt)
    find_contacts(sim.model, sim.state, sim.grid, sim.contacts, sim.diagnostics, sim.dt)
    offsets, values = sim.contacts.lists.to_csr()
    base = sim.contacts.base
    out = set()
    for i in range(sim.body_count):
        for r in range(offsets[base + i], offsets[base + i + 1]):
            out.add((i, int(values["other"][r]), int(values["feature"][r]), round(float(values["depth"][r]), 6)))
    return out


def test_narrowphase_same_contacts_when_candidate_pairs_overflow(sim):
    # With the pairs VLA emptied and trimmed, every pair beyond a list's 2 inline slots overflows: the pairs'
    # commit grows the pool and moves them home before the narrowphase reads them (class 0 through the flat
    # walk, classes 1-2 compacted), and the contacts must be the same set as with room for all.
    pile = _small_pile("vla")
    sim.load(scene_from_dict({**pile.raw, "bodies": [{**pile.raw["bodies"][0], "count": 130, "max": [0.55, 3.0, 0.55]}]}))
    for _ in range(400):  # landed, three layers deep: lists of every class beyond their 2 inline slots
        sim.step()

    roomy = _contact_set(sim)
    sim.contacts.flip()  # back to the same generation, so both runs fill the same lists
    sim.grid.pairs.clear_all()
    sim.grid.pairs.trim()
    assert sim.grid.pairs.stats()["pool_chunks_used"] == 0
    tight = _contact_set(sim)
    per_class = sim.grid.pairs.lengths().reshape(sim.grid.pair_classes, -1)
    assert all((per_class[c] > 2).any() for c in range(3))  # every class overflowed (beyond 2 inline)
    assert len(roomy) > sim.body_count and tight == roomy


def test_step_redone_after_a_failed_device_commit_moves_bodies_the_same(sim):
    # Simulation.step commits its VLAs on the device (vla.Batch) and reads once whether that sufficed; when it
    # did not (a pool too small: the device cannot grow one), the broadphase and narrowphase run again through
    # vla.launch. A step that went that way must end exactly where a step with room everywhere ends: same
    # state to the last bit (CPU runs are deterministic: the solver sums in fixed point, see FIXED_ONE).
    sim.load(_small_pile("vla"))
    for _ in range(400):  # landed: every class of pair lists beyond its 2 inline slots
        sim.step()
    st = sim.state
    fields = (st.body_pos, st.body_quat, st.body_vel, st.body_omega)
    before = [f.to_numpy() for f in fields]
    redone = sim.vla_regrowths
    sim.step()
    assert sim.vla_regrowths == redone  # room everywhere: the batch sufficed
    roomy = [f.to_numpy() for f in fields]

    sim.contacts.flip()  # back to the same generations: the step warm-starts from the same lists
    for f, a in zip(fields, before):
        f.from_numpy(a)
    sim.grid.pairs.clear_all()
    sim.grid.pairs.trim()  # a pool of one chunk: the pairs' device commit cannot place the pairs past inline
    assert sim.grid.pairs.stats()["pool_chunks_total"] == 1
    sim.step()
    assert sim.vla_regrowths == redone + 1  # the batch failed and the step was redone through vla.launch
    for a, b in zip(roomy, (f.to_numpy() for f in fields)):
        assert np.array_equal(a, b)
    assert not np.array_equal(roomy[0], before[0])  # (the step moved the bodies)


def test_steps_checked_later_are_redone_from_the_failed_one_to_the_same_bits(sim):
    # Simulation.advance reads back whether its steps' VLA commits sufficed only every few steps. A step whose
    # commit failed, and every step launched after it before that read, must leave the state and the contact
    # lists alone, and the redo from the failed step must end where steps checked one at a time end: the
    # same state to the last bit. Here 2 steps succeed, the pairs' pool is cut to one chunk, and the next 2
    # steps are launched before the read.
    st = sim.state
    fields = (st.body_pos, st.body_quat, st.body_vel, st.body_omega)

    def run(fail_in_window):
        sim.load(_small_pile("vla"))
        sim.advance(400)  # landed: every class of pair lists beyond its 2 inline slots
        sim._check_every = 4
        regrowths = sim.vla_regrowths
        launched = []
        sim._launch_step = lambda: (launched.append(sim.step_count), type(sim)._launch_step(sim))
        try:
            sim._launch_step()
            sim._launch_step()
            if fail_in_window:
                sim.grid.pairs.clear_all()
                sim.grid.pairs.trim()   # the next step's device commit cannot place its pairs
                assert sim.grid.pairs.stats()["pool_chunks_total"] == 1
            sim._launch_step()
            sim._launch_step()
            before = fields[0].to_numpy() if fail_in_window else None
            sim._settle()
        finally:
            del sim._launch_step
        return [f.to_numpy() for f in fields], launched, sim.vla_regrowths - regrowths, before

    checked, launched, redone, _ = run(False)
    assert launched == [400, 401, 402, 403] and redone == 0 and sim.step_count == 404
    later, launched, redone, skipped = run(True)
    # step 402 failed: 403 was skipped, 402 was redone through vla.launch and 403 launched again
    assert launched == [400, 401, 402, 403, 403] and redone == 1 and sim.step_count == 404
    assert not np.array_equal(skipped, later[0])   # (before the read, steps 402-403 had not moved the bodies)
    for a, b in zip(checked, later):
        assert np.array_equal(a, b)


def test_solver_motion_does_not_depend_on_list_order(sim):
    # Threads append their pairs' contacts in whatever order they race (each pair's points together, in feature
    # order); the solver sums each list in fixed point (app.sim.solver.FIXED_ONE) and finds warm-start partners by
    # key, so one step from the same state and the same contacts, with every list's pairs (both generations) in
    # another order, must give bit-identical velocities and poses.
    from app.sim.narrowphase import find_contacts

    sim.load(_small_pile("vla"))
    for _ in range(300):  # landed: many lists with several records, and a previous generation to warm-start from
        sim.step()
    sim.contacts.flip()
    sim.grid.build(sim.model, sim.state, sim.dt)
    find_contacts(sim.model, sim.state, sim.grid, sim.contacts, sim.diagnostics, sim.dt)
    st = sim.state
    fields = (st.body_pos, st.body_quat, st.body_vel, st.body_omega)
    state0 = [f.to_numpy() for f in fields]
    lists = sim.contacts.lists
    offsets, values = lists.to_csr()

    # the narrowphase's marks for the impact pass, which the pass consumes: each solve starts from them
    marks = (sim.contacts.impact_dirty.to_numpy(), sim.contacts.impact_any.to_numpy())

    def solve():
        for f, a in zip(fields, state0):
            f.from_numpy(a)
        sim.contacts.impact_dirty.from_numpy(marks[0])
        sim.contacts.impact_any.from_numpy(marks[1])
        sim.solver.step(st, st, sim.contacts, sim.dt)
        return [f.to_numpy() for f in fields]

    first = solve()
    impulses = lists.to_csr()[1]["impulse_n"]
    assert (impulses > 0).sum() > sim.body_count // 2  # the solver pushed: many contacts carry an impulse
    rng = np.random.default_rng(3)
    perm = np.arange(int(offsets[-1]))
    permuted = 0
    count = ((values["feature"] >> COUNT_SHIFT) & 3) + 1
    for i in range(lists.num_arrays):
        a, b = int(offsets[i]), int(offsets[i + 1])
        starts = [a]
        while starts[-1] < b:
            starts.append(starts[-1] + int(count[starts[-1]]))
        if len(starts) > 2:
            blocks = [np.arange(starts[k], starts[k + 1]) for k in range(len(starts) - 1)]
            perm[a:b] = np.concatenate([blocks[k] for k in rng.permutation(len(blocks))[::-1]])
            permuted += int((perm[a:b] != np.arange(a, b)).any())
    assert permuted > sim.body_count // 2, "the pile must have many lists of several contacts"
    lists.from_csr(offsets, {name: arr[perm] for name, arr in values.items()})
    second = solve()
    for name, x, y in zip(("position", "orientation", "velocity", "angular velocity"), first, second):
        assert np.array_equal(x, y), name
    sim.load(_small_pile("vla"))


def _pile_with_a_block():
    """The small pile and a 3 x 2 x 3 block of touching boxes on its floor: a box in the middle of the block has up to
    4 points with each of its neighbours and so lists of ~20 records, beside the pile's short ones."""
    block = {"generate": "grid", "shape": "box", "half_extents": [0.05, 0.05, 0.05], "count": [3, 2, 3],
             "origin": [-0.1, 0.05, -0.1], "spacing": 0.1, "material": "a"}
    pile = _small_pile("vla")
    return scene_from_dict({**pile.raw, "bodies": pile.raw["bodies"] + [block]})


def test_warm_start_takes_each_contacts_impulse_from_last_steps_record_with_its_key(sim):
    # The narrowphase gives each new contact the impulses of last step's record of the same pair and feature,
    # from one of the pair's two lists (both copies were solved alike). Reference: each body's own last list,
    # as a dict per body in plain Python; lists of more than 8 records must be among those checked.
    from app.sim.narrowphase import find_contacts

    sim.load(_pile_with_a_block())
    for _ in range(300):
        sim.step()
    sim.contacts.flip()
    sim.grid.build(sim.model, sim.state, sim.dt)
    find_contacts(sim.model, sim.state, sim.grid, sim.contacts, sim.diagnostics, sim.dt)
    lists, c = sim.contacts.lists, sim.contacts
    offsets, cur = lists.to_csr()
    prev = cur
    warm = float(sim.model.warm_start[None])
    inv_mass = sim.model.body_inv_mass.to_numpy()
    checked_beyond_8 = 0
    for i in range(sim.body_count):
        if inv_mass[i] == 0.0:
            continue
        a, b = int(offsets[c.prev_base + i]), int(offsets[c.prev_base + i + 1])
        last = {}
        for q in range(a, b):
            # (last step's records carry the solver's pair links: the key is the rest)
            key = (int(prev["other"][q]), int(prev["feature"][q]) & FEATURE_KEY_MASK)
            last.setdefault(key, (q - a, float(prev["impulse_n"][q])))
        for r in range(int(offsets[c.base + i]), int(offsets[c.base + i + 1])):
            q, jn = last.get((int(cur["other"][r]), int(cur["feature"][r]) & FEATURE_KEY_MASK), (-1, 0.0))
            assert cur["impulse_n"][r] == np.float32(warm * jn), (i, r)
            # friction: last step's impulse back in 3-D from its own tangents, its in-plane part now,
            # in this record's tangents (float64 reference; the kernel rounds in f32)
            jt = np.zeros(3)
            if q >= 0:
                old_n = _record_normal_ref(prev["normal_code"][a + q], prev["feature"][a + q])
                o1, o2 = _tangents_ref(old_n)
                old_t = prev["impulse_t"][a + q, 0] * o1 + prev["impulse_t"][a + q, 1] * o2
                n = _record_normal_ref(cur["normal_code"][r], cur["feature"][r])
                jt = warm * (old_t - old_t.dot(n) * n)
            t1, t2 = _tangents_ref(_record_normal_ref(cur["normal_code"][r], cur["feature"][r]))
            assert np.allclose(cur["impulse_t"][r], [jt.dot(t1), jt.dot(t2)], rtol=1e-4, atol=1e-7), (i, r)
            checked_beyond_8 += q >= 8
    assert checked_beyond_8 > 0, "no warm-start partner sat past the 8th record: the test needs longer lists"
    assert (cur["impulse_n"] > 0).sum() > sim.body_count  # many contacts were warm-started
    sim.load(_small_pile("vla"))


def test_a_pairs_points_sit_together_in_feature_order_in_both_lists(sim):
    # The narrowphase puts a pair's points in consecutive slots of each of its two lists (the solver walks them in
    # order), ordered by feature id, each marked with its rank and the pair's count. Reference: plain Python over
    # every list; the block's boxes touch their neighbours and the floor with up to 4 points each.
    sim.load(_pile_with_a_block())
    for _ in range(50):
        sim.step()
    offsets, cur = sim.contacts.lists.to_csr()
    several = 0
    for i in range(sim.body_count):
        a, b = int(offsets[sim.contacts.base + i]), int(offsets[sim.contacts.base + i + 1])
        other = cur["other"][a:b].astype(int)
        feature = cur["feature"][a:b].astype(int)
        key = feature & FEATURE_KEY_MASK
        rank = (feature >> RANK_SHIFT) & 3
        count = ((feature >> COUNT_SHIFT) & 3) + 1
        k = 0
        while k < b - a:
            c = int(count[k])
            assert rank[k] == 0, (i, k)
            run = slice(k, k + c)
            assert (other[run] == other[k]).all() and (count[run] == c).all(), (i, k)
            assert rank[run].tolist() == list(range(c)) and (np.diff(key[run]) > 0).all(), (i, k)
            assert (other == other[k]).sum() == c, (i, k)   # and no other record of that pair elsewhere
            several += c > 1
            k += c
    assert several > 50, several
    sim.load(_small_pile("vla"))


def _decode_normal_ref(code):
    """numpy (float64) reference of app.sim.math3d.decode_normal: octahedral coordinates in two 16-bit halves."""
    code = int(code) & 0xFFFFFFFF
    qx, qy = code & 0xFFFF, code >> 16
    px, py = [(q - 0x10000 if q >= 0x8000 else q) / 32767.0 for q in (qx, qy)]
    z = 1.0 - abs(px) - abs(py)
    if z < 0:
        px, py = (1.0 - abs(py)) * (1.0 if px >= 0 else -1.0), (1.0 - abs(px)) * (1.0 if py >= 0 else -1.0)
    v = np.array([px, py, z])
    return v / np.linalg.norm(v)


def _encode_normal_ref(n):
    """numpy reference of app.sim.math3d.encode_normal (float64, so a component may round the other way at a tie)."""
    n = np.asarray(n, np.float64)
    p = n[:2] / np.abs(n).sum()
    if n[2] < 0:
        p = (1.0 - np.abs(p[::-1])) * np.where(p >= 0, 1.0, -1.0)
    q = np.rint(np.clip(p, -1, 1) * 32767.0).astype(np.int64)
    return int(np.int32(np.uint32((q[0] & 0xFFFF) | ((q[1] & 0xFFFF) << 16))))


def _record_normal_ref(code, feature):
    """numpy reference of app.sim.contacts.record_normal: the code stores the normal that pushes the pair's first
    body (or the body, against a plane); the second body's copy, flagged in its feature, negates it."""
    return _decode_normal_ref(code) * (-1.0 if int(feature) & SECOND_COPY else 1.0)


def test_normal_code_round_trips_within_7e_5_rad_and_axes_exactly(sim):
    # A contact record keeps its normal in 32 bits (app.sim.math3d.encode_normal): the decoded normal must be unit,
    # within 7e-5 rad of the original (the octahedral map's worst case with 16-bit coordinates: 6.4e-5 in float64
    # on 2M random normals, plus f32 rounding), exact on the six axes (resting contacts on floors and walls keep
    # exact normals), and the codes must match a numpy reference (one step of 1/32767 where a float rounds at a
    # tie). Normals: random, both hemispheres, on and near the fold (z ~ 0) and the octahedron's edges (x or y ~ 0).
    from app.sim.math3d import decode_normal, encode_normal

    rng = np.random.default_rng(21)
    n = rng.normal(size=(4000, 3))
    n[:500, 2] *= 1e-6
    n[500:1000, 0] *= 1e-6
    n[1000:1500, 1] *= 1e-6
    axes = np.array([[1, 0, 0], [-1, 0, 0], [0, 1, 0], [0, -1, 0], [0, 0, 1], [0, 0, -1]], np.float64)
    n[1500:1506] = axes
    n = (n / np.linalg.norm(n, axis=1, keepdims=True)).astype(np.float32)
    codes = np.zeros(len(n), np.int32)
    out = np.zeros((len(n), 3), np.float32)

    @ti.kernel
    def round_trip(nn: ti.types.ndarray(), codes: ti.types.ndarray(), out: ti.types.ndarray()):
        for k in range(nn.shape[0]):
            c = encode_normal(ti.Vector([nn[k, 0], nn[k, 1], nn[k, 2]]))
            codes[k] = c
            d = decode_normal(c)
            for a in ti.static(range(3)):
                out[k, a] = d[a]

    round_trip(n, codes, out)
    nd, od = n.astype(np.float64), out.astype(np.float64)
    assert np.allclose(np.linalg.norm(od, axis=1), 1.0, atol=1e-6)
    angle = np.arctan2(np.linalg.norm(np.cross(nd, od), axis=1), (nd * od).sum(1))   # (arccos is blunt near 0)
    assert angle.max() < 7e-5, angle.max()
    assert (out[1500:1506] == axes).all()
    for k in range(len(n)):
        ref = _encode_normal_ref(n[k])
        for half in (0, 16):
            qa = (int(codes[k]) >> half) & 0xFFFF
            qb = (ref >> half) & 0xFFFF
            assert min((qa - qb) & 0xFFFF, (qb - qa) & 0xFFFF) <= 1, (k, n[k], codes[k], ref)
        assert np.allclose(_decode_normal_ref(codes[k]), od[k], atol=1e-6), k


def _tangents_ref(n):
    """numpy reference of app.sim.math3d.contact_tangents (float64)."""
    flip = n[1] < 0 or (n[1] == 0 and (n[0] < 0 or (n[0] == 0 and n[2] < 0)))
    s = -1.0 if flip else 1.0
    m = s * n
    sz = 1.0 if m[2] >= 0 else -1.0
    a = -1.0 / (sz + m[2])
    b = m[0] * m[1] * a
    return (s * np.array([1.0 + sz * m[0] * m[0] * a, sz * b, -sz * m[0]]),
            np.array([b, sz + m[1] * m[1] * a, -m[1]]))


def test_contact_tangents_are_an_orthonormal_basis_mirrored_exactly(sim):
    # contact_tangents(n) = (t1, t2): unit, orthogonal to each other and to n, t1 x t2 = n, and for -n exactly
    # (-t1, t2) bit for bit (the two copies of a pair contact store their friction impulse in these bases).
    # Normals: random, the axes with +-0.0 components, and near the canonical flip (y ~ 0) and the basis's
    # own seam (z ~ 0).
    from app.sim.math3d import contact_tangents

    rng = np.random.default_rng(8)
    n = rng.normal(size=(200, 3))
    n[:40, 1] *= 1e-7
    n[40:80, 2] *= 1e-7
    axes = [[1, 0, 0], [0, 1, 0], [0, 0, 1], [-0.0, 1, 0.0], [1, -0.0, 0], [0.0, -0.0, -1], [0.6, 0, 0.8]]
    n[80:80 + len(axes)] = axes
    n = (n / np.linalg.norm(n, axis=1, keepdims=True)).astype(np.float32)
    both = np.concatenate([n, -n])
    out = np.zeros((len(both), 2, 3), np.float32)

    @ti.kernel
    def basis(nn: ti.types.ndarray(), out: ti.types.ndarray()):
        for k in range(nn.shape[0]):
            t1, t2 = contact_tangents(ti.Vector([nn[k, 0], nn[k, 1], nn[k, 2]]))
            for c in ti.static(range(3)):
                out[k, 0, c] = t1[c]
                out[k, 1, c] = t2[c]

    basis(both, out)
    t1, t2 = out[:, 0].astype(np.float64), out[:, 1].astype(np.float64)
    nd = both.astype(np.float64)
    # f32 arithmetic: a few ulps (1 ulp = 6e-8)
    assert np.allclose(np.linalg.norm(t1, axis=1), 1, atol=1e-6) and np.allclose(np.linalg.norm(t2, axis=1), 1, atol=1e-6)
    for x, y in ((t1, t2), (t1, nd), (t2, nd)):
        assert np.abs((x * y).sum(1)).max() < 1e-6
    assert np.allclose(np.cross(t1, t2), nd, atol=1e-6)
    m = len(n)
    assert (-out[:m, 0]).tobytes() == out[m:, 0].tobytes() and out[:m, 1].tobytes() == out[m:, 1].tobytes()
    ref = np.array([np.concatenate(_tangents_ref(x)) for x in nd])
    assert np.allclose(out.reshape(-1, 6), ref, atol=1e-6)


def test_pair_contact_copies_hold_opposite_impulses_bit_for_bit(sim):
    # Each pair contact is solved twice, once in each body's list, from mirrored inputs: the two copies must
    # hold the same normal and split impulses and opposite friction impulses (coordinates (c1, c2) and
    # (c1, -c2) in the mirrored tangent bases), bit for bit, so that momentum is exchanged exactly. (This
    # module runs without fast math, so the two threads round alike.)
    sim.load(_small_pile("vla"))
    for _ in range(300):
        sim.step()
    offsets, rec = sim.contacts.lists.to_csr()
    base = sim.contacts.base  # the generation the last step built and solved
    copies = {}
    for i in range(sim.body_count):
        for r in range(int(offsets[base + i]), int(offsets[base + i + 1])):
            if rec["other"][r] >= 0:
                copies.setdefault((i, int(rec["other"][r]), int(rec["feature"][r])), []).append(r)
    pairs = 0
    for (i, j, f), rs in copies.items():
        mirror = copies.get((j, i, f | SECOND_COPY))   # (i, j, f) the first body's copy, its mirror flagged
        if f & SECOND_COPY or mirror is None or len(rs) != 1 or len(mirror) != 1:
            continue
        a, b = rs[0], mirror[0]
        assert rec["normal_code"][a] == rec["normal_code"][b], (i, j, f)   # (each copy's normal: +- its decoding)
        assert rec["impulse_n"][a] == rec["impulse_n"][b] and rec["impulse_p"][a] == rec["impulse_p"][b], (i, j, f)
        assert rec["impulse_t"][a][0] == rec["impulse_t"][b][0] and rec["impulse_t"][a][1] == -rec["impulse_t"][b][1]
        pairs += rec["impulse_n"][a] > 0
    assert pairs >= 10, "a landed pile must have many pushing pair contacts (this one: 12 of 40 bodies)"
    sim.load(_small_pile("vla"))


def test_solver_body_symmetric_inertia_matches_full_matrix(sim):
    # SolverBody keeps the world inverse inertia R diag(I^-1) R^T as 6 numbers: sym_mul(sym_pack(M), x) must
    # equal M @ x for the matrices world_inv_inertia builds (random orientations and box inertias).
    from app.sim.math3d import quat_to_mat, world_inv_inertia
    from app.sim.solver import sym_mul, sym_pack

    rng = np.random.default_rng(5)
    q = rng.normal(size=(64, 4)).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    inv_i = rng.uniform(0.1, 50.0, size=(64, 3)).astype(np.float32)
    x = rng.normal(size=(64, 3)).astype(np.float32)
    out = np.zeros((64, 2, 3), np.float32)

    @ti.kernel
    def apply(q: ti.types.ndarray(), inv_i: ti.types.ndarray(), x: ti.types.ndarray(), out: ti.types.ndarray()):
        for k in range(64):
            M = world_inv_inertia(quat_to_mat(ti.Vector([q[k, 0], q[k, 1], q[k, 2], q[k, 3]])),
                                  ti.Vector([inv_i[k, 0], inv_i[k, 1], inv_i[k, 2]]))
            v = ti.Vector([x[k, 0], x[k, 1], x[k, 2]])
            d, o = sym_pack(M)
            a = sym_mul(d, o, v)
            b = M @ v
            for c in ti.static(range(3)):
                out[k, 0, c] = a[c]
                out[k, 1, c] = b[c]

    apply(q, inv_i, x, out)
    assert np.allclose(out[:, 0], out[:, 1], rtol=1e-5, atol=1e-4)
    w, xx, y, z = q.T.astype(np.float64)  # and M itself: R diag R^T from the quaternion, in numpy
    R = np.stack([np.stack([1 - 2 * (y * y + z * z), 2 * (xx * y - w * z), 2 * (xx * z + w * y)], -1),
                  np.stack([2 * (xx * y + w * z), 1 - 2 * (xx * xx + z * z), 2 * (y * z - w * xx)], -1),
                  np.stack([2 * (xx * z - w * y), 2 * (y * z + w * xx), 1 - 2 * (xx * xx + y * y)], -1)], 1)
    ref = np.einsum("kij,kj,klj,kl->ki", R, inv_i, R, x)
    assert np.allclose(out[:, 0], ref, rtol=1e-4, atol=1e-3)


def test_solver_records_pack_into_words_bit_for_bit(sim):
    # The solver keeps SolverBody and Motion as six u64 words each (app.sim.solver_records); every member must come
    # back with the same bits and in its own place (random bit patterns: NaN payloads and -0.0 included).
    from app.sim.solver_records import Motion, SolverBody, pack_body, pack_motion, unpack_body, unpack_motion

    bits = np.random.default_rng(11).integers(0, 2**32, size=(32, 2, 12), dtype=np.uint64).astype(np.uint32)
    src = bits.view(np.float32)
    out = np.zeros_like(src)

    @ti.kernel
    def roundtrip(src: ti.types.ndarray(), out: ti.types.ndarray()):
        for k in range(32):
            f = ti.Vector([src[k, 0, c] for c in ti.static(range(12))])
            g = ti.Vector([src[k, 1, c] for c in ti.static(range(12))])
            b = unpack_body(pack_body(SolverBody(
                pos=ti.Vector([f[0], f[1], f[2]]), inv_mass=f[3], inv_inertia_d=ti.Vector([f[4], f[5], f[6]]),
                inv_inertia_o=ti.Vector([f[7], f[8], f[9]]), split=f[10], friction=f[11])))
            m = unpack_motion(pack_motion(Motion(
                v=ti.Vector([g[0], g[1], g[2]]), w=ti.Vector([g[3], g[4], g[5]]), pv=ti.Vector([g[6], g[7], g[8]]),
                pw=ti.Vector([g[9], g[10], g[11]]))))
            for c in ti.static(range(3)):
                out[k, 0, c] = b.pos[c]
                out[k, 0, 4 + c] = b.inv_inertia_d[c]
                out[k, 0, 7 + c] = b.inv_inertia_o[c]
                out[k, 1, c] = m.v[c]
                out[k, 1, 3 + c] = m.w[c]
                out[k, 1, 6 + c] = m.pv[c]
                out[k, 1, 9 + c] = m.pw[c]
            out[k, 0, 3] = b.inv_mass
            out[k, 0, 10] = b.split
            out[k, 0, 11] = b.friction

    roundtrip(src, out)
    assert out.view(np.uint32).tobytes() == bits.tobytes()


def test_candidate_pairs_match_brute_force(sim):
    # grid.pairs against an O(n^2) numpy reference: every pair whose bounding spheres come within the
    # larger of the contact margin and the two bodies' reach over the step, exactly once (in either body's list: the half neighbourhood), in a list of its class
    # (number of boxes); and every plane within reach of a body's bounding sphere (class = the body's shape),
    # in that body's list.
    sim.load(_small_pile("vla"))
    for _ in range(400):  # landed (a 1.6 m fall takes 0.57 s = 285 steps)
        sim.step()
    sim.grid.build(sim.model, sim.state, sim.dt)
    from app.sim.broadphase import kernel_candidate_pairs
    from vla import launch

    launch(kernel_candidate_pairs, sim.model, sim.state, sim.grid, sim.dt, vlas=[sim.grid.pairs], rollback=False)
    ref = _assert_pairs_match_brute_force(sim)
    assert len(ref) > sim.body_count and {c for c, _, _ in ref} == {0, 1, 2, 3}  # landed: all classes, > 1 pair a body


def _assert_pairs_match_brute_force(sim):
    """grid.pairs (just filled) against an O(n^2) numpy reference, in scene order; returns the reference."""
    g = sim.grid
    n = sim.body_count
    order = g.body_order.to_numpy()[:n]
    offsets, vals = g.pairs.to_csr()
    got = set()
    for c in range(g.pair_classes):
        for t in range(n):
            lst = c * g.pair_stride + t
            for j in vals[offsets[lst]:offsets[lst + 1]].tolist():
                # stored body indices -> scene order (the reference below works on scene-order arrays)
                i = int(sim.scene_of[order[t]])
                key = (c, i, j) if j < 0 else (c, min(i, int(sim.scene_of[j])), max(i, int(sim.scene_of[j])))
                assert key not in got, f"pair {key} listed twice"
                got.add(key)
    pos = sim.positions().astype(np.float64)
    shapes = sim.shapes()
    rad = shapes["radius"].astype(np.float64)
    shape = shapes["shape"]
    margin = float(sim.model.contact_margin[None])
    fixed = shapes["fixed"]
    # how far each body can move in the step (speculative contacts: app.sim.broadphase, Grid.body_reach)
    g = np.linalg.norm(sim.model.gravity[None].to_numpy().astype(np.float64))
    step = sim.dt * (np.linalg.norm(sim.velocities(), axis=1) + g * sim.dt
                     + np.linalg.norm(sim.angular_velocities(), axis=1) * rad)
    step[fixed] = 0.0
    ref = set()
    d = np.linalg.norm(pos[:, None, :] - pos[None, :, :], axis=2)
    slack = d - (rad[:, None] + rad[None, :] + np.maximum(margin, step[:, None] + step[None, :]))
    # a static body (fixed in the scene) meets a moving one when the moving body's sphere comes within the larger of
    # the margin and its reach of both the static body's sphere and its bounding box (app.sim.broadphase)
    static = sim.builder.bodies["static"][:n]
    lo, hi = sim.builder.bodies["box_lo"], sim.builder.bodies["box_hi"]
    for k in np.flatnonzero(static):
        gap = np.linalg.norm(np.maximum(np.maximum(lo[k] - pos, pos - hi[k]), 0.0), axis=1)
        slack[k, :] = slack[:, k] = np.maximum(slack[k], gap - (rad + np.maximum(margin, step)))
    for i, j in zip(*np.nonzero(np.triu(slack <= 0, 1))):
        if not (fixed[i] and fixed[j]):  # two fixed bodies never collide
            # (a capsule counts as two boxes; any pair with a hull is class 3)
            ref.add((3 if 3 in (shape[i], shape[j]) else min(int(shape[i] + shape[j]), 2), int(i), int(j)))
    k_planes = int(sim.model.plane_count[None])
    normals = sim.model.plane_normal.to_numpy()[:k_planes].astype(np.float64)
    offs = sim.model.plane_offset.to_numpy()[:k_planes].astype(np.float64)
    for i in range(n):
        for k in range(k_planes):
            if not fixed[i] and offs[k] - normals[k] @ pos[i] + rad[i] > -max(margin, step[i]):  # (fixed: none)
                ref.add((3 if shape[i] == 3 else min(int(shape[i]), 2), i, -1 - k))
    # float32 on the device vs float64 here: only pairs within 1e-5 m of the threshold may differ
    near = {(c, i, j) for c, i, j in got ^ ref
            if j >= 0 and abs(slack[i, j]) < 1e-5}
    # a pair of two bodies still since last step may be left out: it keeps last step's records (VLA contact lists,
    # sleeping on, warm start 1: app.sim.broadphase.kernel_candidate_pairs, app.sim.narrowphase._keeps_still_pairs)
    kept = set()
    if sim.grid.keeps_still_pairs and float(sim.model.sleep_speed[None]) > 0 and float(sim.model.warm_start[None]) == 1:
        slow = sim.to_scene_order(sim.state.body_slow_time.to_numpy()[:n])
        dynamic = sim.to_scene_order(sim.model.body_inv_mass.to_numpy()[:n]) > 0
        kinematic = sim.to_scene_order(sim.model.body_kinematic.to_numpy()[:n]) != 0
        still = np.where(dynamic, slow >= float(sim.model.sleep_time[None]) + 0.5 * sim.dt, ~kinematic)
        kept = {(c, i, j) for c, i, j in ref - got if still[i] and (j < 0 or still[j])}
    assert (got ^ ref) - kept == near
    return ref


def test_large_bodies_keep_cells_small_and_every_pair(sim):
    # Five large bodies (a fixed box, a fixed sphere, two dynamic boxes that touch each other, and a fixed sphere
    # just over the threshold, whose touching neighbours lie in the cells its own search visits: the median radius
    # is the small spheres', the cells are sized for the boxes) among 300 small spheres and boxes. The cells are
    # sized for the small bodies (app.sim.model.grid_radius), and the pairs with a large body, which the cell search
    # skips, come from the large-body pass: the pairs must still match the O(n^2) brute force, each once, with
    # large-small and large-large pairs among them.
    from app.sim.model import LARGE_RADIUS_FACTOR

    scene = scene_from_dict({
        "name": "large", "sim": {"dt": 0.002}, "materials": {"m": {}},
        "static": [{"type": "container", "size": [4, 3, 4], "material": "m"}],
        "bodies": [{"shape": "box", "half_extents": [0.8, 0.3, 0.8], "position": [-1.0, 0.3, -1.0], "material": "m",
                    "fixed": True},
                   {"shape": "sphere", "radius": 0.6, "position": [1.0, 0.6, 1.0], "material": "m", "fixed": True},
                   {"shape": "box", "half_extents": [0.5, 0.5, 0.5], "position": [1.0, 0.5, -1.1], "material": "m"},
                   {"shape": "box", "half_extents": [0.5, 0.5, 0.5], "position": [1.0, 1.55, -1.1], "material": "m"},
                   {"shape": "sphere", "radius": 0.15, "position": [-1.0, 0.15, 1.0], "material": "m", "fixed": True},
                   # small spheres touching it (centres 0.176 m away: 1 mm apart), above and on the diagonals
                   *[{"shape": "sphere", "radius": 0.025, "position": [-1.0 + 0.176 * d[0], 0.15 + 0.176 * d[1],
                                                                        1.0 + 0.176 * d[2]], "material": "m"}
                     for d in ([0, 1, 0], [0.6, 0.8, 0], [0, 0.8, -0.6], [-0.48, 0.6, 0.64])],
                   {"generate": "random", "shape": "sphere", "count": 200, "min": [-1.9, 0.7, -1.9],
                    "max": [1.9, 2.6, 1.9], "radius": 0.03, "material": "m"},
                   {"generate": "random", "shape": "box", "count": 100, "min": [-1.9, 0.7, -1.9],
                    "max": [1.9, 2.6, 1.9], "half_extents": [0.05, 0.04, 0.05], "material": "m"}]})
    sim.load(scene)
    radius = sim.shapes()["radius"]
    # the fixed ones (0, 1, 4) are static: the broadphase lists them in its static cells, never as large bodies
    assert sim.builder.large_body_count() == 2 and sim.builder.static_count == 3
    assert (radius[:5] > LARGE_RADIUS_FACTOR * np.median(radius)).all()
    # cells for the small bodies (2 x 1.02 x their largest radius + 2 margins), not for the 0.87 m box
    small_r = float(radius[5:].max())
    assert float(sim.model.grid_cell_size[None]) < 2.1 * small_r + 2 * float(sim.model.contact_margin[None]) + 1e-5
    from app.sim.broadphase import kernel_candidate_pairs
    from vla import launch

    for steps in (0, 250):   # as placed, then with the small bodies landed on the large ones and the floor
        for _ in range(steps):
            sim.step()
        sim.grid.build(sim.model, sim.state, sim.dt)
        launch(kernel_candidate_pairs, sim.model, sim.state, sim.grid, sim.dt, vlas=[sim.grid.pairs], rollback=False)
        ref = _assert_pairs_match_brute_force(sim)
        large_small = {(i, j) for _, i, j in ref if j >= 0 and (i < 5) != (j < 5)}
        assert (2, 3) in {(i, j) for _, i, j in ref}   # the two dynamic large boxes, stacked
        if steps == 0:
            assert {(4, j) for j in range(5, 9)} <= large_small
    assert {min(i, j) for i, j in large_small} == {0, 1, 2, 3, 4} and len(large_small) > 20
    # sim.large_body_factor: 0 turns the pass off (cells as wide as the largest body); the same pairs
    raw = dict(scene.raw)
    raw["sim"] = dict(raw["sim"], large_body_factor=0)
    sim.load(scene_from_dict(raw))
    assert sim.builder.large_body_count() == 0
    assert float(sim.model.grid_large_radius[None]) == pytest.approx(float(np.delete(radius, [0, 1, 4]).max()))
    sim.grid.build(sim.model, sim.state, sim.dt)
    launch(kernel_candidate_pairs, sim.model, sim.state, sim.grid, sim.dt, vlas=[sim.grid.pairs], rollback=False)
    assert {(i, j) for _, i, j in _assert_pairs_match_brute_force(sim)} >= {(4, j) for j in range(5, 9)}


def test_static_bodies_keep_cells_small_and_every_pair(sim):
    # A heightfield of 0.9 m triangles, a fixed wall and fixed posts under 0.05-0.08 m bodies, ten thrown at 70-90
    # m/s (they reach further than a cell in the step: the static pass's 27-cell search). The cells are sized for
    # the moving bodies, and the pairs match the O(n^2) brute force, each once, with pairs of slow and of fast
    # bodies with static ones among them. (test_candidate_pairs_with_bucket_wrap_around has static bodies in a
    # table smaller than their extent.)
    from app.sim.broadphase import kernel_candidate_pairs
    from vla import launch

    rng = np.random.default_rng(7)
    heights = (0.3 * np.sin(np.arange(9)[:, None] * 0.9) * np.cos(np.arange(9)[None, :] * 0.7)).round(3).tolist()
    bodies = [{"shape": "box", "half_extents": [0.02, 0.5, 2.0], "position": [2.2, 0.5, 0], "material": "m",
               "fixed": True}]
    bodies += [{"shape": "capsule", "radius": 0.06, "half_length": 0.3, "position": [x, 0.6, -3.0], "material": "m",
                "fixed": True} for x in (-2.0, 0.0, 2.0)]
    for k in range(150):
        shape = ("sphere", "box", "capsule")[k % 3]
        size = {"radius": 0.05} if shape == "sphere" else {"half_extents": [0.05, 0.04, 0.05]} if shape == "box" \
            else {"radius": 0.03, "half_length": 0.04}
        if k < 10:   # fast, 0.7 m apart on a row of their own (the grid finds no pair of moving bodies that far)
            v = rng.normal(size=3)
            pos, vel = [-3.2 + 0.7 * k, 0.35, 3.1], (v / np.linalg.norm(v) * rng.uniform(70, 90)).tolist()
        else:
            pos = [float(rng.uniform(-3.4, 3.4)), float(rng.uniform(0.1, 0.6)), float(rng.uniform(-3.4, 2.2))]
            vel = rng.normal(size=3).tolist()
        bodies.append({"shape": shape, **size, "position": pos, "velocity": vel, "material": "m"})
    scene = scene_from_dict({"name": "terrain", "sim": {"gravity": [0, -9.81, 0]}, "materials": {"m": {}},
                             "static": [{"type": "heightfield", "heights": heights, "size": [7.2, 7.2],
                                         "material": "m"}], "bodies": bodies})
    sim.load(scene)
    n_tri = 2 * 8 * 8
    assert sim.builder.static_count == 4 + n_tri
    # (the largest moving body: a box of half extents 0.05, 0.04, 0.05; a triangle's bounding radius is 0.6 m)
    assert float(sim.model.grid_cell_size[None]) < 2.1 * np.linalg.norm([0.05, 0.04, 0.05]) + \
        2 * float(sim.model.contact_margin[None])
    sim.grid.build(sim.model, sim.state, sim.dt)
    launch(kernel_candidate_pairs, sim.model, sim.state, sim.grid, sim.dt, vlas=[sim.grid.pairs], rollback=False)
    ref = _assert_pairs_match_brute_force(sim)
    static = np.arange(sim.body_count) < 4
    static[len(bodies):] = True
    fast = np.zeros(sim.body_count, bool)
    fast[4:14] = True
    with_static = [(i, j) for _, i, j in ref if j >= 0 and static[i] != static[j]]
    assert len(with_static) > 100
    assert any(fast[i] or fast[j] for i, j in with_static)   # the fast bodies' search
    assert any(static[i] and i < 4 or static[j] and j < 4 for i, j in with_static)   # the wall and posts


def test_a_landed_piles_contact_storage_gives_back_what_it_no_longer_needs_without_changing_the_motion(sim):
    # A contact list keeps the capacity it once needed until the lazy release (advance: every release_interval steps,
    # once the VLAs grow no more than now and then; ContactSet.release_unused). 512 bodies of pile_1m (the capacity
    # is their count: no idle lists) land in 800 steps, first never released, then in the same Simulation with a
    # release every 200 steps: the same motion to the bit, and the storage's bytes (elements, metadata, overflow
    # area, headroom) at most 1.6x the live records' (issue: 1.5x on pile_1m; here more lists sit at the pile's
    # surface with fewer records than their 5 inline slots), where never released it ends over 2x.
    from app.scene import load_scene
    from app.sim import Simulation

    scene = load_scene(SCENES / "pile_1m.yaml", ("bodies.0.count=512", "static.0.size=[1.3, 14, 1.3]",
                                                 "bodies.0.min=[-0.5, 0.1, -0.5]", "bodies.0.max=[0.5, 3, 0.5]"))
    s = Simulation(scene, verbose=False)
    assert s.capacity == 512

    def run(interval):
        s.load(scene)
        s.release_interval = interval
        s.advance(800)
        st = s.contacts.lists.stats()
        return s.positions(), s.orientations(), s.velocities(), st["reserved_bytes"] / st["live_bytes"]

    *kept, ratio_kept = run(0)
    *released, ratio_released = run(200)
    for a, b in zip(kept, released):
        assert np.array_equal(a, b)
    assert int(s.diagnostics.contact_total[None]) > 1000, "the pile must have landed for this to mean anything"
    assert ratio_kept > 2.0
    assert ratio_released <= 1.6


def test_candidate_pairs_with_bucket_wrap_around(sim):  # (the fixture: ti.init; this test builds its own)
    # A grid of P = 4 buckets per axis (capacity 64) under clusters spread over ~20 cells per axis: far
    # cells share buckets (the wrap-around). Pairs must still match the brute force, each exactly once. The
    # pairs VLA has an 8-element overflow area, so the first narrowphase loses pending pairs: vla.launch
    # grows the pool and re-runs both kernels, and the packed-pair buffer must follow the larger pool.
    from app.sim import Simulation
    from vla import VLA

    bodies = []
    for c, centre in enumerate([[0, 1, 0], [2.6, 1, 0.4], [5.2, 1.4, 5.0], [1.2, 2.9, 4.1], [4.4, 0.7, 2.2],
                                [5.9, 2.2, 0.1]]):
        for k in range(8):
            off = [0.19 * (k & 1), 0.19 * ((k >> 1) & 1), 0.19 * (k >> 2)]
            pos = [centre[a] + off[a] for a in range(3)]
            if (c + k) % 2:
                bodies.append({"shape": "sphere", "radius": 0.1, "position": pos, "material": "m"})
            else:
                bodies.append({"shape": "box", "half_extents": [0.08, 0.08, 0.08], "position": pos, "material": "m",
                               "fixed": k == 0})
    scene = scene_from_dict({"name": "wrap", "sim": {"gravity": [0, 0, 0]}, "materials": {"m": {}},
                             "static": [{"type": "plane", "normal": [0, 1, 0], "offset": 0.75, "material": "m"}],
                             "bodies": bodies})
    sim = Simulation(scene, capacity=64, verbose=False)  # a small grid of its own, not the module's
    assert sim.grid.axis_mask == 3 and sim.grid.table_size == 64
    cell = float(sim.model.grid_cell_size[None])
    assert np.ptp(sim.positions(), axis=0).max() > 8 * cell  # the clusters span at least two periods
    sim.grid.pairs = VLA(sim.grid.pair_classes * sim.grid.pair_stride, ti.i32, inline_capacity=2, chunk_size=4,
                         overflow_capacity=8, name="candidate_pairs_tiny")
    first = _contact_set(sim)
    assert sim.grid.pairs.stats()["overflow_events"] > 0  # the first attempt lost pairs and was re-run
    size_after = sim.grid.compact_pairs.shape[0]
    assert size_after >= sim.grid.compact_pairs_size(sim.body_count)
    ref = _assert_pairs_match_brute_force(sim)
    assert {c for c, _, _ in ref} == {0, 1, 2}
    sim.contacts.flip()
    assert _contact_set(sim) == first and len(first) > len(bodies)  # a roomy second run: the same contacts
