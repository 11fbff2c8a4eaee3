"""Faster kernel compilation, off unless asked for: memoise the repeated source work of Taichi's Python front end.

Every time a process first calls a kernel, Taichi rebuilds the kernel's intermediate code from its Python
source, also when the machine code then comes from its disk cache (the cache's key is a hash of that code).
For each inlined ``@ti.func`` call it reads the function's source again (``inspect.getsourcelines``, then
``textwrap.fill`` on every line), and for every expression and statement node it formats a source-position
message (file, line, the line wrapped by ``textwrap`` with a ``^^^`` marker under the node) that is kept for
error messages. The simulator's kernels inline the same functions many times (a Jacobi iteration five times a
launch, the contact emission once per pair class, the math helpers everywhere), so most of this work repeats
the same inputs: on a 2-core CPU the first step of ``scenes/default.yaml`` (its kernels in Taichi's disk cache)
spent 7.1 of 17.1 s formatting position messages (102,492 of them, 7,192 distinct) and 3.2 s re-reading sources;
with the caches, that step takes about half as long.

``install()`` wraps those functions with caches keyed on everything their results depend on, so the strings and
source lines Taichi gets are exactly the ones it would have computed: no behaviour changes, compiled code
included. The trade-off: it patches private functions of Taichi 1.7.4 (``taichi.lang.kernel_impl`` and
``taichi.lang.ast.ast_transformer_utils``) for the whole process, and its caches hold every source line and
position message seen (bounded at 200,000 messages, about 10,000 for the simulator). So it is off unless asked
for: ``SMOLVLA_FRONTEND_CACHE=1`` in the environment turns it on for the app's runs (app.runtime.init_taichi,
app.filter.cli.init_taichi), ``install(force=True)`` for a program of one's own; the test suite, whose time is
mostly kernel compilation, turns it on in tests/conftest.py. On another Taichi version it does nothing.
"""

import functools
import os
import textwrap

_installed = False
_originals = {}   # (object, attribute) -> what install() replaced

# Taichi version whose internals this patches; on any other, install() leaves Taichi alone.
TAICHI_VERSION = (1, 7, 4)


class _TextwrapWithCachedFill:
    """Stands in for the textwrap module inside taichi.lang.kernel_impl: fill() is cached (kernel_impl calls
    textwrap.fill(line, tabsize=4, width=9999) on every source line of every inlined function), the rest is
    textwrap's own."""

    def __getattr__(self, name):
        return getattr(textwrap, name)

    @staticmethod
    @functools.lru_cache(maxsize=1 << 16)
    def fill(text, **kwargs):
        # (lru_cache keys on the keyword arguments too; TextWrapper.fill's result depends on nothing else)
        return textwrap.fill(text, **kwargs)


def install(force: bool = False) -> bool:
    """Install the caches (once per process) if SMOLVLA_FRONTEND_CACHE=1 or force. Returns whether they are
    installed."""
    global _installed
    if _installed:
        return True
    if not force and os.environ.get("SMOLVLA_FRONTEND_CACHE", "0") != "1":
        return False
    import taichi as ti

    if tuple(ti.__version__) != TAICHI_VERSION:
        return False
    from taichi.lang import kernel_impl
    from taichi.lang.ast import ast_transformer_utils as atu

    ctx_class = getattr(atu, "ASTTransformerContext", None)
    if not (callable(getattr(kernel_impl, "getsourcelines", None)) and callable(getattr(kernel_impl, "getsourcefile", None))
            and getattr(kernel_impl, "textwrap", None) is textwrap and ctx_class is not None
            and callable(getattr(ctx_class, "get_pos_info", None))):
        return False

    # Sources by function object: a function's source is read once, as Taichi first read it (a new function
    # object, e.g. after a module reload, is read afresh).
    lines_of = {}
    file_of = {}
    read_lines = kernel_impl.getsourcelines
    read_file = kernel_impl.getsourcefile

    def getsourcelines(obj):
        got = lines_of.get(obj)
        if got is None:
            src, start = read_lines(obj)
            got = lines_of[obj] = (tuple(src), start)
        return list(got[0]), got[1]

    def getsourcefile(obj):
        got = file_of.get(obj)
        if got is None:
            got = file_of[obj] = read_file(obj)
        return got

    # Position messages by everything get_pos_info reads: the file, function name, line offset and indent of
    # the context, the node's type, span and (for compound statements) first body line, and the source lines
    # the span covers, so two nodes get one message only where Taichi would write the same one.
    messages = {}
    format_message = ctx_class.get_pos_info

    def get_pos_info(self, node):
        body = getattr(node, "body", None)
        first_body_line = body[0].lineno if isinstance(body, list) and body and hasattr(body[0], "lineno") else None
        key = (self.file, self.func.func.__name__, self.lineno_offset, self.indent, type(node).__name__,
               node.lineno, node.end_lineno, node.col_offset, node.end_col_offset, first_body_line,
               tuple(self.src[node.lineno - 1:node.end_lineno]))
        msg = messages.get(key)
        if msg is None:
            if len(messages) > 200_000:   # (a bound for very long sessions; the simulator needs ~10k)
                messages.clear()
            msg = messages[key] = format_message(self, node)
        return msg

    _originals.update({(kernel_impl, "getsourcelines"): read_lines, (kernel_impl, "getsourcefile"): read_file,
                       (kernel_impl, "textwrap"): textwrap, (ctx_class, "get_pos_info"): format_message})
    kernel_impl.getsourcelines = getsourcelines
    kernel_impl.getsourcefile = getsourcefile
    kernel_impl.textwrap = _TextwrapWithCachedFill()
    ctx_class.get_pos_info = get_pos_info
    _installed = True
    return True


def uninstall():
    """Put Taichi's own functions back (the tests compare the two)."""
    global _installed
    for (owner, name), original in _originals.items():
        setattr(owner, name, original)
    _originals.clear()
    _installed = False
