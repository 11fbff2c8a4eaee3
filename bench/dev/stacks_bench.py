"""Solver convergence on stacks: how far a heavy box sinks into the light ones under it, and how much a column of
boxes sags, at the scene's dt and solver iterations.

    python run.py bench stacks [--arch auto|cpu|cuda] [--iterations N] [--seconds S] [--out DIR]

Cases (0.5 m boxes on a floor, friction 0.6, no restitution), each with sleeping on (the default) and off:
  heavy 100:1, heavy 1000:1   three stacked boxes, the top one 100 (1000) times as dense as the two below it
  ... shifted 1 cm            the same, each box 1 cm further along x than the one under it (a stable stack: the
                              centres of mass lie far inside the supports)
  column 20                   twenty 0.2 m boxes in a column
Reported: the top box's largest sink below its start over the run (sampled every 0.1 s), its sink at the end, and
the fastest body at the end. The tests hold the 100:1 stack to < 5 mm (tests/sim/test_physics.py).
"""
import argparse

import numpy as np

from bench.common import markdown_table, write_results

CASES = ("heavy 100:1", "heavy 1000:1", "heavy 100:1 shifted 1 cm", "heavy 1000:1 shifted 1 cm", "column 20")


def _scene(case: str, sleep_speed: float, iterations: int):
    if case.startswith("heavy"):
        ratio = 100 if "100:1" in case else 1000
        shift = 0.01 if "shifted" in case else 0.0
        h = 0.25
        mats = {"light": {"density": 10, "friction": 0.6, "restitution": 0.0},
                "heavy": {"density": 10 * ratio, "friction": 0.6, "restitution": 0.0}}
        bodies = [{"shape": "box", "half_extents": [h, h, h], "position": [shift * k, h + 2 * h * k, 0],
                   "material": "heavy" if k == 2 else "light"} for k in range(3)]
    else:
        h = 0.1
        mats = {"light": {"density": 1000, "friction": 0.6, "restitution": 0.0}}
        bodies = [{"shape": "box", "half_extents": [h, h, h], "position": [0, h + 2 * h * k, 0], "material": "light"}
                  for k in range(20)]
    return {"name": case, "materials": mats, "bodies": bodies,
            "sim": {"dt": 0.002, "substeps": 1, "sleep_speed": sleep_speed, "solver_iterations": iterations},
            "static": [{"type": "plane", "normal": [0, 1, 0], "offset": 0, "material": "light"}]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="run.py bench stacks", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--iterations", type=int, default=10, help="sim.solver_iterations (default 10, the scenes')")
    p.add_argument("--seconds", type=float, default=3.0, help="simulated time per case (default 3)")
    p.add_argument("--out", default=None, help="directory for stacks_bench.json / stacks_bench.md")
    args = p.parse_args(argv)
    from app.errors import UserError

    if args.iterations < 1 or not args.seconds > 0:
        raise UserError("bench stacks: expected --iterations >= 1 and --seconds > 0")
    from app.runtime import ensure_taichi
    from app.scene import scene_from_dict
    from app.sim import Simulation

    arch = ensure_taichi(args.arch, verbose=True)
    rows, sim = [], None
    for case in CASES:
        for sleep_speed in (0.05, 0.0):
            scene = scene_from_dict(_scene(case, sleep_speed, args.iterations))
            if sim is None:
                sim = Simulation(scene, capacity=64)
            else:
                sim.load(scene)
            top = sim.body_count - 1
            y0 = float(sim.positions()[top, 1])
            worst = 0.0
            samples = max(1, int(round(args.seconds / 0.1)))
            for _ in range(samples):
                for _ in range(int(round(0.1 / sim.dt))):
                    sim.step()
                worst = max(worst, y0 - float(sim.positions()[top, 1]))
            sim.check()
            rows.append({"case": case, "sleeping": "on" if sleep_speed > 0 else "off",
                         "max_sink_mm": 1000 * worst, "end_sink_mm": 1000 * (y0 - float(sim.positions()[top, 1])),
                         "end_speed": float(np.abs(sim.velocities()).max())})
            print(f"{case:26s} sleeping {rows[-1]['sleeping']:3s}  sink max {rows[-1]['max_sink_mm']:8.2f} mm  "
                  f"end {rows[-1]['end_sink_mm']:8.2f} mm  fastest {rows[-1]['end_speed']:.2e} m/s", flush=True)
    md = (f"Stacks, {args.iterations} solver iterations, dt 2 ms, {args.seconds:g} s each ({arch})\n\n"
          + markdown_table(rows, [("case", "case", "{}"), ("sleeping", "sleeping", "{}"),
                                  ("max_sink_mm", "top box sink, largest (mm)", "{:.2f}"),
                                  ("end_sink_mm", "at the end (mm)", "{:.2f}"),
                                  ("end_speed", "fastest body at the end (m/s)", "{:.2e}")]))
    write_results(args.out, "stacks_bench", {"arch": arch, "iterations": args.iterations, "rows": rows}, md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
