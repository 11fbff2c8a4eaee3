"""The viewer: an interactive GGUI window, offscreen frames and video, replay of recorded runs.

    python run.py [SCENE]                        interactive window (app.cli -> main_interactive)
    python run.py [SCENE] --headless --render DIR [--render-every K] [--video FILE.mp4]
                                                  offscreen frames / video while simulating (FrameRecorder)
    python run.py replay OUT_DIR [--speed S] [--video F.mp4 | --render DIR]
                                                  watch (or render) a recorded trajectory.npz
    python -m app.viewer [SCENE] [--size WxH] [--screenshot-dir DIR] ...   the window with viewer-only options

The viewer is a plug-in: it reads the simulation's fields (app/render.py) and calls the Simulation's public
methods (step_frame, reset, add_bodies, set_gravity, set_material, and the dt / solver_iterations
attributes); the simulation never imports it. Without a display `python run.py` runs headless and writes a
preview image; without a Vulkan driver it says which package to install.
"""
from __future__ import annotations

import argparse
import ctypes.util
import glob
import json
import math
import os
import sys
import time

import numpy as np

from app.errors import UserError

DEFAULT_SIZE = (1280, 720)
OFFSCREEN_SIZE = (1024, 576)   # multiples of 16: H.264 encoders need no resize
PREVIEW_SIM_SECONDS = 1.0      # no display: simulated time of the headless preview run (a few s on a laptop)
SCREENSHOT_DIR = os.path.join("out", "screenshots")
WINDOW_TITLE = "SmolVLA viewer"
DROP_HEADROOM = 4096           # bodies the window can add before the simulation's fields must grow
VULKAN_HINT = ("install a Vulkan driver: on Debian/Ubuntu `apt-get install mesa-vulkan-drivers libvulkan1` "
               "(lavapipe renders on the CPU), or your GPU vendor's driver")


# --------------------------------------------------------------------------------------------------------------
# environment checks
# --------------------------------------------------------------------------------------------------------------
def has_display() -> bool:
    """True where a window can open: an X11 or Wayland display on Linux; always on macOS and Windows."""
    if sys.platform.startswith("linux"):
        return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
    return True


def vulkan_problem() -> str | None:
    """None when a Vulkan loader and at least one driver manifest are present, else a one-line reason with
    the package to install. GGUI draws with Vulkan, windowed or offscreen."""
    if not sys.platform.startswith("linux"):
        return None
    if ctypes.util.find_library("vulkan") is None and not glob.glob("/usr/lib*/**/libvulkan.so.1", recursive=True):
        return f"no Vulkan loader (libvulkan.so.1) found; {VULKAN_HINT}"
    listed = [p for var in ("VK_ICD_FILENAMES", "VK_DRIVER_FILES") for p in os.environ.get(var, "").split(":") if p]
    if listed:
        if not any(os.path.isfile(p) for p in listed):
            return f"no Vulkan driver: the manifests named by VK_ICD_FILENAMES/VK_DRIVER_FILES do not exist; {VULKAN_HINT}"
        return None
    dirs = ["/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d", "/usr/local/share/vulkan/icd.d"]
    xdg = os.environ.get("XDG_DATA_DIRS", "")
    dirs += [os.path.join(d, "vulkan", "icd.d") for d in xdg.split(":") if d]
    if not any(glob.glob(os.path.join(d, "*.json")) for d in dirs):
        return f"no Vulkan driver found (no ICD manifest in /usr/share/vulkan/icd.d); {VULKAN_HINT}"
    return None


def vulkan_icds() -> list:
    """Vulkan driver manifests visible to the loader (file names): tells lavapipe (lvp_icd, a CPU rasteriser)
    from a GPU driver (nvidia_icd, ...) when reading benchmark figures."""
    listed = [p for var in ("VK_ICD_FILENAMES", "VK_DRIVER_FILES") for p in os.environ.get(var, "").split(":") if p]
    if listed:
        return [os.path.basename(p) for p in listed if os.path.isfile(p)]
    found = []
    for d in ("/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d", "/usr/local/share/vulkan/icd.d"):
        found += sorted(os.path.basename(p) for p in glob.glob(os.path.join(d, "*.json")))
    return found


def open_window(title: str, size, show_window: bool):
    """A GGUI window (show_window=False: offscreen). Raises UserError naming the package when Vulkan is
    missing instead of GGUI's traceback."""
    problem = vulkan_problem()
    if problem:
        raise UserError(problem)
    import taichi as ti

    try:
        return ti.ui.Window(title, tuple(int(x) for x in size), vsync=show_window, show_window=show_window)
    except RuntimeError as e:
        if "vulkan" in str(e).lower():
            raise UserError(f"cannot start Vulkan ({e}); {VULKAN_HINT}") from None
        if show_window:
            raise UserError(f"cannot open a window ({e}); check $DISPLAY, or run with --headless") from None
        raise


