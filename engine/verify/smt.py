"""UOp graphs as z3 terms, with the IR's exact meaning of each op (engine/ir/alu.py, the NUMPY device).

`Terms().value(u)` is a z3 term for the value of a scalar (index-level) graph: its free leaves (RANGE,
DEFINE_VAR) become z3 variables, constrained by `constraints()` to the bounds the graph gives them. The
sorts follow the dtype:

- bool: a z3 Bool;
- the integers (index included, 64 bits wide): bit-vectors of the dtype's width. ADD, SUB, MUL, NEG wrap
  around; IDIV and MOD are floor division and floor modulo, CDIV and CMOD truncating division and the C
  remainder, all four giving 0 for a zero divisor (numpy's answer) and INT_MIN for INT_MIN / -1; SHL / SHR by
  a negative amount leave the value alone, past the width SHL gives 0 and SHR 0 or -1 (arithmetic for signed
  dtypes, logical for unsigned ones); comparisons and MAX are signed or unsigned by the dtype;
- the floats: z3's IEEE floating-point sorts (float16, bfloat16, float32, float64), every op rounding to
  nearest-even once, as numpy computes in the dtype. MOD is numpy's remainder (the C fmod, then moved into
  the divisor's sign, a zero taking the divisor's sign), IDIV numpy's floor of the rounded quotient, MAX
  Python's max (the first operand unless the second is larger, so a NaN first operand stays);
- casts: integer to integer wraps, a float to an integer truncates and wraps around (NaN and infinities give
  0, as engine/ir/alu.py's wrap and the NUMPY device do), an integer to a float rounds once to nearest-even,
  anything to bool is "not zero" (NaN is True).

EXP2, LOG2, SIN and float POW are device-defined (engine/ir/alu.py DEVICE_DEFINED): each is an unknown function
here (z3's uninterpreted functions), except where IEEE 754 fixes pow's value (pow(x, 0) and pow(1, y) are 1).
A proof through one holds whatever the device computes for it. What the translation has no meaning for (an
op of kernel structure, THREEFRY, a MULACC whose rounding the device picks) raises `Untranslatable`.

z3's floating-point theory has one NaN, without sign or payload: "is NaN" is all a rule can rely on here,
as numpy gives no other guarantee either (NaN's sign bit shows only through copysign and BITCAST).

Three translations share this meaning: `Terms` (bit-vectors and floats, scalar graphs), `TensorTerms` (tensor-
and kernel-level graphs: a value is a function of its index) and `IntTerms` (linear integer arithmetic in z3's
unbounded integers, wrapped back into each dtype: where 64-bit division by constants is quick to prove).
"""
from __future__ import annotations

import math
import struct

import numpy as np
import z3

from rulec.engine.ir.alu import DEVICE_DEFINED, wrap
from rulec.engine.ir.dtypes import DType
from rulec.engine.ir.ops import Ops
from rulec.engine.ir.uop import UOp


class Untranslatable(Exception):
  """The graph has an op (or a form of one) the translation has no exact meaning for."""


# (exponent bits, significand bits with the implicit one) of each float dtype
FLOAT_SORTS = {"float16": (5, 11), "bfloat16": (8, 8), "float32": (8, 24), "float64": (11, 53)}
RNE = z3.RNE()


def sort_of(dt: DType):
  if dt.kind == "b": return z3.BoolSort()
  if dt.kind in "iux": return z3.BitVecSort(dt.bits)
  if dt.kind == "f": return z3.FPSort(*FLOAT_SORTS[dt.name])
  raise Untranslatable(f"no value of dtype {dt.name}")


def signed(dt: DType) -> bool: return dt.kind in "ix"


# *** constants ***

def const_term(value, dt: DType):
  """A Python scalar as the z3 constant dtype dt holds it (integers wrapped, floats rounded)."""
  v = wrap(value, dt)
  if dt.kind == "b": return z3.BoolVal(bool(v))
  if dt.kind in "iux": return z3.BitVecVal(v % (1 << dt.bits), dt.bits)
  s = sort_of(dt)
  if math.isnan(v): return z3.fpNaN(s)
  if math.isinf(v): return z3.fpPlusInfinity(s) if v > 0 else z3.fpMinusInfinity(s)
  if v == 0: return z3.fpMinusZero(s) if math.copysign(1.0, v) < 0 else z3.fpPlusZero(s)
  return z3.FPVal(v, None, s)   # v already holds a value of the dtype: exact


def python_value(term, dt: DType):
  """A z3 constant (a model's value) as the Python value engine/ir/alu.py computes with."""
  if dt.kind == "b": return z3.is_true(term)
  if dt.kind in "iux":
    v = term.as_long()
    return v - (1 << dt.bits) if signed(dt) and v >= 1 << (dt.bits - 1) else v
  if z3.is_fp_value(term) and term.isNaN(): return math.nan
  bits = z3.simplify(z3.fpToIEEEBV(term)).as_long()
  if dt.name == "float64": return struct.unpack("<d", bits.to_bytes(8, "little"))[0]
  if dt.name == "float32": return struct.unpack("<f", bits.to_bytes(4, "little"))[0]
  if dt.name == "float16": return struct.unpack("<e", bits.to_bytes(2, "little"))[0]
  return struct.unpack("<f", (bits << 16).to_bytes(4, "little"))[0]   # bfloat16: the top half of a float32


def same_value(a, b, dt: DType):
  """The two values are equal: bit for bit, except that any NaN equals any NaN (-0.0 and 0.0 differ)."""
  if dt.kind == "f": return z3.Or(a == b, z3.And(z3.fpIsNaN(a), z3.fpIsNaN(b)))
  return a == b


# *** integer ops ***

def _zero(n: int): return z3.BitVecVal(0, n)


def floor_of(q, r, a, b):
  """Floor division from the truncating quotient q and remainder r of a / b (signed, b != 0): where the
  quotient is negative and inexact, truncation rounded it up, so floor is one lower."""
  return z3.If(z3.And(r != 0, (a < 0) != (b < 0)), q - 1, q)


def floor_rem(r, b):
  """Floor modulo from the truncating remainder r (the sign of the dividend): moved into the divisor's sign."""
  return z3.If(z3.And(r != 0, (r < 0) != (b < 0)), r + b, r)


def int_pow(a, b, is_signed: bool, exponent: int | None):
  """a ** b as engine/ir/alu.py's _pow, wrapped (modulo 2**bits); exponent: b's value when it is a constant."""
  n = a.size()
  one = z3.BitVecVal(1, n)
  if exponent is not None:
    if exponent < 0:   # 1 / a**|b| truncated: 1 for a = 1, +-1 for a = -1, else 0
      neg_one = z3.BitVecVal(-1 % (1 << n), n)
      sign = one if exponent % 2 == 0 else neg_one
      return z3.If(a == one, one, z3.If(a == neg_one, sign, _zero(n))) if is_signed else z3.If(a == one, one, _zero(n))
    out, base, k = one, a, exponent % (1 << n)
    while k:
      if k & 1: out = out * base
      base, k = base * base, k >> 1
    return out
  if not z3.is_bv_value(z3.simplify(a)):
    raise Untranslatable("POW of integers with neither base nor exponent a constant")
  # square and multiply over every bit of b (the base is a constant: the products fold)
  out, base = one, a
  for i in range(n):
    out = z3.If(z3.Extract(i, i, b) == 1, out * base, out)
    base = base * base
  if not is_signed: return out
  neg_one = z3.BitVecVal(-1 % (1 << n), n)
  negative = z3.If(a == one, one, z3.If(a == neg_one, z3.If(z3.Extract(0, 0, b) == 0, one, neg_one), _zero(n)))
  return z3.If(b < 0, negative, out)


