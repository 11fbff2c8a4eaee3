"""Simulator benchmark: steps/s of the pile scenes, and the same scene with each contact storage.

    python run.py bench sim [--small] [--out DIR] [--arch auto|cpu|cuda] [--steps N] [--storages vla,padded,dynamic]
        [--repeats R]
    python -m bench.sim_bench --small

For every (scene, storage) it loads the scene, simulates a warm-up until the pile has landed (so that the
timed steps carry a real contact load; kernels compile during the warm-up too), then times `--steps`
steps between two ti.sync() calls. Recorded per run: ms/step, steps/s, contacts per step, contact-storage
memory (bytes reserved by the storage for both contact generations, and bytes live), padded overflow,
VLA growth events. Writes sim_bench.json and sim_bench.md into --out (default out/bench_sim).

Large scenes re-sort their bodies in memory every Simulation.resort_interval steps (--resort-interval; 0:
never), which the timed steps may not include: after them one resort() is timed on its own, and the table
gives ms/step with its share (resort ms / interval) added.

--repeats R runs every (scene, storage) R times, the storages of a scene taking turns to go first (on the
H200 the second of two back-to-back processes measured up to 10% slower at 100k bodies, where a step is
half host overhead), and reports each case's median with its range; speed ratios are of the medians.

--small runs the same scenes at a few thousand bodies (CPU-sized); full size is for the GPU machine.

A storage may carry scene overrides after "+", to compare variants side by side in one run, taking turns:
--storages "vla,vla+sim.large_body_factor=0" (the large-body broadphase on and off).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

from app.files import write_text_atomic

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STORAGES = ("vla", "padded", "dynamic")

# --small: a pile of N bodies in a container sized so that the pile is several layers deep.
SMALL_OVERRIDES = {
    "pile_100k": ("bodies.0.count=2000", "static.0.size=[2.5, 4, 2.5]", "bodies.0.min=[-1.2, 0.1, -1.2]",
                  "bodies.0.max=[1.2, 6, 1.2]"),
    "pile_1m": ("bodies.0.count=5000", "static.0.size=[3.5, 6, 3.5]", "bodies.0.min=[-1.7, 0.1, -1.7]",
                "bodies.0.max=[1.7, 8, 1.7]"),
    # the same 2,000 bodies in the same container: capsules or rocks where pile_100k has spheres and boxes
    "capsule_pile_100k": ("bodies.0.count=800", "bodies.1.count=1200", "static.0.size=[2.5, 4, 2.5]",
                          "bodies.0.min=[-1.2, 0.1, -1.2]", "bodies.0.max=[1.2, 3, 1.2]",
                          "bodies.1.min=[-1.2, 3.2, -1.2]", "bodies.1.max=[1.2, 6, 1.2]"),
    "convex_pile_100k": ("bodies.0.count=1400", "bodies.1.count=600", "static.0.size=[2.5, 4, 2.5]",
                         "bodies.0.min=[-1.2, 0.1, -1.2]", "bodies.0.max=[1.2, 3, 1.2]",
                         "bodies.1.min=[-1.2, 3.2, -1.2]", "bodies.1.max=[1.2, 6, 1.2]"),
    # 2,000 bodies rained onto 10 x 10 m of the whole 18,432-triangle terrain
    "junkyard_100k": ("bodies.0.count=800", "bodies.1.count=800", "bodies.2.count=400", "bodies.0.min=[-5, 2.6, -5]",
                      "bodies.0.max=[5, 5, 5]", "bodies.1.min=[-5, 5.2, -5]", "bodies.1.max=[5, 6.4, 5]",
                      "bodies.2.min=[-5, 6.6, -5]", "bodies.2.max=[5, 7.7, 5]"),
}


def _landing_steps(scene) -> int:
    """Steps until the highest body has fallen to the floor, plus 0.25 s to settle into contact."""
    g = max(1e-6, math.sqrt(sum(x * x for x in scene.sim["gravity"])))
    top = float(scene.bodies["position"][:, 1].max())
    t = math.sqrt(2 * max(top, 0.0) / g) + 0.25
    return int(math.ceil(t / scene.sim["dt"]))


def bench_one(scene_path, storage, steps, overrides=(), warmup_steps=None, verbose=True, scene=None,
              resort_interval=None, capacity=None) -> dict:
    """One timed run (see the module docstring); scene: the loaded scene, if the caller has it already;
    resort_interval: Simulation.resort_interval (None: its default); capacity: the Simulation's body capacity
    (None: the scene's)."""
    import taichi as ti

    import gc

    from app.scene import load_scene
    from app.sim import Simulation

    if scene is None:
        scene = load_scene(scene_path, tuple(overrides) + (f"sim.contacts={storage}",))
    gc.collect()  # the previous run's fields go before this one allocates
    t_build = time.perf_counter()
    # A fresh Simulation, not app.headless.get_simulation's cached one: a simulation sized for an earlier,
    # larger scene would be reused, and its memory (and speed) reported for this one.
    sim = Simulation(scene, verbose=verbose, resort_interval=resort_interval, capacity=capacity)
    warm = _landing_steps(scene) if warmup_steps is None else int(warmup_steps)
    sim.advance(warm)
    sim.check()
    ti.sync()
    t_warm = time.perf_counter() - t_build
    contacts0 = int(sim.diagnostics.contact_total[None])
    dropped0 = sim.contacts.overflowed()  # cumulative since the storage was made: split warm-up / timed
    t0 = time.perf_counter()
    sim.advance(steps)
    ti.sync()
    wall = time.perf_counter() - t0
    sim.check()
    resorts = sim.resort_interval > 0 and sim.body_count >= sim.resort_min_bodies
    resort_ms = None
    if resorts:   # what the timed steps may have missed: one resort, amortised over its interval below
        t0 = time.perf_counter()
        sim.resort()
        ti.sync()
        resort_ms = 1e3 * (time.perf_counter() - t0)
    st = sim.contacts.stats()
    grid = sim.grid.stats()
    # how well it holds still: the top body's displacement since the scene put it there (a pyramid's top drift),
    # and the fastest body at the end (resting speed)
    p0 = scene.bodies["position"]
    top = int(p0[:, 1].argmax())
    top_drift = float(((sim.positions()[top].astype(float) - p0[top]) ** 2).sum() ** 0.5)
    speed_end = float((sim.velocities().astype(float) ** 2).sum(axis=1).max() ** 0.5)
    return {
        "scene": scene.name, "storage": storage, "bodies": sim.body_count, "warmup_steps": warm,
        "warmup_seconds": t_warm, "steps": steps, "wall_time": wall, "ms_per_step": 1e3 * wall / steps,
        "steps_per_second": steps / wall, "contacts_at_start": contacts0,
        "resort_interval": sim.resort_interval if resorts else 0, "resort_ms": resort_ms,
        "ms_per_step_with_resort": 1e3 * wall / steps + (resort_ms / sim.resort_interval if resorts else 0.0),
        "contacts_at_end": int(sim.diagnostics.contact_total[None]),
        "contact_reserved_bytes": int(st["reserved_bytes"]), "contact_live_bytes": int(st["live_bytes"]),
        "contact_storage_stats": st, "grid_reserved_bytes": int(grid["reserved_bytes"]),
        # contacts the padded/dynamic storage dropped over the whole run (warm-up + timed steps), and in the
        # timed steps alone
        "padded_overflow": sim.contacts.overflowed(), "padded_overflow_timed": sim.contacts.overflowed() - dropped0,
        "overrides": list(overrides), "top_drift_m": top_drift, "max_speed_end": speed_end,
        "asleep_at_end": int(sim.sleeping().sum()),
        "sim_seconds": (warm + steps) * scene.sim["dt"],
    }


def _bench_in_subprocess(path, storage, steps, overrides, warmup, arch, resort_interval=None, capacity=None) -> dict:
    """bench_one in a fresh process: each run starts from an empty device (Taichi does not give field memory
    back), and a run that crashes the device context (Taichi's `dynamic` SNode asserts on the device when
    its allocator runs dry) is reported as a failed row instead of ending the whole benchmark."""
    import subprocess

    job = json.dumps({"path": path, "storage": storage, "steps": steps, "overrides": list(overrides),
                      "warmup": warmup, "arch": arch, "resort_interval": resort_interval, "capacity": capacity})
    from app.errors import PARENT_PID_ENV

    # (the run ends with this process: a benchmark stopped by `timeout` leaves no run holding the device; as a
    # module from ROOT, it imports this checkout's app, not another one installed with `pip install -e`)
    proc = subprocess.run([sys.executable, "-m", "bench.sim_bench", "--one", job], capture_output=True,
                          text=True, cwd=ROOT, env={**os.environ, PARENT_PID_ENV: str(os.getpid())})
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    tail = [ln for ln in (proc.stderr or "").splitlines() if ln.strip()][-3:]
    name = os.path.splitext(os.path.basename(path))[0]
    return {"scene": name, "storage": storage, "error": f"exit code {proc.returncode}: " + " | ".join(tail)[-400:]}


def _run_one(job_json: str) -> int:
    from app.errors import die_with_parent
    from app.runtime import ensure_taichi
    from app.scene import load_scene

    die_with_parent()
    job = json.loads(job_json)
    # the scene first: a dynamic storage sizes Taichi's sparse-data pool at ti.init (app.sim.simulation.taichi_pool_gb)
    scene = load_scene(job["path"], tuple(job["overrides"]) + (f"sim.contacts={job['storage']}",))
    arch = ensure_taichi(job["arch"], verbose=False, scene=scene, capacity=job.get("capacity") or 0)
    r = bench_one(job["path"], job["storage"], job["steps"], job["overrides"], job["warmup"], verbose=False,
                  scene=scene, resort_interval=job.get("resort_interval"), capacity=job.get("capacity"))
    r["arch"] = arch
    print(json.dumps(r), flush=True)
    return 0


def _schedule(storages, repeats):
    """(repeat, storage, overrides) in run order: repeat after repeat, each starting one storage later."""
    k = len(storages)
    for rep in range(repeats):
        for storage, overrides in storages[rep % k:] + storages[:rep % k]:
            yield rep, storage, overrides


def summarize(rows) -> list:
    """One row per (scene, storage) from the runs of --repeats: the run of median ms/step (the lower middle
    one for an even count) with the range over the repeats added ("ms_min", "ms_max", "repeats"). A case
    with a failed run keeps its first failure."""
    groups = {}
    for r in rows:
        groups.setdefault((r["scene"], r["storage"]), []).append(r)
    out = []
    for runs in groups.values():
        failed = [r for r in runs if "error" in r]
        if failed:
            out.append(failed[0])
            continue
        ordered = sorted(runs, key=lambda r: r["ms_per_step"])
        med = dict(ordered[(len(ordered) - 1) // 2])
        med.update(ms_min=ordered[0]["ms_per_step"], ms_max=ordered[-1]["ms_per_step"], repeats=len(runs))
        out.append(med)
    return out


def _times_live(r) -> str:
    """' (Nx)': the contact storage's bytes over its live records' (empty when nothing is live)."""
    live = r.get("contact_live_bytes", 0)
    return f" ({r['contact_reserved_bytes'] / live:.2f}x)" if live else ""


def _table(rows) -> str:
    out = ["| scene | bodies | storage | ms/step | with resorts: ms/step (resort ms / interval) | steps/s | contacts | "
           "contact memory MiB (x live records) | vs padded: speed | vs padded: memory | "
           "dropped (whole run / timed steps) | "
           "top body moved (m) | fastest body at the end (m/s) | asleep at the end |",
           "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    padded = {(r["scene"], r["bodies"]): r for r in rows if r["storage"] == "padded" and "error" not in r}
    for r in rows:
        if "error" in r:
            out.append(f"| {r['scene']} | | {r['storage']} | failed: {r['error']} | | | | | | | | | | |")
            continue
        p = padded.get((r["scene"], r["bodies"]))
        speed = f"{p['ms_per_step'] / r['ms_per_step']:.2f}x" if p else "-"
        mem = f"{r['contact_reserved_bytes'] / p['contact_reserved_bytes']:.2f}x" if p else "-"
        if r["storage"] == "dynamic":  # lower bound: chunks the live lists need; Taichi's allocator keeps more
            mem += " (lower bound)"
        ms = f"{r['ms_per_step']:.2f}"
        if r.get("repeats", 1) > 1:
            ms += f" ({r['ms_min']:.2f}-{r['ms_max']:.2f}, median of {r['repeats']})"
        resort = "no resorts" if not r.get("resort_interval") else \
            f"{r['ms_per_step_with_resort']:.2f} ({r['resort_ms']:.1f} / {r['resort_interval']})"
        out.append(f"| {r['scene']} | {r['bodies']} | {r['storage']} | {ms} | {resort} | "
                   f"{r['steps_per_second']:.1f} | {r['contacts_at_end']} | {r['contact_reserved_bytes'] / 2**20:.1f}"
                   f"{_times_live(r)} | "
                   f"{speed} | {mem} | {r['padded_overflow']} / {r.get('padded_overflow_timed', '-')} | "
                   f"{r.get('top_drift_m', float('nan')):.4f} | {r.get('max_speed_end', float('nan')):.2e} | "
                   f"{r.get('asleep_at_end', '-')} |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--one"]:
        return _run_one(argv[1])
    p = argparse.ArgumentParser(prog="run.py bench sim", description=__doc__.splitlines()[0])
    p.add_argument("--small", action="store_true", help="a few thousand bodies (CPU-sized)")
    p.add_argument("--out", default=os.path.join("out", "bench_sim"))
    p.add_argument("--arch", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--steps", type=int, default=None, help="timed steps per run (default 200, --small 40)")
    p.add_argument("--warmup", type=int, default=None, help="warm-up steps (default: until the pile has landed)")
    p.add_argument("--storages", default=",".join(STORAGES),
                   help="comma list of vla,padded,dynamic; padded:64 sets the per-body maximum (scene default 32)")
    p.add_argument("--scenes", default="pile_100k,pile_1m", help="comma list of scene names in scenes/")
    p.add_argument("--resort-interval", type=int, default=None,
                   help="Simulation.resort_interval: steps between re-sorts of the bodies in memory (0: never; "
                        "default: the Simulation's)")
    p.add_argument("--capacity", type=int, default=None,
                   help="body capacity of every run's Simulation (default: each scene's body count rounded up to a "
                        "power of two). Scenes run at one capacity compile the same kernels, which Taichi's "
                        "offline cache then keeps for the next run: on CUDA a first run compiles for about 100 s")
    p.add_argument("--repeats", type=int, default=1,
                   help="runs per (scene, storage), storages taking turns to go first; medians reported")
    args = p.parse_args(argv)
    from app.errors import UserError

    from bench.common import parse_storages

    storages = parse_storages(args.storages)
    if args.repeats < 1:
        raise UserError(f"--repeats: expected a positive integer, got {args.repeats}")
    if args.resort_interval is not None and args.resort_interval < 0:
        raise UserError(f"--resort-interval: expected an integer >= 0, got {args.resort_interval}")
    if args.capacity is not None and args.capacity < 1:
        raise UserError(f"--capacity: expected a positive integer, got {args.capacity}")
    arch = args.arch  # Taichi runs in the per-run subprocesses only (which report the arch they took)
    steps = args.steps or (40 if args.small else 200)
    rows = []
    for name in [s.strip() for s in args.scenes.split(",") if s.strip()]:
        path = os.path.join(ROOT, "scenes", f"{name}.yaml")
        if not os.path.exists(path):
            raise UserError(f"--scenes: no scene {name!r} in scenes/ (expected a file {path})")
        overrides = SMALL_OVERRIDES.get(name, ()) if args.small else ()
        for rep, storage, storage_overrides in _schedule(storages, args.repeats):
            kind = storage.split("+")[0].partition(":")[0]
            r = _bench_in_subprocess(path, kind, steps, tuple(overrides) + storage_overrides[1:], args.warmup,
                                     args.arch, args.resort_interval, args.capacity)
            r["storage"] = storage
            r["repeat"] = rep
            rows.append(r)
            # written after every run, so that a run cut short (a device call's time limit) keeps what finished
            _write_results(args.out, arch, args.small, steps, args.repeats, rows)
            if "error" in r:
                print(f"{name:10s} {storage:8s} FAILED: {r['error']}", file=sys.stderr)
                continue
            print(f"{name:10s} {r['bodies']:8d} bodies  {storage:8s} {r['ms_per_step']:8.2f} ms/step  "
                  f"{r['contacts_at_end']:9d} contacts  {r['contact_reserved_bytes'] / 2**20:9.1f} MiB  "
                  f"overflow {r['padded_overflow']}", file=sys.stderr)
    print(_write_results(args.out, arch, args.small, steps, args.repeats, rows))
    return 0


def _write_results(out_dir, arch, small, steps, repeats, rows) -> str:
    """sim_bench.json (every run and the summary) and sim_bench.md (the table) in out_dir; returns the table.
    arch: the one a run reports taking, else the --arch asked for."""
    arch = next((r["arch"] for r in rows if "arch" in r), arch)
    summary = summarize(rows)
    os.makedirs(out_dir, exist_ok=True)
    write_text_atomic(os.path.join(out_dir, "sim_bench.json"), json.dumps(
        {"arch": arch, "small": small, "steps": steps, "repeats": repeats, "runs": rows, "summary": summary}, indent=1))
    md = f"# Simulator benchmark ({arch}{', --small' if small else ''})\n\n" + _table(summary)
    write_text_atomic(os.path.join(out_dir, "sim_bench.md"), md)
    return md


if __name__ == "__main__":   # (`python -m bench.sim_bench` from the repository root)
    sys.exit(main())
