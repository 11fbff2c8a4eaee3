"""The rigid-body simulation: Model (static) / State / ContactSet / Diagnostics, the broadphase, narrowphase and
solver kernels, and the Simulation that runs them. Imports nothing of the viewer, batch or filter."""
from app.sim.simulation import Simulation, SimulationCapacityError, SimulationError

__all__ = ["Simulation", "SimulationError", "SimulationCapacityError"]
