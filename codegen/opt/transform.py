"""Applying optimizer actions (codegen/opt/actions.py) to a kernel: transformations of its graph.

Every action either splits a range, `r -> outer * n + inner` with the inner part a new range of a
kind the renderers know, or marks a range with a kind. After them the renderers only follow the
kinds; they choose nothing:

  loop      a loop (CPU) or part of the NDRange (CL store ranges)
  thread    the CPU's loop split across threads (THREAD); loop:<n> / thread:<n>, the tiles of a ragged UPCAST
  upcast    lanes: the range is unrolled, each lane emitted side by side, sharing reduce loops (UPCAST);
            upcast:<size> where the lanes do not divide the range's size: the last tile overlaps the one before
  local     the work-items of one work-group (LOCAL); local:<size> where they do not divide the range (as upcast)
  serial    a block loop outside every store loop (KBLOCK's and BLOCK's outer part)
  simd      a CPU reduce loop the loop vectoriser runs in vector lanes, under upcast lanes that are not the vector
            (SIMD)
  group:n   a reduce range the work-group of n work-items strides through together (GROUP); group:n:v on
            the innermost one: v neighbouring elements per step, with vector loads (VECTOR after GROUP)
  vector:n  the one range of an elementwise kernel, n elements per work-item (VECTOR)
  spread:n  a store range the n work-items of a group take in turn, a, a + n, ... (SPREAD)
  grid:n    the outer part of a group reduction's outermost range: which of n work-groups takes which share of
            the one reduction (GRID); the last group to finish combines their partial results
  stage:n   the outer part of a register tile's reduce range, in blocks of n (STAGE), after the reduction's other
            ranges (loops around the blocks): per block the work-group copies what its staged loads read over the
            block's part of the range into local memory together, then the lanes read it from there; where n does
            not divide the range, the steps after the last whole block are a reduction of their own, unstaged

Each action checks that it applies (an OptError says why not, naming the action and the ranges
there are), so an action list a user forces can never change what a kernel computes.
"""
from __future__ import annotations

import math

from rulec.codegen.opt.actions import Action, OptError
from rulec.engine.ir.dtypes import dtypes
from rulec.engine.ir.facts import terms_of
from rulec.engine.ir.ops import ALU, Ops
from rulec.engine.ir.rewrite import substitute
from rulec.engine.ir.uop import UOp
from rulec.engine.ir.kernel import Kernel

# which actions each renderer can follow
DEVICE_ACTIONS = {"CPU": frozenset({"UPCAST", "KBLOCK", "THREAD", "SIMD", "BLOCK", "PREFETCH"}),
                  "CL": frozenset({"UPCAST", "LOCAL", "GROUP", "VECTOR", "GRID", "SPREAD", "STAGE"})}
MAX_LANES = 512          # upcast lanes in one kernel: each is emitted as code of its own (a 14 x 32 tile: 448)
MAX_GROUP = 1024         # work-items sharing one reduction
VECTOR_WIDTHS = (2, 4, 8, 16)   # OpenCL's vector sizes
VECTOR_DTYPES = (dtypes.float32, dtypes.int32, dtypes.uint32)
MAX_PREFETCH_AHEAD = 64  # PREFETCH's distance, in steps, at most
MAX_STAGED_BYTES = 32 * 1024   # local memory for STAGE's blocks (OpenCL promises 32 KiB to every work-group)


def _kind_fields(r: UOp) -> list[str]:
  """A RANGE's kind split at its colons: ["loop"], ["group", "64"], ["group", "64", "4"], ["vector", "4"] ..."""
  return str(r.arg[1] if isinstance(r.arg, tuple) and len(r.arg) > 1 else "loop").split(":")


def range_kind(r: UOp) -> tuple[str, int | None]:
  """A RANGE's kind and, for group:n / vector:n, its amount."""
  fields = _kind_fields(r)
  return fields[0], (int(fields[1]) if len(fields) > 1 else None)


def prefetch_ahead(r: UOp) -> int | None:
  """PREFETCH's distance for a reduce range it marked (prefetch:n, or partial:size:axis:n), else None."""
  fields = _kind_fields(r)
  if fields[0] == "prefetch": return int(fields[1])
  return int(fields[3]) if fields[0] == "partial" and len(fields) > 3 else None


def group_vector(r: UOp) -> int:
  """Elements per load of a group reduction's innermost range (group:n:v, VECTOR on a GROUP kernel), else 1."""
  fields = _kind_fields(r)
  return int(fields[2]) if fields[0] == "group" and len(fields) > 2 else 1


def contiguous_offset(u: UOp, r: UOp) -> UOp | None:
  """Where u's index starts when u is a load of 4-byte elements whose index is r itself (0) or (something without
  r) + r (that something), proven inside its buffer (not clamped): v neighbouring values of r then read v
  neighbouring elements, one vector load. None for any other node."""
  if u.op is not Ops.INDEX or u.arg is not None or u.dtype not in VECTOR_DTYPES: return None
  idx = u.src[1]
  if idx is r: return UOp.const(dtypes.index, 0)
  if idx.op is not Ops.ADD: return None
  return next((b for a, b in (idx.src, idx.src[::-1]) if a is r and r not in b.toposort()), None)


def size(r: UOp) -> int: return r.src[0].arg


