"""Pass 2 of the scheduler: what to realize (fusion). The decisions are rules (rules/fusion.rules); this
module computes the facts they read (FusionFacts: how many times each node's value would be computed, in
distinct index contexts weighted by expansion; the buffers and reduces recomputing it would cost; the
elementwise tails of reduces) and records what they decide.
"""
from __future__ import annotations

import os
from typing import Any

from rulec.engine.sched.early import is_buffer_view
from rulec.engine.ir.dtypes import dtypes
from rulec.engine.ir.ops import ALU, MOVEMENT, TRANSCENDENTAL, Ops
from rulec.engine.ir.uop import UOp, prod

# The buffers a recomputed value may read before it is stored instead (ctx.max_reads in rules/fusion.rules).
# The seeds' remove-bufferize cost model says two; with five, a residual add feeding a normalisation
# (x + y - mean) is recomputed, not stored, and so are the elementwise gradients of a layernorm and a softmax
# (x, mean, rstd, g and a row sum), which puts the attention block's backward at tinygrad's kernel count. Seven
# also keeps in its consumers the gradient of a layernorm over a residual sum (a post-norm block's, BERT's: the
# sum's two sources, the mean, the variance, the variance's gradient, g and the norm's weight), which stored
# cost a kernel per norm: a BERT training step goes from 316 kernels to 295 (tinygrad 317), and no program of
# bench/schedule.py or the model zoo gets more. (Row values such as the mean are counted as whole buffers,
# though they are a row's worth; a cost in bytes is #34's.)
MAX_RECOMPUTE_READS = int(os.environ.get("RULEC_MAX_RECOMPUTE_READS", "7"))

# The ops a recomputation counts as costly (ctx.transcendentals), and what each costs in ordinary ALU ops (ctx.cost):
# exp2, log2, sin and pow are polynomials of a dozen multiplies and adds after a range reduction on the CPU
# (codegen/decomp.py's exp2: six fmas and the exponent's bits), a GPU's special-function unit runs them at a
# fraction of its FMA rate; a division, a reciprocal or a square root is one vector instruction of several cycles.
TRANSCENDENTAL_OPS = {Ops.EXP2: 16, Ops.LOG2: 16, Ops.SIN: 16, Ops.POW: 16, Ops.SQRT: 4, Ops.RECIPROCAL: 4,
                      Ops.FDIV: 4}
assert frozenset(TRANSCENDENTAL_OPS) == TRANSCENDENTAL
# What a kernel of its own costs, in ALU ops (ctx.launch_cost): the launch, the threads' start and join, the
# pass through memory. About 20 us on this project's CPU and GPU hosts (bench/cl_launch_cost.py: 17 us per
# launch on the H200's host), some two million ALU ops at a 2-core CPU's vector rate. A store that saves less
# recomputation than this is not worth a kernel (a decoding step's softmax over a few positions).
LAUNCH_COST = int(os.environ.get("RULEC_LAUNCH_COST", str(1 << 21)))
# The score matrix, in bytes, past which a softmax whose probabilities only a matmul reads is computed in the matmul's
# kernel with a running max (ctx.online_bytes; rules/fusion.rules online_softmax): the scores are never stored, at
# the price of a slower kernel where storing them fits. Measured: on a 2-core Xeon, B2 H12 T256 D64 at one thread,
# 14 ms in one kernel against 7 ms in five with the scores stored; on the H200 (CL), B4 H12 S1024 D64 2.2 ms against
# 1.2, and a GPT-2 block forward at B8 T1024 9.5 ms against 6.7 (bench/results/*session19*). So it is a way to fit
# long sequences in memory, not yet a speed-up: 2 GiB of scores (a batch of 8 x 12 heads at T = 2400).
# RULEC_ONLINE_SOFTMAX_BYTES=0 makes every such softmax one kernel.
ONLINE_SOFTMAX_BYTES = int(os.environ.get("RULEC_ONLINE_SOFTMAX_BYTES", str(2 << 30)))
# How many outputs of a reduction share one computed element of what it reads (ctx.tile): the kernel optimizer
# upcasts a matmul's output columns by 32 on the CPU (codegen/opt), and a GPU's work-group tile shares a loaded
# element as widely, so a value a reduction reads repeats/tile times is computed repeats/tile times.
OUTPUT_TILE = 32
# The epilogue cost (ctx.epilogue_cost, ALU ops per element) past which a contraction a device runs in register tiles
# is stored and its epilogue made a kernel of its own (ctx.tile_epilogue_ops; rules/fusion.rules
# store_sum_before_costly_epilogue). H100, 4096 x 3072 x 768: gelu(x @ W1 + b1) (about 50) 0.539 ms fused against
# 0.492 for the matmul alone; the MLP backward's gelu' over dy @ W2.T (about 120) 0.770 fused, 0.511 + 0.115 stored
# (bench/results/gpu-2026-12-06-session26.txt)
TILE_EPILOGUE_OPS = int(os.environ.get("RULEC_TILE_EPILOGUE_OPS", "80"))
# The ALU ops one kernel may compute per element (ctx.max_kernel_ops; rules/fusion.rules bound_kernels): past it a
# value is stored and the kernel split there. LLVM's compile time grows faster than the kernel: 1,000 chained
# multiply-adds (2,000 ops) compile in 0.8 s on this project's 2-core CPU host, 3,000 in 4.5 s, 10,000 in 45 s
# (bench/results/schedule-2026-12-06-session30.txt). A transcendental counts as TRANSCENDENTAL_OPS says (its
# polynomial's ops).
MAX_KERNEL_OPS = int(os.environ.get("RULEC_MAX_KERNEL_OPS", "2000"))
# ctx.reads counts buffers up to this many (the rules compare it with max_reads): a region's set of buffers is kept
# per node, and a model's output would otherwise carry every weight of the model
READS_CAP = 64


