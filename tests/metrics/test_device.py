"""Device metrics: hw.* instruments by OpenTelemetry's names, units and attributes, one sample per
interval on the reader's thread; absent with one info line without NVML or a GPU; NVML's native
units converted, its errors survived, through a fake libnvidia-ml.so.1 that the real pynvml
binding loads (tests/fake_nvml); a real NVML read where a GPU is."""

from __future__ import annotations

import inspect
import logging
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from doc_rules import documents
from fake_nvml import SONAME, FakeNvml, installed
from fake_nvml import build as build_fake_nvml
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    InMemoryMetricReader,
    MetricExporter,
    MetricExportResult,
    PeriodicExportingMetricReader,
)
from opentelemetry.semconv._incubating.metrics import hw_metrics
from support import child_env, import_or_unavailable, metrics_of, new_in_memory_meter, not_here

from otel_training.config import RankIdentity
from otel_training.metrics import device as device_metrics
from otel_training.metrics.device import (
    DEVICE_METRICS,
    DeviceMetrics,
    DeviceSample,
    NvmlDevices,
    observe_devices,
)
from otel_training.semconv.metrics import DL_GPU_CLOCK_SPEED, METRICS

GIB = 2**30


class InMemoryDevices:
    """A device source that returns fixed samples and records the thread of every read."""

    def __init__(self, samples) -> None:
        self.samples, self.threads = samples, []

    def read(self):
        self.threads.append(threading.current_thread())
        return self.samples


def _points(reader) -> dict[str, list]:
    found: dict[str, list] = {}
    for metric in metrics_of(reader.get_metrics_data()):
        found.setdefault(metric.name, []).extend(
            (metric.unit, dict(p.attributes), p.value) for p in metric.data.data_points
        )
    return found


H100 = DeviceSample(
    id="GPU-1",
    name="NVIDIA H100",
    utilization=0.75,
    memory_used_bytes=20 * GIB,
    memory_total_bytes=80 * GIB,
    power_w=350.5,
    energy_j=1.5e6,
    temperature_cel=61.0,
    clocks_hz={"graphics": 1.98e9, "sm": 1.98e9, "memory": 2.6e9},
)


@documents("device-metrics.md", "Rank identity stays in the Resource, as everywhere")
@documents("device-metrics.md", "`hw.gpu.task` = `general`")
def test_instruments_use_opentelemetrys_hardware_names_units_and_attributes(in_memory_meter):
    """Each value becomes its hw.* instrument, in OTel's unit, with hw.id, hw.type=gpu, hw.name,
    hw.vendor; the temperature is a sensor of the GPU; clocks carry their domain."""
    DeviceMetrics(
        in_memory_meter.meter, InMemoryDevices([H100, DeviceSample(id="GPU-2", name="NVIDIA H100")])
    )
    found = _points(in_memory_meter.reader)
    assert set(found) == set(DEVICE_METRICS)  # GPU-2 reports nothing: no points, no series
    gpu = {"hw.id": "GPU-1", "hw.type": "gpu", "hw.name": "NVIDIA H100", "hw.vendor": "NVIDIA"}
    assert found[hw_metrics.HW_GPU_UTILIZATION] == [("1", {**gpu, "hw.gpu.task": "general"}, 0.75)]
    assert found[hw_metrics.HW_GPU_MEMORY_USAGE] == [("By", gpu, 20 * GIB)]
    assert found[hw_metrics.HW_GPU_MEMORY_LIMIT] == [("By", gpu, 80 * GIB)]
    assert found[hw_metrics.HW_GPU_MEMORY_UTILIZATION] == [("1", gpu, 0.25)]
    assert found[hw_metrics.HW_POWER] == [("W", gpu, 350.5)]
    assert found[hw_metrics.HW_ENERGY] == [("J", gpu, 1.5e6)]
    (temperature,) = found[hw_metrics.HW_TEMPERATURE]
    assert temperature[0] == "Cel" and temperature[2] == 61.0
    assert temperature[1]["hw.type"] == "temperature" and temperature[1]["hw.parent"] == "GPU-1"
    clocks = {a["dl.gpu.clock.domain"]: (unit, v) for unit, a, v in found[DL_GPU_CLOCK_SPEED]}
    assert clocks == {"graphics": ("Hz", 1.98e9), "sm": ("Hz", 1.98e9), "memory": ("Hz", 2.6e9)}
    assert METRICS[DL_GPU_CLOCK_SPEED].unit == "Hz"


def test_one_sample_serves_every_instrument_and_reader_within_the_interval():
    """Eight instruments and two readers collecting at once read the devices once."""
    first, second = InMemoryMetricReader(), InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[first, second]).get_meter("devices")
    source = InMemoryDevices([H100])
    metrics = DeviceMetrics(meter, source, min_interval_s=3600.0)
    first.get_metrics_data()
    second.get_metrics_data()
    assert metrics.reads == 1 and len(source.threads) == 1
    metrics._taken -= 7200.0  # the sample is now older than the interval
    first.get_metrics_data()
    assert metrics.reads == 2


