"""Examples in rule files: `example: INPUT => EXPECTED` lines under a rule.

An example's graphs are written in pattern syntax with concrete leaves:
literals are constants (`3`, `3{int32}`, `0.5{float16}`), `x:DEFINE_VAR[(0, 10)]`
is the index variable `x` with bounds 0..10 (bare `x` after that is the same
node), `RANGE(10)` is a loop over 0..9 (`RANGE(10)[1]` on axis 1), and any
other node is `OP(SOURCES)[ARG]{DTYPE}`. `=> unchanged` says the rule set
leaves the graph as it is.

`rulec check` (check_sources(..., examples=True)) builds the input, rewrites it
with the rule's rule set (the whole set, to a fixed point, with graph_rewrite),
and compares the result with the expected graph by identity (UOps are
hash-consed). The rule itself must fire at least once on the input, and must
not fire on an `unchanged` example. Loading a library never runs examples.
"""
from __future__ import annotations

import difflib
import json
import math
import os
import select
import signal
import sys
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable

from rulec.engine.ir.dtypes import DType, dtype_set, dtypes
from rulec.engine.lang import ast as A
from rulec.engine.lang.checker import CheckedLibrary
from rulec.engine.lang.compiler import generate, per_rule_functions
from rulec.engine.lang.diagnostics import Diagnostic
from rulec.engine.lang.limits import EXAMPLE_FILE_TIME_S, EXAMPLE_MEMORY_BYTES, EXAMPLE_TIME_S
from rulec.engine.lang.parser import _PATTERN_OPS
from rulec.engine.lang.runtime import RuleAbort, RuleRuntimeError
from rulec.engine.ir.ops import ALU, COMPARISON, FIXED_ARITY, GROUPS, OPS_BY_NAME, Ops
from rulec.engine.ir.rewrite import RewriteLoopError, graph_rewrite
from rulec.engine.ir.uop import UOp

# rewrites allowed for one example before it counts as a loop (R605)
MAX_STEPS = 10_000
_SHOW_LIMIT = 300


class ExampleError(Exception):
  """An example graph that cannot be built (R604)."""
  def __init__(self, span: A.Span, message: str):
    super().__init__(message)
    self.span, self.message = span, message


# *** building concrete graphs from pattern syntax ***

def _default_dtype(value: Any) -> DType:
  if isinstance(value, bool): return dtypes.bool
  if isinstance(value, int): return dtypes.index
  if isinstance(value, float): return dtypes.float32
  return dtypes.void


def _one_dtype(dts, span: A.Span) -> DType | None:
  if dts is None: return None
  if len(dts) != 1 or len(dtype_set(dts[0][0]) or ()) != 1:
    names = ", ".join(n for n, _ in dts)
    raise ExampleError(dts[0][1], f"an example node has one dtype, not {{{names}}}")
  return next(iter(dtype_set(dts[0][0])))


def _is_untyped_literal(p) -> bool: return isinstance(p, A.PConst) and p.dtypes is None


