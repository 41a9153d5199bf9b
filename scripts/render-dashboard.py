#!/usr/bin/env python3
"""Draw configs/grafana/throttlewatch.json from real Prometheus answers, as an
HTML page of SVG panels laid out by the dashboard's gridPos (Grafana itself is
not installable on our machines; docs/dashboard.md).

The data comes from the live test, which runs every panel's query against a
private Prometheus scraping the real agent:

  TW_DASHBOARD_DUMP=/tmp/dump.json \
    cargo test -p throttlewatch-integration --test prometheus -- dashboard_and
  scripts/render-dashboard.py /tmp/dump.json /tmp/dashboard.html
  chromium --headless --no-sandbox --hide-scrollbars --window-size=1240,1290 \
    --screenshot=docs/dashboard.png /tmp/dashboard.html

This draws what the queries returned; it is not Grafana's look.
"""
import html
import json
import math
import re
import sys
from pathlib import Path

COL, ROW, PAD = 50, 30, 8
PALETTE = ["#7eb26d", "#eab839", "#6ed0e0", "#ef843c", "#e24d42", "#1f78c1", "#ba43a9", "#705da0"]


def legend(fmt, metric):
    if not fmt or fmt == "__auto":
        return ",".join(f"{k}={v}" for k, v in sorted(metric.items()) if k != "__name__") or "value"
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: metric.get(m.group(1), ""), fmt).strip()


def fmt_value(v, unit):
    if v is None or math.isnan(v):
        return "–"
    if unit == "percentunit":
        return f"{v * 100:.0f}%"
    if unit == "s":
        for scale, name in ((1, "s"), (1e-3, "ms"), (1e-6, "µs")):
            if abs(v) >= scale or scale == 1e-6:
                return f"{v / scale:.3g} {name}"
    return f"{v:.3g}"


def series(data):
    """(label dict, [(t, v)]) from a range or instant answer."""
    out = []
    for r in data.get("result", []):
        if "values" in r:
            pts = [(float(t), float(v)) for t, v in r["values"]]
        else:
            pts = [(float(r["value"][0]), float(r["value"][1]))]
        out.append((r["metric"], pts))
    return out


def axis_box(w, h):
    return 46, 8, w - 56, h - 58  # x0, y0, width, height of the plot area


def draw_lines(p, dump, w, h):
    unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit", "short")
    overrides = [o for o in p.get("fieldConfig", {}).get("overrides", [])
                 if o["matcher"]["id"] == "byFrameRefID"]
    right = {o["matcher"]["options"] for o in overrides}
    bars = {o["matcher"]["options"] for o in overrides
            if {"id": "custom.drawStyle", "value": "bars"} in o["properties"]}
    x0, y0, pw, ph = axis_box(w, h)
    groups = {"left": [], "right": []}
    for t in p["targets"]:
        side = "right" if t["refId"] in right else "left"
        for metric, pts in series(dump.get(f"{p['title']}/{t['refId']}", {})):
            groups[side].append((legend(t.get("legendFormat"), metric), pts, t["refId"]))
    allpts = [pt for g in groups.values() for _, pts, _ in g for pt in pts]
    if not allpts:
        return "<text x='50' y='40'>no data</text>", []
    tmin, tmax = min(t for t, _ in allpts), max(t for t, _ in allpts)
    tspan = max(tmax - tmin, 1)
    svg, keys, n = [], [], 0
    for side, g in groups.items():
        vals = [v for _, pts, _ in g for _, v in pts if not math.isnan(v)]
        if not vals:
            continue
        vmax = max(vals) * 1.1 or 1
        u = "ops" if side == "right" and bars else ("short" if side == "right" else unit)
        ax = x0 if side == "left" else x0 + pw
        anchor = "end" if side == "left" else "start"
        dx = -4 if side == "left" else 4
        for frac in (0, 0.5, 1):
            y = y0 + ph - frac * ph
            svg.append(f"<text x='{ax + dx}' y='{y + 4:.0f}' text-anchor='{anchor}' class='ax'>{fmt_value(vmax * frac, u)}</text>")
        for name, pts, ref in g:
            colour = PALETTE[n % len(PALETTE)]
            n += 1
            xy = [(x0 + (t - tmin) / tspan * pw, y0 + ph - (v / vmax) * ph) for t, v in pts if not math.isnan(v)]
            if ref in bars:
                bw = max(pw / max(len(pts), 1) * 0.6, 1)
                svg += [f"<rect x='{x - bw / 2:.1f}' y='{y:.1f}' width='{bw:.1f}' height='{y0 + ph - y:.1f}' fill='{colour}' opacity='0.5'/>" for x, y in xy]
            else:
                svg.append(f"<polyline fill='none' stroke='{colour}' stroke-width='1.5' points='{' '.join(f'{x:.1f},{y:.1f}' for x, y in xy)}'/>")
            keys.append((colour, name))
    svg.append(f"<line x1='{x0}' y1='{y0 + ph}' x2='{x0 + pw}' y2='{y0 + ph}' class='grid'/>")
    svg.append(f"<text x='{x0}' y='{y0 + ph + 14}' class='ax'>{tspan:.0f} s of the run</text>")
    return "".join(svg), keys


