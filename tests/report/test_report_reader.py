"""report.reader: a run directory read back, whole or damaged, from real and hand-written files."""

from __future__ import annotations

import bisect
import os
import time

from report_files import (
    counter,
    gauge,
    histogram,
    metrics_line,
    span_lines,
    span_record,
    traces_line,
    write_lines,
    write_real_metrics,
)

from otel_training.metrics.views import STEP_DURATION_BUCKETS_MS
from otel_training.report import TRUNCATED_ATTRIBUTE, load_run
from otel_training.semconv.metrics import (
    MEGATRON_TRAINING_LOSS,
    MEGATRON_TRAINING_SKIPPED_ITERS,
    MEGATRON_TRAINING_STEP_DURATION_MS,
)
from otel_training.semconv.spans import (
    MEGATRON_CHECKPOINT_SAVE,
    MEGATRON_TRAIN,
    MEGATRON_TRAIN_ITERATION,
)

T0 = 1_796_000_000 * 10**9
S = 10**9


def _loss_line(rank: int, time_s: float, value: float, **kw) -> str:
    return metrics_line(
        rank, [gauge(MEGATRON_TRAINING_LOSS, [(T0 + int(time_s * S), value, {})])], **kw
    )


def test_two_ranks_each_with_its_series_and_resource(tmp_path):
    """Two ranks' metrics and spans come back per rank, with the resource's identity."""
    for rank in (0, 1):
        write_lines(
            tmp_path / f"metrics-rank{rank}.jsonl",
            [_loss_line(rank, t, 3.0 - t / 10 + rank) for t in (5, 10, 15)],
        )
        write_lines(
            tmp_path / f"spans-rank{rank}.jsonl",
            span_lines(MEGATRON_TRAIN, f"{rank + 1:016x}", None, T0, T0 + 16 * S, rank=rank),
        )
    run = load_run(tmp_path)
    assert list(run.ranks) == [0, 1]
    for rank in (0, 1):
        (series,) = run.ranks[rank].gauge(MEGATRON_TRAINING_LOSS)
        assert series.values == [2.5 + rank, 2.0 + rank, 1.5 + rank]
        assert series.times_ns == [T0 + 5 * S, T0 + 10 * S, T0 + 15 * S]
        assert run.ranks[rank].resource["dl.rank"] == rank
    assert run.service_name == "report-test" and run.world_size == 2
    assert [(s.rank, s.name, s.end_ns - s.start_ns) for s in run.spans] == [
        (0, MEGATRON_TRAIN, 16 * S),
        (1, MEGATRON_TRAIN, 16 * S),
    ]
    assert run.notes == []
    assert run.first_ns == T0 and run.last_ns == T0 + 16 * S


