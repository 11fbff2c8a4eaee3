"""Batches of the real simulator: ``python run.py batch`` driving ``run.py SCENE --headless`` processes.

All runs use tests/batch/batch_tiny.yaml (6 spheres, 3 frames of 4 substeps) on the CPU, so a run costs
about the Taichi start-up. They cover:

- a sweep of 2 seeds x 2 values, one value invalid: 2 ok rows, 2 failed rows with the reason, exit 1;
- killing a batch of 3 runs midway (SIGKILL to its whole process group, as when the machine stops) and resuming
  finishes without redoing the finished runs (their file times are unchanged);
- a worker killed by a signal is reported failed while the other runs finish;
- the Ray backend on a local CPU Ray gives the same summary as the process backend.
"""
import csv
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCENE = "tests/batch/batch_tiny.yaml"
FRAMES = "3"
SWEEP = ["--seeds", "0-1", "--set", "sim.solver_iterations=4,-1"]
# Columns that measure this machine, not the simulation: they differ between any two runs.
TIMING_COLUMNS = ("steps_per_second", "wall_time_s")
# Physics columns must agree between the backends. Each run is the same deterministic program with the
# same inputs, and the motion is bit-identical (the solver's fixed-point sums, Taichi without fast math), but
# the final kinetic energy is a parallel f64 reduction whose rounding depends on the order in which threads
# add, so floats are compared to a relative 1e-6 rather than bit for bit.
PHYSICS_RTOL = 1e-6


