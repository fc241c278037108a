"""Helpers of rules/early.rules, the cleanups of the tensor graph before any decision: the parts that are
arithmetic (split reduces, bitcasts, broadcasts) rather than pattern-shaped."""
from __future__ import annotations

from rulec.engine.lang.capability import rule_helper

import math
import os

from rulec.engine.ir.dtypes import dtypes
from rulec.engine.ir.ops import MOVEMENT, Ops
from rulec.engine.ir.uop import UOp, prod
from rulec.runtime.devices import one_pass_groups, split_parts

REDUCE_SPLIT_THRESHOLD = int(os.environ.get("RULEC_REDUCE_SPLIT_THRESHOLD", 32768))
SPLIT_MIN_PART = 4096   # on a GPU, the fewest steps a part of a split reduce keeps (see split_reduceop)
# on a GPU, a sum over leading axes that keeps the last one (a column sum: a bias's gradient, 3072 columns of 8192
# rows in a GPT-2 MLP) is split from this many steps an output: unsplit, a work-group shares each column and its
# work-items read it a row apart (a 32-byte sector for every 4 bytes), and few columns leave most compute units idle.
# 0: never. Not a product (a matmul's weight gradient sums over the batch the same way, on the tensor cores)
GPU_COLUMN_SPLIT = int(os.environ.get("RULEC_GPU_COLUMN_SPLIT", 4096))
# ... into parts of about this many steps each: a work-item per part and column, consecutive work-items reading
# consecutive columns, and enough of them to keep loads in flight (8192 rows of 3072 columns: 128 parts, 393K
# work-items of 64 steps, where a split at the root of the axis left 98K of 256)
GPU_COLUMN_PART_STEPS = 64



_UINT = {1: dtypes.uint8, 2: dtypes.uint16, 4: dtypes.uint32, 8: dtypes.uint64}


