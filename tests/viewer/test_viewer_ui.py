"""Drive the interactive window as a person would: Xvfb + xdotool key presses (pause, step, reset, screenshot,
Esc), then check the screenshots and the simulation state written beside them.

Needs Xvfb, xdotool and a Vulkan driver (CI installs xvfb, xdotool, mesa-vulkan-drivers); skipped otherwise.
"""
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from app.viewer.display import vulkan_problem

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(ROOT, "tests", "viewer", "viewer_tiny.yaml")
W, H = 480, 360
READY_TIMEOUT_S = 240   # first frame includes compiling the simulator's kernels on a cold cache
ACTION_TIMEOUT_S = 60   # a key press is handled at the next frame; a frame can include a kernel compile

pytestmark = pytest.mark.skipif(
    shutil.which("Xvfb") is None or shutil.which("xdotool") is None or vulkan_problem() is not None,
    reason="needs Xvfb, xdotool and a Vulkan driver (apt-get install xvfb xdotool mesa-vulkan-drivers)")


def _free_display():
    for n in range(140, 200):
        if not os.path.exists(f"/tmp/.X11-unix/X{n}") and not os.path.exists(f"/tmp/.X{n}-lock"):
            return f":{n}"
    pytest.skip("no free X display number")


@pytest.fixture
def xvfb():
    display = _free_display()
    proc = subprocess.Popen(["Xvfb", display, "-screen", "0", "800x600x24", "-nolisten", "tcp"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        if os.path.exists(f"/tmp/.X11-unix/X{display[1:]}"):
            break
        time.sleep(0.1)
    yield display
    proc.terminate()
    proc.wait(timeout=10)


def _wait(pred, timeout, what):
    t0 = time.time()
    while time.time() - t0 < timeout:
        v = pred()
        if v:
            return v
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def test_keys_drive_the_viewer(xvfb, tmp_path):
    from app.scene import load_scene

    scene = load_scene(TINY)
    env = dict(os.environ, DISPLAY=xvfb, PYTHONPATH=ROOT)
    shots = tmp_path / "shots"
    work = tmp_path / "work"   # the working directory: the viewer leaves nothing there (GGUI's imgui.ini included)
    work.mkdir()
    log = open(tmp_path / "viewer.log", "w+")
    viewer = subprocess.Popen([sys.executable, "-m", "app.viewer", TINY, "--arch", "cpu", "--size", f"{W}x{H}",
                               "--screenshot-dir", str(shots), "--headroom", "3"], cwd=work, env=env, stdout=log,
                              stderr=subprocess.STDOUT)

    def xdo(*args):
        return subprocess.run(["xdotool", *args], env=env, capture_output=True, text=True, timeout=30)

    def key(name):
        r = xdo("key", name)
        assert r.returncode == 0, r.stderr

    def shot(k):
        key("p")
        path = shots / f"screenshot_{k:03d}.json"
        _wait(lambda: path.exists() and path.stat().st_size > 0, ACTION_TIMEOUT_S, f"screenshot {k}")
        time.sleep(0.1)
        return json.loads(path.read_text())

    try:
        _wait(lambda: "viewer ready" in (tmp_path / "viewer.log").read_text() or viewer.poll() is not None,
              READY_TIMEOUT_S, "the window")
        assert viewer.poll() is None, (tmp_path / "viewer.log").read_text()[-3000:]
        wid = _wait(lambda: xdo("search", "--name", "SmolVLA viewer").stdout.split(), 30, "the X window")[0]
        xdo("windowfocus", "--sync", wid)

        # running: time advances on its own
        s0 = shot(0)
        assert s0["paused"] is False and s0["step"] > 0

        # space pauses: the step count stops
        key("space")
        time.sleep(1.0)
        s1 = shot(1)
        assert s1["paused"] is True
        time.sleep(1.0)
        s2 = shot(2)
        assert s2["step"] == s1["step"], "time advanced while paused"

        # n steps exactly one frame (substeps steps); positions move under gravity. Keys are handled in order
        # at the top of a frame and a screenshot is taken after that frame's step, so p after n sees the step.
        key("n")
        s3 = shot(3)
        assert s3["step"] == s2["step"] + scene.sim["substeps"]
        assert s3["paused"] is True
        assert not np.allclose(s3["positions"], s2["positions"])

        # r resets to the scene's initial state (still paused)
        key("r")
        s4 = shot(4)
        assert s4["step"] == 0 and s4["paused"] is True
        np.testing.assert_allclose(s4["positions"], scene.bodies["position"], atol=1e-6)

        # the screenshot is the window: right size, not blank, the panel and the scene drawn
        import imageio.v2 as imageio

        img = imageio.imread(s4["image"])
        assert img.shape[:2] == (H, W)
        assert img[..., :3].std() > 15
        assert len({tuple(p) for p in img[::8, ::8, :3].reshape(-1, 3)}) > 50, "too few colours: blank window?"

        # c shows contact points, m colours by contact count; running again after space
        key("c")
        key("m")
        key("space")
        time.sleep(1.0)
        s5 = shot(5)
        assert s5["show_contacts"] is True and s5["color_mode"] == "contacts" and s5["paused"] is False
        assert s5["step"] > 0

        # Esc quits cleanly
        key("Escape")
        _wait(lambda: viewer.poll() is not None, ACTION_TIMEOUT_S, "the viewer to exit on Esc")
        assert viewer.returncode == 0, (tmp_path / "viewer.log").read_text()[-3000:]
        assert list(work.iterdir()) == []
    finally:
        if viewer.poll() is None:
            viewer.kill()
            viewer.wait(timeout=10)
        log.close()


def test_mouse_picks_and_drags_a_body(xvfb, tmp_path):
    """Left button on a body, drag, release, as a person would: the body is selected, pulled toward the cursor
    (up the screen: it rises) while boxes away from it stay where they were; released, it is let go. Then the v
    key records the window to an MP4."""
    from app.viewer.render import project

    env = dict(os.environ, DISPLAY=xvfb, PYTHONPATH=ROOT)
    shots = tmp_path / "shots"
    log = open(tmp_path / "viewer.log", "w+")
    viewer = subprocess.Popen([sys.executable, "-m", "app.viewer", TINY, "--arch", "cpu", "--size", f"{W}x{H}",
                               "--screenshot-dir", str(shots)], cwd=tmp_path, env=env, stdout=log,
                              stderr=subprocess.STDOUT)

    def xdo(*args):
        r = subprocess.run(["xdotool", *args], env=env, capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        return r

    count = [0]

    def shot():
        xdo("key", "p")
        path = shots / f"screenshot_{count[0]:03d}.json"
        _wait(lambda: path.exists() and path.stat().st_size > 0, ACTION_TIMEOUT_S, f"screenshot {count[0]}")
        time.sleep(0.1)
        count[0] += 1
        return json.loads(path.read_text())

    try:
        _wait(lambda: "viewer ready" in (tmp_path / "viewer.log").read_text() or viewer.poll() is not None,
              READY_TIMEOUT_S, "the window")
        assert viewer.poll() is None, (tmp_path / "viewer.log").read_text()[-3000:]
        wid = _wait(lambda: subprocess.run(["xdotool", "search", "--name", "SmolVLA viewer"], env=env,
                                           capture_output=True, text=True).stdout.split(), 30, "the X window")[0]
        xdo("windowfocus", "--sync", wid)
        xdo("key", "h")   # (the panel off: the whole window is the scene)
        s0 = _wait(lambda: (lambda s: s if s["sim_time"] > 2.5 else None)(shot()), ACTION_TIMEOUT_S * 2,
                   "the bodies to land")
        p0 = np.array(s0["positions"])
        x, y = project(p0[0], s0["camera"], W, H)[0]   # body 0: the 0.2 m sphere
        assert 0 < x < W and 40 < y < H
        xdo("mousemove", "--window", wid, str(int(x)), str(int(y)))
        time.sleep(0.3)
        xdo("mousedown", "1")
        for k in range(1, 7):   # up the screen, a few pixels at a time, as a hand moves
            xdo("mousemove", "--window", wid, str(int(x)), str(int(y - 10 * k)))
            time.sleep(0.15)
        time.sleep(1.5)
        s1 = shot()
        xdo("mouseup", "1")
        time.sleep(0.5)
        s2 = shot()
        p1 = np.array(s1["positions"])
        assert s1["selected"] == 0 and s1["dragging"] is True
        assert p1[0, 1] - p0[0, 1] > 0.1, (p0[0], p1[0])   # pulled up toward the cursor
        # boxes away from it stay put (spheres may still roll: nothing stops a rolling ball but the walls)
        from app.scene import load_scene

        boxes = load_scene(TINY).bodies["shape"] == 1
        far = (np.linalg.norm(p0 - p0[0], axis=1) > 0.7) & boxes
        assert far.sum() >= 4 and np.abs(p1[far] - p0[far]).max() < 0.03, np.abs(p1 - p0).max(axis=1)
        assert s2["dragging"] is False
        # v records what the window shows to an MP4, v again finishes it
        xdo("key", "v")
        time.sleep(1.5)
        xdo("key", "v")
        video = shots / "recording_000.mp4"
        _wait(lambda: "recorded:" in (tmp_path / "viewer.log").read_text(), ACTION_TIMEOUT_S, "the recording")
        import imageio.v2 as imageio

        reader = imageio.get_reader(str(video))
        count = reader.count_frames()
        last = reader.get_data(count - 1)
        reader.close()
        assert count >= 5 and last.shape[:2] == (H // 16 * 16, W // 16 * 16)
        assert last.std() > 15   # the window's picture, not a blank frame
        xdo("key", "Escape")
        _wait(lambda: viewer.poll() is not None, ACTION_TIMEOUT_S, "the viewer to exit on Esc")
    finally:
        if viewer.poll() is None:
            viewer.kill()
            viewer.wait(timeout=10)
        log.close()
