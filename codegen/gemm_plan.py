"""Which kernels are a matrix product the tensor cores can run, and how their operands lie in memory.

A kernel qualifies when it is one store of an elementwise function (the epilogue) of one sum

    out[b..., m, n] = f(sum_k A[b..., m, k] * B[b..., k, n], other loads at (b..., m, n))

where A and B are loads of the same 2-byte float type (float16 or bfloat16), the sum is a REDUCE(ADD) over one
range k of their product (MUL of the two loads, of their float32 casts, or the float32 cast of it), and every
index is affine in the ranges with constant strides. The output ranges split three ways by which operand reads
them: a range only A reads is m, one only B reads is n, one both read is a batch range (batched matmul, the heads
of attention). A plan needs exactly one m and one n range; batch ranges are any number.

The tensor-core kernel (codegen/nvptx_gemm.py) copies 16-byte chunks (8 elements) of each operand with cp.async,
so an operand must be contiguous along k or along its own free axis (stride 1), with every other stride, its base
offset and the length of its contiguous axis a multiple of 8 elements. A kernel that fails any of this gets no
plan, with the reason in one line (`why_not`), and runs on the CUDA device's ordinary renderer.

The tensor cores multiply exactly and accumulate in float32: the product of two 2-byte floats is not rounded to
the 2-byte type before it is summed, as the ordinary renderers' MUL of two float16 values is. The result is the
more accurate one, within the rounding torch's and tinygrad's tensor-core matmuls give.
"""
from __future__ import annotations

import attrs

from rulec.engine.ir.dtypes import DType, dtypes
from rulec.engine.ir.kernel import Kernel
from rulec.engine.ir.ops import Ops
from rulec.engine.ir.uop import UOp

CHUNK = 8          # elements per 16-byte cp.async copy
MAX_GRID_YZ = 65535


@attrs.frozen
class Operand:
  slot: int                    # the kernel's buffer (PARAM) it loads from
  base: int                    # element offset of (batch 0, free 0, k 0)
  stride_free: int             # along m (A) or n (B)
  stride_k: int
  stride_batch: tuple[int, ...]   # one per batch range, in GemmPlan.batch order
  k_contiguous: bool           # stride_k == 1 (A row-major, B as in x @ W.T); else stride_free == 1


@attrs.frozen
class GemmPlan:
  dtype: DType                 # float16 or bfloat16: the type the mma instruction multiplies
  M: int
  N: int
  K: int
  m: UOp                       # the output ranges, and the reduce's range
  n: UOp
  k: UOp
  batch: tuple[UOp, ...]
  a: Operand
  b: Operand
  reduce: UOp                  # the REDUCE the tensor cores compute; the epilogue reads it
  store: UOp                   # the STORE (its END's ranges are `ranges`)
  ranges: tuple[UOp, ...]      # the store's ranges, in the END's order (the epilogue's parameters)

  @property
  def batch_sizes(self) -> tuple[int, ...]: return tuple(r.src[0].arg for r in self.batch)


class NoPlan(Exception):
  """Why a kernel is not a tensor-core matmul (one line)."""


def affine(u: UOp) -> dict | None:
  """An index expression as {range: coefficient, None: constant}, or None where it is not a sum of ranges times
  constants (a division, a modulo, a variable, a gate)."""
  if u.op is Ops.CONST: return {None: int(u.arg)} if isinstance(u.arg, int) else None
  if u.op is Ops.RANGE: return {u: 1}
  if u.op is Ops.ADD:
    x, y = affine(u.src[0]), affine(u.src[1])
    if x is None or y is None: return None
    out = dict(x)
    for key, c in y.items(): out[key] = out.get(key, 0) + c
    return {key: c for key, c in out.items() if c != 0 or key is None}
  if u.op is Ops.MUL:
    for v, c in ((u.src[0], u.src[1]), (u.src[1], u.src[0])):
      if c.op is Ops.CONST and isinstance(c.arg, int):
        x = affine(v)
        return None if x is None else {key: k * c.arg for key, k in x.items() if k * c.arg != 0 or key is None}
  return None


def _load(u: UOp) -> UOp | None:
  """The INDEX a factor loads (through a float32 cast), or None."""
  if u.op is Ops.CAST and u.dtype is dtypes.float32: u = u.src[0]
  return u if u.op is Ops.INDEX and len(u.src) == 2 and u.src[0].op is Ops.PARAM else None


def _factors(red: UOp) -> tuple[UOp, UOp]:
  body = red.src[0]
  if body.op is Ops.CAST and body.dtype is dtypes.float32 and body.src[0].op is Ops.MUL: body = body.src[0]
  if body.op is not Ops.MUL: raise NoPlan(f"the sum is of {body.op.name}, not of a product")
  x, y = (_load(s) for s in body.src)
  if x is None or y is None: raise NoPlan("a factor of the product is not a load of a buffer")
  if x.dtype is not y.dtype or x.dtype not in (dtypes.float16, dtypes.bfloat16):
    raise NoPlan(f"the product is of {x.dtype.name} and {y.dtype.name}; the tensor cores take two float16 or two bfloat16")
  return x, y


