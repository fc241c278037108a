"""Creating tensors: constants, ranges, identity matrices, empty buffers, random values and initialisers.

Signatures and defaults are tinygrad 0.14's; rulec's extra `device=` keywords (arange, eye, linspace) stay.
Ranges and identity matrices are built lazily from constants and movement ops (no host arrays); random values
come from the class's numpy generator `_rng` (seeded by manual_seed) and are then scaled lazily."""
from __future__ import annotations

import functools
import itertools
import math
from typing import TYPE_CHECKING, Any

import numpy as np

from rulec.engine.ir.dtypes import dtypes
from rulec.engine.tensor.args import (canon_device, cast_scalar, from_numpy_dtype, int_arg,
                                shape_arg, specialise, to_dtype)
from rulec.engine.tensor.uops import alu, const
from rulec.engine.ir.ops import Ops
from rulec.engine.ir.uop import UOp, prod
from rulec.runtime.buffer import new_buffer, np_dtype

if TYPE_CHECKING: from rulec.engine.tensor.tensor import Tensor


class DTypeArgError(TypeError, ValueError):
  """A dtype a creation function cannot make (rand of ints): tinygrad raises ValueError, older rulec TypeError."""


class StepError(ValueError, ZeroDivisionError):
  """arange's step of zero: tinygrad raises ZeroDivisionError, numpy (and older rulec) ValueError."""


def _shape(shape: tuple, what: str = "shape") -> tuple[int, ...]:
  s = shape_arg(shape, what)
  if any(d < 0 for d in s): raise ValueError(f"negative dimensions are not allowed: {s}")
  return s


