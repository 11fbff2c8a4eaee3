"""Run one simulator step of a landed scene between cuProfilerStart/Stop, for Nsight Compute.

    ncu --profile-from-start off --set basic -o OUT python -m bench.dev.ncu_step [--scene pile_1m] [--warmup 1055]
        [--storage vla]

The warm-up steps run unprofiled (ncu only intercepts them); the step after them is the one profiled, so the
report covers every kernel of one step of the landed pile: registers per thread, occupancy, local memory
(spills), memory throughput. CUDA only.
"""
import argparse
import ctypes
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the repository


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.dev.ncu_step", description=__doc__.splitlines()[0])
    p.add_argument("--scene", default="pile_1m")
    p.add_argument("--warmup", type=int, default=1055)
    p.add_argument("--storage", default="vla")
    args = p.parse_args(argv)
    import taichi as ti

    from app.headless import get_simulation
    from app.scene import load_scene
    from bench.common import init_taichi

    init_taichi("cuda")   # as every bench: the app's Taichi options (no fast math)
    sim = get_simulation(load_scene(os.path.join(ROOT, "scenes", f"{args.scene}.yaml"),
                                    (f"sim.contacts={args.storage}",)), verbose=False)
    for _ in range(args.warmup):
        sim.step()
    ti.sync()
    cuda = ctypes.CDLL("libcuda.so.1")
    cuda.cuProfilerStart()
    sim.step()
    ti.sync()
    cuda.cuProfilerStop()
    return 0


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    sys.exit(main())
