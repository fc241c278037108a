"""RULEC_SEARCH=N: try the action lists around the cost model's choice on the device and keep the fastest.

As tinygrad's BEAM does, but over a small fixed neighbourhood rather than a beam: register tiles of other
shapes, other reduction blocks and work-group shapes, other group-reduction sizes (`candidates`). Each
candidate is compiled and run N times on scratch copies of the kernel's outputs (the runtime's `timer`), the
fastest median wins, and the winner is kept on disk (engine/diskcache.py, `search/`) under the kernel's structure and
the device, so a later process asks no timing at all. A candidate that fails to build or run is skipped; the
cost model's own choice is always a candidate, so a search never picks something that was not measured faster.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Callable

from rulec.codegen.opt import choose
from rulec.codegen.opt.actions import Action, OptError, debug_level, format_actions, parse_actions
from rulec.codegen.version import code_digest
from rulec.engine import diskcache
from rulec.codegen.opt.transform import apply, stored_sum
from rulec.engine.ir.ops import Ops
from rulec.engine.ir.kernel import Kernel, structure

MAX_CANDIDATES = 96   # (a GPU matmul has tiles x work-group shapes x stage blocks)


def repetitions() -> int:
  """RULEC_SEARCH as the number of timed runs per candidate (0: no search)."""
  try: return max(0, int(os.environ.get("RULEC_SEARCH", "0") or 0))
  except ValueError: return 0


def _cpu_candidates(k: Kernel, end, target) -> list[list[Action]]:
  out = []
  first = end.src[1].arg[0]
  most = 2 * choose.TILE_REGISTERS * (target or choose.CPUTarget()).lanes   # accumulators, spills included
  for rows in (4, 8, 16):
    for cols in (8, 16, 32, 64):
      if rows * cols > most: continue
      row, r, col, c = choose.tile_ranges(end, rows, (cols,))
      if col is None: continue
      acts = [Action("UPCAST", col.arg[0], c)]
      if row is None:
        out.append(acts + [Action("THREAD", first)])
        continue
      acts.append(Action("UPCAST", row.arg[0], r))
      blocks = {0} | {choose._k_block(k, end, col.src[0].arg, nbytes) for nbytes in (256 << 10, 512 << 10, 1 << 20)}
      for kb in sorted(blocks):
        if not kb:
          out.append(acts + [Action("THREAD", first)])
          continue
        k_axis = stored_sum(end.src[0].src[1]).src[1].arg[0]   # (a blocked sum: the REDUCE the store's value is of)
        for ahead in (0, choose.PREFETCH_AHEAD):   # with and without prefetches
          out.append(acts + [Action("KBLOCK", k_axis, kb)] + ([Action("PREFETCH", k_axis, ahead)] if ahead else [])
                     + [Action("THREAD", first)])
  lanes = (target or choose.CPUTarget()).lanes
  for tile in ((8, 2), (4, 2), (8, 4), (4, 4), (16, 2), (2, 8)):   # x @ W.T: dot tiles, sums in vector lanes
    for nbytes in (0, 256 << 10, 512 << 10, 1 << 20, 2 << 20):           # ... their column blocks
      out.append(choose.dot_tile(k, end, lanes, tile, nbytes))
  return [acts for acts in out if acts]


def _cl_candidates(k: Kernel, end, target) -> list[list[Action]]:
  out = []
  if end is not None and getattr(target, "tile", 0):
    for tile in sorted(set(choose.GPU_TILES) | {(4, 8), (8, 4)}):
      for local in ((8, 16), (4, 32), (16, 16), (8, 8), (16, 8)):
        for stage in (0, 8, 16, 32):
          acts = choose.gpu_tile(k, tile, local, target, stage, several=True)
          if acts is not None: out.append(acts)   # (candidates() drops repeats)
  if getattr(target, "vector", 0):
    out += [[Action("VECTOR", None, n)] for n in (2, 4, 8, 16)]
  if (spread := choose._spread(k, target)):   # a row per work-group: other work-group sizes
    r = spread[0].axis
    out += [[Action("SPREAD", r, n)] for n in (32, 64, 128, 256, 512, 1024) if n <= target.group]
  if getattr(target, "group", 0) and any(u.op is Ops.REDUCE for u in k.ast.toposort()):
    g = 32
    while g <= target.group:
      out.append([Action("GROUP", None, g)])
      out += [[Action("GROUP", None, g), Action("VECTOR", None, n)] for n in (2, 4)]
      if getattr(target, "grid", 0):   # one-pass reductions: a quarter, half, all and twice the device's groups
        out += [[Action("GROUP", None, g), *v, Action("GRID", None, max(2, target.grid * m // 4))]
                for m in (1, 2, 4, 8) for v in ((), (Action("VECTOR", None, 4),))]
      g *= 2
  return out


def candidates(k: Kernel, device: str, target=None) -> list[tuple[Action, ...]]:
  """The cost model's choice first, then its neighbours that apply to the kernel (at most MAX_CANDIDATES)."""
  default = tuple(choose.cpu_actions(k, target) if device == "CPU" else choose.cl_actions(k, target))
  end = k.ast.src[0] if len(k.ast.src) == 1 and k.ast.src[0].op is Ops.END else None
  more = (_cpu_candidates(k, end, target) if end is not None else []) if device == "CPU" else _cl_candidates(k, end, target)
  seen, out = set(), []
  for acts in [default, ()] + [tuple(a) for a in more]:
    if acts in seen: continue
    seen.add(acts)
    try: apply(k, acts, device)
    except OptError: continue
    out.append(acts)
  return out[:MAX_CANDIDATES]


def _cache_key(k: Kernel, device: str, target) -> str:
  return diskcache.key("search", device, repr(target), structure(k.ast),
                          repr([(b.dtype.name, b.arg[-1]) for b in k.bufs]), code_digest())


def best(k: Kernel, device: str, target, timer: Callable[[Kernel], float], key: str) -> tuple[Action, ...]:
  """The fastest of `candidates` by `timer` (seconds for an optimized kernel), remembered on disk."""
  ckey = _cache_key(k, device, target) if diskcache.enabled() else None
  hit = diskcache.load_json("search", ckey) if ckey is not None else None
  if hit is not None and isinstance(hit.get("actions"), str):
    try:
      acts = parse_actions(hit["actions"])
      apply(k, acts, device)
      return acts
    except OptError: pass   # a record from other code: searched again
  times: list[tuple[float, int, tuple[Action, ...]]] = []
  for i, acts in enumerate(candidates(k, device, target)):
    try: times.append((timer(apply(k, acts, device)), i, acts))
    except Exception as e:   # a candidate the device cannot build or run (too many registers, work-group too large)
      if debug_level() >= 2: print(f"[search] {device} kernel {key}: {format_actions(acts)} failed: {type(e).__name__}: {e}", file=sys.stderr)
  if not times: return tuple(choose.cpu_actions(k, target) if device == "CPU" else choose.cl_actions(k, target))
  t, _, acts = min(times)
  if debug_level() >= 1:
    base = times[0][0] if times[0][1] == 0 else float("nan")
    print(f"[search] {device} kernel {key}: {len(times)} candidates, {format_actions(acts)} at {t * 1e3:.3f} ms "
          f"(the cost model's choice: {base * 1e3:.3f} ms)", file=sys.stderr)
  if ckey is not None: diskcache.store_json("search", ckey, {"actions": format_actions(acts), "ms": t * 1e3})
  return acts


__all__ = ["best", "candidates", "repetitions"]
