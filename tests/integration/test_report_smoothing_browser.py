"""The report's smoothing control in a real headless Chromium: moving the weight redraws each
smoothed curve with the page's JavaScript, which must give what ema_smooth (the Python
definition) gives for the same raw points and weight."""

from __future__ import annotations

import json
import math
import random
import re
import subprocess
from pathlib import Path

import pytest
from support import chromium_or_unavailable, import_or_unavailable

import_or_unavailable("plotly")

import otel_training as ot  # noqa: E402
from otel_training.report import build_report, load_job  # noqa: E402
from otel_training.report.rundir import find_run_directory  # noqa: E402
from otel_training.report.series import ema_smooth  # noqa: E402

FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--virtual-time-budget=10000", "--dump-dom",
]  # fmt: skip

#: Appended to the page: sets the weight, fires the control's event, and writes what each
#: smoothed trace then holds, with its raw trace, into the DOM for --dump-dom.
PROBE = """<script>
window.addEventListener("load", function () {
  var input = document.querySelector("input[data-smoothing]");
  input.value = "%s";
  input.dispatchEvent(new Event("input"));
  var found = [];
  document.querySelectorAll(".js-plotly-plot").forEach(function (plot) {
    plot.data.forEach(function (trace) {
      if (trace.meta && typeof trace.meta.smooth_of === "number") {
        found.push({raw: Array.prototype.slice.call(plot.data[trace.meta.smooth_of].y),
                    smoothed: Array.prototype.slice.call(trace.y)});
      }
    });
  });
  var out = document.createElement("pre");
  out.id = "probe";
  out.textContent = JSON.stringify({shown: input.parentNode.querySelector("output").textContent,
                                    found: found});
  document.body.appendChild(out);
});
</script></body>"""


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> str:
    """The report of a real run with a noisy loss (one NaN among them) and grad norm."""
    output = tmp_path_factory.mktemp("smoothing") / "telemetry"
    environ = {
        "OTEL_PYTHON_TRAINING_OUTPUT_DIR": str(output),
        "OTEL_PYTHON_TRAINING_SHUTDOWN_ON_SIGTERM": "false",
    }
    telemetry = ot.configure(environ=environ)
    noise = random.Random(7)
    with ot.training_run():
        for step in range(1, 121):
            with ot.training_iteration(iteration=step):
                pass
            ot.record_training_metrics(telemetry.meter, step_duration_ms=5.0)
            if step % 4 == 0:
                loss = math.nan if step == 60 else 3.0 / math.sqrt(step) + noise.random()
                ot.record_training_metrics(telemetry.meter, loss=loss, grad_norm=noise.random())
    telemetry.shutdown()
    directory = find_run_directory(output)
    ot.testing.reset()
    return build_report(load_job(directory))


@pytest.mark.parametrize("weight", [0.0, 0.35, 0.9, 0.99])
def test_the_pages_smoothing_is_ema_smooth(page, weight, tmp_path):
    """At each weight the redrawn curves equal ema_smooth of their raw points (to 1e-9),
    the weight is shown, and a NaN stays a gap."""
    chromium = chromium_or_unavailable()
    path = Path(tmp_path) / "report.html"
    path.write_text(page.replace("</body>", PROBE % weight), encoding="utf-8")
    done = subprocess.run(
        [chromium, *FLAGS, path.as_uri()], capture_output=True, text=True, timeout=120
    )
    match = re.search(r'<pre id="probe">(.*?)</pre>', done.stdout, re.S)
    assert match, done.stderr[-2000:]
    probe = json.loads(match[1].replace("&quot;", '"').replace("&amp;", "&"))
    assert probe["shown"] == f"{weight:.2f}"
    assert len(probe["found"]) == 2  # the loss and the grad norm
    for series in probe["found"]:
        expected = ema_smooth(series["raw"], weight)
        assert len(series["smoothed"]) == len(expected) > 20
        for got, want in zip(series["smoothed"], expected):
            if want is None:
                assert got is None
            else:
                assert got == pytest.approx(want, rel=1e-9, abs=1e-12)
    assert any(None in series["raw"] for series in probe["found"])  # the NaN: a gap
