"""Tier 3: stage a list's hot elements in CUDA block shared memory.

For kernels in which a whole thread block works on one list and reads its elements many times (a
filter kernel applied by every pixel of a tile, a body's contacts read by every solver lane), the
block loads the first ``capacity`` elements once, cooperatively and coalesced, and every later read
hits shared memory. Elsewhere (CPU, or lists longer than ``capacity``) reads fall back to the VLA.

Usage (``B`` threads per block, one block per list)::

    from vla import shared

    @ti.kernel
    def k(v: ti.template(), out: ti.template()):
        ti.loop_config(block_dim=B)
        for t in range(v.num_arrays * B):
            i, lane = t // B, t % B        # thread_idx() does not compile on CUDA in Taichi 1.7.4
            cache = shared.block_buffer(v, CAP)          # SharedArray on CUDA, nothing elsewhere
            n = shared.stage(v, cache, i, lane, B)       # cooperative load + block barrier
            acc = 0.0
            for k in range(v.length(i)):
                acc += shared.get(v, cache, n, i, k)
            ...

Whether this pays is measured by ``python run.py bench vla`` (its ``reuse`` rows; docs/benchmarks.md): for a
list re-read by a block it does not on an H200 (L1 serves the re-reads), for the image filter's weights it does.
"""
import warnings

import taichi as ti
from taichi.lang import impl

# block_buffer() is deliberately a plain Python function run while the kernel compiles (it must create
# the SharedArray in the kernel's scope); Taichi warns about every such call.
warnings.filterwarnings("ignore", message=r".*non-taichi function .*block_buffer")


class _NoCache:
    """Stand-in for the shared buffer off CUDA (marked data-oriented so Taichi passes it through)."""

    _data_oriented = True


def _staged(cache) -> bool:
    return not isinstance(cache, _NoCache)


def is_cuda() -> bool:
    return impl.current_cfg().arch == ti.cuda


def block_buffer(v, capacity):
    """A block-shared array of ``capacity`` elements of v's dtype on CUDA; a no-op stand-in elsewhere.

    Called inside a kernel (evaluated while the kernel compiles)."""
    if is_cuda():
        return ti.simt.block.SharedArray((capacity,), v.dtype)
    return _NoCache()


@ti.func
def stage(v: ti.template(), cache: ti.template(), i, lane, block_dim: ti.template()):
    """Load list i's first elements into ``cache`` (all threads of the block call this). Returns how
    many were staged (0 without a cache)."""
    n = 0
    if ti.static(_staged(cache)):
        # Barrier first: under a grid-stride loop the block reuses the buffer for its next list, and
        # slower threads may still be reading the previous one.
        ti.simt.block.sync()
        n = ti.min(v.length(i), ti.static(cache.shape[0]))
        k = lane
        while k < n:
            cache[k] = v.get(i, k)
            k += block_dim
        ti.simt.block.sync()
    return n


@ti.func
def get(v: ti.template(), cache: ti.template(), n_staged, i, k):
    """Element k of list i, from shared memory when staged."""
    r = v._zero()
    if ti.static(_staged(cache)):
        if k < n_staged:
            r = cache[k]
        else:
            r = v.get(i, k)
    else:
        r = v.get(i, k)
    return r
