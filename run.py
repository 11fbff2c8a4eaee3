#!/usr/bin/env python3
"""SmolVLA's single entry point.

    python run.py [SCENE]                          interactive viewer (headless preview when there is no display)
    python run.py [SCENE] --headless --frames N    headless run, results in --out DIR
    python run.py batch SCENE... --frames N --out DIR     batches and sweeps
    python run.py report DIR                       plots and a table for a batch
    python run.py replay OUT_DIR                   watch a recorded trajectory
    python run.py filter IMAGE ...                 variable-radius image filter on VLAs
    python run.py bench vla|sim|filter|viewer|batch ...   benchmarks

This file only dispatches; the work lives in app/ and bench/.
"""
import os
import sys

SUBCOMMANDS = {
    "batch": ("app.batch.cli", "main"),
    "report": ("app.batch.report", "main"),
    "replay": ("app.viewer.replay", "replay_main"),
    "filter": ("app.filter.cli", "main"),
    "bench": ("bench.cli", "main"),
}
USAGE = """usage: python run.py [SCENE] [--headless --frames N --out DIR ...]   simulate a scene (default scenes/default.yaml)
       python run.py batch SCENE... --frames N --out DIR                 many headless runs: seeds x parameter values
       python run.py report DIR                                          plots and a table for a batch
       python run.py replay OUT_DIR                                      watch or render a recorded run
       python run.py filter IMAGE --radius-map MAP --out OUT             variable-radius image filter
       python run.py bench vla|sim|filter|viewer|batch ...               benchmarks
Each takes --help; `python run.py SCENE --help` lists the simulation's options."""


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    from app.errors import Terminated, UserError

    if argv and argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    if argv and not argv[0].startswith("-") and argv[0] not in SUBCOMMANDS and not argv[0].endswith((".yaml", ".yml")):
        from app.scene.loading import find_scene

        if not os.path.exists(find_scene(argv[0])):
            print(f"error: {argv[0]!r} is neither a subcommand ({', '.join(SUBCOMMANDS)}) nor a scene file (.yaml)",
                  file=sys.stderr)
            return 2
    if argv and argv[0] in SUBCOMMANDS:
        module_name, func_name = SUBCOMMANDS[argv[0]]
        argv = argv[1:]
    else:
        module_name, func_name = "app.cli", "main"
    if "-h" in argv or "--help" in argv:   # the usage alone: no Taichi banner from modules that import Taichi
        os.environ.setdefault("ENABLE_TAICHI_HEADER_PRINT", "False")
    try:
        import importlib

        func = getattr(importlib.import_module(module_name), func_name)
        return int(func(argv) or 0)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except Terminated:
        print("terminated (SIGTERM)", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print("interrupted (SIGINT)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    from app.errors import die_with_parent, terminate_as_exception

    terminate_as_exception()   # SIGTERM ends a run as Ctrl-C does, with its outputs written or marked (exit 143)
    die_with_parent()          # a batch's worker: ends with its driver
    code = main()
    if code in (130, 143):
        # Ended by a signal, its outputs written: its one line stays the last. Taichi's exit handlers are skipped: they
        # write its kernel cache, and print a warning after that line when another process holds the cache's lock.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
