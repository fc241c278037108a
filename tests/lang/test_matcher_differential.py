"""The compiled matchers against the reference interpreter.

Hypothesis builds random rule sets (as .rules text) and random UOp graphs, and
every node of the graph must get the same rewrite (the same node, or None, or
the same error) from the generated decision trees and from the interpreter.
"""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rulec.engine.ir.dtypes import dtypes
from rulec.engine.lang.runtime import RuleRuntimeError
from rulec.engine.ir.ops import Ops
from rulec.engine.ir.uop import UOp
from tests.helpers import TextMatcher

BIN_OPS = ["ADD", "MUL", "SUB", "IDIV", "MAX"]
BIN_SUGAR = {"ADD": "+", "MUL": "*", "SUB": "-", "IDIV": "//"}


@st.composite
def patterns(draw, depth: int, names: list[str], counter: list[int]):
  """A pattern as text; `names` collects the names it binds (a name may repeat: identity)."""
  def fresh() -> str:
    counter[0] += 1
    return f"n{counter[0]}"
  choices = ["name", "lit"] + (["bin", "sugar", "neg", "alt", "group", "any", "tail", "star", "each", "bare"] if depth > 0 else [])
  kind = draw(st.sampled_from(choices))
  dt = draw(st.sampled_from(["", "", "", "{index}", "{ints}", "{floats}"]))
  if kind == "name":
    # prefer names already bound, so repeated names (same-node constraints) are common
    pool = [n for n in names if n != "_"]
    name = draw(st.sampled_from(pool)) if pool and draw(st.booleans()) else draw(st.sampled_from(["a", "b", "_"]))
    if name != "_" and name not in names: names.append(name)
    return name + dt
  if kind == "lit": return draw(st.sampled_from(["0", "1", "2", "-1"])) + dt
  sub = lambda: draw(patterns(depth - 1, names, counter))  # noqa: E731
  bind = ""
  if draw(st.booleans()):
    bind = fresh() + ":"
    names.append(bind[:-1])
  if kind == "bin": return f"{bind}{draw(st.sampled_from(BIN_OPS))}({sub()}, {sub()}){dt}"
  if kind == "sugar":
    op = draw(st.sampled_from(list(BIN_SUGAR)))
    text = f"({sub()} {BIN_SUGAR[op]} {sub()})"
    return f"{bind}{text}" if bind else text
  if kind == "neg": return f"{bind}NEG({sub()}){dt}"
  if kind == "alt": return f"{bind}(ADD | MUL | MAX)({sub()}, {sub()}){dt}"
  if kind == "group": return f"{bind}Binary({sub()}, {sub()}){dt}"
  if kind == "any": return f"{bind}{draw(st.sampled_from(['SINK', 'Binary', 'ALU', 'ADD']))}{dt}"
  if kind == "tail": return f"{bind}SINK({sub()}, ..)"
  if kind == "star":
    rest = "t" + fresh()[1:]     # t<k>: bound to a tuple of sources, not a node
    names.append(rest)
    return f"{bind}SINK({sub()}, *{rest})"
  if kind == "each": return f"{bind}SINK(each {draw(st.sampled_from(['CONST', 'ADD', 'Binary', '_', '1']))})"
  return f"{bind}CONST"