class GraphBuilder:
  """Pattern AST -> UOp, for example graphs. `env` holds the names bound so far."""
  def __init__(self, env: dict[str, UOp] | None = None):
    self.env: dict[str, UOp] = {} if env is None else env

  def bind(self, name: str | None, span: A.Span | None, u: UOp) -> UOp:
    if name is None or name == "_": return u
    if name in self.env and self.env[name] is not u:
      raise ExampleError(span, f"'{name}' is already bound to another node in this example")
    self.env[name] = u
    return u

  def build(self, p, ctx_dtype: DType | None = None) -> UOp:
    if isinstance(p, A.PName):
      if p.name == "_": raise ExampleError(p.span, "'_' stands for any node; an example needs a concrete graph")
      if p.name == "unchanged" and p.name not in self.env:
        raise ExampleError(p.span, "'unchanged' is the whole expected side: `example: INPUT => unchanged`")
      if p.name not in self.env:
        raise ExampleError(p.span, f"unbound name '{p.name}' in an example",)
      if p.dtypes is not None: raise ExampleError(p.dtypes[0][1], f"'{p.name}' is bound already: its dtype is fixed")
      return self.env[p.name]
    if isinstance(p, A.PConst):
      dt = _one_dtype(p.dtypes, p.span) or ctx_dtype or _default_dtype(p.value)
      try: u = UOp.const(dt, p.value)
      except (TypeError, ValueError): raise ExampleError(p.span, f"{p.value!r} is not a constant of dtype {dt.name}") from None
      return self.bind(p.name, p.name_span, u)
    return self.node(p)

  def node(self, p: A.PNode) -> UOp:
    if len(p.ops) != 1 or p.ops[0][0] not in OPS_BY_NAME:
      name, span = p.ops[0] if len(p.ops) == 1 else (" | ".join(n for n, _ in p.ops), p.span)
      if len(p.ops) != 1 or name in GROUPS: raise ExampleError(span, f"an example node has one op, not '{name}'")
      close = difflib.get_close_matches(name, list(OPS_BY_NAME), n=1)
      raise ExampleError(span, f"unknown op '{name}'" + (f"; did you mean '{close[0]}'?" if close else ""))
    op = OPS_BY_NAME[p.ops[0][0]]
    if p.each is not None or p.tail is not None:
      raise ExampleError(p.tail_span or p.span, "'..', '*rest' and 'each' match many sources; an example lists them")
    pats = p.srcs or ()
    if (n := FIXED_ARITY.get(op)) is not None and n != len(pats):
      raise ExampleError(p.ops[0][1], f"{op.name} takes {n} source{'s' if n != 1 else ''}, the example gives {len(pats)}")
    given = _one_dtype(p.dtypes, p.span)
    srcs = self.sources(op, pats, given)
    dtype = given or self.infer_dtype(op, srcs, p)
    arg = self.arg(op, p)
    try: u = UOp.const(dtype, arg) if op is Ops.CONST and not srcs else UOp(op, dtype, srcs, arg)
    except Exception as e: raise ExampleError(p.span, f"cannot build {op.name}: {e}") from None
    return self.bind(p.name, p.name_span, u)

  def sources(self, op: Ops, pats, given: DType | None) -> tuple[UOp, ...]:
    """Sources in order; a literal with no dtype in an ALU op takes the dtype of the typed operands."""
    if op is Ops.RANGE: return tuple(self.build(s, dtypes.index) for s in pats)
    if op not in ALU: return tuple(self.build(s) for s in pats)
    built: dict[int, UOp] = {i: self.build(s) for i, s in enumerate(pats) if not _is_untyped_literal(s)}
    if op is Ops.WHERE:
      value = next((built[i].dtype for i in (1, 2) if i in built), given)
      ctx = {0: dtypes.bool, 1: value, 2: value}
    else:
      operand = next(iter(built.values())).dtype if built else (None if op in COMPARISON else given)
      ctx = {i: operand for i in range(len(pats))}
    for i, s in enumerate(pats):
      if i not in built: built[i] = self.build(s, ctx.get(i))
    return tuple(built[i] for i in range(len(pats)))

  @staticmethod
  def infer_dtype(op: Ops, srcs: tuple[UOp, ...], p: A.PNode) -> DType:
    if op in COMPARISON: return dtypes.bool
    if op is Ops.WHERE: return srcs[1].dtype
    if op in ALU: return srcs[0].dtype
    if op in (Ops.CAST, Ops.BITCAST): raise ExampleError(p.ops[0][1], f"{op.name} in an example needs its dtype: {op.name}(x){{int32}}")
    if op in (Ops.RANGE, Ops.DEFINE_VAR): return dtypes.index
    if op is Ops.SINK or not srcs: return dtypes.void
    return srcs[0].dtype

  def arg(self, op: Ops, p: A.PNode) -> Any:
    arg = p.arg if p.has_arg else None
    if op is Ops.DEFINE_VAR:
      if isinstance(arg, tuple) and len(arg) == 2 and p.name is not None: return (p.name, *arg)
      if isinstance(arg, tuple) and len(arg) == 3: return arg
      raise ExampleError(p.span, "a variable in an example is NAME:DEFINE_VAR[(LO, HI)], e.g. x:DEFINE_VAR[(0, 10)]")
    if op is Ops.RANGE:
      if arg is None: return (0, "loop")
      if isinstance(arg, int) and not isinstance(arg, bool): return (arg, "loop")
    return arg


# *** printing graphs in example syntax ***

_SUGAR = {OPS_BY_NAME[name]: sym for sym, name in _PATTERN_OPS.items()}


