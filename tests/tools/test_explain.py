"""`rulec explain RULE PROGRAM.py` (engine/lang/explain.py).

* end to end on small programs in tmp_path: a rule that never fires gets the
  failing test and its location; a rule that fires reports how often; an
  unknown rule is exit status 2 with close names;
* the explain walk on its own: deepest failure over commutative orders,
  each kind of failed test, guards;
* graph_rewrite is restored after the run.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path: sys.path.insert(0, str(REPO))

import rulec.engine.ir.rewrite as ir_rewrite  # noqa: E402
from rulec.engine.ir.dtypes import dtypes  # noqa: E402
from rulec.engine.lang.explain import MATCHES, Explainer  # noqa: E402
from rulec.engine.lang.loader import check_sources  # noqa: E402
from rulec.engine.ir.ops import Ops  # noqa: E402
from rulec.engine.ir.uop import UOp  # noqa: E402
from rulec.cli import main as rulec  # noqa: E402

RULES = """\
ruleset s:
  rule add_zero: x + 0 => x
  rule mul_one: x * 1 => x
  rule add_consts: (x + c1:CONST) + c2:CONST => x + (c1.arg + c2.arg)
  rule div_small: x // c:CONST if x.vmax < c.arg => x.const_like(0)
  rule sink_two: SINK(a, b) => a
  rule add_zero_again: x + 0 => x
ruleset other:
  rule neg_neg: -(-x) => x
