"""Recording what the scheduler does: every pass, every rewrite, every graph.

Off by default and free when off: engine/sched/driver.py checks `ACTIVE` (a list,
empty unless tracing) once per pass. Turn it on

- for a whole process with `RULEC_TRACE=1`: the trace is written as HTML at
  exit to `rulec-trace.html` (or `$RULEC_TRACE_OUT`), as a new file renamed over
  that path: a symbolic link there is replaced, its target never written;
- for a block of code with `with tracing() as t: ...`: `t` collects every
  schedule call made inside the block (`rulec trace PROGRAM.py` does this).

A Trace holds ScheduleRecords (one per `schedule()` call), each holding
PassRecords in run order: the passes of engine/sched/driver.py (`earliest`,
`prepare`, `realize`, `rangeify`, `symbolic`, ...) and, per kernel,
`to_params` and `untag`. A PassRecord has its own node table (each node once,
with an id: op, dtype, short arg, source ids, tag, shape), the rewrites made
(rule name, `file:line:col` of the rule, the node before and after, as ids into
the table) and the graph after the pass (ids in toposort order, sink last).
`Trace.to_json()` is what the viewer (rulec/trace_view.py, which imports this module, never the other way) draws.

In a post-order rewrite the node a rule sees is the node rebuilt from the
already rewritten sources; that is the node recorded as "before".
"""
from __future__ import annotations

import atexit
import contextlib
import copy
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Iterator

from rulec.engine.diskcache import write_replacing
from rulec.engine.ir.uop import UOp, render

# the traces now recording (innermost last); empty means tracing is off
ACTIVE: list[Trace] = []

MAX_REWRITES = int(os.environ.get("RULEC_TRACE_MAX_REWRITES", 5000))   # per pass; later ones are only counted
ARG_CHARS = 60        # arg reprs are cut to this many characters
TEXT_DEPTH = 4        # before/after expressions are printed this many levels deep


def _short(s: str, n: int) -> str: return s if len(s) <= n else s[:n - 1] + "\u2026"


class NodeTable:
  """Nodes of one pass, each with an integer id; a node's sources are interned before it."""
  def __init__(self):
    self.ids: dict[UOp, int] = {}
    self.rows: list[dict] = []

  def intern(self, root: UOp, fresh: list[int] | None = None) -> int:
    """The id of root, interning it and every source not yet in the table (ids of new nodes go to `fresh`)."""
    if (i := self.ids.get(root)) is not None: return i
    stack: list[tuple[UOp, bool]] = [(root, False)]
    while stack:
      u, ready = stack.pop()
      if u in self.ids: continue
      if not ready:
        stack.append((u, True))
        for s in reversed(u.src):
          if s not in self.ids: stack.append((s, False))
        continue
      try: shape = u._shape
      except Exception: shape = None
      row = {"op": u.op.name, "dtype": u.dtype.name, "src": [self.ids[s] for s in u.src]}
      if u.arg is not None: row["arg"] = _short(repr(u.arg), ARG_CHARS)
      if u.tag is not None: row["tag"] = _short(repr(u.tag), ARG_CHARS)
      if shape is not None: row["shape"] = list(shape)
      self.ids[u] = len(self.rows)
      if fresh is not None: fresh.append(len(self.rows))
      self.rows.append(row)
    return self.ids[root]


def _split_location(loc: str) -> tuple[str, int, int]:
  """'/abs/x.rules:12:3' -> ('/abs/x.rules', 12, 3); ('', 0, 0) when there is none."""
  parts = loc.rsplit(":", 2)
  if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
    return os.path.abspath(parts[0]) if parts[0] else "", int(parts[1]), int(parts[2])
  return loc, 0, 0


def scratch_ctx(ctx: Any) -> Any:
  """A copy of a rewrite ctx that rules may call into without changing the real one.

  which_rule re-runs the rules on the node; some ctx methods count (KernelBuilder.renumber),
  so they must not run twice on the real ctx. Containers one level down are copied too."""
  if ctx is None or isinstance(ctx, (int, float, str, bytes, bool, tuple, frozenset)): return ctx
  try:
    c = copy.copy(ctx)
    for k, v in list(getattr(c, "__dict__", {}).items()):
      if isinstance(v, (list, dict, set)): setattr(c, k, copy.copy(v))
    return c
  except Exception:
    return ctx