def show(u: UOp, names: dict[UOp, str] | None = None, limit: int = _SHOW_LIMIT) -> str:
  """`u` in example syntax; nodes in `names` print as their name. Cut off after `limit` characters."""
  names = dict(names or {})

  def lit(c: UOp, ctx: DType | None) -> str:
    v = c.arg
    text = repr(v) if not (isinstance(v, float) and (math.isnan(v) or math.isinf(v))) else f"float({str(v)!r})"
    return text if c.dtype is (ctx or _default_dtype(v)) else f"{text}{{{c.dtype.name}}}"

  def typed(s: UOp) -> bool: return not (s.op is Ops.CONST and not s.src)

  # (a graph thousands of nodes deep, or a DAG whose tree is exponential, is cut off where the text would be: the
  # walk stops past the limit's worth of nodes and below a depth no line shows)
  visits = [0]

  def go(u: UOp, ctx: DType | None = None, top: bool = False, depth: int = 0) -> str:
    visits[0] += 1
    if visits[0] > limit or depth > 100: return "..."
    if u in names: return names[u]
    if u.op is Ops.CONST and not u.src: return lit(u, ctx)
    if u.op is Ops.DEFINE_VAR and isinstance(u.arg, tuple) and len(u.arg) == 3 and isinstance(u.arg[0], str):
      names[u] = u.arg[0]
      return f"{u.arg[0]}:DEFINE_VAR[{(u.arg[1], u.arg[2])!r}]" + ("" if u.dtype is dtypes.index else f"{{{u.dtype.name}}}")
    if u.op is Ops.RANGE and u.dtype is dtypes.index and len(u.src) == 1 and isinstance(u.arg, tuple) and len(u.arg) == 2:
      axis, kind = u.arg
      tail = "" if (axis, kind) == (0, "loop") else f"[{axis}]" if kind == "loop" and isinstance(axis, int) else f"[{u.arg!r}]"
      return f"RANGE({go(u.src[0], dtypes.index, True, depth + 1)}){tail}"
    ctxs: list[DType | None] = [None] * len(u.src)
    if u.op in ALU:
      if u.op is Ops.WHERE and len(u.src) == 3:
        value = next((u.src[i].dtype for i in (1, 2) if typed(u.src[i])), None)
        ctxs = [dtypes.bool, value, value]
      else:
        operand = next((s.dtype for s in u.src if typed(s)), None)
        ctxs = [operand] * len(u.src)
    want = None
    try: want = GraphBuilder.infer_dtype(u.op, u.src, None) if u.src or u.op not in ALU else None
    except Exception: want = None
    if u.op in _SUGAR and len(u.src) == 2 and u.arg is None and u.dtype is want:
      s = f"{go(u.src[0], ctxs[0], False, depth + 1)} {_SUGAR[u.op]} {go(u.src[1], ctxs[1], False, depth + 1)}"
      return s if top else f"({s})"
    if u.op is Ops.NEG and len(u.src) == 1 and u.arg is None and u.dtype is want: return f"-{go(u.src[0], ctxs[0], False, depth + 1)}"
    out = u.op.name
    if u.src: out += "(" + ", ".join(go(s, c, True, depth + 1) for s, c in zip(u.src, ctxs)) + ")"
    if u.arg is not None: out += f"[{u.arg!r}]"
    if u.dtype is not want: out += f"{{{u.dtype.name}}}"
    return out

  text = go(u, None, True)
  return text if len(text) <= limit else text[:limit - 3] + "..."


# *** running examples ***

class ExampleMatcher:
  """A rule set compiled in its counting (RULEC_STATS) variant: same rewrites, plus how often each rule fired."""
  def __init__(self, lib: CheckedLibrary, ruleset: str):
    self.lib, self.rules = lib, lib.flat_rules(ruleset)
    ns: dict[str, Any] = {"__name__": f"rulec_examples_{ruleset}"}
    exec(compile(generate(self.rules, lib.helpers_of, stats=True, title=ruleset), f"<rulec examples {ruleset}>", "exec"), ns)
    self.dispatch, self.stats, self.rule_info = ns["DISPATCH"], ns["STATS"], ns["RULES"]
    self._per_rule = None

  def reset(self):
    for st in self.stats: st[:] = [0, 0, 0.0]

  def fired(self, rule: A.Rule) -> int:
    return next(self.stats[k][1] for k, r in enumerate(self.rules) if r is rule)

  def rewrite(self, node: UOp, ctx: Any = None):
    fn = self.dispatch.get(node.op)
    return None if fn is None else fn(node, ctx)

  def which_rule(self, node: UOp, ctx: Any = None):
    if self._per_rule is None:
      ns: dict[str, Any] = {"__name__": "rulec_examples_per_rule"}
      exec(compile(per_rule_functions(self.rules, self.lib.helpers_of), "<rulec examples>", "exec"), ns)
      self._per_rule = ns["RULE_FNS"]
    for k, fn in enumerate(self._per_rule):
      if fn(node, ctx) is not None: return self.rule_info[k][0], self.rule_info[k][1]
    return None


