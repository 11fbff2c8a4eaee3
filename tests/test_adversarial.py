"""Hostile and broken input through the one entry, `python run.py`, as a user or another program would hand it over:
every case asserts the exit code, the one line on stderr (no traceback), the time it took to fail, and that
nothing it leaves behind looks like a finished result.

The VLA's own edges (sizes near 2^31, a read after a caught overflow, a VLA that a kernel reaches outside
`launch`'s arguments, a VLA of an ended Taichi program) are in tests/vla/test_vla_edges.py; batch run ids made
from file names like the batch's own files in tests/batch/test_batch_unit.py.
"""
import io
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
RUN = str(ROOT / "run.py")

BODY = "{shape: sphere, radius: 0.1, position: [0, 1, 0], material: m}"
HEAD = "name: t\nmaterials: {m: {}}\n"


def cli(args, cwd, env=None, timeout=60):
    """run.py with args in cwd: (exit code, stderr, seconds)."""
    full_env = {**os.environ, **(env or {})}
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, RUN, *args], cwd=cwd, env=full_env, capture_output=True, text=True,
                       timeout=timeout)
    return p.returncode, p.stderr, time.monotonic() - t0


def one_line(err):
    """The error line of stderr, checked to be the only one and no traceback."""
    lines = [x for x in err.strip().splitlines() if not x.startswith("[Taichi]")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("error: "), err
    return lines[0]


def _alias_bomb():
    levels = ["&a0 [x, x, x, x, x, x, x, x, x, x]"] + [f"&a{k} [" + ", ".join([f"*a{k - 1}"] * 10) + "]"
                                                       for k in range(1, 12)]
    return HEAD + f"bodies: [{BODY}]\ncamera: {{position: [" + ", ".join(levels) + "]}\n"


# name -> (scene text, extra run.py arguments, what the line must say)
SCENES = {
    "alias bomb (10^11 elements)": (_alias_bomb(), [], "camera.position: expected a list of 3 numbers"),
    "duplicate key": (HEAD + f"bodies: [{BODY}]\nmaterials: {{w: {{}}}}\n", [], "duplicate key 'materials'"),
    "2000-deep nesting": (HEAD + "bodies: []\ncamera: {position: " + "[" * 2000 + "]" * 2000 + "}\n", [],
                          "nested more than 64 deep"),
    "10^9 bodies": (HEAD + "bodies: [{generate: random, shape: sphere, radius: 0.01, count: 1000000000, "
                    "min: [0, 0, 0], max: [1000, 1000, 1000], material: m}]\n", [], "at most 20,000,000 bodies"),
    "10^9 iterations": (HEAD.replace("name: t\n", "name: t\nsim: {solver_iterations: 1e9}\n") + f"bodies: [{BODY}]\n",
                        [], "sim.solver_iterations: expected a number <= 10000"),
    "10^9 substeps": (HEAD + f"bodies: [{BODY}]\n", ["--set", "sim.substeps=1000000000"],
                      "sim.substeps: expected a number <= 10000"),
    "density 1e308": (HEAD.replace("{m: {}}", "{m: {density: 1e308}}") + f"bodies: [{BODY}]\n", [],
                      "bodies[0]: expected a mass and moments of inertia within"),
    "not UTF-8": (HEAD + "description: \xff\n" + f"bodies: [{BODY}]\n", [], "line 3: expected UTF-8 text, found byte 0xff"),
}


@pytest.mark.parametrize("case", list(SCENES))
def test_hostile_scene_files(tmp_path, case):
    text, extra, says = SCENES[case]
    (tmp_path / "s.yaml").write_bytes(text.encode("latin-1"))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "metrics.json").write_text('{"status": "complete"}')   # an earlier run's
    code, err, seconds = cli(["s.yaml", "--headless", "--arch", "cpu", "--out", "out", *extra], tmp_path)
    line = one_line(err)
    assert code == 2 and "s.yaml" in line and says in line, err
    assert seconds < 10
    # refused before the run: the directory is not touched (the earlier run's result stays what it was)
    assert (tmp_path / "out" / "metrics.json").read_text() == '{"status": "complete"}'


