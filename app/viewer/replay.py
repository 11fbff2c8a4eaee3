"""Replay of a recorded headless run: a window with a timeline, or frames and video rendered offscreen; a preview
image of a run's final state.

    python run.py replay OUT_DIR [--speed S] [--video F.mp4 | --render DIR]
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

import numpy as np

from app.errors import UserError, raise_if_signalled
from app.files import read_json_object, write_named_atomic
from app.scene.schema import SHAPES
from app.viewer.display import (DEFAULT_SIZE, OFFSCREEN_SIZE, SCREENSHOT_DIR, WINDOW_TITLE, ensure_taichi,
                                close_window, has_display, open_window, parse_size, save_png, vulkan_problem)
from app.viewer.offscreen import OffscreenView, VideoWriter


# What a headless run writes (app.headless), as load_out_dir checks it: {array: (shape, dtype kinds)}, N bodies and
# F frames shared between the files.
# Numbers may be integers or floats (a hand-made file may hold [1, 0, 0, 0]); indices must be integers.
STATE_ARRAYS = {"shape": (("N",), "iu"), "half_extents": (("N", 3), "fiu"), "material": (("N",), "iu"),
                "position": (("N", 3), "fiu"), "orientation": (("N", 4), "fiu")}
# ... and what it writes only for some scenes (hull: a convex body's hull, -1 for the other shapes)
STATE_OPTIONAL = {"hull": (("N",), "i")}
TRAJECTORY_ARRAYS = {"time": (("F",), "fiu"), "position": (("F", "N", 3), "fiu"),
                     "orientation": (("F", "N", 4), "fiu")}


def _memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _load_npz(path, arrays, dims, what, optional=None):
    """The arrays `arrays` (STATE_ARRAYS, TRAJECTORY_ARRAYS) of the .npz file `path`, and those of `optional` it
    holds, each of the shape, kind and finiteness given; symbolic sizes agree through `dims`. UserError naming the
    file otherwise."""
    import zipfile
    import zlib

    if not os.path.isfile(path):
        raise UserError(f"{path}: not a regular file (expected the {what} of `python run.py SCENE --headless`)")
    if not zipfile.is_zipfile(path):
        raise UserError(f"{path}: not a .npz file (a zip archive of .npy arrays); expected the {what} of a headless "
                        f"run")
    try:
        with np.load(path, allow_pickle=False) as z:
            missing = [k for k in arrays if k not in z.files]
            arrays = dict(arrays, **{k: v for k, v in (optional or {}).items() if k in z.files})
            if missing:
                raise UserError(f"{path}: no array {missing[0]!r} (expected {', '.join(arrays)}: the {what} of a "
                                f"headless run)")
            for k in arrays:   # sizes from the headers first: a small compressed file may hold a huge array
                with z.zip.open(f"{k}.npy") as fh:
                    major, _ = np.lib.format.read_magic(fh)
                    read_header = (np.lib.format.read_array_header_1_0 if major == 1 else
                                   np.lib.format.read_array_header_2_0)
                    shape, _, dtype = read_header(fh)
                nbytes = int(np.prod(shape, dtype=np.float64)) * dtype.itemsize
                if nbytes > _memory_bytes() // 2:
                    raise UserError(f"{path}: {k} would take {nbytes / 2**30:.1f} GiB, more than half this "
                                    f"machine's memory")
            out = {k: z[k] for k in arrays}
    except UserError:
        raise
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as e:
        reason = str(e).split(".")[0][:100]
        raise UserError(f"{path}: not a readable .npz ({type(e).__name__}: {reason}); expected the {what} of a "
                        f"headless run") from None
    for k, (shape, kinds) in arrays.items():
        a = out[k]
        want = "x".join(str(d) for d in shape)
        if a.dtype.kind not in kinds or a.ndim != len(shape):
            raise UserError(f"{path}: {k} is {a.dtype} of shape {a.shape}; expected {want} "
                            f"{'numbers' if 'f' in kinds else 'integers'}")
        for d, w in zip(a.shape, shape):
            if isinstance(w, str):
                w = dims.setdefault(w, d)
            if d != w:
                raise UserError(f"{path}: {k} has shape {a.shape}; expected {want} with "
                                f"{', '.join(f'{n} = {v}' for n, v in dims.items())}")
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            raise UserError(f"{path}: {k} holds NaN or inf")
    return out


def _scene_of_run(mpath):
    """The scene a run's metrics.json names (scene_path, overrides), or None with a note on stderr: the geometry is
    an extra (floor and walls), the bodies can be drawn without it."""
    if not os.path.isfile(mpath):
        return None
    try:
        m = read_json_object(mpath)
    except (OSError, ValueError) as e:
        print(f"note: {mpath}: unreadable ({e}); drawing bodies without static geometry", file=sys.stderr)
        return None
    sp = m.get("scene_path")
    overrides = m.get("overrides") or []
    if not isinstance(sp, str) or not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
        print(f"note: {mpath}: no scene_path (a string) and overrides (strings); drawing bodies without static "
              f"geometry", file=sys.stderr)
        return None
    if not os.path.isfile(sp):
        print(f"note: {mpath}: its scene {sp} is gone; drawing bodies without static geometry", file=sys.stderr)
        return None
    from app.scene import load_scene

    try:
        return load_scene(sp, tuple(overrides))
    except UserError as e:
        print(f"note: scene not reloaded ({e}); drawing bodies without static geometry", file=sys.stderr)
        return None


def load_out_dir(out_dir):
    """(shapes dict, final poses, trajectory or None, scene or None) from a headless run's output directory, every
    array checked (shape, dtype, finite; body and frame counts agree). The scene (for static geometry and camera) is
    reloaded from metrics.json's scene_path when it exists."""
    if not os.path.isdir(out_dir):
        raise UserError(f"{out_dir}: not a directory (expected the --out directory of a headless run)")
    state_path = os.path.join(out_dir, "state.npz")
    if not os.path.exists(state_path):
        raise UserError(f"{out_dir}: no state.npz (expected the --out directory of `python run.py SCENE --headless`)")
    dims = {}
    st = _load_npz(state_path, STATE_ARRAYS, dims, "state.npz", STATE_OPTIONAL)
    if dims["N"] == 0:
        raise UserError(f"{state_path}: no bodies")
    if not np.isin(st["shape"], list(SHAPES.values())).all() or (st["material"] < 0).any() or \
            (st["half_extents"] < 0).any():
        raise UserError(f"{state_path}: shape must be one of " + ", ".join(f"{v} ({k})" for k, v in SHAPES.items())
                        + "; material >= 0, half_extents >= 0")
    shapes = {k: st[k] for k in ("shape", "half_extents", "material")}
    if "hull" in st:   # (a convex body's hull in the scene's hulls; kept when the scene reloads, see below)
        shapes["hull"] = st["hull"]
    final = (st["position"], st["orientation"])
    traj = None
    tpath = os.path.join(out_dir, "trajectory.npz")
    if os.path.exists(tpath):
        traj = _load_npz(tpath, TRAJECTORY_ARRAYS, dims, "trajectory.npz (--record)")
        traj["time"] = traj["time"].astype(np.float64)
        if dims["F"] == 0 or (np.diff(traj["time"]) < 0).any():
            raise UserError(f"{tpath}: time must hold one or more frames in increasing order")
    scene = _scene_of_run(os.path.join(out_dir, "metrics.json"))
    convex = np.asarray(shapes["shape"]) == SHAPES["convex"]
    if convex.any():
        hull = np.asarray(shapes.get("hull", np.full(len(convex), -1)))
        if scene is None or not np.array_equal(scene.bodies["hull"], hull) or not len(scene.hulls):
            print(f"note: {state_path}: the scene's convex hulls are not those of the run; drawing convex bodies as "
                  f"their bounding boxes", file=sys.stderr)
            shapes.pop("hull", None)
        else:
            shapes["hulls"] = scene.hulls
    if scene is not None and int(st["material"].max()) >= len(scene.materials):
        print(f"note: {state_path}: material {int(st['material'].max())} is not in the scene's "
              f"{len(scene.materials)} materials; drawing bodies without the scene", file=sys.stderr)
        scene = None
    return shapes, final, traj, scene


