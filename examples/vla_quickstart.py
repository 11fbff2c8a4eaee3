"""The README's VLA example: neighbour lists of random points, built in parallel from inside a kernel."""
import numpy as np
import taichi as ti

from vla import VLA, launch


@ti.kernel
def build_neighbours(pos: ti.template(), nbrs: ti.template(), radius: ti.f32):
    for i, j in ti.ndrange(pos.shape[0], pos.shape[0]):       # O(n^2) only to keep the example short
        if i != j and (pos[i] - pos[j]).norm() < radius:
            nbrs.append(i, j)                                  # thread-safe; no maximum per list


@ti.kernel
def neighbour_sums(nbrs: ti.template(), out: ti.template()):
    for i in range(nbrs.num_arrays):
        s = 0
        for k in range(nbrs.length(i)):                        # O(1) access, no chain walk
            s += nbrs.get(i, k)
        out[i] = s


@ti.func
def _add(acc, i, k, x):
    return acc + x


@ti.kernel
def all_pairs_sum(nbrs: ti.template(), part: ti.template()):
    for g in range((nbrs.flat_size() + 3) // 4):               # every element, whatever the lengths: a thread
        part[g] = nbrs.flat_reduce(g * 4, 4, _add, 0)          # folds 4 neighbouring storage slots


def main(n=2000, radius=0.05, seed=0):
    pos = ti.Vector.field(2, ti.f32, shape=n)
    pos.from_numpy(np.random.default_rng(seed).random((n, 2), dtype=np.float32))
    nbrs = VLA(n, ti.i32, inline_capacity=4, chunk_size=8, name="neighbours")
    launch(build_neighbours, pos, nbrs, radius)                # grows and re-runs if needed: nothing lost
    offsets, values = nbrs.to_csr()                            # only live elements cross to the host
    sums = ti.field(ti.i32, shape=n)
    neighbour_sums(nbrs, sums)
    part = ti.field(ti.i32, shape=(nbrs.slot_capacity + 3) // 4)   # slot_capacity >= flat_size(), known on the host
    all_pairs_sum(nbrs, part)
    print(f"{offsets[-1]} neighbour pairs, longest list {np.diff(offsets).max()}")
    print(nbrs.stats())
    return pos.to_numpy(), offsets, values, sums.to_numpy(), int(part.to_numpy().sum())


if __name__ == "__main__":
    ti.init(arch=ti.cpu)
    main()