@rule_helper
def expand_bitcast(bc: UOp, x: UOp) -> UOp:
  """A bitcast to a type of another size as same-size bitcasts, shifts and adds of unsigned integers (the
  seeds' expand_bitcast; little-endian, as numpy on every host here): a wider item is its narrow items shifted
  into place and added (their bits do not overlap); a narrower item is a shifted slice of the wide one."""
  ns, os_ = bc.dtype.itemsize, x.dtype.itemsize
  wide, parts = _UINT[max(ns, os_)], []
  bits = x.bitcast(_UINT[os_]) if x.dtype is not _UINT[os_] else x
  lead = x.shape[:-1]
  if ns > os_:   # (..., n * rate) narrow items -> (..., n) wide ones
    rate = ns // os_
    grouped = bits.reshape(lead + (x.shape[-1] // rate, rate))
    for i in range(rate):
      part = grouped.shrink(tuple((0, d) for d in lead) + ((0, x.shape[-1] // rate), (i, i + 1))).cast(wide)
      parts.append(part << (8 * os_ * i) if i else part)
    total = parts[0]
    for p in parts[1:]: total = total + p
    out = total.reshape(bc.shape)
  else:          # (..., n) wide items -> (..., n * rate) narrow ones: each a slice of bits, placed along a new axis
    rate, narrow = os_ // ns, _UINT[ns]
    n = x.shape[-1]
    for i in range(rate):
      piece = ((bits >> (8 * ns * i)) if i else bits).cast(narrow).reshape(lead + (n, 1))
      parts.append(piece.pad(tuple((0, 0) for _ in lead) + ((0, 0), (i, rate - 1 - i))))
    total = parts[0]
    for p in parts[1:]: total = total + p
    out = total.reshape(bc.shape)
  return out if bc.dtype is out.dtype else out.bitcast(bc.dtype)


# float mantissa bits: a sum of n copies of an integer c is exact while |n * c| stays below 2 ** bits
_MANTISSA = {"float16": 11, "bfloat16": 8, "float32": 24, "float64": 53}


@rule_helper
def fold_constant_reduce(red: UOp, x: UOp) -> UOp | None:
  """A reduce of a broadcast constant (no padding on the way) as a constant, where that is exact: a max is the
  constant, a sum n * c (for floats only when every partial sum is exact: c an integer and |n * c| small), a
  product of 0 or 1 itself. The gradient of a sum is such a constant, so its own sums fold away."""
  v = x
  while v.op in MOVEMENT:
    if v.op is Ops.PAD: return None
    v = v.src[0]
  # (a reduce over nothing is its identity, not the constant: reduce_empty_* answer it)
  if v.op is not Ops.CONST or not red._shape or prod(red.shape) == 0 or prod(x.shape) == 0: return None
  n, c, op = prod(x.shape) // prod(red.shape), v.arg, red.arg[0]
  if op is Ops.MAX or red.dtype is dtypes.bool: return red.const_like(c)
  if op is Ops.MUL: return red.const_like(c) if c in (0, 1) else None
  if op is not Ops.ADD: return None
  if red.dtype.is_float and not (c == 0 or (float(c).is_integer() and abs(c) * n < 2 ** _MANTISSA.get(red.dtype.name, 0))):
    return None
  return red.const_like(c * n)


def _one_hot_select(x: UOp) -> bool:
  """x selects by an equality and is 0 elsewhere (WHERE(i == j, v, 0): a gather, an Embedding, advanced indexing):
  its sum is one element per output once the symbolic rules collapse it (rules/symbolic.rules one_hot_sum), so it
  is not split: a split sum would read every element of the table."""
  if x.op is not Ops.WHERE: return False
  zero, eq = x.src[2].base, x.src[0].base
  # (an equality with a constant, `(x == 3).where(y, 0).sum()`, is a masked sum, not a gather: still split)
  return zero.op is Ops.CONST and zero.arg == 0 and eq.op is Ops.CMPEQ and all(s.base.op is not Ops.CONST for s in eq.src)


def _column_sum(x: UOp, axes: tuple[int, ...]) -> bool:
  """The reduce of x over `axes` keeps x's last axis (more than one element) and reduces only axes before it, and x
  is no product (a contraction's sum, which a GPU runs in register tiles or on tensor cores)."""
  last = len(x.shape) - 1
  return last >= 1 and last not in axes and x.shape[last] > 1 and x.base.op is not Ops.MUL


@rule_helper
def split_reduceop(red: UOp, x: UOp) -> UOp | None:
  """A large reduce with few outputs as two reduces, so the first can run in parallel.

  One reduced axis of x (size divisible by d, 8 <= d <= sqrt(size) and the
  device's split_parts, 256 but thousands on a GPU) is split into (d, size/d); the inner part is
  reduced into a realized buffer of d partial results per output, which a
  second, small reduce combines."""
  op, axes = red.arg
  if red.tag == "split" or 0 in x.shape: return None
  steps = prod(x.shape) // max(1, prod(red.shape))
  column_from = GPU_COLUMN_SPLIT if 0 < GPU_COLUMN_SPLIT < REDUCE_SPLIT_THRESHOLD else REDUCE_SPLIT_THRESHOLD
  if steps < column_from: return None   # (the device is asked only for a reduce long enough for some split)
  parts = split_parts(x.device)
  column = parts > 256 and GPU_COLUMN_SPLIT > 0 and _column_sum(x, axes)
  if steps < REDUCE_SPLIT_THRESHOLD and not column: return None
  if op is Ops.ADD and _one_hot_select(x): return None
  whole = prod(x.shape[a] for a in axes)
  for ax in axes:
    # at most sqrt(size) parts, so that the second reduce is no bigger than the first (and is not split again). A
    # device that takes thousands of parts (a GPU) bounds them by the whole reduction's size: a convolution's weight
    # gradient over N x H x W had 8 parts of its batch of 64 (the axis' own root), 144 work-groups for 132 units.
    # Parts beyond the axis' root keep SPLIT_MIN_PART steps each: the GPU's tile for a long sum
    # (codegen/opt/choose.LONG_SUM_MIN)
    root = math.isqrt(x.shape[ax])
    if parts > 256: root = max(root, min(math.isqrt(whole), whole // SPLIT_MIN_PART))
    top = min(parts, max(8, root), max(8, (1 << 22) // max(1, prod(red.shape))))
    if column: top = min(parts, max(8, whole // GPU_COLUMN_PART_STEPS))
    for d in range(top, 7, -1):
      if x.shape[ax] % d == 0 and x.shape[ax] // d > 1: break
    else: continue
    shape = x.shape[:ax] + (d, x.shape[ax] // d) + x.shape[ax + 1:]
    # reduce the inner part (and the other reduced axes), keeping d partial results per output
    inner_axes = tuple(sorted({a + (1 if a > ax else 0) for a in axes if a != ax} | {ax + 1}))
    # the tag keeps this rule from splitting the first stage again
    partial = x.reshape(shape).r(op, inner_axes).rtag("split").contiguous()
    return partial.r(op, (ax,)).reshape(red.shape)
  return None


@rule_helper
def reduces_in_one_pass(red: UOp) -> bool:
  """Whether the reduce, to a single value, runs as one kernel on its device (the CL device's GRID on a GPU: its
  work-groups' partial results combined by the last group to finish) rather than split in two."""
  if red.size != 1 or (n := one_pass_groups(red.device)) <= 0: return False
  # the kernel's GRID needs a reduce range it divides; where the split below would find a part size of 8 or more,
  # a range of the input has such a divisor (else the split into two kernels stays)
  return any(s % d == 0 and s // d >= 2 for s in red.src[0].shape for d in range(min(n, s // 2), 7, -1))


@rule_helper
def same_view(view: UOp, x: UOp) -> UOp:
  """x (a value of view's base shape) seen through the movement ops that make `view` from its base."""
  chain = []
  while view.op in MOVEMENT:
    chain.append(view)
    view = view.src[0]
  for m in reversed(chain): x = m.replace(src=(x,))
  return x


@rule_helper
def needs_staging_before_store(target: UOp, value: UOp) -> bool:
  """Whether writing value into target in place could read elements it already overwrote.

  In place is safe only when each element of the value reads the target's buffer at the element it writes:
  through elementwise ops and reshapes over the target view itself, or over the whole buffer when the target
  is the whole buffer in order. Anything else (a reduce, a broadcast, a permute, a flip, a pad, a shrink over
  the target, or the buffer read through any view other than the target's: `t.flip(0).assign(t)`) makes the
  value be realized first. A value stored before this one (a CONTIGUOUS, another buffer's write: ASSIGN, AFTER)
  is read from its buffer: what it read of the target does not count (an optimizer's update reads its state, just
  written from a gradient that reduced over the parameter; that write runs first, kernels are ordered so)."""
  base = target.base
  if base not in value.toposort(): return False
  whole = all(m.op is Ops.RESHAPE for m in target.toposort() if m.op in MOVEMENT)
  stored = (Ops.CONTIGUOUS, Ops.ASSIGN, Ops.AFTER)
  reaches: dict[UOp, bool] = {}
  for u in value.toposort(gate=lambda u: u.op not in stored and u is not target):
    if u is target or u is base: reaches[u] = True
    else: reaches[u] = u.op not in stored and any(reaches.get(s, False) for s in u.src)
    if u is base and not whole: return True
    if reaches[u] and ((u.op in MOVEMENT and u.op is not Ops.RESHAPE) or u.op is Ops.REDUCE_AXIS): return True
  return False


def is_buffer_view(x: UOp) -> bool:
  """A plain reshape of a whole buffer: already realized, no kernel needed."""
  return x.op is Ops.BUFFER or (x.op is Ops.RESHAPE and x.src[0].op is Ops.BUFFER)


@rule_helper
def broadcast_sources(x: UOp) -> UOp:
  """An elementwise op whose sources have different shapes, with each source expanded to the common shape."""
  shapes = [s.shape for s in x.src]
  nd = max(len(sh) for sh in shapes)
  padded = [(1,) * (nd - len(sh)) + sh for sh in shapes]
  out = []
  for dims in zip(*padded):
    sizes = {d for d in dims if d != 1}   # 1 broadcasts to any size, 0 included
    if len(sizes) > 1: raise ValueError(f"cannot broadcast shapes {shapes}")
    out.append(sizes.pop() if sizes else 1)
  out = tuple(out)
  return x.replace(src=tuple(s.reshape(p).expand(out) for s, p in zip(x.src, padded)))
