"""VLA against Taichi's `dynamic` SNode and a padded dense array, on the same workloads, in one run.

    python run.py bench vla [--arch auto|cpu|cuda] [--small | --full] [--out DIR] [--dists heavy,uniform16,uniform1024]
                            [--stores padded,dynamic,vla] [--kernel-times] [--rounds N]

Stores: the padded array, the dynamic SNode, the VLA as the README uses it (`VLA(n, dtype)`: it chooses its sizes
and runs, and settles into ordered runs once its lengths stay), the VLA tuned by VLA.tune (runs="bump") and tuned for
runs="ordered" (runs in list order: less metadata, growth re-lays the pool out).

Workloads (one thread per list for fill and read):
  fill          clear every list, then append its elements (the per-frame pattern: clear + refill)
  read          each thread sums its own list (thread-per-array read-all): a get() loop, and reduce_warp() (on
                CUDA the warp reads its long lists together; the padded array gets the same, and an unrolled
                reduce() of its own, so that every ratio is against its best read)
  flat read     VLA only: every live element, load-balanced: threads striding over the slots (flat_index /
                flat_value), and flat_reduce with 4 neighbouring slots a thread ("fold4")
  grow          a launch that makes some lists outgrow their runs: the commit's growth path
  reuse         one block per list, every thread reads the whole list (tier-3 shared staging vs global)
Length distributions: heavy (most 0-8, a few up to 1024; like contact counts), uniform 0-16,
uniform 0-1024. Every store's per-list sums are checked against numpy's, every run. --rounds N times every
store N times, taking turns, and reports medians (ratios taken within each round) and a round-by-round table.
"""
import argparse
import statistics
import time

import numpy as np
import taichi as ti

from vla import launch, shared, warp
from bench.common import device_name, init_taichi, kernel_ms, markdown_table, time_ms, write_results


# ----------------------------------------------------------------------------------------------------
# Baselines: same kernel-side interface as vla.VLA (append / length / get / clear)
# ----------------------------------------------------------------------------------------------------
@ti.data_oriented
class PaddedArrays:
    """Fixed maximum per list + atomic counter (what PhysX/Newton/Genesis do). Appends past the max
    are counted in ``overflow`` (never silently)."""

    def __init__(self, num_arrays, max_len, dtype=ti.i32, warp_head=0):
        if max_len % 8:
            raise ValueError(f"PaddedArrays max_len must be a multiple of 8 (reduce() reads 8 at a time), got {max_len}")
        self.num_arrays, self.max_len = num_arrays, max_len
        # reduce_warp(): row elements loaded together with the count, whatever the count (as VLA.reduce_warp
        # loads a list's inline part), instead of after it
        self.warp_head = warp_head
        self.data = ti.field(dtype, shape=(num_arrays, max_len))
        self.count = ti.field(ti.i32, shape=num_arrays)
        self.overflow = ti.field(ti.i32, shape=())
        self.element_bytes = 4

    @ti.func
    def append(self, i, x):
        slot = ti.atomic_add(self.count[i], 1)
        if slot < self.max_len:
            self.data[i, slot] = x
        else:
            ti.atomic_add(self.overflow[None], 1)
        return slot

    @ti.func
    def length(self, i):
        return ti.min(self.count[i], self.max_len)

    @ti.func
    def get(self, i, k):
        return self.data[i, k]

    @ti.func
    def clear(self, i):
        self.count[i] = 0

    @ti.func
    def reduce(self, i, f: ti.template(), init):
        # 32, then 16 loads in flight, and the last group's 8 loads issued at once (inside the row, used only below
        # n): the padded array's best form of a thread-per-row fold, so that no ratio against it flatters the VLA
        # (H200: 0.093 ms against 0.111 for the plain loop over 8-wide groups).
        n = self.length(i)
        acc = init
        for g in range(n >> 5):
            for j in ti.static(range(32)):
                acc = f(acc, self.data[i, g * 32 + j])
        done = n & ~31
        for g in range((n - done) >> 4):
            for j in ti.static(range(16)):
                acc = f(acc, self.data[i, done + g * 16 + j])
        done = n & ~15
        for g in range((n - done + 7) >> 3):   # (max_len is a multiple of 8: the group stays in the row)
            for j in ti.static(range(8)):
                x = self.data[i, done + g * 8 + j]
                if done + g * 8 + j < n:
                    acc = f(acc, x)
        return acc

    @ti.func
    def reduce_warp(self, i, f: ti.template(), init, combine: ti.template()):
        # The same warp-cooperative read as VLA.reduce_warp (vla.warp), the row being the segment: so that
        # the VLA's warp read is compared with the padded array's, not with a thread reading a row alone.
        n = self.length(i)
        acc = init
        for k in ti.static(range(self.warp_head)):
            x = self.data[i, k]
            if k < n:
                acc = f(acc, x)
        return combine(acc, warp.fold_segments(self, i, ti.max(n - self.warp_head, 0), f, init, combine))

    @ti.func
    def _segment_load(self, i, k):
        return self.data[i, self.warp_head + k]

    def reserved_bytes(self):
        return self.num_arrays * self.max_len * self.element_bytes + 4 * self.num_arrays