def stored_sum(value: UOp) -> UOp | None:
  """The one REDUCE in a store's value, where the value is it or an elementwise function of it (a matmul with a
  bias, gelu or a residual add after it) and no other reduce is inside; else None."""
  reduces = [u for u in value.toposort() if u.op is Ops.REDUCE]
  if len(reduces) != 1: return None
  red = reduces[0]
  if value is red: return red
  # (every path from the value down to the sum is elementwise: nothing indexes it elsewhere). One pass, children
  # first: which nodes reach the sum
  reaches: set[UOp] = {red}
  for u in value.toposort(gate=lambda x: x is not red):
    if u is not red and any(s in reaches for s in u.src):
      if not (u.op in ALU or u.op in (Ops.CAST, Ops.BITCAST)): return None
      reaches.add(u)
  return red


def renamed_reduce(red: UOp) -> UOp:
  """red (a reduce, or any value) with the ranges it and the reduces inside it reduce over renamed by order of
  appearance: equal for two that compute the same value over ranges of their own (a fused softmax reads its row max
  twice; attention's scores are computed in the max's loop and in the sum's)."""
  own = [r for u in red.toposort() if u.op is Ops.REDUCE for r in u.src[1:]]
  return substitute(red, {r: UOp.range(r.src[0], -1 - i, range_kind(r)[0]) for i, r in enumerate(dict.fromkeys(own))})


def free_ranges(u: UOp) -> frozenset:
  """The ranges u's value depends on: every range under it but those its reduces (u's own too) reduce over."""
  free: dict[UOp, frozenset] = {}
  for x in u.toposort():
    if x.op is Ops.RANGE: free[x] = frozenset((x,))
    else:
      f = frozenset().union(*(free[s] for s in x.src)) if x.src else frozenset()
      free[x] = f - frozenset(x.src[1:]) if x.op is Ops.REDUCE else f
  return free[u]


def _shared_reductions(a: Action, top: UOp, store_ranges) -> list[UOp]:
  """The reduces of a kernel whose work-group shares them (GROUP, SPREAD): each may depend on the store's ranges
  only (besides its own), so every work-item of a group computes each one once, in the same order, before the
  store: a reduce inside another is computed first, outside it (every work-item must reach every barrier)."""
  reduces = [u for u in top.toposort() if u.op is Ops.REDUCE]
  if not reduces: raise OptError(f"{a}: the kernel has no reduction")
  allowed = frozenset(store_ranges)
  for u in reduces:
    if not free_ranges(u) <= allowed:
      raise OptError(f"{a}: a reduction depends on r{' r'.join(str(r.arg[0]) for r in free_ranges(u) - allowed)}, which "
                     "is not fixed for a work-group (the range spread across it, or an enclosing reduction's), so it "
                     "cannot be computed once per work-group")
  return reduces


def _names(rs) -> str: return " ".join(f"r{r.arg[0]}[{size(r)}]" for r in rs) or "none"


def _sole_end(ast: UOp, a: Action) -> UOp:
  if len(ast.src) != 1 or ast.src[0].op is not Ops.END:
    raise OptError(f"{a}: only a kernel with one store that loops can take it (this one has {len(ast.src)} stores"
                   f"{'' if ast.src and ast.src[0].op is Ops.END else ', no loop'})")
  return ast.src[0]


def _store_range(end: UOp, a: Action, kinds=("loop", "thread")) -> UOp:
  for r in end.src[1:]:
    if r.arg[0] == a.axis:
      if range_kind(r)[0] not in kinds:
        raise OptError(f"{a}: r{a.axis} is a {r.arg[1]} range already; it takes a {' or '.join(kinds)} range")
      return r
  loops = [r for r in end.src[1:] if range_kind(r)[0] in kinds]
  raise OptError(f"{a}: r{a.axis} is not a store range of this kernel (those it can take: {_names(loops)})")


def _joined(outer: UOp, n: int, inner: UOp) -> UOp:
  """outer * n + inner: where a range split into an outer and an inner part stood."""
  return UOp(Ops.ADD, dtypes.index, (UOp(Ops.MUL, dtypes.index, (outer, UOp.const(dtypes.index, n))), inner))


