"""The matchers the wheel's build compiles (engine/lang/shipped.py): the same code the compiler gives now, taken
only for the shipped rules unchanged under the same compiler, with the rule locations of the rules read now."""
from __future__ import annotations

import importlib
import sys

import pytest

from rulec.engine.lang import loader, shipped
from rulec.engine.lang.loader import RuleLibrary, default_rules_dir, rule_files


@pytest.fixture(scope="module")
def built(tmp_path_factory):
  root = tmp_path_factory.mktemp("shipped")
  names = shipped.build(root / "shipped_test_matchers", RuleLibrary(rule_files()), default_rules_dir())
  sys.path.insert(0, str(root))
  yield names
  sys.path.remove(str(root))
  for m in [m for m in sys.modules if m.startswith("shipped_test_matchers")]: del sys.modules[m]


def test_every_rule_set_is_built_as_the_compiler_emits_it(built):
  lib = RuleLibrary(rule_files())
  assert sorted(built) == sorted(lib.ruleset_names())
  for name in ("symbolic", "earliest", "split_kernels"):
    src, ns = shipped.load(lib, (name,), default_rules_dir(), rule_files(), package="shipped_test_matchers")
    # the module is the generated matcher with the rules directory put back where the build wrote <rules>
    assert src.split("\n", 2)[2] == lib.emit(name)
    fresh, _ = loader._exec(lib.emit(name), (name,))
    assert ns["RULES"] == fresh["RULES"] and str(default_rules_dir()) in ns["RULES"][0][1]
    assert set(ns["DISPATCH"]) == set(fresh["DISPATCH"])


def test_a_shipped_matcher_rewrites_as_the_compiled_one(built):
  from rulec.engine.ir.uop import UOp
  lib = RuleLibrary(rule_files())
  _, ns = shipped.load(lib, ("symbolic",), default_rules_dir(), rule_files(), package="shipped_test_matchers")
  fresh, _ = loader._exec(lib.emit("symbolic"), ("symbolic",))
  i = UOp.variable("i", 0, 63)
  exprs = [(i * 4 + 3) // 4, (i + 8) % 8, (i * 2 + 1) < 0, ((i // 2) * 2 + i % 2) * 1]
  rewrites = 0
  for e in exprs:
    for u in e.toposort():
      a, b = ns["DISPATCH"].get(u.op), fresh["DISPATCH"].get(u.op)
      assert (a is None) == (b is None)
      if a is None: continue
      got, want = a(u, None), b(u, None)
      assert got is want   # (nodes are hash-consed: the same rewrite is the same node)
      rewrites += got is not None
  assert rewrites >= 3


def test_no_shipped_matcher_is_taken_for_other_rules_or_another_compiler(built, tmp_path):
  lib = RuleLibrary(rule_files())
  assert shipped.load(lib, ("symbolic",), default_rules_dir(), rule_files(), package="shipped_test_matchers") is not None
  # a user's rules directory layered over the shipped rules
  (tmp_path / "mine.rules").write_text("ruleset earliest extends earliest:\n  rule noop: x:EXP2(a:ADD) => None\n")
  layered = RuleLibrary(rule_files(), [tmp_path / "mine.rules"])
  assert shipped.load(layered, ("symbolic",), default_rules_dir(), rule_files(), package="shipped_test_matchers") is None
  # another compiler (its source changed since the build)
  lib.compiler_digest = "0" * 64
  assert shipped.load(lib, ("symbolic",), default_rules_dir(), rule_files(), package="shipped_test_matchers") is None
  # a combination of sets, a package that was never built, and a name that is no module's
  lib = RuleLibrary(rule_files())
  assert shipped.load(lib, ("symbolic", "earliest"), default_rules_dir(), rule_files(), package="shipped_test_matchers") is None
  assert shipped.load(lib, ("symbolic",), default_rules_dir(), rule_files(), package="no_such_package_here") is None
  assert shipped.load(lib, ("../symbolic",), default_rules_dir(), rule_files(), package="shipped_test_matchers") is None


def test_a_checkout_has_no_shipped_matchers_and_compiles():
  with pytest.raises(ImportError): importlib.import_module(shipped.PACKAGE)
