"""One rank of the run-health end-to-end job (tests/integration/alerts_job.py starts four).

A real process with RANK, WORLD_SIZE and LOCAL_RANK, on gloo, exporting its metrics with the
Prometheus exporter (OTEL_METRICS_EXPORTER=prometheus, port base + LOCAL_RANK). Each step:
``data_loading`` (sleep), ``forward_backward`` (sleep), ``grad_sync("finish")`` around the
blocking ``all_reduce``, ``optimizer_step`` (sleep), inside ``training_iteration``; checkpoint
saves and evaluations are sleeps inside ``checkpoint_save`` and ``evaluation``.

The plan is a JSON object in argv[1] (keys of ``DEFAULTS``). Lines on stdout:
``ready`` once the exporter serves (then it waits for ``go`` on stdin), ``mark <step> <unix
time>`` when it reaches ``mark_step``, ``straggle <unix time>`` when its straggler starts,
``inject <unix time>`` right before it hangs itself, ``done`` after the last step (then it
waits for ``quit``). SIGUSR1 asks it to hang in its next forward/backward, the way the plan's
``hang`` says: ``sleep`` (a wait that releases the GIL) or ``gil`` (one C call that holds it).
SIGUSR2 turns the rank's straggler of ``on_sigusr2`` on (``straggle <unix time>``) or off
(``recover <unix time>``) from its next step. The rank exits when its stdin closes (its
harness is gone).

A collective that fails because a peer died raises on gloo; NCCL blocks instead until its
watchdog fires (10 min). The rank does what NCCL does: it stays inside
``grad_sync("finish")`` (printing ``peer lost``), so a SIGKILL reads as a hang, as on GPUs.
"""

from __future__ import annotations

import datetime
import json
import os
import random
import signal
import sys
import threading
import time

DEFAULTS = {
    "steps": 2000,
    "data_s": 0.015,
    "fb_s": 0.030,
    "opt_s": 0.003,
    "slow_share": 0.01,  # steps whose forward/backward takes slow_factor times as long
    "slow_factor": 3.0,
    "checkpoint_every": 200,
    "checkpoint_steps": [],  # more saves, at these steps
    "checkpoint_s": 1.0,
    "evaluate_every": 500,
    "evaluate_steps": [],  # more evaluations, at these steps
    "evaluate_s": 2.0,
    "mark_step": None,
    "report_every": 0,  # print "at <step> <unix time>" every this many steps
    "straggler": None,  # {"rank": r, "from_step": n, "phase": "fb" | "data", "factor": x}
    "on_sigusr2": {},  # {"<rank>": {"phase": "fb" | "data", "factor": x}}, toggled by SIGUSR2
    "hang": "sleep",  # how to hang on SIGUSR1: "sleep" | "gil"
}


def _due(step: int, every: int, steps: list[int]) -> bool:
    return bool(every and step % every == 0) or step in steps


def main() -> None:
    plan = {**DEFAULTS, **json.loads(sys.argv[1])}
    import torch
    import torch.distributed as dist

    import otel_training as ot

    telemetry = ot.configure()
    rank = int(os.environ["RANK"])
    # Long enough that a stopped peer keeps the others waiting for the whole test.
    dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=30))
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    quit_ = threading.Event()
    threading.Thread(target=_watch_stdin, args=(quit_,), daemon=True).start()
    slow = random.Random(rank)
    tensor = torch.zeros(1)
    straggler = dict(plan["straggler"] or {})
    hang = threading.Event()
    signal.signal(signal.SIGUSR1, lambda signum, frame: hang.set())
    toggled = threading.Event()  # set by SIGUSR2, cleared when the step loop applies it
    on_demand = plan["on_sigusr2"].get(str(rank))
    signal.signal(signal.SIGUSR2, lambda signum, frame: toggled.set())
    for step in range(1, plan["steps"] + 1):
        if step == plan["mark_step"]:
            print(f"mark {step} {time.time():.6f}", flush=True)
        if plan["report_every"] and step % plan["report_every"] == 0:
            print(f"at {step} {time.time():.6f}", flush=True)
        if toggled.is_set() and on_demand:
            toggled.clear()
            if straggler:
                straggler = {}
                print(f"recover {time.time():.6f}", flush=True)
            else:
                straggler = {"rank": rank, "from_step": step, **on_demand}
        straggling = straggler.get("rank") == rank and step >= straggler["from_step"]
        if straggling and step == straggler["from_step"]:
            print(f"straggle {time.time():.6f}", flush=True)
        factor = straggler.get("factor", 1.0) if straggling else 1.0
        with ot.training_iteration(step, record_step_duration=True):
            with ot.data_loading(step):
                time.sleep(plan["data_s"] * (factor if straggler.get("phase") == "data" else 1))
            with ot.forward_backward(step):
                fb = plan["fb_s"] * (factor if straggler.get("phase") == "fb" else 1)
                if slow.random() < plan["slow_share"]:
                    fb *= plan["slow_factor"]
                time.sleep(fb)
                if hang.is_set():
                    print(f"inject {time.time():.6f}", flush=True)
                    if plan["hang"] == "gil":
                        sum(range(10**12))  # one C call that holds the GIL for minutes
                    threading.Event().wait()  # "sleep": a wait that releases the GIL
            with ot.grad_sync("finish"):
                try:
                    dist.all_reduce(tensor)
                except RuntimeError:
                    print("peer lost", flush=True)
                    threading.Event().wait()  # as NCCL: blocked until the watchdog
            with ot.optimizer_step(step):
                time.sleep(plan["opt_s"])
        if _due(step, plan["checkpoint_every"], plan["checkpoint_steps"]):
            with ot.checkpoint_save(iteration=step):
                time.sleep(plan["checkpoint_s"])
        if _due(step, plan["evaluate_every"], plan["evaluate_steps"]):
            with ot.evaluation(step):
                time.sleep(plan["evaluate_s"])
    print("done", flush=True)
    quit_.wait()
    telemetry.shutdown()


def _watch_stdin(quit_: threading.Event) -> None:
    """Sets ``quit_`` on a ``quit`` line; ends the process when stdin closes without one."""
    for line in sys.stdin:
        if line.strip() == "quit":
            quit_.set()
            return
    os._exit(0)


if __name__ == "__main__":
    main()
