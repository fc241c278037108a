"""rulec prove (engine/verify/prove.py, engine/verify/smt.py): planted wrong rules are refuted with counterexamples
that are checked here by evaluating them, correct rules are proven, a pair of rules that undo each other is
flagged, the json / sarif formats and the exit codes, and the z3 translation against the reference evaluator.

z3 answers within its time limit or not at all; these tests give it a generous limit (LONG), so that no result
depends on how fast the machine is."""
from __future__ import annotations

import json
import math
import struct
import textwrap
from pathlib import Path

import pytest

z3 = pytest.importorskip("z3", reason="rulec prove needs z3-solver: pip install 'rulec[prove]'")
pytest.importorskip("hypothesis", reason="rulec prove builds its instances with the verifier's generator (hypothesis)")

from rulec.cli import main  # noqa: E402
from rulec.engine.ir.dtypes import DType, dtypes  # noqa: E402
from rulec.engine.ir.ops import Ops  # noqa: E402
from rulec.engine.ir.uop import UOp  # noqa: E402
from rulec.engine.lang.loader import load_library  # noqa: E402
from rulec.engine.verify.evaluate import eval_scalar  # noqa: E402
from rulec.engine.verify.generate import FLOATS, INTS  # noqa: E402
from rulec.engine.verify.prove import prove_instance, prove_library  # noqa: E402
from rulec.engine.verify.smt import Terms, const_term, python_value  # noqa: E402

LONG = 120_000   # ms per z3 query: never reached by these rules, so results do not depend on the machine's speed
REPO = Path(__file__).resolve().parents[2]

PLANTED = """
ruleset planted:
  rule floor_twice: (x{ints} // 2) * 2 => x
  rule widen_late: CAST(x{int8} + 1){int32} - 1 => x.cast(dtypes.int32)
  rule double_half: (x{int32} * 2) // 2 => x
  rule neg_div: -(x{sints} // 2) => (-x) // 2
  rule plus_zero: x{floats} + 0.0 => x
"""

CORRECT = """
ruleset fine:
  rule twice: x{ints} * 2 => x + x
  rule halves: (x{ints} // 4) // 2 => x // 8
  rule recombine: (x{ints} // 8) * 8 + x % 8 => x
  rule self_sub: x{ints} - x => x.const_like(0)
  rule times_one: x{floats} * 1.0 => x
  rule reshape_twice: x:RESHAPE(RESHAPE(a)) => a.reshape(x.arg)
  rule permute_twice: x:PERMUTE(p:PERMUTE(a)) => a.permute(tuple(p.arg[i] for i in x.arg))
"""

LOOP = """
ruleset loop:
  rule to_add: x{ints} * 2 => x + x
  rule to_mul: x{ints} + x => x * 2
"""


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
  monkeypatch.setenv("RULEC_CACHE_DIR", str(tmp_path / "cache"))
  monkeypatch.setenv("RULEC_PROGRESS", "0")
  for k in ("RULEC_STATS", "RULEC_HELPER_PACKAGES", "RULEC_RULES"): monkeypatch.delenv(k, raising=False)


def _lib(tmp_path, text: str, name: str = "t.rules"):
  p = tmp_path / name
  p.write_text(textwrap.dedent(text))
  return p, load_library([p])


def _proofs(lib, names=None) -> dict:
  return {r.name: r for rs in prove_library(lib, names, timeout_ms=LONG) for r in rs.rules}


# *** the test's own arithmetic, to check counterexamples with ***

def _wrap(v: int, bits: int, signed: bool = True) -> int:
  v &= (1 << bits) - 1
  return v - (1 << bits) if signed and v >= 1 << (bits - 1) else v


def _float32(v: float) -> float: return struct.unpack("<f", struct.pack("<f", v))[0]


def _same(a: float, b: float) -> bool:
  return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))


