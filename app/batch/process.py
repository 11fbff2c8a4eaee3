"""Local backend: K worker slots, each running one run process at a time.

Slot i owns GPU ``gpus[i % len(gpus)]`` (set as CUDA_VISIBLE_DEVICES for its processes), so with K
workers and K GPUs every GPU runs one simulation at a time. Slots are threads that only start processes
and wait on them; all results are handed to the caller on the calling thread, in completion order.
"""
from __future__ import annotations

import os
import queue
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Callable

from app.batch.plan import RunSpec
from app.errors import raise_if_signalled
from app.batch.store import worker_info
from app.batch.worker import cpu_threads_env, run_worker, stop_process

ArgvFn = Callable[..., list]  # (spec, out_dir) -> argv
ResultFn = Callable[[RunSpec, Path, dict], None]  # (spec, tmp dir with the run's files, result)


def detect_gpus() -> list[str]:
    """GPU ids this process may use: CUDA_VISIBLE_DEVICES when set, else those ``nvidia-smi -L`` lists."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [g.strip() for g in visible.split(",") if g.strip() and g.strip() != "-1"]
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, line in enumerate(ln for ln in out.splitlines() if ln.startswith("GPU "))]


# Every GPU worker runs with NVLink multicast off (the lent multi-GPU machines require it; our workers use
# no NCCL, so this changes nothing for them). A value the user set wins.
NO_NVLS_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def slot_envs(workers: int, gpus: list[str], base_env: dict | None = None) -> list[dict]:
    """The environment of each worker slot: its GPU when there are GPUs, else a share of the CPU cores."""
    base = dict(os.environ if base_env is None else base_env)
    if gpus:
        base = {**NO_NVLS_ENV, **base}
        return [{**base, "CUDA_VISIBLE_DEVICES": gpus[i % len(gpus)]} for i in range(workers)]
    return [cpu_threads_env(base, workers) for _ in range(workers)]


def run_processes(
    specs: list[RunSpec],
    argv_fn: ArgvFn,
    new_tmp: Callable[[str], Path],
    on_result: ResultFn,
    workers: int,
    envs: list[dict],
    record: bool,
    timeout: float | None = None,
) -> None:
    """Run every spec (at most ``workers`` at once) and call ``on_result`` for each as it ends.

    On KeyboardInterrupt (Ctrl-C, or SIGTERM turned into one by the caller) the running processes are
    stopped, their results dropped (they are redone by --resume), and the interrupt re-raised."""
    todo: queue.Queue = queue.Queue()
    for s in specs:
        todo.put(s)
    done: queue.Queue = queue.Queue()
    stop = threading.Event()
    running: dict[int, subprocess.Popen] = {}
    lock = threading.Lock()

    def slot(i: int) -> None:
        env = envs[i]
        while not stop.is_set():
            try:
                spec = todo.get_nowait()
            except queue.Empty:
                return
            tmp = new_tmp(spec.run_id)
            try:

                def started(proc, i=i):
                    with lock:
                        running[i] = proc
                    if stop.is_set():
                        stop_process(proc)

                result = run_worker(argv_fn(spec, tmp), tmp, record, env=env, timeout=timeout, on_start=started)
                result["worker"] = {**worker_info(env.get("CUDA_VISIBLE_DEVICES") if "CUDA_VISIBLE_DEVICES" in env else None),
                                    "slot": i, "pid": running[i].pid if i in running else None}
            except Exception as e:  # the batch itself failed to start the run (e.g. argv_fn raised)
                result = {"status": "failed", "error": f"could not start the run: {type(e).__name__}: {e}",
                          "returncode": None, "wall_time_s": 0.0, "log": "", "command": []}
            finally:
                with lock:
                    running.pop(i, None)
            done.put((spec, tmp, result))

    threads = [threading.Thread(target=slot, args=(i,), daemon=True, name=f"batch-slot-{i}")
               for i in range(min(workers, len(specs)))]
    for t in threads:
        t.start()
    try:
        for _ in range(len(specs)):
            while True:
                try:
                    spec, tmp, result = done.get(timeout=0.2)
                    break
                except queue.Empty:
                    raise_if_signalled()   # (a Ctrl-C whose exception Python swallowed: app.errors)
                    if not any(t.is_alive() for t in threads) and done.empty():
                        raise RuntimeError("batch worker slots ended with runs left")  # a bug, not a run failure
            on_result(spec, tmp, result)
    except BaseException:
        stop.set()
        with lock:
            procs = list(running.values())
        for p in procs:
            stop_process(p)
        for t in threads:
            t.join(timeout=10)
        raise
    for t in threads:
        t.join()
