"""Warp-cooperative folds: the 32 lanes of a CUDA warp read together the long segments some of them own.

In a thread-per-list loop a warp lasts as long as its longest list. With a heavy-tailed length distribution
(most lists a few elements, one in a hundred or so hundreds of elements) a warp that holds one long list
idles 31 lanes while one thread reads it, a memory round trip per group of loads. ``fold_segments`` has the
warp read each long segment together instead: lane l takes elements l, l + 32, l + 64, ... (coalesced when
the segment is contiguous, as a VLA's pool part and a padded row are), the 32 partial folds are combined
by shuffles, and the lane that owns the segment gets the total. Segments of at most ``SHORT`` elements are
read by their own lane, all ``SHORT`` loads issued at once.

The owner's result no longer comes from folding its elements in order: the combination must be associative
and commutative (a sum of integers, a min, a max; a float sum is then correct to rounding but not
bit-identical to the in-order fold) and ``init`` must be its identity (0 for a sum).

Used only where every lane of the warp calls it together: ``fold_segments`` checks that with the warp's
active mask and falls back to the lane's own serial fold when the warp is not whole (the last, partial warp
of a loop, or a call under a branch some lanes did not take), so the result is the same either way. Off
CUDA it is always the serial fold. A lane is found as its thread's linear index mod 32, so the loop's block
dimension must be a multiple of 32 (Taichi's default, 128, is). Elements are read through
``src._segment_load(base, k)``, a ``@ti.func`` of the caller's container.
"""
import warnings

import taichi as ti
from taichi.lang import impl
from taichi.lang.expr import Expr
from taichi.lang.util import taichi_scope

# _linear_thread_index() is a plain Python function run while the kernel compiles (it wraps Taichi's own
# expression); Taichi warns about every such call.
warnings.filterwarnings("ignore", message=r".*non-taichi function .*_linear_thread_index")

# Segments this long or shorter are read by their owner alone (all loads issued at once, predicated).
SHORT = 8
# Loads each lane keeps in flight while the warp reads a long segment (32 * UNROLL elements per round trip).
# H200, the VLA bench's heavy tail: 4 -> 0.0403-0.0414 ms,
# 8 -> 0.0408-0.0413, 16 -> 0.0387-0.0396; SHORT 4 or 16 instead of 8: no better for the VLA, 2.5x worse for
# the padded array at 4 (its short rows then go through the warp one by one).
UNROLL = 16

# Masks of the lowest-set-bit search below, as signed 32-bit constants (Taichi's i32).
_M16, _M8, _M4, _M2, _M1 = (m - (1 << 32) for m in (0xFFFF0000, 0xFF00FF00, 0xF0F0F0F0, 0xCCCCCCCC, 0xAAAAAAAA))


def _on_cuda() -> bool:
    return impl.current_cfg().arch == ti.cuda


def _type_of(x):
    return x.ptr.get_rvalue_type()


@taichi_scope
def _linear_thread_index():
    """block index * block dim + thread index (CUDA), as an expression a kernel can compute with."""
    return Expr(ti.simt.block.global_thread_idx())


@ti.func
def _lane_of_bit(b):
    """Index (0-31) of the one bit set in the i32 b."""
    return (ti.select((b & _M16) != 0, 16, 0) + ti.select((b & _M8) != 0, 8, 0) + ti.select((b & _M4) != 0, 4, 0)
            + ti.select((b & _M2) != 0, 2, 0) + ti.select((b & _M1) != 0, 1, 0))


@ti.func
def _shfl(mask, x, lane):
    """x of lane `lane` (every lane of `mask` calls this together); x an i32 or f32."""
    ti.static_assert(_type_of(x) == ti.i32 or _type_of(x) == ti.f32,
                     "vla.warp: the accumulator of a warp fold must be an i32 or f32 scalar")
    r = x
    if ti.static(_type_of(x) == ti.f32):
        r = ti.simt.warp.shfl_sync_f32(mask, x, lane)
    else:
        r = ti.simt.warp.shfl_sync_i32(mask, x, lane)
    return r


@ti.func
def fold_serial(src: ti.template(), base, count, f: ti.template(), init):
    """acc = f(acc, x) over src._segment_load(base, k), k = 0 .. count - 1, by this thread alone."""
    acc = init
    for k in range(count):
        acc = f(acc, src._segment_load(base, k))
    return acc


@ti.func
def fold_segments(src: ti.template(), base, count, f: ti.template(), init, combine: ti.template()):
    """This lane's fold of its segment (src._segment_load(base, k), k < count), read with the warp's help
    when the segment is longer than SHORT (see the module docstring for the contract). The accumulator must
    be an i32 or f32 scalar on CUDA (warp shuffles move 32-bit scalars)."""
    acc = init
    if ti.static(_on_cuda()):
        mask = ti.simt.warp.active_mask()
        if ti.cast(mask, ti.i32) == -1:
            # (block dims are multiples of 32, so a thread's lane is its linear index mod 32)
            lane = _linear_thread_index() & 31
            if count <= SHORT:
                for k in ti.static(range(SHORT)):
                    if k < count:
                        acc = f(acc, src._segment_load(base, k))
            todo = ti.simt.warp.ballot(ti.cast(count > SHORT, ti.i32))   # the same value in every lane: a uniform loop
            while todo != 0:
                b = todo & (-todo)
                owner = _lane_of_bit(b)
                seg_base = _shfl(mask, base, owner)
                seg_count = _shfl(mask, count, owner)
                part = init
                for g in range((seg_count + 32 * UNROLL - 1) // (32 * UNROLL)):
                    for u in ti.static(range(UNROLL)):
                        k = g * (32 * UNROLL) + u * 32 + lane
                        if k < seg_count:
                            part = f(part, src._segment_load(seg_base, k))
                for s in ti.static((16, 8, 4, 2, 1)):   # butterfly: every lane ends with the whole sum
                    part = combine(part, _shfl(mask, part, lane ^ s))
                if lane == owner:
                    acc = combine(acc, part)
                todo ^= b
        else:
            acc = fold_serial(src, base, count, f, init)
    else:
        acc = fold_serial(src, base, count, f, init)
    return acc
