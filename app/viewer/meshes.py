"""Meshes and colours for the viewer, as numpy arrays (no Taichi, no GGUI: testable anywhere).

Every mesh is (vertices (V,3) f32, normals (V,3) f32, indices (3T,) i32[, colours (V,3) f32]), with
triangles wound counter-clockwise seen from outside. Body meshes are unit shapes that an instance
transform scales: a box spanning [-1, 1]^3 (scaled by the half extents) and a capsule's cylinder of radius 1 from
y = -1 to 1 (scaled by its radius and half length; its rounded ends are sphere particles).
"""
from __future__ import annotations

import numpy as np

# Material palette (linear RGB in [0, 1]): saturated but not neon, distinguishable side by side and under
# the viewer's warm key light; material k takes entry k mod len.
MATERIAL_PALETTE = np.array([
    [0.90, 0.45, 0.20],   # orange
    [0.20, 0.60, 0.80],   # steel blue
    [0.85, 0.75, 0.30],   # sand
    [0.45, 0.75, 0.40],   # green
    [0.80, 0.35, 0.45],   # rose
    [0.55, 0.45, 0.80],   # violet
    [0.35, 0.75, 0.70],   # teal
    [0.75, 0.75, 0.78],   # light grey
], np.float32)

# Contact-count ramp: bucket k = min(contacts, len - 1); 0 contacts (free flight) is a dim grey so that bodies
# that touch something stand out, then blue -> red with more contacts.
# colour by speed: bucket k holds speeds from SPEED_EDGES[k - 1] to SPEED_EDGES[k] (m/s), slow blue to fast red
SPEED_EDGES = np.array([0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0], np.float32)
SPEED_RAMP = np.array([[0.30, 0.38, 0.62], [0.20, 0.45, 0.90], [0.15, 0.70, 0.90], [0.20, 0.80, 0.55],
                       [0.55, 0.85, 0.25], [0.95, 0.85, 0.20], [0.98, 0.60, 0.15], [0.95, 0.35, 0.15],
                       [0.85, 0.15, 0.15]], np.float32)
# colour by sleep state: awake (bucket 0), asleep (bucket 1)
SLEEP_COLORS = np.array([[0.95, 0.62, 0.25], [0.30, 0.38, 0.62]], np.float32)
CONTACT_RAMP = np.array([
    [0.45, 0.47, 0.52],   # 0
    [0.20, 0.45, 0.90],   # 1
    [0.15, 0.75, 0.85],   # 2
    [0.30, 0.80, 0.35],   # 3
    [0.90, 0.85, 0.20],   # 4
    [0.95, 0.55, 0.15],   # 5
    [0.90, 0.20, 0.15],   # 6+
], np.float32)

COLOR_BUCKETS = 16  # colour buckets per shape; >= len(MATERIAL_PALETTE), len(CONTACT_RAMP)
SHAPE_KINDS = 4     # sphere, box, capsule, convex (app.scene.schema.SHAPES): key = shape * COLOR_BUCKETS + bucket
CYLINDER_SIDES = 16


# Materials whose name contains one of these words get a colour that reads as that material; others take
# the palette in order.
NAMED_COLORS = {
    "steel": (0.62, 0.66, 0.72), "iron": (0.55, 0.57, 0.60), "metal": (0.62, 0.66, 0.72),
    "alumin": (0.78, 0.80, 0.83), "copper": (0.80, 0.45, 0.28), "gold": (0.90, 0.72, 0.25),
    "wood": (0.76, 0.55, 0.32), "rubber": (0.85, 0.25, 0.22), "ice": (0.70, 0.88, 0.95),
    "glass": (0.55, 0.80, 0.85), "stone": (0.60, 0.58, 0.54), "concrete": (0.62, 0.62, 0.60),
    "plastic": (0.25, 0.55, 0.90), "foam": (0.90, 0.88, 0.70),
}


def material_color(name, index: int) -> np.ndarray:
    low = (name or "").lower()
    for word, col in NAMED_COLORS.items():
        if word in low:
            return np.asarray(col, np.float32)
    return MATERIAL_PALETTE[index % len(MATERIAL_PALETTE)]


def bucket_colors(mode: str, material_names=None) -> np.ndarray:
    """(COLOR_BUCKETS, 3) colours for 'material' (bucket = material index mod COLOR_BUCKETS; named after
    material_names where they say what they are), 'contacts', 'sleep' or 'speed' colouring."""
    out = np.zeros((COLOR_BUCKETS, 3), np.float32)
    names = list(material_names or ())
    for k in range(COLOR_BUCKETS):
        if mode == "contacts":
            out[k] = CONTACT_RAMP[min(k, len(CONTACT_RAMP) - 1)]
        elif mode == "sleep":
            out[k] = SLEEP_COLORS[min(k, len(SLEEP_COLORS) - 1)]
        elif mode == "speed":
            out[k] = SPEED_RAMP[min(k, len(SPEED_RAMP) - 1)]
        else:
            out[k] = material_color(names[k] if k < len(names) else None, k)
    return out