class NullExporter(MetricExporter):
    """Accepts every export; sets ``exported`` at the first."""

    def __init__(self) -> None:
        super().__init__()
        self.exported = threading.Event()

    def export(self, metrics_data, timeout_millis: float = 10_000, **kwargs):
        self.exported.set()
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
        pass


def test_devices_are_read_on_the_readers_thread_not_the_training_thread():
    """With a periodic reader, every read before shutdown happens on the reader's thread."""
    source = InMemoryDevices([H100])
    exporter = NullExporter()
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=50)
    provider = MeterProvider(metric_readers=[reader])
    DeviceMetrics(provider.get_meter("devices"), source, min_interval_s=0.0)
    assert exporter.exported.wait(30)
    before_shutdown = list(source.threads)
    provider.shutdown()
    assert before_shutdown
    assert all(t is reader._daemon_thread for t in before_shutdown)
    assert threading.current_thread() not in before_shutdown


def test_without_a_gpu_the_instruments_are_absent_with_one_info_line(caplog):
    """NVML is there as a package but finds no driver or GPU (this machine): no hw.* point,
    one info line for the process, however many pipelines and collections."""
    import_or_unavailable("pynvml")
    device_metrics._said.clear()
    with caplog.at_level(logging.INFO, logger="otel_training.metrics.device"):
        for _ in range(2):
            sdk = new_in_memory_meter("devices")  # a pipeline of its own each time
            metrics = observe_devices(sdk.meter, RankIdentity())
            assert isinstance(metrics, DeviceMetrics)
            for _ in range(3):
                found = _points(sdk.reader)
            if metrics.source.read():  # pragma: no cover - a machine with a GPU
                not_here("this machine has a GPU that NVML can read")
            assert not any(name.startswith(("hw.", "dl.gpu.")) for name in found)
    lines = [r.getMessage() for r in caplog.records if "device metrics" in r.getMessage()]
    assert len(lines) == 1 and "none are exported" in lines[0]


@pytest.mark.slow
def test_without_nvidia_ml_py_configure_builds_no_device_instrument(tmp_path):
    """configure() asks for device metrics; without the package: one info line for the
    process (two pipelines), and no hw.* instrument beside the pipeline's own."""
    code = (
        "import sys, logging\n"
        "sys.modules['pynvml'] = None\n"  # the package is not importable
        "logging.basicConfig(level=logging.INFO, format='%(name)s %(message)s')\n"
        "from opentelemetry.sdk.metrics.export import InMemoryMetricReader\n"
        "from otel_training import configuration as setup\n"
        "for _ in range(2):\n"
        "    reader = InMemoryMetricReader()\n"
        "    t = setup.configure(environ={'OTEL_METRICS_EXPORTER': 'none',\n"
        "        'OTEL_TRACES_EXPORTER': 'none'}, metric_readers=[reader], set_global=False)\n"
        "    t.meter.create_counter('probe').add(1)\n"
        "    data = reader.get_metrics_data()\n"
        "    own = ('dl.training.', 'otel_training.')\n"
        "    names = [m.name for rm in data.resource_metrics for sm in rm.scope_metrics\n"
        "             for m in sm.metrics if not m.name.startswith(own)]\n"
        "    print('names', sorted(names))\n"
    )
    env = child_env(OTEL_PYTHON_TRAINING_OUTPUT_DIR=str(tmp_path))
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines().count("names ['probe']") == 2
    lines = [line for line in result.stderr.splitlines() if "device metrics" in line]
    assert len(lines) == 1 and "nvidia-ml-py is not installed" in lines[0]


def test_a_forked_child_reports_no_device():
    """After fork the child's source reads nothing: the parent reports the devices."""
    source = NvmlDevices(devices=[0])
    source._pid = -1  # as if this process were the fork of another
    assert source.read() == []


def test_the_devices_of_one_rank_per_gpu_are_its_own(monkeypatch):
    """With as many ranks on the node as visible GPUs, a rank reads only its own GPU; a
    CUDA_VISIBLE_DEVICES list is honoured by index and UUID."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,GPU-abc,1")
    three = RankIdentity(local_rank=1, local_world_size=3)
    assert NvmlDevices(identity=three)._selection(8) == ["GPU-abc"]
    alone = RankIdentity(local_rank=0, local_world_size=1)
    assert NvmlDevices(identity=alone)._selection(8) == [3, "GPU-abc", 1]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert NvmlDevices(identity=alone)._selection(2) == [0, 1]
    assert NvmlDevices(identity=RankIdentity(local_rank=1, local_world_size=2))._selection(2) == [1]


def test_a_real_nvml_read_where_a_gpu_is():
    """On a machine with an NVIDIA GPU, NVML's readings are in range and exported."""
    nvml = import_or_unavailable("pynvml")
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as error:
        not_here(f"no GPU that NVML can read here: {error}")
    sdk = new_in_memory_meter("gpu")
    DeviceMetrics(sdk.meter, NvmlDevices())
    found = _points(sdk.reader)
    for _, _, value in found[hw_metrics.HW_GPU_UTILIZATION]:
        assert 0.0 <= value <= 1.0
    for (_, _, used), (_, _, total) in zip(
        found[hw_metrics.HW_GPU_MEMORY_USAGE], found[hw_metrics.HW_GPU_MEMORY_LIMIT]
    ):
        assert 0 < used <= total
    assert found[DL_GPU_CLOCK_SPEED]


