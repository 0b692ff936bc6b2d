"""configure() in real processes against a real OTLP receiver, a black hole and a refused port:
dead collectors (case A2), environment handling (case A4), exit, SIGTERM and fork."""

from __future__ import annotations

import base64
import json
import signal
import textwrap

import pytest
from support import start_python, terminate_when_ready

TRAIN_AGAINST_ENDPOINT = textwrap.dedent(
    """
    import json, sys, threading
    import otel_training
    telemetry = otel_training.configure()
    # Everything the training thread calls while it trains: no exporter, gRPC or HTTP code may
    # run on it (all network I/O belongs to the export threads).
    entered = set()
    NETWORK = ("opentelemetry.exporter", "grpc", "requests", "urllib3", "http.client")
    def profile(frame, event, arg):
        if event == "call":
            module = frame.f_globals.get("__name__", "")
            if module.startswith(NETWORK):
                entered.add(module)
    sys.setprofile(profile)
    for step in range(200):
        with telemetry.tracer.start_as_current_span("train_step"):
            pass
        otel_training.record_training_metrics(
            telemetry.meter, step_duration_ms=100.0, loss=2.0, throughput_tflops=1.0,
            grad_norm=1.0, skipped_iters=0, learning_rate=1e-4, tokens_per_sec=1e4,
            memory_allocated_gb=1.0,
        )
    sys.setprofile(None)
    exporting = sorted(t.name for t in threading.enumerate() if t is not threading.main_thread())
    ok = telemetry.shutdown()
    print(json.dumps({"ok": ok, "entered": sorted(entered), "threads": exporting}))
    """
)


def _last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("variant", ["refused", "black_hole"])
@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_case_a2_dead_collector_never_stalls_training_or_exit(
    run_python, tmp_path, request, variant, protocol
):
    """Case A2: with no answering collector the training thread never enters exporter or
    network code, the span JSON lines hold all 200 steps, and the process exits normally
    (a bounded shutdown; its duration is measured by bench/bad_day.py)."""
    endpoint = (
        request.getfixturevalue("refused_endpoint")
        if variant == "refused"
        else request.getfixturevalue("black_hole").endpoint
    )
    result = run_python(
        TRAIN_AGAINST_ENDPOINT,
        env={
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
            "OTEL_EXPORTER_OTLP_TIMEOUT": "3",
            "OTEL_METRIC_EXPORT_INTERVAL": "500",
            "OTEL_BSP_SCHEDULE_DELAY": "200",
            "OTEL_PYTHON_TRAINING_JSONLOG_DIR": str(tmp_path),
        },
        timeout_s=60,
    )
    assert result.returncode == 0, result.stderr
    report = _last_json(result.stdout)
    assert report["entered"] == [], report
    assert {"otel-training-jsonlog"} <= set(report["threads"]), report
    lines = (tmp_path / "latest" / "spans-rank0.jsonl").read_text().splitlines()
    assert sum('"span_end"' in line for line in lines) == 200
    assert result.stderr.count("Traceback") <= 2, result.stderr[-3000:]


