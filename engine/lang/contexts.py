"""What the scheduler passes as `ctx` to each rule set it runs, and which of that object's names rules may use.

`rulec check` reads this table (engine/lang/checker.py): in a set the driver runs, or a set such a set
includes, `ctx.NAME` must be a name the set's ctx offers rules, and a call of one of its methods must fit the
method's signature. A typo in a rules file (`ctx.row_valu`) is then a located diagnostic at check time, not
an AttributeError in the middle of a schedule, and a stranger's rules file cannot reach the parts of a ctx
object that are the driver's own bookkeeping (`KernelSplit.run_pass`, `FusionFacts.staged`).

A pass that starts passing a new object, or a new fact a rule may read, is added here in the same change
(tests/lang/test_rules_ctx.py checks every class's names exist). The classes belong to the scheduler, a layer above the
rule language, so they are named here as data ("module:Class") and imported only when the checker reads their
signatures, as helper libraries are (engine/lang/libraries.py)."""
from __future__ import annotations

import importlib

import attrs


@attrs.frozen
class RuleContext:
  what: str                         # how a diagnostic names the object ("engine/sched/fusion.py's FusionFacts")
  names: frozenset[str] = frozenset()   # the attributes rules may use
  where: str | None = None          # "module:Class" of the class the names live in, None for a plain value

  @property
  def cls(self) -> type | None:
    """The class itself (its methods' signatures are checked)."""
    if self.where is None: return None
    module, _, name = self.where.partition(":")
    return getattr(importlib.import_module(module), name)


def _facts(where: str, *names: str) -> RuleContext:
  module, _, name = where.partition(":")
  path = module.removeprefix("rulec.").replace(".", "/") + ".py"
  return RuleContext(f"{path}'s {name}", frozenset(names), where)


def rule_contexts() -> dict[str, RuleContext | None]:
  """Rule set name -> what it receives as ctx; None: the pass passes no ctx (`ctx` is None in its rules)."""
  fusion = _facts("rulec.engine.sched.fusion:FusionFacts", "uses", "contexts", "repeats", "cost", "transcendentals", "bytes", "reads", "reduces_inside", "epilogue",
                  "needed_below", "needed_more_below", "guards", "hoists", "hoists_rows", "lane_guards", "max_reads", "launch_cost", "tile", "row_value", "row_tail", "over_hoisted_row", "tiled_epilogues", "tensor_cores", "tile_epilogue_ops", "epilogue_cost", "contraction", "online_softmax", "score_bytes", "online_bytes", "shrunk_view", "permuted_view",
                  "kernel_ops", "max_kernel_ops", "decided", "store", "hoist", "keep")
  return {
    "earliest": None, "prepare": None, "realize": None, "rangeify": None, "symbolic": None, "multi": None,
    "kernel_views": None, "untag": None,
    "reuse_copies": _facts("rulec.engine.sched.stages:CopyReuse", "reads_a_copy", "via_copy", "record"),
    "fuse_reduces": fusion, "fuse_values": fusion, "bound_kernels": fusion,
    "stage": _facts("rulec.engine.sched.stages:StagePlan", "empty_output", "empty_buffer", "output_device", "stored",
                    "record"),
    "place": _facts("rulec.engine.sched.stages:Placement", "consumer_device", "record"),
    "limit_buffers": RuleContext("an int (the most buffers one kernel may read)"),
    "split_kernels": _facts("rulec.engine.sched.kernels:KernelSplit", "split"),
    "to_params": _facts("rulec.engine.sched.kernels:KernelBuilder", "param", "param_after", "renumber"),
    "online": RuleContext("None or a frozenset of REDUCE MAX nodes (the row maxes a running max may replace)"),
    "decomp": RuleContext("None or a frozenset of ops (the optional decompositions the backend asks for)"),
  }


__all__ = ["RuleContext", "rule_contexts"]
