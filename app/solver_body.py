"""Per-body records of the contact solver, and their packing into 64-bit words.

Gathered by every contact in every Jacobi iteration (app.solver), so their layout decides much of the
iteration's memory traffic.
"""

import taichi as ti

vec3 = ti.types.vector(3, ti.f32)

# What a contact needs of the body at its other end, gathered once per contact per iteration: packed in one
# record (48 bytes) instead of six fields (pos, inverse mass, inertia, list length, material -> friction: a
# memory sector each). Filled by kernel_prepare.
#   pos: vec3 m; inv_mass: 1/kg (0 fixed); inv_inertia_d, inv_inertia_o: the world-frame inverse inertia
#   R diag(I^-1) R^T (1/(kg m^2)) at the start of the step, symmetric, so 6 numbers (diagonal xx, yy, zz and
#   off-diagonal xy, xz, yz; see sym_mul) instead of 9; split: contacts in the body's list (mass-splitting
#   factor); friction: the body material's mu.
SolverBody = ti.types.struct(pos=vec3, inv_mass=ti.f32, inv_inertia_d=vec3, inv_inertia_o=vec3, split=ti.f32,
                             friction=ti.f32)
# Velocity and split-impulse pseudo velocity of a body (m/s, rad/s), one 48-byte record per body and buffer.
Motion = ti.types.struct(v=vec3, w=vec3, pv=vec3, pw=vec3)
# Both records are stored as six 64-bit words (two f32 each) and moved with 64-bit loads and stores: Taichi
# loads a struct one scalar at a time, and a contact gathers the other body's two records every iteration,
# so packing halves the load instructions (and L1 requests) of those gathers.
words6 = ti.types.vector(6, ti.u64)


@ti.func
def _pack2(a, b):
    """Two f32 as one u64 (a in the low half)."""
    return ti.cast(ti.bit_cast(a, ti.u32), ti.u64) | (ti.cast(ti.bit_cast(b, ti.u32), ti.u64) << ti.u64(32))


@ti.func
def _lo(x):
    return ti.bit_cast(ti.cast(x & ti.u64(0xFFFFFFFF), ti.u32), ti.f32)


@ti.func
def _hi(x):
    return ti.bit_cast(ti.cast(x >> ti.u64(32), ti.u32), ti.f32)


@ti.func
def _pack12(f):
    """Twelve f32 (a ti.Vector) as words6."""
    return words6(_pack2(f[0], f[1]), _pack2(f[2], f[3]), _pack2(f[4], f[5]), _pack2(f[6], f[7]),
                  _pack2(f[8], f[9]), _pack2(f[10], f[11]))


@ti.func
def _unpack12(x):
    return ti.Vector([_lo(x[0]), _hi(x[0]), _lo(x[1]), _hi(x[1]), _lo(x[2]), _hi(x[2]), _lo(x[3]), _hi(x[3]),
                      _lo(x[4]), _hi(x[4]), _lo(x[5]), _hi(x[5])], dt=ti.f32)


@ti.func
def pack_motion(m):
    return _pack12(ti.Vector([m.v[0], m.v[1], m.v[2], m.w[0], m.w[1], m.w[2], m.pv[0], m.pv[1], m.pv[2],
                              m.pw[0], m.pw[1], m.pw[2]], dt=ti.f32))


@ti.func
def unpack_motion(x):
    f = _unpack12(x)
    return Motion(v=vec3(f[0], f[1], f[2]), w=vec3(f[3], f[4], f[5]), pv=vec3(f[6], f[7], f[8]),
                  pw=vec3(f[9], f[10], f[11]))


@ti.func
def pack_body(b):
    return _pack12(ti.Vector([b.pos[0], b.pos[1], b.pos[2], b.inv_mass, b.inv_inertia_d[0], b.inv_inertia_d[1],
                              b.inv_inertia_d[2], b.inv_inertia_o[0], b.inv_inertia_o[1], b.inv_inertia_o[2],
                              b.split, b.friction], dt=ti.f32))


@ti.func
def unpack_body(x):
    f = _unpack12(x)
    return SolverBody(pos=vec3(f[0], f[1], f[2]), inv_mass=f[3], inv_inertia_d=vec3(f[4], f[5], f[6]),
                      inv_inertia_o=vec3(f[7], f[8], f[9]), split=f[10], friction=f[11])