def parse_size(text: str, what="--size"):
    try:
        w, h = (int(x) for x in text.lower().split("x"))
        if w < 64 or h < 64:
            raise ValueError
        return w, h
    except ValueError:
        raise UserError(f"{what} {text!r}: expected WIDTHxHEIGHT, at least 64x64 (e.g. 1280x720)") from None


def _fmt_bytes(n) -> str:
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _ensure_taichi(arch, scene_arch="auto", scene=None, capacity=0):
    from app.headless import ensure_taichi

    return ensure_taichi(arch if arch not in (None, "auto") else scene_arch, scene=scene, capacity=capacity)


def _save_png(path, rgb):
    from PIL import Image

    d = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(d, exist_ok=True)
        Image.fromarray(rgb).save(path, optimize=True)
    except OSError as e:
        raise UserError(f"{path}: cannot write the image ({e.strerror or e})") from None


# --------------------------------------------------------------------------------------------------------------
# offscreen
# --------------------------------------------------------------------------------------------------------------
class OffscreenView:
    """An invisible window + renderer + camera for one source. render() draws a fresh frame and returns it as
    (H, W, 3) uint8 (each capture ends GGUI's frame, so every call draws again)."""

    def __init__(self, source, scene_camera=None, size=OFFSCREEN_SIZE, color_mode="material", show_contacts=False):
        import taichi as ti

        from app.render import Renderer, apply_camera, camera_spec

        self.size = tuple(int(x) for x in size)
        self.window = open_window(WINDOW_TITLE, self.size, show_window=False)
        self.renderer = Renderer(source, color_mode=color_mode, show_contacts=show_contacts)
        self.camera = ti.ui.Camera()
        lo, hi = self.renderer.scene_bounds()
        self.camera_spec = camera_spec(scene_camera, lo, hi, self.size[0] / self.size[1])
        apply_camera(self.camera, self.camera_spec, self.renderer.extent)

    def render(self) -> np.ndarray:
        from app.render import BACKGROUND, image_rgb8

        self.renderer.update()
        canvas = self.window.get_canvas()
        canvas.set_background_color(BACKGROUND)
        scene = self.window.get_scene()
        self.renderer.draw(scene, self.camera)
        canvas.scene(scene)
        return image_rgb8(self.window)

    def close(self):
        self.window.destroy()


class VideoWriter:
    """H.264 MP4 through imageio-ffmpeg (which ships its own ffmpeg binary)."""

    def __init__(self, path, fps):
        try:
            import imageio.v2 as imageio
            import imageio_ffmpeg  # noqa: F401  (fail here, with the package's name, not at the first frame)
        except ImportError:
            raise UserError(f"--video {path}: needs the imageio-ffmpeg package (pip install imageio-ffmpeg)") from None
        d = os.path.dirname(os.path.abspath(path))
        try:
            os.makedirs(d, exist_ok=True)
        except OSError as e:
            raise UserError(f"--video {path}: cannot create {d} ({e.strerror})") from None
        self.path = path
        self.frames = 0
        self._writer = imageio.get_writer(path, fps=float(fps), codec="libx264", quality=7, macro_block_size=16,
                                          ffmpeg_log_level="error", pixelformat="yuv420p")

    def append(self, rgb):
        self._writer.append_data(rgb)
        self.frames += 1

    def close(self):
        self._writer.close()


