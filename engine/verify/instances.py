"""What rulec prove's two provers share (engine/verify/prove.py for value rules, engine/verify/adjoint.py for
gradient rules): how many instances each rule is tried on, how an instance is known again, and what one
instance's proof ended in."""
from __future__ import annotations

import attrs

from rulec.engine.ir.dtypes import dtypes
from rulec.engine.ir.ops import Ops
from rulec.engine.ir.uop import UOp

TRIES_PER_DTYPE = 10        # hypothesis examples per preferred dtype and mode
MORE_TRIES = 6              # with fewer than WANTED instances, this many times more (for the dtypes that built a graph)
WANTED = 4
MAX_INSTANCES = 24          # distinct instances proven per rule


def graph_structure(*graphs: UOp) -> tuple:
  """The graphs up to the numbering of their buffers (each draw makes new ones): equal instances, one proof."""
  sink = UOp(Ops.SINK, dtypes.void, graphs)
  number: dict[UOp, int] = {}
  out = []
  for u in sink.toposort():
    number[u] = len(number)
    arg = ("buffer",) + tuple(u.arg[1:]) if u.op is Ops.BUFFER else u.arg
    out.append((u.op, u.dtype, repr(arg), u.tag, tuple(number[x] for x in u.src)))
  return tuple(out)


@attrs.define
class Outcome:
  status: str   # "proven" | "refuted" | "unknown" (timeout) | "untranslatable" | "unconfirmed" | "vacuous" (no values)
  reason: str | None = None
  counterexample: dict | None = None
  device_defined: tuple = ()    # what the device decides that the instance depends on (EXP2, a float reduce's order)
