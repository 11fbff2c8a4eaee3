"""Storing per-body fields in a new order, in place: the fields keep their identity (kernels and the viewer bind
them), so each is gathered into a scratch buffer of its kind and copied back."""
import taichi as ti


@ti.func
def permute_field(f: ti.template(), scratch: ti.template(), order: ti.template(), n):
    """f[k] = old f[order[k]] for k < n, through the scratch buffer of f's kind (scratch.scratch_i32, scratch_f32 or
    scratch_vec, n entries or more). Call at a kernel's top level: its loops run one after the other, so a field is
    gathered completely before it is copied back."""
    if ti.static(hasattr(f, "n")):   # a vector field: through the vec4 buffer
        for k in range(n):
            v = f[order[k]]
            w = ti.Vector([0.0, 0.0, 0.0, 0.0])
            for c in ti.static(range(f.n)):
                w[c] = v[c]
            scratch.scratch_vec[k] = w
        for k in range(n):
            w = scratch.scratch_vec[k]
            f[k] = ti.Vector([w[c] for c in ti.static(range(f.n))])
    elif ti.static(f.dtype == ti.i32):
        for k in range(n):
            scratch.scratch_i32[k] = f[order[k]]
        for k in range(n):
            f[k] = scratch.scratch_i32[k]
    else:
        for k in range(n):
            scratch.scratch_f32[k] = f[order[k]]
        for k in range(n):
            f[k] = scratch.scratch_f32[k]
