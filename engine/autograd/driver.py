"""The gradient driver: a reverse topological walk from the root that asks the `gradient` rule set, node by node,
for the gradients of the node's sources given its own, and adds up the gradients that meet at a node.

Gradients are ordinary lazy tensor graphs (they are scheduled and fused with the forward pass by the same rules).
Only float values carry gradients; sources that cannot lead to a target are skipped without asking any rule."""
from __future__ import annotations

from typing import Iterable

from rulec.engine.lang.loader import load_library
from rulec.engine.ir.uop import UOp


class NoGradientRule(RuntimeError):
  """A node on the way to a target has no rule in the gradient rule set."""


def gradients(root: UOp, seed: UOp, targets: Iterable[UOp], stop: Iterable[UOp] = (),
              ruleset: str = "gradient") -> dict[UOp, UOp]:
  """d root / d t for every target t the root depends on (others are left out), given d loss / d root = seed.

  `stop` nodes are treated as constants: nothing flows into or through them."""
  targets, stop = set(targets), set(stop)
  topo = root.toposort()
  leads: dict[UOp, bool] = {}   # does a float path lead from this node down to a target?
  for u in topo:
    leads[u] = u not in stop and u.dtype.is_float and (u in targets or any(leads[s] for s in u.src))
  rules = load_library().matcher(ruleset)
  grads: dict[UOp, UOp] = {root: seed}
  for u in reversed(topo):
    g = grads.get(u)
    if g is None or not leads[u] or not any(leads[s] for s in u.src): continue
    res = rules.rewrite(u, g)
    if res is None:
      raise NoGradientRule(f"no rule in the '{ruleset}' gradient set gives the gradient of {u.op.name} "
                           f"(dtype {u.dtype.name}, shape {u._shape}); add one to rules/gradient.rules")
    for s, sg in zip(u.src, res):
      if sg is None or not leads[s]: continue
      grads[s] = sg if s not in grads else grads[s] + sg
  return {t: grads[t] for t in targets if t in grads}
