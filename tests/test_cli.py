"""run.py, the one entry: its help lists every subcommand, a word that is neither a subcommand nor a scene is an
error that says so, and shipped scenes are found from any working directory. No Taichi in this process."""
from pathlib import Path

import run
from app.scene.loading import find_scene

ROOT = Path(__file__).resolve().parents[1]


def test_help_lists_every_subcommand(capsys):
    assert run.main(["--help"]) == 0
    out = capsys.readouterr().out
    for sub in run.SUBCOMMANDS:
        assert f"python run.py {sub}" in out, sub


def test_an_unknown_word_is_neither_a_subcommand_nor_a_scene(capsys):
    assert run.main(["bach", "--frames", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: 'bach' is neither a subcommand") and "\n" not in err


def test_shipped_scenes_are_found_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert Path(find_scene("scenes/default.yaml")) == ROOT / "scenes" / "default.yaml"
    assert Path(find_scene("bounce")) == ROOT / "scenes" / "bounce.yaml"
    assert find_scene("missing.yaml") == "missing.yaml"
    (tmp_path / "bounce").write_text("a file of the user's own wins")
    assert find_scene("bounce") == "bounce"


def test_auto_arch_asks_taichi_for_cuda_only_where_a_driver_library_is(tmp_path, monkeypatch):
    """Asking Taichi about CUDA prints "libcuda.so lib not found" on every CPU machine: --arch auto first looks for
    the driver library (the linker's cache, LD_LIBRARY_PATH, the usual directories)."""
    import ctypes.util

    from app import runtime

    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    monkeypatch.setattr(runtime, "CUDA_DRIVER_DIRS", ())
    monkeypatch.setenv("LD_LIBRARY_PATH", str(tmp_path))
    assert not runtime._cuda_driver_present()
    assert runtime.pick_arch("auto") == "cpu" and runtime.pick_arch("cuda") == "cuda"
    (tmp_path / "libcuda.so.1").write_bytes(b"")
    assert runtime._cuda_driver_present()


def test_every_help_starts_with_its_usage(tmp_path):
    """`--help` of run.py, every subcommand and bench: the usage first (no Taichi banner before it), exit 0."""
    import subprocess
    import sys

    for args in ([], ["bounce"], ["replay"], ["batch"], ["report"], ["filter"], ["bench"], ["bench", "vla"],
                 ["bench", "sim"], ["bench", "filter"], ["bench", "viewer"], ["bench", "batch"]):
        p = subprocess.run([sys.executable, str(ROOT / "run.py"), *args, "--help"], capture_output=True, text=True,
                           cwd=tmp_path, timeout=120)
        assert p.returncode == 0 and p.stdout.startswith("usage:") and "[Taichi]" not in p.stdout + p.stderr, \
            (args, p.stdout[:300], p.stderr[-500:])
