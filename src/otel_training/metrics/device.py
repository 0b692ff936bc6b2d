"""Device metrics: utilisation, memory, power, energy, temperature and clock speeds of the GPUs
this process uses, as observable instruments, read with NVML on the metric reader's thread.

Names, units and attributes are OpenTelemetry's hardware semantic conventions (from the
``opentelemetry-semantic-conventions`` package), one series per GPU (``hw.id``, its UUID):

=================================  =============  ======  ====================================
instrument                         kind           unit    NVML source
=================================  =============  ======  ====================================
``hw.gpu.utilization``             gauge          ``1``   ``nvmlDeviceGetUtilizationRates().gpu``
                                                          / 100, ``hw.gpu.task`` = ``general``
``hw.gpu.memory.usage``            up-down count  ``By``  ``nvmlDeviceGetMemoryInfo().used``
``hw.gpu.memory.limit``            up-down count  ``By``  ``nvmlDeviceGetMemoryInfo().total``
``hw.gpu.memory.utilization``      gauge          ``1``   used / total
``hw.power``                       gauge          ``W``   ``nvmlDeviceGetPowerUsage`` (mW)
``hw.energy``                      counter        ``J``   ``nvmlDeviceGetTotalEnergyConsumption``
                                                          (mJ since the driver was loaded)
``hw.temperature``                 gauge          ``Cel`` ``nvmlDeviceGetTemperature`` (GPU die)
``dl.gpu.clock.speed``             gauge          ``Hz``  ``nvmlDeviceGetClockInfo`` (MHz), per
                                                          ``dl.gpu.clock.domain``
=================================  =============  ======  ====================================

GPU metrics carry ``hw.id``, ``hw.type`` = ``gpu``, ``hw.name`` and ``hw.vendor``; the die
temperature is a sensor of the GPU (``hw.type`` = ``temperature``, ``hw.parent`` = the GPU's
``hw.id``), as the conventions model temperatures. OpenTelemetry defines no GPU clock yet, so
``dl.gpu.clock.speed`` is otel-training's (``semconv/registry/device.yaml``).

Threads: NVML is initialised and read only inside the instruments' callbacks, which the SDK
runs on the metric reader's thread; one sample of every device serves all instruments and
readers for ``min_interval_s`` seconds. Nothing here runs on the training thread (a collection
that training code forces itself, ``force_flush()``, reads where it is called). Without
``nvidia-ml-py`` (the ``nvml`` extra), without a driver or without a GPU the instruments are
absent and one info line says why. In a forked child (a DataLoader worker) they report nothing:
the parent reports the devices.

Which devices: by default those the process can see (``CUDA_VISIBLE_DEVICES``, by index or
``GPU-`` UUID; all of them when unset); when the node runs one rank per visible GPU
(``LOCAL_WORLD_SIZE`` equal to their number, as torchrun without per-rank
``CUDA_VISIBLE_DEVICES``), only the rank's own, ``LOCAL_RANK``.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from opentelemetry.metrics import CallbackOptions, Meter, Observation
from opentelemetry.semconv._incubating.attributes.hw_attributes import (
    HW_GPU_TASK,
    HW_ID,
    HW_NAME,
    HW_PARENT,
    HW_SENSOR_LOCATION,
    HW_TYPE,
    HW_VENDOR,
    HwGpuTaskValues,
    HwTypeValues,
)
from opentelemetry.semconv._incubating.metrics.hw_metrics import (
    HW_ENERGY,
    HW_GPU_MEMORY_LIMIT,
    HW_GPU_MEMORY_USAGE,
    HW_GPU_MEMORY_UTILIZATION,
    HW_GPU_UTILIZATION,
    HW_POWER,
    HW_TEMPERATURE,
)

from otel_training import config
from otel_training._log_once import MINUTE_S, LogOnce
from otel_training.config import RankIdentity
from otel_training.semconv.attributes import DL_GPU_CLOCK_DOMAIN
from otel_training.semconv.metrics import DL_GPU_CLOCK_SPEED, METRICS

__all__ = [
    "DEVICE_METRICS",
    "DeviceMetrics",
    "DeviceSample",
    "DeviceSource",
    "NvmlDevices",
    "observe_devices",
]

#: Why there are no device metrics when pynvml cannot be imported.
_NO_NVML = "nvidia-ml-py is not installed (pip install nvidia-ml-py: otel-training's extra nvml)"

_logger = logging.getLogger(__name__)
# A failed read is said at most once a minute (the reader's thread reads at every collection);
# that the devices are absent, once per process and cause, at INFO.
_failed = LogOnce(_logger, interval_s=MINUTE_S, exc_info=True)
_said = LogOnce(_logger, level=logging.INFO)

#: Every instrument name, in the order they are created.
DEVICE_METRICS: tuple[str, ...] = (
    HW_GPU_UTILIZATION,
    HW_GPU_MEMORY_USAGE,
    HW_GPU_MEMORY_LIMIT,
    HW_GPU_MEMORY_UTILIZATION,
    HW_POWER,
    HW_ENERGY,
    HW_TEMPERATURE,
    DL_GPU_CLOCK_SPEED,
)

_CLOCK_DOMAINS = ("graphics", "sm", "memory")


@dataclass(frozen=True)
class DeviceSample:
    """One reading of one GPU; a value that the device does not report is ``None``.

    Attributes:
        id: ``hw.id``: the GPU's UUID (``GPU-...``), unique on the host.
        name: ``hw.name``: the product name (``NVIDIA H100 80GB HBM3``).
        vendor: ``hw.vendor``.
        utilization: Fraction of the last sample period in which a kernel ran, 0 to 1.
        memory_used_bytes: Device memory in use, bytes.
        memory_total_bytes: Device memory, bytes.
        power_w: Power draw, watts.
        energy_j: Energy consumed since the driver was loaded, joules (monotonic).
        temperature_cel: Die temperature, degrees Celsius.
        clocks_hz: Clock speed per domain (``graphics``, ``sm``, ``memory``), hertz.
    """

    id: str
    name: str
    vendor: str = "NVIDIA"
    utilization: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    power_w: float | None = None
    energy_j: float | None = None
    temperature_cel: float | None = None
    clocks_hz: Mapping[str, float] = field(default_factory=dict)


class DeviceSource(Protocol):
    """Where device readings come from (:class:`NvmlDevices`, or a test's in-memory source)."""

    def read(self) -> Sequence[DeviceSample]:
        """One sample of every device; ``[]`` when none can be read. Must not raise."""
        ...


class NvmlDevices:
    """Reads GPUs with NVML (``nvidia-ml-py``); implements :class:`DeviceSource`.

    Args:
        devices: NVML indices or UUIDs to read; ``None``: the devices of this process (see
            the module docstring).
        identity: The rank identity, for choosing the rank's own device; default: detected.

    NVML is initialised on the first :meth:`read` (the reader's thread). When it cannot be (no
    package, no driver, no GPU), one info line says why and every read returns ``[]``. Never
    raises.
    """

    def __init__(
        self, devices: Sequence[int | str] | None = None, identity: RankIdentity | None = None
    ) -> None:
        self._wanted = None if devices is None else list(devices)
        self._identity = identity
        self._nvml: Any = None
        self._handles: list[tuple[Any, str, str]] = []
        self._state = "new"  # new -> ready | absent
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._unsupported: set[tuple[Any, ...]] = set()  # (GPU, NVML function, its arguments)
        self._permanent: frozenset[Any] = frozenset()
        self._lost: set[str] = set()

    def read(self) -> Sequence[DeviceSample]:
        if os.getpid() != self._pid:  # a forked child: the parent reports the devices
            return []
        with self._lock:
            if self._state == "new":
                self._start()
            if self._state != "ready":
                return []
            samples = []
            for handle, uuid, name in self._handles:
                if uuid in self._lost:
                    continue
                try:
                    samples.append(self._sample(handle, uuid, name))
                except _GpuLost:
                    continue
            return samples

    def _start(self) -> None:
        try:
            nvml = importlib.import_module("pynvml")
        except ImportError:
            self._absent(_NO_NVML)
            return
        try:
            nvml.nvmlInit()
            count = nvml.nvmlDeviceGetCount()
        except Exception as error:  # NVMLError: no driver, no GPU
            self._absent(f"NVML is unavailable ({error})")
            return
        handles = []
        for wanted in self._selection(count):
            try:
                if isinstance(wanted, str) and not wanted.isdigit():
                    handle = nvml.nvmlDeviceGetHandleByUUID(wanted)
                else:
                    handle = nvml.nvmlDeviceGetHandleByIndex(int(wanted))
                uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            except Exception as error:
                if isinstance(error, nvml.NVMLError) and error.value == nvml.NVML_ERROR_NOT_FOUND:
                    break  # a UUID that no GPU has: CUDA sees no device from there on
                _logger.info("device metrics: GPU %s cannot be read (%s); left out", wanted, error)
                continue
            handles.append((handle, uuid, _name(nvml, handle)))
        if not handles:
            self._absent("NVML sees no GPU for this process")
            return
        self._permanent = frozenset(getattr(nvml, code) for code in _PERMANENT_ERRORS)
        self._nvml, self._handles, self._state = nvml, handles, "ready"
        _logger.info(
            "device metrics: reading %d GPU(s) with NVML: %s",
            len(handles),
            ", ".join(f"{name} ({uuid})" for _, uuid, name in handles),
        )

    def _selection(self, count: int) -> list[int | str]:
        if self._wanted is not None:
            return self._wanted
        visible: list[int | str] = list(range(count))
        entries = config.cuda_visible_devices()
        if entries is not None:
            visible = []
            for entry in entries:
                if entry.isdigit() and int(entry) < count:
                    visible.append(int(entry))
                elif entry.startswith("GPU-"):
                    visible.append(entry)
                else:  # a MIG device or an invalid entry: CUDA stops at the first one
                    break
        identity = self._identity or config.load_identity()
        if len(visible) == identity.local_world_size and identity.local_rank < len(visible):
            return [visible[identity.local_rank]]  # one rank per visible GPU: its own
        return visible

    def _absent(self, why: str) -> None:
        self._state = "absent"
        _say_absent(why)

    def _sample(self, handle: Any, uuid: str, name: str) -> DeviceSample:
        nvml = self._nvml
        rates = self._get(uuid, nvml.nvmlDeviceGetUtilizationRates, handle)
        memory = self._get(uuid, nvml.nvmlDeviceGetMemoryInfo, handle)
        power_mw = self._get(uuid, nvml.nvmlDeviceGetPowerUsage, handle)
        energy_mj = self._get(uuid, nvml.nvmlDeviceGetTotalEnergyConsumption, handle)
        temperature = self._get(
            uuid, nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU
        )
        clocks = {}
        for domain, clock in zip(
            _CLOCK_DOMAINS, (nvml.NVML_CLOCK_GRAPHICS, nvml.NVML_CLOCK_SM, nvml.NVML_CLOCK_MEM)
        ):
            mhz = self._get(uuid, nvml.nvmlDeviceGetClockInfo, handle, clock)
            if mhz is not None:
                clocks[domain] = float(mhz) * 1e6
        return DeviceSample(
            id=uuid,
            name=name,
            utilization=None if rates is None else rates.gpu / 100.0,
            memory_used_bytes=None if memory is None else int(memory.used),
            memory_total_bytes=None if memory is None else int(memory.total),
            power_w=None if power_mw is None else power_mw / 1000.0,
            energy_j=None if energy_mj is None else energy_mj / 1000.0,
            temperature_cel=None if temperature is None else float(temperature),
            clocks_hz=clocks,
        )

    def _get(self, uuid: str, read: Callable[..., Any], handle: Any, *args: Any) -> Any:
        """``read(handle, *args)``, or ``None`` when NVML cannot tell: a field the device
        does not have (NOT_SUPPORTED, NO_PERMISSION...) is not asked again, a passing failure
        (TIMEOUT, UNKNOWN...) is asked again at the next sample.

        Raises:
            _GpuLost: when the GPU fell off the bus (GPU_IS_LOST): it is not read again.
        """
        field = (uuid, read.__name__, *args)
        if field in self._unsupported:
            return None
        try:
            return read(handle, *args)
        except Exception as error:
            nvml = self._nvml
            code = error.value if isinstance(error, nvml.NVMLError) else None
            if code == nvml.NVML_ERROR_GPU_IS_LOST:
                self._lost.add(uuid)
                _logger.warning("device metrics: %s is lost (%s); its metrics stop", uuid, error)
                raise _GpuLost from error
            if code is not None and code not in self._permanent:
                _logger.debug("device metrics: %s failed this time: %s", field, error)
                return None
            self._unsupported.add(field)
            _logger.debug("device metrics: %s is not available: %s", field, error)
            return None


class _GpuLost(Exception):
    """A GPU that NVML says is lost (``NVML_ERROR_GPU_IS_LOST``): no more samples of it."""


#: NVML's errors that say a field cannot be read on this device, ever (the rest may pass).
_PERMANENT_ERRORS = (
    "NVML_ERROR_NOT_SUPPORTED",
    "NVML_ERROR_NO_PERMISSION",
    "NVML_ERROR_FUNCTION_NOT_FOUND",
    "NVML_ERROR_INVALID_ARGUMENT",
)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _name(nvml: Any, handle: Any) -> str:
    try:
        return _text(nvml.nvmlDeviceGetName(handle))
    except Exception:
        return "GPU"


class DeviceMetrics:
    """The observable instruments of :data:`DEVICE_METRICS` on ``meter``, fed by ``source``.

    Args:
        meter: Where the instruments go.
        source: The readings (default: :class:`NvmlDevices` of this process).
        min_interval_s: A sample is reused by every instrument and reader for this many
            seconds (a collection reads every instrument; several readers collect).

    Callbacks run on the metric reader's thread; each reads the sample (taking a new one at
    most once per ``min_interval_s``) and never raises: a source that fails loses its points
    for that collection.
    """

    def __init__(
        self,
        meter: Meter,
        source: DeviceSource | None = None,
        *,
        min_interval_s: float = 1.0,
    ) -> None:
        self.source = source if source is not None else NvmlDevices()
        self._min_interval_s = min_interval_s
        self._sample: Sequence[DeviceSample] = ()
        self._taken = -float("inf")
        self._lock = threading.Lock()
        self.reads = 0  # samples taken, for tests and benchmarks
        observations = {
            HW_GPU_UTILIZATION: self._utilization,
            HW_GPU_MEMORY_USAGE: self._memory_used,
            HW_GPU_MEMORY_LIMIT: self._memory_total,
            HW_GPU_MEMORY_UTILIZATION: self._memory_fraction,
            HW_POWER: self._power,
            HW_ENERGY: self._energy,
            HW_TEMPERATURE: self._temperature,
            DL_GPU_CLOCK_SPEED: self._clocks,
        }
        for name in DEVICE_METRICS:
            kind, unit, description = _INSTRUMENTS[name]
            create = getattr(meter, kind)
            try:
                create(
                    name,
                    callbacks=[self._callback(observations[name])],
                    unit=unit,
                    description=description,
                )
            except Exception:
                _logger.warning("device metrics: could not create %s", name, exc_info=True)

    def samples(self) -> Sequence[DeviceSample]:
        """The current sample, taken now if the last one is ``min_interval_s`` old."""
        with self._lock:
            now = time.monotonic()
            if now - self._taken >= self._min_interval_s:
                self._taken = now
                try:
                    self._sample = tuple(self.source.read())
                except Exception:
                    _failed("read", "device metrics: reading the devices failed")
                    self._sample = ()
                self.reads += 1
            return self._sample

    def _callback(self, observe: Callable[[DeviceSample], Iterable[Observation]]):
        def callback(options: CallbackOptions) -> list[Observation]:
            found: list[Observation] = []
            for sample in self.samples():
                found.extend(observe(sample))
            return found

        return callback

    @staticmethod
    def _gpu(sample: DeviceSample, **extra: str) -> dict[str, str]:
        return {
            HW_ID: sample.id,
            HW_TYPE: HwTypeValues.GPU.value,
            HW_NAME: sample.name,
            HW_VENDOR: sample.vendor,
            **extra,
        }

    def _utilization(self, sample: DeviceSample):
        if sample.utilization is not None:
            task = {HW_GPU_TASK: HwGpuTaskValues.GENERAL.value}
            yield Observation(sample.utilization, self._gpu(sample, **task))

    def _memory_used(self, sample: DeviceSample):
        if sample.memory_used_bytes is not None:
            yield Observation(sample.memory_used_bytes, self._gpu(sample))

    def _memory_total(self, sample: DeviceSample):
        if sample.memory_total_bytes is not None:
            yield Observation(sample.memory_total_bytes, self._gpu(sample))

    def _memory_fraction(self, sample: DeviceSample):
        if sample.memory_used_bytes is not None and sample.memory_total_bytes:
            fraction = sample.memory_used_bytes / sample.memory_total_bytes
            yield Observation(fraction, self._gpu(sample))

    def _power(self, sample: DeviceSample):
        if sample.power_w is not None:
            yield Observation(sample.power_w, self._gpu(sample))

    def _energy(self, sample: DeviceSample):
        if sample.energy_j is not None:
            yield Observation(sample.energy_j, self._gpu(sample))

    def _temperature(self, sample: DeviceSample):
        if sample.temperature_cel is not None:
            attributes = {
                HW_ID: f"{sample.id}/temperature",
                HW_TYPE: HwTypeValues.TEMPERATURE.value,
                HW_PARENT: sample.id,
                HW_SENSOR_LOCATION: "gpu",
                HW_NAME: f"{sample.name} die",
            }
            yield Observation(sample.temperature_cel, attributes)

    def _clocks(self, sample: DeviceSample):
        for domain, hz in sample.clocks_hz.items():
            yield Observation(hz, {HW_ID: sample.id, DL_GPU_CLOCK_DOMAIN: domain})


# name -> (Meter method, unit, description), as OpenTelemetry's conventions define them.
_INSTRUMENTS: dict[str, tuple[str, str, str]] = {
    HW_GPU_UTILIZATION: (
        "create_observable_gauge",
        "1",
        "Fraction of time spent in a specific task.",
    ),
    HW_GPU_MEMORY_USAGE: ("create_observable_up_down_counter", "By", "GPU memory used."),
    HW_GPU_MEMORY_LIMIT: ("create_observable_up_down_counter", "By", "Size of the GPU memory."),
    HW_GPU_MEMORY_UTILIZATION: ("create_observable_gauge", "1", "Fraction of GPU memory used."),
    HW_POWER: (
        "create_observable_gauge",
        "W",
        "Instantaneous power consumed by the component.",
    ),
    HW_ENERGY: ("create_observable_counter", "J", "Energy consumed by the component."),
    HW_TEMPERATURE: ("create_observable_gauge", "Cel", "Temperature in degrees Celsius."),
    DL_GPU_CLOCK_SPEED: (
        "create_observable_gauge",
        METRICS[DL_GPU_CLOCK_SPEED].unit,
        METRICS[DL_GPU_CLOCK_SPEED].description,
    ),
}


def observe_devices(meter: Meter, identity: RankIdentity | None = None) -> DeviceMetrics | None:
    """The device metrics of this process on ``meter``, if NVML's Python package is installed;
    else ``None``, with one info line. What :func:`otel_training.configuration.configure` calls for
    the pipelines it builds. Never raises; reads nothing on the calling thread.

    Args:
        meter: The meter of the pipeline.
        identity: The rank identity (for choosing the rank's own GPU); default: detected.
    """
    try:
        if importlib.util.find_spec("pynvml") is None:
            _say_absent(_NO_NVML)
            return None
        return DeviceMetrics(meter, NvmlDevices(identity=identity))
    except Exception:
        _logger.warning("device metrics could not be set up", exc_info=True)
        return None


def _say_absent(why: str) -> None:
    """One info line per process and cause: the device metrics are absent, and why."""
    _said(why, "device metrics (hw.gpu.*): %s; none are exported.", why)
