"""Batch plans: scenes x seeds x parameter values expanded into runs with stable ids.

A plan is pure data (no processes, no files written): ``expand_runs`` turns scene paths, seeds and
``--set``/sweep parameters into ``RunSpec`` rows in a fixed order (scene, then seed, then each parameter
in the order given, last one fastest), each with an id that names its parameters, e.g.
``default__seed3__sim.solver_iterations=20``. The same command always gives the same ids, which is what
``--resume`` relies on.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path


from app.errors import UserError
from app.scene import yamlio
from app.scene.loading import find_scene
from app.scene.schema import limit

SEED_KEY = "sim.seed"
# A --set key path: dot-separated names or list indices, e.g. materials.ball.friction, bodies.0.radius.
_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*$")
# Characters kept as they are in run ids; anything else becomes "_" (and the id gets a hash suffix).
_ID_SAFE_RE = re.compile(r"[^A-Za-z0-9._+-]")
RUN_ID_MAX_LEN = 150
_SWEEP_KEYS = {"scenes", "seeds", "set"}


@dataclass(frozen=True)
class RunSpec:
    """One headless run of a batch.

    ``scene`` is the path as the user wrote it (shown in the summary); ``scene_path`` is absolute (what
    workers are given). ``params`` are the ``--set`` parameters as (key path, value text) in plan order;
    ``seed`` is None when the scene's own seed is used. ``overrides`` are the ``key=value`` strings the
    worker receives (``sim.seed`` first when seeded)."""

    run_id: str
    scene: str
    scene_path: str
    seed: int | None
    params: tuple[tuple[str, str], ...] = field(default_factory=tuple)

    @property
    def overrides(self) -> tuple[str, ...]:
        head = (f"{SEED_KEY}={self.seed}",) if self.seed is not None else ()
        return head + tuple(f"{k}={v}" for k, v in self.params)

    def to_json(self) -> dict:
        return {
            "run_id": self.run_id,
            "scene": self.scene,
            "scene_path": self.scene_path,
            "seed": self.seed,
            "params": dict(self.params),
        }


# ---------------------------------------------------------------------------------------------- parsing


def parse_seeds(text: str, what: str = "--seeds") -> list[int]:
    """``"0-15"``, ``"3"``, ``"0,4,8"`` or ``"0-3,10-12"`` -> sorted unique non-negative ints."""
    expected = f"{what}: expected seeds like 0-15, 7 or 0,3,8-11 (non-negative integers, ranges low-high)"
    text = str(text).strip()
    if not text:
        raise UserError(f"{expected}, got an empty value")
    seeds: list[int] = []
    for part in text.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)(?:\s*-\s*(\d+))?", part)
        if not m:
            raise UserError(f"{expected}, got {text!r}")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi < lo:
            raise UserError(f"{what}: range {part!r} runs backwards (low-high expected, e.g. 0-15)")
        if hi - lo >= 1_000_000:
            raise UserError(f"{what}: range {part!r} has more than a million seeds")
        seeds.extend(range(lo, hi + 1))
    return sorted(set(seeds))


def split_values(text: str) -> list[str]:
    """Split ``v1,v2,...`` at top-level commas: commas inside [...], {...} or quotes stay, so
    ``[0,-9.81,0],[0,-1.62,0]`` is two values."""
    values, depth, quote, cur = [], 0, None, []
    for ch in text:
        if quote:
            cur.append(ch)
            if ch == quote:
                quote = None
            continue
        if ch in "'\"":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            values.append("".join(cur).strip())
            cur = []
            continue
        cur.append(ch)
    values.append("".join(cur).strip())
    if depth != 0 or quote:
        raise ValueError("unbalanced brackets or quotes")
    return values


def parse_set(text: str) -> tuple[str, list[str]]:
    """``key.path=v1,v2`` -> (key, [v1, v2]); a UserError naming ``--set`` for anything else."""
    expected = "--set: expected key.path=value or key.path=v1,v2,... (e.g. sim.solver_iterations=5,10)"
    if "=" not in text:
        raise UserError(f"{expected}, got {text!r} (no '=')")
    key, _, rest = text.partition("=")
    key = key.strip()
    if not _KEY_RE.match(key):
        raise UserError(f"{expected}, got key {key!r} in {text!r}")
    try:
        values = split_values(rest)
    except ValueError as e:
        raise UserError(f"--set {key}: {e} in {rest!r}") from None
    if any(v == "" for v in values):
        raise UserError(f"--set {key}: empty value in {rest!r} (values are separated by single commas)")
    if key == SEED_KEY:
        raise UserError(f"--set {SEED_KEY}: use --seeds for seeds (e.g. --seeds {rest})")
    return key, values


def format_value(value, where: str) -> str:
    """A YAML value from a sweep file -> the text a worker's ``--set`` gets."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise UserError(f"{where}: expected a finite number, got {value}")
        return repr(value)
    if isinstance(value, str):
        if value.strip() == "":
            raise UserError(f"{where}: expected a value, got an empty string")
        return value
    if isinstance(value, (list, dict)):
        return json.dumps(value, separators=(",", ":"))
    raise UserError(f"{where}: expected a number, string, boolean or list, got {value!r}")


