"""The AST of a .rules file: attrs classes, each carrying the Span it came from.

Patterns (P*) describe the graph shape a rule matches; expressions (E*) are
the guard and the replacement, a safe subset of Python expressions.
"""
from __future__ import annotations

from typing import Any

import attrs


@attrs.frozen
class Span:
  file: str
  line: int
  col: int
  end_line: int
  end_col: int

  def __str__(self): return f"{self.file}:{self.line}:{self.col}"


# *** patterns ***

@attrs.frozen
class PName:
  """A bare name: binds any node (`_` binds nothing). A name used twice means the same node."""
  span: Span
  name: str
  dtypes: tuple[tuple[str, Span], ...] | None = None


@attrs.frozen
class PConst:
  """A literal: a CONST node whose arg equals `value`."""
  span: Span
  value: Any
  dtypes: tuple[tuple[str, Span], ...] | None = None
  name: str | None = None
  name_span: Span | None = None


@attrs.frozen
class PNode:
  """An op (or alternation / group) with optional sources, arg and dtype constraints.

  srcs None means any sources. `tail` is None (exactly these sources), "any"
  (`..`: any further sources) or the name bound to the remaining sources
  (`*rest`). `each` is a pattern every source must match.
  """
  span: Span
  ops: tuple[tuple[str, Span], ...]
  srcs: tuple[Any, ...] | None = None
  tail: str | None = None
  tail_span: Span | None = None
  each: Any = None
  has_arg: bool = False
  arg: Any = None
  dtypes: tuple[tuple[str, Span], ...] | None = None
  name: str | None = None
  name_span: Span | None = None


Pattern = PName | PConst | PNode


# *** expressions ***

@attrs.frozen
class EName:
  span: Span
  id: str

@attrs.frozen
class EConst:
  span: Span
  value: Any

@attrs.frozen
class EAttr:
  span: Span
  obj: Any
  attr: str
  attr_span: Span

@attrs.frozen
class EKeyword:
  span: Span
  name: str
  value: Any

@attrs.frozen
class EStarred:
  span: Span
  value: Any
  double: bool = False

@attrs.frozen
class ECall:
  span: Span
  func: Any
  args: tuple[Any, ...]      # expressions, EKeyword, EStarred

@attrs.frozen
class ESlice:
  span: Span
  lo: Any
  hi: Any
  step: Any

@attrs.frozen
class ESub:
  span: Span
  obj: Any
  index: Any                 # an expression, ESlice, or ETuple of those

@attrs.frozen
class ESeq:
  span: Span
  kind: str                  # "tuple" | "list" | "set"
  elts: tuple[Any, ...]

@attrs.frozen
class EDict:
  span: Span
  keys: tuple[Any, ...]
  values: tuple[Any, ...]

@attrs.frozen
class EBin:
  span: Span
  op: str                    # the Python operator text: "+", "//", "<<", ...
  left: Any
  right: Any

@attrs.frozen
class EUnary:
  span: Span
  op: str                    # "-", "+", "~", "not"
  operand: Any

@attrs.frozen
class EBool:
  span: Span
  op: str                    # "and" | "or"
  values: tuple[Any, ...]

@attrs.frozen
class ECompare:
  span: Span
  left: Any
  ops: tuple[str, ...]       # "<", "in", "not in", "is", "is not", ...
  rights: tuple[Any, ...]

@attrs.frozen
class ECond:
  span: Span
  test: Any
  body: Any
  orelse: Any

@attrs.frozen
class CompFor:
  span: Span
  targets: tuple[tuple[str, Span], ...]
  iter: Any
  ifs: tuple[Any, ...]

@attrs.frozen
class EComp:
  span: Span
  kind: str                  # "list" | "set" | "gen" | "dict"
  elt: Any                   # for dict: (key, value)
  gens: tuple[CompFor, ...]

@attrs.frozen
class ELambda:                # parsed only so the checker can reject it with a location
  span: Span

@attrs.frozen
class EWalrus:                # likewise
  span: Span


# *** file structure ***

@attrs.frozen
class Example:
  """`example: INPUT => EXPECTED` under a rule: concrete graphs in pattern syntax.

  `expected` is None for `=> unchanged`. Checked by `rulec check`
  (engine/lang/examples.py), never when a matcher is loaded."""
  span: Span
  input: Pattern
  expected: Pattern | None
  expected_span: Span