@st.composite
def rule_sets(draw):
  rules = []
  for _ in range(draw(st.integers(1, 6))):
    names: list[str] = []
    pat = draw(patterns(draw(st.integers(1, 3)), names, [0]))
    pat = pat if not pat[0].isalpha() or pat[0].isupper() or ":" in pat.split("(")[0] else pat
    bound = [n for n in names if n != "_"] or [None]
    x = draw(st.sampled_from(bound))
    guards = [None]
    repls = ["None"]
    if x is not None and x.startswith("t"):
      # a *rest name is a tuple: node attributes on it are rejected by the checker (R406)
      guards += [f"len({x}) >= 2", f"not isinstance({x}, tuple)"]
      repls += [x, f"{x}[0] if {x} else None", f"{x}[1]",
                f"[s for s in {x} if s.op is CONST][0] if any(s.op is CONST for s in {x}) else None"]
    elif x is not None:
      guards += [f"{x}.op in Binary", f"len({x}.src) >= 2", f"{x}.vmax > 3" if True else "", f"not isinstance({x}, tuple)",
                 f"{x}.dtype is dtypes.index"]
      y = draw(st.sampled_from([n for n in bound if not n.startswith("t")]))
      repls += [x, f"{x}.const_like(7)", f"({x} + {y})", f"{x}.src[0] if {x}.src else None",
                f"{x}.src[1]",   # raises on nodes with fewer sources: errors must agree too
                f"[s for s in {x}.src if s.op is CONST][0] if any(s.op is CONST for s in {x}.src) else None"]
    guard = draw(st.sampled_from(guards))
    repl = draw(st.sampled_from(repls))
    rules.append(f"  {pat}{' if ' + guard if guard else ''} => {repl}")
  return "ruleset r:\n" + "\n".join(rules) + "\n"


@st.composite
def graphs(draw):
  """A random DAG of index (and some float) ALU nodes, with a few SINKs of varying width."""
  nodes = [UOp.variable("v0", 0, 5), UOp.variable("v1", -3, 9), UOp.const(dtypes.index, 0), UOp.const(dtypes.index, 1),
           UOp.const(dtypes.index, 2), UOp.const(dtypes.index, -1), UOp.const(dtypes.float32, 1.0)]
  for _ in range(draw(st.integers(1, 14))):
    kind = draw(st.sampled_from(["bin", "bin", "bin", "same", "neg", "sink"]))
    pick = lambda: draw(st.sampled_from(nodes))  # noqa: E731
    if kind == "bin":
      a, b = pick(), pick()
      nodes.append(UOp(Ops[draw(st.sampled_from(BIN_OPS))], a.dtype, (a, b)))
    elif kind == "same":
      a = pick()
      nodes.append(UOp(Ops[draw(st.sampled_from(BIN_OPS))], a.dtype, (a, a)))
    elif kind == "neg":
      a = pick()
      nodes.append(UOp(Ops.NEG, a.dtype, (a,)))
    else:
      nodes.append(UOp.sink(*[pick() for _ in range(draw(st.integers(0, 4)))]))
  return nodes


def outcome(fn, node):
  try: return ("ok", fn(node))
  except RuleRuntimeError as e: return ("error", e.rule_name, type(e.cause).__name__)


@settings(max_examples=600)
@given(rule_sets(), graphs())
def test_compiled_matches_reference(text, nodes):
  m = TextMatcher(text, "r")
  for node in nodes:
    got, want = outcome(m.rewrite, node), outcome(m.reference.rewrite, node)
    assert got[0] == want[0] and (got[1:] == want[1:] if got[0] == "error" else got[1] is want[1]), \
      f"node {node}\nrules:\n{text}\ncompiled: {got}\nreference: {want}\n{m.source}"


def test_commutative_order_original_first():
  # both orders match; the original order binds first
  m = TextMatcher("ruleset r:\n  x + y => x\n", "r")
  a, b = UOp.variable("a", 0, 3), UOp.variable("b", 0, 3)
  assert m.rewrite(a + b) is a
  # a guard that only holds for the swapped order makes the second order fire
  m = TextMatcher("ruleset r:\n  x + c:CONST if c.arg == 5 => x\n", "r")
  assert m.rewrite(UOp.const(dtypes.index, 5) + a) is a


def test_first_rule_in_file_order_wins_and_none_falls_through():
  text = "ruleset r:\n  x * 2 => None\n  x * 2 => x + x\n  x * c:CONST => x\n"
  m = TextMatcher(text, "r")
  a = UOp.variable("a", 0, 3)
  assert m.rewrite(a * 2) is a + a
  assert m.rewrite(a * 3) is a
