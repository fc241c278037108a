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
  """Kernels in an order that respects reads after writes (AFTER) and writes after reads:
  a kernel that overwrites an existing buffer (an assign) runs after every kernel
  that reads that buffer's old contents."""
  n = len(built)
  writer = {buf: i for i, (_, _, buf) in enumerate(built)}
  deps: list[set[int]] = [set() for _ in range(n)]
  for i, (_, ctx, out) in enumerate(built):
    for b in ctx.bufs:
      if b is out: continue
      if b in ctx.after_reads and b in writer: deps[i].add(writer[b])         # read after write
      elif b not in ctx.after_reads and b in writer: deps[writer[b]].add(i)   # the overwrite waits for this read
  order, done = [], set()
  while len(order) < n:
    ready = [i for i in range(n) if i not in done and deps[i] <= done]
    if not ready: raise RuntimeError("cycle in the kernel graph: two kernels each need the other's buffer first")
    done.add(ready[0])
    order.append(ready[0])
  return [built[i][0] for i in order]