def draw_heatmap(p, dump, w, h):
    t = p["targets"][0]
    rows = {}
    for metric, pts in series(dump.get(f"{p['title']}/{t['refId']}", {})):
        le = math.inf if metric["le"] == "+Inf" else float(metric["le"])
        rows[le] = dict(pts)
    if not rows:
        return "<text x='50' y='40'>no data</text>", []
    les = sorted(rows)
    times = sorted({ts for r in rows.values() for ts in r})
    # The buckets are cumulative; a cell is its bucket alone.
    cells = {}
    for ts in times:
        prev = 0.0
        for le in les:
            v = rows[le].get(ts, 0.0)
            cells[(le, ts)] = max(v - prev, 0.0)
            prev = v
    vmax = max(cells.values()) or 1
    x0, y0, pw, ph = axis_box(w, h)
    cw, rh = pw / len(times), ph / len(les)
    svg = []
    for i, le in enumerate(les):
        y = y0 + ph - (i + 1) * rh
        if i % 3 == 0 or le == math.inf:
            svg.append(f"<text x='{x0 - 4}' y='{y + rh / 2 + 4:.0f}' text-anchor='end' class='ax'>{'+Inf' if le == math.inf else fmt_value(le, 's')}</text>")
        for j, ts in enumerate(times):
            v = cells[(le, ts)]
            if v > 0:
                a = math.sqrt(v / vmax)
                svg.append(f"<rect x='{x0 + j * cw:.1f}' y='{y:.1f}' width='{cw + 0.3:.1f}' height='{rh - 1:.1f}' fill='#ef843c' fill-opacity='{0.15 + 0.85 * a:.2f}'/>")
    svg.append(f"<text x='{x0}' y='{y0 + ph + 14}' class='ax'>{len(times)} s of the run; rows: le buckets (upper bound), colour: count per interval (max {vmax:.0f})</text>")
    return "".join(svg), []


def draw_bargauge(p, dump, w, h):
    items = []
    for t in p["targets"]:
        for metric, pts in series(dump.get(f"{p['title']}/{t['refId']}", {})):
            items.append((legend(t.get("legendFormat"), metric), pts[-1][1]))
    items = [(n, v) for n, v in items if not math.isnan(v)]
    items.sort(key=lambda x: x[0])
    if not items:
        return "<text x='50' y='40'>no data</text>", []
    vmax = max(v for _, v in items) or 1
    bh = min((h - 40) / len(items), 22)
    svg = []
    for i, (name, v) in enumerate(items):
        y = 6 + i * bh
        svg.append(f"<text x='118' y='{y + bh * 0.7:.0f}' text-anchor='end' class='ax'>{html.escape(name)}</text>")
        svg.append(f"<rect x='124' y='{y:.1f}' width='{(w - 210) * v / vmax:.1f}' height='{bh - 3:.1f}' fill='#6ed0e0'/>")
        svg.append(f"<text x='{w - 80}' y='{y + bh * 0.7:.0f}' class='ax'>{fmt_value(v, 's')}</text>")
    return "".join(svg), []


