"""Narrowphase: exact contact geometry for every candidate pair, appended to both bodies' lists.

The broadphase's candidate-pair pass (app.sim.broadphase.kernel_candidate_pairs) lists, per body i, the
planes within reach and the bodies j whose bounding spheres come within the margin, each pair in one of
the two bodies' lists (so each pair is tested once). Here one thread per candidate pair computes the
manifold and appends each contact point to list i *and* list j, with mirrored normals, inside the kernel.
Pairs: sphere-sphere, sphere-plane, sphere-box, box-plane and box-box (separating-axis test over the 15
axes, then Sutherland-Hodgman clipping of the incident face against the reference face: a manifold of up
to 4 points; edge-edge gives one point).

Contacts closer than the contact margin are kept with a negative depth (speculative contacts): the
solver lets such a pair approach by exactly the gap, so resting contacts do not flicker in and out
and warm starting keeps its history.

The contact storage is generic (see app/sim/contacts.py): the kernel is compiled against whatever object
is passed as `lists`.
"""

import taichi as ti

from vla import launch
from vla.scan import exclusive_scan

from app.sim.diagnostics import atomic_max_rare, record_penetration
from app.scene.schema import SHAPE_BOX, SHAPE_CAPSULE, SHAPE_CONVEX, SHAPE_SPHERE
from app.sim.broadphase import HULL_CLASS, kernel_candidate_pairs
from app.sim.capsule import (PARALLEL_SIN, box_closest, capsule_segment, clip_segment_to_face, closest_on_segment,
                             segment_box_deepest, segments_closest)
from app.sim.convex import (clip_polygon, collide_capsule_poly, collide_hull_plane, collide_poly_sphere,
                            collide_polytopes, reduce_to_four)
from app.sim.contacts import SECOND_COPY, ContactRecord, copy_normal, feature_key, with_place
from app.sim.math3d import (contact_tangents, decode_normal, encode_normal, quat_to_mat, sign_nz, tangent_coords,
                         tangent_vector)
from app.sim.load_paths import SUPPORT_COS
from app.sim.manifold import EDGE_ABS_TOL, EDGE_REL_TOL, manifold_add, manifold_empty, plane_accepts
from app.sim.state import asleep_by_time, moves_itself, still_since_last_step

vec3 = ti.types.vector(3, ti.f32)

# Feature ids (warm-start keys, together with the other body). Plane contacts: the corner index.
# Box-box: 16 * axis code + clipped-vertex index (axis code 0-2 faces of the pair's first body, the lower
# body id, 3-5 faces of the other, 6-14 edge pairs); the second body's copy adds app.sim.contacts.SECOND_COPY.
FEATURE_STRIDE = 16


@ti.func
def _record(point, normal_code, depth, other, feature, bias, impulse_n, impulse_t):
    return ContactRecord(point=point, normal_code=normal_code, depth=depth, other=other, feature=feature,
                         impulse_n=impulse_n, impulse_t=impulse_t, impulse_p=0.0, bias=bias)


@ti.func
def _material_of(model: ti.template(), body_or_plane):
    m = 0
    if body_or_plane >= 0:
        m = model.body_material[body_or_plane]
    else:
        m = model.plane_material[-1 - body_or_plane]
    return m


# Fixed-point unit of _pair_warm_scale's sums (N s): they do not depend on the order of the old list.
WARM_FIXED_ONE = 2.0 ** 24


@ti.func
def _pair_warm_scale(lists: ti.template(), lp, other, flag, m, searched):
    """(found, mean_old, scale) for a pair's warm start, found[q] the index of point q's old record in list lp (-1:
    none). The points matched by feature id start from their old normal impulse times scale, the others from
    mean_old times scale, so that the pair starts from the normal impulse it ended last step with (the sum over its
    old records in list lp) when its manifold's features or point count change. A point that lost its match and
    started from zero left, in pyramid_100, a box under 60 levels short of its load for a step, and the load-path
    correction spread the shortfall over every body above it. Where nothing changed, scale is exactly 1 (the same
    fixed-point terms on both sides)."""
    # one pass over last step's list: the pair's old records, their sum, and each point's first record with its key
    # (other body, feature id); no break, so the compares do not wait on one another
    old_sum = ti.cast(0, ti.i64)
    matched_sum = ti.cast(0, ti.i64)
    matched = 0
    found = ti.Vector([-1, -1, -1, -1])
    for k in range(ti.select(searched, lists.length(lp), 0)):
        if lists.get_member(lp, k, "other") == other:
            impulse = ti.cast(lists.get_member(lp, k, "impulse_n") * WARM_FIXED_ONE, ti.i64)
            old_sum += impulse
            key = feature_key(lists.get_member(lp, k, "feature"))
            for q in ti.static(range(4)):
                if q < m.count and found[q] < 0 and key == (m.feature[q] | flag):
                    found[q] = k
                    matched_sum += impulse
                    matched += 1
    old_total = ti.cast(old_sum, ti.f32) / WARM_FIXED_ONE
    mean_old = ti.select(matched > 0, ti.cast(matched_sum, ti.f32) / WARM_FIXED_ONE / ti.max(matched, 1),
                         old_total / ti.max(m.count, 1))
    base_total = ti.cast(matched_sum, ti.f32) / WARM_FIXED_ONE + ti.cast(m.count - matched, ti.f32) * mean_old
    scale = 1.0
    if matched < m.count or old_sum != matched_sum:
        scale = ti.select(base_total > 0.0, old_total / base_total, 0.0)
    return found, mean_old, scale


@ti.func
def collide_sphere_plane(model: ti.template(), c, r, k, margin):
    m = manifold_empty()
    n = model.plane_normal[k]
    m.normal = n
    depth = model.plane_offset[k] - n.dot(c) + r
    point = c - n * (r - 0.5 * depth)
    if depth > -margin and plane_accepts(model, k, point, depth, depth - r, r):
        manifold_add(m, point, depth, 0)
    return m