def run_example(lib: CheckedLibrary, rule: A.Rule, ex: A.Example, m: ExampleMatcher) -> list[Diagnostic]:
  """The diagnostics of one example (empty when it holds)."""
  b = GraphBuilder()
  try:
    given = b.build(ex.input)
    inputs = dict(b.env)
    expected = GraphBuilder(b.env).build(ex.expected) if ex.expected is not None else None
  except ExampleError as e:
    return [Diagnostic("R604", "error", e.span, e.message)]
  except MemoryError: raise
  except Exception as e:
    return [Diagnostic("R604", "error", ex.input.span, f"the example graph cannot be built: {type(e).__name__}: {e}")]
  named = {u: n for n, u in reversed(list(inputs.items()))}
  m.reset()
  try: got = graph_rewrite(given, m, max_steps=MAX_STEPS)
  except MemoryError: raise
  except (RuleRuntimeError, RewriteLoopError, RuleAbort) as e:
    if isinstance(getattr(e, "cause", None), MemoryError): raise MemoryError from None
    what = str(e).split("\n")[0] or type(e).__name__
    return [Diagnostic("R605", "error", ex.input.span, f"rewriting the example of rule '{rule.name}' failed: {what}")]
  except Exception as e:   # e.g. a replacement whose sources are not nodes, failing inside graph_rewrite
    what = f"{type(e).__name__}: {e}".split("\n")[0]
    return [Diagnostic("R605", "error", ex.input.span, f"rewriting the example of rule '{rule.name}' failed: {what}")]
  fired = m.fired(rule)
  try: got_s = show(got, named)
  except RecursionError: got_s = "(a graph too deep to show)"
  if expected is None:
    if fired:
      return [Diagnostic("R603", "error", ex.input.span,
                         f"rule '{rule.name}' fires on an example marked unchanged ({fired}x)",
                         note=f"ruleset '{rule.ruleset}' rewrites {show(given, {})} to {got_s}")]
    if got is not given:
      return [Diagnostic("R601", "error", ex.expected_span, f"example of rule '{rule.name}' is not unchanged",
                         note=f"expected {show(given, named)}, got {got_s}")]
    return []
  if not fired:
    if got is not expected: note = f"expected {show(expected, named)}, got {got_s}"
    elif got is given: note = "the rule set leaves the graph as it is; to say the rule does not rewrite it, write '=> unchanged'"
    else: note = f"the result {got_s} is as expected, but other rules of '{rule.ruleset}' made it"
    return [Diagnostic("R602", "error", ex.input.span, f"rule '{rule.name}' does not fire on its example", note=note)]
  if got is not expected:
    return [Diagnostic("R601", "error", ex.expected_span, f"example of rule '{rule.name}' gives a different graph",
                       note=f"expected {show(expected, named)}, got {got_s}")]
  return []


def example_time_limit() -> float:
  """Seconds one example may run: RULEC_EXAMPLE_TIMEOUT, else EXAMPLE_TIME_S."""
  try: v = float(os.environ.get("RULEC_EXAMPLE_TIMEOUT", ""))
  except ValueError: v = 0.0
  return v if v > 0 and math.isfinite(v) else EXAMPLE_TIME_S


def file_time_limit() -> float:
  """Seconds all the examples of one file may run together: RULEC_EXAMPLE_FILE_TIMEOUT, else EXAMPLE_FILE_TIME_S."""
  try: v = float(os.environ.get("RULEC_EXAMPLE_FILE_TIMEOUT", ""))
  except ValueError: v = 0.0
  return v if v > 0 and math.isfinite(v) else EXAMPLE_FILE_TIME_S


class ExamplesCancelled(Exception):
  """The caller no longer wants these examples' results (the language server: the document changed)."""


_CANCEL = threading.local()


