"""Taichi kernels of the variable-radius filter: the VLA version and the Taichi baselines.

All kernels compute the same sum (see app/filter/reference.py): float32 weights, float32 accumulation, taps in
the same order (dy outer, dx inner, row-major weight lists), coordinates clamped to the image. They differ
only in where the weights live and how the loop over radii is organised:

* ``kernel_filter_vla``: one kernel for every radius; the weight list of radius r is array r of a VLA.
* ``kernel_stage_weights`` + ``kernel_filter_flat`` (vla-flat, every arch): the same, after a staging
  pass that copies all weight lists out of the VLA into one flat buffer (~1k elements, cache-resident).
* ``kernel_filter_vla_shared`` (CUDA only, the VLA's tier 3): the same, one 32x8 tile per block; every
  block first stages all weight lists and its image tile plus halo into block shared memory
  (``stage_tile``), then filters from there.
* ``kernel_filter_vla_shared_runs`` (CUDA only): the same staging, 32x32 tiles, and each thread filters a
  vertical run of RUN = 4 pixels, reusing every staged value it loads for all pixels of the run.
* ``kernel_filter_fixed_radius``: baseline (a), compiled once per radius R (R is a compile-time constant,
  so its loops have constant trip counts) and launched once per radius present, each launch over the whole
  image, filtering the pixels whose mask (radius_map == R) is set.
* ``kernel_filter_padded``: baseline (b), every pixel runs the (2 R_max + 1)^2 window of a weight table
  padded with zeros to R_max (one kernel, uniform trip count).

Arrays (ti.ndarray or numpy, row-major):
    img        float32 (H, W, C)     input image, linear values
    radius_map int32   (H, W)        radius of each pixel in pixels, 0 <= r <= R_max
    out        float32 (H, W, C)     output image
Kernels are free functions with every input passed explicitly; C, R and R_max are compile-time.
"""
import taichi as ti

#: kernel_filter_vla_shared: one block of TILE_X * TILE_Y threads filters a TILE_X x TILE_Y pixel tile; a
#: warp is one row of 32 columns, whose lanes read consecutive 1- or 3-word pixels: no bank conflicts
TILE_X = 32
TILE_Y = 8
#: shared memory one block may use without opting in to more (CUDA's static limit, in bytes)
SHARED_BYTES_LIMIT = 48 * 1024


#: kernel_filter_vla_shared_runs: pixels per thread (a vertical run), and its tile: RUN_TILE x RUN_TILE
#: pixels per block of RUN_TILE * RUN_TILE / RUN threads (a warp = one row of 32 columns: conflict-free)
RUN = 4
RUN_TILE = 32


def staged_shared_bytes(max_radius: int, channels: int, tile_x: int, tile_y: int) -> int:
    """Bytes of block shared memory a shared-memory kernel with a tile_x x tile_y pixel tile needs: all
    weight lists plus the tile with its halo."""
    weights = sum((2 * r + 1) ** 2 for r in range(max_radius + 1))
    return 4 * (weights + (tile_x + 2 * max_radius) * (tile_y + 2 * max_radius) * channels)


def block_buffers(emulate: bool, emu_w, emu_img, w_size: int, img_size: int):
    """Evaluated while a kernel compiles (inside ti.static): the (weights, image) block-shared float32
    arrays of a shared-memory kernel, or, when ``emulate`` (the CPU test of those kernels), the global
    buffers ``emu_w`` and ``emu_img`` in which every thread keeps a private copy at offset
    thread * size."""
    if emulate:
        return emu_w, emu_img
    return ti.simt.block.SharedArray((w_size,), ti.f32), ti.simt.block.SharedArray((img_size,), ti.f32)


@ti.func
def func_clamp(v: ti.i32, lo: ti.i32, hi: ti.i32) -> ti.i32:
    return ti.min(ti.max(v, lo), hi)