class FrameRecorder:
    """Offscreen frames of a running simulation: call it after each sim.step_frame() with the frame index.

        rec = FrameRecorder(sim, render_dir="out/frames", render_every=2, video="out/run.mp4")
        for f in range(frames): sim.step_frame(); rec(sim, f)
        rec.close()

    Writes render_dir/frame_00000.png, frame_00001.png, ... (numbered by image, not by simulation frame) and/or
    an MP4 whose frame rate plays the simulation in real time (capped at 60 fps). Works without a display.
    """

    def __init__(self, sim, render_dir=None, render_every=1, video=None, size=OFFSCREEN_SIZE, color_mode="material"):
        from app.render import SimSource

        if render_every is None or int(render_every) < 1:
            raise UserError(f"--render-every: expected an integer >= 1, got {render_every!r}")
        if not render_dir and not video:
            raise UserError("FrameRecorder: nothing to write (give --render DIR and/or --video FILE.mp4)")
        if video and not str(video).lower().endswith((".mp4", ".mkv", ".mov")):
            raise UserError(f"--video {video}: expected a file name ending in .mp4")
        self.render_dir = render_dir
        self.render_every = int(render_every)
        if render_dir:
            try:
                os.makedirs(render_dir, exist_ok=True)
            except OSError as e:
                raise UserError(f"--render {render_dir}: cannot create the directory ({e.strerror})") from None
        self.view = OffscreenView(SimSource(sim), sim.scene.camera, size, color_mode=color_mode)
        frame_seconds = sim.dt * sim.substeps * self.render_every
        self.video = VideoWriter(video, min(60.0, max(1.0, 1.0 / frame_seconds))) if video else None
        self.images = 0

    def __call__(self, sim, frame: int):
        if frame % self.render_every:
            return
        rgb = self.view.render()
        if self.render_dir:
            _save_png(os.path.join(self.render_dir, f"frame_{self.images:05d}.png"), rgb)
        if self.video:
            self.video.append(rgb)
        self.images += 1

    def close(self):
        if self.video:
            self.video.close()
        self.view.close()


class _LazyRecorder:
    """on_frame hook for app.headless.run_headless: builds the FrameRecorder at the first frame (the
    simulation exists only then); close() finishes the video."""

    def __init__(self, render_dir, render_every, video, size):
        self.args = (render_dir, render_every, video, size)
        self.recorder = None

    def __call__(self, sim, frame):
        if self.recorder is None:
            render_dir, every, video, size = self.args
            self.recorder = FrameRecorder(sim, render_dir, every, video, size)
        self.recorder(sim, frame)

    def close(self):
        if self.recorder is not None:
            self.recorder.close()


def frame_callback(render_dir=None, render_every=1, video=None, size=OFFSCREEN_SIZE):
    """What `--headless --render DIR --render-every K --video F.mp4` passes to run_headless(on_frame=...).
    Checks the arguments and the Vulkan driver now, before the simulation starts."""
    if render_every is None or int(render_every) < 1:
        raise UserError(f"--render-every: expected an integer >= 1, got {render_every!r}")
    if video and not str(video).lower().endswith((".mp4", ".mkv", ".mov")):
        raise UserError(f"--video {video}: expected a file name ending in .mp4")
    if video:
        try:
            import imageio_ffmpeg  # noqa: F401
        except ImportError:
            raise UserError(f"--video {video}: needs the imageio-ffmpeg package (pip install imageio-ffmpeg)") from None
    problem = vulkan_problem()
    if problem:
        raise UserError(f"--render/--video: {problem}")
    return _LazyRecorder(render_dir, int(render_every), video, size)


def load_out_dir(out_dir):
    """(shapes dict, final poses, trajectory or None, scene or None) from a headless run's output directory.
    The scene (for static geometry and camera) is reloaded from metrics.json's scene_path when it exists."""
    state_path = os.path.join(out_dir, "state.npz")
    if not os.path.isdir(out_dir):
        raise UserError(f"{out_dir}: not a directory (expected the --out directory of a headless run)")
    if not os.path.isfile(state_path):
        raise UserError(f"{out_dir}: no state.npz (expected the --out directory of `python run.py SCENE --headless`)")
    try:
        st = np.load(state_path)
        shapes = {k: st[k] for k in ("shape", "half_extents", "material")}
        final = (st["position"], st["orientation"])
    except (OSError, KeyError, ValueError) as e:
        raise UserError(f"{state_path}: unreadable or missing arrays ({e}); expected shape, half_extents, "
                        f"material, position, orientation") from None
    traj = None
    tpath = os.path.join(out_dir, "trajectory.npz")
    if os.path.isfile(tpath):
        try:
            t = np.load(tpath)
            traj = {"time": np.asarray(t["time"], np.float64), "position": t["position"],
                    "orientation": t["orientation"]}
        except (OSError, KeyError, ValueError) as e:
            raise UserError(f"{tpath}: unreadable ({e}); expected time, position, orientation") from None
        if traj["position"].ndim != 3 or traj["position"].shape[1] != len(shapes["shape"]):
            raise UserError(f"{tpath}: position has shape {traj['position'].shape}, expected (frames, "
                            f"{len(shapes['shape'])}, 3) to match state.npz")
    scene = None
    mpath = os.path.join(out_dir, "metrics.json")
    if os.path.isfile(mpath):
        try:
            with open(mpath) as fh:
                m = json.load(fh)
            sp = m.get("scene_path")
            if sp and os.path.isfile(sp):
                from app.scene import load_scene

                scene = load_scene(sp, tuple(m.get("overrides") or ()))
        except (OSError, ValueError, UserError) as e:
            print(f"note: {mpath}: scene not reloaded ({e}); drawing bodies without static geometry",
                  file=sys.stderr)
    return shapes, final, traj, scene


