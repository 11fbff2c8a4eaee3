"""The README's VLA example runs and gives exactly the brute-force neighbour lists."""
import numpy as np
import pytest
import taichi as ti


@pytest.fixture(scope="module", autouse=True)
def taichi_runtime():
    ti.init(arch=ti.cpu, advanced_optimization=False)   # (half the compile time)
    yield
    ti.reset()


def test_readme_vla_example_matches_numpy():
    from examples.vla_quickstart import main

    pos, offsets, values, sums, flat_sum = main(n=400, radius=0.1, seed=3)
    d = np.linalg.norm(pos[:, None, :] - pos[None, :, :], axis=-1)
    for i in range(len(pos)):
        expect = sorted(j for j in np.nonzero(d[i] < 0.1)[0] if j != i)
        got = sorted(values[offsets[i]:offsets[i + 1]].tolist())
        # float32 on both sides; a pair exactly at the radius could differ, so compare away from it
        near_edge = np.abs(d[i] - 0.1) < 1e-6
        assert set(got) ^ set(expect) <= set(np.nonzero(near_edge)[0].tolist())
        assert sums[i] == sum(got)
    assert flat_sum == int(values.sum())   # the flat fold visits every element once
