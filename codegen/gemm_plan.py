"""Which kernels are a matrix product the tensor cores can run, and how each factor reaches shared memory.

A kernel qualifies when it is one store of an elementwise function (the epilogue) of one sum

    out[b..., m..., n...] = f(sum over k... of X * Y, other loads at the output's ranges)

where X and Y are expressions of the same 2-byte float type (float16 or bfloat16; the product may be of their
float32 casts, or cast to float32 itself). The output ranges split three ways by which factor reads them: read
only by X they are m (A's rows, flattened, the last fastest), only by Y n, by both a batch range (batched matmul,
attention's heads). The sum's ranges are k. A convolution is one: m = (n, oh, ow), n = (o,), k = (c, kh, kw).

Each factor reaches shared memory one of two ways (codegen/nvptx_gemm.py):
  * copied (`Operand`): a load of the 2-byte type at an affine index over one free range and one k range,
    contiguous along one of them (stride 1), every other stride, its offset and the length of its contiguous axis
    a multiple of 8 elements: 16-byte cp.async copies, in flight while earlier tiles multiply;
  * gathered (`Gather`): anything else (a cast fused in, as autocast makes; a padded or strided view; a
    convolution's window): its expression, rendered by the CPU renderer as a function of the ranges, computes
    each element of the tile.
A kernel that is not a product of two such factors gets no plan, with the reason in one line (`why_not`), and runs
on the CUDA device's ordinary renderer.

The tensor cores multiply exactly and accumulate in float32: the product of two 2-byte floats is not rounded to
the 2-byte type before it is summed, as the ordinary renderers' MUL of two float16 values is. The result is the
more accurate one, within the rounding torch's and tinygrad's tensor-core matmuls give.
"""
from __future__ import annotations

import attrs

from rulec.codegen.opt.transform import free_ranges
from rulec.engine.ir.dtypes import DType, dtypes
from rulec.engine.ir.kernel import Kernel
from rulec.engine.ir.ops import Ops
from rulec.engine.ir.uop import UOp

CHUNK = 8          # elements per 16-byte cp.async copy
HALVES = (dtypes.float16, dtypes.bfloat16)
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
class Gather:
  """A factor the kernel computes element by element into shared memory (codegen/nvptx_gemm.py renders `expr` as a
  function of the ranges): a cast, a padded or strided view, an index that is not affine (a convolution's window)."""
  expr: UOp                    # the factor, of the 2-byte float type (in the kernel as planned)
  position: int                # which source of the product it is (0 or 1)
  free_fastest: bool = False   # its loads step by one element along the last free range, not the last k range: the
                               # kernel's consecutive threads then take consecutive free indices (coalesced reads)
  k_contiguous = True          # (its tile is laid out as [free][k] rows, as a k-contiguous operand's)


@attrs.frozen
class GemmPlan:
  dtype: DType                 # float16 or bfloat16: the type the mma instruction multiplies
  M: int                       # products of the sizes of ms, ns, ks
  N: int
  K: int
  ms: tuple[UOp, ...]          # the output ranges only A reads (flattened: the last fastest), only B reads,
  ns: tuple[UOp, ...]          # the sum's ranges, and the output ranges both read
  ks: tuple[UOp, ...]
  batch: tuple[UOp, ...]
  a: "Operand | Gather"
  b: "Operand | Gather"
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


def _half_factor(u: UOp) -> UOp | None:
  """The 2-byte float expression a factor is (through a float32 cast), or None."""
  if u.op is Ops.CAST and u.dtype is dtypes.float32 and u.src[0].dtype in HALVES: u = u.src[0]
  return u if u.dtype in HALVES else None


def _factors(red: UOp) -> tuple[UOp, UOp]:
  body = red.src[0]
  if body.op is Ops.CAST and body.dtype is dtypes.float32 and body.src[0].op is Ops.MUL: body = body.src[0]
  if body.op is not Ops.MUL: raise NoPlan(f"the sum is of {body.op.name}, not of a product")
  x, y = (_half_factor(s) for s in body.src)
  if x is None or y is None:
    names = ", ".join(s.dtype.name for s in body.src)
    raise NoPlan(f"the product is of {names}; the tensor cores take two float16 or two bfloat16 values")
  if x.dtype is not y.dtype:
    raise NoPlan(f"the product is of {x.dtype.name} and {y.dtype.name}; the tensor cores take two float16 or two bfloat16")
  if any(u.op in (Ops.REDUCE, Ops.RUNMAX) for f in (x, y) for u in f.toposort()):
    raise NoPlan("a factor holds a reduction of its own")
  return x, y