class _UseCounts:
  """How many times each node's value would be computed: distinct index contexts, weighted by expansion, worked
  out on demand and kept until a decision changes them (FusionFacts.uses, contexts, repeats).

  Elementwise users index a value exactly as they are indexed, so they share
  one context; a movement op or a reduce starts a new one; an EXPAND repeats
  its source once per element it adds. A realized node starts afresh.
  A node's contexts are those its users pass down, so they depend only on the nodes above it: a node's are
  computed from its users' (theirs first, consumers before producers, as the fusion rules visit them), and a
  decision to store or hoist x changes only the contexts below x, down to the nodes that start afresh. Those are
  dropped (`fixed`), and computed again when asked: each decision costs the part of the graph it changes, not the
  graph.
  `repeats` is how many times a reduction recomputes each element, in the node's most repeated context: the
  expansions between a reduce and the node along axes the reduce keeps (a matmul's reduction reads its left operand
  once per output column). Other expansions are not counted there: a reduce's own loop is its innermost, so a value
  broadcast along the reduced axes only is computed outside it (a pool over a batchnorm's output: the channel's
  scale once per channel), and an elementwise consumer's loops over a broadcast axis are inside the value's loops."""
  def __init__(self, sink: UOp, users: dict[UOp, list[UOp]], position: dict[UOp, int], decided: set[UOp]):
    self.sink, self.users, self.position, self.decided = sink, users, position, decided
    self.outputs = set(sink.src)
    # per node: (contexts -> weight, contexts -> (0, None) while no reduce is above the node in that context, else
    # (the expansion since the reduce along axes it keeps, at least 1; the kind of each of the node's axes for that
    # reduce, None where not known)); and what it passes to its sources
    self._ctx: dict[UOp, tuple[dict, dict]] = {}
    self._own: dict[UOp, tuple[dict, dict]] = {}

  def afresh(self, u: UOp) -> bool:
    """u's sources see it as a context of its own (a stored, hoisted or realized value, or an output)."""
    return u in self.decided or u.op in (Ops.CONTIGUOUS, Ops.STORE) or u is self.sink or u in self.outputs

  def uses(self, u: UOp) -> float: return float(sum(self.contexts_of(u)[0].values()))

  def count(self, u: UOp) -> int: return len(self.contexts_of(u)[0])

  def repeats(self, u: UOp) -> float:
    # (a node the same all along the reduce's loop, every reduced axis broadcast, is computed outside that loop)
    return max((r for r, m in self.contexts_of(u)[1].values() if m is None or REDUCED in m or not m), default=0.0)

  def get(self, u: UOp, default=0):   # (as a mapping of node -> uses, for _needed_below)
    return self.uses(u)

  def changed(self, x: UOp) -> None:
    """x now starts afresh (stored or hoisted): forget what its sources and the nodes below them were told."""
    self._own.pop(x, None)
    todo = list(x.src)
    while todo:
      s = todo.pop()
      if self._ctx.pop(s, None) is None: continue   # (not known, so neither is anything below it through s)
      self._own.pop(s, None)
      if not self.afresh(s): todo += s.src

  def contexts_of(self, u: UOp) -> tuple[dict, dict]:
    hit = self._ctx.get(u)
    if hit is not None: return hit
    # every node above u whose contexts u needs and nobody has asked for yet, consumers first
    need, seen = [], {u}
    todo = [u]
    while todo:
      v = todo.pop()
      need.append(v)
      for w in self.users.get(v, ()):
        if w not in seen and w not in self._ctx and not self.afresh(w):
          seen.add(w)
          todo.append(w)
    need.sort(key=self._order_key, reverse=True)
    for v in need: self._ctx[v] = self._pull(v)
    return self._ctx[u]

  def _order_key(self, u: UOp) -> int: return self.position[u]

  def _passed(self, u: UOp) -> tuple[dict, dict]:
    """What u passes to its sources: its own context where it starts afresh, else its contexts (too many paths
    to track are collapsed into one)."""
    hit = self._own.get(u)
    if hit is not None: return hit
    if self.afresh(u): own, own_r = {(u,): 1.0}, {(u,): (0.0, None)}
    else:
      own, own_r = self._ctx[u]
      if len(own) > 16: own, own_r = {(u,): float(sum(own.values()))}, {(u,): (max(r for r, _ in own_r.values()), None)}
    self._own[u] = (own, own_r)
    return own, own_r

  def _pull(self, s: UOp) -> tuple[dict, dict]:
    if s is self.sink: return {(): 1.0}, {(): (0.0, None)}
    tgt: dict = {}
    tgt_r: dict = {}
    last = None
    # (users in the graph's order from the last: the order in which the one-pass count reached s, which settles
    # ties between masks of equal repeats)
    for u in reversed(self.users.get(s, ())):
      if u is last: continue
      last = u
      own, own_r = self._passed(u)
      if u.op in ALU or u.op in (Ops.CAST, Ops.BITCAST): add, add_r = own, own_r
      elif u.op in MOVEMENT or u.op is Ops.REDUCE_AXIS:
        f = prod(u.shape) / max(1, prod(s.shape)) if u.op is Ops.EXPAND and s._shape else 1.0
        add = {(k, u): w * f for k, w in own.items()}
        if u.op is Ops.REDUCE_AXIS and _contraction(u):
          red = tuple(REDUCED if i in u.arg[1] else KEPT for i in range(len(s.shape)))
          add_r = {(k, u): (max(r, 1.0), red) for k, (r, _) in own_r.items()}
        elif u.op is Ops.REDUCE_AXIS: add_r = {(k, u): (0.0, None) for k in own_r}
        elif u.op is Ops.EXPAND:
          add_r = {}
          for k, (r, m) in own_r.items():
            factor, below = _kept_expansion(u, s, m, f)
            add_r[(k, u)] = (r * factor, below) if r else (0.0, None)
        else: add_r = {(k, u): (r, _through(u, s, m)) for k, (r, m) in own_r.items()}
      else: add, add_r = {(k, u): w for k, w in own.items()}, {(k, u): (r, None) for k, (r, _) in own_r.items()}
      for k, w in add.items(): tgt[k] = max(tgt.get(k, 0.0), w)
      for k, r in add_r.items():
        if r[0] >= tgt_r.get(k, (0.0, None))[0]: tgt_r[k] = r
    return tgt, tgt_r


