"""stowage: train larger models on one GPU with PyTorch.

The C++ core lives in ``stowage._core``; this package is the thin Python layer over it: the
safe snapshot loader, the trace recorder, and the ``stowage`` command.
"""

from stowage._core import __version__, format_bytes, parse_byte_size

__all__ = ["__version__", "format_bytes", "parse_byte_size"]
