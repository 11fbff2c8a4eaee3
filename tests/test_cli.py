"""run.py, the one entry: its help lists every subcommand, a word that is neither a subcommand nor a scene is an
error that says so, and shipped scenes are found from any working directory. No Taichi here."""
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
