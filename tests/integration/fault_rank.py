"""One rank of the fault-injection campaign (bench/faults.py starts 2 to 8 of them).

A real process with RANK, WORLD_SIZE and LOCAL_RANK on gloo, configured from the environment
(the campaign turns on the Prometheus exporter and the embedded default's files together). Each
step, inside ``training_iteration``: ``data_loading`` (a sleep), ``forward_backward`` (a sleep,
then, under ``"sync": "ddp"``, a real ``DistributedDataParallel`` forward and backward of a tiny
model, whose all-reduce runs inside the backward pass), the blocking all-reduce inside
``grad_sync("finish")`` (``"sync": "explicit"`` only) and ``optimizer_step`` (a sleep, and the
optimizer under DDP). Every sleep is drawn within ``jitter`` of its mean. Between steps, on the
plan's schedule: checkpoint saves (on ``checkpoint_ranks``; the others go on to the next
collective and wait there), evaluations, epoch-boundary pauses (a long data loading on every
rank), recompilations (a long forward/backward on every rank); the first forward/backward of
the process takes ``warmup_s`` more (compilation). A restart loads ``resume`` first.

The plan is a JSON object in argv[1] (keys of :data:`DEFAULTS`). The harness talks through lines:

- stdin: ``go`` (start training); ``hang WHERE ID`` (hang at WHERE in the next step: ``data``,
  ``forward`` (inside forward/backward, before the model's forward), ``optimizer``, ``between``
  (after the step completed, before the next), ``save`` (a checkpoint save that never finishes,
  at the next step's end) or ``gil`` (one C call in forward/backward that holds the GIL for
  ``gil_hold_s``)); ``release`` (ends the hang); ``slow PHASE EXTRA ID`` (from the next step,
  ``EXTRA`` x the mean busy time more per step, in ``fb`` or ``data``); ``unslow``; ``spike
  SECONDS ID`` (the next forward/backward that much longer); ``quit``. The rank exits when its
  stdin closes.
- stdout, the truth (Unix times from ``time.time()``): ``ready T``; ``step N T`` after every
  completed step; ``inject ID WHERE STEP T`` right before a hang; ``released ID T``;
  ``straggle ID STEP T`` at the start of the first slow step; ``recover ID STEP T``; ``spike ID
  STEP T0 T1``; ``save STEP T0 T1`` after a good save; ``eval STEP T0 T1``; ``pause STEP T0 T1``
  (an epoch boundary); ``recompile STEP T0 T1``; ``load STEP T0 T1``; ``warmup T0 T1``;
  ``peer_lost T``; ``done T``.

A collective that fails because a peer died raises on gloo; NCCL blocks instead until its
watchdog fires (10 min). The rank does what NCCL does: it stays where the collective was (in
``grad_sync("finish")``, or inside forward/backward under DDP), so a SIGKILL reads as a hang.
"""

from __future__ import annotations

import datetime
import json
import os
import queue
import random
import sys
import threading
import time

DEFAULTS = {
    "sync": "explicit",  # "explicit" (grad_sync around all_reduce) | "ddp"
    "ddp_hook": False,  # DDP: otel_training.integrations.ddp.register_comm_hook
    "steps": 10**7,
    "resume": 0,  # > 0: a checkpoint_load of this step first, then steps from resume + 1
    "load_s": 0.3,
    "data_s": 0.05,
    "fb_s": 0.12,
    "opt_s": 0.01,
    "jitter": 0.1,  # every sleep uniform in [1 - jitter, 1 + jitter] x its mean
    "warmup_s": 0.0,  # more time in the first forward/backward of the process (compilation)
    "warmup_rank_s": {},  # {"<rank>": seconds}: more still on these ranks
    "checkpoint_every": 0,
    "checkpoint_s": [0.5, 0.5],  # [least, most]: the same draw on every rank
    "checkpoint_ranks": None,  # None: every rank saves; else these ranks only
    "evaluate_every": 0,
    "evaluate_s": [1.0, 1.0],
    "epoch_every": 0,  # steps k * epoch_every + 1 (an epoch's first) wait in data loading:
    "epoch_pause_s": [1.0, 1.0],
    "recompile_every": 0,  # every rank's forward/backward that long at these steps
    "recompile_s": [1.0, 1.0],
    "gil_hold_s": 12.0,
    "seed": 0,  # the schedule's draws (the same on every rank)
}

_BUSY_PHASES = ("data", "fb")


def _draw(plan: dict, key: str, step: int, salt: int) -> float:
    """A duration in ``plan[key]`` = [least, most], the same on every rank for this step."""
    least, most = plan[key]
    return random.Random(plan["seed"] * 1_000_003 + step * 31 + salt).uniform(least, most)


def _due(step: int, every: int) -> bool:
    return bool(every) and step % every == 0


def _out(*parts: object) -> None:
    print(" ".join(str(p) for p in parts), flush=True)


def _now() -> str:
    return f"{time.time():.6f}"


class _Commands:
    """The harness's lines, read on a thread of their own: ``release`` acts at once (the
    training thread may be blocked), the rest are queued for the next step."""

    def __init__(self) -> None:
        self.queue: queue.Queue[list[str]] = queue.Queue()
        self.release = threading.Event()
        self.go = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in sys.stdin:
            words = line.split()
            if not words:
                continue
            if words[0] == "go":
                self.go.set()
            elif words[0] == "release":
                self.release.set()
            elif words[0] == "quit":
                break
            else:
                self.queue.put(words)
        os._exit(0)  # stdin closed or quit: the harness is done with this rank


