"""What tinygrad model code imports from `tinygrad` and `tinygrad.helpers` besides Tensor: getenv, Context and the
flags it sets (DEBUG, BEAM, JIT, TRAINING, ...), GlobalCounters, and the small utilities (Timing, colored, tqdm,
prod, flatten, ...). rulec's own settings stay where they are (RULEC_* environment variables, Tensor.training);
the flags here read and write those, so `with Context(DEBUG=2):` is `RULEC_DEBUG=2` for its block.

Flags fall in three kinds (docs/api.md, "Beyond Tensor", has the table):
- bound: the flag is a rulec setting under another name, read and written live (DEBUG, BEAM, JIT, TRAINING, DEV,
  RING, NUM_CPU_THREADS, WINO);
- accepted: tinygrad's tuning and diagnostics switches rulec has no counterpart of (NOOPT, TC, VIZ, ...):
  Context sets them and getenv-style reads see the value, but nothing in rulec changes (no value depends on them);
- refused: switches that would change values in ways rulec does not do (IMAGE, FLOAT16, DEFAULT_FLOAT, ...):
  setting one to anything but its default raises NotImplementedError naming it.
A name that is no flag at all is a KeyError, as in tinygrad."""
from __future__ import annotations

import contextlib
import functools
import os
import re
import time
from collections import defaultdict
from typing import Any, Callable, ClassVar, Iterable, TypeVar

from rulec.engine import realize as _realize
from rulec.engine.ir.dtypes import dtypes
from rulec.engine.ir.ops import ALU, Ops
from rulec.engine.ir.uop import UOp
from rulec.engine.tensor import Tensor

T = TypeVar("T")

__all__ = ["getenv", "Context", "ContextVar", "GlobalCounters", "Timing", "Profiling", "colored", "ansilen", "ansistrip",
           "prod", "flatten", "dedup", "argfix", "make_tuple", "round_up", "ceildiv", "all_int", "all_same", "partition",
           "get_child", "fetch", "tqdm", "trange", "profile_marker", "function", "Variable", "DEBUG", "BEAM", "NOOPT", "JIT", "TRAINING", "DEV"]


# *** environment ***

@functools.cache
def getenv(key: str, default: Any = 0) -> Any:
  """tinygrad's getenv(key, default=0): the environment variable converted to the default's type
  (`getenv("BS", 32)` is an int), the default when unset. Cached per (key, default), as tinygrad's is:
  `getenv.cache_clear()` makes it read the environment again."""
  return type(default)(os.getenv(key, default))


class ContextError(KeyError):
  """Context(NAME=...) for a NAME that is no flag (a KeyError, as tinygrad's)."""
  def __str__(self) -> str: return str(self.args[0]) if self.args else ""


class ContextVar:
  """ContextVar(key, default_value): a named flag `Context` can set, its value starting from the environment
  variable of that name (getenv). `DEBUG >= 2`, `if BEAM:` compare and test its value."""
  _cache: ClassVar[dict[str, ContextVar]] = {}

  def __init__(self, key: str, default_value: Any):
    if key in ContextVar._cache: raise RuntimeError(f"attempt to recreate ContextVar {key}")
    ContextVar._cache[key] = self
    self.key, self.default = key, default_value
    self._init(default_value)

  def _init(self, default_value: Any) -> None: self._value = getenv(self.key, default_value)

  @property
  def value(self) -> Any: return self._value
  @value.setter
  def value(self, v: Any) -> None: self._value = v

  # Context keeps what it changed as a snapshot, so a bound flag can restore its setting exactly (unset included)
  def _snapshot(self) -> Any: return self._value
  def _restore(self, snap: Any) -> None: self._value = snap

  def __bool__(self) -> bool: return bool(self.value)
  def __eq__(self, x: Any) -> bool: return self.value == x
  def __ne__(self, x: Any) -> bool: return self.value != x
  def __ge__(self, x: Any) -> bool: return self.value >= x
  def __gt__(self, x: Any) -> bool: return self.value > x
  def __le__(self, x: Any) -> bool: return self.value <= x
  def __lt__(self, x: Any) -> bool: return self.value < x
  def __int__(self) -> int: return int(self.value)
  __hash__ = None  # type: ignore[assignment]   (compares by value, as tinygrad's)

  def __repr__(self) -> str: return f"<{type(self).__name__} {self.key}={self.value!r}>"

  def tolist(self, obj: Any = None) -> list:
    """A comma-separated string value as a list (of obj's attributes of those names when obj is given)."""
    if not isinstance(self.value, str): raise TypeError(f"{self.key} is not a string flag")
    return [getattr(obj, x) if obj is not None else x for x in self.value.split(",") if x]