def render_state_preview(out_dir, png_path, size=OFFSCREEN_SIZE):
    """Render the final state of a headless run (out_dir/state.npz) to a PNG; returns the path."""
    from app.viewer.render import PoseSource

    shapes, (pos, quat), _, scene = load_out_dir(out_dir)
    src = PoseSource(shapes, scene.statics if scene else (), [m["name"] for m in scene.materials] if scene else None)
    src.set_poses(pos, quat)
    view = OffscreenView(src, scene.camera if scene else None, size)
    try:
        save_png(png_path, view.render())
    finally:
        view.close()
    return png_path


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
    if not (args.speed > 0 and math.isfinite(args.speed)):
        raise UserError(f"replay --speed: expected a number > 0, got {args.speed}")
    if args.render_every < 1:
        raise UserError(f"replay --render-every: expected an integer >= 1, got {args.render_every}")
    offscreen = bool(args.video or args.render)
    if not offscreen and not has_display():
        raise UserError("replay: no display found ($DISPLAY is not set); render the trajectory instead with "
                        "--video FILE.mp4 or --render DIR")
    problem = vulkan_problem()
    if problem:
        raise UserError(problem)
    ensure_taichi(args.arch)
    from app.viewer.render import PoseSource

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
                save_png(os.path.join(args.render, f"frame_{images:05d}.png"), rgb)
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

        from app.viewer.render import BACKGROUND, Renderer, apply_camera, camera_spec, view_of

        times = self.traj["time"]
        last = len(times) - 1
        window = open_window(f"{WINDOW_TITLE} - replay", self.size, show_window=True)
        try:
            renderer = Renderer(self.source, aspect=self.size[0] / self.size[1])
            camera = ti.ui.Camera()
            lo, hi = renderer.scene_bounds()
            spec = camera_spec(self.scene_camera, lo, hi, self.size[0] / self.size[1])
            apply_camera(camera, spec, renderer.extent)
            canvas, scene, gui = window.get_canvas(), window.get_scene(), window.get_gui()
            prev = time.perf_counter()
            shots = 0
            while window.running:
                raise_if_signalled()   # (a Ctrl-C whose exception Python swallowed: app.errors)
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
                renderer.update(view_of(camera, spec["fov"], window.get_window_shape()))
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
                    write_named_atomic(path, window.save_image)
                    shots += 1
                    print(f"screenshot: {path}", flush=True)
                window.show()
        finally:
            close_window(window)
        return 0