@attrs.frozen
class Rule:
  span: Span
  name: str
  named: bool                # True when the file gave the name
  pattern: Pattern
  guard: Any                 # expression or None
  replacement: Any
  ruleset: str
  source_line: str           # the rule's first line, for error messages and generated comments
  examples: tuple[Example, ...] = ()
  grad: str | None = None    # in a `gradients` set: the name of the incoming gradient


@attrs.frozen
class RuleSet:
  span: Span
  name: str
  includes: tuple[tuple[str, Span], ...]
  rules: tuple[Rule, ...]
  grad: tuple[str, Span] | None = None   # `gradients NAME(g):` sets: the incoming gradient's name
  extends: tuple[str, Span] | None = None  # `ruleset NAME extends BASE:`: BASE, a set of a layer beneath


@attrs.frozen
class UseLine:
  span: Span
  module: str
  module_span: Span
  names: tuple[tuple[str, Span], ...]


@attrs.frozen
class RuleFile:
  path: str
  source: str
  uses: tuple[UseLine, ...]
  rulesets: tuple[RuleSet, ...]


def pattern_children(p: Pattern) -> list[Pattern]:
  if isinstance(p, PNode): return list(p.srcs or ()) + ([p.each] if p.each is not None else [])
  return []


def iter_exprs(e: Any):
  """Every expression node under `e`, `e` included (pre-order)."""
  stack = [e]
  while stack:
    x = stack.pop()
    if x is None: continue
    if isinstance(x, tuple): stack.extend(reversed(x)); continue
    yield x
    if isinstance(x, EAttr): stack.append(x.obj)
    elif isinstance(x, (EKeyword, EStarred)): stack.append(x.value)
    elif isinstance(x, ECall): stack.extend(reversed((x.func,) + x.args))
    elif isinstance(x, ESlice): stack.extend([x.step, x.hi, x.lo])
    elif isinstance(x, ESub): stack.extend([x.index, x.obj])
    elif isinstance(x, ESeq): stack.extend(reversed(x.elts))
    elif isinstance(x, EDict): stack.extend(reversed(x.keys + x.values))
    elif isinstance(x, EBin): stack.extend([x.right, x.left])
    elif isinstance(x, EUnary): stack.append(x.operand)
    elif isinstance(x, EBool): stack.extend(reversed(x.values))
    elif isinstance(x, ECompare): stack.extend(reversed((x.left,) + x.rights))
    elif isinstance(x, ECond): stack.extend([x.orelse, x.body, x.test])
    elif isinstance(x, EComp):
      for g in reversed(x.gens): stack.extend(reversed((g.iter,) + g.ifs))
      stack.append(x.elt)


def expr_children(x: Any) -> list:
  """The direct sub-expressions of an expression node (comprehension clauses included)."""
  if isinstance(x, tuple): return list(x)
  if isinstance(x, EAttr): return [x.obj]
  if isinstance(x, (EKeyword, EStarred)): return [x.value]
  if isinstance(x, ECall): return [x.func, *x.args]
  if isinstance(x, ESlice): return [x.lo, x.hi, x.step]
  if isinstance(x, ESub): return [x.obj, x.index]
  if isinstance(x, ESeq): return list(x.elts)
  if isinstance(x, EDict): return list(x.keys + x.values)
  if isinstance(x, EBin): return [x.left, x.right]
  if isinstance(x, EUnary): return [x.operand]
  if isinstance(x, EBool): return list(x.values)
  if isinstance(x, ECompare): return [x.left, *x.rights]
  if isinstance(x, ECond): return [x.test, x.body, x.orelse]
  if isinstance(x, EComp):
    out = [x.elt]
    for g in x.gens: out += [g.iter, *g.ifs]
    return out
  return []


def deepest(root: Any, children, limit: int) -> Any | None:
  """The first node found more than `limit` levels below `root` (None if there is none); no recursion."""
  stack = [(root, 1, root)]
  while stack:
    x, d, spanned = stack.pop()
    if x is None: continue
    if hasattr(x, "span"): spanned = x
    if d > limit: return spanned
    stack.extend((c, d + (0 if isinstance(x, tuple) else 1), spanned) for c in children(x))
  return None
