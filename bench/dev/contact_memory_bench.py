"""The contact storage's memory through a pile's rain and landing: a slice of pile_1m at pile_1m's density.

    python run.py bench contact-memory [--arch auto|cpu|cuda] [--bodies 15500] [--steps 3000] [--every 100]
                                       [--out DIR]

pile_1m pours 1,000,000 bodies from up to 17 m into a 20 x 20 m container. The slice pours --bodies of them from
the same heights into a container scaled to the same bodies per square metre, so that its rain, its landing and
its contacts per body are pile_1m's. Every --every steps it reports the VLA contact storage's reserved bytes (the
inline tier, pool, overflow area and metadata: vla.VLA.stats) against its live records' bytes (both generations:
last step's records are the warm start), how the pool is used, and the fastest body. The simulation releases what
the lists no longer need every 500 steps once they stop growing (Simulation.release_interval, docs/simulator.md).
The byte counts are the same on any device. The default body count fills its power-of-two capacity (16,384) about
as pile_1m fills its own (2^20); a count just above a power of two leaves up to half the lists, and their inline
slots, unused.
"""
import argparse
import os

import numpy as np

from bench.common import markdown_table, write_results

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the repository
PILE_1M = os.path.join(ROOT, "scenes", "pile_1m.yaml")


def slice_overrides(bodies: int) -> tuple:
    """Scene overrides of scenes/pile_1m.yaml for `bodies` of its bodies at its density (bodies per square metre of
    its container), poured from its heights."""
    import yaml

    with open(PILE_1M) as f:
        scene = yaml.safe_load(f)
    size, gen = scene["static"][0]["size"], scene["bodies"][0]
    scale = (bodies / gen["count"]) ** 0.5
    margin = size[0] / 2 - gen["max"][0]   # (the generator's region inside the walls)
    sx, sz = size[0] * scale, size[2] * scale
    return (f"bodies.0.count={bodies}", f"static.0.size=[{sx:.4f}, {size[1]}, {sz:.4f}]",
            f"bodies.0.min=[{margin - sx / 2:.4f}, {gen['min'][1]}, {margin - sz / 2:.4f}]",
            f"bodies.0.max=[{sx / 2 - margin:.4f}, {gen['max'][1]}, {sz / 2 - margin:.4f}]")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="run.py bench contact-memory", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--bodies", type=int, default=15500, help="bodies of the slice (default 15,500)")
    p.add_argument("--steps", type=int, default=3000, help="steps in all (default 3,000: 6 s)")
    p.add_argument("--every", type=int, default=100, help="steps between two reports (default 100), each one step "
                   "after a multiple of it")
    p.add_argument("--out", default=None, help="directory for contact_memory_bench.json / .md")
    args = p.parse_args(argv)
    from app.errors import UserError

    if args.bodies < 1 or args.every < 1 or args.steps <= args.every:
        raise UserError("bench contact-memory: expected --bodies and --every >= 1 and --steps > --every")
    from app.runtime import ensure_taichi
    from app.scene import load_scene
    from app.sim import Simulation

    arch = ensure_taichi(args.arch, verbose=True)
    scene = load_scene(PILE_1M, slice_overrides(args.bodies))
    sim = Simulation(scene, verbose=False)
    rows = []
    # one step after each multiple of --every: a scene of 20,000 bodies or more re-sorts its bodies every 500 steps
    # (Simulation.resort), which leaves only the current generation live until the next step
    for step in range(args.every + 1, args.steps + 1, args.every):
        sim.advance(step - sim.step_count)
        st = sim.contacts.stats()
        speed = np.linalg.norm(sim.velocities(), axis=1)
        live, reserved = st["live_bytes"], st["reserved_bytes"]
        rows.append({"step": sim.step_count, "live_mb": live / 1e6, "reserved_mb": reserved / 1e6,
                     "ratio": reserved / live if live else float("inf"),
                     "inline": st["inline_elements"], "used": st["pool_chunks_used"],
                     "holes": st["pool_chunks_holes"], "pool": st["pool_chunks_total"],
                     "fastest": float(speed.max()), "over_1": int((speed > 1.0).sum())})
        r = rows[-1]
        print(f"step {r['step']:6d}  live {r['live_mb']:8.2f} MB  reserved {r['reserved_mb']:8.2f} MB "
              f"({r['ratio']:.2f}x)  pool chunks {r['used']}/{r['pool']} ({r['holes']} in holes)  "
              f"fastest {r['fastest']:.2f} m/s", flush=True)
    st = sim.contacts.stats()
    md = (f"Contact storage through pile_1m's rain and landing: {args.bodies:,} bodies at pile_1m's density, capacity "
          f"{sim.capacity:,}, layout (inline {st['inline_capacity']}, chunk {st['chunk_size']}, {st['runs']} runs) "
          f"({arch})\n\n"
          + markdown_table(rows, [("step", "step", "{}"), ("live_mb", "live records MB", "{:.2f}"),
                                  ("reserved_mb", "reserved MB", "{:.2f}"), ("ratio", "x live", "{:.2f}"),
                                  ("inline", "inline slots", "{}"), ("used", "pool chunks used", "{}"),
                                  ("holes", "in holes", "{}"), ("pool", "pool chunks", "{}"),
                                  ("fastest", "fastest body (m/s)", "{:.2f}"), ("over_1", "bodies over 1 m/s", "{}")]))
    write_results(args.out, "contact_memory_bench", {"arch": arch, "bodies": args.bodies, "rows": rows}, md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