class _EnvFlag(ContextVar):
  """A tinygrad flag that is a rulec environment setting under another name: reading it reads the setting now,
  writing it writes the setting (so rulec sees it at once)."""
  def __init__(self, key: str, default_value: Any, env: str, why: str, convert: Callable[[Any], str] = lambda v: str(int(v)),
               after: Callable[[], None] | None = None):
    self.env, self.why, self.convert, self.after = env, why, convert, after
    super().__init__(key, default_value)

  def _init(self, default_value: Any) -> None: pass

  @property
  def value(self) -> Any:
    raw = os.environ.get(self.env, "")
    if raw == "": return self.default
    try: return type(self.default)(raw)
    except ValueError: return raw
  @value.setter
  def value(self, v: Any) -> None:
    os.environ[self.env] = self.convert(v)
    if self.after is not None: self.after()

  def _snapshot(self) -> Any: return os.environ.get(self.env)
  def _restore(self, snap: Any) -> None:
    if snap is None: os.environ.pop(self.env, None)
    else: os.environ[self.env] = snap
    if self.after is not None: self.after()


def _sync_debug() -> None:
  # the scheduler reads RULEC_DEBUG once, at import (engine/sched/driver.py); the rest of rulec reads it each time
  from rulec.engine.sched import driver
  try: driver.DEBUG = int(os.environ.get("RULEC_DEBUG", "0") or 0)
  except ValueError: driver.DEBUG = 0


def _device_name(v: Any) -> str:
  from rulec.engine.tensor.args import canon_device
  d = canon_device(str(v))
  if not isinstance(d, str): raise ValueError(f"DEV takes one device, got {v!r}")
  return d


def _jit_switch(v: Any) -> str: return "0" if not int(v) else "1"


class _TrainingFlag(ContextVar):
  """TRAINING: Tensor.training (dropout drops, BatchNorm uses batch statistics, optimizers step)."""
  def _init(self, default_value: Any) -> None: pass
  @property
  def value(self) -> int: return int(Tensor.training)
  @value.setter
  def value(self, v: Any) -> None: Tensor.training = bool(v)
  def _snapshot(self) -> Any: return Tensor.training
  def _restore(self, snap: Any) -> None: Tensor.training = snap


class _Accepted(ContextVar):
  """A tinygrad tuning or diagnostics flag rulec has no counterpart of: it holds a value and changes nothing."""
  def __init__(self, key: str, default_value: Any, why: str):
    self.why = why
    super().__init__(key, default_value)


class _Refused(ContextVar):
  """A tinygrad flag that would change values in a way rulec does not: only its default may be set."""
  def __init__(self, key: str, default_value: Any, why: str):
    self.why = why
    super().__init__(key, default_value)

  def _init(self, default_value: Any) -> None: self._value = default_value

  @property
  def value(self) -> Any: return self._value
  @value.setter
  def value(self, v: Any) -> None:
    if v != self.default and str(v).lower() != str(self.default).lower():
      raise NotImplementedError(f"{self.key}={v!r}: {self.why} (rulec runs with {self.key}={self.default!r})")
    self._value = v


