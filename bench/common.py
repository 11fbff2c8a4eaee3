"""Shared helpers for the benchmarks: timing on the device, tables, output files."""
import json
import os
import platform
import statistics
import subprocess
import time

import taichi as ti

from app.files import write_text_atomic


def init_taichi(arch: str, kernel_profiler: bool = False, device_memory_GB=None):
    """ti.init for 'cpu' | 'cuda' | 'auto'; returns the arch name taken. kernel_profiler: also time every
    kernel on the device (CUDA events), for kernel_ms(). device_memory_GB: Taichi's sparse-data pool on CUDA
    (None: Taichi's default; see app.sim.simulation.taichi_pool_gb)."""
    from app.runtime import init_taichi as init_app_taichi   # as the simulation runs (no fast math)

    common = {"offline_cache": True, "kernel_profiler": kernel_profiler}
    extra = {} if device_memory_GB is None else {"device_memory_GB": float(device_memory_GB)}
    return init_app_taichi(arch, cuda_options={**common, **extra}, cpu_options=common)


CONTACT_STORAGES = ("vla", "padded", "dynamic")


def parse_storages(text: str) -> list:
    """--storages "vla,padded:64" -> [(spec, scene overrides)], e.g. ("padded:64", ("sim.contacts=padded",
    "sim.padded_capacity=64")). A spec may add scene overrides after "+", to compare variants of one storage side
    by side: "vla+sim.large_body_factor=0". Raises UserError naming the bad entry."""
    from app.errors import UserError

    out = []
    for spec in [s.strip() for s in text.split(",") if s.strip()]:
        spec_storage, *extra = spec.split("+")
        for e in extra:
            if "=" not in e or not e.partition("=")[0].strip():
                raise UserError(f"--storages: {spec!r}: expected STORAGE+key.path=value, got {e!r} after '+'")
        kind, _, cap = spec_storage.partition(":")
        if kind not in CONTACT_STORAGES or (cap and not (cap.isdigit() and int(cap) > 0)):
            raise UserError(f"--storages: unknown storage {spec!r}; valid: vla | padded | dynamic, padded and "
                            f"dynamic optionally with a per-body maximum as in padded:64")
        out.append((spec, (f"sim.contacts={kind}",) + ((f"sim.padded_capacity={cap}",) if cap else ())
                    + tuple(e.strip() for e in extra)))
    return out


def kernel_ms(fn, repeats=10, warmup=1):
    """Device time of the kernels fn() launches, in ms per call (mean over repeats): what the device spends,
    without the host's launch and synchronisation overhead. Needs init_taichi(kernel_profiler=True)."""
    for _ in range(warmup):
        fn()
    ti.sync()
    ti.profiler.clear_kernel_profiler_info()
    for _ in range(repeats):
        fn()
    ti.sync()
    return ti.profiler.get_kernel_profiler_total_time() * 1e3 / repeats


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
        write_text_atomic(os.path.join(out_dir, f"{name}.json"), json.dumps(payload, indent=2))
        write_text_atomic(os.path.join(out_dir, f"{name}.md"), table_md + "\n")
    print(table_md)