def load_sweep(path: str) -> dict:
    """Read a sweep file::

        scenes: [scenes/default.yaml]        # optional, added to the SCENE arguments
        seeds: 0-15                          # optional: a string like --seeds, or a list of ints
        set:                                 # optional: key path -> list of values (or one value)
          sim.solver_iterations: [5, 10, 20]
          materials.ball.restitution: [0.1, 0.9]

    Returns ``{"scenes": [...], "seeds": [...] or None, "set": [(key, [value texts])]}``."""
    p = Path(path)
    data = yamlio.load_file(path, "sweep file")
    if data is None:
        raise UserError(f"{path}: empty sweep file (expected keys {sorted(_SWEEP_KEYS)})")
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a mapping with keys {sorted(_SWEEP_KEYS)}, got {type(data).__name__}")
    unknown = set(data) - _SWEEP_KEYS
    if unknown:
        raise UserError(f"{path}: unknown key {sorted(map(str, unknown))[0]!r} (expected {sorted(_SWEEP_KEYS)})")
    out = {"scenes": [], "seeds": None, "set": []}
    scenes = data.get("scenes", [])
    if isinstance(scenes, str):
        scenes = [scenes]
    if not isinstance(scenes, list) or not all(isinstance(s, str) for s in scenes):
        raise UserError(f"{path}: scenes: expected a list of scene file paths")
    # Scene paths in a sweep file are relative to the sweep file, like includes in most tools.
    out["scenes"] = [s if Path(s).is_absolute() else str(p.parent / s) for s in scenes]
    if "seeds" in data:
        seeds = data["seeds"]
        if isinstance(seeds, list):
            if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds) or not seeds:
                raise UserError(f"{path}: seeds: expected non-negative integers, got {seeds!r}")
            out["seeds"] = sorted(set(seeds))
        elif isinstance(seeds, int) and not isinstance(seeds, bool):
            out["seeds"] = parse_seeds(str(seeds), f"{path}: seeds")
        elif isinstance(seeds, str):
            out["seeds"] = parse_seeds(seeds, f"{path}: seeds")
        else:
            raise UserError(f"{path}: seeds: expected a range like 0-15 or a list of integers, got {seeds!r}")
    params = data.get("set", {}) or {}
    if not isinstance(params, dict):
        raise UserError(f"{path}: set: expected a mapping of key.path -> list of values")
    for key, values in params.items():
        where = f"{path}: set.{key}"
        if not isinstance(key, str) or not _KEY_RE.match(key):
            raise UserError(f"{path}: set: expected key paths like sim.dt, got {key!r}")
        if key == SEED_KEY:
            raise UserError(f"{where}: put seeds under 'seeds:', not under 'set:'")
        if not isinstance(values, list):
            values = [values]
        if not values:
            raise UserError(f"{where}: expected at least one value")
        out["set"].append((key, [format_value(v, where) for v in values]))
    return out


# ---------------------------------------------------------------------------------------------- ids


def _short_hash(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:8]


def _id_part(text: str) -> tuple[str, bool]:
    """Sanitised text for a run id, and whether sanitising lost information."""
    safe = _ID_SAFE_RE.sub("_", text)
    return safe, safe != text


def make_run_id(scene_label: str, seed: int | None, params) -> str:
    """``{scene}[__seed{K}][__{key}={value}]...``; values that had to be sanitised (brackets, spaces, /)
    or ids longer than RUN_ID_MAX_LEN get an 8-hex hash of the exact parameters so ids stay unique."""
    parts = [scene_label]
    lossy = False
    if seed is not None:
        parts.append(f"seed{seed}")
    for key, value in params:
        safe, lost = _id_part(value)
        lossy |= lost
        parts.append(f"{key}={safe}")
    run_id = "__".join(parts)
    exact = json.dumps([scene_label, seed, list(params)])
    if lossy:
        run_id = f"{run_id}-{_short_hash(exact)}"
    if len(run_id) > RUN_ID_MAX_LEN:
        run_id = f"{run_id[:RUN_ID_MAX_LEN - 9]}-{_short_hash(exact)}"
    return run_id