# The kinds of axis a mask (_through) gives each axis of a node below a reduce: one the reduce keeps (an output's),
# one it loops over where the node varies along it, and one it loops over where the node is the same all along it
# (broadcast by an EXPAND between: a batchnorm's per-channel scale under a pool's window).
KEPT, REDUCED, BROADCAST = 0, 1, 2


def _contraction(r: UOp) -> bool:
  """r sums products (a matmul, a convolution, attention's two): the reduce whose operands it recomputes once per
  output of the other operand's axes. A pool, a max or a plain sum reads each element once per window or row."""
  v = r.src[0]
  while v.op is Ops.CAST: v = v.src[0]
  return r.arg[0] is Ops.ADD and v.op is Ops.MUL


def _kept_expansion(u: UOp, s: UOp, mask, f: float) -> tuple[float, tuple | None]:
  """(the part of an EXPAND's factor f along axes the reduce above it keeps, the mask for its source): the reduced
  axes it expands become BROADCAST. Where the mask is not known (None; a convolution's windows, made by reshaping a
  repeated image), all of f: each element is read by as many outputs, through the window's taps."""
  if mask is None or len(mask) != len(u.shape) or len(s.shape) != len(u.shape): return f, None
  grown = [n != m for n, m in zip(u.shape, s.shape)]
  factor = float(prod(n for n, g, k in zip(u.shape, grown, mask) if g and k == KEPT))
  return factor, tuple(BROADCAST if g and k == REDUCED else k for g, k in zip(grown, mask))


def _through(u: UOp, s: UOp, mask):
  """The mask of u (a kind per axis: KEPT, REDUCED, BROADCAST) for u's source s, or None where it is not known:
  through an elementwise op, a PAD or a SHRINK unchanged (the same axes), through a PERMUTE permuted, through a
  RESHAPE where no group of axes it splits or merges mixes kept and reduced ones (a matmul's reshaped operands)."""
  if mask is None or len(mask) != len(u.shape): return None
  if u.op is Ops.PERMUTE:
    out = [KEPT] * len(mask)
    for i, j in enumerate(u.arg): out[j] = mask[i]
    return tuple(out)
  if u.op is Ops.RESHAPE: return _reshape_mask(tuple(s.shape), tuple(u.shape), mask)
  return mask if len(s.shape) == len(u.shape) else None


def _reshape_mask(old: tuple, new: tuple, mask: tuple):
  """`mask` over the axes of `new` carried to the axes of `old` (the same elements, reshaped), or None where a
  group of axes that the reshape splits or merges mixes kept and reduced axes, or a size is not a number. Axes of
  size 1 are KEPT; a reduced group is REDUCED where any axis of it is, else BROADCAST."""
  if not all(isinstance(n, int) for n in (*old, *new)): return None
  out = [KEPT] * len(old)
  io, jn = [i for i, n in enumerate(old) if n != 1], [j for j, n in enumerate(new) if n != 1]
  a = b = 0
  while a < len(io) and b < len(jn):
    gi, gj, po, pn = [io[a]], [jn[b]], old[io[a]], new[jn[b]]
    a, b = a + 1, b + 1
    while po != pn:
      if po < pn and a < len(io): gi.append(io[a]); po *= old[io[a]]; a += 1
      elif pn < po and b < len(jn): gj.append(jn[b]); pn *= new[jn[b]]; b += 1
      else: return None
    kinds = {mask[j] for j in gj}
    if KEPT in kinds and len(kinds) > 1: return None
    for i in gi: out[i] = KEPT if kinds == {KEPT} else REDUCED if REDUCED in kinds else BROADCAST
  return tuple(out) if a == len(io) and b == len(jn) else None


def _under_views(x: UOp) -> UOp:
  """x through the reshapes and permutes over it: the value an epilogue reads at its own shape."""
  while x.op in (Ops.RESHAPE, Ops.PERMUTE): x = x.src[0]
  return x


def _reduce_epilogues(order: list[UOp]) -> set[UOp]:
  """Elementwise ops over reduce results at the reduced shape: every source is a reduce, another such op, a
  constant or a realized buffer (numpy's NaN-aware max: WHERE(any nan, nan, max); a mean: sum * 1/n).
  Storing the top of such a tail stores the reduces below it in the same kernel."""
  out: set[UOp] = set()
  reduces_below: dict[UOp, bool] = {}
  for u in order:
    reduces_below[u] = u.op is Ops.REDUCE_AXIS or any(reduces_below[s] for s in u.src)
    if not (u.op in ALU or u.op is Ops.CAST): continue
    ok, any_reduce = True, False
    for s in u.src:
      x = _under_views(s)
      if x.op is Ops.REDUCE_AXIS or x in out: any_reduce = True
      # (an elementwise value at this shape is computed here too; so is a broadcast parameter, a batchnorm's
      # rsqrt(var + eps): anything with no reduce below it)
      elif not (x.op in ALU or x.op is Ops.CAST or not reduces_below[x]): ok = False
    if ok and any_reduce: out.add(u)
  return out


