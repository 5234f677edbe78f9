"""The spend charts, drawn as SVG on the server (no script, no library in the browser).

A chart is a list of bars, each a label and stacked parts; every text is escaped here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from markupsafe import Markup

from ..journal import Spend

COLOURS = ("#3f51b5", "#8c9eff", "#e53935", "#43a047", "#fb8c00", "#8e24aa", "#00897b", "#6d4c41")
PARTS = ("prompt tokens", "completion tokens", "crash waste (tokens)")
OTHERS = "others"


@dataclass(frozen=True, slots=True)
class Bar:
    label: str
    parts: tuple[int, ...]  # stacked, in the order of PARTS

    @property
    def total(self) -> int:
        return sum(self.parts)


def spend_bars(spends: Sequence[Spend]) -> list[Bar]:
    """Billed prompt and completion tokens and the tokens crashes wasted, per row."""
    return [
        Bar(
            s.key,
            (
                s.billed.prompt_tokens,
                s.billed.completion_tokens,
                s.crash_waste.prompt_tokens + s.crash_waste.completion_tokens,
            ),
        )
        for s in spends
    ]


def day_agent_bars(
    days: Sequence[Spend], day_agents: Sequence[Spend]
) -> tuple[list[Bar], list[str]]:
    """Billed tokens per day (oldest first), stacked by agent; and the agents, in stack
    order (the seven that spent most, then the others summed)."""
    spent: dict[str, int] = {}
    for s in day_agents:
        agent = s.key.partition(" ")[2]
        spent[agent] = spent.get(agent, 0) + s.billed.prompt_tokens + s.billed.completion_tokens
    agents = sorted(spent, key=lambda a: -spent[a])
    shown = agents[: len(COLOURS) - 1]
    names = shown + ([OTHERS] if len(agents) > len(shown) else [])
    tokens: dict[tuple[str, str], int] = {}
    for s in day_agents:
        day, _, agent = s.key.partition(" ")
        name = agent if agent in shown else OTHERS
        value = s.billed.prompt_tokens + s.billed.completion_tokens
        tokens[day, name] = tokens.get((day, name), 0) + value
    bars = [Bar(d.key, tuple(tokens.get((d.key, n), 0) for n in names)) for d in days]
    return bars, names


def column_chart(
    bars: Sequence[Bar],
    title: str,
    parts: Sequence[str] = PARTS,
    *,
    width: int = 760,
    height: int = 240,
) -> Markup:
    """Stacked columns, one per bar, left to right as given; ``parts`` names the stack."""
    left, bottom, top = 64, 36, 28
    plot_h = height - bottom - top
    peak = max((b.total for b in bars), default=0) or 1
    step = (width - left - 8) / max(len(bars), 1)
    body = [_frame(width, height, title), *_axis(left, top, plot_h, peak, width)]
    bar_w = min(step * 0.7, 48.0)
    for i, bar in enumerate(bars):
        x = left + i * step + (step - bar_w) / 2
        y = float(top + plot_h)
        for part, value in enumerate(bar.parts):
            h = plot_h * value / peak
            y -= h
            body.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar_w:.1f}" height="{h:.1f}" '
                f'fill="{COLOURS[part]}"><title>{escape(bar.label)}: {value:,} '
                f"{escape(parts[part])}</title></rect>"
            )
        if len(bars) <= 16 or i % max(1, len(bars) // 8) == 0:
            body.append(
                f'<text x="{x + bar_w / 2:.1f}" y="{height - 20}" text-anchor="middle" '
                f'class="tick">{escape(bar.label[-5:] if len(bar.label) == 10 else bar.label)}'
                "</text>"
            )
    return _svg(width, height, title, body)


def row_chart(bars: Sequence[Bar], title: str, *, width: int = 760) -> Markup:
    """Stacked horizontal bars, one row per bar, top to bottom as given."""
    row, top, left = 26, 28, 150
    height = top + row * max(len(bars), 1) + 30
    peak = max((b.total for b in bars), default=0) or 1
    body = [_frame(width, height, title)]
    for i, bar in enumerate(bars):
        y = top + i * row
        x = float(left)
        body.append(
            f'<text x="{left - 8}" y="{y + row * 0.62:.1f}" text-anchor="end" class="tick">'
            f"{escape(bar.label[:22])}</text>"
        )
        for part, value in enumerate(bar.parts):
            w = (width - left - 90) * value / peak
            body.append(
                f'<rect x="{x:.1f}" y="{y + 4}" width="{w:.1f}" height="{row - 8}" '
                f'fill="{COLOURS[part]}"><title>{escape(bar.label)}: {value:,} '
                f"{PARTS[part]}</title></rect>"
            )
            x += w
        body.append(
            f'<text x="{x + 6:.1f}" y="{y + row * 0.62:.1f}" class="tick">{bar.total:,}</text>'
        )
    return _svg(width, height, title, body)


def legend(parts: Sequence[str] = PARTS) -> Markup:
    items = "".join(
        f'<span class="key"><span class="swatch c{i}"></span>{escape(p)}</span>'
        for i, p in enumerate(parts)
    )
    return Markup(f'<p class="legend">{items}</p>')


def _frame(width: int, height: int, title: str) -> str:
    return f'<text x="8" y="18" class="chart-title">{escape(title)}</text>'


def _axis(left: int, top: int, plot_h: int, peak: int, width: int) -> list[str]:
    lines = []
    for fraction in (0, 0.5, 1):
        y = top + plot_h * (1 - fraction)
        lines.append(
            f'<line x1="{left}" x2="{width - 8}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>'
            f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" class="tick">'
            f"{_short(peak * fraction)}</text>"
        )
    return lines


def _short(value: float) -> str:
    if value >= 1_000_000:
        return f"{value / 1_000_000:.1f}M"
    if value >= 1_000:
        return f"{value / 1_000:.1f}k"
    return f"{value:.0f}"


def _svg(width: int, height: int, title: str, body: list[str]) -> Markup:
    return Markup(
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" role="img" aria-label="{escape(title)}" '
        f'class="chart">{"".join(body)}</svg>'
    )
