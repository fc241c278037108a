"""`rulec trace`: recording scheduler passes and rewrites (engine/trace.py), the HTML viewer
(rulec/trace_view.py, checked in a real headless Chromium), the CLI and RULEC_TRACE=1."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path: sys.path.insert(0, str(REPO))

from rulec.engine.sched import driver as scheduler  # noqa: E402
from rulec.engine import trace  # noqa: E402
from rulec.engine.lang.loader import load_library  # noqa: E402
from rulec.engine.ir.ops import Ops  # noqa: E402
from rulec.engine.ir.rewrite import RewriteLoopError  # noqa: E402
from rulec.engine.ir.uop import UOp  # noqa: E402
from rulec import Tensor  # noqa: E402
from rulec.cli import main as cli_main  # noqa: E402
from rulec.trace_view import MAX_DRAWN, render_html, write_html  # noqa: E402
from tests.helpers import subprocess_env  # noqa: E402

PROGRAM = "from rulec import Tensor\n(Tensor.rand(4, 4) + 1).relu().sum().realize()\n"
PASS_NAMES = ["earliest", "prepare", "stage", "realize", "rangeify", "symbolic", "split", "to_params", "untag", "views"]


def _env() -> dict:
  return subprocess_env()


@pytest.fixture(scope="module")
def traced():
  with trace.tracing() as t:
    (Tensor.rand(4, 4) + 1).relu().sum().realize()
  assert not trace.ACTIVE, "tracing() left a trace active"
  return t


# *** recording ***

def test_passes_are_recorded_in_order(traced):
  assert len(traced.schedules) == 1
  s = traced.schedules[0]
  assert [p.name for p in s.passes] == PASS_NAMES
  assert [p.name for p in traced.passes] == PASS_NAMES
  assert re.search(rf"{Path(__file__).name}:\d+$", s.caller), s.caller   # the line that called realize()
  assert [p.kernel for p in traced.passes if p.name in ("to_params", "untag")] == [0, 0]
  assert traced.n_rewrites > 0 and any(p.name == "rangeify" and p.n_rewrites for p in traced.passes)


def test_rewrites_name_real_rules_at_real_lines(traced):
  lib = load_library()
  for p in traced.passes:
    known = {(n, loc) for n, loc, _ in lib.matcher(p.ruleset).rule_info}
    for r in p.rewrites:
      assert (r["rule"], r["loc"]) in known, f"{p.name}: {r['rule']} at {r['loc']} is not a rule of {p.ruleset}"
      path = Path(r["file"])
      assert path.is_absolute() and path.suffix == ".rules" and path.is_file(), r["file"]
      text = path.read_text().splitlines()[r["line"] - 1]
      assert r["rule"] in text and 1 <= r["col"] <= len(text), f"{r['loc']}: {text!r}"
      assert r["text"].startswith(f"rule {r['rule']}")


def test_node_tables_resolve(traced):
  for p in traced.passes:
    nodes = p.table.rows
    for k, row in enumerate(nodes):
      assert all(0 <= s < k for s in row["src"]), f"{p.name}: node {k} has a source interned after it"
      assert row["op"] in Ops.__members__ and isinstance(row["dtype"], str)
    for r in p.rewrites:
      for key in ("before", "after"): assert 0 <= r[key] < len(nodes)
      assert r["before"] != r["after"] and r["touched"][0] == r["after"]
      assert r["before_text"] and r["after_text"]
    assert p.graph and all(0 <= i < len(nodes) for i in p.graph) and len(set(p.graph)) == len(p.graph)
    assert nodes[p.sink]["op"] == "SINK" and p.graph[-1] == p.sink
  rangeify = next(p for p in traced.passes if p.name == "rangeify")
  assert any(row.get("shape") for row in rangeify.table.rows)


def test_tracing_does_not_change_the_kernels():
  # which_rule re-runs rules, and to_params' ctx counts ranges: tracing must not renumber twice
  x = Tensor.rand(3, 5).realize()
  y = (x.exp() * 2).sum(axis=1) + x.max(axis=1)
  text = lambda ks: [re.sub(r"BUFFER #\d+", "BUFFER", k.render()) for k in ks]   # noqa: E731 (new output buffers each time)
  plain = text(y.schedule())
  with trace.tracing() as t: traced_kernels = text(y.schedule())
  assert traced_kernels == plain
  assert [p.name for p in t.passes if p.name == "to_params"] == ["to_params"] * len(plain)


class _Loop:
  """A matcher that rewrites a NEG into another NEG and back again, forever."""
  def rewrite(self, u, ctx=None):
    if u.op is not Ops.NEG: return None
    return UOp(Ops.NEG, u.dtype, u.src, None if u.arg == 1 else 1)


def test_a_failing_pass_is_recorded_with_its_error():
  sink = UOp.sink(UOp(Ops.NEG, UOp.variable("x", 0, 9).dtype, (UOp.variable("x", 0, 9),)))
  with trace.tracing() as t, pytest.raises(RewriteLoopError):
    scheduler._pass("looping", sink, _Loop())
  p, = t.passes
  assert p.name == "looping" and p.error.startswith("RewriteLoopError") and p.n_rewrites >= 1 and p.graph == []
  assert p.rewrites[0]["rule"] == "?"
  render_html(t)   # a partial trace still renders


def test_no_recording_when_off():
  assert not trace.ACTIVE
  x = Tensor.rand(4)
  with trace.tracing() as t: pass
  (x + 1).realize()
  assert t.passes == [] and t.schedules == []


# *** the page ***

def _data_of(page: str) -> dict:
  m = re.search(r'<script type="application/json" id="trace-data">(.*?)</script>', page, re.S)
  assert m, "no trace data in the page"
  return json.loads(m.group(1))


def test_html_is_self_contained(traced):
  page = render_html(traced)
  assert "<svg" in page and "<script>" in page and page.lstrip().startswith("<!doctype html>")
  assert not re.search(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", page, re.I), "the page loads something from elsewhere"
  assert "http://" not in page and "https://" not in page
  assert not re.search(r"<link\b|@import|url\(", page, re.I)
  data = _data_of(page)
  assert [p["name"] for p in data["passes"]] == PASS_NAMES
  r = next(p for p in data["passes"] if p["rewrites"])["rewrites"][0]
  assert r["href"] == Path(r["file"]).as_uri() + f"#L{r['line']}"
  assert r["where"] == f"{Path(r['file']).name}:{r['line']}:{r['col']}"


def _chromium() -> str | None:
  for name in (os.environ.get("RULEC_CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
    if name and (path := shutil.which(name)): return path
  return None


class _Dom(HTMLParser):
  """Text and attributes of elements with an id; every element with class `touched` and the ids around it."""
  VOID = {"meta", "br", "input", "img", "link", "hr", "wbr", "source", "area", "base", "col", "embed", "track"}

  def __init__(self, text: str):
    super().__init__()
    self.by_id: dict[str, dict] = {}
    self.touched: list[list[str]] = []
    self.open: list[tuple[str, str | None]] = []
    self.raw = text
    self.feed(text)

  def handle_starttag(self, tag, attrs):
    a = dict(attrs)
    if "touched" in (a.get("class") or "").split(): self.touched.append([i for _, i in self.open if i] + [a.get("id") or ""])
    if tag in self.VOID: return
    self.open.append((tag, a.get("id")))
    if a.get("id"): self.by_id[a["id"]] = {"attrs": a, "text": ""}

  def handle_startendtag(self, tag, attrs):
    self.handle_starttag(tag, attrs)
    if tag not in self.VOID: self.handle_endtag(tag)

  def handle_endtag(self, tag):
    while self.open:
      if self.open.pop()[0] == tag: break

  def handle_data(self, data):
    for _, i in self.open:
      if i and i in self.by_id: self.by_id[i]["text"] += data

  def text(self, i: str) -> str: return " ".join(self.by_id[i]["text"].split())


def _dump_doms(urls: list[str], tmp: Path) -> list[_Dom]:
  """Load each URL in headless Chromium (in parallel) and parse the DOM after the scripts ran."""
  exe = _chromium()
  if exe is None: pytest.skip("chromium not found: apt-get install chromium")
  procs = []
  for k, url in enumerate(urls):
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
           f"--user-data-dir={tmp / f'profile{k}'}", "--virtual-time-budget=5000", "--dump-dom", url]
    procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
  doms = []
  for p, url in zip(procs, urls):
    out, err = p.communicate(timeout=90)
    assert p.returncode == 0 and "</html>" in out, f"chromium failed on {url} (rc {p.returncode}):\n{err[-2000:]}"
    doms.append(_Dom(out))
  return doms


def test_viewer_in_headless_chromium(traced, tmp_path):
  data = _data_of(render_html(traced))
  k = next(p["index"] for p in data["passes"] if len(p["rewrites"]) >= 3)
  p = data["passes"][k]
  n, j = len(p["rewrites"]), 2
  page = write_html(traced, tmp_path / "trace.html")
  # a copy whose last script presses the Next button once after the page opened at the fragment
  clicked = tmp_path / "clicked.html"
  clicked.write_text(page.read_text().replace("</body>", "<script>document.getElementById('next').click();</script></body>"))
  # a graph over the drawing cap: a chain of 600 nodes
  big = tmp_path / "big.html"
  nodes = [{"op": "CONST", "dtype": "int32", "src": [], "arg": "0"}] + [{"op": "NEG", "dtype": "int32", "src": [i]} for i in range(599)]
  nodes.append({"op": "SINK", "dtype": "void", "src": [599]})
  write_html({"title": "big", "schedules": [{"index": 0, "device": "CPU", "targets": 1, "caller": "", "passes": [0]}],
              "passes": [{"name": "chain", "index": 0, "schedule": 0, "kernel": None, "ruleset": "x", "nodes": nodes,
                          "rewrites": [], "n_rewrites": 0, "graph": list(range(601)), "sink": 600, "input_nodes": 601,
                          "ms": 0, "error": None}]}, big)
  doms = _dump_doms([f"{page.as_uri()}#pass={k}&step={j}", f"{page.as_uri()}#pass={k}&step={j + 1}",
                     f"{clicked.as_uri()}#pass={k}&step={j}", f"{big.as_uri()}#pass=0&step=0"], tmp_path)
  big_dom = doms.pop()
  assert big_dom.text("graph-note") == f"large graph: drawing {MAX_DRAWN} of 601 nodes (those nearest the sink)"
  assert len(re.findall(r'id="gnode-\d+"', big_dom.raw)) == MAX_DRAWN and big_dom.text("step-counter") == "rewrite 0 of 0"
  for dom, step in zip(doms, (j, j + 1, j + 1)):
    r = p["rewrites"][step - 1]
    assert dom.text("step-counter") == f"rewrite {step} of {n}"
    assert dom.text("pass-title").startswith(f"pass {k}: {p['name']}")
    assert dom.text("rule-name") == r["rule"]
    link = dom.by_id["rule-link"]
    assert link["attrs"].get("href") == Path(r["file"]).as_uri() + f"#L{r['line']}"
    assert link["attrs"]["href"].startswith("file:///") and dom.text("rule-link") == r["where"]
    assert re.fullmatch(r"[\w.]+\.rules:\d+:\d+", dom.text("rule-link"))
    assert dom.touched, "no element has class 'touched'"
    assert any("before-tree" in ids for ids in dom.touched), "the before node is not highlighted"
    assert any("after-tree" in ids for ids in dom.touched), "the after node is not highlighted"
    assert f"#{r['before']}" in dom.text("before-tree") and f"#{r['after']}" in dom.text("after-tree")
    assert len(dom.by_id["graph"]["text"]) > 0 and "selected" in dom.by_id[f"pass-item-{k}"]["attrs"]["class"]
  assert doms[0].text("rule-name") != doms[1].text("rule-name") or doms[0].text("before-tree") != doms[1].text("before-tree")


# *** the command ***

def test_cli_trace_end_to_end(tmp_path):
  prog = tmp_path / "prog.py"
  prog.write_text("import sys\nprint('args', sys.argv[1:])\n" + PROGRAM)
  out = tmp_path / "out" / "t.html"
  r = subprocess.run([sys.executable, "-m", "rulec.cli", "trace", str(prog), "-o", str(out), "--", "--n", "3"],
                     cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stderr
  assert "args ['--n', '3']" in r.stdout
  assert re.search(rf"^rulec trace: 1 schedule calls, 10 passes, [1-9]\d* rewrites -> {re.escape(str(out))}$", r.stdout, re.M), r.stdout
  assert [p["name"] for p in _data_of(out.read_text())["passes"]] == PASS_NAMES


def test_cli_trace_bad_input(tmp_path, capsys, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert cli_main(["trace", str(tmp_path / "nope.py")]) == 2
  assert "no such file" in capsys.readouterr().err
  bad = tmp_path / "bad.py"
  bad.write_text(PROGRAM + "def f():\n  raise ValueError('boom')\nf()\n")
  assert cli_main(["trace", str(bad), "-o", "bad.html"]) == 1
  cap = capsys.readouterr()
  assert "ValueError: boom" in cap.err and f'File "{bad}", line 5' in cap.err and "runpy" not in cap.err
  assert "raised ValueError" in cap.err and "10 passes" in cap.out   # what ran before the error is still written
  assert (tmp_path / "bad.html").is_file()
  quits = tmp_path / "quits.py"
  quits.write_text("import sys\nsys.exit(3)\n")
  assert cli_main(["trace", str(quits), "-o", "q.html"]) == 3
  assert "exited with 3" in capsys.readouterr().err


def test_env_var_writes_a_trace_at_exit(tmp_path):
  prog = tmp_path / "prog.py"
  prog.write_text(PROGRAM)
  out = tmp_path / "env-trace.html"
  r = subprocess.run([sys.executable, str(prog)], cwd=tmp_path, env={**_env(), "RULEC_TRACE": "1", "RULEC_TRACE_OUT": str(out)},
                     capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stderr
  assert f"-> {out}" in r.stderr and out.is_file()
  assert [p["name"] for p in _data_of(out.read_text())["passes"]] == PASS_NAMES
  r = subprocess.run([sys.executable, str(prog)], cwd=tmp_path, env={**_env(), "RULEC_TRACE": "1"}, capture_output=True, text=True, timeout=120)
  assert r.returncode == 0 and (tmp_path / "rulec-trace.html").is_file(), r.stderr


def test_docs_example_prints_what_docs_trace_md_says(tmp_path, capsys, monkeypatch):
  """docs/trace.md's example: its program, traced, prints the lines its console block shows."""
  doc = (REPO / "docs" / "trace.md").read_text()
  program = re.search(r"A program \(`(\S+)`\):\n\n```python\n(.*?)```", doc, re.S)
  console = re.search(r"```console\n\$ rulec trace (\S+) -o (\S+)\n(.*?)```", doc, re.S)
  assert program and console and program.group(1) == console.group(1)
  monkeypatch.chdir(tmp_path)
  (tmp_path / program.group(1)).write_text(program.group(2))
  assert cli_main(["trace", program.group(1), "-o", console.group(2)]) == 0
  assert capsys.readouterr().out.strip() == console.group(3).strip(), "docs/trace.md's example output is out of date"
  assert (tmp_path / console.group(2)).is_file()