# *** float ops ***

def fmod(a, b):
  """C's fmod (exact: the sign of a, smaller than |b|), from z3's IEEE remainder (the quotient rounded to
  nearest): where the two differ, they differ by |b|, and the sum is exact because the result is representable."""
  r = z3.fpRem(a, b)
  same_sign = z3.Or(z3.fpIsZero(r), z3.fpIsNegative(r) == z3.fpIsNegative(a))
  return z3.If(same_sign, r, z3.If(z3.fpIsNegative(a), z3.fpSub(RNE, r, z3.fpAbs(b)), z3.fpAdd(RNE, r, z3.fpAbs(b))))


def float_mod(a, b, m):
  """numpy's remainder (npy_divmod) from m = fmod(a, b): where m is nonzero and its sign is not the divisor's, plus
  the divisor (one rounding: -1e-20 % 1.0 is 1.0); a zero takes the divisor's sign; a zero divisor gives NaN."""
  s = a.sort()
  zero_with_b_sign = z3.If(z3.fpIsNegative(b), z3.fpMinusZero(s), z3.fpPlusZero(s))
  moved = z3.If(z3.fpLT(b, z3.fpPlusZero(s)) != z3.fpLT(m, z3.fpPlusZero(s)), z3.fpAdd(RNE, m, b), m)
  return z3.If(z3.fpIsZero(b), z3.fpNaN(s), z3.If(z3.fpIsZero(m), zero_with_b_sign, moved))


def float_floor_div(a, b):
  """engine/ir/alu.py float_alu's IDIV: floor of the rounded quotient, + 0.0 (never -0.0); a quotient that is not
  finite passes through (1 // -0.0 is -inf, 0 // 0 and NaN // 0 NaN, as IEEE 754 divides)."""
  return z3.fpAdd(RNE, z3.fpRoundToIntegral(z3.RTN(), z3.fpDiv(RNE, a, b)), z3.fpPlusZero(a.sort()))


def float_to_int(x, src: DType, dt: DType):
  """A float cast to an integer dtype: truncated toward zero, wrapped around (modulo 2**bits), NaN and the
  infinities 0. The truncated value is taken exactly at a width that holds every finite value of the float
  dtype (its largest exponent + 2 bits), then cut to the dtype's width."""
  ebits, _ = FLOAT_SORTS[src.name]
  wide = (1 << (ebits - 1)) + 2
  exact = z3.fpToSBV(z3.RTZ(), x, z3.BitVecSort(wide))
  low = z3.Extract(dt.bits - 1, 0, exact) if wide >= dt.bits else z3.SignExt(dt.bits - wide, exact)
  return z3.If(z3.Or(z3.fpIsNaN(x), z3.fpIsInf(x)), _zero(dt.bits), low)


def cast(x, src: DType, dt: DType):
  if src is dt: return x
  if dt.kind == "b":
    if src.kind == "b": return x
    if src.kind == "f": return z3.Not(z3.fpIsZero(x))   # (NaN is not zero: True)
    return x != 0
  if src.kind == "b":
    if dt.kind == "f": return z3.If(x, const_term(1.0, dt), const_term(0.0, dt))
    return z3.If(x, z3.BitVecVal(1, dt.bits), _zero(dt.bits))
  if dt.kind in "iux":
    if src.kind == "f": return float_to_int(x, src, dt)
    if dt.bits <= src.bits: return z3.Extract(dt.bits - 1, 0, x) if dt.bits < src.bits else x
    return (z3.SignExt if signed(src) else z3.ZeroExt)(dt.bits - src.bits, x)
  if dt.kind == "f":
    if src.kind == "f": return z3.fpToFP(RNE, x, sort_of(dt))
    return (z3.fpSignedToFP if signed(src) else z3.fpUnsignedToFP)(RNE, x, sort_of(dt))
  raise Untranslatable(f"CAST from {src.name} to {dt.name}")


def bitcast(x, src: DType, dt: DType):
  if src.itemsize != dt.itemsize or "b" in (src.kind, dt.kind): raise Untranslatable(f"BITCAST from {src.name} to {dt.name}")
  bits = z3.fpToIEEEBV(x) if src.kind == "f" else x
  return z3.fpBVToFP(bits, sort_of(dt)) if dt.kind == "f" else bits


def combine(rop: Ops, dt: DType, parts: list, device_order=None):
  """The values of a reduce's elements (in index order) combined by rop (ADD, MUL, MAX); the identity when there
  are none. A float reduce of several elements adds (or compares) in an order the device picks, so its rounding is
  the device's: `device_order(rop, dt, n)` gives an unknown function of the n elements standing for it (only the
  max of equal values has one answer)."""
  from rulec.engine.ir.alu import identity_element
  if not parts: return const_term(identity_element(rop, dt), dt)
  if dt.kind == "f" and len(parts) > 1:
    if rop is Ops.MAX and all(z3.eq(p, parts[0]) for p in parts): return parts[0]
    if device_order is None: raise Untranslatable("a float reduce of several elements (its order is the device's)")
    return device_order(rop, dt, len(parts))(*parts)
  acc = parts[0]
  for v in parts[1:]:
    if dt.kind == "b": acc = z3.Or(acc, v) if rop in (Ops.ADD, Ops.MAX) else z3.And(acc, v)
    elif dt.kind == "f":
      if rop is Ops.ADD: acc = z3.fpAdd(RNE, acc, v)
      elif rop is Ops.MUL: acc = z3.fpMul(RNE, acc, v)
      else: acc = z3.If(z3.fpGT(v, acc), v, acc)
    elif rop is Ops.ADD: acc = acc + v
    elif rop is Ops.MUL: acc = acc * v
    elif rop is Ops.MAX: acc = z3.If((acc < v) if signed(dt) else z3.ULT(acc, v), v, acc)
    else: raise Untranslatable(f"a reduce of {rop}")
  return acc


# *** graphs ***