# A run's first compile of the simulator on the CPU takes ~40 s on a 2-core machine with a cold Taichi cache, and a
# batch starts two of them at once: the timeouts only catch hangs.
def batch(*args, timeout=600, **kw):
    return subprocess.run([sys.executable, "run.py", "batch", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, **kw)


def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def run_dirs(out):
    return sorted(p for p in Path(out).iterdir() if p.is_dir() and not p.name.startswith("."))


@pytest.fixture(scope="module")
def sweep_out(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep") / "out"
    p = batch(SCENE, *SWEEP, "--frames", FRAMES, "--out", str(out), "--workers", "2", "--arch", "cpu")
    return out, p


def test_sweep_with_an_invalid_value_gives_failed_rows_with_the_reason(sweep_out):
    out, p = sweep_out
    assert p.returncode == 1, p.stderr
    rows = read_csv(out / "summary.csv")
    assert len(rows) == 4
    assert list(rows[0])[:6] == ["run_id", "scene", "seed", "sim.solver_iterations", "status", "error"]
    ok = [r for r in rows if r["status"] == "ok"]
    failed = [r for r in rows if r["status"] == "failed"]
    assert sorted((r["seed"], r["sim.solver_iterations"]) for r in ok) == [(str(s), "4") for s in range(2)]
    assert sorted((r["seed"], r["sim.solver_iterations"]) for r in failed) == [(str(s), "-1") for s in range(2)]
    for r in failed:
        # The worker's own one-line message: exit code 2, the file, the key path and what was expected.
        assert r["error"].startswith("exit 2: "), r["error"]
        assert "sim.solver_iterations" in r["error"] and "expected" in r["error"] and "-1" in r["error"]
    for r in ok:
        assert r["error"] == ""
        assert r["run_id"] == f"batch_tiny__seed{r['seed']}__sim.solver_iterations=4"
        assert float(r["steps_per_second"]) > 0
        assert math.isfinite(float(r["final_kinetic_energy"])) and float(r["final_kinetic_energy"]) > 0
        assert float(r["max_penetration"]) >= 0 and int(r["contacts_max"]) >= 0
        run = out / r["run_id"]
        assert {"metrics.json", "state.npz", "run.json", "log.txt"} <= {f.name for f in run.iterdir()}
        metrics = json.loads((run / "metrics.json").read_text())
        assert metrics["frames"] == int(FRAMES) and len(metrics["kinetic_energy"]) == int(FRAMES)
    # The seed reaches the simulator: different seeds start the spheres in different places.
    import numpy as np

    starts = {r["seed"]: np.load(out / r["run_id"] / "state.npz")["position"] for r in ok}
    assert not np.allclose(starts["0"], starts["1"])
    assert "4 runs: 2 ok, 2 failed" in p.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["ok"], summary["failed"]) == (2, 2)


def test_report_on_a_real_batch(sweep_out):
    out, _ = sweep_out
    p = subprocess.run([sys.executable, "run.py", "report", str(out)], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    assert "4 runs: 2 ok, 2 failed" in p.stdout
    for name in ("kinetic_energy.png", "contacts.png", "steps_per_second.png"):
        assert (out / "report" / name).stat().st_size > 5000


def test_ray_backend_gives_the_same_summary(sweep_out, tmp_path):
    pytest.importorskip("ray", reason="ray is the cluster extra: pip install -e .[cluster]")
    out, _ = sweep_out
    ray_out = tmp_path / "ray"
    p = batch(SCENE, *SWEEP, "--frames", FRAMES, "--out", str(ray_out), "--workers", "2", "--arch", "cpu",
              "--ray", timeout=300)
    assert p.returncode == 1, p.stderr
    a, b = read_csv(out / "summary.csv"), read_csv(ray_out / "summary.csv")
    assert list(a[0]) == list(b[0])
    assert len(a) == len(b) == 4
    for ra, rb in zip(a, b):
        for col in ra:
            if col in TIMING_COLUMNS:
                assert (ra[col] == "") == (rb[col] == ""), col
            elif col in ("final_kinetic_energy", "max_penetration") and ra[col]:
                assert math.isclose(float(ra[col]), float(rb[col]), rel_tol=PHYSICS_RTOL, abs_tol=1e-12), col
            elif col == "error":  # the same message, only the scene's path may be spelled differently
                assert ra[col].replace(str(ROOT) + os.sep, "") == rb[col].replace(str(ROOT) + os.sep, ""), col
            else:
                assert ra[col] == rb[col], col
    # Same layout, written by the driver.
    names = lambda d: [x.name for x in run_dirs(d) if x.name != "report"]  # noqa: E731
    assert names(out) == names(ray_out)
    info = json.loads((ray_out / "batch_tiny__seed0__sim.solver_iterations=4" / "run.json").read_text())
    assert info["status"] == "ok" and info["worker"]["host"]
    assert json.loads((ray_out / "summary.json").read_text())["backend"] == "ray"


def _children(pid):
    kids = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids += [int(x) for x in (task / "children").read_text().split()]
        except OSError:
            pass
    return kids


def _cmdline(pid):
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return []


def test_killed_batch_resumes_without_redoing_finished_runs(tmp_path):
    out = tmp_path / "out"
    args = [SCENE, "--seeds", "0-2", "--frames", FRAMES, "--out", str(out), "--workers", "1", "--arch", "cpu"]
    # Its own session, so SIGKILL to the group takes the batch and its running worker at once.
    proc = subprocess.Popen([sys.executable, "run.py", "batch", *args], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    # Generous: with Taichi's offline cache empty (a fresh machine), the first run compiles every kernel (~15 s on a
    # 2-core CPU); with the cache warm, two runs finish in ~10 s and the wait ends there. Runs take turns (one
    # worker), so the third is under way when the batch is killed.
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and len(run_dirs(out) if out.exists() else []) < 2:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done = [d.name for d in run_dirs(out)]
    assert len(done) == 2, done
    mtimes = {d: {f.name: f.stat().st_mtime_ns for f in (out / d).iterdir()} for d in done}

    p = batch(*args)
    assert p.returncode == 2 and "already holds a batch; add --resume" in p.stderr  # never overwrites
    p = batch(*args, "--resume")
    assert p.returncode == 0, p.stderr
    assert "resume: 2 of 3 runs already complete" in p.stderr
    for d, files in mtimes.items():
        assert {f.name: f.stat().st_mtime_ns for f in (out / d).iterdir()} == files, f"{d} was redone"
    rows = read_csv(out / "summary.csv")
    assert [r["status"] for r in rows] == ["ok"] * 3
    assert [r["seed"] for r in rows] == [str(s) for s in range(3)]
    assert not (out / ".tmp").exists() and not (out / ".lock").exists()


def test_worker_killed_by_a_signal_is_failed_and_the_rest_finish(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "run.py", "batch", SCENE, "--seeds", "0-2", "--frames", FRAMES, "--out", str(out),
         "--workers", "1", "--arch", "cpu"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    victim = None
    deadline = time.monotonic() + 600   # (seed 0 runs first: with a cold Taichi cache it compiles for minutes)
    while victim is None and time.monotonic() < deadline and proc.poll() is None:
        for kid in _children(proc.pid):
            if b"sim.seed=1" in _cmdline(kid):
                victim = kid
                os.kill(kid, signal.SIGKILL)
                break
        time.sleep(0.01)
    _, err = proc.communicate(timeout=900)
    assert victim is not None, "never saw the worker of seed 1"
    assert proc.returncode == 1, err
    rows = {r["seed"]: r for r in read_csv(out / "summary.csv")}
    assert rows["1"]["status"] == "failed" and rows["1"]["error"] == "killed by SIGKILL"
    assert rows["0"]["status"] == "ok" and rows["2"]["status"] == "ok"
    assert json.loads((out / rows["1"]["run_id"] / "run.json").read_text())["returncode"] == -signal.SIGKILL


def test_a_driver_killed_outright_takes_its_worker_with_it(tmp_path):
    """SIGKILL to the batch driver alone (not its process group): its running worker gets SIGTERM from the kernel
    (PR_SET_PDEATHSIG) and ends, instead of running on with nobody to collect its result."""
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "run.py", "batch", SCENE, "--seeds", "0", "--frames", "100000", "--out",
                             str(out), "--workers", "1", "--arch", "cpu"], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    worker = None
    deadline = time.monotonic() + 120
    while worker is None and time.monotonic() < deadline and proc.poll() is None:
        worker = next((k for k in _children(proc.pid) if b"--headless" in _cmdline(k)), None)
        time.sleep(0.02)
    assert worker is not None, "never saw the worker"
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and Path(f"/proc/{worker}").exists() and \
            b"zombie" not in Path(f"/proc/{worker}/status").read_bytes().lower():
        time.sleep(0.05)
    gone = not Path(f"/proc/{worker}").exists() or b"zombie" in Path(f"/proc/{worker}/status").read_bytes().lower()
    if not gone:
        os.kill(worker, signal.SIGKILL)
    assert gone, "the worker ran on after its driver was killed"
