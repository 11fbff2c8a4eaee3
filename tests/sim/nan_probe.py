"""Run by tests/sim/test_sim.py in a subprocess: Taichi with fast math (its default, as run.py uses it), one sphere
resting on a plane, a NaN put into its contact's point either before the solver step ("prepare") or after
kernel_prepare, before the Jacobi iterations ("iterations"); prints what Simulation.check() raises."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402
import taichi as ti  # noqa: E402


def main(stage: str) -> str:
    from app.sim.integrator import kernel_integrate
    from app.sim.narrowphase import find_contacts
    from app.scene import scene_from_dict
    from app.sim import Simulation, SimulationError
    from app.sim.solver import kernel_prepare, kernel_solve_iterations

    scene = scene_from_dict({"name": "nan", "sim": {"max_speed": 50.0}, "materials": {"m": {}},
                             "static": [{"type": "plane", "normal": [0, 1, 0], "offset": 0, "material": "m"}],
                             "bodies": [{"shape": "sphere", "radius": 0.1, "position": [0, 0.099, 0],
                                         "material": "m"}]})
    sim = Simulation(scene, verbose=False)
    sim.step()
    sim.contacts.flip()
    sim.grid.build(sim.model, sim.state)
    find_contacts(sim.model, sim.state, sim.grid, sim.contacts, sim.diagnostics, sim.dt)
    c, lists, solver = sim.contacts, sim.contacts.lists, sim.solver

    def poison():
        offsets, values = lists.to_csr()
        first = int(offsets[c.base])
        assert offsets[c.base + 1] - first == 1  # the sphere's one plane contact
        values["point"][first] = np.nan   # (the normal is an integer code: app.sim.math3d.encode_normal)
        lists.from_csr(offsets, values)

    if stage == "prepare":
        poison()
    kernel_prepare(sim.model, sim.state, lists, c.base, solver, c, sim.diagnostics, sim.dt)
    if stage == "iterations":
        poison()
    kernel_solve_iterations(sim.model, lists, c.base, solver, 0, 1, sim.dt, c.failed_step)
    kernel_integrate(sim.model, sim.state, sim.state, solver, 1, sim.dt, sim.step_count, sim.diagnostics,
                     c.failed_step)
    try:
        sim.check()
    except SimulationError as e:
        return str(e)
    return "no error"


if __name__ == "__main__":
    # fast_math on (Taichi's default; the app runs without it, app.runtime.TAICHI_OPTIONS): the harder case,
    # where the compiler (LLVM, told that floats are finite) may fold a NaN test away; otherwise with the CPU's
    # options of the app (app.runtime.CPU_OPTIONS: a cold compile of minutes without them)
    from app.runtime import CPU_OPTIONS

    ti.init(arch=ti.cpu, log_level=ti.WARN, **CPU_OPTIONS)
    for stage in sys.argv[1:]:
        print(f"{stage}: {main(stage)}", flush=True)
