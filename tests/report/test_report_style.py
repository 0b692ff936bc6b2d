"""report/style.py and report/wording.py: one colour per span group and phase, labels that
plotly shows as text, ranks said alike everywhere."""

from __future__ import annotations

from otel_training.health.ledger import PHASES
from otel_training.report import style
from otel_training.report.wording import cut, plural, rank_list, ranks_phrase
from otel_training.semconv.spans import SPAN_GROUP_LEVELS


def test_every_span_group_has_its_own_colour():
    """Each group of the registry, and custom, has a colour no other group has, and none is
    the error red."""
    groups = sorted({*SPAN_GROUP_LEVELS, "custom"})
    colors = [style.group_color(g) for g in groups]
    assert set(groups) <= set(style.GROUP_COLORS)
    assert len(set(colors)) == len(groups)
    assert style.ERROR_COLOR not in colors


def test_a_span_group_and_a_ledger_phase_of_one_name_share_a_colour():
    """data_loading, forward_backward, optimizer, communication, evaluate: the timeline's bar
    and the health section's phase are the same colour; every phase has one."""
    assert set(style.PHASE_COLORS) == set(PHASES)
    shared = set(SPAN_GROUP_LEVELS) & set(PHASES)
    assert shared == {"data_loading", "forward_backward", "optimizer", "communication",
                      "evaluate"}  # fmt: skip
    for name in shared:
        assert style.GROUP_COLORS[name] == style.PHASE_COLORS[name]


def test_an_unknown_group_gets_the_same_spare_colour_every_time():
    """A group of a newer registry: a colour chosen by its name, stable, not a known one."""
    color = style.group_color("speculative_decoding")
    assert color == style.group_color("speculative_decoding")
    assert color not in style.GROUP_COLORS.values()


def test_a_label_is_text_to_plotly():
    """Markup is escaped (plotly would read <b>, <br>, <a href>), long names are cut."""
    assert (
        style.label('<a href="http://x">x</a>') == "&lt;a href=&quot;http://x&quot;&gt;x&lt;/a&gt;"
    )
    assert style.label("a" * 100) == "a" * (style.LABEL_LENGTH - 1) + "…"
    assert style.label("a" * 100, None) == "a" * 100


def test_layout_keeps_both_titles_when_axes_are_given():
    """Axis settings passed in are merged with the titles, not put in their place."""
    layout = style.layout("step", "loss", yaxis={"type": "log"}, xaxis={"range": [0, 1]})
    assert layout["yaxis"]["title"] == {"text": "loss"} and layout["yaxis"]["type"] == "log"
    assert layout["xaxis"]["title"] == {"text": "step"} and layout["xaxis"]["range"] == [0, 1]


def test_ranks_are_said_alike():
    """1 rank, rank 0; 2 ranks, ranks 0, 1; runs of three or more as a range."""
    assert plural(1, "rank") == "1 rank" and plural(2, "rank") == "2 ranks"
    assert ranks_phrase([0]) == "rank 0" and ranks_phrase([1, 0]) == "ranks 0, 1"
    assert rank_list([0, 1, 2, 3, 5, 7, 8]) == "0–3, 5, 7, 8"
    assert ranks_phrase([]) == "no rank" and rank_list([]) == "none"


def test_a_long_name_is_cut_saying_how_much():
    """At most the limit, the marker included, saying how many characters went."""
    short = cut("x" * 10_000, 240)
    kept = short.index("…")
    assert short == "x" * kept + f"…[{10_000 - kept:,} more characters]" and len(short) <= 240
    assert cut("short", 240) == "short"