class FusionFacts:
  """ctx of the fusion rule sets (rules/fusion.rules): the facts each decision reads, and the decisions.

  The driver offers every node of the graph to each set in turn, consumers before producers; a rule decides
  with one of three calls: `store(x)` (x gets a buffer of its own: a kernel boundary), `hoist(x)` (a single
  value computed once at the top of its one consumer's kernel, on devices that do so) or `keep(x)` (x stays
  fused into its consumers; later sets may still decide otherwise). A node no rule decides stays fused. A store
  or a hoist changes the facts it touches (a realized value starts afresh): the counts below it, the regions and
  costs above it, which are worked out again when asked."""
  def __init__(self, sink: UOp, hoists: bool, hoists_rows: bool | None = None, lane_guards: bool | None = None,
               tiled_epilogues: bool = False, tensor_cores: bool = False):
    self.sink, self.hoists, self.tensor_cores = sink, hoists, tensor_cores
    self.tiled_epilogues, self.tile_epilogue_ops = tiled_epilogues, TILE_EPILOGUE_OPS
    self.hoists_rows = hoists if hoists_rows is None else hoists_rows
    self.lane_guards = hoists if lane_guards is None else lane_guards
    self._outputs = set(sink.src)
    self.max_reads = MAX_RECOMPUTE_READS
    self.launch_cost, self.tile = LAUNCH_COST, OUTPUT_TILE
    self.order = sink.toposort()
    self.staged: set[UOp] = set()
    self.hoisted: set[UOp] = set()
    self._epilogues = _reduce_epilogues(self.order)
    self._users: dict[UOp, list[UOp]] = {}
    self._position = {u: i for i, u in enumerate(self.order)}
    for u in self.order:
      for x in u.src: self._users.setdefault(x, []).append(u)
    self._online = _online_softmax_nodes(self.order, self._users, set(sink.src))
    self.online_bytes = ONLINE_SOFTMAX_BYTES
    # (the counts and regions are worked out when a rule asks, and a decision forgets only what it changes: the
    # counts below the decided node, the regions and costs above it)
    self._decided: set[UOp] = set()
    self._counts = _UseCounts(sink, self._users, self._position, self._decided)
    self._regions: dict[UOp, tuple[frozenset | None, bool, int]] = {}
    self._costs: dict[UOp, tuple[int, int]] = {}
    self._below: dict[UOp, frozenset | None] = {}
    self.max_kernel_ops = MAX_KERNEL_OPS

  def _decide(self, x: UOp) -> None:
    self._decided.add(x)
    self._counts.changed(x)
    self._forget_regions_above(x)
    # a stored x is one more buffer below everything above it, stored or not: a hoisted value's reads are every
    # buffer below it (_reached), so the regions that reach such a value change too
    if x in self.staged:
      todo = [x]
      while todo:
        v = todo.pop()
        if self._below.pop(v, None) is None: continue   # (not known, so neither is anything above it through v)
        if v in self.hoisted: self._forget_regions_above(v)
        todo += self._users.get(v, ())
    # the costs that counted x's ops: up through the elementwise ops above it
    todo, seen = [x], set()
    while todo:
      for w in self._users.get(todo.pop(), ()):
        if w in seen: continue
        seen.add(w)
        self._costs.pop(w, None)
        if not self._cost_edge(w): todo.append(w)

  def _forget_regions_above(self, x: UOp) -> None:
    """The regions that reached x through nodes that are not stored."""
    todo = [x]
    while todo:
      for w in self._users.get(todo.pop(), ()):
        if self._regions.pop(w, None) is not None and not self._stop(w): todo.append(w)

  def _buffers_below(self, u: UOp) -> frozenset | None:
    """Every buffer and stored value in u's graph, u included (None for more than READS_CAP), from its sources'."""
    hit = self._below.get(u, False)
    if hit is not False: return hit
    for v in _missing_below(u, self._below):
      got: frozenset | None = frozenset((v,)) if self._stop(v) else frozenset()
      for s in v.src:
        b = self._below[s]
        got = None if got is None or b is None else got | b
        if got is not None and len(got) > READS_CAP: got = None
      self._below[v] = got
    return self._below[u]

  # *** facts ***
  def uses(self, x: UOp) -> float:
    """How many times x's value would be computed: its distinct index contexts, weighted by expansion."""
    return self._counts.uses(x) if x in self._position else 0

  def contexts(self, x: UOp) -> int:
    """How many distinct index contexts read x (unweighted)."""
    return self._counts.count(x) if x in self._position else 0

  def repeats(self, x: UOp) -> float:
    """How many times a reduction would compute each element of x on its trips: the expansions between a reduce
    and x in the most repeated context (a matmul recomputes its left operand once per output column); 1 for a
    reduce reading x as it is (a sum of x), 0 where no reduce reads x in its kernel (an elementwise consumer
    computes a broadcast value outside the loop over the broadcast axes)."""
    return self._counts.repeats(x) if x in self._position else 0

  def cost(self, x: UOp) -> int:
    """ALU ops recomputing one element of x runs, each transcendental or division counted as several (TRANSCENDENTAL_OPS):
    its elementwise ops down to the buffers, the stored and hoisted values, the reduces and the broadcast values
    it reads."""
    return self._own_cost(x)[1]

  def transcendentals(self, x: UOp) -> int:
    """Transcendentals and divisions (exp2, log2, sin, sqrt, reciprocal, division, pow) among the ops ctx.cost
    counts."""
    return self._own_cost(x)[0]

  def bytes(self, x: UOp) -> int:
    """Bytes storing x writes (each consumer that reads it back reads as many)."""
    return x.size * x.dtype.itemsize

  def guards(self, x: UOp) -> int:
    """Comparisons a read of x's padded view costs: one per padded side (a PAD's arg) that reading it through
    its padding checks, each a compare and an and (0 for a node that is not a PAD)."""
    if x.op is not Ops.PAD: return 0
    return sum(1 for lo, hi in x.arg for side in (lo, hi) if side != 0)

  def epilogue_cost(self, r: UOp) -> int:
    """ALU cost per element (as ctx.cost counts it) of the costliest epilogue over the reduce r: the elementwise ops
    above r at its reduced shape (through reshapes and permutes), each counted down to the buffers and stored values
    it reads; 0 where nothing elementwise reads r."""
    best, seen, todo = 0, set(), [r]
    while todo:
      v = todo.pop()
      for u in self._users.get(v, []):
        if u in seen: continue
        seen.add(u)
        if u.op in (Ops.RESHAPE, Ops.PERMUTE): todo.append(u)
        elif u in self._epilogues:
          best = max(best, self.cost(u))
          if u not in self.staged: todo.append(u)
    return best

  def contraction(self, r: UOp) -> bool:
    """r sums products (a matmul, a convolution, attention's two): the reduce a device tiles."""
    return r.op is Ops.REDUCE_AXIS and _contraction(r)

  def epilogue(self, x: UOp) -> bool:
    """x is elementwise over reduce results at the reduced shape (a mean's `sum * 1/n`, a NaN-aware max)."""
    return x in self._epilogues

  def needed_below(self, x: UOp) -> bool:
    """A reduce inside x's epilogue is used more often than x, or an epilogue value below x at least as often."""
    return _needed_below(x, self._epilogues, self._counts, stored=self.staged, users=self._users, position=self._position)

  def needed_more_below(self, x: UOp) -> bool:
    """A reduce or an epilogue value inside x's epilogue is used more often than x: something besides x reads it."""
    return _needed_below(x, self._epilogues, self._counts, strict=True, stored=self.staged, users=self._users,
                        position=self._position)

  def _sole_chain(self, x: UOp, ops) -> tuple[UOp, set]:
    """The end of the ops (of `ops`) that are x's only consumers, one after the other, and which ops they are."""
    v, seen = x, set()
    while len(users := self._users.get(v, [])) == 1 and users[0].op in ops and users[0] not in self.sink.src:
      v = users[0]
      seen.add(v.op)
    return v, seen

  def shrunk_view(self, x: UOp) -> UOp | None:
    """The end of the movement ops that are x's only consumers, one after the other, when they shrink x (the
    gradient of a pad, of a convolution's padded input, reads the padded gradient so); else None."""
    v, seen = self._sole_chain(x, MOVEMENT)
    return v if Ops.SHRINK in seen and v.size < x.size else None

  def permuted_view(self, x: UOp) -> UOp | None:
    """The end of the movement ops that are x's only consumers, one after the other, when they only permute and
    reshape x and do permute it (a pool's gradient is computed in the pool's axis order and read in the image's
    order): storing that view lays the value out as it is read; else None."""
    v, seen = self._sole_chain(x, (Ops.PERMUTE, Ops.RESHAPE))
    if Ops.PERMUTE not in seen: return None
    # (reshapes after the last permute: stored contiguous, the permuted value has their layout already, and its
    # kernel keeps the axes apart; attention's (B, H, T, D) -> (B, T, H * D) would loop over H * D and index with
    # divisions, which no register tile takes)
    while v.op is Ops.RESHAPE: v = v.src[0]
    return v

  def online_softmax(self, x: UOp) -> bool:
    """x is part of a softmax whose probabilities only a contraction over the softmax axis reads (`softmax(q @ k.T)
    @ v`, float32 or float64): the scores and what computes them, the row's max, the exponent's chain up to exp2,
    the row's sum and what reads it, or the probabilities. All of it left in the contraction's kernel, the kernel
    rules (rules/online.rules running_softmax_sum) compute the sums over the row with a running max, and the
    score matrix is never stored."""
    return x in self._online

  def score_bytes(self, x: UOp) -> int:
    """The bytes of the score matrix of the softmax x is part of (online_softmax), 0 if none."""
    return self._online.get(x, 0)

  def row_value(self, x: UOp) -> bool:
    """x is read only broadcast along trailing axes of size 1 (a keepdim reduce over the last axes: a softmax row's
    max or sum, a layernorm's mean): every path from x to where its readers are stored or reduced goes through
    elementwise ops and EXPANDs of those trailing axes only, and any reduce on the way reduces only them. A kernel
    computing x's readers then loops over x's own axes outside the broadcast ones, so x depends on outer loops
    only: computed there (codegen/llvmir.py _reduce_levels), it costs once per row."""
    shape = x.shape
    if not shape or shape[-1] != 1: return False
    lead = len(shape)
    while lead and shape[lead - 1] == 1: lead -= 1
    seen, todo = set(), [x]
    while todo:
      v = todo.pop()
      if v in seen: continue
      seen.add(v)
      if v is not x and (v in self.staged or v in self._outputs): continue
      for u in self._users.get(v, []):
        # an assign's value stored into a whole buffer in its own order (the store's loops are the value's axes; a
        # permuted target would loop over them in another order and compute a row's value per element)
        if u.op is Ops.STORE and u.src[-1] is v and is_buffer_view(u.src[0]) and v.shape[:lead] == shape[:lead]: continue
        if u.op is Ops.EXPAND:
          if len(u.shape) != len(shape) or u.shape[:lead] != shape[:lead]: return False
        elif u.op is Ops.REDUCE_AXIS:
          if any(a < lead for a in u.arg[1]): return False
          continue   # (a reduce of the broadcast axes: its own decision)
        elif not (u.op in ALU or u.op in (Ops.CAST, Ops.BITCAST)) or u.shape[:lead] != shape[:lead]: return False
        todo.append(u)
    return True

  def row_tail(self, x: UOp) -> bool:
    """x is a value at its full shape over a reduce of its own rows that is not decided yet (a softmax's
    probabilities over its max and sum, a layernorm's output over its mean): below x, through elementwise ops and
    broadcasts only, a reduce whose shape is x's with its trailing axes reduced to 1 (not a product inside a matmul,
    whose shape has the matmul's axis besides, nor a sum of padded gradients, whose reduces lie behind the pads)."""
    shape = x.shape
    if not shape or shape[-1] == 1: return False
    for u in self._along_rows(x):
      if u.op is not Ops.REDUCE_AXIS or self._row_stop(x, u) or len(u.shape) != len(shape): continue
      lead = len(shape) - len(u.arg[1])
      if sorted(u.arg[1]) == list(range(lead, len(shape))) and u.shape[:lead] == shape[:lead]: return True
    return False

  def over_hoisted_row(self, x: UOp) -> bool:
    """x is a value at its full shape that reads, through elementwise ops and broadcasts only, a row's value
    hoisted so far (a softmax's exp(x - max) over its hoisted max). Every kernel that recomputes x computes that
    row's value again: one more pass over each row per kernel."""
    shape = x.shape
    if not shape or shape[-1] == 1: return False
    return any(u in self.hoisted and len(u.shape) == len(shape) and u.shape[-1] == 1 for u in self._along_rows(x))

  def _row_stop(self, x: UOp, u: UOp) -> bool:
    return u is not x and (u in self.staged or u in self.hoisted or u.op in (Ops.CONTIGUOUS, Ops.BUFFER))

  def _along_rows(self, x: UOp):
    """x and what lies below it through elementwise ops, casts and broadcasts, down to (and including) the stored,
    hoisted or realized values it reads: the walk row_tail and over_hoisted_row look along."""
    return x.toposort(gate=lambda u: u is x or (not self._row_stop(x, u) and (u.op in ALU or u.op in (Ops.CAST, Ops.EXPAND))))

  def reads(self, x: UOp) -> int:
    """How many buffers recomputing x reads (inputs, realized values, stores chosen so far); counted up to
    READS_CAP, and READS_CAP + 1 for more."""
    found = self._region(x)[0]
    return READS_CAP + 1 if found is None else len(found)

  def reduces_inside(self, x: UOp) -> bool:
    """Recomputing x would run a reduce (one not stored so far)."""
    return self._region(x)[1]

  def decided(self, x: UOp) -> bool:
    return x in self.staged or x in self.hoisted

  def _stop(self, x: UOp) -> bool: return x in self.staged or x.op in (Ops.CONTIGUOUS, Ops.BUFFER)

  def kernel_ops(self, x: UOp) -> int:
    """ALU ops computing one element of x in its kernel: every op of its region down to the buffers and stored
    values it reads (reduces' bodies and hoisted values too: they run in that kernel), each once however often it
    is read, a transcendental as TRANSCENDENTAL_OPS says."""
    ops = self._region(x)[2]
    if ops <= self.max_kernel_ops: return ops   # (the count per path is at least the count per op)
    stop = lambda u: u is not x and self._stop(u)  # noqa: E731
    return sum(_op_weight(u) for u in x.toposort(gate=lambda u: not stop(u)) if not stop(u))

  def _reached(self, s: UOp) -> tuple[frozenset | None, bool, int]:
    """What a region that reaches s gets from it: s itself where it is a buffer; for a hoisted value (computed once
    in the kernel that reads it, however often it is read: recomputing a region does not recompute the reduces
    inside it) its ops, and as its reads every buffer and stored value below it; or s's own region."""
    if self._stop(s): return frozenset((s,)), False, 0
    reads, reduce, ops = self._regions[s]
    return (self._buffers_below(s), False, ops) if s in self.hoisted else (reads, reduce, ops)

  def _region(self, u: UOp) -> tuple[frozenset | None, bool, int]:
    """(the buffers read, None for more than READS_CAP; a reduce is run; ALU ops, counted once per path: an upper
    bound of kernel_ops that a sum over the sources keeps) recomputing u: from its sources' regions, each worked
    out once (below the nodes not asked about yet first)."""
    hit = self._regions.get(u)
    if hit is not None: return hit
    for v in _missing_below(u, self._regions, lambda s: not self._stop(s)):
      reads: frozenset | None = frozenset()
      reduce, ops = v.op is Ops.REDUCE_AXIS, _op_weight(v)
      for s in dict.fromkeys(v.src):
        got, red, n = self._reached(s)
        reduce, ops = reduce or red, min(ops + n, OPS_CAP)
        if reads is not None: reads = None if got is None else reads | got
        if reads is not None and len(reads) > READS_CAP: reads = None
      self._regions[v] = (reads, reduce, ops)
    return self._regions[u]

  def _cost_edge(self, x: UOp) -> bool:
    return x in self.staged or x in self.hoisted or x.op in (Ops.CONTIGUOUS, Ops.BUFFER, Ops.REDUCE_AXIS, Ops.EXPAND)

  def _own_cost(self, u: UOp) -> tuple[int, int]:
    """(transcendentals, ALU cost) of recomputing one element of u: its elementwise ops down to the buffers and
    stored or hoisted values it reads, the reduces below it (a reduce is ctx.reduces_inside's, and is decided on
    its own) and the broadcasts (a layernorm's rsqrt(var + eps), expanded along a row: the same for every element
    of the row, it is decided on its own, and a loop over the row computes it once)."""
    hit = self._costs.get(u)
    if hit is None:
      costly, ops = 0, 0
      for x in u.toposort(gate=lambda x: x is u or not self._cost_edge(x)):
        if x is not u and self._cost_edge(x): continue
        if x.op in TRANSCENDENTAL: costly, ops = costly + 1, ops + TRANSCENDENTAL_OPS[x.op]
        elif x.op in ALU: ops += 1
      hit = self._costs[u] = (costly, ops)
    return hit

  # *** decisions: each returns a marker node (so the rule counts as having fired), or None when x is decided ***
  def store(self, x: UOp) -> UOp | None:
    if self.decided(x): return None
    self.staged.add(x)
    self._decide(x)
    return UOp(Ops.STAGE, x.dtype, (x,), x.device)

  def hoist(self, x: UOp) -> UOp | None:
    if self.decided(x): return None
    self.hoisted.add(x)
    self._decide(x)
    return UOp(Ops.FUSE, x.dtype, (x,), "hoist")

  def keep(self, x: UOp) -> UOp | None:
    return None if self.decided(x) else UOp(Ops.FUSE, x.dtype, (x,))


