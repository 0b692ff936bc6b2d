"""Everything works the second time (issue 15 item 11): a second ``configure()``, a shutdown
then ``configure()`` again, a second ``logging_handler()``: each records exactly as the first
did, and nothing the first registered process-wide is left behind or doubled."""

from __future__ import annotations

import logging

import pytest
from doc_rules import documents

import otel_training as ot
from otel_training import configuration as setup
from otel_training import testing
from otel_training.semconv import spans as names

ENVIRON = {"OTEL_PYTHON_TRAINING_SPAN_GROUPS": "all", "OTEL_PYTHON_TRAINING_LOGGING": "true"}


def _program(first_iteration: int) -> None:
    """A short run: two iterations with metrics, a checkpoint save, a log record."""
    with ot.training_run():
        for iteration in (first_iteration, first_iteration + 1):
            with ot.training_iteration(iteration=iteration, record_step_duration=True) as it:
                with ot.forward_backward(iteration=iteration):
                    pass
                it.record_metrics(loss=2.0, grad_norm=0.5)
        with ot.checkpoint_save("/ckpt", iteration=first_iteration + 1):
            pass
        logging.getLogger("train.second_time").warning("saved %d", first_iteration + 1)


def _recorded(pipeline: testing.InMemoryTelemetry) -> dict:
    """What a pipeline recorded, without ids and times: span names with their parents' names,
    metric names with their point counts or series, log bodies."""
    spans = pipeline.spans.get_finished_spans()
    by_id = {s.context.span_id: s.name for s in spans}
    tree = sorted((s.name, by_id.get(s.parent.span_id) if s.parent else None) for s in spans)
    metrics = {}
    for name, point in pipeline.points():
        count = getattr(point, "count", 1)
        metrics[name] = metrics.get(name, 0) + count
    logs = sorted(str(r.log_record.body) for r in pipeline.logs.get_finished_logs())
    return {"spans": tree, "metrics": metrics, "logs": logs}


def _process_wide() -> dict:
    """What configure() registers in the process, counted."""
    telemetry = setup.current()
    return {
        "flush hooks": len(setup._flush_hooks),
        "root handlers": len(logging.getLogger().handlers),
        "live pipelines": len(setup._live),
        "shutdown hooks": len(telemetry.before_shutdown),
    }


@pytest.mark.parametrize(
    "how", ["configure again", "shutdown, then configure", "flush, then configure"]
)
def test_a_second_pipeline_records_exactly_as_the_first(how):
    """The same program under a second pipeline records the same spans, metrics (the health
    ledger's instruments once, not twice) and log records as under the first; the first
    records nothing more; the process-wide registrations are those of one pipeline."""
    first = testing.configure_in_memory(ENVIRON, set_global=True)
    _program(1)
    registered = _process_wide()
    recorded = _recorded(first)
    # The run, its segment span in the job trace and the save under it, the step trace's root
    # segment span, the first iteration's wrapper, two iterations, two forward-backwards.
    assert len(recorded["spans"]) == 9 and recorded["logs"] == ["saved 2"]
    if how == "shutdown, then configure":
        assert ot.shutdown(5_000)
    elif how == "flush, then configure":
        assert ot.force_flush(5_000)
    for _ in range(2):  # a second and a third pipeline
        before = len(first.spans.get_finished_spans()), len(first.logs.get_finished_logs())
        second = testing.configure_in_memory(ENVIRON, set_global=True)
        for thread in setup._retiring:
            thread.join(10)
        _program(1)
        assert _recorded(second) == recorded
        assert _process_wide() == registered
        assert (
            len(first.spans.get_finished_spans()),
            len(first.logs.get_finished_logs()),
        ) == before
        first = second


def test_a_span_open_at_a_second_configure_ends_with_the_first_pipeline():
    """A run open when configure() is called again ends, truncated, in the pipeline it started
    in; the new pipeline's phases start fresh (no parent from the old one: the new run span
    is the root of a run trace of its own, this process's second run)."""
    first = testing.configure_in_memory({"OTEL_PYTHON_TRAINING_SPAN_GROUPS": "all"})
    run = ot.SpanRecorder().start_phase(ot.training_run)
    second = testing.configure_in_memory({"OTEL_PYTHON_TRAINING_SPAN_GROUPS": "all"})
    for thread in setup._retiring:
        thread.join(10)
    (truncated,) = first.spans.get_finished_spans()
    assert truncated.name == names.MEGATRON_TRAIN
    assert truncated.attributes["otel_training.span.truncated"] is True
    with ot.training_run():
        pass
    run.stop()  # its span ended already: nothing more anywhere
    (fresh,) = second.spans.get_finished_spans()
    assert fresh.name == names.MEGATRON_TRAIN and fresh.parent is None
    assert fresh.context.trace_id != truncated.context.trace_id
    assert len(first.spans.get_finished_spans()) == 1


@documents("spans.md", "or a pipeline built again by a second `configure()` within a run")
def test_a_second_configure_within_a_run_keeps_every_trace_whole():
    """configure() again in the middle of segment 0, its iterations going on in the new
    pipeline: over both pipelines' spans every trace has one root, no span id is exported
    twice in a trace (the new pipeline's segment span starts under the job trace's root the
    first one exported, its iterations in a step trace of a new part), no parent is missing."""
    environ = {"OTEL_PYTHON_TRAINING_SPAN_GROUPS": "all"}
    first = testing.configure_in_memory(environ)
    run = ot.SpanRecorder().start_phase(ot.training_run)
    with ot.training_iteration(iteration=1):
        pass
    second = testing.configure_in_memory(environ)
    for thread in setup._retiring:
        thread.join(10)
    for iteration in (2, 3):
        with ot.training_iteration(iteration=iteration):
            pass
    run.stop()
    second.telemetry.shutdown()
    spans = [*first.spans.get_finished_spans(), *second.spans.get_finished_spans()]
    ids = [(s.context.trace_id, s.context.span_id) for s in spans]
    assert len(set(ids)) == len(ids)
    roots = {}
    for span in spans:
        if span.parent is None:
            roots.setdefault(span.context.trace_id, []).append(span.name)
        else:
            assert (span.context.trace_id, span.parent.span_id) in ids, span.name
    assert set(roots) == {s.context.trace_id for s in spans}
    assert all(len(names_) == 1 for names_ in roots.values()), roots
    # The run, the job and two step traces (the second pipeline's in a part of its own).
    assert len(roots) == 4


def test_logging_handlers_of_either_pipeline_record_into_the_current_one():
    """A handler obtained before a second configure() and one obtained after both send each
    record, once each, to the second pipeline; nothing reaches the first."""
    first = testing.configure_in_memory(set_global=True)
    before = ot.logging_handler()
    second = testing.configure_in_memory(set_global=True)
    for thread in setup._retiring:
        thread.join(10)
    after = ot.logging_handler()
    logger = logging.getLogger("train.handlers")
    logger.propagate = False
    logger.addHandler(before)
    logger.addHandler(after)
    try:
        logger.warning("step %d", 1)
    finally:
        logger.removeHandler(before)
        logger.removeHandler(after)
        logger.propagate = True
    assert [str(r.log_record.body) for r in second.logs.get_finished_logs()] == ["step 1"] * 2
    assert first.logs.get_finished_logs() == ()
