"""The memory planner: intermediates whose lifetimes do not overlap share one buffer.

A realize runs a list of kernels; a TinyJit capture keeps the kernels of a whole step and replays them. Every
intermediate value they store (a value no tensor shows afterwards: a matmul's output read by the next layer's
kernel, a softmax's row sums) gets a BUFFER of its own from the scheduler, and each keeps its memory for as long
as the kernel list lives: all of them at once at the end of a realize, and for the life of a jitted function
after its capture. Here the list is planned instead. An intermediate's lifetime is the kernels from its first
write to its last use; intermediates of one device and dtype whose lifetimes do not overlap (not even in one
kernel: a kernel that reads one while writing the other must not see its own writes) are stored in one buffer,
as large as the largest of them (a kernel's buffer may be larger than its PARAM: engine/ir/kernel.py). tinygrad's
JIT does the same (its `_internal_memory_planner`); its buffers are raw bytes, so dtypes mix there, not here.

Which buffers may be planned is the caller's to say (`candidates`): only those no one can see after the kernels
ran (not an input, not an output, not a value handed to a live tensor, not one a live graph or a kept autograd
history reads). The planner itself keeps out any candidate it cannot prove is written before it is read:
- one whose first use reads it (a kernel that updates it in place, or reads it before any kernel writes it:
  its contents from before matter);
- one that a copy between devices touches (the copy moves whole buffers of one size: runtime/devices.py).
So a planned buffer's contents before its first write are never read, and sharing it changes no value.

`RULEC_MEMORY_PLAN=0` turns planning off (every intermediate keeps a buffer of its own, as before). `STATS` counts
what planning saved.
"""
from __future__ import annotations

import bisect
import os
from typing import Iterable

from rulec.engine.ir.kernel import Kernel
from rulec.engine.ir.uop import UOp
from rulec.runtime.buffer import ALIGN, ARENA_DEVICES, new_arena_views, new_buffer
from rulec.runtime.devices import copy_buffers, device_kind

__all__ = ["enabled", "plan", "STATS"]

# buffers planned, buffers they were stored in, bytes those would have taken apart and take together
STATS = {"planned": 0, "shared": 0, "bytes_before": 0, "bytes_after": 0}


def enabled() -> bool:
  """Planning is on unless RULEC_MEMORY_PLAN=0 (read on every call, so tests can switch it)."""
  return os.environ.get("RULEC_MEMORY_PLAN", "1") != "0"


def _lifetimes(kernels: list[Kernel], candidates: set[UOp]) -> dict[UOp, list[int]]:
  """For each candidate that may be planned: [first kernel, last kernel] of its uses."""
  span: dict[UOp, list[int]] = {}
  refused: set[UOp] = set()
  for i, k in enumerate(kernels):
    mine = [b for b in k.bufs if b in candidates]
    if not mine: continue
    if copy_buffers(k) is not None:
      refused.update(mine)
      continue
    written = {k.bufs[s] for s in k.outputs}
    read = {k.bufs[s] for s in k.inputs}
    for b in mine:
      if b in refused: continue
      if b not in span:
        # first use: it must be written here and not read (reading it would see what it held before)
        if b not in written or b in read:
          refused.add(b)
          continue
        span[b] = [i, i]
      else: span[b][1] = i
  for b in refused: span.pop(b, None)
  return span


def plan(kernels: list[Kernel], candidates: Iterable[UOp]) -> list[Kernel]:
  """`kernels` with the candidates among their buffers stored in shared buffers where lifetimes allow (the list
  itself when nothing is shared). The shared buffers are new BUFFERs: a candidate that shares nothing keeps its
  own."""
  candidates = set(candidates)
  if not candidates or not enabled(): return kernels
  span = _lifetimes(kernels, candidates)
  if len(span) < 2: return kernels
  STATS["planned"] += len(span)
  STATS["bytes_before"] += sum(_nbytes(b) for b in span)
  mapping: dict[UOp, UOp] = {}
  on_host: dict[str, list[UOp]] = {}
  for b in span:
    if device_kind(b.arg[1]) in ARENA_DEVICES: on_host.setdefault(b.arg[1], []).append(b)
  for device, bufs in on_host.items(): mapping.update(_arena(device, bufs, span))
  mapping.update(_slots([b for b in span if b not in mapping], span))
  if not mapping: return kernels
  return [Kernel(k.ast, tuple(mapping.get(b, b) for b in k.bufs), k.vals)
          if any(b in mapping for b in k.bufs) else k for k in kernels]


