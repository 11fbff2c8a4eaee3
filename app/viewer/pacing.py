"""How much simulation a viewer frame runs, so that the window keeps its frame rate when the simulation is slow.

    pacer = FramePacer(substeps)
    steps = pacer.steps()                    # before each frame; 0: draw this frame without stepping
    pacer.stepped(steps, ms)                 # the frame's simulation took ms
    pacer.drew(ms)                           # its drawing took ms
    pacer.frame_done(sim_seconds, wall_seconds)
    pacer.step_ms, pacer.draw_ms, pacer.realtime   # moving averages (a step, a frame's drawing, sim s per wall s)

A frame aims at TARGET_FRAME_MS (1/64 s: 60 frames/s with a margin). The simulation gets what drawing leaves of it;
at least MIN_SIM_SHARE of the target (3.9 ms), so that it keeps moving however slow the drawing; and more, up to
MIN_SIM_SHARE of the drawing time, while the frame stays within LEAST_FRAME_MS. So the camera and the panel keep 30
frames/s wherever drawing takes less than about 29 ms (27.4 ms of drawing and 3.9 ms of simulation: 31.3 ms
frames), at the cost of the simulation's pace, and a slower rasteriser (lavapipe on a CPU) still moves the
simulation along. Steps are owed fractionally: a step that takes longer than the budget runs every few frames
instead of holding every frame up (a 1M-body step of 11 ms with a 5 ms budget runs on about every other frame), and
the camera, the panel and picking keep their frame rate. A frame never runs more than the scene's substeps, so the
viewer never goes faster than real time. Pure Python: the interactive window and `bench viewer` pace the same way.
"""
from __future__ import annotations

# The frame the viewer aims at (ms): 60 frames/s less a margin for the jitter of the step and draw times, which the
# pacer knows only as moving averages (as LEAST_FRAME_MS for 30). Aimed at 1/60 s exactly, default.yaml's paced frames
# on an H100 had a median of 16.58 ms and a mean of 17.9 (55.9 frames/s): the slower frames went over.
TARGET_FRAME_MS = 1000.0 / 64
# The simulation's share: at least this much of the target frame, and up to this much of the drawing time where
# the frame stays within LEAST_FRAME_MS (see the module docstring).
MIN_SIM_SHARE = 0.25
# The longest frame the simulation's share beyond the least may make (ms): 30 frames/s, less a margin for the
# jitter of the step and draw times, which the pacer knows only as moving averages.
LEAST_FRAME_MS = 1000.0 / 32
# A frame runs a step at least this often (frames), however slow the step: a step time inflated by a kernel
# compile is measured again soon, and a very slow simulation still moves.
MAX_IDLE_FRAMES = 4
# Weight of the newest frame in the moving averages (of the drawing time and the real-time factor; of a step's
# time when it grows: the step time follows a slowing simulation sooner).
SMOOTHING = 0.1
STEP_SMOOTHING = 0.2


class FramePacer:
    """Steps per frame from the measured step and draw times (see the module docstring)."""

    def __init__(self, substeps: int):
        self.substeps = max(1, int(substeps))
        self.credit = 0.0        # steps owed to the simulation, fractional
        self.idle = 0            # frames since the last one that stepped
        self.step_ms = 0.0       # a step, moving average (0: not timed yet)
        self.draw_ms = 0.0       # a frame's drawing, moving average
        self.realtime = 0.0      # simulated s per wall s, moving average

    def budget_ms(self) -> float:
        """The simulation's share of the next frame (ms)."""
        draw = self.draw_ms
        least = MIN_SIM_SHARE * TARGET_FRAME_MS
        return max(TARGET_FRAME_MS - draw, min(MIN_SIM_SHARE * max(draw, TARGET_FRAME_MS),
                                               max(LEAST_FRAME_MS - draw, least)))

    def steps(self) -> int:
        """Steps for the next frame: 0 .. substeps. Until a step has been timed: one."""
        if self.step_ms <= 0.0:
            return 1
        self.credit = min(self.credit + self.budget_ms() / self.step_ms, float(self.substeps))
        n = int(self.credit)
        self.credit -= n
        self.idle = self.idle + 1 if n == 0 else 0
        if self.idle >= MAX_IDLE_FRAMES:
            n, self.credit, self.idle = 1, 0.0, 0
        return n

    def stepped(self, steps: int, ms: float):
        """Record a frame's simulation: `steps` steps in `ms`. A faster step is believed at once (the first frames'
        include kernel compiles), a slower one gradually."""
        if steps > 0:
            per = ms / steps
            self.step_ms = per if self.step_ms == 0.0 or per < self.step_ms else \
                (1.0 - STEP_SMOOTHING) * self.step_ms + STEP_SMOOTHING * per

    def drew(self, ms: float):
        """Record a frame's drawing time (ms)."""
        ms = max(ms, 0.0)
        self.draw_ms = ms if self.draw_ms == 0.0 else (1.0 - SMOOTHING) * self.draw_ms + SMOOTHING * ms

    def frame_done(self, sim_seconds: float, wall_seconds: float):
        """Record a frame: how much simulated time it advanced in how much wall time."""
        if wall_seconds > 0.0:
            r = sim_seconds / wall_seconds
            self.realtime = r if self.realtime == 0.0 else (1.0 - SMOOTHING) * self.realtime + SMOOTHING * r
