"""What the scheduler passes as `ctx` to each rule set it runs, and which of that object's names rules may use.

`rulec check` reads this table (engine/lang/checker.py): in a set the driver runs, or a set such a set
includes, `ctx.NAME` must be a name the set's ctx offers rules, and a call of one of its methods must fit the
method's signature. A typo in a rules file (`ctx.row_valu`) is then a located diagnostic at check time, not
an AttributeError in the middle of a schedule, and a stranger's rules file cannot reach the parts of a ctx
object that are the driver's own bookkeeping (`KernelSplit.run_pass`, `FusionFacts.staged`).

Keep it next to the driver: a pass that starts passing a new object, or a new fact a rule may read, is added
here in the same change (tests/test_rules_ctx.py checks every class's names exist)."""
from __future__ import annotations

import attrs


@attrs.frozen
class RuleContext:
  what: str                         # how a diagnostic names the object ("engine/sched/fusion.py's FusionFacts")
  names: frozenset[str] = frozenset()   # the attributes rules may use
  cls: type | None = None           # where the names live (their signatures are checked), None for a plain value


def _facts(cls: type, where: str, *names: str) -> RuleContext:
  return RuleContext(f"{where}'s {cls.__name__}", frozenset(names), cls)


def rule_contexts() -> dict[str, RuleContext | None]:
  """Rule set name -> what it receives as ctx; None: the pass passes no ctx (`ctx` is None in its rules)."""
  from rulec.engine.sched.fusion import FusionFacts
  from rulec.engine.sched.kernels import KernelBuilder, KernelSplit
  from rulec.engine.sched.stages import CopyReuse, Placement, StagePlan
  fusion = _facts(FusionFacts, "engine/sched/fusion.py", "uses", "contexts", "reads", "reduces_inside", "epilogue",
                  "needed_below", "hoists", "hoists_rows", "max_reads", "row_value", "shrunk_view", "permuted_view",
                  "store", "hoist", "keep")
  return {
    "earliest": None, "prepare": None, "realize": None, "rangeify": None, "symbolic": None, "multi": None,
    "kernel_views": None, "untag": None,
    "reuse_copies": _facts(CopyReuse, "engine/sched/stages.py", "reads_a_copy", "via_copy", "record"),
    "fuse_reduces": fusion, "fuse_values": fusion,
    "stage": _facts(StagePlan, "engine/sched/stages.py", "empty_output", "empty_buffer", "output_device", "stored",
                    "record"),
    "place": _facts(Placement, "engine/sched/stages.py", "consumer_device", "record"),
    "limit_buffers": RuleContext("an int (the most buffers one kernel may read)"),
    "split_kernels": _facts(KernelSplit, "engine/sched/kernels.py", "split"),
    "to_params": _facts(KernelBuilder, "engine/sched/kernels.py", "param", "param_after", "renumber"),
    "decomp": RuleContext("None or a frozenset of ops (the optional decompositions the backend asks for)"),
  }


__all__ = ["RuleContext", "rule_contexts"]
