"""Reading YAML strictly, for every file and value a user hands the app (scenes, --set values, sweep files).

PyYAML's safe loader, with three changes: a mapping that repeats a key is an error (PyYAML keeps the last one
silently); numbers written as `2e-3` or `1e10` are floats, as in YAML 1.2 (YAML 1.1 wants a dot: `2.0e-3`, and
reads `2e-3` as a string); a document may use at most LIMITS["aliases"] aliases (`*name`), so that a small
file cannot stand for an exponentially large one (a "billion laughs"); and lists and mappings nest at most
NESTING_LIMIT deep.
"""
import os
import re
import stat

import yaml

from app.errors import UserError
from app.scene.schema import limit


# Nesting a scene or sweep file may use: scenes need about 5 levels (PyYAML would hit Python's recursion limit near 300).
NESTING_LIMIT = 64


class _StrictLoader(yaml.SafeLoader):
    """yaml.SafeLoader that rejects duplicate keys, reads 2e-3 as a float and bounds aliases."""

    def __init__(self, stream):
        super().__init__(stream)
        self._aliases = 0
        self._depth = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > limit("aliases"):
                event = self.peek_event()
                raise yaml.composer.ComposerError(
                    None, None, f"more than {limit('aliases')} aliases (*name) in one document", event.start_mark)
        # PyYAML composes nested lists and mappings recursively: deep nesting would end in a RecursionError.
        nests = int(self.check_event(yaml.SequenceStartEvent, yaml.MappingStartEvent))
        self._depth += nests
        try:
            if self._depth > NESTING_LIMIT:
                raise yaml.composer.ComposerError(
                    None, None, f"lists or mappings nested more than {NESTING_LIMIT} deep", self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= nests

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            # The mapping's own keys: those a merge (`<<: *base`) brings in may be overridden, as YAML intends.
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    duplicate = key in seen
                except TypeError:   # an unhashable key: PyYAML reports it below
                    continue
                if duplicate:
                    raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r} in a mapping",
                                                            key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep)


_StrictLoader.yaml_implicit_resolvers = {k: list(v) for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"))


def load(text: str):
    """The YAML document in text (StrictLoader). Raises yaml.YAMLError."""
    loader = _StrictLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def describe_error(e: "yaml.YAMLError") -> str:
    """'at line L, column C: problem' for a YAMLError."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "unknown line"
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    return f"at {where}: {problem}"


def read_text(path, what: str) -> str:
    """The text of a file a user named: a regular file (not a directory, FIFO or device, which could block or
    never end) of at most LIMITS["file_bytes"], UTF-8. Raises UserError naming the file."""
    path = str(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise UserError(f"{path}: {what} not found") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read the {what} ({e.strerror})") from None
    if stat.S_ISDIR(st.st_mode):
        raise UserError(f"{path}: is a directory, expected a {what}")
    if not stat.S_ISREG(st.st_mode):
        raise UserError(f"{path}: not a regular file (a pipe or a device?), expected a {what}")
    if st.st_size > limit("file_bytes"):
        raise UserError(f"{path}: {st.st_size:,} bytes, more than a {what} may have ({limit('file_bytes'):,}; "
                        f"SMOLVLA_LIMITS=file_bytes=N raises the limit)")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise UserError(f"{path}: cannot read the {what} ({e.strerror})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise UserError(f"{path}: line {line}: expected UTF-8 text, found byte 0x{data[e.start]:02x}") from None


def load_file(path, what: str):
    """The YAML document in file `path` (read_text, then load); None for an empty file. Raises UserError naming the
    file, with the line of a YAML error."""
    try:
        return load(read_text(path, what))
    except yaml.YAMLError as e:
        raise UserError(f"{path}: YAML error {describe_error(e)}") from None
