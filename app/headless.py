"""Headless runs: load a scene, simulate N frames, write metrics.json, state.npz and (optionally)
trajectory.npz.

    run_headless("scenes/bounce.yaml", frames=120, out_dir="out/bounce", record=True)

Output files (bodies in scene order):
    metrics.json   scene, scene_path, arch, bodies, frames, steps, dt, substeps, sim_time, wall_time (s, all
                   frames), steps_per_second (steps / wall_time), first_frame_wall_time (s: the first frame
                   also compiles most kernels, or loads them from Taichi's cache: seconds on a CPU),
                   steps_per_second_after_first_frame (null for one frame), contacts {max, mean, final}
                   (contact points after each frame's last step; a pair contact counts once), max_penetration
                   (m, deepest contact of the run), final_max_penetration (m, deepest in the last frame),
                   kinetic_energy (J, one per frame),
                   contact_storage, vla {contacts: storage stats, grid: cell-list stats}, overflow_events,
                   overflow_total, overrides.
    state.npz      position (N,3) m, orientation (N,4) w,x,y,z, linear_velocity (N,3) m/s,
                   angular_velocity (N,3) rad/s, shape (N,) 0 sphere / 1 box, radius (N,) m (boxes: bounding
                   radius), half_extents (N,3) m, material (N,), fixed (N,), mass (N,) kg.
    trajectory.npz time (F,) s, position (F,N,3), orientation (F,N,4); with record=True.
"""
from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

from app.errors import UserError
from app.scene import load_scene

# Simulations kept alive per contact storage, so repeated runs in one process (tests, batches) reuse the
# compiled kernels: Simulation.load refills fields when the capacity suffices.
_SIM_CACHE: dict = {}


def _taichi_prog():
    from taichi.lang import impl

    return impl.get_runtime().prog


# Taichi options of every simulation run (headless, viewer, batch, the benchmarks). fast_math=False: IEEE float
# rounding, so that a contact record's terms round the same wherever the compiler puts it. With Taichi's default
# fast math the compiler may round a contact record's terms differently in different code paths (on the CPU, most
# likely a vectorized loop body and its scalar remainder, which a record falls into by its place in the list: the
# generated code was not inspected), and the order in which threads appended a body's contacts then changes its
# velocity in the last bits: runs of one scene diverged (CPU: two runs of scenes/default.yaml in different states
# after 249 steps; H200: 0.42 m apart after 600 steps in one process). The fixed-point sums (app.solver.FIXED_ONE)
# make the motion order-independent only when each term is computed the same way. Measured on the H200
# (docs/benchmarks.md, session 16): pile_1m is also faster without fast math (10.29 against 10.89 ms a step; the
# Jacobi iteration 0.582 against 0.644 ms), and runs are bit-identical on the GPU too (session 17).
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
        return "cuda" if is_arch_supported(ti.cuda) else "cpu"
    return arch


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

    install()   # (kernels compile about twice as fast: see app.frontend_cache)
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
    whose contact storage may need a larger sparse-data pool on CUDA (app.contacts.taichi_pool_gb), and
    capacity the body capacity its Simulation will get if more than the scene's."""
    import taichi as ti
    from taichi.lang import impl

    if arch not in ("auto", "cpu", "cuda"):
        raise UserError(f"--arch: expected auto | cpu | cuda, got {arch!r}")
    if _taichi_prog() is None:
        from app.contacts import taichi_pool_gb

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


def get_simulation(scene, verbose=True):
    """A Simulation for `scene`, reusing a cached one (same storage, same Taichi runtime) when it fits."""
    from app.sim import Simulation

    kind = scene.sim["contacts"]
    prog = _taichi_prog()
    cached = _SIM_CACHE.get(kind)
    if cached is not None and cached[0] is prog:
        sim = cached[1]
        sim.verbose = verbose
        sim.load(scene)  # reallocates by itself when the scene does not fit
        return sim
    sim = Simulation(scene, verbose=verbose)
    _SIM_CACHE[kind] = (prog, sim)
    return sim


def _progress(frames, enabled):
    if not enabled or frames < 20:
        return None
    try:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        p = Progress(TextColumn("simulating"), BarColumn(), TextColumn("{task.completed}/{task.total} frames"),
                     TimeRemainingColumn(), console=Console(stderr=True), transient=True)
        return p
    except ImportError:  # rich comes with taichi; stay quiet without it
        return None


