"""The interactive viewer: a GGUI window on a running simulation, its keys and its panel.

    python run.py [SCENE]                        the window (app.cli -> main_interactive)
    python -m app.viewer [SCENE] [--size WxH] [--screenshot-dir DIR] ...   the window with viewer-only options

The viewer is a plug-in: it reads the simulation's fields (app.viewer.render) and calls the Simulation's public
methods (step_frame, reset, add_bodies, set_gravity, set_material, and the dt / solver_iterations attributes);
the simulation never imports it.
"""
from __future__ import annotations

import argparse
import glob
import json
import math
import os
import sys
import time

import numpy as np

from app.errors import UserError, raise_if_signalled
from app.files import write_named_atomic, write_text_atomic
from app.scene.schema import SHAPES, quat_matrices
from app.viewer.display import (COLOR_MODES, DEFAULT_SIZE, SCREENSHOT_DIR, WINDOW_TITLE, close_window, ensure_taichi,
                                fmt_bytes, has_display, open_window, parse_size, vulkan_problem)
from app.viewer.pacing import FramePacer

SHAPE_NAMES = {v: k for k, v in SHAPES.items()}

DROP_HEADROOM = 4096           # bodies the window can add before the simulation's fields must grow
PREVIEW_SIM_SECONDS = 1.0      # no display: simulated time of the headless preview run (a few s on a laptop)


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
    ensure_taichi(getattr(args, "arch", "auto"), scene.sim["arch"], scene, scene.body_count + headroom)
    from app.sim import Simulation

    sim = Simulation(scene, capacity=scene.body_count + headroom)
    sim.strict = bool(getattr(args, "strict", False))
    size = parse_size(args.size) if getattr(args, "size", None) else DEFAULT_SIZE
    viewer = InteractiveViewer(sim, size=size, screenshot_dir=getattr(args, "screenshot_dir", None) or SCREENSHOT_DIR,
                               color_mode=getattr(args, "color", None) or "material",
                               show_contacts=bool(getattr(args, "contacts", False)))
    return viewer.run()


def _headless_preview(args) -> int:
    """No display: run the scene headless for PREVIEW_SIM_SECONDS, write metrics and a preview PNG, exit 0."""
    from app.headless import default_out_dir, run_headless
    from app.scene import load_scene
    from app.viewer.replay import render_state_preview

    overrides = tuple(getattr(args, "set", None) or ())
    scene = load_scene(args.scene, overrides)
    frame_s = scene.sim["dt"] * scene.sim["substeps"]
    frames = getattr(args, "frames", None) or max(1, int(math.ceil(PREVIEW_SIM_SECONDS / frame_s)))
    out = getattr(args, "out", None) or default_out_dir(args.scene)
    print(f"no display found ($DISPLAY is not set): running headless instead: {args.scene}, {frames} frames "
          f"({frames * frame_s:.2f} s simulated), then a preview image in {out}/", file=sys.stderr)
    m = run_headless(args.scene, frames, out, arch=getattr(args, "arch", "auto"), overrides=overrides, progress=True,
                     strict=bool(getattr(args, "strict", False)))
    print(f"{m['scene']}: {m['bodies']} bodies, {m['frames']} frames in {m['wall_time']:.2f} s "
          f"({m['steps_per_second']:.1f} steps/s, {m['arch']}); contacts final {m['contacts']['final']}")
    problem = vulkan_problem()
    if problem:
        print(f"wrote {out}/metrics.json and state.npz; no preview image: {problem}", file=sys.stderr)
        return 0
    png = render_state_preview(out, os.path.join(out, "preview.png"))
    print(f"wrote {out}/metrics.json, state.npz and {png} (open a display to get the interactive viewer)")
    return 0


# Frames per second of the videos the v key records (one video frame per window frame).
RECORD_FPS = 30
# The panel's width in pixels: its longest slider label, "solver iterations", fits, also beside the scroll bar
# that a window too short for the whole panel gives it.
PANEL_WIDTH_PX = 420.0