@ti.func
def collide_box_plane(model: ti.template(), p, R, h, k, margin):
    """Up to 4 deepest penetrating corners (a resting face gives exactly its 4 corners)."""
    m = manifold_empty()
    n = model.plane_normal[k]
    m.normal = n
    off = model.plane_offset[k]
    behind = off - n.dot(p)
    radius = h.norm()
    depths = ti.Vector.zero(ti.f32, 8)
    for c in ti.static(range(8)):
        s = vec3(1.0 if c & 1 else -1.0, 1.0 if c & 2 else -1.0, 1.0 if c & 4 else -1.0)
        corner = p + R @ (s * h)
        d = off - n.dot(corner)
        ok = d > -margin and plane_accepts(model, k, corner + 0.5 * d * n, d, behind, radius)
        depths[c] = d if ok else -1e30
    for _ in range(4):
        best = -1
        best_d = -1e29
        for c in range(8):
            if depths[c] > best_d:
                best_d = depths[c]
                best = c
        if best >= 0:
            s = vec3(1.0 if best & 1 else -1.0, 1.0 if best & 2 else -1.0, 1.0 if best & 4 else -1.0)
            corner = p + R @ (s * h)
            manifold_add(m, corner + 0.5 * best_d * n, best_d, best)
            depths[best] = -1e30
    return m


@ti.func
def collide_sphere_sphere(ci, ri, cj, rj, margin):
    m = manifold_empty()
    d = cj - ci
    dist = d.norm()
    depth = ri + rj - dist
    if depth > -margin:
        n = vec3(0.0, 1.0, 0.0)
        if dist > 1e-9:
            n = d / dist
        m.normal = n
        manifold_add(m, ci + n * (ri - 0.5 * depth), depth, 0)
    return m


@ti.func
def collide_capsule_plane(model: ti.template(), p, R, he, k, margin):
    """Both ends of a capsule's segment as spheres of its radius against plane k: up to 2 points (a capsule lying on
    a floor rests on both). he: its half_extents (r, half_length + r, r)."""
    m = manifold_empty()
    n = model.plane_normal[k]
    m.normal = n
    r = he[0]
    a, b = capsule_segment(p, R, he)
    behind = model.plane_offset[k] - n.dot(p)
    for e in ti.static(range(2)):
        c = a
        if ti.static(e == 1):
            c = b
        depth = model.plane_offset[k] - n.dot(c) + r
        point = c - n * (r - 0.5 * depth)
        if depth > -margin and plane_accepts(model, k, point, depth, behind, he[1]):
            manifold_add(m, point, depth, e)
    return m


@ti.func
def collide_capsule_sphere(a, b, rc, c, rs, margin):
    """A capsule (segment a-b, radius rc) and a sphere (centre c, radius rs): the sphere against the segment's point
    closest to its centre. Normal from the capsule towards the sphere."""
    t = closest_on_segment(a, b, c)
    return collide_sphere_sphere(a + t * (b - a), rc, c, rs, margin)


@ti.func
def collide_capsule_capsule(a0, a1, ra, b0, b1, rb, margin):
    """Two capsules (segments a0-a1, b0-b1; radii ra, rb): the closest points of the segments, or, for segments
    within PARALLEL_SIN of parallel, the two ends of their overlap along the first (a log resting on a log: one point
    would let it roll about the contact). Normal from the first towards the second."""
    m = manifold_empty()
    s, t = segments_closest(a0, a1, b0, b1)
    pa = a0 + s * (a1 - a0)
    pb = b0 + t * (b1 - b0)
    d = pb - pa
    dist = d.norm()
    depth = ra + rb - dist
    if depth > -margin:
        da = a1 - a0
        la = da.norm()
        ua = da / la
        db = b1 - b0
        n, _t2 = contact_tangents(ua)   # (axes that meet: any direction across the first)
        if dist > 1e-9:
            n = d / dist
        m.normal = n
        two = False
        if ua.cross(db).norm() < PARALLEL_SIN * db.norm():
            sb0 = (b0 - a0).dot(ua)
            sb1 = (b1 - a0).dot(ua)
            lo = ti.max(0.0, ti.min(sb0, sb1))
            hi = ti.min(la, ti.max(sb0, sb1))
            if hi - lo > 0.1 * ti.min(ra, rb):
                two = True
                for e in ti.static(range(2)):
                    sa = lo
                    if ti.static(e == 1):
                        sa = hi
                    xa = a0 + ua * sa
                    xb = b0 + closest_on_segment(b0, b1, xa) * db
                    dep = ra + rb - (xb - xa).dot(n)
                    if dep > -margin:
                        manifold_add(m, xa + n * (ra - 0.5 * dep), dep, e)
        if not two:
            manifold_add(m, pa + n * (ra - 0.5 * depth), depth, 2)
    return m


@ti.func
def collide_capsule_box(a, b, rc, pb, R, h, margin):
    """A capsule (segment a-b, radius rc) and a box (centre pb, rotation R, half extents h): the segment's point
    deepest in the box (or closest to it), or, for a segment within PARALLEL_SIN of parallel to the face it meets,
    the two ends of its part over that face. Normal from the capsule towards the box."""
    m = manifold_empty()
    Rt = R.transpose()
    al = Rt @ (a - pb)
    bl = Rt @ (b - pb)
    d = bl - al
    x = al + segment_box_deepest(al, bl, h) * d
    n_l, s, face = box_closest(x, h)   # n_l: from the box towards the segment
    depth = rc - s
    if depth > -margin:
        m.normal = -(R @ n_l)
        two = False
        if face >= 0 and ti.abs(d.dot(n_l)) < PARALLEL_SIN * d.norm():
            t0, t1, ok = clip_segment_to_face(al, bl, h, face)
            if ok and t1 - t0 > 1e-3:
                two = True
                side = ti.select(n_l[face] < 0.0, 1, 0)
                for e in ti.static(range(2)):
                    te = t0
                    if ti.static(e == 1):
                        te = t1
                    xe = al + te * d
                    dep = rc - (xe.dot(n_l) - h[face])   # the segment's height over the face, less the radius
                    if dep > -margin:
                        manifold_add(m, pb + R @ (xe - n_l * (rc - 0.5 * dep)), dep, 4 * face + 2 * side + e)
        if not two:
            manifold_add(m, pb + R @ (x - n_l * (rc - 0.5 * depth)), depth, 12)
    return m


