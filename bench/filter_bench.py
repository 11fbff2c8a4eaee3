"""Benchmark of the variable-radius filter: the VLA version against the three baselines, in one run.

    python run.py bench filter [--arch cpu|cuda] [--small] [--out DIR] [...]
    python -m bench.filter_bench ...                       (the same)

Every method filters the same image with the same radius map and must give the same output (checked:
max |difference| against baseline (a) <= CHECK_TOLERANCE). Each is warmed up (compilation excluded),
then timed over --repeats rounds, one run of every method per round (round-robin, so load from other
work on the machine hits all alike), ti.sync() around each run; the median is reported as Mpixel/s.
"bytes" are the compulsory bytes of one filter pass (read the image and the radius map once, write the
output once); their rate is compared with a plain Taichi copy kernel measured in the same run.
Results: DIR/filter_bench.json and DIR/filter_bench.md (also printed).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np

from app.files import write_text_atomic

#: max |difference| allowed between any method and baseline (a): all run the same float32 sum, so
#: the outputs differ only by rounding (fused multiply-adds, scipy's float64 accumulation)
CHECK_TOLERANCE = 1e-5
#: the design's claim: the best VLA method's throughput >= this times baseline (a)'s, at 1080p on the GPU
TARGET_SPEEDUP_VS_A = 1.8
#: --small: the CPU-friendly size (1/6 of 1080p in each direction)
SMALL_SIZE = (320, 180)
MAP_KINDS = ("dof", "random", "constant")


def make_radius_map(kind: str, height: int, width: int, max_radius: int, seed: int = 0) -> np.ndarray:
    """int32 (H, W). dof: depth of field of a ground plane tilted away from the camera, focused at 55% of
    the height, with an in-focus round subject in the middle: smooth bands of every radius 0..max.
    random: uniform per pixel (worst case for divergence). constant: max_radius everywhere."""
    if kind == "constant":
        return np.full((height, width), max_radius, dtype=np.int32)
    if kind == "random":
        return np.random.default_rng(seed).integers(0, max_radius + 1, (height, width)).astype(np.int32)
    if kind != "dof":
        raise ValueError(f"unknown map kind {kind!r}; expected one of {list(MAP_KINDS)}")
    y = np.linspace(0.0, 1.0, height)[:, None]
    x = np.linspace(0.0, 1.0, width)[None, :]
    blur = np.clip(np.abs(y - 0.55) * 2.2, 0.0, 1.0) * np.ones_like(x)
    subject = (x - 0.5) ** 2 * (width / height) ** 2 + (y - 0.5) ** 2 < 0.2**2
    blur[subject] = 0.0
    return np.rint(blur * max_radius).astype(np.int32)


def make_image(height: int, width: int, channels: int, seed: int = 0) -> np.ndarray:
    """float32 (H, W, C) in [0, 1]: smooth gradients plus noise, so a blur changes every pixel."""
    rng = np.random.default_rng(seed)
    y = np.linspace(0, 1, height, dtype=np.float32)[:, None, None]
    x = np.linspace(0, 1, width, dtype=np.float32)[None, :, None]
    c = np.arange(channels, dtype=np.float32)[None, None, :]
    base = 0.5 + 0.25 * np.sin(6.0 * x + 3.0 * y + c)
    return np.clip(base + 0.25 * rng.random((height, width, channels), dtype=np.float32), 0, 1).astype(np.float32)


def _time(fn, warmup: int, repeats: int, sync) -> list[float]:
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return times


def measure_copy_bandwidth(n_floats: int, warmup: int, repeats: int) -> dict:
    """Bytes/s of kernel_copy over n_floats float32 (4 B read + 4 B written per element); best run."""
    import taichi as ti

    from app.filter.kernels import kernel_copy

    src = ti.ndarray(ti.f32, shape=(n_floats,))
    dst = ti.ndarray(ti.f32, shape=(n_floats,))
    src.fill(1.0)
    times = _time(lambda: kernel_copy(src, dst), warmup, repeats, ti.sync)
    moved = 8 * n_floats
    return {"floats": n_floats, "bytes_per_run": moved, "best_s": min(times), "median_s": statistics.median(times), "bytes_per_s": moved / min(times)}


def _device_name(arch: str) -> str:
    if arch == "cuda":
        try:
            q = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
            return q.stdout.strip().splitlines()[0]
        except Exception:
            return "cuda (nvidia-smi unavailable)"
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} logical cores"


def build_parser() -> argparse.ArgumentParser:
    from app.filter.engine import METHODS

    from app.filter.cli import _Parser

    p = _Parser(prog="run.py bench filter", description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--small", action="store_true", help=f"{SMALL_SIZE[0]}x{SMALL_SIZE[1]} instead of --width x --height")
    p.add_argument("--width", type=int, default=1920)
    p.add_argument("--height", type=int, default=1080)
    p.add_argument("--channels", type=int, default=3)
    p.add_argument("--max-radius", type=int, default=8)
    p.add_argument("--map", default="dof", choices=list(MAP_KINDS))
    p.add_argument("--kernel", default="gaussian")
    p.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset of " + ",".join(METHODS))
    p.add_argument("--no-scipy", action="store_true", help="skip baseline (c) (slow at 1080p)")
    p.add_argument("--specialise", type=int, default=None, help="radii up to this get compile-time paths in vla-flat/vla-shared (-1: none; default app.filter.engine.DEFAULT_SPECIALISE)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--scipy-repeats", type=int, default=1, help="timed runs of baseline (c), which needs no warm-up")
    p.add_argument("--copy-mib", type=int, default=None, help="size of each copy buffer in MiB (default 64 on cpu, 1024 on cuda)")
    p.add_argument("--out", default=None, help="directory for filter_bench.json and filter_bench.md")
    return p


def run_bench(args) -> dict:
    import taichi as ti

    from app.errors import UserError
    from app.filter.cli import init_taichi
    from app.filter.engine import METHODS, FilterEngine

    init_taichi(args.arch)
    width, height = SMALL_SIZE if args.small else (args.width, args.height)
    methods = [m for m in args.methods.split(",") if m]
    for m in methods:
        if m not in METHODS:
            raise UserError(f"--methods: unknown method {m!r}; expected some of {list(METHODS)}")
    if args.no_scipy and "scipy" in methods:
        methods.remove("scipy")
    from app.filter.engine import DEFAULT_SPECIALISE

    spec = DEFAULT_SPECIALISE if args.specialise is None else args.specialise
    engine = FilterEngine(height, width, args.channels, args.max_radius, args.kernel, specialise=spec)
    skipped = {}
    for m in list(methods):
        why = engine.unavailable(m)
        if why:
            methods.remove(m)
            skipped[m] = why
    image = make_image(height, width, args.channels)
    radius_map = make_radius_map(args.map, height, width, args.max_radius)
    engine.set_image(image)
    engine.set_radius_map(radius_map)
    # the same (VLA) weights object for every vla method, built before timing
    if any(m.startswith("vla") for m in methods):
        engine.weights_vla()

    pixels = height * width
    taps_per_pixel = float(np.mean((2 * radius_map.astype(np.float64) + 1) ** 2))
    compulsory = pixels * (2 * 4 * args.channels + 4)  # image in + out (float32), radius map (int32)
    copy_floats = (args.copy_mib or (1024 if args.arch == "cuda" else 64)) * (1 << 20) // 4
    copy = measure_copy_bandwidth(copy_floats, args.warmup, max(args.repeats, 3))

    # warm up every method (compiles), then time them round-robin, so that a slow spell of a shared
    # machine hits every method alike; the output of each is kept right after its last run
    device_methods = [m for m in methods if m != "scipy"]
    for m in list(device_methods):
        try:
            _time(lambda m=m: engine.run(m), max(1, args.warmup), 0, ti.sync)
        except Exception as e:  # a method that does not compile here is reported, not fatal
            device_methods.remove(m)
            methods.remove(m)
            skipped[m] = f"failed: {type(e).__name__}: {str(e).strip().splitlines()[-1][:300] if str(e).strip() else ''}"
            print(f"warning: method {m} failed and is skipped: {skipped[m]}", file=sys.stderr)
    all_times = {m: [] for m in methods}
    outputs = {}
    for _ in range(args.repeats):
        for m in device_methods:
            all_times[m] += _time(lambda m=m: engine.run(m), 0, 1, ti.sync)
    for m in device_methods:
        engine.run(m)
        ti.sync()
        outputs[m] = engine.result(m).copy()
    if "scipy" in methods:
        all_times["scipy"] = _time(lambda: engine.run("scipy"), 0, max(1, args.scipy_repeats), ti.sync)
        outputs["scipy"] = engine.result("scipy").copy()

    rows = []
    for m in methods:
        times = all_times[m]
        med = statistics.median(times)
        executed_taps = (2 * args.max_radius + 1) ** 2 if m == "padded" else taps_per_pixel
        rows.append(
            {
                "method": m,
                "median_ms": 1e3 * med,
                "best_ms": 1e3 * min(times),
                "runs": len(times),
                "mpixel_per_s": pixels / med / 1e6,
                "taps_per_pixel": executed_taps,
                "gtaps_per_s": pixels * executed_taps / med / 1e9,
                "compulsory_gb_per_s": compulsory / med / 1e9,
                "fraction_of_copy_bw": (compulsory / med) / copy["bytes_per_s"],
                "launches": {"per-radius": len(engine.radii_present), "vla-flat": 2, "scipy": 0}.get(m, 1),
            }
        )
    reference = outputs.get("per-radius", next(iter(outputs.values())) if outputs else None)
    base = next((r for r in rows if r["method"] == "per-radius"), None)
    for r in rows:
        r["max_abs_diff_vs_a"] = float(np.max(np.abs(outputs[r["method"]] - reference)))
        r["matches"] = r["max_abs_diff_vs_a"] <= CHECK_TOLERANCE
        r["speedup_vs_a"] = (base["median_ms"] / r["median_ms"]) if base else None

    vla_rows = [r for r in rows if r["method"].startswith("vla")]
    best = max(vla_rows, key=lambda r: r["mpixel_per_s"]) if vla_rows else None
    summary = None
    if best is not None and base is not None:
        summary = {
            "best_vla_method": best["method"],
            "speedup_vs_a": best["speedup_vs_a"],
            "target_speedup_vs_a": TARGET_SPEEDUP_VS_A,
            "target_met": best["speedup_vs_a"] >= TARGET_SPEEDUP_VS_A,
            "target_applies": args.arch == "cuda" and (width, height) == (1920, 1080),
        }
    return {
        "command": "python run.py bench filter " + " ".join(args._argv),
        "summary": summary,
        "arch": args.arch,
        "device": _device_name(args.arch),
        "taichi": ti.__version__ if hasattr(ti, "__version__") else str(ti.lang.impl.get_runtime()),
        "width": width,
        "height": height,
        "channels": args.channels,
        "max_radius": args.max_radius,
        "map": args.map,
        "kernel": args.kernel,
        "specialise": engine.specialise,
        "radii_present": engine.radii_present,
        "mean_taps_per_pixel": taps_per_pixel,
        "compulsory_bytes_per_pass": compulsory,
        "copy": copy,
        "warmup": args.warmup,
        "repeats": args.repeats,
        "check_tolerance": CHECK_TOLERANCE,
        "results": rows,
        "skipped": skipped,
        "vla_params": engine.weights.stats() if engine.weights is not None else None,
    }


def to_markdown(report: dict) -> str:
    lines = [
        f"Filter benchmark: {report['width']}x{report['height']}x{report['channels']}, radius map '{report['map']}' "
        f"(radii {report['radii_present'][0]}..{report['radii_present'][-1]}, mean {report['mean_taps_per_pixel']:.1f} taps/pixel), "
        f"{report['kernel']} kernel, compile-time paths in the staged VLA kernels for radii <= {report['specialise']}, "
        f"arch {report['arch']} ({report['device']}).",
        f"Copy bandwidth (plain Taichi copy, {report['copy']['bytes_per_run'] / 2**20:.0f} MiB moved): "
        f"{report['copy']['bytes_per_s'] / 1e9:.1f} GB/s. Command: `{report['command']}`",
        "",
        "| method | median ms | Mpixel/s | x (a) | Gtap/s | compulsory GB/s | % of copy BW | launches | max diff vs (a) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["results"]:
        sp = f"{r['speedup_vs_a']:.2f}" if r["speedup_vs_a"] is not None else "-"
        lines.append(
            f"| {r['method']} | {r['median_ms']:.2f} | {r['mpixel_per_s']:.1f} | {sp} | {r['gtaps_per_s']:.2f} | "
            f"{r['compulsory_gb_per_s']:.2f} | {100 * r['fraction_of_copy_bw']:.2f} | {r['launches']} | "
            f"{r['max_abs_diff_vs_a']:.1e}{'' if r['matches'] else ' MISMATCH'} |"
        )
    s = report.get("summary")
    if s:
        verdict = ("met" if s["target_met"] else "missed") if s["target_applies"] else "applies to --arch cuda at 1920x1080 only"
        lines.append(
            f"\nBest VLA method: {s['best_vla_method']}, {s['speedup_vs_a']:.2f}x baseline (a); "
            f"target >= {s['target_speedup_vs_a']}x: {verdict}."
        )
    for m, why in report["skipped"].items():
        lines.append(f"\n{m}: skipped ({why}).")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args._argv = argv
    report = run_bench(args)
    md = to_markdown(report)
    print(md)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        write_text_atomic(os.path.join(args.out, "filter_bench.json"), json.dumps(report, indent=2, default=str))
        write_text_atomic(os.path.join(args.out, "filter_bench.md"), md)
    if not all(r["matches"] for r in report["results"]):
        print(f"error: a method's output differs from baseline (a) by more than {CHECK_TOLERANCE}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
