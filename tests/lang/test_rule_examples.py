"""`example:` lines in rule files (engine/lang/examples.py).

* the syntax: examples attach to the rule above, continue like rules, and a
  malformed one is an ordinary located syntax error;
* example graphs: constants and their dtypes, variables, ranges, any op;
* every example code (R601-R605) at its exact location, with its message;
* `rulec check` runs examples (and `--no-examples` does not), loading never does;
* the shipped rules/ examples hold.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path: sys.path.insert(0, str(REPO))

from rulec.engine.ir.dtypes import dtypes  # noqa: E402
from rulec.engine.lang import examples as E  # noqa: E402
from rulec.engine.lang.diagnostics import EXAMPLE_CODES  # noqa: E402
from rulec.engine.lang.loader import check_sources, load_library  # noqa: E402
from rulec.engine.lang.parser import parse_rules  # noqa: E402
from rulec.engine.ir.ops import Ops  # noqa: E402
from rulec.engine.ir.rewrite import graph_rewrite  # noqa: E402
from rulec.engine.ir.uop import UOp  # noqa: E402
from rulec.cli import main as rulec  # noqa: E402


@pytest.fixture(autouse=True)
def isolated_env(tmp_path_factory, monkeypatch):
  monkeypatch.setenv("RULEC_CACHE_DIR", str(tmp_path_factory.mktemp("rulec-cache")))
  monkeypatch.delenv("RULEC_STATS", raising=False)


def run(src: str, path: str = "t.rules"):
  return check_sources({path: src}, examples=True).diagnostics


def loc(d) -> tuple:
  return (d.code, d.span.line, d.span.col, d.span.end_line, d.span.end_col)


def underlined(src: str, line: int, col: int, end_col: int) -> str:
  return src.split("\n")[line - 1][col - 1:end_col - 1]


# *** syntax ***

def test_examples_attach_to_the_rule_above():
  src = ("ruleset s:\n"
         "  rule add_zero: x + 0 => x\n"
         "    example: RANGE(10) + 0 => RANGE(10)\n"
         "    example: RANGE(10) + 1\n"
         "      => unchanged\n"
         "  rule mul_one: x * 1\n"
         "      => x\n"
         "  example: RANGE(10) * 1 => RANGE(10)\n")
  rf, diags = parse_rules(src, "t.rules")
  assert diags == []
  add_zero, mul_one = rf.rulesets[0].rules
  assert [(e.span.line, e.expected is None) for e in add_zero.examples] == [(3, False), (4, True)]
  assert add_zero.examples[1].expected_span.line == 5
  assert [e.span.line for e in mul_one.examples] == [8]     # same indentation as the rules works too
  assert run(src) == []


def test_example_is_still_an_ordinary_name():
  src = "ruleset s:\n  rule r: example:CONST + 0 => example\n    example: 1 + 0 => 1\n"
  assert run(src) == []


def test_malformed_example_is_a_located_syntax_error():
  src = "ruleset s:\n  rule add_zero: x + 0 => x\n    example: RANGE(10) + 0 RANGE(10)\n"
  [d] = check_sources({"t.rules": src}).diagnostics
  assert loc(d) == ("R001", 3, 28, 3, 33) and underlined(src, 3, 28, 33) == "RANGE"
  assert d.message.startswith("unexpected 'RANGE'; expected ")
  assert "'=>'" in d.message


def test_example_before_any_rule_is_an_error():
  src = "ruleset s:\n  example: 1 + 0 => 1\n  rule add_zero: x + 0 => x\n"
  [d] = check_sources({"t.rules": src}).diagnostics
  assert loc(d) == ("R001", 2, 3, 2, 10)
  assert d.message == "an example must follow the rule it shows"


# *** graphs ***

def build(text: str, env=None) -> UOp:
  rf, diags = parse_rules(f"ruleset s:\n  rule r: x => x\n    example: {text} => unchanged\n", "g.rules")
  assert diags == [], diags
  return E.GraphBuilder(env).build(rf.rulesets[0].rules[0].examples[0].input)


def test_graph_leaves():
  x = UOp.variable("x", 0, 10)
  assert build("x:DEFINE_VAR[(0, 10)]") is x
  assert build("x:DEFINE_VAR[(-3, 3)]{int32}") is UOp.variable("x", -3, 3, dtypes.int32)
  assert build("RANGE(10)") is UOp.range(10, 0)
  assert build("RANGE(10)[2]") is UOp.range(10, 2)
  assert build('RANGE(10)[(1, "reduce")]') is UOp.range(10, 1, "reduce")
  assert build("3") is UOp.const(dtypes.index, 3)
  assert build("2.5") is UOp.const(dtypes.float32, 2.5)
  assert build("True") is UOp.const(dtypes.bool, True)
  assert build("3{int8}") is UOp.const(dtypes.int8, 3)
  assert build("-1") is UOp.const(dtypes.index, -1)


def test_graph_literals_take_the_dtype_of_their_operands():
  f = UOp.variable("f", 0, 1, dtypes.float16)
  assert build("f:DEFINE_VAR[(0, 1)]{float16} + 1") is f + 1
  assert build("1 + f:DEFINE_VAR[(0, 1)]{float16}") is f.const_like(1) + f
  assert build("2 * 3{int32}") is UOp.const(dtypes.int32, 2) * 3
  assert build("RANGE(4) < 3").dtype is dtypes.bool
  w = build("WHERE(RANGE(4) < 2, f:DEFINE_VAR[(0, 1)]{float16}, 0)")
  assert w is (UOp.range(4, 0).lt(2)).where(f, 0.0) and w.src[2].dtype is dtypes.float16


def test_graph_any_op_and_bindings():
  x = UOp.variable("x", 0, 10)
  assert build("CAST(x:DEFINE_VAR[(0, 10)]){int32}") is x.cast(dtypes.int32)
  assert build("SINK(x:DEFINE_VAR[(0, 10)], x + 1)") is UOp.sink(x, x + 1)
  assert build("a:(x:DEFINE_VAR[(0, 10)] + 1) * a") is (x + 1) * (x + 1)
  assert build("CMOD(RANGE(8), 3)") is UOp(Ops.CMOD, dtypes.index, (UOp.range(8, 0), UOp.const(dtypes.index, 3)))
  assert build("-RANGE(8)") is -UOp.range(8, 0)


@pytest.mark.parametrize("text,err", [
  ("x + 1", "unbound name 'x' in an example"),
  ("_ + 1", "'_' stands for any node; an example needs a concrete graph"),
  ("(ADD | MUL)(RANGE(2), 1)", "an example node has one op, not 'ADD | MUL'"),
  ("Binary(RANGE(2), 1)", "an example node has one op, not 'Binary'"),
  ("RANGEE(2)", "unknown op 'RANGEE'; did you mean 'RANGE'?"),
  ("SINK(RANGE(2), ..)", "'..', '*rest' and 'each' match many sources; an example lists them"),
  ("CAST(RANGE(2))", "CAST in an example needs its dtype: CAST(x){int32}"),
  ("3{ints}", "an example node has one dtype, not {ints}"),
  ("RANGE(2) + 0.5", "0.5 is not a constant of dtype index"),
  ("ADD(RANGE(2))", "ADD takes 2 sources, the example gives 1"),
  ("DEFINE_VAR[(0, 1)]", "a variable in an example is NAME:DEFINE_VAR[(LO, HI)], e.g. x:DEFINE_VAR[(0, 10)]"),
])
def test_graph_errors(text, err):
  with pytest.raises(E.ExampleError) as e: build(text)
  assert e.value.message == err


def test_show_prints_example_syntax_that_builds_the_same_graph():
  for text in ["x:DEFINE_VAR[(0, 10)] + 3", "(RANGE(4) * 9 + RANGE(8)[1]) // 9", "3{int32} * x:DEFINE_VAR[(0, 10)]{int32}",
               "WHERE(RANGE(4) < 2, f:DEFINE_VAR[(0, 1)]{float16}, 0)", "CAST(RANGE(3)){float32}", "-RANGE(3) % 4",
               'RANGE(10)[(1, "reduce")] + 1.5{float32}', "ADD(RANGE(3), 1){int32}"]:
    u = build(text)
    assert build(E.show(u)) is u, (text, E.show(u))
  x = UOp.variable("x", 0, 10)
  assert E.show(x * 2 + 1, {x: "x"}) == "(x * 2) + 1"


# *** every example code, located ***

H = "ruleset s:\n  rule add_zero: x + 0 => x\n"
CASES = [
  ("R601", H + "    example: x:DEFINE_VAR[(0, 10)] + 0 => x + 0\n", (3, 43, 3, 48), "x + 0",
   "example of rule 'add_zero' gives a different graph", "expected x + 0, got x"),
  ("R601-unchanged", "ruleset s:\n  rule add_zero: x + 0 => x\n  rule mul_one: x * 1 => x\n"
   "    example: (RANGE(4) + 0) * 2 => unchanged\n", (4, 36, 4, 45), "unchanged",
   "example of rule 'mul_one' is not unchanged", "expected (RANGE(4) + 0) * 2, got RANGE(4) * 2"),
  ("R602", H + "    example: RANGE(4) * 2 => RANGE(4) * 2\n", (3, 14, 3, 26), "RANGE(4) * 2",
   "rule 'add_zero' does not fire on its example",
   "the rule set leaves the graph as it is; to say the rule does not rewrite it, write '=> unchanged'"),
  ("R602-wrong-result", H + "    example: RANGE(4) * 2 => RANGE(4)\n", (3, 14, 3, 26), "RANGE(4) * 2",
   "rule 'add_zero' does not fire on its example", "expected RANGE(4), got RANGE(4) * 2"),
  ("R602-others-did-it", "ruleset s:\n  rule add_zero: x + 0 => x\n  rule add_zero_too: 0 + x => x\n"
   "    example: RANGE(4) + 0 => RANGE(4)\n", (4, 14, 4, 26), "RANGE(4) + 0",
   "rule 'add_zero_too' does not fire on its example",
   "the result RANGE(4) is as expected, but other rules of 's' made it"),
  ("R603", H + "    example: RANGE(10) + 0 => unchanged\n", (3, 14, 3, 27), "RANGE(10) + 0",
   "rule 'add_zero' fires on an example marked unchanged (1x)", "ruleset 's' rewrites RANGE(10) + 0 to RANGE(10)"),
  ("R604", H + "    example: RANGE(4) + y => RANGE(4)\n", (3, 25, 3, 26), "y",
   "unbound name 'y' in an example", None),
  ("R605-loop", "ruleset s:\n  rule swap: x + y => y + x\n    example: RANGE(10) + 1 => 1 + RANGE(10)\n", (3, 14, 3, 27),
   "RANGE(10) + 1", "rewriting the example of rule 'swap' failed: graph_rewrite did not reach a fixed point: a rewrite "
   "of ADD led back to a node being rewritten; rules that keep firing: 'swap' (t.rules:2:3) x2", None),
  ("R605-raises", "ruleset s:\n  rule third: x * 1 => x.src[2]\n    example: (RANGE(4) + 1) * 1 => RANGE(4)\n",
   (3, 14, 3, 32), "(RANGE(4) + 1) * 1",
   "rewriting the example of rule 'third' failed: rule 'third' at t.rules:2:3 failed: IndexError: tuple index out of range",
   None),
]


# examples that exceed their budget (engine/lang/limits.py): located at the example's input graph
BUDGET_CASES = [
  ("R706", "ruleset s:\n  rule slow: x + 0 => x if sum(1 for i in range(10 ** 6) for j in range(10 ** 6)) else x\n"
   "    example: RANGE(4) + 0 => RANGE(4)\n",
   (3, 14, 3, 26), "RANGE(4) + 0", "the example of rule 'slow' ran longer than 0.5 s"),
  ("R707", "ruleset s:\n  rule big: x + 0 => x if len([[0] * 10 ** 6 for i in range(10 ** 6)]) else x\n"
   "    example: RANGE(4) + 0 => RANGE(4)\n",
   (3, 14, 3, 26), "RANGE(4) + 0", "the example of rule 'big' used more than 1024 MiB of memory"),
]


def test_every_example_code_has_a_case():
  # (R708, a file's total example time, skips the file's later examples: tests/lang/test_runtime_bounds.py)
  assert {c[0].split("-")[0] for c in CASES + BUDGET_CASES} | {"R708"} == set(EXAMPLE_CODES)


@pytest.mark.parametrize("name,src,where,text,message", BUDGET_CASES, ids=[c[0] for c in BUDGET_CASES])
def test_example_budget_is_enforced_and_located(monkeypatch, name, src, where, text, message):
  # (the memory case fills 1 GiB a few MiB at a time: room to get there before the time limit)
  monkeypatch.setenv("RULEC_EXAMPLE_TIMEOUT", "0.5" if name == "R706" else "30")
  assert underlined(src, where[0], where[1], where[3]) == text
  # a good example after the bad one still runs (in a fresh process)
  src2 = src + "  rule add_zero: x * 1 => x\n    example: RANGE(4) * 1 => RANGE(5)\n"
  got = run(src2)
  assert [loc(d) for d in got] == [(name, *where), ("R601", 5, 30, 5, 38)], [(loc(d), d.message) for d in got]
  assert got[0].message == message


@pytest.mark.parametrize("name,src,where,text,message,note", CASES, ids=[c[0] for c in CASES])
def test_example_code_is_reported_at_its_location(name, src, where, text, message, note):
  assert underlined(src, where[0], where[1], where[3]) == text, "the test case itself is inconsistent"
  [d] = run(src)
  assert loc(d) == (name.split("-")[0], *where)
  assert (d.severity, d.message, d.note) == ("error", message, note)
  assert check_sources({"t.rules": src}).diagnostics == []    # not run unless asked


def test_failing_example_render():
  src = H + "    example: x:DEFINE_VAR[(0, 10)] + 0 => x + 0\n"
  [d] = run(src)
  assert d.render(src) == ("t.rules:3:43: error R601: example of rule 'add_zero' gives a different graph\n"
                           "     3 |     example: x:DEFINE_VAR[(0, 10)] + 0 => x + 0\n"
                           "       |                                           ^^^^^\n"
                           "       = expected x + 0, got x")


def test_examples_run_with_the_whole_ruleset_and_its_includes():
  src = ("ruleset fold:\n  rule add_consts: a:CONST + b:CONST => a.const_like(a.arg + b.arg)\n"
         "ruleset s includes fold:\n  rule add_zero: x + 0 => x\n"
         "    example: RANGE(4) + (3 + -3) => RANGE(4)\n")
  assert run(src) == []


def test_examples_are_not_run_on_errors():
  src = H + "    example: RANGE(4) * 2 => RANGE(4) * 2\n  rule bad: x * 1 => x + y\n"
  assert [d.code for d in run(src)] == ["R201"]


# *** the command line and the loader ***

def test_rulec_check_runs_examples(tmp_path, capsys):
  f = tmp_path / "t.rules"
  f.write_text(H + "    example: RANGE(10) + 0 => unchanged\n")
  assert rulec(["check", str(f)]) == 1
  out = capsys.readouterr()
  assert f"{f}:3:14: error R603: rule 'add_zero' fires on an example marked unchanged (1x)" in out.out
  assert "1 errors, 0 warnings" in out.err
  assert rulec(["check", "--no-examples", str(f)]) == 0


def test_loading_never_runs_examples(tmp_path, monkeypatch):
  def boom(*a, **k): raise AssertionError("examples ran while loading")
  monkeypatch.setattr(E, "run_examples", boom)
  f = tmp_path / "t.rules"
  f.write_text(H + "    example: RANGE(10) + 0 => unchanged\n")      # a failing example
  lib = load_library([f])
  assert lib.checked.diagnostics == []
  assert graph_rewrite(UOp.range(10, 0) + 0, lib.matcher("s")) is UOp.range(10, 0)


def test_shipped_examples_hold():
  from rulec.engine.lang.loader import check_paths
  lib, _ = check_paths(None, examples=True)
  assert lib.diagnostics == []
  assert E.count_examples(lib) >= 10
