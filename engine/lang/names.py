"""What a name in a guard or replacement may refer to.

A rules file cannot reach Python beyond this: names bound by the pattern,
`ctx`, helpers declared by `use` (engine/lang/libraries.py), the builtins below, and op / group / dtype names.
"""
from __future__ import annotations

import inspect
import math
from typing import Any, Callable

from rulec.engine.ir.dtypes import dtypes
from rulec.engine.ir.ops import GROUPS, OPS_BY_NAME, Ops
from rulec.engine.ir.uop import UOp, prod
from rulec.engine.lang.bounded import rule_range

BUILTINS: dict[str, Any] = {
  "len": len, "range": rule_range, "tuple": tuple, "list": list, "dict": dict, "set": set, "frozenset": frozenset,
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


def check_call_arity(fn: Callable, n_positional: int, keywords: tuple[str, ...]) -> str | None:
  """None if fn accepts this call shape, else a message naming its signature."""
  try: sig = inspect.signature(fn)
  except (TypeError, ValueError): return None
  try: sig.bind(*([None] * n_positional), **{k: None for k in keywords})
  except TypeError as e: return f"{fn.__name__}{sig}: {e}"
  return None
