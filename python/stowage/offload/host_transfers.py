"""Copies between one device's tensors and the offloaded optimizer's host buffers.

On a GPU, gradients go out on a device-to-host stream and parameters come back on a host-to-device
stream, both of their own, so they overlap compute; each waits for the compute stream's work
issued so far (a gradient is final there; a parameter is no longer read by backward there), and
the compute stream waits for the write-backs at the end of step(). On a CPU (plain, or CPU mode's
simulated device) the copies are memcpy, done when the call returns.
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager

import torch


class HostTransfers:
    """Contract: called from the optimizer's thread and DDP's hook callbacks (under the GIL)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.to_host = torch.cuda.Stream(device)
            self.to_device = torch.cuda.Stream(device)

    def copy_out(self, destination: torch.Tensor, gradient: torch.Tensor) -> None:
        """Starts copying `gradient` into the host buffer `destination` (1-D, same numel)."""
        source = gradient.reshape(-1)
        if not self.cuda:
            destination.copy_(source)
            return
        self.to_host.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.to_host):
            destination.copy_(source, non_blocking=True)
        source.record_stream(self.to_host)

    def copies_out_issued(self) -> Any:
        """An event that completes when the copies out issued so far have (None on a CPU)."""
        if not self.cuda:
            return None
        event = torch.cuda.Event()
        event.record(self.to_host)
        return event

    def write_back(self, params: list[torch.Tensor], sources: list[torch.Tensor]) -> Any:
        """Starts writing `sources` (host) into `params`; returns an event that completes when the
        host buffers may be written again (None on a CPU, where that is at once)."""
        with torch.no_grad():
            if not self.cuda:
                torch._foreach_copy_(params, sources)
                return None
            self.to_device.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self.to_device):
                torch._foreach_copy_(params, sources, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.to_device)
            return event

    def on_write_back_stream(self) -> ContextManager[Any]:
        """Work issued inside runs after the write-backs issued so far (on their stream)."""
        return torch.cuda.stream(self.to_device) if self.cuda else contextlib.nullcontext()

    def written_back(self) -> None:
        """Makes the compute stream wait for the write-backs issued so far."""
        if self.cuda:
            torch.cuda.current_stream(self.device).wait_stream(self.to_device)

    def synchronize(self) -> None:
        if self.cuda:
            self.to_host.synchronize()
            self.to_device.synchronize()
