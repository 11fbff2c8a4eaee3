"""The on-disk layout of a batch, and the only code that writes into it.

    DIR/
      batch.json            the plan: command line, frames, arch, record and every run's parameters
      summary.csv           one row per finished run (rewritten after each run, atomically)
      summary.json          the same rows, plus the batch settings
      RUN_ID/               one per finished run, ok or failed:
        metrics.json state.npz [trajectory.npz]    what a headless run writes (ok runs)
        run.json            status, error, exit code, wall time, worker (GPU, host), the command
        log.txt             the worker's stderr
      .tmp/                 runs in progress; each is renamed to DIR/RUN_ID when it ends
      .lock                 pid of the batch writing here

A run directory appears in one rename, so a DIR/RUN_ID that exists is whole. ``--resume`` skips the
runs whose directory says ``ok`` and redoes the rest (failed ones included).
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

from app.batch.plan import RunSpec, scene_seed
from app.errors import UserError
from app.files import read_json_object, write_text_atomic

RESULT_FILES = ("metrics.json", "state.npz")
RECORD_FILE = "trajectory.npz"
SUMMARY_METRICS = ("steps_per_second", "final_kinetic_energy", "max_penetration", "contacts_max")
# Settings that must match for --resume to reuse finished runs (a run id does not show them).
RESUME_KEYS = ("frames", "arch", "record", "strict")
# A batch.json without a key had its default.
RESUME_DEFAULTS = {"strict": False}


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def metrics_summary(metrics: dict) -> dict:
    """The summary's numbers from a metrics.json (app.headless writes them); missing ones are None."""

    def num(x):
        try:
            x = float(x)
        except (TypeError, ValueError):
            return None
        return x if math.isfinite(x) else None

    ke = metrics.get("kinetic_energy")
    if isinstance(ke, list):
        ke = ke[-1] if ke else None
    elif isinstance(ke, dict):  # tolerate {"per_frame": [...]} / {"final": x}
        ke = ke.get("final", (ke.get("per_frame") or [None])[-1])
    contacts = metrics.get("contacts")
    cmax = contacts.get("max") if isinstance(contacts, dict) else None
    return {
        "steps_per_second": num(metrics.get("steps_per_second")),
        "final_kinetic_energy": num(ke),
        "max_penetration": num(metrics.get("max_penetration")),
        "contacts_max": None if cmax is None else int(cmax),
    }


