"""What a rules file may reach: marked helpers, and attributes by type.

A rules file is untrusted input. Its guards and replacements may call only
functions the project has marked with `@rule_helper`, and may read only the
attributes listed here for the type of the value (an allowlist). The checker
applies the lists where it knows an expression's type; everywhere else the
generated matcher (and the reference interpreter) asks `rule_attr` at run
time, which refuses any attribute of any other type.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable

from rulec.engine.ir.dtypes import DType, dtypes
from rulec.engine.ir.ops import Ops
from rulec.engine.ir.uop import UOp
from rulec.engine.lang import ast as A
from rulec.engine.lang.names import BUILTINS, CONSTANT_NAMES

# "module.name" -> the function, for every function marked with @rule_helper
RULE_HELPERS: dict[str, Callable] = {}


def rule_helper(fn: Callable) -> Callable:
  """Mark a plain, public, module-level function as callable from `.rules` files (via `use LIBRARY (NAME)`:
  engine/lang/libraries.py)."""
  if not inspect.isfunction(fn): raise TypeError(f"@rule_helper marks plain functions, not {type(fn).__name__}")
  if fn.__name__.startswith("_") or "<" in fn.__qualname__ or "." in fn.__qualname__:
    raise ValueError(f"@rule_helper: {fn.__qualname__} is private or not at module level")
  RULE_HELPERS[f"{fn.__module__}.{fn.__name__}"] = fn
  return fn


def is_rule_helper(module: str, name: str, fn: Any) -> bool:
  return RULE_HELPERS.get(f"{module}.{name}") is fn and getattr(fn, "__module__", None) == module


# *** attribute allowlists ***

# UOp: its fields, the derived properties, and the node builders. `_shape` is the shape or None (data, no code).
UOP_BUILDERS = frozenset({"replace", "rtag", "f", "const_like", "alu", "cast", "bitcast", "where", "index", "load", "store",
                          "end", "after", "contiguous", "lt", "ne", "eq", "maximum", "reshape", "expand", "permute", "pad",
                          "shrink", "flip", "r"})
UOP_ATTRS = frozenset({"op", "dtype", "src", "arg", "tag", "marg", "base", "_shape", "shape", "size", "device", "ndim",
                       "toposort", "ranges", "vmin", "vmax"}) | UOP_BUILDERS
# attributes of the class UOp itself (the constructors)
UOP_CLASS_ATTRS = frozenset({"const", "variable", "range", "sink", "new_buffer"})
DTYPE_ATTRS = frozenset({"name", "itemsize", "kind", "priority", "np_name", "is_float", "is_int", "is_unsigned", "is_bool", "is_half",
                         "bits", "min", "max"})
DTYPES_NS_ATTRS = frozenset({n for n, v in vars(dtypes).items() if isinstance(v, DType)} | {"by_name", "all"})
OPS_ENUM_ATTRS = frozenset(Ops.__members__)
OP_ATTRS = frozenset({"name", "value"})
_NUMBER = frozenset({"real", "imag", "conjugate", "bit_length", "bit_count", "numerator", "denominator", "as_integer_ratio",
                     "is_integer"})
_STR = frozenset({"startswith", "endswith", "join", "split", "rsplit", "strip", "lstrip", "rstrip", "lower", "upper",
                  "replace", "find", "rfind", "index", "rindex", "count", "isdigit", "isalpha", "isalnum", "isidentifier",
                  "isupper", "islower", "isspace", "partition", "rpartition", "removeprefix", "removesuffix", "splitlines",
                  "zfill"})
_SEQ = frozenset({"count", "index"})
_LIST = _SEQ | {"append", "extend", "insert", "pop", "remove", "copy", "reverse", "sort", "clear"}
_DICT = frozenset({"get", "keys", "values", "items", "copy", "setdefault", "pop", "update", "clear"})
_FROZENSET = frozenset({"union", "intersection", "difference", "symmetric_difference", "issubset", "issuperset",
                        "isdisjoint", "copy"})
_SET = _FROZENSET | {"add", "discard", "remove", "pop", "update", "clear"}

# exact type -> attributes rules may read on a value of that type (subclasses are not included)
ATTRS_BY_TYPE: dict[type, frozenset[str]] = {
  UOp: UOP_ATTRS, DType: DTYPE_ATTRS, Ops: OP_ATTRS, int: _NUMBER, float: _NUMBER, bool: _NUMBER, str: _STR,
  tuple: _SEQ, list: _LIST, range: frozenset({"start", "stop", "step", "count", "index"}), dict: _DICT, set: _SET,
  frozenset: _FROZENSET, slice: frozenset({"start", "stop", "step"}),
}

# static types the checker infers (a Python type, or one of these markers; None means unknown)
UOP_CLASS, DTYPES_NS, OPS_ENUM, CTX, CALLABLE = "the class UOp", "dtypes", "Ops", "ctx", "a function"
NODES = "a tuple of nodes"      # n.src, a *rest binding: a tuple whose items are nodes


def allowed_attrs(t) -> frozenset[str] | None:
  """The attributes a value of static type `t` allows; None when only the run-time check can tell."""
  if t is None: return None
  if t == UOP_CLASS: return UOP_CLASS_ATTRS
  if t == DTYPES_NS: return DTYPES_NS_ATTRS
  if t == OPS_ENUM: return OPS_ENUM_ATTRS
  if t == CTX: return None
  if t == CALLABLE: return frozenset()
  if t == NODES: return ATTRS_BY_TYPE[tuple]
  return ATTRS_BY_TYPE.get(t, frozenset())


def element_type(t):
  """The static type of the items of a value of static type `t` (iterating or indexing it)."""
  return UOp if t == NODES else None


def attr_type(t, attr: str):
  """The static type of `obj.attr` for an obj of static type `t` (None: unknown)."""
  if t is UOp:
    if attr in ("base",): return UOp
    if attr == "op": return Ops
    if attr == "dtype": return DType
    if attr == "src": return NODES
    if attr in UOP_BUILDERS or attr == "toposort": return ("method", UOp, attr)
    return None
  if t == UOP_CLASS and attr in UOP_CLASS_ATTRS: return ("method", UOP_CLASS, attr)
  if t == DTYPES_NS and attr in DTYPES_NS_ATTRS: return DType if attr not in ("by_name", "all") else None
  if t == OPS_ENUM and attr in OPS_ENUM_ATTRS: return Ops
  return None


def call_type(t):
  """The static type of calling a value of static type `t`."""
  if isinstance(t, tuple) and t[0] == "method":
    if t[2] == "toposort": return list
    return UOp
  if t == UOP_CLASS: return UOp
  return None


def describe(obj) -> str:
  if obj is UOp: return "the class UOp"
  if obj is dtypes: return "dtypes"
  if obj is Ops: return "Ops"
  return f"a {type(obj).__name__}"


class RuleCapabilityError(AttributeError):
  """A rule read an attribute its value's type does not allow to rules."""


