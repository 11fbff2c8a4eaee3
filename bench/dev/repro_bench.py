"""Run-to-run reproducibility: one scene simulated three times in one process, compared bit for bit.

    python run.py bench repro [SCENE] [--steps N] [--arch auto|cpu|cuda] [--out DIR]

Runs the scene for N steps in a Simulation, again in a second Simulation, and again in the first after
reset(); reports the largest position and velocity difference of each rerun from the first run, and the
contact counts. The solver's sums are order-independent (app.sim.solver.FIXED_ONE), so with the app's Taichi
options (app.runtime.TAICHI_OPTIONS: no fast math) the three runs should agree to the bit whatever order the
threads appended contacts in. A pile amplifies any difference, so this is a sensitive check: under fast math
scenes/default.yaml's reruns on an H200 ended 0.42-0.48 m apart after 600 steps.
"""
import argparse
import sys

import numpy as np

from bench.common import write_results


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="run.py bench repro", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scene", nargs="?", default="scenes/default.yaml", help="scene file (default scenes/default.yaml)")
    p.add_argument("--steps", type=int, default=600, help="steps per run (default 600)")
    p.add_argument("--arch", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--out", default=None, help="directory for repro_bench.json / repro_bench.md")
    args = p.parse_args(argv)
    from app.errors import UserError

    if args.steps < 1:
        raise UserError(f"--steps: expected a positive int, got {args.steps}")
    from app.runtime import ensure_taichi
    from app.scene import load_scene
    from app.sim import Simulation

    scene = load_scene(args.scene)
    arch = ensure_taichi(args.arch, verbose=True, scene=scene)

    def run(sim):
        for _ in range(args.steps):
            sim.step()
        sim.check()
        return sim.positions().copy(), sim.velocities().copy(), int(sim.contact_counts().sum())

    def row(name, result):
        pos, vel, contacts = result
        return {"run": name, "max_dpos_m": float(np.abs(pos - ref[0]).max()),
                "max_dvel_mps": float(np.abs(vel - ref[1]).max()), "contacts": contacts}

    first = Simulation(scene, verbose=False)
    ref = run(first)
    rows = [row("first", ref), row("second Simulation", run(Simulation(scene, verbose=False)))]
    first.reset()
    rows.append(row("first, after reset()", run(first)))
    identical = all(r["max_dpos_m"] == 0.0 and r["max_dvel_mps"] == 0.0 for r in rows)
    md = (f"Reproducibility of {args.scene} ({scene.body_count} bodies, {args.steps} steps, arch {arch}): "
          f"{'bit-identical' if identical else 'DIFFERENT'}\n\n| run | max position diff (m) | max velocity diff (m/s) "
          f"| contacts |\n|---|---:|---:|---:|\n"
          + "".join(f"| {r['run']} | {r['max_dpos_m']:.3g} | {r['max_dvel_mps']:.3g} | {r['contacts']:,} |\n"
                    for r in rows))
    write_results(args.out, "repro_bench", {"scene": args.scene, "arch": arch, "steps": args.steps,
                                            "identical": identical, "rows": rows}, md)
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
