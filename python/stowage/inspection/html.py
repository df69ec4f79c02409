"""The HTML report of ``stowage inspect --html``: one self-contained file that opens offline.

Everything is drawn on the server side as inline SVG (no script, no fonts or styles from the
network): a stacked live-memory timeline by allocation site, a map of the segments with their
blocks, and the tables of the terminal report. Large traces are downsampled in the plot only
(at most snapshot/timelines.hpp's kMaxPoints samples, each the live bytes just after its event, the peak always
among them); the totals and tables come from every event. The file stays small: a few hundred KiB for
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
from pathlib import Path
from typing import Any

from stowage import _core
from stowage.inspection.findings import device_segments
from stowage.inspection.text import HELD, SITES, STEPS, bytes_text
from stowage.terminal import literal

MAX_SEGMENT_ROWS = 300  # segments drawn in the map (the largest, if there are more)
WIDTH = 1100
PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1",
           "#ff9da7", "#9c755f", "#bab0ac")
OTHER = "#cfcfcf"
FREE = "#ececec"


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
                     f"<title>{_e(site)}: up to {bytes_text(max(values))}</title></path>")
        lower = upper
    for fraction in (0, 0.25, 0.5, 0.75, 1):
        y = py(highest * fraction)
        parts.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#999" '
                     f'stroke-width="0.5"/><text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">'
                     f"{_e(bytes_text(int(highest * fraction)))}</text>")
    peak_x = px(data["peak_index"])
    parts.append(f'<line x1="{peak_x:.1f}" x2="{peak_x:.1f}" y1="10" y2="{10 + plot_h}" stroke="#000" '
                 f'stroke-dasharray="4 3"/><text x="{peak_x + 4:.1f}" y="22">peak</text>')
    parts.append(f'<text x="{left}" y="{height - 8}">event {x0:,}</text>'
                 f'<text x="{left + plot_w}" y="{height - 8}" text-anchor="end">event {xs[-1]:,}</text>')
    parts.append("</svg>")
    return "".join(parts)


def timeline_dict(timeline: _core.Timeline) -> dict[str, Any]:
    """A timeline as the drawing reads it: the samples' events, each series by name, the peak."""
    return {"x": list(timeline.x), "series": dict(timeline.series), "peak_index": timeline.peak_index}


def _segment_map_svg(segments: list[dict[str, Any]], block_sites: list[list[str]], colors: dict[str, str]) -> str:
    """The segments with their blocks, each block in its site's color (`block_sites`: each
    segment's, as the findings name them)."""
    if not segments:
        return "<p>The snapshot lists no segments (everything had been freed and released).</p>"
    chosen = [(s, sites) for s, sites in zip(segments, block_sites) if int(s["total_size"]) > 0]
    chosen = sorted(chosen, key=lambda pair: int(pair[0]["total_size"]), reverse=True)[:MAX_SEGMENT_ROWS]
    chosen.sort(key=lambda pair: int(pair[0]["address"]))
    if not chosen:
        return "<p>The snapshot lists only empty segments.</p>"
    largest = max(int(s["total_size"]) for s, _ in chosen)
    row, left = 11, 90
    bar_w = WIDTH - left - 10
    parts = [f'<svg width="{WIDTH}" height="{row * len(chosen) + 4}" role="img" aria-label="segment map">']
    for r, (segment, sites) in enumerate(chosen):
        total = int(segment["total_size"])
        width = max(2.0, total / largest * bar_w)
        y = 2 + r * row
        parts.append(f'<text x="{left - 6}" y="{y + row - 1}" text-anchor="end" style="font-size:9px">{_e(bytes_text(total))}</text>')
        x = float(left)
        pending_free = 0.0
        for block, site in zip(segment.get("blocks", []), sites):
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
            color = colors.get(site, colors["other"])
            parts.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.2f}" height="{row - 1}" fill="{color}">'
                         f"<title>{_e(bytes_text(int(block['size'])))} {_e(state)}: {_e(site)}</title></rect>")
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


def _timeline_section(title: str, data: dict[str, Any], colors: dict[str, str]) -> list[str]:
    """A timeline under its title, with its legend."""
    legend = "".join(f'<span class="key"><span class="swatch" style="background:{colors[k]}"></span>{_e(k)}</span>'
                     for k in data["series"])
    return [f"<h2>{_e(title)}</h2>", f'<div class="legend">{legend}</div>', _timeline_svg(data, colors)]