# -- NVML through the fake library (tests/fake_nvml): native units in, OpenTelemetry's out ------

# NVML's return codes (nvml.h), written out so that the tests do not take them from the binding.
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999

# Two GPUs as NVML reports them: %, bytes, mW, mJ, degrees Celsius, MHz.
H100_NVML = {
    "utilization_gpu_percent": 87,
    "memory_total_bytes": 85_899_345_920,  # 80 GiB
    "memory_used_bytes": 21_474_836_480,  # 20 GiB
    "power_mw": 312_456,
    "energy_mj": 9_876_543_210,
    "temperature_c": 67,
    "clock_graphics_mhz": 1_980,
    "clock_sm_mhz": 1_755,
    "clock_memory_mhz": 2_619,
}
A100_NVML = {
    "utilization_gpu_percent": 3,
    "memory_total_bytes": 42_949_672_960,  # 40 GiB
    "memory_used_bytes": 32_212_254_720,  # 30 GiB
    "power_mw": 61_000,
    "energy_mj": 1_500,
    "temperature_c": 35,
    "clock_graphics_mhz": 210,
    "clock_sm_mhz": 1_410,
    "clock_memory_mhz": 1_215,
}
# The same readings in OpenTelemetry's units (1, By, W, J, Cel, Hz), worked out by hand.
H100_OTEL = {
    hw_metrics.HW_GPU_UTILIZATION: 0.87,
    hw_metrics.HW_GPU_MEMORY_USAGE: 21_474_836_480,
    hw_metrics.HW_GPU_MEMORY_LIMIT: 85_899_345_920,
    hw_metrics.HW_GPU_MEMORY_UTILIZATION: 0.25,
    hw_metrics.HW_POWER: 312.456,
    hw_metrics.HW_ENERGY: 9_876_543.21,
    hw_metrics.HW_TEMPERATURE: 67.0,
}
A100_OTEL = {
    hw_metrics.HW_GPU_UTILIZATION: 0.03,
    hw_metrics.HW_GPU_MEMORY_USAGE: 32_212_254_720,
    hw_metrics.HW_GPU_MEMORY_LIMIT: 42_949_672_960,
    hw_metrics.HW_GPU_MEMORY_UTILIZATION: 0.75,
    hw_metrics.HW_POWER: 61.0,
    hw_metrics.HW_ENERGY: 1.5,
    hw_metrics.HW_TEMPERATURE: 35.0,
}
H100_CLOCKS_HZ = {"graphics": 1.98e9, "sm": 1.755e9, "memory": 2.619e9}
A100_CLOCKS_HZ = {"graphics": 2.1e8, "sm": 1.41e9, "memory": 1.215e9}


@pytest.fixture(scope="module")
def fake_nvml_library(tmp_path_factory) -> Path:
    """The fake NVML for this process, built once for this module with the C compiler."""
    return build_fake_nvml(tmp_path_factory.mktemp("nvml"))


@pytest.fixture
def fake_nvml(fake_nvml_library):
    """pynvml's library is the fake for this test: no device until the test adds some."""
    pynvml = import_or_unavailable("pynvml")
    device_metrics._said.clear()
    with installed(pynvml, fake_nvml_library) as fake:
        yield fake


def _two_gpus(fake: FakeNvml) -> None:
    fake.add("GPU-11111111-h100", "NVIDIA H100 80GB HBM3", **H100_NVML)
    fake.add("GPU-22222222-a100", "NVIDIA A100-SXM4-40GB", **A100_NVML)


def _nvml_metrics():
    """A reader and the device metrics of one rank alone on its node, one sample a collection
    (:func:`_collect`)."""
    sdk = new_in_memory_meter("gpu")
    source = NvmlDevices(identity=RankIdentity(local_rank=0, local_world_size=1))
    return sdk.reader, DeviceMetrics(sdk.meter, source, min_interval_s=3600.0)


def _collect(reader, metrics: DeviceMetrics) -> dict[str, list]:
    """One collection from a new sample (the last one made older than the interval)."""
    metrics._taken -= 7200.0
    return _points(reader)


