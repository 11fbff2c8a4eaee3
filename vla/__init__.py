"""SmolVLA: tiered-storage variable-length arrays for Taichi kernels.

    from vla import VLA, launch, Batch, VLAOverflowError, VLACapacityError

See vla/core.py for the design and README.md for an example kernel.
"""
from .core import NO_FAILURE, VLA, Batch, element_bytes, launch
from .errors import VLACapacityError, VLAOverflowError

__all__ = ["VLA", "Batch", "launch", "VLAOverflowError", "VLACapacityError", "element_bytes", "NO_FAILURE"]