def _more_timelines(timelines: _core.Timelines, report: dict[str, Any]) -> list[str]:
    """The timelines by category and by module, each with its legend."""
    by_category = timeline_dict(timelines.by_category)
    by_module = timeline_dict(timelines.by_module) if timelines.by_module is not None else None
    out: list[str] = []
    for title, data in ((f"Live memory by what it is ({report.get('category_source', 'inferred')})", by_category),
                        ("Live memory by the module that made it", by_module)):
        if data is None or not data["x"]:
            continue
        out += _timeline_section(title, data, {k: PALETTE[i % len(PALETTE)] for i, k in enumerate(data["series"])})
    return out


def render(name: str, report: dict[str, Any], snapshot: dict[str, Any], found: _core.Findings) -> str:
    """The page: `report` (stowage.inspection.findings'), the snapshot's segments, and the
    timelines and block sites of `found` (inspected with timelines)."""
    device = report["device"]
    segments = device_segments(snapshot, device)
    data = timeline_dict(found.timelines.by_site)
    colors = {site: PALETTE[k % len(PALETTE)] for k, site in enumerate(data["series"])}
    colors["other"] = OTHER
    totals = report["totals"]
    total_rows = [[label, bytes_text(totals[key])] for label, key in (
        ("allocated", "allocated"), ("active", "active"), ("requested", "requested"), ("reserved", "reserved"),
        ("reserved but unallocated", "reserved_unallocated"), ("largest free block", "largest_free_block"))]
    total_rows.append(["fragmentation (1 - largest free block / free reserved bytes)",
                       f"{100 * totals['fragmentation']:.1f}%"])
    peak = report["peak"]
    sections = [
        f"<h1>{_e(name)}, device {device}</h1>",
        f"<p>{report['trace_events']:,} trace events, {totals['segments']:,} segments. "
        f"Peak: {_e(bytes_text(peak['live_bytes']))} live at event {peak['event_index']:,}.</p>",
        *_more_timelines(found.timelines, report),
        *_timeline_section("Live memory by allocation site", data, colors),
        f"<p class=\"small\">{len(data['x']):,} samples of the trace's events; totals and tables use every event.</p>",
        "<h2>Totals</h2>", _table("", ["", "bytes"], total_rows),
        "<h2>Segments</h2>", _segment_map_svg(segments, found.block_sites, colors),
        _table("segments held by one small live block", HELD, _core.held_rows(found.segments.held_by_one_small_block)),
        _table("live at the end, by site", SITES, _core.site_rows(found.sites_at_end, totals["allocated"])),
        _table("live at the peak, by site", SITES, _core.site_rows(found.peak.sites, peak["live_bytes"])),
    ]
    if peak.get("categories"):
        sections.insert(2, _table(f"live at the peak, by what it is ({report.get('category_source', 'inferred')})",
                                  ["live", "share", "category"], _core.category_rows(found.peak, before_trace=False)))
    if peak.get("modules"):
        sections.insert(3, _table("live at the peak, by the module that made it", ["live", "share", "module"],
                                  _core.module_rows(found.peak)))
    if report.get("advice"):
        items = "".join(f"<li><b>{'up to ' if row.get('upper_bound') else ''}{_e(bytes_text(row['saving_bytes']))}</b> of the "
                        f"peak (re-simulated): {_e(row['advice'])}</li>" for row in report["advice"])
        sections.insert(2, f"<h2>Advice</h2><ul>{items}</ul>")
    run_steps = [step for step in found.steps if not step.fit_trial]
    if run_steps:
        sections.append(_table(f"steps ({len(run_steps)}, found by {report['steps_found_by']})", STEPS,
                               _core.step_rows(run_steps[:200])))
    for oom, finding in zip(report["ooms"], found.ooms):
        sections.append(f"<h2>Out of memory at event {oom['event_index']:,}</h2><p>asked for "
                        f"{_e(bytes_text(oom['requested']))}; the device had {_e(bytes_text(oom['device_free']))} free; "
                        f"{_e(bytes_text(oom['live_bytes']))} were live.</p>")
        sections.append(_table("live at the OOM, by site", SITES, _core.site_rows(finding.sites, oom["live_bytes"])))
    style = ("body{font:14px sans-serif;margin:24px;color:#222}table{border-collapse:collapse;margin:8px 0}"
             "td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}td:last-child{text-align:left}"
             "svg text{font:11px sans-serif;fill:#333}.small{font-size:11px;color:#555}"
             ".legend{margin:6px 0}.key{margin-right:14px;font-size:12px}"
             ".swatch{display:inline-block;width:10px;height:10px;margin-right:4px}")
    return (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>stowage inspect: {_e(name)}"
            f"</title><style>{style}</style></head><body>{''.join(sections)}"
            f"<p class=\"small\">Made by stowage inspect. Opens offline: no scripts, nothing fetched.</p>"
            f"</body></html>")