def _by_gpu(found: dict[str, list]) -> dict[str, dict[str, float]]:
    """{hw.id of the GPU: {instrument: value}} (the temperature under its parent GPU)."""
    values: dict[str, dict[str, float]] = {}
    for name, points in found.items():
        if name == DL_GPU_CLOCK_SPEED:
            continue
        for _, attributes, value in points:
            gpu = attributes.get("hw.parent", attributes["hw.id"])
            values.setdefault(gpu, {})[name] = value
    return values


def _clocks(found: dict[str, list]) -> dict[str, dict[str, float]]:
    clocks: dict[str, dict[str, float]] = {}
    for _, attributes, value in found.get(DL_GPU_CLOCK_SPEED, []):
        clocks.setdefault(attributes["hw.id"], {})[attributes["dl.gpu.clock.domain"]] = value
    return clocks


@documents(
    "device-metrics.md",
    "GPU metrics carry `hw.id` (the GPU's UUID), `hw.type` = `gpu`, `hw.name` (the product",
)
@documents("device-metrics.md", "clock speed per `dl.gpu.clock.domain`: `graphics`, `sm`, `memory`")
@documents("device-metrics.md", "GPU die temperature (`nvmlDeviceGetTemperature`)")
@documents(
    "device-metrics.md",
    "energy since the driver was loaded (`nvmlDeviceGetTotalEnergyConsumption`, mJ)",
)
@documents("device-metrics.md", "power draw (`nvmlDeviceGetPowerUsage`, mW)")
@documents("device-metrics.md", "`hw.gpu.memory.utilization` | gauge | `1` | used / total")
@documents("device-metrics.md", "device memory (`.total`)")
@documents("device-metrics.md", "device memory in use (`nvmlDeviceGetMemoryInfo().used`)")
@documents("device-metrics.md", "fraction of the last sample period in which a kernel ran")
def test_nvml_native_units_are_exported_in_opentelemetrys_units(fake_nvml, monkeypatch):
    """%, bytes, mW, mJ, degrees Celsius and MHz from the driver become 1, By, W, J, Cel and Hz,
    per GPU, with the GPU's UUID and NVML's product name (docs/device-metrics.md, Instruments)."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    _two_gpus(fake_nvml)
    reader, metrics = _nvml_metrics()
    found = _collect(reader, metrics)
    assert _by_gpu(found) == {"GPU-11111111-h100": H100_OTEL, "GPU-22222222-a100": A100_OTEL}
    assert _clocks(found) == {
        "GPU-11111111-h100": H100_CLOCKS_HZ,
        "GPU-22222222-a100": A100_CLOCKS_HZ,
    }
    units = {name: {unit for unit, _, _ in points} for name, points in found.items()}
    assert units == {
        hw_metrics.HW_GPU_UTILIZATION: {"1"},
        hw_metrics.HW_GPU_MEMORY_USAGE: {"By"},
        hw_metrics.HW_GPU_MEMORY_LIMIT: {"By"},
        hw_metrics.HW_GPU_MEMORY_UTILIZATION: {"1"},
        hw_metrics.HW_POWER: {"W"},
        hw_metrics.HW_ENERGY: {"J"},
        hw_metrics.HW_TEMPERATURE: {"Cel"},
        DL_GPU_CLOCK_SPEED: {"Hz"},
    }
    (power,) = [a for _, a, v in found[hw_metrics.HW_POWER] if v == 312.456]
    assert power == {
        "hw.id": "GPU-11111111-h100",
        "hw.type": "gpu",
        "hw.name": "NVIDIA H100 80GB HBM3",
        "hw.vendor": "NVIDIA",
    }
    temperatures = {a["hw.id"]: a for _, a, _ in found[hw_metrics.HW_TEMPERATURE]}
    assert temperatures["GPU-22222222-a100/temperature"] == {
        "hw.id": "GPU-22222222-a100/temperature",
        "hw.type": "temperature",
        "hw.parent": "GPU-22222222-a100",
        "hw.sensor_location": "gpu",
        "hw.name": "NVIDIA A100-SXM4-40GB die",
    }


def test_each_collection_reads_the_driver_anew(fake_nvml, monkeypatch):
    """A value that changed in the driver is exported at the next sample, not the first one."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    _two_gpus(fake_nvml)
    reader, metrics = _nvml_metrics()
    _collect(reader, metrics)
    fake_nvml.set(0, power_mw=700_000, utilization_gpu_percent=100, energy_mj=9_876_600_000)
    gpu = _by_gpu(_collect(reader, metrics))["GPU-11111111-h100"]
    assert (gpu[hw_metrics.HW_POWER], gpu[hw_metrics.HW_GPU_UTILIZATION]) == (700.0, 1.0)
    assert gpu[hw_metrics.HW_ENERGY] == 9_876_600.0


