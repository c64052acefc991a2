#!/usr/bin/env python3
"""Draws what monitoring/dashboard.json shows, from a running Prometheus, as one SVG.

    python3 monitoring/draw.py --prometheus http://127.0.0.1:9090 --out picture.svg [--minutes 5]

Each panel's queries are asked of Prometheus's HTTP API (a range query; an instant query for
a table panel) and drawn small, three panels to a row, the way the dashboard lays them out
in Grafana. tests/it/server/monitoring.rs runs it on what its Prometheus scraped, and
docs/operations.md shows a picture it drew. Python 3 standard library only.
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.parse
import urllib.request
from pathlib import Path
from xml.sax.saxutils import escape

HERE = Path(__file__).resolve().parent
COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"]
CELL_W, CELL_H, PAD = 330, 190, 12


def ask(prometheus: str, path: str, params: dict) -> list:
    url = f"{prometheus.rstrip('/')}{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=30) as reply:
        return json.load(reply)["data"]["result"]


def legend(template: str, labels: dict) -> str:
    text = template
    for name, value in labels.items():
        text = text.replace("{{" + name + "}}", value)
    return text.replace("{{instance}}", "").strip() or labels.get("key", "")


def series_of(prometheus: str, panel: dict, minutes: float) -> list[tuple[str, list[tuple[float, float]]]]:
    end = time.time()
    out = []
    for target in panel["targets"]:
        if panel["type"] == "table":
            for result in ask(prometheus, "/api/v1/query", {"query": target["expr"]}):
                value = float(result["value"][1])
                out.append((legend(target.get("legendFormat", ""), result["metric"]), [(0.0, value)]))
            continue
        params = {"query": target["expr"], "start": end - minutes * 60, "end": end, "step": max(1, minutes * 60 / 120)}
        for result in ask(prometheus, "/api/v1/query_range", params):
            points = [(float(t), float(v)) for t, v in result["values"] if v not in ("NaN", "+Inf", "-Inf")]
            out.append((legend(target.get("legendFormat", ""), result["metric"]), points))
    return out


def cell(x: int, y: int, title: str, series: list, kind: str) -> list[str]:
    parts = [
        f'<rect x="{x}" y="{y}" width="{CELL_W}" height="{CELL_H}" fill="#fff" stroke="#ccc"/>',
        f'<text x="{x + 8}" y="{y + 16}" font-size="12" font-weight="bold">{escape(title)}</text>',
    ]
    left, top, width, height = x + 40, y + 26, CELL_W - 52, CELL_H - 70
    values = [v for _, points in series for _, v in points]
    if not values:
        parts.append(f'<text x="{left}" y="{top + 40}" font-size="11" fill="#888">no data</text>')
        return parts
    high = max(values) or 1.0
    if kind == "table":
        # The keys denied most, as bars.
        rows = sorted(series, key=lambda s: -s[1][0][1])[:6]
        bar_h = height / max(len(rows), 1)
        for i, (name, points) in enumerate(rows):
            w = width * points[0][1] / high
            by = top + i * bar_h
            name = name.removeprefix("tb_top_denied:")
            parts.append(f'<rect x="{left}" y="{by + 2:.1f}" width="{w:.1f}" height="{bar_h - 4:.1f}" fill="#9ecae1"/>')
            parts.append(f'<text x="{left + 4}" y="{by + bar_h / 2 + 4:.1f}" font-size="10" fill="#222">'
                         f'{escape(name[:40])}: {points[0][1]:g}</text>')
        return parts
    times = [t for _, points in series for t, _ in points]
    start, end = min(times), max(times)
    span = (end - start) or 1.0
    parts.append(f'<line x1="{left}" y1="{top + height}" x2="{left + width}" y2="{top + height}" stroke="#999"/>')
    parts.append(f'<text x="{x + 4}" y="{top + 8}" font-size="9" fill="#666">{high:.3g}</text>')
    parts.append(f'<text x="{x + 4}" y="{top + height}" font-size="9" fill="#666">0</text>')
    for i, (name, points) in enumerate(series[:6]):
        colour = COLOURS[i % len(COLOURS)]
        line = " ".join(f"{left + width * (t - start) / span:.1f},{top + height - height * v / high:.1f}" for t, v in points)
        parts.append(f'<polyline points="{line}" fill="none" stroke="{colour}" stroke-width="1.5"/>')
        parts.append(f'<text x="{left + (i % 2) * 140}" y="{top + height + 16 + (i // 2) * 12}" font-size="10" '
                     f'fill="{colour}">{escape(name[:28])}</text>')
    return parts


def draw(prometheus: str, dashboard: dict, minutes: float) -> str:
    panels = dashboard["panels"]
    columns = 3
    rows = (len(panels) + columns - 1) // columns
    width, height = columns * (CELL_W + PAD) + PAD, rows * (CELL_H + PAD) + PAD + 24
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif">',
        f'<rect width="{width}" height="{height}" fill="#f4f5f5"/>',
        f'<text x="{PAD}" y="18" font-size="14" font-weight="bold">{escape(dashboard["title"])}: '
        f"the last {minutes:g} minutes, as Prometheus holds them</text>",
    ]
    for index, panel in enumerate(panels):
        x = PAD + (index % columns) * (CELL_W + PAD)
        y = 24 + PAD + (index // columns) * (CELL_H + PAD)
        parts += cell(x, y, panel["title"], series_of(prometheus, panel, minutes), panel["type"])
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prometheus", required=True, help="Prometheus's base URL")
    ap.add_argument("--dashboard", default=str(HERE / "dashboard.json"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--minutes", type=float, default=5.0)
    args = ap.parse_args()
    dashboard = json.loads(Path(args.dashboard).read_text())
    Path(args.out).write_text(draw(args.prometheus, dashboard, args.minutes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
