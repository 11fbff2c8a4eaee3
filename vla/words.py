"""A flat struct of 32-bit members as 64-bit words: how a VLA stores such elements, also usable on its own.

Taichi loads and stores a struct one scalar at a time; stored as u64 words (two members' 32-bit slots each,
in member order, the last word's high half 0 when the slots are odd in number) it moves in half the
instructions. ``Words(dtype)`` describes the packing at compile time; its ``@ti.func`` methods convert::

    w = Words(Record)                     # Record: ti.types.struct of f32/i32/u32 scalars, vectors, matrices
    field = ti.Vector.field(w.n_words, ti.u64, shape=n)   # or w.store_dtype
    field[i] = w.pack(rec); rec = w.unpack(field[i]); x = w.member(field[i], "name")

The conversions are expressions only (no mutated locals): they are inlined wherever a record moves, and
Taichi compiles a mutated local vector much more slowly.
"""

import taichi as ti
from taichi.lang.matrix import MatrixType
from taichi.lang.struct import StructType


def _slots(dtype):
    """The 32-bit slots of `dtype` in member order, as (member, component index or None, slot, scalar dtype,
    member is a scalar), and each member's (first slot, slot count, leaf dtype). ValueError otherwise."""
    if not isinstance(dtype, StructType):
        raise ValueError(f"64-bit words need a ti.types.struct dtype, got {dtype!r}")
    slots, members = [], {}
    for name, ldt in dtype.members.items():
        if isinstance(ldt, StructType):
            raise ValueError(f"64-bit words need a flat struct; member {name!r} is nested")
        base = ldt.dtype if isinstance(ldt, MatrixType) else ldt
        if base not in (ti.f32, ti.i32, ti.u32):
            raise ValueError(f"64-bit words need 32-bit members (f32, i32, u32); {name!r} is {base}")
        if isinstance(ldt, MatrixType):
            comps = [(r,) for r in range(ldt.n)] if ldt.ndim == 1 else \
                [(r, c) for r in range(ldt.n) for c in range(ldt.m)]
        else:
            comps = [None]
        members[name] = (len(slots), len(comps), ldt)
        for c in comps:
            slots.append((name, c, len(slots), base, c is None))
    return slots, members


def words_fit(dtype) -> bool:
    """Whether ``dtype`` packs into words: a flat ti.types.struct whose members are 32-bit scalars, vectors or
    matrices (f32, i32, u32)."""
    try:
        _slots(dtype)
    except ValueError:
        return False
    return True


@ti.data_oriented
class Words:
    """The packing of struct type `dtype` into ``n_words`` u64 words (``store_dtype``, ``storage_bytes``)."""

    def __init__(self, dtype):
        self.dtype = dtype
        self.slots, self.members = _slots(dtype)
        self.n_words = (len(self.slots) + 1) // 2
        self.store_dtype = ti.types.vector(self.n_words, ti.u64)
        self.storage_bytes = 8 * self.n_words

    def plans(self, names):
        """The words that writing members `names` (a tuple) touches, each as (word, low half, high half, read
        first): a half is (2, slot entry) when one of those members fills it, (1,) when another member does
        (the old word is then read first to keep it) and (0,) when it is padding (written as 0)."""
        mine = set()
        for name in names:
            first, count, _ = self.members[name]
            mine.update(range(first, first + count))
        plans = []
        for w in sorted({q // 2 for q in mine}):
            halves = tuple((2, self.slots[q]) if q in mine else (1,) if q < len(self.slots) else (0,)
                           for q in (2 * w, 2 * w + 1))
            plans.append((w, halves[0], halves[1], any(h[0] == 1 for h in halves)))
        return tuple(plans)

    @ti.func
    def pack(self, x):
        """The words of struct value x."""
        return self.store_dtype([self._pack_word(x, w) for w in ti.static(range(self.n_words))])

    @ti.func
    def _pack_word(self, x, w: ti.template()):
        lo = ti.static(self.slots[2 * w])
        if ti.static(2 * w + 1 < len(self.slots)):
            hi = ti.static(self.slots[2 * w + 1])
            return self.join(self.bits(x[lo[0]], lo), self.bits(x[hi[0]], hi))
        else:
            return ti.cast(self.bits(x[lo[0]], lo), ti.u64)

    @ti.func
    def unpack(self, s):
        """Inverse of pack: the struct value from its words s."""
        return self.dtype(**{name: self.member(s, name) for name in ti.static(tuple(self.members))})

    @ti.func
    def member(self, s, name: ti.template()):
        """Member `name` from words s (words it does not use are not needed: their loads are dead code when s
        comes straight from a field)."""
        first, count, ldt = ti.static(self.members[name])
        if ti.static(self.slots[first][4]):
            return ti.bit_cast(self.half(s[first // 2], first % 2), ldt)
        elif ti.static(ldt.ndim == 1):
            return ldt([ti.bit_cast(self.half(s[q // 2], q % 2), ldt.dtype)
                        for q in ti.static(range(first, first + count))])
        else:
            return ldt([[ti.bit_cast(self.half(s[(first + r * ldt.m + c) // 2], (first + r * ldt.m + c) % 2),
                                     ldt.dtype)
                         for c in ti.static(range(ldt.m))] for r in ti.static(range(ldt.n))])

    @ti.func
    def bits(self, v, e: ti.template()):
        """The 32 bits of slot entry e (see _slots) of member value v, as u32."""
        if ti.static(e[4]):
            return ti.bit_cast(ti.cast(v, e[3]), ti.u32)
        else:
            return ti.bit_cast(ti.cast(v[e[1]], e[3]), ti.u32)

    @ti.func
    def join(self, lo, hi):
        """One u64 word from two u32 halves."""
        return ti.cast(lo, ti.u64) | (ti.cast(hi, ti.u64) << ti.u64(32))

    @ti.func
    def half(self, word, high: ti.template()):
        """Low (high=0) or high (high=1) 32 bits of a u64 word, as u32."""
        return ti.cast((word >> ti.u64(32 * high)) & ti.u64(0xFFFFFFFF), ti.u32)

    @ti.func
    def new_half(self, x, old, spec: ti.template(), high: ti.template(), whole: ti.template()):
        """A half of a word being written (spec: see plans): from x (the struct value if whole, else the one
        member's value), kept from the old word, or 0."""
        if ti.static(spec[0] == 2):
            e = ti.static(spec[1])
            if ti.static(whole):
                return self.bits(x[e[0]], e)
            else:
                return self.bits(x, e)
        elif ti.static(spec[0] == 1):
            return self.half(old, high)
        else:
            return ti.u32(0)
