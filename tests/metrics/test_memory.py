"""memory_allocated_gb carries GiB of the current allocation (case A8)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from doc_rules import documents

import otel_training
from otel_training import testing
from otel_training.metrics import memory

ALLOCATED = 81_352_720_384
PEAK = 85_000_000_000
RESERVED = 85_899_345_920
TOTAL = 85_899_345_920  # 80 GiB


def stub_torch(available: bool = True):
    cuda = SimpleNamespace(
        is_available=lambda: available,
        memory_allocated=lambda device=None: ALLOCATED,
        max_memory_allocated=lambda device=None: PEAK,
        memory_reserved=lambda device=None: RESERVED,
        get_device_properties=lambda device=None: SimpleNamespace(total_memory=TOTAL),
    )
    return SimpleNamespace(cuda=cuda)


@documents("README.md", "`torch.cuda.memory_allocated()` now, not the peak (CUDA only)")
def test_case_a8_value_is_current_allocation_in_gib():
    """Case A8: 81,352,720,384 bytes read as 75.77 GiB, never 81.35 "GB" nor the peak."""
    torch = stub_torch()
    gib = memory.memory_allocated_gib(torch_module=torch)
    assert gib == pytest.approx(75.77, abs=0.005)
    assert gib <= memory.bytes_to_gib(torch.cuda.get_device_properties().total_memory) == 80.0
    assert gib != pytest.approx(memory.bytes_to_gib(PEAK))
    assert gib != pytest.approx(memory.bytes_to_gib(RESERVED))


def test_case_a8_exported_value():
    """The exported memory_allocated_gb point carries the GiB value."""
    in_memory = testing.configure_in_memory()
    otel_training.record_training_metrics(
        in_memory.meter, memory_allocated_gb=memory.memory_allocated_gib(torch_module=stub_torch())
    )
    ((_, point),) = in_memory.points("megatron.training.memory_allocated_gb")
    assert point.value == pytest.approx(75.77, abs=0.005)


@documents("README.md", "`torch.cuda.memory_allocated()` now, not the peak (CUDA only)")
def test_no_cuda_gives_none():
    """Without CUDA there is no memory value (the metric is then not recorded)."""
    assert memory.memory_allocated_gib(torch_module=stub_torch(available=False)) is None
