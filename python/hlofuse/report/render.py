"""Renderings of a report: the terminal table, the JSON document and the offline HTML page."""

from __future__ import annotations

import html
import json
import math
from typing import Any

from hlofuse.report.model import Report, TargetReport

KIND_COLORS = {"dot": "#4e79a7", "kernel": "#59a14f", "loop": "#f28e2b", "reduce": "#e15759", "sort": "#b07aa1",
               "collective": "#76b7b2", "dus": "#edc948", "scatter": "#ff9da7", "custom": "#9c755f",
               "allocation": "#bab0ac", "call": "#d4d4d4"}


def seconds(s: float) -> str:
    if s is None or math.isnan(s):
        return "-"
    if abs(s) >= 1:
        return f"{s:.3g} s"
    if abs(s) >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    if abs(s) >= 1e-6:
        return f"{s * 1e6:.3g} us"
    return f"{s * 1e9:.3g} ns"


def quantity(x: float, unit: str) -> str:
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}"


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def header(report: Report) -> str:
    fused = ", ".join(f"{v} {k.replace('_to_', ' -> ')}" for k, v in sorted(report.counters.items())
                      if k in ("softmax_of_qk_to_attention", "greedy_to_sample") or k.endswith("_to_sample"))
    what = f"{report.sites} hlofuse site{'s' if report.sites != 1 else ''}" if report.fused else "not fused (XLA alone)"
    line = f"hlofuse-report: {report.program}: {what}"
    if fused:
        line += f" ({fused})"
    if report.devices > 1:
        line += f", {report.devices} devices (per-device times)"
    return line


def target_text(t: TargetReport, top: int = 8) -> list[str]:
    lines = [f"== {t.name} ({t.chip.description}): {seconds(t.predicted_s)} per call"
             f"  [{quantity(t.flops, 'FLOP')}, {quantity(t.bytes, 'B')}]"]
    if t.lowering != "ok":
        lines.append(f"   note: {t.lowering}")
    lines.append(f"   {'time':>9}  {'share':>6}  {'bound':<12} {'count':>5}  region")
    for r in t.regions[:top]:
        lines.append(f"   {seconds(r.predicted_s):>9}  {r.share * 100:5.1f}%  {r.bound:<12} {r.count:>5.0f}  "
                     f"{_cut(r.name, 78)}")
    rest = t.regions[top:]
    if rest:
        lines.append(f"   {seconds(sum(r.predicted_s for r in rest)):>9}  "
                     f"{sum(r.share for r in rest) * 100:5.1f}%  {'':<12} {len(rest):>5}  (other regions)")
    if t.fusions:
        lines.append("   fusions:")
        for f in t.fusions:
            status = {"kernel": "kernel", "kept": "kept: " + _cut(f.reason, 60), "modelled": "modelled as kernel"}[
                f.status]
            gain = f"{f.gain:.2f}x" if not math.isinf(f.gain) else "-"
            lines.append(f"     {_cut(f.site, 64):<64} {seconds(f.unfused_s):>9} -> {seconds(f.fused_s):>9} "
                         f"{gain:>7}  {status}")
    if t.next:
        lines.append("   the next 2x:")
        for i, n in enumerate(t.next, 1):
            lines.append(f"     {i}. {_cut(n.region, 70)}: {seconds(n.predicted_s)} ({n.share * 100:.0f}%), "
                         f"{n.why}")
            lines.append(f"        {n.fix}")
    for note in t.notes:
        lines.append(f"   note: {note}")
    return lines


def text(report: Report, top: int = 8) -> str:
    lines = [header(report)]
    for note in report.notes:
        lines.append(f"note: {note}")
    for t in report.targets.values():
        lines.extend(target_text(t, top))
    if report.measured:
        m = report.measured["host"]
        host = report.targets.get("host")
        line = (f"measured on this host: CPU time {seconds(m['measured_cpu_s'])} a call, wall median "
                f"{seconds(m['measured_s'])} (best {seconds(m['best_s'])}), {m['runs']} runs")
        if host is not None and m["measured_cpu_s"]:
            cpu = host.predicted_cpu_s
            line += (f"; predicted CPU time {seconds(cpu)} "
                     f"({(cpu - m['measured_cpu_s']) / m['measured_cpu_s'] * 100:+.0f}%)")
        lines.append(line)
    lines.append(f"(analysis {report.analysis_s:.2f} s; GPU/TPU/Trainium times are unvalidated predictions)")
    return "\n".join(lines) + "\n"


