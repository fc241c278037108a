"""Helpers of rules/bufferize.rules (scheduler pass 3): a chosen value stored into a new buffer, and how many
buffers a kernel would read (for devices with a limit on kernel arguments)."""
from __future__ import annotations

from rulec.engine.lang.capability import rule_helper
from rulec.engine.ir.ops import Ops
from rulec.engine.ir.uop import UOp


@rule_helper
def stage_to_buffer(stage: UOp) -> UOp:
  """STAGE(x): x stored into a new buffer; the value read back in x's shape."""
  x = stage.src[0]
  buf = UOp.new_buffer(stage.arg, x.size, x.dtype)
  view = buf.reshape(x.shape)
  return buf.after(view.store(x)).reshape(x.shape)


@rule_helper
def kernel_inputs(x: UOp) -> int:
  """How many buffers the kernel computing x would read (realized values count as buffers)."""
  bufs = {u for u in x.toposort(gate=lambda u: u.op not in (Ops.BUFFER, Ops.STAGE, Ops.CONTIGUOUS))
          if u.op in (Ops.BUFFER, Ops.STAGE, Ops.CONTIGUOUS)}
  return len(bufs)
