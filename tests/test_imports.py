"""The project's import structure: no cycles, and imports flow one way (the simulation and the VLA library never
import the products built on them). Read from the sources (every import statement, those inside functions
included), nothing is imported or run."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("vla", "app", "bench")


def _module_of(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict:
    """{module name: path} of every Python file of the packages, and run.py."""
    mods = {"run": ROOT / "run.py"}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            mods[_module_of(path)] = path
    return mods


def import_graph(mods: dict) -> dict:
    """{module: set of project modules it imports}. `from a.b import c` imports a.b.c when that is a module of its
    own, else a.b; relative imports are resolved against the importing module's package. A module's own packages
    (whose __init__ Python runs first) are not edges: only what the source names."""
    graph = {}
    for name, path in mods.items():
        is_pkg = path.name == "__init__.py"
        package = name if is_pkg else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[:len(anchor) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for t in targets:
                # the longest project module that t names or lies in
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != name:
                    edges.add(t)
        graph[name] = edges
    return graph


def cycles(graph: dict) -> list:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _under(module: str, prefixes) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def test_the_graph_reads_the_project():
    mods = project_modules()
    graph = import_graph(mods)
    # a few edges any change to the walk must keep seeing (an import at the top, one inside a function, a
    # relative one, one of a package's __init__)
    assert "app.sim.narrowphase" in graph["app.sim.simulation"]
    assert "app.viewer.interactive" in graph["app.cli"]          # imported inside main()
    assert "vla.growth" in graph["vla.array"]                    # from .growth import Growth
    assert "app.sim.simulation" in graph["app.sim"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles():
    found = cycles(import_graph(project_modules()))
    assert found == [], f"import cycles: {found}"


def test_imports_flow_one_way():
    graph = import_graph(project_modules())
    products = ("app.viewer", "app.batch", "app.filter", "app.cli", "app.headless", "bench")
    rules = [
        (("vla",), ("app", "bench"), "the VLA library knows nothing of the app"),
        (("app.sim",), products, "the simulation never imports the viewer, batch, filter or the entry points"),
        (("app.scene",), ("app.sim", "app.runtime") + products, "scenes are data: no simulation, no Taichi start-up"),
        (("app",), ("bench",), "the app never imports the benchmarks"),
        (("app.viewer", "app.batch", "app.filter"), ("app.cli",), "products do not import the command line"),
        (("app.batch",), ("app.viewer", "app.filter"), "batch runs do not need the viewer or the filter"),
    ]
    bad = []
    for low, forbidden, why in rules:
        for mod, edges in graph.items():
            if _under(mod, low):
                bad += [f"{mod} -> {e} ({why})" for e in sorted(edges) if _under(e, forbidden)]
    assert bad == []


def test_the_simulation_and_the_library_never_load_ggui():
    """No module of app.sim, app.scene or vla names taichi.ui (the viewer's GGUI) at all."""
    for name, path in project_modules().items():
        if _under(name, ("app.sim", "app.scene", "vla")):
            assert "ti.ui" not in path.read_text() and "taichi.ui" not in path.read_text(), name
