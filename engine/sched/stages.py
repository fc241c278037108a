"""Between choosing and realizing. The ctx objects of rules/bufferize.rules' `stage` and `place` (the chosen
nodes and the outputs wrapped in STAGE; constants placed on a device), and one graph pass still written
in Python: reads of overwritten buffers redirected to snapshots. Also the ctx of `reuse_copies` (early.rules)."""
from __future__ import annotations

from rulec.engine.ir.ops import ALU, MOVEMENT, Ops
from rulec.engine.ir.uop import UOp


class Rebuilt:
  """A ctx whose facts are keyed by the nodes of the graph a pass started from.

  A post-order pass shows its rules each node rebuilt over its rewritten sources; `key(x)` is the node it
  was: x with every source taken back to its original, and every replacement the rules `record`ed taken back
  to the node it replaced (nodes are hash-consed, so an unchanged node is its own key). A node is replaced
  once: a wrapper (STAGE(x)) has x among its sources, which the pass visits again.

  One replacement may stand for several originals (`CONTIGUOUS(STAGE(x)) -> STAGE(x)`: the stage is both x and
  the copy of x); a node over it is taken back to the choice that was a node of the graph the pass started
  from (`sink`), so readers of x and readers of the copy are both still recognised."""
  def __init__(self, sink: UOp | None = None):
    self._key: dict[UOp, UOp] = {}
    self._alts: dict[UOp, list[UOp]] = {}   # replacement -> every original it stands for, the first first
    self._replaced: set[UOp] = set()
    self._sink = sink
    self._users: dict[UOp, list[UOp]] | None = None   # node of sink's graph -> its users there, made when first needed
    # rebuilt node -> the rebuilt nodes over it whose keys `key` derived (not recorded): forgotten when it gains an
    # original, since a key chosen while it stood for one original may be the wrong choice now
    self._over: dict[UOp, list[UOp]] = {}

  def record(self, old: UOp, new: UOp) -> UOp:
    """`new` replaces `old`: the replacement, remembered as standing for old's original."""
    k = self.key(old)
    first = self._key.get(new)
    if first is None or self._sink is None: self._key[new] = k
    elif k is not first:
      self._alts.setdefault(new, [first]).append(k)
      self._forget_over(new)
    self._replaced.add(k)
    return new

  def fresh(self, x: UOp) -> UOp | None:
    """x's original, if no replacement was recorded for it yet (else None)."""
    k = self.key(x)
    return None if k in self._replaced else k

  def key(self, x: UOp) -> UOp:
    if (hit := self._key.get(x)) is not None: return hit
    for u in x.toposort(gate=lambda u: u not in self._key):
      if u in self._key: continue
      src = tuple(self._key[s] for s in u.src)
      if self._alts and any(s in self._alts for s in u.src):
        found = self._originals(u, [self._alts.get(s, (k,)) for s, k in zip(u.src, src)])
        if found:
          src = found[0].src
          # a node over an ambiguous one can be ambiguous itself (two views of x and of its copy that became one
          # node once the copy was staged): its readers pick among all of them in turn
          if len(found) > 1 and u not in self._alts: self._alts[u] = found
      self._key[u] = u if all(a is b for a, b in zip(src, u.src)) else UOp(u.op, u.dtype, src, u.arg, u.tag)
      if self._sink is not None:
        for s in u.src: self._over.setdefault(s, []).append(u)
    return self._key[x]

  def _forget_over(self, new: UOp) -> None:
    """Drop the derived keys of the nodes over `new`, which just gained an original: a node over it built while it
    stood for one original (a view of x read before x's copy became the same stage) keeps that choice, and the
    nodes above it then miss the node of the starting graph they are (an output no longer recognised as one)."""
    stack = list(self._over.pop(new, ()))
    while stack:
      u = stack.pop()
      if self._key.pop(u, None) is None: continue
      self._alts.pop(u, None)
      stack.extend(self._over.pop(u, ()))


  def _originals(self, u: UOp, choices: list) -> list[UOp]:
    """The nodes of the starting graph that are u over one of choices[i] as source i, in the order of the
    choices (the first choice of every source first, as itertools.product would list them). Found from the users
    of the first source's choices, not by trying every combination: one ambiguous source per output of a sink
    of many outputs would otherwise be 2**n combinations."""
    if self._users is None:
      self._users = {}
      for n in self._sink.toposort():
        for s in n.src: self._users.setdefault(s, []).append(n)
    cands = {o for c in choices[0] for o in self._users.get(c, ())}
    found = [o for o in cands if o.op is u.op and len(o.src) == len(choices)
             and all(any(x is c for c in ch) for x, ch in zip(o.src, choices))
             and UOp(u.op, u.dtype, o.src, u.arg, u.tag) is o]
    return sorted(found, key=lambda o: tuple(next(i for i, c in enumerate(ch) if c is x) for x, ch in zip(o.src, choices)))