"""

PROGRAM = """\
import sys
from rulec import UOp, graph_rewrite, load_library
lib = load_library([sys.argv[1]])
x, y = UOp.variable("x", 0, 10), UOp.variable("y", 0, 10)
print(graph_rewrite(UOp.sink((x + 3) * 1, (x + 3) + y, x // 4, y + 0), lib.matcher("s")))
"""


@pytest.fixture(autouse=True)
def isolated_env(tmp_path_factory, monkeypatch):
  monkeypatch.setenv("RULEC_CACHE_DIR", str(tmp_path_factory.mktemp("rulec-cache")))
  monkeypatch.delenv("RULEC_STATS", raising=False)


@pytest.fixture
def files(tmp_path):
  (tmp_path / "s.rules").write_text(RULES)
  (tmp_path / "prog.py").write_text(PROGRAM)
  return tmp_path


def explain(files, rule, capsys, program="prog.py"):
  rules = str(files / "s.rules")
  status = rulec(["explain", "--rules", rules, rule, str(files / program), rules])
  out = capsys.readouterr()
  return status, out.out.replace(str(files) + "/", ""), out.err


def test_pattern_failure_is_located(files, capsys):
  status, out, _ = explain(files, "add_consts", capsys)
  assert status == 1
  assert out.splitlines()[1:] == [
    "rule 'add_consts' (s.rules:4:3) never fired: tried on 3 nodes in 1 graph_rewrite call with s",
    "node (x:DEFINE_VAR[(0, 10)] + 3) + y:DEFINE_VAR[(0, 10)]",
    "  s.rules:4:40: source 1: expected CONST, got DEFINE_VAR",
    "       4 |   rule add_consts: (x + c1:CONST) + c2:CONST => x + (c1.arg + c2.arg)",
    "         |                                        ^^^^^",
    "node x:DEFINE_VAR[(0, 10)] + 3",
    "  s.rules:4:21: source 0: expected ADD, got DEFINE_VAR",
    "       4 |   rule add_consts: (x + c1:CONST) + c2:CONST => x + (c1.arg + c2.arg)",
    "         |                     ^^^^^^^^^^^^",
    "node y:DEFINE_VAR[(0, 10)] + 0",
    "  s.rules:4:21: source 0: expected ADD, got DEFINE_VAR",
    "       4 |   rule add_consts: (x + c1:CONST) + c2:CONST => x + (c1.arg + c2.arg)",
    "         |                     ^^^^^^^^^^^^",
  ]


def test_false_guard_is_located(files, capsys):
  status, out, _ = explain(files, "div_small", capsys)
  assert status == 1
  assert out.splitlines()[2:4] == ["node x:DEFINE_VAR[(0, 10)] // 4", "  s.rules:5:35: guard `x.vmax < c.arg` was False"]


def test_source_count(files, capsys):
  _, out, _ = explain(files, "sink_two", capsys)
  assert "  s.rules:6:18: the node: source count 4 != 2" in out.splitlines()


def test_an_earlier_rule_rewrote_the_node(files, capsys):
  status, out, _ = explain(files, "add_zero_again", capsys)
  assert status == 1
  assert "  pattern and guard match, but rule 'add_zero' (" in out
  assert "s.rules:2:3) rewrote the node first" in out


def test_a_rule_that_fires_is_counted(files, capsys):
  status, out, _ = explain(files, "mul_one", capsys)
  assert status == 0
  assert out.splitlines()[-1] == "rule 'mul_one' (s.rules:3:3) fired 1 time in 1 graph_rewrite call with s"
  assert explain(files, "add_zero", capsys)[:2] == (0, out.splitlines()[0] + "\n" +
                                                   "rule 'add_zero' (s.rules:2:3) fired 1 time in 1 graph_rewrite call with s\n")


def test_a_rule_in_no_matcher_used(files, capsys):
  status, out, _ = explain(files, "neg_neg", capsys)
  assert status == 1
  assert ("rule 'neg_neg' (s.rules:9:3) never fired: no graph_rewrite call or fusion pass used a matcher with this rule "
          "(1 graph_rewrite call with other matchers)") in out


def test_a_rule_of_that_name_in_another_file_is_pointed_out(files, capsys):
  assert rulec(["explain", "add_zero", str(files / "prog.py"), str(files / "s.rules")]) == 1   # default library: rules/
  out = capsys.readouterr().out.replace(str(files) + "/", "")
  assert "  the program's matchers have a rule 'add_zero' at s.rules:2:3: pass --rules" in out.splitlines()


def test_unknown_rule_lists_close_names(files, capsys):
  status, out, err = explain(files, "add_zeroo", capsys)
  assert status == 2 and out == ""
  assert err.strip() == "rulec explain: unknown rule 'add_zeroo'; did you mean add_zero, add_zero_again?"


def test_missing_program_exits_2(files, capsys):
  assert rulec(["explain", "--rules", str(files / "s.rules"), "add_zero", str(files / "nope.py")]) == 2
  assert "no such program" in capsys.readouterr().err


def test_graph_rewrite_is_restored_and_the_program_ran(files, capsys):
  orig = ir_rewrite.graph_rewrite
  import rulec as pkg
  explain(files, "add_consts", capsys)
  assert ir_rewrite.graph_rewrite is orig and pkg.graph_rewrite is orig


def test_program_through_the_scheduler(tmp_path, capsys):
  (tmp_path / "t.py").write_text("import numpy as np\nfrom rulec import Tensor\n"
                                 "a = Tensor(np.arange(24, dtype=np.float32)).reshape((4, 6))\n"
                                 "print((a.permute((1, 0)).reshape((2, 12)) + 1).sum(1).numpy())\n")
  assert rulec(["explain", "reshape_reshape", str(tmp_path / "t.py")]) == 1
  out = capsys.readouterr().out.splitlines()
  assert out[0] == "[132. 168.]"
  assert out[1].startswith("rule 'reshape_reshape' (") and "in 1 graph_rewrite call with earliest" in out[1]
  assert out[2].startswith("node RESHAPE(BUFFER[(") and out[2].endswith("{float32})[(4, 6)]")   # the buffer's number varies
  assert out[3].endswith("early.rules:11:35: source 0: expected RESHAPE, got BUFFER")


# *** fusion (decision) rules: offered every node by the scheduler's fusion pass, not by graph_rewrite ***

# x's column sums, read by every row of x + s: a reduce used in three index contexts, so store_reused_reduce stores it
REUSED_REDUCE = ("import numpy as np\nfrom rulec import Tensor\n"
                 "x = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4))\n"
                 "s = x.sum(axis=0)\n"
                 "print((x + s).numpy().sum())\n")


def _fusion_rule_line(name: str) -> int:
  lines = (REPO / "rules" / "fusion.rules").read_text().splitlines()
  return next(i for i, line in enumerate(lines, 1) if f"rule {name}:" in line)


def test_a_fusion_rule_that_fires_is_counted_with_its_nodes(tmp_path, capsys):
  import rulec.engine.sched.driver as driver
  import rulec.engine.sched.fusion as fusion
  orig = fusion.choose_stages
  (tmp_path / "prog.py").write_text(REUSED_REDUCE)
  assert rulec(["explain", "store_reused_reduce", str(tmp_path / "prog.py")]) == 0
  out = capsys.readouterr().out.splitlines()
  assert out[0] == "264.0"
  line = _fusion_rule_line("store_reused_reduce")
  assert out[1].startswith("rule 'store_reused_reduce' (") and f"fusion.rules:{line}:3)" in out[1]
  assert out[1].endswith(" fired 1 time in 1 fusion pass with fuse_reduces, on 1 distinct node:")
  assert out[2].startswith("node REDUCE_AXIS(") and len(out) == 3
  # the scheduler's own names are back
  assert fusion.choose_stages is orig and driver.choose_stages is orig


def test_a_fusion_rule_that_never_fired_is_explained(tmp_path, capsys):
  (tmp_path / "prog.py").write_text(REUSED_REDUCE)
  assert rulec(["explain", "store_expensive", str(tmp_path / "prog.py")]) == 1
  out = capsys.readouterr().out.splitlines()
  assert out[1].startswith("rule 'store_expensive' (") and " never fired: tried on " in out[1]
  assert out[1].endswith(" in 1 fusion pass with fuse_values")
  # the guard it failed, located in rules/fusion.rules (the ADD is read once: ctx.uses(x) is 1)
  guard = _fusion_rule_line("store_expensive") + 1
  assert any(f"fusion.rules:{guard}:" in line and "was False" in line for line in out), out


def test_a_fusion_rule_is_counted_under_rulec_debug(tmp_path, capsys, monkeypatch):
  # RULEC_DEBUG wraps each fusion set in a counting matcher (engine/sched/driver.py _Counting): still watched
  import rulec.engine.sched.driver as driver
  monkeypatch.setattr(driver, "DEBUG", 1)
  (tmp_path / "prog.py").write_text(REUSED_REDUCE)
  assert rulec(["explain", "store_reused_reduce", str(tmp_path / "prog.py")]) == 0
  out = capsys.readouterr().out
  assert "store_reused_reduce x1" in out   # the debug line of the fusion pass
  assert " fired 1 time in 1 fusion pass with fuse_reduces, on 1 distinct node:" in out


def test_a_gradient_rule_is_refused_plainly(tmp_path, capsys):
  (tmp_path / "prog.py").write_text(REUSED_REDUCE)
  assert rulec(["explain", "grad_add", str(tmp_path / "prog.py")]) == 2
  out = capsys.readouterr()
  assert out.out == ""   # the program did not run
  err = out.err.strip()
  assert err.startswith("rulec explain: rule 'grad_add' (") and "is a gradient rule" in err
  assert "explain cannot watch it" in err and len(err.splitlines()) == 1


# *** the walk ***

def rule_of(src: str):
  lib = check_sources({"w.rules": "ruleset s:\n" + src})
  assert not lib.errors, lib.errors
  r = lib.rulesets["s"].rules[0]
  return Explainer(r, lib.helpers_of(r), "ruleset s:\n" + src)


X = UOp.variable("x", 0, 10)


@pytest.mark.parametrize("rule,node,col,message", [
  # the written order fails at source 1 of source 0, the swapped order only at source 0: the deeper one is shown
  ("  rule r: (x + 1) * c:CONST => x\n", (X + 2) * X, 16, "source 0.1: expected the constant 1, got 2"),
  ("  rule r: x{float32} * 2 => x\n", X * 2, 11, "source 0: dtype index not in {float32}"),
  ("  rule r: p:PERMUTE[(1, 0)] => p.src[0]\n", UOp(Ops.PERMUTE, dtypes.index, (X,), (0, 1)), 13,
   "the node: arg mismatch: expected (1, 0), got (0, 1)"),
  ("  rule r: x - x => x.const_like(0)\n", X - 1, 15, "source 1: 'x' must be the same node as before, got another node"),
  ("  rule r: s:SINK(each CONST) => s.src[0]\n", UOp.sink(UOp.const(dtypes.index, 1), X), 23,
   "source 1: expected CONST, got DEFINE_VAR"),
  ("  rule r: SINK(a, b, *rest) => a\n", UOp.sink(X), 11, "the node: source count 1 < 2"),
  ("  rule r: x + c:CONST if c.arg > x.vmax => x\n", X + 3, 26, "guard `c.arg > x.vmax` was False"),
])
def test_walk_reports_the_deepest_failure(rule, node, col, message):
  f = rule_of(rule).explain(node)
  assert f != MATCHES and (f.span.line, f.span.col, f.message) == (2, col, message)


def test_walk_matches_when_pattern_and_guard_pass():
  assert rule_of("  rule r: x + c:CONST if c.arg < x.vmax => x\n").explain(X + 3) == MATCHES
  assert rule_of("  rule r: c:CONST + x => x\n").explain(X + 3) == MATCHES      # swapped order


def test_walk_guard_that_raises():
  f = rule_of("  rule r: x + c:CONST if c.src[3] => x\n").explain(X + 3)
  assert f.message == "guard `c.src[3]` raised IndexError: tuple index out of range"


# *** docs/explain.md ***

def test_docs_example_runs_as_shown(tmp_path, capsys, monkeypatch):
  """docs/explain.md: its rules file and program, explained, print what its console block shows."""
  import re
  import shlex
  doc = (REPO / "docs" / "explain.md").read_text()
  blocks = re.findall(r"^```(\w+)\n(.*?)^```$", doc, re.M | re.S)
  rules = next(b for lang, b in blocks if lang == "rules")
  program = next(b for lang, b in blocks if lang == "python")
  console = next(b for lang, b in blocks if lang == "console")
  (tmp_path / "mine.rules").write_text(rules)
  (tmp_path / "prog.py").write_text(program)
  monkeypatch.chdir(tmp_path)
  runs = re.split(r"^\$ ", console, flags=re.M)[1:]
  assert len(runs) == 5
  for run in runs:
    cmd, _, expected = run.partition("\n")
    argv = shlex.split(cmd)
    assert argv[0] == "rulec"
    rulec(argv[1:])
    out = capsys.readouterr()
    assert (out.out + out.err).rstrip("\n") == expected.rstrip("\n"), f"docs/explain.md: `{cmd}` is out of date"


def test_docs_fusion_example_runs_as_shown(tmp_path):
  """docs/explain.md, "Fusion (decision) rules": its program, explained in a fresh process on the CPU device."""
  import re
  import shlex
  import subprocess
  from tests.helpers import subprocess_env
  doc = (REPO / "docs" / "explain.md").read_text()
  section = doc.split("## Fusion (decision) rules", 1)[1].split("\n## ", 1)[0]
  blocks = dict(re.findall(r"^```(\w+)\n(.*?)^```$", section, re.M | re.S))
  (tmp_path / "prog.py").write_text(blocks["python"])
  cmd, _, expected = blocks["console"].removeprefix("$ ").partition("\n")
  argv = shlex.split(cmd)
  assert argv[0] == "rulec"
  proc = subprocess.run([sys.executable, "-m", "rulec.cli", *argv[1:]], cwd=tmp_path, capture_output=True, text=True,
                        env=subprocess_env(RULEC_DEVICE="CPU", RULEC_CACHE_DIR=str(tmp_path / "cache")), timeout=300)
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.replace(str(REPO) + "/", "").rstrip("\n") == expected.rstrip("\n"), "docs/explain.md is out of date"


def test_the_kernel_bound_rule_is_explained_on_a_deep_program(tmp_path, capsys):
  # bound_kernels is offered producers first (choose_stages' upward_sets): explain watches it too, and the node it
  # fired on, 2,400 ops deep, prints cut off instead of recursing through the whole chain
  (tmp_path / "prog.py").write_text("from rulec import Tensor\nimport numpy as np\nx = Tensor(np.ones((4, 4), np.float32))\n"
                                    "y = x\nfor _ in range(1200): y = y * 0.999 + x\ny.realize()\n")
  assert rulec(["explain", "store_large_kernel", str(tmp_path / "prog.py")]) == 0
  out = capsys.readouterr().out.splitlines()
  assert out[0].startswith("rule 'store_large_kernel' (")
  assert out[0].endswith(" fired 1 time in 1 fusion pass with bound_kernels, on 1 distinct node:")
  assert out[1].startswith("node (") and len(out[1]) < 400 and len(out) == 2
