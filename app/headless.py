"""Headless runs: load a scene, simulate N frames, write metrics.json, state.npz and (optionally)
trajectory.npz.

    run_headless("scenes/bounce.yaml", frames=120, out_dir="out/bounce", record=True)

Output files (bodies in scene order), each written whole or not at all, metrics.json last; a run first removes the
results an earlier run left in the directory, so a directory without metrics.json holds no finished run:
    metrics.json   status ("complete"; "error" after an explosion, with "error" the message; "interrupted" after
                   Ctrl-C or SIGTERM: the outputs hold the state when it stopped), scene, scene_path, arch,
                   bodies, frames, steps, dt, substeps, sim_time, wall_time (s, all
                   frames), steps_per_second (steps / wall_time), first_frame_wall_time (s: the first frame
                   also compiles most kernels, or loads them from Taichi's cache: seconds on a CPU),
                   steps_per_second_after_first_frame (null for one frame), contacts {max, mean, final}
                   (contact points after each frame's last step; a pair contact counts once), max_penetration
                   (m, deepest contact of the run), final_max_penetration (m, deepest in the last frame),
                   kinetic_energy (J, one per frame), health (deep penetration: penetration_limit,
                   max_penetration_fraction, deep_frames, longest_deep_s, first_deep, warnings; see
                   app.sim.Simulation.health),
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
import time

import numpy as np

from app.errors import UserError, raise_if_signalled, signal_taken
from app.files import write_atomic, write_text_atomic
from app.runtime import ensure_taichi, taichi_program
from app.scene import load_scene

# What a run writes into its --out directory (metrics.json last: see run_headless).
RESULT_FILES = ("state.npz", "trajectory.npz", "metrics.json")

# Simulations kept alive per contact storage, so repeated runs in one process (tests, batches) reuse the
# compiled kernels: Simulation.load refills fields when the capacity suffices.
_SIM_CACHE: dict = {}


def default_out_dir(scene_path: str) -> str:
    """out/<scene file name without extension>: where a headless run writes when no --out is given."""
    return os.path.join("out", os.path.splitext(os.path.basename(scene_path))[0])


def get_simulation(scene, verbose=True):
    """A Simulation for `scene`, reusing a cached one (same storage, same Taichi runtime) when it fits."""
    from app.sim import Simulation

    kind = scene.sim["contacts"]
    prog = taichi_program()
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
                 on_frame=None, strict=False) -> dict:
    """Run `frames` frames of a scene without a viewer and write the outputs into out_dir (see module
    docstring). Returns the metrics dict. Bad input raises UserError (exit 2); an explosion, or with strict a
    contact deeper than sim.penetration_limit, raises app.sim.SimulationError (exit 1) after writing what it has."""
    if isinstance(frames, bool) or not isinstance(frames, (int, np.integer)) or frames < 1:
        raise UserError(f"--frames: expected an integer >= 1, got {frames!r}")
    scene = load_scene(scene_path, overrides)
    try:
        os.makedirs(out_dir, exist_ok=True)
        # an earlier run's results must not pass for this run's if this one stops early
        for name in RESULT_FILES:
            if os.path.exists(os.path.join(out_dir, name)):
                os.remove(os.path.join(out_dir, name))
    except OSError as e:
        raise UserError(f"--out {out_dir}: cannot create the output directory or clear its results ({e.strerror})") \
            from None
    want = arch if arch not in (None, "auto") else scene.sim["arch"]
    used = ensure_taichi(want, verbose=progress, scene=scene)

    import taichi as ti

    from app.sim import SimulationError

    sim = get_simulation(scene, verbose=True)
    sim.strict = bool(strict)
    n = sim.body_count
    energies, contacts, traj_t, traj_p, traj_q = [], [], [], [], []
    status = "complete"
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
            raise_if_signalled()   # (a Ctrl-C whose exception Python swallowed: app.errors)
            sim.step_frame()
            if on_frame is not None:  # viewer hook (offscreen frames / video); see app.viewer.offscreen.frame_callback
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
        status = "error"
    except KeyboardInterrupt as e:   # Ctrl-C, or SIGTERM (app.errors.Terminated): write what there is, marked
        signal_taken()
        error = e
        status = "interrupted"
    finally:
        if bar:
            bar.stop()
    ti.sync()
    wall = time.perf_counter() - t0
    stats = sim.contacts.stats()
    metrics = {
        "status": status,
        "scene": scene.name,
        "scene_path": os.path.abspath(scene.path),   # (the file found: a shipped scene's name works anywhere)
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
        "health": sim.health(),
        "vla": {"contacts": stats, "grid": sim.grid.stats()},
        "overflow_events": sim.overflow_events,
        "overflow_total": sim.contacts.overflowed(),
        "overrides": list(overrides or ()),
    }
    if status == "error":
        metrics["error"] = str(error)
    # every file whole or absent (written aside, then renamed), metrics.json last: its status says how the run ended
    shapes = sim.shapes()
    state = dict(position=sim.positions(), orientation=sim.orientations(), linear_velocity=sim.velocities(),
                 angular_velocity=sim.angular_velocities(), **shapes)
    write_atomic(os.path.join(out_dir, "state.npz"), lambda fh: np.savez(fh, **state))
    if record:
        write_atomic(os.path.join(out_dir, "trajectory.npz"), lambda fh: np.savez(
            fh, time=np.asarray(traj_t, np.float64), position=np.asarray(traj_p, np.float32).reshape(len(traj_t), n, 3),
            orientation=np.asarray(traj_q, np.float32).reshape(len(traj_t), n, 4)))
    write_text_atomic(os.path.join(out_dir, "metrics.json"), json.dumps(metrics, indent=1))
    if error is not None:
        raise error
    return metrics
