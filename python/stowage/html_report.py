"""The HTML report of ``stowage inspect --html``: one self-contained file that opens offline.

Everything is drawn on the server side as inline SVG (no script, no fonts or styles from the
network): a stacked live-memory timeline by allocation site, a map of the segments with their
blocks, and the tables of the terminal report. Large traces are downsampled in the plot only
(at most MAX_POINTS samples, each the live bytes just after its event, the peak always among
them); the totals and tables come from every event. The file stays small: a few hundred KiB for
the largest traces here.

Every string from the snapshot (file and function names, module paths) or from its file's name
is shown as it holds, as the terminal report shows it (stowage.terminal.literal): what a browser
or a terminal reading the file would act on (control characters, NUL and ESC among them, bidi
overrides, lone surrogates, which cannot even be written as UTF-8) is written as its escape
(``\\x1b``, ``\\ud800``), then HTML-escaped. ``write`` puts the file in place whole or not at all.
"""

from __future__ import annotations

import html
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from stowage import _core, categories, tag_reading
from stowage.recompute_estimate import block_of_paths
from stowage.snapshot_reader import TraceColumns
from stowage.terminal import literal
from stowage.trace import as_columns
from stowage.trace_pairs import LivePairs, TraceSites, live_pairs, site_of

MAX_POINTS = 1500      # timeline samples
MAX_SITES = 8          # sites drawn by name in the timeline; the rest are "other"
MAX_SEGMENT_ROWS = 300  # segments drawn in the map (the largest, if there are more)
WIDTH = 1100
PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1",
           "#ff9da7", "#9c755f", "#bab0ac")
OTHER = "#cfcfcf"
FREE = "#ececec"


def _b(value: int) -> str:
    return _core.format_bytes(int(value))


def _e(text: object) -> str:
    return html.escape(literal(str(text)), quote=True)


def write(page: str, path: str | Path) -> None:
    """Writes the report to `path` whole: into a file beside it, then renamed over it, so that a
    failure leaves no partial file (and an earlier report there as it was)."""
    target = Path(path)
    data = page.encode("utf-8")  # (every string went through _e: nothing left that UTF-8 cannot hold)
    temporary = target.with_name(f".{target.name}.{os.getpid()}.partial")
    try:
        with open(temporary, "wb") as file:
            file.write(data)
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def timeline(trace: TraceColumns | Sequence[dict[str, Any]], baseline: int, named: list[str],
             pairs: LivePairs | None = None) -> dict[str, Any]:
    """Live bytes by site, sampled: at most MAX_POINTS samples, always including the peak. As in
    inspector.analyse_trace, bytes live before the trace began start at `baseline` and drop with
    each free of an address the trace never allocated. (`pairs`: the trace's, when known.)"""
    columns = as_columns(trace)
    pairs = live_pairs(columns) if pairs is None else pairs
    if len(pairs.index) == 0:
        return {"x": [], "series": {}, "peak_index": -1}
    sites = TraceSites(columns, pairs)
    index_of_site = {site: k for k, site in enumerate(named)}
    series_of_site = np.array([index_of_site.get(site, len(named)) for site in sites.names] + [-1], dtype=np.int64)
    return grouped(pairs, series_of_site[sites.of], [*named, "other"], baseline)


def grouped(pairs: LivePairs, group: np.ndarray, names: list[str], baseline: int) -> dict[str, Any]:
    """Live bytes by group, sampled as `timeline`'s: `group` gives each allocation's (an index
    into `names`; frees' entries are ignored: a free leaves its allocation's group)."""
    if len(pairs.index) == 0:
        return {"x": [], "series": {}, "peak_index": -1}
    positions, peak_at, freed, series = _core.grouped_live(pairs.own, pairs.unknown, pairs.is_alloc, pairs.alloc_of,
                                                           group, len(names), MAX_POINTS)  # (snapshot/live_groups.hpp)
    values: dict[str, list[int]] = {}
    if baseline:
        values["(live before the trace began)"] = [max(baseline - v, 0) for v in freed]
    values.update(zip(names, series))
    return {"x": pairs.index[positions].tolist(), "series": values, "peak_index": int(pairs.index[peak_at])}