def _iota(n: int) -> UOp:
  """0, 1, ..., n-1 as int32, lazily: the sum of the binary digits' patterns 2^b * [i >> b & 1].

  Each pattern is 2^b zeros then 2^b ones, tiled with EXPAND and cut with SHRINK, so the whole range is
  movement ops over constants (log2(n) terms, fused into one elementwise kernel)."""
  if n <= 1: return const(0, dtypes.int32, (n,))
  out = None
  for b in range((n - 1).bit_length()):
    w = 1 << b
    reps = -(-n // (2 * w))
    bit = const(w, dtypes.int32, (w,)).pad(((w, 0),))  # (2w,): w zeros, then w copies of 2^b
    bit = bit.reshape((1, 2 * w)).expand((reps, 2 * w)).reshape((reps * 2 * w,)).shrink(((0, n),))
    out = bit if out is None else alu(Ops.ADD, out, bit)
  return out


def _is_num(v: Any) -> bool:
  return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


def _requires_grad_kw(fn):
  """The constructor also takes torch's (and older tinygrad's) `requires_grad=` keyword, as Tensor() does: the
  tensor made gets that requires_grad (None, the default, leaves it as made). The signature shown stays fn's."""
  @functools.wraps(fn)
  def make(*args, requires_grad: bool | None = None, **kwargs):
    t = fn(*args, **kwargs)
    if requires_grad is not None: t.requires_grad = bool(requires_grad)
    return t
  return make


# tags that keep user-made float constants apart (see full)
_LEAF_IDS = itertools.count()

class CreationMixin:
  """Tensor constructors (classmethods, so subclasses build their own kind)."""
  __slots__ = ()

  # *** constants ***

  @classmethod
  def manual_seed(cls, seed: int = 0) -> None:
    """manual_seed(seed=0): seed the generator behind rand, randn, randint and the initialisers."""
    cls._rng = np.random.default_rng(seed)

  @classmethod
  @_requires_grad_kw
  def full(cls, shape: Any, fill_value: Any, dtype: Any = None, device: str | None = None, buffer: bool = True) -> Tensor:
    """full(shape, fill_value, dtype=None, device=None, buffer=True): a tensor of one value; the dtype follows
    the value (bool, int32 (int64 if it does not fit), float32). `buffer` is accepted for tinygrad's sake:
    rulec's constants are always lazy. A float constant made here is a node of its own (its CONST is tagged), so
    two `Tensor.zeros(3)` used as two parameters get a gradient each; UOps are hash-consed, and untagged the two
    would be one node."""
    shape = _shape(shape if isinstance(shape, (tuple, list)) else (shape,))
    fill_value = specialise(fill_value)
    if dtype is not None: dt = to_dtype(dtype)
    elif isinstance(fill_value, np.generic): dt = from_numpy_dtype(fill_value.dtype)
    elif isinstance(fill_value, bool): dt = dtypes.bool
    elif isinstance(fill_value, int): dt = dtypes.default_int if -2**31 <= fill_value < 2**31 else dtypes.int64
    elif isinstance(fill_value, float): dt = dtypes.default_float
    else: raise TypeError(f"fill_value must be a scalar, got {type(fill_value).__name__}")
    tag = ("leaf", next(_LEAF_IDS)) if dt.is_float else None
    return cls._from_uop(const(cast_scalar(fill_value, dt), dt, shape, tag), canon_device(device))

  @classmethod
  @_requires_grad_kw
  def zeros(cls, *shape, dtype: Any = None, device: str | None = None) -> Tensor:
    """zeros(*shape, dtype=None, device=None): float32 zeros unless dtype says otherwise; shape as ints or a tuple."""
    return cls.full(_shape(shape), 0, dtype=dtypes.default_float if dtype is None else dtype, device=device)

  @classmethod
  @_requires_grad_kw
  def ones(cls, *shape, dtype: Any = None, device: str | None = None) -> Tensor:
    """ones(*shape, dtype=None, device=None): float32 ones unless dtype says otherwise; shape as ints or a tuple."""
    return cls.full(_shape(shape), 1, dtype=dtypes.default_float if dtype is None else dtype, device=device)

  @classmethod
  @_requires_grad_kw
  def empty(cls, *shape, device: str | None = None, dtype: Any = None) -> Tensor:
    """empty(*shape, device=None, dtype=None): a fresh buffer whose contents are undefined (float32 by default)."""
    s, dt = _shape(shape), dtypes.default_float if dtype is None else to_dtype(dtype)
    dev = canon_device(device)
    if isinstance(dev, tuple):   # a device set: a buffer on each
      from rulec.engine.tensor.multi import fresh_buffers
      return cls._from_uop(fresh_buffers(s, dt, dev), dev)
    return cls._from_uop(new_buffer(dev, prod(s), dt).reshape(s), dev)

  @_requires_grad_kw
  def zeros_like(self, dtype: Any = None, device: str | None = None) -> Tensor:
    """zeros_like(dtype=None, device=None): zeros of this shape, dtype and device unless told otherwise."""
    return self.full_like(0, dtype, device)

  @_requires_grad_kw
  def ones_like(self, dtype: Any = None, device: str | None = None) -> Tensor:
    """ones_like(dtype=None, device=None): ones of this shape, dtype and device unless told otherwise."""
    return self.full_like(1, dtype, device)

  @_requires_grad_kw
  def full_like(self, fill_value: Any, dtype: Any = None, device: str | None = None, buffer: bool = True) -> Tensor:
    """full_like(fill_value, dtype=None, device=None, buffer=True): fill_value cast to this tensor's dtype
    (full_like(2.5) of an int tensor holds 2, as in tinygrad and numpy)."""
    return type(self).full(self.shape, fill_value, dtype=self.dtype if dtype is None else dtype,
                           device=self.device if device is None else device)

  @_requires_grad_kw
  def empty_like(self, dtype: Any = None, device: str | None = None) -> Tensor:
    """empty_like(dtype=None, device=None): an uninitialised buffer of this shape (and dtype, device)."""
    return type(self).empty(self.shape, dtype=self.dtype if dtype is None else dtype,
                            device=self.device if device is None else device)

  # *** ranges ***

  @classmethod
  @_requires_grad_kw
  def arange(cls, start: Any, stop: Any = None, step: Any = 1, dtype: Any = None, device: str | None = None) -> Tensor:
    """arange(start, stop=None, step=1, dtype=None): start, start+step, ... below stop. Ints give int32, or int64
    when a value does not fit int32 (tinygrad); any float gives float32. Values are start + i*step."""
    start, stop, step = specialise(start), specialise(stop), specialise(step)   # (bound Variables: their values)
    if stop is None: start, stop = 0, start
    for v, name in ((start, "start"), (stop, "stop"), (step, "step")):
      if not _is_num(v): raise TypeError(f"arange {name} must be a number, got {v!r}")
    if step == 0: raise StepError(f"arange step must not be zero (start={start}, stop={stop})")
    n = max(0, math.ceil((stop - start) / step))
    if n and (dtype is not None or not any(isinstance(v, (float, np.floating)) for v in (start, stop, step))):
      # an integer dtype (given, or int64 picked for big ints) must hold the first and the last value (tinygrad:
      # OverflowError; torch and numpy wrap around silently)
      idt = dtypes.int64 if dtype is None else to_dtype(dtype)
      if not idt.is_float:
        lo, hi = (False, True) if idt.is_bool else (idt.min(), idt.max())
        ends = (math.trunc(start), math.trunc(start + (n - 1) * step))
        if not all(lo <= e <= hi for e in ends):
          raise OverflowError(f"arange({start}, {stop}, {step}): the values {ends[0]} .. {ends[1]} do not fit {idt.name}")
    floats = any(isinstance(v, (float, np.floating)) for v in (start, stop, step))
    fits32 = all(-2**31 <= v < 2**31 for v in (start, start + n * step))
    if dtype is not None: dt = to_dtype(dtype)
    elif floats: dt = dtypes.default_float
    else: dt = dtypes.int32 if fits32 else dtypes.int64
    # computed in dt for floats (half floats in float32: start + i*step rounded once, as tinygrad and numpy), in a
    # wide enough int otherwise, then cast (an int dtype truncates float steps)
    work = (dtypes.float32 if dt.itemsize < 4 else dt) if dt.is_float else dtypes.default_float if floats \
      else dtypes.int32 if fits32 else dtypes.int64
    dev = canon_device(device)
    i = cls._from_uop(_iota(n).cast(work), dev)
    return (i * _num(step, work) + _num(start, work)).cast(dt) if n else i.cast(dt)

  @classmethod
  @_requires_grad_kw
  def linspace(cls, start: Any, stop: Any, steps: int, dtype: Any = None, device: str | None = None) -> Tensor:
    """linspace(start, stop, steps, dtype=None): steps evenly spaced values from start to stop inclusive
    (float32; an int dtype truncates, as tinygrad)."""
    for v, name in ((start, "start"), (stop, "stop")):
      if not _is_num(v): raise TypeError(f"linspace {name} must be a number, got {v!r}")
    steps = int_arg(steps, "linspace steps")
    if steps < 0: raise ValueError(f"linspace: number of steps must be non-negative, got {steps}")
    dt = dtypes.default_float if dtype is None else to_dtype(dtype)
    if dt.is_bool: raise ValueError("linspace with bool dtype is not supported (tinygrad, torch)")
    work = dtypes.float64 if dt is dtypes.float64 else dtypes.float32
    i = cls._from_uop(_iota(steps).cast(work), canon_device(device))
    if steps <= 1: return (i + float(start)).cast(dt)
    return (i * ((float(stop) - float(start)) / (steps - 1)) + float(start)).cast(dt)

  @classmethod
  @_requires_grad_kw
  def eye(cls, n: int, m: int | None = None, dtype: Any = None, device: str | None = None) -> Tensor:
    """eye(n, m=None, dtype=None): the n x m identity (ones on the main diagonal), float32 by default."""
    n = int_arg(n, "eye n")
    m = n if m is None else int_arg(m, "eye m")
    if n < 0 or m < 0: raise ValueError(f"eye needs non-negative sizes, got n={n}, m={m}")
    dt = dtypes.default_float if dtype is None else to_dtype(dtype)
    k = min(n, m)
    d = cls.full((k,), 1, dtype=dt, device=device).diag()
    return cls._from_uop(d.uop.pad(((0, n - k), (0, m - k))), d.device)

  # *** random values ***

  @classmethod
  def _random(cls, kind: str, shape: tuple, dtype: Any, device: str | None) -> Tensor:
    shape = _shape(shape)
    dt = dtypes.default_float if dtype is None else to_dtype(dtype)
    if not dt.is_float: raise DTypeArgError(f"{kind} only supports float dtypes, got {dt.name}")
    gen = np.float64 if dt is dtypes.float64 else np.float32
    rng = cls._rng
    if kind == "rand":
      a = rng.random(shape, dtype=gen).astype(np_dtype(dt))
      # stay below 1: the largest value below 1 is 1 - 2**-11 in float16, 1 - 2**-8 in bfloat16 (its precision)
      if dt.is_half: a = np.minimum(a, np.array(1 - 2.0 ** -(11 if dt is dtypes.float16 else 8)).astype(a.dtype))
    else: a = rng.standard_normal(shape, dtype=gen).astype(np_dtype(dt))
    return cls(a, dtype=dt, device=device)

  @classmethod
  @_requires_grad_kw
  def rand(cls, *shape, device: str | None = None, dtype: Any = None, contiguous: bool = True) -> Tensor:
    """rand(*shape, device=None, dtype=None, contiguous=True): uniform in [0, 1); float dtypes only."""
    return cls._random("rand", shape, dtype, device)

  @classmethod
  @_requires_grad_kw
  def randn(cls, *shape, dtype: Any = None, device: str | None = None) -> Tensor:
    """randn(*shape, dtype=None, device=None): standard normal; an int dtype casts the floats (tinygrad)."""
    dt = None if dtype is None else to_dtype(dtype)
    if dt is not None and not dt.is_float: return cls._random("randn", shape, None, device).cast(dt)
    return cls._random("randn", shape, dt, device)

  @classmethod
  @_requires_grad_kw
  def randint(cls, *shape, low: int = 0, high: int = 10, dtype: Any = dtypes.int32, device: str | None = None) -> Tensor:
    """randint(*shape, low=0, high=10, dtype=int32, device=None): uniform integers in [low, high).
    rulec's old form randint(low, high, shape_tuple) is still read as such."""
    if len(shape) == 3 and isinstance(shape[2], (tuple, list)):
      low, high, shape = shape[0], shape[1], tuple(shape[2])  # rulec's old randint(low, high, shape) keeps working
    if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in (low, high)):
      raise TypeError(f"randint: low={low!r} and high={high!r} must be integers")
    if not low < high: raise ValueError(f"randint requires low < high, got low={low}, high={high}")
    dt = to_dtype(dtype)
    if not dt.is_int: raise TypeError(f"randint: dtype={dt.name} must be an integer dtype")
    return cls(cls._rng.integers(low, high, _shape(shape)), dtype=dt, device=device)

  @classmethod
  def randperm(cls, n: int, device: str | None = None, dtype: Any = dtypes.int32) -> Tensor:
    """randperm(n, device=None, dtype=int32): a random permutation of 0 .. n-1."""
    n = int_arg(n, "randperm n")
    if n < 0: raise ValueError(f"randperm: n must be non-negative, got {n}")
    return cls(cls._rng.permutation(n), dtype=dtype, device=device)

  @classmethod
  @_requires_grad_kw
  def normal(cls, *shape, mean: float = 0.0, std: float = 1.0, dtype: Any = None, device: str | None = None) -> Tensor:
    """normal(*shape, mean=0.0, std=1.0, dtype=None, device=None): normal values of that mean and std."""
    return (cls.randn(*shape, dtype=dtype, device=device) * std + mean).cast(dtypes.default_float if dtype is None else dtype)

  @classmethod
  @_requires_grad_kw
  def uniform(cls, *shape, low: float = 0.0, high: float = 1.0, dtype: Any = None, device: str | None = None) -> Tensor:
    """uniform(*shape, low=0.0, high=1.0, dtype=None, device=None): uniform in [low, high)."""
    dt = dtypes.default_float if dtype is None else to_dtype(dtype)
    r = cls._random("rand", shape, dt if dt.is_float else None, device)
    return (r * (high - low)).cast(dt) + low  # cast before the shift, as tinygrad: ints floor within [low, high)

  @classmethod
  @_requires_grad_kw
  def scaled_uniform(cls, *shape, dtype: Any = None, device: str | None = None) -> Tensor:
    """scaled_uniform(*shape): uniform in [-1, 1) scaled by 1/sqrt(numel)."""
    s = _shape(shape)
    return cls.uniform(s, low=-1.0, high=1.0, dtype=dtype, device=device) * (max(prod(s), 1) ** -0.5)

  @classmethod
  @_requires_grad_kw
  def glorot_uniform(cls, *shape, dtype: Any = None, device: str | None = None) -> Tensor:
    """glorot_uniform(*shape): uniform in [-b, b) with b = sqrt(6 / (shape[0] + prod(shape[1:]))) (Xavier)."""
    s = _shape(shape)
    fan = (s[0] if s else 1) + prod(s[1:])
    return cls.uniform(s, low=-1.0, high=1.0, dtype=dtype, device=device) * math.sqrt(6 / max(fan, 1))

  @classmethod
  @_requires_grad_kw
  def kaiming_uniform(cls, *shape, a: float = 0.01, dtype: Any = None, device: str | None = None) -> Tensor:
    """kaiming_uniform(*shape, a=0.01): uniform in [-b, b) with b = sqrt(6 / ((1 + a^2) * prod(shape[1:])))."""
    s = _shape(shape)
    bound = math.sqrt(3.0) * math.sqrt(2.0 / (1 + a ** 2)) / math.sqrt(max(prod(s[1:]), 1))
    return cls.uniform(s, low=-bound, high=bound, dtype=dtype, device=device)

  @classmethod
  @_requires_grad_kw
  def kaiming_normal(cls, *shape, a: float = 0.01, dtype: Any = None, device: str | None = None) -> Tensor:
    """kaiming_normal(*shape, a=0.01): normal with std sqrt(2 / ((1 + a^2) * prod(shape[1:])))."""
    s = _shape(shape)
    std = math.sqrt(2.0 / (1 + a ** 2)) / math.sqrt(max(prod(s[1:]), 1))
    return cls.normal(s, mean=0.0, std=std, dtype=dtype, device=device)

  @_requires_grad_kw
  def rand_like(self, dtype: Any = None, device: str | None = None) -> Tensor:
    """rand_like(dtype=None, device=None): rand of this shape (and float dtype, device)."""
    return type(self).rand(self.shape, dtype=self.dtype if dtype is None else dtype,
                           device=self.device if device is None else device)

  @_requires_grad_kw
  def randn_like(self, dtype: Any = None, device: str | None = None) -> Tensor:
    """randn_like(dtype=None, device=None): randn of this shape, dtype (ints get cast floats) and device."""
    return type(self).randn(self.shape, dtype=self.dtype if dtype is None else dtype,
                            device=self.device if device is None else device)


def _num(v: Any, dt) -> Any:
  """A Python number for arithmetic with a tensor of dtype dt (ints stay exact for integer work dtypes)."""
  return float(v) if dt.is_float else int(v)