# Names a batch directory holds beside its run directories (app.batch.store, app.batch.report): no run id may be
# one of them, nor start with a dot (".", "..", hidden files).
BATCH_FILE_NAMES = frozenset({"batch.json", "summary.csv", "summary.json", "report", ".tmp", ".lock"})


def _label(stem: str) -> str:
    """A scene file's stem made safe as the start of a run id: no dot in front, none of BATCH_FILE_NAMES."""
    safe = _id_part(stem)[0]
    if not safe or safe.startswith(".") or safe in BATCH_FILE_NAMES:
        safe = "scene_" + safe.lstrip(".")
    return safe


def _scene_labels(scene_paths: list[str]) -> dict[str, str]:
    """File stem per scene (_label); scenes that share one (a/x.yaml, b/x.yaml) get a hash of their path."""
    stems: dict[str, list[str]] = {}
    for s in scene_paths:
        stems.setdefault(_label(Path(s).stem), []).append(s)
    labels = {}
    for stem, paths in stems.items():
        for s in paths:
            labels[s] = stem if len(set(paths)) == 1 else f"{stem}-{_short_hash(str(Path(s).resolve()))}"
    return labels


# ---------------------------------------------------------------------------------------------- expansion


def expand_runs(scenes: list[str], seeds: list[int] | None, params: list[tuple[str, list[str]]]) -> list[RunSpec]:
    """Cartesian product scenes x seeds x params[0] values x params[1] values x ...

    ``scenes`` must exist (checked here: a UserError naming SCENE otherwise); duplicate parameter keys are
    refused. No seeds -> one run per combination with the scene's own seed."""
    if not scenes:
        raise UserError("SCENE: give at least one scene file (e.g. scenes/default.yaml) or 'scenes:' in --sweep")
    scenes = [find_scene(s) for s in scenes]   # (a shipped scene by name, from any directory, as run.py SCENE)
    for s in scenes:
        p = Path(s)
        if not p.exists():
            raise UserError(f"SCENE: file not found: {s}")
        if not p.is_file():
            raise UserError(f"SCENE: not a file: {s}")
    keys = [k for k, _ in params]
    dup = {k for k in keys if keys.count(k) > 1}
    if dup:
        raise UserError(f"--set {sorted(dup)[0]}: given more than once (list all values in one --set: key=v1,v2)")
    unique_scenes = list(dict.fromkeys(scenes))
    labels = _scene_labels(unique_scenes)
    seed_axis: list[int | None] = list(seeds) if seeds else [None]
    value_axes = [[(k, v) for v in dict.fromkeys(vals)] for k, vals in params]
    total = math.prod([len(unique_scenes), len(seed_axis)] + [len(a) for a in value_axes])
    if total > limit("runs"):   # before the plan is built: 10^9 runs would fill memory first
        raise UserError(f"batch: {total:,} runs ({len(unique_scenes)} scenes x {len(seed_axis)} seeds"
                        + "".join(f" x {len(a)} values of {k}" for (k, _), a in zip(params, value_axes))
                        + f"); expected at most {limit('runs'):,} (SMOLVLA_LIMITS=runs=N raises the limit)")
    runs = []
    for scene in unique_scenes:
        for seed in seed_axis:
            for combo in itertools.product(*value_axes):
                runs.append(
                    RunSpec(
                        run_id=make_run_id(labels[scene], seed, combo),
                        scene=scene,
                        scene_path=str(Path(scene).resolve()),
                        seed=seed,
                        params=tuple(combo),
                    )
                )
    ids = [r.run_id for r in runs]
    assert len(set(ids)) == len(ids), "run ids must be unique"
    return runs


def scene_seed(scene_path: str) -> int | None:
    """The scene's own ``sim.seed`` for the summary when --seeds is not given (0 when the scene does not
    set it, as in the scene schema); None when the file cannot be read (the worker reports why)."""
    try:
        data = yamlio.load_file(scene_path, "scene file")
        seed = (data.get("sim") or {}).get("seed", 0)
        return int(seed) if isinstance(seed, int) and not isinstance(seed, bool) else None
    except Exception:
        return None
