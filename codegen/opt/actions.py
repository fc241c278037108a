"""Optimizer actions: what the optimizer does to a kernel, as data a user can read and write.

An action names one transformation of the kernel graph (codegen/opt/transform.py
applies it) by a range's axis number, the `r<axis>` of `Kernel.render()`:

  UPCAST(a,n)   split store range a into a loop of size/n and n lanes computed side by side (register tile,
                vector lanes); the lanes share every reduce loop nest of the value. Where n does not divide the
                size, ceil(size/n) tiles, the last one overlapping the one before (not in a kernel that reads what
                it writes)
  LOCAL(a,n)    split store range a into work-groups and n work-items of one group (GPUs)
  KBLOCK(a,n)   run reduce range a in blocks of n, the block loop outermost, each block adding into what the
                previous one stored (the block of the second input stays in cache for every row tile: CPU).
                Where n does not divide a's size, the last block is shorter (1009 in blocks of 64: the last of 49).
                A ragged UPCAST must come before it. An elementwise epilogue of the sum (a bias, a residual add, a
                relu, gelu) is applied by the last block alone (the CPU renderer branches on the block)
  THREAD(a)     split store range a across the CPU's threads
  BLOCK(a,n)    run store range a in blocks of n, the block loop outermost (outside the threads' loop too): what
                one block reads stays in cache while every other store loop runs (CPU: x @ W.T's rows of W)
  GROUP(n)      every reduction of the kernel shared by a work-group of n work-items, combined in local memory
  VECTOR(n)     an elementwise kernel over one contiguous range moves n elements per work-item with aligned vector
                loads and stores; after GROUP, each work-item's step of the group reduction takes n neighbouring
                elements, with a vector load for each load contiguous in the innermost reduce range
  SPREAD(a,n)   store range a spread across a work-group of n work-items (a, a + n, ... each); every reduction
                of the kernel (none may depend on a) computed once per work-group by all n (GROUP): a softmax row
                per work-group, its max and sum shared
  GRID(n)       after GROUP, in a kernel that stores one value of one reduction: the reduction split across n
                work-groups in one launch; each stores its partial result, and the last to finish (an atomic
                counter) combines the n partials and stores the value (one kernel where the scheduler would
                otherwise split the reduce into two)
  SIMD(a)       the CPU's reduce range a runs in vector lanes (a partial sum per lane, the lanes added at the end:
                LLVM's loop vectoriser for a sum over a alone; explicit vectors kept across every range of a sum
                over several, where its terms are loads stepping along a) instead of the upcast lanes being the
                vector: a register tile whose loads run along the reduction and not along the tile (x @ W.T: rows
                of A by rows of W; a convolution's weight gradient: its sum along image rows)
  PREFETCH(a,n) the CPU's sum over reduce range a (or over the blocks KBLOCK made of it): each load that moves a
                cache line or more per step of the sum's innermost range is prefetched n steps ahead, one
                prefetch per line its lanes read (a matmul's rows of B, a page apart, which the hardware
                prefetchers do not follow)
  STAGE(a,n)    after UPCAST and LOCAL: reduce range a in blocks of n; per block the work-group copies every load
                that depends on a and on the store ranges only into local memory together, and the lanes read it
                from there (a GPU's matmul tile reads A and B from global memory once per work-group). The
                sum's other ranges are loops around the blocks (a weight gradient's images and rows around
                blocks of a row's columns, a convolution's taps around blocks of its channels)

Text form: the actions separated by spaces or commas, `UPCAST(2,8) UPCAST(3,16) KBLOCK(4,64) THREAD(2)`,
as RULEC_DEBUG=2 prints them and RULEC_OPT accepts them (codegen/opt/__init__.py).
"""
from __future__ import annotations

import os
import re

import attrs

# op -> (takes an axis, takes an amount)
SHAPES = {"UPCAST": (True, True), "LOCAL": (True, True), "KBLOCK": (True, True), "THREAD": (True, False),
          "GROUP": (False, True), "VECTOR": (False, True),
          "GRID": (False, True), "SPREAD": (True, True), "STAGE": (True, True), "SIMD": (True, False), "BLOCK": (True, True),
          "PREFETCH": (True, True)}


class OptError(ValueError):
  """An action list that cannot apply to a kernel, or text that is not one."""


@attrs.frozen
class Action:
  op: str
  axis: int | None = None
  amount: int | None = None

  def __str__(self) -> str:
    args = [str(x) for x in (self.axis, self.amount) if x is not None]
    return f"{self.op}({','.join(args)})"


def format_actions(actions) -> str:
  return " ".join(str(a) for a in actions) if actions else "(none)"


_ACTION = re.compile(r"\s*([A-Za-z_]+)\s*\(\s*([^()]*?)\s*\)\s*,?")


def parse_actions(text: str) -> tuple[Action, ...]:
  """The actions written in `text`; an OptError names the first part that is not one, with its column."""
  out, pos, text = [], 0, text.strip()
  if text in ("", "(none)"): return ()
  while pos < len(text):
    m = _ACTION.match(text, pos)
    if m is None: raise OptError(f"expected an action such as UPCAST(2,8) at column {pos + 1} of {text!r}")
    op, args = m.group(1).upper(), [a.strip() for a in m.group(2).split(",")] if m.group(2) else []
    if op not in SHAPES: raise OptError(f"unknown action {m.group(1)!r} at column {pos + 1} (known: {', '.join(SHAPES)})")
    want = sum(SHAPES[op])
    if len(args) != want or not all(re.fullmatch(r"r?\d+", a) for a in args):
      form = {(True, True): "(axis,amount)", (True, False): "(axis)", (False, True): "(amount)"}[SHAPES[op]]
      raise OptError(f"{op} takes {form} as non-negative integers, got ({m.group(2)}) at column {pos + 1}")
    nums = [int(a.lstrip("r")) for a in args]
    has_axis, has_amount = SHAPES[op]
    out.append(Action(op, nums[0] if has_axis else None, nums[-1] if has_amount else None))
    pos = m.end()
  return tuple(out)


__all__ = ["SHAPES", "Action", "OptError", "debug_level", "format_actions", "parse_actions"]


def debug_level() -> int:
  """RULEC_DEBUG as a number (0 when unset or not a number): 1 prints search results, 2 each kernel's actions."""
  try: return int(os.environ.get("RULEC_DEBUG", "0") or 0)
  except ValueError: return 0
