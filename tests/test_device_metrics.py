"""Device metrics: hw.* instruments by OpenTelemetry's names, units and attributes, one sample per
interval on the reader's thread; absent with one info line without NVML or a GPU; a real NVML
read where a GPU is."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    InMemoryMetricReader,
    MetricExporter,
    MetricExportResult,
    PeriodicExportingMetricReader,
)
from opentelemetry.semconv._incubating.metrics import hw_metrics
from support import child_env, import_or_unavailable, not_here

from otel_training import device_metrics
from otel_training.config import RankIdentity
from otel_training.device_metrics import (
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
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
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


def test_instruments_use_opentelemetrys_hardware_names_units_and_attributes():
    """Each value becomes its hw.* instrument, in OTel's unit, with hw.id, hw.type=gpu, hw.name,
    hw.vendor; the temperature is a sensor of the GPU; clocks carry their domain."""
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("devices")
    DeviceMetrics(meter, InMemoryDevices([H100, DeviceSample(id="GPU-2", name="NVIDIA H100")]))
    found = _points(reader)
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
    with caplog.at_level(logging.INFO, logger="otel_training.device_metrics"):
        for _ in range(2):
            reader = InMemoryMetricReader()
            meter = MeterProvider(metric_readers=[reader]).get_meter("devices")
            metrics = observe_devices(meter, RankIdentity())
            assert isinstance(metrics, DeviceMetrics)
            for _ in range(3):
                found = _points(reader)
            if metrics.source.read():  # pragma: no cover - a machine with a GPU
                not_here("this machine has a GPU that NVML can read")
            assert not any(name.startswith(("hw.", "dl.gpu.")) for name in found)
    lines = [r.getMessage() for r in caplog.records if "device metrics" in r.getMessage()]
    assert len(lines) == 1 and "none are exported" in lines[0]


def test_without_nvidia_ml_py_configure_builds_no_device_instrument(tmp_path):
    """configure() asks for device metrics; without the package: one info line for the
    process (two pipelines), and no hw.* instrument beside the pipeline's own."""
    code = (
        "import sys, logging\n"
        "sys.modules['pynvml'] = None\n"  # the package is not importable
        "logging.basicConfig(level=logging.INFO, format='%(name)s %(message)s')\n"
        "from opentelemetry.sdk.metrics.export import InMemoryMetricReader\n"
        "from otel_training import setup\n"
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
    reader = InMemoryMetricReader()
    DeviceMetrics(MeterProvider(metric_readers=[reader]).get_meter("gpu"), NvmlDevices())
    found = _points(reader)
    for _, _, value in found[hw_metrics.HW_GPU_UTILIZATION]:
        assert 0.0 <= value <= 1.0
    for (_, _, used), (_, _, total) in zip(
        found[hw_metrics.HW_GPU_MEMORY_USAGE], found[hw_metrics.HW_GPU_MEMORY_LIMIT]
    ):
        assert 0 < used <= total
    assert found[DL_GPU_CLOCK_SPEED]
