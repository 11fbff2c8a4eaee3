"""Device-side exclusive prefix sum over an int32 ndarray.

Blocked three-pass scan: per-block sums (one thread per block of ``SCAN_BLOCK`` items), a serial scan
of the block sums (n / SCAN_BLOCK items, a few thousand at most), then each block writes its
offsets. O(n) work on any backend; used by commit/trim/to_csr, never by the append or read paths.
Taichi's own ``PrefixSumExecutor`` only runs on CUDA/Vulkan, and this must run on the CPU too.
"""
import taichi as ti

SCAN_BLOCK = 512

_i32_nd = ti.types.ndarray(dtype=ti.i32, ndim=1)


@ti.kernel
def _scan(src: _i32_nd, n: ti.i32, block_sum: _i32_nd, dst: _i32_nd):
    """The three passes as three loops of one kernel: Taichi runs a kernel's top-level loops one after the
    other, each finished everywhere before the next starts, and one launch costs less than three."""
    nb = (n + SCAN_BLOCK - 1) // SCAN_BLOCK
    for b in range(nb):
        s = 0
        for j in range(b * SCAN_BLOCK, ti.min((b + 1) * SCAN_BLOCK, n)):
            s += src[j]
        block_sum[b] = s
    # Exclusive scan of the block sums in place; block_sum[nb] receives the total.
    acc = 0
    ti.loop_config(serialize=True)
    for b in range(nb):
        t = block_sum[b]
        block_sum[b] = acc
        acc += t
    block_sum[nb] = acc
    for b in range(nb):
        run = block_sum[b]
        for j in range(b * SCAN_BLOCK, ti.min((b + 1) * SCAN_BLOCK, n)):
            dst[j] = run
            run += src[j]
    dst[n] = block_sum[nb]


class Scanner:
    """Holds the block-sum scratch for scans of up to ``capacity`` items."""

    def __init__(self, capacity: int):
        self.capacity = 0
        self.block_sum = None
        self.reserve(capacity)

    def reserve(self, capacity: int):
        if capacity > self.capacity:
            self.capacity = capacity
            self.block_sum = ti.ndarray(ti.i32, shape=capacity // SCAN_BLOCK + 2)

    def exclusive(self, src, n: int, dst) -> None:
        """dst[0..n] = exclusive prefix sum of src[0..n-1]; dst[n] is the total. dst has n+1 items."""
        self.reserve(n)
        _scan(src, n, self.block_sum, dst)
