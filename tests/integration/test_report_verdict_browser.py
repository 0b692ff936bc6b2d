"""The report opens with its verdict (report/verdict.py, the template's ``#verdict``): loaded
from file:// in a real headless Chromium, the first heading of the page is the verdict's word
and sentence, readable as text, in the words ``otel-training health`` prints; for a healthy
job, a hung one (its culprit named), one with a straggler, and a job whose first attempt was
killed and whose figures are estimated. Run directories written by the real SDK
(tests/health_sim.py)."""

from __future__ import annotations

import datetime as dt
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest
from health_sim import SimRank, job_resource, simulated, write_process
from support import chromium_dump_dom, import_or_unavailable

from otel_training.health import ledger as L
from otel_training.report import find_run_directory, load_job
from otel_training.report.health import assess_read, format_text

import_or_unavailable("plotly")

from otel_training.report import write_report  # noqa: E402

#: The sims' clock starts this long before now: the real SDK dates every export now, so a
#: job is judged as of its last export (now); a hung one stalls for most of it.
AGO_S = 2000.0


def _iso(unix_s: float) -> str:
    return dt.datetime.fromtimestamp(unix_s, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[
        :-3
    ] + "Z"  # fmt: skip


def healthy(out: Path) -> Path:
    """Two ranks of five steps and a save (4.2 s), shut down cleanly."""
    t0 = time.time() - 5.0
    for rank in (0, 1):
        sim = simulated(t0)
        sim.process.rank = rank
        write_process(out / "run", sim, job_resource(rank, 0, _iso(t0), "run", "healthy"))
    return out / "run"


def hung(out: Path) -> Path:
    """Two ranks, 30 steps; then rank 0 waits in the collective while rank 1 computes, for
    1,000 s (tests/report/test_report_health.py's ``hung_job``, written to files)."""
    t0 = time.time() - AGO_S
    ranks = [SimRank(t0, rank=r) for r in (0, 1)]
    for sim in ranks:
        sim.advance(2.0)
        for _ in range(30):
            sim.step()
    ranks[0].ledger.enter(L.ITERATION)
    ranks[0].ledger.enter(L.COMMUNICATION)
    ranks[1].ledger.enter(L.ITERATION)
    ranks[1].ledger.enter(L.FORWARD_BACKWARD)
    for sim in ranks:
        sim.advance(1000.0)
        write_process(out / "run", sim, job_resource(sim.process.rank, 0, _iso(t0), "run", "hung"))
    return out / "run"


def straggling(out: Path) -> Path:
    """Two ranks of 400 steps, exported every 20; rank 1 computes 50 % longer and waits as much
    less (tests/report/test_report_health_figures.py's ``straggling_job``, written to files)."""
    t0 = time.time() - 50.0
    for rank in (0, 1):
        sim = SimRank(t0, rank=rank)
        sim.advance(1.0)
        slow = rank == 1

        def steps(i: int, sim=sim, slow=slow) -> None:
            for _ in range(20):
                sim.step(compute=0.09 if slow else 0.06, communication=0.005 if slow else 0.035)

        write_process(
            out / "run", sim, job_resource(rank, 0, _iso(t0), "run", "straggling"),
            exports=20, before_export=steps,
        )  # fmt: skip
    return out / "run"


def killed_then_restarted(out: Path) -> Path:
    """Job of a world of 3 whose rank 2 left no files (an estimate); attempt 0 killed inside a
    step (tests/report/test_report_cli.py's ``_killed_job``), attempt 1 started after its last
    export and complete (its exports wait until its sim's clock has passed: 4.5 s)."""
    for attempt in (0, 1):
        t0 = time.time() - (6.0 if attempt == 0 else 0.0)
        for rank in (0, 1):
            attrs = job_resource(rank, attempt, _iso(t0), f"run-a{attempt}", "job")
            attrs["dl.world_size"] = 3
            sim = simulated(t0)
            sim.process.rank = rank
            if attempt == 0:
                sim.begin_step(0.5)
            wait = (
                (lambda i, end=sim.now: time.sleep(max(0.0, end - time.time())))
                if attempt
                else None
            )
            write_process(out / f"run-a{attempt}", sim, attrs, before_export=wait)
    return out / "run-a1"


class _Text(HTMLParser):
    """The page's headings and the verdict's text, in document order."""

    def __init__(self) -> None:
        super().__init__()
        self.headings: list[tuple[str, str]] = []  # (id of its section, text)
        self.section: list[str] = []
        self.heading: list[str] | None = None
        self.verdict: list[str] = []
        self.depth = 0
        self.in_verdict = False
        self.links: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "section":
            self.section.append(attrs.get("id") or "")
            if attrs.get("id") == "verdict":
                self.in_verdict = True
        if tag in ("h2", "h3") and self.heading is None:
            self.heading = []
        if tag == "a" and self.in_verdict:
            self.links.append(attrs.get("href") or "")

    def handle_endtag(self, tag):
        if tag == "section" and self.section:
            if self.section.pop() == "verdict":
                self.in_verdict = False
        if tag in ("h2", "h3") and self.heading is not None:
            self.headings.append((self.section[-1] if self.section else "", "".join(self.heading)))
            self.heading = None

    def handle_data(self, data):
        if self.heading is not None:
            self.heading.append(data)
        if self.in_verdict:
            self.verdict.append(data)


def _opened(directory: Path, tmp_path: Path) -> tuple[_Text, str, set[str]]:
    """The report of ``directory`` as Chromium shows it, the terminal summary of the same
    job, and the ids on the page."""
    job = load_job(find_run_directory(directory))
    page = write_report(job, tmp_path / "report.html")
    dom = chromium_dump_dom(page.as_uri(), tmp_path / "profile")
    text = _Text()
    text.feed(dom)
    ids = set(__import__("re").findall(r'id="([^"]+)"', dom))
    return text, format_text(assess_read(job)), ids


def _verdict_text(text: _Text) -> str:
    return " ".join(" ".join(text.verdict).split())


@pytest.mark.parametrize(
    ("make", "word", "says"),
    [
        (healthy, "Healthy", ["completed (attempt 0, last step 5)", "hang: none",
                              "stragglers: not judged: too few steps"]),
        (hung, "Problem", ["hang: attempt 0 has made no progress for",
                           "culprit: rank 1 (outside communication)", "Problem ended hung"]),
        (straggling, "Attention", ["stragglers: attempt 0, rank 1: score",
                                   "cause compute", "hang: none"]),
        (killed_then_restarted, "Attention", ["attempts: 2, 1 failed or killed before the last: "
                                              "attempt 0 killed (steps 1–5 lost)",
                                              "estimated: attempt 0: ", "hang: none",
                                              "rank 2 of its 3 left no files"]),
    ],
    ids=["healthy", "hung", "straggler", "killed-and-estimated"],
)  # fmt: skip
def test_the_page_opens_with_the_verdict_in_the_words_of_health(make, word, says, tmp_path):
    """The first heading of the page is the verdict (word, then sentence); each question's
    answer is in it as text, with the same words and the same first line as the terminal's
    summary, each linking to an element of the page."""
    text, terminal, ids = _opened(make(tmp_path / "out"), tmp_path)
    section, heading = text.headings[0]
    assert section == "verdict"
    assert " ".join(heading.split()).startswith(word + " ")
    assert terminal.splitlines()[0] == f"{word}: {' '.join(heading.split())[len(word) + 1 :]}"
    verdict = _verdict_text(text)
    for words in says:
        assert words in verdict or words in terminal, words
        if not words.startswith("Problem"):
            assert words in terminal, words  # one wording: the terminal says it alike
    for topic in ("hang", "stragglers", "attempts", "estimated"):
        assert f"{topic}:" in verdict
    assert all(link.startswith("#") and link[1:] in ids for link in text.links), text.links


def test_the_verdict_of_a_hung_job_names_its_culprit_first(tmp_path):
    """Hung: the verdict's sentence is the hang's, with its culprit; its link goes to the
    hang's box of the Run health section."""
    text, _, _ = _opened(hung(tmp_path / "out"), tmp_path)
    heading = " ".join(text.headings[0][1].split())
    assert heading.startswith("Problem hang: attempt 0 has made no progress")
    assert heading.endswith("culprit: rank 1 (outside communication)")
    assert "#health-hang" in text.links


def test_first_screen_screenshots(tmp_path):
    """The report's first screen (1200 x 800) of a healthy and of a hung job: PNGs Chromium
    wrote (docs/report-verdict-*.png are these, taken with REPORT_SCREENSHOTS=DIR)."""
    import os

    target = Path(os.environ.get("REPORT_SCREENSHOTS") or tmp_path)
    for name, make in (("healthy", healthy), ("problem", hung)):
        job = load_job(find_run_directory(make(tmp_path / name)))
        page = write_report(job, tmp_path / f"{name}.html")
        png = target / f"report-verdict-{name}.png"
        chromium_dump_dom(
            page.as_uri(), tmp_path / f"profile-{name}",
            f"--screenshot={png}", "--window-size=1200,800",
        )  # fmt: skip
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
