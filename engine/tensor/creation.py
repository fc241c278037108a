"""Creating tensors: constants, ranges, identity matrices and random values."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from engine.dtypes import dtypes
from engine.tensor.args import (canon_device, cast_scalar, from_numpy_dtype, int_arg,
                                shape_arg, to_dtype)
from engine.tensor.uops import (const)
from runtime.buffer import np_dtype

if TYPE_CHECKING: from engine.tensor.tensor import Tensor


class CreationMixin:
  """Tensor constructors (classmethods, so subclasses build their own kind)."""
  __slots__ = ()

  # *** creation ***

  @classmethod
  def manual_seed(cls, seed: int = 0) -> None:
    """Seed the generator behind rand, randn and randint."""
    cls._rng = np.random.default_rng(seed)

  @classmethod
  def full(cls, shape: Any, fill_value: Any, dtype: Any = None, device: str | None = None) -> Tensor:
    shape = shape_arg(shape if isinstance(shape, (tuple, list)) else (shape,), "shape")
    if any(s < 0 for s in shape): raise ValueError(f"negative dimensions are not allowed: {shape}")
    if dtype is not None: dt = to_dtype(dtype)
    elif isinstance(fill_value, np.generic): dt = from_numpy_dtype(fill_value.dtype)
    elif isinstance(fill_value, bool): dt = dtypes.bool
    elif isinstance(fill_value, int): dt = dtypes.default_int if -2**31 <= fill_value < 2**31 else dtypes.int64
    elif isinstance(fill_value, float): dt = dtypes.default_float
    else: raise TypeError(f"fill_value must be a scalar, got {type(fill_value).__name__}")
    return cls._from_uop(const(cast_scalar(fill_value, dt), dt, shape), canon_device(device))

  @classmethod
  def zeros(cls, *shape, dtype: Any = None, device: str | None = None) -> Tensor:
    return cls.full(shape_arg(shape, "shape"), 0, dtype=dtypes.default_float if dtype is None else dtype, device=device)

  @classmethod
  def ones(cls, *shape, dtype: Any = None, device: str | None = None) -> Tensor:
    return cls.full(shape_arg(shape, "shape"), 1, dtype=dtypes.default_float if dtype is None else dtype, device=device)

  def zeros_like(self, dtype: Any = None) -> Tensor: return type(self).zeros(self.shape, dtype=dtype or self.dtype, device=self.device)
  def ones_like(self, dtype: Any = None) -> Tensor: return type(self).ones(self.shape, dtype=dtype or self.dtype, device=self.device)
  def full_like(self, fill_value: Any, dtype: Any = None) -> Tensor:
    return type(self).full(self.shape, fill_value, dtype=dtype or self.dtype, device=self.device)

  @classmethod
  def arange(cls, start: Any, stop: Any = None, step: Any = 1, dtype: Any = None, device: str | None = None) -> Tensor:
    if stop is None: start, stop = 0, start
    for v, name in ((start, "start"), (stop, "stop"), (step, "step")):
      if not isinstance(v, (int, float, np.integer, np.floating)) or isinstance(v, (bool, np.bool_)):
        raise TypeError(f"arange {name} must be a number, got {v!r}")
    if step == 0: raise ValueError("arange step must not be zero")
    if dtype is None:
      dtype = dtypes.default_float if any(isinstance(v, (float, np.floating)) for v in (start, stop, step)) else dtypes.default_int
    return cls(np.arange(start, stop, step), dtype=dtype, device=device)

  @classmethod
  def eye(cls, n: int, m: int | None = None, dtype: Any = None, device: str | None = None) -> Tensor:
    n = int_arg(n, "eye n")
    m = n if m is None else int_arg(m, "eye m")
    if n < 0 or m < 0: raise ValueError(f"eye needs non-negative sizes, got n={n}, m={m}")
    return cls(np.eye(n, m), dtype=dtypes.default_float if dtype is None else dtype, device=device)

  @classmethod
  def _random(cls, kind: str, shape: tuple, dtype: Any, device: str | None) -> Tensor:
    shape = shape_arg(shape, "shape")
    if any(s < 0 for s in shape): raise ValueError(f"negative dimensions are not allowed: {shape}")
    dt = dtypes.default_float if dtype is None else to_dtype(dtype)
    if not dt.is_float: raise TypeError(f"{kind} needs a float dtype, got {dt.name}")
    gen = np.float64 if dt is dtypes.float64 else np.float32
    rng = cls._rng
    if kind == "rand":
      a = rng.random(shape, dtype=gen).astype(np_dtype(dt))
      if dt is dtypes.float16: a = np.minimum(a, np.nextafter(np.float16(1), np.float16(0)))  # stay below 1
    else: a = rng.standard_normal(shape, dtype=gen).astype(np_dtype(dt))
    return cls(a, dtype=dt, device=device)

  @classmethod
  def rand(cls, *shape, dtype: Any = None, device: str | None = None) -> Tensor:
    """Uniform in [0, 1)."""
    return cls._random("rand", shape, dtype, device)

  @classmethod
  def randn(cls, *shape, dtype: Any = None, device: str | None = None) -> Tensor:
    """Standard normal."""
    return cls._random("randn", shape, dtype, device)

  @classmethod
  def randint(cls, low: int, high: int | None = None, shape: Any = (), dtype: Any = None, device: str | None = None) -> Tensor:
    """Uniform integers in [low, high) (or [0, low))."""
    if high is None: low, high = 0, low
    low, high = int_arg(low, "randint low"), int_arg(high, "randint high")
    if high <= low: raise ValueError(f"randint needs low < high, got low={low}, high={high}")
    shape = shape_arg(shape if isinstance(shape, (tuple, list)) else (shape,), "shape")
    dt = dtypes.default_int if dtype is None else to_dtype(dtype)
    return cls(cls._rng.integers(low, high, shape), dtype=dt, device=device)

  # *** realizing ***
