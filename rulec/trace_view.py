"""The HTML viewer of a scheduler trace (engine/trace.py): one self-contained file.

`write_html(trace, path)` writes a page with everything inline (the trace as
JSON, the script, the styles; graphs are drawn as inline SVG by the script),
so it opens from disk with no network. The page shows the passes of every
schedule call; for the selected pass, the graph after it (a layered DAG,
sources on top, the sink at the bottom, at most MAX_DRAWN nodes) and a
step-through of its rewrites: the rule, a link to its line in the .rules
file, the node before and after, and the touched nodes (CSS class
`touched`). The URL fragment `#pass=K&step=J` opens pass K (0-based, as
numbered in the list) at rewrite J (1-based, as in "rewrite J of N";
0 = no rewrite selected); Prev / Next, the lists and the arrow keys keep the
fragment up to date, so a view can be shared as a link.
"""
from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from rulec.engine.diskcache import write_replacing

MAX_DRAWN = 400   # nodes drawn per graph; bigger graphs show the part nearest the sink, with a note


def _with_links(data: dict) -> dict:
  """Each rewrite gets `href` (file:///abs/x.rules#L12) and `where` (x.rules:12:3) for its rule."""
  for p in data["passes"]:
    for r in p["rewrites"]:
      f = r.get("file") or ""
      if f and Path(f).is_absolute():
        r["href"] = Path(f).as_uri() + (f"#L{r['line']}" if r.get("line") else "")
        r["where"] = f"{Path(f).name}:{r['line']}:{r['col']}"
      else:
        r["href"], r["where"] = "", r.get("loc") or "unknown location"
  return data


def render_html(trace: Any) -> str:
  """The page for a Trace (or its to_json() dict)."""
  data = _with_links(trace if isinstance(trace, dict) else trace.to_json())
  data["max_drawn"] = MAX_DRAWN
  blob = json.dumps(data, separators=(",", ":")).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
  title = html.escape(data.get("title") or "rulec trace")
  page = _PAGE.replace("@STYLE@", _STYLE).replace("@SCRIPT@", _SCRIPT)
  return page.replace("@TITLE@", title).replace("@DATA@", blob)   # the data last: nothing is replaced inside it


def write_html(trace: Any, path: str | Path) -> Path:
  """Write the page as a new file renamed over `path` (engine/diskcache.py's write_replacing): a symbolic link
  at `path` is replaced by the page, and the file it pointed to is left as it was (docs/security.md)."""
  path = Path(path)
  if path.parent and not path.parent.exists(): path.parent.mkdir(parents=True, exist_ok=True)
  write_replacing(path, render_html(trace).encode("utf-8"))
  return path


_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>@TITLE@</title>
<style>@STYLE@</style>
</head>
<body>
<header><h1>@TITLE@</h1><span id="summary"></span></header>
<div id="main">
<nav id="side"><ol id="passes"></ol></nav>
<section id="view">
  <h2 id="pass-title">no passes recorded</h2>
  <div id="pass-info"></div>
  <div id="controls">
    <button id="prev" type="button" onclick="go(-1)">&#9664; Prev</button>
    <span id="step-counter">rewrite 0 of 0</span>
    <button id="next" type="button" onclick="go(1)">Next &#9654;</button>
    <span class="hint">keys: &larr; &rarr; rewrites, [ ] passes</span>
  </div>
  <div id="rewrite">
    <div id="rule-line">rule <b id="rule-name">-</b> at <a id="rule-link" href="#">-</a></div>
    <pre id="rule-text"></pre>
    <div class="panes">
      <div class="pane" id="before-pane"><h3>before</h3><pre class="etext" id="before-text"></pre><div id="before-tree"></div></div>
      <div class="pane" id="after-pane"><h3>after</h3><pre class="etext" id="after-text"></pre><div id="after-tree"></div></div>
    </div>
  </div>
  <h3>graph after this pass <span id="graph-legend">(sources on top, sink at the bottom; <span class="touched-swatch">outlined</span>: touched by the current rewrite)</span></h3>
  <div id="graph-note"></div>
  <div id="touched-note"></div>
  <div id="graph"></div>
  <details id="steps-box"><summary>all rewrites of this pass</summary><ol id="steps"></ol></details>
