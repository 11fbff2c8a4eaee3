"""The benchmarks' own arithmetic: how bench sim and bench vla take turns, ratios and medians, and bench lanes'
statistic, and the contact-memory slice's scene. No Taichi kernel runs."""
import numpy as np
import pytest


def test_sim_bench_repeats_take_turns_and_report_medians():
    # bench sim --repeats: storages alternate going first, and each case reports its median run with the range.
    from bench.sim_bench import _schedule, summarize

    order = [(rep, s) for rep, s, _ in _schedule([("vla", ()), ("padded", ()), ("dynamic", ())], 3)]
    assert order == [(0, "vla"), (0, "padded"), (0, "dynamic"), (1, "padded"), (1, "dynamic"), (1, "vla"),
                     (2, "dynamic"), (2, "vla"), (2, "padded")]
    runs = [{"scene": "p", "storage": st, "ms_per_step": ms, "repeat": i}
            for i, (st, ms) in enumerate([("vla", 3.4), ("padded", 4.2), ("vla", 3.9), ("padded", 3.8),
                                          ("vla", 3.3), ("padded", 4.1), ("vla", 3.5), ("padded", 9.0)])]
    runs.append({"scene": "q", "storage": "dynamic", "error": "exit code -6"})
    by = {(r["scene"], r["storage"]): r for r in summarize(runs)}
    assert (by["p", "vla"]["ms_per_step"], by["p", "vla"]["ms_min"], by["p", "vla"]["ms_max"]) == (3.4, 3.3, 3.9)
    assert by["p", "padded"]["ms_per_step"] == 4.1 and by["p", "padded"]["repeats"] == 4  # lower middle of 4
    assert "error" in by["q", "dynamic"]


def test_vla_bench_rounds_take_each_ratio_within_its_round_and_report_medians():
    # bench vla --rounds: a ratio is taken against the baseline's figure of the same round, and the row reports the
    # median of each figure and ratio over the rounds (the lower middle one for an even count).
    from bench.vla_bench import _add_ratios, _median_of_rounds

    rounds = []
    for pad_warp, vla_warp, fold, copy in ((0.060, 0.040, 0.050, 3000.0), (0.066, 0.033, 0.040, 2000.0),
                                           (0.063, 0.042, 0.045, 3000.0)):
        common = {"fill_ms": 1.0, "read_ms": 1.0, "reduce_ms": 1.0, "fill_kms": 0.4, "read_kms": 0.09,
                  "reduce_kms": 0.09, "copy_GBps": copy, "copy_kGBps": copy}
        rows = [dict(common, store="padded", reduce_warp_ms=1.0, reduce_warp_kms=pad_warp),
                dict(common, store="vla", fill_kms=0.2, reduce_warp_ms=1.0, reduce_warp_kms=vla_warp,
                     flat_read_ms=1.0, flat_read_kms=0.06, flat_fold_ms=1.0, flat_fold_kms=fold)]
        _add_ratios(rows, live_bytes=30_000_000)
        rounds.append(rows[1])
    assert [r["reduce_warp_kx_padded_best"] for r in rounds] == pytest.approx([1.5, 2.0, 1.5])
    assert [r["read_kx_padded_best"] for r in rounds] == pytest.approx([0.06 / 0.09, 0.066 / 0.09, 0.063 / 0.09])
    row = _median_of_rounds(rounds)
    assert row["reduce_warp_kx_padded_best"] == pytest.approx(1.5)   # not 0.063 / 0.040, the ratio of the medians
    assert row["reduce_warp_kms"] == pytest.approx(0.040) and row["fill_kx_padded"] == pytest.approx(2.0)
    # fold: 30 MB in 50 / 40 / 45 us = 600 / 750 / 667 GB/s against copies of 3000 / 2000 / 3000: 20%, 37.5%, 22.2%
    assert row["flat_fold_kpct_copy_bw"] == pytest.approx(100 * 0.03 / 0.045 / 3)
    assert row["flat_read_kpct_copy_bw"] == pytest.approx(100 * 0.03 / 0.06 / 3)
    assert row["rounds_n"] == 3
    assert _median_of_rounds(rounds[:2])["reduce_warp_kms"] == pytest.approx(0.033)   # lower middle of two