@ti.data_oriented
class DynamicArrays:
    """Taichi's `dynamic` SNode (chunked linked list per row). Appends past the max write nowhere;
    ti.append returns the old length, so we count those."""

    def __init__(self, num_arrays, max_len, chunk_size=16, dtype=ti.i32):
        self.num_arrays, self.max_len, self.chunk_size = num_arrays, max_len, chunk_size
        self.data = ti.field(dtype)
        self.block = ti.root.dense(ti.i, num_arrays).dynamic(ti.j, max_len, chunk_size=chunk_size)
        self.block.place(self.data)
        self.overflow = ti.field(ti.i32, shape=())

    @ti.func
    def append(self, i, x):
        slot = ti.append(self.block, i, x)
        if slot >= self.max_len:
            ti.atomic_add(self.overflow[None], 1)
        return slot

    @ti.func
    def length(self, i):
        return ti.length(self.block, i)

    @ti.func
    def get(self, i, k):
        return self.data[i, k]

    def clear_all(self):
        self.block.deactivate_all()

    def reserved_bytes_estimate(self, lengths):
        # Chunks actually touched (chunk_size elements each) + one pointer per chunk + per-row header.
        chunks = np.ceil(lengths / self.chunk_size).sum()
        return int(chunks * (self.chunk_size * 4 + 8) + self.num_arrays * 16)


# ----------------------------------------------------------------------------------------------------
# Kernels, generic over the store
# ----------------------------------------------------------------------------------------------------
@ti.kernel
def k_clear(s: ti.template()):
    for i in range(s.num_arrays):
        s.clear(i)


@ti.kernel
def k_fill(s: ti.template(), lens: ti.template()):
    for i in range(s.num_arrays):
        for k in range(lens[i]):
            s.append(i, (i * 7 + k) % 1000)


@ti.kernel
def k_grow(s: ti.template(), every: ti.i32, offset: ti.i32, extra: ti.i32):
    """Append `extra` more elements to the lists i with i % every == offset."""
    for i in range(s.num_arrays):
        if i % every == offset:
            for k in range(extra):
                s.append(i, k)


