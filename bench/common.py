"""Shared helpers for the benchmarks: timing on the device, tables, output files."""
import json
import os
import platform
import statistics
import subprocess
import time

import taichi as ti


def init_taichi(arch: str):
    """ti.init for 'cpu' | 'cuda' | 'auto'; returns the arch name taken."""
    if arch == "auto":
        try:
            ti.init(arch=ti.cuda, offline_cache=True)
            return "cuda"
        except Exception:  # no CUDA device or driver
            ti.init(arch=ti.cpu)
            return "cpu"
    ti.init(arch=getattr(ti, arch), offline_cache=True)
    return arch


def device_name(arch: str) -> str:
    if arch == "cuda":
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20)
            return out.stdout.strip().splitlines()[0]
        except Exception:
            return "CUDA GPU"
    return f"{platform.processor() or platform.machine()} CPU ({os.cpu_count()} cores)"


def time_ms(fn, repeats=10, warmup=2):
    """Median wall time of fn() in ms, synchronising the device around each call."""
    for _ in range(warmup):
        fn()
    ti.sync()
    samples = []
    for _ in range(repeats):
        ti.sync()
        t0 = time.perf_counter()
        fn()
        ti.sync()
        samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def markdown_table(rows, columns):
    """rows: list of dicts; columns: list of (key, header, format)."""
    out = ["| " + " | ".join(h for _, h, _ in columns) + " |",
           "|" + "|".join("---" for _ in columns) + "|"]
    for r in rows:
        cells = []
        for key, _, fmt in columns:
            val = r.get(key, "")
            cells.append(fmt.format(val) if val not in ("", None) else "")
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def write_results(out_dir, name, payload, table_md):
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
            json.dump(payload, f, indent=2)
        with open(os.path.join(out_dir, f"{name}.md"), "w") as f:
            f.write(table_md + "\n")
    print(table_md)