def _missing_below(u: UOp, known: dict, through=None) -> list[UOp]:
  """The nodes of u's graph (u included) that `known` lacks, sources before users, going down only into the sources
  `through` accepts (all where None): what a fact built from the sources' must work out, in the order to do it."""
  ok = lambda m: m is u or (m not in known and (through is None or through(m)))  # noqa: E731
  return [n for n in u.toposort(gate=ok) if ok(n)]


OPS_CAP = 1 << 40   # (a count per path doubles with each x.maximum(f(x)) nested)


def _op_weight(u: UOp) -> int:
  return TRANSCENDENTAL_OPS[u.op] if u.op in TRANSCENDENTAL else 1 if u.op in ALU else 0


def _online_softmax_nodes(order: list[UOp], users: dict[UOp, list[UOp]], outputs: set[UOp]) -> dict[UOp, int]:
  """The nodes of every softmax in the graph whose probabilities only a contraction over the softmax axis reads
  (FusionFacts.online_softmax): for m = max(x, last axis), e = exp2(f(x - m)), the probabilities p = e * g(sum(e))
  (or e itself), read only through a reshape that inserts an axis before the last, its expand, and a multiply
  summed over the last axis (a matmul's form); x read by m and the exponent only, e by its sum and p only.
  Returns each node of those softmaxes (what computes x, x, m, the exponent's ops, e, the sum and p) -> the bytes
  of its score matrix x."""
  out: dict[UOp, int] = {}
  position = {u: i for i, u in enumerate(order)}
  only = lambda v: users.get(v, []) if v not in outputs else []  # noqa: E731
  for m in order:
    if m.op is not Ops.REDUCE_AXIS or m.arg[0] is not Ops.MAX or m.shape[-1:] != (1,): continue
    x, last = m.src[0], len(m.shape) - 1
    # (float32 and float64: rules/online.rules leaves float16 sums alone)
    if m.arg[1] != (last,) or x.dtype not in (dtypes.float32, dtypes.float64) or not isinstance(x.shape[-1], int) or x.shape[-1] < 2: continue
    bm = only(m)
    if len(bm) != 1 or bm[0].op is not Ops.EXPAND or bm[0].shape != x.shape: continue
    xu = only(x)
    if len(xu) != 2 or m not in xu: continue
    sub = next(u for u in xu if u is not m)
    if sub.op is not Ops.SUB or sub.src != (x, bm[0]) or only(bm[0]) != [sub]: continue
    # the exponent: elementwise ops with one reader each, other sources constants broadcast, up to exp2
    chain, v = [sub], sub
    while v.op is not Ops.EXP2:
      nxt = only(v)
      if len(nxt) != 1 or nxt[0].op not in (Ops.MUL, Ops.EXP2) or nxt[0].shape != x.shape: break
      v = nxt[0]
      if v.op is Ops.MUL and not all(s is chain[-1] or _broadcast_const(s) for s in v.src): break
      chain.append(v)
    if v.op is not Ops.EXP2: continue
    e = v
    eu = only(e)
    sums = [u for u in eu if u.op is Ops.REDUCE_AXIS and u.arg == (Ops.ADD, (last,))]
    probs = [u for u in eu if u not in sums]
    if len(sums) != 1 or len(probs) != 1: continue
    p = probs[0]
    # p = e * (a row value over the sum): e times an EXPAND of something that reads the sum
    if p.op is Ops.MUL and len(p.src) == 2 and (o := p.src[1] if p.src[0] is e else p.src[0]).op is Ops.EXPAND \
       and o.src[0].shape == m.shape and sums[0] in (over_sum := _reaching(o, sums[0], position)): pass
    else: continue
    if not all(_contracted_last(u, x.shape, only) for u in only(p)) or not only(p): continue
    # (the row's max and sum too: after the kernel rules the max is gone and the sum runs in the product's loop, on
    # any device; left to the row-value rules, a device that does not hoist rows would store them)
    found = {x, *chain, p, m, bm[0], *over_sum}
    # (and what only the scores read, down to the reduce that computes them: q @ k.T, scaled, masked)
    todo = [s for s in x.src]
    while todo:
      v = todo.pop()
      if v in found or v.op in (Ops.BUFFER, Ops.CONST) or not (rd := only(v)) or not all(u in found for u in rd): continue
      found.add(v)
      if v.op is not Ops.REDUCE_AXIS: todo += v.src
    for n in found: out[n] = max(out.get(n, 0), x.size * x.dtype.itemsize)
  return out


