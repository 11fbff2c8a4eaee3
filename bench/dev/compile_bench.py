"""Compile time of the simulator's kernels: each kernel's first call, timed, for one small Simulation.

    python run.py bench compile [--arch cpu] [--taichi-optimisations app|on|off] [--offline-cache]
                                [--frontend-cache on|off]

A first call compiles (Taichi builds the kernel's intermediate code from Python, then generates machine code)
and runs the kernel once on a 40-body pile, whose run time is negligible beside the compile. Without
--offline-cache, Taichi's disk cache is off, so every kernel compiles in full. --taichi-optimisations: Taichi's
own IR optimisations (ti.init's advanced_optimization) as the app runs them (app.runtime.taichi_options: off on
the CPU), on, or off. --frontend-cache: app.frontend_cache's caches of Taichi's front end (off as the app runs
unless SMOLVLA_FRONTEND_CACHE=1) or Taichi as it comes. Prints the kernels by compile time and the total.
"""
import argparse
import collections
import time


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="run.py bench compile", description=__doc__.splitlines()[0])
    p.add_argument("--arch", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--taichi-optimisations", choices=("app", "on", "off"), default="app",
                   help="Taichi's advanced_optimization: as the app runs it (default), on or off")
    p.add_argument("--offline-cache", action="store_true", help="use Taichi's disk cache (default: off)")
    p.add_argument("--storage", choices=("vla", "padded", "dynamic"), default="vla", help="contact storage")
    p.add_argument("--frontend-cache", choices=("on", "off"), default="off",
                   help="app.frontend_cache's caches of Taichi's front end (default off, as the app runs)")
    p.add_argument("--top", type=int, default=12, help="how many kernels to list")
    args = p.parse_args(argv)
    if args.frontend_cache == "on":
        from app.frontend_cache import install

        install(force=True)

    import taichi as ti
    from taichi.lang import kernel_impl

    from app.runtime import taichi_options

    options = taichi_options(args.arch)
    if args.taichi_optimisations != "app":
        options["advanced_optimization"] = args.taichi_optimisations == "on"
    ti.init(arch=getattr(ti, args.arch), offline_cache=args.offline_cache, log_level=ti.WARN, **options)

    # Each kernel's first call per instantiation (a new compiled variant) is charged to the kernel's name.
    seconds = collections.defaultdict(float)
    seen = set()
    call = kernel_impl.Kernel.__call__

    def timed(kernel, *a, **kw):
        t0 = time.perf_counter()
        out = call(kernel, *a, **kw)
        key = (id(kernel), len(kernel.compiled_kernels))
        if key not in seen:
            seen.add(key)
            seconds[kernel.func.__name__] += time.perf_counter() - t0
        return out

    kernel_impl.Kernel.__call__ = timed
    try:
        from app.scene import scene_from_dict
        from app.sim import Simulation

        scene = scene_from_dict({
            "name": "compile", "sim": {"dt": 0.002, "substeps": 5, "contacts": args.storage},
            "materials": {"a": {"density": 1000, "friction": 0.5, "restitution": 0.3}},
            "static": [{"type": "container", "size": [1.2, 1.0, 1.2], "material": "a"}],
            "bodies": [{"generate": "random", "shape": "mixed", "count": 40, "min": [-0.55, 0.05, -0.55],
                        "max": [0.55, 1.6, 0.55], "radius": 0.08, "half_extents": [0.07, 0.05, 0.06],
                        "materials": ["a"]}]})
        t0 = time.perf_counter()
        sim = Simulation(scene, capacity=256, verbose=False)
        t1 = time.perf_counter()
        for _ in range(3):
            sim.step()
        ti.sync()
        t2 = time.perf_counter()
    finally:
        kernel_impl.Kernel.__call__ = call
    opt = "on" if options.get("advanced_optimization", True) else "off"
    print(f"arch {args.arch}, Taichi's IR optimisations {opt}, offline cache {'on' if args.offline_cache else 'off'}, "
          f"front-end cache {args.frontend_cache}, contacts {args.storage}: Simulation() {t1 - t0:.1f} s, first 3 steps {t2 - t1:.1f} s")
    for name, s in sorted(seconds.items(), key=lambda kv: -kv[1])[:args.top]:
        print(f"{s:8.2f} s  {name}")
    print(f"{sum(seconds.values()):8.2f} s  all first calls ({len(seconds)} kernels)")
    return 0
