"""Does the sparse-data pool that run.py gives a `contacts: dynamic` scene hold every list filled to its maximum?

    python -m bench.dev.dynamic_pool [--lists 2097152] [--max 32] [--arch cuda] [--pool GB]

Starts Taichi with the pool app.sim.contacts.dynamic_pool_gb computes for --lists lists of --max contact records
(--pool overrides it: 1 is Taichi's default, under which pile_1m's lists should not fit), makes the
DynamicLists, fills every list to its maximum in one kernel, and checks every length and a checksum of the
records on the host. The defaults are pile_1m's (two generations of 2^20 lists, padded_capacity 32): the
worst case a 1M-body dynamic scene can reach. On the CPU the pool is host memory and the check is about the storage only.
"""
import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the repository


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.dev.dynamic_pool", description=__doc__.splitlines()[0])
    p.add_argument("--lists", type=int, default=2 * 2**20)
    p.add_argument("--max", type=int, default=32)
    p.add_argument("--arch", choices=("cpu", "cuda"), default="cuda")
    p.add_argument("--pool", type=float, default=None, help="device_memory_GB (default: dynamic_pool_gb)")
    args = p.parse_args(argv)
    import taichi as ti

    from app.sim.contacts import CONTACT_RECORD_BYTES, ContactRecord, DynamicLists, dynamic_pool_gb

    pool = dynamic_pool_gb(args.lists, args.max) if args.pool is None else args.pool
    extra = {"device_memory_GB": pool} if args.arch == "cuda" else {}
    ti.init(arch=getattr(ti, args.arch), log_level=ti.ERROR, **extra)
    lists = DynamicLists(args.lists, ContactRecord, args.max)
    checksum = ti.field(ti.i64, ())

    @ti.kernel
    def fill(lists: ti.template(), m: ti.i32):
        for i, k in ti.ndrange(lists.num_arrays, m):
            lists.append(i, ContactRecord(depth=ti.cast(k, ti.f32), other=i, feature=k))

    @ti.kernel
    def check(lists: ti.template()):
        for i in range(lists.num_arrays):
            for k in range(lists.length(i)):
                r = lists.get(i, k)
                ti.atomic_add(checksum[None], ti.cast(r.other - i, ti.i64) + r.feature + ti.cast(r.depth, ti.i64))

    t0 = time.perf_counter()
    fill(lists, args.max)
    check(lists)
    ti.sync()
    lengths = lists.lengths()
    m = args.max
    want = args.lists * (m * (m - 1))  # sum over lists of sum_k (feature k + depth k)
    ok = bool((lengths == m).all()) and int(checksum[None]) == want and lists.overflowed() == 0
    full_gb = args.lists * m * CONTACT_RECORD_BYTES / 2**30
    print(f"{args.arch}: {args.lists} lists x {m} records ({full_gb:.2f} GiB of records) in a {pool:.1f} GB pool: "
          f"{'all present' if ok else 'WRONG'} (lengths {int(lengths.min())}..{int(lengths.max())}, checksum "
          f"{int(checksum[None])} of {want}, dropped {lists.overflowed()}), {time.perf_counter() - t0:.1f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    sys.exit(main())