def rule_attr(obj: Any, name: str) -> Any:
  """`obj.name` if the allowlist of obj's type has `name`; else RuleCapabilityError. Used where the type is not known statically."""
  if obj is UOp: allowed = UOP_CLASS_ATTRS
  elif obj is dtypes: allowed = DTYPES_NS_ATTRS
  elif obj is Ops: allowed = OPS_ENUM_ATTRS
  else: allowed = ATTRS_BY_TYPE.get(type(obj))
  if allowed is None or name not in allowed:
    raise RuleCapabilityError(f"attribute {name!r} of {describe(obj)} is not available to rules")
  return getattr(obj, name)


__all__ = ["rule_helper", "is_rule_helper", "RULE_HELPERS", "rule_attr", "RuleCapabilityError", "ATTRS_BY_TYPE"]


# *** static types of rule expressions ***

def pattern_tails(p) -> set[str]:
  """Names bound by `*rest` in a pattern (tuples of nodes, not nodes)."""
  out: set[str] = set()
  stack = [p]
  while stack:
    q = stack.pop()
    if isinstance(q, A.PNode):
      if q.tail not in (None, "any"): out.add(q.tail)
      stack += A.pattern_children(q)
  return out


def static_type(e, nodes, tails, helpers, scope):
  """What the checker knows of the value of expression `e`: a type, a marker above, or None (unknown).

  nodes: names bound to nodes; tails: names bound by `*rest`; helpers: the file's helper names; scope:
  the comprehension variables in scope, a dict name -> static type (or a set: all unknown)."""
  import types

  if isinstance(e, A.EName):
    n = e.id
    if n in scope: return scope.get(n) if isinstance(scope, dict) else None
    if n == "ctx": return CTX
    if n in tails: return NODES
    if n in nodes: return UOp
    if n in helpers: return CALLABLE
    if n in BUILTINS:
      v = BUILTINS[n]
      if v is UOp: return UOP_CLASS
      if v is dtypes: return DTYPES_NS
      if v is Ops: return OPS_ENUM
      return float if isinstance(v, float) else CALLABLE
    if n in CONSTANT_NAMES: return type(CONSTANT_NAMES[n])
    return None
  if isinstance(e, A.EConst): return type(e.value)
  if isinstance(e, A.EAttr): return attr_type(static_type(e.obj, nodes, tails, helpers, scope), e.attr)
  if isinstance(e, A.ECall): return call_type(static_type(e.func, nodes, tails, helpers, scope))
  if isinstance(e, A.ESub):
    t = static_type(e.obj, nodes, tails, helpers, scope)
    if t == NODES: return NODES if isinstance(e.index, A.ESlice) else (UOp if not isinstance(e.index, A.ESeq) else None)
    return None
  if isinstance(e, A.ESeq): return {"tuple": tuple, "list": list, "set": set}[e.kind]
  if isinstance(e, A.EDict): return dict
  if isinstance(e, A.EComp): return {"list": list, "set": set, "dict": dict, "gen": types.GeneratorType}[e.kind]
  return None


def comprehension_scope(gen, nodes, tails, helpers, scope: dict) -> dict:
  """`scope` extended with the targets of one `for` clause; a single target over a tuple of nodes is a node."""
  it = static_type(gen.iter, nodes, tails, helpers, scope)
  et = element_type(it) if len(gen.targets) == 1 else None
  return {**scope, **{t: et for t, _ in gen.targets}}


def describe_type(t) -> str:
  if isinstance(t, str): return t
  if isinstance(t, tuple): return f"the method {t[2]}"
  return f"a {t.__name__}" if isinstance(t, type) else str(t)
