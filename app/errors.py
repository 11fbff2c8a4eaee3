"""User-facing errors: raised for bad input, printed by run.py as one line, exit code 2, no traceback."""


class UserError(Exception):
    """Bad input from the user (file, key, argument). The message must name what was wrong and what was
    expected; run.py prints it without a traceback and exits with ``exit_code``."""

    exit_code = 2