def category_and_module_timelines(snapshot: dict[str, Any], device: int, columns: TraceColumns, pairs: LivePairs,
                                  report: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Live bytes by category (exact where stowage tagged the snapshot, else inferred, with the
    report's steps), and by module where it carries module paths (None otherwise): by block
    (stowage.recompute_estimate's blocks, each a model's item of its block list) and, outside
    blocks, by module to three names deep; the MAX_SITES that allocate most, the rest together."""
    baseline = report["peak"]["baseline"]
    exact = tag_reading.read(snapshot, device, columns.action, pairs.index)
    if exact is not None:
        category = exact.category
    else:
        firsts = np.array([step["first_event"] for step in report.get("steps") or []], dtype=np.int64)
        starts = np.searchsorted(pairs.index, firsts)
        category = categories.all_categories(columns, pairs.index, pairs.is_alloc, pairs.end, starts)
    by_category = grouped(pairs, category, list(categories.CATEGORIES), baseline)
    by_category["series"] = {k: v for k, v in by_category["series"].items() if any(v)}
    if exact is None:
        return by_category, None
    block, blocks = block_of_paths(exact.paths)
    group_names = [blocks[b] if b >= 0 else _prefix(p, 3) for p, b in zip(exact.paths, block.tolist())]
    group_names[0] = "(outside any module's forward)"
    distinct = sorted(set(group_names))
    group = np.array([distinct.index(g) for g in group_names], dtype=np.int64)[exact.module]
    made = np.zeros(len(distinct), dtype=np.float64)
    np.add.at(made, group[pairs.is_alloc], np.asarray(pairs.size[pairs.is_alloc], dtype=np.float64))
    shown = [int(g) for g in np.argsort(-made, kind="stable")[:MAX_SITES] if made[g] > 0]
    names = [distinct[g] for g in shown] + ["other modules"]
    remap = np.full(len(distinct), len(shown), dtype=np.int64)
    remap[shown] = np.arange(len(shown))
    by_module = grouped(pairs, remap[group], names, baseline)
    by_module["series"] = {k: v for k, v in by_module["series"].items() if any(v)}
    return by_category, by_module


def _prefix(path: str, depth: int) -> str:
    return ".".join(path.split(".")[:depth])


def _timeline_svg(data: dict[str, Any], colors: dict[str, str]) -> str:
    xs, series = data["x"], data["series"]
    if not xs:
        return "<p>The snapshot has no trace events.</p>"
    height, left, bottom = 320, 80, 30
    plot_w, plot_h = WIDTH - left - 20, height - bottom - 10
    n = len(xs)
    tops = [0] * n
    for values in series.values():
        tops = [t + max(v, 0) for t, v in zip(tops, values)]
    highest = max(max(tops), 1)
    x0, x1 = xs[0], max(xs[-1], xs[0] + 1)

    def px(x: int) -> float:
        return left + (x - x0) / (x1 - x0) * plot_w

    def py(y: float) -> float:
        return 10 + plot_h - y / highest * plot_h

    parts = [f'<svg width="{WIDTH}" height="{height}" role="img" aria-label="live memory by site">']
    lower = [0] * n
    for site, values in series.items():
        upper = [lo + max(v, 0) for lo, v in zip(lower, values)]
        forward = " ".join(f"{px(x):.1f},{py(u):.1f}" for x, u in zip(xs, upper))
        backward = " ".join(f"{px(x):.1f},{py(lo):.1f}" for x, lo in zip(reversed(xs), reversed(lower)))
        parts.append(f'<path class="area" d="M{forward} L{backward} Z" fill="{colors[site]}">'
                     f"<title>{_e(site)}: up to {_b(max(values))}</title></path>")
        lower = upper
    for fraction in (0, 0.25, 0.5, 0.75, 1):
        y = py(highest * fraction)
        parts.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#999" '
                     f'stroke-width="0.5"/><text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">'
                     f"{_e(_b(int(highest * fraction)))}</text>")
    peak_x = px(data["peak_index"])
    parts.append(f'<line x1="{peak_x:.1f}" x2="{peak_x:.1f}" y1="10" y2="{10 + plot_h}" stroke="#000" '
                 f'stroke-dasharray="4 3"/><text x="{peak_x + 4:.1f}" y="22">peak</text>')
    parts.append(f'<text x="{left}" y="{height - 8}">event {x0:,}</text>'
                 f'<text x="{left + plot_w}" y="{height - 8}" text-anchor="end">event {xs[-1]:,}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _segment_map_svg(segments: list[dict[str, Any]], colors: dict[str, str]) -> str:
    if not segments:
        return "<p>The snapshot lists no segments (everything had been freed and released).</p>"
    chosen = [s for s in segments if int(s["total_size"]) > 0]
    chosen = sorted(chosen, key=lambda s: int(s["total_size"]), reverse=True)[:MAX_SEGMENT_ROWS]
    chosen.sort(key=lambda s: int(s["address"]))
    if not chosen:
        return "<p>The snapshot lists only empty segments.</p>"
    largest = max(int(s["total_size"]) for s in chosen)
    row, left = 11, 90
    bar_w = WIDTH - left - 10
    parts = [f'<svg width="{WIDTH}" height="{row * len(chosen) + 4}" role="img" aria-label="segment map">']
    for r, segment in enumerate(chosen):
        total = int(segment["total_size"])
        width = max(2.0, total / largest * bar_w)
        y = 2 + r * row
        parts.append(f'<text x="{left - 6}" y="{y + row - 1}" text-anchor="end" style="font-size:9px">{_e(_b(total))}</text>')
        x = float(left)
        pending_free = 0.0
        for block in segment.get("blocks", []):
            w = int(block["size"]) / total * width
            state = block.get("state", "")
            if state == "inactive":
                pending_free += w
                continue
            if pending_free:
                parts.append(f'<rect x="{x:.1f}" y="{y}" width="{pending_free:.2f}" height="{row - 1}" fill="{FREE}"/>')
                x += pending_free
                pending_free = 0.0
            if w < 0.2:
                x += w
                continue
            site = site_of(block.get("frames"), int(block["size"]))
            color = colors.get(site, colors["other"])
            parts.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.2f}" height="{row - 1}" fill="{color}">'
                         f"<title>{_e(_b(int(block['size'])))} {_e(state)}: {_e(site)}</title></rect>")
            x += w
        if pending_free:
            parts.append(f'<rect x="{x:.1f}" y="{y}" width="{pending_free:.2f}" height="{row - 1}" fill="{FREE}"/>')
    parts.append("</svg>")
    note = (f"<p>The {len(chosen)} largest of {len(segments)} segments.</p>" if len(segments) > len(chosen) else "")
    return note + "".join(parts)


def _table(title: str, header: list[str], rows: list[list[str]]) -> str:
    if not rows:
        return ""
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<h3>{_e(title)}</h3><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _site_rows(sites: list[dict[str, Any]], total: int) -> list[list[str]]:
    return [[_b(s["bytes"]), f"{100 * s['bytes'] / total:.1f}%" if total else "-", f"{s['allocations']:,}",
             s["site"]] for s in sites]


def _more_timelines(snapshot: dict[str, Any], device: int, columns: TraceColumns, pairs: LivePairs,
                    report: dict[str, Any]) -> list[str]:
    """The timelines by category and by module, each with its legend."""
    by_category, by_module = category_and_module_timelines(snapshot, device, columns, pairs, report)
    out: list[str] = []
    for title, data in ((f"Live memory by what it is ({report.get('category_source', 'inferred')})", by_category),
                        ("Live memory by the module that made it", by_module)):
        if data is None or not data["x"]:
            continue
        colors = {k: PALETTE[i % len(PALETTE)] for i, k in enumerate(data["series"])}
        legend = "".join(f'<span class="key"><span class="swatch" style="background:{c}"></span>{_e(k)}</span>'
                         for k, c in colors.items())
        out += [f"<h2>{_e(title)}</h2>", f'<div class="legend">{legend}</div>', _timeline_svg(data, colors)]
    return out


def render(name: str, report: dict[str, Any], snapshot: dict[str, Any]) -> str:
    device = report["device"]
    traces = snapshot.get("device_traces", [])
    columns = as_columns(traces[device] if device < len(traces) else [])
    pairs = live_pairs(columns)  # (once, for every timeline)
    segments = [s for s in snapshot.get("segments", []) if int(s.get("device", 0)) == device]
    named = [s["site"] for s in report["peak"]["sites"] if not s["site"].startswith("(")][:MAX_SITES]
    data = timeline(columns, report["peak"]["baseline"], named, pairs)
    colors = {site: PALETTE[k % len(PALETTE)] for k, site in enumerate(data["series"])}
    colors["other"] = OTHER
    for block_site in {site_of(b.get("frames"), int(b["size"])) for s in segments for b in s.get("blocks", [])}:
        colors.setdefault(block_site, OTHER)
    totals = report["totals"]
    legend = "".join(f'<span class="key"><span class="swatch" style="background:{colors[site]}"></span>{_e(site)}</span>'
                     for site in data["series"])
    total_rows = [[label, _b(totals[key])] for label, key in (
        ("allocated", "allocated"), ("active", "active"), ("requested", "requested"), ("reserved", "reserved"),
        ("reserved but unallocated", "reserved_unallocated"), ("largest free block", "largest_free_block"))]
    total_rows.append(["fragmentation (1 - largest free block / free reserved bytes)",
                       f"{100 * totals['fragmentation']:.1f}%"])
    peak = report["peak"]
    sections = [
        f"<h1>{_e(name)}, device {device}</h1>",
        f"<p>{report['trace_events']:,} trace events, {totals['segments']:,} segments. "
        f"Peak: {_e(_b(peak['live_bytes']))} live at event {peak['event_index']:,}.</p>",
        *_more_timelines(snapshot, device, columns, pairs, report),
        "<h2>Live memory by allocation site</h2>", f'<div class="legend">{legend}</div>',
        _timeline_svg(data, colors),
        f"<p class=\"small\">{len(data['x']):,} samples of the trace's events; totals and tables use every event.</p>",
        "<h2>Totals</h2>", _table("", ["", "bytes"], total_rows),
        "<h2>Segments</h2>", _segment_map_svg(segments, colors),
        _table("segments held by one small live block", ["segment", "live", "held back", "site"],
               [[_b(r["segment_bytes"]), _b(r["live_bytes"]), _b(r["held_back"]), r["site"]]
                for r in report["segments"]["held_by_one_small_block"]]),
        _table("live at the end, by site", ["live", "share", "allocs", "site"],
               _site_rows(report["sites_at_end"], totals["allocated"])),
        _table("live at the peak, by site", ["live", "share", "allocs", "site"],
               _site_rows(peak["sites"], peak["live_bytes"])),
    ]
    if peak.get("categories"):
        rows = sorted(peak["categories"].items(), key=lambda item: item[1], reverse=True)
        sections.insert(2, _table(f"live at the peak, by what it is ({report.get('category_source', 'inferred')})",
                                  ["live", "share", "category"],
                                  [[_b(v), f"{100 * v / max(peak['live_bytes'], 1):.1f}%", k] for k, v in rows]))
    if peak.get("modules"):
        sections.insert(3, _table("live at the peak, by the module that made it", ["live", "share", "module"],
                                  [[_b(r["bytes"]), f"{100 * r['bytes'] / max(peak['live_bytes'], 1):.1f}%",
                                    r["module"] or "(outside any module's forward)"] for r in peak["modules"]]))
    if report.get("advice"):
        items = "".join(f"<li><b>{'up to ' if row.get('upper_bound') else ''}{_e(_b(row['saving_bytes']))}</b> of the "
                        f"peak (re-simulated): {_e(row['advice'])}</li>" for row in report["advice"])
        sections.insert(2, f"<h2>Advice</h2><ul>{items}</ul>")
    run_steps = [step for step in report.get("steps") or [] if not step["fit_trial"]]
    if run_steps:
        sections.append(_table(f"steps ({len(run_steps)}, found by {report['steps_found_by']})",
                               ["step", "events", "peak", "at its end"],
                               [[str(st["number"]), f"{st['first_event']:,}-{st['last_event']:,}", _b(st["peak_bytes"]),
                                 _b(st["end_bytes"])] for st in run_steps[:200]]))
    for oom in report["ooms"]:
        sections.append(f"<h2>Out of memory at event {oom['event_index']:,}</h2><p>asked for "
                        f"{_e(_b(oom['requested']))}; the device had {_e(_b(oom['device_free']))} free; "
                        f"{_e(_b(oom['live_bytes']))} were live.</p>")
        sections.append(_table("live at the OOM, by site", ["live", "share", "allocs", "site"],
                               _site_rows(oom["sites"], oom["live_bytes"])))
    style = ("body{font:14px sans-serif;margin:24px;color:#222}table{border-collapse:collapse;margin:8px 0}"
             "td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}td:last-child{text-align:left}"
             "svg text{font:11px sans-serif;fill:#333}.small{font-size:11px;color:#555}"
             ".legend{margin:6px 0}.key{margin-right:14px;font-size:12px}"
             ".swatch{display:inline-block;width:10px;height:10px;margin-right:4px}")
    return (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>stowage inspect: {_e(name)}"
            f"</title><style>{style}</style></head><body>{''.join(sections)}"
            f"<p class=\"small\">Made by stowage inspect. Opens offline: no scripts, nothing fetched.</p>"
            f"</body></html>")
