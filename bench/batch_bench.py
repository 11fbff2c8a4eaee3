"""Batch throughput: runs per hour of ``python run.py batch`` for 1, 2, ... workers.

    python run.py bench batch [--scene scenes/default.yaml] [--frames 60] [--runs 4] [--workers 1,2]
                              [--arch cpu|cuda|auto] [--out DIR] [--json FILE]
    python -m bench.batch_bench ...            (the same)

For each worker count it runs the real command, ``run.py batch SCENE --seeds 0-(R-1) --frames F --workers K``,
end to end (process start, Taichi start-up and kernel compilation from the offline cache, the simulation,
writing results), and reports ok runs x 3600 / wall time. One warm-up run first fills Taichi's offline
kernel cache so that every worker count starts from the same warm cache. On a machine with G GPUs,
``--workers 1,G --arch cuda`` measures one GPU against all of them (each worker gets its own GPU).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from app.files import write_text_atomic

ROOT = Path(__file__).resolve().parent.parent


def _batch(args: list[str]) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, str(ROOT / "run.py"), "batch", *args], capture_output=True, text=True,
                       cwd=ROOT)
    return time.perf_counter() - t0, p


def measure(scene: str, frames: int, runs: int, workers: int, arch: str, out: Path) -> dict:
    wall, p = _batch([scene, "--seeds", f"0-{runs - 1}", "--frames", str(frames), "--out", str(out),
                      "--workers", str(workers), "--arch", arch])
    try:
        summary = json.loads((out / "summary.json").read_text())
    except (OSError, ValueError):
        raise SystemExit(f"batch with {workers} workers wrote no summary (exit {p.returncode}):\n{p.stderr[-2000:]}")
    rows = summary["rows"]
    ok = [r for r in rows if r["status"] == "ok"]
    run_walls = [r["wall_time_s"] for r in ok if r.get("wall_time_s")]
    sps = [r["steps_per_second"] for r in ok if r.get("steps_per_second")]
    return {
        "workers": workers,
        "runs": len(rows),
        "ok": len(ok),
        "wall_s": round(wall, 2),
        "runs_per_hour": round(len(ok) * 3600.0 / wall, 1),
        "mean_run_wall_s": round(sum(run_walls) / len(run_walls), 2) if run_walls else None,
        "mean_steps_per_second": round(sum(sps) / len(sps), 1) if sps else None,
        "exit_code": p.returncode,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="run.py bench batch", description=__doc__.split("\n\n")[0])
    p.add_argument("--scene", default="scenes/default.yaml")
    p.add_argument("--frames", type=int, default=60)
    p.add_argument("--runs", type=int, default=4, help="runs per worker count (seeds 0..runs-1)")
    p.add_argument("--workers", default="1,2", help="comma-separated worker counts")
    p.add_argument("--arch", default="cpu", choices=("cpu", "cuda", "auto"))
    p.add_argument("--out", help="keep the batches here (default: a temporary directory, removed)")
    p.add_argument("--json", help="also write the results to this JSON file")
    args = p.parse_args(argv)
    workers = [int(w) for w in args.workers.split(",") if w.strip()]
    scene = str(Path(args.scene).resolve())
    base = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="batch_bench."))
    base.mkdir(parents=True, exist_ok=True)
    try:
        warm, wp = _batch([scene, "--frames", "1", "--out", str(base / "warmup"), "--arch", args.arch])
        if wp.returncode != 0:
            print(wp.stderr[-3000:], file=sys.stderr)
            return 1
        results = [measure(scene, args.frames, args.runs, k, args.arch, base / f"workers{k}") for k in workers]
    finally:
        if not args.out:
            shutil.rmtree(base, ignore_errors=True)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    head = (f"batch throughput: {Path(args.scene).name}, {args.frames} frames/run, {args.runs} runs, arch {args.arch}, "
            f"{platform.machine()} with {cores} cores (warm-up run {warm:.1f} s)")
    print(head)
    print("| workers | runs ok | wall (s) | runs/hour | mean run wall (s) | mean steps/s per run |")
    print("|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['workers']} | {r['ok']}/{r['runs']} | {r['wall_s']} | {r['runs_per_hour']} | "
              f"{r['mean_run_wall_s']} | {r['mean_steps_per_second']} |")
    if args.json:
        write_text_atomic(args.json, json.dumps({"title": head, "command": ["bench", "batch", *(argv or sys.argv[1:])],
                                                 "results": results}, indent=2))
    return 0 if all(r["ok"] == r["runs"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