class BatchDir:
    """Owns DIR: the lock, temporary run directories, finished runs and the summaries."""

    def __init__(self, out: str | os.PathLike):
        self.root = Path(out)
        self.tmp_root = self.root / ".tmp"
        self.lock_path = self.root / ".lock"
        self._locked = False
        self._rows: dict[str, dict] = {}  # summary rows of finished runs, by run id

    # ------------------------------------------------------------------------------------------ setup

    def open(self, config: dict, resume: bool) -> None:
        """Create DIR (or check that --resume matches it), take the lock, clear stale temporaries."""
        if self.root.exists() and not self.root.is_dir():
            raise UserError(f"--out {self.root}: exists and is not a directory")
        batch_json = self.root / "batch.json"
        if batch_json.exists():
            if not resume:
                raise UserError(
                    f"--out {self.root}: already holds a batch; add --resume to finish it, or choose another --out"
                )
            try:
                old = read_json_object(batch_json)
            except (OSError, ValueError) as e:
                raise UserError(f"--out {self.root}: batch.json unreadable ({e}); choose another --out") from None
            for key in RESUME_KEYS:
                if old.get(key, RESUME_DEFAULTS.get(key)) != config.get(key, RESUME_DEFAULTS.get(key)):
                    raise UserError(
                        f"--resume: --{key} {config.get(key)!r} differs from the batch in {self.root} "
                        f"({old.get(key)!r}); use the same settings or another --out"
                    )
        elif self.root.is_dir() and any(p for p in self.root.iterdir() if p.name not in (".tmp", ".lock")):
            if not resume:
                raise UserError(f"--out {self.root}: directory exists and is not empty; choose another --out")
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock()
        shutil.rmtree(self.tmp_root, ignore_errors=True)  # runs in progress when a batch was killed
        self.tmp_root.mkdir()
        write_text_atomic(batch_json, json.dumps(config, indent=2))

    def _lock(self) -> None:
        for _ in range(2):
            try:
                fd = os.open(self.lock_path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                try:
                    pid = int(self.lock_path.read_text().strip() or 0)
                except (OSError, ValueError):
                    pid = 0
                if pid and pid != os.getpid() and _pid_alive(pid):
                    raise UserError(f"--out {self.root}: another batch (pid {pid}) is writing there") from None
                self.lock_path.unlink(missing_ok=True)  # stale: that batch died
                continue
            with os.fdopen(fd, "w") as f:
                f.write(str(os.getpid()))
            self._locked = True
            return
        raise UserError(f"--out {self.root}: could not take the lock {self.lock_path}")

    def close(self) -> None:
        shutil.rmtree(self.tmp_root, ignore_errors=True)
        if self._locked:
            self.lock_path.unlink(missing_ok=True)
            self._locked = False

    # ------------------------------------------------------------------------------------------ runs

    def new_tmp(self, run_id: str) -> Path:
        return Path(tempfile.mkdtemp(prefix=f"{run_id}.", dir=self.tmp_root))

    def run_dir(self, run_id: str) -> Path:
        return self.root / run_id

    def read_run(self, run_id: str) -> dict | None:
        try:
            return read_json_object(self.run_dir(run_id) / "run.json")
        except (OSError, ValueError):
            return None

    def is_complete(self, spec: RunSpec, record: bool) -> bool:
        """A finished ok run with all its files: what --resume skips."""
        info = self.read_run(spec.run_id)
        if not info or info.get("status") != "ok":
            return False
        files = RESULT_FILES + ((RECORD_FILE,) if record else ())
        return all((self.run_dir(spec.run_id) / f).is_file() for f in files)

    def finalize(self, spec: RunSpec, tmp: Path, result: dict) -> dict:
        """Write run.json and log.txt into ``tmp`` and rename it to DIR/RUN_ID (replacing an earlier
        failed attempt). ``result`` has status, error, returncode, wall_time_s, log, worker, command."""
        info = {
            **spec.to_json(),
            "status": result["status"],
            "error": result.get("error", ""),
            "returncode": result.get("returncode"),
            "wall_time_s": result.get("wall_time_s"),
            "worker": result.get("worker", {}),
            "command": result.get("command", []),
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
        write_text_atomic(tmp / "log.txt", result.get("log", ""))
        write_text_atomic(tmp / "run.json", json.dumps(info, indent=2))
        final = self.run_dir(spec.run_id)
        if final.exists():
            trash = Path(tempfile.mkdtemp(prefix=f"{spec.run_id}.old.", dir=self.tmp_root))
            os.replace(final, trash / "old")
            shutil.rmtree(trash, ignore_errors=True)
        os.replace(tmp, final)
        self._rows.pop(spec.run_id, None)
        return info

    # ------------------------------------------------------------------------------------------ summary

    def summary_row(self, spec: RunSpec, param_keys: list[str]) -> dict | None:
        """The summary row of a finished run (None while it has not finished)."""
        info = self.read_run(spec.run_id)
        if info is None:
            return None
        params = dict(spec.params)
        row = {
            "run_id": spec.run_id,
            "scene": spec.scene,
            "seed": spec.seed if spec.seed is not None else scene_seed(spec.scene_path),
        }
        row.update({k: params.get(k, "") for k in param_keys})
        row["status"] = info.get("status", "failed")
        row["error"] = info.get("error", "")
        metrics = {}
        if row["status"] == "ok":
            try:
                metrics = read_json_object(self.run_dir(spec.run_id) / "metrics.json")
            except (OSError, ValueError) as e:
                row["status"], row["error"] = "failed", f"metrics.json unreadable: {e}"
        row.update(metrics_summary(metrics))
        row["wall_time_s"] = info.get("wall_time_s")
        return row

    def write_summary(self, runs: list[RunSpec], settings: dict) -> list[dict]:
        """Rewrite summary.csv and summary.json from the run directories (rows in plan order)."""
        param_keys = list(dict.fromkeys(k for r in runs for k, _ in r.params))
        rows = []
        for r in runs:
            if r.run_id not in self._rows:
                row = self.summary_row(r, param_keys)
                if row is None:
                    continue
                self._rows[r.run_id] = row
            rows.append(self._rows[r.run_id])
        columns = ["run_id", "scene", "seed", *param_keys, "status", "error", *SUMMARY_METRICS, "wall_time_s"]
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in columns})
        write_text_atomic(self.root / "summary.csv", buf.getvalue())
        doc = {
            **settings,
            "columns": columns,
            "parameters": param_keys,
            "runs_planned": len(runs),
            "ok": sum(r["status"] == "ok" for r in rows),
            "failed": sum(r["status"] != "ok" for r in rows),
            "rows": rows,
        }
        write_text_atomic(self.root / "summary.json", json.dumps(doc, indent=2))
        return rows


def worker_info(gpu: str | None = None) -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid(), "gpu": gpu}
