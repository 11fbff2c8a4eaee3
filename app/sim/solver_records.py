"""Per-body records of the contact solver, and their packing into 64-bit words.

Gathered by every contact in every Jacobi iteration (app.sim.solver), so their layout decides much of the
iteration's memory traffic.
"""

import taichi as ti

from vla.words import Words

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
# Both records are stored as six 64-bit words (two f32 each; vla.words) and moved with 64-bit loads and
# stores: Taichi loads a struct one scalar at a time, and a contact gathers the other body's two records every
# iteration, so packing halves the load instructions (and L1 requests) of those gathers.
BODY_WORDS = Words(SolverBody)
MOTION_WORDS = Words(Motion)


@ti.func
def pack_body(b):
    return BODY_WORDS.pack(b)


@ti.func
def unpack_body(x):
    return BODY_WORDS.unpack(x)


@ti.func
def pack_motion(m):
    return MOTION_WORDS.pack(m)


@ti.func
def unpack_motion(x):
    return MOTION_WORDS.unpack(x)
