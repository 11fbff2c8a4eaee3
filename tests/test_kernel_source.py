"""Kernel code that the CPU runs but CUDA does not: checked in the sources, since CI has no GPU.

A bool made in a kernel's serial part (before its parallel loops) and read inside one of those loops is passed
between the kernel's offloaded tasks through Taichi's global temporaries, and on CUDA (Taichi 1.7.4) the loop's
load of it stops the program with CUDA_ERROR_MISALIGNED_ADDRESS; the CPU backend runs it. Reproduced on an H100
with a 6-line kernel (`active = m > 0` before `for i in range(n): if a[i] > -1.0 and active: ...`), the same kernel
comparing `m > 0` inside the loop runs. Read from the sources, nothing is imported or run."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _is_kernel(fn: ast.FunctionDef) -> bool:
    for d in fn.decorator_list:
        name = d.attr if isinstance(d, ast.Attribute) else getattr(d, "id", None)
        if name == "kernel":
            return True
    return False


def _makes_bool(value: ast.expr) -> bool:
    return isinstance(value, (ast.Compare, ast.BoolOp)) or (isinstance(value, ast.UnaryOp)
                                                            and isinstance(value.op, ast.Not))


def bools_crossing_into_loops(source: str) -> list:
    """(kernel, name, line) for each name a kernel's top level assigns a comparison, `and`/`or` or `not` to and
    then reads in the body of one of its top-level for loops (a loop's range is evaluated in the serial part:
    not a crossing)."""
    found = []
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, ast.FunctionDef) or not _is_kernel(fn):
            continue
        bools = {}

        def scan(stmts):
            for st in stmts:
                if isinstance(st, ast.Assign) and _makes_bool(st.value):
                    for t in st.targets:
                        if isinstance(t, ast.Name):
                            bools[t.id] = st.lineno
                elif isinstance(st, ast.For) and "static" in ast.unparse(st.iter):
                    scan(st.body)   # unrolled at compile time: its loops are top-level loops
                elif isinstance(st, ast.For):
                    read = {n.id for body_st in st.body for n in ast.walk(body_st) if isinstance(n, ast.Name)}
                    found.extend((fn.name, b, line) for b, line in bools.items() if b in read)

        scan(fn.body)
    return found


def test_the_check_finds_a_bool_read_in_a_loop():
    src = ("@ti.kernel\ndef k():\n    m = c[None]\n    active = m > 0\n    for i in range(n):\n"
           "        if active:\n            a[i] = 1\n")
    assert bools_crossing_into_loops(src) == [("k", "active", 4)]
    inside = src.replace("if active:", "if m > 0:")
    assert bools_crossing_into_loops(inside) == []
    in_range = ("@ti.kernel\ndef k():\n    run = c[None] > 0\n    for i in range(ti.select(run, n, 0)):\n"
                "        a[i] = 1\n")
    assert bools_crossing_into_loops(in_range) == []
    unrolled = src.replace("    for i in range(n):\n", "    for p in ti.static(range(2)):\n      for i in range(n):\n")
    assert bools_crossing_into_loops(unrolled) == [("k", "active", 4)]


def test_no_kernel_reads_a_bool_from_its_serial_part_in_a_parallel_loop():
    found = []
    for pkg in ("vla", "app", "bench"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            found += [f"{path.relative_to(ROOT)}: {k}: {b} (line {line})"
                      for k, b, line in bools_crossing_into_loops(path.read_text())]
    assert found == [], "compare inside the loop instead (CUDA faults on these):\n" + "\n".join(found)
