"""app.frontend_cache: Taichi's front end gets from the caches exactly what it would have computed itself.

One Taichi runtime for the module. The caches are installed for every test module (tests/conftest.py), so
these tests compare them with Taichi's own functions, which install() keeps (frontend_cache._originals).
"""
import pytest

ti = pytest.importorskip("taichi")

from taichi.lang import kernel_impl  # noqa: E402
from taichi.lang.ast import ast_transformer_utils as atu  # noqa: E402

from app import frontend_cache  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def taichi_runtime():
    ti.init(arch=ti.cpu, offline_cache=False)
    yield
    ti.reset()


@pytest.fixture()
def cache(monkeypatch):
    if not frontend_cache.install(force=True):   # (these tests are of the caches)
        pytest.skip("app.frontend_cache does not patch this Taichi version")
    yield
    frontend_cache.install(force=True)


@ti.func
def _spring(x, k):
    # a multi-line expression, a compound statement and a static loop: position messages of several shapes
    f = -k * x + \
        0.5 * x * x
    if f > 1.0:
        f = 1.0
    for d in ti.static(range(2)):
        f += ti.cast(d, ti.f32) * x
    return f


@ti.kernel
def _k_springs(out: ti.types.ndarray(dtype=ti.f32, ndim=1)):
    for i in range(out.shape[0]):
        x = ti.cast(i, ti.f32) * 0.25
        # the same function inlined three times: its nodes' messages repeat
        out[i] = _spring(x, 1.0) + _spring(x, 2.0) * _spring(-x, 0.5)


def _reference(i):
    def spring(x, k):
        f = -k * x + 0.5 * x * x
        f = min(f, 1.0)
        return f + 1.0 * x

    x = i * 0.25
    return spring(x, 1.0) + spring(x, 2.0) * spring(-x, 0.5)


def test_every_position_message_and_source_is_taichis_own(cache):
    """While a kernel compiles with the caches, each cached position message and source read is checked
    against Taichi's own function on the same input: all equal, and the repeated inlining was served from
    the caches (fewer computations than calls). The kernel's results match a Python reference."""
    originals = frontend_cache._originals
    own_message = originals[(atu.ASTTransformerContext, "get_pos_info")]
    own_lines = originals[(kernel_impl, "getsourcelines")]
    cached_message = atu.ASTTransformerContext.get_pos_info
    cached_lines = kernel_impl.getsourcelines
    seen = {"messages": 0, "lines": 0, "computed": 0, "bad": []}

    def counting_own(self, node):
        seen["computed"] += 1
        return own_message(self, node)

    def checked_message(self, node):
        seen["messages"] += 1
        got = cached_message(self, node)
        if got != own_message(self, node):
            seen["bad"].append((node.lineno, got))
        return got

    def checked_lines(obj):
        seen["lines"] += 1
        got = cached_lines(obj)
        if got != own_lines(obj):
            seen["bad"].append(("source", obj))
        return got

    # (the cached function calls the original through its closure; count those calls too)
    frontend_cache.uninstall()
    atu.ASTTransformerContext.get_pos_info = counting_own
    assert frontend_cache.install(force=True)
    cached_message = atu.ASTTransformerContext.get_pos_info
    cached_lines = kernel_impl.getsourcelines
    atu.ASTTransformerContext.get_pos_info = checked_message
    kernel_impl.getsourcelines = checked_lines
    try:
        out = ti.ndarray(ti.f32, shape=16)
        _k_springs(out)
    finally:
        frontend_cache.uninstall()
        atu.ASTTransformerContext.get_pos_info = own_message
    assert seen["bad"] == []
    assert seen["lines"] >= 4   # the kernel and three inlined calls
    assert 0 < seen["computed"] < seen["messages"]
    got = out.to_numpy()
    for i in range(16):
        assert got[i] == pytest.approx(_reference(i), rel=1e-6, abs=1e-6)


@ti.kernel
def _k_broken(out: ti.types.ndarray(dtype=ti.f32, ndim=1)):
    for i in range(out.shape[0]):
        out[i] = _spring(ti.cast(i, ti.f32), 1.0) + \
            undefined_name_here   # noqa: F821  (the compile error under test)


def _compile_error():
    out = ti.ndarray(ti.f32, shape=4)
    with pytest.raises(Exception) as err:
        _k_broken(out)
    return str(err.value)


def test_a_compile_error_reads_the_same_with_and_without_the_caches(cache):
    """A kernel that does not compile gives the same message, file, line and ^^^ marker included."""
    with_caches = _compile_error()
    frontend_cache.uninstall()
    without = _compile_error()
    assert with_caches == without
    assert "undefined_name_here" in with_caches and "^" in with_caches
    assert "test_frontend_cache.py" in with_caches


def test_off_unless_asked_for(monkeypatch):
    """Without SMOLVLA_FRONTEND_CACHE=1 (or force) install() leaves Taichi's own functions in place; with it, it
    installs the caches."""
    assert frontend_cache.install(force=True)
    own = frontend_cache._originals[(atu.ASTTransformerContext, "get_pos_info")]
    frontend_cache.uninstall()
    for value in (None, "0", "yes"):
        if value is None:
            monkeypatch.delenv("SMOLVLA_FRONTEND_CACHE", raising=False)
        else:
            monkeypatch.setenv("SMOLVLA_FRONTEND_CACHE", value)
        assert frontend_cache.install() is False
        assert atu.ASTTransformerContext.get_pos_info is own
    monkeypatch.setenv("SMOLVLA_FRONTEND_CACHE", "1")
    assert frontend_cache.install() is True
    assert atu.ASTTransformerContext.get_pos_info is not own
