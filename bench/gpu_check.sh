#!/usr/bin/env bash
# The GPU check of otel-training, for a machine with a CUDA device (make gpu-check).
#
#   bash bench/gpu_check.sh            # PYTHON=/path/to/python to choose the interpreter
#
# 1. Sync-free training step: the demo model trains on the GPU with tensor metrics due every
#    step and record_training_metrics fed CUDA tensors (the deferred-read path), under
#    torch.cuda.set_sync_debug_mode("error"): any host synchronisation on the training thread
#    raises. Then the published values are compared with torch on the same tensors.
# 2. Executor vs naive per due step (.norm().item() per tensor, as training scripts do it),
#    synchronised timing, target >= 20x. A due step that the executor drops because copies are
#    still in flight is a failure, not saved time: the dropped count is printed.
# 3. Device metrics: a real NVML read of hw.gpu.* (needs nvidia-ml-py; installed if missing
#    and the package index is reachable).
#
# Exit status 0 when every check passes, 1 when one fails, 2 when it cannot run here. It runs
# in well under 8 minutes on one H200 (most of it importing torch and warming up).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2

PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  for candidate in .venv/bin/python python3 python; do
    if command -v "$candidate" >/dev/null 2>&1 \
      && "$candidate" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' \
        >/dev/null 2>&1; then
      PY="$candidate"
      break
    fi
  done
fi
if [ -z "$PY" ] && [ "${GPU_CHECK_ALLOW_CPU:-}" = "1" ]; then
  PY=.venv/bin/python  # a dry run of the script's own logic on the CPU (no sync checks)
fi
if [ -z "$PY" ]; then
  echo "gpu_check: no Python with a CUDA build of torch and a visible GPU (set PYTHON=...)"
  exit 2
fi
echo "gpu_check: python $("$PY" -c 'import sys; print(sys.executable, sys.version.split()[0])')"

importable() { "$PY" -c 'import otel_training.configuration, otel_training.tensor' >/dev/null 2>&1; }
if ! importable; then
  echo "gpu_check: installing otel-training (pip install -e .)"
  "$PY" -m pip install -q --no-build-isolation -e . 2>&1 | tail -n 3
  importable || "$PY" -m pip install -q -e . 2>&1 | tail -n 3
fi
if ! importable; then
  export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
fi
if ! importable; then
  echo "gpu_check: otel-training's dependencies are missing and could not be installed:"
  "$PY" -c 'import otel_training.configuration, otel_training.tensor' 2>&1 | tail -n 2
  exit 2
fi
if ! "$PY" -c 'import pynvml' >/dev/null 2>&1; then
  echo "gpu_check: installing nvidia-ml-py for the device metrics"
  "$PY" -m pip install -q 'nvidia-ml-py>=12' 2>&1 | tail -n 2
fi

timeout 420 "$PY" - <<'PYTHON'
import math
import os
import statistics
import sys
import threading
import time

import torch
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_training import instruments
from otel_training.demo.model import GPT, GPTConfig
from otel_training.metrics.instruments import record_training_metrics
from otel_training.tensor import TensorObserver, canonical_name, default_layer_of

cuda = torch.cuda.is_available()
if not cuda and os.environ.get("GPU_CHECK_ALLOW_CPU") != "1":
    print("gpu_check: no CUDA device")
    sys.exit(2)
device = torch.device("cuda" if cuda else "cpu")
failures: list[str] = []


def check(ok: bool, what: str) -> None:
    print(("PASS " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def points(reader) -> dict[str, list]:
    found: dict[str, list] = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                found.setdefault(metric.name, []).extend(
                    (dict(p.attributes), getattr(p, "value", getattr(p, "sum", None)))
                    for p in metric.data.data_points
                )
    return found


name = torch.cuda.get_device_name(device) if cuda else "cpu (dry run)"
print(f"gpu_check: device {name}, torch {torch.__version__}", flush=True)

# -- 1. a training step without host synchronisation ---------------------------------------
torch.manual_seed(0)
model = GPT(GPTConfig(seq_len=128)).to(device)
reader = InMemoryMetricReader()
meter = MeterProvider(metric_readers=[reader]).get_meter("gpu-check")
schedule = (
    "grad_norm:1,param_norm:1,grad_nonfinite:1,update_ratio:1,activation_rms:1,"
    "activation_max_abs:1,residual_rms:1,logits_norm:1"
)
observer = TensorObserver(model, schedule, meter=meter)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
inputs = torch.randint(0, 256, (16, 128), device=device)
targets = torch.randint(0, 256, (16, 128), device=device)


committed: dict[str, torch.Tensor] = {}


def training_step(step: int, keep: bool = False) -> torch.Tensor:
    observer.begin_step(step)
    logits = model(inputs)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 256).float(), targets.reshape(-1))
    loss.backward()
    observer.commit()
    if keep:  # the gradients the tensor metrics read, before clipping changes them
        committed.update({n: p.grad.detach().clone() for n, p in model.named_parameters()})
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    record_training_metrics(
        meter,
        step_duration_ms=100.0,
        loss=loss.detach(),  # CUDA tensors: copied to pinned memory, read on another thread
        grad_norm=norm,
        learning_rate=1e-3,
        tokens_per_sec=1000.0,
        memory_allocated_gb=torch.cuda.memory_allocated(device) / 2**30 if cuda else None,
    )
    return norm


for step in range(1, 6):  # warm up: allocators, pinned buffers, kernels
    training_step(step)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
if cuda:
    torch.cuda.synchronize()
observer.flush(30.0)
instruments.flush_deferred(30.0)

