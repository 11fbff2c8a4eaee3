"""Batch orchestration with stand-in workers: plans, ids, summaries, failures, resume, CLI errors.

The stand-in (STANDIN below) is a small Python program with run.py's headless interface that writes
metrics.json and state.npz and behaves as its --set parameters say (fail, sleep, kill itself), so the
orchestration is tested with real subprocesses in well under a second per run. The tests that drive
the real simulator are in test_batch_sim.py.
"""
import csv
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from app.batch import cli as batch
from app.batch.plan import expand_runs, load_sweep, make_run_id, parse_seeds, parse_set, split_values
from app.batch.store import metrics_summary
from app.batch.worker import describe_exit
from app.errors import UserError

ROOT = Path(__file__).resolve().parents[2]

STANDIN = textwrap.dedent(
    r'''
    """Stand-in for `run.py SCENE --headless`: behaviour from --set test.* parameters."""
    import argparse, json, os, signal, sys, time
    import numpy as np
    p = argparse.ArgumentParser()
    p.add_argument("scene"); p.add_argument("--headless", action="store_true")
    p.add_argument("--frames", type=int); p.add_argument("--out"); p.add_argument("--arch")
    p.add_argument("--record", action="store_true"); p.add_argument("--set", action="append", default=[])
    a = p.parse_args()
    sets = dict(s.split("=", 1) for s in a.set)
    seed = int(sets.get("sim.seed", 0))
    mode = sets.get("test.mode", "ok")
    time.sleep(float(sets.get("test.sleep", 0)))
    if mode == "bad":
        print(f"error: {a.scene}: test.mode: expected ok, got 'bad'", file=sys.stderr); sys.exit(2)
    if mode == "nan":
        print("progress 10%"); print("error: NaN in body 3 at step 17", file=sys.stderr); sys.exit(1)
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "crash":
        raise RuntimeError("boom")
    os.makedirs(a.out, exist_ok=True)
    if mode != "nofiles":
        ke = [float(seed + i) for i in range(a.frames)]
        json.dump({"steps_per_second": 1000.0 + seed, "kinetic_energy": ke, "max_penetration": 0.001 * seed,
                   "contacts": {"max": 10 + seed, "mean": 5.0, "final": 7}, "frames": a.frames,
                   "env_gpu": os.environ.get("CUDA_VISIBLE_DEVICES"),
                   "env_threads": os.environ.get("TI_CPU_MAX_NUM_THREADS")}, open(os.path.join(a.out, "metrics.json"), "w"))
        np.savez(os.path.join(a.out, "state.npz"), position=np.zeros((2, 3)))
        if a.record:
            np.savez(os.path.join(a.out, "trajectory.npz"), time=np.zeros(a.frames))
    '''
)


@pytest.fixture
def standin(tmp_path):
    path = tmp_path / "standin.py"
    path.write_text(STANDIN)

    def argv_fn(spec, out_dir, scene_path=None):
        argv = [sys.executable, str(path), scene_path or spec.scene_path, "--headless", "--frames", "3",
                "--out", str(out_dir)]
        for o in spec.overrides:
            argv += ["--set", o]
        return argv

    return argv_fn


@pytest.fixture
def scene(tmp_path):
    p = tmp_path / "tiny.yaml"
    p.write_text("name: tiny\nsim: {seed: 5}\nbodies: []\n")
    return str(p)


def settings(**kw):
    return {"frames": 3, "arch": None, "record": False, "seeds": None, "parameters": {}, "backend": "processes", **kw}


def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


# ------------------------------------------------------------------------------------------------ plans


def test_parse_seeds():
    assert parse_seeds("0-3") == [0, 1, 2, 3]
    assert parse_seeds("7") == [7]
    assert parse_seeds("5,0-2,2") == [0, 1, 2, 5]
    for bad in ["", "a", "3-1", "-1", "1-", "0-2-4", "1.5"]:
        with pytest.raises(UserError, match="--seeds"):
            parse_seeds(bad)


