"""`python run.py bench WHAT ...`: dispatch to the benchmark modules."""
import importlib

from app.errors import UserError

# The product's benchmarks (docs/benchmarks.md)
BENCHES = {
    "vla": "bench.vla_bench",
    "sim": "bench.sim_bench",
    "filter": "bench.filter_bench",
    "viewer": "bench.viewer_bench",
    "batch": "bench.batch_bench",
}
# Tools for working on the simulator and viewer (bench/dev/): where a step's time goes, lane use, reproducibility,
# compile time, solver convergence on stacks, what ending an offscreen frame costs, the contact storage's memory
# through a pile's landing
DEV_BENCHES = {
    "profile": "bench.dev.profile_bench",
    "lanes": "bench.dev.lanes_bench",
    "repro": "bench.dev.repro_bench",
    "compile": "bench.dev.compile_bench",
    "stacks": "bench.dev.stacks_bench",
    "frame-end": "bench.dev.frame_end_bench",
    "contact-memory": "bench.dev.contact_memory_bench",
}


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python run.py bench {" + ",".join(BENCHES) + "} [options]   (each takes --help)\n"
              "       python run.py bench {" + ",".join(DEV_BENCHES) + "} [options]   (tools in bench/dev/)")
        return 0 if argv else 2
    what = argv[0]
    modules = {**BENCHES, **DEV_BENCHES}
    if what not in modules:
        raise UserError(f"bench: unknown benchmark {what!r}; expected one of {', '.join(modules)}")
    try:
        module = importlib.import_module(modules[what])
    except ModuleNotFoundError as e:
        raise UserError(f"bench {what}: not available ({e})") from None
    return module.main(argv[1:])
