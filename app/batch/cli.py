"""``python run.py batch``: many headless runs of scenes x seeds x parameter values.

    python run.py batch SCENE [SCENE ...] [--seeds 0-15] [--set key.path=v1,v2,... ...] [--sweep sweep.yaml]
                  --frames N --out DIR [--workers K] [--arch auto|cpu|cuda] [--record] [--strict] [--resume]
                  [--timeout S] [--ray [ADDRESS]]

Every run is its own ``run.py SCENE --headless`` process (see app/batch/worker.py), so one Taichi runtime
per run and a crash or a signal takes down one run, never the batch. Results: DIR/RUN_ID/ per run and
DIR/summary.csv|json (layout in app/batch/store.py). Exit code 0 when every run is ok, 1 when some
failed, 2 for bad arguments (one line naming the argument), 130 when interrupted (Ctrl-C), 143 on SIGTERM
(--resume finishes either).
"""
from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)

from app.batch.plan import RunSpec, expand_runs, load_sweep, parse_seeds, parse_set
from app.batch.process import detect_gpus, run_processes, slot_envs
from app.batch.store import BatchDir
from app.batch.worker import cpu_threads_env, headless_argv
from app.errors import UserError, terminate_as_exception

ARCHS = ("auto", "cpu", "cuda")


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad argument as a UserError (one line, exit code 2) instead of usage text."""

    def error(self, message):
        raise UserError(f"batch: {message} (see python run.py batch --help)")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="run.py batch", description=__doc__.split("\n\n")[0],
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenes", nargs="*", metavar="SCENE", help="scene YAML files")
    p.add_argument("--seeds", help="seeds as sim.seed, e.g. 0-15 or 0,3,8-11 (default: each scene's own seed)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY.PATH=V1,V2,...",
                   help="a scene parameter and its values; several --set give their cartesian product")
    p.add_argument("--sweep", help="YAML file with scenes:, seeds: and set: {key.path: [values]}")
    p.add_argument("--frames", type=int, required=True, help="frames per run")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--workers", type=int, help="runs at once (default: one per GPU, else 1)")
    p.add_argument("--arch", choices=ARCHS, help="passed to each run (default: each scene's sim.arch)")
    p.add_argument("--record", action="store_true", help="also write trajectory.npz per run")
    p.add_argument("--strict", action="store_true",
                   help="each run stops, recorded failed, at a contact deeper than sim.penetration_limit")
    p.add_argument("--resume", action="store_true", help="finish a batch in --out: skip its complete runs")
    p.add_argument("--timeout", type=float, help="seconds after which a run is killed and recorded failed")
    p.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="run as Ray tasks; without ADDRESS on a local Ray (pip install -e .[cluster])")
    return p


def plan_from_args(args) -> tuple[list[RunSpec], dict]:
    """Validate the arguments and expand them into runs; the settings dict goes into batch.json."""
    if args.frames <= 0:
        raise UserError(f"--frames: expected a positive integer, got {args.frames}")
    if args.workers is not None and args.workers <= 0:
        raise UserError(f"--workers: expected a positive integer, got {args.workers}")
    if args.timeout is not None and not args.timeout > 0:
        raise UserError(f"--timeout: expected a positive number of seconds, got {args.timeout}")
    sweep = load_sweep(args.sweep) if args.sweep else {"scenes": [], "seeds": None, "set": []}
    seeds = parse_seeds(args.seeds) if args.seeds is not None else None
    if seeds is not None and sweep["seeds"] is not None:
        raise UserError(f"--seeds: {args.sweep} also gives seeds; use one of them")
    seeds = seeds if seeds is not None else sweep["seeds"]
    params = [parse_set(s) for s in args.sets]
    sweep_keys = {k for k, _ in sweep["set"]}
    for key, _ in params:
        if key in sweep_keys:
            raise UserError(f"--set {key}: {args.sweep} also sets it; use one of them")
    params = sweep["set"] + params
    runs = expand_runs(list(args.scenes) + sweep["scenes"], seeds, params)
    settings = {
        "frames": args.frames,
        "arch": args.arch,
        "record": bool(args.record),
        "strict": bool(args.strict),
        "seeds": seeds,
        "parameters": {k: v for k, v in params},
        "backend": "ray" if args.ray is not None else "processes",
    }
    return runs, settings


def _fmt(x, spec=".4g"):
    return "-" if x is None else format(x, spec)


class _Reporter:
    """The rich progress bar (runs done, failures so far, elapsed, ETA) and one line per finished run."""

    def __init__(self, total: int, console: Console):
        self.console = console
        self.failed = 0
        self.progress = Progress(
            SpinnerColumn(), TextColumn("[bold]batch"), BarColumn(), MofNCompleteColumn(),
            TextColumn("[red]{task.fields[failed]} failed"), TextColumn("elapsed"), TimeElapsedColumn(),
            TextColumn("ETA"), TimeRemainingColumn(), console=console, transient=False,
        )
        self.task = self.progress.add_task("runs", total=total, failed=0)

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        return self.progress.__exit__(*exc)

    def finished(self, spec: RunSpec, row: dict | None, info: dict) -> None:
        ok = info["status"] == "ok"
        self.failed += not ok
        wall = info.get("wall_time_s")
        took = f"{wall:.1f} s" if isinstance(wall, (int, float)) else "-"
        if ok:
            sps = (row or {}).get("steps_per_second")
            self.progress.console.print(f"[green]ok[/]     {escape(spec.run_id)}  ({took}, {_fmt(sps)} steps/s)", highlight=False)
        else:
            self.progress.console.print(f"[red]failed[/] {escape(spec.run_id)}  ({took}): {escape(info.get('error', ''))}",
                                        highlight=False)
        self.progress.update(self.task, advance=1, failed=self.failed)


def run_batch(runs: list[RunSpec], settings: dict, out: str, *, workers: int | None = None, resume: bool = False,
              ray_address: str | None = None, timeout: float | None = None, argv_fn=None,
              console: Console | None = None, command: list[str] | None = None) -> dict:
    """Run a plan into ``out``; returns {"total", "skipped", "ok", "failed", "rows", "wall_time_s"}.

    ``argv_fn(spec, out_dir, scene_path=None) -> argv`` makes each run's command (default: the headless
    run.py); tests substitute small stand-in programs."""
    console = console or Console(stderr=True)
    record, arch, frames = settings["record"], settings["arch"], settings["frames"]
    use_ray = ray_address is not None
    if argv_fn is None:
        argv_fn = functools.partial(_default_argv, frames=frames, arch=arch or "", record=record,
                                    strict=bool(settings.get("strict")))
    store = BatchDir(out)
    config = {**settings, "command": command or [], "runs": [r.to_json() for r in runs]}
    gpus = [] if (arch == "cpu" or use_ray) else detect_gpus()
    if workers is None and not use_ray:
        workers = max(1, len(gpus))
    config["workers"] = workers
    config["gpus"] = gpus
    store.open(config, resume)
    t0 = time.perf_counter()
    try:
        todo = [r for r in runs if not (resume and store.is_complete(r, record))]
        skipped = len(runs) - len(todo)
        if resume:
            console.print(f"resume: {skipped} of {len(runs)} runs already complete in {out}, {len(todo)} to run",
                          highlight=False)
        if gpus and workers > len(gpus):
            console.print(f"note: {workers} workers share {len(gpus)} GPU(s)", highlight=False)
        store.write_summary(runs, settings)
        last_write = [time.monotonic()]

        with _Reporter(len(todo), console) as reporter:

            def on_result(spec: RunSpec, tmp: Path, result: dict) -> None:
                info = store.finalize(spec, tmp, result)
                rows = None
                # Rewrite the summaries at most every 2 s while running (always at the end).
                if time.monotonic() - last_write[0] > 2.0:
                    rows = store.write_summary(runs, settings)
                    last_write[0] = time.monotonic()
                row = next((r for r in rows if r["run_id"] == spec.run_id), None) if rows else \
                    store.summary_row(spec, [])
                reporter.finished(spec, row, info)

            if use_ray:
                from app.batch.ray import run_ray

                env_extra = cpu_threads_env({}, workers) if (workers and arch == "cpu") else {}
                facts = run_ray(todo, argv_fn, store.new_tmp, on_result, ray_address or None, arch, record,
                                workers=workers, timeout=timeout, env_extra=env_extra)
                settings = {**settings, **facts}
            else:
                run_processes(todo, argv_fn, store.new_tmp, on_result, workers, slot_envs(workers, gpus), record,
                              timeout=timeout)
        rows = store.write_summary(runs, settings)
    except KeyboardInterrupt:
        rows = store.write_summary(runs, settings)
        console.print(f"interrupted: {len(rows)} of {len(runs)} runs finished; the same command with --resume "
                      "finishes the rest", highlight=False)
        raise
    finally:
        store.close()
    ok = sum(r["status"] == "ok" for r in rows)
    return {"total": len(runs), "skipped": skipped, "ok": ok, "failed": len(rows) - ok, "rows": rows,
            "wall_time_s": time.perf_counter() - t0}


def _default_argv(spec: RunSpec, out_dir, scene_path=None, *, frames: int, arch: str, record: bool,
                  strict: bool = False) -> list[str]:
    argv = headless_argv(spec, frames, arch or "auto", record, str(out_dir), scene_path=scene_path, strict=strict)
    if not arch:  # no --arch given: leave the scene's sim.arch in charge
        i = argv.index("--arch")
        del argv[i:i + 2]
    return argv


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    runs, settings = plan_from_args(args)
    console = Console(stderr=True)
    terminate_as_exception()   # (SIGTERM stops the batch like Ctrl-C: running processes stopped, finished runs kept)
    res = run_batch(runs, settings, args.out, workers=args.workers, resume=args.resume, ray_address=args.ray,
                    timeout=args.timeout, console=console, command=["run.py", "batch", *argv])
    console.print(
        f"{res['total']} runs: {res['ok']} ok, {res['failed']} failed"
        + (f" ({res['skipped']} complete before --resume)" if res["skipped"] else "")
        + f" in {res['wall_time_s']:.1f} s; summary in {os.path.join(args.out, 'summary.csv')}",
        highlight=False,
    )
    return 0 if res["failed"] == 0 else 1