@ti.func
def capsule_pair_manifold(model: ti.template(), state: ti.template(), i, j, margin):
    """Manifold of bodies i and j, one of them a capsule (the other a sphere, box or capsule), normal from i towards
    j; size (m): the smaller half size of the two."""
    c = i
    o = j
    if model.body_shape[i] != SHAPE_CAPSULE:
        c = j
        o = i
    hc = model.body_half_extents[c]
    rc = hc[0]
    a, b = capsule_segment(state.body_pos[c], quat_to_mat(state.body_quat[c]), hc)
    shape_o = model.body_shape[o]
    po = state.body_pos[o]
    ho = model.body_half_extents[o]
    m = manifold_empty()
    if shape_o == SHAPE_SPHERE:
        m = collide_capsule_sphere(a, b, rc, po, ho[0], margin)
    elif shape_o == SHAPE_BOX:
        m = collide_capsule_box(a, b, rc, po, quat_to_mat(state.body_quat[o]), ho, margin)
    else:
        a2, b2 = capsule_segment(po, quat_to_mat(state.body_quat[o]), ho)
        m = collide_capsule_capsule(a, b, rc, a2, b2, ho[0], margin)
    if c != i:
        m.normal = -m.normal
    m.size = ti.min(rc, ho.min())
    return m


@ti.func
def _polytope_of(model: ti.template(), b):
    """(hull, scale, smallest half size m) of body b as a polytope of model.hulls: its hull, or a box as the unit
    cube (hull 0) scaled by its half extents."""
    h = model.body_hull[b]
    s = vec3(1.0)
    size = 0.0
    if model.body_shape[b] == SHAPE_CONVEX:
        size = model.hulls.inradius[h]
    else:
        s = model.body_half_extents[b]
        size = s.min()
    return h, s, size


@ti.func
def _behind_one_sided(model: ti.template(), state: ti.template(), t, b):
    """Whether body t is a one-sided static triangle (app.scene.hull.triangle_hull) and body b's centre is behind
    its plane."""
    behind = False
    if model.body_shape[t] == SHAPE_CONVEX:
        h = model.body_hull[t]
        if model.hulls.one_sided[h] != 0:
            p = model.hulls.planes.get(h, 0)
            n = quat_to_mat(state.body_quat[t]) @ vec3(p[0], p[1], p[2])
            behind = n.dot(state.body_pos[b] - state.body_pos[t]) < 0.0
    return behind


@ti.func
def hull_pair_manifold(model: ti.template(), state: ti.template(), i, j, margin):
    """Manifold of body i (a convex hull when j < 0) with plane -1 - j, or of bodies i and j, one of them a hull (the
    other any shape); normal from i towards j; size (m): the smaller half size of the two."""
    m = manifold_empty()
    if j < 0:
        h = model.body_hull[i]
        m = collide_hull_plane(model, model.hulls, h, state.body_pos[i], quat_to_mat(state.body_quat[i]),
                               model.body_radius[i], -1 - j, margin)
        m.size = model.hulls.inradius[h]
    else:
        c = i   # the hull (or, for two polytopes, the first)
        o = j
        if model.body_shape[i] != SHAPE_CONVEX:
            c = j
            o = i
        hc, sc, size_c = _polytope_of(model, c)
        pc = state.body_pos[c]
        Rc = quat_to_mat(state.body_quat[c])
        shape_o = model.body_shape[o]
        ho = model.body_half_extents[o]
        size = size_c
        if _behind_one_sided(model, state, i, j) or _behind_one_sided(model, state, j, i):
            pass   # a one-sided static triangle and a body behind it: no contact
        elif shape_o == SHAPE_SPHERE:
            m = collide_poly_sphere(model.hulls, hc, sc, pc, Rc, state.body_pos[o], ho[0], margin)
            size = ti.min(size, ho[0])
        elif shape_o == SHAPE_CAPSULE:
            a, b = capsule_segment(state.body_pos[o], quat_to_mat(state.body_quat[o]), ho)
            m = collide_capsule_poly(model.hulls, a, b, ho[0], hc, sc, pc, Rc, margin)
            m.normal = -m.normal   # (from the capsule: now from the hull)
            size = ti.min(size, ho[0])
        else:
            # two polytopes, in the pair's order (i first): feature ids name the first body's faces
            hi, si, size_i = _polytope_of(model, i)
            hj, sj, size_j = _polytope_of(model, j)
            size = ti.min(size_i, size_j)
            m = collide_polytopes(model.hulls, hi, si, state.body_pos[i], quat_to_mat(state.body_quat[i]), hj, sj,
                                  state.body_pos[j], quat_to_mat(state.body_quat[j]), size, margin)
            c = i
        if c != i:
            m.normal = -m.normal
        m.size = size
    return m


@ti.func
def sphere_box_geometry(c, r, pb, R, h):
    """(n_bs, depth, point): n_bs points from the box towards the sphere centre (a centre inside the box is pushed
    out through the nearest face: app.sim.capsule.box_closest)."""
    local = R.transpose() @ (c - pb)
    n_local, s, _face = box_closest(local, h)
    n_bs = R @ n_local
    q = pb + R @ (local - n_local * s)   # the box's surface point nearest the centre
    point = 0.5 * (q + c - n_bs * r)
    return n_bs, r - s, point