class PassRecord:
  def __init__(self, name: str, index: int, matcher: Any, kernel: int | None):
    self.name, self.index, self.kernel = name, index, kernel
    self.ruleset = getattr(matcher, "title", type(matcher).__name__)
    self.table = NodeTable()
    self.rewrites: list[dict] = []
    self.n_rewrites = 0
    self.graph: list[int] = []
    self.sink: int | None = None
    self.input_nodes = 0
    self.ms = 0.0
    self.error: str | None = None

  def to_json(self) -> dict:
    return {"name": self.name, "index": self.index, "kernel": self.kernel, "ruleset": self.ruleset,
            "nodes": self.table.rows, "rewrites": self.rewrites, "n_rewrites": self.n_rewrites,
            "graph": self.graph, "sink": self.sink, "input_nodes": self.input_nodes, "ms": round(self.ms, 3),
            "error": self.error}


class ScheduleRecord:
  def __init__(self, index: int, device: str, n_targets: int, caller: str):
    self.index, self.device, self.n_targets, self.caller = index, device, n_targets, caller
    self.passes: list[PassRecord] = []
    self.kernels = 0

  def to_json(self) -> dict:
    return {"index": self.index, "device": self.device, "targets": self.n_targets, "caller": self.caller,
            "passes": [p.index for p in self.passes]}


class Trace:
  """Everything recorded while this trace was active."""
  def __init__(self, title: str = "rulec trace"):
    self.title = title
    self.schedules: list[ScheduleRecord] = []
    self.passes: list[PassRecord] = []

  @property
  def n_rewrites(self) -> int: return sum(p.n_rewrites for p in self.passes)

  def _schedule(self) -> ScheduleRecord:
    if not self.schedules: self.schedules.append(ScheduleRecord(0, "?", 0, ""))   # a pass run outside schedule()
    return self.schedules[-1]

  def to_json(self) -> dict:
    passes = []
    for s in self.schedules:
      for p in s.passes:
        d = p.to_json()
        d["index"], d["schedule"] = len(passes), s.index
        passes.append(d)
    return {"title": self.title, "schedules": [s.to_json() for s in self.schedules], "passes": passes}

  def summary(self) -> str:
    return f"{len(self.schedules)} schedule calls, {len(self.passes)} passes, {self.n_rewrites} rewrites"


def _caller() -> str:
  """file:line of the first frame outside rulec's own packages (who asked for the schedule)."""
  root = str(Path(__file__).resolve().parent.parent)
  for fr in reversed(traceback.extract_stack()[:-2]):
    f = str(Path(fr.filename).resolve()) if fr.filename and not fr.filename.startswith("<") else fr.filename
    if not f.startswith(root + os.sep) or f.startswith(os.path.join(root, "tests") + os.sep):
      return f"{fr.filename}:{fr.lineno}"
  return ""


def begin_schedule(device: str, n_targets: int):
  """Called by rulec.engine.sched.driver.schedule() (only when ACTIVE) as a schedule call starts."""
  caller = _caller()
  for t in ACTIVE: t.schedules.append(ScheduleRecord(len(t.schedules), device, n_targets, caller))