def hull_triangles(hulls):
    """Flat-shaded triangles of hulls (app.scene.hull.Hull, in their body frames), each face fanned: (first triangle of
    each hull (H + 1,) int32, corners (3T, 3) float32 m, face normals (T, 3) float32)."""
    start, corners, normals = [0], [], []
    for h in hulls:
        for f, plane in zip(h.faces, h.planes):
            for k in range(1, len(f) - 1):
                corners += [h.vertices[f[0]], h.vertices[f[k]], h.vertices[f[k + 1]]]
                normals.append(plane[:3])
        start.append(len(normals))
    return (np.asarray(start, np.int32), np.asarray(corners, np.float32).reshape(-1, 3),
            np.asarray(normals, np.float32).reshape(-1, 3))


def unit_box():
    """[-1, 1]^3 with flat normals: 24 vertices (4 per face), 12 triangles."""
    verts, normals, idx = [], [], []
    for axis in range(3):
        for sign in (1.0, -1.0):
            n = np.zeros(3)
            n[axis] = sign
            u = np.zeros(3)
            u[(axis + 1) % 3] = 1.0
            w = np.cross(n, u)
            base = len(verts)
            for du, dw in ((-1, -1), (1, -1), (1, 1), (-1, 1)):
                verts.append(n + du * u + dw * w)
                normals.append(n)
            idx += [base, base + 1, base + 2, base, base + 2, base + 3]
    return np.asarray(verts, np.float32), np.asarray(normals, np.float32), np.asarray(idx, np.int32)


def unit_cylinder(sides: int = CYLINDER_SIDES):
    """The side of a cylinder of radius 1 about y, from y = -1 to 1, with smooth normals: 2 * sides vertices,
    2 * sides triangles (no caps: a capsule's ends are spheres drawn over them)."""
    a = 2.0 * np.pi * np.arange(sides) / sides
    ring = np.stack([np.cos(a), np.zeros(sides), np.sin(a)], 1)
    verts = np.concatenate([ring + [0, -1, 0], ring + [0, 1, 0]])
    normals = np.concatenate([ring, ring])
    idx = []
    for k in range(sides):
        k1 = (k + 1) % sides
        # counter-clockwise seen from outside (the normal's side)
        idx += [k, sides + k, k1, k1, sides + k, sides + k1]
    return verts.astype(np.float32), normals.astype(np.float32), np.asarray(idx, np.int32)


def _tangent_basis(normal):
    n = np.asarray(normal, np.float64)
    n = n / np.linalg.norm(n)
    helper = np.array([0.0, 0.0, 1.0]) if abs(n[1]) > 0.9 else np.array([0.0, 1.0, 0.0])
    u = np.cross(helper, n)
    u /= np.linalg.norm(u)
    w = np.cross(n, u)
    return n, u, w


def checker_quad(center, normal, half_size_u, half_size_w, cells_u, cells_w, color_a, color_b, lift=0.0):
    """A flat checkerboard rectangle in the plane through `center` with `normal`: cells_u x cells_w cells of
    alternating colours (4 vertices each so colours do not blend). `lift` moves it along the normal."""
    n, u, w = _tangent_basis(normal)
    c = np.asarray(center, np.float64) + lift * n
    verts, normals, cols, idx = [], [], [], []
    du = 2.0 * half_size_u / cells_u
    dw = 2.0 * half_size_w / cells_w
    for i in range(cells_u):
        for j in range(cells_w):
            u0 = -half_size_u + i * du
            w0 = -half_size_w + j * dw
            col = color_a if (i + j) % 2 == 0 else color_b
            base = len(verts)
            for a, b in ((0, 0), (1, 0), (1, 1), (0, 1)):
                verts.append(c + (u0 + a * du) * u + (w0 + b * dw) * w)
                normals.append(n)
                cols.append(col)
            # counter-clockwise seen from +n: u x w = n
            idx += [base, base + 1, base + 2, base, base + 2, base + 3]
    return (np.asarray(verts, np.float32), np.asarray(normals, np.float32), np.asarray(idx, np.int32),
            np.asarray(cols, np.float32))


def container_lines(size, center, rows: int = 3):
    """Line segments (2K, 3) outlining a container's four walls: the 8 vertical edges' worth of frame plus
    `rows` horizontal lines per wall and vertical lines every wall-width / rows, so the walls read as glass
    panes without hiding the bodies inside."""
    s = np.asarray(size, np.float64) / 2.0
    c = np.asarray(center, np.float64)
    lo, hi = c - s, c + s
    segs = []
    corners = [(lo[0], lo[2]), (hi[0], lo[2]), (hi[0], hi[2]), (lo[0], hi[2])]
    for k in range(4):
        (x0, z0), (x1, z1) = corners[k], corners[(k + 1) % 4]
        for r in range(rows + 1):
            y = lo[1] + (hi[1] - lo[1]) * r / rows
            segs += [(x0, y, z0), (x1, y, z1)]
        for r in range(rows):
            f = r / rows
            x, z = x0 + (x1 - x0) * f, z0 + (z1 - z0) * f
            segs += [(x, lo[1], z), (x, hi[1], z)]
    return np.asarray(segs, np.float32)
