"""app.viewer.pacing.FramePacer: steps per frame from step and draw times (pure Python, no window)."""
import pytest

from app.viewer.pacing import MAX_IDLE_FRAMES, MIN_SIM_SHARE, TARGET_FRAME_MS, FramePacer


def _run(pacer, step_ms, draw_ms, frames):
    pacer.step_ms, pacer.draw_ms = step_ms, draw_ms
    return [pacer.steps() for _ in range(frames)]


@pytest.mark.parametrize("step_ms,draw_ms", [(11.0, 5.0), (2.4, 10.0), (30.0, 300.0), (0.5, 1.0), (200.0, 2.0)])
def test_steps_follow_the_budget(step_ms, draw_ms):
    substeps = 8
    steps = _run(FramePacer(substeps), step_ms, draw_ms, 600)
    assert all(0 <= n <= substeps for n in steps)
    budget = max(TARGET_FRAME_MS - draw_ms, MIN_SIM_SHARE * max(draw_ms, TARGET_FRAME_MS))
    expected = max(min(budget / step_ms, substeps), 1.0 / MAX_IDLE_FRAMES)
    assert abs(sum(steps) / len(steps) - expected) <= 0.02 * expected + 2.0 / len(steps)
    # never more than MAX_IDLE_FRAMES - 1 frames in a row without a step
    run = longest = 0
    for n in steps:
        run = run + 1 if n == 0 else 0
        longest = max(longest, run)
    assert longest < MAX_IDLE_FRAMES


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


def _overlapped_frames(pacer, host_ms, device_ms, update_ms, hidden_ms, frames):
    """A model GPU frame: the host launches n steps (host_ms each) and the device runs them (device_ms each) from
    the first launch; the host draws (update_ms before the launch, hidden_ms after it) and waits for the device if
    it is not done. Fed to the pacer as FrameSteps and the viewer feed it; returns (steps, frame ms) per frame."""
    out = []
    for _ in range(frames):
        n = pacer.steps()
        launch = n * host_ms
        device_end = max(launch, n * device_ms)
        wait = max(0.0, device_end - (launch + hidden_ms)) if n else 0.0
        if n:
            pacer.stepped(n, launch, device_ms=launch + hidden_ms + wait, hidden=wait < 1.0)
        pacer.drew(update_ms + hidden_ms, hidden_ms if n else 0.0)
        out.append((n, update_ms + launch + hidden_ms + wait))
    return out


@pytest.mark.parametrize("host_ms,device_ms,update_ms,hidden_ms", [
    (0.1, 1.5, 0.9, 15.0),    # default.yaml on an H100: every substep hides behind the drawing
    (1.0, 6.8, 2.5, 21.0),    # pile_1m: the device outlasts the drawing
    (1.0, 1.5, 1.5, 20.0),    # pile_100k: launch-bound host
    (0.2, 3.0, 0.5, 2.0),     # a fast drawing
])
def test_overlapped_steps_settle_at_the_frame_budget(host_ms, device_ms, update_ms, hidden_ms):
    substeps = 8
    pacer = FramePacer(substeps)
    frames = _overlapped_frames(pacer, host_ms, device_ms, update_ms, hidden_ms, 400)[100:]
    steps = [n for n, _ in frames]
    mean_frame = sum(ms for _, ms in frames) / len(frames)
    draw = update_ms + hidden_ms
    allowed = draw + max(TARGET_FRAME_MS - draw, MIN_SIM_SHARE * max(draw, TARGET_FRAME_MS))
    assert mean_frame <= allowed * 1.02
    mean_steps = sum(steps) / len(steps)
    # the most steps a frame can run within the allowance, by the same model
    best = max(n for n in range(substeps + 1)
               if update_ms + n * host_ms + hidden_ms + max(0.0, max(n * host_ms, n * device_ms) - n * host_ms
                                                               - hidden_ms) <= allowed)
    assert mean_steps >= 0.8 * best
    assert max(steps) - min(steps) <= 1      # steady: no swing between few and many steps


def test_steps_that_hide_behind_the_drawing_all_run():
    pacer = FramePacer(8)
    frames = _overlapped_frames(pacer, 0.1, 1.0, 1.0, 15.0, 50)
    assert [n for n, _ in frames[3:]] == [8] * 47
