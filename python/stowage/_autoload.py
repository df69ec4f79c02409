"""Installs stowage as torch's CUDA allocator when STOWAGE_ALLOC_CONF is set.

``stowage_autoload.pth`` (installed beside the package) imports this module at interpreter start,
and only when the variable is set. It does not import torch: it waits for the program to import
torch, then enables stowage with the variable's configuration (empty: the defaults) right after
torch's own initialisation, before any CUDA tensor can exist. A configuration stowage cannot
use makes ``import torch`` fail with stowage's message; on a machine without a CUDA device
nothing is installed and a RuntimeWarning says so.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import warnings
from types import ModuleType
from typing import Any, Sequence

_VARIABLE = "STOWAGE_ALLOC_CONF"


def _enable_now() -> None:
    # Here, not at the top: this module runs at interpreter start (the .pth), before torch loads,
    # and stowage.memory enables stowage in torch, which needs torch.
    from stowage.memory import NoCudaDevice, enable

    value = os.environ.get(_VARIABLE, "")
    try:
        enable(value, device="cuda")
    except NoCudaDevice as error:  # a launcher's environment on a machine without a GPU
        warnings.warn(f"{_VARIABLE} is set, but {error}", RuntimeWarning, stacklevel=2)
    except ValueError as error:  # a configuration stowage cannot use: name where it came from
        raise ValueError(f"{_VARIABLE}={value!r}: {error}") from None


class _EnableAfterExec(importlib.abc.Loader):
    """Wraps torch's loader: runs it, then enables stowage and removes the hook."""

    def __init__(self, loader: Any, hook: _TorchImportHook) -> None:
        self._loader, self._hook = loader, hook

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        self._hook.remove()
        _enable_now()

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, is_package, ...
        return getattr(self._loader, name)


class _TorchImportHook(importlib.abc.MetaPathFinder):
    """Finds torch with the other finders and wraps its loader. It stays in place until torch
    has really been imported: importlib.util.find_spec("torch"), which libraries call to see
    whether torch is installed, finds a spec that is never loaded."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "torch":
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                if spec.loader is not None and not isinstance(spec.loader, _EnableAfterExec):
                    spec.loader = _EnableAfterExec(spec.loader, self)
                return spec
        return None

    def remove(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)


def install() -> None:
    if "torch" in sys.modules:
        _enable_now()
    elif not any(isinstance(finder, _TorchImportHook) for finder in sys.meta_path):
        sys.meta_path.insert(0, _TorchImportHook())


if _VARIABLE in os.environ:
    install()
