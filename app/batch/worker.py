"""One run of a batch: a headless ``run.py`` in its own process, and how its end is read.

Each run is a fresh process (one Taichi runtime per run), so a run that crashes, runs out of memory or is
killed by a signal fails alone. Both backends (local processes, Ray tasks) call ``run_worker``; only where
it runs differs. The worker writes into a temporary directory; the batch renames it into place.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from app.batch.plan import RunSpec
from app.errors import PARENT_PID_ENV
from app.batch.store import RECORD_FILE, RESULT_FILES

RUN_PY = Path(__file__).resolve().parents[2] / "run.py"
LOG_TAIL_CHARS = 20_000


def headless_argv(spec: RunSpec, frames: int, arch: str, record: bool, out_dir: str, scene_path: str | None = None,
                  strict: bool = False) -> list[str]:
    """The command of one run: ``python run.py SCENE --headless --frames N --out TMP --arch A [--record] [--strict]
    [--set k=v ...]`` (one ``--set`` per override)."""
    # The scene as the user wrote it (workers share the batch's working directory), so messages name it
    # the same way; Ray tasks pass their own path.
    argv = [sys.executable, str(RUN_PY), scene_path or spec.scene, "--headless", "--frames", str(frames),
            "--out", str(out_dir), "--arch", arch]
    if record:
        argv.append("--record")
    if strict:
        argv.append("--strict")
    for override in spec.overrides:
        argv += ["--set", override]
    return argv


def describe_exit(returncode: int, log: str) -> str:
    """A one-line reason for a failed run: the signal that killed it, or the worker's own error line
    (``error: ...`` from run.py, else the last line such as a Python exception) with its exit code."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name}"
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.lower().startswith("error")]
    reason = errors[-1] if errors else (lines[-1] if lines else "no output")
    if reason.lower().startswith("error:"):
        reason = reason[len("error:"):].strip()
    return f"exit {returncode}: {reason}"


def check_outputs(out_dir: Path, record: bool) -> str:
    """'' when the run wrote everything it should, else what is missing."""
    files = RESULT_FILES + ((RECORD_FILE,) if record else ())
    missing = [f for f in files if not (out_dir / f).is_file()]
    return f"exited 0 but wrote no {', '.join(missing)}" if missing else ""


def run_worker(
    argv: list[str],
    out_dir: Path,
    record: bool,
    env: dict | None = None,
    timeout: float | None = None,
    on_start: Callable[[subprocess.Popen], None] | None = None,
    cwd: str | None = None,
) -> dict:
    """Run ``argv`` (which writes into ``out_dir``) to its end and classify it.

    Returns ``{"status": "ok"|"failed", "error", "returncode", "wall_time_s", "log", "command"}``; the log is
    the worker's stdout and stderr together (its last LOG_TAIL_CHARS)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    log_path = out_dir.parent / f"{out_dir.name}.log"
    t0 = time.perf_counter()
    timed_out = False
    with open(log_path, "wb") as log_file:
        # the worker ends with this process (app.errors.die_with_parent)
        env = {**(os.environ if env is None else env), PARENT_PID_ENV: str(os.getpid())}
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                                env=env, cwd=cwd)
        if on_start is not None:
            on_start(proc)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            stop_process(proc)
        except BaseException:
            stop_process(proc)
            raise
    wall = time.perf_counter() - t0
    log = log_path.read_bytes()[-LOG_TAIL_CHARS:].decode("utf-8", "replace")
    log_path.unlink(missing_ok=True)
    rc = proc.returncode
    if timed_out:
        status, error = "failed", f"timed out after {timeout:g} s (--timeout)"
    elif rc != 0:
        status, error = "failed", describe_exit(rc, log)
    else:
        error = check_outputs(out_dir, record)
        status = "failed" if error else "ok"
    return {"status": status, "error": error, "returncode": rc, "wall_time_s": round(wall, 3), "log": log,
            "command": list(argv)}


def stop_process(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after ``grace_s``."""
    if proc.poll() is not None:
        return
    try:
        proc.terminate()
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    except ProcessLookupError:
        pass


def cpu_threads_env(env: dict, workers: int) -> dict:
    """Split the CPU cores between concurrent Taichi CPU runtimes (TI_CPU_MAX_NUM_THREADS, read by
    ti.init) unless the user set it: K runtimes each spawning one thread per core oversubscribe K-fold."""
    if workers > 1 and "TI_CPU_MAX_NUM_THREADS" not in env:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        env = {**env, "TI_CPU_MAX_NUM_THREADS": str(max(1, cores // workers))}
    return env