class Terms:
  """z3 terms for the values of scalar UOp graphs; one instance names each free leaf once, so the graphs before
  and after a rewrite share their variables. `device_ops` collects the device-defined ops met (EXP2, ...).

  Integer division is where a bit-vector solver struggles (a 64-bit divider is a large circuit), so a quotient
  and remainder are fresh variables tied to their operands by constraints (`definitions`, to be asserted with
  the terms):
  - with abstract=True, only by facts of truncating division: r is 0 or has a's sign, |r| < |b|, and for a
    constant divisor c, a = q*c + r (wrapping: a multiplication by a constant). A proof under fewer constraints
    is a proof; a counterexample may not be one, so the caller asks again with abstract=False;
  - with abstract=False, exactly: by a constant c, a = q*c + r at n+3 bits with q bounded, where nothing wraps
    (so q is the quotient), with the facts above; by a variable, z3's own bvsdiv / bvsrem (bvudiv / bvurem)."""

  def __init__(self, abstract: bool = False, opaque: frozenset = frozenset()):
    self.abstract = abstract
    self.opaque = opaque           # nodes standing for any value of their dtype (see prove.py generalize)
    self.memo: dict[UOp, object] = {}
    self.leaves: dict[UOp, object] = {}
    self.bound_ranges: set[UOp] = set()   # the RANGEs a REDUCE runs over: no free leaves
    self.functions: dict[tuple, object] = {}
    self.device_ops: set[str] = set()
    self.definitions: list = []
    self.divisions: dict[tuple, tuple] = {}
    self.division_operands: dict[tuple, tuple] = {}
    self.fmods: dict[tuple, object] = {}
    self.abstractions = 0          # values replaced by variables with some of their facts (abstract=True)

  def leaf(self, u: UOp):
    if u not in self.leaves:
      name = f"r{u.arg[0]}" if u.op is Ops.RANGE else str(u.arg[0])
      self.leaves[u] = z3.Const(f"{name}!{len(self.leaves)}", sort_of(u.dtype))
    return self.leaves[u]

  def constraints(self) -> list:
    """Each leaf within the bounds its node gives it: a RANGE(n) in [0, n), a DEFINE_VAR in [lo, hi]."""
    out = []
    for u, v in self.leaves.items():
      if u in self.bound_ranges or u in self.opaque: continue
      if u.op is Ops.RANGE:
        end = u.src[0]
        if end.op is not Ops.CONST: raise Untranslatable("a RANGE whose size is not a constant")
        out.append(z3.And(v >= 0, v < const_term(end.arg, u.dtype)) if end.arg > 0 else z3.BoolVal(False))
        continue
      lo, hi = u.arg[1], u.arg[2]
      if u.dtype.kind == "b":
        if lo == hi: out.append(v == z3.BoolVal(bool(lo)))
      elif u.dtype.kind == "f":
        if not (lo == -math.inf and hi == math.inf):   # the whole line: NaN too
          out.append(z3.And(z3.fpLEQ(const_term(lo, u.dtype), v), z3.fpLEQ(v, const_term(hi, u.dtype))))
      else:
        le = (lambda a, b: a <= b) if signed(u.dtype) else z3.ULE
        out.append(z3.And(le(const_term(lo, u.dtype), v), le(v, const_term(hi, u.dtype))))
    return out

  def reduce_function(self, rop: Ops, dt: DType, n: int):
    """A float reduce of n elements: an unknown function of them, in index order (the device's order of operations)."""
    key = ("reduce", rop, dt, n)
    if key not in self.functions:
      s = sort_of(dt)
      self.functions[key] = z3.Function(f"reduce_{rop.name.lower()}_{dt.name}_{n}", *([s] * n), s)
    self.device_ops.add(f"a float REDUCE of {rop.name} (its order of operations)")
    return self.functions[key]

  def function(self, op: Ops, dt: DType, arity: int):
    key = (op, dt)
    if key not in self.functions:
      s = sort_of(dt)
      self.functions[key] = z3.Function(f"{op.name.lower()}_{dt.name}", *([s] * arity), s)
    self.device_ops.add(op.name)
    return self.functions[key]

  def differ(self, before: UOp, after: UOp):
    """The condition that the two graphs' values differ."""
    self.root_values = (self.value(before), self.value(after))
    return z3.Not(same_value(*self.root_values, before.dtype))

  def witness(self, model) -> tuple[tuple, object, object]:
    """Where a model of `differ` makes the values differ: (the index, the value before, the value after)."""
    return (), self.root_values[0], self.root_values[1]

  def value(self, root: UOp):
    for u in root.toposort(gate=lambda n: n not in self.opaque and n.op is not Ops.INDEX):   # (INDEX: see _index)
      if u in self.memo: continue
      if u in self.opaque:
        self.memo[u] = z3.Const(f"opaque!{len(self.memo)}", sort_of(u.dtype))
        self.leaves[u] = self.memo[u]
      elif u.op is Ops.REDUCE: self.memo[u] = self._reduce_ranges(u)
      elif u.op is Ops.INDEX: self.memo[u] = self._index(u)
      else: self.memo[u] = self._node(u, [self.memo[s] for s in u.src])
    return self.memo[root]

  def _index(self, u: UOp):
    raise Untranslatable("INDEX of a value outside a tensor graph")

  def _reduce_ranges(self, u: UOp):
    """A kernel's REDUCE(value, *ranges)[op]: the value at every point of its ranges (constant sizes), combined."""
    value, ranges = u.src[0], u.src[1:]
    sizes = self._range_sizes(ranges, "a REDUCE")
    count = math.prod(sizes)
    if count > REDUCE_LIMIT: raise Untranslatable(f"a REDUCE over {count} points (more than {REDUCE_LIMIT})")
    parts = self.at_points(value, ranges, sizes, lambda: self.value(value))
    return combine(u.arg, u.dtype, parts, self.reduce_function)

  def _range_sizes(self, ranges: tuple, what: str) -> list[int]:
    """The constant sizes of the RANGEs a REDUCE or an END runs over (they bind them: no free leaves)."""
    sizes = []
    for r in ranges:
      if r.op is not Ops.RANGE or r.src[0].op is not Ops.CONST: raise Untranslatable(f"{what} over something else than a RANGE of constant size")
      sizes.append(r.src[0].arg)
      self.bound_ranges.add(r)
    return sizes

  def at_points(self, graph: UOp, ranges: tuple, sizes: list, term) -> list:
    """term() at every point of the ranges, each range a constant there: the nodes of graph that read a range are
    translated again at each point (not a term of the range substituted afterwards: a division's quotient and
    remainder are variables whose definitions read their operands, and each point needs its own)."""
    reads = set(ranges)
    for n in graph.toposort():
      if any(x in reads for x in n.src): reads.add(n)
    saved = {n: self.memo.pop(n) for n in reads if n in self.memo}
    out = []
    at_memo = getattr(self, "at_memo", {})   # (TensorTerms: elements of values, by node and index)
    for point in np.ndindex(*sizes):
      for n in reads: self.memo.pop(n, None)
      for key in [key for key in at_memo if key[0] in reads]: del at_memo[key]
      for r, k in zip(ranges, point): self.memo[r] = const_term(int(k), r.dtype)
      out.append(term())
    for n in reads: self.memo.pop(n, None)
    self.memo.update(saved)
    return out

  def _node(self, u: UOp, xs: list):
    op, dt = u.op, u.dtype
    if op in (Ops.RANGE, Ops.DEFINE_VAR): return self.leaf(u)
    if op is Ops.CONST:
      if not isinstance(u.arg, (bool, int, float)): raise Untranslatable(f"a CONST of {type(u.arg).__name__}")
      return const_term(u.arg, dt)
    if op is Ops.CAST: return cast(xs[0], u.src[0].dtype, dt)
    if op is Ops.BITCAST: return bitcast(xs[0], u.src[0].dtype, dt)
    if op is Ops.WHERE: return z3.If(xs[0], xs[1], xs[2])
    if op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ): return self._compare(op, u.src[0].dtype, xs)
    if dt.kind == "b": return self._logic(op, xs)
    if dt.kind in "iux": return self._int(u, xs)
    if dt.kind == "f": return self._float(u, xs)
    raise Untranslatable(f"{op.name} of dtype {dt.name}")

  @staticmethod
  def _compare(op: Ops, dt: DType, xs: list):
    a, b = xs
    if dt.kind == "f":
      if op is Ops.CMPLT: return z3.fpLT(a, b)
      return z3.fpEQ(a, b) if op is Ops.CMPEQ else z3.Not(z3.fpEQ(a, b))   # (IEEE: NaN equals nothing, -0.0 == 0.0)
    if op is Ops.CMPEQ: return a == b
    if op is Ops.CMPNE: return a != b
    if dt.kind == "b": return z3.And(z3.Not(a), b)   # False < True
    return a < b if signed(dt) else z3.ULT(a, b)

  @staticmethod
  def _logic(op: Ops, xs: list):
    """Ops on bools: numpy's, as engine/tensor_eval.py lists them (ADD is or, MUL and, SUB not-equal, NEG identity)."""
    if op in (Ops.AND, Ops.MUL): return z3.And(*xs)
    if op in (Ops.OR, Ops.ADD, Ops.MAX): return z3.Or(*xs)
    if op in (Ops.XOR, Ops.SUB): return z3.Xor(*xs)
    if op is Ops.NEG: return xs[0]
    raise Untranslatable(f"{op.name} on bool")

  def _int(self, u: UOp, xs: list):
    op, sgn = u.op, signed(u.dtype)
    if op is Ops.ADD: return xs[0] + xs[1]
    if op is Ops.SUB: return xs[0] - xs[1]
    if op is Ops.MUL: return xs[0] * xs[1]
    if op is Ops.NEG: return -xs[0]
    if op is Ops.MULACC:
      if u.arg is not None: raise Untranslatable(f"MULACC marked {u.arg!r}")
      return xs[0] * xs[1] + xs[2]
    if op in (Ops.IDIV, Ops.MOD, Ops.CDIV, Ops.CMOD): return self._division(u, xs)
    if op is Ops.MAX:
      a, b = xs
      return z3.If((a < b) if sgn else z3.ULT(a, b), b, a)
    if op is Ops.AND: return xs[0] & xs[1]
    if op is Ops.OR: return xs[0] | xs[1]
    if op is Ops.XOR: return xs[0] ^ xs[1]
    if op in (Ops.SHL, Ops.SHR):
      a, b = xs
      shifted = (a << b) if op is Ops.SHL else (a >> b) if sgn else z3.LShR(a, b)   # (>>: arithmetic)
      return z3.If(b < 0, a, shifted) if sgn else shifted
    if op is Ops.POW:
      e = u.src[1]
      return int_pow(xs[0], xs[1], sgn, wrap(e.arg, e.dtype) if e.op is Ops.CONST else None)
    raise Untranslatable(f"{op.name} on {u.dtype.name}")

  def _division(self, u: UOp, xs: list):
    """IDIV, MOD (floor), CDIV, CMOD (truncating) of integers; 0 for a zero divisor."""
    (a, b), sgn, n = xs, signed(u.dtype), u.dtype.bits
    d = u.src[1]
    divisor = wrap(d.arg, d.dtype) if d.op is Ops.CONST else None
    if divisor == 0: return _zero(n)
    q, r = self._truncating(a, b, sgn, divisor)
    if u.op is Ops.CDIV: out = q
    elif u.op is Ops.CMOD: out = r
    elif not sgn: out = q if u.op is Ops.IDIV else r   # (unsigned: truncation is floor)
    else:
      out = floor_of(q, r, a, b) if u.op is Ops.IDIV else floor_rem(r, b)
      if self.abstract and u.op is Ops.MOD:   # (what the solver would have to work out: the divisor's sign, below |b|)
        magnitude = lambda v: z3.If(v < 0, -v, v)   # noqa: E731
        self.definitions += [z3.Implies(b != 0, z3.And(z3.Or(out == 0, (out < 0) == (b < 0)), z3.ULT(magnitude(out), magnitude(b)))),
                             z3.Implies(b > 0, z3.And(out >= 0, out < b)), z3.Implies(b < 0, z3.And(out <= 0, out > b))]
    return out if divisor is not None else z3.If(b == 0, _zero(n), out)

  def _truncating(self, a, b, sgn: bool, divisor: int | None):
    """(quotient, remainder) of a / b truncated toward zero, for b != 0 (INT_MIN / -1 wraps to INT_MIN)."""
    key = (a.get_id(), b.get_id(), sgn)
    if key in self.divisions: return self.divisions[key]
    n, k = a.size(), len(self.divisions)
    if divisor is None and not self.abstract:
      out = (a / b, z3.SRem(a, b)) if sgn else (z3.UDiv(a, b), z3.URem(a, b))
      self.divisions[key] = out
      return out
    q, r = z3.BitVec(f"quot!{k}", n), z3.BitVec(f"rem!{k}", n)
    if self.abstract: self.abstractions += 1
    nonzero = z3.BoolVal(True) if divisor is not None else b != 0
    # facts of truncating division at the width of the operands (true also for INT_MIN / -1, which wraps)
    if sgn:
      magnitude = lambda v: z3.If(v < 0, -v, v)   # noqa: E731 (INT_MIN's is 2**(n-1), read unsigned)
      smaller = z3.ULT(magnitude(a), magnitude(b))
      facts = [z3.Or(r == 0, (r < 0) == (a < 0)), z3.ULT(magnitude(r), magnitude(b))]
    else:
      smaller = z3.ULT(a, b)
      facts = [z3.ULT(r, b), z3.ULE(q, a)]
    facts.append(z3.Implies(smaller, z3.And(q == 0, r == a)))   # |a| < |b|: the quotient is 0
    if sgn:   # (the same where a and b share a sign, without magnitudes: quicker for the solver to use)
      facts += [z3.Implies(z3.And(a >= 0, b > 0, a < b), z3.And(q == 0, r == a)),
                z3.Implies(z3.And(a <= 0, b < 0, a > b), z3.And(q == 0, r == a))]
    facts.append(z3.Implies(b == 1, z3.And(q == a, r == 0)))
    if sgn: facts.append(z3.Implies(b == -1, z3.And(q == -a, r == 0)))   # (INT_MIN / -1 wraps to INT_MIN)
    if divisor is not None: facts.append(a == q * b + r)   # (a multiplication by a constant: cheap)
    self.definitions += [z3.Implies(nonzero, f) for f in facts]
    # the same division of equal operands has equal results (what the abstraction forgets of a function)
    for (a2, b2, sgn2), (q2, r2) in self.division_operands.items():
      if sgn2 == sgn and a2.size() == n:
        self.definitions.append(z3.Implies(z3.And(a == a2, b == b2), z3.And(q == q2, r == r2)))
    self.division_operands[(a, b, sgn)] = (q, r)
    if divisor is not None and not self.abstract:
      # the exact definition: with |q| <= 2**n // |c| + 1, |q*c + r| < 2**n + 2|c| < 2**(n+2), so at n+3 bits
      # nothing wraps and q is a's quotient (also 2**(n-1) for INT_MIN / -1, whose n bits wrap to INT_MIN)
      w = n + 3
      wq, wr = z3.BitVec(f"wquot!{k}", w), z3.BitVec(f"wrem!{k}", w)
      wa = (z3.SignExt if sgn else z3.ZeroExt)(w - n, a)
      limit = z3.BitVecVal((1 << n) // abs(divisor) + 1, w)
      self.definitions += [wa == wq * z3.BitVecVal(divisor, w) + wr, -limit <= wq, wq <= limit,
                           z3.Or(wr == 0, (wr < 0) == (wa < 0)), z3.If(wr < 0, -wr, wr) < abs(divisor),
                           q == z3.Extract(n - 1, 0, wq), r == z3.Extract(n - 1, 0, wr)]
    out = (q, r)
    self.divisions[key] = out
    return out

  def fmod(self, a, b):
    """C's fmod; with abstract=True a variable with its facts (z3 is slow to reason about fp.rem): NaN exactly for a
    NaN operand, an infinite dividend or a zero divisor; otherwise the dividend's sign, smaller than |b|, and the
    dividend itself where that is smaller than |b| already."""
    if not self.abstract: return fmod(a, b)
    key = (a.get_id(), b.get_id())
    if key in self.fmods: return self.fmods[key]
    f = self.fmods[key] = z3.FP(f"fmod!{len(self.fmods)}", a.sort())
    self.abstractions += 1
    nan = z3.Or(z3.fpIsNaN(a), z3.fpIsNaN(b), z3.fpIsInf(a), z3.fpIsZero(b))
    self.definitions += [nan == z3.fpIsNaN(f),
                         z3.Implies(z3.Not(nan), z3.And(z3.fpIsNegative(f) == z3.fpIsNegative(a), z3.fpLT(z3.fpAbs(f), z3.fpAbs(b)))),
                         z3.Implies(z3.And(z3.Not(nan), z3.fpLT(z3.fpAbs(a), z3.fpAbs(b))), f == a)]
    return f

  def _float(self, u: UOp, xs: list):
    op, dt = u.op, u.dtype
    s = sort_of(dt)
    if op is Ops.ADD: return z3.fpAdd(RNE, *xs)
    if op is Ops.SUB: return z3.fpSub(RNE, *xs)
    if op is Ops.MUL: return z3.fpMul(RNE, *xs)
    if op is Ops.FDIV: return z3.fpDiv(RNE, *xs)
    if op is Ops.NEG: return z3.fpNeg(xs[0])
    if op is Ops.SQRT: return z3.fpSqrt(RNE, xs[0])
    if op is Ops.RECIPROCAL: return z3.fpDiv(RNE, const_term(1.0, dt), xs[0])
    if op is Ops.TRUNC: return z3.fpAdd(RNE, z3.fpRoundToIntegral(z3.RTZ(), xs[0]), z3.fpPlusZero(s))   # never -0.0
    if op is Ops.MAX:
      a, b = xs
      return z3.If(z3.fpGT(b, a), b, a)
    if op is Ops.IDIV: return float_floor_div(*xs)
    if op is Ops.MOD: return float_mod(*xs, self.fmod(*xs))
    if op is Ops.CMOD:   # C's fmod: NaN for a zero divisor or an infinite dividend (fpRem gives NaN there too)
      return self.fmod(*xs)
    if op is Ops.MULACC:
      if u.arg is not None: raise Untranslatable(f"MULACC marked {u.arg!r} (one rounding or two: the device picks)")
      return z3.fpAdd(RNE, z3.fpMul(RNE, xs[0], xs[1]), xs[2])
    if op is Ops.POW:
      a, b = xs
      one = const_term(1.0, dt)
      # IEEE 754's pow: x ** +-0 is 1 and 1 ** y is 1, even for NaN; anything else is the device's
      return z3.If(z3.Or(z3.fpIsZero(b), a == one), one, self.function(op, dt, 2)(a, b))
    if op in DEVICE_DEFINED: return self.function(op, dt, 1)(xs[0])
    raise Untranslatable(f"{op.name} on {dt.name}")


# *** tensor-level graphs ***

IDENTITY_OPS = frozenset({Ops.CONTIGUOUS, Ops.CONTIGUOUS_BACKWARD, Ops.DETACH, Ops.FUSE, Ops.COPY, Ops.STAGE, Ops.NOOP})
REDUCE_LIMIT = 64   # the most elements a reduce is unrolled over, per output
ENUMERATE_LIMIT = 64   # a root of at most this many elements is compared at each of them
STORE_LIMIT = 256   # the most elements of a STORE enumerated


class TensorTerms(Terms):
  """z3 terms for tensor-level graphs (docs/verify.md): a tensor's value is a function of its index, and the two
  graphs are compared at one symbolic index within the root's shape. A BUFFER is an unknown function from its
  element number to a value (any contents); movement ops are their index arithmetic on the way to the buffers
  (RESHAPE flattens and splits again, PERMUTE reorders, EXPAND reads index 0 of a size-1 axis, SHRINK and PAD
  shift, PAD reads 0 outside its source, FLIP mirrors); elementwise ops broadcast as numpy does; a REDUCE_AXIS of
  integers is unrolled over its reduced elements (any order gives the same wrapped sum, product or max).
  A float reduce of several elements adds (or compares) in an order the device picks: an unknown function of its
  elements in index order (Terms.reduce_function), so a rewrite that keeps the elements and their order is
  proven, and one that regroups them (split_reduce) is not. AFTER(buffer, STORE(view, value), ..) is the buffer
  with each store's elements written in turn (the view's elements enumerated, at most STORE_LIMIT); INDEX(x, i..)
  is x at the indices i (scalar terms), and anything (a fresh variable: poison) where they fall outside x.
  A value spread over devices is its whole value (engine/tensor_eval.py's meaning): MSTACK(x_0..x_n-1)[(axis, ..)]
  the parts joined along axis, or its first part when replicated (axis None; `replicated` gives the engine's
  guarantee that the parts are equal, a precondition of the graph before a rewrite), MSELECT(v)[(i, axis, n)] part
  i of v split n ways along axis. Shapes are concrete, so index arithmetic is
  done on bit-vectors just wide enough that nothing in it wraps; a root of at most ENUMERATE_LIMIT elements is
  compared at each index in turn (its index arithmetic folds to constants), a larger one at a symbolic index."""

  def __init__(self, abstract: bool, graphs: list[UOp], opaque: frozenset = frozenset()):
    super().__init__(abstract, opaque)
    biggest = 2
    for g in graphs:
      for u in g.toposort():
        shape = u._shape or ()
        biggest = max([biggest, math.prod(shape), *shape])
        if u.op in (Ops.PAD, Ops.SHRINK) and isinstance(u.arg, tuple):
          biggest = max([biggest] + [abs(x) for pair in u.arg for x in pair if isinstance(x, int)])
        if u.op is Ops.BUFFER: biggest = max(biggest, u.arg[-1])
        if u.op is Ops.PARAM: biggest = max(biggest, u.arg[1])
    self.index_bits = (4 * biggest).bit_length() + 2
    self.at_memo: dict[tuple, object] = {}
    self.shapes: dict[UOp, tuple] = {}
    self.buffers: list[UOp] = []
    self.index_bounds: list = []
    self.points: list = []
    self.preconditions: list = []   # what the engine guarantees of the graph before (replicated parts are equal)

  def constraints(self) -> list: return super().constraints() + self.index_bounds + self.preconditions

  def _i(self, v: int): return z3.BitVecVal(v, self.index_bits)

  def shape(self, u: UOp) -> tuple:
    """u's shape as its value has it: an elementwise op broadcasts its sources numpy's way (a generated graph's
    sources may differ in shape until rules/early.rules expand_broadcast expands them; UOp.shape takes the first's)."""
    if u not in self.shapes:
      if u.op in _ALU_OPS or u.op in (Ops.CAST, Ops.WHERE):
        try: self.shapes[u] = tuple(np.broadcast_shapes(*(self.shape(x) for x in u.src)))
        except ValueError as e: raise Untranslatable(f"sources that do not broadcast: {e}") from None
      elif u.op in (Ops.INDEX, Ops.REDUCE): self.shapes[u] = ()   # (one element of a value)
      elif u.op is Ops.PARAM: self.shapes[u] = (u.arg[1],)   # (a kernel's buffer argument: its elements)
      else: self.shapes[u] = tuple(u._shape or ())
    return self.shapes[u]

  def buffer_element(self, b: UOp, k):
    if b not in self.buffers and b.op is Ops.BUFFER: self.buffers.append(b)
    f = self.functions.get(("buffer", b))
    if f is None:
      name = f"buffer{b.arg[0]}" if b.op is Ops.BUFFER else f"param{b.arg[0]}"
      f = self.functions[("buffer", b)] = z3.Function(name, z3.BitVecSort(self.index_bits), sort_of(b.dtype))
    return f(self._i(k) if isinstance(k, int) else k)

  def differ(self, before: UOp, after: UOp):
    """The values differ at some index of the root's shape: at each index in turn when there are few (the index
    arithmetic then folds to constants, and what is left is the values'), else at one symbolic index."""
    shape, self.root_dtype = self.shape(before), before.dtype
    self.preconditions = self.replicated(before)
    if math.prod(shape) <= ENUMERATE_LIMIT:
      self.points = []
      for point in np.ndindex(*shape):
        idx = tuple(self._i(int(k)) for k in point)
        self.points.append((tuple(int(k) for k in point), self.at(before, idx), self.at(after, idx)))
    else:
      index = tuple(z3.BitVec(f"i{k}", self.index_bits) for k in range(len(shape)))
      self.index_bounds = [z3.ULT(i, self._i(d)) for i, d in zip(index, shape)]
      self.points = [(index, self.at(before, index), self.at(after, index))]
    differ = z3.Or([z3.Not(same_value(b, a, before.dtype)) for _, b, a in self.points])
    # a read outside its value (poison) may give anything: after is right where it gives a value before may give,
    # so the values before's poison takes are quantified (after's stay free: any of them must do)
    poison = _poisons([b for _, b, _ in self.points])
    return z3.ForAll(poison, differ) if poison else differ

  def witness(self, model) -> tuple[tuple, object, object]:
    def concrete(index): return tuple(i if isinstance(i, int) else model.eval(i, model_completion=True).as_long() for i in index)
    for index, b, a in self.points:
      if z3.is_true(model.eval(z3.Not(same_value(b, a, self.root_dtype)), model_completion=True)): return concrete(index), b, a
    return concrete(self.points[0][0]), self.points[0][1], self.points[0][2]

  def at(self, u: UOp, idx: tuple):
    key = (u, tuple(i.get_id() for i in idx))
    if key not in self.at_memo: self.at_memo[key] = self._at(u, idx)
    return self.at_memo[key]

  def source_index(self, u: UOp, idx: tuple) -> tuple[tuple, object]:
    """A movement op's index into its source for the index idx into its result, and where the result reads the
    source (a PAD reads 0 elsewhere); None: everywhere."""
    op, inner = u.op, self.shape(u.src[0])
    if op is Ops.RESHAPE:
      flat = self._i(0)
      for i, stride in zip(idx, _strides(u.shape)): flat = flat + i * self._i(stride)
      return tuple(z3.URem(z3.UDiv(flat, self._i(st)), self._i(d)) if d != 1 else self._i(0)
                   for st, d in zip(_strides(inner), inner)), None
    if op is Ops.PERMUTE:
      out = [None] * len(u.arg)
      for i, a in enumerate(u.arg): out[a] = idx[i]
      return tuple(out), None
    if op is Ops.EXPAND: return tuple(self._i(0) if s == 1 else i for i, s in zip(idx, inner)), None
    if op is Ops.SHRINK: return tuple(i + self._i(b) for i, (b, _) in zip(idx, u.arg)), None
    if op is Ops.FLIP: return tuple(self._i(s - 1) - i if f else i for i, s, f in zip(idx, inner, u.arg)), None
    if op is Ops.PAD:
      if not any(b or a for b, a in u.arg): return tuple(idx), None   # (no padding: every index reads the source)
      valid = z3.And(*[z3.And(z3.ULE(self._i(b), i), z3.ULT(i, self._i(b + s))) for i, s, (b, _) in zip(idx, inner, u.arg)])
      return tuple(i - self._i(b) for i, (b, _) in zip(idx, u.arg)), valid
    raise Untranslatable(f"{op.name} is not a movement op")

  def _at(self, u: UOp, idx: tuple):
    op, src = u.op, u.src
    if u in self.opaque:   # any function of the index (a scalar: any value, as Terms.value has it)
      if not idx: return self.value(u)
      f = self.functions.get(("opaque", u))
      if f is None:
        f = self.functions[("opaque", u)] = z3.Function(f"value!{len(self.functions)}", *[i.sort() for i in idx], sort_of(u.dtype))
      return f(*idx)
    if op in (Ops.BUFFER, Ops.PARAM): return self.buffer_element(u, idx[0])
    if op in (Ops.CONST, Ops.DEFINE_VAR, Ops.RANGE): return self.value(u)
    if op in IDENTITY_OPS: return self.at(src[0], idx)
    if op is Ops.ASSIGN: return self.at(src[1], idx)   # (its value's value, as engine/tensor_eval.py)
    if op in _MOVEMENT:
      inner, valid = self.source_index(u, idx)
      v = self.at(src[0], inner)
      return v if valid is None else z3.If(valid, v, const_term(0, u.dtype))
    if op is Ops.REDUCE_AXIS: return self._reduce(u, idx)
    if op is Ops.MSTACK: return self._stack(u, idx)
    if op is Ops.MSELECT:   # device i's part of src split n ways along axis: the whole value, shifted to part i
      i, axis, _ = u.arg
      if axis is None: return self.at(src[0], idx)
      return self.at(src[0], idx[:axis] + (idx[axis] + self._i(i * self.shape(u)[axis]),) + idx[axis + 1:])
    if op is Ops.AFTER: return self._after(u, idx)
    if op is Ops.BITCAST and u.dtype.itemsize != src[0].dtype.itemsize: return self._resize(u, idx)
    if op is Ops.INDEX: return self._index(u)
    if op is Ops.REDUCE: return self.value(u)
    if op in (Ops.CAST, Ops.WHERE) or op in _ALU_OPS or (op is Ops.BITCAST and u.dtype.itemsize == src[0].dtype.itemsize):
      shape = self.shape(u)
      return self._node(u, [self.at(x, _broadcast(idx, shape, self.shape(x), self._i(0))) for x in src])
    raise Untranslatable(f"{op.name} in a tensor graph")

  def _stack(self, u: UOp, idx: tuple):
    """MSTACK(x_0..x_n-1)[(axis, devices)]: the parts joined along axis (part k holds the elements from k * size on),
    the first part when replicated (axis None: the parts are equal, `replicated` below)."""
    axis, parts = u.arg[0], u.src
    if axis is None: return self.at(parts[0], idx)
    size = self.shape(parts[0])[axis]
    def read(k): return self.at(parts[k], idx[:axis] + (idx[axis] - self._i(k * size),) + idx[axis + 1:])
    if z3.is_bv_value(z3.simplify(idx[axis])): return read(min(z3.simplify(idx[axis]).as_long() // max(size, 1), len(parts) - 1))
    out = read(len(parts) - 1)
    for k in reversed(range(len(parts) - 1)): out = z3.If(z3.ULT(idx[axis], self._i((k + 1) * size)), read(k), out)
    return out

  def replicated(self, graph: UOp) -> list:
    """The engine's guarantee for a replicated stack (MSTACK with axis None) of the graph: its parts are copies of
    one value, equal bit for bit (any NaN for a NaN), at every element."""
    out = []
    for m in graph.toposort():
      if m.op is not Ops.MSTACK or m.arg[0] is not None: continue
      shape = self.shape(m.src[0])
      if math.prod(shape) > STORE_LIMIT: raise Untranslatable(f"a replicated MSTACK of more than {STORE_LIMIT} elements")
      for point in np.ndindex(*shape):
        idx = tuple(self._i(int(k)) for k in point)
        out += [same_value(self.at(m.src[0], idx), self.at(x, idx), m.dtype) for x in m.src[1:]]
    return out

  def _resize(self, u: UOp, idx: tuple):
    """A bitcast to another item size, little-endian as numpy: a wider item is `rate` source items, the first in
    its lowest bits; a narrower one is a slice of the bits of one source item."""
    x, dt = u.src[0], u.dtype
    if "b" in (dt.kind, x.dtype.kind): raise Untranslatable("a BITCAST of bools")
    def bits(v, d): return z3.fpToIEEEBV(v) if d.kind == "f" else v
    def value(b, d): return z3.fpBVToFP(b, sort_of(d)) if d.kind == "f" else b
    *lead, j = idx
    if dt.itemsize > x.dtype.itemsize:
      rate = dt.itemsize // x.dtype.itemsize
      parts = [bits(self.at(x, (*lead, j * self._i(rate) + self._i(k))), x.dtype) for k in range(rate)]
      return value(z3.Concat(*reversed(parts)), dt)
    rate, w = x.dtype.itemsize // dt.itemsize, dt.bits
    whole = bits(self.at(x, (*lead, z3.UDiv(j, self._i(rate)))), x.dtype)
    k = z3.URem(j, self._i(rate))
    piece = z3.Extract(w - 1, 0, whole)
    for n in range(1, rate): piece = z3.If(k == n, z3.Extract((n + 1) * w - 1, n * w, whole), piece)
    return value(piece, dt)

  def _reduce(self, u: UOp, idx: tuple):
    rop, axes = u.arg
    x = u.src[0]
    sizes = [self.shape(x)[a] for a in axes]
    count = math.prod(sizes)
    if count > REDUCE_LIMIT: raise Untranslatable(f"a reduce over {count} elements (more than {REDUCE_LIMIT})")
    parts = []
    for combo in np.ndindex(*sizes):
      inner = list(idx)
      for a, k in zip(axes, combo): inner[a] = self._i(int(k))
      parts.append(self.at(x, tuple(inner)))
    return combine(rop, u.dtype, parts, self.reduce_function)

  def address(self, view: UOp, idx: tuple):
    """The element of the buffer under a chain of movement ops (no PAD) that index idx of the view reads."""
    while view.op in _MOVEMENT:
      idx, valid = self.source_index(view, idx)
      if valid is not None: raise Untranslatable("a STORE through a PAD")
      view = view.src[0]
    if view.op is not Ops.BUFFER: raise Untranslatable(f"a STORE into {view.op.name}")
    return view, idx[0]

  # *** stores: what a STORE root writes (rules/rangeify.rules store_loops) ***

  def writes(self, root: UOp) -> list[tuple]:
    """The writes of a store, in order, as (buffer, element number, value): STORE(view, value) writes each element of
    the view (at most STORE_LIMIT); STORE(INDEX(view, i..), INDEX(value, i..)) one element, at index terms; END(that,
    r..) that store at every point of its ranges (constant sizes, at most STORE_LIMIT points)."""
    if root.op is Ops.END:
      st, ranges = root.src[0], root.src[1:]
      sizes = self._range_sizes(ranges, "an END")
      if math.prod(sizes) > STORE_LIMIT: raise Untranslatable(f"a loop of more than {STORE_LIMIT} stores")
      return [w for ws in self.at_points(st, ranges, sizes, lambda: self.writes(st)) for w in ws]
    if root.op is not Ops.STORE: raise Untranslatable(f"the writes of {root.op.name}")
    target, value = root.src
    if target.op is Ops.INDEX:   # one element, at index terms (64-bit, as INDEX's sources are)
      idx = tuple(z3.Extract(self.index_bits - 1, 0, self.value(i)) for i in target.src[1:])
      buf, addr = self.address(target.src[0], idx)
      return [(buf, addr, self.value(value))]
    shape = self.shape(target)
    if math.prod(shape) > STORE_LIMIT: raise Untranslatable(f"a STORE of more than {STORE_LIMIT} elements")
    out = []
    for point in np.ndindex(*shape):
      j = tuple(self._i(int(k)) for k in point)
      buf, addr = self.address(target, j)
      out.append((buf, addr, self.at(value, _broadcast(j, shape, self.shape(value), self._i(0)))))
    return out

  def differ_writes(self, before: UOp, after: UOp):
    """The contents of some written buffer differ once the two stores are done (each element: the last write to it,
    else what the buffer held)."""
    wb, wa = self.writes(before), self.writes(after)
    self.points, differ = [], []
    for buf in dict.fromkeys([b for b, _, _ in wb + wa]):
      if buf.arg[-1] > STORE_LIMIT: raise Untranslatable(f"a buffer of more than {STORE_LIMIT} elements")
      for k in range(buf.arg[-1]):
        vals = []
        for writes in (wb, wa):
          v = self.buffer_element(buf, k)
          for b, addr, x in writes:
            if b is buf: v = z3.If(addr == self._i(k), x, v)
          vals.append(v)
        self.points.append(((buf.arg[0], k), *vals))
        differ.append(z3.Not(same_value(*vals, buf.dtype)))
    self.root_dtype = wb[0][0].dtype if wb else before.dtype
    return z3.Or(differ)

  def _after(self, u: UOp, idx: tuple):
    """AFTER(buffer, STORE(view, value), ..) at element idx of the buffer: what the last store writing it wrote."""
    buf = u.src[0]
    if buf.op is not Ops.BUFFER: raise Untranslatable("AFTER of something other than a BUFFER")
    v = self.buffer_element(buf, idx[0])
    for st in u.src[1:]:
      if st.op is not Ops.STORE: raise Untranslatable(f"AFTER a {st.op.name}")
      target, value = st.src
      shape = self.shape(target)
      if math.prod(shape) > STORE_LIMIT: raise Untranslatable(f"a STORE of more than {STORE_LIMIT} elements")
      for point in np.ndindex(*shape):
        j = tuple(self._i(int(k)) for k in point)
        into, addr = self.address(target, j)
        if into is not buf: raise Untranslatable("a STORE into another buffer than its AFTER's")
        v = z3.If(addr == idx[0], self.at(value, _broadcast(j, shape, self.shape(value), self._i(0))), v)
    return v

  def _index(self, u: UOp):
    """INDEX(x, i..): x's element at the indices (scalar index terms), anything outside x's shape."""
    x, idxs = u.src[0], u.src[1:]
    shape = self.shape(x)
    if len(idxs) != len(shape): raise Untranslatable(f"an INDEX with {len(idxs)} indices into shape {shape}")
    terms = [self.value(i) for i in idxs]
    inside = z3.And(*[z3.And(t >= 0, t < d) for t, d in zip(terms, shape)])
    v = self.at(x, tuple(z3.Extract(self.index_bits - 1, 0, t) for t in terms))
    return z3.If(inside, v, z3.Const(f"poison!{len(self.at_memo)}", sort_of(u.dtype)))


_ALU_OPS = frozenset(o for o in Ops if o.name in {
  "NEG", "EXP2", "LOG2", "SIN", "SQRT", "RECIPROCAL", "TRUNC", "ADD", "SUB", "MUL", "FDIV", "IDIV", "MOD", "MAX", "POW",
  "CMPLT", "CMPNE", "CMPEQ", "CDIV", "CMOD", "AND", "OR", "XOR", "SHL", "SHR", "MULACC"})


_MOVEMENT = frozenset({Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.PAD, Ops.SHRINK, Ops.FLIP})


def _strides(shape: tuple[int, ...]) -> list[int]:
  out, acc = [], 1
  for d in reversed(shape):
    out.append(acc)
    acc *= d
  return out[::-1]


def _poisons(terms: list) -> list:
  """The poison variables (reads outside a value, TensorTerms._index) the terms read."""
  out, seen, todo = {}, set(), list(terms)
  while todo:
    t = todo.pop()
    if t.get_id() in seen: continue
    seen.add(t.get_id())
    if z3.is_const(t) and t.decl().kind() == z3.Z3_OP_UNINTERPRETED and t.decl().name().startswith("poison!"): out[t.get_id()] = t
    todo.extend(t.children())
  return list(out.values())


def _broadcast(idx: tuple, shape: tuple, src_shape: tuple, zero) -> tuple:
  """The index into a source of shape src_shape, broadcast numpy's way to `shape`, read at idx."""
  lead = len(shape) - len(src_shape)
  return tuple(zero if d == 1 else idx[lead + k] for k, d in enumerate(src_shape))




# *** linear integer arithmetic ***

class IntTerms(Terms):
  """The same meaning in z3's (unbounded) integers, for graphs of linear integer arithmetic: each integer value
  a z3 Int within its dtype's range, every op's exact result wrapped back into it (t - 2**bits * floor((t - min) /
  2**bits)); division and modulo by constants are floor (or truncating) division of integers. Linear arithmetic
  with division by constants is where z3's integer solver is at home, and a 64-bit divider is where its bit-vector
  solver is not: `(a // 3) // 7 == a // 21` at int64. Anything else (a product of two variables, a division by
  a variable, bitwise ops, shifts, floats) is Untranslatable here, and the bit-vector translation answers."""

  def leaf(self, u: UOp):
    if u not in self.leaves:
      if u.dtype.kind not in "iuxb": raise Untranslatable(f"a {u.dtype.name} leaf")
      name = f"r{u.arg[0]}" if u.op is Ops.RANGE else str(u.arg[0])
      self.leaves[u] = z3.Bool(f"{name}!{len(self.leaves)}") if u.dtype.kind == "b" else z3.Int(f"{name}!{len(self.leaves)}")
    return self.leaves[u]

  def constraints(self) -> list:
    out = []
    for u, v in self.leaves.items():
      if u in self.bound_ranges or u.dtype.kind == "b": continue
      if u.op is Ops.RANGE: lo, hi = 0, u.src[0].arg - 1 if u.src[0].op is Ops.CONST else None
      elif u.op is Ops.DEFINE_VAR: lo, hi = u.arg[1], u.arg[2]
      else: lo, hi = u.dtype.min(), u.dtype.max()   # (an opaque node: any value of its dtype)
      if hi is None: raise Untranslatable("a RANGE whose size is not a constant")
      out.append(z3.And(v >= lo, v <= hi))
    return out

  def value(self, root: UOp):
    for u in root.toposort(gate=lambda n: n not in self.opaque):
      if u in self.memo: continue
      if u in self.opaque:
        if u.dtype.kind not in "iuxb": raise Untranslatable(f"a kept {u.dtype.name} value")
        self.memo[u] = self.leaves[u] = z3.Bool(f"opaque!{len(self.memo)}") if u.dtype.kind == "b" else z3.Int(f"opaque!{len(self.memo)}")
      else: self.memo[u] = self._lia(u, [self.memo[s] for s in u.src])
    return self.memo[root]

  @staticmethod
  def _wrap(t, dt: DType):
    lo, span = dt.min(), 1 << dt.bits
    if z3.is_int_value(t): return z3.IntVal(wrap(t.as_long(), dt))
    return t - span * ((t - lo) / span)   # (z3's / on Int with a positive divisor is floor division)

  def _lia(self, u: UOp, xs: list):
    op, dt = u.op, u.dtype
    if op in (Ops.RANGE, Ops.DEFINE_VAR): return self.leaf(u)
    if op is Ops.CONST:
      if dt.kind == "b": return z3.BoolVal(bool(u.arg))
      if dt.kind not in "iux" or not isinstance(u.arg, int): raise Untranslatable("a float constant")
      return z3.IntVal(wrap(u.arg, dt))
    if op is Ops.WHERE: return z3.If(*xs)
    if op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ):
      a, b = xs
      if u.src[0].dtype.kind == "b": return self._compare(op, u.src[0].dtype, xs)
      return a < b if op is Ops.CMPLT else a != b if op is Ops.CMPNE else a == b
    if dt.kind == "b":
      if op in (Ops.AND, Ops.OR, Ops.XOR): return self._logic(op, xs)
      if op is Ops.CAST and u.src[0].dtype.kind in "iux": return xs[0] != 0
      raise Untranslatable(f"{op.name} to bool")
    if dt.kind not in "iux": raise Untranslatable(f"{op.name} of {dt.name}")
    if op is Ops.CAST:
      src = u.src[0].dtype
      if src.kind == "b": return z3.If(xs[0], z3.IntVal(1), z3.IntVal(0))
      if src.kind not in "iux": raise Untranslatable("a cast from a float")
      return self._wrap(xs[0], dt)
    if op is Ops.ADD: return self._wrap(xs[0] + xs[1], dt)
    if op is Ops.SUB: return self._wrap(xs[0] - xs[1], dt)
    if op is Ops.NEG: return self._wrap(-xs[0], dt)
    if op is Ops.MUL:
      if not (z3.is_int_value(xs[0]) or z3.is_int_value(xs[1])): raise Untranslatable("a product of two variables")
      return self._wrap(xs[0] * xs[1], dt)
    if op is Ops.MAX: return z3.If(xs[0] < xs[1], xs[1], xs[0])
    if op in (Ops.IDIV, Ops.MOD, Ops.CDIV, Ops.CMOD):
      a, b = xs
      if not z3.is_int_value(b): raise Untranslatable("a division by a variable")
      c = b.as_long()
      if c == 0: return z3.IntVal(0)
      if op in (Ops.IDIV, Ops.MOD):
        q = a / c if c > 0 else (-a) / (-c)   # floor(a / c): Euclidean division is floor division for a positive divisor
      else:   # truncating: the floor of |a| / |c|, with the sign of a / c
        mag = z3.If(a >= 0, a, -a) / abs(c)
        q = z3.If(a >= 0, mag, -mag) if c > 0 else z3.If(a >= 0, -mag, mag)
      return self._wrap(q, dt) if op in (Ops.IDIV, Ops.CDIV) else a - c * q   # (a remainder is in range already)
    raise Untranslatable(f"{op.name} in linear integer arithmetic")


__all__ = ["Terms", "TensorTerms", "IntTerms", "Untranslatable", "same_value", "python_value", "const_term", "sort_of"]