def test_a_torn_last_line_is_skipped_and_noted(tmp_path):
    """A last line cut mid-document is skipped, flagged on its file and named in a note."""
    good = [_loss_line(0, t, float(t)) for t in (1, 2)]
    write_lines(tmp_path / "metrics-rank0.jsonl", good, torn_tail=good[0][: len(good[0]) // 2])
    run = load_run(tmp_path)
    (stats,) = run.files
    assert stats.torn_last_line and stats.bad_lines == 0 and stats.lines == 3
    assert run.ranks[0].gauge(MEGATRON_TRAINING_LOSS)[0].values == [1.0, 2.0]
    assert any("metrics-rank0.jsonl: the last line is cut" in n for n in run.notes)


def test_a_bad_line_in_the_middle_is_counted(tmp_path):
    """A line that is not JSON, or not of the expected shape, is skipped and counted."""
    write_lines(
        tmp_path / "metrics-rank0.jsonl",
        [_loss_line(0, 1, 1.0), "{not json", '{"resourceMetrics": 3}', _loss_line(0, 2, 2.0)],
    )
    run = load_run(tmp_path)
    assert run.files[0].bad_lines == 2 and not run.files[0].torn_last_line
    assert run.ranks[0].gauge(MEGATRON_TRAINING_LOSS)[0].values == [1.0, 2.0]
    assert any("2 lines not readable" in n for n in run.notes)


def test_missing_files_give_notes_not_errors(tmp_path):
    """A run with span lines only reads, and says that the curves are empty; and vice versa."""
    write_lines(
        tmp_path / "spans-rank0.jsonl", span_lines(MEGATRON_TRAIN, "1" * 16, None, T0, T0 + S)
    )
    run = load_run(tmp_path)
    assert len(run.spans) == 1
    assert any("No metrics file" in n and "curves are empty" in n for n in run.notes)
    other = tmp_path / "other"
    other.mkdir()
    write_lines(other / "metrics-rank0.jsonl", [_loss_line(0, 1, 1.0)])
    assert any("No spans file" in n for n in load_run(other).notes)


def test_an_empty_or_absent_directory_is_an_empty_run(tmp_path):
    """No file at all: an empty run with a note; an absent directory does not raise either."""
    run = load_run(tmp_path)
    assert run.is_empty and run.files == [] and "holds no" in run.notes[0]
    assert load_run(tmp_path / "absent").is_empty


def _expected_buckets(durations: list[float]) -> list[int]:
    buckets = [0] * (len(STEP_DURATION_BUCKETS_MS) + 1)
    for d in durations:  # a value on a bound belongs to that bound's bucket (le)
        buckets[bisect.bisect_left(STEP_DURATION_BUCKETS_MS, d)] += 1
    return buckets


def test_delta_and_cumulative_exports_read_alike(tmp_path):
    """The SDK's delta and cumulative files read as the same histograms and counter totals."""
    batches = [
        {"step_duration_ms": [90.0, 120.0, 135.0], "skipped_iters": 1, "loss": 3.0},
        {"step_duration_ms": [150.0, 99.0], "loss": 2.5},
        {"step_duration_ms": [1200.0], "skipped_iters": 2, "loss": 2.0},
    ]
    runs = {}
    for temporality in ("cumulative", "delta"):
        directory = tmp_path / temporality
        directory.mkdir()
        write_real_metrics(directory / "metrics-rank0.jsonl", batches, temporality=temporality)
        runs[temporality] = load_run(directory).ranks[0]
    per_batch = [b["step_duration_ms"] for b in batches]
    for temporality, rank in runs.items():
        (hist,) = rank.histogram(MEGATRON_TRAINING_STEP_DURATION_MS)
        assert hist.temporality == temporality
        # The provider's shutdown exports once more (nothing new): intervals with steps only.
        intervals = [i for i, count in enumerate(hist.delta_counts) if count]
        assert [hist.delta_buckets[i] for i in intervals] == [
            _expected_buckets(d) for d in per_batch
        ]
        assert [hist.delta_counts[i] for i in intervals] == [3, 2, 1]
        assert [hist.cumulative_counts[i] for i in intervals] == [3, 5, 6]
        assert hist.cumulative_buckets == _expected_buckets([d for b in per_batch for d in b])
        assert abs(hist.cumulative_sums[-1] - sum(sum(b) for b in per_batch)) < 1e-9
        (skipped,) = rank.counter(MEGATRON_TRAINING_SKIPPED_ITERS)
        assert skipped.total == 3
        assert rank.gauge(MEGATRON_TRAINING_LOSS)[0].values[:3] == [3.0, 2.5, 2.0]


def test_a_cumulative_reset_continues_the_running_total(tmp_path):
    """A cumulative counter whose start time changes (a restart) is added on, not subtracted."""
    name = MEGATRON_TRAINING_SKIPPED_ITERS
    points = [(T0, T0 + S, 2, {}), (T0, T0 + 2 * S, 5, {}), (T0 + 3 * S, T0 + 4 * S, 1, {})]
    write_lines(
        tmp_path / "metrics-rank0.jsonl",
        [metrics_line(0, [counter(name, [p], "cumulative")]) for p in points],
    )
    (series,) = load_run(tmp_path).ranks[0].counter(name)
    assert series.totals == [2, 5, 6]


def test_a_cumulative_histogram_reset_starts_a_new_interval(tmp_path):
    """A cumulative histogram with a new start time counts its buckets as the next interval."""
    bounds = [10.0, 20.0]
    points = [
        (T0, T0 + S, [1, 2, 0], 40.0),
        (T0, T0 + 2 * S, [1, 4, 1], 100.0),
        (T0 + 3 * S, T0 + 4 * S, [0, 1, 0], 15.0),
    ]
    write_lines(
        tmp_path / "metrics-rank0.jsonl",
        [
            metrics_line(
                0, [histogram(MEGATRON_TRAINING_STEP_DURATION_MS, [p], bounds, "cumulative")]
            )
            for p in points
        ],
    )
    (hist,) = load_run(tmp_path).ranks[0].histogram(MEGATRON_TRAINING_STEP_DURATION_MS)
    assert hist.delta_buckets == [[1, 2, 0], [0, 2, 1], [0, 1, 0]]
    assert hist.cumulative_buckets == [1, 5, 1] and hist.cumulative_counts == [3, 6, 7]


def test_a_run_in_progress_shows_its_open_spans(tmp_path):
    """Start-only spans last to the rank's last time; fresh files with them are in progress."""
    lines = [
        span_record("span_start", MEGATRON_TRAIN, "1" * 16, None, T0),
        *span_lines(
            MEGATRON_TRAIN_ITERATION,
            "2" * 16,
            "1" * 16,
            T0 + S,
            T0 + 3 * S,
            attributes={"megatron.iteration": 1},
        ),
        span_record("span_start", MEGATRON_CHECKPOINT_SAVE, "3" * 16, "1" * 16, T0 + 4 * S),
    ]
    write_lines(tmp_path / "spans-rank0.jsonl", lines)
    write_lines(tmp_path / "metrics-rank0.jsonl", [_loss_line(0, 7, 2.0)])
    run = load_run(tmp_path, now_s=time.time())
    open_spans = [s for s in run.spans if s.open]
    assert [s.name for s in open_spans] == [MEGATRON_TRAIN, MEGATRON_CHECKPOINT_SAVE]
    assert all(s.truncated for s in open_spans)
    assert all(run.span_end_ns(s) == T0 + 7 * S for s in open_spans)  # the rank's last time
    assert any("2 spans never ended" in n for n in run.notes)
    assert any("still in progress" in n for n in run.notes)
    old = time.time() - 3600
    for path in tmp_path.iterdir():
        os.utime(path, (old, old))
    assert not any("still in progress" in n for n in load_run(tmp_path).notes)


def test_spans_ended_at_exit_are_truncated(tmp_path):
    """A span carrying otel_training.span.truncated = true is truncated, and said so."""
    write_lines(
        tmp_path / "spans-rank0.jsonl",
        span_lines(
            MEGATRON_TRAIN,
            "1" * 16,
            None,
            T0,
            T0 + S,
            status="ERROR",
            attributes={TRUNCATED_ATTRIBUTE: True},
        ),
    )
    run = load_run(tmp_path)
    (span,) = run.spans
    assert span.truncated and span.failed and not span.open
    assert span.status_description == "RuntimeError: boom"
    assert any("ended then (truncated)" in n for n in run.notes)


def test_older_runs_in_the_same_files_are_left_out(tmp_path):
    """Lines of two runs in one flat file: the later run is read, the other named."""
    write_lines(
        tmp_path / "metrics-rank0.jsonl",
        [_loss_line(0, 1, 9.0, run_id="old" * 4), _loss_line(0, 100, 1.0, run_id="new" * 4)],
    )
    run = load_run(tmp_path)
    assert run.run_id == "new" * 4 and run.other_run_ids == ["old" * 4]
    assert run.ranks[0].gauge(MEGATRON_TRAINING_LOSS)[0].values == [1.0]
    assert any("1 other run" in n for n in run.notes)


def test_traces_complete_span_lines_that_lack_an_end(tmp_path):
    """An end that the span lines lack is taken from the OTLP-JSON traces file."""
    write_lines(
        tmp_path / "spans-rank0.jsonl",
        [
            *span_lines(MEGATRON_TRAIN_ITERATION, "2" * 16, None, T0, T0 + S),
            span_record("span_start", MEGATRON_CHECKPOINT_SAVE, "3" * 16, None, T0 + 2 * S),
        ],
    )
    write_lines(
        tmp_path / "traces-rank0.jsonl",
        [
            traces_line(
                0,
                [
                    {
                        "name": MEGATRON_CHECKPOINT_SAVE,
                        "span_id": "3" * 16,
                        "start_ns": T0 + 2 * S,
                        "end_ns": T0 + 5 * S,
                        "status": "ERROR",
                        "attributes": {"megatron.iteration": 7},
                    }
                ],
            )
        ],
    )
    run = load_run(tmp_path)
    save = next(s for s in run.spans if s.name == MEGATRON_CHECKPOINT_SAVE)
    assert (
        save.end_ns == T0 + 5 * S and save.status == "ERROR" and save.status_description == "boom"
    )
    assert save.source == "spans+traces" and save.attributes["megatron.iteration"] == 7
    assert not any("never ended" in n for n in run.notes)


def test_complete_span_lines_spare_the_traces_file(tmp_path):
    """Where a rank's span lines are complete, its traces file is not read (and says why)."""
    write_lines(
        tmp_path / "spans-rank0.jsonl", span_lines(MEGATRON_TRAIN, "1" * 16, None, T0, T0 + S)
    )
    write_lines(
        tmp_path / "traces-rank0.jsonl",
        [
            traces_line(
                0, [{"name": "extra", "span_id": "9" * 16, "start_ns": T0, "end_ns": T0 + 1}]
            )
        ],
    )
    run = load_run(tmp_path)
    assert [s.name for s in run.spans] == [MEGATRON_TRAIN]
    traces = next(f for f in run.files if f.signal == "traces")
    assert traces.skipped and traces.lines == 0
    status = (tmp_path / "traces-rank0.jsonl").stat()  # its size and time are still shown
    assert (traces.size_bytes, traces.mtime_s) == (status.st_size, status.st_mtime)


def test_traces_stand_in_for_missing_span_lines(tmp_path):
    """Without span lines, a rank's spans come from its traces file, parents and status kept."""
    spans = [
        {"name": MEGATRON_TRAIN, "span_id": "1" * 16, "start_ns": T0, "end_ns": T0 + 9 * S},
        {
            "name": MEGATRON_TRAIN_ITERATION,
            "span_id": "2" * 16,
            "parent": "1" * 16,
            "start_ns": T0 + S,
            "end_ns": T0 + 2 * S,
            "status": "ERROR",
        },
    ]
    write_lines(tmp_path / "traces-rank1.jsonl", [traces_line(1, spans)])
    run = load_run(tmp_path)
    assert [(s.rank, s.name, s.parent_span_id, s.status, s.source) for s in run.spans] == [
        (1, MEGATRON_TRAIN, None, "UNSET", "traces"),
        (1, MEGATRON_TRAIN_ITERATION, "1" * 16, "ERROR", "traces"),
    ]


def test_worker_processes_read_what_one_process_reads(tmp_path):
    """Reading files in worker processes gives the same run as reading them here."""
    for rank in range(3):
        write_lines(
            tmp_path / f"metrics-rank{rank}.jsonl",
            [_loss_line(rank, t, t * 0.5 + rank) for t in range(1, 30)],
        )
        write_lines(
            tmp_path / f"spans-rank{rank}.jsonl",
            [
                line
                for i in range(20)
                for line in span_lines(
                    MEGATRON_TRAIN_ITERATION,
                    f"{rank:02x}{i:014x}",
                    None,
                    T0 + i * S,
                    T0 + i * S + S // 2,
                    rank=rank,
                )
            ],
        )
    one, many = load_run(tmp_path, workers=1), load_run(tmp_path, workers=2)
    assert list(one.ranks) == list(many.ranks) == [0, 1, 2]
    for rank in one.ranks:
        assert one.ranks[rank].gauges == many.ranks[rank].gauges
    assert one.spans == many.spans and len(one.spans) == 60