@contextmanager
def cancel_when(cancelled: Callable[[], bool]):
  """Within this block, on this thread, run_examples stops (ExamplesCancelled, its child process killed) as soon
  as cancelled() is true; it is asked a few times a second."""
  old = getattr(_CANCEL, "fn", None)
  _CANCEL.fn = cancelled
  try: yield
  finally: _CANCEL.fn = old


def _cancelled() -> bool:
  fn = getattr(_CANCEL, "fn", None)
  return fn is not None and bool(fn())


def _jobs(lib: CheckedLibrary) -> list[tuple[str, A.Rule, A.Example]]:
  return [(rs.name, rule, ex) for f in lib.files for rs in f.rulesets if lib.rulesets.get(rs.name) is rs
          for rule in rs.rules if rule.grad is None for ex in rule.examples]


def _one(lib: CheckedLibrary, job, matchers: dict) -> list[Diagnostic]:
  rs, rule, ex = job
  try:
    if rs not in matchers: matchers[rs] = ExampleMatcher(lib, rs)
    return run_example(lib, rule, ex, matchers[rs])
  except MemoryError:
    return [_budget_diag("R707", rule, ex)]
  except (Exception, RecursionError) as e:
    return [Diagnostic("R605", "error", ex.input.span,
                       f"rewriting the example of rule '{rule.name}' failed: {type(e).__name__}: {e}".split("\n")[0])]


def _budget_diag(code: str, rule: A.Rule, ex: A.Example, detail: str = "") -> Diagnostic:
  if code == "R706":
    msg = f"the example of rule '{rule.name}' ran longer than {example_time_limit():g} s"
    note = "examples run under a time limit (RULEC_EXAMPLE_TIMEOUT seconds); a rule whose guard or replacement does much work belongs in a helper"
  else:
    msg = f"the example of rule '{rule.name}' used more than {EXAMPLE_MEMORY_BYTES >> 20} MiB of memory" + detail
    note = "examples run under a memory limit"
  return Diagnostic(code, "error", ex.input.span, msg, note=note)


def run_examples(lib: CheckedLibrary) -> list[Diagnostic]:
  """Run every example of a checked library with no errors; the diagnostics of those that fail.

  Where the platform can fork, the examples run in a child process with a memory limit (EXAMPLE_MEMORY_BYTES
  over what the checker uses) and each under a wall-clock limit (example_time_limit()); an example past either
  is R706 / R707 and the remaining ones run in a new child. Elsewhere they run in this process, unbounded."""
  jobs = _jobs(lib)
  if not jobs: return []
  if not hasattr(os, "fork") or os.environ.get("RULEC_EXAMPLE_ISOLATION", "1") == "0":
    matchers: dict[str, ExampleMatcher] = {}
    return [d for job in jobs for d in _one(lib, job, matchers)]
  out: list[Diagnostic] = []
  spent: dict[str, float] = {}      # file -> seconds its examples have run
  start = 0
  while start < len(jobs): start = _run_forked(lib, jobs, start, out, spent)
  return out


def _file_of(job) -> str: return job[2].span.file


def _past_file_budget(jobs, k: int, out: list[Diagnostic]) -> int:
  """R708 at the first example of jobs[k]'s file not run; the index of the first job of another file."""
  f = _file_of(jobs[k])
  _, rule, ex = jobs[k]
  rest = sum(1 for j in jobs[k:] if _file_of(j) == f)
  out.append(Diagnostic("R708", "error", ex.input.span,
                        f"the examples of this file ran longer than {file_time_limit():g} s in all; this one and the "
                        f"{rest - 1} after it were not run",
                        note="a file's examples run under a total time limit (RULEC_EXAMPLE_FILE_TIMEOUT seconds)"))
  while k < len(jobs) and _file_of(jobs[k]) == f: k += 1
  return k


def _die_with(parent: int) -> None:
  """Make this (forked) process end when `parent` does: a killed `rulec check` or language server must not leave
  an example running. Linux: the kernel sends SIGKILL (PR_SET_PDEATHSIG); elsewhere a thread watches the parent."""
  try:
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(1, signal.SIGKILL, 0, 0, 0) == 0:        # PR_SET_PDEATHSIG = 1
      if os.getppid() != parent: os._exit(0)               # (the parent ended before the call)
      return
  except (OSError, AttributeError): pass
  def watch():
    while os.getppid() == parent: time.sleep(0.5)
    os._exit(0)
  threading.Thread(target=watch, daemon=True).start()


