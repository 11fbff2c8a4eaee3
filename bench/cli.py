"""`python run.py bench WHAT ...`: dispatch to the benchmark modules."""
import importlib

from app.errors import UserError

BENCHES = {
    "vla": "bench.vla_bench",
    "sim": "bench.sim_bench",
    "filter": "bench.filter_bench",
    "viewer": "bench.viewer_bench",
    "batch": "bench.batch_bench",
    "profile": "bench.profile_bench",
    "lanes": "bench.lanes_bench",
    "repro": "bench.repro_bench",
    "compile": "bench.compile_bench",
}


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python run.py bench {" + ",".join(BENCHES) + "} [options]   (each takes --help)")
        return 0 if argv else 2
    what = argv[0]
    if what not in BENCHES:
        raise UserError(f"bench: unknown benchmark {what!r}; expected one of {', '.join(BENCHES)}")
    try:
        module = importlib.import_module(BENCHES[what])
    except ModuleNotFoundError as e:
        raise UserError(f"bench {what}: not available ({e})") from None
    return module.main(argv[1:])
