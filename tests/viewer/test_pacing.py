"""app.viewer.pacing.FramePacer: steps per frame from step and draw times (pure Python, no window)."""
import pytest

from app.viewer.pacing import LEAST_FRAME_MS, MAX_IDLE_FRAMES, MIN_SIM_SHARE, TARGET_FRAME_MS, FramePacer


def _run(pacer, step_ms, draw_ms, frames):
    pacer.step_ms, pacer.draw_ms = step_ms, draw_ms
    return [pacer.steps() for _ in range(frames)]


@pytest.mark.parametrize("step_ms,draw_ms,budget", [
    (11.0, 5.0, TARGET_FRAME_MS - 5.0),                 # drawing leaves most of the frame
    (2.4, 15.0, MIN_SIM_SHARE * TARGET_FRAME_MS),       # the least share of a 60 frames/s frame
    (15.0, 22.0, MIN_SIM_SHARE * 22.0),                 # a quarter of the drawing: the frame stays within 1/32 s
    (15.0, 26.0, LEAST_FRAME_MS - 26.0),                # held to 1/32 s: a quarter of the drawing would be more
    (15.0, 27.4, MIN_SIM_SHARE * TARGET_FRAME_MS),      # 31.6 frames/s (a 1M-body pile on a GPU)
    (3.0, 40.0, MIN_SIM_SHARE * TARGET_FRAME_MS),       # 30 frames/s out of reach: the least share
    (0.5, 1.0, TARGET_FRAME_MS - 1.0), (200.0, 2.0, TARGET_FRAME_MS - 2.0)])
def test_steps_follow_the_budget(step_ms, draw_ms, budget):
    substeps = 8
    steps = _run(FramePacer(substeps), step_ms, draw_ms, 600)
    assert all(0 <= n <= substeps for n in steps)
    expected = max(min(budget / step_ms, substeps), 1.0 / MAX_IDLE_FRAMES)
    assert abs(sum(steps) / len(steps) - expected) <= 0.02 * expected + 2.0 / len(steps)
    # never more than MAX_IDLE_FRAMES - 1 frames in a row without a step
    run = longest = 0
    for n in steps:
        run = run + 1 if n == 0 else 0
        longest = max(longest, run)
    assert longest < MAX_IDLE_FRAMES


@pytest.mark.parametrize("draw_ms", [2.0, 12.0, 17.0, 22.0, 27.4, 30.0])
@pytest.mark.parametrize("step_ms", [0.3, 1.4, 6.0, 15.0, 40.0, 90.0])
def test_the_simulation_never_pulls_the_frame_rate_below_30_where_drawing_allows_it(step_ms, draw_ms):
    steps = _run(FramePacer(8), step_ms, draw_ms, 1200)
    sim_ms = step_ms * sum(steps) / len(steps)
    least_steps = 1.0 / MAX_IDLE_FRAMES   # however slow the step, one every MAX_IDLE_FRAMES frames
    least_ms = MIN_SIM_SHARE * TARGET_FRAME_MS
    if draw_ms + max(least_ms, step_ms * least_steps) <= 1000.0 / 30:
        assert draw_ms + sim_ms <= 1000.0 / 30
    # and the simulation keeps at least its least share (all its substeps if they take less)
    assert sim_ms >= 0.97 * min(least_ms, 8 * step_ms) or sum(steps) / len(steps) >= 0.97 * least_steps


def test_a_fast_scene_runs_every_substep_and_the_first_frame_one_step():
    pacer = FramePacer(8)
    assert pacer.steps() == 1                  # nothing timed yet
    assert _run(pacer, 0.1, 2.0, 10) == [8] * 10


def test_step_time_follows_a_faster_step_at_once_and_a_slower_one_gradually():
    pacer = FramePacer(8)
    pacer.stepped(1, 5000.0)                   # a first frame that compiled kernels
    pacer.stepped(4, 8.0)
    assert pacer.step_ms == 2.0
    pacer.stepped(2, 8.0)                      # 4 ms a step: it moves that way, not all the way
    assert 2.0 < pacer.step_ms < 4.0
    pacer.stepped(0, 123.0)                    # a frame without steps changes nothing
    assert 2.0 < pacer.step_ms < 4.0


def test_realtime_factor_is_sim_time_over_wall_time():
    pacer = FramePacer(8)
    for _ in range(200):
        pacer.frame_done(0.004, 0.016)
    assert pacer.realtime == pytest.approx(0.25)
