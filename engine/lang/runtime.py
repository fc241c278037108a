"""What generated matchers call at run time: helper imports and rule errors."""
from __future__ import annotations

from engine.lang.names import resolve_helper, resolve_helper_module


class RuleAbort(Exception):
  """Raised on purpose by a helper to stop a rewrite; passes through matchers untouched."""


class RuleRuntimeError(RuntimeError):
  """A guard or replacement raised: names the rule and where it is."""
  def __init__(self, rule: tuple[str, str, str], cause: BaseException):
    self.rule_name, self.location, self.source = rule
    self.cause = cause
    super().__init__(f"rule '{self.rule_name}' at {self.location} failed: {type(cause).__name__}: {cause}\n"
                     f"    {self.source}")


def rule_failed(rule: tuple[str, str, str], cause: BaseException):
  if isinstance(cause, RuleRuntimeError): raise cause
  raise RuleRuntimeError(rule, cause) from cause


def not_a_node(rule: tuple[str, str, str], value) -> None:
  raise RuleRuntimeError(rule, TypeError(f"the replacement is a {type(value).__name__}, not a UOp (or None for no rewrite)"))


def import_helper(module: str, name: str):
  mod, why = resolve_helper_module(module)
  if mod is None: raise ImportError(why)
  fn, why = resolve_helper(mod, name)
  if fn is None: raise ImportError(why)
  return fn