@ti.func
def stage_tile(img: ti.template(), weights: ti.template(), weight_offset: ti.template(), sh_w: ti.template(),
               sh_img: ti.template(), wb, ib, lane, step, ty0, tx0, height, width, HALO_X: ti.template(),
               HALO_Y: ti.template(), C: ti.template(), R_MAX: ti.template(), EMU: ti.template()):
    """Fill a shared-memory filter kernel's block buffers (block_buffers): every weight list of the VLA
    `weights` at sh_w[wb + weight_offset[r] + j] (read-mostly, reused by every pixel of the tile), and the
    HALO_X x HALO_Y pixels of the tile at (ty0, tx0) with its R_MAX halo, clamped to the image (the clamp
    happens here, once per value), at sh_img[ib + (row * HALO_X + column) * C + channel]. The block's threads
    share the work: thread `lane` takes items lane, lane + step, ...; then a block barrier (not under EMU,
    where each thread stages its own copy). height, width: the image's size in pixels."""
    for r in range(R_MAX + 1):
        base = weight_offset[r]
        n = weight_offset[r + 1] - base
        j = lane
        while j < n:
            sh_w[wb + base + j] = weights.get(r, j)
            j += step
    j = lane
    while j < HALO_X * HALO_Y:
        hy = j // HALO_X
        hx = j - hy * HALO_X
        yy = func_clamp(ty0 - R_MAX + hy, 0, height - 1)
        xx = func_clamp(tx0 - R_MAX + hx, 0, width - 1)
        for c in ti.static(range(C)):
            sh_img[ib + j * C + c] = img[yy, xx, c]
        j += step
    if ti.static(not EMU):
        ti.simt.block.sync()


@ti.kernel
def kernel_filter_vla(
    img: ti.types.ndarray(dtype=ti.f32, ndim=3),
    radius_map: ti.types.ndarray(dtype=ti.i32, ndim=2),
    weights: ti.template(),
    out: ti.types.ndarray(dtype=ti.f32, ndim=3),
    C: ti.template(),
):
    """weights: VLA of f32, array r = the (2r+1)^2 weights of radius r (row-major in dy, dx)."""
    height, width = radius_map.shape[0], radius_map.shape[1]
    for y, x in ti.ndrange(height, width):
        r = radius_map[y, x]
        acc = ti.Vector.zero(ti.f32, C)
        t = 0
        for dy in range(-r, r + 1):
            yy = func_clamp(y + dy, 0, height - 1)
            for dx in range(-r, r + 1):
                xx = func_clamp(x + dx, 0, width - 1)
                w = weights.get(r, t)
                t += 1
                for c in ti.static(range(C)):
                    acc[c] += w * img[yy, xx, c]
        for c in ti.static(range(C)):
            out[y, x, c] = acc[c]


