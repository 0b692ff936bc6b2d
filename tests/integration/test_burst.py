"""A burst of spans from many threads with the embedded default at default settings."""

from __future__ import annotations

import collections
import json
import textwrap
from pathlib import Path

BURST = textwrap.dedent(
    """
    import json, threading
    import otel_training as ot
    t = ot.configure()
    def work(n):
        for i in range(10_000):
            with t.tracer.start_as_current_span(f"burst.{n}") as span:
                span.set_attribute("i", i)
    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ok = t.shutdown()
    print(json.dumps({"run_dir": t.output_dir, "ok": ok}))
    """
)


def test_eight_threads_of_10000_spans_lose_none_locally(run_python, tmp_path):
    """8 threads x 10,000 spans: the OTLP-JSON traces file and the span JSON lines hold all
    80,000, every line within 1 MiB."""
    result = run_python(
        BURST, env={"OTEL_PYTHON_TRAINING_OUTPUT_DIR": str(tmp_path)}, timeout_s=240
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["ok"], result.stderr[-3000:]
    run = Path(report["run_dir"])
    names: list[str] = []
    raw = (run / "traces-rank0.jsonl").read_bytes().splitlines()
    for line in raw:
        for resource in json.loads(line)["resourceSpans"]:
            for scope in resource["scopeSpans"]:
                names.extend(span["name"] for span in scope["spans"])
    assert len(names) == 80_000
    assert collections.Counter(names) == {f"burst.{n}": 10_000 for n in range(8)}
    assert max(len(line) for line in raw) < 1024 * 1024
    ends = sum(
        b'"span_end"' in line for line in (run / "spans-rank0.jsonl").read_bytes().splitlines()
    )
    assert ends == 80_000
    assert "dropping" not in result.stderr.lower()
