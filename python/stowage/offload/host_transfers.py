"""Copies between one device's tensors and the offloaded optimizer's host buffers.

On a GPU, gradients go out on a device-to-host stream and parameters come back on a host-to-device
stream, both of their own, so they overlap compute; each waits for the compute stream's work
issued so far (a gradient is final there; a parameter is no longer read by backward there), and
the compute stream waits for the write-backs at the end of step(). In CPU mode the copies cross the
simulated device's link (its offload engine: copy_bandwidth, statistics, injected faults) and are
done when the call returns; on a plain CPU they are memcpy.
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
            _copy_on_cpu(destination, source)
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
                for param, source in zip(params, sources):
                    _copy_on_cpu(param, source)
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

    def synchronize(self, bytes: int = 0) -> None:
        """Waits for every copy issued so far, by Note [Bounded waits] (`bytes`: what they move)."""
        if self.cuda:
            from stowage.waiting import wait_until

            for name, stream in (("to host", self.to_host), ("to the device", self.to_device)):
                event = torch.cuda.Event()
                event.record(stream)
                wait_until(event.query, f"the optimizer's copies {name}", bytes)


def _copy_on_cpu(destination: torch.Tensor, source: torch.Tensor) -> None:
    """Over CPU mode's link where one side is its device's memory, else memcpy."""
    from stowage.serving import torch_module

    module = torch_module()
    if module.is_enabled() and destination.is_contiguous() and source.is_contiguous() and \
            destination.dtype == source.dtype and module.copy_over_link(destination, source):
        # As copy_ would: a graph that saved the destination must see it was written.
        torch._C._autograd._unsafe_set_version_counter((destination,), (destination._version + 1,))
        return
    destination.copy_(source)