@ti.func
def _support_face_vertices(pc, R, h, k, sgn):
    """4 vertices (rows of a 4x3 matrix, in loop order) of the face of box (pc, R, h) with outward normal
    sgn * R[:, k]."""
    u = (k + 1) % 3
    v = (k + 2) % 3
    ax = _axis_at(R, k)
    au = _axis_at(R, u)
    av = _axis_at(R, v)
    fc = pc + ax * (sgn * _pick(h, k))
    hu = _pick(h, u)
    hv = _pick(h, v)
    verts = ti.Matrix.zero(ti.f32, 8, 3)
    su = ti.Vector([1.0, -1.0, -1.0, 1.0])
    sv = ti.Vector([1.0, 1.0, -1.0, -1.0])
    for m in ti.static(range(4)):
        x = fc + au * (su[m] * hu) + av * (sv[m] * hv)
        for d in ti.static(range(3)):
            verts[m, d] = x[d]
    return verts


@ti.func
def _axis(R, k: ti.template()):
    """Column k (compile time) of R."""
    return ti.Vector([R[0, k], R[1, k], R[2, k]])


# Runtime indices into a box's axes and half extents go through selects, not an index: a local vector or
# matrix indexed at run time lives in (slow, per-thread) local memory on a GPU, a statically indexed one in
# registers.
@ti.func
def _pick(v, k):
    """v[k] for a runtime k in 0..2."""
    return ti.select(k == 0, v[0], ti.select(k == 1, v[1], v[2]))


@ti.func
def _axis_at(R, k):
    """Column k (runtime, 0..2) of R."""
    return ti.select(k == 0, _axis(R, 0), ti.select(k == 1, _axis(R, 1), _axis(R, 2)))


@ti.func
def collide_box_box(pa, Ra, ha, pb, Rb, hb, margin):
    """Separating axes + clipping. The manifold normal points from box A to box B."""
    mf = manifold_empty()
    t = pb - pa
    separated = False
    best_face_s = -1e30
    best_face = -1
    best_face_n = vec3(0.0)
    best_edge_s = -1e30
    best_edge = -1
    best_edge_n = vec3(0.0)
    lmin = ti.min(ha.min(), hb.min())
    # The 15 axes in A's frame (Gottschalk, Lin and Manocha 1996, "OBBTree"): with C = Ra^T Rb (C[i, j] =
    # A_i . B_j) every projection is a few products of C's entries. No runtime index into a matrix (see
    # _pick): the 6 face axes are unrolled, the 9 edge axes are a runtime loop that picks its entries of C by
    # selects (less code to compile; H200, landed pile_1m: the box-box loop 2.26 -> 1.63 ms against the
    # earlier runtime loop over all 15 axes that indexed Ra and Rb by its counter).
    C = Ra.transpose() @ Rb
    tA = Ra.transpose() @ t
    for code in ti.static(range(6)):
        s = 0.0
        n = vec3(0.0)
        if ti.static(code < 3):
            rb = hb[0] * ti.abs(C[code, 0]) + hb[1] * ti.abs(C[code, 1]) + hb[2] * ti.abs(C[code, 2])
            tl = tA[code]
            s = ti.abs(tl) - (ha[code] + rb)
            n = _axis(Ra, code) * sign_nz(tl)
        else:
            k = ti.static(code - 3)
            ra = ha[0] * ti.abs(C[0, k]) + ha[1] * ti.abs(C[1, k]) + ha[2] * ti.abs(C[2, k])
            tl = tA[0] * C[0, k] + tA[1] * C[1, k] + tA[2] * C[2, k]
            s = ti.abs(tl) - (ra + hb[k])
            n = _axis(Rb, k) * sign_nz(tl)
        if not separated:
            if s > margin:
                separated = True
            # a small preference for A's faces keeps the reference face stable between steps
            bias = 0.0
            if ti.static(code >= 3):
                bias = 1e-4 * lmin
            if s > best_face_s + bias:
                best_face_s = s
                best_face = code
                best_face_n = n
    for e in range(9):
        ia = e // 3
        c = _axis_at(C, e % 3)   # B_jb in A's frame
        LA = ti.select(ia == 0, vec3(0.0, -c[2], c[1]), ti.select(ia == 1, vec3(c[2], 0.0, -c[0]),
                                                                  vec3(-c[1], c[0], 0.0)))   # A_ia x B_jb
        ln = LA.norm()
        if ln > 1e-5 and not separated:   # (near-parallel edges: their axis is a face axis's)
            LA = LA / ln
            tl = tA.dot(LA)
            s = ti.abs(tl) - (ha.dot(ti.abs(LA)) + hb.dot(ti.abs(C.transpose() @ LA)))
            if s > margin:
                separated = True
            if s > best_edge_s:
                best_edge_s = s
                best_edge = 6 + e
                best_edge_n = (Ra @ LA) * sign_nz(tl)
    if not separated and best_face >= 0:
        use_edge = best_edge >= 0 and best_edge_s > EDGE_REL_TOL * best_face_s + EDGE_ABS_TOL * lmin
        if use_edge:
            n = best_edge_n
            ia = (best_edge - 6) // 3
            jb = (best_edge - 6) % 3
            pA = pa
            pB = pb
            for k in ti.static(range(3)):
                if k != ia:
                    pA += _axis(Ra, k) * (sign_nz(_axis(Ra, k).dot(n)) * ha[k])
                if k != jb:
                    pB -= _axis(Rb, k) * (sign_nz(_axis(Rb, k).dot(n)) * hb[k])
            da = _axis_at(Ra, ia)
            db = _axis_at(Rb, jb)
            r = pA - pB
            b = da.dot(db)
            c = da.dot(r)
            f = db.dot(r)
            denom = 1.0 - b * b
            sa = 0.0
            tb = 0.0
            if denom > 1e-8:
                sa = (b * f - c) / denom
                tb = (f - b * c) / denom
            sa = ti.math.clamp(sa, -_pick(ha, ia), _pick(ha, ia))
            tb = ti.math.clamp(tb, -_pick(hb, jb), _pick(hb, jb))
            point = 0.5 * (pA + da * sa + pB + db * tb)
            mf.normal = n
            manifold_add(mf, point, -best_edge_s, FEATURE_STRIDE * best_edge)
        else:
            n = best_face_n  # from A to B
            ref_is_a = best_face < 3
            pr, Rr, hr, pi_, Ri, hi = pa, Ra, ha, pb, Rb, hb
            nr = n
            k = best_face
            if not ref_is_a:
                pr, Rr, hr, pi_, Ri, hi = pb, Rb, hb, pa, Ra, ha
                nr = -n
                k = best_face - 3
            # incident face: the incident box's face most anti-parallel to the reference normal
            ki = 0
            best_dot = -1.0
            for m in ti.static(range(3)):
                d = ti.abs(_axis(Ri, m).dot(nr))
                if d > best_dot:
                    best_dot = d
                    ki = m
            poly = _support_face_vertices(pi_, Ri, hi, ki, -sign_nz(_axis_at(Ri, ki).dot(nr)))
            count = 4
            u = (k + 1) % 3
            v = (k + 2) % 3
            au = _axis_at(Rr, u)
            av = _axis_at(Rr, v)
            hru = _pick(hr, u)
            hrv = _pick(hr, v)
            for side in range(4):  # the reference face's four side planes, one inlined clip
                ax = au if side < 2 else av
                hw = hru if side < 2 else hrv
                sg = 1.0 if side % 2 == 0 else -1.0
                if count > 0:
                    poly, count = clip_polygon(poly, count, sg * ax, sg * ax.dot(pr) + hw)
            cr = pr + nr * _pick(hr, k)
            # keep the points at most `margin` above the reference face
            depth = ti.Vector.zero(ti.f32, 8)
            keep = 0
            for m in range(count):
                x = ti.Vector([poly[m, 0], poly[m, 1], poly[m, 2]])
                sep = nr.dot(x - cr)
                if sep < margin:
                    xm = x - nr * (0.5 * sep)
                    for d in ti.static(range(3)):
                        poly[keep, d] = xm[d]
                    depth[keep] = -sep
                    keep += 1
            sel = reduce_to_four(poly, depth, keep, nr)
            mf.normal = n
            for m in range(4):
                if sel[m] >= 0:
                    q = sel[m]
                    x = ti.Vector([poly[q, 0], poly[q, 1], poly[q, 2]])
                    manifold_add(mf, x, depth[q], FEATURE_STRIDE * best_face + m)
    return mf


