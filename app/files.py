"""Writing result files so that a reader never sees half of one: a temporary file in the same directory, flushed
to disk, then renamed over the target (atomic on POSIX). A full disk or a missing permission is a UserError that
names the file."""
import os
from pathlib import Path

from app.errors import UserError


def write_atomic(path, write) -> None:
    """Call write(file object, binary) for `path`'s content, then put it in place at once."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as e:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise UserError(f"{path}: cannot write ({e.strerror or e})") from None


def write_text_atomic(path, text: str) -> None:
    write_atomic(path, lambda fh: fh.write(text.encode("utf-8")))