def _reaching(top: UOp, target: UOp, position: dict[UOp, int]) -> set[UOp]:
  """The nodes of top's graph that have target in theirs (target and top included, where top reaches it): one walk,
  never below target's place in the graph's order (nothing there can reach it)."""
  floor = position[target]
  walk = top.toposort(gate=lambda u: position.get(u, -1) > floor)
  got: set[UOp] = set()
  for u in walk:   # (sources first)
    if u is target or any(s in got for s in u.src): got.add(u)
  return got


def _broadcast_const(x: UOp) -> bool:
  while x.op in (Ops.EXPAND, Ops.RESHAPE): x = x.src[0]
  return x.op is Ops.CONST


def _contracted_last(r: UOp, shape: tuple, only) -> bool:
  """r (a reader of the probabilities, of `shape`) reshapes them to (..., 1, T) and every way on goes through an
  expand of that axis and a multiply whose sum reduces the last axis: a matmul of the probabilities with v."""
  if r.op is not Ops.RESHAPE or r.shape != (*shape[:-1], 1, shape[-1]): return False
  for ex in only(r):
    # (no expand where v has one column)
    if ex.op is Ops.MUL: muls = [ex]
    elif ex.op is not Ops.EXPAND or len(ex.shape) != len(r.shape) or ex.shape[-1] != shape[-1]: return False
    else: muls = only(ex)
    for mul in muls:
      if mul.op is not Ops.MUL: return False
      for red in only(mul):
        if red.op is not Ops.REDUCE_AXIS or red.arg != (Ops.ADD, (len(r.shape) - 1,)): return False
      if not only(mul): return False
    if not muls: return False
  return True


