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