def summary_table(report: Report) -> str:
    """One line per target: the predicted time and what bounds the top region."""
    lines = []
    for t in report.targets.values():
        top = t.regions[0] if t.regions else None
        lines.append(f"{t.name:<9} {seconds(t.predicted_s):>10}  " + (f"top: {top.bound} {top.name}" if top else ""))
    return "\n".join(lines)


# ---- compare ---------------------------------------------------------------------------------------------


def compare_rows(a: TargetReport, b: TargetReport) -> list[dict[str, Any]]:
    """Per-region rows of two programs on one target: matched by name, then by kind in order of time."""
    rows: list[dict[str, Any]] = []
    b_left = {r.name: r for r in b.regions}
    unmatched_a = []
    for r in a.regions:
        other = b_left.pop(r.name, None)
        if other is None:
            unmatched_a.append(r)
            continue
        rows.append({"region": r.name, "kind": r.kind, "a_s": r.predicted_s, "b_s": other.predicted_s})
    rest_b = list(b_left.values())
    for r in unmatched_a:
        other = next((o for o in rest_b if o.kind == r.kind), None)
        if other is not None:
            rest_b.remove(other)
            rows.append({"region": f"{r.name} | {other.name}", "kind": r.kind, "a_s": r.predicted_s,
                         "b_s": other.predicted_s})
        else:
            rows.append({"region": r.name, "kind": r.kind, "a_s": r.predicted_s, "b_s": 0.0})
    for other in rest_b:
        rows.append({"region": other.name, "kind": other.kind, "a_s": 0.0, "b_s": other.predicted_s})
    for row in rows:
        row["delta_s"] = row["b_s"] - row["a_s"]
    rows.sort(key=lambda r: -abs(r["delta_s"]))
    return rows


def compare_json(a: Report, b: Report) -> dict[str, Any]:
    out: dict[str, Any] = {"a": a.program, "b": b.program, "targets": {}}
    for name, ta in a.targets.items():
        tb = b.targets.get(name)
        if tb is None:
            continue
        out["targets"][name] = {"a_s": ta.predicted_s, "b_s": tb.predicted_s,
                                "delta_s": tb.predicted_s - ta.predicted_s,
                                "ratio": tb.predicted_s / ta.predicted_s if ta.predicted_s else None,
                                "regions": compare_rows(ta, tb)}
    measured = compare_measured(a, b)
    if measured is not None:
        out["measured"] = measured
    return out


def compare_measured(a: Report, b: Report) -> dict[str, Any] | None:
    """With `--compare --measure`: the host's predicted change (B/A, in CPU time, as the validation compares)
    beside the measured one, and whether the sign agrees."""
    if not (a.measured and b.measured and "host" in a.targets and "host" in b.targets):
        return None
    ma, mb = a.measured["host"], b.measured["host"]
    pa, pb = a.targets["host"].predicted_cpu_s, b.targets["host"].predicted_cpu_s
    out = {"a_cpu_s": ma["measured_cpu_s"], "b_cpu_s": mb["measured_cpu_s"],
           "delta_cpu_s": mb["measured_cpu_s"] - ma["measured_cpu_s"],
           "ratio": mb["measured_cpu_s"] / ma["measured_cpu_s"] if ma["measured_cpu_s"] else None,
           "a_wall_s": ma["measured_s"], "b_wall_s": mb["measured_s"],
           "predicted_a_cpu_s": pa, "predicted_b_cpu_s": pb, "predicted_delta_cpu_s": pb - pa,
           "predicted_ratio": pb / pa if pa else None, "runs": ma["runs"]}
    out["sign_agrees"] = (out["delta_cpu_s"] > 0) == (out["predicted_delta_cpu_s"] > 0)
    return out


