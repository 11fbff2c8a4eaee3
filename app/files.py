"""Writing result files so that a reader never sees half of one: a temporary file in the same directory, flushed
to disk, then renamed over the target (atomic on POSIX). A full disk or a missing permission is a UserError that
names the file."""
import os
from pathlib import Path

from app.errors import UserError


def write_atomic(path, write) -> None:
    """Call write(file object, binary) for `path`'s content, then put it in place at once."""
    def save(tmp):
        with open(tmp, "wb") as fh:
            write(fh)

    write_named_atomic(path, save)


def write_text_atomic(path, text: str) -> None:
    write_atomic(path, lambda fh: fh.write(text.encode("utf-8")))


def temporary_name(path) -> Path:
    """A name beside `path` for writing it first, hidden, with the same suffix (writers that choose the format by
    the name's suffix: GGUI's save_image, imageio's video and image writers)."""
    path = Path(path)
    return path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")


def write_named_atomic(path, save) -> None:
    """Call save(temporary path) to write `path`'s content under temporary_name(path) (save may open the file
    itself, as image libraries do), flush it to disk, then put it in place at once. The temporary file is removed
    whatever happens; an OSError becomes a UserError naming `path`."""
    path = Path(path)
    tmp = temporary_name(path)
    try:
        save(str(tmp))
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as e:
        raise UserError(f"{path}: cannot write ({e.strerror or e})") from None
    finally:
        try:
            tmp.unlink()
        except OSError:   # (renamed into place, or never made)
            pass


def read_json_object(path, max_bytes: int = 64 * 2**20) -> dict:
    """The JSON object in the regular file `path` (results this program wrote, which a user or a crash may have
    changed). Raises OSError, or ValueError saying what is wrong: not a regular file, larger than max_bytes, not
    JSON, nested too deep for Python's parser, or not an object."""
    import json
    import stat

    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise ValueError("not a regular file")
    if st.st_size > max_bytes:
        raise ValueError(f"{st.st_size} bytes, more than {max_bytes}")
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except RecursionError:
        raise ValueError("nested too deep") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"not UTF-8 text ({e.reason})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"a JSON {type(doc).__name__}, expected an object")
    return doc
