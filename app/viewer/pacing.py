"""How much simulation a viewer frame runs, so that the window keeps its frame rate when the simulation is slow.

    pacer = FramePacer(substeps)
    steps = pacer.steps()                    # before each frame; 0: draw this frame without stepping
    pacer.stepped(steps, ms)                 # the frame's simulation cost the host ms
    pacer.drew(ms)                           # its drawing took ms
    pacer.frame_done(sim_seconds, wall_seconds)
    pacer.step_ms, pacer.draw_ms, pacer.realtime   # moving averages (a step, a frame's drawing, sim s per wall s)

A frame aims at TARGET_FRAME_MS. The simulation gets what drawing leaves of it, and never less than
MIN_SIM_SHARE of the target or of the drawing time, whichever is longer: where drawing alone takes longer than
the target (a CPU rasteriser), the frame rate cannot be had anyway and the simulation keeps moving. Steps are owed
fractionally: a step that takes longer than the budget runs every few frames instead of holding every frame up (a
1M-body step of 11 ms with a 5 ms budget runs on about every other frame), and the camera, the panel and picking
keep their frame rate. A frame never runs more than the scene's substeps, so the viewer never goes faster than real
time. Pure Python: the interactive window and `bench viewer` pace the same way.

On a GPU a frame launches its steps and draws while the device runs them (FrameSteps, Simulation.launch_frame):
a step then costs the frame its launch on the host (step_ms), and its device time (device_ms) only where the
steps outlast the drawing beside them (hidden_ms):

    frame = drawing + steps * step_ms + max(0, steps * device_ms - hidden_ms)

The device time is known from frames whose steps outlasted the drawing (from the launch to their end, the host
waiting); steps done before the drawing tell only that they hid behind it, and the next frame tries one step more.
Until the device has been seen to outlast a drawing, the steps are taken to hide behind it.
"""
from __future__ import annotations

import time