def _bits_of(where: str) -> tuple[int, bool]:
  """(width, signed) of the dtype a counterexample's 'where' gives its leaf."""
  for name, dt in dtypes.all().items():
    if "{" + name + "}" in where: return dt.bits, dt.kind != "u"
  return 64, True   # a RANGE: index


def test_planted_wrong_rules_are_refuted_with_checked_counterexamples(tmp_path):
  _, lib = _lib(tmp_path, PLANTED)
  res = _proofs(lib)
  assert {r.status for r in res.values()} == {"refuted"}, {n: (r.status, r.reason) for n, r in res.items()}
  for name, r in res.items():
    c = r.counterexample
    assert r.location.endswith(f"t.rules:{list(res).index(name) + 3}:3") and c["why"] == "different values"
    assert c["before"] and c["after"] and c["at"] and c["values"] and "x" in c["names"], (name, c)

  c = res["floor_twice"].counterexample   # x odd: (x // 2) * 2 is x - 1
  bits, signed = _bits_of(" ".join(c["where"]))
  x = int(c["names"]["x"])
  assert _wrap((x // 2) * 2, bits, signed) == int(c["results"]["before"]) != x == int(c["results"]["after"])

  c = res["widen_late"].counterexample    # only 127 overflows int8: 127 + 1 is -128, and -128 - 1 is -129
  x = int(c["names"]["x"])
  assert x == 127 and _wrap(x + 1, 8) - 1 == int(c["results"]["before"]) == -129 and int(c["results"]["after"]) == 127
  assert "wrap-around" in c["note"]

  c = res["double_half"].counterexample   # |x| >= 2**30: x * 2 wraps at int32
  x = int(c["names"]["x"])
  assert abs(x) >= 2 ** 30 and _wrap(x * 2, 32) // 2 == int(c["results"]["before"]) != x

  c = res["neg_div"].counterexample       # x odd: floor division does not commute with negation
  bits, signed = _bits_of(" ".join(c["where"]))
  x = int(c["names"]["x"])
  before, after = _wrap(-(x // 2), bits), _wrap(_wrap(-x, bits) // 2, bits)
  assert x % 2 == 1 and before == int(c["results"]["before"]) != after == int(c["results"]["after"])

  c = res["plus_zero"].counterexample     # -0.0 + 0.0 is +0.0
  x = float(c["names"]["x"])
  assert _same(x, -0.0) and _same(_float32(x + 0.0), float(c["results"]["before"])) and c["results"]["after"] == "-0.0"
  assert "sign of zero" in c["note"]


def test_correct_rules_are_proven(tmp_path):
  _, lib = _lib(tmp_path, CORRECT)
  res = _proofs(lib)
  for name, r in res.items(): assert r.status == "proven" and r.instances > 0, (name, r.reason, r.counterexample)
  (rs,) = prove_library(lib, timeout_ms=LONG)
  assert rs.termination is not None and not rs.termination.cycles


def test_a_pair_of_rules_that_undo_each_other_is_flagged(tmp_path, capsys):
  p, lib = _lib(tmp_path, LOOP)
  (rs,) = prove_library(lib, timeout_ms=LONG)
  assert {r.status for r in rs.rules} == {"proven"}   # each is right; together they never stop
  assert [set(c) for c in rs.termination.cycles] == [{"to_add", "to_mul"}]
  assert main(["prove", "--rules", str(p), "--timeout", str(LONG)]) == 1
  assert "these rules undo each other" in capsys.readouterr().out


def test_not_provable_rules_say_why(tmp_path):
  _, lib = _lib(tmp_path, """
    ruleset s:
      rule needs_ctx: x{index} * 5 => ctx.get(x)
      rule device_pow: POW(x{floats}, 1.0) => x
      rule never: x{index} * 3 if x.op is CUSTOM => x
  """)
  res = _proofs(lib)
  assert {r.status for r in res.values()} == {"not provable"}
  assert "ctx" in res["needs_ctx"].reason
  assert "POW" in res["device_pow"].reason and "DEVICE_DEFINED" in res["device_pow"].reason
  assert res["never"].reason.startswith("the generator could not satisfy the pattern/guard")


# *** gradient rules: the adjoint identity in real arithmetic (engine/verify/adjoint.py) ***

PLANTED_GRADIENTS = """
gradients planted(grad):
  rule mul_by_itself: MUL(x, y) => (grad * x, grad * x)
  rule fdiv_no_sign: q:FDIV(_, y) => (grad / y, (grad * q) / y)
  rule expand_first: EXPAND(x) => (grad.shrink(tuple((0, n) for n in x.shape)),)
  rule exp2_no_ln2: e:EXP2(_) => (grad * e,)
  rule compare_flows: CMPLT(_, _) => (grad, None)
"""


def _true_partial(name: str, xs: list, g, i: int, k: int, shapes: dict) -> float:
  """The derivative of sum(g * node) by element k of source i, from the op's definition (the test's own)."""
  import numpy as np
  if name == "mul_by_itself": return g[k] * xs[1 - i][k]
  if name == "fdiv_no_sign": return g[k] / xs[1][k] if i == 0 else -g[k] * xs[0][k] / xs[1][k] ** 2
  if name == "expand_first":   # every element the source's element k was broadcast to
    spread = np.broadcast_to(np.arange(len(xs[0])).reshape(shapes["source 0"]), shapes["g"])
    return float(np.sum(np.asarray(g).reshape(shapes["g"])[spread == k]))
  if name == "exp2_no_ln2": return g[k] * 2.0 ** xs[0][k] * math.log(2)
  raise AssertionError(name)


def test_planted_wrong_gradient_rules_are_refuted_with_checked_counterexamples(tmp_path):
  _, lib = _lib(tmp_path, PLANTED_GRADIENTS)
  res = _proofs(lib)
  assert {r.status for r in res.values()} == {"refuted"}, {n: (r.status, r.reason) for n, r in res.items()}
  assert "no gradient flows through CMPLT" in res["compare_flows"].counterexample["why"]
  for name in ("mul_by_itself", "fdiv_no_sign", "expand_first", "exp2_no_ln2"):
    c = res[name].counterexample
    assert c["why"].startswith("the gradient differs from the derivative"), (name, c)
    inputs = c["inputs"]
    i, k = (int(w) for w in c["at"].removeprefix("along source ").split(" (")[0].split(", element "))
    xs = [inputs[f"source {j}"] for j in range(len(inputs) - 1)]
    want = _true_partial(name, xs, inputs["g"], i, k, c["shapes"])
    rule_value, fd = float(c["results"]["rule"]), float(c["results"]["finite differences"])
    assert abs(fd - want) <= 1e-5 * (1 + abs(want)), (name, c, want)        # the float64 check agrees with the definition
    assert abs(rule_value - want) > 1e-3 * (1 + abs(want)), (name, c, want)  # and the rule's gradient is not it


def test_the_shipped_gradient_rules_are_proven():
  """Every rule of rules/gradient.rules against forward-mode derivatives, in z3's reals."""
  res = _proofs(load_library(), ["gradient"])
  for name, r in res.items(): assert r.status == "proven" and r.instances > 0, (name, r.reason, r.counterexample)


def test_a_gradient_is_proven_only_where_the_derivative_exists(tmp_path):
  """MAX has no derivative at a tie: a rule that gives nothing there is proven (as rulec verify skips kinks), one that
  is wrong off the ties is refuted."""
  _, lib = _lib(tmp_path, """
    gradients m(grad):
      rule ties_dropped: MAX(x, y) => (y.lt(x).where(grad, 0.0), x.lt(y).where(grad, 0.0))
      rule first_always: MAX(_, _) => (grad, None)
  """)
  res = _proofs(lib)
  assert res["ties_dropped"].status == "proven", (res["ties_dropped"].reason, res["ties_dropped"].counterexample)
  assert res["first_always"].status == "refuted"


# *** values spread over devices (rules/multi.rules): MSTACK / MSELECT as the whole value, each device's part ***

PLANTED_MULTI = """
ruleset multi:
  rule select_first: s:MSELECT(m:MSTACK) if m.arg[0] == s.arg[1] => m.src[0]
  rule copy_half: c:COPY(x) if isinstance(c.arg, tuple) and len(c.arg) == 2 and x.op is not MSTACK
    => UOp(MSTACK, x.dtype, (x, x.const_like(0)), (None, c.arg))
"""


def test_planted_wrong_multi_device_rules_are_refuted(tmp_path):
  """The part of another device, and a replicated result whose second device holds zeros (each device's part of a
  replicated result is compared, not only the first, which is its value)."""
  _, lib = _lib(tmp_path, PLANTED_MULTI)
  res = _proofs(lib)
  assert {r.status for r in res.values()} == {"refuted"}, {n: (r.status, r.reason) for n, r in res.items()}
  c = res["select_first"].counterexample
  assert "MSELECT" in c["before"] and c["why"] == "different values" and c["values"]
  c = res["copy_half"].counterexample
  assert c["note"].startswith("on device ") and c["values"]


# the reduces over the shard axis add in another order than one reduce (a float reduce's order is the device's)
ALLREDUCE = {"reduce_ring", "reduce_naive"}
# the rules that gather a sharded value (engine/sched/multi.py gathered) turned a -0.0 element into +0.0, while the
# parts were padded with +0.0 and added: refuted by prove's first run over them, proven since (-0.0 padding)
GATHERING = {"select_resharded", "move_gathered", "copy_gather"}


def test_the_shipped_multi_device_rules_are_proven():
  """(the allreduce rules are left out: their float instances are not provable, and their larger integer MAX instances
  run past any time limit)"""
  from rulec.engine.verify.prove import prove_rule
  lib = load_library()
  order = lib.rules_of(("multi",))
  res = {}
  for k, rule in enumerate(order):
    if rule.name not in ALLREDUCE: res[rule.name] = prove_rule(rule, lib.checked.helpers_of, timeout_ms=LONG, earlier=order[:k])
  assert GATHERING <= set(res)
  for name, r in res.items():
    assert r.status == "proven" and r.instances > 0, (name, r.reason, r.counterexample)


# *** kernel-level loads and stores ***

def test_loads_and_stores_are_proven(tmp_path):
  """A load outside its buffer (poison) may give anything, so clamp_load's read of element 0 there is right; a store
  as a loop of element stores (store_loops) leaves every buffer with the same contents. A load from the next
  element, or a store of the flipped value, is not proven (z3's counterexample; kernel-level graphs have no reference
  evaluator to confirm it with)."""
  from rulec.engine.verify.prove import prove_rule
  lib = load_library()
  for rs, name in (("decomp", "clamp_load"), ("range_creation", "store_loops")):
    rule = next(x for x in lib.checked.rulesets[rs].rules if x.name == name)
    r = prove_rule(rule, lib.checked.helpers_of, timeout_ms=LONG)
    assert r.status == "proven" and r.instances > 0, (name, r.reason)
  _, lib = _lib(tmp_path, """
    ruleset wrong:
      rule next_element: i:INDEX(p:PARAM, idx) if i.arg is None => p.index(idx + 1, arg="clamped")
      rule flipped: STORE(t, v) if t.op is not INDEX and len(t.shape) == 1 and t.shape[0] > 1 => t.store(v.flip((True,)))
  """)
  res = _proofs(lib)
  for name, r in res.items(): assert r.status == "not provable" and "z3 finds" in r.reason, (name, r.reason)


def test_a_reduce_over_ranges_translates_each_point():
  """REDUCE(value, r) is the value at each point of r: a division in the value has its own quotient and remainder at
  each point (sum over r < 4 of r % 2 is 2), not one shared by all of them."""
  r = UOp.range(4, 0)
  red = UOp(Ops.REDUCE, dtypes.index, ((r % 2),) + (r,), Ops.ADD)
  assert prove_instance(red, UOp.const(dtypes.index, 2), "scalar", LONG).status == "proven"
  assert prove_instance(red, UOp.const(dtypes.index, 4), "scalar", LONG).status != "proven"


def test_kernel_patterns_from_programs_are_proven():
  """Patterns the generator does not build get the nodes they rewrote while small programs were scheduled:
  Tensor.arange's iota is its range (iota_range); a gather's one-hot sum is proven for integers, and for floats
  only some orders of the sum's additions give the picked value (a float reduce's order is the device's)."""
  from rulec.engine.verify.prove import prove_rule
  lib = load_library()
  order = lib.rules_of(("symbolic",))
  res = {r.name: prove_rule(r, lib.checked.helpers_of, timeout_ms=LONG, earlier=order[:k])
         for k, r in enumerate(order) if r.name in ("iota_range", "one_hot_sum")}
  assert res["iota_range"].status == "proven" and res["iota_range"].instances > 0, res["iota_range"].reason
  r = res["one_hot_sum"]
  assert r.status == "not provable" and "float REDUCE" in r.reason and "the other 1 instances are proven" in r.reason, r.reason


def test_a_shipped_rule_is_proven_through_its_helper(tmp_path):
  """fold_div_parts answers through divmod_parts (a helper): the proof covers what the helper returned."""
  lib = load_library()
  r = _proofs(lib, ["symbolic_fold"])
  assert r["fold_alu"].status == r["fold_cast"].status == "proven"
  rule = next(x for x in lib.checked.rulesets["symbolic"].rules if x.name == "fold_div_parts")
  from rulec.engine.verify.prove import prove_rule
  assert prove_rule(rule, lib.checked.helpers_of, timeout_ms=LONG).status == "proven"


def test_cli_formats_and_exit_codes(tmp_path, capsys, monkeypatch):
  monkeypatch.chdir(tmp_path)
  bad, _ = _lib(tmp_path, PLANTED, "bad.rules")
  good, _ = _lib(tmp_path, CORRECT, "good.rules")
  assert main(["prove", "--rules", str(good), "--timeout", str(LONG)]) == 0
  out = capsys.readouterr().out
  assert "proven         twice" in out and "fine: 7 proven, 0 refuted, 0 not provable" in out
  assert main(["prove", "--rules", str(bad), "--timeout", str(LONG)]) == 1
  out = capsys.readouterr().out
  assert "REFUTED        floor_twice (bad.rules:3:3)" in out and "planted: 0 proven, 5 refuted, 0 not provable" in out

  assert main(["prove", "planted", "--rules", str(bad), "--timeout", str(LONG), "--format", "json"]) == 1
  data = json.loads(capsys.readouterr().out)
  assert data["refuted"] == 5 and data["proven"] == 0
  rule = data["rulesets"][0]["rules"][0]
  assert rule["status"] == "refuted" and rule["location"].endswith("bad.rules:3:3")
  assert set(rule["counterexample"]) >= {"why", "before", "after", "at", "values", "inputs", "results", "names"}
  assert "termination" in data["rulesets"][0]

  assert main(["prove", "planted", "--rules", str(bad), "--timeout", str(LONG), "--format", "sarif"]) == 1
  log = json.loads(capsys.readouterr().out)
  jsonschema = pytest.importorskip("jsonschema")
  schema = json.loads((REPO / "tests" / "data" / "sarif-schema-2.1.0.json").read_text())
  assert not list(jsonschema.Draft4Validator(schema).iter_errors(log))
  results = log["runs"][0]["results"]
  assert len(results) == 5 and {r["ruleId"] for r in results} == {"P001"}
  first = results[0]
  region = first["locations"][0]["physicalLocation"]["region"]
  assert first["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "bad.rules"
  assert (region["startLine"], region["startColumn"]) == (3, 3) and "floor_twice" in first["message"]["text"]
  rules = log["runs"][0]["tool"]["driver"]["rules"]
  assert rules[first["ruleIndex"]]["id"] == "P001"

  assert main(["prove", "nope", "--rules", str(good)]) == 2
  assert "unknown ruleset nope" in capsys.readouterr().err
  assert main(["prove", "--rules", str(tmp_path / "missing.rules")]) == 2
  assert main(["prove", "--rules", str(good), "--timeout", "0"]) == 2


def test_missing_z3_is_one_line_not_a_traceback(tmp_path, capsys, monkeypatch):
  import importlib.util
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "z3" else real(name, *a))
  assert main(["prove"]) == 2
  assert "pip install 'rulec[prove]'" in capsys.readouterr().err


# *** the translation against the reference evaluator (engine/verify/evaluate.py, engine/ir/alu.py) ***

def _int_values(dt):
  lo, hi = dt.min(), dt.max()
  return sorted(v for v in {0, 1, -1, 2, -2, 7, -7, lo, hi, lo + 1, hi - 1, dt.bits, dt.bits + 1} if lo <= v <= hi)


_FLOAT_VALUES = (0.0, -0.0, 1.0, -2.5, 3.0, 0.1, 1e-20, math.inf, -math.inf, math.nan, 1e30, 70000.0, 5e-324)
_INT_OPS = (Ops.ADD, Ops.SUB, Ops.MUL, Ops.IDIV, Ops.MOD, Ops.CDIV, Ops.CMOD, Ops.MAX, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL,
            Ops.SHR, Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ)
_FLOAT_OPS = (Ops.ADD, Ops.SUB, Ops.MUL, Ops.FDIV, Ops.IDIV, Ops.MOD, Ops.CMOD, Ops.MAX, Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ)


def _z3_value(graph: UOp, env: dict):
  terms = Terms()
  term = terms.value(graph)
  subs = [(terms.leaves[u], const_term(v, u.dtype)) for u, v in env.items()]
  return python_value(z3.simplify(z3.substitute(term, *subs)), graph.dtype)


def _agree(want, got) -> bool:
  if isinstance(want, float): return isinstance(got, float) and _same(want, got)
  return type(want) is type(got) and want == got


def _var(name, dt):
  if dt.kind == "f": return UOp.variable(name, -math.inf, math.inf, dt)
  return UOp.variable(name, dt.min(), dt.max(), dt)


def _check_binary_ops(ops, a: UOp, b: UOp, dt: DType, vals: list) -> None:
  """Each binary op of dt at every pair of values: the translation's value is the reference evaluator's."""
  for op in ops:
    out = dtypes.bool if op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ) else dt
    g = UOp(op, out, (a, b))
    for x in vals:
      for y in vals:
        env = {a: x, b: y}
        assert _agree(eval_scalar(g, env), _z3_value(g, env)), (op, dt, x, y)


@pytest.mark.parametrize("dt", [d for d in INTS if d.bits in (8, 32, 64)], ids=lambda d: d.name)
def test_integer_ops_mean_what_the_reference_evaluator_computes(dt):
  a, b = _var("a", dt), _var("b", dt)
  vals = _int_values(dt)
  _check_binary_ops(_INT_OPS, a, b, dt, vals)
  for to in (dtypes.int8, dtypes.uint16, dtypes.int64, dtypes.bool, dtypes.float32, dtypes.float16):
    for x in vals:
      g = UOp(Ops.CAST, to, (a,))
      assert _agree(eval_scalar(g, {a: x}), _z3_value(g, {a: x})), (dt, to, x)


@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.name)
def test_float_ops_mean_what_the_reference_evaluator_computes(dt):
  a, b = _var("a", dt), _var("b", dt)
  vals = [float(UOp.const(dt, v).arg) for v in _FLOAT_VALUES]
  _check_binary_ops(_FLOAT_OPS, a, b, dt, vals)
  # (not to index: engine/verify's evaluator keeps a float's value there, where the NUMPY device truncates)
  for op_or_dt in (Ops.NEG, Ops.SQRT, Ops.RECIPROCAL, Ops.TRUNC, dtypes.int32, dtypes.uint8, dtypes.int64, dtypes.bool,
                   dtypes.float16, dtypes.float64):
    g = UOp(op_or_dt, dt, (a,)) if isinstance(op_or_dt, Ops) else UOp(Ops.CAST, op_or_dt, (a,))
    for x in vals: assert _agree(eval_scalar(g, {a: x}), _z3_value(g, {a: x})), (op_or_dt, dt, x)


def test_division_by_a_constant_is_exact():
  """Division by a constant is translated as q*c + r = a with bounds (engine/verify/smt.py Terms._truncating):
  at the edges (INT_MIN // -1, a negative divisor) z3 must find exactly the reference's value."""
  for dt in (dtypes.int8, dtypes.int32, dtypes.uint8):
    a = _var("a", dt)
    for c in (-1, 3, -7, 2, dt.max()):
      if not dt.min() <= c <= dt.max(): continue
      for op in (Ops.IDIV, Ops.MOD, Ops.CDIV, Ops.CMOD):
        g = UOp(op, dt, (a, UOp.const(dt, c)))
        for x in _int_values(dt):
          want = eval_scalar(g, {a: x})
          terms = Terms()   # (the value must be the only one its constraints allow)
          term = terms.value(g)
          s = z3.Solver()
          s.add(*terms.definitions, terms.leaf(a) == const_term(x, dt), term != const_term(want, dt))
          assert s.check() == z3.unsat, (op, dt, c, x, want)


def test_a_counterexample_must_be_confirmed_by_the_reference_evaluator():
  """A rule that holds for numpy's pow but not for any pow (POW is device-defined) is not refuted: z3's
  counterexample is not one the reference evaluator confirms, and the reason says so."""
  f = UOp.variable("a", -math.inf, math.inf, dtypes.float32)
  out = prove_instance(UOp(Ops.POW, dtypes.float32, (f, UOp.const(dtypes.float32, 1.0))), f, "scalar", LONG)
  assert out.status == "unconfirmed" and out.device_defined == ("POW",)


def test_the_shipped_movement_and_index_rules_are_proven():
  """The movement-op rewrites (mop_cleanup) and the index algebra of rules/rangeify.rules (INDEX through a movement
  op, a PAD, an elementwise op), with integer index arithmetic and any buffer contents."""
  res = _proofs(load_library(), ["mop_cleanup", "range_migration"])
  for name, r in res.items(): assert r.status == "proven", (name, r.reason, r.counterexample)


def _tensor_graphs():
  """Tensor-level graphs over one buffer, each op of the tensor translation's among them."""
  import numpy as np
  from rulec.runtime.buffer import buffer_of
  b8 = UOp.new_buffer("CPU", 12, dtypes.uint8)
  buffer_of(b8).copyin(np.arange(1, 13, dtype=np.uint8) * 21)
  bf = UOp.new_buffer("CPU", 6, dtypes.float32)
  buffer_of(bf).copyin(np.array([1.5, -0.0, 3.0, -2.25, 7.0, 0.5], dtype=np.float32))
  x = b8.reshape((3, 4))
  f = bf.reshape((2, 3))
  return [
    x.bitcast(dtypes.uint32),                                   # 4 bytes to one item, little-endian
    x.reshape((3, 2, 2)).permute((2, 0, 1)).flip((True, False, True)),
    x.pad(((1, 0), (0, 2))).shrink(((0, 3), (1, 5))),
    x.reshape((12,)).reshape((2, 6)).expand((2, 6)),
    f.bitcast(dtypes.uint16),                                   # one float to two halves of its bits
    (f * f + f).shrink(((1, 2), (0, 3))),
    (x.cast(dtypes.int32) * x.cast(dtypes.int32)).r(Ops.MAX, (1,)),   # (a float reduce's order is the device's: ints)
    f.cast(dtypes.int32).reshape((6,)).shrink(((1, 5),)),
    x.cast(dtypes.int8).r(Ops.ADD, (0,)),
  ]


def test_tensor_graphs_mean_what_the_reference_evaluator_computes():
  """engine/verify/smt.py TensorTerms at every index against engine/verify/evaluate.py TensorEval (numpy)."""
  import numpy as np
  from rulec.engine.verify.evaluate import TensorEval
  from rulec.engine.verify.smt import TensorTerms
  from rulec.runtime.buffer import buffer_of
  for g in _tensor_graphs():
    want = TensorEval().value(g)
    terms = TensorTerms(False, [g])
    s = z3.Solver()
    for point in np.ndindex(*want.shape):
      term = terms.at(g, tuple(terms._i(int(k)) for k in point))
      for b in terms.buffers:
        for k, v in enumerate(buffer_of(b).numpy_view()): s.add(terms.buffer_element(b, k) == const_term(v.item(), b.dtype))
      assert s.check() == z3.sat
      got = python_value(s.model().eval(term, model_completion=True), g.dtype)
      assert _agree(want[point].item() if g.dtype.kind != "f" else float(want[point]), got), (g, point)


@pytest.mark.parametrize("dt", [dtypes.int8, dtypes.uint8, dtypes.int32, dtypes.index], ids=lambda d: d.name)
def test_linear_integer_translation_means_the_same(dt):
  """IntTerms (z3's integers, each result wrapped into its dtype) against the reference evaluator: sums, products
  and division by constants, casts between widths, comparisons."""
  from rulec.engine.verify.smt import IntTerms
  a, b = _var("a", dt), _var("b", dt)
  graphs = [a + b, a - b, a * UOp.const(dt, 3), UOp(Ops.NEG, dt, (a,)), a.maximum(b), a.lt(b), a.ne(b),
            a.cast(dtypes.int8).cast(dt), a.cast(dtypes.uint16), a.cast(dtypes.bool)]
  for c in (1, 2, 7, -1, -3, dt.max(), dt.min()):
    if dt.min() <= c <= dt.max():
      graphs += [UOp(op, dt, (a, UOp.const(dt, c))) for op in (Ops.IDIV, Ops.MOD, Ops.CDIV, Ops.CMOD)]
  for g in graphs:
    for x in _int_values(dt):
      for y in (_int_values(dt) if b in g.toposort() else [0]):
        env = {a: x, b: y} if b in g.toposort() else {a: x}
        terms = IntTerms()
        term = terms.value(g)
        got = z3.simplify(z3.substitute(term, *[(terms.leaf(u), z3.IntVal(v)) for u, v in env.items()]))
        got = z3.is_true(got) if g.dtype.kind == "b" else got.as_long()
        assert got == eval_scalar(g, env), (g, env)


def test_a_float_zero_literal_also_stands_for_negative_zero(tmp_path):
  """The matcher compares a literal with ==, so `x - 0.0` matches x - (-0.0) too, where -0.0 - -0.0 is +0.0."""
  _, lib = _lib(tmp_path, """
    ruleset s:
      rule minus_zero: x{floats} - 0.0 => x
  """)
  c = _proofs(lib)["minus_zero"].counterexample
  assert "-0.0" in c["before"] and c["names"]["x"] == "-0.0" and c["results"] == {"before": "0.0", "after": "-0.0"}


@pytest.mark.parametrize("name", ["add_zero", "sub_zero", "lt_add_invariant"])
def test_the_shipped_rules_prove_refuted_are_fixed(name):
  """rulec prove's first run over rules/ refuted these three: x + 0 => x at a float -0.0 (and x - 0 when the zero is
  -0.0), and lt_add_invariant's right side r0 < 16 - 16*b*c, which wraps near 2**63. Each now proves."""
  from rulec.engine.verify.prove import prove_rule
  lib = load_library()
  rule = next(x for x in lib.checked.rulesets["symbolic"].rules if x.name == name)
  r = prove_rule(rule, lib.checked.helpers_of, timeout_ms=LONG)
  assert r.status == "proven", (r.reason, r.counterexample)