def test_destination_goes_to_stderr_without_logging_setup(run_python, tmp_path):
    """Without any logging configuration the destination line is printed to stderr once."""
    result = run_python(
        "import otel_training; otel_training.configure()",
        env={"OTEL_PYTHON_TRAINING_OUTPUT_DIR": str(tmp_path)},
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("otel-training telemetry: metrics to OTLP-JSON file") == 1


def test_case_a4c_zero_interval_is_no_busy_loop(run_python, otlp_receiver):
    """Case A4(c): interval "0" warns and uses 60 s: at most the shutdown export in 3 s."""
    for raw in ("abc", "0", "-5000"):
        otlp_receiver.clear()
        result = run_python(
            textwrap.dedent(
                """
                import time, otel_training
                t = otel_training.configure()
                end = time.monotonic() + 1.0
                while time.monotonic() < end:
                    otel_training.record_training_metrics(t.meter, loss=1.0)
                    time.sleep(0.01)
                t.shutdown()
                """
            ),
            env={**otlp_receiver.env("grpc"), "OTEL_METRIC_EXPORT_INTERVAL": raw},
        )
        assert result.returncode == 0, result.stderr
        assert "OTEL_METRIC_EXPORT_INTERVAL" in result.stderr
        assert len(otlp_receiver.metric_requests()) == 1, raw


def test_case_a4b_metrics_none_traces_otlp(run_python, otlp_receiver):
    """Case A4(b): no metric export attempt, no connection errors; traces still arrive."""
    result = run_python(
        textwrap.dedent(
            """
            import otel_training
            t = otel_training.configure()
            for _ in range(20):
                otel_training.record_training_metrics(t.meter, loss=1.0)
            with t.tracer.start_as_current_span("megatron.train"):
                pass
            t.shutdown()
            """
        ),
        env={
            **otlp_receiver.env("grpc"),
            "OTEL_METRICS_EXPORTER": "none",
            "OTEL_TRACES_EXPORTER": "otlp",
        },
    )
    assert result.returncode == 0, result.stderr
    assert otlp_receiver.metric_requests() == []
    assert [s.name for s in otlp_receiver.spans()] == ["megatron.train"]
    assert "rror" not in result.stderr


def test_case_a4e_headers_reach_the_collector(run_python, otlp_receiver):
    """Case A4(e): a header value with a space is sent; the bare entry is named by its
    position in one warning, its content never shown (nor by the SDK)."""
    result = run_python(
        textwrap.dedent(
            """
            import otel_training
            t = otel_training.configure()
            otel_training.record_training_metrics(t.meter, loss=1.0)
            t.shutdown()
            """
        ),
        env={
            **otlp_receiver.env("http/protobuf"),
            "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer abc def,bare",
        },
    )
    assert result.returncode == 0, result.stderr
    assert "entry 2" in result.stderr and "bare" not in result.stderr
    headers = [
        h for signal_name, _, h in otlp_receiver.request_headers() if signal_name == "metrics"
    ]
    assert headers and headers[0]["authorization"] == "Bearer abc def"


def test_last_interval_is_exported_at_normal_exit(run_python, otlp_receiver):
    """A script that never calls shutdown() still delivers its last values at exit."""
    result = run_python(
        "import otel_training\n"
        "otel_training.record_training_metrics(otel_training.get_meter(), loss=3.5)\n",
        env=otlp_receiver.env("grpc"),
    )
    assert result.returncode == 0, result.stderr
    assert [p.value for p in otlp_receiver.metrics("megatron.training.loss")] == [3.5]


def test_sigterm_flushes_then_terminates(repo_root, otlp_receiver, tmp_path):
    """On SIGTERM the last values are exported, then the process dies of SIGTERM as before."""

    code = textwrap.dedent(
        """
        import sys, time, otel_training
        t = otel_training.configure()
        otel_training.record_training_metrics(t.meter, loss=4.25)
        print("ready", flush=True)
        time.sleep(60)
        """
    )
    status, stderr = terminate_when_ready(start_python(code, env=otlp_receiver.env("grpc")))
    assert status == -signal.SIGTERM, stderr[-3000:]
    assert [p.value for p in otlp_receiver.metrics("megatron.training.loss")] == [4.25]


def test_forked_child_does_not_reexport(run_python, otlp_receiver):
    """A forked child (a DataLoader worker) never exports the parent's values."""
    result = run_python(
        textwrap.dedent(
            """
            import os, time, otel_training
            t = otel_training.configure()
            otel_training.record_training_metrics(t.meter, loss=1.0)
            t.force_flush()
            pid = os.fork()
            if pid == 0:
                time.sleep(1.5)   # 15 export intervals of the restarted reader thread
                os._exit(0)
            t.shutdown()
            print(time.time_ns(), flush=True)
            os.waitpid(pid, 0)
            """
        ),
        env={**otlp_receiver.env("grpc"), "OTEL_METRIC_EXPORT_INTERVAL": "100"},
    )
    assert result.returncode == 0, result.stderr
    parent_done_ns = int(result.stdout.split()[-1])
    # The SDK restarts the reader thread in the child; had it exported, points stamped after
    # the parent's shutdown would have arrived during the child's 1.5 s.
    points = otlp_receiver.metrics("megatron.training.loss")
    assert points
    assert all(p.time_unix_nano <= parent_done_ns for p in points)


def test_delta_preference_reaches_the_exporter(run_python, otlp_receiver):
    """OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE=delta makes counters delta."""
    result = run_python(
        "import otel_training\n"
        "t = otel_training.configure()\n"
        "otel_training.record_training_metrics(t.meter, skipped_iters=2, step_duration_ms=5)\n"
        "t.shutdown()\n",
        env={
            **otlp_receiver.env("grpc"),
            "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE": "delta",
        },
    )
    assert result.returncode == 0, result.stderr
    (counter,) = otlp_receiver.metrics("megatron.training.skipped_iters")
    assert (counter.temporality, counter.value, counter.is_monotonic) == ("delta", 2, True)
    (histogram,) = otlp_receiver.metrics("megatron.training.step_duration_ms")
    assert histogram.temporality == "delta"


def test_fork_while_threads_record_never_deadlocks(run_python, tmp_path):
    """Children forked while other threads record can record and exit (no inherited lock)."""
    result = run_python(
        textwrap.dedent(
            """
            import os, threading, time, otel_training
            t = otel_training.configure()
            stop = threading.Event()
            def work():
                while not stop.is_set():
                    otel_training.record_training_metrics(t.meter, loss=1.0, step_duration_ms=2.0)
            threads = [threading.Thread(target=work) for _ in range(3)]
            for thread in threads:
                thread.start()
            children = []
            for _ in range(20):
                pid = os.fork()
                if pid == 0:
                    otel_training.record_training_metrics(t.meter, loss=2.0, step_duration_ms=3.0)
                    os._exit(0)
                children.append(pid)
            codes = [os.waitpid(pid, 0)[1] for pid in children]
            stop.set()
            for thread in threads:
                thread.join()
            t.shutdown()
            print(sum(1 for c in codes if c == 0))
            """
        ),
        env={"OTEL_PYTHON_TRAINING_OUTPUT_DIR": str(tmp_path)},
        timeout_s=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-1] == "20"


def test_every_configured_pipeline_is_flushed_at_exit(run_python, otlp_receiver):
    """configure() twice: values on both pipelines reach the collector at exit."""
    result = run_python(
        textwrap.dedent(
            """
            import otel_training
            first = otel_training.configure()
            otel_training.record_training_metrics(first.meter, loss=1.0)
            second = otel_training.configure()
            otel_training.record_training_metrics(second.meter, learning_rate=0.5)
            del first, second
            """
        ),
        env=otlp_receiver.env("grpc"),
    )
    assert result.returncode == 0, result.stderr
    assert [p.value for p in otlp_receiver.metrics("megatron.training.loss")] == [1.0]
    assert [p.value for p in otlp_receiver.metrics("megatron.training.learning_rate")] == [0.5]


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_no_secret_reaches_stderr_and_userinfo_becomes_basic_auth(
    run_python, otlp_receiver, protocol
):
    """A malformed header entry and URL userinfo never appear on stderr (ours or the SDK's
    lines); the credentials reach the collector as an authorization header."""
    endpoint = otlp_receiver.env(protocol)["OTEL_EXPORTER_OTLP_ENDPOINT"]
    with_userinfo = endpoint.replace("http://", "http://trainer:PASSWORD1@")
    result = run_python(
        textwrap.dedent(
            """
            import otel_training
            t = otel_training.configure()
            print(t.destination)
            otel_training.record_training_metrics(t.meter, loss=1.0)
            t.shutdown()
            """
        ),
        env={
            **otlp_receiver.env(protocol),
            "OTEL_EXPORTER_OTLP_ENDPOINT": with_userinfo,
            "OTEL_EXPORTER_OTLP_HEADERS": "x-api-key:SECRET2,x-tenant=llm",
        },
    )
    assert result.returncode == 0, result.stderr
    for secret in ("PASSWORD1", "SECRET2"):
        assert secret not in result.stderr + result.stdout
    headers = [
        h for signal_name, _, h in otlp_receiver.request_headers() if signal_name == "metrics"
    ]
    assert headers
    lowered = {k.lower(): v for k, v in headers[0].items()}
    assert lowered["authorization"] == "Basic " + base64.b64encode(b"trainer:PASSWORD1").decode()
    assert lowered["x-tenant"] == "llm" and "x-api-key" not in lowered


def test_a_counter_at_the_int64_maximum_saturates_and_exports_go_on(run_python, otlp_receiver):
    """skipped_iters 2**63-1, then 1, then 2**80: the counter stays at int64's maximum, one
    warning, and the exports after it still succeed (a later loss arrives)."""
    result = run_python(
        textwrap.dedent(
            """
            import otel_training
            t = otel_training.configure()
            otel_training.record_training_metrics(t.meter, skipped_iters=2**63 - 1)
            t.force_flush()
            otel_training.record_training_metrics(t.meter, skipped_iters=1)
            otel_training.record_training_metrics(t.meter, skipped_iters=2**80)
            t.force_flush()
            otel_training.record_training_metrics(t.meter, loss=0.25)
            t.shutdown()
            """
        ),
        env=otlp_receiver.env("grpc"),
    )
    assert result.returncode == 0, result.stderr
    counters = otlp_receiver.metrics("megatron.training.skipped_iters")
    assert len(counters) >= 3 and {p.value for p in counters} == {2**63 - 1}
    assert all(isinstance(p.value, int) for p in counters)
    assert [p.value for p in otlp_receiver.metrics("megatron.training.loss")] == [0.25]
    assert result.stderr.count("int64 maximum") == 1


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_an_unreachable_collector_is_one_line_over_several_export_intervals(
    run_python, refused_endpoint, protocol
):
    """A closed loopback port, metrics every 0.5 s and spans every 0.2 s for 4 s, then the
    shutdown: one line on stderr about it (besides the destination line), not the SDK's
    retry and error lines."""
    result = run_python(
        textwrap.dedent(
            """
            import time, otel_training
            telemetry = otel_training.configure()
            for step in range(40):
                with telemetry.tracer.start_as_current_span("step"):
                    otel_training.record_training_metrics(telemetry.meter, loss=2.0)
                time.sleep(0.1)
            telemetry.shutdown()
            """
        ),
        env={
            "OTEL_EXPORTER_OTLP_ENDPOINT": refused_endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
            "OTEL_EXPORTER_OTLP_TIMEOUT": "1",
            "OTEL_METRIC_EXPORT_INTERVAL": "500",
            "OTEL_BSP_SCHEDULE_DELAY": "200",
        },
        timeout_s=60,
    )
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines[0].startswith("otel-training telemetry: metrics to OTLP"), lines
    assert len(lines) == 2, result.stderr
    assert lines[1].startswith("otel-training: OTLP export failed (") and "Said once" in lines[1]


def test_rank_1_under_torchrun_prints_nothing_unless_asked(run_python, tmp_path):
    """RANK=1 of 2 (a torchrun worker): configure() and shutdown() write nothing to stderr or
    stdout; with OTEL_PYTHON_TRAINING_PRINT_ALL_RANKS=true it writes its telemetry line, and
    so does it when it alone exports (EXPORT_RANKS=last); rank 0 writes it either way."""
    code = "import otel_training; otel_training.configure(); otel_training.shutdown()"
    torchrun = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                "OTEL_PYTHON_TRAINING_OUTPUT_DIR": str(tmp_path)}  # fmt: skip
    quiet = run_python(code, env=torchrun)
    assert quiet.returncode == 0 and (quiet.stdout, quiet.stderr) == ("", "")
    asked = run_python(code, env={**torchrun, "OTEL_PYTHON_TRAINING_PRINT_ALL_RANKS": "true"})
    assert asked.stderr.count("otel-training telemetry: metrics to") == 1
    assert "metrics-rank1.jsonl" in asked.stderr
    rank0 = run_python(code, env={**torchrun, "RANK": "0", "LOCAL_RANK": "0"})
    assert rank0.stderr.count("otel-training telemetry: metrics to") == 1
    last = run_python(code, env={**torchrun, "OTEL_PYTHON_TRAINING_EXPORT_RANKS": "last"})
    assert last.stderr.count("otel-training telemetry: metrics to") == 1  # rank 0 exports not