def test_parse_set_and_values():
    assert parse_set("sim.dt=0.001,0.002") == ("sim.dt", ["0.001", "0.002"])
    assert parse_set("sim.gravity=[0,-9.81,0],[0,-1.62,0]") == ("sim.gravity", ["[0,-9.81,0]", "[0,-1.62,0]"])
    assert split_values("'a,b',c") == ["'a,b'", "c"]
    for bad, why in [("sim.dt", "no '='"), ("=1", "key"), ("sim..dt=1", "key"), ("sim.dt=1,,2", "empty value"),
                     ("sim.dt=", "empty value"), ("sim.g=[0,1", "unbalanced"), ("sim.seed=1,2", "--seeds")]:
        with pytest.raises(UserError, match="--set") as e:
            parse_set(bad)
        assert why in str(e.value)


def test_expand_is_cartesian_ordered_and_ids_show_parameters(scene, tmp_path):
    runs = expand_runs([scene], [0, 1], [("a.x", ["1", "2"]), ("b", ["p", "q", "r"])])
    assert len(runs) == 2 * 2 * 3
    assert runs[0].run_id == "tiny__seed0__a.x=1__b=p"
    assert runs[-1].run_id == "tiny__seed1__a.x=2__b=r"
    assert runs[1].overrides == ("sim.seed=0", "a.x=1", "b=q")
    assert len({r.run_id for r in runs}) == len(runs)
    # Stable: the same plan gives the same ids.
    assert [r.run_id for r in expand_runs([scene], [0, 1], [("a.x", ["1", "2"]), ("b", ["p", "q", "r"])])] == \
        [r.run_id for r in runs]
    # No seeds: one run with the scene's own seed, no seed in the id.
    assert [r.run_id for r in expand_runs([scene], None, [])] == ["tiny"]


def test_run_ids_unique_when_values_need_sanitising(tmp_path):
    a = make_run_id("s", 0, [("g", "[0,1]")])
    b = make_run_id("s", 0, [("g", "[0_1]")])
    assert a != b and a.startswith("s__seed0__g=_0_1_-") and "/" not in a
    long = make_run_id("s", 0, [("k", "x" * 400)])
    assert len(long) <= 150
    # Two scenes with the same file name in different folders get distinct ids.
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    for d in "ab":
        (tmp_path / d / "x.yaml").write_text("name: x\n")
    runs = expand_runs([str(tmp_path / "a" / "x.yaml"), str(tmp_path / "b" / "x.yaml")], [0], [])
    assert len({r.run_id for r in runs}) == 2


def test_expand_refuses_missing_scene_and_duplicate_keys(scene):
    with pytest.raises(UserError, match="SCENE: file not found: nope.yaml"):
        expand_runs(["nope.yaml"], None, [])
    with pytest.raises(UserError, match="--set a: given more than once"):
        expand_runs([scene], None, [("a", ["1"]), ("a", ["2"])])


def test_sweep_file(tmp_path, scene):
    sw = tmp_path / "sweep.yaml"
    sw.write_text("scenes: [tiny.yaml]\nseeds: 0-2\nset:\n  sim.solver_iterations: [5, 10]\n"
                  "  sim.gravity: [[0, -9.81, 0]]\n  sim.contacts: padded\n  flag: [true]\n")
    s = load_sweep(str(sw))
    assert s["scenes"] == [str(tmp_path / "tiny.yaml")]
    assert s["seeds"] == [0, 1, 2]
    assert s["set"] == [("sim.solver_iterations", ["5", "10"]), ("sim.gravity", ["[0,-9.81,0]"]),
                        ("sim.contacts", ["padded"]), ("flag", ["true"])]
    for text, msg in [("", "empty sweep file"), ("seeds: [1, -2]\n", "seeds: expected"),
                      ("sets: {}\n", "unknown key 'sets'"), ("set: {sim.dt: []}\n", "set.sim.dt: expected at least one"),
                      ("set: [1\n", "YAML error at line"), ("set: {sim.seed: [1]}\n", "put seeds under")]:
        sw.write_text(text)
        with pytest.raises(UserError, match=msg):
            load_sweep(str(sw))
    with pytest.raises(UserError, match="sweep file not found"):
        load_sweep(str(tmp_path / "missing.yaml"))


