"""`python run.py [SCENE] [--headless] --frames N [--arch auto|cpu|cuda] [--out DIR] [--record] [--set k=v ...]`

With --headless: app.headless.run_headless, outputs in --out (default out/<scene file stem>).
Without: the interactive viewer, app.viewer.interactive.main_interactive(args) (imported only then, so headless runs
never load GGUI). `args` is the argparse namespace: scene, headless, frames, arch, out, record, set.
"""
from __future__ import annotations

import argparse
import os
import sys

from app.errors import UserError

DEFAULT_SCENE = os.path.join("scenes", "default.yaml")
DEFAULT_FRAMES = 240


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit code 2, no traceback (as every UserError)
        raise UserError(f"{message} (usage: python run.py [SCENE] [--headless] --frames N [--arch auto|cpu|cuda] "
                        f"[--out DIR] [--record] [--strict] [--set key.path=value ...])")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="run.py", description="SmolVLA rigid-body simulator")
    p.add_argument("scene", nargs="?", default=DEFAULT_SCENE, help="scene YAML (default scenes/default.yaml)")
    p.add_argument("--headless", action="store_true", help="run without a window and write results to --out")
    p.add_argument("--frames", type=int, default=None, help=f"frames to simulate (default {DEFAULT_FRAMES} headless)")
    p.add_argument("--arch", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto takes CUDA where it exists (default), else CPU")
    p.add_argument("--out", default=None, help="output directory (default out/<scene file stem>)")
    p.add_argument("--record", action="store_true", help="also write trajectory.npz (every frame's poses)")
    p.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="override a scene value, e.g. --set sim.seed=3 --set materials.steel.friction=0.4")
    p.add_argument("--strict", action="store_true",
                   help="stop (exit 1) at a contact deeper than sim.penetration_limit, as at an explosion")
    # offscreen rendering (app/viewer/offscreen.py); GGUI is imported only when one of these is given
    p.add_argument("--render", default=None, metavar="DIR", help="with --headless: write DIR/frame_00000.png ...")
    p.add_argument("--render-every", type=int, default=1, metavar="K", help="render every K-th frame (default 1)")
    p.add_argument("--video", default=None, metavar="FILE.mp4", help="with --headless: encode the frames to an MP4")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.frames is not None and args.frames < 1:
        raise UserError(f"--frames: expected an integer >= 1, got {args.frames}")
    if args.headless:
        from app.headless import default_out_dir, run_headless

        out = args.out or default_out_dir(args.scene)
        on_frame = None
        if args.render or args.video:
            from app.viewer.offscreen import frame_callback

            on_frame = frame_callback(args.render, args.render_every, args.video)
        try:
            m = run_headless(args.scene, args.frames or DEFAULT_FRAMES, out, arch=args.arch, record=args.record,
                             overrides=tuple(args.set), progress=True, on_frame=on_frame, strict=args.strict)
        finally:
            if on_frame is not None:
                on_frame.close()
        after = m["steps_per_second_after_first_frame"]
        rate = f"{m['steps_per_second']:.1f} steps/s"
        if after is not None:  # the first frame carries Taichi's compile: seconds on a CPU
            rate = f"{after:.1f} steps/s after the first frame, which took {m['first_frame_wall_time']:.2f} s " \
                   f"with the kernels' compile"
        print(f"{m['scene']}: {m['bodies']} bodies, {m['steps']} steps in {m['wall_time']:.2f} s "
              f"({rate}, {m['arch']}); contacts final {m['contacts']['final']}, "
              f"max penetration {m['max_penetration'] * 1000:.2f} mm; wrote {out}/")
        return 0
    from app.viewer.interactive import main_interactive

    return int(main_interactive(args) or 0)
