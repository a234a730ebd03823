"""`trace_html`: one rollout's trace as a self-contained HTML page (inline CSS, no scripts, no CDN)."""

from __future__ import annotations

import json
from html import escape
from typing import Any

from agentrl_sdk.tracing.render import advantage_sign, ids_text
from agentrl_sdk.tracing.view import SpanLine, TraceView

_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px;color:#1d2330;background:#fff}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:24px 0 8px}
.meta{color:#5b6478;margin-bottom:12px} table.facts td{padding:2px 14px 2px 0;vertical-align:top}
table.facts td:first-child{font-weight:600} .err{color:#b3261e;font-weight:600}
ul.spans{list-style:none;padding-left:18px;margin:0} ul.spans li{margin:2px 0}
.kind{font-size:11px;color:#fff;border-radius:3px;padding:0 4px;margin-right:6px;background:#7a8499}
.k-AGENT{background:#6c4ab6}.k-CHAIN{background:#3b6fb6}.k-CHAT_MODEL{background:#b65e3b}
.k-LLM{background:#8a6d1f}.k-TOOL{background:#2f8a5b} .ms{color:#7a8499;font-size:12px}
.io{color:#0b6e7a;font-family:ui-monospace,monospace;font-size:12px}
.seg{border:1px solid #d5d9e2;border-radius:6px;margin:12px 0;overflow:hidden}
.seg header{background:#f3f5f9;padding:6px 10px;font-size:13px}
.seg pre{margin:0;padding:10px;white-space:pre-wrap;word-break:break-word;
 font:13px/1.5 ui-monospace,monospace}
.prompt{color:#8a90a0} .obs{background:#e3f4f7;color:#0b5e6a}
.gen-pos{background:#dcf5dc;color:#145c14;font-weight:600}
.gen-neg{background:#fbdede;color:#8c1d18;font-weight:600}
.gen-0{background:#fbf3d0;color:#6b5400;font-weight:600}
.legend span{padding:1px 6px;margin-right:8px;border-radius:3px}
"""

_GEN = {"+": "gen-pos", "-": "gen-neg", "0": "gen-0"}


def trace_html(view: TraceView) -> str:
    """The page: summary, span tree (tool inputs/outputs and errors inline), tokens by mask."""
    summary = view.summary()
    sign = advantage_sign(summary["advantage"])
    facts = "".join(
        f"<tr><td>{escape(k)}</td><td class='{'err' if k == 'error' else ''}'>"
        f"{escape(_text(v))}</td></tr>"
        for k, v in summary.items() if v not in (None, {}, [])
    )
    tags = ", ".join(f"{escape(k)}={escape(v)}" for k, v in sorted(view.tags.items())
                     if not k.startswith("mlflow."))
    segments = "".join(_segment(i, seg, sign) for i, seg in enumerate(view.segments))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>agentrl trace {escape(view.trace_id)}</title><style>{_CSS}</style></head>
<body>
<h1>Rollout {escape(view.title)}</h1>
<div class="meta">trace <code>{escape(view.trace_id)}</code> · tags: {tags}</div>
<table class="facts">{facts}</table>
<h2>Spans</h2>
{_spans(view.spans)}
<h2>Tokens</h2>
<div class="legend"><span class="prompt">prompt</span><span class="obs">observation (mask 0)</span>
<span class="gen-pos">generated, mask 1, advantage &gt; 0</span>
<span class="gen-neg">generated, mask 1, advantage &lt; 0</span>
<span class="gen-0">generated, mask 1, advantage 0</span></div>
{segments}
</body></html>
"""


def _spans(lines: list[SpanLine]) -> str:
    out, depth = [], -1
    for line in lines:
        if line.depth > depth:
            out.append("<ul class='spans'>" * (line.depth - depth))
        else:
            out.append("</li>" + "</ul></li>" * (depth - line.depth))
        depth = line.depth
        out.append(f"<li>{_span(line)}")
    out.append("</li>" + "</ul></li>" * depth + "</ul>")
    return "".join(out)


def _span(line: SpanLine) -> str:
    parts = [f"<span class='kind k-{escape(line.kind)}'>{escape(line.kind)}</span>",
             f"<span class='{'err' if line.error else ''}'>{escape(line.name)}</span> ",
             f"<span class='ms'>{line.duration_ms:.1f} ms</span>"]
    for label, value in line.details():
        css = {"tokens": "ms", "error": "err"}.get(label, "io")
        shown = value if label == "tokens" else f"{label}: {_text(value)}"
        parts.append(f" <span class='{css}'>{escape(shown)}</span>")
    return "".join(parts)


def _segment(index: int, seg: dict[str, Any], sign: str) -> str:
    chunks = [f"<span class='prompt' title='prompt: {len(seg['prompt_ids'])} tokens'>"
              f"{escape(seg.get('prompt_text') or ids_text(seg['prompt_ids']))}</span>"]
    for run in seg.get("runs", []):
        ids = seg["response_ids"][run["start"]:run["end"]]
        css = _GEN[sign] if run["mask"] else "obs"
        title = f"tokens {run['start']}-{run['end'] - 1} · mask {run['mask']} · ids {ids[:12]}"
        text = run["text"] if run["text"] is not None else ids_text(ids)
        chunks.append(f"<span class='{css}' title='{escape(title)}'>{escape(text)}</span>")
    generated = sum(seg["response_mask"])
    head = (f"segment {index} · node <b>{escape(seg['node'])}</b> · policy {escape(seg['policy'])}"
            f" · {'trained' if seg['trained'] else 'frozen'} · prompt {len(seg['prompt_ids'])} · "
            f"generated {generated} · observation {len(seg['response_ids']) - generated} tokens")
    return f"<section class='seg'><header>{head}</header><pre>{''.join(chunks)}</pre></section>"


def _text(value: Any, limit: int = 400) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"