# The frame rate the viewer aims at (ms a frame).
TARGET_FRAME_MS = 1000.0 / 60.0
# The simulation's least budget, as a share of the target frame or of the drawing time if that is longer.
MIN_SIM_SHARE = 0.25
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
        self.step_ms = 0.0       # a step's cost to the host, moving average (0: not timed yet)
        self.device_ms = 0.0     # a step's time on a device that runs it beside the drawing (0: not known)
        self.hidden_steps = 0    # steps of the last frame, if they hid behind its drawing
        self.draw_ms = 0.0       # a frame's drawing, moving average
        self.hidden_ms = 0.0     # the part of it beside the launched steps, moving average
        self.realtime = 0.0      # simulated s per wall s, moving average

    def budget_ms(self) -> float:
        """What the simulation may add to the next frame beyond its drawing (ms)."""
        return max(TARGET_FRAME_MS - self.draw_ms, MIN_SIM_SHARE * max(self.draw_ms, TARGET_FRAME_MS))

    def steps_that_fit(self) -> float:
        """How many steps a frame can run within the budget (fractional; the cost model of the module docstring)."""
        budget, host, device, hidden = self.budget_ms(), self.step_ms, self.device_ms, self.hidden_ms
        if device <= 0.0 or host * hidden >= budget * device:   # the device is done before the drawing
            return budget / host
        # steps that outlast the drawing; more if the last frame's hid behind it (the device time is an estimate)
        return max((budget + hidden) / (host + device), min(budget / host, self.hidden_steps + 1.0))

    def steps(self) -> int:
        """Steps for the next frame: 0 .. substeps. Until a step has been timed: one."""
        if self.step_ms <= 0.0:
            return 1
        self.credit = min(self.credit + self.steps_that_fit(), float(self.substeps))
        n = int(self.credit)
        self.credit -= n
        self.idle = self.idle + 1 if n == 0 else 0
        if self.idle >= MAX_IDLE_FRAMES:
            n, self.credit, self.idle = 1, 0.0, 0
        return n

    @staticmethod
    def _follow(old: float, new: float, bound: bool = False) -> float:
        # a faster step is believed at once (the first frames' include kernel compiles), a slower one gradually;
        # an upper bound only lowers the estimate
        if old == 0.0 or new < old:
            return new
        return old if bound else (1.0 - STEP_SMOOTHING) * old + STEP_SMOOTHING * new

    def stepped(self, steps: int, ms: float, device_ms: float = None, hidden: bool = False):
        """Record a frame's simulation: `steps` steps that cost the host `ms`; with device_ms, steps that ran on a
        device beside the drawing and were done device_ms after their launch, or (hidden) before the drawing was,
        device_ms then being only an upper bound."""
        if steps > 0:
            self.step_ms = self._follow(self.step_ms, max(ms, 1e-6) / steps)
            self.hidden_steps = steps if device_ms is not None and hidden else 0
            if device_ms is not None and (self.device_ms > 0.0 or not hidden):
                self.device_ms = self._follow(self.device_ms, max(device_ms, 1e-6) / steps, hidden)

    def drew(self, ms: float, hidden_ms: float = 0.0):
        """Record a frame's drawing time (ms), of which hidden_ms ran beside the frame's launched steps."""
        ms = max(ms, 0.0)
        hidden_ms = min(max(hidden_ms, 0.0), ms)
        first = self.draw_ms == 0.0
        self.draw_ms = ms if first else (1.0 - SMOOTHING) * self.draw_ms + SMOOTHING * ms
        self.hidden_ms = hidden_ms if first else (1.0 - SMOOTHING) * self.hidden_ms + SMOOTHING * hidden_ms

    def frame_done(self, sim_seconds: float, wall_seconds: float):
        """Record a frame: how much simulated time it advanced in how much wall time."""
        if wall_seconds > 0.0:
            r = sim_seconds / wall_seconds
            self.realtime = r if self.realtime == 0.0 else (1.0 - SMOOTHING) * self.realtime + SMOOTHING * r


# The host waited for a frame's steps when finishing them took longer than this (ms); else they were done before
# the drawing was, and their time is hidden by it.
WAITED_MS = 1.0


class FrameSteps:
    """A frame's steps, launched before its drawing and finished after it, timed for a FramePacer.

        steps = FrameSteps(sim, pacer, overlap)   # overlap: a launch returns before its steps are done (a GPU)
        steps.launch(n)                           # sim.launch_frame(n); n = 0 launches nothing
        ...                                       # draw the frame
        steps.finish()                            # sim.finish_frame() (raises what it raises); pacer.stepped(...)

    sim: anything with launch_frame(n) and finish_frame() (app.sim.Simulation)."""

    def __init__(self, sim, pacer: FramePacer, overlap: bool):
        self.sim, self.pacer, self.overlap = sim, pacer, bool(overlap)
        self.launched = None   # (steps, launch start, launch end) while steps run

    def launch(self, steps: int):
        if steps > 0:
            t0 = time.perf_counter()
            self.sim.launch_frame(steps)
            self.launched = (steps, t0, time.perf_counter())

    def finish(self) -> int:
        """Wait for the launched steps and check them; returns how many there were."""
        if self.launched is None:
            return 0
        steps, t0, t1 = self.launched
        self.launched = None
        t2 = time.perf_counter()
        self.sim.finish_frame()
        t3 = time.perf_counter()
        if self.overlap:
            # the host's cost: the launch; the device's time: from the launch to the end of the steps, exact when the
            # host waited for them, an upper bound when they were done before the drawing
            self.pacer.stepped(steps, (t1 - t0) * 1e3, device_ms=(t3 - t0) * 1e3, hidden=(t3 - t2) * 1e3 < WAITED_MS)
        else:
            self.pacer.stepped(steps, (t1 - t0 + t3 - t2) * 1e3)
        return steps
