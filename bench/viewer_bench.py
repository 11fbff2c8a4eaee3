"""Viewer speed: frames per second while simulating and rendering offscreen.

    python run.py bench viewer --arch cuda --scene scenes/pile_100k.yaml [--frames 120] [--warmup 30]
                               [--size 1280x720] [--color material|contacts] [--contacts] [--out DIR]

Four loops over the same scene, after `--warmup` untimed frames (kernel compilation, VLA growth), taking turns a
frame each (a landing pile's steps grow slower as its contacts grow: each loop sees the same stretch of it):

* sim: `sim.step_frame()` alone (substeps steps), synchronised: the ceiling the viewer can reach.
* render: the viewer alone on a frozen state: instance-transform kernels + GGUI draw + the frame's end.
* sim+render: both per frame (all substeps).
* paced: the interactive window's loop: each frame runs the steps app.viewer.pacing.FramePacer gives it (the
  camera keeps its frame rate when the simulation is slow), then renders; reports the steps a frame and the
  real-time factor.

Offscreen, GGUI rasterises a frame only when something ends it (`show()` needs a visible window, which presents
instead): the loops end each frame as cheaply as GGUI allows, by copying its depth buffer to a device array
(OffscreenView.finish; no image comes back). A second table splits the render frame: the viewer's kernels and the
frame's copy to the host (update), GGUI's draw calls (declare: each uploads its data), the end (rasterising and
the depth copy), against the end of a frame with nothing declared (empty frame): render minus empty frame is what
drawing the bodies costs. Its last row is the frame declared and read back as an image instead (capture: what
`--headless --render` and `--video` pay a frame).
Results: a table on stdout, and viewer.json / viewer.md in --out when given.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

from app.errors import UserError


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UserError(f"bench viewer: {message}")


def _parser():
    p = _Parser(prog="run.py bench viewer", description=__doc__.split("\n\n")[0])
    p.add_argument("--scene", default=os.path.join("scenes", "pile_100k.yaml"))
    p.add_argument("--arch", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--frames", type=int, default=120, help="timed frames per loop")
    p.add_argument("--warmup", type=int, default=30,
                   help="untimed frames first (kernel compilation; VLA pool growth recompiles while bodies land)")
    p.add_argument("--size", default="1280x720", help="image size WIDTHxHEIGHT")
    p.add_argument("--color", choices=("material", "contacts"), default="material")
    p.add_argument("--contacts", action="store_true", help="also draw contact points and normals")
    p.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE")
    p.add_argument("--out", default=None, help="write viewer.json and viewer.md here")
    return p


def main(argv=None) -> int:
    args = _parser().parse_args(list(argv or []))
    if args.frames < 1 or args.warmup < 0:
        raise UserError("bench viewer: --frames must be >= 1 and --warmup >= 0")
    from app.scene import load_scene
    from app.viewer.display import parse_size, vulkan_icds, vulkan_problem
    from app.viewer.offscreen import OffscreenView

    size = parse_size(args.size)
    problem = vulkan_problem()
    if problem:
        raise UserError(f"bench viewer: {problem}")
    scene = load_scene(args.scene, tuple(args.set))
    from app.runtime import ensure_taichi

    arch = ensure_taichi(args.arch if args.arch != "auto" else scene.sim["arch"])
    from app.viewer.render import SimSource
    from app.sim import Simulation

    from bench.common import device_name, markdown_table, write_results

    sim = Simulation(scene, verbose=False)
    view = OffscreenView(SimSource(sim), scene.camera, size, color_mode=args.color, show_contacts=args.contacts)

    import taichi as ti

    from app.viewer.pacing import FramePacer

    def sim_only():
        sim.step_frame()

    def render_only():
        view.draw()

    def both():
        sim.step_frame()
        view.draw()

    pacer = FramePacer(sim.substeps)
    paced_count = [0]

    def paced():
        # as InteractiveViewer.advance, then its drawing
        n = pacer.steps()
        t0 = time.perf_counter()
        if n:
            sim.step_frame(n)
            ti.sync()
            pacer.stepped(n, (time.perf_counter() - t0) * 1e3)
        t1 = time.perf_counter()
        view.draw()
        ti.sync()
        pacer.drew((time.perf_counter() - t1) * 1e3)
        paced_count[0] += n

    def render_parts(parts):
        t0 = time.perf_counter()
        view.update()
        ti.sync()
        t1 = time.perf_counter()
        view.declare()
        t2 = time.perf_counter()
        view.finish()
        ti.sync()
        t3 = time.perf_counter()
        view.declare(empty=True)
        view.finish()
        ti.sync()
        t4 = time.perf_counter()
        view.declare()
        view.capture()
        t5 = time.perf_counter()
        for key, a, b in (("update", t0, t1), ("declare", t1, t2), ("end", t2, t3), ("empty frame", t3, t4),
                          ("declare + capture", t4, t5)):
            parts.setdefault(key, []).append((b - a) * 1e3)

    for _ in range(args.warmup):
        both()
    # the loops take turns, a frame each, so that each sees the same stretch of the scene's motion (a pile that
    # lands gets more contacts and slower steps as it goes)
    loops = (("sim", sim_only), ("render", render_only), ("sim+render", both), ("paced", paced))
    samples = {name: [] for name, _ in loops}
    sim_advanced = 0.0
    for _ in range(args.frames):
        for name, fn in loops:
            t_sim = sim.sim_time
            t0 = time.perf_counter()
            fn()
            ti.sync()
            samples[name].append((time.perf_counter() - t0) * 1e3)
            if name == "paced":
                sim_advanced += sim.sim_time - t_sim
    rows = []
    for name, _ in loops:
        ms = samples[name]
        row = {"loop": name, "fps": round(1e3 * len(ms) / sum(ms), 2), "ms_median": round(statistics.median(ms), 2),
               "ms_max": round(max(ms), 2)}
        if name == "paced":
            row["steps_per_frame"] = round(paced_count[0] / args.frames, 2)
            row["realtime"] = round(sim_advanced / (sum(ms) * 1e-3), 3)
        rows.append(row)
    sim_ms, both_ms = rows[0]["ms_median"], rows[2]["ms_median"]
    parts = {}
    for _ in range(args.frames):
        render_parts(parts)
    split = [{"part": k, "ms_median": round(statistics.median(v), 2)} for k, v in parts.items()]
    view.close()
    table = markdown_table(rows, [("loop", "loop", "{}"), ("fps", "frames/s", "{:.1f}"),
                                  ("ms_median", "median ms/frame", "{:.2f}"), ("ms_max", "max ms/frame", "{:.2f}"),
                                  ("steps_per_frame", "steps/frame", "{}"), ("realtime", "x real time", "{}")])
    header = (f"viewer bench: {scene.name} ({sim.body_count} bodies, {sim.substeps} substeps/frame), {arch} on "
              f"{device_name(arch)}, {size[0]}x{size[1]} offscreen, colour by {args.color}"
              f"{', contacts drawn' if args.contacts else ''}; {args.frames} frames after {args.warmup} warm-up; "
              f"Vulkan drivers: {', '.join(vulkan_icds()) or 'none found'} (lvp = lavapipe, CPU rasteriser)")
    table += "\n\nWhere a render frame goes (medians):\n\n" + markdown_table(
        split, [("part", "part", "{}"), ("ms_median", "median ms", "{:.2f}")])
    header += f"; frame upload: {view.renderer.frame.path}; sim+render / sim: {both_ms / sim_ms:.2f}"
    payload = {"scene": args.scene, "bodies": sim.body_count, "substeps": sim.substeps, "arch": arch,
               "device": device_name(arch), "size": list(size), "color": args.color, "contacts": args.contacts,
               "frames": args.frames, "warmup": args.warmup, "rows": rows,
               "sim_render_over_sim": round(both_ms / sim_ms, 3), "render_split": split,
               "frame_upload": view.renderer.frame.path, "vulkan_icds": vulkan_icds(),
               "goal": "render <= 5 ms (pile_100k); sim+render within 15% of sim; paced >= 60 fps (default.yaml), "
                       ">= 30 fps (pile_1m)"}
    write_results(args.out, "viewer", payload, header + "\n\n" + table)
    return 0


if __name__ == "__main__":
    import sys

    from app.errors import UserError as _UE

    try:
        sys.exit(main(sys.argv[1:]))
    except _UE as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