def _nbytes(b: UOp) -> int: return b.arg[2] * b.dtype.itemsize


def _largest_first(bufs: list[UOp], span: dict[UOp, list[int]]) -> list[UOp]:
  return sorted(bufs, key=lambda b: (-_nbytes(b), span[b][0]))


def _arena(device: str, bufs: list[UOp], span: dict[UOp, list[int]]) -> dict[UOp, UOp]:
  """Host devices: the buffers as views of one arena of bytes, each at an offset no buffer whose lifetime meets its
  own uses at the same time. Largest first, each at the lowest offset that is free for its whole lifetime (greedy by
  size, as TensorFlow Lite's arena planner places tensors): several small intermediates fit where a
  large one lives at another time, which slots of one buffer each cannot do (a GPT-2 step's token-embedding
  gradient, 147 MiB, idle through the backward pass while the layers' activations each kept a slot)."""
  if len(bufs) < 2: return {}
  placed: list[tuple[int, int, int, int]] = []   # (first, last, start byte, end byte)
  layout: dict[UOp, int] = {}
  total = 0
  for b in _largest_first(bufs, span):
    (first, last), size = span[b], -(-_nbytes(b) // ALIGN) * ALIGN
    busy = sorted((s, e) for f, l, s, e in placed if f <= last and first <= l)
    at = 0
    for s, e in busy:
      if at + size <= s: break
      at = max(at, e)
    layout[b] = at
    placed.append((first, last, at, at + size))
    total = max(total, at + size)
  order = list(layout)
  views = new_arena_views(device, total, [(layout[b], b.arg[2], b.dtype) for b in order])
  STATS["shared"] += 1
  STATS["bytes_after"] += total
  return dict(zip(order, views))


def _slots(bufs: list[UOp], span: dict[UOp, list[int]]) -> dict[UOp, UOp]:
  """Other devices: the buffers stored in shared buffers, one member at a time each."""
  # Largest first: each buffer goes to the smallest slot of its device and dtype that is free for its whole
  # lifetime (every slot made before it is at least as large), else to a new slot of its size. Sweeping the kernels
  # in order instead, and growing a free slot to the next buffer's size, left a 2-layer GPT-2 step 15% above the
  # most bytes live at once (a slot grown to a gradient's size for a moment held it for the step).
  kinds: list[tuple] = []             # slot -> (device, dtype)
  sizes: list[int] = []               # slot -> elements (its first, largest member's)
  taken: list[list[tuple]] = []       # slot -> the (first, last) kernels of its members, sorted
  members: list[list[UOp]] = []
  for b in _largest_first(bufs, span):
    kind, (first, last) = (b.arg[1], b.dtype), span[b]
    best = None
    for s, k in enumerate(kinds):
      if k != kind or (best is not None and sizes[s] >= sizes[best]): continue
      i = bisect.bisect_left(taken[s], (first, last))
      if i > 0 and taken[s][i - 1][1] >= first: continue    # (overlaps the member before)
      if i < len(taken[s]) and taken[s][i][0] <= last: continue   # (or the one after)
      best = s
    if best is None:
      best = len(kinds)
      kinds.append(kind)
      sizes.append(b.arg[2])
      taken.append([])
      members.append([])
    bisect.insort(taken[best], (first, last))
    members[best].append(b)
  mapping: dict[UOp, UOp] = {}
  for (device, dtype), size, group in zip(kinds, sizes, members):
    if len(group) < 2: continue
    shared = new_buffer(device, size, dtype)
    for b in group: mapping[b] = shared
  STATS["shared"] += len(kinds)
  STATS["bytes_after"] += sum(n * d.itemsize for (_, d), n in zip(kinds, sizes))
  return mapping