def test_a_field_the_device_does_not_support_is_left_out_and_not_asked_again(
    fake_nvml, monkeypatch
):
    """NVML_ERROR_NOT_SUPPORTED for a field of one GPU (one clock domain alone, too) drops that
    series of that GPU only, and the driver is not asked for it again; its other fields and
    the other GPU's same fields go on."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    _two_gpus(fake_nvml)
    fake_nvml.fail(0, "nvmlDeviceGetPowerUsage", NVML_ERROR_NOT_SUPPORTED)
    fake_nvml.fail(0, "nvmlDeviceGetClockInfo", NVML_ERROR_NOT_SUPPORTED, argument=2)  # memory
    for call in (
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetTotalEnergyConsumption",
        "nvmlDeviceGetTemperature",
    ):
        fake_nvml.fail(1, call, NVML_ERROR_NOT_SUPPORTED)
    reader, metrics = _nvml_metrics()
    for _ in range(3):
        found = _collect(reader, metrics)
    assert _by_gpu(found) == {
        "GPU-11111111-h100": {k: v for k, v in H100_OTEL.items() if k != hw_metrics.HW_POWER},
        "GPU-22222222-a100": {hw_metrics.HW_POWER: 61.0},
    }
    assert _clocks(found) == {
        "GPU-11111111-h100": {"graphics": 1.98e9, "sm": 1.755e9},
        "GPU-22222222-a100": A100_CLOCKS_HZ,
    }
    assert fake_nvml.calls(0, "nvmlDeviceGetPowerUsage") == 1
    assert fake_nvml.calls(0, "nvmlDeviceGetClockInfo") == 3 + 3 + 1  # graphics, sm, memory
    assert fake_nvml.calls(1, "nvmlDeviceGetTemperature") == 1
    assert fake_nvml.calls(1, "nvmlDeviceGetPowerUsage") == 3


def test_a_passing_nvml_failure_loses_one_sample_only(fake_nvml, monkeypatch):
    """An error that may pass (NVML_ERROR_UNKNOWN) drops that field from one sample; the next
    sample asks again and exports it."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    _two_gpus(fake_nvml)
    fake_nvml.fail(0, "nvmlDeviceGetTotalEnergyConsumption", NVML_ERROR_UNKNOWN, times=1)
    reader, metrics = _nvml_metrics()
    first = _by_gpu(_collect(reader, metrics))["GPU-11111111-h100"]
    assert hw_metrics.HW_ENERGY not in first and first[hw_metrics.HW_POWER] == 312.456
    second = _by_gpu(_collect(reader, metrics))["GPU-11111111-h100"]
    assert second[hw_metrics.HW_ENERGY] == 9_876_543.21


def test_a_gpu_lost_mid_run_stops_its_series_and_the_others_go_on(fake_nvml, monkeypatch, caplog):
    """NVML_ERROR_GPU_IS_LOST: that GPU's series stop (one warning names it), the driver is
    not asked about it again, the GPU after it is still read, and nothing raises."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    _two_gpus(fake_nvml)
    reader, metrics = _nvml_metrics()
    assert set(_by_gpu(_collect(reader, metrics))) == {"GPU-11111111-h100", "GPU-22222222-a100"}
    fake_nvml.lose(0)
    with caplog.at_level(logging.INFO, logger="otel_training.metrics.device"):
        for _ in range(3):  # the sample that finds it lost, and two after
            found = _collect(reader, metrics)
            assert _by_gpu(found) == {"GPU-22222222-a100": A100_OTEL}
            assert set(_clocks(found)) == {"GPU-22222222-a100"}
    assert fake_nvml.calls(0, "nvmlDeviceGetUtilizationRates") == 2  # the good read, the lost one
    assert fake_nvml.calls(0, "nvmlDeviceGetPowerUsage") == 1
    lines = [r.getMessage() for r in caplog.records if "GPU-11111111-h100" in r.getMessage()]
    assert lines == ["device metrics: GPU-11111111-h100 is lost (GPU is lost); its metrics stop"]
    assert metrics.reads == 4


def test_cuda_visible_devices_chooses_gpus_by_uuid_and_index_in_cudas_order(fake_nvml, monkeypatch):
    """CUDA_VISIBLE_DEVICES by GPU- UUID and index, in its order; the list ends where CUDA's
    does (a UUID no GPU has, a MIG device); with one rank per visible GPU, the rank's own."""
    for uuid in ("GPU-aaaa", "GPU-bbbb", "GPU-cccc"):
        fake_nvml.add(uuid, "NVIDIA L4", **H100_NVML)
    alone = RankIdentity(local_rank=0, local_world_size=1)

    def read_ids(visible: str, identity: RankIdentity = alone) -> list[str]:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        return [sample.id for sample in NvmlDevices(identity=identity).read()]

    assert read_ids("GPU-cccc,0") == ["GPU-cccc", "GPU-aaaa"]
    assert read_ids("GPU-cccc,GPU-0000,1") == ["GPU-cccc"]
    assert read_ids("1,MIG-5c1d1e2a-0000,0") == ["GPU-bbbb"]
    assert read_ids("0,3,1") == ["GPU-aaaa"]  # index 3 of 3 GPUs: no such device
    assert read_ids("2,GPU-aaaa", RankIdentity(local_rank=1, local_world_size=2)) == ["GPU-aaaa"]
    # LOCAL_RANK beyond LOCAL_WORLD_SIZE is no rank of the node's: every visible GPU
    assert read_ids("2,0", RankIdentity(local_rank=2, local_world_size=2)) == [
        "GPU-cccc",
        "GPU-aaaa",
    ]
    assert read_ids("GPU-0000") == []
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # an explicit choice wins over it
    chosen = NvmlDevices(devices=["GPU-bbbb", 2], identity=alone).read()
    assert [sample.id for sample in chosen] == ["GPU-bbbb", "GPU-cccc"]


