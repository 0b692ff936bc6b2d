"""One rank of the ground-truth job of ``docs/health.md`` (run as its own process, 2 ranks on
gloo): startup 1.0 s with model init 0.3 s; when a checkpoint exists, a load of it (0.3 s);
then steps of data 20 ms, forward/backward 60 ms with a gloo all_reduce in
``grad_sync("finish")``, optimizer 10 ms (the first step of a process +0.5 s); an evaluation of
0.4 s every 25 steps and a checkpoint save of 0.25 s every 20 (rank 0 writes the file), to
step 100.

Independently of the telemetry, it writes its own truth log: ``time.time()`` at every phase
boundary, one JSON line each (``{"t", "event": "begin"|"end", "phase", "iteration"}``),
flushed at once, to ``TRUTH_LOG``. Step ``HOLD_AT`` (if set) holds 2 s inside its
forward/backward, after writing ``{"event": "hold"}``, for the harness to kill it there. A rank
that fails (its peer died inside the collective) writes ``{"event": "crash"}`` before it
exits.

Environment: ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` (gloo),
``TRUTH_LOG``, ``CHECKPOINT_DIR``, ``HOLD_AT``, ``LAST_STEP`` (default 100), ``SAVE_S`` (this
rank's save, default 0.25 s), and the
``OTEL_*`` variables of the run.
"""

from __future__ import annotations

import json
import os
import time

_truth = open(os.environ["TRUTH_LOG"], "a", buffering=1)  # noqa: SIM115


def truth(event: str, phase: str, iteration: int | None = None) -> None:
    _truth.write(
        json.dumps({"t": time.time(), "event": event, "phase": phase, "iteration": iteration})
        + "\n"
    )


class Phase:
    """The truth log's begin and end around an otel-training phase."""

    def __init__(self, name: str, phase, iteration: int | None = None) -> None:
        self.name, self.phase, self.iteration = name, phase, iteration

    def __enter__(self):
        self.phase.__enter__()
        truth("begin", self.name, self.iteration)
        return self

    def __exit__(self, *exc):
        truth("end", self.name, self.iteration)
        return self.phase.__exit__(*exc)


def main() -> None:
    import torch
    import torch.distributed as dist

    import otel_training as ot

    telemetry = ot.configure(service_name="health-ground-truth")
    rank = int(os.environ["RANK"])
    checkpoints = os.environ["CHECKPOINT_DIR"]
    hold_at = int(os.environ.get("HOLD_AT") or 0)
    last_step = int(os.environ.get("LAST_STEP") or 100)
    with Phase("startup", ot.startup()):
        time.sleep(0.7)
        with ot.model_init():
            time.sleep(0.3)
        dist.init_process_group("gloo")
    start = 0
    names = [name for name in os.listdir(checkpoints) if not name.endswith(".tmp")]
    saved = sorted(int(name.split("-")[1]) for name in names)
    if saved:
        with Phase("checkpoint_load", ot.checkpoint_load(iteration=saved[-1]), saved[-1]):
            with open(os.path.join(checkpoints, f"iter-{saved[-1]:07d}")) as handle:
                start = int(handle.read())
            time.sleep(0.3)
    grad = torch.ones(1024)
    first = True
    for step in range(start + 1, last_step + 1):
        with Phase("iteration", ot.training_iteration(iteration=step), step):
            with Phase("data_loading", ot.data_loading(iteration=step), step):
                time.sleep(0.02)
            with Phase("forward_backward", ot.forward_backward(iteration=step), step):
                time.sleep(0.06 + (0.5 if first else 0.0))
                if step == hold_at:
                    truth("hold", "forward_backward", step)
                    time.sleep(2.0)
                with Phase("communication", ot.grad_sync("finish"), step):
                    dist.all_reduce(grad)
            with Phase("optimizer", ot.optimizer_step(iteration=step), step):
                time.sleep(0.01)
        first = False
        if step % 25 == 0:
            with Phase("evaluate", ot.evaluation(iteration=step), step):
                time.sleep(0.4)
        if step % 20 == 0:
            with Phase("checkpoint_save", ot.checkpoint_save(iteration=step), step):
                if rank == 0:
                    path = os.path.join(checkpoints, f"iter-{step:07d}")
                    with open(path + ".tmp", "w") as handle:
                        handle.write(str(step))
                    os.replace(path + ".tmp", path)
                time.sleep(float(os.environ.get("SAVE_S") or 0.25))
    dist.barrier()
    dist.destroy_process_group()
    telemetry.shutdown()
    truth("end", "process")


if __name__ == "__main__":
    try:
        main()
    except BaseException:  # a peer died inside the collective: when this rank gave up
        truth("crash", "process")
        raise
