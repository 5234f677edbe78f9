"""The console's SVG charts: sizes follow the figures, every text is escaped."""

from __future__ import annotations

import re

from durable_agent.operate.spend import Spend, Tokens
from durable_agent.web import charts


def spend(key: str, prompt: int, completion: int) -> Spend:
    return Spend(key=key, billed=Tokens(1, prompt, completion, None))


def test_columns_stack_by_agent_and_scale_to_the_tallest_day() -> None:
    days = [spend("2026-12-01", 0, 0), spend("2026-12-02", 0, 0)]
    day_agents = [
        spend("2026-12-01 billing", 300, 100),
        spend("2026-12-02 billing", 100, 0),
        spend("2026-12-02 <b>x</b>", 50, 50),
    ]
    bars, agents = charts.day_agent_bars(days, day_agents)
    assert agents == ["billing", "<b>x</b>"]
    assert [(b.label, b.parts) for b in bars] == [
        ("2026-12-01", (400, 0)),
        ("2026-12-02", (100, 100)),
    ]
    svg = str(charts.column_chart(bars, "t", agents))
    heights = [float(h) for h in re.findall(r'height="([0-9.]+)"', svg)[1:]]
    assert max(heights) == heights[0] and abs(heights[2] - heights[0] / 4) < 0.2
    assert "<b>" not in svg and "&lt;b&gt;x&lt;/b&gt;" in svg


def test_more_agents_than_colours_are_summed_as_others() -> None:
    names = [f"a{i}" for i in range(10)]
    day_agents = [spend(f"2026-12-01 {n}", 10 * (i + 1), 0) for i, n in enumerate(names)]
    bars, agents = charts.day_agent_bars([spend("2026-12-01", 0, 0)], day_agents)
    assert len(agents) == len(charts.COLOURS) and agents[-1] == charts.OTHERS
    assert sum(bars[0].parts) == sum(10 * (i + 1) for i in range(10))


def test_row_labels_are_escaped() -> None:
    svg = str(charts.row_chart(charts.spend_bars([spend("<script>", 5, 5)]), "<t>"))
    assert "<script>" not in svg and "&lt;script&gt;" in svg and "&lt;t&gt;" in svg
