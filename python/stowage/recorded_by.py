"""Which allocator recorded a snapshot: stowage's snapshots carry its mark in
``allocator_settings``, torch's do not.

- stowage as torch's CUDA allocator (python/libtorch/cuda_allocator.cpp) fills torch's own
  settings, which torch writes as ``allocator_settings["PYTORCH_CUDA_ALLOC_CONF"]``:
  ``"stowage:"`` followed by stowage's configuration;
- stowage's CPU mode (python/bindings/torch/snapshot_dict.cpp) writes
  ``allocator_settings = {"allocator": "stowage", "config": ...}``.

Stock torch writes its PYTORCH_CUDA_ALLOC_CONF there (often empty); older snapshots, and
stowage's profiler recordings of torch's CPU allocator, have other settings or none.
"""

from __future__ import annotations

from typing import Any

CUDA_MARK = "stowage:"  # the head of the settings string stowage's CUDA allocator reports


def recorded_by_stowage(snapshot: dict[str, Any]) -> bool:
    """Whether stowage's allocator (CUDA or CPU mode) recorded `snapshot`."""
    settings = snapshot.get("allocator_settings")
    if not isinstance(settings, dict):
        return False
    if settings.get("allocator") == "stowage":
        return True
    conf = settings.get("PYTORCH_CUDA_ALLOC_CONF")
    return isinstance(conf, str) and conf.startswith(CUDA_MARK)
