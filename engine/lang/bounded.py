"""The operators and builtins whose work a rule could make unbounded (`9 ** 9 ** 9`, `range(10 ** 12)`,
`[x] * 10 ** 9`, `"%0999999999d" % 1`), checked against engine/lang/limits.py. Generated matchers and the reference
interpreter call these where the checker cannot tell that the operands are nodes or floats; a refusal is a
RuleBudgetError, which the matcher reports as a RuleRuntimeError naming the rule and where it is."""
from __future__ import annotations

from rulec.engine.lang.limits import MAX_INT_BITS, MAX_ITEMS


class RuleBudgetError(Exception):
  """A guard or replacement asked for more work than a rule may do (engine/lang/limits.py)."""


_INTS = (int, bool)
_SEQS = (str, bytes, list, tuple)


def _too_big(bits: int, what: str):
  if bits > MAX_INT_BITS: raise RuleBudgetError(f"{what} would make an int of about {bits} bits (the limit is {MAX_INT_BITS})")


def rule_pow(a, b):
  """a ** b, refusing an int result of more than MAX_INT_BITS bits."""
  if type(a) in _INTS and type(b) in _INTS and b > 0 and abs(a) > 1: _too_big(b * (abs(a).bit_length() - 1), "**")
  return a ** b


def rule_lshift(a, b):
  """a << b, likewise."""
  if type(a) in _INTS and type(b) in _INTS and a and b > 0: _too_big(b + abs(a).bit_length(), "<<")
  return a << b


def rule_mul(a, b):
  """a * b, refusing an int of more than MAX_INT_BITS bits and a repeated sequence of more than MAX_ITEMS items."""
  ta, tb = type(a), type(b)
  if ta in _INTS and tb in _INTS: _too_big(abs(a).bit_length() + abs(b).bit_length(), "*")
  elif (ta in _SEQS and tb in _INTS and len(a) * b > MAX_ITEMS) or (tb in _SEQS and ta in _INTS and len(b) * a > MAX_ITEMS):
    raise RuleBudgetError(f"* would repeat a sequence to more than {MAX_ITEMS} items")
  return a * b


def rule_mod(a, b):
  """a % b; a string on the left (printf-style formatting, whose width can be any size) is refused."""
  if type(a) in (str, bytes): raise RuleBudgetError("% formatting of a string is not available to rules")
  return a % b


def rule_range(*args):
  """range(...), refusing one of more than MAX_ITEMS items."""
  r = range(*args)
  try: n = len(r)
  except OverflowError: n = MAX_ITEMS + 1
  if n > MAX_ITEMS: raise RuleBudgetError(f"range of {args} has more than {MAX_ITEMS} items")
  return r


# the checked forms of the binary operators that can make unbounded work (the compiler and interpreter use them)
CHECKED_BINOPS = {"**": rule_pow, "<<": rule_lshift, "*": rule_mul, "%": rule_mod}
