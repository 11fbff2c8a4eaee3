"""How much simulation a viewer frame runs, so that the window keeps its frame rate when the simulation is slow.

    pacer = FramePacer(substeps)
    steps = pacer.steps(step_ms, draw_ms)    # before each frame; 0: draw this frame without stepping
    pacer.frame_done(sim_seconds, wall_seconds)
    pacer.realtime                           # simulated seconds per wall second (moving average)

A frame aims at TARGET_FRAME_MS. The simulation gets what drawing leaves of it, and never less than
MIN_SIM_SHARE of the target or of the drawing time, whichever is longer: where drawing alone takes longer than
the target (a CPU rasteriser), the frame rate cannot be had anyway and the simulation keeps moving. Steps are owed fractionally: a step that takes
longer than the budget runs every few frames instead of holding every frame up (a 1M-body step of 11 ms with a
5 ms budget runs on about every other frame), and the camera, the panel and picking keep their frame rate. A
frame never runs more than the scene's substeps, so the viewer never goes faster than real time. Pure Python:
the interactive window and `bench viewer` pace the same way.
"""
from __future__ import annotations

# The frame rate the viewer aims at (ms a frame).
TARGET_FRAME_MS = 1000.0 / 60.0
# The simulation's least budget, as a share of the target frame or of the drawing time if that is longer.
MIN_SIM_SHARE = 0.25
# A frame runs a step at least this often (frames), however slow the step: a step time inflated by a kernel
# compile is measured again soon, and a very slow simulation still moves.
MAX_IDLE_FRAMES = 4
# Weight of the newest frame in the moving averages.
SMOOTHING = 0.1


class FramePacer:
    """Steps per frame from the measured step and draw times (see the module docstring)."""

    def __init__(self, substeps: int):
        self.substeps = max(1, int(substeps))
        self.credit = 0.0        # steps owed to the simulation, fractional
        self.idle = 0            # frames since the last one that stepped
        self.realtime = 0.0      # simulated s per wall s, moving average

    def budget_ms(self, draw_ms: float) -> float:
        """The simulation's share of the next frame (ms)."""
        draw_ms = max(draw_ms, 0.0)
        return max(TARGET_FRAME_MS - draw_ms, MIN_SIM_SHARE * max(draw_ms, TARGET_FRAME_MS))

    def steps(self, step_ms: float, draw_ms: float) -> int:
        """Steps for the next frame: 0 .. substeps. Until a step has been timed (step_ms <= 0): one."""
        if step_ms <= 0.0:
            return 1
        self.credit = min(self.credit + self.budget_ms(draw_ms) / step_ms, float(self.substeps))
        n = int(self.credit)
        self.credit -= n
        self.idle = self.idle + 1 if n == 0 else 0
        if self.idle >= MAX_IDLE_FRAMES:
            n, self.credit, self.idle = 1, 0.0, 0
        return n

    def frame_done(self, sim_seconds: float, wall_seconds: float):
        """Record a frame: how much simulated time it advanced in how much wall time."""
        if wall_seconds > 0.0:
            r = sim_seconds / wall_seconds
            self.realtime = r if self.realtime == 0.0 else (1.0 - SMOOTHING) * self.realtime + SMOOTHING * r