DEBUG = _EnvFlag("DEBUG", 0, "RULEC_DEBUG", "rulec's debug output at that level (its own lines, not tinygrad's)",
                 after=_sync_debug)
BEAM = _EnvFlag("BEAM", 0, "RULEC_SEARCH", "kernel search: BEAM=n times the candidates n times each (RULEC_SEARCH=n)")
JIT = _EnvFlag("JIT", 1, "RULEC_JIT", "JIT=0 runs TinyJit functions plainly; any other value captures and replays",
               convert=_jit_switch)
DEV = _EnvFlag("DEV", "CPU", "RULEC_DEVICE", "the default device (Device.DEFAULT)", convert=_device_name)
RING = _EnvFlag("RING", 1, "RULEC_RING", "ring allreduce: 0 never, 1 when it pays, 2 always")
NUM_CPU_THREADS = _EnvFlag("NUM_CPU_THREADS", os.cpu_count() or 1, "RULEC_THREADS", "threads a CPU kernel runs on")
TRAINING = _TrainingFlag("TRAINING", 0)
# (off unless set: runtime/devices.py winograd_convs says why)
WINO = _EnvFlag("WINO", 0, "RULEC_WINOGRAD", "3x3 stride-1 float32 convolutions as Winograd's F(2x2, 3x3): 1 on, 0 off")

_NO_EFFECT = "a tinygrad tuning or diagnostics switch with no counterpart in rulec: accepted, changes nothing"
NOOPT = _Accepted("NOOPT", 0, "rulec's kernel optimizer has no global off switch (RULEC_OPT forces a kernel's actions)")
for _name, _default in [("IGNORE_BEAM_CACHE", 0), ("TC", 1), ("TC_SELECT", -1), ("TC_OPT", 0),
                        ("NOLOCALS", 0), ("SPLIT_REDUCEOP", 1), ("NO_MEMORY_PLANNER", 0), ("LRU", 1), ("CACHELEVEL", 2),
                        ("CCACHE", 1), ("SCACHE", 1), ("VIZ", 0), ("PROFILE", 0), ("TRACEMETA", 1), ("CAPTURING", 1),
                        ("NO_COLOR", 0), ("JIT_BATCH_SIZE", 32), ("FUSE_OPTIM", 0), ("TRANSCENDENTAL", 1),
                        ("ALLOW_TF32", 0), ("DISABLE_FAST_IDIV", 1), ("USE_ATOMICS", 0), ("TUPLE_ORDER", 1),
                        ("VALIDATE_WITH_CPU", 0), ("CAPTURE_PROCESS_REPLAY", 0), ("SPEC", 1), ("CHECK_OOB", 0),
                        ("PCONTIG", 0), ("DEBUG_RANGEIFY", 0), ("ALLOW_DEVICE_USAGE", 1), ("MAX_BUFFER_SIZE", 0),
                        ("MAX_KERNEL_BUFFERS", 0), ("ALL2ALL", 0), ("ALLREDUCE_CAST", 1), ("PARALLEL", 0)]:
  _Accepted(_name, _default, _NO_EFFECT)
IMAGE = _Refused("IMAGE", 0, "image (texture) dtypes are out of scope")
FLOAT16 = _Refused("FLOAT16", 0, "openpilot's float16 image path is out of scope")
_Refused("OPENPILOT_HACKS", 0, "openpilot's special cases are out of scope")
_Refused("DEFAULT_FLOAT", "float32", "rulec's default float is float32; cast explicitly")
_Refused("DEFAULT_INT", "int32", "rulec's default int is int32; cast explicitly")
_Refused("EMULATED_DTYPES", "", "rulec emulates no dtypes on request")
_Refused("DISALLOW_BROADCAST", 0, "rulec always broadcasts")
_Refused("NULL_ALLOW_COPYOUT", 0, "rulec has no NULL device")