def test_describe_exit():
    assert describe_exit(-9, "") == "killed by SIGKILL"
    assert describe_exit(2, "[Taichi] hi\nerror: x.yaml: sim.dt: expected > 0\n") == "exit 2: x.yaml: sim.dt: expected > 0"
    assert describe_exit(1, "Traceback...\nRuntimeError: boom\n") == "exit 1: RuntimeError: boom"
    assert metrics_summary({"kinetic_energy": [3.0, 2.0], "contacts": {"max": 4}, "steps_per_second": "nan"}) == \
        {"steps_per_second": None, "final_kinetic_energy": 2.0, "max_penetration": None, "contacts_max": 4}


# ------------------------------------------------------------------------------------------------ running


def test_failures_are_recorded_and_the_batch_goes_on(tmp_path, scene, standin):
    runs = expand_runs([scene], [0, 1], [("test.mode", ["ok", "bad", "nan", "kill", "crash", "nofiles"])])
    out = tmp_path / "out"
    res = batch.run_batch(runs, settings(), str(out), workers=2, argv_fn=standin)
    assert (res["ok"], res["failed"]) == (2, 10)
    rows = {r["run_id"]: r for r in read_csv(out / "summary.csv")}
    assert list(rows) == [r.run_id for r in runs]  # plan order, one row per run
    err = {r["run_id"].split("=")[-1] + r["seed"]: r["error"] for r in rows.values()}
    assert err["ok0"] == "" and rows["tiny__seed0__test.mode=ok"]["status"] == "ok"
    assert err["bad0"].startswith("exit 2: ") and "expected ok, got 'bad'" in err["bad0"]
    assert err["nan1"] == "exit 1: NaN in body 3 at step 17"
    assert err["kill0"] == "killed by SIGKILL"
    assert err["crash0"] == "exit 1: RuntimeError: boom"
    assert err["nofiles0"] == "exited 0 but wrote no metrics.json, state.npz"
    ok = rows["tiny__seed1__test.mode=ok"]
    assert float(ok["steps_per_second"]) == 1001.0 and float(ok["final_kinetic_energy"]) == 3.0
    assert int(ok["contacts_max"]) == 11 and float(ok["max_penetration"]) == 0.001
    # Every finished run has its directory; failed ones keep the worker's log.
    assert "boom" in (out / "tiny__seed0__test.mode=crash" / "log.txt").read_text()
    assert json.loads((out / "tiny__seed0__test.mode=kill" / "run.json").read_text())["returncode"] == -9
    assert not (out / ".tmp").exists() and not (out / ".lock").exists()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ok"] == 2 and summary["failed"] == 10 and summary["parameters"] == ["test.mode"]


def test_resume_skips_complete_runs_and_redoes_failed(tmp_path, scene, standin):
    out = tmp_path / "out"
    runs = expand_runs([scene], [0, 1, 2], [("test.mode", ["ok"])])
    first = runs[:2] + [expand_runs([scene], [2], [("test.mode", ["bad"])])[0]]
    batch.run_batch(runs[:2], settings(), str(out), argv_fn=standin)
    mtimes = {r.run_id: (out / r.run_id / "metrics.json").stat().st_mtime_ns for r in runs[:2]}
    with pytest.raises(UserError, match="already holds a batch; add --resume"):
        batch.run_batch(runs, settings(), str(out), argv_fn=standin)
    with pytest.raises(UserError, match="--resume: --frames 4 differs"):
        batch.run_batch(runs, settings(frames=4), str(out), resume=True, argv_fn=standin)
    res = batch.run_batch(runs, settings(), str(out), resume=True, argv_fn=standin)
    assert (res["skipped"], res["ok"], res["failed"]) == (2, 3, 0)
    for run_id, t in mtimes.items():
        assert (out / run_id / "metrics.json").stat().st_mtime_ns == t
    # A failed run is redone by --resume (and replaced when it then succeeds).
    out2 = tmp_path / "out2"
    batch.run_batch(first, settings(), str(out2), argv_fn=standin)
    assert json.loads((out2 / first[2].run_id / "run.json").read_text())["status"] == "failed"
    res = batch.run_batch(first, settings(), str(out2), resume=True, argv_fn=standin)
    assert res["skipped"] == 2 and res["failed"] == 1  # the bad value fails again, deterministically


