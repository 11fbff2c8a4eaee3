"""Per-kernel device time of simulator steps: where a step's time goes, for each contact storage.

    python run.py bench profile [--scene pile_1m] [--storages vla,padded] [--orders z,scene] [--warmup 200]
                                [--steps 20] [--arch ...]

Runs Taichi with its kernel profiler (CUDA events per launch), simulates --warmup steps, then prints the
profiler's per-kernel table for --steps steps and the wall time per step (which the profiler itself
inflates a little). Wall time minus the kernels' total is the host's share: launches and syncs.
"""
import argparse
import itertools
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="run.py bench profile", description=__doc__.splitlines()[0])
    p.add_argument("--scene", default="pile_1m", help="scene name in scenes/ (default pile_1m)")
    p.add_argument("--storages", default="vla,padded", help="comma list of vla,padded,dynamic; padded:64 sets the per-body maximum")
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--arch", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--orders", default="z",
                   help="comma list of body storage orders to profile: z (Z-order of the initial positions, the "
                        "default), scene (scene order, as before session 5) and/or landed (an experiment: after the "
                        "warm-up, the bodies are stored again in Z-order of their current positions, the contacts "
                        "dropped, and --resettle steps run before the timed ones)")
    p.add_argument("--resettle", type=int, default=50, help="steps between the re-sort and the timed steps (landed)")
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
    import gc

    import taichi as ti

    from app.scene import load_scene
    from app.sim import Simulation

    # the largest sparse-data pool a case needs (a dynamic storage's), set once: ti.init runs once
    from app.contacts import taichi_pool_gb

    pools = [taichi_pool_gb(load_scene(path, ov)) for _, ov in storages if ov[0] == "sim.contacts=dynamic"]
    arch = init_taichi(args.arch, kernel_profiler=True, device_memory_GB=max(pools) if pools else None)
    sim = None
    for order, (storage, overrides) in itertools.product(orders, storages):
        scene = load_scene(path, overrides)
        # A fresh Simulation per case, the last one freed first: two 1M-body simulations would share the GPU
        del sim
        gc.collect()
        sim = Simulation(scene, verbose=False, spatial_sort=(order != "scene"))
        for _ in range(args.warmup):
            sim.step()
        if order == "landed":
            _store_in_current_z_order(sim)
            for _ in range(args.resettle):
                sim.step()
        ti.sync()
        ti.profiler.clear_kernel_profiler_info()
        prof = None
        if args.host:
            import cProfile
            prof = cProfile.Profile()
            prof.enable()
        t0 = time.perf_counter()
        for _ in range(args.steps):
            sim.step()
        ti.sync()
        wall = (time.perf_counter() - t0) / args.steps * 1e3
        if prof is not None:
            import pstats
            prof.disable()
        device = ti.profiler.get_kernel_profiler_total_time() * 1e3 / args.steps
        print(f"\n{args.scene} ({sim.body_count} bodies, {order}-order), contacts {storage}, arch {arch}: {wall:.2f} ms/step wall, "
              f"{device:.2f} ms/step in kernels, {int(sim.contacts.contact_total[None])} contacts", flush=True)
        ti.profiler.print_kernel_profiler_info("count")
        if prof is not None:
            print(f"host side of {args.steps} steps, top functions by own time:")
            pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(12)
    return 0


def _store_in_current_z_order(sim):
    """Store the bodies of a loaded scene (no bodies added at run time) again in Z-order, of their current
    positions: the permutation the Simulation applies at load, applied to the present state. The contact
    lists are dropped (no warm start for one step). An experiment: how much of a step is locality."""
    import numpy as np

    from app.sim import spatial_order

    n = sim.body_count
    st = sim.state.to_numpy(n)
    p = spatial_order(st["body_pos"])
    sim.scene_of = sim.scene_of[p]
    sim.internal_of[sim.scene_of] = np.arange(n)
    sim.model.set_bodies({key: np.asarray(arr)[sim.scene_of] for key, arr in sim.scene.bodies.items()},
                         sim.scene.materials, 0)
    sim.state.set_rows(0, st["body_pos"][p], st["body_quat"][p], st["body_vel"][p], st["body_omega"][p])
    sim.contacts.reset()


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    sys.exit(main())