def test_an_nvml_that_cannot_start_leaves_the_instruments_absent(fake_nvml, caplog, monkeypatch):
    """nvmlInit failing (no driver) or no GPU: no hw.* point, one info line that says why."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    fake_nvml.fail_init(NVML_ERROR_DRIVER_NOT_LOADED)
    with caplog.at_level(logging.INFO, logger="otel_training.metrics.device"):
        reader, metrics = _nvml_metrics()
        assert _collect(reader, metrics) == {} and _collect(reader, metrics) == {}
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "device metrics (hw.gpu.*): NVML is unavailable (Driver Not Loaded); none are exported."
    ]
    fake_nvml.fail_init(0)  # the driver is there, with no GPU
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="otel_training.metrics.device"):
        reader, metrics = _nvml_metrics()
        assert _collect(reader, metrics) == {}
    assert [r.getMessage() for r in caplog.records] == [
        "device metrics (hw.gpu.*): NVML sees no GPU for this process; none are exported."
    ]


def test_a_gpu_that_cannot_be_opened_is_left_out(fake_nvml, caplog, monkeypatch):
    """A GPU lost before the first sample (its handle fails) is left out with one info line;
    the other GPUs are read."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    _two_gpus(fake_nvml)
    fake_nvml.fail(0, "nvmlDeviceGetHandleByIndex_v2", NVML_ERROR_GPU_IS_LOST)
    with caplog.at_level(logging.INFO, logger="otel_training.metrics.device"):
        reader, metrics = _nvml_metrics()
        assert _by_gpu(_collect(reader, metrics)) == {"GPU-22222222-a100": A100_OTEL}
    left_out = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert left_out == ["device metrics: GPU 0 cannot be read (GPU is lost); left out"]


