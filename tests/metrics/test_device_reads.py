"""Device scalars read without stalling the training thread: a CUDA scalar is queued as a
non-blocking copy into pinned memory plus an event on its stream, and only the background
thread waits, for that event; anything else is handed over as it is."""

from __future__ import annotations

import threading

import pytest
from support import import_or_unavailable, not_here

from otel_training.metrics.device_reads import PendingDeviceRead, device_type, start_device_read

torch = import_or_unavailable("torch")


class Device:
    """A device object as frameworks other than torch spell it: a ``type`` attribute."""

    def __init__(self, kind) -> None:
        self.type = kind


class Holder:
    """A value with the given ``device`` and ``is_cuda`` attributes (absent when unset)."""

    def __init__(self, **attributes) -> None:
        self.__dict__.update(attributes)


def test_device_type_reads_torch_tensors_strings_and_device_objects():
    """The device type of a torch tensor, of a "cuda:1" string, of an object with a type;
    is_cuda counts only when it is True and no device is given; else None, never a raise."""
    assert device_type(torch.tensor(1.0)) == "cpu"
    assert device_type(torch.empty(2, device="meta")) == "meta"
    assert device_type(Holder(device="cuda:1")) == "cuda"
    assert device_type(Holder(device="xla")) == "xla"
    assert device_type(Holder(device=Device("mps"))) == "mps"
    assert device_type(Holder(device=Device(3))) is None
    assert device_type(Holder(device=Device(None))) is None
    assert device_type(Holder(device=object())) is None
    assert device_type(Holder(device="cuda:0:1")) == "cuda"
    assert device_type(Holder(is_cuda=True)) == "cuda"
    assert device_type(Holder(is_cuda=1)) is None
    assert device_type(Holder(is_cuda=True, device="cpu")) == "cpu"
    assert device_type(2.5) is None and device_type(None) is None


def test_values_that_are_not_cuda_scalars_are_handed_over_as_they_are():
    """A CPU tensor, a CUDA-like stand-in that is no tensor, or a CUDA tensor of several
    elements is not copied: the background thread gets the value itself."""
    cpu = torch.tensor(4.0)
    stand_in = Holder(is_cuda=True, device="cuda:0")
    for value in (cpu, stand_in, 7.5):
        assert start_device_read(value).result() is value
    assert PendingDeviceRead(source="x").result() == "x"


class RecordingEvent:
    """A CUDA event that records where it was recorded and which thread waited on it."""

    def __init__(self) -> None:
        self.stream = None
        self.waited_on: list[str] = []

    def record(self, stream) -> None:
        self.stream = stream

    def synchronize(self) -> None:
        self.waited_on.append(threading.current_thread().name)


class PinnedHost(torch.Tensor):
    """The pinned host tensor: records how it was filled."""

    copies: list[dict]

    def copy_(self, source, non_blocking=False):
        self.copies.append({"non_blocking": non_blocking, "source_shape": tuple(source.shape)})
        self.as_subclass(torch.Tensor).copy_(source.as_subclass(torch.Tensor))  # same storage
        return self


class CudaScalar(torch.Tensor):
    """A CPU tensor that says it is on a CUDA device (this machine may have none)."""

    @property
    def is_cuda(self) -> bool:
        return True


@pytest.fixture
def cuda_calls(monkeypatch):
    """torch's allocation of pinned memory, its CUDA events and streams, recorded: what a CUDA
    scalar's read asks of torch, on a machine without a GPU."""
    calls: dict[str, list] = {"empty": [], "events": [], "streams": [], "copies": []}
    real_empty = torch.empty

    def empty(*shape, **kwargs):
        calls["empty"].append((shape, kwargs))
        kwargs = {k: v for k, v in kwargs.items() if k != "pin_memory"}
        host = real_empty(*shape, **kwargs).as_subclass(PinnedHost)
        host.copies = calls["copies"]
        return host

    def event():
        calls["events"].append(RecordingEvent())
        return calls["events"][-1]

    def current_stream(device=None):
        calls["streams"].append(device)
        return ("stream of", device)

    monkeypatch.setattr(torch, "empty", empty)
    monkeypatch.setattr(torch.cuda, "Event", event)
    monkeypatch.setattr(torch.cuda, "current_stream", current_stream)
    return calls


def test_a_cuda_scalar_is_copied_without_waiting_and_read_after_its_event(cuda_calls):
    """A one-element CUDA tensor: a 0-d host buffer in pinned memory of its dtype, filled by a
    non-blocking copy, an event recorded on the tensor's device's current stream; result(),
    on another thread, waits for that event only and returns the host value."""
    value = torch.tensor([[2.5]], dtype=torch.float64).as_subclass(CudaScalar)
    read = start_device_read(value)
    assert cuda_calls["empty"] == [
        (((),), {"dtype": torch.float64, "device": "cpu", "pin_memory": True})
    ]
    assert cuda_calls["copies"] == [{"non_blocking": True, "source_shape": ()}]
    (event,) = cuda_calls["events"]
    assert cuda_calls["streams"] == [value.device]
    assert event.stream == ("stream of", value.device) and event.waited_on == []
    results = []
    reader = threading.Thread(target=lambda: results.append(read.result()), name="background")
    reader.start()
    reader.join()
    assert event.waited_on == ["background"]
    (host,) = results
    assert host.shape == () and host.dtype == torch.float64 and float(host) == 2.5


def test_a_cuda_tensor_of_several_elements_is_not_copied(cuda_calls):
    """Only scalars are copied: a CUDA tensor of two elements is handed over as it is."""
    value = torch.tensor([1.0, 2.0]).as_subclass(CudaScalar)
    assert start_device_read(value).result() is value
    assert cuda_calls["empty"] == [] and cuda_calls["events"] == []


def test_a_cuda_scalar_read_on_a_gpu():
    """Where a CUDA device is: the value computed on the device arrives through pinned memory."""
    if not torch.cuda.is_available():
        not_here("no CUDA device here")
    value = torch.tensor(1.75, device="cuda") * 2
    read = start_device_read(value)
    host = read.result()
    assert host.device.type == "cpu" and host.is_pinned() and float(host) == 3.5