class Context(contextlib.ContextDecorator):
  """`with Context(DEBUG=2, BEAM=4):` (or as a decorator) sets flags for its block and restores them after.

  Every name must be a flag (a ContextVar: tinygrad's, or one the program made); others raise ContextError, a
  KeyError. A refused flag set to other than its default raises NotImplementedError; nothing is left changed."""
  def __init__(self, **kwargs: Any): self.kwargs = kwargs

  def __enter__(self) -> Context:
    unknown = [k for k in self.kwargs if k not in ContextVar._cache]
    if unknown:
      raise ContextError(f"Context: no flag named {', '.join(unknown)}; flags: {', '.join(sorted(ContextVar._cache))}")
    self.old: dict[str, Any] = {}
    try:
      for k, v in self.kwargs.items():
        var = ContextVar._cache[k]
        snap = var._snapshot()
        var.value = v
        self.old[k] = snap
    except BaseException:
      self._undo()
      raise
    return self

  def _undo(self) -> None:
    for k, snap in reversed(list(self.old.items())): ContextVar._cache[k]._restore(snap)
    self.old = {}

  def __exit__(self, *exc: Any) -> None: self._undo()


# *** counters ***



def _estimate(kernel: Any) -> tuple[int, int]:
  """(ALU operations, bytes) of one run of a kernel, kept per AST (a JIT replay runs the same ASTs on other
  buffers; a PARAM's arg holds its buffer's size, so equal ASTs have equal sizes)."""
  return kernel.ast.memo_root("kernel_estimate",
                              lambda ast: (_ops_estimate(ast), sum(b.arg[2] * b.dtype.itemsize for b in kernel.bufs)))


def _ops_estimate(ast: Any) -> int:
  """ALU operations a kernel carries out: each value op (index arithmetic left out) once per iteration of the ranges
  its value depends on, and a REDUCE once per iteration of the ranges it reduces (a matmul: 2*M*N*K)."""
  ranges: dict[Any, frozenset] = {}
  ops = 0
  for u in ast.toposort():
    if u.op is Ops.RANGE: rs = frozenset((u,))
    else: rs = frozenset().union(*(ranges[s] for s in u.src)) if u.src else frozenset()
    if u.op is Ops.REDUCE:
      ops += _iterations(rs)
      rs = rs - frozenset(u.src[1:])
    elif u.op in ALU and u.dtype is not dtypes.index: ops += _iterations(rs)
    ranges[u] = rs
  return ops


def _iterations(rs: frozenset) -> int:
  n = 1
  for r in rs:
    size = r.src[0].arg if r.src and r.src[0].op is Ops.CONST and isinstance(r.src[0].arg, int) else 1
    n *= size
  return n


class _CountersMeta(type):
  @property
  def mem_used(cls) -> int:
    """Bytes held now by allocated buffers on every device."""
    return sum(_live_bytes().values())
  @property
  def mem_used_per_device(cls) -> dict[str, int]:
    """Bytes held now by allocated buffers, per device."""
    return defaultdict(int, _live_bytes())


def _live_bytes() -> dict[str, int]:
  from rulec.runtime import buffer as _buffer
  return {d: m["used"] for d, m in _buffer.MEMORY.items() if m["used"]}


class GlobalCounters(metaclass=_CountersMeta):
  """tinygrad's GlobalCounters, counted from rulec's kernel runs (a TinyJit replay's included), since the last
  reset():

  - kernel_count: kernels run (copies between devices count one each, as tinygrad's);
  - global_ops: an estimate of the ALU operations they carried out (per kernel: each value op once per iteration of
    the loops it depends on, a reduce once per iteration it sums);
  - global_mem: bytes of the buffers each kernel reads and writes (each buffer once per kernel run);
  - time_sum_s: host seconds spent running them (on CL, enqueueing them: the queue runs ahead);
  - mem_used / mem_used_per_device: bytes held by allocated buffers now (read live; reset() leaves them)."""
  global_ops: ClassVar[int] = 0
  global_mem: ClassVar[int] = 0
  time_sum_s: ClassVar[float] = 0.0
  kernel_count: ClassVar[int] = 0

  @staticmethod
  def reset() -> None:
    """Zero kernel_count, global_ops, global_mem and time_sum_s."""
    GlobalCounters.global_ops, GlobalCounters.global_mem, GlobalCounters.time_sum_s, GlobalCounters.kernel_count = 0, 0, 0.0, 0


