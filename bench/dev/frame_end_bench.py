"""What ending an offscreen GGUI frame costs: reading the image back against copying the depth buffer.

    python run.py bench frame-end [--arch cuda] [--particles 100000] [--frames 30] [--size 1280x720]

Offscreen, GGUI 1.7.4 rasterises a frame only when something ends it (`window.show()` needs a visible window), so
`bench viewer` ends each one with `get_image_buffer_as_numpy()`: the image's read-back to the host and its float
conversion, about 12 ms of an empty frame on the H100. Copying the depth buffer into a Taichi ndarray
(`copy_depth_buffer_to_ndarray`, GGUI's path to CUDA and CPU arrays) also draws and ends the frame, without the
colour read-back. This times both on the same frame (`--particles` random particles, one draw), alternating, and
prints ms a frame for each and their ratio. Whether the depth path works at all on CUDA is part of the question.
"""
import argparse
import sys
import time


def _parse_size(text):
    from app.errors import UserError

    try:
        w, h = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise UserError(f"--size: expected WxH such as 1280x720, got {text!r}") from None
    if w < 16 or h < 16:
        raise UserError(f"--size: expected at least 16x16, got {text!r}")
    return w, h


def main(argv=None) -> int:
    from app.errors import UserError

    p = argparse.ArgumentParser(prog="run.py bench frame-end", description=__doc__.splitlines()[0])
    p.add_argument("--arch", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--particles", type=int, default=100_000)
    p.add_argument("--frames", type=int, default=30, help="timed frames per method and round")
    p.add_argument("--size", default="1280x720")
    args = p.parse_args(argv)
    if args.particles < 1 or args.frames < 1:
        raise UserError("--particles and --frames: expected positive integers")
    size = _parse_size(args.size)

    import taichi as ti

    from app.runtime import init_taichi
    from app.viewer.display import close_window, open_window

    arch = init_taichi(args.arch, cuda_options={"log_level": ti.WARN}, cpu_options={"log_level": ti.WARN})
    from taichi.ui.staging_buffer import get_depth_ndarray

    window = open_window("frame-end", size, show_window=False)
    pos = ti.Vector.field(3, ti.f32, shape=args.particles)

    @ti.kernel
    def fill():
        for i in pos:
            pos[i] = ti.Vector([ti.random(), ti.random(), ti.random()]) * 2.0 - 1.0

    fill()
    camera = ti.ui.Camera()
    camera.position(0.0, 0.0, 4.0)
    camera.lookat(0.0, 0.0, 0.0)
    depth = get_depth_ndarray(window.window)

    def declare():
        canvas = window.get_canvas()
        canvas.set_background_color((0.1, 0.1, 0.1))
        scene = window.get_scene()
        scene.set_camera(camera)
        scene.ambient_light((0.5, 0.5, 0.5))
        scene.point_light((2.0, 2.0, 2.0), (1.0, 1.0, 1.0))
        scene.particles(pos, radius=0.01, color=(0.8, 0.3, 0.2))
        canvas.scene(scene)

    ends = {"image read-back": lambda: window.get_image_buffer_as_numpy(),
            "depth copy": lambda: window.window.copy_depth_buffer_to_ndarray(depth.arr)}
    times = {name: [] for name in ends}
    try:
        for rnd in range(3):   # the first round warms up (shaders, staging buffers), the others are kept
            for name, end in ends.items():
                ti.sync()
                t0 = time.perf_counter()
                for _ in range(args.frames):
                    declare()
                    end()
                ti.sync()
                if rnd > 0:
                    times[name].append(1e3 * (time.perf_counter() - t0) / args.frames)
    finally:
        close_window(window)
    ms = {name: min(v) for name, v in times.items()}
    print(f"arch {arch}, {args.particles} particles, {size[0]}x{size[1]}, best of 2 rounds of {args.frames} frames",
          file=sys.stderr)
    for name, v in ms.items():
        print(f"{name:16s} {v:8.2f} ms/frame")
    print(f"depth copy / image read-back: {ms['depth copy'] / ms['image read-back']:.2f}")
    return 0
