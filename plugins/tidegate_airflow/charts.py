"""Server-rendered SVG charts of the tidegate page: one bar per run, no JavaScript.

Pure functions of the status document's ``history`` (:func:`tidegate.status.run_history`), so
they are unit-tested without Airflow. Every bar carries its run id and value as ``data-run`` and
``data-value`` (empty when unknown) and a ``<title>`` tooltip; an unknown value is drawn as a
short grey stub so that a chart always has one bar per run.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

WIDTH, HEIGHT, PAD_TOP, PAD_BOTTOM, PAD_LEFT = 420, 110, 14, 16, 54

# (history field, chart title, unit, bar colour)
SERIES = (("lag_seconds", "lag (seconds)", "s", "#c2571a"),
          ("lag_bytes", "lag (source log bytes)", "B", "#7a4fb0"),
          ("events", "events delivered", "", "#2a6fb0"))


def human(value: float | int | None, unit: str) -> str:
    """A short label: 1.2k, 3.4M, 12.5 s."""
    if value is None:
        return "unknown"
    v = float(value)
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return f"{v / div:.1f}{suffix}{unit}"
    text = f"{v:.1f}" if unit == "s" and not v.is_integer() else f"{v:.0f}"
    return f"{text}{' ' + unit if unit == 's' else unit}"


def bar_chart(series: str, title: str, runs: Sequence[dict[str, Any]], unit: str, color: str) -> str:
    """One SVG bar per run of ``runs`` (oldest first), of the run's ``series`` value."""
    values = [r.get(series) for r in runs]
    top = max([v for v in values if v is not None] or [0]) or 1
    plot_w, plot_h = WIDTH - PAD_LEFT - 4, HEIGHT - PAD_TOP - PAD_BOTTOM
    step = plot_w / max(1, len(runs))
    bar_w = max(2.0, step * 0.7)
    bars = []
    for i, (run, v) in enumerate(zip(runs, values, strict=True)):
        h = 2.0 if v is None else max(1.0, plot_h * float(v) / top)
        x, y = PAD_LEFT + i * step + (step - bar_w) / 2, PAD_TOP + plot_h - h
        label = f"{run.get('run_id')}: {human(v, unit)}"
        kind, fill = ("bar unknown", "#b9c2cc") if v is None else ("bar", color)
        bars.append(f"<rect class='{kind}' data-run='{_e(run.get('run_id'))}' "
                    f"data-value='{'' if v is None else _e(v)}' x='{x:.1f}' y='{y:.1f}' width='{bar_w:.1f}' "
                    f"height='{h:.1f}' fill='{fill}'><title>{_e(label)}</title></rect>")
    axis = (f"<line x1='{PAD_LEFT}' y1='{PAD_TOP + plot_h}' x2='{WIDTH - 4}' y2='{PAD_TOP + plot_h}' "
            f"stroke='#9aa6b2'/><text x='{PAD_LEFT - 4}' y='{PAD_TOP + 4}' text-anchor='end'>"
            f"{_e(human(top, unit))}</text><text x='{PAD_LEFT - 4}' y='{PAD_TOP + plot_h}' "
            f"text-anchor='end'>0</text><text x='{PAD_LEFT}' y='{HEIGHT - 3}'>{len(runs)} runs, oldest "
            f"left</text>")
    return (f"<svg class='chart' data-series='{_e(series)}' role='img' aria-label='{_e(title)}' "
            f"viewBox='0 0 {WIDTH} {HEIGHT}' width='{WIDTH}' height='{HEIGHT}' font-size='10' "
            f"font-family='sans-serif'><title>{_e(title)}</title>"
            f"<text x='{PAD_LEFT}' y='10' font-weight='600'>{_e(title)}</text>{axis}{''.join(bars)}</svg>")


def history_charts(history: Sequence[dict[str, Any]]) -> str:
    """The charts of a pipeline's run history; a note when no run was journaled yet."""
    if not history:
        return "<p class=muted>no journaled run yet</p>"
    return "<div class=charts>" + "".join(bar_chart(s, t, history, u, c) for s, t, u, c in SERIES) + "</div>"


def _e(v: Any) -> str:
    return html.escape("" if v is None else str(v), quote=True)
