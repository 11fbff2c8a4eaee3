"""Starting Taichi the way every part of the app runs it (headless, viewer, batch workers, filter, benches).

    arch = ensure_taichi("auto")        # ti.init unless Taichi already runs; 'cuda' or 'cpu'
"""
from __future__ import annotations

import sys

from app.errors import UserError


def taichi_program():
    """The running Taichi program, or None before ti.init."""
    from taichi.lang import impl

    return impl.get_runtime().prog


# Taichi options of every simulation run (headless, viewer, batch, the benchmarks). fast_math=False: IEEE float
# rounding, so that a contact record's terms round the same wherever the compiler puts it. With Taichi's default
# fast math the compiler may round a contact record's terms differently in different code paths (on the CPU, most
# likely a vectorized loop body and its scalar remainder, which a record falls into by its place in the list: the
# generated code was not inspected), and the order in which threads appended a body's contacts then changes its
# velocity in the last bits: runs of one scene diverged (CPU: two runs of scenes/default.yaml in different states
# after 249 steps; H200: 0.42 m apart after 600 steps in one process). The fixed-point sums (app.sim.solver.FIXED_ONE)
# make the motion order-independent only when each term is computed the same way. On the H200 pile_1m is also
# faster without fast math (10.29 against 10.89 ms a step), and runs are bit-identical on the GPU too.
TAICHI_OPTIONS = {"fast_math": False}
# and on the CPU, without Taichi's own IR optimisations (advanced_optimization), whose passes took most of a first
# run's compile: the simulator's kernels took 225 s to compile on a 2-core CPU with them (the narrowphase
# 186 s, the Jacobi iterations 28 s) and 37 s without (narrowphase 16 s), while LLVM still optimises the code
# it generates. On CUDA, where the steps are what is measured, the options stay Taichi's defaults.
CPU_OPTIONS = {"advanced_optimization": False}


def taichi_options(arch: str) -> dict:
    """The ti.init options of a simulation run on `arch` ('cpu' or 'cuda'): TAICHI_OPTIONS, and CPU_OPTIONS
    on the CPU."""
    return {**TAICHI_OPTIONS, **(CPU_OPTIONS if arch == "cpu" else {})}


def pick_arch(arch: str) -> str:
    """'cpu' or 'cuda' for an --arch of auto | cpu | cuda: auto takes CUDA where Taichi finds it. Deciding
    before ti.init lets a CPU run start once, with the CPU's options (a CUDA init that falls back would have
    to start again: 0.3 s)."""
    from taichi.lang.misc import is_arch_supported
    import taichi as ti

    if arch == "auto":
        # Without the CUDA driver library there is no GPU to find, and asking Taichi would print its warning
        # (libcuda.so not found) on every CPU machine.
        return "cuda" if _cuda_driver_present() and is_arch_supported(ti.cuda) else "cpu"
    return arch


# Where the CUDA driver library lives on Linux machines and containers, beside the linker's cache and LD_LIBRARY_PATH.
CUDA_DRIVER_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
                    "/usr/local/nvidia/lib64", "/usr/local/nvidia/lib", "/lib64")


def _cuda_driver_present() -> bool:
    import ctypes.util
    import glob
    import os

    if sys.platform != "linux" or ctypes.util.find_library("cuda") is not None:
        return True   # (elsewhere Taichi is asked as it comes)
    dirs = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d] + list(CUDA_DRIVER_DIRS)
    return any(glob.glob(os.path.join(d, "libcuda.so*")) for d in dirs)


NO_CUDA = "--arch cuda: no CUDA device is available here (use --arch auto or cpu)"


def init_taichi(arch: str, cuda_options=None, cpu_options=None) -> str:
    """ti.init on pick_arch(arch) with taichi_options() and the caller's own options for that arch (log level,
    profiler, memory pool); returns 'cuda' or 'cpu'. A CUDA init that Taichi turned into a CPU one (CUDA found
    but failing) starts again with the CPU's options; `arch` 'cuda' without a working device is a UserError.
    Simulation runs (ensure_taichi: headless, viewer, batch workers) and the benches (bench.common) start Taichi
    through it."""
    import taichi as ti
    from taichi.lang import impl

    from app.frontend_cache import install

    install()   # only with SMOLVLA_FRONTEND_CACHE=1 (app.frontend_cache)
    if pick_arch(arch) == "cuda":
        ti.init(arch=ti.cuda, **(cuda_options or {}), **taichi_options("cuda"))
        if impl.current_cfg().arch == ti.cuda:
            return "cuda"
    if arch == "cuda":
        raise UserError(NO_CUDA)
    ti.init(arch=ti.cpu, **(cpu_options or {}), **taichi_options("cpu"))
    return "cpu"


def ensure_taichi(arch: str = "auto", verbose=True, scene=None, capacity: int = 0) -> str:
    """ti.init for `arch` (auto | cpu | cuda) unless Taichi already runs; returns the arch in use ('cpu' or
    'cuda'). auto takes CUDA where it exists and says which it took on stderr. scene: the scene it is for,
    whose contact storage may need a larger sparse-data pool on CUDA (app.sim.simulation.taichi_pool_gb), and
    capacity the body capacity its Simulation will get if more than the scene's."""
    import taichi as ti
    from taichi.lang import impl

    if arch not in ("auto", "cpu", "cuda"):
        raise UserError(f"--arch: expected auto | cpu | cuda, got {arch!r}")
    if taichi_program() is None:
        from app.sim.simulation import taichi_pool_gb

        pool = taichi_pool_gb(scene, capacity) if scene is not None else None
        cuda_options = {"log_level": ti.ERROR} if pool is None else {"log_level": ti.ERROR, "device_memory_GB": pool}
        init_taichi(arch, cuda_options=cuda_options, cpu_options={"log_level": ti.WARN})
    used = "cuda" if impl.current_cfg().arch == ti.cuda else "cpu"
    if arch == "cuda" and used != "cuda":   # (Taichi already running on the CPU)
        raise UserError(NO_CUDA)
    if verbose:
        why = " (no CUDA device found)" if arch == "auto" and used == "cpu" else ""
        print(f"arch: {used}{why}", file=sys.stderr)
    return used