def test_a_pipe_a_device_and_a_huge_file_as_the_scene(tmp_path):
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    for path, says in ((str(fifo), "not a regular file"), ("/dev/zero", "not a regular file")):
        code, err, seconds = cli([path, "--headless", "--arch", "cpu", "--out", "out"], tmp_path)
        assert code == 2 and says in one_line(err) and path in err and seconds < 10, err
    big = tmp_path / "big.yaml"
    with open(big, "wb") as fh:   # 100 MB, sparse: refused from its size, never read
        fh.truncate(100 * 2**20)
    code, err, seconds = cli([str(big), "--headless", "--arch", "cpu", "--out", "out"], tmp_path)
    assert code == 2 and "SMOLVLA_LIMITS=file_bytes=N" in one_line(err) and seconds < 10, err
    assert not (tmp_path / "out").exists()


def test_a_sweep_of_a_billion_runs(tmp_path):
    (tmp_path / "s.yaml").write_text(HEAD + f"bodies: [{BODY}]\n")
    values = ", ".join(str(v) for v in range(1000))
    (tmp_path / "sweep.yaml").write_text(f"scenes: [s.yaml]\nseeds: 0-999\nset:\n  sim.solver_iterations: [{values}]\n"
                                         f"  sim.substeps: [{values}]\n")
    code, err, seconds = cli(["batch", "--sweep", "sweep.yaml", "--frames", "1", "--out", "runs"], tmp_path)
    assert code == 2 and "1,000,000,000 runs" in one_line(err) and seconds < 10, err
    assert not (tmp_path / "runs").exists()


# ---------------------------------------------------------------------------------------------- replay


def _npz(arrays) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def _state(n=2, **change):
    a = {"shape": np.zeros(n, np.int32), "half_extents": np.full((n, 3), 0.1, np.float32),
         "material": np.zeros(n, np.int32), "position": np.zeros((n, 3), np.float32),
         "orientation": np.tile(np.float32([1, 0, 0, 0]), (n, 1))}
    a.update(change)
    return _npz(a)


def _trajectory(f=3, n=2, **change):
    a = {"time": np.arange(f, dtype=np.float64), "position": np.zeros((f, n, 3), np.float32),
         "orientation": np.tile(np.float32([1, 0, 0, 0]), (f, n, 1))}
    a.update(change)
    return _npz(a)


def _npz_bomb() -> bytes:
    """A zip holding position.npy whose header claims 10^12 x 3 float32 (12 TB) and whose data is absent."""
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000000, 3), }"
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    npy = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode()
    buf = io.BytesIO()
    src = zipfile.ZipFile(io.BytesIO(_state()))
    with zipfile.ZipFile(buf, "w") as z:
        for name in src.namelist():
            z.writestr(name, npy if name == "position.npy" else src.read(name))
    return buf.getvalue()


REPLAYS = {
    "text, not a zip": ({"state.npz": b"garbage\n"}, "not a .npz file"),
    "truncated zip": ({"state.npz": _state()[:300]}, "not a"),
    "a missing array": ({"state.npz": _npz({"position": np.zeros((2, 3))})}, "no array 'shape'"),
    "12 TB in its header": ({"state.npz": _npz_bomb()}, "more than half this machine's memory"),
    "NaN position": ({"state.npz": _state(position=np.full((2, 3), np.nan, np.float32))}, "position holds NaN"),
    "wrong shape": ({"state.npz": _state(orientation=np.zeros((2, 3), np.float32))}, "orientation"),
    "bodies disagree": ({"state.npz": _state(), "trajectory.npz": _trajectory(n=5)}, "N = 2"),
    "time runs back": ({"state.npz": _state(), "trajectory.npz": _trajectory(time=np.float64([0, 2, 1]))},
                       "increasing order"),
    "a directory as state.npz": ({"state.npz/": None}, "not a regular file"),
}


@pytest.mark.parametrize("case", list(REPLAYS))
def test_malformed_recordings_for_replay(tmp_path, case):
    files, says = REPLAYS[case]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for name, data in files.items():
        if name.endswith("/"):
            (run_dir / name).mkdir()
        else:
            (run_dir / name).write_bytes(data)
    code, err, seconds = cli(["replay", "run", "--video", "x.mp4"], tmp_path)
    assert code == 2 and says in one_line(err) and seconds < 20, err
    assert not (tmp_path / "x.mp4").exists()


# ---------------------------------------------------------------------------------------------- report


