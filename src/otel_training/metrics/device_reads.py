"""Reading device scalars without stalling the training thread: the one mechanism that
``record_training_metrics`` and the phases' span attributes share.

On the training thread, :func:`start_device_read` queues a non-blocking copy of a one-element
CUDA tensor into pinned host memory and records a CUDA event on the current stream; neither
waits for the device. A background thread later calls :meth:`PendingDeviceRead.result`, which
waits for that event only. Nothing here synchronises the device on the calling thread.
"""

from __future__ import annotations

import sys

__all__ = ["PendingDeviceRead", "device_type", "start_device_read"]


def device_type(value) -> str | None:
    """The device type of a tensor-like value (``"cuda"``, ``"cpu"``...), else ``None``.
    Never raises on a value with a ``device`` attribute of any kind."""
    device = getattr(value, "device", None)
    if device is None:
        return "cuda" if getattr(value, "is_cuda", None) is True else None
    if isinstance(device, str):
        return device.split(":")[0]
    kind = getattr(device, "type", None)
    return kind if isinstance(kind, str) else None


class PendingDeviceRead:
    """A device scalar being copied to host; :meth:`result` runs on a background thread."""

    __slots__ = ("_host", "_event", "_source")

    def __init__(self, host=None, event=None, source=None) -> None:
        self._host = host
        self._event = event
        self._source = source

    def result(self):
        """The host value (a pinned 0-d tensor), after waiting for its copy's event; the
        value itself for anything that was not a CUDA tensor."""
        if self._event is not None:
            self._event.synchronize()
            return self._host
        return self._source


def start_device_read(value) -> PendingDeviceRead:
    """Starts an asynchronous device-to-host copy of a device scalar (training thread).

    For a CUDA ``torch.Tensor`` with one element: a non-blocking copy into pinned host memory
    from PyTorch's caching host allocator, and a CUDA event recorded on the current stream;
    neither waits for the device. Any other tensor-like (other devices, test doubles) is handed
    over as it is and converted with ``float()`` on the background thread.

    Raises:
        RuntimeError: what torch raises when the copy cannot be queued (callers catch it).
    """
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor) and value.is_cuda:
        source = value.detach()
        if source.numel() == 1:
            source = source.reshape(())
            host = torch.empty((), dtype=source.dtype, device="cpu", pin_memory=True)
            host.copy_(source, non_blocking=True)
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(source.device))
            return PendingDeviceRead(host=host, event=event)
    return PendingDeviceRead(source=value)