def test_lane_use_statistic():
    # bench lanes' formula: useful lane-iterations over the lane-iterations a warp lasts (its longest list)
    from bench.dev.lanes_bench import lane_use

    assert lane_use(np.full(64, 5), np.arange(64)) == 1.0
    counts = np.arange(32)
    assert lane_use(counts, np.arange(32)) == pytest.approx(counts.sum() / (32 * 31))
    two = np.concatenate([np.zeros(32, int), np.full(32, 4)])  # grouped: one idle warp, one full one
    mixed = np.arange(64).reshape(2, 32).T.reshape(-1)  # interleaved: both warps last 4 iterations
    assert lane_use(two, np.arange(64)) == 1.0 and lane_use(two, mixed) == 0.5


@pytest.mark.parametrize("module", ["bench.sim_bench", "bench.dev.dynamic_pool", "bench.dev.lanes_bench",
                                    "bench.dev.ncu_step", "bench.dev.profile_bench"])
def test_benches_find_the_shipped_scenes(module):
    # Each bench that loads scenes/<name>.yaml builds the path from its ROOT: the repository's, wherever it sits.
    import importlib
    import os

    root = importlib.import_module(module).ROOT
    assert os.path.isfile(os.path.join(root, "run.py")) and os.path.isfile(os.path.join(root, "scenes", "bounce.yaml"))


def test_frame_end_bench_times_both_ways_of_ending_a_frame():
    # bench frame-end draws offscreen frames and ends each by the image's read-back or by the depth buffer's copy.
    import os
    import subprocess
    import sys

    from app.viewer.display import vulkan_problem

    if vulkan_problem() is not None:
        pytest.skip(vulkan_problem())
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, "run.py", "bench", "frame-end", "--arch", "cpu", "--particles", "200",
                           "--frames", "2", "--size", "64x48"], cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    times = {line[:16].strip(): float(line[16:].split()[0]) for line in proc.stdout.splitlines()
             if line.endswith("ms/frame")}
    assert set(times) == {"image read-back", "depth copy"} and all(t > 0 for t in times.values())
    bad = subprocess.run([sys.executable, "run.py", "bench", "frame-end", "--size", "64"], cwd=root,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "--size: expected WxH" in bad.stderr and "Traceback" not in bad.stderr


def test_sim_bench_capacity_reaches_the_simulation_and_rejects_nonsense(tmp_path):
    # --capacity sizes every run's Simulation (so that scenes share compiled kernels); a non-positive one is one line.
    import json
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    bad = subprocess.run([sys.executable, "run.py", "bench", "sim", "--capacity", "0"], cwd=root, capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode != 0 and "--capacity: expected a positive integer" in bad.stderr
    assert "Traceback" not in bad.stderr
    out = tmp_path / "b"
    ok = subprocess.run([sys.executable, "run.py", "bench", "sim", "--arch", "cpu", "--capacity", "4096", "--steps", "2",
                         "--warmup", "1", "--scenes", "bounce", "--storages", "vla", "--out", str(out)], cwd=root,
                        capture_output=True, text=True, timeout=600)
    assert ok.returncode == 0, ok.stderr[-2000:]
    run = json.loads((out / "sim_bench.json").read_text())["runs"][0]
    # the grid and the contact lists are sized by the body capacity: more than bounce's own (16 bodies) gets
    assert run["bodies"] < 16 and run["contact_storage_stats"]["arrays"] >= 2 * 4096


def test_contact_memory_slice_keeps_pile_1m_density_and_heights():
    # bench contact-memory: the slice's container holds its bodies at pile_1m's bodies per square metre (the yaml's
    # 1,000,000 in 20 x 20 m), poured from pile_1m's heights, and the scene loads (its region holds the count).
    import yaml

    from app.scene import load_scene
    from bench.dev.contact_memory_bench import PILE_1M, slice_overrides

    with open(PILE_1M) as f:
        full = yaml.safe_load(f)
    size_full, gen_full = full["static"][0]["size"], full["bodies"][0]
    for bodies in (2000, 15500):
        part = load_scene(PILE_1M, slice_overrides(bodies))
        assert part.body_count == bodies
        size, gen = part.statics[0]["size"], part.raw["bodies"][0]
        assert bodies / (size[0] * size[2]) == pytest.approx(gen_full["count"] / (size_full[0] * size_full[2]),
                                                             rel=1e-3)
        assert size[1] == size_full[1]
        assert (gen["min"][1], gen["max"][1]) == (gen_full["min"][1], gen_full["max"][1])
