"""Pass 6 of the scheduler and the run order: each store becomes a Kernel over numbered PARAMs
(rules/kernel.rules, with a KernelBuilder as ctx), and kernels are ordered by their reads and writes."""
from __future__ import annotations

from rulec.engine.ir.ops import Ops
from rulec.engine.ir.uop import UOp
from rulec.engine.ir.kernel import Kernel


class KernelBuilder:
  """ctx of rules/kernel.rules: numbers the buffers and ranges of one kernel."""
  def __init__(self):
    self.bufs: list[UOp] = []
    self.slots: dict[UOp, UOp] = {}
    self.ranges = 0
    self.after_reads: set[UOp] = set()   # buffers read as written by an earlier kernel (AFTER)

  def param_after(self, buf: UOp) -> UOp:
    self.after_reads.add(buf)
    return self.param(buf)

  def param(self, buf: UOp) -> UOp:
    if buf not in self.slots:
      self.slots[buf] = UOp(Ops.PARAM, buf.dtype, (), (len(self.bufs), buf.arg[2]))
      self.bufs.append(buf)
    return self.slots[buf]

  def renumber(self, r: UOp) -> UOp:
    self.ranges += 1
    return r.replace(arg=(self.ranges - 1, r.arg[1]), tag="k")


class KernelSplit:
  """ctx of rules/kernel.rules' split_kernels (the seeds' split_store): `split(after)` turns the stores of one
  AFTER into a Kernel (its own to_params pass numbers the buffers and ranges) and gives the AFTER back naming
  that kernel, AFTER(buffer, KERNEL): a later kernel that reads the buffer still sees the dependency."""
  def __init__(self, to_params, untag, run_pass):
    self.to_params, self.untag, self.run_pass = to_params, untag, run_pass
    self.built: list[tuple[Kernel, KernelBuilder, UOp]] = []

  def split(self, after: UOp) -> UOp:
    ctx = KernelBuilder()
    ast = self.run_pass("to_params", UOp.sink(*after.src[1:]), self.to_params, quiet=True, ctx=ctx, bottom_up=True)
    self.built.append((Kernel(self.run_pass("untag", ast, self.untag, quiet=True), tuple(ctx.bufs)), ctx, after.src[0]))
    return after.replace(src=(after.src[0], UOp(Ops.KERNEL, after.dtype, (), len(self.built) - 1)))


def order_kernels(built: list[tuple[Kernel, KernelBuilder, UOp]]) -> list[Kernel]:
  """Kernels in an order that respects reads after writes (AFTER) and writes after reads: a kernel that overwrites
  an existing buffer (an assign) runs after every kernel that reads that buffer's old contents; kernels writing one
  buffer keep their order.

  Within that, each kernel runs as late as its consumers allow: a depth-first walk from the kernels nobody waits
  for (the last built first) emits a kernel's inputs just before it. The memory planner
  (engine/memory_plan.py) keeps a buffer from its first write to its last read, so the order decides the memory a
  realize needs: in a training step each weight's gradient is computed right before the optimizer's update that
  reads it, instead of every gradient of the backward pass waiting for the updates at the end (a 12-layer GPT-2
  training step, T 256, under TinyJit: 2137 -> 1952 MiB at the peak, bench/memory.py). (Before, the
  lowest-numbered ready kernel ran first.)"""
  n = len(built)
  writers: dict[UOp, list[int]] = {}
  for i, (_, _, buf) in enumerate(built): writers.setdefault(buf, []).append(i)
  deps: list[set[int]] = [set() for _ in range(n)]
  for ws in writers.values():
    for a, b in zip(ws, ws[1:]): deps[b].add(a)
  for i, (_, ctx, out) in enumerate(built):
    for b in ctx.bufs:
      if b is out or b not in writers: continue
      if b in ctx.after_reads: deps[i].update(w for w in writers[b] if w != i)   # read after write
      else:
        for w in writers[b]:
          if w != i: deps[w].add(i)   # the overwrite waits for this read
  waited_for = set().union(*deps) if deps else set()
  def inputs(i: int): return iter(sorted(deps[i]))
  order: list[int] = []
  state = [0] * n   # 0 not seen, 1 on the walk's stack, 2 emitted
  # (the last built first: a training step builds its optimizer updates in the parameters' order, input to output,
  # while the backward pass makes gradients output to input; walked from the last parameter, each layer's weight
  # gradient and update follow the backward down the model and free its activations there, and the token
  # embedding's gradient, read first, tied to the logits' matmul, comes last instead of living through it all)
  roots = [i for i in reversed(range(n)) if i not in waited_for]
  for root in roots + list(range(n)):
    if state[root]: continue
    stack = [(root, inputs(root))]
    state[root] = 1
    while stack:
      i, it = stack[-1]
      nxt = next(it, None)
      if nxt is None:
        stack.pop()
        state[i] = 2
        order.append(i)
      elif state[nxt] == 1: raise RuntimeError("cycle in the kernel graph: two kernels each need the other's buffer first")
      elif state[nxt] == 0:
        state[nxt] = 1
        stack.append((nxt, inputs(nxt)))
  return [built[i][0] for i in order]