class InteractiveViewer:
    """The window loop. Keys: space pause, n step one frame, r reset, c contacts on/off, m colour by
    material / contacts / sleep / speed, f fix / free the picked body, v record an MP4, p screenshot, h panel on/off, Esc quit; right mouse drag looks around, WASD/QE move.
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
        self.recorder = None   # while the v key records: an app.viewer.offscreen.VideoWriter
        self.selected = None   # scene index of the body picked with the mouse (app.viewer.picking)
        self._grab = None      # while dragging: (grab point in the body frame, plane point, plane normal)
        self._lmb = False
        self._camera_spec = None   # (position, lookat, up, fov) of the camera this frame
        self.frame_steps = 0
        self.pacer = FramePacer(sim.substeps)   # steps per frame; step and drawing times (moving averages)
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
        self.selected = None
        self._grab = None

    def drop_bodies(self, count: int):
        """Drop `count` bodies above the scene (spheres, boxes and capsules in turn, the scene's median size, the
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
            q = rng.normal(size=4)
            q = (q / np.linalg.norm(q)).tolist()
            if k % 3 == 0:
                bodies.append({"shape": "sphere", "radius": size, "position": p, "material": mat})
            elif k % 3 == 1:
                bodies.append({"shape": "box", "half_extents": [size] * 3, "position": p, "orientation": q,
                               "material": mat})
            else:   # (bounding radius 1.6 size, inside the box's sqrt(3) size the spacing is made for)
                bodies.append({"shape": "capsule", "radius": 0.6 * size, "half_length": size, "position": p,
                               "orientation": q, "material": mat})
        sim.add_bodies(bodies)

    def advance(self):
        """One frame of simulation: the steps the pacer gives this frame while playing (app.viewer.pacing: the
        window keeps its frame rate when the simulation is slow; the panel shows the real-time factor), possibly
        none. The n key always steps a whole frame."""
        import taichi as ti

        from app.sim import SimulationError

        steps = self.sim.substeps
        if self.playing and not self.step_requested:
            steps = self.pacer.steps()
        self.frame_steps = steps
        if steps == 0:
            return
        t0 = time.perf_counter()
        try:
            self.sim.step_frame(steps)
        except SimulationError as e:
            self.error = str(e)
            self.playing = False
            print(f"error: {e} (paused; press r to reset)", file=sys.stderr)
            return
        ti.sync()
        self.pacer.stepped(steps, (time.perf_counter() - t0) * 1e3)
        self.frames += 1

    def screenshot(self, window) -> str:
        n = len(glob.glob(os.path.join(self.screenshot_dir, "screenshot_*.png")))
        path = os.path.join(self.screenshot_dir, f"screenshot_{n:03d}.png")
        os.makedirs(self.screenshot_dir, exist_ok=True)
        write_named_atomic(path, window.save_image)
        meta = {"image": path, "step": self.sim.step_count, "frame": self.frames, "sim_time": self.sim.sim_time,
                "paused": not self.playing, "bodies": self.sim.body_count, "color_mode": self.color_mode,
                "show_contacts": self.show_contacts, "scene": self.sim.scene.path, "selected": self.selected,
                "dragging": self._grab is not None, "size": list(self.size)}
        if self._camera_spec is not None:
            meta["camera"] = dict(zip(("position", "lookat", "up", "fov"), self._camera_spec))
        if self.sim.body_count <= 1000:
            meta["positions"] = self.sim.positions().tolist()
        write_text_atomic(path[:-4] + ".json", json.dumps(meta))
        self.screenshots.append(path)
        print(f"screenshot: {path}", flush=True)
        return path

    def toggle_recording(self):
        """Start recording what the window shows to screenshot_dir/recording_NNN.mp4 (H.264, 30 frames/s), or stop
        and finish the file."""
        from app.viewer.offscreen import VideoWriter

        if self.recorder is not None:
            self.recorder.close()
            print(f"recorded: {self.recorder.path} ({self.recorder.frames} frames)", flush=True)
            self.recorder = None
            return
        n = len(glob.glob(os.path.join(self.screenshot_dir, "recording_*.mp4")))
        self.recorder = VideoWriter(os.path.join(self.screenshot_dir, f"recording_{n:03d}.mp4"), RECORD_FPS)

    # ------------------------------------------------------------------ mouse: pick and drag
    def _mouse(self, window, panel_width):
        """Left button: pick the body under the cursor (outside the panel) and drag it while held; release throws
        it (app.viewer.picking)."""
        import taichi as ti

        from app.viewer import picking

        down = window.is_pressed(ti.ui.LMB)
        cx, cy = window.get_cursor_pos()
        pressed, self._lmb = down and not self._lmb, down
        if self._camera_spec is None:
            return
        pos, look, up, fov = self._camera_spec
        o, d = picking.cursor_ray(pos, look, up, fov, self.size[0] / self.size[1], cx, cy)
        sim = self.sim
        if pressed and not (self.show_panel and cx < 0.01 + panel_width and cy > 0.14):
            shapes = sim.shapes()
            b, s = picking.pick(o, d, sim.positions(), sim.orientations(), shapes["shape"], shapes["half_extents"],
                                shapes["hull"], sim.hulls())
            self.selected = b
            if b is not None:
                hit = o + s * d
                R = quat_matrices(sim.orientations()[b:b + 1])[0]
                self._grab = (R.T @ (hit - sim.positions()[b]), hit, -d)
        if self._grab is not None and not down:
            sim.set_external_force(None)
            self._grab = None
        if self._grab is not None and self.selected is not None:
            local, p0, normal = self._grab
            target = picking.plane_point(o, d, p0, normal)
            k = int(sim.internal_of[self.selected])
            c = np.asarray(sim.state.body_pos[k], np.float64)
            R = quat_matrices(np.asarray(sim.state.body_quat[k], np.float64)[None])[0]
            grab = c + R @ local
            v = np.asarray(sim.state.body_vel[k], np.float64) + np.cross(np.asarray(sim.state.body_omega[k]), grab - c)
            if target is not None:
                mass = float(sim.builder.bodies["mass"][self.selected])
                g = np.asarray(sim.model.gravity[None], np.float64)
                sim.set_external_force(self.selected, picking.drag_force(mass, grab, v, target, g), point=grab)

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
            elif key == "m":   # material -> contacts -> sleep -> speed -> material
                self.color_mode = COLOR_MODES[(COLOR_MODES.index(self.color_mode) + 1) % len(COLOR_MODES)]
            elif key == "p":
                self.screenshot_requested = True
            elif key == "h":
                self.show_panel = not self.show_panel
            elif key == "v":
                self.toggle_recording()
            elif key == "f" and self.selected is not None and self.selected < self.sim.body_count:
                fixed = bool(self.sim.builder.bodies["fixed"][self.selected])
                self.sim.set_fixed(self.selected, not fixed)

    def _panel(self, window):
        gui = window.get_gui()
        sim = self.sim
        width = min(0.5, PANEL_WIDTH_PX / self.size[0])
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
            step_ms = self.pacer.step_ms
            g.text(f"{self.fps:5.1f} fps   {step_ms:6.2f} ms / step")
            steps = self.frame_steps
            realtime = self.pacer.realtime if self.playing else 0.0
            g.text(f"frame: sim {step_ms * steps:5.1f} ms ({steps}/{sim.substeps} steps)   "
                   f"draw {self.pacer.draw_ms:5.1f} ms")
            g.text(f"x{realtime:.2f} real time")
            g.text(f"t = {sim.sim_time:.3f} s   step {sim.step_count}")
            g.text(f"bodies {sim.body_count}   contacts {int(sim.diagnostics.contact_total[None])}")
            if self.selected is not None and self.selected < sim.body_count:
                b = self.selected
                k = int(sim.internal_of[b])
                shape = SHAPE_NAMES[int(sim.model.body_shape[k])]
                speed = float(np.linalg.norm(np.asarray(sim.state.body_vel[k])))
                fixed = bool(sim.builder.bodies["fixed"][b])
                g.text(f"body {b}: {shape}, {float(sim.builder.bodies['mass'][b]):.3g} kg, {speed:.2f} m/s"
                       + ("  fixed (f frees)" if fixed else "  (f fixes)")
                       + ("  dragging" if self._grab is not None else ""))
            live, reserved = self._mem
            g.text(f"{sim.contacts_kind} memory: live {fmt_bytes(live)} / reserved {fmt_bytes(reserved)}")
            if self.error:
                g.text("exploded: press r to reset", color=(1.0, 0.4, 0.3))
            if self.recorder is not None:
                g.text(f"recording {os.path.basename(self.recorder.path)} (v stops)", color=(1.0, 0.4, 0.3))
            self.show_contacts = g.checkbox("contact points (c)", self.show_contacts)
            by_contacts = g.checkbox("colour by contacts (m)", self.color_mode == "contacts")
            by_sleep = g.checkbox("colour asleep / awake (m)", self.color_mode == "sleep")
            by_speed = g.checkbox("colour by speed (m)", self.color_mode == "speed")
            if by_contacts != (self.color_mode == "contacts"):
                self.color_mode = "contacts" if by_contacts else "material"
            elif by_sleep != (self.color_mode == "sleep"):
                self.color_mode = "sleep" if by_sleep else "material"
            elif by_speed != (self.color_mode == "speed"):
                self.color_mode = "speed" if by_speed else "material"
            gy = float(sim.model.gravity[None][1])
            ngy = g.slider_float("gravity y", gy, -20.0, 0.0)
            if ngy != gy:
                gv = sim.model.gravity[None]
                sim.set_gravity([float(gv[0]), ngy, float(gv[2])])
            dt = g.slider_float("dt (s)", sim.dt, 0.0002, 0.01)
            iterations = g.slider_int("solver iterations", sim.solver_iterations, 1, 60)
            if dt != sim.dt or iterations != sim.solver_iterations:   # (a change wakes sleeping bodies)
                sim.dt, sim.solver_iterations = dt, iterations
                sim.wake()
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

        from app.viewer.render import (BACKGROUND, Renderer, SimSource, apply_camera, camera_spec, image_rgb8,
                                        view_of)

        sim = self.sim
        window = open_window(f"{WINDOW_TITLE} - {sim.scene.name}", self.size, show_window=True)
        try:
            renderer = Renderer(SimSource(sim), aspect=self.size[0] / self.size[1], color_mode=self.color_mode,
                                show_contacts=self.show_contacts)
            camera = ti.ui.Camera()
            lo, hi = renderer.scene_bounds()
            spec = camera_spec(sim.scene.camera, lo, hi, self.size[0] / self.size[1])
            apply_camera(camera, spec, renderer.extent)
            speed = 0.01 * renderer.extent
            canvas = window.get_canvas()
            scene = window.get_scene()
            announced = False
            while window.running and not self.quit:
                raise_if_signalled()   # (a Ctrl-C whose exception Python swallowed: app.errors)
                self._events(window)
                if self.quit:
                    break
                camera.track_user_inputs(window, movement_speed=speed, hold_key=ti.ui.RMB)
                self._camera_spec = (tuple(camera.curr_position), tuple(camera.curr_lookat), tuple(camera.curr_up),
                                     spec["fov"])
                self._mouse(window, min(0.5, PANEL_WIDTH_PX / self.size[0]))
                t_sim = sim.sim_time
                if self.playing or self.step_requested:
                    if self.error is None:
                        self.advance()
                    self.step_requested = False
                t_draw = time.perf_counter()
                renderer.set_color_mode(self.color_mode)
                renderer.show_contacts = self.show_contacts
                renderer.highlight = int(sim.internal_of[self.selected]) \
                    if self.selected is not None and self.selected < sim.body_count else -1
                renderer.update(view_of(camera, spec["fov"], window.get_window_shape()))
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
                if self.recorder is not None:   # (whole 16-pixel blocks: H.264's macroblocks)
                    img = image_rgb8(window)
                    self.recorder.append(img[:img.shape[0] // 16 * 16, :img.shape[1] // 16 * 16])
                window.show()
                self.pacer.drew((time.perf_counter() - t_draw) * 1e3)
                dt = now - self._last
                self._last = now
                if self.playing:
                    self.pacer.frame_done(sim.sim_time - t_sim, dt)
                if dt > 0:
                    self.fps = 1.0 / dt if self.fps == 0 else 0.9 * self.fps + 0.1 / dt
                if not announced:
                    print("viewer ready", flush=True)
                    announced = True
        finally:
            if self.recorder is not None:   # (a recording still running is finished, not lost)
                self.toggle_recording()
            close_window(window)
        return 0


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
    p.add_argument("--color", choices=COLOR_MODES, default="material")
    p.add_argument("--contacts", action="store_true", help="start with contact points shown")
    p.add_argument("--headroom", type=int, default=None,
                   help=f"bodies the drop button can add without reallocating (default max({DROP_HEADROOM}, N/2))")
    p.add_argument("--out", default=None)
    p.add_argument("--frames", type=int, default=None)
    return main_interactive(p.parse_args(list(sys.argv[1:] if argv is None else argv)))