def render_state_preview(out_dir, png_path, size=OFFSCREEN_SIZE):
    """Render the final state of a headless run (out_dir/state.npz) to a PNG; returns the path."""
    from app.render import PoseSource

    shapes, (pos, quat), _, scene = load_out_dir(out_dir)
    src = PoseSource(shapes, scene.statics if scene else (), [m["name"] for m in scene.materials] if scene else None)
    src.set_poses(pos, quat)
    view = OffscreenView(src, scene.camera if scene else None, size)
    try:
        _save_png(png_path, view.render())
    finally:
        view.close()
    return png_path


# --------------------------------------------------------------------------------------------------------------
# interactive
# --------------------------------------------------------------------------------------------------------------
def main_interactive(args) -> int:
    """`python run.py [SCENE]` without --headless. args: argparse namespace with scene, arch, set, out,
    frames (and optionally size, screenshot_dir, color, contacts from `python -m app.viewer`)."""
    from app.scene import load_scene

    scene_path = args.scene
    overrides = tuple(getattr(args, "set", None) or ())
    if not has_display():
        return _headless_preview(args)
    scene = load_scene(scene_path, overrides)
    problem = vulkan_problem()
    if problem:
        raise UserError(problem)
    # headroom for the "drop N bodies" button: growing past the capacity reallocates every field, which
    # recompiles every simulation kernel (tens of seconds on a CPU)
    headroom = getattr(args, "headroom", None)
    headroom = max(DROP_HEADROOM, scene.body_count // 2) if headroom is None else max(0, int(headroom))
    _ensure_taichi(getattr(args, "arch", "auto"), scene.sim["arch"], scene, scene.body_count + headroom)
    from app.sim import Simulation

    sim = Simulation(scene, capacity=scene.body_count + headroom)
    size = parse_size(args.size) if getattr(args, "size", None) else DEFAULT_SIZE
    viewer = InteractiveViewer(sim, size=size, screenshot_dir=getattr(args, "screenshot_dir", None) or SCREENSHOT_DIR,
                               color_mode=getattr(args, "color", None) or "material",
                               show_contacts=bool(getattr(args, "contacts", False)))
    return viewer.run()


def _headless_preview(args) -> int:
    """No display: run the scene headless for PREVIEW_SIM_SECONDS, write metrics and a preview PNG, exit 0."""
    from app.cli import default_out_dir
    from app.headless import run_headless
    from app.scene import load_scene

    overrides = tuple(getattr(args, "set", None) or ())
    scene = load_scene(args.scene, overrides)
    frame_s = scene.sim["dt"] * scene.sim["substeps"]
    frames = getattr(args, "frames", None) or max(1, int(math.ceil(PREVIEW_SIM_SECONDS / frame_s)))
    out = getattr(args, "out", None) or default_out_dir(args.scene)
    print(f"no display found ($DISPLAY is not set): running headless instead: {args.scene}, {frames} frames "
          f"({frames * frame_s:.2f} s simulated), then a preview image in {out}/", file=sys.stderr)
    m = run_headless(args.scene, frames, out, arch=getattr(args, "arch", "auto"), overrides=overrides, progress=True)
    print(f"{m['scene']}: {m['bodies']} bodies, {m['frames']} frames in {m['wall_time']:.2f} s "
          f"({m['steps_per_second']:.1f} steps/s, {m['arch']}); contacts final {m['contacts']['final']}")
    problem = vulkan_problem()
    if problem:
        print(f"wrote {out}/metrics.json and state.npz; no preview image: {problem}", file=sys.stderr)
        return 0
    png = render_state_preview(out, os.path.join(out, "preview.png"))
    print(f"wrote {out}/metrics.json, state.npz and {png} (open a display to get the interactive viewer)")
    return 0


class InteractiveViewer:
    """The window loop. Keys: space pause, n step one frame, r reset, c contacts on/off, m colour by
    material/contacts, p screenshot, h panel on/off, Esc quit; right mouse drag looks around, WASD/QE move.
    Screenshots go to screenshot_dir/screenshot_NNN.png with a .json beside them (step, time, paused, bodies,
    positions for small scenes): what the UI test checks."""

    def __init__(self, sim, size=DEFAULT_SIZE, screenshot_dir=SCREENSHOT_DIR, color_mode="material",
                 show_contacts=False):
        self.sim = sim
        self.size = tuple(size)
        self.screenshot_dir = screenshot_dir
        self.color_mode = color_mode
        self.show_contacts = show_contacts
        self.playing = True
        self.step_requested = False
        self.screenshot_requested = False
        self.show_panel = True
        self.quit = False
        self.error = None
        self.frames = 0
        self.drop_count = 50
        self.material_sel = 0
        self.fps = 0.0
        self.step_ms = 0.0
        self._mem = (0, 0)
        self._mem_time = 0.0
        self._last = time.perf_counter()
        self.screenshots = []

    # ------------------------------------------------------------------ actions
    def toggle_pause(self):
        self.playing = not self.playing

    def reset(self):
        self.sim.reset()
        self.frames = 0
        self.error = None

    def drop_bodies(self, count: int):
        """Drop `count` bodies above the scene (alternating spheres and boxes, the scene's median size, the
        selected material) through sim.add_bodies: the contact VLAs and the grid absorb them live."""
        sim = self.sim
        shapes = sim.shapes()
        pos = sim.positions()
        he = shapes["half_extents"]
        size = float(np.median(he.min(axis=1))) if len(he) else 0.1
        bound = size * math.sqrt(3.0)
        spacing = 2.3 * bound
        lo, hi = (pos.min(axis=0), pos.max(axis=0)) if len(pos) else (np.zeros(3), np.zeros(3))
        for s in sim.static_geometry():
            if s["type"] == "container":
                c, h = np.asarray(s["center"]), np.asarray(s["size"]) / 2
                lo, hi = np.array([c[0] - h[0], lo[1], c[2] - h[2]]), np.array([c[0] + h[0], hi[1], c[2] + h[2]])
                lo[[0, 2]] += spacing / 2
                hi[[0, 2]] -= spacing / 2
        nx = max(1, int((hi[0] - lo[0]) / spacing) + 1)
        nz = max(1, int((hi[2] - lo[2]) / spacing) + 1)
        y0 = float(hi[1]) + 3.0 * bound
        rng = np.random.default_rng(sim.step_count + count)
        mats = sim.scene.materials
        mat = mats[min(self.material_sel, len(mats) - 1)]["name"]
        bodies = []
        for k in range(count):
            layer, rest = divmod(k, nx * nz)
            iz, ix = divmod(rest, nx)
            p = [float(lo[0] + ix * spacing), y0 + layer * spacing, float(lo[2] + iz * spacing)]
            if k % 2 == 0:
                bodies.append({"shape": "sphere", "radius": size, "position": p, "material": mat})
            else:
                q = rng.normal(size=4)
                bodies.append({"shape": "box", "half_extents": [size] * 3, "position": p,
                               "orientation": (q / np.linalg.norm(q)).tolist(), "material": mat})
        sim.add_bodies(bodies)

    def advance(self):
        import taichi as ti

        from app.sim import SimulationError

        t0 = time.perf_counter()
        try:
            self.sim.step_frame()
        except SimulationError as e:
            self.error = str(e)
            self.playing = False
            print(f"error: {e} (paused; press r to reset)", file=sys.stderr)
            return
        ti.sync()
        ms = (time.perf_counter() - t0) * 1e3 / max(1, self.sim.substeps)
        self.step_ms = ms if self.step_ms == 0 else 0.8 * self.step_ms + 0.2 * ms
        self.frames += 1

    def screenshot(self, window) -> str:
        n = len(glob.glob(os.path.join(self.screenshot_dir, "screenshot_*.png")))
        path = os.path.join(self.screenshot_dir, f"screenshot_{n:03d}.png")
        os.makedirs(self.screenshot_dir, exist_ok=True)
        window.save_image(path)
        meta = {"image": path, "step": self.sim.step_count, "frame": self.frames, "sim_time": self.sim.sim_time,
                "paused": not self.playing, "bodies": self.sim.body_count, "color_mode": self.color_mode,
                "show_contacts": self.show_contacts, "scene": self.sim.scene.path}
        if self.sim.body_count <= 1000:
            meta["positions"] = self.sim.positions().tolist()
        with open(path[:-4] + ".json", "w") as fh:
            json.dump(meta, fh)
        self.screenshots.append(path)
        print(f"screenshot: {path}", flush=True)
        return path

    # ------------------------------------------------------------------ loop
    def _events(self, window):
        import taichi as ti

        for e in window.get_events(ti.ui.PRESS):
            key = e.key
            if key == ti.ui.ESCAPE:
                self.quit = True
            elif key == " ":
                self.toggle_pause()
            elif key == "n":
                self.playing = False
                self.step_requested = True
            elif key == "r":
                self.reset()
            elif key == "c":
                self.show_contacts = not self.show_contacts
            elif key == "m":
                self.color_mode = "contacts" if self.color_mode == "material" else "material"
            elif key == "p":
                self.screenshot_requested = True
            elif key == "h":
                self.show_panel = not self.show_panel

    def _panel(self, window):
        gui = window.get_gui()
        sim = self.sim
        width = min(0.5, 360.0 / self.size[0])
        with gui.sub_window("SmolVLA", 0.01, 0.01, width, 0.85) as g:
            if g.button("pause (space)" if self.playing else "play (space)"):
                self.toggle_pause()
            if g.button("step (n)"):
                self.playing = False
                self.step_requested = True
            if g.button("reset (r)"):
                self.reset()
            if g.button("screenshot (p)"):
                self.screenshot_requested = True
            g.text(f"{self.fps:5.1f} fps   {self.step_ms:6.2f} ms / step")
            g.text(f"t = {sim.sim_time:.3f} s   step {sim.step_count}")
            g.text(f"bodies {sim.body_count}   contacts {int(sim.contacts.contact_total[None])}")
            live, reserved = self._mem
            g.text(f"{sim.contacts_kind} memory: live {_fmt_bytes(live)} / reserved {_fmt_bytes(reserved)}")
            if self.error:
                g.text("exploded: press r to reset", color=(1.0, 0.4, 0.3))
            self.show_contacts = g.checkbox("contact points (c)", self.show_contacts)
            by_contacts = g.checkbox("colour by contacts (m)", self.color_mode == "contacts")
            self.color_mode = "contacts" if by_contacts else "material"
            gy = float(sim.model.gravity[None][1])
            ngy = g.slider_float("gravity y", gy, -20.0, 0.0)
            if ngy != gy:
                gv = sim.model.gravity[None]
                sim.set_gravity([float(gv[0]), ngy, float(gv[2])])
            sim.dt = g.slider_float("dt (s)", sim.dt, 0.0002, 0.01)
            sim.solver_iterations = g.slider_int("solver iterations", sim.solver_iterations, 1, 60)
            mats = sim.scene.materials
            if len(mats) > 1:
                self.material_sel = g.slider_int("material", self.material_sel, 0, len(mats) - 1)
            k = min(self.material_sel, len(mats) - 1)
            g.text(f"material: {mats[k]['name']}")
            fr = float(sim.model.material_friction[k])
            re = float(sim.model.material_restitution[k])
            nfr = g.slider_float("friction", fr, 0.0, 1.5)
            nre = g.slider_float("restitution", re, 0.0, 1.0)
            if nfr != fr or nre != re:
                sim.set_material(k, friction=nfr, restitution=nre)
            self.drop_count = g.slider_int("N", self.drop_count, 1, 2000)
            if g.button(f"drop {self.drop_count} bodies"):
                self.drop_bodies(self.drop_count)

    def run(self) -> int:
        import taichi as ti

        from app.render import BACKGROUND, Renderer, SimSource, apply_camera, camera_spec

        sim = self.sim
        window = open_window(f"{WINDOW_TITLE} - {sim.scene.name}", self.size, show_window=True)
        renderer = Renderer(SimSource(sim), color_mode=self.color_mode, show_contacts=self.show_contacts)
        camera = ti.ui.Camera()
        lo, hi = renderer.scene_bounds()
        spec = camera_spec(sim.scene.camera, lo, hi, self.size[0] / self.size[1])
        apply_camera(camera, spec, renderer.extent)
        speed = 0.01 * renderer.extent
        canvas = window.get_canvas()
        scene = window.get_scene()
        announced = False
        while window.running and not self.quit:
            self._events(window)
            if self.quit:
                break
            camera.track_user_inputs(window, movement_speed=speed, hold_key=ti.ui.RMB)
            if self.playing or self.step_requested:
                if self.error is None:
                    self.advance()
                self.step_requested = False
            renderer.set_color_mode(self.color_mode)
            renderer.show_contacts = self.show_contacts
            renderer.update()
            now = time.perf_counter()
            if now - self._mem_time > 0.5:
                st = sim.contacts.stats()
                self._mem = (st.get("live_bytes", 0), st.get("reserved_bytes", 0))
                self._mem_time = now
            canvas.set_background_color(BACKGROUND)
            renderer.draw(scene, camera)
            canvas.scene(scene)
            if self.show_panel:
                self._panel(window)
            if self.screenshot_requested:
                self.screenshot(window)
                self.screenshot_requested = False
            window.show()
            dt = now - self._last
            self._last = now
            if dt > 0:
                self.fps = 1.0 / dt if self.fps == 0 else 0.9 * self.fps + 0.1 / dt
            if not announced:
                print("viewer ready", flush=True)
                announced = True
        window.destroy()
        return 0


# --------------------------------------------------------------------------------------------------------------
# replay
# --------------------------------------------------------------------------------------------------------------
def _replay_parser():
    class P(argparse.ArgumentParser):
        def error(self, message):
            raise UserError(f"replay: {message} (usage: python run.py replay OUT_DIR [--speed S] [--size WxH] "
                            f"[--video FILE.mp4] [--render DIR] [--render-every K])")

    p = P(prog="run.py replay", description="Watch (or render) a recorded headless run.")
    p.add_argument("out_dir", help="the --out directory of `python run.py SCENE --headless --record`")
    p.add_argument("--speed", type=float, default=1.0, help="playback speed (1 = real time)")
    p.add_argument("--size", default=None, help="window / image size WIDTHxHEIGHT")
    p.add_argument("--video", default=None, help="render the trajectory to this MP4 instead of opening a window")
    p.add_argument("--render", default=None, help="render the trajectory to DIR/frame_00000.png ...")
    p.add_argument("--render-every", type=int, default=1, help="with --render/--video: every K-th recorded frame")
    p.add_argument("--arch", choices=("auto", "cpu", "cuda"), default="cpu",
                   help="Taichi arch for the viewer's kernels (default cpu: replay uploads from the host anyway)")
    return p


def replay_main(argv) -> int:
    args = _replay_parser().parse_args(list(argv))
    shapes, final, traj, scene = load_out_dir(args.out_dir)
    if traj is None:
        raise UserError(f"{args.out_dir}: no trajectory.npz (record one with `python run.py SCENE --headless "
                        f"--frames N --record --out {args.out_dir}`)")
    if len(traj["time"]) == 0:
        raise UserError(f"{args.out_dir}/trajectory.npz: no frames recorded")
    if not (args.speed > 0 and math.isfinite(args.speed)):
        raise UserError(f"replay --speed: expected a number > 0, got {args.speed}")
    if args.render_every < 1:
        raise UserError(f"replay --render-every: expected an integer >= 1, got {args.render_every}")
    offscreen = bool(args.video or args.render)
    if not offscreen and not has_display():
        raise UserError("replay: no display found ($DISPLAY is not set); render the trajectory instead with "
                        f"--video FILE.mp4 or --render DIR")
    problem = vulkan_problem()
    if problem:
        raise UserError(problem)
    _ensure_taichi(args.arch)
    from app.render import PoseSource

    src = PoseSource(shapes, scene.statics if scene else (), [m["name"] for m in scene.materials] if scene else None)
    src.set_poses(traj["position"][0], traj["orientation"][0])
    camera = scene.camera if scene else None
    if offscreen:
        size = parse_size(args.size) if args.size else OFFSCREEN_SIZE
        view = OffscreenView(src, camera, size)
        times = traj["time"]
        frame_dt = float(np.median(np.diff(times))) if len(times) > 1 else 1 / 60
        video = VideoWriter(args.video, min(60.0, max(1.0, args.speed / (frame_dt * args.render_every)))) \
            if args.video else None
        images = 0
        for f in range(0, len(times), args.render_every):
            src.set_poses(traj["position"][f], traj["orientation"][f])
            rgb = view.render()
            if args.render:
                _save_png(os.path.join(args.render, f"frame_{images:05d}.png"), rgb)
            if video:
                video.append(rgb)
            images += 1
        if video:
            video.close()
        view.close()
        print(f"replay: rendered {images} frames" + (f" to {args.render}/" if args.render else "")
              + (f" and {args.video}" if args.video else ""))
        return 0
    size = parse_size(args.size) if args.size else DEFAULT_SIZE
    return ReplayViewer(src, traj, camera, size, args.speed).run()


class ReplayViewer:
    """Plays a trajectory: space pause, left/right one frame, p screenshot, Esc quit; the panel scrubs (frame
    slider), sets the speed and loops."""

    def __init__(self, source, traj, scene_camera, size, speed=1.0):
        self.source, self.traj, self.scene_camera, self.size = source, traj, scene_camera, size
        self.speed = float(speed)
        self.playing = True
        self.loop = True
        self.frame = 0
        self.t = float(traj["time"][0])

    def _show(self, f):
        f = int(np.clip(f, 0, len(self.traj["time"]) - 1))
        if f != self.frame:
            self.source.set_poses(self.traj["position"][f], self.traj["orientation"][f])
            self.frame = f

    def run(self) -> int:
        import taichi as ti

        from app.render import BACKGROUND, Renderer, apply_camera, camera_spec

        times = self.traj["time"]
        last = len(times) - 1
        window = open_window(f"{WINDOW_TITLE} - replay", self.size, show_window=True)
        renderer = Renderer(self.source)
        camera = ti.ui.Camera()
        lo, hi = renderer.scene_bounds()
        apply_camera(camera, camera_spec(self.scene_camera, lo, hi, self.size[0] / self.size[1]), renderer.extent)
        canvas, scene, gui = window.get_canvas(), window.get_scene(), window.get_gui()
        prev = time.perf_counter()
        shots = 0
        while window.running:
            now = time.perf_counter()
            wall_dt, prev = now - prev, now
            shot = False
            for e in window.get_events(ti.ui.PRESS):
                if e.key == ti.ui.ESCAPE:
                    window.running = False
                elif e.key == " ":
                    self.playing = not self.playing
                elif e.key in (ti.ui.RIGHT, ti.ui.LEFT):
                    self.playing = False
                    self._show(self.frame + (1 if e.key == ti.ui.RIGHT else -1))
                    self.t = float(times[self.frame])
                elif e.key == "p":
                    shot = True
            if not window.running:
                break
            if self.playing:
                self.t += wall_dt * self.speed
                if self.t > times[-1]:
                    if self.loop:
                        self.t = float(times[0])
                    else:
                        self.t, self.playing = float(times[-1]), False
                self._show(int(np.searchsorted(times, self.t)))
            camera.track_user_inputs(window, movement_speed=0.01 * renderer.extent, hold_key=ti.ui.RMB)
            renderer.update()
            canvas.set_background_color(BACKGROUND)
            renderer.draw(scene, camera)
            canvas.scene(scene)
            with gui.sub_window("replay", 0.01, 0.01, min(0.5, 360.0 / self.size[0]),
                                min(0.9, 200.0 / self.size[1])) as g:
                if g.button("pause (space)" if self.playing else "play (space)"):
                    self.playing = not self.playing
                g.text(f"t = {times[self.frame]:.3f} s   frame {self.frame} / {last}")
                f = g.slider_int("frame", self.frame, 0, last)
                if f != self.frame:
                    self.playing = False
                    self._show(f)
                    self.t = float(times[f])
                self.speed = g.slider_float("speed", self.speed, 0.05, 4.0)
                self.loop = g.checkbox("loop", self.loop)
                shot = g.button("screenshot (p)") or shot
            if shot:
                os.makedirs(SCREENSHOT_DIR, exist_ok=True)
                path = os.path.join(SCREENSHOT_DIR, f"replay_{shots:03d}.png")
                window.save_image(path)
                shots += 1
                print(f"screenshot: {path}", flush=True)
            window.show()
        window.destroy()
        return 0


# --------------------------------------------------------------------------------------------------------------
# python -m app.viewer
# --------------------------------------------------------------------------------------------------------------
def viewer_main(argv=None) -> int:
    """The interactive window with viewer-only options (the UI test drives this)."""
    class P(argparse.ArgumentParser):
        def error(self, message):
            raise UserError(f"viewer: {message}")

    p = P(prog="python -m app.viewer")
    p.add_argument("scene", nargs="?", default=os.path.join("scenes", "default.yaml"))
    p.add_argument("--arch", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--set", action="append", default=[])
    p.add_argument("--size", default=None, help="WIDTHxHEIGHT (default 1280x720)")
    p.add_argument("--screenshot-dir", default=SCREENSHOT_DIR)
    p.add_argument("--color", choices=("material", "contacts"), default="material")
    p.add_argument("--contacts", action="store_true", help="start with contact points shown")
    p.add_argument("--headroom", type=int, default=None,
                   help=f"bodies the drop button can add without reallocating (default max({DROP_HEADROOM}, N/2))")
    p.add_argument("--out", default=None)
    p.add_argument("--frames", type=int, default=None)
    return main_interactive(p.parse_args(list(sys.argv[1:] if argv is None else argv)))


if __name__ == "__main__":
    try:
        sys.exit(viewer_main())
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
