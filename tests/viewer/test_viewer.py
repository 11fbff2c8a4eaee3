"""Viewer: offscreen rendering on lavapipe (mesa-vulkan-drivers), projection, recorder, replay, fallbacks.

Images are small (320x240) because lavapipe renders on the CPU. Colour checks compare dominant channels
rather than exact values: lighting changes the shade, not which channel wins.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from app.viewer import meshes as rm
from app.viewer.display import vulkan_problem

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(ROOT, "tests", "viewer", "viewer_tiny.yaml")
W, H = 320, 240

# A body's projected centre must land within this many pixels of its blob's centroid: perspective shifts
# a sphere's silhouette centroid off the projected centre by well under a pixel at these distances, the
# rest is pixel quantisation of the silhouette edge.
CENTROID_TOL_PX = 2.0

needs_vulkan = pytest.mark.skipif(vulkan_problem() is not None, reason=f"{vulkan_problem()}")


@pytest.fixture(scope="module")
def ti_cpu():
    import taichi as ti

    from app.runtime import taichi_options

    ti.init(arch=ti.cpu, log_level=ti.WARN, **taichi_options("cpu"))  # as the app runs
    yield ti


# ---------------------------------------------------------------------------------------------------- pure numpy
def test_box_mesh_is_closed_and_unit():
    v, n, i = rm.unit_box()
    assert v.shape == (24, 3) and len(i) == 36 and np.abs(v).max() == 1.0
    tri = v[i.reshape(-1, 3)]
    gn = np.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0])
    assert (np.einsum("ij,ij->i", gn, n[i.reshape(-1, 3)[:, 0]]) > 0).all()


def test_projection_matches_taichi_camera_matrices(ti_cpu):
    import taichi as ti

    from app.viewer.render import project

    spec = {"position": [3.0, 2.0, 4.0], "lookat": [0.0, 0.5, 0.0], "up": [0.0, 1.0, 0.0], "fov": 40.0}
    cam = ti.ui.Camera()
    cam.position(*spec["position"])
    cam.lookat(*spec["lookat"])
    cam.up(*spec["up"])
    cam.fov(spec["fov"])
    view = np.asarray(cam.get_view_matrix()).T        # taichi returns them transposed (column-major)
    proj = np.asarray(cam.get_projection_matrix(W / H)).T
    pts = np.array([[0.0, 0.5, 0.0], [1.0, 0.0, -0.5], [-0.7, 1.2, 0.3]])
    clip = (proj @ view @ np.c_[pts, np.ones(3)].T).T
    ndc = clip[:, :2] / clip[:, 3:4]
    expect = np.stack([(ndc[:, 0] + 1) / 2 * W, (1 - ndc[:, 1]) / 2 * H], 1)
    np.testing.assert_allclose(project(pts, spec, W, H), expect, atol=1e-3)
    np.testing.assert_allclose(project(spec["lookat"], spec, W, H)[0], [W / 2, H / 2], atol=1e-6)


# ---------------------------------------------------------------------------------------------------- offscreen
def _pose_view(positions, materials, shapes=None, statics=(), camera=None):
    from app.viewer.render import PoseSource
    from app.viewer.offscreen import OffscreenView

    n = len(positions)
    shapes = np.zeros(n, np.int32) if shapes is None else np.asarray(shapes, np.int32)
    src = PoseSource({"shape": shapes, "half_extents": np.full((n, 3), 0.25, np.float32),
                      "material": np.asarray(materials, np.int32)}, statics)
    quat = np.tile([1.0, 0.0, 0.0, 0.0], (n, 1))
    src.set_poses(np.asarray(positions, np.float32), quat)
    return src, OffscreenView(src, camera, (W, H))


@needs_vulkan
def test_culling_changes_no_pixel(ti_cpu, monkeypatch):
    """Occlusion culling (kernels.kernel_cull) draws a dense block of spheres, boxes and capsules, turned at
    random and seen from two cameras (one close, bodies crossing the image's edges), without a good part of them
    and with every pixel as drawing them all."""
    from app.viewer import render
    from app.viewer.offscreen import OffscreenView
    from app.viewer.render import PoseSource

    monkeypatch.setattr(render, "CULL_MIN_BODIES", 0)   # (1,568 bodies: culled only from 10,000 by default)
    monkeypatch.setattr(render.rk, "LOD_POINT_PIXELS", 0.0)   # (every box as a box: the pixels must match)

    rng = np.random.default_rng(3)
    g = np.stack(np.meshgrid(*[np.arange(k) for k in (14, 8, 14)], indexing="ij"), -1).reshape(-1, 3)
    n = len(g)
    shapes = rng.integers(0, 3, n).astype(np.int32)
    half = np.stack([rng.uniform(0.06, 0.1, n)] * 3, 1).astype(np.float32)
    half[shapes == 1] = rng.uniform(0.05, 0.1, (int((shapes == 1).sum()), 3))
    half[shapes == 2, 1] = half[shapes == 2, 0] + rng.uniform(0.02, 0.1, int((shapes == 2).sum()))
    src = PoseSource({"shape": shapes, "half_extents": half, "material": rng.integers(0, 3, n).astype(np.int32)})
    quat = rng.normal(size=(n, 4))
    src.set_poses(g * 0.2 + rng.uniform(-0.02, 0.02, (n, 3)), quat / np.linalg.norm(quat, axis=1)[:, None])
    for camera in ({"position": [5.0, 4.0, 6.0], "lookat": [1.3, 0.7, 1.3], "fov": 45},
                   {"position": [1.6, 1.2, 3.4], "lookat": [1.3, 0.7, 1.0], "fov": 60}):
        view = OffscreenView(src, camera, (W, H))
        culled = view.render()
        hidden = view.renderer.culled
        view.renderer.update()   # (no view: every body drawn)
        view.declare()
        every = view.capture()
        view.close()
        assert hidden > n // 5, f"only {hidden} of {n} bodies culled"
        assert np.array_equal(culled, every), f"{(culled != every).any(axis=2).sum()} pixels differ"


@needs_vulkan
def test_far_boxes_are_points(ti_cpu, monkeypatch):
    """Level of detail: a box whose bounding sphere's image is under LOD_POINT_PIXELS in radius is one particle of
    its volume's sphere, in its colour; the same box near the camera stays a box."""
    from app.viewer import render
    from app.viewer.offscreen import OffscreenView
    from app.viewer.render import PoseSource, view_of

    monkeypatch.setattr(render, "CULL_MIN_BODIES", 0)
    half = np.array([[0.1, 0.05, 0.2]] * 2, np.float32)
    src = PoseSource({"shape": np.array([1, 1], np.int32), "half_extents": half, "material": np.array([0, 1], np.int32)})
    src.set_poses(np.array([[0.0, 0.0, 0.0], [8.0, 0.0, -55.0]]), np.tile([1.0, 0, 0, 0], (2, 1)))
    view = OffscreenView(src, {"position": [0.0, 0.0, 3.0], "lookat": [0.0, 0.0, 0.0], "fov": 45}, (W, H))
    r = view.renderer
    r.update(view_of(view.camera, 45, (W, H)))
    view.close()
    assert r.drawn_instances == 1 and r.drawn_particles == 1   # the near box, the far one
    np.testing.assert_allclose(r.host_transforms()[0, :3, 3], [0, 0, 0], atol=1e-6)
    centre, radius, colour = r.host_particles()
    np.testing.assert_allclose(centre[0], [8, 0, -55], atol=1e-4)
    volume_radius = (0.1 * 0.05 * 0.2 * 6 / np.pi) ** (1 / 3)
    np.testing.assert_allclose(radius[0], volume_radius * r.particle_scale, rtol=1e-5)
    np.testing.assert_allclose(colour[0], rm.bucket_colors("material", None)[1], atol=1e-6)
    # GGUI draws a particle the image's aspect times its radius: a window resized to a square draws it at 1x
    r.update(view_of(view.camera, 45, (W, W)))
    np.testing.assert_allclose(r.host_particles()[1][0], volume_radius, rtol=1e-5)


def _foreground(img):
    """Pixels that differ from the background colour (any shade of any body)."""
    bg = np.array([0.11, 0.12, 0.15]) * 255
    return np.abs(img.astype(np.float32) - bg).max(axis=2) > 25


def _blob_centroid(img, centre, radius=40):
    yy, xx = np.nonzero(_foreground(img))
    near = np.hypot(xx + 0.5 - centre[0], yy + 0.5 - centre[1]) < radius
    return near.sum(), np.array([xx[near].mean() + 0.5, yy[near].mean() + 0.5]) if near.any() else None


def _mask(img, channel):
    """Pixels whose `channel` (0 R, 1 G, 2 B) clearly dominates the other two."""
    f = img.astype(np.float32)
    others = [c for c in range(3) if c != channel]
    return (f[..., channel] > f[..., others[0]] + 25) & (f[..., channel] > f[..., others[1]] + 25)


@needs_vulkan
def test_bodies_appear_where_projected(ti_cpu):
    from app.viewer.render import project

    camera = {"position": [0.0, 1.5, 5.0], "lookat": [0.0, 0.0, 0.0], "fov": 45.0}
    # material 0 is orange (red dominant), material 1 steel blue (blue dominant), 3 green
    pos = np.array([[-1.2, 0.3, 0.0], [1.0, -0.4, 0.5], [0.2, 0.9, -1.0]], np.float32)
    src, view = _pose_view(pos, [0, 1, 3], camera=camera)
    try:
        img = view.render()
        assert img.shape == (H, W, 3)
        assert img.std() > 10, "blank image"
        spec = view.camera_spec
        px = project(pos, spec, W, H)
        for k, channel in enumerate((0, 2, 1)):
            # the blob around this body only (the three are far apart on screen) is centred on its projection
            count, centroid = _blob_centroid(img, px[k])
            assert count > 30, f"body {k} not drawn near its projection {px[k]}"
            assert np.linalg.norm(centroid - px[k]) < CENTROID_TOL_PX, (k, centroid, px[k])
            # and has the body's material colour at its centre
            cx, cy = int(px[k, 0]), int(px[k, 1])
            assert _mask(img[cy - 2:cy + 3, cx - 2:cx + 3], channel).all(), (k, img[cy, cx])
        # background far from the bodies
        corner = img[2:10, 2:10].astype(np.float32) / 255
        np.testing.assert_allclose(corner.mean(axis=(0, 1)), [0.11, 0.12, 0.15], atol=0.02)

        # move a body: its blob follows, and the update is on the device (no new renderer)
        pos2 = pos.copy()
        pos2[0] = [-0.3, -0.8, 1.0]
        src.set_poses(pos2, np.tile([1.0, 0, 0, 0], (3, 1)))
        img2 = view.render()
        p2 = project(pos2[0], spec, W, H)[0]
        count, centroid = _blob_centroid(img2, p2, radius=60)
        assert count > 30 and np.linalg.norm(centroid - p2) < CENTROID_TOL_PX, (centroid, p2)
        assert _foreground(img2)[int(px[0, 1]), int(px[0, 0])] == 0, "the body is still drawn where it was"
    finally:
        view.close()


@needs_vulkan
def test_colour_buckets_and_statics(ti_cpu):
    """Counting sort: per (shape, material) bucket counts; boxes and a container drawn."""
    from app.viewer.render import PoseSource, Renderer

    shapes = np.array([0, 1, 1, 0, 1], np.int32)
    mats = np.array([2, 0, 2, 2, 17], np.int32)
    src = PoseSource({"shape": shapes, "half_extents": np.full((5, 3), 0.1, np.float32), "material": mats},
                     [{"type": "container", "size": [2, 1, 2], "center": [0, 0.5, 0], "material": 0}])
    src.set_poses(np.random.default_rng(0).uniform(-0.5, 0.5, (5, 3)) + [0, 0.5, 0], np.tile([1.0, 0, 0, 0], (5, 1)))
    r = Renderer(src, aspect=16 / 9)
    r.update()
    counts = r._host_counts
    B = rm.COLOR_BUCKETS
    assert counts[0 * B + 2] == 2 and counts[1 * B + 0] == 1 and counts[1 * B + 2] == 1 and counts[1 * B + 1] == 1
    assert counts.sum() == 5
    # every box's transform is somewhere in the sorted array: translations are a permutation of the boxes'
    # positions; the spheres are particles at theirs
    t = r.host_transforms()
    got = sorted(map(tuple, np.round(t[:, :3, 3], 5)))
    assert got == sorted(map(tuple, np.round(src.host_positions()[shapes == 1], 5)))
    np.testing.assert_allclose(np.abs(np.linalg.det(t[:, :3, :3])), 0.1 ** 3, rtol=1e-4)
    centre, radius, _ = r.host_particles()
    assert sorted(map(tuple, np.round(centre, 5))) == sorted(map(tuple, np.round(src.host_positions()[shapes == 0], 5)))
    # container floor + ground around it, in one mesh: 2 checker quads of (cells + 1)^2 vertices each
    assert r.static_lines is not None
    k = r.static_records.shape[0]
    assert k > 8 and k % 3 == 0
    # three boxes are few: drawn as 12 triangles each in the one mesh, after the static geometry, at their places
    mesh = r.host_mesh()
    assert r.boxes_meshed and mesh.shape[0] == k + 3 * 36
    np.testing.assert_array_equal(mesh[:k], r.static_records)
    corners = mesh[k:, :3].reshape(3, 36, 3)
    got = sorted(map(tuple, np.round(corners.mean(axis=1), 5)))
    assert got == sorted(map(tuple, np.round(src.host_positions()[shapes == 1], 5)))
    np.testing.assert_allclose(np.ptp(corners, axis=1), 0.2, atol=1e-5)


@needs_vulkan
def test_capsules_are_two_end_particles_and_a_cylinder(ti_cpu):
    """A recording of capsules only (the source's capacity = its bodies): each capsule's two end particles at
    centre -+ half_length along its turned y axis, with its radius divided by the aspect (GGUI draws a particle the
    aspect times its radius), and its cylinder's transform scaled by (r, half_length, r); a sphere one particle."""
    from app.viewer.render import PoseSource, Renderer

    r_cap, hl = 0.1, 0.3
    half = np.array([[r_cap, hl + r_cap, r_cap]] * 3 + [[0.2, 0.2, 0.2]], np.float32)
    src = PoseSource({"shape": np.array([2, 2, 2, 0], np.int32), "half_extents": half,
                      "material": np.zeros(4, np.int32)})
    c = np.sqrt(0.5)
    quat = np.array([[1, 0, 0, 0], [c, 0, 0, -c], [c, c, 0, 0], [1, 0, 0, 0]], np.float64)   # y, x, z
    pos = np.array([[0, 1, 0], [2, 1, 0], [4, 1, 0], [6, 1, 0]], np.float64)
    src.set_poses(pos, quat)
    aspect = 16 / 9
    r = Renderer(src, aspect=aspect)
    r.update()
    n = int(r.sphere_count[None])
    assert n == 7
    centre, radius, _ = r.host_particles()
    assert centre.shape[0] == n
    want = [tuple(pos[k] + sgn * hl * ax) for k, ax in enumerate(np.eye(3)[[1, 0, 2]]) for sgn in (-1, 1)]
    want.append(tuple(pos[3]))
    assert sorted(map(tuple, np.round(centre.astype(np.float64), 5))) == sorted(map(tuple, np.round(np.array(want), 5)))
    np.testing.assert_allclose(sorted(radius), sorted([r_cap / aspect] * 6 + [0.2 / aspect]), rtol=1e-6)
    t = r.host_transforms()   # the capsules' cylinders (the sphere has none)
    assert t.shape[0] == 3
    np.testing.assert_allclose(sorted(np.linalg.norm(t[:, :3, :3], axis=1).ravel()),
                               sorted([r_cap, hl, r_cap] * 3), rtol=1e-5)


@pytest.fixture(scope="module")
def tiny_sim(ti_cpu):
    """One simulation for the module (kernels compile once). Capacity 32, the default for the 29-body scene,
    so the no-display run and the UI test reuse the same compiled kernels from Taichi's offline cache; it
    leaves room for 3 dropped bodies."""
    from app.scene import load_scene
    from app.sim import Simulation

    return Simulation(load_scene(TINY), capacity=32, verbose=False)


@needs_vulkan
def test_drop_bodies_live(tiny_sim):
    """The panel's drop button: bodies join the running simulation and the renderer draws all of them."""
    from app.viewer.render import Renderer, SimSource
    from app.viewer.interactive import InteractiveViewer

    sim = tiny_sim
    sim.reset()
    r = Renderer(SimSource(sim), aspect=16 / 9)
    r.update()
    assert r._host_counts.sum() == 29
    top = sim.positions()[:, 1].max()
    InteractiveViewer(sim).drop_bodies(3)
    assert sim.body_count == 32 and sim.capacity == 32
    new = sim.positions()[29:]
    assert (new[:, 1] > top).all(), "dropped bodies must start above the scene"
    d = np.linalg.norm(new[:, None] - new[None], axis=2) + np.eye(3) * 9
    assert d.min() > 2 * 0.1 * np.sqrt(3), "dropped bodies overlap"
    sim.step_frame()
    r.update()
    assert r._host_counts.sum() == 32
    # every body drawn at its height: boxes and capsules as instances, spheres as particles (and capsule ends)
    shape, y = sim.shapes()["shape"], sim.positions()[:, 1]
    instanced = (shape == 1) | (shape == 2)
    np.testing.assert_allclose(np.sort(r.host_transforms()[:, 1, 3]), np.sort(y[instanced]), atol=1e-6)
    particle_y = r.host_particles()[0][:, 1]
    assert particle_y.shape[0] == (shape == 0).sum() + 2 * (shape == 2).sum()
    assert all(np.isclose(particle_y, h, atol=1e-6).any() for h in y[shape == 0])
    sim.reset()
    r.update()
    assert sim.body_count == 29 and r._host_counts.sum() == 29


@needs_vulkan
def test_contact_glyphs_and_contact_colours(tiny_sim):
    """After the first bodies land: one glyph per contact point (a pair counted once, as contact_total
    counts), on the floor for floor contacts; contact-count buckets match the simulation's per-body counts."""
    from app.viewer.render import Renderer, SimSource

    sim = tiny_sim
    sim.reset()
    for _ in range(24):   # the big sphere and box land after about 0.3 s (19 frames of 16 ms)
        sim.step_frame()
    total = int(sim.diagnostics.contact_total[None])
    assert total > 0
    r = Renderer(SimSource(sim), aspect=16 / 9, color_mode="contacts", show_contacts=True)
    r.update()
    assert r.contact_glyphs == total
    pts = r.glyph_point.to_numpy()[:total]
    assert (pts[:, 1] > -0.01).all() and (np.abs(pts[:, [0, 2]]) < 1.01).all(), "contacts outside the container"
    counts = np.minimum(sim.contact_counts(), 6)
    shape = sim.shapes()["shape"]
    B = rm.COLOR_BUCKETS
    expect = np.zeros(rm.SHAPE_KINDS * B, int)
    np.add.at(expect, shape * B + counts, 1)
    np.testing.assert_array_equal(r._host_counts, expect)


@needs_vulkan
def test_headless_recorder_writes_frames_and_video(tiny_sim, tmp_path):
    import imageio.v2 as imageio

    from app.viewer.offscreen import frame_callback

    sim = tiny_sim
    sim.reset()
    cb = frame_callback(str(tmp_path / "frames"), 2, str(tmp_path / "run.mp4"), size=(W, H))
    for f in range(5):
        sim.step_frame()
        cb(sim, f)
    cb.close()
    pngs = sorted(os.listdir(tmp_path / "frames"))
    assert pngs == ["frame_00000.png", "frame_00001.png", "frame_00002.png"]
    a = imageio.imread(tmp_path / "frames" / pngs[0])
    b = imageio.imread(tmp_path / "frames" / pngs[-1])
    assert a.shape == (H, W, 3) and a.std() > 10
    assert np.abs(a.astype(int) - b).sum() > 0, "bodies fell but the frames are identical"
    reader = imageio.get_reader(str(tmp_path / "run.mp4"))
    assert sum(1 for _ in reader) == 3
    reader.close()


@needs_vulkan
def test_replay_renders_a_recorded_run(ti_cpu, tmp_path):
    import imageio.v2 as imageio

    from app.scene import load_scene
    from app.viewer.replay import replay_main

    scene = load_scene(TINY)
    b = scene.bodies
    n = scene.body_count
    frames = 3
    pos = np.stack([b["position"] - [0, 0.1 * f, 0] for f in range(frames)]).astype(np.float32)
    quat = np.tile(b["orientation"], (frames, 1, 1)).astype(np.float32)
    np.savez(tmp_path / "trajectory.npz", time=np.arange(frames) * 0.016, position=pos, orientation=quat)
    np.savez(tmp_path / "state.npz", position=pos[-1], orientation=quat[-1], shape=b["shape"],
             half_extents=b["half_extents"], material=b["material"], radius=b["radius"])
    (tmp_path / "metrics.json").write_text(json.dumps({"scene_path": TINY, "overrides": []}))
    assert replay_main([str(tmp_path), "--render", str(tmp_path / "r"), "--size", f"{W}x{H}"]) == 0
    imgs = [imageio.imread(tmp_path / "r" / f"frame_{k:05d}.png") for k in range(frames)]
    assert all(im.shape == (H, W, 3) for im in imgs)
    assert np.abs(imgs[0].astype(int) - imgs[2]).sum() > 0
    assert n == pos.shape[1]


# ---------------------------------------------------------------------------------------------------- fallbacks
def _run(args, env_update, timeout=240):
    env = dict(os.environ)
    for k, v in env_update.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return subprocess.run([sys.executable, os.path.join(ROOT, "run.py"), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_no_vulkan_driver_names_the_package(tmp_path):
    (tmp_path / "state.npz").write_bytes(b"")
    np.savez(tmp_path / "state.npz", position=np.zeros((1, 3)), orientation=[[1, 0, 0, 0]], shape=[0],
             half_extents=[[0.1, 0.1, 0.1]], material=[0])
    np.savez(tmp_path / "trajectory.npz", time=[0.0], position=np.zeros((1, 1, 3)), orientation=[[[1, 0, 0, 0]]])
    r = _run(["replay", str(tmp_path), "--video", str(tmp_path / "x.mp4")],
             {"VK_ICD_FILENAMES": "/nonexistent/icd.json", "VK_DRIVER_FILES": None})
    assert r.returncode == 2, r.stderr
    assert "mesa-vulkan-drivers" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@needs_vulkan
def test_no_display_runs_headless_and_writes_preview(tmp_path):
    out = tmp_path / "out"
    r = _run([TINY, "--frames", "3", "--arch", "cpu", "--out", str(out)], {"DISPLAY": None, "WAYLAND_DISPLAY": None})
    assert r.returncode == 0, r.stderr[-2000:]
    assert "running headless" in r.stderr and "Traceback" not in r.stderr
    m = json.loads((out / "metrics.json").read_text())
    assert m["frames"] == 3 and m["bodies"] == 29
    import imageio.v2 as imageio

    img = imageio.imread(out / "preview.png")
    assert img.shape == (576, 1024, 3) and img.std() > 10


@needs_vulkan
def test_cli_headless_render_and_video(tmp_path):
    """`run.py SCENE --headless --render DIR --render-every K --video F` through the real command line."""
    r = _run([TINY, "--headless", "--frames", "4", "--arch", "cpu", "--out", str(tmp_path / "o"),
              "--render", str(tmp_path / "f"), "--render-every", "2", "--video", str(tmp_path / "v.mp4")], {})
    assert r.returncode == 0, r.stderr[-2000:]
    assert sorted(os.listdir(tmp_path / "f")) == ["frame_00000.png", "frame_00001.png"]
    assert (tmp_path / "v.mp4").stat().st_size > 1000
    # every file written aside and renamed: nothing else is left
    assert sorted(os.listdir(tmp_path)) == ["f", "o", "v.mp4"]
    assert sorted(os.listdir(tmp_path / "o")) == ["metrics.json", "state.npz"]
    bad = _run([TINY, "--headless", "--frames", "1", "--render", str(tmp_path / "g"), "--render-every", "0"], {})
    assert bad.returncode == 2 and "--render-every" in bad.stderr and "Traceback" not in bad.stderr


def test_vulkan_loader_lookup_ends_and_finds_a_loader_on_the_library_path(tmp_path, monkeypatch):
    """The loader is looked up file by file (no recursive search, which looped through symlinked build trees and
    hung `python run.py`): a library path holding only a symlink loop gives the one-line reason at once, and one
    holding libvulkan.so.1 passes that check."""
    import ctypes.util
    import time

    from app.viewer import display

    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    monkeypatch.setattr(display, "LOADER_DIRS", ())
    (tmp_path / "loop").symlink_to("..")
    monkeypatch.setenv("LD_LIBRARY_PATH", str(tmp_path / "loop"))
    t0 = time.monotonic()
    problem = display.vulkan_problem()
    assert time.monotonic() - t0 < 1.0
    assert problem.startswith("no Vulkan loader") and "mesa-vulkan-drivers" in problem
    (tmp_path / "libvulkan.so.1").write_bytes(b"")
    monkeypatch.setenv("LD_LIBRARY_PATH", f"{tmp_path / 'loop'}:{tmp_path}")
    assert not (display.vulkan_problem() or "").startswith("no Vulkan loader")


def test_picking_hits_a_capsule_where_a_dense_march_along_the_ray_enters_it():
    # A capsule (shape 2) in random poses: the distance along the ray to its surface against a march in 1e-4 m
    # steps testing the point's distance to the segment; rays that miss it are misses.
    from app.scene.schema import quat_matrices
    from app.viewer import picking

    rng = np.random.default_rng(4)
    hits = 0
    for _ in range(60):
        q = rng.normal(size=4)
        q /= np.linalg.norm(q)
        r, hl = rng.uniform(0.1, 0.4), rng.uniform(0.1, 0.6)
        c = rng.uniform(-0.3, 0.3, 3) + [3.0, 0.0, 0.0]
        o = np.zeros(3)
        d = np.array([1.0, *rng.uniform(-0.15, 0.15, 2)])
        d /= np.linalg.norm(d)
        b, s = picking.pick(o, d, [c], [q], [2], [[r, hl + r, r]])
        axis = quat_matrices(q[None])[0][:, 1] * hl
        t = np.arange(0.0, 6.0, 1e-4)
        x = o + t[:, None] * d
        u = np.clip(((x - (c - axis)) @ (2 * axis)) / (4 * axis @ axis), 0.0, 1.0)
        inside = np.linalg.norm(x - (c - axis + u[:, None] * 2 * axis), axis=1) <= r
        if inside.any():
            hits += 1
            assert b == 0 and abs(s - t[np.argmax(inside)]) < 2e-4, (s, t[np.argmax(inside)])
        else:
            assert b is None
    assert hits > 20


def test_picking_hits_the_first_body_on_the_ray():
    from app.viewer import picking

    o, d = np.zeros(3), np.array([1.0, 0.0, 0.0])
    c45, s45 = np.cos(np.pi / 8), np.sin(np.pi / 8)   # a quarter turn's half angle: 45 degrees about y
    pos = [[5, 0, 0], [9, 0, 0], [5, 3, 0], [3, 0.5, 0]]
    quat = [[1, 0, 0, 0], [c45, 0, s45, 0], [1, 0, 0, 0], [1, 0, 0, 0]]
    shape = [0, 1, 0, 0]
    half = [[1, 1, 1], [1, 1, 1], [1, 1, 1], [0.4, 0.4, 0.4]]
    b, s = picking.pick(o, d, pos, quat, shape, half)
    assert b == 0 and abs(s - 4.0) < 1e-9                   # the sphere at 5 (the small one at 3 is missed)
    b, s = picking.pick(o, d, pos[1:], quat[1:], shape[1:], half[1:])
    assert b == 0 and abs(s - (9 - np.sqrt(2))) < 1e-9     # the turned box: its edge faces the ray
    assert picking.pick(o, -d, pos, quat, shape, half) == (None, np.inf)
    # the cursor ray through the middle of the window is the camera's axis, the corner's is fov/2 off it
    o, d = picking.cursor_ray([0, 0, 5], [0, 0, 0], [0, 1, 0], 60, 1.0, 0.5, 0.5)
    np.testing.assert_allclose(d, [0, 0, -1], atol=1e-12)
    o, d = picking.cursor_ray([0, 0, 5], [0, 0, 0], [0, 1, 0], 60, 1.0, 0.5, 1.0)
    assert abs(np.degrees(np.arctan2(d[1], -d[2])) - 30) < 1e-9
    # the drag spring: at the target and still, it holds the weight
    f = picking.drag_force(2.0, np.zeros(3), np.zeros(3), np.zeros(3), [0, -9.81, 0])
    np.testing.assert_allclose(f, [0, 19.62, 0])


def test_speed_keys_follow_the_speed_edges(ti_cpu):
    import taichi as ti

    from app.viewer import kernels as rk

    speeds = np.array([0.0, 0.049, 0.05, 0.3, 1.0, 4.9, 12.0, 100.0], np.float32)
    n = len(speeds)
    vel = ti.Vector.field(3, ti.f32, n)
    v = np.zeros((n, 3), np.float32)
    v[:, 0] = speeds * 0.6
    v[:, 2] = speeds * 0.8
    vel.from_numpy(v)
    shape = ti.field(ti.i32, n)
    shape.from_numpy(np.array([0, 1] * (n // 2), np.int32))
    edges = ti.field(ti.f32, len(rm.SPEED_EDGES))
    edges.from_numpy(rm.SPEED_EDGES)
    key = ti.field(ti.i32, n)
    rk.kernel_keys_speed(shape, vel, n, rm.COLOR_BUCKETS, edges, key)
    speed = np.linalg.norm(v, axis=1)
    expect = shape.to_numpy() * rm.COLOR_BUCKETS + np.searchsorted(rm.SPEED_EDGES, speed, side="right")
    np.testing.assert_array_equal(key.to_numpy(), expect)
    assert len(rm.SPEED_RAMP) == len(rm.SPEED_EDGES) + 1 <= rm.COLOR_BUCKETS


def test_hulls_are_drawn_live_and_in_replay(ti_cpu, tmp_path):
    """Convex bodies and static triangles: the live renderer writes every hull body's triangles (3 vertices each,
    its faces fanned); a recorded run's state.npz names each body's hull, the replay takes the hulls from the
    reloaded scene and writes the same triangles; a run whose scene no longer matches draws bounding boxes."""
    from app.scene import scene_from_dict
    from app.sim import Simulation
    from app.viewer.render import PoseSource, Renderer, SimSource
    from app.viewer.replay import load_out_dir

    cube = [[x, y, z] for x in (-0.1, 0.1) for y in (-0.1, 0.1) for z in (-0.1, 0.1)]
    tet = [[0, 0, 0], [0.2, 0, 0], [0, 0.2, 0], [0, 0, 0.2]]
    raw = {"name": "hulls", "materials": {"m": {}},
           "static": [{"type": "heightfield", "heights": [[0, 0, 0], [0, 0.1, 0]], "size": [2, 2], "material": "m"}],
           "bodies": [{"shape": "convex", "vertices": cube, "position": [0, 1, 0], "material": "m"},
                      {"shape": "convex", "vertices": tet, "position": [0.5, 1, 0], "material": "m"},
                      {"shape": "sphere", "radius": 0.1, "position": [-0.5, 1, 0], "material": "m"}]}
    scene = scene_from_dict(raw)
    # the cube's 6 faces fan into 12 triangles, the tetrahedron's 4 into 4, the field's 4 triangles (2 cells) 2 each
    # (both faces): 3 vertices a triangle
    expected = 3 * (12 + 4 + 4 * 2)
    sim = Simulation(scene, verbose=False)
    live = Renderer(SimSource(sim), aspect=16 / 9)
    live.update()
    assert live.hull_vertices == expected
    from app.headless import run_headless

    out = tmp_path / "out"
    import yaml

    (tmp_path / "hulls.yaml").write_text(yaml.safe_dump(raw))
    run_headless(str(tmp_path / "hulls.yaml"), 2, out, arch="cpu", progress=False)
    shapes, (pos, quat), _, scene2 = load_out_dir(str(out))
    assert "hulls" in shapes and (shapes["hull"] >= 0).sum() == 2 + 4
    src = PoseSource(shapes, scene2.statics)
    src.set_poses(pos, quat)
    replay = Renderer(src, aspect=16 / 9)
    replay.update()
    assert replay.hull_vertices == expected
    # the scene changed since the run (another hull): bounding boxes, no hull mesh
    raw["bodies"][1]["vertices"] = cube
    (tmp_path / "hulls.yaml").write_text(yaml.safe_dump(raw))
    shapes, (pos, quat), _, scene3 = load_out_dir(str(out))
    assert "hulls" not in shapes
    src = PoseSource(shapes, scene3.statics if scene3 else ())
    src.set_poses(pos, quat)
    boxes = Renderer(src, aspect=16 / 9)
    boxes.update()
    assert boxes.hull_vertices == 0 and boxes._host_counts.sum() == 3 + 4
    # each convex body is its bounding box: its transform scales the unit box by its half extents
    convex = np.asarray(shapes["shape"]) == 3
    t = boxes.host_transforms()
    assert t.shape[0] == convex.sum()
    np.testing.assert_allclose(np.sort(np.linalg.norm(t[:, :3, :3], axis=1).ravel()),
                               np.sort(np.asarray(shapes["half_extents"])[convex].ravel()), rtol=1e-5)


@needs_vulkan
def test_bench_viewer_times_each_loop_over_the_same_frames(ti_cpu, tmp_path):
    # bench viewer's loops take turns a frame each: every loop gets every frame, the paced loop never runs more
    # than the scene's substeps, and the split of a render frame names its parts
    from bench.viewer_bench import main

    assert main(["--scene", TINY, "--arch", "cpu", "--frames", "3", "--warmup", "1", "--size", f"{W}x{H}",
                 "--out", str(tmp_path)]) == 0
    got = json.loads((tmp_path / "viewer.json").read_text())
    rows = {r["loop"]: r for r in got["rows"]}
    assert list(rows) == ["sim", "render", "sim+render", "paced"]
    assert all(r["fps"] > 0 and 0 < r["ms_median"] <= r["ms_max"] for r in rows.values())
    assert 0 <= rows["paced"]["steps_per_frame"] <= got["substeps"]
    assert got["sim_render_over_sim"] == pytest.approx(rows["sim+render"]["ms_median"] / rows["sim"]["ms_median"],
                                                       abs=1e-3)
    assert [p["part"] for p in got["render_split"]] == ["update", "declare", "end", "empty frame",
                                                        "declare + capture"]
