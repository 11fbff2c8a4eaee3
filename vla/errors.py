"""Exceptions of the VLA library. Neither is ever swallowed: an element the VLA could not hold is reported."""


class VLAOverflowError(RuntimeError):
    """A kernel appended more elements than the VLA could hold, even in its overflow area.

    Raised by :meth:`VLA.commit`. The VLA has already grown to the demand when this is raised, so
    re-running the kernel (what :func:`vla.launch` does after rolling the lengths back) succeeds.

    Attributes: ``appended`` (elements that went to the overflow area), ``overflow_capacity``, ``lost``.
    """

    def __init__(self, message, appended=0, overflow_capacity=0, lost=0):
        super().__init__(message)
        self.appended = appended
        self.overflow_capacity = overflow_capacity
        self.lost = lost


class VLACapacityError(MemoryError):
    """The device cannot hold what the VLA was asked to store (memory or 32-bit index space)."""
