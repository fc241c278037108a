"""Between choosing and realizing: the chosen nodes wrapped in STAGE, targets given buffers, constants
placed on a device, reads of overwritten buffers redirected to snapshots."""
from __future__ import annotations

from engine.ops import ALU, MOVEMENT, Ops
from engine.uop import UOp


def wrap_stages(sink: UOp, staged: set[UOp], devices: list[str]) -> UOp:
  """Each chosen node wrapped in STAGE, and each target realized into a buffer of its own.

  A target that is a whole or partial view of a buffer (realized before, or
  written by an assign in this schedule), of a chosen stage, or of a constant
  needs no kernel: it stays that view. Any other target is wrapped in a STAGE tagged "target"
  (no rule folds it away: the caller reads that buffer), and that same node
  replaces the target everywhere, so a value that is both an output and used by
  another output is computed once. CONTIGUOUS of a value that is staged anyway
  is that stage: one buffer, not a copy of one."""
  targets = list(sink.src)
  target_of: dict[UOp, str] = {}   # node -> device of the buffer its target stage writes
  for t, dev in zip(targets, devices):
    if t.size == 0 or t.base.op in (Ops.BUFFER, Ops.AFTER): continue
    if t.base.op is Ops.CONST: continue   # a constant (one the earlier passes folded, too) stays a constant
    if t.op is not Ops.CONTIGUOUS and t.base in staged: continue
    # a copy of a computed value is that value's stage; a copy of a view of a buffer stages the CONTIGUOUS
    # itself, so the view (an assign's target, say) stays what it is everywhere else
    # (a tagged CONTIGUOUS is a copy asked for: a buffer of its own)
    x = t.src[0] if t.op is Ops.CONTIGUOUS and t.tag is None and t.src[0].base.op not in (Ops.BUFFER, Ops.AFTER) else t
    target_of.setdefault(x, x.device or dev)
  done: dict[UOp, UOp] = {}
  for u in sink.toposort():
    if u is sink: break
    new_src = tuple(done[s] for s in u.src)
    x = u if new_src == u.src else UOp(u.op, u.dtype, new_src, u.arg, u.tag)
    if u in target_of: x = UOp(Ops.STAGE, x.dtype, x.src if x.op is Ops.CONTIGUOUS else (x,), target_of[u], tag="target")
    elif u in staged: x = UOp(Ops.STAGE, x.dtype, (x,), x.device)
    elif u.op is Ops.CONTIGUOUS and u.tag is None and x.src[0].op is Ops.STAGE: x = x.src[0]
    done[u] = x
  outs = []
  for t, dev in zip(targets, devices):
    if t.size == 0: outs.append(UOp.new_buffer(t.device or dev, 0, t.dtype).reshape(t.shape))
    elif t.op is Ops.CONTIGUOUS and done[t].op is Ops.STAGE: outs.append(done[t])
    else: outs.append(done[t.src[0]] if t.op is Ops.CONTIGUOUS and t.src[0] in target_of else done[t])
  return sink.replace(src=tuple(outs))


def reuse_contiguous_copies(sink: UOp) -> UOp:
  """An elementwise op reading x reads a contiguous copy of x's permute/reshape instead, through the inverse
  view, when the program makes one: the copy's kernel computes x once (the seeds' replace_contiguous)."""
  found: dict[UOp, UOp] = {}
  for u in sink.toposort():
    if u.op is not Ops.CONTIGUOUS or u.tag is not None or u.src[0].op not in (Ops.PERMUTE, Ops.RESHAPE): continue
    x, view, views = u.src[0], u, {}
    while x.op in (Ops.PERMUTE, Ops.RESHAPE):
      view = view.permute(tuple(sorted(range(len(x.arg)), key=lambda i: x.arg[i]))) if x.op is Ops.PERMUTE \
        else view.reshape(x.src[0].shape)
      x = x.src[0]
      views[x] = view   # each level of the chain (a matmul's value is a RESHAPE of its reduce)
    if x.op in ALU or x.op is Ops.REDUCE_AXIS:
      for k, v in views.items(): found.setdefault(k, v)
  if not found: return sink
  def via_copy(s: UOp) -> UOp | None:
    """s (a permute/reshape chain over a value that has a copy) read from that copy."""
    chain = []
    while s not in found and s.op in (Ops.PERMUTE, Ops.RESHAPE):
      chain.append(s)
      s = s.src[0]
    if s not in found: return None
    out = found[s]
    for m in reversed(chain): out = m.replace(src=(out,))
    return out
  done: dict[UOp, UOp] = {}
  for u in sink.toposort():
    new_src = tuple((via_copy(s) or done[s]) if u.op in ALU else done[s] for s in u.src)
    done[u] = u if new_src == u.src else UOp(u.op, u.dtype, new_src, u.arg, u.tag)
  return done[sink]


def place_constants(sink: UOp, devices: list[str]) -> UOp:
  """A buffer for a value that lives on no device (a CONTIGUOUS of constants, a split reduce of
  ones) goes where its nearest consumer lives: that consumer's device, or the target's."""
  order = sink.toposort()
  if all(u.device is not None for u in order if u.op in (Ops.STAGE, Ops.CONTIGUOUS)): return sink
  where: dict[UOp, str] = dict(zip(sink.src, devices))
  for u in reversed(order):
    here = u.arg if u.op is Ops.COPY else u.device or where.get(u)
    for s in u.src:
      if here is not None: where.setdefault(s, here)
  done: dict[UOp, UOp] = {}
  for u in order:
    new_src = tuple(done[s] for s in u.src)
    x = u if new_src == u.src else UOp(u.op, u.dtype, new_src, u.arg, u.tag)
    if u.device is None and u in where and u.op in (Ops.STAGE, Ops.CONTIGUOUS) and (u.op is Ops.CONTIGUOUS or u.arg is None):
      x = UOp(Ops.STAGE, x.dtype, x.src, where[u], x.tag)
    done[u] = x
  return done[sink]


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

  def read(site: UOp, s: UOp) -> UOp | None:
    """The source s of site, when it is a view of a written buffer read raw in a kernel after the write."""
    chain = []
    x = s
    while x.op in MOVEMENT:
      chain.append(x)
      x = x.src[0]
    if x.op is not Ops.BUFFER or x not in afters: return None
    out = snaps.setdefault(x, UOp(Ops.STAGE, x.dtype, (x,), x.arg[1], tag="snapshot"))
    for m in reversed(chain): out = m.replace(src=(out,))
    return out

  for root in order:
    if not (root.op in _KERNEL_ROOTS or root.op is Ops.AFTER or root is sink): continue
    needs = root.op in _KERNEL_ROOTS and any(b in after_of[root] for b in afters)
    done[root] = _rebuild_region(root, done, read if needs else None)
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
