"""User-facing errors: raised for bad input, printed by run.py as one line, exit code 2, no traceback."""


class UserError(Exception):
    """Bad input from the user (file, key, argument). The message must name what was wrong and what was
    expected; run.py prints it without a traceback and exits with ``exit_code``."""

    exit_code = 2


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the program is (terminate_as_exception), so that it ends like Ctrl-C: results written
    so far are kept or marked incomplete, and run.py exits with 143."""


# Signals whose exception the handler raised, not yet taken by raise_if_signalled. Python ignores an exception
# raised in a __del__ ("Exception ignored in ..."): a Ctrl-C that lands while Taichi frees an object would be
# lost, and a long run would go on. The loops that run for long check here too.
_SIGNALLED = []


def terminate_as_exception():
    """Turn SIGTERM into Terminated, and Ctrl-C into KeyboardInterrupt, in the main thread (where Python runs
    signal handlers), each also remembered for raise_if_signalled; unless a handler of the program's own is
    installed already."""
    import signal
    import sys

    def handler(signum, frame):
        _SIGNALLED.append(signum)
        raise Terminated() if signum == getattr(signal, "SIGTERM", None) else KeyboardInterrupt()

    previous_hook = sys.unraisablehook

    def unraisable(info):
        # the handler's raise landed in a __del__ (Taichi freeing an ndarray): Python would print it with a
        # traceback and go on; it is remembered in _SIGNALLED and raised again between pieces of work, so say nothing
        if isinstance(info.exc_value, KeyboardInterrupt) and _SIGNALLED:
            return
        previous_hook(info)

    sys.unraisablehook = unraisable
    for name, default in (("SIGTERM", signal.SIG_DFL), ("SIGINT", signal.default_int_handler)):
        sig = getattr(signal, name, None)
        if sig is None or signal.getsignal(sig) not in (default, signal.SIG_DFL, None):
            continue
        try:
            signal.signal(sig, handler)
        except ValueError:  # not the main thread
            pass


def raise_if_signalled():
    """Raise the exception of a signal whose handler's raise was swallowed (see _SIGNALLED); call between the
    pieces of work of a long loop."""
    import signal

    if _SIGNALLED:
        signum = _SIGNALLED.pop()
        _SIGNALLED.clear()
        raise Terminated() if signum == getattr(signal, "SIGTERM", None) else KeyboardInterrupt()


def signal_taken():
    """The exception of the last signal reached its handler's catcher: forget it."""
    _SIGNALLED.clear()


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