def grow_ms(v, refill, repeats):
    """(median wall ms, lists grown) of a launch whose appends make every `every`-th list outgrow its run
    (chunk_size + 1 elements each), as many lists as half the overflow area holds: the commit's growth path, as a
    simulation meets it. runs="bump" moves those lists to free chunks on the device; runs="ordered" re-lays the
    whole pool out. After a refill and trim, a first growth (not timed; it compiles, and leaves the pool the
    headroom that any growth leaves) then one timed growth per repeat, each of other lists."""
    n, extra = v.num_arrays, v.chunk_size + 1
    every = max(repeats + 1, -(-n * extra // (v.stats()["overflow_capacity"] // 2)))
    refill()
    v.trim()
    launch(k_grow, v, every, 0, extra)
    samples = []
    for r in range(1, repeats + 1):
        ti.sync()
        t0 = time.perf_counter()
        launch(k_grow, v, every, r, extra)
        ti.sync()
        samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples), -(-n // every)


@ti.kernel
def k_read(s: ti.template(), out: ti.template()):
    for i in range(s.num_arrays):
        acc = 0
        for k in range(s.length(i)):
            acc += s.get(i, k)
        out[i] = acc


@ti.func
def _add(a, b):
    return a + b


@ti.kernel
def k_read_reduce(s: ti.template(), out: ti.template()):
    for i in range(s.num_arrays):
        out[i] = s.reduce(i, _add, 0)


@ti.kernel
def k_read_reduce_warp(s: ti.template(), out: ti.template()):
    for i in range(s.num_arrays):
        out[i] = s.reduce_warp(i, _add, 0, _add)


FLAT_THREADS = 1 << 18


FLAT_UNROLL = 4


@ti.kernel
def k_read_flat(v: ti.template(), partial: ti.template(), threads: ti.template(), unroll: ti.template()):
    # Each thread strides over the storage slots (neighbouring threads, neighbouring slots) and keeps
    # its own sum: coalesced loads, one store per thread, no atomics. Four slots per iteration, each value
    # loaded unconditionally (every slot below flat_size() is readable) and masked by a select: four
    # independent load chains in flight per thread instead of one, which is what a latency-bound loop needs.
    # (threads, unroll: compile-time, FLAT_THREADS x FLAT_UNROLL)
    for g in range(threads):
        acc = ti.i64(0)
        e = g
        n = v.flat_size()
        while e + (unroll - 1) * threads < n:
            for u in ti.static(range(unroll)):
                i, k = v.flat_index(e + u * threads)
                x = v.flat_value(e + u * threads)
                acc += ti.select(i >= 0, ti.cast(x, ti.i64), ti.i64(0))
            e += unroll * threads
        while e < n:
            i, k = v.flat_index(e)
            if i >= 0:
                acc += v.flat_value(e)
            e += threads
        partial[g] = acc


@ti.func
def _add_element(acc, i, k, x):
    return acc + ti.cast(x, ti.i64)


# Slots a thread folds in the flat_reduce read, as the README shows it: on the H100, heavy tail, 4 slots read 50% of
# the copy bandwidth, 8 slots 32%, 16 37% and 32 19% (one run, side by side).
FLAT_FOLD = 4


@ti.kernel
def k_read_flat_fold(v: ti.template(), partial: ti.template(), seg: ti.template()):
    # Each thread folds `seg` neighbouring slots through VLA.flat_reduce: the seg loads issued first, the current
    # list kept in registers (runs="ordered": steps forward; a search only for the thread's first slot).
    n = v.flat_size()
    for g in range((n + seg - 1) // seg):
        ti.atomic_add(partial[g & (FLAT_THREADS - 1)], v.flat_reduce(g * seg, seg, _add_element, ti.i64(0)))


@ti.kernel
def k_copy(src: ti.template(), dst: ti.template()):
    for j in src:
        dst[j] = src[j]


REUSE_BLOCK = 64
REUSE_CAP = 256


@ti.kernel
def k_reuse_global(v: ti.template(), out: ti.template()):
    ti.loop_config(block_dim=REUSE_BLOCK)
    for t in range(v.num_arrays * REUSE_BLOCK):
        i = t // REUSE_BLOCK
        lane = t % REUSE_BLOCK
        acc = 0
        for k in range(v.length(i)):
            acc += v.get(i, k) * ((lane + k) % 3)
        out[t] = acc


@ti.kernel
def k_reuse_staged(v: ti.template(), out: ti.template()):
    ti.loop_config(block_dim=REUSE_BLOCK)
    for t in range(v.num_arrays * REUSE_BLOCK):
        i = t // REUSE_BLOCK
        lane = t % REUSE_BLOCK
        cache = shared.block_buffer(v, REUSE_CAP)
        n = shared.stage(v, cache, i, lane, REUSE_BLOCK)
        acc = 0
        for k in range(v.length(i)):
            acc += shared.get(v, cache, n, i, k) * ((lane + k) % 3)
        out[t] = acc


# ----------------------------------------------------------------------------------------------------
def make_lengths(dist, n, rng):
    if dist == "heavy":
        # 99.3% uniform 0-8, 0.7% log-uniform 9-1024: mean ~5.05 (2M lists -> ~10.1M elements)
        lens = rng.integers(0, 9, size=n)
        tail = rng.random(n) < 0.007
        lens[tail] = np.exp(rng.uniform(np.log(9), np.log(1024), size=int(tail.sum()))).astype(np.int64)
        lens[rng.integers(0, n)] = 1024  # the maximum is always present
        return lens, 1024
    if dist == "uniform16":
        return rng.integers(0, 17, size=n), 16
    if dist == "uniform1024":
        return rng.integers(0, 1025, size=n), 1024
    raise ValueError(f"unknown distribution {dist!r}")


DEFAULT_SIZES = {"heavy": 2_000_000, "uniform16": 1_250_000, "uniform1024": 20_000}
SMALL_SIZES = {"heavy": 40_000, "uniform16": 25_000, "uniform1024": 400}


STORE_KINDS = ("padded", "dynamic", "vla")


def bench_distribution(dist, n, rng, repeats, copy_bw, reuse=True, kernel_times=False, kinds=STORE_KINDS, rounds=1):
    """Rows of every store on one length distribution. copy_bw(): (wall GB/s, device GB/s or None) of the copy
    kernel, measured once per round."""
    from vla import VLA

    lens_np, max_len = make_lengths(dist, n, rng)
    lens_np = lens_np.astype(np.int32)
    live_bytes = int(lens_np.sum()) * 4
    lens = ti.field(ti.i32, shape=n)
    lens.from_numpy(lens_np)
    out = ti.field(ti.i32, shape=n)
    rows = []
    # every list's sum of k_fill's values, computed apart from any store
    owner = np.repeat(np.arange(n, dtype=np.int64), lens_np)
    k_of = np.arange(owner.size, dtype=np.int64) - np.repeat(np.cumsum(lens_np, dtype=np.int64) - lens_np, lens_np)
    reference = np.bincount(owner, weights=(owner * 7 + k_of) % 1000, minlength=n).astype(np.int64)

    def check(name):
        got = out.to_numpy()
        if not np.array_equal(got.astype(np.int64), reference):
            raise AssertionError(f"{dist}: {name} read sums that differ from k_fill's")

    tuned = VLA.tune(lens_np)
    # the same choice for the VLA whose runs are kept in list order (8 bytes a list, nothing per chunk)
    tuned_o = VLA.tune(lens_np, runs="ordered")
    stores = [
        ("padded", lambda: PaddedArrays(n, max_len)),
        ("padded (head 8)", lambda: PaddedArrays(n, max_len, warp_head=8)),   # differs in reduce_warp() only
        ("dynamic", lambda: DynamicArrays(n, max_len, chunk_size=16)),
        (DEFAULT_STORE, lambda: VLA(n, ti.i32, name="bench")),   # the constructor's defaults
        (f"vla tuned ({tuned['inline_capacity']},{tuned['chunk_size']})",
         lambda: VLA(n, ti.i32, inline_capacity=tuned["inline_capacity"], chunk_size=tuned["chunk_size"],
                     name="bench")),
        (f"vla tuned ordered ({tuned_o['inline_capacity']},{tuned_o['chunk_size']})",
         lambda: VLA(n, ti.i32, inline_capacity=tuned_o["inline_capacity"], chunk_size=tuned_o["chunk_size"],
                     runs="ordered", name="bench")),
    ]
    stores = [(name, make) for name, make in stores if name.split(" ")[0] in kinds]
    built = []
    first_fill = {}   # VLA store -> its stats() right after the first launch, from empty
    for name, make in stores:
        s = make()
        if isinstance(s, DynamicArrays):
            def refill(s=s):
                s.clear_all()
                k_fill(s, lens)
        elif isinstance(s, PaddedArrays):
            def refill(s=s):
                k_clear(s)
                k_fill(s, lens)
        else:
            launch(k_fill, s, lens)  # first fill learns the capacity (overflow -> grow -> re-run)
            first_fill[name] = s.stats()
            if name != DEFAULT_STORE:   # the tuned stores as an expert runs them; the default as the README teaches
                s.trim()

            def refill(s=s):
                s.clear_all()
                k_fill(s, lens)
                s.commit()
        built.append((name, s, refill))
    partial = ti.field(ti.i64, shape=FLAT_THREADS)
    # the host transfer's yardstick: a plain field holding exactly the live elements, copied with to_numpy()
    live_field = ti.field(ti.i32, shape=max(1, int(lens_np.sum())))

    def time_store(name, s, refill):
        """One round of the timed operations of one store, each checked against the reference."""
        m = {"fill_ms": time_ms(refill, repeats=repeats), "read_ms": time_ms(lambda: k_read(s, out), repeats=repeats)}
        if kernel_times:
            m["fill_kms"] = kernel_ms(refill, repeats=repeats)
            m["read_kms"] = kernel_ms(lambda: k_read(s, out), repeats=repeats)
        check(name)
        for op, kern in (("reduce", k_read_reduce), ("reduce_warp", k_read_reduce_warp)):
            if hasattr(s, op):
                m[f"{op}_ms"] = time_ms(lambda: kern(s, out), repeats=repeats)
                if kernel_times:
                    m[f"{op}_kms"] = kernel_ms(lambda: kern(s, out), repeats=repeats)
                check(f"{name} {op}")
        if name == DEFAULT_STORE:
            # to_csr against the same live bytes as one plain field's to_numpy(), interleaved pair by pair
            offsets, values = s.to_csr()
            if not np.array_equal(np.diff(offsets), lens_np):
                raise AssertionError(f"{dist}: {name} to_csr lengths differ")
            live_field.to_numpy()
            pairs = [(time_ms(live_field.to_numpy, repeats=1, warmup=0), time_ms(s.to_csr, repeats=1, warmup=0))
                     for _ in range(max(3, repeats // 4))]
            m["host_copy_ms"] = statistics.median(p[0] for p in pairs)
            m["to_csr_ms"] = statistics.median(p[1] for p in pairs)
            m["to_csr_pct_host_copy"] = 100 * m["host_copy_ms"] / m["to_csr_ms"]
            # the export without a copy (to_dlpack: packed into new device arrays, shared with the consumer)
            if ti.lang.impl.current_cfg().arch == ti.cpu:
                got = np.from_dlpack(s.to_dlpack()[1])
                if not np.array_equal(got, values):
                    raise AssertionError(f"{dist}: {name} to_dlpack differs from to_csr")
            m["to_dlpack_ms"] = time_ms(s.to_dlpack, repeats=max(3, repeats // 4))
        if isinstance(s, VLA):
            for op, flat in (("flat_read", lambda: k_read_flat(s, partial, FLAT_THREADS, FLAT_UNROLL)),
                             ("flat_fold", lambda: k_read_flat_fold(s, partial, FLAT_FOLD))):
                partial.fill(0)
                flat()
                if int(partial.to_numpy().sum()) != int(reference.sum()):
                    raise AssertionError(f"{dist}: {name} {op} sum differs")
                m[f"{op}_ms"] = time_ms(flat, repeats=repeats)
                if kernel_times:
                    m[f"{op}_kms"] = kernel_ms(flat, repeats=repeats)
        return m

    # Rounds: every store's timed operations once per round, each round starting one store later (as bench sim
    # --repeats), so that a drift of the device's speed over the run spreads over all of them; ratios are taken
    # within a round, and the row reports the median over rounds.
    per_round = []
    for rnd in range(rounds):
        copy = copy_bw()
        timed = {name: time_store(name, s, refill) for name, s, refill in built[rnd % len(built):] + built[:rnd % len(built)]}
        round_rows = [dict(timed[name], store=name, copy_GBps=copy[0], copy_kGBps=copy[1]) for name, _, _ in built]
        _add_ratios(round_rows, live_bytes)
        per_round.append({r["store"]: r for r in round_rows})
    rows = []
    for name, s, refill in built:
        row = {"dist": dist, "store": name, "arrays": n, "elements": int(lens_np.sum()), "live_MB": live_bytes / 1e6}
        row.update(_median_of_rounds([pr[name] for pr in per_round]))
        if rounds > 1:
            row["rounds"] = [pr[name] for pr in per_round]
        if isinstance(s, DynamicArrays):
            reserved = s.reserved_bytes_estimate(lens_np)
        elif isinstance(s, PaddedArrays):
            reserved = s.reserved_bytes()
        else:
            st = s.stats()
            reserved = st["reserved_bytes"]
            row["layout"] = f"({st['inline_capacity']},{st['chunk_size']})" + (" ordered" if st["runs"] == "ordered"
                                                                                else "")
            row["first_reserved_over_live"] = first_fill[name]["reserved_bytes"] / live_bytes
            row["first_device_over_live"] = first_fill[name]["device_bytes"] / live_bytes
            row["element_reserved_MB"] = st["element_reserved_bytes"] / 1e6
            # (all the device memory the VLA holds: reserved plus its kept work buffers, e.g. launch's snapshot)
            row["device_MB"] = st["device_bytes"] / 1e6
            row["device_over_live"] = st["device_bytes"] / live_bytes
            row["grow_events"] = st["grow_events"]
            row["grow_ms"], row["grow_lists"] = grow_ms(s, refill, max(3, repeats // 4))
            if reuse and dist != "uniform1024":
                rout = ti.field(ti.i32, shape=n * REUSE_BLOCK)
                row["reuse_global_ms"] = time_ms(lambda s=s: k_reuse_global(s, rout), repeats=repeats)
                ref_reuse = rout.to_numpy()
                row["reuse_staged_ms"] = time_ms(lambda s=s: k_reuse_staged(s, rout), repeats=repeats)
                if not np.array_equal(rout.to_numpy(), ref_reuse):
                    raise AssertionError(f"{dist}: staged reads differ from global reads")
        if not isinstance(s, VLA) and int(s.overflow[None]) > 0:   # (the baselines count what they drop)
            row["overflow"] = int(s.overflow[None])
        row["reserved_MB"] = reserved / 1e6
        row["reserved_over_live"] = reserved / live_bytes
        rows.append(row)
    if any(r["store"] == "padded" for r in rows):
        pad = next(r for r in rows if r["store"] == "padded")
        for r in rows:
            r["mem_vs_padded"] = r["reserved_MB"] / pad["reserved_MB"]
    return rows, tuned


# The store a user gets from VLA(n, dtype): filled by launch from empty, then cleared and refilled with commit() each
# frame (never trimmed), read with the get() loop and the flat_index loop. The user-path table reports it against
# issue targets: (key, what, target or None, format).
DEFAULT_STORE = "vla default"
USER_PATH = [
    ("fill_x_padded", "fill cycle x padded", 1.5, "{:.2f}"),
    ("read_x_padded", "get loop x padded", 1.5, "{:.2f}"),
    ("fill_x_dynamic", "fill cycle x dynamic", 50.0, "{:.1f}"),
    ("read_x_dynamic", "get loop x dynamic", None, "{:.1f}"),
    ("flat_fold_pct_copy_bw", f"flat iteration (flat_reduce, {FLAT_FOLD} slots a thread) % copy BW", 40.0, "{:.0f}"),
    # memory: all the device memory the VLA holds (stats()["device_bytes"]: elements, metadata, the overflow area,
    # growth headroom and the work buffers it keeps, launch's snapshot among them)
    ("first_device_over_live", "memory/live after the first launch", -2.0, "{:.2f}"),
    ("device_over_live", "memory/live after the refills", -1.5, "{:.2f}"),
    ("to_csr_pct_host_copy", "to_csr % of a plain field's to_numpy", 80.0, "{:.0f}"),
    ("to_dlpack_pct_copy_bw", "to_dlpack (device export) % copy BW", None, "{:.0f}"),
    ("layout", "layout after the refills (inline, chunk, runs)", None, "{}"),
]


# figures that are wall time (a host transfer) or no time at all, also in a --kernel-times table
WALL_ONLY = ("to_csr_pct_host_copy", "to_dlpack_pct_copy_bw", "layout")


def user_path_table(rows, kernel_times):
    """Markdown: the default store's figures on each distribution, with the targets (a negative target is an upper
    bound) and whether each holds. Device-time ratios with --kernel-times."""
    out = ["| dist | " + " | ".join(what for _, what, _, _ in USER_PATH) + " |",
           "|---|" + "---:|" * len(USER_PATH)]
    for r in rows:
        if r["store"] != DEFAULT_STORE:
            continue
        cells = []
        for key, _, target, fmt in USER_PATH:
            if kernel_times and key not in WALL_ONLY:   # the device-time figure; "-" where it was not measured
                key = key.replace("_x_", "_kx_").replace("_pct", "_kpct")
            v = r.get(key)
            if v is None:
                cells.append("-")
                continue
            cell = fmt.format(v)
            if target is not None and r["dist"] == "heavy":
                held = v <= -target if target < 0 else v >= target
                cell += f" ({'met' if held else 'short'}: {'<=' if target < 0 else '>='} {abs(target):g})"
            cells.append(cell)
        out.append(f"| {r['dist']} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def _add_ratios(rows, live_bytes):
    """Ratios of one round's rows against each baseline that ran (padded, dynamic), and the flat reads' bandwidth
    as GB/s and as a share of the copy kernel's (measured in the same round)."""
    base = {r["store"]: r for r in rows}
    for r in rows:
        for b in ("padded", "dynamic"):
            if b not in base:
                continue
            for op in ("fill", "read"):
                r[f"{op}_x_{b}"] = base[b][f"{op}_ms"] / r[f"{op}_ms"]
                if f"{op}_kms" in r:
                    r[f"{op}_kx_{b}"] = base[b][f"{op}_kms"] / r[f"{op}_kms"]
        for op in ("flat_read", "flat_fold"):
            if f"{op}_ms" in r:
                r[f"{op}_GBps"] = (live_bytes / 1e9) / (r[f"{op}_ms"] / 1e3)
                r[f"{op}_pct_copy_bw"] = 100 * r[f"{op}_GBps"] / r["copy_GBps"]
                if f"{op}_kms" in r and r["copy_kGBps"]:
                    r[f"{op}_kGBps"] = (live_bytes / 1e9) / (r[f"{op}_kms"] / 1e3)
                    r[f"{op}_kpct_copy_bw"] = 100 * r[f"{op}_kGBps"] / r["copy_kGBps"]
        if "to_dlpack_ms" in r:
            r["to_dlpack_pct_copy_bw"] = 100 * (live_bytes / 1e9) / (r["to_dlpack_ms"] / 1e3) / r["copy_GBps"]
        if "padded" not in base:
            continue
        if "reduce_warp_ms" in r:
            # against the padded array's own warp read, and against its best read of any form
            pads = [q for q in rows if q["store"].startswith("padded")]
            p = base["padded"]
            r["reduce_warp_x_padded"] = p["reduce_warp_ms"] / r["reduce_warp_ms"]
            r["reduce_warp_x_padded_best"] = (min(min(q["read_ms"], q["reduce_ms"], q["reduce_warp_ms"]) for q in pads)
                                              / r["reduce_warp_ms"])
            r["read_x_padded_best"] = (min(min(q["read_ms"], q["reduce_ms"], q["reduce_warp_ms"]) for q in pads)
                                       / r["read_ms"])
            if "reduce_warp_kms" in r:
                best = min(min(q["read_kms"], q["reduce_kms"], q["reduce_warp_kms"]) for q in pads)
                r["reduce_warp_kx_padded"] = p["reduce_warp_kms"] / r["reduce_warp_kms"]
                r["reduce_warp_kx_padded_best"] = best / r["reduce_warp_kms"]
                r["read_kx_padded_best"] = best / r["read_kms"]


def _median_of_rounds(rounds):
    """One row from the rounds' rows of a store: the median of every number (of every entry of a dict of numbers)
    over the rounds, the lower middle one for an even count."""
    def med(xs):
        xs = sorted(x for x in xs if x is not None)
        return xs[(len(xs) - 1) // 2] if xs else None

    out = {}
    for key in rounds[0]:
        vals = [r.get(key) for r in rounds]
        if isinstance(vals[0], dict):
            out[key] = {c: med([v.get(c) for v in vals]) for c in vals[0]}
        elif isinstance(vals[0], (int, float)) and not isinstance(vals[0], bool):
            out[key] = med(vals)
        elif key != "store":
            out[key] = vals[0]
    if len(rounds) > 1:
        out["rounds_n"] = len(rounds)
    return out


def copy_bandwidth(repeats, small, kernel_times=False):
    """A function that measures a plain copy kernel: (wall-clock GB/s, device-time GB/s or None), counting bytes
    read + written (its buffers allocated once, for a measurement every round)."""
    n = (1 << 22) if small else (1 << 28)  # 16 MB or 1 GiB per buffer
    a = ti.field(ti.f32, shape=n)
    b = ti.field(ti.f32, shape=n)
    gb = 2 * n * 4 / 1e9

    def measure():
        ms = time_ms(lambda: k_copy(a, b), repeats=repeats)
        kms = kernel_ms(lambda: k_copy(a, b), repeats=repeats) if kernel_times else None
        return gb / (ms / 1e3), (gb / (kms / 1e3) if kms else None)
    return measure


# (key, format, header) of the figures the round-by-round table lists: device times, or wall times without
# --kernel-times
ROUND_KEYS = [("fill_kx_padded", "{:.2f}", "fill x padded"), ("read_kx_padded_best", "{:.2f}", "get loop x padded's best"),
              ("reduce_warp_kx_padded_best", "{:.2f}", "reduce_warp x padded's best read"),
              ("flat_read_kpct_copy_bw", "{:.0f}", "flat (strided) % copy BW"),
              ("flat_fold_kpct_copy_bw", "{:.0f}", f"flat fold{FLAT_FOLD} % copy BW"), ("copy_kGBps", "{:.0f}", "copy GB/s")]
ROUND_KEYS_WALL = [("fill_x_padded", "{:.2f}", "fill x padded"), ("read_x_padded_best", "{:.2f}", "get loop x padded's best"),
                   ("reduce_warp_x_padded_best", "{:.2f}", "reduce_warp x padded's best read"),
                   ("flat_read_pct_copy_bw", "{:.0f}", "flat (strided) % copy BW"),
                   ("flat_fold_pct_copy_bw", "{:.0f}", f"flat fold{FLAT_FOLD} % copy BW"), ("copy_GBps", "{:.0f}", "copy GB/s")]


COLUMNS = [
    ("dist", "dist", "{}"), ("store", "store", "{}"), ("arrays", "lists", "{:,}"), ("elements", "elements", "{:,}"),
    ("fill_ms", "clear+refill ms", "{:.3f}"), ("fill_kms", "clear+refill device ms", "{:.3f}"),
    ("fill_kx_padded", "fill x padded (device)", "{:.2f}"), ("fill_kx_dynamic", "fill x dynamic (device)", "{:.1f}"),
    ("read_ms", "read-all (get loop) ms", "{:.3f}"), ("read_kms", "read-all device ms", "{:.3f}"),
    ("read_kx_padded", "read x padded (device)", "{:.2f}"),
    ("read_kx_padded_best", "get loop x padded's best read (device)", "{:.2f}"),
    ("flat_read_kGBps", "flat GB/s (device)", "{:.0f}"), ("flat_read_kpct_copy_bw", "flat % copy BW (device)", "{:.0f}"),
    ("flat_fold_kGBps", f"fold{FLAT_FOLD} GB/s (device)", "{:.0f}"),
    ("flat_fold_kpct_copy_bw", f"fold{FLAT_FOLD} % copy BW (device)", "{:.0f}"),
    ("reduce_warp_kms", "reduce_warp device ms", "{:.4f}"),
    ("reduce_warp_kx_padded", "reduce_warp x padded's reduce_warp (device)", "{:.2f}"),
    ("reduce_warp_kx_padded_best", "reduce_warp x padded's best read (device)", "{:.2f}"),
    ("reduce_warp_ms", "reduce_warp ms", "{:.3f}"), ("reduce_warp_x_padded", "reduce_warp x padded's", "{:.2f}"),
    ("reduce_warp_x_padded_best", "reduce_warp x padded's best", "{:.2f}"),
    ("flat_read_ms", "flat read ms", "{:.3f}"), ("flat_read_GBps", "flat GB/s", "{:.0f}"),
    ("flat_read_pct_copy_bw", "flat % copy BW", "{:.0f}"),
    ("flat_fold_ms", f"fold{FLAT_FOLD} ms", "{:.3f}"), ("flat_fold_pct_copy_bw", f"fold{FLAT_FOLD} % copy BW", "{:.0f}"),
    ("grow_lists", "lists grown", "{:,}"), ("grow_ms", "growth ms", "{:.2f}"),
    ("fill_x_padded", "fill x padded", "{:.2f}"), ("read_x_padded", "read x padded", "{:.2f}"),
    ("fill_x_dynamic", "fill x dynamic", "{:.1f}"), ("read_x_dynamic", "read x dynamic", "{:.1f}"),
    ("live_MB", "live MB", "{:.1f}"), ("reserved_MB", "reserved MB", "{:.1f}"),
    ("first_reserved_over_live", "reserved/live after the first launch", "{:.2f}"),
    ("reserved_over_live", "reserved/live", "{:.2f}"),
    ("device_over_live", "with scratch/live", "{:.2f}"),
    ("reuse_global_ms", "reuse global ms", "{:.3f}"), ("reuse_staged_ms", "reuse staged ms", "{:.3f}"),
]


def main(argv=None):
    p = argparse.ArgumentParser(prog="run.py bench vla", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--small", action="store_true", help="CPU-sized lists (default on the CPU)")
    p.add_argument("--stores", default=",".join(STORE_KINDS),
                   help="comma list of the stores to run (ratios need padded and dynamic)")
    p.add_argument("--full", action="store_true",
                   help="the GPU's sizes on the CPU too (slow; the byte counts do not depend on the device)")
    p.add_argument("--out", default=None, help="directory for vla_bench.json / vla_bench.md")
    p.add_argument("--dists", default="heavy,uniform16,uniform1024")
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=1,
                   help="time every store this many times, taking turns (each round starts one store later), and "
                        "report the median of each figure and of each ratio over the rounds")
    p.add_argument("--kernel-times", action="store_true",
                   help="also report device time per operation (Taichi's kernel profiler), not only wall time")
    args = p.parse_args(argv)
    from app.errors import UserError

    dists = [d for d in args.dists.split(",") if d]
    if not dists:
        raise UserError(f"--dists: expected some of {', '.join(DEFAULT_SIZES)}, got {args.dists!r}")
    for d in dists:
        if d not in DEFAULT_SIZES:
            raise UserError(f"--dists: unknown distribution {d!r}; expected some of {', '.join(DEFAULT_SIZES)}")
    if args.rounds < 1:
        raise UserError(f"--rounds: expected a positive int, got {args.rounds}")
    kinds = [k for k in args.stores.split(",") if k]
    for k in kinds:
        if k not in STORE_KINDS:
            raise UserError(f"--stores: unknown store {k!r}; expected some of {', '.join(STORE_KINDS)}")
    arch = init_taichi(args.arch, kernel_profiler=args.kernel_times)
    small = args.small or (arch == "cpu" and not args.full)
    sizes = SMALL_SIZES if small else DEFAULT_SIZES
    repeats = args.repeats or (5 if small else 20)
    rng = np.random.default_rng(args.seed)
    copy_bw = copy_bandwidth(repeats, small, args.kernel_times)
    rows, tuned = [], {}
    for d in dists:
        r, t = bench_distribution(d, sizes[d], rng, repeats, copy_bw, kernel_times=args.kernel_times, kinds=kinds,
                                  rounds=args.rounds)
        rows += r
        tuned[d] = t
    bw, kbw = rows[0]["copy_GBps"], rows[0]["copy_kGBps"]
    dev = device_name(arch)
    header = (f"VLA benchmark on {dev} (arch {arch}); plain copy kernel: {bw:.0f} GB/s wall"
              + (f", {kbw:.0f} GB/s device time" if kbw else "") + f"; repeats {repeats} (wall: median)"
              + (f"; {args.rounds} rounds, every figure the median over them" if args.rounds > 1 else ""))
    md = header + "\n\n" + markdown_table(rows, COLUMNS)
    if any(r["store"] == DEFAULT_STORE for r in rows) and any(r["store"] == "padded" for r in rows):
        md += ("\n\nUser path: `VLA(n, ti.i32)` filled by `launch` from empty, then `clear_all()` + fill + `commit()` "
               "each cycle, never trimmed; targets on the heavy tail" + (" (device time)" if args.kernel_times else "")
               + ":\n\n" + user_path_table(rows, args.kernel_times))
    if args.rounds > 1:
        keys = ROUND_KEYS if args.kernel_times else ROUND_KEYS_WALL
        md += (f"\n\nRound by round ({'device' if args.kernel_times else 'wall'} time), in the order measured:\n\n"
               + markdown_table([dict(r, **{key: " / ".join(fmt.format(q[key]) for q in r["rounds"]
                                                            if q.get(key) is not None) for key, fmt, _ in keys})
                                 for r in rows],
                                [("dist", "dist", "{}"), ("store", "store", "{}")] + [(k, h, "{}") for k, _, h in keys]))
    write_results(args.out, "vla_bench", {"device": dev, "arch": arch, "copy_GBps": bw, "copy_device_GBps": kbw,
                                          "rows": rows,
                                          "tuned": tuned}, md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
