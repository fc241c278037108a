"""The kernel optimizer: between scheduling and rendering, the same for every backend.

  choose.py     which actions a kernel gets on a device (a small cost model over its structure and the
                device's limits)
  actions.py    the actions as data, and their text form
  search.py     RULEC_SEARCH: the candidates around choose.py's choice timed on the device, the fastest kept
  transform.py  the actions applied: splits and marks of the kernel's ranges, which the renderers follow

`optimize(kernel, device, target)` is what a runtime calls on a decomposed kernel before rendering it.

RULEC_DEBUG=2 prints each kernel's key and actions as it is optimized. RULEC_MERGE_REDUCE_RANGES=0 leaves a
reduction's ranges apart (transform.merged_reduce_ranges), for comparisons. RULEC_OPT forces actions for kernels
by key: `RULEC_OPT="1a2b3c4d=UPCAST(2,8) UPCAST(3,16); 5e6f7a8b=(none)"` (see actions.py for the list). A
forced list that does not apply to its kernel raises an OptError naming the action and why.
"""
from __future__ import annotations

import hashlib
import os
import sys

from rulec.codegen.opt import choose, search
from rulec.codegen.opt.actions import Action, OptError, debug_level, format_actions, parse_actions
from rulec.codegen.opt.transform import apply, merged_reduce_ranges, range_kind
from rulec.engine.ir.kernel import Kernel, structure


def kernel_key(kernel: Kernel) -> str:
  """A short name for a kernel that is the same in every process: a digest of its structure."""
  return hashlib.sha256(structure(kernel.ast).encode()).hexdigest()[:8]


def forced() -> dict[str, tuple[Action, ...]]:
  """RULEC_OPT as {kernel key: actions}; an OptError for text that is not that."""
  text = os.environ.get("RULEC_OPT", "").strip()
  out: dict[str, tuple[Action, ...]] = {}
  for part in filter(None, (p.strip() for p in text.split(";"))):
    key, eq, acts = part.partition("=")
    key = key.strip()
    if not eq or not key: raise OptError(f"RULEC_OPT: expected KEY=ACTIONS, got {part!r}")
    try: out[key] = parse_actions(acts)
    except OptError as e: raise OptError(f"RULEC_OPT for kernel {key}: {e}") from None
  return out


def optimize(kernel: Kernel, device: str, target=None, timer=None) -> tuple[Kernel, tuple[Action, ...]]:
  """The kernel with its actions applied, and the actions: RULEC_OPT's for this kernel if it names it, else with
  RULEC_SEARCH the fastest candidate by `timer` (the runtime's: seconds for an optimized kernel; search.py), else
  the device's choice (choose.py). `target` is the CL device's rulec.codegen.opencl.Target, or the CPU's choose.CPUTarget."""
  key = kernel_key(kernel)
  # (a reduction's ranges that its loads read as one are one range, which the GPU's staged matmul tile and the CPU's
  # KBLOCK take; the key stays the kernel's as it came, and actions name the ranges of the kernel RULEC_DEBUG=2
  # prints, this one)
  if os.environ.get("RULEC_MERGE_REDUCE_RANGES", "1") != "0": kernel = merged_reduce_ranges(kernel)
  want = forced().get(key)
  if want is not None: acts = want
  elif timer is not None and search.repetitions(): acts = search.best(kernel, device, target, timer, key)
  else: acts = tuple(choose.cpu_actions(kernel, target) if device == "CPU" else choose.cl_actions(kernel, target))
  try: out = apply(kernel, acts, device)
  except OptError as e:
    if want is None: raise   # the cost model chose something that does not apply: a bug, not the user's
    raise OptError(f"RULEC_OPT for kernel {key}: {e}") from None
  if debug_level() >= 2: print(f"[opt] {device} kernel {key} {kernel!r}: {format_actions(acts)}{' (RULEC_OPT)' if want is not None else ''}",
                          file=sys.stderr)
  return out, acts


__all__ = ["Action", "OptError", "apply", "forced", "format_actions", "kernel_key", "optimize", "parse_actions", "range_kind"]
