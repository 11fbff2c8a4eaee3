"""Appending from inside kernels, and the overflow area that makes an append never fail.

Taichi 1.7.4 has no compare-and-swap, so an append takes its slot with one ``atomic_add`` on the list's length.
If the slot lies inside the list's inline part or its chunks, the element goes home directly. Otherwise it goes
to the overflow area through an atomic bump, tagged with (list, slot), and waits there for the commit
(vla.growth), which grows the lists that need it and moves the parked elements home. If even the overflow area
was too small, the commit grows everything to the demand it saw and raises VLAOverflowError; vla.launch catches
that, rolls the lengths back and runs the kernel again, so a caller that uses launch never loses an element.

The scalars of a VLA (``_scalars``, 16 i32): [0] appends parked in the overflow area, [1] its capacity, [2] chunks
handed out (the pool's bump), [3] chunks in holes, [4] lists that found the pool full (until the host repairs the
bump), [5] lists moved by the last claiming kernel, [6] the overflow count the last device commit saw, [7] the
claims' outcome, [8] / [9] device commits (Batch) that found parked appends / moved lists.
"""
import taichi as ti


class Appending:
    """Kernel-side growth of :class:`vla.VLA`'s lists (a mixin)."""

    @ti.func
    def append(self, i, x):
        """Append x to list i (thread-safe, also when many threads append to the same list). Returns x's index in
        list i. Readable after the commit (vla.launch commits)."""
        if ti.static(self._debug):
            assert i >= 0 and i < self.num_arrays, "VLA.append: list index out of range"
        # The chunk-table entry is loaded before the atomic so its latency overlaps the atomic's: on a GPU a thread
        # appending many elements is bound by this dependency chain, not by bandwidth.
        t_start = self.table_start[i]
        t_chunks = self._chunks_of(i)
        slot = ti.atomic_add(self.length_field[i], 1)
        self._place(i, slot, x, t_start, t_chunks)
        return slot

    @ti.func
    def append_n(self, i, n):
        """Reserve n consecutive slots at the end of list i (thread-safe) and return the first one's index: list i
        then holds, at first .. first + n - 1, what put(i, first + q, x) stores there, in that order, whatever other
        threads append meanwhile. Readable after the commit, as append's."""
        if ti.static(self._debug):
            assert i >= 0 and i < self.num_arrays and n >= 0, "VLA.append_n: list index out of range or n < 0"
        return ti.atomic_add(self.length_field[i], n)

    @ti.func
    def put(self, i, slot, x):
        """Store x in a slot of list i that append_n reserved: at home if the list's storage holds it, else in the
        overflow area, tagged with its slot, for the commit to move home (as append does)."""
        self._place(i, slot, x, self.table_start[i], self._chunks_of(i))

    @ti.func
    def _place(self, i, slot, x, t_start, t_chunks):
        """x into slot `slot` of list i (chunk run at t_start, t_chunks chunks): at home, or beyond the list's
        chunks parked in the overflow area, tagged (list, slot), for commit() to move home."""
        if slot < self.inline_capacity + (t_chunks << self._chunk_shift):
            self._put(self._addr_at(i, slot, t_start), x)
        else:
            o = ti.atomic_add(self._scalars[0], 1)
            if o < self._scalars[1]:
                self.ovf_value[o] = self._pack(x)
                self.ovf_meta[o] = ti.Vector([i, slot])

    @ti.func
    def clear(self, i):
        """Empty list i; its storage stays reserved for the next fill.

        Appends parked in the overflow area before the clear are dropped by the next commit() only where their
        slot lies at or past the list's new length. So commit (or use vla.launch) between a kernel whose appends to
        list i overflowed and a later clear-and-refill of list i past its room: otherwise an old parked value and a
        new one share a slot, and either may end up there."""
        self.length_field[i] = 0


@ti.func
def move_overflow_home(v: ti.template()):
    """Store the parked elements at home, then empty the overflow area. Does nothing while _scalars[4] says that
    some list found no room (the host then grows the pool first). Call at a kernel's top level (its loop runs in
    parallel there)."""
    for o in range(ti.min(v._scalars[0], v._scalars[1])):
        meta = v.ovf_meta[o]
        # A slot at or past the list's length is dead (the list was emptied since): drop it, as its home may lie
        # outside the list's chunks.
        if v._scalars[4] == 0 and meta[1] < v.length_field[meta[0]]:
            v.store[v._addr(meta[0], meta[1])] = v.ovf_value[o]
    if v._scalars[4] == 0:
        v._scalars[0] = 0


@ti.kernel
def k_move_overflow_home(v: ti.template()):
    move_overflow_home(v)
