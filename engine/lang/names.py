"""What a name in a guard or replacement may refer to.

A rules file cannot reach Python beyond this: names bound by the pattern,
`ctx`, helpers declared by `use` (plain functions from the project's own
packages), the builtins below, and op / group / dtype names.
"""
from __future__ import annotations

import importlib
import inspect
import math
import os
from typing import Any, Callable

from rulec.engine.ir.dtypes import dtypes
from rulec.engine.lang.capability import is_rule_helper
from rulec.engine.ir.ops import GROUPS, OPS_BY_NAME, Ops
from rulec.engine.ir.uop import UOp, prod

BUILTINS: dict[str, Any] = {
  "len": len, "range": range, "tuple": tuple, "list": list, "dict": dict, "set": set, "frozenset": frozenset,
  "zip": zip, "enumerate": enumerate, "all": all, "any": any, "min": min, "max": max, "sum": sum, "abs": abs,
  "int": int, "float": float, "bool": bool, "str": str, "sorted": sorted, "reversed": reversed, "round": round,
  "divmod": divmod, "isinstance": isinstance, "prod": prod, "dtypes": dtypes, "UOp": UOp, "Ops": Ops,
  "inf": math.inf, "nan": math.nan,
}

# Names that would let a rule reach the interpreter; reported as R403 rather than "unbound".
FORBIDDEN_NAMES = frozenset({"__import__", "eval", "exec", "open", "compile", "getattr", "setattr", "delattr", "globals",
                             "locals", "vars", "input", "breakpoint", "type", "object", "super", "help", "memoryview",
                             "classmethod", "staticmethod", "property", "exit", "quit", "print", "__builtins__", "os",
                             "sys", "importlib", "dir", "id", "hash", "iter", "next", "callable", "bytearray"})

# Attributes that lead from ordinary objects to frames, code and globals.
FORBIDDEN_ATTRS = frozenset({"format", "format_map", "mro", "gi_frame", "gi_code", "f_globals", "f_locals", "f_builtins",
                             "f_back", "f_code", "tb_frame", "tb_next", "cr_frame", "cr_code", "ag_frame", "ag_code",
                             "co_code", "func_globals", "func_code", "im_func", "im_self"})

CONSTANT_NAMES: dict[str, Any] = {**{n: o for n, o in OPS_BY_NAME.items()}, **GROUPS}


def forbidden_attr(attr: str) -> bool:
  return (attr.startswith("__") and attr.endswith("__")) or attr in FORBIDDEN_ATTRS


def helper_packages() -> tuple[str, ...]:
  """Top-level packages helpers may come from (the project's own, plus RULEC_HELPER_PACKAGES)."""
  extra = tuple(p.strip() for p in os.environ.get("RULEC_HELPER_PACKAGES", "").split(",") if p.strip())
  return ("engine", "codegen", "runtime", "rulec") + extra


def resolve_helper_module(module: str) -> tuple[Any | None, str | None]:
  """Import `module` if it is allowed; returns (module, None) or (None, why not)."""
  top = module.split(".")[0]
  if top not in helper_packages():
    return None, f"helpers may only come from the packages {', '.join(helper_packages())} (not '{module}')"
  if any(part.startswith("_") for part in module.split(".")):
    return None, f"'{module}' is a private module; helpers come from public modules"
  try:
    return importlib.import_module(module), None
  except (Exception, SystemExit) as e:   # a module that fails (or exits) on import is a diagnostic, not a crash
    return None, f"cannot import helper module '{module}': {type(e).__name__}: {e}"


def resolve_helper(mod: Any, name: str) -> tuple[Callable | None, str | None]:
  """The function `mod.name` if the project marked it with @rule_helper (rulec.engine.lang.capability); else (None, why)."""
  if name.startswith("_"): return None, f"'{name}' is private; helpers are public functions marked @rule_helper"
  fn = getattr(mod, name, None)
  if fn is None: return None, f"module '{mod.__name__}' has no helper '{name}'"
  if not inspect.isfunction(fn): return None, f"'{mod.__name__}.{name}' is not a plain function"
  if not is_rule_helper(mod.__name__, name, fn):
    return None, f"'{mod.__name__}.{name}' is not a rule helper (only functions marked @rule_helper can be used)"
  return fn, None


def check_call_arity(fn: Callable, n_positional: int, keywords: tuple[str, ...]) -> str | None:
  """None if fn accepts this call shape, else a message naming its signature."""
  try: sig = inspect.signature(fn)
  except (TypeError, ValueError): return None
  try: sig.bind(*([None] * n_positional), **{k: None for k in keywords})
  except TypeError as e: return f"{fn.__name__}{sig}: {e}"
  return None
