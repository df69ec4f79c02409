"""The previous release's name of stowage.offload.saved_tensor_offload (its SavedTensorPaging is
SavedTensorOffload); importing it warns, and the next release drops it."""

from __future__ import annotations

import warnings

from stowage.offload.saved_tensor_offload import SavedTensorOffload, keep

warnings.warn("stowage.offload.saved_tensor_paging is now stowage.offload.saved_tensor_offload (SavedTensorPaging is "
              "SavedTensorOffload); the old name goes in the next release", DeprecationWarning, stacklevel=2)

SavedTensorPaging = SavedTensorOffload
__all__ = ["SavedTensorPaging", "keep"]