def _split_divisions(value: UOp, joined: UOp, n: int) -> UOp:
  """value with each division and remainder of a split range (`joined`: outer * n + inner, inner in [0, n)) by a
  divisor m of n taken apart: (outer * n + inner) // m = outer * (n // m) + inner // m, and % m = inner % m, so that
  what depends on the outer part only (a head's index, c // 64, when 64 lanes split c) is seen not to depend on the
  lanes. (Exact: outer * n is a multiple of m, and both parts are non-negative.)"""
  outer, inner = joined.src[0].src[0], joined.src[1]
  mapping = {}
  for u in value.toposort():
    if u.op in (Ops.IDIV, Ops.CDIV, Ops.MOD, Ops.CMOD) and u.src[0] is joined and u.src[1].op is Ops.CONST \
       and isinstance(m := u.src[1].arg, int) and m > 0 and n % m == 0:
      if u.op in (Ops.IDIV, Ops.CDIV):
        low = inner if m == 1 else UOp(u.op, u.dtype, (inner, u.src[1]), u.arg) if m < n else UOp.const(u.dtype, 0)
        mapping[u] = UOp(Ops.ADD, u.dtype, (UOp(Ops.MUL, u.dtype, (outer, UOp.const(u.dtype, n // m))), low))
      else: mapping[u] = inner if m == n else UOp(u.op, u.dtype, (inner, u.src[1]), u.arg)
  return substitute(value, mapping) if mapping else value


def merged_reduce_ranges(kernel: Kernel) -> Kernel:
  """The kernel with each pair of adjacent ranges of a reduction that its value reads only as one (outer * n + inner:
  every load's index affine in both, the outer's coefficient n times the inner's, n the inner's size, and nothing
  but load indices depending on them) made one range of their product. A weight gradient x.T @ dy over a batch and
  a sequence (8 x 1024) is then one sum of 8192, which the GPU's tiles stage in local memory like any matmul's
  (codegen/opt/choose.py gpu_tile takes one reduce range), and the CPU's KBLOCK blocks (it takes one too). Measured:
  an H100's GPT-2 MLP fwd+bwd at B4 T1024 7.76 -> 5.83 ms, GPT-2 block fwd+bwd 31.0 -> 25.1; this CPU's weight
  gradient 768 x 2304 over 2 x 256 at one thread 38.8 -> 15.5 ms."""
  ast = kernel.ast
  users: dict[UOp, set[UOp]] = {}
  for u in ast.toposort():
    for x in u.src:
      if x.op is Ops.RANGE: users.setdefault(x, set()).add(u)
  for red in [u for u in ast.toposort() if u.op is Ops.REDUCE and len(u.src) > 2]:
    # (only ranges nothing outside this reduction reads: another one over the same range keeps it)
    inside = set(red.toposort())
    mine = lambda r: users.get(r, set()) <= inside  # noqa: E731
    new = red
    while True:
      merged = next((m for a, b in zip(new.src[1:], new.src[2:]) if mine(a) and mine(b) and (m := _merge_pair(new, a, b)) is not None), None)
      if merged is None: break
      new = merged
    if new is not red: ast = substitute(ast, {red: new})
  return kernel if ast is kernel.ast else Kernel(ast, kernel.bufs)


def _merge_pair(red: UOp, outer: UOp, inner: UOp) -> UOp | None:
  """red with ranges outer and inner made one (merged_reduce_ranges), or None where its value reads them otherwise."""
  if not all(r.op is Ops.RANGE and range_kind(r)[0] in ("loop", "reduce") and isinstance(r.src[0].arg, int) for r in (outer, inner)):
    return None
  value, n = red.src[0], inner.src[0].arg
  # the nodes whose value depends on the ranges other than through a load (a load's value is another matter)
  direct: set[UOp] = set()
  for u in value.toposort():
    if u is outer or u is inner or (u.op is not Ops.INDEX and any(s in direct for s in u.src)): direct.add(u)
  loads = [u for u in value.toposort() if u.op is Ops.INDEX and len(u.src) == 2 and u.src[1] in direct]
  allowed = set().union(*(set(x.src[1].toposort()) for x in loads)) if loads else set()
  if not loads or not direct <= allowed: return None
  for x in loads:
    a, b = _step(x.src[1], outer), _step(x.src[1], inner)
    if a is None or b is None or a != n * b: return None
  both = UOp.range(outer.src[0].arg * n, outer.arg[0], outer.arg[1])
  fresh = substitute(value, {outer: UOp.const(outer.dtype, 0), inner: both})
  return UOp(Ops.REDUCE, red.dtype, (fresh, *(both if r is outer else r for r in red.src[1:] if r is not inner)), red.arg)


def _step(idx: UOp, r: UOp) -> int | None:
  """idx's step along r where idx is affine in it (engine/ir/facts.py terms_of: r a term of its own, no other term
  reading it), else None."""
  terms, _ = terms_of(idx)
  if any(t is not r and r in t.toposort() for _, t in terms): return None
  return sum(k for k, t in terms if t is r)


def tiles(total: int, n: int) -> int:
  """How many tiles of n a split of a range of `total` has: ceil(total / n), the last overlapping the one before
  where n does not divide (a ragged split)."""
  return -(-total // n)


def _aliased(k: Kernel) -> bool:
  return len({id(b) for b in k.bufs}) != len(k.bufs)


def reads_what_it_writes(k: Kernel) -> bool:
  """Whether a kernel reads a buffer it writes (or two of its buffers are one): it may not take a ragged split, whose
  overlapping tiles compute some outputs twice."""
  return _aliased(k) or bool(set(k.outputs) & set(k.inputs))


def _overlapped(st: UOp) -> UOp | None:
  """Whether a lane of a ragged split under store st is one the tile before also has (lane < tile * n - start), or
  None where st has no ragged split. As lanes against a per-tile bound, not as the lanes' element indices: those,
  compared before a sum, become values of their own that its loads then reuse, and LLVM's SLP vectoriser left part of
  a 14 x 32 tile's inner loop scalar."""
  conds = [UOp(Ops.CMPLT, dtypes.bool, (x.src[1], UOp(Ops.ADD, dtypes.index, (x.src[0].src[1], UOp(
    Ops.MUL, dtypes.index, (x.src[0], UOp.const(dtypes.index, -1))))))) for x in st.toposort() if _ragged_lane(x)]
  if not conds: return None
  out = conds[0]
  for c in conds[1:]: out = UOp(Ops.OR, dtypes.bool, (out, c))
  return out


def _ragged_lane(x: UOp) -> bool:
  """Whether x is a ragged UPCAST's (or LOCAL's) element index, start + lane (_Applier._ragged)."""
  return (x.op is Ops.ADD and x.src[1].op is Ops.RANGE and range_kind(x.src[1])[0] in ("upcast", "local")
          and range_kind(x.src[1])[1] is not None and x.src[0].op is Ops.WHERE)


def _rebuild(ast: UOp, end: UOp | None, store: UOp, ranges) -> UOp:
  top = store if end is None else UOp(Ops.END, end.dtype, (store, *ranges), end.arg)
  return UOp(Ops.SINK, ast.dtype, (top,), ast.arg)


class _Applier:
  def __init__(self, kernel: Kernel, device: str):
    self.k, self.device = kernel, device
    self.ast = kernel.ast
    self.kblocked = False   # after KBLOCK the kernel reads the sums earlier blocks stored
    self.next_axis = 1 + max((r.arg[0] for r in kernel.ranges if isinstance(r.arg[0], int)), default=-1)

  def new_axis(self) -> int:
    self.next_axis += 1
    return self.next_axis - 1

  def apply(self, a: Action) -> None:
    if a.op not in DEVICE_ACTIONS[self.device]:
      raise OptError(f"{a}: the {self.device} renderer does not take {a.op} "
                     f"(it takes {', '.join(sorted(DEVICE_ACTIONS[self.device]))})")
    getattr(self, a.op.lower())(a)

  # *** splits ***
  def _split(self, a: Action, inner_kind: str) -> None:
    end = _sole_end(self.ast, a)
    r = _store_range(end, a, ("loop", "thread") if inner_kind == "upcast" else ("loop",))
    n, total = a.amount, size(r)
    if n < 2: raise OptError(f"{a}: the amount must be at least 2")
    if total % n == 0:
      outer, inner = UOp.range(total // n, a.axis, r.arg[1]), UOp.range(n, self.new_axis(), inner_kind)
      # (a whole range in lanes: its outer part, of size 1, is 0 in the value, so that a select on the range (a
      # stack's pieces: where(r < 1, a, 0) + ...) folds in each lane)
      expr = inner if total == n else _joined(outer, n, inner)
    elif total < n: raise OptError(f"{a}: r{a.axis} has size {total}, fewer than {n}")
    else: outer, inner, expr = self._ragged(a, r, inner_kind)
    ranges = []
    for x in end.src[1:]: ranges += [outer, inner] if x is r else [x]
    value = substitute(end.src[0], {r: expr})
    self.ast = _rebuild(self.ast, end, _split_divisions(value, expr, n) if total % n == 0 and total > n else value, ranges)
    lanes = math.prod(size(x) for x in ranges if range_kind(x)[0] == "upcast")
    if lanes > MAX_LANES: raise OptError(f"{a}: {lanes} lanes in all; a kernel takes at most {MAX_LANES}")

  def _ragged(self, a: Action, r: UOp, kind: str) -> tuple[UOp, UOp, UOp]:
    """UPCAST(a,n) (or LOCAL) of a range n does not divide: ceil(total / n) tiles of n lanes, the last one moved back to end
    at the range's end, so it overlaps the one before (min(tile * n, total - n) + lane). Every lane stays in range
    and the lanes stay neighbours (vector loads), with no guard; the overlapped outputs are computed twice and
    stored twice, the same value both times, which holds only where the kernel does not read what it writes (KBLOCK,
    which does, leaves the twice-computed lanes of the last tile as the tile before stored them). The lanes' kind is
    upcast:<total> and the tiles' loop:<n> (thread:<n> after THREAD): the runtime keeps the last two tiles in one
    thread's share when the kernel reads what it writes."""
    n, total = a.amount, size(r)
    if reads_what_it_writes(self.k) or self.kblocked:
      raise OptError(f"{a}: r{a.axis} has size {total}, which {n} does not divide, and the kernel reads a buffer it "
                     f"writes{' (after KBLOCK: the sums of earlier blocks; UPCAST first, then KBLOCK)' if self.kblocked else ''}, "
                     "so the last tile, which overlaps the one before, would compute some outputs from values already stored")
    outer = UOp.range(tiles(total, n), a.axis, f"{range_kind(r)[0]}:{n}")
    inner = UOp.range(n, self.new_axis(), f"{kind}:{total}")
    tile, last = UOp(Ops.MUL, dtypes.index, (outer, UOp.const(dtypes.index, n))), UOp.const(dtypes.index, total - n)
    start = UOp(Ops.WHERE, dtypes.index, (UOp(Ops.CMPLT, dtypes.bool, (tile, last)), tile, last))
    return outer, inner, UOp(Ops.ADD, dtypes.index, (start, inner))

  def upcast(self, a: Action) -> None: self._split(a, "upcast")

  def local(self, a: Action) -> None:
    self._split(a, "local")
    end = self.ast.src[0]
    items = math.prod(size(x) for x in end.src[1:] if range_kind(x)[0] == "local")
    if items > MAX_GROUP: raise OptError(f"{a}: {items} work-items per work-group; at most {MAX_GROUP}")

  def kblock(self, a: Action) -> None:
    end = _sole_end(self.ast, a)
    st = end.src[0]
    target, stored = st.src
    red = stored_sum(stored)
    if red is None or red.arg is not Ops.ADD or red.dtype not in (dtypes.float32, dtypes.float64) \
       or len(red.src) != 2 or red.src[1].arg[0] != a.axis or stored.dtype != red.dtype:
      raise OptError(f"{a}: takes a kernel that stores a float sum over one range, r{a.axis}, into its output (or an "
                     "elementwise function of it, of the sum's dtype)")
    if _aliased(self.k) or target.src[0] in stored.toposort():
      raise OptError(f"{a}: the sum reads the buffer it writes, so a block would see another block's partial sums")
    k = red.src[1]
    block, inner, expr = self._serial_blocks(a, k, partial=True)
    part = UOp(Ops.REDUCE, red.dtype, (substitute(red.src[0], {k: expr}), inner), Ops.ADD)
    first = UOp(Ops.CMPLT, dtypes.bool, (block, UOp.const(dtypes.index, 1)))
    before = UOp(Ops.WHERE, red.dtype, (first, UOp.const(red.dtype, 0.0), target))   # what earlier blocks stored
    value = UOp(Ops.ADD, red.dtype, (before, part))
    # a ragged UPCAST's last tile overlaps the one before, which has added this block already: those lanes store
    # back what they find
    twice = _overlapped(st)
    back = (lambda v: UOp(Ops.WHERE, red.dtype, (twice, target, v))) if twice is not None else (lambda v: v)
    if stored is not red:
      # an epilogue (a bias, gelu, a residual add): the blocks store the partial sums, the last one the epilogue of
      # the whole sum (a matmul's epilogue kept it from KBLOCK: GPT-2's MLP ran its matmuls at half the plain speed).
      # The block's test is outermost, the same for every lane: the CPU renderer branches on it rather than
      # selecting, so only the last block computes an epilogue's transcendentals (gelu's exp)
      last = UOp(Ops.CMPLT, dtypes.bool, (block, UOp.const(dtypes.index, size(block) - 1)))
      value = UOp(Ops.WHERE, red.dtype, (last, back(value), back(substitute(stored, {red: value}))))
    else: value = back(value)
    self.ast = _rebuild(self.ast, end, UOp(Ops.STORE, st.dtype, (target, value), st.arg), (block, *end.src[1:]))
    self.kblocked = True

  def _serial_blocks(self, a: Action, r: UOp, partial: bool = False) -> tuple[UOp, UOp, UOp]:
    """Range r in blocks of a.amount (KBLOCK, BLOCK): the `serial` block range, the range within a block, and the
    expression that stands for r. partial (a reduce range): a block that does not divide r's size is allowed, the
    range within a block then `partial:<size>:<block axis>`, which the CPU renderer runs to min(n, size - block * n)
    steps (the last block shorter: 1009 in blocks of 64, the last of 49)."""
    n, total = a.amount, size(r)
    if n < 2 or n >= total or (total % n and not partial):
      raise OptError(f"{a}: r{a.axis} has size {total}; the block must {'' if partial else 'divide it and '}be smaller "
                     "(and at least 2)")
    outer = UOp.range(tiles(total, n), a.axis, "serial")
    inner = UOp.range(n, self.new_axis(), "loop" if total % n == 0 else f"partial:{total}:{a.axis}")
    return outer, inner, _joined(outer, n, inner)

  # *** marks ***
  def _mark(self, rs, kind: str) -> None:
    top = self.ast.src[0]
    mapping = {r: UOp.range(size(r), r.arg[0], kind) for r in rs}
    if top.op is not Ops.END: self.ast = _rebuild(self.ast, None, substitute(top, mapping), ())
    else: self.ast = _rebuild(self.ast, top, substitute(top.src[0], mapping), [mapping.get(x, x) for x in top.src[1:]])

  def thread(self, a: Action) -> None:
    end = _sole_end(self.ast, a)
    if any(range_kind(r)[0] == "thread" for r in end.src[1:]): raise OptError(f"{a}: the kernel has a THREAD range already")
    r = _store_range(end, a, ("loop",))
    lanes = range_kind(r)[1]
    self._mark([r], "thread" if lanes is None else f"thread:{lanes}")

  def block(self, a: Action) -> None:
    """Store range a in blocks of n: its outer part a `serial` loop outside every other store loop (the threads
    included), so one block of what the inner part reads stays in cache while every other store loop runs."""
    end = _sole_end(self.ast, a)
    r = _store_range(end, a, ("loop",))
    outer, inner, expr = self._serial_blocks(a, r)
    ranges = [outer] + [inner if x is r else x for x in end.src[1:]]
    self.ast = _rebuild(self.ast, end, substitute(end.src[0], {r: expr}), ranges)

  def simd(self, a: Action) -> None:
    """The reduce range a, the innermost range of every sum it belongs to, run in vector lanes by the CPU."""
    end = _sole_end(self.ast, a)
    reduces = [u for u in end.src[0].toposort() if u.op is Ops.REDUCE]
    mine = [u for u in reduces if any(r.arg[0] == a.axis for r in u.src[1:])]
    if not mine:
      raise OptError(f"{a}: r{a.axis} is not a reduce range of this kernel (those it has: "
                     f"{_names(dict.fromkeys(r for u in reduces for r in u.src[1:]))})")
    for u in mine:
      if u.arg is not Ops.ADD or u.src[-1].arg[0] != a.axis or range_kind(u.src[-1])[0] not in ("loop", "reduce"):
        raise OptError(f"{a}: r{a.axis} must be the innermost plain range of a sum (a max or product keeps its order)")
    self._mark([mine[0].src[-1]], "simd")

  def prefetch(self, a: Action) -> None:
    """The innermost range of the sum over r_a (r_a itself, or after KBLOCK the range within a block) marked
    prefetch:n: the CPU renderer prefetches, n steps ahead, the loads that move a line or more per step."""
    n = a.amount
    if not 1 <= n <= MAX_PREFETCH_AHEAD: raise OptError(f"{a}: the distance is 1 to {MAX_PREFETCH_AHEAD} steps")
    top = self.ast.src[0]
    reduces = [u for u in top.toposort() if u.op is Ops.REDUCE]
    def over(u):   # the sum's own ranges, or a serial block range of r_a in its body
      return any(r.arg[0] == a.axis for r in u.src[1:]) or \
        any(r.arg[0] == a.axis and range_kind(r)[0] == "serial" for r in free_ranges(u.src[0]))
    mine = [u for u in reduces if over(u)]
    if not mine:
      raise OptError(f"{a}: r{a.axis} is not a reduce range of this kernel, nor blocks of one (those it has: "
                     f"{_names(dict.fromkeys(r for u in reduces for r in u.src[1:]))})")
    inner = mine[0].src[-1]
    kind = range_kind(inner)[0]
    if kind == "partial" and len(_kind_fields(inner)) == 3:   # (a block's steps that stop short: both marks)
      return self._mark([inner], f"{inner.arg[1]}:{n}")
    if kind not in ("loop", "reduce"):
      raise OptError(f"{a}: the sum's innermost range r{inner.arg[0]} is a {inner.arg[1]} range already")
    self._mark([inner], f"prefetch:{n}")

  def group(self, a: Action) -> None:
    if len(self.ast.src) != 1: raise OptError(f"{a}: only a kernel with one store can take it (this one has {len(self.ast.src)})")
    top = self.ast.src[0]
    n = a.amount
    if n < 2 or n > MAX_GROUP or n & (n - 1): raise OptError(f"{a}: a work-group size is a power of two from 2 to {MAX_GROUP}")
    ends = top.src[1:] if top.op is Ops.END else ()
    reduces = _shared_reductions(a, top, ends)
    if any(size(r) == 0 for r in ends): raise OptError(f"{a}: the kernel stores nothing (an empty range)")
    if any(range_kind(r)[0] not in ("loop", "spread") for r in ends): raise OptError(f"{a}: the store ranges are split already")
    self._mark({r for u in reduces for r in u.src[1:]}, f"group:{n}")

  def spread(self, a: Action) -> None:
    """Store range a spread across a work-group of n work-items (a, a + n, ... each), every reduction of the kernel,
    none of which depends on a, computed once per work-group by all n together (GROUP): a softmax row per group,
    its max and sum shared, each work-item storing its share of the row."""
    end = _sole_end(self.ast, a)
    r = _store_range(end, a, ("loop",))
    _shared_reductions(a, end.src[0], [x for x in end.src[1:] if x is not r])
    self._mark([r], f"spread:{a.amount}")
    self.group(a)   # (its checks, named for this action: the size, the other store ranges unsplit, none empty)

  def vector(self, a: Action) -> None:
    n = a.amount
    if n not in VECTOR_WIDTHS: raise OptError(f"{a}: a vector has {', '.join(map(str, VECTOR_WIDTHS))} elements")
    groups = [u for u in self.ast.toposort() if u.op is Ops.RANGE and range_kind(u)[0] == "group"]
    if groups: return self._vector_group(a, groups)
    end = _sole_end(self.ast, a)
    if len(end.src) != 2 or range_kind(end.src[1])[0] != "loop":
      raise OptError(f"{a}: takes an elementwise kernel over one range (this one stores over {_names(end.src[1:])})")
    r = end.src[1]
    nodes = end.src[0].toposort()
    if any(u.op is Ops.REDUCE for u in nodes): raise OptError(f"{a}: the kernel reduces")
    if size(r) % n: raise OptError(f"{a}: r{r.arg[0]} has size {size(r)}, which {n} does not divide")
    for u in nodes:
      if u.op is Ops.INDEX and (u.src[1] is not r or u.dtype not in VECTOR_DTYPES):
        raise OptError(f"{a}: every load and the store must index r{r.arg[0]} itself, in 4-byte elements")
    self._mark([r], f"vector:{n}")


  def _vector_group(self, a: Action, groups: list[UOp]) -> None:
    """After GROUP: each work-item's step takes n neighbouring elements of the reduction, read with vector loads
    where a load is contiguous in the innermost reduce range (more bytes in flight per load on a GPU)."""
    n = a.amount
    reduces = [u for u in self.ast.toposort() if u.op is Ops.REDUCE]
    inner = {u.src[-1] for u in reduces}
    if any(group_vector(r) > 1 for r in groups): raise OptError(f"{a}: the group reduction has vector loads already")
    for r in inner:
      if size(r) % n: raise OptError(f"{a}: the innermost reduce range r{r.arg[0]} has size {size(r)}, which {n} does not divide")
    if all(contiguous_offset(x, u.src[-1]) is None for u in reduces for x in u.src[0].toposort()):
      raise OptError(f"{a}: no load of the reduction reads neighbouring elements along its innermost range")
    g = range_kind(next(iter(inner)))[1]
    self._mark(inner, f"group:{g}:{n}")


  def stage(self, a: Action) -> None:
    """Reduce range a of a register tile in work-groups (after UPCAST and LOCAL) in blocks of n: per block the
    work-group copies the block of every load that depends on a and otherwise on the store ranges only into local
    memory, together, and each work-item's lanes read it from there (a GPU matmul then reads each element of A and
    B from global memory once per work-group instead of once per work-item)."""
    end = _sole_end(self.ast, a)
    ends = end.src[1:]
    kinds = {range_kind(r)[0] for r in ends}
    if not {"local", "upcast"} <= kinds: raise OptError(f"{a}: comes after UPCAST and LOCAL (a register tile in work-groups)")
    reduces = [u for u in end.src[0].toposort() if u.op is Ops.REDUCE]
    red = next((u for u in reduces if any(r.arg[0] == a.axis for r in u.src[1:])), None)
    if red is None:
      raise OptError(f"{a}: r{a.axis} is not a reduce range of this kernel (those it has: "
                     f"{_names(dict.fromkeys(r for u in reduces for r in u.src[1:]))})")
    k, n = next(r for r in red.src[1:] if r.arg[0] == a.axis), a.amount
    if range_kind(k)[0] not in ("loop", "reduce"): raise OptError(f"{a}: r{a.axis} is a {k.arg[1]} range already")
    if any(x.op is Ops.REDUCE for x in red.src[0].toposort()):
      raise OptError(f"{a}: takes a reduction with no reduction inside it")
    if n < 2 or n >= size(k): raise OptError(f"{a}: r{a.axis} has size {size(k)}; blocks of {n} must be at least 2 and fewer")
    whole = size(k) - size(k) % n
    outer = UOp.range(whole // n, a.axis, f"stage:{n}")
    inner = UOp.range(n, self.new_axis(), k.arg[1])
    # (the reduction's other ranges stay loops outside the blocks, in their order: a weight gradient's images and
    # rows around blocks of a row, a convolution's taps around blocks of its input channels, whose blocks would
    # otherwise hold every tap's copy of the window; then the block range and the block's part of a)
    rest = [*(r for r in red.src[1:] if r is not k), outer, inner]
    new = UOp(Ops.REDUCE, red.dtype, (substitute(red.src[0], {k: _joined(outer, n, inner)}), *rest), red.arg)
    loads = staged_loads(new, ends)
    if not loads: raise OptError(f"{a}: no load of the reduction depends on r{a.axis} and the store ranges only")
    need = sum(math.prod(size(r) for r in staged_dims(x, ends) + block_dims(x, new)) * max(4, x.dtype.itemsize) for x in loads)
    if need > MAX_STAGED_BYTES:
      raise OptError(f"{a}: its blocks need {need} bytes of local memory; at most {MAX_STAGED_BYTES}")
    if whole < size(k):   # the steps after the last whole block: a reduction of their own, unstaged, combined after
      tail = UOp.range(size(k) - whole, self.new_axis(), k.arg[1])
      fresh = {r: UOp.range(size(r), self.new_axis(), r.arg[1]) for r in red.src[1:] if r is not k}
      at = UOp(Ops.ADD, dtypes.index, (UOp.const(dtypes.index, whole), tail))
      rest = [tail if r is k else fresh[r] for r in red.src[1:]]
      new = UOp(red.arg, red.dtype, (new, UOp(Ops.REDUCE, red.dtype, (substitute(red.src[0], {k: at, **fresh}), *rest), red.arg)))
    self.ast = _rebuild(self.ast, end, substitute(end.src[0], {red: new}), ends)

  def grid(self, a: Action) -> None:
    """After GROUP: the reductions of a kernel that stores one value, each split across the same n work-groups. In
    each, a reduce range r becomes (grid:n outer, size/n inner), the outer part (one range shared by every reduce)
    first among the reduce's ranges, which the renderer reads as the work-group's number; the inner part keeps r's
    group kind (and vector width)."""
    top, n = self.ast.src[0], a.amount
    if len(self.ast.src) != 1 or top.op is not Ops.STORE:
      raise OptError(f"{a}: takes a kernel that stores one value (this one stores over a range or several times)")
    reduces = [u for u in top.toposort() if u.op is Ops.REDUCE]
    if not reduces or any(len(u.src) < 2 or range_kind(u.src[1])[0] != "group" for u in reduces):
      raise OptError(f"{a}: comes after GROUP")
    if any(x.op is Ops.REDUCE for u in reduces for x in u.src[0].toposort()):
      raise OptError(f"{a}: a reduction inside another needs the inner one's whole value before its own partials")
    if n < 2: raise OptError(f"{a}: the amount must be at least 2")
    outer = UOp.range(n, self.new_axis(), f"grid:{n}")
    mapping = {}
    for red in reduces:
      rngs = red.src[1:]
      # the outermost reduce range n divides into parts of at least 2 (of whole vectors, in a vector group step)
      r = next((x for x in rngs if size(x) % n == 0 and size(x) // n >= 2 and (size(x) // n) % group_vector(x) == 0), None)
      if r is None: raise OptError(f"{a}: no reduce range has a size that {n} divides into parts of at least 2 "
                                   f"(and of whole vectors): {_names(rngs)}")
      inner = UOp.range(size(r) // n, r.arg[0], r.arg[1])
      at = _joined(outer, size(r) // n, inner)
      mapping[red] = UOp(Ops.REDUCE, red.dtype, (substitute(red.src[0], {r: at}), outer,
                                                 *(inner if x is r else x for x in rngs)), red.arg)
    self.ast = _rebuild(self.ast, None, substitute(top, mapping), ())


def else_zero(value: UOp) -> UOp | None:
  """c where value is where(c, t, 0) (a sum's terms that a guard leaves out: a padded convolution's input gradient),
  else None."""
  return value.src[0] if value.op is Ops.WHERE and value.src[2].op is Ops.CONST and value.src[2].arg == 0 else None


def guarded_product(value: UOp) -> bool:
  """value is where(c, a * b, 0): a product the padding guards (a padded convolution's input gradient)."""
  return else_zero(value) is not None and value.src[1].op is Ops.MUL


def stage_split(red: UOp) -> tuple[tuple[UOp, ...], UOp, tuple[UOp, ...]] | None:
  """A STAGE reduction's ranges as (the loops outside its blocks, the stage:n block range, the block's own ranges),
  or None where red is not staged."""
  rngs = red.src[1:]
  at = next((i for i, r in enumerate(rngs) if range_kind(r)[0] == "stage"), None)
  return None if at is None else (rngs[:at], rngs[at], rngs[at + 1:])


def staged_loads(red: UOp, store_ranges) -> list[UOp]:
  """The loads of a STAGE reduction that its work-group copies into local memory: those that depend on the block's
  ranges and otherwise on the store ranges and the loops around the blocks only (the same for every work-item of a
  group but for its local and upcast ranges)."""
  outside, stage, inner = stage_split(red)
  block = frozenset(inner)
  allowed = frozenset(store_ranges) | {stage} | block | frozenset(outside)
  return [x for x in red.src[0].toposort() if x.op is Ops.INDEX and (f := free_ranges(x)) & block and f <= allowed]


def block_dims(load: UOp, red: UOp) -> list[UOp]:
  """The ranges of a STAGE reduction's block (those after the block range) that a staged load depends on, in order."""
  f = free_ranges(load)
  return [r for r in stage_split(red)[2] if r in f]


def staged_dims(load: UOp, store_ranges) -> list[UOp]:
  """The ranges a staged load's block is laid out over in local memory: the work-group's own store ranges (local
  and upcast) it depends on, in store order."""
  f = free_ranges(load)
  return [r for r in store_ranges if r in f and range_kind(r)[0] in ("local", "upcast")]


# what a kernel with a running max (RUNMAX) does not take: actions that share every reduction with a work-group, and
# actions on the running sum's own range
WORKGROUP_ACTIONS = frozenset({"GROUP", "SPREAD", "GRID", "STAGE", "VECTOR"})
RANGE_ACTIONS = frozenset({"KBLOCK", "SIMD", "PREFETCH"})


def apply(kernel: Kernel, actions, device: str) -> Kernel:
  """The kernel with `actions` applied in order (an OptError when one does not apply)."""
  if not actions: return kernel
  if (running := {u.src[1].arg[0] for u in kernel.ast.toposort() if u.op is Ops.RUNMAX}):
    # (a running max is one pass over its sum's range, in order: that range is not split, shared or vectorised, and
    # no reduction of the kernel is shared by a work-group; the other reduces' ranges (the scores' dot product) may be)
    for a in actions:
      if a.op in WORKGROUP_ACTIONS or (a.op in RANGE_ACTIONS and a.axis in running):
        raise OptError(f"{a}: the kernel sums over r{min(running)} with a running max (rules/online.rules), which runs "
                       "in one pass, in order, by one work-item")
  ap = _Applier(kernel, device)
  for a in actions: ap.apply(a)
  kinds = {range_kind(u)[0] for u in ap.ast.toposort() if u.op is Ops.RANGE}
  if "group" in kinds and kinds & {"upcast", "local", "vector"}:
    raise OptError("GROUP cannot be combined with UPCAST or LOCAL (or with VECTOR before it)")
  if "vector" in kinds and len(kinds) > 1: raise OptError("VECTOR cannot be combined with other actions")
  return Kernel(ap.ast, kernel.bufs)


__all__ = ["DEVICE_ACTIONS", "MAX_LANES", "merged_reduce_ranges", "apply", "contiguous_offset", "free_ranges", "group_vector", "prefetch_ahead", "range_kind",
           "block_dims", "else_zero", "guarded_product", "reads_what_it_writes", "renamed_reduce", "stage_split", "staged_dims", "staged_loads", "tiles"]
