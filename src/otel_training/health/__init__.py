"""Run health: where each rank's time goes, whether training progresses, what was productive.

:mod:`otel_training.health.ledger` is the per-rank ledger that the phases and callbacks feed;
:mod:`otel_training.health.metrics` exposes it as observable instruments (``dl.training.*``).
Job-level figures (goodput, a hang's culprit, stragglers) are computed where the ranks' data
meet, never by a collective: ``otel-training health`` and the Prometheus rules of
``collector-config/rules/training.yaml``. Definitions: ``docs/health.md``.
"""