REPORTS = {
    "not JSON": ("[[[", "not a batch summary"),
    "a list": ("[1, 2]", "a JSON list, expected an object"),
    "rows not a list": ('{"rows": 3}', "expected 'rows', a list of objects"),
    "a run id climbing out": ('{"rows": [{"run_id": "../../etc"}]}', "rows[0].run_id: expected the name of a run"),
    "nested 100,000 deep": ("[" * 100_000 + "]" * 100_000, "nested too deep"),
    "100 MB": (None, "more than 67108864"),
}


@pytest.mark.parametrize("case", list(REPORTS))
def test_malformed_batch_summaries_for_report(tmp_path, case):
    text, says = REPORTS[case]
    batch = tmp_path / "runs"
    batch.mkdir()
    if text is None:
        with open(batch / "summary.json", "wb") as fh:
            fh.truncate(100 * 2**20)
    else:
        (batch / "summary.json").write_text(text)
    code, err, seconds = cli(["report", "runs"], tmp_path)
    assert code == 2 and says in one_line(err) and "summary.json" in err and seconds < 20, err
    assert not (batch / "report").exists()


def test_report_shows_stray_values_as_missing(tmp_path):
    # a summary whose numbers are strings, booleans or objects, and a run whose metrics.json is not JSON: the report
    # is written, those values shown as missing
    batch = tmp_path / "runs"
    (batch / "a").mkdir(parents=True)
    (batch / "a" / "metrics.json").write_text("{not json")
    rows = [{"run_id": "a", "status": "ok", "seed": "x", "steps_per_second": True, "max_penetration": {"a": 1},
             "final_kinetic_energy": 1e400, "contacts_max": None}]
    (batch / "summary.json").write_text(json.dumps({"rows": rows, "parameters": []}).replace("1e+400", "1e400"))
    code, err, seconds = cli(["report", "runs"], tmp_path)
    assert code == 0, err
    row = (batch / "report" / "summary.md").read_text().splitlines()[2]
    assert row.startswith("| a |") and "inf" not in row and "True" not in row and "{" not in row, row
    assert sorted(p.name for p in (batch / "report").iterdir()) == ["contacts.png", "kinetic_energy.png",
                                                                  "steps_per_second.png", "summary.md"]


# ---------------------------------------------------------------------------------------------- signals, disk


@pytest.mark.parametrize("sig, code, says", [(signal.SIGTERM, 143, "terminated (SIGTERM)"),
                                             (signal.SIGINT, 130, "interrupted (SIGINT)")])