def test_lock_refuses_a_second_live_batch(tmp_path, scene, standin):
    out = tmp_path / "out"
    out.mkdir()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        (out / ".lock").write_text(str(sleeper.pid))
        with pytest.raises(UserError, match=f"another batch \\(pid {sleeper.pid}\\)"):
            batch.run_batch(expand_runs([scene], None, []), settings(), str(out), argv_fn=standin)
    finally:
        sleeper.kill()
        sleeper.wait()
    # The holder is gone: the stale lock is taken over.
    res = batch.run_batch(expand_runs([scene], None, []), settings(), str(out), resume=True, argv_fn=standin)
    assert res["ok"] == 1


def test_workers_get_one_gpu_each_or_a_share_of_the_cores(tmp_path, scene, standin):
    from app.batch.process import slot_envs

    envs = slot_envs(3, ["0", "1"], base_env={})
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0", "1", "0"]
    assert all(e["NCCL_NVLS_ENABLE"] == "0" and e["NVSHMEM_DISABLE_NVLS"] == "1"
               and e["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1" for e in envs)  # NVLink multicast off
    assert slot_envs(1, ["0"], base_env={"NCCL_NVLS_ENABLE": "1"})[0]["NCCL_NVLS_ENABLE"] == "1"  # user wins
    envs = slot_envs(2, [], base_env={})
    cores = len(os.sched_getaffinity(0))
    assert all(e["TI_CPU_MAX_NUM_THREADS"] == str(max(1, cores // 2)) for e in envs)
    assert slot_envs(1, [], base_env={}) == [{}]


def test_timeout_kills_a_slow_run(tmp_path, scene, standin):
    runs = expand_runs([scene], None, [("test.sleep", ["0", "20"])])
    t0 = time.monotonic()
    res = batch.run_batch(runs, settings(), str(tmp_path / "out"), workers=2, timeout=1.5, argv_fn=standin)
    assert time.monotonic() - t0 < 15
    assert res["ok"] == 1
    assert res["rows"][1]["error"] == "timed out after 1.5 s (--timeout)"


# ------------------------------------------------------------------------------------------------ CLI


def run_cli(*args, timeout=60):
    return subprocess.run([sys.executable, str(ROOT / "run.py"), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


@pytest.mark.parametrize(
    "args, message",
    [
        (["{scene}", "--frames", "2"], "the following arguments are required: --out"),
        (["{scene}", "--frames", "2", "--out", "{out}", "--set", "sim.dt"], "--set: expected key.path=value"),
        (["{scene}", "--frames", "2", "--out", "{out}", "--seeds", "9-2"], "--seeds: range '9-2' runs backwards"),
        (["{scene}", "--frames", "2", "--out", "{out}", "--seeds", "x"], "--seeds: expected seeds like 0-15"),
        (["missing.yaml", "--frames", "2", "--out", "{out}"], "SCENE: file not found: missing.yaml"),
        (["{scene}", "--frames", "0", "--out", "{out}"], "--frames: expected a positive integer, got 0"),
        (["{scene}", "--frames", "x", "--out", "{out}"], "argument --frames: invalid int value"),
        (["{scene}", "--frames", "2", "--out", "{out}", "--arch", "tpu"], "argument --arch: invalid choice"),
        (["{scene}", "--frames", "2", "--out", "{out}", "--workers", "0"], "--workers: expected a positive"),
        (["--frames", "2", "--out", "{out}"], "SCENE: give at least one scene file"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(tmp_path, scene, args, message):
    args = [a.format(scene=scene, out=tmp_path / "out") for a in args]
    p = run_cli("batch", *args)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], p.stderr
    assert "Traceback" not in p.stderr
    assert not (tmp_path / "out").exists()


def test_ray_missing_names_the_extra(tmp_path, scene, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_ray(name, *a, **kw):
        if name == "ray":
            raise ImportError("no ray")
        return real_import(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    from app.batch.ray import import_ray

    with pytest.raises(UserError, match=r"pip install -e \.\[cluster\]"):
        import_ray()


def test_sigterm_stops_the_batch_and_resume_finishes(tmp_path, scene, standin):
    """SIGTERM to the batch: running workers are stopped, finished runs kept (the driver here exits 130 on the
    interrupt; run.py exits 143 on SIGTERM); --resume then runs only the rest. (The real-simulator test kills the
    whole process group with SIGKILL instead.)"""
    out = tmp_path / "out"
    script = tmp_path / "drive.py"
    script.write_text(textwrap.dedent(f"""
        import sys, functools
        sys.path.insert(0, {str(ROOT)!r})
        from app.batch import cli as batch
        from app.batch.plan import expand_runs
        from app.errors import terminate_as_exception
        import test_standin_argv as t
        runs = expand_runs([{scene!r}], [0, 1, 2, 3, 4, 5], [("test.sleep", ["0.7"])])
        s = {{"frames": 3, "arch": None, "record": False, "seeds": None, "parameters": {{}}, "backend": "processes"}}
        terminate_as_exception()
        try:
            batch.run_batch(runs, s, {str(out)!r}, resume="--resume" in sys.argv, argv_fn=t.argv_fn)
        except KeyboardInterrupt:
            sys.exit(130)
    """))
    (tmp_path / "test_standin_argv.py").write_text(textwrap.dedent(f"""
        import sys
        def argv_fn(spec, out_dir, scene_path=None):
            argv = [sys.executable, {str(tmp_path / 'standin.py')!r}, spec.scene_path, "--headless", "--frames", "3",
                    "--out", str(out_dir)]
            for o in spec.overrides:
                argv += ["--set", o]
            return argv
    """))
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    p = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len([d for d in out.glob("tiny__*") if d.is_dir()]) < 2:
        time.sleep(0.05)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 130, err
    done = sorted(d.name for d in out.glob("tiny__*"))
    assert 2 <= len(done) < 6, done
    assert "interrupted:" in err and "--resume" in err
    assert not (out / ".tmp").exists() and not (out / ".lock").exists()
    mtimes = {d: (out / d / "run.json").stat().st_mtime_ns for d in done}
    p = subprocess.run([sys.executable, str(script), "--resume"], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert f"resume: {len(done)} of 6 runs already complete" in p.stderr
    assert all((out / d / "run.json").stat().st_mtime_ns == t for d, t in mtimes.items())
    assert len(read_csv(out / "summary.csv")) == 6


# ------------------------------------------------------------------------------------------------ Ray task, report


def test_ray_task_ships_the_scene_to_nodes_without_it(tmp_path, scene, standin):
    """The body of a Ray task, called directly: on a node where the driver's scene path does not exist it
    runs the shipped scene text, and it returns the run's files as bytes for the driver to write."""
    from dataclasses import replace

    from app.batch.ray import _ray_task

    spec = replace(expand_runs([scene], [3], [])[0], scene_path=str(tmp_path / "elsewhere" / "tiny.yaml"))
    seen = {}

    def argv_fn(spec, out_dir, scene_path=None):
        seen["scene"] = Path(scene_path).read_text()
        return standin(spec, out_dir, scene_path)

    result = _ray_task(spec, Path(scene).read_bytes(), argv_fn, False, None, {})
    assert result["status"] == "ok", result
    assert seen["scene"] == Path(scene).read_text()
    assert set(result["files"]) == {"metrics.json", "state.npz"}
    assert json.loads(result["files"]["metrics.json"])["steps_per_second"] == 1003.0


def test_report_writes_plots_and_prints_the_table(tmp_path, scene, standin):
    out = tmp_path / "out"
    runs = expand_runs([scene], [0, 1], [("test.mode", ["ok", "bad"])])
    batch.run_batch(runs, settings(), str(out), argv_fn=standin)
    p = run_cli("report", str(out))
    assert p.returncode == 0, p.stderr
    for name in ("kinetic_energy.png", "contacts.png", "steps_per_second.png", "summary.md"):
        assert (out / "report" / name).stat().st_size > 0
    assert (out / "report" / "kinetic_energy.png").read_bytes()[:4] == b"\x89PNG"
    assert "4 runs: 2 ok, 2 failed" in p.stdout
    assert "tiny__seed1__test.mode=bad" in p.stdout and "expected ok, got 'bad'" in p.stdout
    md = (out / "report" / "summary.md").read_text().splitlines()
    assert len(md) == 2 + 4 and "| tiny__seed0__test.mode=ok | 0 | ok | ok | 1000" in md[2]
    p = run_cli("report", str(tmp_path))
    assert p.returncode == 2 and "no summary.json" in p.stderr and "Traceback" not in p.stderr


def test_run_ids_never_name_the_batchs_own_files(tmp_path):
    """Scene files named like the batch directory's own files (summary.csv.yaml, batch.json.yaml, ..yaml,
    .tmp.yaml, report.yaml) give run ids that are none of them and start with no dot; all stay distinct."""
    names = ["summary.csv.yaml", "summary.json.yaml", "batch.json.yaml", "..yaml", ".tmp.yaml", ".lock.yaml",
             "report.yaml", ".hidden.yaml"]
    for n in names:
        (tmp_path / n).write_text("name: x\n")
    runs = expand_runs([str(tmp_path / n) for n in names], None, [])
    ids = [r.run_id for r in runs]
    assert len(set(ids)) == len(ids) == len(names)
    for i in ids:
        assert not i.startswith(".") and i not in {"batch.json", "summary.csv", "summary.json", "report", ".tmp",
                                                   ".lock", ".", ".."}, i


def test_batch_finds_shipped_scenes_by_name_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runs = expand_runs(["bounce"], None, [])
    assert Path(runs[0].scene_path).resolve() == (Path(__file__).resolve().parents[2] / "scenes" / "bounce.yaml")


def test_a_sweep_of_too_many_runs_is_refused_before_it_is_built(tmp_path, scene, monkeypatch):
    # 1000 seeds x 1000 x 1000 values: 10^9 runs, refused from the sizes alone (building them would fill memory)
    values = [str(v) for v in range(1000)]
    t0 = time.monotonic()
    with pytest.raises(UserError, match=r"batch: 1,000,000,000 runs \(1 scenes x 1000 seeds x 1000 values of a x 1000 "
                                        r"values of b\); expected at most 100,000 \(SMOLVLA_LIMITS=runs=N"):
        expand_runs([scene], list(range(1000)), [("a", values), ("b", values)])
    assert time.monotonic() - t0 < 1.0
    monkeypatch.setenv("SMOLVLA_LIMITS", "runs=6")
    assert len(expand_runs([scene], [0, 1, 2], [("a", ["1", "2"])])) == 6
    with pytest.raises(UserError, match="8 runs"):
        expand_runs([scene], [0, 1, 2, 3], [("a", ["1", "2"])])


def test_strict_reaches_every_run_and_must_match_on_resume(tmp_path, scene):
    from app.batch.worker import headless_argv

    args = batch.build_parser().parse_args([scene, "--frames", "2", "--out", str(tmp_path / "o"), "--strict"])
    runs, config = batch.plan_from_args(args)
    assert config["strict"] is True
    argv = headless_argv(runs[0], 2, "cpu", False, "tmp", strict=True)
    assert "--strict" in argv and "--strict" not in headless_argv(runs[0], 2, "cpu", False, "tmp")
    argv = batch._default_argv(runs[0], "tmp", frames=2, arch="", record=False, strict=True)
    assert "--strict" in argv and "--arch" not in argv
    # a batch.json written without the key had strict off: resuming it without --strict is fine, with it is not
    from app.batch.store import BatchDir

    root = tmp_path / "b"
    root.mkdir()
    (root / "batch.json").write_text(json.dumps({"frames": 2, "arch": None, "record": False, "runs": []}))
    for strict, ok in ((False, True), (True, False)):
        store = BatchDir(str(root))
        try:
            store.open({"frames": 2, "arch": None, "record": False, "strict": strict, "runs": []}, resume=True)
            assert ok
        except UserError as e:
            assert not ok and "--strict True differs" in str(e)
        finally:
            store.close()
