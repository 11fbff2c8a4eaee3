"""Per-kernel device time of simulator steps: where a step's time goes, for each contact storage.

    python run.py bench profile [--scene pile_1m] [--storages vla,padded] [--orders z,scene]
                                [--resort-intervals 500,0] [--warmup 200] [--steps 20] [--resort-cost K] [--arch ...]

Runs Taichi with its kernel profiler (CUDA events per launch), simulates --warmup steps, then prints the
profiler's per-kernel table for --steps steps and the wall time per step (which the profiler itself
inflates a little). Wall time minus the kernels' total is the host's share: launches and syncs.
"""
import argparse
import itertools
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the repository


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="run.py bench profile", description=__doc__.splitlines()[0])
    p.add_argument("--scene", default="pile_1m", help="scene name in scenes/ (default pile_1m)")
    p.add_argument("--storages", default="vla,padded", help="comma list of vla,padded,dynamic; padded:64 sets the per-body maximum")
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--arch", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--orders", default="z",
                   help="comma list of body storage orders to profile: z (Z-order of the initial positions, the "
                        "default), scene (scene order) and/or landed (after the warm-up, one Simulation.resort(), "
                        "then --resettle steps before the timed ones)")
    p.add_argument("--resettle", type=int, default=50, help="steps between the re-sort and the timed steps (landed)")
    p.add_argument("--resort-intervals", default="",
                   help="comma list of Simulation.resort_interval values to profile, each a case of its own (0: "
                        "never re-sort); default: the Simulation's own")
    p.add_argument("--resort-cost", type=int, default=0, metavar="K",
                   help="after the timed steps, time K calls of Simulation.resort() (wall ms each, and the "
                        "kernels' device time)")
    p.add_argument("--host", action="store_true",
                   help="also profile the host side of the timed steps (cProfile, top functions by own time)")
    args = p.parse_args(argv)
    from app.errors import UserError

    path = os.path.join(ROOT, "scenes", f"{args.scene}.yaml")
    if not os.path.exists(path):
        raise UserError(f"--scene: no scene {args.scene!r} in scenes/ (expected a file {path})")
    from bench.common import init_taichi, parse_storages

    storages = parse_storages(args.storages)
    orders = [o.strip() for o in args.orders.split(",") if o.strip()]
    if not orders or any(o not in ("z", "scene", "landed") for o in orders):
        raise UserError(f"--orders: expected a comma list of z, scene and landed, got {args.orders!r}")
    try:
        intervals = [int(x) for x in args.resort_intervals.split(",") if x.strip()] or [None]
    except ValueError:
        raise UserError(f"--resort-intervals: expected a comma list of integers >= 0, got {args.resort_intervals!r}")
    if any(x is not None and x < 0 for x in intervals):
        raise UserError(f"--resort-intervals: expected integers >= 0, got {args.resort_intervals!r}")
    import gc

    import taichi as ti

    from app.scene import load_scene
    from app.sim import Simulation

    # the largest sparse-data pool a case needs (a dynamic storage's), set once: ti.init runs once
    from app.sim.simulation import taichi_pool_gb

    pools = [taichi_pool_gb(load_scene(path, ov)) for _, ov in storages if ov[0] == "sim.contacts=dynamic"]
    arch = init_taichi(args.arch, kernel_profiler=True, device_memory_GB=max(pools) if pools else None)
    sim = None
    for order, interval, (storage, overrides) in itertools.product(orders, intervals, storages):
        scene = load_scene(path, overrides)
        # A fresh Simulation per case, the last one freed first: two 1M-body simulations would share the GPU
        del sim
        gc.collect()
        sim = Simulation(scene, verbose=False, spatial_sort=(order != "scene"), resort_interval=interval)
        sim.advance(args.warmup)
        if order == "landed":
            sim.resort()
            sim.advance(args.resettle)
        ti.sync()
        ti.profiler.clear_kernel_profiler_info()
        prof = None
        if args.host:
            import cProfile
            prof = cProfile.Profile()
            prof.enable()
        t0 = time.perf_counter()
        sim.advance(args.steps)
        ti.sync()
        wall = (time.perf_counter() - t0) / args.steps * 1e3
        if prof is not None:
            import pstats
            prof.disable()
        device = ti.profiler.get_kernel_profiler_total_time() * 1e3 / args.steps
        resorts = "never" if sim.resort_interval <= 0 or sim.body_count < sim.resort_min_bodies else \
            f"every {sim.resort_interval} steps"
        print(f"\n{args.scene} ({sim.body_count} bodies, {order}-order, resort {resorts}), contacts {storage}, arch "
              f"{arch}: {wall:.2f} ms/step wall, {device:.2f} ms/step in kernels, "
              f"{int(sim.diagnostics.contact_total[None])} contacts", flush=True)
        ti.profiler.print_kernel_profiler_info("count")
        if args.resort_cost > 0:
            ti.profiler.clear_kernel_profiler_info()
            times = []
            for _ in range(args.resort_cost):
                t0 = time.perf_counter()
                sim.resort()
                ti.sync()
                times.append((time.perf_counter() - t0) * 1e3)
            device = ti.profiler.get_kernel_profiler_total_time() * 1e3 / args.resort_cost
            print(f"resort: {', '.join(f'{t:.1f}' for t in times)} ms wall each; {device:.2f} ms in kernels on average",
                  flush=True)
            ti.profiler.print_kernel_profiler_info("count")
        if prof is not None:
            print(f"host side of {args.steps} steps, top functions by own time:")
            pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(12)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    sys.exit(main())