@ti.func
def sphere_box_manifold(c, r, pb, R, h, margin, sphere_first: ti.template()):
    m = manifold_empty()
    n_bs, depth, point = sphere_box_geometry(c, r, pb, R, h)
    if depth > -margin:
        m.normal = -n_bs if ti.static(sphere_first) else n_bs
        manifold_add(m, point, depth, 0)
    return m


@ti.func
def _pair_manifold(model: ti.template(), state: ti.template(), i, j, margin, cls: ti.template()):
    """Manifold of body i with body j (or plane -1 - j when j < 0), a pair of the static class cls (0:
    sphere-plane / sphere-sphere, 1: box-plane / sphere-box, 2: box-box and every pair with a capsule, 3: every pair
    with a convex hull; see app.sim.broadphase.pair_class)."""
    pi_ = state.body_pos[i]
    m = manifold_empty()
    size = 1.0
    if ti.static(cls == 0):
        ri = model.body_radius[i]
        size = ri
        if j < 0:
            m = collide_sphere_plane(model, pi_, ri, -1 - j, margin)
        else:
            rj = model.body_radius[j]
            size = ti.min(ri, rj)
            m = collide_sphere_sphere(pi_, ri, state.body_pos[j], rj, margin)
    elif ti.static(cls == 1):
        if j < 0:
            hi = model.body_half_extents[i]
            size = hi.min()
            m = collide_box_plane(model, pi_, quat_to_mat(state.body_quat[i]), hi, -1 - j, margin)
        elif model.body_shape[i] == 0:
            ri = model.body_radius[i]
            hj = model.body_half_extents[j]
            size = ti.min(ri, hj.min())
            m = sphere_box_manifold(pi_, ri, state.body_pos[j], quat_to_mat(state.body_quat[j]), hj, margin, True)
        else:
            rj = model.body_radius[j]
            hi = model.body_half_extents[i]
            size = ti.min(rj, hi.min())
            m = sphere_box_manifold(state.body_pos[j], rj, pi_, quat_to_mat(state.body_quat[i]), hi, margin, False)
    elif ti.static(cls == HULL_CLASS):
        m = hull_pair_manifold(model, state, i, j, margin)
        size = m.size
    else:
        hi = model.body_half_extents[i]
        size = hi.min()
        if j < 0:   # (in this class, only a capsule meets a plane)
            m = collide_capsule_plane(model, pi_, quat_to_mat(state.body_quat[i]), hi, -1 - j, margin)
        elif model.body_shape[i] == SHAPE_BOX and model.body_shape[j] == SHAPE_BOX:
            hj = model.body_half_extents[j]
            size = ti.min(hi.min(), hj.min())
            m = collide_box_box(pi_, quat_to_mat(state.body_quat[i]), hi, state.body_pos[j],
                                quat_to_mat(state.body_quat[j]), hj, margin)
        else:
            m = capsule_pair_manifold(model, state, i, j, margin)
            size = m.size
    m.size = size
    return m


@ti.func
def _ordered_pair(model: ti.template(), grid: ti.template(), t, j):
    """(i, j) of candidate pair (body grid.body_order[t], j), the lower body id (model.body_id) first. A body
    pair is computed in the same order whichever of the two lists holds it (the broadphase's half
    neighbourhood hands it to either) and however the bodies are stored (Simulation.resort): box-box feature
    ids name the first body's faces, the record's normal pushes the first body, and warm starting matches
    them from step to step."""
    i = grid.body_order[t]
    jj = j
    if j >= 0 and model.body_id[j] < model.body_id[i]:
        jj = i
        i = j
    return i, jj