def _flat_stride(ix: dict, rs: tuple) -> int | None:
  """The stride of ranges rs (the last fastest) flattened into one index, in the affine index ix: the last range's
  coefficient, where each range's is the next one's times its size; else None (the ranges do not flatten)."""
  want = stride = ix.get(rs[-1], 0)
  for r in reversed(rs):
    if ix.get(r, 0) != want: return None
    want *= r.src[0].arg
  return stride


def _copied(expr: UOp, free: tuple, k: tuple, batch: tuple) -> Operand | None:
  """The factor as an Operand the kernel copies with cp.async, or None where it must be gathered: a load of the
  2-byte type at an affine index, over free and k ranges that each flatten into one index (a (batch, time) pair of
  an activation does), contiguous along one of the two, aligned."""
  load = expr
  if not (load.op is Ops.INDEX and len(load.src) == 2 and load.src[0].op is Ops.PARAM): return None
  ix = affine(load.src[1])
  if ix is None or any(r is not None and r not in (*free, *k, *batch) for r in ix): return None
  sf, sk, base = _flat_stride(ix, free), _flat_stride(ix, k), ix.get(None, 0)
  if sf is None or sk is None: return None
  sb = tuple(ix.get(r, 0) for r in batch)
  if sk == 1: contiguous, others = k, (sf, *sb, base)
  elif sf == 1: contiguous, others = free, (sk, *sb, base)
  else: return None
  if any(s % CHUNK for s in others) or _size(contiguous) % CHUNK or any(s < 0 for s in (sf, sk, *sb, base)): return None
  return Operand(load.src[0].arg[0], base, sf, sk, sb, sk == 1)


def _gathered(expr: UOp, position: int, free: tuple, k: tuple) -> Gather:
  """The factor as a Gather, told which way its widest load is contiguous (a cast of x.T, as autocast's weight
  gradients make, reads along the free range)."""
  # (the loads that read a matrix: over a free and a k range; a row's statistics or a column's scale are broadcasts)
  loads = [ix for u in expr.toposort() if u.op is Ops.INDEX and len(u.src) == 2 and u.src[0].op is Ops.PARAM
           for ix in [affine(u.src[1])] if ix is not None and any(r in ix for r in free) and any(r in ix for r in k)]
  fast = bool(loads) and all(ix.get(free[-1], 0) == 1 and ix.get(k[-1], 0) != 1 for ix in loads)
  return Gather(expr, position, fast)


def _size(rs) -> int:
  n = 1
  for r in rs: n *= r.src[0].arg
  return n


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
  if red.dtype not in (*HALVES, dtypes.float32): raise NoPlan(f"a sum of {red.dtype.name}")
  ks = tuple(red.src[1:])
  if not ks or any(r.op is not Ops.RANGE or not isinstance(r.src[0].arg, int) for r in ks):
    raise NoPlan("the sum is not over ranges of constant sizes")
  x, y = _factors(red)
  in_x, in_y = free_ranges(x), free_ranges(y)   # (a factor holds no reduce: every range under it)
  if any(r not in ranges and r not in ks for r in in_x | in_y): raise NoPlan("a factor opens a range of its own")
  ms = tuple(r for r in ranges if r in in_x and r not in in_y)
  ns = tuple(r for r in ranges if r in in_y and r not in in_x)
  batch = tuple(r for r in ranges if r in in_x and r in in_y)
  if not ms or not ns: raise NoPlan("no output range that only one factor reads: not a matrix product")
  if len(ms) + len(ns) + len(batch) != len(ranges): raise NoPlan("an output range neither factor reads (a broadcast result)")
  if _size(batch) > MAX_GRID_YZ: raise NoPlan(f"{_size(batch)} batches, more than a grid's {MAX_GRID_YZ}")
  if any(u.op is Ops.RANGE and u not in ranges and u not in ks for u in value.toposort()):
    raise NoPlan("the epilogue opens a range of its own")
  a = _copied(x, ms, ks, batch) or _gathered(x, 0, ms, ks)
  b = _copied(y, ns, ks, batch) or _gathered(y, 1, ns, ks)
  return GemmPlan(x.dtype, _size(ms), _size(ns), _size(ks), ms, ns, ks, batch, a, b, red, store, ranges)


def why_not(kernel: Kernel) -> str | None:
  """None where the kernel has a plan, else the reason it has none."""
  try: plan(kernel)
  except NoPlan as e: return str(e)
  return None