def _child(lib: CheckedLibrary, jobs, start: int, w: int, parent: int, stop: int):
  try:
    _die_with(parent)
    _limit_memory()
    matchers: dict[str, ExampleMatcher] = {}
    for k in range(start, stop):
      os.write(w, f"S {k}\n".encode())
      diags = _one(lib, jobs[k], matchers)
      os.write(w, (json.dumps({"k": k, "d": [d.to_json() for d in diags]}) + "\n").encode())
  except BaseException:
    pass
  finally:
    os._exit(0)


def _limit_memory():
  try:
    import resource
    with open("/proc/self/statm") as f: vm = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    want = vm + EXAMPLE_MEMORY_BYTES
    if hard != resource.RLIM_INFINITY: want = min(want, hard)
    resource.setrlimit(resource.RLIMIT_AS, (want, hard))
  except (ImportError, OSError, ValueError):
    pass


def _from_json(d: dict) -> Diagnostic:
  span = A.Span(d["file"], d["line"], d["col"], d["end_line"], d["end_col"])
  return Diagnostic(d["code"], d["severity"], span, d["message"], d["note"])


def _run_forked(lib: CheckedLibrary, jobs, start: int, out: list[Diagnostic], spent: dict[str, float]) -> int:
  """Run the jobs of jobs[start]'s file from `start` in a child; returns where the next child should start
  (len(jobs) when all ran). Each example runs under example_time_limit(), the file's under file_time_limit()."""
  if _cancelled(): raise ExamplesCancelled()
  f = _file_of(jobs[start])
  stop = start
  while stop < len(jobs) and _file_of(jobs[stop]) == f: stop += 1
  if spent.get(f, 0.0) >= file_time_limit(): return _past_file_budget(jobs, start, out)
  r, w = os.pipe()
  sys.stdout.flush(); sys.stderr.flush()
  parent = os.getpid()
  pid = os.fork()
  if pid == 0:
    os.close(r)
    try: os.dup2(2, 1)          # nothing the child prints can mix into the checker's stdout (JSON)
    except OSError: pass
    _child(lib, jobs, start, w, parent, stop)
  os.close(w)
  reaped = False
  limit = example_time_limit()
  current: int | None = None
  began = time.monotonic()
  file_deadline = began + file_time_limit() - spent.get(f, 0.0)
  deadline = min(began + limit, file_deadline)
  buf = b""
  try:
    while True:
      ready, _, _ = select.select([r], [], [], min(0.2, max(0.0, deadline - time.monotonic())))
      if not ready and _cancelled():                  # nobody wants these results any more
        raise ExamplesCancelled()
      if not ready and time.monotonic() < deadline: continue
      if not ready:                                   # past the time limit: stop the child
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        reaped = True
        spent[f] = spent.get(f, 0.0) + time.monotonic() - began
        k = start if current is None else current
        if deadline >= file_deadline: return _past_file_budget(jobs, k, out)
        _, rule, ex = jobs[k]
        out.append(_budget_diag("R706", rule, ex))
        return k + 1
      chunk = os.read(r, 1 << 16)
      if not chunk:                                   # the child exited
        _, status = os.waitpid(pid, 0)
        reaped = True
        spent[f] = spent.get(f, 0.0) + time.monotonic() - began
        if current is None: return stop
        _, rule, ex = jobs[current]
        sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
        out.append(_budget_diag("R707", rule, ex, f" (its process ended{f' by signal {sig}' if sig else ''})"))
        return current + 1
      buf += chunk
      *lines, buf = buf.split(b"\n")
      for line in lines:
        if line.startswith(b"S "):
          current = int(line[2:])
          deadline = min(time.monotonic() + limit, file_deadline)
        elif line:
          msg = json.loads(line)
          out.extend(_from_json(d) for d in msg["d"])
          current = None
  finally:
    os.close(r)
    if not reaped:                                    # interrupted (or a bad message): never leave the child running
      try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
      except OSError: pass


def count_examples(lib: CheckedLibrary) -> int:
  return sum(len(r.examples) for rs in lib.rulesets.values() for r in rs.rules)


__all__ = ["ExampleError", "GraphBuilder", "show", "run_example", "run_examples", "count_examples", "ExampleMatcher",
           "ExamplesCancelled", "cancel_when"]
