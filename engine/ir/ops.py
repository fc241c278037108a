"""The op table: every op the IR knows, the named groups the rule language
can use, and per-op facts the matcher compiler and checker rely on
(commutativity, fixed source counts)."""
from __future__ import annotations

import enum


class Ops(enum.IntEnum):
  # sources of values and identities
  BUFFER = enum.auto(); CONST = enum.auto(); DEVICE = enum.auto(); UNIQUE = enum.auto()
  DEFINE_VAR = enum.auto(); BIND = enum.auto(); PARAM = enum.auto()
  DEFINE_GLOBAL = enum.auto(); DEFINE_LOCAL = enum.auto(); DEFINE_REG = enum.auto(); BUFFER_VIEW = enum.auto()
  # unary ALU
  NEG = enum.auto(); EXP2 = enum.auto(); LOG2 = enum.auto(); SIN = enum.auto(); SQRT = enum.auto()
  RECIPROCAL = enum.auto(); TRUNC = enum.auto()
  # binary ALU
  ADD = enum.auto(); SUB = enum.auto(); MUL = enum.auto(); FDIV = enum.auto(); IDIV = enum.auto(); MOD = enum.auto()
  MAX = enum.auto(); POW = enum.auto(); CMPLT = enum.auto(); CMPNE = enum.auto(); CMPEQ = enum.auto()
  CDIV = enum.auto(); CMOD = enum.auto()   # truncating division and C remainder, for backends (rules/decomp.rules)
  AND = enum.auto(); OR = enum.auto(); XOR = enum.auto(); SHL = enum.auto(); SHR = enum.auto(); THREEFRY = enum.auto()
  # ternary ALU
  WHERE = enum.auto(); MULACC = enum.auto()   # a*b+c, two roundings; arg MAY_FUSE: see below
  # type changes
  CAST = enum.auto(); BITCAST = enum.auto()
  # reductions: REDUCE_AXIS on tensors (arg=(op, axes)), REDUCE over ranges in kernels (arg=op)
  REDUCE_AXIS = enum.auto(); REDUCE = enum.auto()
  # movement (arg holds the static argument: new shape, permutation, padding, ...)
  RESHAPE = enum.auto(); PERMUTE = enum.auto(); EXPAND = enum.auto(); PAD = enum.auto(); SHRINK = enum.auto()
  FLIP = enum.auto()
  # tensor-graph structure
  CONTIGUOUS = enum.auto(); CONTIGUOUS_BACKWARD = enum.auto(); DETACH = enum.auto(); FUSE = enum.auto()
  COPY = enum.auto(); ASSIGN = enum.auto(); MSTACK = enum.auto(); MSELECT = enum.auto()
  # kernel-graph structure
  INDEX = enum.auto(); RANGE = enum.auto(); END = enum.auto(); BUFFERIZE = enum.auto(); STAGE = enum.auto()
  STORE = enum.auto(); LOAD = enum.auto(); AFTER = enum.auto(); SINK = enum.auto(); GROUP = enum.auto()
  KERNEL = enum.auto(); CALL = enum.auto(); NOOP = enum.auto(); VECTORIZE = enum.auto(); GEP = enum.auto()
  SPECIAL = enum.auto(); IF = enum.auto(); ENDIF = enum.auto(); BARRIER = enum.auto(); CUSTOM = enum.auto()
  # a kernel's running max: RUNMAX(t, r) with arg a (a positive float) is the max of t over range r, inside a float
  # sum over r whose every term is exp2(-a * RUNMAX) times terms free of it (rules/online.rules): a renderer may
  # compute that sum in one pass, rescaling what it has summed by exp2(a * (old - new)) when the max grows
  RUNMAX = enum.auto()

  def __repr__(self): return f"Ops.{self.name}"
  __str__ = __repr__


UNARY = frozenset({Ops.NEG, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.RECIPROCAL, Ops.TRUNC})
BINARY = frozenset({Ops.ADD, Ops.SUB, Ops.MUL, Ops.FDIV, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.POW, Ops.CMPLT, Ops.CMPNE,
                    Ops.CMPEQ, Ops.CDIV, Ops.CMOD, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR, Ops.THREEFRY})
TERNARY = frozenset({Ops.WHERE, Ops.MULACC})
ALU = UNARY | BINARY | TERNARY
# Ops that cost several ALU ops each: a polynomial after a range reduction (exp2, log2, sin, pow) or a division,
# reciprocal or square root (the fusion cost facts, engine/sched/fusion.py; KBLOCK's epilogues, codegen/opt)
TRANSCENDENTAL = frozenset({Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.POW, Ops.SQRT, Ops.RECIPROCAL, Ops.FDIV})
# MULACC's arg where its product and sum may round once (an fma, where the target has one): set by code whose error
# budget was measured both ways (rules/decomp.rules' polynomials). The decomposition settles it per device: the mark
# stays only where the device asks for MULACC (the CPU with FMA), which then rounds once, always; elsewhere it is
# removed. A MULACC without it rounds twice, as numpy does
MAY_FUSE = "fma"
MOVEMENT = frozenset({Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.PAD, Ops.SHRINK, Ops.FLIP})
COMMUTATIVE = frozenset({Ops.ADD, Ops.MUL, Ops.MAX, Ops.CMPNE, Ops.CMPEQ, Ops.AND, Ops.OR, Ops.XOR})
COMPARISON = frozenset({Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ})

# The groups a .rules pattern or expression may name. Adding a group here makes
# it available to every rule file; `rulec check` knows about it at once.
GROUPS: dict[str, frozenset[Ops]] = {
  "Unary": UNARY,
  "Binary": BINARY,
  "Ternary": TERNARY,
  "ALU": ALU,
  "Elementwise": ALU | {Ops.CAST, Ops.BITCAST},
  "Movement": MOVEMENT,
  "Commutative": COMMUTATIVE,
  "Comparison": COMPARISON,
  "Associative": frozenset({Ops.ADD, Ops.MUL, Ops.AND, Ops.OR, Ops.MAX}),
  "Idempotent": frozenset({Ops.OR, Ops.AND, Ops.MAX}),
  "Defines": frozenset({Ops.BUFFER, Ops.DEFINE_GLOBAL, Ops.DEFINE_LOCAL, Ops.DEFINE_REG, Ops.DEFINE_VAR, Ops.PARAM}),
  "All": frozenset(Ops),
}

# Source counts that are fixed for an op; patterns that disagree are errors.
FIXED_ARITY: dict[Ops, int] = {**{o: 1 for o in UNARY}, **{o: 2 for o in BINARY}, **{o: 3 for o in TERNARY},
                               Ops.CAST: 1, Ops.BITCAST: 1, Ops.CONST: 0, Ops.DEFINE_GLOBAL: 0, Ops.DEFINE_VAR: 0,
                               Ops.UNIQUE: 0, Ops.DEVICE: 0, Ops.REDUCE_AXIS: 1, Ops.RANGE: 1, Ops.RESHAPE: 1,
                               Ops.PERMUTE: 1, Ops.EXPAND: 1, Ops.PAD: 1, Ops.SHRINK: 1, Ops.FLIP: 1, Ops.DETACH: 1,
                               Ops.CONTIGUOUS_BACKWARD: 1, Ops.FUSE: 1, Ops.RUNMAX: 2}

OPS_BY_NAME: dict[str, Ops] = {o.name: o for o in Ops}


def op_set(name: str) -> frozenset[Ops] | None:
  """The ops a name in a rules file stands for: one op, or a group; None if neither."""
  if name in OPS_BY_NAME: return frozenset({OPS_BY_NAME[name]})
  return GROUPS.get(name)