def _operand(load: UOp, free: UOp, k: UOp, batch: tuple[UOp, ...], name: str) -> Operand:
  ix = affine(load.src[1])
  if ix is None: raise NoPlan(f"{name}'s index is not affine in the ranges")
  extra = [r for r in ix if r is not None and r not in (free, k, *batch)]
  if extra: raise NoPlan(f"{name}'s index reads a range that is neither its row, k nor a batch range")
  sf, sk, base = ix.get(free, 0), ix.get(k, 0), ix.get(None, 0)
  sb = tuple(ix.get(r, 0) for r in batch)
  if sk == 1: kc, contiguous, others = True, k, (sf, *sb, base)
  elif sf == 1: kc, contiguous, others = False, free, (sk, *sb, base)
  else: raise NoPlan(f"{name} is contiguous neither along k nor along its free axis (strides {sf}, {sk})")
  if any(s % CHUNK for s in others):
    raise NoPlan(f"{name}'s other strides and offset ({', '.join(map(str, others))}) are not all multiples of {CHUNK} elements")
  if contiguous.src[0].arg % CHUNK:
    raise NoPlan(f"{name}'s contiguous axis has {contiguous.src[0].arg} elements, not a multiple of {CHUNK}")
  if any(s < 0 for s in (sf, sk, *sb, base)): raise NoPlan(f"{name} has a negative stride")
  return Operand(load.src[0].arg[0], base, sf, sk, sb, kc)


def plan(kernel: Kernel) -> GemmPlan:
  """The kernel as a tensor-core matmul; NoPlan (with the reason) where it is not one."""
  ast = kernel.ast
  if len(ast.src) != 1 or ast.src[0].op is not Ops.END: raise NoPlan("not one store over ranges")
  end = ast.src[0]
  store, ranges = end.src[0], tuple(end.src[1:])
  if store.op is not Ops.STORE: raise NoPlan("not one store over ranges")
  if kernel.vars: raise NoPlan("the kernel has variables")
  if any(r.op is not Ops.RANGE or not isinstance(r.src[0].arg, int) for r in ranges):
    raise NoPlan("an output range of a symbolic size")
  target, value = store.src
  reds = [u for u in value.toposort() if u.op is Ops.REDUCE]
  if len(reds) != 1: raise NoPlan(f"{len(reds)} reductions, not one")
  red = reds[0]
  if red.arg is not Ops.ADD: raise NoPlan(f"a {red.arg} reduction, not a sum")
  if red.dtype not in (dtypes.float16, dtypes.bfloat16, dtypes.float32): raise NoPlan(f"a sum of {red.dtype.name}")
  if len(red.src) != 2 or red.src[1].op is not Ops.RANGE or not isinstance(red.src[1].src[0].arg, int):
    raise NoPlan("the sum is not over one range of a constant size")
  k = red.src[1]
  x, y = _factors(red)
  ix, iy = affine(x.src[1]), affine(y.src[1])
  if ix is None or iy is None: raise NoPlan("an operand's index is not affine in the ranges")
  if not ix.get(k) or not iy.get(k): raise NoPlan("an operand does not read k")
  in_x, in_y = {r for r in ix if r is not None}, {r for r in iy if r is not None}
  ms = [r for r in ranges if r in in_x and r not in in_y]
  ns = [r for r in ranges if r in in_y and r not in in_x]
  batch = tuple(r for r in ranges if r in in_x and r in in_y)
  if len(ms) != 1 or len(ns) != 1: raise NoPlan(f"{len(ms)} ranges only one operand reads and {len(ns)} only the other: not one m and one n")
  if len(ms) + len(ns) + len(batch) != len(ranges): raise NoPlan("an output range neither operand reads (a broadcast result)")
  m, n = ms[0], ns[0]
  out = affine(target.src[1]) if target.op is Ops.INDEX and len(target.src) == 2 else None
  if out is None: raise NoPlan("the store's index is not affine")
  nb = 1
  for r in batch: nb *= r.src[0].arg
  if nb > MAX_GRID_YZ: raise NoPlan(f"{nb} batches, more than a grid's {MAX_GRID_YZ}")
  a, b = _operand(x, m, k, batch, "A"), _operand(y, n, k, batch, "B")
  if any(u.op is Ops.RANGE and u not in ranges and u is not k for u in value.toposort()):
    raise NoPlan("the epilogue opens a range of its own")
  return GemmPlan(x.dtype, m.src[0].arg, n.src[0].arg, k.src[0].arg, m, n, k, batch, a, b, red, store, ranges)


def why_not(kernel: Kernel) -> str | None:
  """None where the kernel has a plan, else the reason it has none."""
  try: plan(kernel)
  except NoPlan as e: return str(e)
  return None
