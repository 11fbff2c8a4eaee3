"""SmolVLA: tiered-storage variable-length arrays for Taichi kernels.

    from vla import VLA, launch, Batch, VLAOverflowError, VLACapacityError

vla/API.md is the reference; README.md has an example kernel.
"""
from .array import VLA
from .errors import VLACapacityError, VLAOverflowError
from .launch import Batch, launch

__all__ = ["VLA", "Batch", "launch", "VLAOverflowError", "VLACapacityError"]