raised = None
steps = 20
try:
    for step in range(6, 6 + steps):
        if cuda:
            torch.cuda.set_sync_debug_mode("error")
        try:
            training_step(step, keep=step == 5 + steps)
        finally:
            if cuda:
                torch.cuda.set_sync_debug_mode("default")
        optimizer.step()  # outside the check: the optimizer is not telemetry
        optimizer.zero_grad(set_to_none=True)
except RuntimeError as error:
    raised = error
check(
    raised is None,
    f"{steps} training steps (tensor metrics due every step, record_training_metrics with CUDA "
    f"tensors) under set_sync_debug_mode('error'): "
    + ("no host synchronisation" if raised is None else f"raised {raised!r}"),
)
if cuda:
    torch.cuda.synchronize()
landed = observer.flush(30.0) and instruments.flush_deferred(30.0)
stats = observer.executor.stats
check(landed, "every device-to-host copy landed and was published (flush)")
check(
    stats.host_copies == stats.due_steps and stats.dropped == 0 and stats.failures == 0,
    f"one host copy per due step: {stats.host_copies} copies, {stats.due_steps} due steps, "
    f"{stats.dropped} dropped, {stats.failures} failures",
)
found = points(reader)
if committed:
    store = observer.executor.published
    values = {a["megatron.training.layer"]: v for a, v in store.observe(
        "megatron.training.tensor.grad_norm")}
    expected: dict[str, float] = {}
    total = 0.0
    for param_name, grad in committed.items():
        square = float(grad.double().square().sum())
        total += square
        layer = default_layer_of(canonical_name(param_name))
        if layer is not None:
            expected[layer] = expected.get(layer, 0.0) + square
    expected = {k: math.sqrt(v) for k, v in expected.items()}
    expected["global"] = math.sqrt(total)
    close = expected.keys() == values.keys() and all(
        math.isclose(values[k], v, rel_tol=1e-4) for k, v in expected.items()
    )
    check(close, f"published grad norms equal torch's on the last step's gradients: {values}")
for name_ in ("megatron.training.loss", "megatron.training.grad_norm"):
    check(bool(found.get(name_)), f"{name_} recorded through the deferred read")

# -- 2. executor vs naive per due step ------------------------------------------------------
sys.path.insert(0, "bench")
from tensor_metrics import _Setup  # noqa: E402

bench = _Setup(device, batch=16, seq_len=128)


def sync() -> None:
    if cuda:
        torch.cuda.synchronize()


for _ in range(10):
    bench.executor()
    bench.naive()
sync()
bench.observer.flush(30.0)
executor_stats = bench.observer.executor.stats
dropped_before, due_before = executor_stats.dropped, executor_stats.due_steps
times: dict[str, list[float]] = {"executor": [], "naive": [], "bare": []}
rounds, reps = 30, 10
for _ in range(rounds):
    for label, function in (("executor", bench.executor), ("naive", bench.naive),
                            ("bare", bench.bare)):
        sync()
        start = time.perf_counter()
        for _ in range(reps):
            function()
        sync()
        times[label].append((time.perf_counter() - start) / reps)
        if label == "executor":
            bench.observer.flush(30.0)  # outside the timed region: nothing left in flight
dropped = executor_stats.dropped - dropped_before
due = executor_stats.due_steps - due_before
ratio = statistics.median(n / e for n, e in zip(times["naive"], times["executor"]))
medians = {k: statistics.median(v) * 1e6 for k, v in times.items()}
print(
    "time per due step (synchronised, median of rounds): "
    + ", ".join(f"{k} {v:.0f} us" for k, v in medians.items()),
    flush=True,
)
check(dropped == 0, f"executor due steps dropped while copies were in flight: {dropped} of "
      f"{due + dropped}")
check(ratio >= 20.0, f"naive / executor = {ratio:.1f}x per due step (target >= 20)")

# -- 3. device metrics through NVML ---------------------------------------------------------
try:
    import pynvml  # noqa: F401
except ImportError:
    check(False, "device metrics: nvidia-ml-py is not installed (pip install nvidia-ml-py)")
else:
    from otel_training.metrics.device import DEVICE_METRICS, DeviceMetrics, NvmlDevices

    device_reader = InMemoryMetricReader()
    source = NvmlDevices()
    DeviceMetrics(MeterProvider(metric_readers=[device_reader]).get_meter("hw"), source)
    collected: dict[str, list] = {}

    def collect() -> None:  # as the SDK does: on the reader's thread
        collected.update(points(device_reader))

    reader_thread = threading.Thread(target=collect, name="reader")
    reader_thread.start()
    reader_thread.join(60)
    for metric in DEVICE_METRICS:
        series = collected.get(metric, [])
        shown = ", ".join(f"{v:.4g}" for _, v in series[:4])
        print(f"  {metric}: {len(series)} series [{shown}]")
    gpus = {a.get("hw.id") for a, _ in collected.get("hw.gpu.utilization", [])}
    check(bool(gpus), f"device metrics read with NVML for {len(gpus)} GPU(s): {sorted(gpus)}")
    util = [v for _, v in collected.get("hw.gpu.utilization", [])]
    used = [v for _, v in collected.get("hw.gpu.memory.usage", [])]
    limit = [v for _, v in collected.get("hw.gpu.memory.limit", [])]
    check(
        all(0.0 <= u <= 1.0 for u in util)
        and all(0 < u <= t for u, t in zip(used, limit))
        and bool(collected.get("dl.gpu.clock.speed")),
        "utilisation in [0, 1], memory used <= total, clocks reported",
    )

print(f"gpu_check: {'FAILED: ' + '; '.join(failures) if failures else 'all checks passed'}")
sys.exit(1 if failures else 0)
PYTHON
status=$?
if [ "$status" -eq 124 ]; then
  echo "gpu_check: timed out"
fi
exit "$status"
