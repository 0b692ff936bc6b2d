"""SIGTERM into real frameworks that handle it themselves, with telemetry on: Lightning's
trainer (SIGTERM, and SLURM's requeue signal with auto-requeue) and a Megatron-LM-style
exit-signal handler on two gloo ranks. The framework's graceful path completes (its
checkpoint is written), the exit status is the program's, and the last interval arrives at a
real OTLP receiver."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from otlp_receiver import free_port
from support import child_env, gloo_or_unavailable, import_or_unavailable

from otel_training.semconv.attributes import OTEL_TRAINING_SPAN_TRUNCATED

LIGHTNING_FIT = textwrap.dedent(
    """
    import signal, sys
    from pathlib import Path
    sys.path.insert(0, "tests/integration")
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    import lightning.pytorch as L
    from lightning.fabric.plugins.environments import SLURMEnvironment
    from lightning.pytorch.callbacks import OnExceptionCheckpoint
    import lightning_run
    import otel_training as ot
    from otel_training.integrations.lightning import OtelTrainingCallback

    root, variant = Path(sys.argv[1]), sys.argv[2]
    ot.configure()    # before fit(), where the Trainer sets its own signal handlers
    interrupted = ot.get_meter("program").create_counter("program.interrupted_fits")

    class Probe(L.Callback):
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step == 3 and not getattr(self, "said", False):
                self.said = True
                print("ready", flush=True)

        def on_exception(self, trainer, module, exception):    # the graceful path
            interrupted.add(1, {"exception": type(exception).__name__})

    plugins = []
    if variant == "slurm":
        plugins = [SLURMEnvironment(auto_requeue=True, requeue_signal=signal.SIGUSR1)]
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_steps=1_000_000, logger=False,
        enable_progress_bar=False, enable_model_summary=False,
        limit_val_batches=0, num_sanity_val_steps=0, default_root_dir=str(root),
        plugins=plugins,
        callbacks=[OtelTrainingCallback(tensor_metrics="none"), Probe(),
                   OnExceptionCheckpoint(str(root))],
    )
    torch.set_num_threads(1)
    rows = lightning_run.corpus(16, 96)
    trainer.fit(lightning_run.build_module("lightning"),
                DataLoader(TensorDataset(rows), batch_size=4))
    """
)

SCONTROL = '#!/bin/sh\necho "$@" >> "{calls}"\n'


def _env(repo_root: Path, **extra: str) -> dict[str, str]:
    return child_env(extra, drop=("SLURM_",), OMP_NUM_THREADS="1")


def _wait_for(condition, what: str, children: list[subprocess.Popen], timeout_s: float = 60.0):
    """Polls ``condition()`` until true; fails after ``timeout_s`` (a generous bound) or when a
    child ends first."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        for child in children:
            if child.poll() is not None:
                pytest.fail(f"a child ended (status {child.returncode}) before {what}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {timeout_s:g} s")
        time.sleep(0.05)


def _finish(children: list[subprocess.Popen], timeout_s: float = 60.0) -> list[str]:
    """Waits for every child (a hang fails the test); returns their stderr."""
    try:
        for child in children:
            try:
                child.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                pytest.fail("a child hung after SIGTERM")
        return [child.stderr.read() for child in children]
    finally:
        for child in children:
            child.kill()
            child.wait()