@pytest.mark.slow
def test_configure_reads_gpus_through_libnvidia_ml_so_1(tmp_path):
    """In a process whose loader finds the fake as libnvidia-ml.so.1, configure() exports the
    GPU's readings in OpenTelemetry's units: the binding's own library loading, end to end."""
    import_or_unavailable("pynvml")
    (tmp_path / "driver").mkdir()
    driver = build_fake_nvml(tmp_path / "driver", SONAME)
    code = (
        "import ctypes, sys\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "from fake_nvml import FakeNvml\n"
        "fake = FakeNvml(ctypes.CDLL('libnvidia-ml.so.1'))\n"
        "fake.add('GPU-33333333-b200', 'NVIDIA B200', power_mw=998_001, energy_mj=42,\n"
        "         utilization_gpu_percent=50, temperature_c=80, clock_sm_mhz=1_965,\n"
        "         memory_total_bytes=4_096, memory_used_bytes=1_024)\n"
        "from opentelemetry.sdk.metrics.export import InMemoryMetricReader\n"
        "from otel_training import configuration as setup\n"
        "reader = InMemoryMetricReader()\n"
        "setup.configure(environ={'OTEL_METRICS_EXPORTER': 'none', 'OTEL_TRACES_EXPORTER':\n"
        "    'none'}, metric_readers=[reader], set_global=False)\n"
        "data = reader.get_metrics_data()\n"
        "for m in (m for rm in data.resource_metrics for sm in rm.scope_metrics\n"
        "          for m in sm.metrics if m.name.startswith(('hw.', 'dl.gpu.'))):\n"
        "    for p in m.data.data_points:\n"
        "        print(m.name, m.unit, p.attributes.get('dl.gpu.clock.domain', '-'), p.value)\n"
    )
    env = child_env(
        CUDA_VISIBLE_DEVICES=None,
        LD_LIBRARY_PATH=str(driver.parent),
        OTEL_PYTHON_TRAINING_OUTPUT_DIR=str(tmp_path),
    )
    tests = str(Path(__file__).resolve().parents[1])
    result = subprocess.run(
        [sys.executable, "-c", code, tests], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == [
        "dl.gpu.clock.speed Hz graphics 0.0",
        "dl.gpu.clock.speed Hz memory 0.0",
        "dl.gpu.clock.speed Hz sm 1965000000.0",
        "hw.energy J - 0.042",
        "hw.gpu.memory.limit By - 4096",
        "hw.gpu.memory.usage By - 1024",
        "hw.gpu.memory.utilization 1 - 0.25",
        "hw.gpu.utilization 1 - 0.5",
        "hw.power W - 998.001",
        "hw.temperature Cel - 80.0",
    ]


def test_a_gpu_without_a_name_is_named_gpu(fake_nvml, monkeypatch):
    """When NVML cannot tell a GPU's product name, hw.name is "GPU"; its values still go out."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    _two_gpus(fake_nvml)
    fake_nvml.fail(1, "nvmlDeviceGetName", NVML_ERROR_UNKNOWN)
    reader, metrics = _nvml_metrics()
    names = {a["hw.id"]: a["hw.name"] for _, a, _ in _collect(reader, metrics)[hw_metrics.HW_POWER]}
    assert names == {"GPU-11111111-h100": "NVIDIA H100 80GB HBM3", "GPU-22222222-a100": "GPU"}


def test_uuids_and_names_are_text_from_any_binding_version():
    """Older nvidia-ml-py bindings return bytes, newer ones str: both become the same text."""
    assert device_metrics._text(b"GPU-1234") == "GPU-1234" == device_metrics._text("GPU-1234")


def test_device_metrics_of_an_sdk_set_up_by_hand_read_this_processs_gpus(fake_nvml, monkeypatch):
    """DeviceMetrics(meter) reads NVML by default; observe_devices(meter, identity) reads the
    GPU of that rank (one rank per GPU on the node: its own)."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    _two_gpus(fake_nvml)
    every = new_in_memory_meter("gpu")
    DeviceMetrics(every.meter)
    assert set(_by_gpu(_points(every.reader))) == {"GPU-11111111-h100", "GPU-22222222-a100"}
    own = new_in_memory_meter("gpu")
    observe_devices(own.meter, RankIdentity(local_rank=1, local_world_size=2))
    assert set(_by_gpu(_points(own.reader))) == {"GPU-22222222-a100"}


def test_without_nvidia_ml_py_the_devices_are_absent_with_one_info_line(monkeypatch, caplog):
    """Without the package (not importable in this process): observe_devices builds nothing,
    an NvmlDevices reads nothing, and one info line says which package to install."""
    monkeypatch.setitem(sys.modules, "pynvml", None)
    device_metrics._said.clear()
    meter = new_in_memory_meter("gpu").meter
    with caplog.at_level(logging.INFO, logger="otel_training.metrics.device"):
        assert observe_devices(meter, RankIdentity()) is None
        assert NvmlDevices(devices=[0]).read() == []
    assert [r.getMessage() for r in caplog.records] == [
        "device metrics (hw.gpu.*): nvidia-ml-py is not installed "
        "(pip install nvidia-ml-py: otel-training's extra nvml); none are exported."
    ]


def test_one_sample_serves_one_second_by_default():
    """docs/device-metrics.md: "One sample of every device serves all eight instruments and
    every reader for one second (min_interval_s)": a sample one second old is taken anew."""
    assert inspect.signature(DeviceMetrics).parameters["min_interval_s"].default == 1.0
    metrics = DeviceMetrics(new_in_memory_meter("devices").meter, InMemoryDevices([H100]))
    assert metrics.samples() == (H100,)
    metrics._taken -= 1.0  # the sample is now (at least) one second old
    assert metrics.samples() == (H100,) and metrics.reads == 2


class RecordingMeter:
    """Keeps the keyword arguments of each instrument created, by name."""

    def __init__(self) -> None:
        self.created: dict[str, dict] = {}

    def __getattr__(self, kind: str):
        def create(name, **kwargs):
            self.created[name] = {"kind": kind, **kwargs}

        return create


@documents(
    "device-metrics.md", "The `hw.*` names, units, descriptions and attributes are OpenTelemetry's"
)
def test_instruments_are_described_as_opentelemetrys_conventions_describe_them():
    """Each hw.* instrument's description and unit are those of OpenTelemetry's hardware
    conventions (their create_hw_* functions); the kinds are the conventions' too, observable."""
    ours, theirs = RecordingMeter(), RecordingMeter()
    DeviceMetrics(ours, InMemoryDevices([]))
    for name in DEVICE_METRICS:
        if name == DL_GPU_CLOCK_SPEED:
            continue
        create = getattr(hw_metrics, "create_" + name.replace(".", "_"))
        create(theirs, []) if "callbacks" in inspect.signature(create).parameters else create(
            theirs
        )
        assert ours.created[name]["description"] == theirs.created[name]["description"], name
        assert ours.created[name]["unit"] == theirs.created[name]["unit"], name
        kind = theirs.created[name]["kind"].removeprefix("create_").removeprefix("observable_")
        assert ours.created[name]["kind"] == f"create_observable_{kind}", name
    clock = METRICS[DL_GPU_CLOCK_SPEED]
    assert ours.created[DL_GPU_CLOCK_SPEED]["description"] == clock.description


@documents("device-metrics.md", "`hw.gpu.memory.utilization` | gauge | `1` | used / total")
def test_a_gpu_reporting_no_memory_size_has_no_memory_fraction(in_memory_meter):
    """A total of 0 bytes (or none) gives no hw.gpu.memory.utilization point for that GPU;
    the other GPUs' fractions are exported."""
    zero = DeviceSample(id="GPU-0", name="x", memory_used_bytes=0, memory_total_bytes=0)
    unknown = DeviceSample(id="GPU-9", name="x", memory_used_bytes=None, memory_total_bytes=8)
    DeviceMetrics(in_memory_meter.meter, InMemoryDevices([zero, unknown, H100]))
    fractions = _points(in_memory_meter.reader)[hw_metrics.HW_GPU_MEMORY_UTILIZATION]
    assert [(a["hw.id"], v) for _, a, v in fractions] == [("GPU-1", 0.25)]


class FailingDevices:
    """A device source whose read raises, as a broken binding might."""

    def read(self):
        raise RuntimeError("the binding broke")


def test_a_source_that_fails_loses_its_points_with_one_warning_and_no_sdk_error(
    caplog, in_memory_meter
):
    """A read that raises costs that collection's points: one warning of ours per sample, and
    no callback error for the SDK to log."""
    DeviceMetrics(in_memory_meter.meter, FailingDevices(), min_interval_s=3600.0)
    with caplog.at_level(logging.WARNING):
        assert _points(in_memory_meter.reader) == {}
    assert [(r.name, r.getMessage()) for r in caplog.records] == [
        ("otel_training.metrics.device", "device metrics: reading the devices failed")
    ]


@documents("device-metrics.md", "`dl.gpu.clock.speed` | gauge")
@documents("device-metrics.md", "`hw.temperature` | gauge")
@documents("device-metrics.md", "`hw.energy` | counter")
@documents("device-metrics.md", "`hw.power` | gauge")
@documents("device-metrics.md", "`hw.gpu.memory.limit` | up-down counter")
@documents("device-metrics.md", "`hw.gpu.memory.usage` | up-down counter")
@documents("device-metrics.md", "`hw.gpu.utilization` | gauge")
def test_the_kinds_are_those_of_the_instruments_table():
    """docs/device-metrics.md: utilisation, memory fraction, power, temperature and clocks are
    gauges, memory used and total up-down counters, energy a counter; all observable."""
    meter = RecordingMeter()
    DeviceMetrics(meter, InMemoryDevices([]))
    gauge, up_down, counter = (
        "create_observable_gauge",
        "create_observable_up_down_counter",
        "create_observable_counter",
    )
    assert {name: meter.created[name]["kind"] for name in DEVICE_METRICS} == {
        hw_metrics.HW_GPU_UTILIZATION: gauge,
        hw_metrics.HW_GPU_MEMORY_USAGE: up_down,
        hw_metrics.HW_GPU_MEMORY_LIMIT: up_down,
        hw_metrics.HW_GPU_MEMORY_UTILIZATION: gauge,
        hw_metrics.HW_POWER: gauge,
        hw_metrics.HW_ENERGY: counter,
        hw_metrics.HW_TEMPERATURE: gauge,
        DL_GPU_CLOCK_SPEED: gauge,
    }


@documents(
    "device-metrics.md", "OpenTelemetry defines no GPU clock yet (`hw.cpu.speed` is the CPU's)"
)
def test_opentelemetry_defines_no_gpu_clock_yet():
    """The hardware conventions name the CPU's speed, not a GPU clock: dl.gpu.clock.speed is
    ours, in the registry (when they add one, this fails and the docs and instrument move)."""
    names = [n for n in dir(hw_metrics) if n.startswith("HW_")]
    assert "HW_CPU_SPEED" in names
    assert not [n for n in names if "GPU" in n and any(w in n for w in ("CLOCK", "SPEED", "FREQ"))]
    assert DL_GPU_CLOCK_SPEED == "dl.gpu.clock.speed" and DL_GPU_CLOCK_SPEED in METRICS


def test_a_binding_that_raises_its_own_error_leaves_that_field_out_for_good(fake_nvml, monkeypatch):
    """A binding call that raises something other than an NVMLError (a binding version that
    does not match the driver's) drops that field, which is not asked again; the other fields
    go on."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    _two_gpus(fake_nvml)
    pynvml = import_or_unavailable("pynvml")
    calls = []

    def power_usage(handle):
        calls.append(handle)
        raise TypeError("a binding of another version")

    monkeypatch.setattr(pynvml, "nvmlDeviceGetPowerUsage", power_usage)
    reader, metrics = _nvml_metrics()
    for _ in range(3):
        found = _by_gpu(_collect(reader, metrics))
    assert len(calls) == 2  # once per GPU
    assert found["GPU-11111111-h100"] == {
        k: v for k, v in H100_OTEL.items() if k != hw_metrics.HW_POWER
    }