def choose_stages(sink: UOp, rule_sets, hoists: bool = False, hoists_rows: bool | None = None,
                  lane_guards: bool | None = None, tiled_epilogues: bool = False, tensor_cores: bool = False,
                  upward_sets=()) -> set[UOp]:
  """Nodes to realize: every node offered to each fusion rule set (a matcher) in turn, consumers first; then to
  each of `upward_sets`, producers first (rules/fusion.rules bound_kernels: what a kernel computes below a node is
  decided by then, so a kernel's size can be bounded from its inputs up).

  `hoists`: the devices compute a reduce that depends on no loop around it once per kernel (CPU, NUMPY), so a
  whole-tensor value with one consumer may stay in that consumer's kernel however far it is broadcast
  (`x.argmax()`, `x - x.mean()`: one kernel, as in tinygrad). `hoists_rows` (default: `hoists`): they compute a
  row's value once per row (CPU and NUMPY as above; a GPU's CL device in a work-group per row: codegen/opt SPREAD).
  `lane_guards` (default: `hoists`): a guarded read costs them in every vector lane (LANE_GUARD_DEVICES).
  `tiled_epilogues`: they run a contraction in register tiles on few threads, its epilogue too (runtime/devices.py
  tiles_sums: a GPU's CL device). `tensor_cores`: they run sums of 2-byte float products on tensor cores
  (runtime/devices.py tensor_cores)."""
  facts = FusionFacts(sink, hoists, hoists_rows, lane_guards, tiled_epilogues, tensor_cores)
  for m in rule_sets:
    for u in reversed(facts.order): m.rewrite(u, facts)
  for m in upward_sets:
    for u in facts.order: m.rewrite(u, facts)
  return facts.staged