def compare_text(a: Report, b: Report, top: int = 8) -> str:
    data = compare_json(a, b)
    lines = [f"hlofuse-report --compare: A = {a.program}, B = {b.program}"]
    for name, t in data["targets"].items():
        ratio = f"{t['ratio']:.2f}x" if t["ratio"] else "-"
        lines.append(f"== {name}: A {seconds(t['a_s'])}, B {seconds(t['b_s'])}, delta {seconds(t['delta_s'])} "
                     f"(B/A {ratio})")
        lines.append(f"   {'A':>9}  {'B':>9}  {'delta':>10}  region")
        for row in t["regions"][:top]:
            lines.append(f"   {seconds(row['a_s']):>9}  {seconds(row['b_s']):>9}  {seconds(row['delta_s']):>10}  "
                         f"{_cut(row['region'], 80)}")
    m = data.get("measured")
    if m:
        lines.append(f"measured on this host ({m['runs']} calls each, in turn; CPU time): A {seconds(m['a_cpu_s'])}, "
                     f"B {seconds(m['b_cpu_s'])}, B/A {m['ratio']:.2f}x; predicted B/A {m['predicted_ratio']:.2f}x "
                     f"(delta {seconds(m['predicted_delta_cpu_s'])} predicted, {seconds(m['delta_cpu_s'])} measured"
                     f"{'' if m['sign_agrees'] else '; the sign differs'})")
    return "\n".join(lines) + "\n"


# ---- JSON ------------------------------------------------------------------------------------------------


def to_json(report: Report, compare: Report | None = None) -> str:
    data = report.to_json()
    if compare is not None:
        data["compare"] = compare_json(report, compare)
        data["compare_program"] = compare.to_json()
    return json.dumps(data, indent=1, default=_default)


def _default(value: Any) -> Any:  # noqa: ANN401
    if isinstance(value, float) and (math.isinf(value) or math.isnan(value)):
        return None
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)


# ---- HTML ------------------------------------------------------------------------------------------------


def _log_scale(value: float, lo: float, hi: float, size: float) -> float:
    value = min(max(value, lo), hi)
    return (math.log10(value) - math.log10(lo)) / (math.log10(hi) - math.log10(lo)) * size


def roofline_svg(t: TargetReport, width: int = 520, height: int = 340) -> str:
    """A roofline chart: attainable FLOP/s against arithmetic intensity, one dot per region (area ~ time)."""
    chip = t.chip
    pad_l, pad_b, pad_t, pad_r = 60, 40, 14, 14
    w, h = width - pad_l - pad_r, height - pad_b - pad_t
    peaks = sorted({chip.peak("f32"), chip.peak("bf16"), chip.vector_flops})
    hi_y = max(peaks) * 3
    lo_y = max(hi_y / 1e7, 1e6)
    lo_x, hi_x = 1e-2, 1e4
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
             f'aria-label="roofline for {html.escape(t.name)}">',
             f'<rect x="{pad_l}" y="{pad_t}" width="{w}" height="{h}" fill="#fafafa" stroke="#999"/>']
    for decade in range(-2, 5):
        x = pad_l + _log_scale(10.0 ** decade, lo_x, hi_x, w)
        parts.append(f'<line x1="{x:.1f}" y1="{pad_t}" x2="{x:.1f}" y2="{pad_t + h}" stroke="#e4e4e4"/>')
        parts.append(f'<text x="{x:.1f}" y="{pad_t + h + 14}" font-size="10" text-anchor="middle">'
                     f'{10.0 ** decade:g}</text>')
    y_decade = math.floor(math.log10(lo_y))
    while 10.0 ** y_decade <= hi_y:
        if 10.0 ** y_decade >= lo_y:
            y = pad_t + h - _log_scale(10.0 ** y_decade, lo_y, hi_y, h)
            parts.append(f'<line x1="{pad_l}" y1="{y:.1f}" x2="{pad_l + w}" y2="{y:.1f}" stroke="#e4e4e4"/>')
            parts.append(f'<text x="{pad_l - 4}" y="{y + 3:.1f}" font-size="10" text-anchor="end">'
                         f'{quantity(10.0 ** y_decade, "")}</text>')
        y_decade += 1
    parts.append(f'<text x="{pad_l + w / 2}" y="{height - 6}" font-size="11" text-anchor="middle">'
                 'arithmetic intensity (FLOP / HBM byte)</text>')
    parts.append(f'<text x="12" y="{pad_t + h / 2}" font-size="11" text-anchor="middle" '
                 f'transform="rotate(-90 12 {pad_t + h / 2})">FLOP/s</text>')
    bw = chip.hbm_bw
    used_y: list[float] = []
    for peak, name, dash in ((chip.peak("bf16"), "bf16 peak", ""), (chip.peak("f32"), "f32 peak", "6,3"),
                             (chip.vector_flops, "vector", "2,3")):
        ridge = peak / bw
        points = []
        for xi in (lo_x, ridge, hi_x):
            yv = min(peak, bw * xi)
            points.append((pad_l + _log_scale(xi, lo_x, hi_x, w), pad_t + h - _log_scale(yv, lo_y, hi_y, h)))
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
        parts.append(f'<polyline points="{path}" fill="none" stroke="#333" stroke-width="1.3" '
                     f'stroke-dasharray="{dash}"/>')
        label_y = points[-1][1] - 4
        while any(abs(label_y - y) < 11 for y in used_y):  # keep close roofs' labels apart
            label_y += 11
        used_y.append(label_y)
        parts.append(f'<text x="{pad_l + w - 4}" y="{label_y:.1f}" font-size="10" text-anchor="end">'
                     f'{name} {quantity(peak, "FLOP/s")}</text>')
    total = max(t.predicted_s, 1e-30)
    for r in t.regions[:60]:
        if r.predicted_s <= 0 or not r.flops:
            continue
        ai = r.intensity if r.bytes else hi_x
        achieved = r.flops / r.predicted_s
        x = pad_l + _log_scale(ai, lo_x, hi_x, w)
        y = pad_t + h - _log_scale(achieved, lo_y, hi_y, h)
        radius = 3 + 14 * math.sqrt(r.predicted_s / total)
        color = KIND_COLORS.get(r.kind, "#888")
        tip = html.escape(f"{r.name}: {seconds(r.predicted_s)} ({r.share * 100:.1f}%), {r.bound}-bound, "
                          f"{quantity(r.flops, 'FLOP')}, {quantity(r.bytes, 'B')}")
        parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{radius:.1f}" fill="{color}" fill-opacity="0.65" '
                     f'stroke="#222" stroke-width="0.5"><title>{tip}</title></circle>')
    parts.append("</svg>")
    return "".join(parts)