def _calibrated_gil_call(hold_s: float):
    """A C call that holds the GIL for about ``hold_s`` seconds: ``sum(range(n))`` with ``n``
    from a timing of a shorter one, taken right before (more load after it makes the call
    longer)."""
    n = 2_000_000
    t0 = time.perf_counter()
    sum(range(n))
    per_item = max((time.perf_counter() - t0) / n, 1e-9)
    count = int(hold_s / per_item)
    return lambda: sum(range(count))


def main() -> None:
    plan = {**DEFAULTS, **json.loads(sys.argv[1])}
    import torch
    import torch.distributed as dist

    import otel_training as ot

    telemetry = ot.configure()
    rank = int(os.environ["RANK"])
    # Long enough that a stopped peer keeps the others waiting for the whole campaign.
    dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=30))
    commands = _Commands()
    model = optimizer = inputs = None
    if plan["sync"] == "ddp":
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 16))
        if plan["ddp_hook"]:
            from otel_training.integrations.ddp import register_comm_hook

            register_comm_hook(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        inputs = torch.randn(8, 16)
    tensor = torch.zeros(1)
    _out("ready", _now())
    commands.go.wait()
    jitter = random.Random(1000 + rank)
    busy_mean = plan["data_s"] + plan["fb_s"] + plan["opt_s"]

    def sleep(mean_s: float) -> None:
        j = plan["jitter"]
        time.sleep(max(0.0, mean_s * jitter.uniform(1 - j, 1 + j)))

    def stuck(hang: list[str], step: int) -> None:
        """Blocks the training thread as ``hang`` says, until ``release``."""
        _out("inject", hang[2], hang[1], step, _now())
        if hang[1] == "gil":
            _calibrated_gil_call(plan["gil_hold_s"])()
        else:
            commands.release.wait()
        commands.release.clear()
        _out("released", hang[2], _now())

    def blocked_peer() -> None:
        _out("peer_lost", _now())
        threading.Event().wait()  # as NCCL: blocked until its watchdog

    slow: list[str] | None = None  # ["slow", phase, extra, id]
    hang: list[str] | None = None  # ["hang", where, id]
    spike: list[str] | None = None  # ["spike", seconds, id]
    first = True
    start = plan["resume"] + 1
    if plan["resume"]:
        t0 = _now()
        with ot.checkpoint_load(iteration=plan["resume"]):
            time.sleep(plan["load_s"])
        _out("load", plan["resume"], t0, _now())
    for step in range(start, plan["steps"] + 1):
        while not commands.queue.empty():
            words = commands.queue.get()
            if words[0] == "hang":
                hang = words
            elif words[0] == "slow":
                slow = words
                _out("straggle", words[3], step, _now())
            elif words[0] == "unslow" and slow is not None:
                _out("recover", slow[3], step, _now())
                slow = None
            elif words[0] == "spike":
                spike = words
        extra = {phase: 0.0 for phase in _BUSY_PHASES}
        if slow is not None:
            extra[slow[1]] = float(slow[2]) * busy_mean
        with ot.training_iteration(step, record_step_duration=True):
            with ot.data_loading(step):
                if step > 1 and _due(step - 1, plan["epoch_every"]):
                    t0 = _now()
                    time.sleep(_draw(plan, "epoch_pause_s", step, 1))
                    _out("pause", step, t0, _now())
                sleep(plan["data_s"] + extra["data"])
                if hang is not None and hang[1] == "data":
                    stuck(hang, step)
                    hang = None
            with ot.forward_backward(step):
                if first and (plan["warmup_s"] or str(rank) in plan["warmup_rank_s"]):
                    t0 = _now()
                    time.sleep(plan["warmup_s"] + plan["warmup_rank_s"].get(str(rank), 0.0))
                    _out("warmup", t0, _now())
                if _due(step, plan["recompile_every"]):
                    t0 = _now()
                    time.sleep(_draw(plan, "recompile_s", step, 2))
                    _out("recompile", step, t0, _now())
                sleep(plan["fb_s"] + extra["fb"])
                if spike is not None:
                    t0 = _now()
                    time.sleep(float(spike[1]))
                    _out("spike", spike[2], step, t0, _now())
                    spike = None
                if hang is not None and hang[1] in ("forward", "gil"):
                    stuck(hang, step)
                    hang = None
                if model is not None:
                    try:
                        model(inputs).square().mean().backward()
                    except RuntimeError:
                        blocked_peer()
            if model is None:
                with ot.grad_sync("finish"):
                    try:
                        dist.all_reduce(tensor)
                    except RuntimeError:
                        blocked_peer()
            with ot.optimizer_step(step):
                sleep(plan["opt_s"])
                if optimizer is not None:
                    optimizer.step()
                    optimizer.zero_grad()
                if hang is not None and hang[1] == "optimizer":
                    stuck(hang, step)
                    hang = None
        _out("step", step, _now())
        first = False
        if hang is not None and hang[1] == "between":
            stuck(hang, step)
            hang = None
        saving = plan["checkpoint_ranks"] is None or rank in plan["checkpoint_ranks"]
        if hang is not None and hang[1] == "save":
            with ot.checkpoint_save(iteration=step):
                stuck(hang, step)
            hang = None
        elif saving and _due(step, plan["checkpoint_every"]):
            t0 = _now()
            with ot.checkpoint_save(iteration=step):
                time.sleep(_draw(plan, "checkpoint_s", step, 3))
            _out("save", step, t0, _now())
        if _due(step, plan["evaluate_every"]):
            t0 = _now()
            with ot.evaluation(step):
                time.sleep(_draw(plan, "evaluate_s", step, 4))
            _out("eval", step, t0, _now())
    _out("done", _now())
    threading.Event().wait()  # until the harness closes stdin
    telemetry.shutdown()


if __name__ == "__main__":
    main()