</section>
</div>
<script type="application/json" id="trace-data">@DATA@</script>
<script>@SCRIPT@</script>
</body>
</html>
"""

_STYLE = """
body { font: 13px/1.4 system-ui, sans-serif; margin: 0; color: #222; }
header { padding: 6px 12px; background: #2d3e50; color: #fff; display: flex; gap: 16px; align-items: baseline; }
header h1 { font-size: 16px; margin: 0; }
#main { display: flex; align-items: flex-start; }
#side { width: 250px; min-width: 250px; max-height: calc(100vh - 40px); overflow: auto; border-right: 1px solid #ccc; position: sticky; top: 0; }
#passes { list-style: none; margin: 0; padding: 4px; }
#passes li.sched { font-weight: bold; margin-top: 8px; color: #555; }
#passes li.pass a { display: block; padding: 2px 6px; color: #222; text-decoration: none; border-radius: 3px; }
#passes li.pass a:hover { background: #eef; }
#passes li.pass.selected a { background: #2d6cdf; color: #fff; }
#passes .n { float: right; opacity: .7; }
#view { padding: 8px 14px; flex: 1; min-width: 0; }
#view h2 { margin: 4px 0; font-size: 18px; }
#view h3 { margin: 10px 0 4px; font-size: 14px; }
#controls { margin: 8px 0; display: flex; gap: 10px; align-items: center; }
#controls button { font-size: 13px; padding: 3px 10px; }
#step-counter { font-weight: bold; min-width: 140px; text-align: center; }
.hint, #graph-legend { color: #777; font-weight: normal; font-size: 12px; }
#rule-text { background: #f6f6f6; padding: 4px 6px; margin: 4px 0; white-space: pre-wrap; }
.panes { display: flex; gap: 12px; }
.pane { flex: 1; min-width: 0; border: 1px solid #ddd; border-radius: 4px; padding: 4px 8px; overflow: auto; max-height: 360px; }
.etext { white-space: pre-wrap; word-break: break-all; font-size: 12px; margin: 2px 0 6px; color: #444; }
.enode { border-left: 2px solid #ccc; padding: 1px 0 1px 6px; margin: 2px 0 2px 4px; }
.enode > .lbl { font-family: ui-monospace, monospace; font-size: 12px; }
.enode.touched > .lbl { outline: 2px solid #e4572e; background: #fff1ec; border-radius: 3px; padding: 0 3px; }
.op { font-weight: bold; }
.dt { color: #2d6cdf; }
.arg { color: #6a3d9a; }
.tag { color: #b15928; }
.nid, .more { color: #999; }
#graph { overflow: auto; max-height: 75vh; border: 1px solid #ddd; border-radius: 4px; }
#graph-note { color: #b15928; margin: 2px 0; }
#touched-note { color: #777; font-size: 12px; margin: 2px 0; }
svg .edge { stroke: #999; fill: none; stroke-width: 1; }
svg .node rect { fill: #fff; stroke: #556; stroke-width: 1; rx: 4; }
svg .node.sink rect { fill: #eef3ff; }
svg .node.touched rect { stroke: #e4572e; stroke-width: 3; fill: #fff1ec; }
svg .node text { font: 11px ui-monospace, monospace; fill: #222; }
svg .node text.opname { font-weight: bold; }
.touched-swatch { outline: 2px solid #e4572e; padding: 0 3px; }
#steps li.cur { background: #fff1ec; font-weight: bold; }
#steps a { color: #222; text-decoration: none; }
.err { color: #c00; font-weight: bold; }
"""

_SCRIPT = r"""
"use strict";
const DATA = JSON.parse(document.getElementById("trace-data").textContent);
const PASSES = DATA.passes;
const CAP = DATA.max_drawn || 400;
const BW = 150, BH = 40, GX = 18, GY = 34, PAD = 12;
let cur = {pass: -1, step: 0};
let drawn = {pass: -1, els: new Map()};

function esc(s) { return String(s).replace(/[&<>"']/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c])); }
function short(s, n) { s = String(s); return s.length <= n ? s : s.slice(0, n - 1) + "\u2026"; }
function $(id) { return document.getElementById(id); }

function passLabel(p) { return p.kernel === null || p.kernel === undefined ? p.name : p.name + " k" + p.kernel; }

function buildPassList() {
  const ol = $("passes");
  let h = "", lastSched = -1;
  for (const p of PASSES) {
    if (p.schedule !== lastSched) {
      lastSched = p.schedule;
      const s = DATA.schedules[p.schedule] || {};
      h += `<li class="sched">schedule ${p.schedule}${s.caller ? ' <span class="nid">' + esc(short(s.caller.split("/").pop(), 28)) + "</span>" : ""}</li>`;
    }
    h += `<li class="pass" id="pass-item-${p.index}"><a href="#pass=${p.index}" onclick="selectPass(${p.index}); return false;">`
       + `${p.index}. ${esc(passLabel(p))}${p.error ? ' <span class="err">!</span>' : ""}<span class="n">${p.n_rewrites}</span></a></li>`;
  }
  ol.innerHTML = h;
  const n = PASSES.reduce((a, p) => a + p.n_rewrites, 0);
  $("summary").textContent = `${DATA.schedules.length} schedule calls, ${PASSES.length} passes, ${n} rewrites`;
}

// *** the graph: layered layout, sources on top ***

function layout(p) {
  const N = p.nodes;
  let ids = p.graph, capped = false;
  if (ids.length > CAP && p.sink !== null) {
    const keep = new Set([p.sink]), q = [p.sink];
    for (let h = 0; h < q.length && keep.size < CAP; h++)
      for (const s of N[q[h]].src) if (!keep.has(s) && keep.size < CAP) { keep.add(s); q.push(s); }
    ids = ids.filter(i => keep.has(i));
    capped = true;
  }
  const inSet = new Set(ids), layer = new Map(), layers = [];
  for (const i of ids) {
    let l = 0;
    for (const s of N[i].src) if (inSet.has(s)) l = Math.max(l, layer.get(s) + 1);
    layer.set(i, l);
    (layers[l] = layers[l] || []).push(i);
  }
  const col = new Map();
  layers.forEach((L, li) => {
    if (li > 0) {
      const bc = new Map(L.map(i => {
        const xs = N[i].src.filter(s => inSet.has(s)).map(s => col.get(s));
        return [i, xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : 0];
      }));
      L.sort((a, b) => bc.get(a) - bc.get(b));
    }
    L.forEach((i, k) => col.set(i, k - (L.length - 1) / 2));
  });
  const widest = Math.max(1, ...layers.map(L => L.length));
  const pos = new Map();
  const x0 = PAD + (widest - 1) / 2 * (BW + GX);
  for (const i of ids) pos.set(i, {x: x0 + col.get(i) * (BW + GX), y: PAD + layer.get(i) * (BH + GY)});
  return {ids, pos, capped, inSet, width: 2 * PAD + widest * (BW + GX) - GX, height: 2 * PAD + layers.length * (BH + GY) - GY};
}

function nodeTitle(id, n) {
  return `#${id} ${n.op} ${n.dtype}` + (n.arg !== undefined ? ` arg=${n.arg}` : "") + (n.shape ? ` shape=(${n.shape.join(", ")})` : "")
       + (n.tag !== undefined ? ` tag=${n.tag}` : "") + (n.src.length ? ` src=[${n.src.map(s => "#" + s).join(", ")}]` : "");
}

function drawGraph(k) {
  const p = PASSES[k], N = p.nodes;
  const L = layout(p);
  let s = `<svg width="${L.width}" height="${L.height}" viewBox="0 0 ${L.width} ${L.height}">`;
  for (const i of L.ids) {
    const b = L.pos.get(i);
    for (const src of N[i].src) {
      if (!L.inSet.has(src)) continue;
      const a = L.pos.get(src), ax = a.x + BW / 2, ay = a.y + BH, bx = b.x + BW / 2, by = b.y, my = (ay + by) / 2;
      s += `<path class="edge" d="M${ax},${ay} C${ax},${my} ${bx},${my} ${bx},${by}"/>`;
    }
  }
  for (const i of L.ids) {
    const n = N[i], b = L.pos.get(i);
    const line2 = n.arg !== undefined ? short(n.arg, 21) : (n.shape && n.shape.length ? "(" + n.shape.join(",") + ")" : "");
    s += `<g class="node${i === p.sink ? " sink" : ""}" id="gnode-${i}" data-id="${i}" transform="translate(${b.x},${b.y})">`
       + `<title>${esc(nodeTitle(i, n))}</title><rect width="${BW}" height="${BH}"/>`
       + `<text class="opname" x="6" y="15">${esc(short(n.op, 12))}</text><text x="${BW - 6}" y="15" text-anchor="end">${esc(short(n.dtype, 8))}</text>`
       + `<text x="6" y="32">${esc(line2)}</text></g>`;
  }
  s += "</svg>";
  $("graph").innerHTML = s;
  const els = new Map();
  for (const g of $("graph").querySelectorAll("g.node")) els.set(+g.dataset.id, g);
  drawn = {pass: k, els};
  $("graph-note").textContent = L.capped
    ? `large graph: drawing ${L.ids.length} of ${p.graph.length} nodes (those nearest the sink)` : "";
}

// *** before / after as small expression trees ***

function expr(p, id, depth, mark) {
  const n = p.nodes[id];
  let h = `<div class="enode${mark.has(id) ? " touched" : ""}" data-id="${id}"><span class="lbl" title="${esc(nodeTitle(id, n))}">`
        + `<span class="op">${esc(n.op)}</span> <span class="dt">${esc(n.dtype)}</span>`
        + (n.arg !== undefined ? ` <span class="arg">${esc(short(n.arg, 40))}</span>` : "")
        + (n.tag !== undefined ? ` <span class="tag">tag=${esc(short(n.tag, 20))}</span>` : "")
        + ` <span class="nid">#${id}</span></span>`;
  if (n.src.length) {
    if (depth <= 0) h += ` <span class="more">(${n.src.length} sources)</span>`;
    else { for (const s of n.src) h += expr(p, s, depth - 1, mark); }
  }
  return h + "</div>";
}

// *** selection ***

function selectPass(k, step) {
  if (!PASSES.length) return;
  k = Math.max(0, Math.min(PASSES.length - 1, k | 0));
  const p = PASSES[k];
  if (step === undefined || step === null || isNaN(step)) step = p.rewrites.length ? 1 : 0;
  if (drawn.pass !== k) drawGraph(k);
  document.querySelectorAll("#passes li.pass.selected").forEach(e => e.classList.remove("selected"));
  const item = $("pass-item-" + k);
  if (item) { item.classList.add("selected"); }
  cur.pass = k;
  const s = DATA.schedules[p.schedule] || {};
  $("pass-title").textContent = `pass ${k}: ${passLabel(p)} (schedule ${p.schedule})`;
  const counts = {};
  for (const r of p.rewrites) counts[r.rule] = (counts[r.rule] || 0) + 1;
  const fired = Object.entries(counts).sort((a, b) => b[1] - a[1]).map(([r, c]) => `${esc(r)} x${c}`).join(", ");
  $("pass-info").innerHTML = `rule set <b>${esc(p.ruleset)}</b>; ${p.input_nodes} &rarr; ${p.graph.length} nodes; `
    + `${p.n_rewrites} rewrites in ${p.ms} ms` + (p.n_rewrites > p.rewrites.length ? ` (first ${p.rewrites.length} recorded)` : "")
    + (s.caller ? `; scheduled from ${esc(s.caller)} on ${esc(s.device)}` : "")
    + (fired ? `<br>rules fired: ${fired}` : "")
    + (p.error ? `<br><span class="err">the pass failed: ${esc(p.error)}</span>` : "");
  let h = "";
  const shown = Math.min(p.rewrites.length, 1000);
  for (let j = 0; j < shown; j++) {
    const r = p.rewrites[j];
    h += `<li id="step-item-${j + 1}"><a href="#pass=${k}&step=${j + 1}" onclick="setStep(${j + 1}); return false;">${esc(r.rule)} <span class="nid">${esc(r.where)}</span></a></li>`;
  }
  if (p.rewrites.length > shown) h += `<li>&hellip; ${p.rewrites.length - shown} more</li>`;
  $("steps").innerHTML = h;
  setStep(step);
}

function setStep(j) {
  const p = PASSES[cur.pass];
  if (!p) return;
  const n = p.rewrites.length;
  j = n ? Math.max(1, Math.min(n, j | 0)) : 0;
  cur.step = j;
  $("step-counter").textContent = `rewrite ${j} of ${n}`;
  $("prev").disabled = j <= 1;
  $("next").disabled = j >= n;
  for (const g of drawn.els.values()) g.classList.remove("touched");
  document.querySelectorAll("#steps li.cur").forEach(e => e.classList.remove("cur"));
  const link = $("rule-link");
  if (!j) {
    $("rule-name").textContent = "-";
    link.textContent = "-"; link.removeAttribute("href");
    $("rule-text").textContent = p.n_rewrites ? "" : "no rule fired in this pass";
    for (const id of ["before-text", "after-text"]) $(id).textContent = "";
    for (const id of ["before-tree", "after-tree"]) $(id).innerHTML = "";
    $("touched-note").textContent = "";
  } else {
    const r = p.rewrites[j - 1];
    $("rule-name").textContent = r.rule;
    link.textContent = r.where;
    if (r.href) link.setAttribute("href", r.href); else link.removeAttribute("href");
    link.title = r.loc;
    $("rule-text").textContent = r.text || "";
    $("before-text").textContent = r.before_text;
    $("after-text").textContent = r.after_text;
    $("before-tree").innerHTML = expr(p, r.before, 3, new Set([r.before]));
    const touched = new Set(r.touched);
    $("after-tree").innerHTML = expr(p, r.after, 3, touched);
    let shown = 0;
    for (const id of touched) { const g = drawn.els.get(id); if (g) { g.classList.add("touched"); shown++; } }
    $("touched-note").textContent = `${shown} of the ${touched.size} nodes this rewrite made appear in the graph below`
      + (shown < touched.size ? " (later rewrites replaced the others)" : "");
    const li = $("step-item-" + j);
    if (li) li.classList.add("cur");
  }
  try { history.replaceState(null, "", `#pass=${cur.pass}&step=${j}`); } catch (e) { /* file:// may refuse; fine */ }
}

function go(d) { setStep(cur.step + d); }
function goPass(d) { selectPass(cur.pass + d); }

function fromHash() {
  const m = {};
  for (const part of location.hash.replace(/^#/, "").split("&")) {
    const [k, v] = part.split("=");
    if (k) m[k] = parseInt(v, 10);
  }
  if (!isNaN(m.pass) && m.pass !== undefined) selectPass(m.pass, m.step);
  else if (PASSES.length) {
    const first = PASSES.findIndex(p => p.rewrites.length);
    selectPass(first < 0 ? 0 : first);
  }
}

document.addEventListener("keydown", e => {
  if (e.target && /INPUT|TEXTAREA/.test(e.target.tagName)) return;
  if (e.key === "ArrowRight") go(1);
  else if (e.key === "ArrowLeft") go(-1);
  else if (e.key === "]") goPass(1);
  else if (e.key === "[") goPass(-1);
});
window.addEventListener("hashchange", fromHash);
buildPassList();
fromHash();
"""


def split_args(tokens: list[str], out: str) -> tuple[list[str], str]:
  """The words after `rulec trace PROGRAM`: `-o FILE` / `--output FILE` / `--output=FILE` are rulec's,
  everything after `--` and every other word goes to the program."""
  args: list[str] = []
  i = 0
  while i < len(tokens):
    t = tokens[i]
    if t == "--": return args + tokens[i + 1:], out
    if t in ("-o", "--output") and i + 1 < len(tokens): out, i = tokens[i + 1], i + 2; continue
    if t.startswith("--output="): out = t.split("=", 1)[1]
    else: args.append(t)
    i += 1
  return args, out


def trace_program(program: str, argv: list[str], out: str | Path) -> int:
  """`rulec trace`: run a Python program with tracing on (as `python PROGRAM ARGS...` would) and write the page.

  Returns 0; 1 when the program raised, or its exit code when it exited non-zero (the trace so far is
  still written either way); 2 when there is no such program."""
  import runpy
  import sys
  import traceback
  from rulec.engine.trace import tracing
  argv, out = split_args(list(argv), str(out))   # `rulec trace p.py -o t.html`: argparse leaves -o to the program
  path = Path(program)
  if not path.is_file():
    print(f"rulec trace: no such file: {program}", file=sys.stderr)
    return 2
  fname = str(path)
  old_argv, old_path = sys.argv, list(sys.path)
  sys.argv = [fname, *argv]
  sys.path.insert(0, str(path.resolve().parent))
  rc = 0
  with tracing(f"rulec trace {program}") as t:
    try:
      runpy.run_path(fname, run_name="__main__")
    except SystemExit as e:
      if e.code not in (None, 0):
        rc = e.code if isinstance(e.code, int) else 1
        print(f"rulec trace: {program} exited with {e.code}", file=sys.stderr)
    except Exception as e:
      tb = e.__traceback__
      while tb is not None and tb.tb_frame.f_code.co_filename != fname: tb = tb.tb_next   # from the program's frames on
      lines = traceback.format_exception(type(e), e, tb) if tb is not None else traceback.format_exception_only(type(e), e)
      print("".join(lines).rstrip(), file=sys.stderr)
      print(f"rulec trace: {program} raised {type(e).__name__}; writing the trace recorded so far", file=sys.stderr)
      rc = 1
    finally:
      sys.argv = old_argv
      sys.path[:] = old_path
  try: out = write_html(t, out)
  except OSError as e:
    print(f"rulec trace: could not write {out}: {e.strerror or type(e).__name__}", file=sys.stderr)
    return rc or 1
  print(f"rulec trace: {t.summary()} -> {out}")
  if not t.passes: print("rulec trace: the program scheduled nothing (realize a Tensor to record passes)", file=sys.stderr)
  return rc
