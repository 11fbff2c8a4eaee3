"""User-facing errors: raised for bad input, printed by run.py as one line, exit code 2, no traceback."""


class UserError(Exception):
    """Bad input from the user (file, key, argument). The message must name what was wrong and what was
    expected; run.py prints it without a traceback and exits with ``exit_code``."""

    exit_code = 2


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the program is (terminate_as_exception), so that it ends like Ctrl-C: results written
    so far are kept or marked incomplete, and run.py exits with 143."""


def terminate_as_exception():
    """Turn SIGTERM into Terminated in the main thread (where Python runs signal handlers), unless a handler of the
    program's own is installed already."""
    import signal

    if not hasattr(signal, "SIGTERM") or signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None):
        return

    def handler(signum, frame):
        raise Terminated()

    try:
        signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        pass


# The environment variable by which a batch hands its worker the driver's pid (app.batch.worker).
PARENT_PID_ENV = "SMOLVLA_PARENT_PID"


def die_with_parent():
    """In a worker started with PARENT_PID_ENV: SIGTERM when the thread that started it ends, so that a batch driver
    killed outright (SIGKILL) leaves no run going on alone (Linux prctl PR_SET_PDEATHSIG; the driver's starting
    thread waits for the worker, so it ends only after it or with the driver). Set here, in the worker, rather than
    in a preexec_fn, which is unsafe while the driver runs threads. A driver already gone: SIGTERM at once."""
    import os
    import signal
    import sys

    parent = os.environ.pop(PARENT_PID_ENV, "")
    if not parent or not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)   # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if str(os.getppid()) != parent:   # (it died before the prctl: nobody will send the signal)
        os.kill(os.getpid(), signal.SIGTERM)
