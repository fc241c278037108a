"""`ctx` in the rule sets the scheduler runs (engine/lang/contexts.py): `rulec check` knows what each set
receives, so a misspelt fact, a wrong number of arguments to a decision, `ctx` in a set that gets none, and a
reach into the driver's own bookkeeping are located errors before anything runs, in the set itself and in a
set it includes. A set no pass runs keeps the caller's ctx unchecked (docs/rules.md, "ctx")."""
from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path: sys.path.insert(0, str(REPO))

from rulec.engine.lang.diagnostics import RuleError  # noqa: E402
from rulec.engine.lang.loader import check_paths, load_library  # noqa: E402
from rulec.engine.lang.contexts import rule_contexts  # noqa: E402
from rulec.engine.sched.fusion import FusionFacts  # noqa: E402
from rulec.engine.sched.kernels import KernelBuilder, KernelSplit  # noqa: E402
from rulec.engine.sched.stages import CopyReuse, Placement, StagePlan  # noqa: E402
from rulec.engine.tensor import Tensor  # noqa: E402
from rulec.engine.ir.uop import UOp  # noqa: E402


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
  for k in list(os.environ):
    if k.startswith("RULEC_"): monkeypatch.delenv(k)
  monkeypatch.setenv("RULEC_CACHE_DIR", str(tmp_path / "cache"))


def errors(tmp_path: Path, text: str) -> list:
  d = tmp_path / "mine"
  d.mkdir(exist_ok=True)
  (d / "mine.rules").write_text(textwrap.dedent(text))
  lib, _ = check_paths(None, user=[d])
  return [(e.code, e.span.line, e.span.col, e.message, e.note) for e in lib.errors]


def test_every_name_a_context_offers_exists_on_the_object_the_driver_passes():
  a = Tensor(np.ones((3, 4), np.float32))
  sink = UOp.sink((a.exp() + a.sum(axis=1, keepdim=True)).contiguous().uop)
  objects = {FusionFacts: FusionFacts(sink, True), CopyReuse: CopyReuse(sink), Placement: Placement(sink, ["CPU"]),
             StagePlan: StagePlan(sink, set(), ["CPU"]), KernelBuilder: KernelBuilder(),
             KernelSplit: KernelSplit(None, None, None)}
  checked = 0
  for name, ctx in rule_contexts().items():
    if ctx is None or ctx.cls is None: continue
    obj = objects[ctx.cls]
    for n in ctx.names:
      assert hasattr(obj, n), f"{name}: {ctx.cls.__name__} has no {n}"
      checked += 1
  assert checked > 20


def test_the_shipped_rules_use_only_what_each_ctx_offers():
  lib, _ = check_paths(None)
  assert not lib.errors


def test_a_misspelt_fact_is_located_with_a_suggestion(tmp_path):
  (err,) = errors(tmp_path, """\
    ruleset fuse_values extends fuse_values:
      rule mine: x:ALU if ctx.row_valu(x) is not None => ctx.store(x)
  """)
  code, line, col, msg, note = err
  assert (code, line, col) == ("R406", 2, 27)
  assert "ctx of ruleset 'fuse_values' (engine/sched/fusion.py's FusionFacts) has no 'row_valu'" in msg
  assert note.startswith("did you mean 'row_value'?")


def test_a_decision_called_with_the_wrong_arguments_is_R303(tmp_path):
  (err,) = errors(tmp_path, """\
    ruleset stage extends stage:
      rule mine: x:ALU if ctx.stored(x) => ctx.record(x)
  """)
  code, line, col, msg, _ = err
  assert (code, line, col) == ("R303", 2, 40)
  assert msg.startswith("ctx.record called with arguments it does not accept: record(old")
  assert errors(tmp_path, """\
    ruleset stage extends stage:
      rule mine: x:ALU if ctx.stored(x=x) => None
  """) == []   # keyword arguments count as the signature says


def test_ctx_in_a_set_that_gets_none_and_an_int_ctx(tmp_path):
  errs = errors(tmp_path, """\
    ruleset earliest extends earliest:
      rule e: x + 0 if ctx.uses(x) > 1 => x
    ruleset limit_buffers extends limit_buffers:
      rule l: x + 0 if ctx > 2 and ctx.bit_length() > 1 => x
  """)
  assert [e[:3] for e in errs] == [("R406", 2, 24), ("R406", 4, 36)]
  assert "ruleset 'earliest' runs with no ctx (ctx is None), so ctx.uses fails" in errs[0][3]
  assert "ctx of ruleset 'limit_buffers' (an int (the most buffers one kernel may read)) has no 'bit_length'" in errs[1][3]


def test_the_drivers_bookkeeping_is_out_of_reach(tmp_path):
  errs = errors(tmp_path, """\
    ruleset split_kernels extends split_kernels:
      rule s: x:ALU if ctx.run_pass is not None and ctx.built.clear() => x
  """)
  assert [e[:2] for e in errs] == [("R406", 2)] * 2
  with pytest.raises(RuleError, match="has no 'run_pass'"):
    load_library(user=[tmp_path / "mine"]).matcher("split_kernels")


def test_an_included_set_is_checked_against_the_ctx_of_each_set_that_includes_it(tmp_path):
  d = tmp_path / "mine"
  d.mkdir()
  (d / "a.rules").write_text("ruleset mine:\n  rule m: x:EXP2 if ctx.uses(x) > 1 and ctx.reduces_insid(x) == 0 => ctx.store(x)\n")
  (d / "b.rules").write_text("ruleset fuse_values includes mine:\n  rule t: x:LOG2 if ctx.uses(x) > 9 => ctx.store(x)\n"
                             "ruleset earliest includes mine:\n  rule e: x + 0 => x\n")
  lib, _ = check_paths(None, user=[d])
  got = sorted((e.span.file.endswith("a.rules"), e.span.line, e.span.col, e.message.split(" (")[0]) for e in lib.errors)
  assert (True, 2, 45, "ctx of ruleset 'fuse_values'") in got                       # the typo, under fuse_values
  assert sum("ruleset 'earliest' runs with no ctx" in g[3] for g in got) == 3       # each ctx use, under earliest
  # a set that no pass runs is the caller's business: its ctx is not checked
  (d / "b.rules").write_text("ruleset other includes mine:\n  rule e: x + 0 => x\n")
  assert not check_paths(None, user=[d])[0].errors


def test_a_fusion_rule_with_a_good_ctx_use_still_runs(tmp_path, monkeypatch):
  d = tmp_path / "mine"
  d.mkdir()
  (d / "f.rules").write_text("ruleset fuse_values extends fuse_values:\n"
                             "  rule exp_alone: x:EXP2 if ctx.uses(x) >= 1 => ctx.store(x)\n")
  a = Tensor(np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4))
  base = len(Tensor.schedule((a.exp2() + 1) * 2))
  monkeypatch.setenv("RULEC_RULES", str(d))
  out = (a.exp2() + 1) * 2
  assert len(Tensor.schedule(out)) == base + 1
  np.testing.assert_allclose(out.numpy(), (np.exp2(a.numpy()) + 1) * 2, rtol=1e-6)