class StagePlan(Rebuilt):
  """ctx of rules/bufferize.rules' `stage`: the fusion decisions and the outputs, for wrapping them in STAGE.

  An output that is a whole or partial view of a buffer (realized before, or written by an assign in this
  schedule), of a stored value, or of a constant needs no kernel: it stays that view. Any other output is
  stored into a buffer of its own, on `output_device(x)`; a copy (CONTIGUOUS) of a computed value is that
  value's stage, and a copy of a view of a buffer stages the copy itself, so the view (an assign's target,
  say) stays what it is everywhere else."""
  def __init__(self, sink: UOp, staged: set[UOp], devices: list[str]):
    super().__init__(sink)
    self.staged = staged
    self._outputs: dict[UOp, str] = {}   # node -> device of the buffer its output stage writes
    self._empty: dict[UOp, str] = {}
    for t, dev in zip(sink.src, devices):
      if t.size == 0: self._empty.setdefault(t, t.device or dev); continue
      if t.base.op in (Ops.BUFFER, Ops.AFTER, Ops.CONST): continue   # (constants, folded ones too, stay constants)
      if t.op is not Ops.CONTIGUOUS and t.base in staged: continue
      # (a tagged CONTIGUOUS is a copy asked for: a buffer of its own)
      x = t.src[0] if t.op is Ops.CONTIGUOUS and t.tag is None and t.src[0].base.op not in (Ops.BUFFER, Ops.AFTER) else t
      self._outputs.setdefault(x, x.device or dev)

  def output_device(self, x: UOp) -> str | None:
    """Where the buffer of the output x is (None: x is no output that needs one)."""
    return self._outputs.get(self.fresh(x))

  def stored(self, x: UOp) -> bool:
    """The fusion rules stored x (rules/fusion.rules)."""
    return self.fresh(x) in self.staged

  def empty_output(self, x: UOp) -> bool:
    """x is an output of size 0."""
    return self.fresh(x) in self._empty

  def empty_buffer(self, x: UOp) -> UOp:
    """A view of an empty buffer of x's shape, on the output's device."""
    return UOp.new_buffer(self._empty[self.key(x)], 0, x.dtype).reshape(x.shape)


class CopyReuse(Rebuilt):
  """ctx of rules/early.rules' `reuse_copies`: the contiguous copies of permute/reshape chains the program
  makes, so an elementwise op reading the chain's value reads the copy through the inverse view (the copy's
  kernel computes the value once: the seeds' replace_contiguous)."""
  def __init__(self, sink: UOp):
    super().__init__()
    self.found: dict[UOp, UOp] = {}   # a value in a chain -> that value as a view of the copy
    for u in sink.toposort():
      if u.op is not Ops.CONTIGUOUS or u.tag is not None or u.src[0].op not in (Ops.PERMUTE, Ops.RESHAPE): continue
      x, view, views = u.src[0], u, {}
      while x.op in (Ops.PERMUTE, Ops.RESHAPE):
        view = view.permute(tuple(sorted(range(len(x.arg)), key=lambda i: x.arg[i]))) if x.op is Ops.PERMUTE \
          else view.reshape(x.src[0].shape)
        x = x.src[0]
        views[x] = view   # each level of the chain (a matmul's value is a RESHAPE of its reduce)
      if x.op in ALU or x.op is Ops.REDUCE_AXIS:
        for k, v in views.items(): self.found.setdefault(k, v)

  def via_copy(self, s: UOp) -> UOp | None:
    """s (a permute/reshape chain over a value that has a copy) read from that copy; None if it has none."""
    chain, s = [], self.key(s)
    while s not in self.found and s.op in (Ops.PERMUTE, Ops.RESHAPE):
      chain.append(s)
      s = s.src[0]
    if s not in self.found: return None
    out = self.found[s]
    for m in reversed(chain): out = m.replace(src=(out,))
    return out

  def reads_a_copy(self, e: UOp) -> bool:
    """Some source of e can be read from a copy (and e was not rewritten for it yet)."""
    return self.fresh(e) is not None and any(self.via_copy(s) is not None for s in e.src)


