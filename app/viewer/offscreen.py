"""Offscreen rendering: frames and video of a running simulation.

    python run.py [SCENE] --headless --render DIR [--render-every K] [--video FILE.mp4]
"""
from __future__ import annotations

import os

import numpy as np

from app.errors import UserError
from app.files import temporary_name
from app.viewer.display import OFFSCREEN_SIZE, WINDOW_TITLE, close_window, open_window, save_png, vulkan_problem


class OffscreenView:
    """An invisible window + renderer + camera for one source. render() draws a fresh frame and returns it as
    (H, W, 3) uint8 (each capture ends GGUI's frame, so every call draws again); draw() draws one without reading
    it back (what a window's frame costs, for `bench viewer`)."""

    def __init__(self, source, scene_camera=None, size=OFFSCREEN_SIZE, color_mode="material", show_contacts=False):
        import taichi as ti

        from app.viewer.render import Renderer, apply_camera, camera_spec

        self.size = tuple(int(x) for x in size)
        self.window = open_window(WINDOW_TITLE, self.size, show_window=False)
        self.renderer = Renderer(source, aspect=self.size[0] / self.size[1], color_mode=color_mode, show_contacts=show_contacts)
        self.camera = ti.ui.Camera()
        lo, hi = self.renderer.scene_bounds()
        self.camera_spec = camera_spec(scene_camera, lo, hi, self.size[0] / self.size[1])
        apply_camera(self.camera, self.camera_spec, self.renderer.extent)
        self._depth = None   # finish()'s target, made at its first call

    def render(self) -> np.ndarray:
        self.update()
        self.declare()
        return self.capture()

    # render()'s three parts, timed apart by `bench viewer`
    def update(self):
        """The renderer's kernels (culling bodies no pixel sees) and the frame's copy to the host."""
        from app.viewer.render import view_of

        self.renderer.update(view_of(self.camera, self.camera_spec["fov"], self.size))

    def declare(self, empty=False):
        """The frame's GGUI draws (each uploads its data to the renderer); empty: the background alone."""
        from app.viewer.render import BACKGROUND

        canvas = self.window.get_canvas()
        canvas.set_background_color(BACKGROUND)
        if not empty:
            scene = self.window.get_scene()
            self.renderer.draw(scene, self.camera)
            canvas.scene(scene)

    def capture(self) -> np.ndarray:
        """Rasterise the declared frame and read it back as (H, W, 3) uint8; ends the frame."""
        from app.viewer.render import image_rgb8

        return image_rgb8(self.window)

    def draw(self):
        """update(), declare() and finish(): a frame drawn and ended without its image."""
        self.update()
        self.declare()
        self.finish()

    def finish(self):
        """Rasterise the declared frame and end it without reading the image back. GGUI 1.7.4 rasterises an
        offscreen frame only when something ends it (show() needs a visible window); copying the depth buffer
        into a device array is the cheapest end it offers (`python run.py bench frame-end`: 0.61x the image's
        read-back for 100k particles on an H100), the nearest to a window's present."""
        if self._depth is None:
            from taichi.ui.staging_buffer import get_depth_ndarray

            self._depth = get_depth_ndarray(self.window.window)
        self.window.window.copy_depth_buffer_to_ndarray(self._depth.arr)

    def close(self):
        close_window(self.window)


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
        # written under a hidden name and renamed when closed: the file at `path` is always a whole video
        self._tmp = temporary_name(path)
        self._writer = imageio.get_writer(str(self._tmp), fps=float(fps), codec="libx264", quality=7,
                                          macro_block_size=16, ffmpeg_log_level="error", pixelformat="yuv420p")

    def append(self, rgb):
        self._writer.append_data(rgb)
        self.frames += 1

    def close(self):
        """Finish the video and put it in place (a video of the frames so far, when a run stopped early)."""
        if self._writer is None:
            return
        try:
            self._writer.close()
            os.replace(self._tmp, self.path)
        except OSError as e:
            raise UserError(f"--video {self.path}: cannot write ({e.strerror or e})") from None
        finally:
            self._writer = None
            if os.path.exists(self._tmp):
                os.remove(self._tmp)


class FrameRecorder:
    """Offscreen frames of a running simulation: call it after each sim.step_frame() with the frame index.

        rec = FrameRecorder(sim, render_dir="out/frames", render_every=2, video="out/run.mp4")
        for f in range(frames): sim.step_frame(); rec(sim, f)
        rec.close()

    Writes render_dir/frame_00000.png, frame_00001.png, ... (numbered by image, not by simulation frame) and/or
    an MP4 whose frame rate plays the simulation in real time (capped at 60 fps). Works without a display.
    """

    def __init__(self, sim, render_dir=None, render_every=1, video=None, size=OFFSCREEN_SIZE, color_mode="material"):
        from app.viewer.render import SimSource

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
            save_png(os.path.join(self.render_dir, f"frame_{self.images:05d}.png"), rgb)
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
