"""A derandomized differential fuzzer of whole Tensor programs.

The generator (`Gen`) writes small random *valid* programs over the Tensor
front end as Python source: inputs from literals (lists, numpy arrays, every
dtype spelling) and constant constructors (full / zeros / ones / *_like /
arange / eye), elementwise ops with broadcasting and Python scalars, lists and
numpy arrays as operands, comparisons, where, clip, casts between every dtype
pair, bitcasts, reductions (sum with and without dtype=, prod, max, min, mean,
var, std, argmax, argmin, any, all; keepdim, axis None / int / tuple),
softmax / log_softmax / layernorm, matmul, conv2d, max / avg pools, movement
ops and indexing (ints, slices with any step, None, Ellipsis), cat / stack,
contiguous / clone / detach, .to() round trips through another device,
realize in the middle of a program, several outputs realized together,
Tensor.schedule, and assign (whole tensors, views, __setitem__), with values
computed lazily before an assign read together with the new ones; size-0 and
size-1 axes, constant-only programs (some of 2**15 or more elements), and a
"big" flavor with the sizes where the CPU's vector and tiled paths apply.

As it writes each statement it computes the expected value with numpy (its
own mirror of the semantics documented at the top of engine/tensor/__init__.py, not
rulec's evaluator) and, for floats, an elementwise bound on the rounding
error, so that only well-conditioned programs are generated: a comparison,
floor, cast to int, argmax, ... is only applied where the rounding of its
inputs cannot change the answer, values stay far from overflow, integer
division never divides by zero, no float is cast to an int it does not fit.
Assigns follow tinygrad: a tensor computed before an assign of a whole buffer
and realized in the same realize call keeps the old value, while a write
through a view is made before anything realized with it reads the buffer
(engine/tensor/writes.py); values whose result would depend on
realize timing (a lazy reader of a buffer realized in a later call than the
assign, views that may share the written storage) are dropped from the
program, not checked (see `Val` for the storage model).

The runner executes a program on a device and compares each captured output
(value, dtype, device) with the expectation: exact for bools and integers,
within the tracked bound (a few ulps per op) for floats. Any exception is a
crash. `run_isolated` runs a batch in child processes and restarts after a
segfault or a hang, recording the program that killed it, so a crashing
backend cannot take pytest down. `shrink` deletes statements of a failing
program while it fails the same way (for wrong values, against the
RULEC_REALIZE=eval path when that one agrees with numpy).

Programs are derandomized: program `i` of seed `s` is always the same (for one
version of this file).

    python tests/fuzz_programs.py --device NUMPY --n 20000 --seed 0
    python tests/fuzz_programs.py --device CPU --n 2000 --shrink          # shrink one reproducer per class
    python tests/fuzz_programs.py --device CPU --start 17 --n 1 --shrink  # just program 17
    python tests/fuzz_programs.py --device CPU --show 17                  # print program 17 and its expectations
    python tests/fuzz_programs.py --device NUMPY --realize eval           # the generator against tensor_eval
    python tests/fuzz_programs.py --device CL --small                     # the smaller programs of the CL sample
    python tests/fuzz_programs.py --device CPU --flavor big --exclude dup,dup_assign
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import select
import subprocess
import sys
import time
import traceback
import warnings
from typing import Any

import ml_dtypes  # noqa: F401  (np.dtype("bfloat16"): rulec imports it only when a bfloat16 is first needed)
import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path: sys.path.insert(0, REPO)

INTS = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"]
FLOATS = ["float16", "float32", "float64"]
ALL = ["bool"] + INTS + FLOATS
EPS = {"float16": 2.0 ** -11, "float32": 2.0 ** -24, "float64": 2.0 ** -53}
# floats stay below these magnitudes (far from float16 overflow, where absolute tolerances still mean something)
LIMIT = {"float16": 2.0e3, "float32": 1.0e6, "float64": 1.0e6}
TINY = {"float16": 2.0 ** -14, "float32": 2.0 ** -100, "float64": 2.0 ** -1000}
BITS = {d: np.dtype(d).itemsize * 8 for d in INTS}

# what every program (and reproducer) starts with: snap() captures a value, its dtype and device
HEADER = '''import numpy as np
from rulec import Tensor, dtypes
nan, inf = float("nan"), float("inf")
OUT = {}
def snap(t, how="numpy"):   # the value, its dtype, its device (and the buffer's, when they differ)
  if how == "numpy": a = t.numpy()
  elif how == "item": a = np.array(t.item(), dtype=t.dtype.name).reshape(t.shape)
  else: a = np.array(t.tolist(), dtype=t.dtype.name).reshape(t.shape)
  b = t.uop.base
  bdev = b.arg[1] if b.op.name == "BUFFER" else t.device
  return (a, t.dtype.name, t.device if bdev == t.device else f"{t.device} (buffer on {bdev})")
'''

CHECK = '''
def check(key, want, dtype, tol):
  got, dt, dev = OUT[key]
  assert dt == dtype, f"{key}: dtype {dt}, expected {dtype}"
  assert dev == DEV, f"{key}: device {dev}, expected {DEV}"
  assert got.shape == np.shape(want), f"{key}: shape {got.shape}, expected {np.shape(want)}"
  w = np.array(want, dtype=dtype).reshape(got.shape)
  if dtype.startswith("float"): np.testing.assert_allclose(got.astype(np.float64), w.astype(np.float64), rtol=0, atol=tol, equal_nan=True, err_msg=key)
  else: np.testing.assert_array_equal(got, w, err_msg=key)
'''


def is_f(dt: str) -> bool: return dt in FLOATS
def is_i(dt: str) -> bool: return dt in INTS
def is_u(dt: str) -> bool: return dt.startswith("uint")
def promote(*dts: str) -> str:
  """tinygrad's promotion lattice (engine/tensor/args.py promote_types; the table in
  tests/frontend/test_api_conventions.py): the widest float if any; else the narrowest int holding every operand
  (uint8 + int8 -> int16), float32 when a signed int meets uint64; bool below everything."""
  fl = [d for d in dts if d in FLOATS]
  if fl: return max(fl, key=lambda d: np.dtype(d).itemsize)
  sb = max((np.dtype(d).itemsize * 8 for d in dts if d.startswith("int")), default=0)
  ub = max((np.dtype(d).itemsize * 8 for d in dts if d.startswith("uint")), default=0)
  if not sb and not ub: return "bool"
  if not ub: return f"int{sb}"
  if not sb: return f"uint{ub}"
  if sb > ub: return f"int{sb}"
  return f"int{2 * ub}" if ub < 64 else "float32"


def sum_dtype(dt: str) -> str:
  """engine/tensor/__init__.py: sum of bool, int8-32 gives int32, of uint8-32 uint32; others keep their dtype."""
  if dt == "bool" or dt in ("int8", "int16", "int32"): return "int32"
  if dt in ("uint8", "uint16", "uint32"): return "uint32"
  return dt


def weak(dt: str, v: Any) -> str:
  """The dtype of `tensor(dt) op v` for a Python scalar v (NEP 50 with default int32 / float32)."""
  if isinstance(v, bool): return dt
  if isinstance(v, int): return "int32" if dt == "bool" else dt
  return dt if is_f(dt) else "float32"


def fits(v: Any, dt: str) -> bool:
  if dt == "bool" or is_f(dt) or isinstance(v, bool): return True
  if isinstance(v, float) and not v.is_integer(): return False
  ii = np.iinfo(dt)
  return ii.min <= int(v) <= ii.max


def scalar_arr(v: Any, dt: str) -> np.ndarray:
  """A Python scalar as a 0-d array of dt (the front end's scalar_of)."""
  if dt == "bool": return np.array(bool(v))
  if is_i(dt): return np.array(int(v), dtype=dt)
  return np.array(float(v), dtype=dt)


def list_dtype(vals: list) -> str:
  """The dtype of Tensor(nested list): bool, int32 (int64 / uint64 when values do not fit), float32."""
  a = np.array(vals)
  if a.dtype.kind == "b": return "bool"
  if a.dtype.kind in "iu":
    lo, hi = (int(a.min()), int(a.max())) if a.size else (0, 0)
    return "int32" if -2 ** 31 <= lo and hi < 2 ** 31 else "int64" if hi < 2 ** 63 else "uint64"
  if a.dtype.kind == "f": return "float32"
  return "object"


def zeros_err(shape) -> np.ndarray: return np.zeros(shape, dtype=np.float64)


def lit(a: Any) -> str:
  """Python source for a nested list (nan / inf are names the header defines)."""
  return repr(a)


def f64(a: np.ndarray) -> np.ndarray: return np.asarray(a).astype(np.float64)


class Reject(Exception):
  """The chosen operation is not valid or not well conditioned here: the generator tries another."""


class Val:
  """A tensor of the program under construction: its variable, its expected value and error bound.

  The model of storage (what an assign may change) is deliberately conservative:
  - mroot: the storage a realize of this tensor may share: a buffer id for a tensor made from host data, a
    token of its own for a computed value, its source's for a movement op (a realized view may be a view of
    its source's buffer, see engine/realize.py);
  - reads: every buffer / token the value depends on (its own mroot included), and ("w", b) for an assign
    into b that is still pending inside its graph;
  - buf: set when the tensor is a whole realized buffer (view is then the identity); view: for each element,
    its flat position in mroot's storage (None through padding or repeats);
  - computed: realizing it runs kernels (it is not a realized buffer or a view of one);
  - assign_buf: this tensor is an ASSIGN into that buffer, not carried out yet; base_assign: its graph is an
    ASSIGN under movement ops (the front end carries it out before a new assign);
  - movement: its storage is mroot's (a movement op, detach, or the same object as its source)."""
  __slots__ = ("name", "ref", "err", "dt", "reads", "mroot", "buf", "view", "computed", "assign_buf", "base_assign",
               "movement", "msrc", "alias_of", "tag", "tag_src")

  def __init__(self, name, ref, dt, err=None, reads=frozenset(), buf=None, view=None, computed=True, tag="",
               mroot=None, movement=False, base_assign=False):
    ref = np.asarray(ref)
    if ref.dtype.name != dt: raise AssertionError(f"generator bug: {tag} made {ref.dtype.name}, expected {dt}")
    self.name, self.ref, self.dt, self.tag = name, ref, dt, tag
    self.err = (zeros_err(ref.shape) if err is None else np.broadcast_to(np.asarray(err, dtype=np.float64), ref.shape).copy()) \
      if is_f(dt) else None
    if self.err is not None: self.err[~np.isfinite(f64(ref))] = 0.0   # NaN / inf only come out of exact ops
    self.reads, self.buf, self.view, self.computed = frozenset(reads), buf, view, computed
    self.mroot, self.movement, self.base_assign = mroot, movement, base_assign
    self.assign_buf, self.alias_of, self.msrc, self.tag_src = None, None, None, None

  @property
  def shape(self): return self.ref.shape
  @property
  def special(self) -> bool: return is_f(self.dt) and not np.isfinite(f64(self.ref)).all()
  @property
  def exact(self) -> bool: return self.err is None or not self.err.any()
  def E(self) -> np.ndarray: return self.err if self.err is not None else zeros_err(self.shape)
  @property
  def numel(self) -> int: return int(self.ref.size)
  @property
  def lazy(self) -> bool: return self.computed or self.assign_buf is not None
  def identity(self) -> np.ndarray: return np.arange(self.numel).reshape(self.shape)


# *** numpy mirrors with error bounds ***

def bounded(ref: np.ndarray, err: np.ndarray, dt: str) -> None:
  """Reject non-finite results and results too large for the tolerance model."""
  if not is_f(dt): return
  r = f64(ref)
  if not np.isfinite(r).all() or not np.isfinite(err).all(): raise Reject("not finite")
  if ref.size and (np.abs(r) + err).max() > LIMIT[dt]: raise Reject("too large")


def cast_mirror(ref: np.ndarray, err: np.ndarray | None, src: str, dst: str) -> tuple[np.ndarray, np.ndarray | None]:
  """numpy's astype where it is well defined and robust to the rounding of the input."""
  if src == dst: return ref, err
  with np.errstate(all="ignore"):
    if is_f(src):
      x = f64(ref)
      e = err if err is not None else zeros_err(ref.shape)
      if dst == "bool":
        ok = np.isnan(x) | (np.abs(x) > e) | ((x == 0) & (e == 0))
        if not ok.all(): raise Reject("cast to bool near 0")
        return ref.astype(dst), None
      if is_i(dst):
        if not np.isfinite(x).all(): raise Reject("non-finite to int")
        lo, hi = np.trunc(x - e), np.trunc(x + e)
        if (lo != hi).any(): raise Reject("cast to int near an integer")
        ii = np.iinfo(dst)
        if ref.size and (lo.min() < ii.min or hi.max() > ii.max or (lo.min() < 0 and is_u(dst))): raise Reject("out of range")
        if ref.size and (np.abs(x).max() >= 2.0 ** 62): raise Reject("huge")
        return ref.astype(dst), None
      out = ref.astype(dst)
      o = f64(out)
      if not (np.isfinite(o) == np.isfinite(x)).all(): raise Reject("overflows the narrower float")
      ne = e + (EPS[dst] * np.abs(o) if e.any() else 0.0)
      return out, ne
    out = ref.astype(dst)
    if is_f(dst):
      o = f64(out)
      if not np.isfinite(o).all(): raise Reject("int overflows the float")
      return out, zeros_err(ref.shape)
    return out, None


def corners(f, a: np.ndarray, ea: np.ndarray, b: np.ndarray, eb: np.ndarray) -> np.ndarray:
  """max |f(a +- ea, b +- eb) - f(a, b)| (a bound for f monotone in each argument on the boxes)."""
  with np.errstate(all="ignore"):
    c = f(a, b)
    d = np.zeros(np.broadcast_shapes(np.shape(a), np.shape(b)))
    for sa in (-1, 1):
      for sb in (-1, 1):
        d = np.maximum(d, np.abs(f(a + sa * ea, b + sb * eb) - c))
    return d


class Gen:
  """One random program: source lines, the live tensors with their expectations, the captured outputs."""

  def __init__(self, seed: int, index: int, device: str, flavor: str | None = None, skip: tuple = (), small: bool = False,
               exclude: tuple = ()):
    self.r = random.Random(f"rulec-fuzz:{seed}:{index}" + (":small" if small else ""))
    self.seed, self.index, self.device, self.skip, self.small, self.exclude = seed, index, device, set(skip), small, set(exclude)
    self.lines: list[str] = []
    self.live: list[Val] = []
    self.n = 0
    self.nbuf = 0
    self.expect: dict[str, tuple] = {}      # OUT key -> (ref, err, dt)
    self.keytags: dict[str, str] = {}      # OUT key -> the op that made it
    self.tags: list[str] = []
    self.flavor = flavor or self.r.choices(["general", "const", "assign", "multi", "movement", "cast", "big"],
                                           [44, 9, 16, 12, 11, 8, 0 if small else 3])[0]
    self.specials = self.r.random() < 0.12
    self.maxn = 4096 if self.flavor in ("const", "big") else 24 if small else 48

  # *** plumbing ***

  def emit(self, line: str) -> None: self.lines.append(line)

  def fresh(self) -> str:
    self.n += 1
    return f"v{self.n}"

  def add(self, v: Val) -> Val:
    if v.numel > self.maxn and self.flavor not in ("const", "big"): raise Reject("too big")
    if v.numel > 2 ** 16: raise Reject("too big")
    if v.mroot is None:   # a value of its own
      v.mroot = v.buf if v.buf is not None else self.newbuf()
      if v.view is None: v.view = v.identity()
    v.reads = v.reads | {v.mroot}
    self.live.append(v)
    self.tags.append(v.tag)
    return v

  def newbuf(self) -> int:
    self.nbuf += 1
    return self.nbuf

  def pick(self, pred=lambda v: True, recent: bool = True) -> Val:
    c = [v for v in self.live if pred(v)]
    if not c: raise Reject("no operand")
    if recent and self.r.random() < 0.55: return c[-1 - min(int(self.r.expovariate(0.7)), len(c) - 1)]
    return self.r.choice(c)

  def rdt(self) -> str:
    return self.r.choices(ALL, [6, 4, 4, 3, 3, 8, 3, 4, 3, 5, 10, 5])[0]

  BIG_DIMS = [1, 4, 8, 16, 17, 24, 32, 33, 64]

  def rshape(self, maxnd: int = 3, maxn: int = 24) -> tuple:
    if self.flavor == "big":   # sizes where the CPU's vector lanes, row tiles and blocked reductions apply
      for _ in range(20):
        s = tuple(self.r.choice(self.BIG_DIMS) for _ in range(self.r.choice([1, 2, 2, 3])))
        if math.prod(s) <= self.maxn: return s
      return (64,)
    for _ in range(20):
      nd = self.r.choices(range(maxnd + 1), [2, 4, 5, 3, 1][:maxnd + 1])[0]
      s = tuple(self.r.choices([0, 1, 2, 3, 4, 5], [0.5, 4, 6, 5, 3, 1])[0] for _ in range(nd))
      if math.prod(s) <= maxn: return s
    return (2,)

  def values(self, dt: str, n: int) -> list:
    r = self.r
    if dt == "bool": return [r.random() < 0.5 for _ in range(n)]
    if is_i(dt):
      ii = np.iinfo(dt)
      if r.random() < 0.75:
        lo, hi = (0, 9) if is_u(dt) else (-6, 6)
        return [r.randint(lo, hi) for _ in range(n)]
      edge = [int(ii.min), int(ii.max), 0, 1, int(ii.max) - 1] + ([] if is_u(dt) else [-1, int(ii.min) + 1])
      return [r.choice(edge) if r.random() < 0.5 else r.randint(int(ii.min), int(ii.max)) for _ in range(n)]
    m = r.random()
    if m < 0.65: out = [r.randint(-16, 16) / 4 for _ in range(n)]
    elif m < 0.9: out = [round(r.uniform(-3, 3), 3) for _ in range(n)]
    else: out = [round(r.uniform(-60, 60), 2) for _ in range(n)]
    if self.specials and n:
      for _ in range(r.randint(1, 2)): out[r.randrange(n)] = r.choice([math.nan, math.inf, -math.inf, -0.0])
    return out

  def input(self, shape: tuple, dt: str, tag: str = "input") -> Val:
    """A new tensor from host data (a buffer)."""
    r = self.r
    n = math.prod(shape)
    vals = self.values(dt, n)
    arr = np.array(vals, dtype=dt).reshape(shape)
    nested = arr.tolist() if dt != "float16" and dt != "float32" else np.array(vals, dtype=np.float64).reshape(shape).tolist()
    name = self.fresh()
    default = shape != () and n > 0 and list_dtype(nested) == dt
    m = r.random()
    if shape == () and r.random() < 0.4 and dt in ("bool", "int32", "float32"):
      v = vals[0]
      if dt == "float32" and not isinstance(v, float): v = float(v)
      self.emit(f"{name} = Tensor({v!r}, device=DEV)")
    elif default and m < 0.3: self.emit(f"{name} = Tensor({lit(nested)}, device=DEV)")
    elif n > 0 and m < 0.55:
      spell = r.choice([f'"{dt}"', f"dtypes.{dt}", f"np.{dt}"])
      self.emit(f"{name} = Tensor({lit(nested)}, dtype={spell}, device=DEV)")
    else:
      self.emit(f"{name} = Tensor(np.array({lit(nested)}, dtype=\"{dt}\").reshape({shape!r}), device=DEV)")
    arr = np.array(nested, dtype=dt).reshape(shape)
    b = self.newbuf()
    return self.add(Val(name, arr, dt, reads={b}, buf=b, view=np.arange(n).reshape(shape), computed=False, tag=tag))

  def const_input(self, shape: tuple | None = None, dt: str | None = None) -> Val:
    """A constant tensor (full / zeros / ones / *_like / arange / eye)."""
    r = self.r
    shape = self.rshape() if shape is None else shape
    name = self.fresh()
    k = r.choice(["full", "zeros", "ones", "like", "arange", "eye"])
    if k == "arange" and len(shape) == 1 and shape[0] > 0:
      n = shape[0]
      if r.random() < 0.5:
        start, step = r.randint(-3, 3), r.choice([1, 2, 3, -1, -2])
        stop = start + step * n
        dt = r.choice([None, "int8", "int64", "float16", "float32", "uint8" if start >= 0 and stop >= -1 else "int16"])
        ref = np.arange(start, stop, step)
        if dt is None: dt = "int32"
        # (an arange whose values do not fit its integer dtype raises OverflowError, as tinygrad's: a wider one)
        if dt not in ("float16", "float32") and ref.size and not (np.iinfo(dt).min <= ref.min() and ref.max() <= np.iinfo(dt).max):
          dt = "int64"
      else:
        start, step = r.choice([0.0, 0.5, -1.0]), r.choice([0.25, 0.5, 1.5])
        stop = start + step * (n - 0.5)
        dt = r.choice([None, "float64", "float16"])
        ref = np.arange(start, stop, step)
        if dt is None: dt = "float32"
      ref = ref.astype(dt)
      if ref.size != n: raise Reject("arange size")
      args = f"{start!r}, {stop!r}" + ("" if step == 1 else f", {step!r}")
      default = "float32" if any(isinstance(x, float) for x in (start, stop, step)) else "int32"
      self.emit(f"{name} = Tensor.arange({args}{'' if dt == default and r.random() < 0.5 else f', dtype={dt!r}'}, device=DEV)")
      return self.add(Val(name, ref, dt, tag="arange"))   # lazy, like full (no storage until realized)
    if k == "eye" and len(shape) == 2:
      n, m = shape
      dt = r.choice([None, "int32", "bool", "float16"])
      ref = np.eye(n, m).astype(dt or "float32")
      self.emit(f"{name} = Tensor.eye({n}, {m}{'' if dt is None else f', dtype={dt!r}'}, device=DEV)")
      return self.add(Val(name, ref, dt or "float32", tag="eye"))   # lazy, like full
    if k == "like" and any(v.shape == shape for v in self.live):
      src = self.pick(lambda v: v.shape == shape)
      dt = r.choice([None, self.rdt()])
      which = r.choice(["zeros_like", "ones_like", "full_like"])
      odt = dt or src.dt
      if which == "full_like":
        fv = self.scalar_for(odt, "fill")
        ref = np.full(src.shape, fv, dtype=odt)
        self.emit(f"{name} = {src.name}.full_like({fv!r}{'' if dt is None else f', dtype={dt!r}'})")
      else:
        ref = (np.zeros if which == "zeros_like" else np.ones)(src.shape, dtype=odt)
        self.emit(f"{name} = {src.name}.{which}({'' if dt is None else f'dtype={dt!r}'})")
      return self.add(Val(name, ref, odt, tag=which))
    if k in ("zeros", "ones"):
      dt = r.choice([None, self.rdt()])
      ref = (np.zeros if k == "zeros" else np.ones)(shape, dtype=dt or "float32")
      sh = r.choice([", ".join(map(str, shape)), repr(shape)]) if shape else r.choice(["", "()"])
      self.emit(f"{name} = Tensor.{k}({sh}{', ' if sh else ''}{'' if dt is None else f'dtype={dt!r}, '}device=DEV)")
      return self.add(Val(name, ref, dt or "float32", tag=k))
    dt = r.choice([None, None, self.rdt()])
    if dt is None:
      fv = r.choice([True, False, 0, 1, 3, -2, 7, 2 ** 40, 0.5, -1.25, 3.0, 0.1])
      dt = "bool" if isinstance(fv, bool) else ("int32" if -2 ** 31 <= fv < 2 ** 31 else "int64") if isinstance(fv, int) else "float32"
      ref = np.full(shape, fv, dtype=dt)
      self.emit(f"{name} = Tensor.full({shape!r}, {fv!r}, device=DEV)")
    else:
      fv = self.scalar_for(dt, "fill")
      ref = np.full(shape, fv, dtype=dt)
      self.emit(f"{name} = Tensor.full({shape!r}, {fv!r}, dtype={dt!r}, device=DEV)")
    return self.add(Val(name, ref, dt, tag="full"))

  def scalar_for(self, dt: str, purpose: str = "arith") -> Any:
    """A Python scalar that fits dt (no OverflowError)."""
    r = self.r
    if dt == "bool": return r.choice([True, False])
    if is_i(dt):
      c = [0, 1, 2, 3, 5, 7, -1, -2, -3, 100, -100, 127, 1000, 2 ** 31 - 1, 2 ** 40]
      c = [x for x in c if fits(x, dt)]
      return r.choice(c[:9] if r.random() < 0.8 else c)
    return r.choice([0.5, 1.5, 2.0, -0.25, 0.1, 3.0, -2.5, 1.0, 0.0, -7.0, 0.3])

  def operand(self, shape: tuple, dt: str | None = None) -> Val:
    """A tensor whose shape broadcasts with shape: a live one (shared subexpressions) or a new input."""
    r = self.r
    def compat(v):
      try: s = np.broadcast_shapes(v.shape, shape)
      except ValueError: return False
      return math.prod(s) <= self.maxn and len(s) <= 4 and (dt is None or v.dt == dt)
    if r.random() < 0.5:
      try: return self.pick(compat)
      except Reject: pass
    if r.random() < 0.6: s = list(shape)
    else: s = [1 if r.random() < 0.5 else d for d in shape]
    if s and r.random() < 0.2: s = s[r.randint(1, len(s)):]
    if r.random() < 0.1 and len(s) < 3: s = [r.choice([1, 2])] + s
    s = tuple(s)
    try:
      if math.prod(np.broadcast_shapes(s, shape)) > self.maxn: s = shape
    except ValueError: s = shape
    if r.random() < 0.15 and self.flavor != "const": return self.const_input(s, dt)
    return self.input(s, dt or self.rdt())

  # *** elementwise ***

  def binary_core(self, op: str, a: np.ndarray, ea: np.ndarray, b: np.ndarray, eb: np.ndarray, R: str):
    """op on a, b (already of dtype R and broadcastable): (ref, err, result dtype)."""
    with np.errstate(all="ignore"):
      if R == "bool":
        if op in ("+", "|", "maximum"): return np.logical_or(a, b), None, "bool"
        if op in ("*", "&", "minimum"): return np.logical_and(a, b), None, "bool"
        if op == "^": return np.logical_xor(a, b), None, "bool"
        # tinygrad: - and ** are a or not b; // and % compute in float32
        if op in ("-", "**"): return np.logical_or(a, np.logical_not(b)), None, "bool"
        if op in ("//", "%"):
          fa, fb = a.astype("float32"), b.astype("float32")
          return self.binary_core(op, fa, zeros_err(fa.shape), fb, zeros_err(fb.shape), "float32")
        raise Reject("bool op")
      if is_i(R):
        if op == "+": return np.add(a, b), None, R
        if op == "-": return np.subtract(a, b), None, R
        if op == "*": return np.multiply(a, b), None, R
        if op in ("//", "%"):
          if (b == 0).any(): raise Reject("int division by zero")
          if not is_u(R) and ((a == np.iinfo(R).min) & (b == -1)).any(): raise Reject("INT_MIN // -1")
          return (np.floor_divide if op == "//" else np.remainder)(a, b), None, R
        if op == "**":
          if (b < 0).any() or (b > 6).any(): raise Reject("int power exponent")
          return np.power(a, b), None, R
        if op in ("&", "|", "^"): return {"&": np.bitwise_and, "|": np.bitwise_or, "^": np.bitwise_xor}[op](a, b), None, R
        if op in ("<<", ">>"):
          if (b < 0).any() or (b >= BITS[R]).any(): raise Reject("shift amount")
          return (np.left_shift if op == "<<" else np.right_shift)(a, b), None, R
        if op == "maximum": return np.maximum(a, b), None, R
        if op == "minimum": return np.minimum(a, b), None, R
        raise Reject(op)
      # floats
      if op in ("&", "|", "^", "<<", ">>"): raise Reject("bitwise float")
      x, y = f64(a), f64(b)
      ex = ea if ea is not None else 0.0
      ey = eb if eb is not None else 0.0
      special = not (np.isfinite(x).all() and np.isfinite(y).all())
      if op in ("maximum", "minimum"):
        ref = (np.maximum if op == "maximum" else np.minimum)(a, b)
        return ref, np.maximum(ex, ey) * np.ones(ref.shape), R
      if special: raise Reject("arithmetic on non-finite")
      eps = EPS[R]
      if op in ("+", "-", "*"):
        f = {"+": np.add, "-": np.subtract, "*": np.multiply}[op]
        ref = f(a, b)
        err = corners(f, x, ex, y, ey) + 2 * eps * np.abs(f64(ref)) + (2 * eps * np.abs(x) * np.abs(y) if op == "*" else 0)
      elif op in ("/", "//", "%"):
        if (np.abs(y) - ey <= 0.05).any(): raise Reject("divisor near 0")
        q = f64((a / b))
        eq = corners(np.divide, x, ex, y, ey) + 4 * eps * np.abs(q)
        if op == "/":
          ref, err = a / b, eq
        else:
          fl = np.floor(q)
          if (np.floor(q - eq) != np.floor(q + eq)).any(): raise Reject("quotient near an integer")
          if op == "//": ref, err = np.floor(a / b), zeros_err(q.shape)
          else:
            ref = np.remainder(a, b)
            err = ex + np.abs(fl) * ey + 4 * eps * (np.abs(x) + np.abs(fl * y))
      elif op == "**":
        if (x - ex > 0.05).all():
          ref = np.power(a, b)
          lg = np.abs(y * np.log2(x))
          err = corners(np.power, x, ex, y, ey) + (4 + 2 * lg) * eps * np.abs(f64(ref))
        elif (ey == 0).all() and np.isin(y, [0.0, 1.0, 2.0, 3.0]).all():
          ref = np.power(a, b)
          err = (np.abs(x) + ex) ** y - np.abs(x) ** y + 8 * eps * np.abs(f64(ref))
        else: raise Reject("pow domain")
      else: raise Reject(op)
      bounded(np.asarray(ref), np.asarray(err), R)
      return ref, err, R

  def op_binary(self) -> None:
    r = self.r
    op = r.choice(["+", "-", "*", "/", "//", "%", "**", "&", "|", "^", "<<", ">>", "maximum", "minimum", "+", "*", "-"])
    a = self.pick()
    form = r.choices(["tensor", "scalar", "rscalar", "list"], [60, 22, 12, 6])[0]
    if form == "tensor":
      b = self.operand(a.shape)
      R = promote(a.dt, b.dt)
      A, EA = cast_mirror(a.ref, a.err, a.dt, R)
      B, EB = cast_mirror(b.ref, b.err, b.dt, R)
      bname = b.name
      reads = a.reads | b.reads
    elif form == "list":
      if a.ref.ndim == 0 or a.shape[-1] == 0: raise Reject("list operand")
      row = self.values(r.choice(["int32", "float32", "bool"]), a.shape[-1])
      row = [float(x) if isinstance(x, float) else x for x in row]
      ldt = list_dtype(row)
      if ldt == "float32" and any(not math.isfinite(x) for x in row): raise Reject("list special")
      R = promote(a.dt, ldt)
      A, EA = cast_mirror(a.ref, a.err, a.dt, R)
      B, EB = cast_mirror(np.array(row, dtype=ldt), None if ldt != "float32" else zeros_err(len(row)), ldt, R)
      bname, reads = lit(row), a.reads
      if r.random() < 0.4:   # a numpy array keeps its dtype
        ndt = r.choice(["int8", "uint8", "int16", "float16", "float64", "bool", ldt])
        if ldt == "float32" and ndt not in FLOATS: raise Reject("float list to int")
        try: arr = np.array(row, dtype=ndt)
        except (OverflowError, ValueError): raise Reject("list does not fit")
        if not np.array_equal(f64(arr), np.array(row, dtype=np.float64)) and ndt not in FLOATS: raise Reject("lossy")
        R = promote(a.dt, ndt)
        A, EA = cast_mirror(a.ref, a.err, a.dt, R)
        B, EB = cast_mirror(arr, zeros_err(arr.shape) if is_f(ndt) else None, ndt, R)
        bname = f"np.array({lit(row)}, dtype={ndt!r})"
    else:
      s = self.scalar_for(a.dt if r.random() < 0.7 else r.choice(["bool", "int32", "float32"]))
      R = weak(a.dt, s)
      if not fits(s, R): raise Reject("scalar does not fit")
      if op == "**" and is_i(R) and form == "scalar" and isinstance(s, int) and s < 0: raise Reject("negative int power")
      A, EA = cast_mirror(a.ref, a.err, a.dt, R)
      B, EB = scalar_arr(s, R), (zeros_err(()) if is_f(R) else None)
      bname, reads = repr(s), a.reads
    if op == "-" and R == "bool": raise Reject("bool minus")
    if op in ("<<", ">>") and (R == "bool" or is_f(R)): raise Reject("shift")
    if op in ("&", "|", "^") and is_f(R): raise Reject("bitwise float")
    if op == "/":
      FR = R if is_f(R) else "float32"
      A, EA = cast_mirror(A, EA, R, FR)
      B, EB = cast_mirror(B, EB, R, FR)
      R = FR
    if form == "rscalar":
      ref, err, odt = self.binary_core(op, B, EB, A, EA, R)
    else:
      ref, err, odt = self.binary_core(op, A, EA, B, EB, R)
    ref = np.asarray(ref).astype(odt)
    name = self.fresh()
    if op in ("maximum", "minimum"):
      if form == "rscalar": raise Reject("reverse method")
      self.emit(f"{name} = {a.name}.{op}({bname})")
    elif form == "rscalar": self.emit(f"{name} = {'(' + bname + ')' if bname.startswith('-') else bname} {op} {a.name}")
    else: self.emit(f"{name} = {a.name} {op} {bname}")
    self.add(Val(name, ref, odt, err, reads=reads, tag=f"binary{op}"))

  def op_compare(self) -> None:
    r = self.r
    op = r.choice(["<", "<=", ">", ">=", "==", "!="])
    a = self.pick()
    if r.random() < 0.65:
      b = self.operand(a.shape)
      R = promote(a.dt, b.dt)
      bname, reads = b.name, a.reads | b.reads
      B, EB = cast_mirror(b.ref, b.err, b.dt, R)
    else:
      s = self.scalar_for(a.dt if r.random() < 0.8 else "float32")
      R = weak(a.dt, s)
      if not fits(s, R): raise Reject("scalar does not fit")
      bname, reads = repr(s), a.reads
      B, EB = scalar_arr(s, R), None
    A, EA = cast_mirror(a.ref, a.err, a.dt, R)
    f = {"<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal, "==": np.equal, "!=": np.not_equal}[op]
    ref = f(A, B)
    if is_f(R):
      ea = EA if EA is not None else 0.0
      eb = EB if EB is not None else 0.0
      with np.errstate(all="ignore"):
        tot = ea + eb
        ok = (np.broadcast_to(tot, ref.shape) == 0) | (np.abs(f64(A) - f64(B)) > 2 * tot)
      if not np.all(ok): raise Reject("comparison too close")
    name = self.fresh()
    if r.random() < 0.15 and bname[0].isdigit():
      flipped = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "==", "!=": "!="}[op]
      self.emit(f"{name} = {bname} {flipped} {a.name}")
    else: self.emit(f"{name} = {a.name} {op} {bname}")
    self.add(Val(name, ref, "bool", reads=reads, tag=f"cmp{op}"))

  def as_bool(self, v: Val) -> np.ndarray:
    return cast_mirror(v.ref, v.err, v.dt, "bool")[0]

  def op_where(self) -> None:
    r = self.r
    c = self.pick()
    cond = self.as_bool(c)
    xs, ys = r.random() < 0.3, r.random() < 0.3
    shape = c.shape
    parts, reads = [], set(c.reads)
    for is_s in (xs, ys):
      if is_s:
        parts.append(("s", r.choice([True, False, 0, 1, -3, 2, 0.5, -1.5, 2.0])))
      else:
        t = self.operand(shape)
        shape = np.broadcast_shapes(shape, t.shape)
        parts.append(("t", t))
        reads |= t.reads
    (kx, x), (ky, y) = parts
    if kx == "s" and ky == "s":
      dt = "float32" if isinstance(x, float) or isinstance(y, float) else "bool" if isinstance(x, bool) and isinstance(y, bool) else "int32"
    elif kx == "t" and ky == "t": dt = promote(x.dt, y.dt)
    elif kx == "t": dt = weak(x.dt, y)
    else: dt = weak(y.dt, x)
    vals = []
    for k, v in parts:
      if k == "s":
        if not fits(v, dt): raise Reject("where scalar")
        vals.append((scalar_arr(v, dt), zeros_err(()) if is_f(dt) else None))
      else: vals.append(cast_mirror(v.ref, v.err, v.dt, dt))
    (X, EX), (Y, EY) = vals
    cb = np.broadcast_to(cond, shape)
    ref = np.where(cb, np.broadcast_to(X, shape), np.broadcast_to(Y, shape)).astype(dt)
    err = None if not is_f(dt) else np.where(cb, np.broadcast_to(EX, shape), np.broadcast_to(EY, shape))
    name = self.fresh()
    xn = repr(x) if kx == "s" else x.name
    yn = repr(y) if ky == "s" else y.name
    self.emit(f"{name} = {c.name}.where({xn}, {yn})")
    self.add(Val(name, ref, dt, err, reads=reads, tag="where"))

  def op_unary(self) -> None:
    r = self.r
    a = self.pick()
    op = r.choice(["neg", "abs", "relu", "square", "invert", "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "reciprocal",
                   "sin", "cos", "tanh", "sigmoid", "trunc", "floor", "ceil", "clip", "pos", "neg", "abs", "exp", "sigmoid"])
    dt, x, e = a.dt, a.ref, a.E()
    name = self.fresh()
    alias = False
    with np.errstate(all="ignore"):
      if op in ("neg", "abs", "relu", "square", "invert", "pos", "trunc", "floor", "ceil", "clip"):
        if a.special and op in ("square",): raise Reject("special")
        if op == "neg":
          ref, err, odt = (np.logical_not(x) if dt == "bool" else np.negative(x)), a.err, dt   # tinygrad: -bool is not
          code = r.choice([f"-{a.name}", f"{a.name}.__neg__()"])
        elif op == "abs":
          if dt == "bool" or is_u(dt): alias = True
          ref, err, odt = np.abs(x), a.err, dt
          code = r.choice([f"{a.name}.abs()", f"abs({a.name})"])
        elif op == "relu":
          if dt == "bool": ref, odt = x.astype("int32"), "int32"   # tinygrad: relu of bool is int32
          else: ref, odt = np.maximum(x, np.zeros((), dtype=dt)), dt
          err, code = a.err, f"{a.name}.relu()"
        elif op == "square":
          if dt == "bool": ref, err, odt = x, None, "bool"   # tinygrad: bool * bool is and
          elif is_i(dt): ref, err, odt = x * x, None, dt
          else:
            ref = x * x
            xx = f64(x)
            err, odt = 2 * np.abs(xx) * e + e * e + 2 * EPS[dt] * np.abs(f64(ref)), dt
            bounded(ref, err, dt)
          code = f"{a.name}.square()"
        elif op == "invert":
          if is_f(dt): raise Reject("invert float")
          ref, err, odt, code = np.invert(x), None, dt, f"~{a.name}"
        elif op == "pos":
          alias = True
          ref, err, odt, code = x, a.err, dt, f"+{a.name}"
        elif op in ("trunc", "floor", "ceil"):
          f = {"trunc": np.trunc, "floor": np.floor, "ceil": np.ceil}[op]
          if dt == "bool" and op != "trunc": ref, err = x.astype("int32"), None   # tinygrad: floor/ceil of bool is int32
          elif not is_f(dt): alias = True; ref, err = x, None
          else:
            xx = f64(x)
            fin = np.isfinite(xx)
            if (f(np.where(fin, xx - e, 0)) != f(np.where(fin, xx + e, 0))).any(): raise Reject("rounding near an integer")
            ref, err = f(x), None
          odt, code = ("int32" if dt == "bool" and op != "trunc" else dt), f"{a.name}.{op}()"
        else:  # clip
          lo = None if r.random() < 0.3 else self.scalar_for(dt)
          hi = None if (lo is None or r.random() < 0.7) else self.scalar_for(dt)
          if lo is None and hi is None: hi = self.scalar_for(dt)
          ref, err, odt = x, a.err, dt
          for op2, bound in (("maximum", lo), ("minimum", hi)):
            if bound is None: continue
            R = weak(odt, bound)
            if not fits(bound, R): raise Reject("clip bound")
            X, EX = cast_mirror(ref, err, odt, R)
            ref, err, odt = self.binary_core(op2, X, EX, scalar_arr(bound, R), zeros_err(()) if is_f(R) else None, R)
          args = ", ".join(x for x in ([repr(lo)] if lo is not None else []) + ([f"max_={hi!r}" if lo is None else repr(hi)] if hi is not None else []))
          code = f"{a.name}.clip({args})"
        ref = np.asarray(ref).astype(odt)
      else:
        if a.special: raise Reject("transcendental of non-finite")
        work = "float32" if dt in ("float16",) or not is_f(dt) else dt
        out = "float16" if dt == "float16" else work
        X = x.astype(work)
        xx = f64(X)
        ew = np.broadcast_to(cast_mirror(x, a.err, dt, work)[1] if is_f(dt) else zeros_err(x.shape), x.shape)
        eps = EPS[work]
        fns = {"exp": np.exp, "exp2": np.exp2, "log": np.log, "log2": np.log2, "sqrt": np.sqrt, "rsqrt": lambda v: 1 / np.sqrt(v),
               "reciprocal": lambda v: 1 / v, "sin": np.sin, "cos": np.cos, "tanh": np.tanh, "sigmoid": lambda v: 1 / (1 + np.exp(-v))}
        f = fns[op]
        if op in ("exp", "exp2"):
          if x.size and (xx + ew).max() > math.log(LIMIT[out]) / (1 if op == "exp" else math.log(2)): raise Reject("exp overflow")
          rnd = (4 + 2 * np.abs(xx)) * eps
        elif op in ("log", "log2"):
          if (xx - ew <= 0.01).any(): raise Reject("log domain")
          rnd = 4 * eps
        elif op == "sqrt":
          if not ((xx - ew >= 0) | ((ew == 0) & (xx >= 0))).all(): raise Reject("sqrt domain")
          rnd = 4 * eps
        elif op in ("rsqrt",):
          if (xx - ew <= 0.02).any(): raise Reject("rsqrt domain")
          rnd = 4 * eps
        elif op == "reciprocal":
          if (np.abs(xx) - ew <= 0.02).any(): raise Reject("reciprocal near 0")
          rnd = 4 * eps
        elif op in ("sin", "cos"):
          if (np.abs(xx) > 20).any(): raise Reject("sin range")
          rnd = 0
        else:
          if (np.abs(xx) > 40).any(): raise Reject("range")
          rnd = 0
        ref = f(X).astype(out)
        r64 = f(xx)
        if op in ("sin", "cos"): err = ew + 4 * eps * (1 + np.abs(xx))
        elif op in ("tanh", "sigmoid"): err = ew + 8 * eps * (1 + np.abs(r64))
        else:
          lo, hi = np.maximum(xx - ew, 0) if op == "sqrt" else xx - ew, xx + ew
          err = np.maximum(np.abs(f(hi) - r64), np.abs(f(lo) - r64)) + rnd * np.abs(r64) + (4 * eps if op in ("log", "log2") else 0)
        if out != work: err = err + EPS[out] * np.abs(r64)
        err = err + TINY[out]
        bounded(ref, err, out)
        odt = out
        code = f"{a.name}.{op}()"
    if alias:   # the same Tensor object as a
      v = self.view_of(a, name, ref, err, a.view, op)
      v.alias_of = a.alias_of or a
    else: v = Val(name, ref, odt, err, reads=a.reads, tag=op)
    self.emit(f"{name} = {code}")
    self.add(v)

  def op_cast(self) -> None:
    r = self.r
    a = self.pick()
    dst = r.choice(ALL)
    if (a.dt, dst) in self.skip: raise Reject("skipped cast")
    ref, err = cast_mirror(a.ref, a.err, a.dt, dst)
    name = self.fresh()
    same = dst == a.dt   # UOp.cast to its own dtype is the same graph: the result shares a's storage
    short = {"float32": "float", "float16": "half", "float64": "double", "int32": "int", "int64": "long", "bool": "bool"}
    m = r.random()
    if dst in short and m < 0.25: code = f"{a.name}.{short[dst]}()"
    elif m < 0.45: code = f"{a.name}.cast(dtypes.{dst})"
    elif m < 0.55: code = f"{a.name}.cast(np.{dst})"
    elif m < 0.62: code = f"Tensor({a.name}, dtype={dst!r})"
    else: code = f"{a.name}.cast({dst!r})"
    self.emit(f"{name} = {code}")
    tag = f"cast:{a.dt}->{dst}"
    self.add(self.view_of(a, name, ref, err, a.view, tag) if same else Val(name, ref, dst, err, reads=a.reads, tag=tag))

  def op_bitcast(self) -> None:
    r = self.r
    a = self.pick(lambda v: v.dt != "bool")
    same = [d for d in ALL if d != "bool" and d != a.dt and np.dtype(d).itemsize == np.dtype(a.dt).itemsize]
    if not same: raise Reject("no bitcast")
    dst = r.choice(same)
    if is_f(a.dt):
      x = f64(a.ref)
      if not a.exact or not np.isfinite(x).all() or (x == 0).any(): raise Reject("bitcast of an inexact float")
    ref = a.ref.view(dst)
    if is_f(dst):
      y = f64(ref)
      tiny = np.finfo(dst).tiny
      if not np.isfinite(y).all() or (np.abs(y) < tiny).any() or (np.abs(y) > LIMIT[dst]).any(): raise Reject("bitcast to odd floats")
    name = self.fresh()
    self.emit(f"{name} = {a.name}.bitcast({r.choice([repr(dst), 'dtypes.' + dst])})")
    self.add(Val(name, ref, dst, None, reads=a.reads, tag=f"bitcast:{a.dt}->{dst}"))

  # *** reductions ***

  def axis_arg(self, nd: int, multi: bool = True):
    r = self.r
    m = r.random()
    if nd == 0 or m < 0.25: return None
    if m < 0.7 or not multi:
      ax = r.randrange(nd)
      return ax - nd if r.random() < 0.3 else ax
    k = r.randint(1, nd)
    axes = r.sample(range(nd), k)
    return tuple(a - nd if r.random() < 0.2 else a for a in axes)

  @staticmethod
  def norm_axes(axis, nd) -> tuple:
    if axis is None: return tuple(range(nd))
    axes = axis if isinstance(axis, tuple) else (axis,)
    return tuple(sorted(a % nd for a in axes))

  def op_reduce(self) -> None:
    r = self.r
    a = self.pick()
    kind = r.choice(["sum", "sum", "max", "min", "mean", "prod", "any", "all", "argmax", "argmin", "var", "std", "sum_dtype"])
    nd = a.ref.ndim
    axis = self.axis_arg(nd, multi=kind not in ("argmax", "argmin"))
    keep = r.random() < 0.35
    ax = self.norm_axes(axis, nd)
    n = math.prod(a.shape[i] for i in ax)
    x, e = a.ref, a.E()
    args = [] if axis is None and r.random() < 0.5 else [f"axis={axis!r}" if r.random() < 0.5 else repr(axis)]
    if keep: args.append("keepdim=True")
    method = "sum" if kind == "sum_dtype" else kind
    with np.errstate(all="ignore"):
      if kind in ("sum", "prod", "sum_dtype"):
        if kind == "sum_dtype":
          R = r.choice(["int32", "int64", "float32", "float64", "uint32", "float16", "int8", "bool"])
          args.append(f"dtype={R!r}")
          kind = "sum"
        else: R = sum_dtype(a.dt) if kind == "sum" else a.dt   # tinygrad: prod keeps the dtype
        X, EX = cast_mirror(x, a.err, a.dt, R)
        if is_f(R) and not np.isfinite(f64(X)).all(): raise Reject("reduce of non-finite")
        err = None
        if R == "bool":
          ref = (np.any if kind == "sum" else np.all)(X, axis=ax, keepdims=keep)
        elif kind == "sum":
          ref = np.sum(X, axis=ax, keepdims=keep, dtype=R)
          if is_f(R):
            xa = np.abs(f64(X))
            err = np.sum(EX, axis=ax, keepdims=keep) + (n + 2) * EPS[R] * np.sum(xa, axis=ax, keepdims=keep)
        else:
          if n > 8 and is_f(R): raise Reject("long float prod")
          ref = np.prod(X, axis=ax, keepdims=keep, dtype=R)
          if is_f(R):
            xa = np.abs(f64(X))
            err = np.prod(xa + EX, axis=ax, keepdims=keep) * (1 + (n + 2) * EPS[R]) - np.prod(xa, axis=ax, keepdims=keep)
        odt = R
        ref = np.asarray(ref).astype(R)
        if is_f(R): bounded(ref, err, R)
      elif kind in ("max", "min"):
        if n == 0: raise Reject("max of empty")
        ref = (np.max if kind == "max" else np.min)(x, axis=ax, keepdims=keep)
        odt = a.dt
        err = np.max(e, axis=ax, keepdims=keep) if is_f(a.dt) else None
      elif kind in ("any", "all"):
        b = self.as_bool(a)
        ref = (np.any if kind == "any" else np.all)(b, axis=ax, keepdims=keep)
        odt, err = "bool", None
      elif kind in ("mean", "var", "std"):
        if a.special: raise Reject("mean of non-finite")
        if n == 0: raise Reject("mean of empty")   # 0 / 0: NaN in numpy too, but keep programs finite
        work = "float32" if a.dt == "float16" or not is_f(a.dt) else a.dt
        out = "float16" if a.dt == "float16" else work
        X, EX = cast_mirror(x, a.err, a.dt, work)
        xx = f64(X)
        if xx.size and np.abs(xx).max() > LIMIT[work]: raise Reject("intermediates may overflow")
        ex = EX if EX is not None else zeros_err(x.shape)
        eps = EPS[work]
        if kind == "mean":
          ref64 = np.sum(xx, axis=ax, keepdims=keep) / n
          err = (np.sum(ex, axis=ax, keepdims=keep) + (n + 3) * eps * np.sum(np.abs(xx), axis=ax, keepdims=keep)) / n
        else:
          ddof = r.choice([0, 0, 1])
          if n - ddof <= 0: raise Reject("var of too few")
          args.append(r.choice([f"ddof={ddof}", f"correction={ddof}"]))   # tinygrad's default correction is 1
          mu = np.mean(xx, axis=ax, keepdims=True)
          d = xx - mu
          var = np.sum(d * d, axis=ax, keepdims=keep) / (n - ddof)
          delta = 2 * np.max(ex, axis=ax, keepdims=True) + (n + 3) * eps * np.max(np.abs(xx), axis=ax, keepdims=True)
          dv = (np.sum(2 * np.abs(d) * delta + delta * delta, axis=ax, keepdims=keep)
                + 2 * (n + 4) * eps * np.sum(d * d, axis=ax, keepdims=keep)) / (n - ddof)
          if kind == "var": ref64, err = var, dv
          else:
            ref64 = np.sqrt(var)
            err = np.sqrt(var + dv) - np.sqrt(np.maximum(var - dv, 0)) + 4 * eps * ref64
        ref = np.asarray(ref64).astype(work).astype(out)
        err = err + EPS[out] * np.abs(ref64) + TINY[out]
        odt = out
        bounded(ref, err, out)
      else:  # argmax / argmin
        if a.numel == 0 and axis is None: raise Reject("arg of empty")
        if axis is not None and a.shape[axis % nd] == 0: raise Reject("arg of empty")
        if is_f(a.dt): self.check_arg_robust(f64(x) if kind == "argmax" else -f64(x), e, axis)
        ref = (np.argmax if kind == "argmax" else np.argmin)(x, axis=axis, keepdims=keep).astype("int32")
        odt, err = "int32", None
    name = self.fresh()
    self.emit(f"{name} = {a.name}.{method}({', '.join(args)})")
    ref = np.asarray(ref).astype(odt)
    if not ax and odt == a.dt and kind in ("sum", "prod", "max", "any"):   # nothing reduced: the same graph as a
      self.add(self.view_of(a, name, ref, err, a.view, kind))
    else: self.add(Val(name, ref, odt, err, reads=a.reads, tag=kind))

  def check_arg_robust(self, y: np.ndarray, e: np.ndarray, axis) -> None:
    """argmax of y is the same for every y' within e of y (or exact ties, or a NaN, decide it)."""
    if axis is None: ys, es = y.reshape(1, -1), e.reshape(1, -1)
    else:
      ys = np.moveaxis(y, axis, -1).reshape(-1, y.shape[axis])
      es = np.moveaxis(e, axis, -1).reshape(-1, y.shape[axis])
    for row, er in zip(ys, es):
      if np.isnan(row).any() or row.size == 0: continue
      cand = row + er >= np.max(row - er)
      if cand.sum() == 1: continue
      if (er[cand] == 0).all() and (row[cand] == row[cand].max()).all(): continue
      raise Reject("argmax near a tie")

  def op_softmax(self) -> None:
    r = self.r
    a = self.pick(lambda v: v.ref.ndim > 0 and not v.special)
    kind = r.choice(["softmax", "log_softmax", "layernorm"])
    nd = a.ref.ndim
    axis = r.randrange(-nd, nd) if r.random() < 0.6 else -1
    ax = axis % nd
    n = a.shape[ax]
    work = "float32" if a.dt == "float16" or not is_f(a.dt) else a.dt
    out = "float16" if a.dt == "float16" else work
    X, EX = cast_mirror(a.ref, a.err, a.dt, work)
    xx = f64(X)
    if xx.size and np.abs(xx).max() > LIMIT[work]: raise Reject("intermediates may overflow")
    ex = EX if EX is not None else zeros_err(X.shape)
    eps = EPS[work]
    name = self.fresh()
    with np.errstate(all="ignore"):
      if n == 0:
        if kind == "layernorm": raise Reject("layernorm of empty")
        ref64, err = xx.copy(), zeros_err(xx.shape)
      elif kind in ("softmax", "log_softmax"):
        m = np.max(xx, axis=ax, keepdims=True)
        s = xx - m
        z = np.sum(np.exp(s), axis=ax, keepdims=True)
        dm = 2 * np.max(ex, axis=ax, keepdims=True)
        if kind == "softmax":
          ref64 = np.exp(s) / z
          err = dm * 2 + (n + 8) * eps * (ref64 + 1e-3) * (1 + np.abs(s)) + (n + 8) * eps * ref64
        else:
          ref64 = s - np.log(z)
          err = dm * 2 + (n + 8) * eps * (np.abs(ref64) + np.abs(s) + 1)
      else:
        mu = np.mean(xx, axis=ax, keepdims=True)
        d = xx - mu
        var = np.mean(d * d, axis=ax, keepdims=True)
        if (var < 0.05).any(): raise Reject("layernorm of near-constant")
        rs = 1 / np.sqrt(var + 1e-5)
        ref64 = d * rs
        delta = 2 * np.max(ex, axis=ax, keepdims=True) + (n + 3) * eps * np.max(np.abs(xx), axis=ax, keepdims=True)
        dv = np.mean(2 * np.abs(d) * delta + delta * delta, axis=ax, keepdims=True) + (n + 4) * eps * var * 2
        # the variance's error bound as large as half the variance itself: the bound below no longer holds (its
        # denominator reaches 0 and then turns negative, a negative tolerance)
        if (dv >= (var + 1e-5) / 2).any(): raise Reject("layernorm whose variance its inputs' error swamps")
        err = (delta + np.abs(d) * dv / (2 * (var + 1e-5) - 2 * dv)) * rs * 1.5 + (n + 8) * eps * (np.abs(ref64) + 1)
    ref = ref64.astype(work).astype(out)
    err = err + EPS[out] * np.abs(ref64) + TINY[out]
    bounded(ref, err, out)
    if kind == "layernorm": code = f"{a.name}.layernorm({'' if axis == -1 and r.random() < 0.5 else f'axis={axis}'})"
    else: code = f"{a.name}.{kind}({'' if axis == -1 and r.random() < 0.5 else axis})"
    self.emit(f"{name} = {code}")
    self.add(Val(name, ref, out, err, reads=a.reads, tag=kind))

  def op_matmul(self) -> None:
    r = self.r
    a = self.pick(lambda v: v.ref.ndim >= 1 and not v.special and v.ref.ndim <= 3)
    sa = a.shape
    k = sa[-1]
    form = r.choice(["1d", "2d", "2d", "batch"])
    m3 = (lambda: r.choice([4, 8, 16, 32, 5])) if self.flavor == "big" else (lambda: r.randint(1, 3))
    if a.ref.ndim == 1: bshape = r.choice([(k,), (k, m3())])
    elif form == "batch" and a.ref.ndim == 2: bshape = (r.randint(1, 2), k, m3())
    elif form == "1d": bshape = (k,)
    else: bshape = (k, r.randint(0, 3) if r.random() < 0.1 else m3())
    if a.ref.ndim == 3 and r.random() < 0.4: bshape = (r.choice([1, sa[0]]), k, m3())
    b = None
    for _ in range(3):
      try:
        b = self.pick(lambda v: v.shape == bshape and not v.special)
        break
      except Reject: pass
    if b is None: b = self.input(bshape, self.rdt() if r.random() < 0.5 else a.dt)
    R = promote(a.dt, b.dt)
    A, EA = cast_mirror(a.ref, a.err, a.dt, R)
    B, EB = cast_mirror(b.ref, b.err, b.dt, R)
    with np.errstate(all="ignore"):
      ref = np.matmul(A, B)
      err = None
      if is_f(R):
        aa, bb = np.abs(f64(A)), np.abs(f64(B))
        err = np.matmul(aa + EA, bb + EB) - np.matmul(aa, bb) + (k + 2) * EPS[R] * np.matmul(aa, bb) + TINY[R]
        bounded(ref, err, R)
    name = self.fresh()
    code = r.choice([f"{a.name} @ {b.name}", f"{a.name}.matmul({b.name})", f"{a.name}.dot({b.name})"])
    self.emit(f"{name} = {code}")
    self.add(Val(name, np.asarray(ref).astype(R), R, err, reads=a.reads | b.reads, tag="matmul"))

  def windows(self, xp: np.ndarray, k: tuple, st: tuple, dl: tuple) -> np.ndarray:
    """(..., H, W) -> (..., Oh, Ow, kh, kw): the kernel windows (im2col) of the last two axes."""
    H, W = xp.shape[-2:]
    oh = (H - dl[0] * (k[0] - 1) - 1) // st[0] + 1
    ow = (W - dl[1] * (k[1] - 1) - 1) // st[1] + 1
    rows = np.arange(oh)[:, None] * st[0] + np.arange(k[0])[None, :] * dl[0]
    cols = np.arange(ow)[:, None] * st[1] + np.arange(k[1])[None, :] * dl[1]
    return xp[..., rows[:, None, :, None], cols[None, :, None, :]]

  def op_conv(self) -> None:
    """conv2d of NCHW input with OIHW weights (groups, stride, padding, dilation, bias)."""
    r = self.r
    N, G = r.choice([1, 1, 2]), r.choice([1, 1, 2])
    Cg, Og = r.choice([1, 2]), r.choice([1, 2])
    H, W = r.randint(1, 4), r.randint(1, 4)
    if self.flavor == "big": Cg, Og, H, W = r.choice([1, 4, 8]), r.choice([4, 8, 16]), r.choice([8, 16, 17]), r.choice([8, 16, 32])
    kh, kw = r.randint(1, 3), r.randint(1, 3)
    st, dl = (r.choice([1, 1, 2]), r.choice([1, 1, 2])), (r.choice([1, 1, 2]), 1)
    pd = (r.choice([0, 0, 1]), r.choice([0, 1]))
    if H + 2 * pd[0] < (kh - 1) * dl[0] + 1 or W + 2 * pd[1] < (kw - 1) * dl[1] + 1: raise Reject("kernel too big")
    C, O = Cg * G, Og * G
    xs = (N, C, H, W)
    try: x = self.pick(lambda v: v.shape == xs and not v.special)
    except Reject: x = self.input(xs, self.rdt())
    w = self.input((O, Cg, kh, kw), x.dt if r.random() < 0.5 else self.rdt())
    R_ = promote(x.dt, w.dt)
    X, EX = cast_mirror(x.ref, x.err, x.dt, R_)
    Wt, EW = cast_mirror(w.ref, w.err, w.dt, R_)
    pads = ((0, 0), (0, 0), (pd[0], pd[0]), (pd[1], pd[1]))
    def conv(xa, wa, kind):
      xw = self.windows(np.pad(xa, pads), (kh, kw), st, dl)          # N C Oh Ow kh kw
      oh, ow = xw.shape[2], xw.shape[3]
      xw = xw.reshape(N, G, 1, Cg, oh, ow, kh, kw)
      wb = wa.reshape(1, G, Og, Cg, 1, 1, kh, kw)
      if kind == "bool": out = np.any(np.logical_and(xw, wb), axis=(3, 6, 7))
      else: out = np.sum(xw * wb, axis=(3, 6, 7), dtype=kind)
      return out.reshape(N, O, oh, ow)
    with np.errstate(all="ignore"):
      if R_ == "bool": ref, err = conv(X, Wt, "bool"), None
      elif is_i(R_): ref, err = conv(X, Wt, R_), None
      else:
        ax, aw = np.abs(f64(X)), np.abs(f64(Wt))
        ref = conv(X, Wt, R_)
        k = Cg * kh * kw
        err = conv(ax + EX, aw + EW, "float64") - conv(ax, aw, "float64") + (k + 2) * EPS[R_] * conv(ax, aw, "float64") + TINY[R_]
        bounded(ref, err, R_)
    args = [w.name]
    reads = x.reads | w.reads
    if r.random() < 0.3:
      b = self.input((O,), r.choice([R_, self.rdt()]))
      R2 = promote(R_, b.dt)
      A, EA = cast_mirror(ref, err, R_, R2)
      B, EB = cast_mirror(b.ref.reshape(1, O, 1, 1), None if b.err is None else b.err.reshape(1, O, 1, 1), b.dt, R2)
      ref, err, R_ = self.binary_core("+", A, EA, B, EB, R2)
      args.append(f"bias={b.name}" if r.random() < 0.5 else b.name)
      reads = reads | b.reads
    if st != (1, 1): args.append(f"stride={st if st[0] != st[1] else st[0]!r}")
    if pd != (0, 0): args.append(f"padding={pd if pd[0] != pd[1] else pd[0]!r}")
    if dl != (1, 1): args.append(f"dilation={dl!r}")
    if G != 1: args.append(f"groups={G}")
    name = self.fresh()
    self.emit(f"{name} = {x.name}.conv2d({', '.join(args)})")
    self.add(Val(name, np.asarray(ref).astype(R_), R_, err, reads=reads, tag="conv2d"))

  def op_pool(self) -> None:
    r = self.r
    a = self.pick(lambda v: v.ref.ndim >= 2 and v.ref.ndim <= 4 and min(v.shape[-2:]) >= 1 and not (v.special and is_f(v.dt)))
    kind = r.choice(["max_pool2d", "avg_pool2d"])
    k = (r.randint(1, 3), r.randint(1, 3))
    st = None if r.random() < 0.5 else (r.randint(1, 2), r.randint(1, 2))
    pd = (r.choice([0, 0, 1]), r.choice([0, 1]))
    if pd[0] * 2 > k[0] or pd[1] * 2 > k[1]: pd = (0, 0)
    dl = (1, 1) if kind == "avg_pool2d" or r.random() < 0.7 else (r.choice([1, 2]), r.choice([1, 2]))
    H, W = a.shape[-2:]
    if H + 2 * pd[0] < (k[0] - 1) * dl[0] + 1 or W + 2 * pd[1] < (k[1] - 1) * dl[1] + 1: raise Reject("kernel too big")
    stt = k if st is None else st
    nd = a.ref.ndim
    pads = ((0, 0),) * (nd - 2) + ((pd[0], pd[0]), (pd[1], pd[1]))
    with np.errstate(all="ignore"):
      if kind == "max_pool2d":
        low = np.array(-np.inf if is_f(a.dt) else False if a.dt == "bool" else np.iinfo(a.dt).min, dtype=a.dt)
        xw = self.windows(np.pad(a.ref, pads, constant_values=low), k, stt, dl)
        ref = np.max(xw, axis=(-2, -1)) if xw.size else np.zeros(xw.shape[:-2], dtype=a.dt)
        err = None if a.err is None else np.max(self.windows(np.pad(a.E(), pads), k, stt, dl), axis=(-2, -1), initial=0.0)
        odt = a.dt
      else:
        work = "float32" if a.dt == "float16" or not is_f(a.dt) else a.dt
        odt = "float16" if a.dt == "float16" else work
        X, EX = cast_mirror(a.ref, a.err, a.dt, work)
        xx = f64(X)
        if xx.size and np.abs(xx).max() > LIMIT[work]: raise Reject("intermediates may overflow")
        n = k[0] * k[1]
        xw = self.windows(np.pad(xx, pads), k, stt, (1, 1))
        ref64 = np.sum(xw, axis=(-2, -1)) / n
        ew = self.windows(np.pad(EX if EX is not None else zeros_err(X.shape), pads), k, stt, (1, 1))
        err = (np.sum(ew, axis=(-2, -1)) + (n + 3) * EPS[work] * np.sum(np.abs(xw), axis=(-2, -1))) / n
        err = err + EPS[odt] * np.abs(ref64) + TINY[odt]
        ref = ref64.astype(work).astype(odt)
        bounded(ref, err, odt)
    args = [repr(k) if k[0] != k[1] or r.random() < 0.5 else str(k[0])]
    if st is not None: args.append(f"stride={st!r}")
    if pd != (0, 0): args.append(f"padding={pd!r}")
    if dl != (1, 1): args.append(f"dilation={dl!r}")
    name = self.fresh()
    self.emit(f"{name} = {a.name}.{kind}({', '.join(args)})")
    self.add(Val(name, np.asarray(ref).astype(odt), odt, err, reads=a.reads, tag=kind))

  # *** movement ***

  def moved(self, a: Val, name: str, code: str, f, tag: str, viewable: bool = True) -> Val:
    """A movement op: the same numpy function moves the value, the error and the buffer positions."""
    ref = np.asarray(f(a.ref)).astype(a.dt)
    err = None if a.err is None else np.asarray(f(a.err))
    view = np.asarray(f(a.view)) if (a.view is not None and viewable) else None
    self.emit(f"{name} = {code}")
    return self.add(self.view_of(a, name, ref, err, view, tag))

  def view_of(self, a: Val, name: str, ref, err, view, tag: str) -> Val:
    """A tensor whose storage (once realized) may be a's: a movement op of a, detach, the same object."""
    v = Val(name, ref, a.dt if ref.dtype.name == a.dt else ref.dtype.name, err, reads=a.reads, view=view,
            computed=a.computed, tag=tag, mroot=a.mroot, movement=True, base_assign=a.base_assign)
    v.msrc = a
    return v

  def op_reshape(self) -> None:
    r = self.r
    a = self.pick()
    n = a.numel
    dims = []
    rem = n
    nd = r.choice([0, 1, 2, 2, 3])
    if n == 0:
      dims = [r.choice([0, 1, 2]) for _ in range(max(nd, 1))]
      if 0 not in dims: dims[r.randrange(len(dims))] = 0
    else:
      for i in range(nd - 1):
        divs = [d for d in range(1, rem + 1) if rem % d == 0]
        d = r.choice(divs)
        dims.append(d); rem //= d
      if nd == 0:
        if n != 1: dims = [n]
      else: dims.append(rem)
    shape = tuple(dims)
    if math.prod(shape) != n: raise Reject("reshape")
    spell = list(shape)
    if shape and n > 0 and r.random() < 0.3: spell[r.randrange(len(spell))] = -1
    args = r.choice([", ".join(map(str, spell)), repr(tuple(spell))]) if spell else "()"
    name = self.fresh()
    self.moved(a, name, f"{a.name}.reshape({args})", lambda x: np.reshape(x, shape), "reshape")

  def op_permute(self) -> None:
    r = self.r
    a = self.pick(lambda v: v.ref.ndim >= 2 or self.r.random() < 0.2)
    nd = a.ref.ndim
    name = self.fresh()
    m = r.random()
    if m < 0.2:
      self.moved(a, name, f"{a.name}.T", lambda x: np.transpose(x), "T")
    elif m < 0.4 and nd >= 2:
      i, j = r.sample(range(nd), 2)
      self.moved(a, name, f"{a.name}.transpose({i}, {j - nd if r.random() < 0.3 else j})", lambda x: np.swapaxes(x, i, j), "transpose")
    else:
      order = list(range(nd)); r.shuffle(order)
      spell = [o - nd if r.random() < 0.2 else o for o in order]
      args = r.choice([", ".join(map(str, spell)), repr(tuple(spell))]) if spell else "()"
      self.moved(a, name, f"{a.name}.permute({args})", lambda x: np.transpose(x, order), "permute")

  def op_expand(self) -> None:
    r = self.r
    a = self.pick(lambda v: 1 in v.shape or v.ref.ndim < 3)
    s = [r.choice([1, 2, 3, 0] if r.random() < 0.1 else [1, 2, 3]) if d == 1 else d for d in a.shape]
    if r.random() < 0.4 and len(s) < 4: s = [r.randint(1, 3)] + s
    shape = tuple(s)
    if math.prod(shape) > self.maxn: raise Reject("too big")
    spell = [(-1 if (i >= len(shape) - a.ref.ndim and d == a.shape[i - len(shape) + a.ref.ndim] and r.random() < 0.3) else d)
             for i, d in enumerate(shape)]
    name = self.fresh()
    how = r.choice(["expand", "broadcast_to"])
    self.moved(a, name, f"{a.name}.{how}({', '.join(map(str, spell)) if spell else '()'})",
               lambda x: np.broadcast_to(x, shape), "expand", viewable=False)

  def op_pad(self) -> None:
    r = self.r
    a = self.pick(lambda v: v.ref.ndim >= 1)
    nd = a.ref.ndim
    pads = []
    for d in a.shape:
      if r.random() < 0.3: pads.append(None); continue
      b, e = r.randint(-1, 2), r.randint(-1, 2)
      if min(b, 0) + min(e, 0) + d < 0: b, e = 0, 0
      pads.append((b, e))
    value = 0 if r.random() < 0.5 else self.scalar_for(a.dt, "fill")
    if is_f(a.dt) and isinstance(value, float) and value == 0.0: value = 0
    pp = [(0, 0) if p is None else p for p in pads]
    if r.random() < 0.15:
      k = r.randint(0, 1)
      pp, pads = [(k, k)] * nd, k
    crop = tuple(slice(-min(b, 0), d + min(e, 0)) for (b, e), d in zip(pp, a.shape))
    pos = [(max(b, 0), max(e, 0)) for b, e in pp]
    fill = np.full((), value, dtype=a.dt)
    def f(x, fillv=None):
      y = x[crop]
      return np.pad(y, pos, constant_values=fillv)
    ref = f(a.ref, fill)
    err = None if a.err is None else f(a.err, 0.0)
    only_crop = all(p[0] == 0 and p[1] == 0 for p in pos)
    view = a.view[crop] if (a.view is not None and only_crop) else None
    name = self.fresh()
    args = repr(pads) if not isinstance(pads, int) else str(pads)
    self.emit(f"{name} = {a.name}.pad({args}{'' if value == 0 and r.random() < 0.6 else f', value={value!r}'})")
    self.add(self.view_of(a, name, ref, err, view, "pad"))

  def op_shrink(self) -> None:
    r = self.r
    a = self.pick(lambda v: v.ref.ndim >= 1)
    bounds = []
    for d in a.shape:
      if r.random() < 0.3: bounds.append(None); continue
      s = r.randint(0, d); e = r.randint(s, d)
      bounds.append((s, e))
    sl = tuple(slice(0, d) if b is None else slice(*b) for b, d in zip(bounds, a.shape))
    name = self.fresh()
    self.moved(a, name, f"{a.name}.shrink({tuple(bounds)!r})", lambda x: x[sl], "shrink")

  def rand_index(self, shape: tuple) -> tuple[str, tuple]:
    """A basic index (ints, slices with any step, None, one Ellipsis) as source and as a numpy index."""
    r = self.r
    nd = len(shape)
    items, src = [], []
    ell = False
    i = 0
    while i < nd:
      m = r.random()
      if m < 0.12:
        items.append(None); src.append("None"); continue
      if m < 0.2 and not ell:
        ell = True
        k = r.randint(0, nd - i)
        items.append(Ellipsis); src.append("...")
        i += k
        continue
      d = shape[i]
      if m < 0.4 and d > 0:
        v = r.randrange(-d, d)
        items.append(v); src.append(str(v))
      elif m < 0.5:
        items.append(slice(None)); src.append(":")
      else:
        start = r.choice([None, r.randint(-d - 1, d + 1)])
        stop = r.choice([None, r.randint(-d - 1, d + 1)])
        step = r.choice([None, 1, 2, 3, -1, -2])
        items.append(slice(start, stop, step))
        src.append(f"{'' if start is None else start}:{'' if stop is None else stop}{'' if step is None else ':' + str(step)}")
      i += 1
      if not ell and r.random() < 0.25: break
    if r.random() < 0.1: items.append(None); src.append("None")
    if not items: items, src = [slice(None)], [":"]
    if len(items) == 1 and r.random() < 0.5: return src[0], items[0]
    return ", ".join(src) + ("," if len(items) == 1 else ""), tuple(items)

  def op_getitem(self) -> None:
    a = self.pick(lambda v: v.ref.ndim >= 1)
    s, idx = self.rand_index(a.shape)
    name = self.fresh()
    self.moved(a, name, f"{a.name}[{s}]", lambda x: x[idx], "getitem")

  def op_flip(self) -> None:
    r = self.r
    a = self.pick(lambda v: v.ref.ndim >= 1)
    axis = self.axis_arg(a.ref.ndim)
    name = self.fresh()
    self.moved(a, name, f"{a.name}.flip({'' if axis is None and r.random() < 0.5 else repr(axis)})",
               lambda x: np.flip(x, axis=axis), "flip")

  def op_squeeze(self) -> None:
    r = self.r
    a = self.pick()
    nd = a.ref.ndim
    m = r.random()
    name = self.fresh()
    if m < 0.35:
      ones = [i for i, d in enumerate(a.shape) if d == 1]
      if ones and r.random() < 0.6:
        ax = r.choice(ones)
        self.moved(a, name, f"{a.name}.squeeze({ax})", lambda x: np.squeeze(x, axis=ax), "squeeze")
      else: self.moved(a, name, f"{a.name}.squeeze()", lambda x: np.squeeze(x), "squeeze")
    elif m < 0.7:
      ax = r.randint(-nd - 1, nd)
      self.moved(a, name, f"{a.name}.unsqueeze({ax})", lambda x: np.expand_dims(x, ax), "unsqueeze")
    else:
      if nd == 0:
        self.moved(a, name, f"{a.name}.flatten()", lambda x: x.reshape(1), "flatten")
        return
      s = r.randrange(nd); e = r.randrange(s, nd)
      sh = a.shape
      new = sh[:s] + (math.prod(sh[s:e + 1]),) + sh[e + 1:]
      self.moved(a, name, f"{a.name}.flatten({s}, {e})" if r.random() < 0.7 else f"{a.name}.flatten({s})" if e == nd - 1 else f"{a.name}.flatten({s}, {e})",
                 lambda x: x.reshape(new), "flatten")

  def op_cat(self) -> None:
    r = self.r
    a = self.pick(lambda v: v.ref.ndim >= 1)
    nd = a.ref.ndim
    stack = r.random() < 0.3
    ax = r.randrange(nd + 1 if stack else nd)
    ts = [a]
    for _ in range(r.choice([1, 1, 2])):
      if stack: want = a.shape
      else: want = tuple(r.choice([0, 1, 2]) if i == ax else d for i, d in enumerate(a.shape))
      try: t = self.pick(lambda v: v.shape == want and v is not a)
      except Reject: t = self.input(want, self.rdt() if r.random() < 0.4 else a.dt) if r.random() < 0.85 else a
      ts.append(t)
    R = promote(*(t.dt for t in ts))
    cs = [cast_mirror(t.ref, t.err, t.dt, R) for t in ts]
    if stack:
      ref = np.stack([c[0] for c in cs], axis=ax)
      err = np.stack([c[1] for c in cs], axis=ax) if is_f(R) else None
    else:
      ref = np.concatenate([c[0] for c in cs], axis=ax)
      err = np.concatenate([c[1] for c in cs], axis=ax) if is_f(R) else None
    axs = ax - (nd + 1 if stack else nd) if r.random() < 0.3 else ax
    names = [t.name for t in ts]
    m = r.random()
    fn = "stack" if stack else "cat"
    if m < 0.4: code = f"Tensor.{fn}({', '.join(names)}, axis={axs})"
    elif m < 0.7: code = f"{names[0]}.{fn}({', '.join(names[1:])}{', ' if names[1:] else ''}axis={axs})"
    else: code = f"Tensor.{fn}([{', '.join(names)}]{'' if axs == 0 and r.random() < 0.5 else f', axis={axs}'})"
    name = self.fresh()
    self.emit(f"{name} = {code}")
    reads = frozenset().union(*(t.reads for t in ts))
    self.add(Val(name, ref.astype(R), R, err, reads=reads, tag=fn))

  def op_contiguous(self) -> None:
    r = self.r
    a = self.pick()
    how = r.choice(["contiguous", "contiguous", "clone", "detach"])
    name = self.fresh()
    self.emit(f"{name} = {a.name}.{how}()")
    # DETACH may vanish; contiguous() of a realized tensor is its buffer (engine/tensor/__init__.py); clone() always copies
    if how == "detach" or (how == "contiguous" and not a.computed):
      self.add(self.view_of(a, name, a.ref.copy(), a.err, a.view, how))
    else: self.add(Val(name, a.ref.copy(), a.dt, a.err, reads=a.reads, tag=how))

  def op_dup_assign(self) -> None:
    """Two equal expressions (one graph: UOps are hash-consed), one realized and then written: the other must
    keep its value."""
    r = self.r
    b = self.op_dup()
    a = next(v for v in self.live if v.name == b.tag_src)
    if r.random() < 0.5: self.realize([a] + ([b] if r.random() < 0.3 else []))
    (self.op_assign if r.random() < 0.5 or a.lazy or a.buf is None else self.op_assign_view)(target=a)
    if b in self.live: self.capture(b)

  def op_dup(self) -> Val:
    """The same expression written a second time: an equal graph (UOps are hash-consed) that is a value of
    its own; writing into one of the two must not change the other."""
    effects = [i for i, l in enumerate(self.lines) if ".assign(" in l or "] = " in l]
    last = effects[-1] if effects else -1
    cands = []
    for v in self.live:
      if v.alias_of is not None or v.movement: continue
      for i in range(len(self.lines) - 1, last, -1):
        if self.lines[i].startswith(f"{v.name} = "):
          cands.append((v, self.lines[i][len(v.name) + 3:]))
          break
    if not cands: raise Reject("nothing to repeat")
    v, expr = self.r.choice(cands)
    if expr.startswith("Tensor(") or expr.startswith("Tensor.arange") or expr.startswith("Tensor.eye"): raise Reject("host data")
    name = self.fresh()
    self.emit(f"{name} = {expr}")
    d = self.add(Val(name, v.ref.copy(), v.dt, v.err, reads=frozenset(x for x in v.reads if x != v.mroot), tag="dup:" + v.tag))
    d.tag_src = v.name
    return d

  def op_to(self) -> None:
    """A round trip through another device: t.to(OTHER)[...].to(DEV) (COPY nodes)."""
    r = self.r
    a = self.pick()
    other = r.choice([d for d in ("NUMPY", "CPU") if d != self.device])
    mid = r.choice(["", ".contiguous()", " * 1" if a.dt != "bool" else "", ".reshape(-1)" if a.numel else ""])
    name = self.fresh()
    ref, err = a.ref, a.err
    if mid == ".reshape(-1)": ref, err = ref.reshape(-1), None if err is None else err.reshape(-1)
    if mid == " * 1":
      R_ = weak(a.dt, 1)
      X, EX = cast_mirror(a.ref, a.err, a.dt, R_)
      ref, err, _ = self.binary_core("*", X, EX, scalar_arr(1, R_), zeros_err(()) if is_f(R_) else None, R_)
      ref = np.asarray(ref).astype(R_)
      code = f"({a.name}.to({other!r}) * 1).to(DEV)"
    else: code = f"{a.name}.to({other!r}){mid}.to(DEV)"
    self.emit(f"{name} = {code}")
    self.add(Val(name, np.asarray(ref).copy(), np.asarray(ref).dtype.name, err, reads=a.reads, tag="to"))

  # *** realizing, outputs, assign ***

  def capture(self, v: Val) -> None:
    """OUT[name] = its value now (numpy() realizes it)."""
    key = v.name
    if key in self.expect or v not in self.live: return
    how = self.r.choice(["", "", "", "", ", 'tolist'"] + ([", 'item'"] if v.numel == 1 else []))
    self.emit(f"OUT[{key!r}] = snap({v.name}{how})")
    self.expect[key] = (v.ref.copy(), None if v.err is None else v.err.copy(), v.dt)
    self.keytags[key] = v.tag
    self.realized([v])

  def realize(self, vals: list[Val], how: str | None = None) -> None:
    """Emit one realize call of vals and update the model."""
    r = self.r
    uniq = list(dict.fromkeys(vals))
    names = [v.name for v in uniq]
    if how is None:
      how = "single" if len(uniq) == 1 and r.random() < 0.6 else r.choice(["static", "method"])
    if how == "single": self.emit(f"{names[0]}.realize()")
    elif how == "method": self.emit(f"{names[0]}.realize({', '.join(names[1:])})")
    elif how == "static":
      dup = names + ([r.choice(names)] if r.random() < 0.1 else [])
      self.emit(f"Tensor.realize({', '.join(dup)})")
    self.realized(uniq)

  def realized(self, uniq: list[Val]) -> None:
    """The model after one realize call of uniq: pending assigns in their graphs written, lazy values in
    buffers, and values whose result now depends on timing dropped."""
    ids = set(map(id, uniq))
    writes = {x[1] for v in uniq for x in v.reads if isinstance(x, tuple)}
    # a value that reads a written buffer other than through the assign (none should be left: see op_assign)
    self.live = [v for v in self.live if id(v) in ids or not any(b in v.reads and ("w", b) not in v.reads for b in writes)]
    changed = set()
    for v in self.live:
      w = {x for x in v.reads if isinstance(x, tuple) and x[1] in writes}
      if w: v.reads = (v.reads - w) | {x[1] for x in w}   # graphs holding the executed ASSIGN read the buffer
      if v.assign_buf in writes:
        v.assign_buf, v.computed, v.base_assign = None, False, False
        v.buf = None if v.movement else v.mroot
        changed.add(id(v))
    for v in uniq:
      if v.computed:
        v.computed, v.base_assign = False, False
        v.buf = None if v.movement else v.mroot
        if not v.movement: v.view = v.identity()
        changed.add(id(v))
    for v in self.live:   # movement ops (views) of a realized tensor: views of its buffer now
      u = v
      while u.msrc is not None and u.computed:
        u = u.msrc
      if v.computed and v.movement and not u.computed and id(u) in changed:
        v.computed, v.base_assign = False, False
    # other names for the same Tensor object have changed state too: drop them
    roots = {id(v.alias_of or v) for v in self.live if id(v) in changed}
    self.live = [v for v in self.live if id(v) in changed or id(v.alias_of or v) not in roots]

  def kill_readers(self, token, keep: set) -> None:
    self.live = [v for v in self.live if id(v) in keep or token not in v.reads]

  def op_realize(self) -> None:
    r = self.r
    lazy = [v for v in self.live if v.lazy and v.alias_of is None]
    if not lazy: raise Reject("nothing lazy")
    k = min(len(lazy), r.choice([1, 1, 2, 3]))
    vals = r.sample(lazy, k)
    if r.random() < 0.25: self.emit(f"Tensor.schedule({', '.join(v.name for v in vals)})")
    self.realize(vals)
    for v in vals:
      if r.random() < 0.3: self.capture(v)

  def readers_of(self, token, exclude: Val) -> list[Val]:
    return [v for v in self.live if v is not exclude and token in v.reads]

  def snapshots(self, pending: list[Val], t: Val, views: bool = False) -> list[Val]:
    """Readers of t's storage that may be realized with (or before) an assign into it and keep the old value:
    computed values of their own (not views of that storage) without pending assigns. Views of the storage
    compute nothing: they are the buffer and show the write (engine/realize.py), which this model does not
    follow, so they are never checked as snapshots."""
    views = False
    def view_ok(p):
      if not (views and p.movement and not p.computed and p.mroot == t.mroot and p.view is not None): return False
      n = t.numel
      return not (p.view.size == n and (p.view.reshape(-1) == np.arange(n)).all())
    return [p for p in pending if (view_ok(p) or (p.computed and not p.movement and p.mroot != t.mroot)) and p.alias_of is None
            and not any(isinstance(x, tuple) for x in p.reads) and self.r.random() < 0.7]

  def snapshot_views_done(self, snaps: list[Val]) -> None:
    """Views of the written storage realized with the assign: their old value is checked now, then they go
    (what they show later depends on whether realize copied them)."""
    for v in [v for v in snaps if v.movement]:
      v.tag = "view_read_with_assign:" + v.tag
      self.capture(v)
      if v in self.live: self.live.remove(v)

  def value_for(self, target_shape: tuple, target_dt: str):
    """What to assign: a tensor (broadcasting to the target), a Python scalar or a nested list."""
    r = self.r
    m = r.random()
    if m < 0.2:
      s = self.scalar_for(target_dt, "fill")
      return repr(s), np.full((), s, dtype=target_dt), None if not is_f(target_dt) else zeros_err(()), frozenset()
    if m < 0.3 and target_shape and math.prod(target_shape) > 0:
      vals = self.values(r.choice(["int32", "float32", "bool"]) if r.random() < 0.5 else ("float32" if is_f(target_dt) else "int32"), target_shape[-1])
      vals = [float(x) if isinstance(x, float) else x for x in vals]
      if any(isinstance(x, float) and not math.isfinite(x) for x in vals): raise Reject("special list")
      ldt = list_dtype(vals)
      ref, err = cast_mirror(np.array(vals, dtype=ldt), zeros_err(len(vals)) if is_f(ldt) else None, ldt, target_dt)
      return lit(vals), ref, err, frozenset()
    v = self.operand(target_shape)
    try: shape = np.broadcast_shapes(v.shape, target_shape)
    except ValueError: raise Reject("assign shape")
    if shape != tuple(target_shape): raise Reject("assign shape")
    ref, err = cast_mirror(v.ref, v.err, v.dt, target_dt)
    return v.name, ref, err, v.reads

  def op_assign(self, target: Val | None = None) -> None:
    """t.assign(x) of a whole tensor: a realized buffer or a view of one (written through), or a lazy tensor
    (which gets a fresh buffer)."""
    r = self.r
    t = target or self.pick(lambda v: v.alias_of is None and not any(u.alias_of is v for u in self.live))
    if t.alias_of is not None or any(u.alias_of is t for u in self.live): raise Reject("aliased")
    if t.base_assign: self.realized([t])   # assign() carries out a pending assign under t first
    if t not in self.live: raise Reject("gone")
    through = not t.computed   # realized, or a view of a buffer: the write goes into that storage
    if t.view is None: raise Reject("padded or expanded view")   # a documented ValueError (if it is a view of a buffer)
    if t.view.size and np.unique(t.view).size != t.view.size: raise Reject("repeats")
    src, ref, err, vreads = self.value_for(t.shape, t.dt)
    ref = np.broadcast_to(ref, t.shape).astype(t.dt)
    err = None if err is None else np.broadcast_to(err, t.shape)
    name = t.name
    if through:
      m = t.mroot
      pending = self.readers_of(m, t)
      now = r.random() < 0.65
      # a write through a view is made before anything realized with it reads the buffer (engine/tensor/writes.py):
      # only a whole buffer's write leaves old values to readers realized beside it
      snaps = [] if t.movement else self.snapshots(pending, t, views=now)
      if not now and snaps: self.realize(snaps)
      self.live = [v for v in self.live if v is t or v in snaps or v not in pending]
      self.emit(f"{name}.assign({src})")
      t.reads = frozenset(vreads) | {("w", m), m}
      t.assign_buf, t.computed, t.base_assign, t.buf = m, True, True, None
      t.ref, t.err, t.tag = ref, (None if err is None else err.copy()), "assign"
      if now:
        if snaps or r.random() < 0.5:
          order = [t] + snaps
          r.shuffle(order)
          self.realize(order, how="static" if snaps else None)
          self.snapshot_views_done(snaps)
        else:
          self.lines[-1] = f"{name}.assign({src}).realize()"
          self.realized([t])
        for x in [t] + snaps:
          if r.random() < 0.5: self.capture(x)
    else:
      nb = self.newbuf()   # a fresh buffer; nothing else reads it
      m = t.mroot           # (but t's graph may have been staged into a buffer readers share: they go)
      self.live = [v for v in self.live if v is t or m not in v.reads]
      self.emit(f"{name}.assign({src})")
      t.reads = frozenset(vreads) | {("w", nb), nb}
      t.mroot, t.movement, t.view = nb, False, t.identity()
      t.assign_buf, t.computed, t.base_assign, t.buf = nb, True, True, None
      t.ref, t.err, t.tag = ref, (None if err is None else err.copy()), "assign_lazy"
      if r.random() < 0.4: self.realize([t])
    self.tags.append(t.tag)

  def view_chain(self, t: Val) -> tuple[str, np.ndarray]:
    """A view of buffer t without padding or repeats, as source and as the flat positions it covers."""
    r = self.r
    src, idx = t.name, t.view
    for _ in range(r.choice([1, 1, 1, 2])):
      m = r.random()
      nd = idx.ndim
      if m < 0.55 and nd >= 1:
        s, ix = self.rand_index(idx.shape)
        src, idx = f"{src}[{s}]", idx[ix]
      elif m < 0.7 and nd >= 2:
        src, idx = f"{src}.T", np.transpose(idx)
      elif m < 0.8 and nd >= 1:
        ax = r.randrange(nd)
        src, idx = f"{src}.flip({ax})", np.flip(idx, ax)
      elif m < 0.9 and nd >= 2:
        order = list(range(nd)); r.shuffle(order)
        src, idx = f"{src}.permute({', '.join(map(str, order))})", np.transpose(idx, order)
      elif nd >= 1:
        sh = idx.shape
        n = idx.size
        if n > 0 and r.random() < 0.5: new = (n,)
        else: new = sh[:1] + (1,) + sh[1:]
        src, idx = f"{src}.reshape({', '.join(map(str, new))}{',' if len(new) == 1 else ''})", idx.reshape(new)
    return src, idx

  def op_assign_view(self, target: Val | None = None) -> None:
    """Writes through a view of a realized buffer: t[idx].assign(x), t[idx] = x, t.T[...] = x, ..."""
    r = self.r
    ok = lambda v: v.buf is not None and not v.lazy and v.ref.ndim >= 1 and v.alias_of is None
    t = target if target is not None else self.pick(ok)
    if not ok(t): raise Reject("not a buffer")
    vsrc, idx = self.view_chain(t)
    if idx.size and np.unique(idx).size != idx.size: raise Reject("repeats")
    src, ref, err, vreads = self.value_for(idx.shape, t.dt)
    m = t.mroot
    pending = self.readers_of(m, t)
    form = r.choice(["setitem", "assign_realize", "together"]) if vsrc.endswith("]") else r.choice(["assign_realize", "together"])
    # (no reader keeps the old value: a write through a view is made before anything realized with it reads the
    # buffer, engine/tensor/writes.py; only the write and the buffer itself are realized together)
    snaps: list[Val] = []
    self.live = [v for v in self.live if v is t or v in snaps or v not in pending]
    new = t.ref.copy()
    new.reshape(-1)[idx.reshape(-1)] = np.broadcast_to(ref, idx.shape).reshape(-1)
    newerr = None
    if t.err is not None:
      newerr = t.E().copy()
      newerr.reshape(-1)[idx.reshape(-1)] = np.broadcast_to(err if err is not None else 0.0, idx.shape).reshape(-1)
    # the view being written: its value afterwards is x; it is a view of t's buffer
    wname = None if form == "setitem" else self.fresh()
    w = Val(wname or "_", np.broadcast_to(ref, idx.shape).astype(t.dt), t.dt,
            None if err is None else np.broadcast_to(err, idx.shape), reads=frozenset(vreads) | {m}, computed=True,
            tag="assign_view", mroot=m, movement=True)
    if form == "setitem": self.emit(f"{vsrc} = {src}")
    else:
      self.emit(f"{wname} = {vsrc}")
      if form == "assign_realize": self.emit(f"{wname}.assign({src}).realize()")
      else:
        self.emit(f"{wname}.assign({src})")
        names = [wname] + [x.name for x in snaps] + ([t.name] if r.random() < 0.3 else [])
        r.shuffle(names)
        self.emit(f"Tensor.realize({', '.join(names)})")
    self.live.append(w)
    self.realized([w] + snaps)   # pending assigns inside x are carried out too
    self.live.remove(w)
    t.ref, t.err = new, newerr
    self.kill_readers(m, keep={id(t)} | set(map(id, snaps)))
    self.snapshot_views_done(snaps)
    if wname is not None:
      w.computed = False
      self.live.append(w)
      if r.random() < 0.5: self.capture(w)
    for x in [t] + snaps:
      if r.random() < 0.4: self.capture(x)
    self.tags.append(f"assign_view:{form}")

  # *** programs ***

  OPS = {"binary": 22, "compare": 8, "where": 5, "unary": 14, "cast": 8, "bitcast": 1, "reduce": 12, "softmax": 3,
         "matmul": 4, "reshape": 4, "permute": 3, "expand": 3, "pad": 3, "shrink": 2, "getitem": 5, "flip": 2,
         "squeeze": 2, "cat": 3, "contiguous": 3, "realize": 4, "assign": 2, "assign_view": 2, "const": 2, "dup": 1,
         "conv": 1, "pool": 2, "dup_assign": 1, "to": 1}
  FLAVORS = {
    "general": {},
    "const": {"binary": 10, "reduce": 20, "contiguous": 6, "const": 10, "matmul": 1, "assign": 0, "assign_view": 0, "cast": 4},
    "assign": {"assign": 14, "assign_view": 16, "realize": 6, "binary": 12, "reduce": 8, "dup": 2, "dup_assign": 4},
    "multi": {"reduce": 20, "binary": 22, "realize": 6},
    "movement": {"reshape": 8, "permute": 6, "expand": 6, "pad": 8, "shrink": 5, "getitem": 12, "flip": 5, "squeeze": 4,
                 "cat": 6, "assign_view": 4},
    "cast": {"cast": 30, "bitcast": 4, "unary": 6},
    "big": {"matmul": 14, "conv": 6, "reduce": 12, "binary": 16, "unary": 6, "softmax": 3, "assign": 1, "assign_view": 1,
            "dup": 0, "dup_assign": 0, "cat": 1, "pad": 2, "expand": 1, "pool": 2, "where": 2, "cast": 3},
  }

  def start(self) -> None:
    r = self.r
    if self.flavor == "const":
      k = r.random()
      if k < 0.25:
        n = r.choice([2 ** 15, 2 ** 12, 1000, 4097, 65536])
        shape = r.choice([(n,), (n // 64 if n >= 64 else n, 64) if n % 64 == 0 else (n,)])
        self.const_input(shape)
      else:
        for _ in range(r.randint(1, 2)): self.const_input()
      return
    for _ in range(r.choice([1, 1, 2] if self.small else [1, 1, 2, 2, 3])):
      self.input(self.rshape(), self.rdt())
    if self.flavor == "cast":
      dst = r.choice(ALL)
      self.input(self.rshape(), dst)

  def build(self) -> "Program":
    r = self.r
    weights = {k: (0 if k in self.exclude else w) for k, w in dict(self.OPS, **self.FLAVORS[self.flavor]).items()}
    names = list(weights)
    w = [weights[k] for k in names]
    self.start()
    steps = r.randint(1, 4) if self.small else r.randint(2, 9)
    done = 0
    tries = 0
    while done < steps and tries < steps * 12:
      tries += 1
      op = r.choices(names, w)[0]
      save = (len(self.lines), list(self.live), self.n, self.nbuf, dict(self.expect), len(self.tags),
              [(v, *(getattr(v, k) for k in Val.__slots__)) for v in self.live])
      try:
        if op == "const": self.const_input()
        else: getattr(self, f"op_{op}")()
        done += 1
      except Reject:
        del self.lines[save[0]:]
        self.live, self.n, self.nbuf, self.expect = save[1], save[2], save[3], save[4]
        del self.tags[save[5]:]
        for v, *st in save[6]:
          for k, x in zip(Val.__slots__, st): setattr(v, k, x)
    if self.flavor == "multi" and self.live:
      self.shared_reduce()
    self.finish()
    p = Program(self.seed, self.index, self.device, self.flavor, "\n".join(self.lines), self.expect, sorted(set(self.tags)),
                self.small)
    p.keytags = self.keytags
    return p

  def shared_reduce(self) -> None:
    """Several consumers of one reduce, realized together (the reduce too, sometimes)."""
    r = self.r
    try:
      a = self.pick(lambda v: v.ref.ndim >= 1 and v.numel > 0)
      self.live.append(self.live.pop(self.live.index(a)))
      for _ in range(3):
        try: self.op_reduce(); break
        except Reject: pass
      red = self.live[-1]
      outs = [red] if r.random() < 0.5 else []
      for _ in range(r.randint(2, 3)):
        try:
          self.live.append(self.live.pop(self.live.index(red)))
          (self.op_binary if r.random() < 0.7 else self.op_unary)()
          outs.append(self.live[-1])
        except Reject: pass
      if len(outs) >= 2:
        if r.random() < 0.3: self.emit(f"Tensor.schedule({', '.join(v.name for v in outs)})")
        self.realize(outs, how="static")
        for v in outs: self.capture(v)
    except (Reject, ValueError): pass

  def finish(self) -> None:
    r = self.r
    if not self.live: return
    outs = [self.live[-1]] + r.sample(self.live, min(len(self.live), r.randint(0, 1 if self.small else 3)))
    outs = list(dict.fromkeys(outs))
    outs = [v for v in outs if v.name not in self.expect]
    lazy = [v for v in outs if v.lazy and v.alias_of is None]
    if len(lazy) >= 2 and r.random() < 0.6:
      if r.random() < 0.3: self.emit(f"Tensor.schedule({', '.join(v.name for v in lazy)})")
      self.realize(lazy, how=r.choice(["static", "method"]))
    for v in outs: self.capture(v)


class Program:
  __slots__ = ("seed", "index", "device", "flavor", "source", "expect", "tags", "small", "keytags")

  def __init__(self, seed, index, device, flavor, source, expect, tags, small=False):
    self.seed, self.index, self.device, self.flavor, self.source, self.expect, self.tags, self.small = \
      seed, index, device, flavor, source, expect, tags, small
    self.keytags: dict = {}


EXCLUDE: tuple = tuple(x for x in os.environ.get("RULEC_FUZZ_EXCLUDE", "").split(",") if x)   # ops left out
FLAVOR: str | None = os.environ.get("RULEC_FUZZ_FLAVOR") or None   # every program of this flavor


def generate(seed: int, index: int, device: str, skip: tuple = (), small: bool = False) -> Program:
  """Program `index` of `seed` (the same on every run); small: fewer statements and outputs (fewer kernels)."""
  with warnings.catch_warnings(), np.errstate(all="ignore"):
    warnings.simplefilter("ignore")
    return _generate(seed, index, device, skip, small)


def _generate(seed: int, index: int, device: str, skip: tuple, small: bool) -> Program:
  for attempt in range(5):
    g = Gen(seed, index, device, skip=skip, small=small, exclude=EXCLUDE, flavor=FLAVOR)
    if attempt: g.r = random.Random(f"rulec-fuzz:{seed}:{index}:{attempt}")
    p = g.build()
    if p.expect: return p
  return p


# *** running ***

def tolerance(ref: np.ndarray, err: np.ndarray | None, dt: str) -> np.ndarray:
  return 4 * err + 2 * EPS[dt] * np.abs(f64(ref)) + TINY[dt]


def compare(key: str, got: Any, want: tuple, device: str) -> str | None:
  ref, err, dt = want
  arr, gdt, gdev = got
  if gdt != dt: return f"{key}: dtype {gdt}, expected {dt}"
  if gdev != device: return f"{key}: device {gdev}, expected {device}"
  if arr.shape != ref.shape: return f"{key}: shape {arr.shape}, expected {ref.shape}"
  if not is_f(dt):
    if np.array_equal(arr, ref): return None
    bad = np.argwhere(arr != ref)
    return f"{key}: {len(bad)} of {ref.size} values differ, e.g. at {tuple(bad[0])} got {arr[tuple(bad[0])]!r} expected {ref[tuple(bad[0])]!r}"
  a, w = f64(arr), f64(ref)
  with np.errstate(all="ignore"):
    nan_ok = np.isnan(a) == np.isnan(w)
    inf_ok = np.where(np.isinf(w) | np.isinf(a), a == w, True)
    tol = tolerance(ref, err, dt)
    close = np.where(np.isfinite(w) & np.isfinite(a), np.abs(a - w) <= tol, True)
  ok = nan_ok & inf_ok & close
  if ok.all(): return None
  bad = np.argwhere(~ok)
  i = tuple(bad[0])
  return f"{key}: {len(bad)} of {ref.size} values differ, e.g. at {i} got {a[i]!r} expected {w[i]!r} (tolerance {float(np.broadcast_to(tol, w.shape)[i]):.3g})"


def namespace(device: str) -> dict:
  ns = {"DEV": device}
  exec(compile(HEADER, "<fuzz header>", "exec"), ns)
  return ns


def normalize(msg: str) -> str:
  """An error message with the numbers, shapes and names taken out, to group failures into classes."""
  m = msg.splitlines()[0] if msg else ""
  m = re.sub(r"0x[0-9a-f]+", "X", m)
  m = re.sub(r"\(([-\d, ]*)\)", "(S)", m)
  m = re.sub(r"\b\d+\b", "N", m)
  m = re.sub(r"'[^']*'", "'_'", m)
  return m[:160]


def execute(source: str, device: str) -> tuple[dict | None, dict | None]:
  """Run a program: (outputs, None) or (None, crash info)."""
  ns = namespace(device)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    try:
      with np.errstate(all="ignore"):
        exec(compile(source, "<fuzz>", "exec"), ns)
    except Exception as e:   # noqa: BLE001 - every exception of a valid program is a finding
      tb = traceback.extract_tb(e.__traceback__)
      line = next((fr.lineno for fr in reversed(tb) if fr.filename == "<fuzz>"), None)
      where = next((f"{os.path.relpath(fr.filename, REPO)}:{fr.lineno} {fr.name}" for fr in reversed(tb)
                    if fr.filename != "<fuzz>" and "site-packages" not in fr.filename), "")
      stmt = source.splitlines()[line - 1] if line else ""
      return None, {"type": type(e).__name__, "msg": str(e)[:400], "line": line, "stmt": stmt, "where": where}
  return ns["OUT"], None


def run_program(p: Program) -> dict | None:
  """None if the program ran and every output matched; else a failure record."""
  outs, crash = execute(p.source, p.device)
  base = {"seed": p.seed, "index": p.index, "device": p.device, "flavor": p.flavor, "tags": p.tags, "small": p.small}
  if crash is not None:
    return dict(base, kind="crash", signature=f"crash {crash['type']}: {normalize(crash['msg'])}", detail=crash)
  bad = []
  for key, want in p.expect.items():
    if key not in outs: bad.append(f"{key}: not captured"); continue
    msg = compare(key, outs[key], want, p.device)
    if msg: bad.append(msg)
  if not bad: return None
  kinds = sorted({("dtype" if "dtype" in b else "device" if "device" in b else "shape" if "shape" in b else "value") for b in bad})
  tag = p.keytags.get(bad[0].split(":")[0], "?")
  if tag.startswith(("dup:", "view_read_with_assign:")): tag = tag.split(":")[0]   # one class, whatever the op
  return dict(base, kind="wrong", signature=f"wrong {'/'.join(kinds)} of {tag}", detail={"mismatches": bad})


def generate_and_run(seed: int, i: int, device: str, skip: tuple, small: bool) -> dict | None:
  """run_program of program i; an exception of the generator itself is a failure of its own kind."""
  try: p = generate(seed, i, device, skip, small)
  except Exception as e:   # noqa: BLE001 - a bug of this file, reported like the others
    return {"seed": seed, "index": i, "device": device, "flavor": "?", "tags": [], "small": small, "kind": "generator",
            "signature": f"generator bug {type(e).__name__}: {normalize(str(e))}",
            "detail": {"type": type(e).__name__, "msg": traceback.format_exc()[-1500:], "line": None, "stmt": "", "where": ""}}
  return run_program(p)


def run_batch(seed: int, start: int, n: int, device: str, skip: tuple = (), small: bool = False) -> dict:
  """Run programs start..start+n-1 in this process (a segfault takes the process down: see run_isolated)."""
  fails, t0 = [], time.perf_counter()
  for i in range(start, start + n):
    f = generate_and_run(seed, i, device, skip, small)
    if f: fails.append(f)
  return {"programs": n, "failures": fails, "seconds": time.perf_counter() - t0}


def _child_main(args) -> None:
  """The child of run_isolated: one JSON line per program started and per failure."""
  skip = tuple(tuple(s.split("->")) for s in args.skip)
  def progress(i):
    sys.stdout.write(json.dumps({"begin": i}) + "\n"); sys.stdout.flush()
  for i in range(args.start, args.start + args.n):
    progress(i)
    f = generate_and_run(args.seed, i, args.device, skip, args.small)
    if f: sys.stdout.write(json.dumps({"fail": f}, default=str) + "\n"); sys.stdout.flush()
  sys.stdout.write(json.dumps({"done": args.n}) + "\n"); sys.stdout.flush()


def run_isolated(seed: int, n: int, device: str, skip: tuple = (), hang_s: float = 120.0, env: dict | None = None,
                 start: int = 0, small: bool = False, stop=None) -> dict:
  """Run programs start..start+n-1 in child processes: a program that kills its process (a segfault) or hangs
  (no progress for hang_s) is recorded as a crash and the batch goes on after it. stop: a threading.Event that
  ends the batch early (its children are killed)."""
  import tempfile
  fails, t0 = [], time.perf_counter()
  i, end = start, start + n
  cenv = dict(os.environ if env is None else env)
  cenv["PYTHONPATH"] = os.pathsep.join([REPO] + [p for p in [cenv.get("PYTHONPATH")] if p])
  cenv.setdefault("RULEC_DEVICE", device)
  restarts, cpu, ran = 0, 0.0, 0
  while i < end:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--device", device, "--seed", str(seed),
           "--start", str(i), "--n", str(end - i)] + [f"--skip={a}->{b}" for a, b in skip] + (["--small"] if small else [])
    with tempfile.TemporaryFile(mode="w+") as errf:   # (a file: a chatty child cannot fill a pipe and stall)
      proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errf, env=cenv, cwd=REPO, text=True)
      cur, done, hung, stopped = None, False, False, False
      last = time.monotonic()
      while True:
        rd, _, _ = select.select([proc.stdout], [], [], 1.0)
        if stop is not None and stop.is_set():
          stopped = True
          proc.kill()
          break
        if not rd:
          if time.monotonic() - last > hang_s:
            hung = True
            proc.kill()
            break
          continue
        line = proc.stdout.readline()
        if not line: break
        last = time.monotonic()
        msg = json.loads(line)
        if "begin" in msg: cur = msg["begin"]; ran += 1
        elif "fail" in msg: fails.append(msg["fail"])
        elif "done" in msg: done = True
      _, status, ru = os.wait4(proc.pid, 0)   # (reaped here, for its CPU time)
      proc.returncode = os.waitstatus_to_exitcode(status)
      proc.stdout.close()
      cpu += ru.ru_utime + ru.ru_stime
      errf.seek(0)
      err = errf.read()
    if done or stopped: break
    restarts += 1
    if cur is None:   # died before running anything: the environment is broken, not a program
      raise RuntimeError(f"fuzz child failed to start (rc={proc.returncode}):\n{err[-3000:]}")
    try: flavor, tags = (lambda q: (q.flavor, q.tags))(generate(seed, cur, device, skip, small))
    except Exception: flavor, tags = "?", []   # noqa: BLE001
    what = "hang" if hung else f"killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exit {proc.returncode}"
    fails.append({"seed": seed, "index": cur, "device": device, "flavor": flavor, "tags": tags, "small": small, "kind": "crash",
                  "signature": f"crash {what}", "detail": {"type": what, "msg": err[-1500:], "line": None, "stmt": "", "where": ""}})
    i = cur + 1
  return {"programs": ran, "failures": fails, "seconds": time.perf_counter() - t0, "restarts": restarts, "cpu_seconds": cpu}


# *** shrinking and reproducers ***

def execute_eval(source: str, device: str) -> tuple[dict | None, dict | None]:
  """execute() with RULEC_REALIZE=eval (engine/tensor_eval.py instead of kernels)."""
  old = os.environ.get("RULEC_REALIZE")
  os.environ["RULEC_REALIZE"] = "eval"
  try: return execute(source, device)
  finally:
    if old is None: os.environ.pop("RULEC_REALIZE", None)
    else: os.environ["RULEC_REALIZE"] = old


def loose(ref: np.ndarray, dt: str) -> tuple:
  """An expectation taken from another run: a generous error bound for floats."""
  return (ref, (64 * EPS[dt] * (1 + np.abs(f64(ref)))) if is_f(dt) else None, dt)


def _differs(a: dict, b: dict, device: str) -> bool:
  """Some output present in both runs differs (dtype, shape or value beyond a loose bound)."""
  for k in a.keys() & b.keys():
    ref, dt, _ = b[k]
    if compare(k, a[k], loose(ref, dt), device) is not None: return True
  return False


def shrink(p: Program, failure: dict, budget_s: float = 30.0) -> tuple[str, dict, str]:
  """Delete statements while the program still fails the same way (in this process: not for segfaults).

  Crashes: any statement may go while the same error remains. Wrong values: when the RULEC_REALIZE=eval path
  agrees with the expectations, any statement may go while kernels and eval still differ (the expectations
  then come from eval); otherwise only captures, schedules and unused definitions go (and realizes, in
  programs without assigns), so that the numpy expectations stay valid. Returns (source, expect, how)."""
  lines = p.source.splitlines()
  expect = dict(p.expect)
  t0 = time.perf_counter()
  how = "crash"
  if failure["kind"] == "wrong":
    ev, crash = execute_eval(p.source, p.device)
    agree = crash is None and all(k in ev and compare(k, ev[k], w, p.device) is None for k, w in p.expect.items())
    how = "differential" if agree else "model"

  killed = re.search(r"killed by signal (\d+)", failure["signature"])

  def fails(cand: list[str]) -> bool:
    src = "\n".join(cand)
    if killed:   # a segfault: each attempt in a child process of its own
      code = HEADER + f"DEV = {p.device!r}\n" + src
      env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO] + [x for x in [os.environ.get("PYTHONPATH")] if x]))
      try: rc = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, timeout=120).returncode
      except subprocess.TimeoutExpired: return False
      return rc == -int(killed.group(1))
    if how == "differential":
      got, c1 = execute(src, p.device)
      if c1 is not None: return False
      ev, c2 = execute_eval(src, p.device)
      return c2 is None and _differs(got, ev, p.device)
    q = Program(p.seed, p.index, p.device, p.flavor, src, expect_now, p.tags, p.small)
    f = run_program(q)
    if f is None or f["kind"] != failure["kind"]: return False
    return f["signature"] == failure["signature"] if failure["kind"] == "crash" else True

  has_assign = any(".assign(" in l or "] = " in l for l in lines)
  changed = True
  while changed and time.perf_counter() - t0 < budget_s:
    changed = False
    for i in range(len(lines) - 1, -1, -1):
      if time.perf_counter() - t0 > budget_s or i >= len(lines): break
      l = lines[i]
      if how == "model":
        if ".assign(" in l or "] = " in l: continue
        if has_assign and ("realize(" in l): continue
      m = re.match(r"OUT\['(\w+)'\] = ", l)
      expect_now = expect
      if m:
        expect_now = {k: v for k, v in expect.items() if k != m.group(1)}
        if how == "model" and not expect_now: continue
      cands = [lines[:i] + lines[i + 1:]]
      g = re.match(r"^(Tensor\.(?:realize|schedule))\((.*)\)$", l)
      if g and "," in g.group(2):   # or one tensor fewer in a realize / schedule of several
        args = [x.strip() for x in g.group(2).split(",")]
        cands += [lines[:i] + [f"{g.group(1)}({', '.join(args[:j] + args[j + 1:])})"] + lines[i + 1:] for j in range(len(args))]
      for cand in cands:
        if fails(cand):
          lines, expect, changed = cand, (expect_now if cand is cands[0] else expect), True
          break
  src = "\n".join(lines)
  if how == "differential":
    ev, _ = execute_eval(src, p.device)
    expect = {k: loose(v[0], v[1]) for k, v in (ev or {}).items()}
  return src, expect, how


