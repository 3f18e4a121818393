"""The overview's numbers and chart, from the statistics the workers flush (``runtime.stats``).

Two reads, one round trip each: the last 60 minute hashes and the last 25 hour
hashes. Every decision is one failed attempt, so "failed attempts" counts them all;
a successful attempt reports no decision and is not counted.

>>> rows = summarize({1: [Count("celery", "t", "q", "retry", "net.Down", 2)]},
...                  {1: [Count("celery", "t", "q", "dead_letter", "net.Down", 1)]})
>>> rows[0].hour.retries, rows[0].day.dead_lettered, rows[0].top_errors
(2, 1, [('net.Down', 1)])
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone

from markupsafe import Markup, escape

from ojs_adapters.runtime.stats import Count, StatsReader

#: Bar colours of the chart, by decision group (also the legend's order).
COLOURS = {"retry": "#3b82f6", "dead_letter": "#dc2626", "discarded": "#9ca3af"}
LABELS = {"retry": "retries scheduled", "dead_letter": "dead-lettered", "discarded": "discarded"}


@dataclass
class Tally:
    """Decisions of one kind of window for one task and queue."""

    failed: int = 0
    retries: int = 0
    dead_lettered: int = 0
    discarded: int = 0

    def add(self, decision: str, n: int) -> None:
        self.failed += n
        if decision == "retry":
            self.retries += n
        elif decision == "dead_letter":
            self.dead_lettered += n
        else:
            self.discarded += n


@dataclass
class Row:
    """One task and queue: the last hour, the last day, and the day's top error types."""

    task: str
    queue: str
    hour: Tally = field(default_factory=Tally)
    day: Tally = field(default_factory=Tally)
    errors: Counter[str] = field(default_factory=Counter)

    @property
    def top_errors(self) -> list[tuple[str, int]]:
        return self.errors.most_common(3)


def summarize(minutes: Mapping[int, Sequence[Count]],
              hours: Mapping[int, Sequence[Count]]) -> list[Row]:
    """Rows per (task, queue), busiest first (by the day's failed attempts)."""
    rows: dict[tuple[str, str], Row] = {}
    for cells in minutes.values():
        for c in cells:
            rows.setdefault((c.task, c.queue), Row(c.task, c.queue)).hour.add(c.decision, c.n)
    for cells in hours.values():
        for c in cells:
            row = rows.setdefault((c.task, c.queue), Row(c.task, c.queue))
            row.day.add(c.decision, c.n)
            row.errors[c.error_type] += c.n
    return sorted(rows.values(), key=lambda r: (-r.day.failed, r.task, r.queue))


def read(reader: StatsReader, framework: str, *,
         now: float | None = None) -> tuple[dict[int, list[Count]], dict[int, list[Count]]]:
    """The last 60 minutes and the last 25 hours (the current ones included)."""
    minute = int((time.time() if now is None else now) // 60)
    return (reader.minutes(minute - 59, minute, framework),
            reader.hours(minute // 60 - 24, minute // 60, framework))


def series(buckets: Mapping[int, Sequence[Count]]) -> list[tuple[int, dict[str, int]]]:
    """Per bucket, in order: decisions grouped as the chart shows them."""
    out = []
    for number in sorted(buckets):
        groups = {"retry": 0, "dead_letter": 0, "discarded": 0}
        for c in buckets[number]:
            groups[c.decision if c.decision in groups else "discarded"] += c.n
        out.append((number, groups))
    return out


def chart(points: Sequence[tuple[int, dict[str, int]]], *, seconds_per_bucket: int,
          width: int = 720, height: int = 160) -> Markup:
    """A stacked bar chart of ``series`` as inline SVG (server-rendered, escaped labels)."""
    top = max([sum(g.values()) for _, g in points] + [1])
    left, bottom = 36, 20
    plot_w, plot_h = width - left - 4, height - bottom - 8
    step = plot_w / max(len(points), 1)
    parts = [f'<svg class="chart" role="img" viewBox="0 0 {width} {height}" '
             f'width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg">',
             f"<title>{escape('decisions over time')}</title>",
             f'<text x="2" y="14" class="axis">{top}</text>',
             f'<text x="2" y="{8 + plot_h}" class="axis">0</text>',
             f'<line x1="{left}" y1="{8 + plot_h}" x2="{width - 4}" y2="{8 + plot_h}" '
             'class="base"/>']
    for i, (number, groups) in enumerate(points):
        y = float(8 + plot_h)
        for name, colour in COLOURS.items():
            n = groups[name]
            if not n:
                continue
            h = plot_h * n / top
            y -= h
            parts.append(f'<rect x="{left + i * step:.1f}" y="{y:.1f}" '
                         f'width="{max(step - 1, 1):.1f}" height="{h:.1f}" fill="{colour}"><title>'
                         f"{escape(_stamp(number, seconds_per_bucket))}: {n} "
                         f"{escape(LABELS[name])}</title></rect>")
    last = len(points) - 1
    for i, anchor in ((0, "start"), (last // 2, "middle"), (last, "end")):
        if 0 <= i <= last:
            x = left + i * step + (step if anchor == "end" else 0)
            parts.append(f'<text x="{x:.1f}" y="{height - 4}" text-anchor="{anchor}" '
                         f'class="axis">{escape(_stamp(points[i][0], seconds_per_bucket))}</text>')
    parts.append("</svg>")
    return Markup("".join(parts))


def _stamp(number: int, seconds: int) -> str:
    moment = datetime.fromtimestamp(number * seconds, timezone.utc)
    return moment.strftime("%H:%M" if seconds < 3600 else "%d %H:00")