@pytest.mark.parametrize("variant", ["sigterm", "slurm"])
def test_lightning_saves_and_exits_as_it_decides_with_telemetry_on(
    otlp_receiver, repo_root, tmp_path, variant
):
    """Lightning's trainer on SIGTERM (and, under SLURM auto-requeue, on the requeue signal
    first: HPC checkpoint and ``scontrol requeue``): its SIGTERMException path runs
    OnExceptionCheckpoint, the process exits 0 as Lightning decides, and what the graceful
    path recorded arrives with the last training metrics."""
    import_or_unavailable("lightning")
    env = {**otlp_receiver.env("grpc"), "OTEL_METRIC_EXPORT_INTERVAL": "60000"}
    calls = tmp_path / "scontrol.calls"
    if variant == "slurm":
        stub = tmp_path / "bin" / "scontrol"
        stub.parent.mkdir()
        stub.write_text(SCONTROL.format(calls=calls))
        stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
        env.update(
            PATH=f"{stub.parent}{os.pathsep}{os.environ['PATH']}",
            SLURM_JOB_ID="4242",
            SLURM_JOB_NAME="train",
            SLURM_NTASKS="1",
            SLURM_PROCID="0",
            SLURM_LOCALID="0",
            SLURM_NODEID="0",
        )
    child = subprocess.Popen(
        [sys.executable, "-c", LIGHTNING_FIT, str(tmp_path), variant],
        cwd=repo_root,
        env=_env(repo_root, **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "ready", child.stderr.read()[-3000:]
        if variant == "slurm":
            child.send_signal(signal.SIGUSR1)  # SLURM's --signal=USR1@N before the time limit
            _wait_for(calls.is_file, "scontrol requeue", [child])
        child.send_signal(signal.SIGTERM)
    finally:
        (stderr,) = _finish([child])
    assert child.returncode == 0, stderr[-3000:]
    assert (tmp_path / "on_exception.ckpt").is_file()
    if variant == "slurm":
        assert calls.read_text().split() == ["requeue", "4242"]
        assert list(tmp_path.glob("hpc_ckpt_*.ckpt"))
    # At exit (and in the flush at SIGTERM when that ran after it): cumulative, so 1 each.
    points = otlp_receiver.metrics("program.interrupted_fits")
    assert points and {(p.value, tuple(p.attributes.items())) for p in points} == {
        (1, (("exception", "SIGTERMException"),))
    }
    steps = otlp_receiver.metrics("megatron.training.step_duration_ms")
    assert steps and steps[-1].count >= 3  # "ready" came after step 3


MEGATRON_STYLE = textwrap.dedent(
    """
    import signal, sys
    from pathlib import Path
    import torch
    import torch.distributed as dist
    import otel_training as ot

    class ExitSignalHandler:
        # As Megatron-LM's --exit-signal-handler: the handler only notes the signal; after
        # each iteration the ranks agree whether any received it, then all save and exit.
        def __init__(self, sig=signal.SIGTERM):
            self.sig, self.received = sig, False

        def __enter__(self):
            self.original = signal.getsignal(self.sig)
            signal.signal(self.sig, self._note)
            return self

        def _note(self, signum, frame):
            self.received = True

        def __exit__(self, *exc):
            signal.signal(self.sig, self.original)

        def any_rank_received(self):
            flag = torch.tensor([int(self.received)])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            return bool(flag.item())

    save_dir = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ot.configure()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    meter = ot.get_meter()
    with ExitSignalHandler() as handler, ot.training_run():
        iteration = 0
        while True:
            iteration += 1
            with ot.training_iteration(iteration=iteration):
                loss = model(torch.randn(4, 8)).pow(2).mean()
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
            ot.record_training_metrics(meter, loss=float(loss), step_duration_ms=1.0)
            if iteration == 20:
                print("ready", flush=True)
            if handler.any_rank_received():
                path = save_dir / f"iter_{iteration:07d}_rank{rank}.pt"
                with ot.checkpoint_save(str(path), iteration=iteration):
                    torch.save({"iteration": iteration, "model": model.state_dict()}, path)
                print(f"exiting program after receiving SIGTERM at {iteration} {float(loss)!r}",
                      flush=True)
                break
    dist.destroy_process_group()
    sys.exit(0)
    """
)


def test_a_megatron_style_exit_signal_handler_saves_on_every_rank_with_telemetry_on(
    otlp_receiver, repo_root, tmp_path
):
    """Two gloo ranks with an exit-signal handler set after configure(), SIGTERM to both (as
    SLURM sends it): they agree, save a checkpoint at the same iteration and exit 0; each
    rank's last loss and its checkpoint span arrive, nothing truncated."""
    gloo_or_unavailable()
    env = {
        **otlp_receiver.env("grpc"),
        "OTEL_METRIC_EXPORT_INTERVAL": "60000",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "WORLD_SIZE": "2",
    }
    children = [
        subprocess.Popen(
            [sys.executable, "-c", MEGATRON_STYLE, str(tmp_path)],
            cwd=repo_root,
            env=_env(repo_root, **env, RANK=str(rank), LOCAL_RANK=str(rank)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    try:
        for child in children:
            assert child.stdout.readline().strip() == "ready", child.stderr.read()[-3000:]
        for child in children:
            child.send_signal(signal.SIGTERM)
    finally:
        stderrs = _finish(children)
    assert [child.returncode for child in children] == [0, 0], stderrs[0][-3000:]
    said = [child.stdout.read().split() for child in children]
    iterations = {int(words[-2]) for words in said}
    (iteration,) = iterations  # the ranks agreed
    for rank, words in enumerate(said):
        assert (tmp_path / f"iter_{iteration:07d}_rank{rank}.pt").is_file()
        last = [
            p.value
            for p in otlp_receiver.metrics("megatron.training.loss")
            if p.resource_attributes.get("dl.rank") == rank
        ]
        assert last[-1] == float(words[-1])
    saves = otlp_receiver.spans("megatron.checkpoint.save")
    assert sorted(s.resource_attributes["dl.rank"] for s in saves) == [0, 1]
    for span in saves + otlp_receiver.spans("megatron.train"):
        assert OTEL_TRAINING_SPAN_TRUNCATED not in span.attributes