def reproducer(p: Program, failure: dict, source: str | None = None, expect: dict | None = None,
               how: str | None = None) -> str:
  source = p.source if source is None else source
  expect = p.expect if expect is None else expect
  head = [f"# rulec fuzz_programs: seed={p.seed} index={p.index} device={p.device} flavor={p.flavor}",
          f"# {failure['signature']}" + ("" if how is None else f" (shrunk; expectations from "
                                          f"{'RULEC_REALIZE=eval' if how == 'differential' else 'numpy' if how == 'model' else '-'})")]
  d = failure["detail"]
  if failure["kind"] == "crash":
    head.append(f"# {d['type']}: {d['msg'].splitlines()[0] if d['msg'] else ''}"[:300])
    if d.get("stmt"): head.append(f"#   at: {d['stmt']}   ({d.get('where', '')})")
  else:
    for m in d["mismatches"][:4]: head.append(f"# {m}"[:300])
  body = [HEADER.rstrip(), f"DEV = {p.device!r}", source]
  if failure["kind"] == "wrong":
    body.append(CHECK.rstrip())
    with np.printoptions(threshold=10 ** 6):
      for k, (ref, err, dt) in expect.items():
        tol = 0.0 if err is None else float(np.max(tolerance(ref, err, dt))) if ref.size else 0.0
        if ref.size <= 64: body.append(f"check({k!r}, {lit(ref.tolist())}, {dt!r}, {tol:.3g})")
        else: body.append(f"# {k}: {dt} {ref.shape}, {ref.size} values (not printed): {np.array2string(ref.reshape(-1), threshold=8)}")
  return "\n".join(head + body) + "\n"


