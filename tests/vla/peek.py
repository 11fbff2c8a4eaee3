"""A test's view past the VLA's guard: what the lists of a VLA that lost appends show (its host reads refuse)."""


def peek_lists(v):
    """v.to_lists() of a VLA whose reads raise because it lost appends; the guard is restored after."""
    lost, v._lost = v._lost, 0
    try:
        return v.to_lists()
    finally:
        v._lost = lost
