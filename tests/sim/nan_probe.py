"""Run by tests/sim/test_sim.py in a subprocess: Taichi with fast math (its default; the app runs without it), one
sphere resting on a plane, its one contact record written as the narrowphase writes it, a NaN put into the record's
point either before the solver step ("prepare") or after kernel_prepare, before the Jacobi iterations
("iterations"); prints what Simulation.check() raises. Only the solver's kernels run (and compile)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402
import taichi as ti  # noqa: E402

# app.sim.math3d.encode_normal of (0, 1, 0): x 0 in the low 16 bits, y = 32767 (NORMAL_CODE_SCALE) in the high ones
UP_CODE = 32767 << 16


def scene():
    from app.scene import scene_from_dict

    r = 0.1
    return scene_from_dict({"name": "nan", "sim": {"max_speed": 50.0}, "materials": {"m": {}},
                            "static": [{"type": "plane", "normal": [0, 1, 0], "offset": 0, "material": "m"}],
                            "bodies": [{"shape": "sphere", "radius": r, "position": [0, r - 0.001, 0],
                                        "material": "m"}]})


def main(stage: str, sim) -> str:
    from app.sim import SimulationError
    from app.sim.integrator import kernel_integrate
    from app.sim.solver import kernel_prepare, kernel_solve_iterations

    sim.load(scene())   # (a fresh start: no error recorded yet)
    c, lists, solver = sim.contacts, sim.contacts.lists, sim.solver
    c.flip()

    def write_contact(point):
        # the sphere's contact with plane 0 (other = -1 - 0), pushing it up, 1 mm deep, no impulse yet
        offsets = np.zeros(lists.num_arrays + 1, np.int64)
        offsets[c.base + 1:] = 1
        lists.from_csr(offsets, {"point": np.array([point], np.float32), "depth": np.array([0.001], np.float32),
                                 "normal_code": np.array([UP_CODE], np.int32), "bias": np.zeros(1, np.float32),
                                 "other": np.array([-1], np.int32), "feature": np.zeros(1, np.int32),
                                 "impulse_n": np.zeros(1, np.float32), "impulse_t": np.zeros((1, 2), np.float32),
                                 "impulse_p": np.zeros(1, np.float32)})

    write_contact([0.0, -0.001, 0.0])
    if stage == "prepare":
        write_contact([np.nan, -0.001, 0.0])
    kernel_prepare(sim.model, sim.state, lists, c.base, solver, c, sim.diagnostics, sim.dt)
    if stage == "iterations":
        write_contact([np.nan, -0.001, 0.0])
    kernel_solve_iterations(sim.model, lists, c.base, solver, 0, 1, sim.dt, c.failed_step)
    kernel_integrate(sim.model, sim.state, sim.state, solver, 1, sim.dt, sim.step_count, sim.diagnostics,
                     c.failed_step)
    try:
        sim.check()
    except SimulationError as e:
        return str(e)
    return "no error"


if __name__ == "__main__":
    # fast_math on (Taichi's default; the app runs without it, app.runtime.TAICHI_OPTIONS): the harder case, where
    # the compiler (LLVM, told that floats are finite) may fold a NaN test away; otherwise with the CPU's options of
    # the app (app.runtime.CPU_OPTIONS: a cold compile of minutes without them)
    from app.runtime import CPU_OPTIONS

    from app.sim import Simulation

    ti.init(arch=ti.cpu, log_level=ti.WARN, **CPU_OPTIONS)
    simulation = Simulation(scene(), verbose=False)
    for stage in sys.argv[1:]:
        print(f"{stage}: {main(stage, simulation)}", flush=True)
