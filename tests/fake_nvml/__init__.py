"""The tests' fake NVML: a C library with libnvidia-ml.so.1's ABI (``fake_nvml.c``), built with
the C compiler at test time and loaded by the real ``pynvml`` binding, so that the binding's
ctypes code and our unit conversions run as they do on a GPU machine. ``build()`` compiles it;
:func:`installed` hands it to ``pynvml`` for one test (and gives the binding back its library
after); :class:`FakeNvml` sets devices, values in NVML's native units, and failures.

Why a library rather than a fake ``pynvml`` module: the boundary we do not own is the C ABI.
A fake module would answer in whatever units and types its author assumed; here the binding
turns C structures and return codes into values and ``NVMLError_*`` exceptions itself."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SOURCE = Path(__file__).with_name("fake_nvml.c")
#: The soname of the real library: ``CDLL("libnvidia-ml.so.1")`` in a child process whose
#: ``LD_LIBRARY_PATH`` names the build directory finds this one.
SONAME = "libnvidia-ml.so.1"


def build(directory: Path, name: str = "libfake_nvml.so") -> Path:
    """Compiles the fake into ``directory/name``, with ``name`` as its soname (a skip without a
    C compiler, a failure under ``CI=true``). Loaded in the test process, it must not be named
    :data:`SONAME`: the dynamic loader would hand it to any later ``CDLL(SONAME)``, a real
    NVML read included; a child process finds one named :data:`SONAME` by ``LD_LIBRARY_PATH``.

    Raises:
        subprocess.CalledProcessError: when the compiler rejects the source.
    """
    from support import build_shared_library

    flags = ("-O2", "-Wall", "-Wextra", "-Werror", f"-Wl,-soname,{name}")
    return build_shared_library(SOURCE, directory / name, *flags)


class FakeNvml:
    """The loaded fake: what its devices report and how they fail (NVML's units throughout).

    Args:
        library: The loaded library (``ctypes.CDLL`` of :func:`build`'s output).
    """

    #: Values a device reports, by their name in the fake, in NVML's units.
    VALUES = (
        "utilization_gpu_percent",
        "memory_total_bytes",
        "memory_used_bytes",
        "power_mw",
        "energy_mj",
        "temperature_c",
        "clock_graphics_mhz",
        "clock_sm_mhz",
        "clock_memory_mhz",
    )

    def __init__(self, library: ctypes.CDLL) -> None:
        self.library = library
        library.fake_nvml_add_device.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
        library.fake_nvml_set.argtypes = [ctypes.c_uint, ctypes.c_char_p, ctypes.c_ulonglong]
        failure = [ctypes.c_uint, ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        library.fake_nvml_fail.argtypes = failure
        library.fake_nvml_lose.argtypes = [ctypes.c_uint]
        library.fake_nvml_fail_init.argtypes = [ctypes.c_int]
        library.fake_nvml_calls.argtypes = [ctypes.c_uint, ctypes.c_char_p]
        library.fake_nvml_calls.restype = ctypes.c_long
        library.fake_nvml_reset()

    def add(self, uuid: str, name: str, **values: int) -> int:
        """Adds a device (the next NVML index, returned) reporting ``values``."""
        index = self.library.fake_nvml_add_device(uuid.encode(), name.encode())
        assert index >= 0, "the fake holds 8 devices at most"
        self.set(index, **values)
        return index

    def set(self, index: int, **values: int) -> None:
        """Sets what device ``index`` reports from now on (names of :data:`VALUES`)."""
        for what, value in values.items():
            assert self.library.fake_nvml_set(index, what.encode(), value) == 0, what

    def fail(self, index: int, call: str, error: int, times: int = -1, argument: int = -1) -> None:
        """Makes NVML function ``call`` of device ``index`` return ``error`` (an
        ``NVML_ERROR_*`` code) for the next ``times`` calls, or every call when negative; only
        for clock type or sensor ``argument`` when it is given."""
        outcome = self.library.fake_nvml_fail(index, call.encode(), argument, error, times)
        assert outcome == 0, call

    def lose(self, index: int) -> None:
        """Device ``index`` falls off the bus: every call on it fails with GPU_IS_LOST."""
        assert self.library.fake_nvml_lose(index) == 0

    def fail_init(self, error: int) -> None:
        """``nvmlInit`` fails with ``error`` (no driver, ...)."""
        self.library.fake_nvml_fail_init(error)

    def calls(self, index: int, call: str) -> int:
        """How many times ``call`` was made for device ``index``."""
        return self.library.fake_nvml_calls(index, call.encode())


@contextmanager
def installed(pynvml, library_path: Path) -> Iterator[FakeNvml]:
    """The fake as ``pynvml``'s library for the duration, fresh (no device, not initialised);
    the binding's own library (``None`` until it loads one), function cache and init count
    are given back after, so a real NVML read in a later test still reaches the driver."""
    saved = (pynvml.nvmlLib, dict(pynvml._nvmlGetFunctionPointer_cache), pynvml._nvmlLib_refcount)
    library = ctypes.CDLL(str(library_path))
    fake = FakeNvml(library)
    pynvml.nvmlLib = library
    pynvml._nvmlGetFunctionPointer_cache.clear()
    try:
        yield fake
    finally:
        pynvml.nvmlLib = saved[0]
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlGetFunctionPointer_cache.update(saved[1])
        pynvml._nvmlLib_refcount = saved[2]