@ti.func
def _keeps_still_pairs(model: ti.template(), lists: ti.template()):
    """Whether the pairs of bodies that have not moved since last step keep last step's records (copied by
    _copy_still_records, never computed: a settled pile then costs no contact geometry): with sleeping on, warm
    starting at 1 (a sleeper's impulses are not solved, so its records still hold the warm start the narrowphase
    would compute) and VLA contact lists (the padded and dynamic ones may have dropped a record last step)."""
    out = False
    if ti.static(not hasattr(lists, "dropped_now")):
        # (nested ifs: Taichi evaluates both sides of `and`, and a scene without sleeping skips the loads)
        if model.sleep_speed[None] > 0.0:
            out = model.warm_start[None] == 1.0
    return out


@ti.func
def _pair_contacts(model: ti.template(), state: ti.template(), grid: ti.template(), lists: ti.template(),
                   base, prev_base, dt, diagnostics: ti.template(), contacts: ti.template(), margin, t, j,
                   cls: ti.template()):
    """Contacts of one candidate pair of the static class cls (body grid.body_order[t] with body j, or with
    plane -1 - j when j < 0): its manifold, appended by _emit_contacts; nothing for a pair of two still bodies
    while _keeps_still_pairs (their records are copied: _copy_still_records)."""
    i, jj = _ordered_pair(model, grid, t, j)
    kept = False
    if _keeps_still_pairs(model, lists):
        if still_since_last_step(model, state, i, dt):
            kept = still_since_last_step(model, state, jj, dt)
    if not kept:
        # speculative contacts out to how far the two bodies can close in the step, at least the margin
        # (app.sim.broadphase: body_reach)
        reach = grid.body_reach[i]
        if jj >= 0:
            reach += grid.body_reach[jj]
        m = _pair_manifold(model, state, i, jj, ti.max(margin, reach), cls)
        _emit_contacts(model, state, lists, base, prev_base, dt, diagnostics, contacts, i, jj, m)


@ti.func
def _copy_still_records(model: ti.template(), state: ti.template(), lists: ti.template(), base, prev_base, dt,
                        diagnostics: ti.template(), i):
    """Body i, still since last step: append to its list, as they are and in their order, last step's records of
    its pairs with still bodies and planes (still_since_last_step). Those pairs' contacts are the ones computed then,
    to the bit, and so are the warm-start impulses the narrowphase would set (_keeps_still_pairs); every body of such
    a pair copies its own records, so each copy of a pair's points stays one run of consecutive records
    (_emit_contacts). The copies' deepest point counts in diagnostics.max_depth as a computed one does (its depth /
    size was checked against penetration_limit when it was computed)."""
    lp = prev_base + i
    n_prev = lists.length(lp)
    count = 0
    for q in range(n_prev):
        count += ti.select(_kept_record(model, state, i, lists.get_member(lp, q, "other"), dt), 1, 0)
    if count > 0:
        at = lists.append_n(base + i, count)
        deepest = -1e30
        for q in range(n_prev):
            if _kept_record(model, state, i, lists.get_member(lp, q, "other"), dt):
                rec = lists.get(lp, q)
                deepest = ti.max(deepest, rec.depth)
                lists.put(base + i, at, rec)
                at += 1
        atomic_max_rare(diagnostics.max_depth, deepest)


@ti.func
def _kept_record(model: ti.template(), state: ti.template(), i, other, dt):
    """Whether still body i keeps its record of last step with `other` (a body, or plane -1 - other): the other is
    still too, and one of the two is dynamic, as in every candidate pair. A fixed body keeps only its records with
    sleepers: those it holds with planes and fixed bodies are from before it was fixed (Simulation.set_fixed, which
    wakes every body, so that none of its sleepers is still until the pairs have been computed again)."""
    out = still_since_last_step(model, state, other, dt)
    if model.body_inv_mass[i] <= 0.0:
        out = out and other >= 0
        if other >= 0:
            out = out and model.body_inv_mass[other] > 0.0
    return out


@ti.func
def _wake_if_touched(model: ti.template(), state: ti.template(), a, b):
    """Wake body b for this step (state.body_woken) if it sleeps and body a, awake, moves faster than
    model.sleep_speed (|v| + |w| r, the velocities at the start of the step, as the wake pass measures them): the
    pairs app.sim.broadphase.kernel_wake_touched does not see (a large body's). A slow body leans on a sleeper as
    on a fixed body. Reads only what no thread of this kernel writes (the sleep clocks, the velocities), so the
    outcome does not depend on the order of the pairs."""
    if asleep_by_time(model, state, b) and not asleep_by_time(model, state, a) and moves_itself(model, a):
        if state.body_vel[a].norm() + state.body_omega[a].norm() * model.body_radius[a] > model.sleep_speed[None]:
            state.body_woken[b] = 1


