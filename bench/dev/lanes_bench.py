"""Warp lane use of the solver's thread-per-body loops, from a landed pile's contact counts.

    python run.py bench lanes [--scene pile_1m] [--small] [--steps N] [--arch ...]

A warp walks its 32 bodies' contact lists in lockstep, so it lasts as long as its longest list; the share
of lanes doing useful work is sum(n_i) / (32 * sum over warps of max n_i). Computed for the thread orders
the solver could take: grid.body_order (Z-order, what it takes), the same with spheres and boxes in
separate runs, and bodies sorted by count (the bound). A statistic, not a timing: it runs anywhere (the
--small pile on the CPU gives the figure in docs/benchmarks.md, which Nsight Compute's "active threads
per warp" matched on the H200). Landing takes --steps steps (default: until the pile has landed).
"""
import argparse
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the repository


def lane_use(counts: np.ndarray, order: np.ndarray, warp: int = 32) -> float:
    """Share of lanes busy when threads take bodies in `order`, 32 to a warp, each walking counts[body]."""
    c = counts[order]
    c = c[: len(c) // warp * warp].reshape(-1, warp)
    busy = int(c.max(axis=1).sum()) * warp
    return float(c.sum()) / busy if busy else 1.0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="run.py bench lanes", description=__doc__.splitlines()[0])
    p.add_argument("--scene", default="pile_1m", help="scene name in scenes/ (default pile_1m)")
    p.add_argument("--small", action="store_true", help="the bench's CPU-sized version of a pile scene")
    p.add_argument("--steps", type=int, default=None, help="steps before counting (default: until landed)")
    p.add_argument("--arch", choices=("auto", "cpu", "cuda"), default="auto")
    args = p.parse_args(argv)
    from app.errors import UserError

    path = os.path.join(ROOT, "scenes", f"{args.scene}.yaml")
    if not os.path.exists(path):
        raise UserError(f"--scene: no scene {args.scene!r} in scenes/ (expected a file {path})")
    from bench.common import init_taichi
    from bench.sim_bench import SMALL_OVERRIDES, _landing_steps

    overrides = SMALL_OVERRIDES.get(args.scene, ()) if args.small else ()
    arch = init_taichi(args.arch)
    from app.scene import load_scene
    from app.sim import Simulation

    scene = load_scene(path, overrides)
    sim = Simulation(scene, verbose=False)
    steps = _landing_steps(scene) if args.steps is None else args.steps
    for _ in range(steps):
        sim.step()
    n = sim.body_count
    counts = sim.contacts.lengths(n)  # stored order, like body_order
    shape = sim.model.body_shape.to_numpy()[:n]   # stored order
    order = sim.grid.body_order.to_numpy()[:n]
    split = np.concatenate([order[shape[order] == 0], order[shape[order] == 1]])
    rows = [("grid.body_order (Z-order; the solver's)", order), ("spheres, then boxes, each in Z-order", split),
            ("sorted by contact count (bound)", np.argsort(counts, kind="stable"))]
    print(f"{args.scene}{' --small' if args.small else ''}: {n} bodies after {steps} steps ({arch}); contacts per "
          f"body mean {counts.mean():.2f} (spheres {counts[shape == 0].mean():.2f}, boxes "
          f"{counts[shape == 1].mean():.2f}), max {counts.max()}")
    print("| thread order | lanes busy |\n|---|---:|")
    for name, o in rows:
        print(f"| {name} | {100 * lane_use(counts, o):.0f}% |")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    sys.exit(main())