def bars_svg(report: Report, width: int = 900) -> str:
    """Stacked bars: each target's time per call split into its regions (top 8 and the rest), each bar the
    whole of its own call (the times differ by orders of magnitude between a CPU and an accelerator)."""
    targets = list(report.targets.values())
    row_h, pad_l = 26, 90
    height = row_h * len(targets) + 30
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
             'aria-label="time per call by region">']
    usable = width - pad_l - 110
    for i, t in enumerate(targets):
        y = 10 + i * row_h
        parts.append(f'<text x="{pad_l - 6}" y="{y + 15}" font-size="12" text-anchor="end">'
                     f'{html.escape(t.name)}</text>')
        x = float(pad_l)
        scale = float(usable)
        shown = t.regions[:8]
        rest = sum(r.predicted_s for r in t.regions[8:])
        for r in shown:
            bw = scale * r.predicted_s / max(t.predicted_s, 1e-30)
            tip = html.escape(f"{r.name}: {seconds(r.predicted_s)} ({r.share * 100:.1f}%)")
            parts.append(f'<rect x="{x:.1f}" y="{y}" width="{max(bw, 0.5):.1f}" height="{row_h - 6}" '
                         f'fill="{KIND_COLORS.get(r.kind, "#888")}" stroke="#fff" stroke-width="0.5">'
                         f'<title>{tip}</title></rect>')
            x += bw
        bw = scale * rest / max(t.predicted_s, 1e-30)
        parts.append(f'<rect x="{x:.1f}" y="{y}" width="{max(bw, 0.5):.1f}" height="{row_h - 6}" fill="#ddd">'
                     f'<title>other regions and the call: {seconds(rest)}</title></rect>')
        parts.append(f'<text x="{x + bw + 6:.1f}" y="{y + 15}" font-size="12">{seconds(t.predicted_s)}</text>')
    legend_y = height - 8
    lx = pad_l
    for kind, color in KIND_COLORS.items():
        parts.append(f'<rect x="{lx}" y="{legend_y - 9}" width="10" height="10" fill="{color}"/>'
                     f'<text x="{lx + 13}" y="{legend_y}" font-size="10">{kind}</text>')
        lx += 72
    parts.append("</svg>")
    return "".join(parts)


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;max-width:1200px}
h1{font-size:20px} h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd;padding-bottom:4px}
table{border-collapse:collapse;font-size:12.5px;margin:8px 0}
td,th{border:1px solid #ddd;padding:3px 7px;text-align:left}
th{background:#f0f0f0} td.n{text-align:right;font-variant-numeric:tabular-nums} .note{color:#666;font-size:12px}
.grid{display:flex;flex-wrap:wrap;gap:18px;align-items:flex-start} .card{flex:1 1 520px}
code{background:#f4f4f4;padding:1px 4px}
"""


def to_html(report: Report, compare: Report | None = None) -> str:
    esc = html.escape
    out = ["<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
           f"<title>hlofuse-report: {esc(report.program)}</title><style>{_CSS}</style></head><body>",
           f"<h1>{esc(header(report))}</h1>",
           "<p class='note'>Predicted per call by hlofuse's analytical model. Host times use ceilings measured on "
           "this machine; TPU, GPU and Trainium times are unvalidated predictions from the published "
           "specifications (python/hlofuse/report/chips.toml).</p>"]
    for note in report.notes:
        out.append(f"<p class='note'>{esc(note)}</p>")
    out.append("<h2>Where the time goes</h2>")
    out.append(bars_svg(report))
    if report.measured:
        m = report.measured["host"]
        out.append(f"<p>Measured on this host: median {esc(seconds(m['measured_s']))} "
                   f"(best {esc(seconds(m['best_s']))}, {m['runs']} runs).</p>")
    out.append("<h2>Fusions</h2><table><tr><th>target</th><th>site</th><th>status</th><th>unfused</th>"
               "<th>fused</th><th>gain</th></tr>")
    for t in report.targets.values():
        for f in t.fusions:
            gain = f"{f.gain:.2f}x" if not math.isinf(f.gain) else "-"
            status = f.status + (f": {f.reason}" if f.reason else "")
            out.append(f"<tr><td>{esc(t.name)}</td><td>{esc(f.site)}</td><td>{esc(status)}</td>"
                       f"<td class='n'>{esc(seconds(f.unfused_s))}</td><td class='n'>{esc(seconds(f.fused_s))}</td>"
                       f"<td class='n'>{gain}</td></tr>")
    out.append("</table>")
    if compare is not None:
        data = compare_json(report, compare)
        out.append(f"<h2>Compare: A = {esc(report.program)}, B = {esc(compare.program)}</h2><table>"
                   "<tr><th>target</th><th>A</th><th>B</th><th>delta</th><th>B/A</th></tr>")
        for name, row in data["targets"].items():
            ratio = f"{row['ratio']:.2f}x" if row["ratio"] else "-"
            out.append(f"<tr><td>{esc(name)}</td><td class='n'>{esc(seconds(row['a_s']))}</td>"
                       f"<td class='n'>{esc(seconds(row['b_s']))}</td><td class='n'>{esc(seconds(row['delta_s']))}</td>"
                       f"<td class='n'>{ratio}</td></tr>")
        out.append("</table>")
    for t in report.targets.values():
        out.append(f"<h2>{esc(t.name)}: {esc(seconds(t.predicted_s))} per call</h2>")
        out.append(f"<p class='note'>{esc(t.chip.description)}; {esc(quantity(t.flops, 'FLOP'))}, "
                   f"{esc(quantity(t.bytes, 'B'))} per call; kernels for <code>{esc(t.chip.kernel_target)}</code>"
                   + (f"; {esc(t.lowering)}" if t.lowering != "ok" else "") + "</p>")
        out.append("<div class='grid'><div class='card'>" + roofline_svg(t) + "</div><div class='card'>")
        out.append("<table><tr><th>time</th><th>share</th><th>bound</th><th>n</th><th>region</th></tr>")
        for r in t.regions[:14]:
            out.append(f"<tr><td class='n'>{esc(seconds(r.predicted_s))}</td><td class='n'>{r.share * 100:.1f}%</td>"
                       f"<td>{esc(r.bound)}</td><td class='n'>{r.count:.0f}</td><td>{esc(r.name)}</td></tr>")
        out.append("</table></div></div>")
        if t.next:
            out.append("<p><b>The next 2×</b></p><ol>")
            for n in t.next:
                out.append(f"<li><b>{esc(n.region)}</b>: {esc(seconds(n.predicted_s))} ({n.share * 100:.0f}%), "
                           f"{esc(n.why)}. {esc(n.fix)}</li>")
            out.append("</ol>")
        for note in t.notes:
            out.append(f"<p class='note'>{esc(note)}</p>")
    out.append(f"<p class='note'>analysis {report.analysis_s:.2f} s</p></body></html>")
    return "\n".join(out)