def _count(kernel: Any, seconds: float) -> None:
  ops, mem = _estimate(kernel)
  GlobalCounters.kernel_count += 1
  GlobalCounters.time_sum_s += seconds
  GlobalCounters.global_mem += mem
  GlobalCounters.global_ops += ops


if _count not in _realize.RUN_HOOKS: _realize.RUN_HOOKS.append(_count)


# *** tinygrad's graph functions and symbolic variables ***

class _Function:
  """A function under tinygrad's `@function`, inlined: see function()."""
  def __init__(self, fxn: Callable):
    self.fxn = fxn
    functools.update_wrapper(self, fxn)

  def __get__(self, obj: Any, objtype: Any = None) -> Any:
    return functools.partial(self.__call__, obj) if obj is not None else self

  def __call__(self, *args: Any, **kwargs: Any) -> Any:
    ret = self.fxn(*args, **kwargs)
    if isinstance(ret, Tensor) or (isinstance(ret, tuple) and all(isinstance(x, Tensor) for x in ret)): return ret
    raise RuntimeError(f"function return type {type(ret)} not supported")


def function(fxn: Callable | None = None, *, precompile: bool = False, precompile_backward: bool = False,
             allow_implicit: bool = False, grad_fxn: Callable | None = None) -> Any:
  """tinygrad's `@function` (or `@function(precompile=True)`): in tinygrad a call boundary, the body traced once
  into a graph function. rulec has no call boundary in its IR, so the body is inlined into the caller's graph: the
  values, gradients and kernels are those of calling it plainly. As tinygrad's, the result must be a Tensor or a
  tuple of Tensors. grad_fxn (a custom gradient) is refused; precompile and allow_implicit change nothing here."""
  if grad_fxn is not None:
    raise NotImplementedError("function(grad_fxn=...): a custom gradient needs tinygrad's call boundary, which rulec "
                              "does not have; write the gradient as tensor operations")
  return _Function if fxn is None else _Function(fxn)


# tinygrad's Variable(name, min, max) is UOp.variable: `.bind(value)` gives it a value. rulec specialises a bound value
# (a shape or offset given as a bound expression is its int, docs/api.md "Symbolic shapes"); TinyJit keys its
# captures by the bound values of the arguments, so a replay never runs kernels built for another value.
Variable = UOp.variable


# *** timing and output ***

class Timing(contextlib.ContextDecorator):
  """`with Timing("step "):` prints the block's wall time in ms (prefix first; on_exit(ns) adds text)."""
  def __init__(self, prefix: str = "", on_exit: Callable[[int], str] | None = None, enabled: bool = True):
    self.prefix, self.on_exit, self.enabled = prefix, on_exit, enabled
  def __enter__(self) -> Timing:
    self.st = time.perf_counter_ns()
    return self
  def __exit__(self, *exc: Any) -> None:
    self.et = time.perf_counter_ns() - self.st
    if self.enabled: print(f"{self.prefix}{self.et * 1e-6:6.2f} ms" + (self.on_exit(self.et) if self.on_exit else ""))


class Profiling(contextlib.ContextDecorator):
  """`with Profiling():` runs its block under cProfile and prints the top functions by `sort` (a fraction frac)."""
  def __init__(self, enabled: bool = True, sort: str = "cumtime", frac: float = 0.2, fn: str | None = None, ts: int = 1):
    self.enabled, self.sort, self.frac, self.fn = enabled, sort, frac, fn
  def __enter__(self) -> Profiling:
    import cProfile
    self.pr = cProfile.Profile()
    if self.enabled: self.pr.enable()
    return self
  def __exit__(self, *exc: Any) -> None:
    if not self.enabled: return
    self.pr.disable()
    if self.fn: self.pr.dump_stats(self.fn)
    import pstats
    stats = pstats.Stats(self.pr).strip_dirs().sort_stats(self.sort)
    stats.print_stats(self.frac)


