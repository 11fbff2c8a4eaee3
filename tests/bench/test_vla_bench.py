"""bench vla end to end at a toy size: every store, two rounds, every read. The bench checks every store's sums
against numpy's as it runs (get loop, reduce_warp, the strided flat read and flat_reduce's fold), so this also
checks those kernels as the bench uses them. A module of its own: the bench needs Taichi's kernel profiler."""
import numpy as np
import pytest
import taichi as ti


@pytest.fixture(scope="module", autouse=True)
def taichi_runtime():
    ti.init(arch=ti.cpu, kernel_profiler=True, advanced_optimization=False)   # (half the compile time)
    yield
    ti.reset()


def test_bench_vla_runs_every_store_and_read_in_rounds(monkeypatch):
    import bench.vla_bench as vb
    from bench.vla_bench import bench_distribution

    monkeypatch.setattr(vb, "FLAT_THREADS", 64)   # (fewer strided threads than slots: each thread loops)
    rows, tuned = bench_distribution("heavy", 600, np.random.default_rng(1), 2, lambda: (10.0, 12.0), reuse=False,
                                     kernel_times=True, rounds=2)
    by = {r["store"]: r for r in rows}
    assert {"padded", "dynamic", vb.DEFAULT_STORE, "vla tuned ordered (0,1)"} <= set(by)
    assert tuned["runs"] == "bump"
    for name, r in by.items():
        assert r["rounds_n"] == 2 and len(r["rounds"]) == 2
        assert r["fill_kx_padded"] > 0 and r["copy_kGBps"] == 12.0
        if name.startswith("vla"):
            assert r["flat_read_kpct_copy_bw"] > 0 and r["flat_fold_kpct_copy_bw"] > 0
            assert r["reduce_warp_kx_padded_best"] > 0 and r["read_kx_padded_best"] > 0
            assert r["grow_lists"] > 0
    assert by["padded"]["reserved_over_live"] > 100 and by["vla tuned ordered (0,1)"]["reserved_over_live"] < 3
    # the default store runs as the README teaches (never trimmed): its first fill from empty settles it into ordered
    # runs without headroom (lazy release), and refills of the same lengths keep that; the tuned stores are trimmed
    # after their first fill
    default, ordered = by[vb.DEFAULT_STORE], by["vla tuned ordered (0,1)"]
    assert default["reserved_over_live"] <= default["first_reserved_over_live"]
    assert default["layout"].endswith(" ordered")
    assert default["first_device_over_live"] >= default["first_reserved_over_live"]
    assert ordered["first_reserved_over_live"] >= ordered["reserved_over_live"]
    table = vb.user_path_table(rows, kernel_times=True).splitlines()
    assert len(table) == 3 and table[2].startswith("| heavy | ")
    assert f"{default['fill_kx_padded']:.2f} (" in table[2] and f"{default['device_over_live']:.2f} (" in table[2]
