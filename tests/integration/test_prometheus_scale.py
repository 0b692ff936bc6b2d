"""The small version of bench/prometheus_scale.py: a real Prometheus scrapes the generated
exposition of otel-training's series and stores, per rank, exactly the series the scale model
counts, under the names the stack gives them. About 10 s (Prometheus start, a few scrapes)."""

from __future__ import annotations

from support import load_script, prometheus_or_unavailable


def _bench():
    return load_script("prometheus_scale", "bench")


def test_prometheus_stores_the_series_the_model_counts(tmp_path):
    """Three ranks of the 4,096-rank job: rank 0 (it sends the replicated values) has
    series_per_rank series, rank 1 (it does not) series_per_silent_rank, each with its
    target_info; the step histogram has its 38 buckets."""
    binary = prometheus_or_unavailable()
    bench = _bench()
    model = bench.model
    w = model.Workload(4096)
    load = model.metrics_load(w)
    count = load.series_per_rank + 2 * load.series_per_silent_rank
    series = bench.series_of_job(w, count)
    assert bench._ranks_in(series) == 3
    exposition = bench.Exposition(series)
    server, port = bench.serve(exposition)
    prometheus = bench.Prometheus(binary, tmp_path, scrape_interval_s=1.0)
    try:
        prometheus.add_target(f"127.0.0.1:{port}")
        prometheus.wait_for('count({job="llama3-405b-pretrain"})', count, 60)
        per_rank = {
            rank: prometheus.value(f'count({{job="llama3-405b-pretrain",dl_rank="{rank}"}})')
            for rank in (0, 1, 2)
        }
        buckets = prometheus.value(
            'count(megatron_training_step_duration_ms_milliseconds_bucket{dl_rank="0"})'
        )
    finally:
        prometheus.stop()
        server.shutdown()
    assert per_rank == {
        0: load.series_per_rank,
        1: load.series_per_silent_rank,
        2: load.series_per_silent_rank,
    }
    assert buckets == len(model.views.STEP_DURATION_BUCKETS_MS) + 1
