"""bench vla end to end at a toy size: every store, two rounds, the flat read in each of its forms. The bench checks
every store's sums against numpy's as it runs, so this also checks flat_reduce's fold kernel as the bench uses it.
A module of its own: the bench needs Taichi's kernel profiler (device times)."""
import numpy as np
import pytest
import taichi as ti


@pytest.fixture(scope="module", autouse=True)
def taichi_runtime():
    ti.init(arch=ti.cpu, kernel_profiler=True)
    yield
    ti.reset()


def test_bench_vla_runs_every_store_and_form_in_rounds(monkeypatch):
    import bench.vla_bench as vb
    from bench.vla_bench import bench_distribution, parse_flat_form

    # 64 threads for the default strided read and a wider form last: the partial sums a wider form leaves above the
    # default's 64 must not reach the next store's (or round's) check (the bench compiles after this patch)
    monkeypatch.setattr(vb, "FLAT_THREADS", 64)
    forms = [parse_flat_form(f) for f in ("fold4", "walk4", "128x1")]
    rows, tuned = bench_distribution("heavy", 600, np.random.default_rng(1), 2, lambda: (10.0, 12.0), reuse=False,
                                     kernel_times=True, flat_sweep=forms, rounds=2)
    by = {r["store"]: r for r in rows}
    assert {"padded", "dynamic", "vla (4,16)", "vla tuned ordered (0,1)"} <= set(by)
    assert tuned["runs"] == "bump"
    for name, r in by.items():
        assert r["rounds_n"] == 2 and len(r["rounds"]) == 2
        assert r["fill_kx_padded"] > 0 and r["copy_kGBps"] == 12.0
        if name.startswith("vla"):
            assert set(r["flat_sweep_kms"]) == {"fold4", "walk4", "128x1"}
            assert r["flat_best_cfg"] in {"fold4", "walk4", "128x1", "64x4"}
            assert r["reduce_warp_kx_padded_best"] > 0
    assert by["padded"]["reserved_over_live"] > 100 and by["vla tuned ordered (0,1)"]["reserved_over_live"] < 3


def test_bench_vla_flat_forms_parse_or_refuse():
    from bench.vla_bench import parse_flat_form

    assert parse_flat_form(" Fold8 ") == ("fold", 8) and parse_flat_form("walk16") == ("walk", 16)
    assert parse_flat_form("262144x4") == ("stride", 262144, 4)
    for bad in ("fold0", "walk", "8", "4x0", "x4", "fold-2"):
        with pytest.raises(ValueError):
            parse_flat_form(bad)