@ti.func
def _emit_contacts(model: ti.template(), state: ti.template(), lists: ti.template(), base, prev_base, dt,
                   diagnostics: ti.template(), contacts: ti.template(), i, j, m):
    """Append manifold m of pair (i, j) (i the lower body id, see _ordered_pair; or j = -1 - plane) to both
    bodies' lists (lists[base + body]): both copies store the normal that pushes i (the manifold's normal
    points from i to j; a plane's pushes the body), j's copy with SECOND_COPY in its feature. Kept out of the
    per-class code so that the kernel inlines it once per loop (compile time)."""
    if m.count > 0:
        # Once per pair, not per copy: both copies get the same speculative target (bias) and warm-start impulses
        # (mirrored), from one key search.
        g = model.gravity[None]
        warm = model.warm_start[None]
        # a support contact (its normal within SUPPORT_COS of up) starts from contacts.normal_warm of its normal
        # impulse, the others from all of it (app.sim.load_paths.NORMAL_WARM)
        g_len = g.norm()
        up = -g / ti.max(g_len, 1e-30)
        leak = ti.select(g_len > 0.0, contacts.normal_warm[None], 1.0)
        threshold = model.restitution_threshold[None]
        inv_i = model.body_inv_mass[i]
        xi = state.body_pos[i]
        vi = state.body_vel[i] + ti.select(inv_i > 0.0, dt, 0.0) * g
        wi = state.body_omega[i]
        inv_j = 0.0
        xj = vec3(0.0)
        vj = vec3(0.0)
        wj = vec3(0.0)
        if j >= 0:
            inv_j = model.body_inv_mass[j]
            xj = state.body_pos[j]
            vj = state.body_vel[j] + ti.select(inv_j > 0.0, dt, 0.0) * g
            wj = state.body_omega[j]
        if j >= 0:
            _wake_if_touched(model, state, i, j)
            _wake_if_touched(model, state, j, i)
        e = ti.max(model.material_restitution[model.body_material[i]],
                   model.material_restitution[_material_of(model, j)])
        # last step's record of this pair: in the list of a body the solver updates (a fixed body's copy is
        # never solved, so it holds no impulse; a sleeping body's keeps what it had when it fell asleep, so the
        # awake body's copy is the one to take)
        s = i
        key = j
        flag = 0
        if j >= 0 and (inv_i <= 0.0 or (asleep_by_time(model, state, i) and not asleep_by_time(model, state, j))):
            s = j
            key = i
            flag = SECOND_COPY
        searched = inv_i > 0.0 or inv_j > 0.0
        lp = prev_base + s
        deepest = -1e30
        # the pair's points in consecutive slots of both lists (the solver walks them in order)
        first_i = lists.append_n(base + i, m.count)
        first_j = 0
        if j >= 0:
            first_j = lists.append_n(base + j, m.count)
        found, mean_old, scale = _pair_warm_scale(lists, lp, key, flag, m, searched)
        for q in range(m.count):
            point = ti.Vector([m.point[q, 0], m.point[q, 1], m.point[q, 2]])
            depth = m.depth[q]
            # copy i's normal (it pushes i), as both copies will store it: encoded, and used decoded from here
            # on, so that the warm start's tangent coordinates refer to the basis the solver rebuilds
            code = encode_normal(ti.select(j < 0, m.normal, -m.normal))
            n = decode_normal(code)
            ri = point - xi
            rj = point - xj
            vn0 = ((vi + wi.cross(ri)) - (vj + wj.cross(rj))).dot(n)
            bias = ti.min(depth, 0.0) / dt   # speculative: may approach by the gap, no further
            if vn0 < -threshold and depth > vn0 * dt and e > 0.0:
                # it touches within this step, fast enough to bounce: the impact pass (app.sim.solver.
                # impact_pass) starts from both bodies
                contacts.impact_dirty[0, i] = 1
                if j >= 0:
                    contacts.impact_dirty[0, j] = 1
                contacts.impact_any[None] = 1
            c = ti.Vector([0.0, 0.0])   # copy i's friction impulse, along its tangents
            p = found[q]
            warm_n = warm * ti.select(ti.abs(n.dot(up)) >= SUPPORT_COS, leak, 1.0)
            jn = warm_n * mean_old * scale   # (a point new to the pair: its share of what the pair carried)
            if p >= 0:
                jn = warm_n * lists.get_member(lp, p, "impulse_n") * scale
                # last step's friction impulse, back in 3-D from its own basis (as seen by i); the tangent
                # plane turned a little since: keep the in-plane part
                o1, o2 = contact_tangents(copy_normal(lists.get_member(lp, p, "normal_code"), m.feature[q] | flag))
                old_t = tangent_vector(lists.get_member(lp, p, "impulse_t"), o1, o2) * ti.select(s == i, 1.0, -1.0)
                t1, t2 = contact_tangents(n)
                c = tangent_coords(warm * (old_t - old_t.dot(n) * n), t1, t2)
            # the basis of -n is (-t1, t2): the other copy's coordinates of -jt are (c0, -c1)
            # (in the order of their feature ids, which a pair keeps from step to step while its manifold's
            # order, deepest first, changes as the bodies rock)
            place = 0
            for p2 in range(m.count):
                place += ti.select(m.feature[p2] < m.feature[q], 1, 0)
            f = with_place(m.feature[q], place, m.count)
            lists.put(base + i, first_i + place, _record(point, code, depth, j, f, bias,
                                                         ti.select(inv_i > 0.0, jn, 0.0),
                                                         c * ti.select(inv_i > 0.0, 1.0, 0.0)))
            if j >= 0:
                lists.put(base + j, first_j + place, _record(point, code, depth, i, f | SECOND_COPY, bias,
                                                         ti.select(inv_j > 0.0, jn, 0.0),
                                                         ti.Vector([c[0], -c[1]]) * ti.select(inv_j > 0.0, 1.0, 0.0)))
            deepest = ti.max(deepest, depth)
        record_penetration(model, diagnostics, i, j, deepest, m.size)


@ti.func
def _readable_pairs(grid: ti.template(), lst):
    """Candidate pairs of list lst in the list's own storage: all of them after the pairs' commit; inside a
    vla.Batch whose commit could not place them all, those that fit (the batch then fails and is re-run)."""
    return ti.min(grid.pairs.length(lst), grid.pairs.capacity(lst))


@ti.func
def _readable_compact_pairs(grid: ti.template(), j):
    """_readable_pairs of list j of the compacted classes' lists, which are contiguous: lists
    pair_list(grid.compact_classes[0], 0) + j, j < len(grid.compact_classes) * pair_stride (class
    grid.compact_classes[j // pair_stride], order position j % pair_stride). An item of exclusive_scan."""
    return _readable_pairs(grid, grid.pair_list(grid.compact_classes[0], 0) + j)