def profile_marker(name: str, color: str = "gray") -> None:
  """tinygrad's profiler marker: rulec has no profiler timeline, so nothing is recorded."""


_COLORS = ["black", "red", "green", "yellow", "blue", "magenta", "cyan", "white"]


def colored(st: str, color: str | None, background: bool = False) -> str:
  """st in an ANSI colour (upper-case name: the bright one); None leaves it plain."""
  if color is None: return st
  return f"\u001b[{10 * background + 60 * (color.upper() == color) + 30 + _COLORS.index(color.lower())}m{st}\u001b[0m"


def ansistrip(s: str) -> str: return re.sub(r"\x1b\[(K|.*?m)", "", s)


def ansilen(s: str) -> int: return len(ansistrip(s))


def tqdm(iterable: Iterable[T] | None = None, desc: str = "", disable: bool = False, unit: str = "it",
         unit_scale: bool = False, total: int | None = None, rate: int = 100):
  """A progress bar over iterable (the tqdm package's)."""
  from tqdm import tqdm as _tqdm
  return _tqdm(iterable, desc=desc, disable=disable, unit=unit, unit_scale=unit_scale, total=total)


def trange(n: int, **kwargs: Any):
  """tqdm(range(n))."""
  return tqdm(range(n), total=n, **kwargs)


# *** small utilities ***

def prod(x: Iterable[Any]) -> Any:
  """The product of the items (1 for none)."""
  return functools.reduce(lambda a, b: a * b, x, 1)


def flatten(xs: Iterable[Iterable[T]]) -> list[T]: return [x for y in xs for x in y]


def dedup(xs: Iterable[T]) -> list[T]:
  """The items without repeats, first occurrence kept (hashable items)."""
  return list(dict.fromkeys(xs))


def argfix(*x: Any) -> tuple:
  """Arguments given as one tuple/list or as several: the tuple."""
  if x and x[0].__class__ in (tuple, list):
    if len(x) != 1: raise ValueError(f"bad arg {x}")
    return tuple(x[0])
  return x


def make_tuple(x: int | Iterable[int], cnt: int) -> tuple[int, ...]:
  return (x,) * cnt if isinstance(x, int) else tuple(x)


def round_up(num: int, amt: int) -> int: return (num + amt - 1) // amt * amt


def ceildiv(num: int, amt: int) -> int: return -(num // -amt)


def all_int(t: Iterable[Any]) -> bool: return all(isinstance(s, int) for s in t)


def all_same(items: list) -> bool: return all(x == items[0] for x in items)


def partition(itr: Iterable[T], fxn: Callable[[T], bool]) -> tuple[list[T], list[T]]:
  """(items where fxn holds, the others)."""
  yes, no = [], []
  for s in itr: (yes if fxn(s) else no).append(s)
  return yes, no


def get_child(obj: Any, key: str) -> Any:
  """obj's descendant by a dotted path: attributes, and list positions for numeric parts ('layers.0.weight')."""
  for k in key.split("."):
    if k.isnumeric(): obj = obj[int(k)]
    elif isinstance(obj, dict): obj = obj[k]
    else: obj = getattr(obj, k)
  return obj


def fetch(url: str, name: Any = None, subdir: str | None = None, gunzip: bool = False, allow_caching: bool = True) -> Any:
  """tinygrad downloads url into its cache; rulec reads nothing from the network, so this raises: download the file
  yourself and pass its path (torch_load, safe_load and gguf_load take paths)."""
  raise NotImplementedError(f"fetch({url!r}): rulec reads nothing from the network; download the file and pass "
                            "its path to the loader (nn.state.torch_load / safe_load / gguf_load)")

