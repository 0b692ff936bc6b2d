"""DistributedDataParallel: where the backward pass stops computing and starts waiting.

DDP runs its gradient all-reduce inside ``loss.backward()``, bucket by bucket as gradients
become ready, and waits for all of them at the end of the pass. To the ledger the whole pass is
``forward_backward``: a rank that waits there for a slow or stuck peer looks busy, so a
straggler's cause reads ``unattributed`` and a hang's culprit can only be told from the phase
the others wait in (``docs/health.md``). A communication hook sees the moment the waiting
begins: when DDP hands it the last bucket of a pass, this rank's gradients are all computed and
every all-reduce is issued; what is left of the pass is waiting. :func:`comm_hook` wraps a hook
(PyTorch's own all-reduce by default) so that from that moment until the training thread's next
transition the rank is in ``communication`` (:meth:`otel_training.health.ledger.Ledger.
collective_wait`). Nothing else changes: the same collectives, on the same buckets.

Use :func:`register_comm_hook` on a DDP model, or pass :func:`comm_hook`'s result where a
framework takes a hook (Lightning: ``DDPStrategy(ddp_comm_hook=comm_hook(),
ddp_comm_state=None)``). DDP takes one hook per model: to keep your own (compression,
PowerSGD), give it as ``hook=`` and it runs unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from otel_training.health import ledger as _ledger

__all__ = ["comm_hook", "register_comm_hook"]

#: A DDP communication hook: ``hook(state, bucket) -> torch.futures.Future``.
CommHook = Callable[[Any, Any], Any]


def comm_hook(hook: CommHook | None = None) -> CommHook:
    """A DDP communication hook that runs ``hook`` and, on the last bucket of a backward pass,
    marks this rank as waiting for its collectives.

    Args:
        hook: The hook to run, ``hook(state, bucket) -> Future`` (default: PyTorch's
            ``allreduce_hook``, DDP's own averaging all-reduce; its state is the process
            group, ``None`` for the default one).

    Returns:
        ``hook(state, bucket)`` returning ``hook``'s future. It runs on the thread that runs
        backward (an autograd device thread on CUDA); the mark is a few stores, and raises
        nothing of its own (``hook``'s exceptions pass through, as DDP expects).
    """
    if hook is None:
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        hook = allreduce_hook
    inner = hook

    # No annotations: DDP checks them against dist.GradBucket and Future[Tensor], and this
    # module's are strings (PEP 563).
    def watched(state, bucket):  # type: ignore[no-untyped-def]
        future = inner(state, bucket)
        if bucket.is_last():
            _ledger.LEDGER.collective_wait()
        return future

    watched.__name__ = watched.__qualname__ = f"watched_{getattr(inner, '__name__', 'hook')}"
    return watched


def register_comm_hook(model: Any, state: Any = None, hook: CommHook | None = None) -> Any:
    """Registers :func:`comm_hook` of ``hook`` on ``model``, a
    ``torch.nn.parallel.DistributedDataParallel``; returns ``model``.

    Args:
        model: The DDP model, before its first backward pass.
        state: ``hook``'s state (default: ``model.process_group``, the state PyTorch's
            all-reduce hook takes).
        hook: The hook to run (default: PyTorch's ``allreduce_hook``).

    Raises:
        RuntimeError: from DDP, when ``model`` already has a hook (DDP takes one) or has run
            a backward pass.
    """
    if state is None and hook is None:
        state = getattr(model, "process_group", None)
    model.register_comm_hook(state, comm_hook(hook))
    return model