class Placement(Rebuilt):
  """ctx of rules/bufferize.rules' `place`: a buffer for a value that lives on no device (a CONTIGUOUS of
  constants, a split reduce of ones) goes where its nearest consumer lives: that consumer's device, or the
  output's."""
  def __init__(self, sink: UOp, devices: list[str]):
    super().__init__()
    self.where: dict[UOp, str] = dict(zip(sink.src, devices))
    for u in reversed(sink.toposort()):
      here = u.arg if u.op is Ops.COPY else u.device or self.where.get(u)
      for s in u.src:
        if here is not None: self.where.setdefault(s, here)

  @staticmethod
  def needed(sink: UOp) -> bool:
    """Whether any buffer would live on no device (else the pass has nothing to place)."""
    return any(u.device is None for u in sink.toposort() if u.op in (Ops.STAGE, Ops.CONTIGUOUS))

  def consumer_device(self, x: UOp) -> str | None:
    """The device of x's nearest consumer when x itself lives on no device (None otherwise)."""
    k = self.fresh(x)
    return self.where.get(k) if k is not None and k.device is None else None


# the nodes that become kernels at the tensor level: stages, contiguous copies, device copies, stores
_KERNEL_ROOTS = (Ops.STAGE, Ops.CONTIGUOUS, Ops.COPY, Ops.STORE)


def snapshot_overwritten_reads(sink: UOp) -> UOp:
  """Reads of a buffer's old contents in a kernel that must run after an assign overwrites that buffer.

  In one realize, every value is computed from the buffers as they were before the call's assigns, except
  through an assign's own result (as `RULEC_REALIZE=eval` does: `old = b + 0; b.assign(b * 10)` then
  `old + b`: old is b as it was). A kernel that reads b raw while its region depends on the written b
  (through the AFTER, directly or through another kernel) cannot be ordered: before the store it misses the
  new contents, after it the old ones. Those raw reads go to a copy of b taken first (a STAGE tagged
  "snapshot", which no rule folds away): the seeds' find_bufs guard, resolved by a copy instead of an
  error. Outputs that are views of b compute nothing: they are the buffer, and show the write."""
  order = sink.toposort()
  afters = {u.src[0]: u for u in order if u.op is Ops.AFTER}
  if not afters: return sink
  after_of: dict[UOp, frozenset] = {}   # the buffers whose written contents each node depends on
  for u in order:
    acc = frozenset({u.src[0]}) if u.op is Ops.AFTER else frozenset()
    for x in u.src: acc |= after_of[x]
    after_of[u] = acc
  snaps: dict[UOp, UOp] = {}
  done: dict[UOp, UOp] = {}

  def reader(written: frozenset):
    def read(site: UOp, s: UOp) -> UOp | None:
      """The source s of site, when it is a view of a buffer read raw in a kernel that runs after that buffer's
      write (`written`: the buffers whose written contents the kernel depends on). A raw read of another written
      buffer stays: order_kernels runs the kernel before that write (an optimizer's update reads its parameter
      raw, and the parameter's gradient too, in the realize that overwrites it: no copy is needed)."""
      chain = []
      x = s
      while x.op in MOVEMENT:
        chain.append(x)
        x = x.src[0]
      if x.op is not Ops.BUFFER or x not in written: return None
      out = snaps.setdefault(x, UOp(Ops.STAGE, x.dtype, (x,), x.arg[1], tag="snapshot"))
      for m in reversed(chain): out = m.replace(src=(out,))
      return out
    return read

  for root in order:
    if not (root.op in _KERNEL_ROOTS or root.op is Ops.AFTER or root is sink): continue
    written = after_of[root] & afters.keys() if root.op in _KERNEL_ROOTS else frozenset()
    done[root] = _rebuild_region(root, done, reader(written) if written else None)
  return done[sink]


def _rebuild_region(root: UOp, done: dict[UOp, UOp], read) -> UOp:
  """root over its region's nodes rebuilt: kernels and AFTERs below it as already rebuilt (`done`), and each
  source of a value (not of a movement op) that read(value, source) redirects. A store's target (src[0]) is
  written, not read: it stays."""
  keep = root.src[:1] if root.op is Ops.STORE else ()
  srcs = root.src[len(keep):]
  boundary = lambda x: x.op in _KERNEL_ROOTS or x.op is Ops.AFTER
  memo: dict[UOp, UOp] = {}
  def sources(x: UOp, xs: tuple[UOp, ...]) -> tuple[UOp, ...]:
    if read is None or x.op in MOVEMENT: return tuple(memo[s] for s in xs)
    return tuple(read(x, s) or memo[s] for s in xs)
  for x in UOp.sink(*srcs).toposort(gate=lambda x: x.op is Ops.SINK or not boundary(x))[:-1]:
    if boundary(x): memo[x] = done.get(x, x)
    else:
      new_src = sources(x, x.src)
      memo[x] = x if new_src == x.src else x.replace(src=new_src)
  new = keep + sources(root, srcs)
  return root if new == root.src else root.replace(src=new)
