"""Reading a VLA from kernels beyond get(): every element at once (flat iteration), and the warp's read of a list.

Flat slots run over the inline tier, list by list (list i's inline slots are i * inline_capacity ..
(i + 1) * inline_capacity - 1), then over the pool's chunks handed out. A loop over ``range(v.flat_size())`` is
therefore load-balanced whatever the lengths, and reads memory in order. A slot holds a live element or nothing
(an inline slot past its list's length, the tail of a list's last chunk, a hole left by a list that moved).
"""
import taichi as ti

from . import warp


class Iteration:
    """Flat iteration and reduce_warp of :class:`vla.VLA` (a mixin)."""

    @ti.func
    def flat_size(self):
        """Number of storage slots (inline + pool chunks handed out) that flat_index() maps."""
        return self._n_inline + (self._scalars[2] << self._chunk_shift)

    @ti.func
    def flat_index(self, e):
        """(list, index) of the element in storage slot e (0 <= e < flat_size()), or (-1, -1) when slot e holds no
        live element. The element itself is flat_value(e). Sees committed elements (vla.launch commits)."""
        i, k, o = self._flat_index_after(e, -1)
        return i, k

    @ti.func
    def flat_value(self, e):
        """The element in storage slot e (valid when flat_index(e) gave i >= 0)."""
        return self._load(e)

    @ti.func
    def flat_reduce(self, first, seg: ti.template(), f: ti.template(), init):
        """Fold ``acc = f(acc, i, k, x)`` over the live elements x (list i, index k) in storage slots first ..
        first + seg - 1 that lie below flat_size(), in slot order, and return acc. ``seg`` is a compile-time int.

        The fast flat read: ``for g in range((v.flat_size() + SEG - 1) // SEG)`` with first = g * SEG visits every
        live element once, each thread SEG neighbouring slots (SEG 4 on a GPU: 50% of the copy bandwidth on the H100,
        heavy tail, against 32% for 8; more slots hold more registers, fewer threads in flight). Against one thread per slot it issues the SEG value loads first, all in flight together (every
        slot below flat_size() is readable), and keeps the current list's run and length in registers: a slot then
        costs a compare, and a new list one or two loads (runs="ordered": steps forward, searching from the hint
        only for the first slot or past 4 lists; runs="bump": the chunk's owner, once per chunk). A thread whose
        slots run past flat_size() takes them one at a time.
        """
        n = self.flat_size()
        acc = init
        if first + seg <= n:
            # (each _load is a call whose value is a variable: the loads are issued here, before the walk)
            xs = [self._load(first + j) for j in ti.static(range(seg))]
            o = -1        # the current pool list: its run starts at chunk rs, its length is ln
            rs = 0
            ln = -1
            hi_t = 0      # ordered: the next list's run start (table_start[o + 1])
            cur_t = -1    # bump: the chunk whose owner o is
            for j in ti.static(range(seg)):
                e = first + j
                pool = True
                if ti.static(self.inline_capacity > 0):
                    pool = e >= self._n_inline
                    if not pool:
                        ii = e // self.inline_capacity
                        kk = e - ii * self.inline_capacity
                        if kk < self.length_field[ii]:
                            acc = f(acc, ii, kk, xs[j])
                if pool:
                    q = e - self._n_inline
                    t = q >> self._chunk_shift
                    if ti.static(self.runs == "ordered"):
                        if o < 0 or t >= hi_t:
                            o, rs, hi_t = self._advance_run(o, rs, hi_t, t)
                            ln = self.length_field[o]
                    else:
                        if t != cur_t:
                            cur_t = t
                            o = self._owner_of_chunk(t)
                            ln = -1   # (a hole: no list owns chunk t)
                            if o >= 0:
                                rs = self.table_start[o]
                                ln = self.length_field[o]
                    kk = self.inline_capacity + ((t - rs) << self._chunk_shift) + (q & (self.chunk_size - 1))
                    if kk < ln:
                        acc = f(acc, o, kk, xs[j])
        else:
            prev = -1
            for j in range(seg):
                e = first + j
                if e < n:
                    i, k, o = self._flat_index_after(e, prev)
                    prev = o
                    if i >= 0:
                        acc = f(acc, i, k, self._load(e))
        return acc

    @ti.func
    def reduce_warp(self, i, f: ti.template(), init, combine: ti.template()):
        """Fold list i with the warp's help for long lists (vla.warp.fold_segments): on CUDA, the lanes of a warp read
        together the pool part of every list in the warp that has more than vla.warp.SHORT elements there, coalesced,
        so a warp no longer lasts as long as its longest list (a thread-per-list read of heavy-tailed lengths).

        ``acc = f(acc, x)`` folds an element in, ``combine(a, b)`` joins two partial folds; the pair must be
        associative and commutative, ``init`` its identity (0 for a sum), and the accumulator an i32 or f32 scalar.
        It is fastest called by every thread of the loop; under a branch that some threads of a warp skip it stays
        correct, each thread then reading its own list alone. Off CUDA it folds the list in order."""
        n = self.length_field[i]
        acc = init
        # every list has its inline slots and a table entry: load them with the length, not after it (one round trip
        # fewer for a warp of short lists)
        start = self.table_start[i]
        for k in ti.static(range(self.inline_capacity)):
            x = self._load(i * self.inline_capacity + k)
            if k < n:
                acc = f(acc, x)
        rem = ti.max(n - self.inline_capacity, 0)
        base = ti.select(rem > 0, self._n_inline + (start << self._chunk_shift), 0)
        acc = combine(acc, warp.fold_segments(self, base, rem, f, init, combine))
        return acc

    # ------------------------------------------------------------------ internals
    @ti.func
    def _segment_load(self, base, k):
        """Element k of the pool segment that starts at store slot base (vla.warp's view of a list)."""
        return self._load(base + k)

    @ti.func
    def _flat_index_after(self, e, prev):
        """flat_index(e) for a walk that visits slots in increasing order: returns (list, index, owner), where owner
        is what to pass as ``prev`` with the walk's next slot (-1 the first time). runs="ordered" then steps forward
        from the previous slot's list (a load or two for neighbouring slots) instead of searching from the hint;
        runs="bump" looks the owner up either way (one load)."""
        i = -1
        k = -1
        o = -1
        if e < self._n_inline:
            ii = e // self.inline_capacity
            kk = e - ii * self.inline_capacity
            if kk < self.length_field[ii]:
                i = ii
                k = kk
        else:
            q = e - self._n_inline
            t = q >> self._chunk_shift
            rs = 0
            if ti.static(self.runs == "ordered"):
                hi_t = 0
                if prev >= 0:
                    rs = self.table_start[prev]
                    hi_t = self.table_start[prev + 1]
                o, rs, hi_t = self._advance_run(prev, rs, hi_t, t)
            else:
                o = self._owner_of_chunk(t)
                if o >= 0:
                    rs = self.table_start[o]
            if o >= 0:
                kk = self.inline_capacity + ((t - rs) << self._chunk_shift) + (q & (self.chunk_size - 1))
                if kk < self.length_field[o]:
                    i = o
                    k = kk
        return i, k, o