@ti.kernel
def kernel_filter_vla_shared(
    img: ti.types.ndarray(dtype=ti.f32, ndim=3),
    radius_map: ti.types.ndarray(dtype=ti.i32, ndim=2),
    weights: ti.template(),
    weight_offset: ti.types.ndarray(dtype=ti.i32, ndim=1),
    out: ti.types.ndarray(dtype=ti.f32, ndim=3),
    C: ti.template(),
    R_MAX: ti.template(),
    WEIGHT_TOTAL: ti.template(),
    SPEC: ti.template(),
    EMU: ti.template(),
    emu_w: ti.types.ndarray(dtype=ti.f32, ndim=1),
    emu_img: ti.types.ndarray(dtype=ti.f32, ndim=1),
):
    """CUDA only (block shared memory). weight_offset: int32 (R_MAX + 2,), prefix sum of the VLA's list
    lengths, so list r is staged at [weight_offset[r], weight_offset[r + 1]). WEIGHT_TOTAL = its last entry.
    Radii <= SPEC (compile-time, -1 for none) take a path specialised for their radius inside this one
    kernel; larger radii the generic runtime loop. One tile of TILE_X x TILE_Y pixels per block; loop
    index i -> thread i % B of tile i // B (Taichi's grid-stride loop keeps i % B equal to the thread
    index when block_dim = B)."""
    B = ti.static(TILE_X * TILE_Y)
    HALO_X = ti.static(TILE_X + 2 * R_MAX)
    HALO_Y = ti.static(TILE_Y + 2 * R_MAX)
    height, width = radius_map.shape[0], radius_map.shape[1]
    tiles_x = (width + TILE_X - 1) // TILE_X
    tiles_y = (height + TILE_Y - 1) // TILE_Y
    ti.loop_config(block_dim=B)
    for i in range(tiles_x * tiles_y * B):
        tid = i % B
        tile = i // B
        ty0 = (tile // tiles_x) * TILE_Y
        tx0 = (tile % tiles_x) * TILE_X
        sh_w, sh_img = ti.static(block_buffers(EMU, emu_w, emu_img, WEIGHT_TOTAL, HALO_X * HALO_Y * C))
        # EMU (CPU test only): thread i stages everything into its own copy; on CUDA wb = ib = 0 and
        # lane/step are the thread index and the block size (cooperative staging)
        wb = i * ti.static(WEIGHT_TOTAL * int(EMU))
        ib = i * ti.static(HALO_X * HALO_Y * C * int(EMU))
        lane = tid * ti.static(1 - int(EMU))
        step = ti.static(B - (B - 1) * int(EMU))
        stage_tile(img, weights, weight_offset, sh_w, sh_img, wb, ib, lane, step, ty0, tx0, height, width, HALO_X,
                   HALO_Y, C, R_MAX, EMU)
        ly = tid // TILE_X
        lx = tid - ly * TILE_X
        y = ty0 + ly
        x = tx0 + lx
        if y < height and x < width:
            r = radius_map[y, x]
            acc = ti.Vector.zero(ti.f32, C)
            generic = True
            for rr in ti.static(range(SPEC + 1)):  # compile-time paths: constant trip counts, as in (a)
                if r == rr:
                    generic = False
                    t0 = weight_offset[rr]
                    for dy in range(-rr, rr + 1):
                        row = (ly + R_MAX + dy) * HALO_X + lx + R_MAX
                        for dx in range(-rr, rr + 1):
                            w = sh_w[wb + t0 + (dy + rr) * (2 * rr + 1) + dx + rr]
                            p = (row + dx) * C
                            for c in ti.static(range(C)):
                                acc[c] += w * sh_img[ib + p + c]
            if generic:
                t = weight_offset[r]
                for dy in range(-r, r + 1):
                    row = (ly + R_MAX + dy) * HALO_X + lx + R_MAX
                    for dx in range(-r, r + 1):
                        w = sh_w[wb + t]
                        t += 1
                        p = (row + dx) * C
                        for c in ti.static(range(C)):
                            acc[c] += w * sh_img[ib + p + c]
            for c in ti.static(range(C)):
                out[y, x, c] = acc[c]
        # the next grid-stride iteration restages shared memory: wait until every thread has read it
        if ti.static(not EMU):
            ti.simt.block.sync()


@ti.kernel
def kernel_filter_vla_shared_runs(
    img: ti.types.ndarray(dtype=ti.f32, ndim=3),
    radius_map: ti.types.ndarray(dtype=ti.i32, ndim=2),
    weights: ti.template(),
    weight_offset: ti.types.ndarray(dtype=ti.i32, ndim=1),
    out: ti.types.ndarray(dtype=ti.f32, ndim=3),
    C: ti.template(),
    R_MAX: ti.template(),
    WEIGHT_TOTAL: ti.template(),
    SPEC: ti.template(),
    EMU: ti.template(),
    emu_w: ti.types.ndarray(dtype=ti.f32, ndim=1),
    emu_img: ti.types.ndarray(dtype=ti.f32, ndim=1),
):
    """CUDA only. kernel_filter_vla_shared with register blocking: each thread filters RUN vertically
    adjacent pixels. When the run shares one radius rr <= SPEC, every staged image value of the run's
    window is read from shared memory once and used by up to RUN pixels (about 2 shared loads per tap
    instead of 1 + C); per pixel the taps are still summed dy outer, dx inner, as everywhere else.
    Other runs filter pixel by pixel as kernel_filter_vla_shared does. Tile RUN_TILE x RUN_TILE pixels,
    block RUN_TILE * RUN_TILE / RUN threads; a warp covers one row of RUN_TILE = 32 columns, so its
    lanes read consecutive 3- or 1-word pixels: no bank conflicts."""
    B = ti.static(RUN_TILE * RUN_TILE // RUN)
    HALO = ti.static(RUN_TILE + 2 * R_MAX)
    height, width = radius_map.shape[0], radius_map.shape[1]
    tiles_x = (width + RUN_TILE - 1) // RUN_TILE
    tiles_y = (height + RUN_TILE - 1) // RUN_TILE
    ti.loop_config(block_dim=B)
    for i in range(tiles_x * tiles_y * B):
        tid = i % B
        tile = i // B
        ty0 = (tile // tiles_x) * RUN_TILE
        tx0 = (tile % tiles_x) * RUN_TILE
        sh_w, sh_img = ti.static(block_buffers(EMU, emu_w, emu_img, WEIGHT_TOTAL, HALO * HALO * C))
        # EMU (CPU test only): thread i stages everything into its own copy; on CUDA wb = ib = 0 and
        # lane/step are the thread index and the block size (cooperative staging)
        wb = i * ti.static(WEIGHT_TOTAL * int(EMU))
        ib = i * ti.static(HALO * HALO * C * int(EMU))
        lane = tid * ti.static(1 - int(EMU))
        step = ti.static(B - (B - 1) * int(EMU))
        stage_tile(img, weights, weight_offset, sh_w, sh_img, wb, ib, lane, step, ty0, tx0, height, width, HALO, HALO,
                   C, R_MAX, EMU)
        lx = tid % RUN_TILE
        ly0 = (tid // RUN_TILE) * RUN  # first tile row of this thread's run
        x = tx0 + lx
        y0 = ty0 + ly0
        if x < width and y0 < height:
            r0 = radius_map[y0, x]
            uniform = y0 + RUN <= height
            if uniform:
                for q in ti.static(range(1, RUN)):
                    if radius_map[y0 + q, x] != r0:
                        uniform = False
            done = False
            if uniform:
                for rr in ti.static(range(SPEC + 1)):
                    if r0 == rr:
                        done = True
                        acc = ti.Matrix.zero(ti.f32, RUN, C)
                        t0 = weight_offset[rr]
                        for s in range(-rr, rr + RUN):  # staged row ly0 + s: row dy = s - q of pixel q
                            row = (ly0 + R_MAX + s) * HALO + lx + R_MAX
                            for dx in range(-rr, rr + 1):
                                p = (row + dx) * C
                                v = ti.Vector.zero(ti.f32, C)
                                for c in ti.static(range(C)):
                                    v[c] = sh_img[ib + p + c]
                                for q in ti.static(range(RUN)):
                                    if s - q >= -rr and s - q <= rr:
                                        w = sh_w[wb + t0 + (s - q + rr) * (2 * rr + 1) + dx + rr]
                                        for c in ti.static(range(C)):
                                            acc[q, c] += w * v[c]
                        for q in ti.static(range(RUN)):
                            for c in ti.static(range(C)):
                                out[y0 + q, x, c] = acc[q, c]
            if not done:  # mixed radii (or the image's last rows): pixel by pixel, as kernel_filter_vla_shared
                for q in range(RUN):
                    y = y0 + q
                    if y < height:
                        r = radius_map[y, x]
                        acc = ti.Vector.zero(ti.f32, C)
                        generic = True
                        for rr in ti.static(range(SPEC + 1)):
                            if r == rr:
                                generic = False
                                t0 = weight_offset[rr]
                                for dy in range(-rr, rr + 1):
                                    row = (ly0 + q + R_MAX + dy) * HALO + lx + R_MAX
                                    for dx in range(-rr, rr + 1):
                                        w = sh_w[wb + t0 + (dy + rr) * (2 * rr + 1) + dx + rr]
                                        pp = (row + dx) * C
                                        for c in ti.static(range(C)):
                                            acc[c] += w * sh_img[ib + pp + c]
                        if generic:
                            t = weight_offset[r]
                            for dy in range(-r, r + 1):
                                row = (ly0 + q + R_MAX + dy) * HALO + lx + R_MAX
                                for dx in range(-r, r + 1):
                                    w = sh_w[wb + t]
                                    t += 1
                                    pp = (row + dx) * C
                                    for c in ti.static(range(C)):
                                        acc[c] += w * sh_img[ib + pp + c]
                        for c in ti.static(range(C)):
                            out[y, x, c] = acc[c]
        if ti.static(not EMU):
            ti.simt.block.sync()


@ti.kernel
def kernel_stage_weights(weights: ti.template(), weight_offset: ti.types.ndarray(dtype=ti.i32, ndim=1), flat: ti.types.ndarray(dtype=ti.f32, ndim=1)):
    """Copy every weight list out of the VLA into one flat buffer: list r to
    flat[weight_offset[r] : weight_offset[r + 1]] (weight_offset: int32 (n_lists + 1,), the prefix sum of
    the lengths). The staging pass of vla-flat: about a thousand elements, against (2r+1)^2 VLA reads
    per pixel without it."""
    for r in range(weight_offset.shape[0] - 1):
        base = weight_offset[r]
        for j in range(weight_offset[r + 1] - base):
            flat[base + j] = weights.get(r, j)


@ti.kernel
def kernel_filter_flat(
    img: ti.types.ndarray(dtype=ti.f32, ndim=3),
    radius_map: ti.types.ndarray(dtype=ti.i32, ndim=2),
    flat: ti.types.ndarray(dtype=ti.f32, ndim=1),
    weight_offset: ti.types.ndarray(dtype=ti.i32, ndim=1),
    out: ti.types.ndarray(dtype=ti.f32, ndim=3),
    C: ti.template(),
    SPEC: ti.template(),
):
    """The filter pass of vla-flat: weights from the staged flat buffer (see kernel_stage_weights).
    Radii <= SPEC (compile-time, -1 for none) take a path specialised for their radius inside this one
    kernel (constant trip counts, as in baseline (a)); larger radii the generic runtime loop. Weight
    list rr is square, (2rr+1)^2 long, as app.filter.reference.weight_lists makes them."""
    height, width = radius_map.shape[0], radius_map.shape[1]
    for y, x in ti.ndrange(height, width):
        r = radius_map[y, x]
        acc = ti.Vector.zero(ti.f32, C)
        generic = True
        for rr in ti.static(range(SPEC + 1)):
            if r == rr:
                generic = False
                t0 = weight_offset[rr]
                for dy in range(-rr, rr + 1):
                    yy = func_clamp(y + dy, 0, height - 1)
                    for dx in range(-rr, rr + 1):
                        xx = func_clamp(x + dx, 0, width - 1)
                        w = flat[t0 + (dy + rr) * (2 * rr + 1) + dx + rr]
                        for c in ti.static(range(C)):
                            acc[c] += w * img[yy, xx, c]
        if generic:
            t = weight_offset[r]
            for dy in range(-r, r + 1):
                yy = func_clamp(y + dy, 0, height - 1)
                for dx in range(-r, r + 1):
                    xx = func_clamp(x + dx, 0, width - 1)
                    w = flat[t]
                    t += 1
                    for c in ti.static(range(C)):
                        acc[c] += w * img[yy, xx, c]
        for c in ti.static(range(C)):
            out[y, x, c] = acc[c]


@ti.kernel
def kernel_filter_fixed_radius(
    img: ti.types.ndarray(dtype=ti.f32, ndim=3),
    radius_map: ti.types.ndarray(dtype=ti.i32, ndim=2),
    weights_r: ti.types.ndarray(dtype=ti.f32, ndim=1),
    out: ti.types.ndarray(dtype=ti.f32, ndim=3),
    C: ti.template(),
    R: ti.template(),
):
    """Baseline (a): filters the pixels with radius_map == R. weights_r: float32 ((2R+1)^2,)."""
    height, width = radius_map.shape[0], radius_map.shape[1]
    for y, x in ti.ndrange(height, width):
        if radius_map[y, x] == R:
            acc = ti.Vector.zero(ti.f32, C)
            for dy in range(-R, R + 1):
                yy = func_clamp(y + dy, 0, height - 1)
                for dx in range(-R, R + 1):
                    xx = func_clamp(x + dx, 0, width - 1)
                    w = weights_r[(dy + R) * (2 * R + 1) + dx + R]
                    for c in ti.static(range(C)):
                        acc[c] += w * img[yy, xx, c]
            for c in ti.static(range(C)):
                out[y, x, c] = acc[c]


@ti.kernel
def kernel_filter_padded(
    img: ti.types.ndarray(dtype=ti.f32, ndim=3),
    radius_map: ti.types.ndarray(dtype=ti.i32, ndim=2),
    weights_padded: ti.types.ndarray(dtype=ti.f32, ndim=2),
    out: ti.types.ndarray(dtype=ti.f32, ndim=3),
    C: ti.template(),
    R_MAX: ti.template(),
):
    """Baseline (b): weights_padded float32 (R_MAX + 1, (2 R_MAX + 1)^2), row r = radius r's table centred
    in a (2 R_MAX + 1)^2 window, zeros outside. Every pixel runs the whole window; the zero taps add
    exactly 0, so the sum equals the other variants' (same order of the non-zero taps)."""
    height, width = radius_map.shape[0], radius_map.shape[1]
    SIDE = ti.static(2 * R_MAX + 1)
    for y, x in ti.ndrange(height, width):
        r = radius_map[y, x]
        acc = ti.Vector.zero(ti.f32, C)
        for dy in range(-R_MAX, R_MAX + 1):
            yy = func_clamp(y + dy, 0, height - 1)
            for dx in range(-R_MAX, R_MAX + 1):
                xx = func_clamp(x + dx, 0, width - 1)
                w = weights_padded[r, (dy + R_MAX) * SIDE + dx + R_MAX]
                for c in ti.static(range(C)):
                    acc[c] += w * img[yy, xx, c]
        for c in ti.static(range(C)):
            out[y, x, c] = acc[c]


@ti.kernel
def kernel_copy(src: ti.types.ndarray(dtype=ti.f32, ndim=1), dst: ti.types.ndarray(dtype=ti.f32, ndim=1)):
    """Plain copy: the bandwidth yardstick of the benchmark (reads 4 B and writes 4 B per element)."""
    for i in range(src.shape[0]):
        dst[i] = src[i]