def draw_table(p, dump, w, h):
    by_pod = {}
    for t in p["targets"]:
        for metric, pts in series(dump.get(f"{p['title']}/{t['refId']}", {})):
            key = (metric.get("namespace", ""), metric.get("pod", ""))
            by_pod.setdefault(key, {})[t["refId"]] = pts[-1][1]
    rows = sorted(by_pod.items(), key=lambda kv: -kv[1].get("A", 0))
    cols = [("pod", 20), ("throttled", 300), ("p99 freeze", 420)]
    svg = [f"<text x='{x}' y='18' class='th'>{c}</text>" for c, x in cols]
    for i, ((ns, pod), v) in enumerate(rows[:10]):
        y = 40 + i * 20
        svg.append(f"<text x='20' y='{y}' class='ax'>{html.escape(pod or '(none)')}</text>")
        svg.append(f"<text x='300' y='{y}' class='ax'>{fmt_value(v.get('A'), 's')}</text>")
        svg.append(f"<text x='420' y='{y}' class='ax'>{fmt_value(v.get('B'), 's')}</text>")
    return "".join(svg), []


DRAW = {"timeseries": draw_lines, "heatmap": draw_heatmap, "bargauge": draw_bargauge, "table": draw_table}


def main(dump_path, out_path, dashboard="configs/grafana/throttlewatch.json"):
    d = json.loads(Path(dashboard).read_text())
    dump = {k: v for k, v in json.loads(Path(dump_path).read_text()).items()}
    parts = []
    for p in d["panels"]:
        g = p["gridPos"]
        w, h = g["w"] * COL - PAD, g["h"] * ROW - PAD - 24
        body, keys = DRAW[p["type"]](p, dump, w, h)
        key_html = "".join(
            f"<span><i style='background:{c}'></i>{html.escape(n)}</span>" for c, n in keys[:8])
        parts.append(
            f"<div class='panel' style='left:{g['x'] * COL}px;top:{g['y'] * ROW}px;width:{w}px;height:{g['h'] * ROW - PAD}px'>"
            f"<div class='title'>{html.escape(p['title'])}</div>"
            f"<svg width='{w}' height='{h}'>{body}</svg><div class='keys'>{key_html}</div></div>")
    height = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in d["panels"]) * ROW
    Path(out_path).write_text(f"""<!doctype html><meta charset='utf-8'><title>{html.escape(d['title'])}</title>
<style>
body{{margin:0;background:#111217;font:12px sans-serif;color:#ccccdc}}
.head{{padding:6px 10px;font-size:14px}} .head b{{color:#fff}}
.board{{position:relative;margin:0 10px;height:{height}px}}
.panel{{position:absolute;background:#181b1f;border:1px solid #2c3235;border-radius:3px;overflow:hidden}}
.title{{padding:4px 8px;font-weight:600;color:#d8d9da}}
.ax{{fill:#9fa7b3;font-size:10px}} .th{{fill:#d8d9da;font-size:11px;font-weight:600}}
.grid{{stroke:#2c3235}}
.keys{{position:absolute;bottom:2px;left:8px;right:8px;font-size:10px;white-space:nowrap;overflow:hidden}}
.keys span{{margin-right:10px}} .keys i{{display:inline-block;width:10px;height:3px;margin-right:3px;vertical-align:middle}}
</style>
<div class='head'><b>{html.escape(d['title'])}</b> — drawn from a real Prometheus by scripts/render-dashboard.py (not Grafana)</div>
<div class='board'>{''.join(parts)}</div>
""")


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        sys.exit(f"usage: {sys.argv[0]} DUMP.json OUT.html [DASHBOARD.json]")
    main(*sys.argv[1:])