def run_headless(scene_path, frames, out_dir, arch="auto", record=False, overrides=(), progress=True,
                 on_frame=None) -> dict:
    """Run `frames` frames of a scene without a viewer and write the outputs into out_dir (see module
    docstring). Returns the metrics dict. Bad input raises UserError (exit 2); an explosion raises
    app.sim.SimulationError (exit 1) after writing what it has."""
    if isinstance(frames, bool) or not isinstance(frames, (int, np.integer)) or frames < 1:
        raise UserError(f"--frames: expected an integer >= 1, got {frames!r}")
    scene = load_scene(scene_path, overrides)
    want = arch if arch not in (None, "auto") else scene.sim["arch"]
    used = ensure_taichi(want, verbose=progress, scene=scene)
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise UserError(f"--out {out_dir}: cannot create the output directory ({e.strerror})") from None

    import taichi as ti

    from app.sim import SimulationError

    sim = get_simulation(scene, verbose=True)
    n = sim.body_count
    energies, contacts, traj_t, traj_p, traj_q = [], [], [], [], []
    max_pen = 0.0
    final_pen = 0.0
    error = None
    bar = _progress(frames, progress)
    task = bar.add_task("sim", total=frames) if bar else None
    if bar:
        bar.start()
    t0 = time.perf_counter()
    t_first = None
    try:
        for f in range(frames):
            sim.contacts.max_depth[None] = 0.0
            sim.step_frame()
            if on_frame is not None:  # viewer hook (offscreen frames / video); see app.viewer.frame_callback
                on_frame(sim, f)
            frame = sim.last_frame   # (step_frame's one read of the device)
            final_pen = frame["max_depth"]
            max_pen = max(max_pen, final_pen)
            contacts.append(frame["contacts"])
            energies.append(frame["kinetic_energy"])
            if record:
                traj_t.append(sim.sim_time)
                traj_p.append(sim.positions().copy())
                traj_q.append(sim.orientations().copy())
            if bar:
                bar.update(task, advance=1)
            if f == 0:
                ti.sync()
                t_first = time.perf_counter() - t0
    except SimulationError as e:
        error = e
    finally:
        if bar:
            bar.stop()
    ti.sync()
    wall = time.perf_counter() - t0
    stats = sim.contacts.stats()
    metrics = {
        "scene": scene.name,
        "scene_path": str(scene_path),
        "arch": used,
        "bodies": n,
        "frames": len(contacts),
        "steps": sim.step_count,
        "dt": sim.dt,
        "substeps": sim.substeps,
        "solver_iterations": sim.solver_iterations,
        "contact_storage": sim.contacts_kind,
        "sim_time": sim.sim_time,
        "wall_time": wall,
        "steps_per_second": sim.step_count / wall if wall > 0 else 0.0,
        "first_frame_wall_time": t_first,
        "steps_per_second_after_first_frame": (sim.step_count - sim.substeps) / (wall - t_first)
        if t_first is not None and len(contacts) > 1 and wall > t_first else None,
        "contacts": {"max": max(contacts) if contacts else 0,
                     "mean": float(np.mean(contacts)) if contacts else 0.0,
                     "final": contacts[-1] if contacts else 0},
        "max_penetration": max_pen,
        "final_max_penetration": final_pen,
        "kinetic_energy": energies,
        "vla": {"contacts": stats, "grid": sim.grid.stats()},
        "overflow_events": sim.overflow_events,
        "overflow_total": sim.contacts.overflowed(),
        "overrides": list(overrides or ()),
    }
    if error is not None:
        metrics["error"] = str(error)
    with open(os.path.join(out_dir, "metrics.json"), "w") as fh:
        json.dump(metrics, fh, indent=1)
    shapes = sim.shapes()
    np.savez(os.path.join(out_dir, "state.npz"), position=sim.positions(), orientation=sim.orientations(),
             linear_velocity=sim.velocities(), angular_velocity=sim.angular_velocities(), **shapes)
    if record:
        np.savez(os.path.join(out_dir, "trajectory.npz"), time=np.asarray(traj_t, np.float64),
                 position=np.asarray(traj_p, np.float32).reshape(len(traj_t), n, 3),
                 orientation=np.asarray(traj_q, np.float32).reshape(len(traj_t), n, 4))
    if error is not None:
        raise error
    return metrics
