"""Ray backend: the same runs as Ray tasks, results written by the driver in the same layout.

Each task runs the same headless process as the local backend (``run_worker``) in a temporary directory
on whatever node Ray picked, and returns the run's files as bytes; the driver writes them into DIR, so
the nodes need no shared filesystem. A task asks for one CPU, and one GPU when the arch is cuda (or auto
on a cluster that has GPUs); Ray then sets CUDA_VISIBLE_DEVICES for it. Without an address a local Ray
is started just for the batch and shut down after it.

``ray`` is optional (``pip install -e .[cluster]``) and imported only here, only when --ray is given.
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from app.batch.plan import RunSpec
from app.batch.worker import RUN_PY, run_worker
from app.errors import UserError


def import_ray():
    try:
        import ray
    except ImportError:
        raise UserError("--ray: the 'ray' package is not installed; install it with: pip install -e .[cluster]") from None
    return ray


def _ray_task(spec: RunSpec, scene_text: bytes, argv_fn, record: bool, timeout: float | None, env_extra: dict) -> dict:
    """Body of one Ray task (runs on a Ray worker): the run in a private temporary directory, its files
    returned as bytes."""
    from app.batch.store import worker_info

    work = Path(tempfile.mkdtemp(prefix=f"smolvla-{spec.run_id}."))
    try:
        scene_path = spec.scene_path
        # On another node the driver's path may not exist (or hold another file): use the shipped text.
        if not (Path(scene_path).is_file() and Path(scene_path).read_bytes() == scene_text):
            scene_path = str(work / "scene" / Path(spec.scene_path).name)
            Path(scene_path).parent.mkdir()
            Path(scene_path).write_bytes(scene_text)
        out = work / "out"
        from app.batch.process import NO_NVLS_ENV

        env = {**NO_NVLS_ENV, **os.environ, **env_extra}  # NVLink multicast off unless the user set it
        result = run_worker(argv_fn(spec, out, scene_path=scene_path), out, record, env=env, timeout=timeout)
        result["files"] = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} if out.is_dir() else {}
        result["worker"] = worker_info(os.environ.get("CUDA_VISIBLE_DEVICES"))
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)


def repo_root() -> str:
    return str(RUN_PY.parent)


def task_error(e: BaseException) -> str:
    """One line for a failed Ray task: the last line of its error, without terminal colours."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e))
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return f"ray task failed: {type(e).__name__}: {lines[-1] if lines else ''}"


def _ray_init(ray, address: str | None, workers: int | None) -> bool:
    """Connect to ``address`` or start a light local Ray; True when this call started/connected it."""
    if ray.is_initialized():
        return False
    import logging

    common = dict(include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    try:
        if address:
            # Ship the project to the cluster's workers (run.py, app/, vla/), not outputs or history.
            runtime_env = {"working_dir": repo_root(),
                           "excludes": [".git", "**/__pycache__", "*.npz", "*.png", "*.mp4", "out", "runs"]}
            ray.init(address=address, runtime_env=runtime_env, **common)
        else:
            # Local workers import app/ from this checkout even when the project is not pip-installed.
            path = os.pathsep.join(p for p in (repo_root(), os.environ.get("PYTHONPATH", "")) if p)
            ray.init(num_cpus=workers or os.cpu_count() or 1, runtime_env={"env_vars": {"PYTHONPATH": path}},
                     **common)
    except Exception as e:  # ConnectionError, ValueError for a malformed address, ...
        where = f"the Ray cluster at {address}" if address else "a local Ray"
        raise UserError(f"--ray: could not start or reach {where}: {type(e).__name__}: {e}") from None
    return True


def run_ray(
    specs: list[RunSpec],
    argv_fn: Callable[..., list],
    new_tmp: Callable[[str], Path],
    on_result: Callable[[RunSpec, Path, dict], None],
    address: str | None,
    arch: str | None,
    record: bool,
    workers: int | None = None,
    timeout: float | None = None,
    env_extra: dict | None = None,
) -> dict:
    """Run every spec as a Ray task, at most ``workers`` in flight when given; call ``on_result`` on the
    driver for each as it ends. Returns facts about the cluster for batch.json."""
    ray = import_ray()
    started = _ray_init(ray, address, workers)
    refs: dict = {}
    try:
        resources = ray.cluster_resources()
        gpus = int(resources.get("GPU", 0))
        if arch == "cuda" and gpus == 0:
            raise UserError("--arch cuda with --ray: the Ray cluster has no GPUs (ray.cluster_resources() shows none)")
        num_gpus = 1 if (arch == "cuda" or (arch in (None, "auto") and gpus > 0)) else 0
        task = ray.remote(_ray_task).options(num_cpus=1, num_gpus=num_gpus, max_retries=2, retry_exceptions=False)
        scene_bytes: dict[str, bytes] = {}
        for s in specs:
            if s.scene_path not in scene_bytes:
                scene_bytes[s.scene_path] = Path(s.scene_path).read_bytes()
        scene_refs = {p: ray.put(b) for p, b in scene_bytes.items()}
        pending = list(specs)
        limit = workers or len(specs)

        def submit():
            while pending and len(refs) < limit:
                spec = pending.pop(0)
                ref = task.remote(spec, scene_refs[spec.scene_path], argv_fn, record, timeout, env_extra or {})
                refs[ref] = spec

        submit()
        while refs:
            ready, _ = ray.wait(list(refs), num_returns=1, timeout=0.5)
            for ref in ready:
                spec = refs.pop(ref)
                try:
                    result = ray.get(ref)
                except Exception as e:  # the task (not the simulation) failed: node lost, worker crashed, ...
                    result = {"status": "failed", "error": task_error(e),
                              "returncode": None, "wall_time_s": None, "log": str(e), "command": []}
                tmp = new_tmp(spec.run_id)
                for name, data in result.pop("files", {}).items():
                    (tmp / name).write_bytes(data)
                on_result(spec, tmp, result)
            submit()
        return {"ray_resources": {k: v for k, v in resources.items() if k in ("CPU", "GPU")},
                "ray_address": address or "local", "num_gpus_per_task": num_gpus}
    except BaseException:
        for ref in list(refs):
            try:
                ray.cancel(ref, force=True)
            except Exception:
                pass
        raise
    finally:
        if started:
            ray.shutdown()
