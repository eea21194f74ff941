"""The leaderboard as one self-contained HTML file: inline CSS and JS, inline SVG charts, no network.

* a models x envs table (mean reward with its 95% CI, pass@1), sortable by clicking a header; a URL
  fragment ``#sort=<column index>-<asc|desc>`` sorts it on load (what the Chromium test uses);
* per env: a bar chart of mean reward per model with 95% CI whiskers, a table of every metric, and
  links to sample episodes whose messages are embedded further down the page (plus the path of the
  JSONL trace file each comes from).
"""

from __future__ import annotations

import datetime as _dt
import html
from typing import Any

from chatgym.trainer.eval.leaderboard import Cell, Leaderboard, ci_text, fmt, metric_table

_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px;color:#1b1f24;max-width:1400px}
h1{font-size:22px;margin:0 0 4px} h2{font-size:18px;margin:32px 0 8px} .meta{color:#57606a}
table{border-collapse:collapse;margin:8px 0} th,td{border:1px solid #d0d7de;padding:4px 8px}
th{background:#f6f8fa;text-align:left} td.num{text-align:right;font-variant-numeric:tabular-nums}
#leaderboard th{cursor:pointer;user-select:none} #leaderboard th.sorted-asc::after{content:" \\25B2"}
#leaderboard th.sorted-desc::after{content:" \\25BC"} .ci{color:#57606a;font-size:12px}
.p1{display:block;color:#0969da;font-size:12px} details{margin:6px 0;border:1px solid #d0d7de;padding:4px 8px}
pre{white-space:pre-wrap;margin:2px 0 8px;background:#f6f8fa;padding:6px} .role{font-weight:600}
svg text{font:12px system-ui,sans-serif}
"""

_JS = """
function sortTable(col, dir){
  const table=document.getElementById('leaderboard'); const body=table.tBodies[0];
  const rows=Array.from(body.rows);
  const key=r=>{const c=r.cells[col]; const v=c.dataset.value;
    return v===undefined? c.textContent.trim().toLowerCase() : (v===''? -Infinity : parseFloat(v));};
  rows.sort((a,b)=>{const x=key(a),y=key(b); const s=(x<y?-1:x>y?1:0); return dir==='asc'?s:-s;});
  rows.forEach(r=>body.appendChild(r));
  Array.from(table.tHead.rows[0].cells).forEach((th,i)=>{th.classList.remove('sorted-asc','sorted-desc');
    if(i===col) th.classList.add('sorted-'+dir);});
  table.dataset.sort=col+'-'+dir;
}
document.querySelectorAll('#leaderboard th').forEach((th,i)=>th.addEventListener('click',()=>{
  const cur=document.getElementById('leaderboard').dataset.sort||'';
  sortTable(i, cur===i+'-desc'?'asc':'desc');}));
const m=/sort=(\\d+)-(asc|desc)/.exec(location.hash); if(m) sortTable(parseInt(m[1]), m[2]);
function openTrace(){const d=document.getElementById(location.hash.slice(1)); if(d&&d.tagName==='DETAILS') d.open=true;}
window.addEventListener('hashchange', openTrace); openTrace();
"""


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _bar_chart(board: Leaderboard, col: tuple[Any, ...], j: int) -> str:
    """Horizontal bars of mean reward per model with 95% CI whiskers; x axis from min(0, lows) to
    max(1, highs)."""
    present = [(r, board.cell(r, col)) for r in board.rows if board.cell(r, col) is not None]
    lows = [c.metrics.reward_ci_low for _, c in present if c.metrics.reward_ci_low is not None]
    highs = [c.metrics.reward_ci_high for _, c in present if c.metrics.reward_ci_high is not None]
    means = [c.metrics.mean_reward for _, c in present]
    lo, hi = min([0.0, *lows, *means]), max([1.0, *highs, *means])
    label_w, plot_w, bar_h, gap = 220, 460, 22, 10
    height = len(present) * (bar_h + gap) + 30

    def x(v: float) -> float:
        return label_w + (v - lo) / (hi - lo) * plot_w

    parts = [
        f'<svg class="chart" id="chart-{j}" width="{label_w + plot_w + 90}" height="{height}" '
        f'role="img" aria-label="mean reward with 95% CI">'
    ]
    for i, (r, cell) in enumerate(present):
        m = cell.metrics
        y = 5 + i * (bar_h + gap)
        x0, x1 = x(min(0.0, m.mean_reward)), x(max(0.0, m.mean_reward))
        parts.append(
            f'<text x="{label_w - 6}" y="{y + bar_h * 0.7:.1f}" text-anchor="end">{_e(board.row_labels[r])}</text>'
        )
        parts.append(
            f'<rect x="{x0:.1f}" y="{y}" width="{max(x1 - x0, 1.0):.1f}" height="{bar_h}" fill="#54aeff">'
            f"<title>{_e(board.row_labels[r])}: {fmt(m.mean_reward)} {ci_text(m)}</title></rect>"
        )
        if m.reward_ci_low is not None and m.reward_ci_high is not None:
            a, b, mid = x(m.reward_ci_low), x(m.reward_ci_high), y + bar_h / 2
            parts.append(
                f'<path d="M{a:.1f},{mid:.1f}H{b:.1f}M{a:.1f},{mid - 6:.1f}V{mid + 6:.1f}'
                f'M{b:.1f},{mid - 6:.1f}V{mid + 6:.1f}" stroke="#1b1f24" stroke-width="1.5" fill="none"/>'
            )
        parts.append(
            f'<text x="{x(max(m.mean_reward, m.reward_ci_high or m.mean_reward)) + 6:.1f}" '
            f'y="{y + bar_h * 0.7:.1f}">{fmt(m.mean_reward)}</text>'
        )
    axis_y = height - 18
    parts.append(f'<path d="M{label_w},{axis_y}H{label_w + plot_w}" stroke="#8c959f"/>')
    ticks = sorted({lo, 0.0, hi} | ({0.5} if lo <= 0.5 <= hi else set()))
    for v in ticks:
        parts.append(f'<text x="{x(v):.1f}" y="{axis_y + 14}" text-anchor="middle">{v:.3g}</text>')
        parts.append(f'<path d="M{x(v):.1f},{axis_y}v4" stroke="#8c959f"/>')
    parts.append("</svg>")
    return "".join(parts)


def _trace_id(i: int, j: int, s: int) -> str:
    return f"trace-{i}-{j}-{s}"


def _sample_links(cell: Cell, i: int, j: int) -> str:
    links = []
    for s, sample in enumerate(cell.samples):
        row = sample["row"]
        verdict = "pass" if row["success"] else "fail"
        links.append(
            f'<a href="#{_trace_id(i, j, s)}">task {row["task_index"]}/{row["sample_index"]} ({verdict})</a>'
        )
    return ", ".join(links) or "-"


def _trace_section(board: Leaderboard) -> str:
    out = ['<h2 id="traces">Sample traces</h2>']
    for i, r in enumerate(board.rows):
        for j, c in enumerate(board.columns):
            cell = board.cell(r, c)
            if cell is None:
                continue
            for s, sample in enumerate(cell.samples):
                row = sample["row"]
                title = (
                    f"{board.row_labels[r]} · {board.column_labels[c]} · task {row['task_index']} "
                    f"({row['task_id']}) sample {row['sample_index']} · reward {fmt(row['reward'])}"
                )  # plain text: escaped once, in the <summary> below
                body = []
                for msg in sample["messages"] or []:
                    content = str(msg.get("content") or "")
                    if len(content) > 4000:
                        content = content[:4000] + f"\n[... {len(content) - 4000} characters cut ...]"
                    calls = msg.get("tool_calls")
                    if calls:
                        content += "\n" + "\n".join(
                            f"[tool call] {call['function']['name']}({call['function']['arguments']})"
                            for call in calls
                        )
                    body.append(f'<div class="role">{_e(msg.get("role"))}</div><pre>{_e(content)}</pre>')
                if not body:
                    body.append("<p>(trace not found)</p>")
                source = f'<p class="meta">trace file: <code>{_e(row.get("trace_path"))}</code></p>'
                if row.get("error"):
                    source += f'<p class="meta">error: {_e(row["error"])}</p>'
                out.append(
                    f'<details id="{_trace_id(i, j, s)}"><summary>{_e(title)}</summary>{source}{"".join(body)}</details>'
                )
    return "".join(out)


def render_html(board: Leaderboard, *, title: str = "chatgym leaderboard", source: str = "") -> str:
    """The page's HTML text (see the module docstring)."""
    when = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    head = ["<th>model</th>"] + [
        f'<th title="{_e(board.column_labels[c])}">{_e(board.column_labels[c])}</th>' for c in board.columns
    ]
    body = []
    for i, r in enumerate(board.rows):
        tds = [f'<td data-testid="model">{_e(board.row_labels[r])}</td>']
        for j, c in enumerate(board.columns):
            cell = board.cell(r, c)
            if cell is None:
                tds.append('<td class="num" data-value="">-</td>')
                continue
            m = cell.metrics
            ci = ci_text(m)
            tds.append(
                f'<td class="num" id="cell-{i}-{j}" data-value="{m.mean_reward!r}" '
                f'data-model="{_e(board.row_labels[r])}" data-env="{_e(board.column_labels[c])}">'
                f'<span class="mean">{fmt(m.mean_reward)}</span> <span class="ci">{_e(ci)}</span>'
                f'<span class="p1">pass@1 {fmt(m.pass_at_1)}</span></td>'
            )
        body.append(f"<tr>{''.join(tds)}</tr>")
    sections = []
    for j, c in enumerate(board.columns):
        present = [(i, r, board.cell(r, c)) for i, r in enumerate(board.rows) if board.cell(r, c) is not None]
        metric_headers, texts = metric_table([cell.metrics for _, _, cell in present])
        headers = ["model", *metric_headers, "sample traces"]
        trs = []
        for (i, r, cell), row_texts in zip(present, texts, strict=True):
            values = "".join(f'<td class="num">{_e(v)}</td>' for v in row_texts)
            trs.append(
                f'<tr data-model="{_e(board.row_labels[r])}"><td>{_e(board.row_labels[r])}</td>{values}'
                f"<td>{_sample_links(cell, i, j)}</td></tr>"
            )
        sections.append(
            f'<section id="env-{j}"><h2>{_e(board.column_labels[c])}</h2>{_bar_chart(board, c, j)}'
            f'<table class="metrics" data-env="{_e(board.column_labels[c])}"><thead><tr>'
            + "".join(f"<th>{_e(h)}</th>" for h in headers)
            + f"</tr></thead><tbody>{''.join(trs)}</tbody></table></section>"
        )
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
        f"<style>{_CSS}</style></head><body><h1>{_e(title)}</h1>"
        f'<p class="meta">generated {when}{" from " + _e(source) if source else ""}. Cells: mean reward over tasks '
        f"[95% CI], pass@1; pass@k uses the unbiased estimator (Chen et al. 2021), k={board.k} (capped at each "
        "cell's samples per task). Columns are env versions: id@dataset-hash/split. Click a header to sort.</p>"
        f'<table id="leaderboard"><thead><tr>{"".join(head)}</tr></thead><tbody>{"".join(body)}</tbody></table>'
        f"{''.join(sections)}{_trace_section(board)}<script>{_JS}</script></body></html>"
    )