class Recorder:
  """Wraps a matcher for one pass: delegates rewrite(), and records each rewrite that fires."""
  def __init__(self, name: str, sink: UOp, matcher: Any, ctx: Any):
    self.matcher, self.ctx = matcher, ctx
    self.traces = list(ACTIVE)
    sched = self.traces[0]._schedule()
    kernel = None
    if name in ("to_params", "untag"):
      kernel = sum(1 for p in sched.passes if p.name == name)
    self.rec = PassRecord(name, 0, matcher, kernel)
    for t in self.traces:
      s = t._schedule()
      s.passes.append(self.rec)
      t.passes.append(self.rec)
    self.rec.index = len(self.traces[0].passes) - 1
    self.rec.input_nodes = len(sink.toposort())
    self.texts = {(n, loc): text for n, loc, text in getattr(matcher, "rule_info", ())}
    self.t0 = time.perf_counter()
    self._which = getattr(matcher, "which_rule", None)

  def which_rule(self, u: UOp, ctx: Any = None):
    return None if self._which is None else self._which(u, ctx)

  def rewrite(self, u: UOp, ctx: Any = None):
    named = getattr(self.matcher, "rewrite_named", None)
    if named is not None:   # the rules run once, naming the one that fired (a ctx method may record)
      res = named(u, ctx)
      if res is None: return None
      r, hit = res
    else:
      r = self.matcher.rewrite(u, ctx)
      if r is None: return None
      hit = None
    rec = self.rec
    rec.n_rewrites += 1
    if len(rec.rewrites) >= MAX_REWRITES: return r
    if named is None:
      # the rules run again to name the one that fired: on a scratch ctx, and untraced
      saved = ACTIVE[:]
      ACTIVE.clear()
      try: hit = self.which_rule(u, scratch_ctx(ctx))
      except Exception: hit = None
      finally: ACTIVE[:] = saved
    name, loc = hit if hit is not None else ("?", "")
    path, line, col = _split_location(loc)
    table = rec.table
    before = table.intern(u)
    fresh: list[int] = []
    after = table.intern(r, fresh)
    rec.rewrites.append({"rule": name, "loc": loc, "file": path, "line": line, "col": col,
                         "text": self.texts.get((name, loc), ""),
                         "before": before, "after": after, "touched": [after] + [i for i in fresh if i != after][:32],
                         "before_text": _short(render(u, TEXT_DEPTH), 400),
                         "after_text": _short(render(r, TEXT_DEPTH), 400)})
    return r

  def finish(self, out: UOp | None, error: BaseException | None = None):
    rec = self.rec
    rec.ms = (time.perf_counter() - self.t0) * 1e3
    if error is not None: rec.error = f"{type(error).__name__}: {error}"
    if out is not None:
      rec.graph = [rec.table.intern(u) for u in out.toposort()]
      rec.sink = rec.graph[-1] if rec.graph else None


@contextlib.contextmanager
def tracing(title: str = "rulec trace") -> Iterator[Trace]:
  """Record every schedule call made inside the block: `with tracing() as t: ...; t.passes`."""
  t = Trace(title)
  ACTIVE.append(t)
  try: yield t
  finally: ACTIVE.remove(t)


# *** RULEC_TRACE=1: trace the whole process, write HTML at exit ***

def _env_on() -> bool: return os.environ.get("RULEC_TRACE", "") not in ("", "0")


_PROCESS_TRACE: Trace | None = None

# What writes the process trace at exit: the viewer lives beside the CLI (rulec/trace_view.py), and importing
# `rulec` sets this to its HTML writer, so the engine never imports the viewer. A program that imports only
# the engine gets the trace as JSON (the data the viewer draws).
exit_writer = None


def _write_json(trace: Trace, path: Path) -> Path:
  import json
  path = path.with_suffix(".json")
  write_replacing(path, json.dumps(trace.to_json()).encode("utf-8"))   # a link at `path` is replaced, not followed
  return path


def _write_process_trace():
  t = _PROCESS_TRACE
  if t is None: return
  out = Path(os.environ.get("RULEC_TRACE_OUT") or "rulec-trace.html")
  try:
    out = (exit_writer or _write_json)(t, out)
    print(f"rulec trace: {t.summary()} -> {out}", file=sys.stderr)
  except Exception as e:   # never turn a finished program into a failing one
    print(f"rulec trace: could not write {out}: {type(e).__name__}: {e}", file=sys.stderr)


if _env_on():
  _PROCESS_TRACE = Trace(f"RULEC_TRACE: {' '.join(sys.argv) or 'python'}")
  ACTIVE.append(_PROCESS_TRACE)
  atexit.register(_write_process_trace)