def _dominating_values(u: UOp, epilogues: set[UOp], stored: set[UOp] | frozenset[UOp]) -> set[UOp]:
  """The values below u (in its epilogue: through epilogue values, under views, to the reduces it computes; stored
  values are buffers) that every path from u to one of those reduces passes through: storing one of them leaves u
  nothing but elementwise work over buffers. Dominators of the reduces in that graph, rooted at u."""
  def below(n: UOp) -> list[UOp]:
    if n is not u and (n.op is Ops.REDUCE_AXIS or n not in epilogues): return []
    out = []
    for s in n.src:
      v = _under_views(s)
      if v not in stored and (v.op is Ops.REDUCE_AXIS or v in epilogues): out.append(v)
    return out
  # depth-first postorder, then reverse postorder (a topological order from u)
  kids = {u: below(u)}
  post, stack = [], [(u, iter(kids[u]))]
  while stack:
    n, it = stack[-1]
    for v in it:
      if v not in kids:
        kids[v] = below(v); stack.append((v, iter(kids[v]))); break
    else:
      post.append(n); stack.pop()
  rpo = post[::-1]
  num = {n: i for i, n in enumerate(rpo)}
  preds: dict[UOp, list[UOp]] = {}
  for n in rpo:
    for v in kids[n]: preds.setdefault(v, []).append(n)
  idom: dict[UOp, UOp] = {u: u}
  def meet(a: UOp, b: UOp) -> UOp:
    while a is not b:
      while num[a] > num[b]: a = idom[a]
      while num[b] > num[a]: b = idom[b]
    return a
  for n in rpo[1:]:
    ps = [p for p in preds[n] if p in idom]
    d = ps[0]
    for q in ps[1:]: d = meet(d, q)
    idom[n] = d
  reduces = [n for n in rpo if n.op is Ops.REDUCE_AXIS]
  if not reduces: return set(rpo) - {u}
  low = reduces[0]
  for r in reduces[1:]: low = meet(low, r)
  out = set()
  while low is not u: out.add(low); low = idom[low]
  return out


def _read_besides(v: UOp, u: UOp, users: dict[UOp, list[UOp]], position: dict[UOp, int]) -> bool:
  """Something that is not u, nor below u, reads v (through reshapes and permutes): gelu's `h * 0.5` reads the
  matmul h beside `erf(h / sqrt(2))`, in the same kernel. Storing u would not spare computing v then.
  (A reader of v comes after v in the graph's order, and so does every node on a path from u down to it: the walk
  below u leaves out everything before v.)"""
  floor, below, todo = position[v], set(), [u]
  while todo:
    n = todo.pop()
    if n in below or position[n] <= floor: continue
    below.add(n)
    todo += n.src
  todo, seen = [v], set()
  while todo:
    n = todo.pop()
    for w in users.get(n, []):
      if w in seen: continue
      seen.add(w)
      if w.op in (Ops.RESHAPE, Ops.PERMUTE): todo.append(w)
      elif w not in below: return True
  return False


def _needed_below(u: UOp, epilogues: set[UOp], uses: dict[UOp, float], strict: bool = False,
                  stored: frozenset[UOp] | set[UOp] = frozenset(), users: dict[UOp, list[UOp]] | None = None,
                  position: dict[UOp, int] | None = None) -> bool:
  """A reduce inside u's epilogue is used more often than u, or an epilogue value below u at least as often (more
  often, when `strict`: something besides u reads it): then that value is the one to store, and u is recomputed
  from it. Only a value that every path from u to its reduces passes through counts (storing it leaves u only
  elementwise work over buffers): storing a residual stream's previous value (x + attn(ln(x)), read by the next
  layer's norm too) would leave this layer's matmul to compute, in a kernel of its own, and u in one more; a
  gradient that sums two products over two matmuls (gelu's) would be stored in pieces. u is better stored then,
  with its reduces in its kernel, as tinygrad does."""
  seen, todo = set(), [s for s in u.src]
  doms: set[UOp] | None = None
  while todo:
    v = _under_views(todo.pop())   # (as _reduce_epilogues sees its sources)
    if v in seen or not (v in epilogues or v.op is Ops.REDUCE_AXIS): continue
    seen.add(v)
    # (an elementwise value below that is needed as often is stored instead: the one nearest the reduce is)
    # (a value needed as often as u but read beside it too is needed more: u's kernel would not spare it)
    # (only a dominating value can answer yes: that is asked first, the use counts of values far below only of those)
    if doms is None: doms = _dominating_values(u, epilogues, stored)
    if v in doms:
      nv, nu = uses.get(v, 0), uses.get(u, 0)
      if nv > nu or (nv >= nu and ((not strict and v.op is not Ops.REDUCE_AXIS)
                                   or (users is not None and nu > 1 and _read_besides(v, u, users, position)))):
        return True
    if v.op is not Ops.REDUCE_AXIS: todo += v.src
  return False


# devices whose kernels compute a reduce that depends on no enclosing loop once, before the loops (the CPU
# renderer hoists it, the NUMPY device evaluates each value over only the ranges it depends on); OpenCL
# work-items would each compute it (a row's value is another matter: runtime/devices.py rows_shared)
HOISTING_DEVICES = frozenset({"CPU", "NUMPY"})
# devices where a read that checks a padding costs the register tile in every vector lane (the CPU: a compare and a
# mask per lane, and lanes whose guards differ break its vector loads; NUMPY: a where over the whole array), so a
# stored padded input pays (store_padded_input). A GPU's CL work-item predicates its guard: storing the padded input
# there cost more than the guards, the ResNet block on an H100 1.97 -> 2.30 ms forward, 16.1 -> 17.9 fwd+bwd
# (bench/results/h100-2026-12-05-session22.txt)
LANE_GUARD_DEVICES = frozenset({"CPU", "NUMPY"})