def summarize(res: dict, show: int = 3, shrink_s: float = 0.0, device: str = "NUMPY", skip: tuple = (), small: bool = False) -> str:
  fails = res["failures"]
  crashes = [f for f in fails if f["kind"] == "crash"]
  wrong = [f for f in fails if f["kind"] == "wrong"]
  gen = [f for f in fails if f["kind"] == "generator"]
  cpu = f", {res['cpu_seconds']:.1f}s of CPU ({res['cpu_seconds'] / max(res['programs'], 1) * 1000:.1f} ms each)" \
    if "cpu_seconds" in res else ""
  out = [f"{res['programs']} programs on {device} in {res['seconds']:.1f}s ({res['seconds'] / max(res['programs'], 1) * 1000:.1f} ms each{cpu}): "
         f"{len(crashes)} crashes, {len(wrong)} wrong values" + (f", {res['restarts']} child restarts" if res.get("restarts") else "")
         + (f", {len(gen)} GENERATOR BUGS (tests/fuzz_programs.py)" if gen else "")]
  classes: dict[str, list] = {}
  for f in fails: classes.setdefault(f["signature"], []).append(f)
  for sig, fs in sorted(classes.items(), key=lambda kv: -len(kv[1])):
    out.append(f"  {len(fs):5d}  {sig}   (e.g. programs {', '.join(str(f['index']) for f in fs[:5])})")
  shown = 0
  for sig, fs in sorted(classes.items(), key=lambda kv: -len(kv[1])):
    if shown >= show: break
    if fs[0]["kind"] == "generator":
      out.append(f"\n# {sig} (program {fs[0]['index']}):\n{fs[0]['detail']['msg']}")
      shown += 1
      continue
    f = min(fs, key=lambda f: len(generate(f["seed"], f["index"], device, skip, small).source))
    p = generate(f["seed"], f["index"], device, skip, small)
    src, ex, how = p.source, p.expect, None
    if shrink_s > 0 and "hang" not in sig:
      src, ex, how = shrink(p, f, shrink_s)
    out.append("\n" + reproducer(p, f, src, ex, how))
    shown += 1
  return "\n".join(out)


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--device", default=os.environ.get("RULEC_DEVICE", "NUMPY").upper())
  ap.add_argument("--n", type=int, default=1000)
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--start", type=int, default=0)
  ap.add_argument("--show", type=int, default=None, help="print program SHOW and its expectations, then exit")
  ap.add_argument("--repro", type=int, default=3, help="how many reproducers to print (one per failure class)")
  ap.add_argument("--shrink", type=float, default=0.0, nargs="?", const=20.0, help="seconds to shrink each reproducer")
  ap.add_argument("--inprocess", action="store_true", help="run in this process (a segfault ends the run)")
  ap.add_argument("--skip", action="append", default=[], help="a cast to leave out, e.g. --skip float64->float16")
  ap.add_argument("--realize", choices=["kernels", "eval"], default="kernels", help="eval: RULEC_REALIZE=eval (tensor_eval)")
  ap.add_argument("--json", default=None, help="write the failures as JSON here")
  ap.add_argument("--small", action="store_true", help="smaller programs (fewer kernels: the CL sample)")
  ap.add_argument("--exclude", default=None, help="ops to leave out, e.g. dup,dup_assign (sets RULEC_FUZZ_EXCLUDE)")
  ap.add_argument("--flavor", default=None, choices=list(Gen.FLAVORS), help="only programs of this kind (sets RULEC_FUZZ_FLAVOR)")
  ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
  args = ap.parse_args(argv)
  global EXCLUDE
  if args.exclude is not None:
    os.environ["RULEC_FUZZ_EXCLUDE"] = args.exclude   # the children see it too
    EXCLUDE = tuple(x for x in args.exclude.split(",") if x)
  global FLAVOR
  if args.flavor is not None: os.environ["RULEC_FUZZ_FLAVOR"] = FLAVOR = args.flavor
  if args.realize == "eval": os.environ["RULEC_REALIZE"] = "eval"
  if args.child:
    _child_main(args)
    return 0
  skip = tuple(tuple(s.split("->")) for s in args.skip)
  if args.show is not None:
    p = generate(args.seed, args.show, args.device, skip, args.small)
    print(f"# flavor {p.flavor}, tags {p.tags}")
    print(HEADER + f"DEV = {args.device!r}\n" + p.source)
    for k, (ref, err, dt) in p.expect.items(): print(f"# {k}: {dt} {ref.tolist()!r}")
    f = run_program(p)
    print("# result:", "ok" if f is None else f["signature"], "" if f is None else json.dumps(f["detail"], default=str)[:2000])
    return 0
  if args.inprocess: res = run_batch(args.seed, args.start, args.n, args.device, skip, args.small)
  else: res = run_isolated(args.seed, args.n, args.device, skip, start=args.start, small=args.small)
  print(summarize(res, show=args.repro, shrink_s=args.shrink, device=args.device, skip=skip, small=args.small))
  if args.json:
    with open(args.json, "w") as fh: json.dump(res, fh, default=str, indent=1)
  return 1 if res["failures"] else 0


if __name__ == "__main__":
  sys.exit(main())
