"""What generated matchers call at run time: helper imports, rule errors, the checked operators
(engine/lang/bounded.py), and the time bound on each guard and replacement (engine/lang/watchdog.py)."""
from __future__ import annotations

from rulec.engine.ir.rewrite import RuleRuntimeError  # noqa: F401 (matchers raise it; graph_rewrite too, so it is IR)
from rulec.engine.lang import watchdog
from rulec.engine.lang.bounded import rule_lshift, rule_mod, rule_mul, rule_pow  # noqa: F401 (matchers call them)
from rulec.engine.lang.libraries import resolve_helper, resolve_library

watchdog.start()    # (matchers import this module: the time bound is on from the first rule that runs)




class RuleAbort(Exception):
  """Raised on purpose by a helper to stop a rewrite; passes through matchers untouched."""


def rule_failed(rule: tuple[str, str, str], cause: BaseException):
  if isinstance(cause, RuleRuntimeError): raise cause
  raise RuleRuntimeError(rule, cause) from cause


def not_a_node(rule: tuple[str, str, str], value) -> None:
  raise RuleRuntimeError(rule, TypeError(f"the replacement is a {type(value).__name__}, not a UOp (or None for no rewrite)"))


def check_gradients(rule: tuple[str, str, str], node, grads):
  """A gradient rule's result: a tuple with one UOp or None per source of the node it matched."""
  from rulec.engine.ir.uop import UOp
  if not isinstance(grads, tuple) or len(grads) != len(node.src):
    what = f"a tuple of {len(grads)}" if isinstance(grads, tuple) else f"a {type(grads).__name__}"
    raise RuleRuntimeError(rule, TypeError(f"the gradient rule gave {what} for {node.op.name} with "
                                           f"{len(node.src)} source{'s' if len(node.src) != 1 else ''}"))
  for i, (s, g) in enumerate(zip(node.src, grads)):
    if g is None: continue
    if g.__class__ is not UOp:
      raise RuleRuntimeError(rule, TypeError(f"gradient {i} is a {type(g).__name__}, not a UOp or None"))
    if g._shape != s._shape:
      raise RuleRuntimeError(rule, ValueError(f"gradient {i} has shape {g._shape}, its source {s._shape}"))
  return grads


def import_helper(module: str, name: str):
  mod, why = resolve_library(module)
  if mod is None: raise ImportError(why)
  fn, why = resolve_helper(mod, name)
  if fn is None: raise ImportError(why)
  return fn