@ti.kernel
def kernel_narrowphase(model: ti.template(), state: ti.template(), grid: ti.template(), lists: ti.template(),
                       base: ti.i32, prev_base: ti.i32, dt: ti.f32, contacts: ti.template(), diagnostics: ti.template(),
                       compact: ti.types.ndarray(dtype=ti.math.ivec2, ndim=1)):
    """Empty lists[base + body] for every body, then compute the contacts of every candidate pair in
    grid.pairs (kernel_candidate_pairs) and append them to lists[base + body] (both bodies for pairs).

    One thread per candidate pair, in one loop per pair class: each loop is a GPU kernel of its own,
    compiled for its class's geometry only (one loop with a branch per class takes the registers, and so
    the occupancy, of its heaviest branch). Class 0 (spheres) walks the pairs VLA's flat slots: the inline
    slots of its lists (one range, in Z-order), then the pool's, keeping its own. The costly classes
    (grid.compact_classes: box-sphere/box-plane, box-box, hulls) are first packed densely into `compact`, (t, j) per
    pair, class by class in Z-order (one prefix sum over their lists gives each list its run): walked
    through the flat slots, their threads met empty slots and other classes' pairs (measured on the H200:
    5 of 32 lanes of a warp active in the box-box loop). The pairs are committed before this kernel runs
    (find_contacts), so every pair is in its list's own storage.
    Inputs: model (shapes, planes, materials, contact_margin, warm_start), state (poses and velocities: which
    contacts collide), grid (body_order, pairs), lists[prev_base + body] (last step's contacts: the warm
    start). Outputs: lists[base + body] (contact storage), diagnostics.max_depth (atomic max). compact: scratch of
    grid.compact_pairs_size(n) entries. Emptying the lists first (a separate loop of the same launch) makes the
    kernel safe to re-run as a whole, which vla.launch(..., rollback=False) relies on. Does nothing while
    contacts.skipping() (an earlier step failed and waits for its redo: its lists must stay as they are)."""
    run = not contacts.skipping()
    n = ti.select(run, model.body_count[None], 0)
    if ti.static(hasattr(lists, "dropped_now")):   # padded / dynamic: this fill's drops, counted afresh
        if run:
            lists.dropped_now[None] = 0
    if run:
        contacts.impact_any[None] = 0
    for i in range(n):
        lists.clear(base + i)
        contacts.impact_dirty[0, i] = 0   # (the impact pass's marks are this kernel's: a re-run starts clean)
        if _keeps_still_pairs(model, lists):
            if still_since_last_step(model, state, i, dt):
                _copy_still_records(model, state, lists, base, prev_base, dt, diagnostics, i)
    margin = model.contact_margin[None]
    stride = grid.pair_stride
    # class 0: the flat slots of its lists (vla.iteration: list i's inline slots are i * inline_capacity ..., so
    # those of lists pair_list(0, 0) .. + n - 1 are one range; then the pool's slots, every list's)
    ic = ti.static(grid.pairs.inline_capacity)
    inline_begin = grid.pair_list(0, 0) * ic
    inline_slots = n * ic
    pool_begin = grid.pairs.num_arrays * ic
    for e in range(ti.select(run, inline_slots + grid.pairs.flat_size() - pool_begin, 0)):
        s = inline_begin + e
        if e >= inline_slots:
            s = pool_begin + e - inline_slots
        lst, _ = grid.pairs.flat_index(s)
        if lst >= 0 and lst < stride:
            _pair_contacts(model, state, grid, lists, base, prev_base, dt, diagnostics, contacts, margin, lst,
                           grid.pairs.flat_value(s), 0)
    # the other classes: pack (one prefix sum over their lists, class after class, so each class's pairs
    # come out as one run of `compact`), then one dense loop per class
    K = ti.static(len(grid.compact_classes))
    exclusive_scan(grid, _readable_compact_pairs, K * stride, grid.compact_scan_scratch, grid.compact_start)
    for t in range(n):
        for k in ti.static(range(K)):
            lst = grid.pair_list(grid.compact_classes[k], t)
            first = grid.compact_start[k * stride + t]
            for q in range(_readable_pairs(grid, lst)):
                compact[first + q] = ti.Vector([t, grid.pairs.get(lst, q)])
    for k in ti.static(range(K)):
        lo = grid.compact_start[k * stride]
        for e in range(ti.select(run, grid.compact_start[(k + 1) * stride] - lo, 0)):
            tj = compact[lo + e]
            _pair_contacts(model, state, grid, lists, base, prev_base, dt, diagnostics, contacts, margin, tj[0], tj[1],
                           grid.compact_classes[k])


def find_contacts(model, state, grid, contacts, diagnostics, dt: float, batch=None):
    """Candidate pairs, then their contacts into contacts.lists[contacts.base + body] (grid.build first).

    Two launches, each committing its VLA: the pairs (kernel_candidate_pairs), then the contacts
    (kernel_narrowphase), so the narrowphase reads every pair from its list's storage (in one launch it would also
    have to walk the pairs still pending in the overflow area: a second copy of every class's manifold code, for
    a loop that is almost always empty). Inside `batch` (a vla.Batch) the caller checks the batch (done(), or first_failure() several steps
    later: app.sim.Simulation.advance) and runs find_contacts again without one if it failed: a pairs overflow
    the device could not commit leaves pairs out of the narrowphase, and that re-run redoes both. Both kernels empty their lists before filling them, so a re-run after a VLA grew
    needs no roll back. Padded and dynamic contact storages are not VLAs: no commit for them."""
    run = batch.launch if batch is not None else launch
    run(kernel_candidate_pairs, model, state, grid, dt, vlas=[grid.pairs], rollback=False)
    # sized after the pairs' commit, which may have grown their pool
    compact = grid.ensure_compact_pairs(model.host_body_count)
    run(kernel_narrowphase, model, state, grid, contacts.lists, contacts.base, contacts.prev_base, dt, contacts,
        diagnostics, compact, vlas=[contacts.lists] if contacts.kind == "vla" else [], rollback=False)
