"""Taichi's limit on SNode trees: a program that keeps making VLAs (or Batches) without release() gets a clear
VLACapacityError before Taichi 1.7's CPU/CUDA runtime would corrupt its memory (vla.taichi_compat.SNODE_TREE_LIMIT).
A module of its own: it uses up the ids of its Taichi program."""
import os

import pytest
import taichi as ti

from vla import VLA, Batch, VLACapacityError, launch

ARCH = os.environ.get("SMOLVLA_TEST_ARCH", "cpu")
CPU_OPTIONS = {"cpu": {"advanced_optimization": False}}   # (as in test_vla.py: half the compile time on the CPU)


@pytest.fixture(scope="module", autouse=True)
def taichi_runtime():
    ti.init(arch=getattr(ti, ARCH), **CPU_OPTIONS.get(ARCH, {}))
    yield
    ti.reset()


@ti.kernel
def k_fill(v: ti.template(), n: ti.i32):
    for j in range(n):
        v.append(j % v.num_arrays, j)


def test_too_many_vlas_raise_before_taichi_corrupts_memory():
    # Without the check, the 513th tree is written past Taichi's table and a later launch segfaults (a hypothesis
    # run that made a Batch per example died that way). Each VLA holds six trees here; 100 of them would need 600.
    vlas = []
    with pytest.raises(VLACapacityError, match="SNode trees") as e:
        for k in range(100):
            vlas.append(VLA(4, ti.i32, inline_capacity=1, chunk_size=2, name=f"many{k}"))
    assert "release()" in str(e.value) and 60 < len(vlas) < 100
    with pytest.raises(VLACapacityError, match="SNode trees"):
        Batch()
    # the VLAs made before still work, also through a growth (its new trees take the ids it frees)
    launch(k_fill, vlas[-1], 400)
    assert sorted(vlas[-1].to_lists()[1]) == list(range(1, 400, 4))
    # released VLAs give their ids back
    for v in vlas[:3]:
        v.release()
    again = VLA(4, ti.i32, inline_capacity=1, chunk_size=2, name="again")
    launch(k_fill, again, 40)
    assert sorted(again.to_lists()[2]) == list(range(2, 40, 4))
    batch = Batch()
    batch.release()
    # the simulator checks before it allocates (its own fields sit on Taichi's root, which no check guards)
    from app.scene import scene_from_dict
    from app.sim import Simulation, SimulationCapacityError

    scene = scene_from_dict({"name": "one", "materials": {"m": {}},
                             "bodies": [{"shape": "sphere", "radius": 0.1, "position": [0, 1, 0], "material": "m"}]})
    with pytest.raises(SimulationCapacityError, match="SNode trees"):
        Simulation(scene, verbose=False)
