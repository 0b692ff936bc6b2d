"""Run health: where each rank's time goes, whether training progresses, what was productive.

Per rank, in the training process:

- :mod:`~otel_training.health.ledger`: the ledger that the phases and callbacks feed;
- :mod:`~otel_training.health.metrics`: it as observable instruments (``dl.training.*``);
- :mod:`~otel_training.health.watchdog`: the thread that writes the stacks of a rank that
  stopped progressing.

Job-level figures, computed where the ranks' data meet, never by a collective (by
``otel-training health`` and the report, :mod:`otel_training.report.health`, and by the
Prometheus rules of ``collector-config/rules/training.yaml``), each defined in one module:

- :mod:`~otel_training.health.goodput`: goodput and badput over all attempts;
- :mod:`~otel_training.health.timeline`: a process's phase times at any moment, an
  attempt's facts (its steps, progress, reference rank) that goodput accounts with;
- :mod:`~otel_training.health.hang`: the hang threshold, stalled ranks, a hung job's culprits;
- :mod:`~otel_training.health.straggler`: busy time, the leave-one-out score, the cause;
- :mod:`~otel_training.health.evidence`: what the files hold per process, and the attempts.

Definitions: ``docs/health.md``.

The definitions (``ledger``, ``record``, ``hang``, ``straggler``, ``goodput``, ``timeline``,
``evidence``, ``incidents``, ``risk``) are the health-definitions layer
(``tests/test_import_layers.py``): they import only the leaves (the clock, warn-once, semantic
conventions), so that the report judges a run with the very definitions its ranks used.
``metrics`` and ``watchdog`` run inside a pipeline and are in the SDK layer.
"""