def test_a_signal_ends_a_run_with_its_code_and_one_line(tmp_path, sig, code, says):
    """A signal during a headless run: its exit code, one line, no traceback; the directory holds a result marked
    interrupted, or none (an earlier run's results are removed first, so nothing there passes for this run's)."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "metrics.json").write_text('{"status": "complete"}')
    # (the run starts with the signal's default action, as from a terminal: a shell runs background jobs with SIGINT
    # ignored, and a run that inherits that rightly keeps ignoring it)
    proc = subprocess.Popen([sys.executable, RUN, "bounce", "--headless", "--frames", "100000", "--arch", "cpu",
                             "--out", str(out)], stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            preexec_fn=lambda: signal.signal(sig, signal.SIG_DFL))
    line = proc.stderr.readline()          # "arch: cpu": Taichi runs, the scene is loaded, the run is under way
    assert line.startswith("arch:"), line
    time.sleep(0.5)
    t0 = time.monotonic()
    proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"the run went on for 60 s after {sig.name}")
    assert proc.returncode == code, err
    assert time.monotonic() - t0 < 30
    assert err.strip().splitlines()[-1] == says and "Traceback" not in err
    if (out / "metrics.json").exists():
        assert json.loads((out / "metrics.json").read_text())["status"] == "interrupted"
        assert np.load(out / "state.npz")["position"].shape == (3, 3)
    assert not [p for p in out.iterdir() if p.name not in ("metrics.json", "state.npz")]


def _can_mount_tmpfs(tmp_path):
    if not shutil.which("unshare"):
        return False
    d = tmp_path / "probe"
    d.mkdir()
    p = subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs {d}"], capture_output=True)
    return p.returncode == 0


def test_a_full_disk_is_one_line_naming_the_file_and_no_result_looks_complete(tmp_path):
    if not _can_mount_tmpfs(tmp_path):
        pytest.skip("needs `unshare -m` and mount (root in a mount namespace) for a small tmpfs")
    disk = tmp_path / "disk"
    disk.mkdir()
    # a 256 KiB tmpfs, all but ~6 KiB taken: state.npz fits, the trajectory does not. What the run left is listed
    # before the namespace (and its tmpfs) ends.
    script = (f"mount -t tmpfs -o size=256k tmpfs {disk} && mkdir {disk}/out && head -c 250000 /dev/zero > "
              f"{disk}/fill || exit 99; {sys.executable} {RUN} bounce --headless --record --frames 50 --arch cpu "
              f"--out {disk}/out; code=$?; ls {disk}/out > {tmp_path}/left.txt; exit $code")
    t0 = time.monotonic()
    p = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, cwd=tmp_path,
                       timeout=120)
    assert time.monotonic() - t0 < 60
    assert p.returncode == 2, p.stderr
    assert one_line(p.stderr.replace("arch: cpu\n", "")) == \
        f"error: {disk}/out/trajectory.npz: cannot write (No space left on device)"
    # no metrics.json (written last): the directory holds no finished run; no temporary file is left
    assert (tmp_path / "left.txt").read_text().split() == ["state.npz"]


FIRST_COMMAND = '''"""`python run.py` as on a machine without a Vulkan loader: ctypes finds none, and no directory holds one."""
import ctypes.util
import sys

sys.path.insert(0, sys.argv[1])
_find = ctypes.util.find_library
ctypes.util.find_library = lambda name: None if "vulkan" in name else _find(name)
from app.viewer import display  # noqa: E402

display.LOADER_DIRS = ()
import run  # noqa: E402

sys.exit(run.main([]))
'''


def test_the_readmes_first_command_without_vulkan_or_display_finishes_within_a_minute(tmp_path):
    (tmp_path / "first.py").write_text(FIRST_COMMAND)
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    env["LD_LIBRARY_PATH"] = ""
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "first.py", str(ROOT)], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=120)
    assert time.monotonic() - t0 < 60
    assert p.returncode == 0, p.stderr
    assert "no preview image: no Vulkan loader (libvulkan.so.1) found" in p.stderr and "mesa-vulkan-drivers" in p.stderr
    assert json.loads((tmp_path / "out" / "default" / "metrics.json").read_text())["status"] == "complete"


def test_hostile_filter_inputs(tmp_path):
    os.mkfifo(tmp_path / "pipe.png")
    (tmp_path / "text.png").write_text("not an image\n" * 3)
    (tmp_path / "ok.npy").write_bytes(b"")
    np.save(tmp_path / "ok.npy", np.zeros((8, 8), np.float32))
    cases = [("pipe.png", ["--radius", "2"], "not a regular file"), ("/dev/zero", ["--radius", "2"], "not a regular file"),
             ("text.png", ["--radius", "2"], "cannot read it as an image"),
             ("ok.npy", ["--radius-map", "pipe.png"], "radius map 'pipe.png': not a regular file")]
    for image, extra, says in cases:
        code, err, seconds = cli(["filter", image, *extra, "--out", "out.png"], tmp_path)
        assert code == 2 and says in one_line(err) and seconds < 20, err
        assert not (tmp_path / "out.png").exists()


def test_a_ctrl_c_swallowed_in_a_destructor_still_ends_the_run(tmp_path):
    """Python ignores an exception raised in a __del__: a Ctrl-C landing while Taichi frees an object would be lost
    and a headless run would go on, after a traceback. app.errors remembers it, says nothing, and raise_if_signalled
    (checked every frame) raises it."""
    script = tmp_path / "swallow.py"
    script.write_text(
        "import os, signal, sys, time\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "from app.errors import terminate_as_exception, raise_if_signalled\n"
        "terminate_as_exception()\n"
        "class Freed:\n"
        "    def __del__(self):\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "        time.sleep(0.2)\n"
        "Freed()\n"
        "print('went on', flush=True)\n"
        "try:\n"
        "    raise_if_signalled()\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted', flush=True)\n")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                       preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))   # (as from a terminal)
    assert r.stdout.split() == ["went", "on", "interrupted"], (r.stdout, r.stderr)
    # "went on": the swallowing this guards against did happen; and it is not printed with a traceback
    assert "Exception ignored" not in r.stderr and "Traceback" not in r.stderr, r.stderr
