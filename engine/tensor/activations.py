"""Activation functions (gelu, silu, elu, softplus, ...).

Compositions of the elementwise math (relu, sigmoid, tanh, softmax live in elementwise.py and nn.py). The ones
that stay piecewise linear (relu6, hardtanh) keep integer dtypes as tinygrad's do; the others compute in float32
for float16 and integer inputs and round to float16 at the end."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING: from rulec.engine.tensor.tensor import Tensor


class ActivationsMixin:
  """Activation functions (gelu, silu, elu, softplus, ...)."""
  __slots__ = ()

  def gelu(self, approximate: str = "tanh") -> Tensor:
    """x * Phi(x): approximate='tanh' (tinygrad's default) uses the tanh form, 'none' the exact erf form."""
    if approximate not in ("tanh", "none"): raise RuntimeError(f"approximate={approximate!r} is not supported")
    if approximate == "none": return self._in_float(lambda x: x * 0.5 * (1 + (x * (1 / math.sqrt(2))).erf()))
    k = math.sqrt(2 / math.pi)
    return self._in_float(lambda x: x * 0.5 * (1 + (k * (x + 0.044715 * x * x * x)).tanh()))

  def quick_gelu(self) -> Tensor:
    """x * sigmoid(1.702 x), the sigmoid approximation of gelu."""
    return self._in_float(lambda x: x * (x * 1.702).sigmoid())

  def silu(self) -> Tensor:
    """x * sigmoid(x)."""
    return self._in_float(lambda x: x * x.sigmoid())

  def swish(self) -> Tensor:
    """silu: x * sigmoid(x)."""
    return self.silu()

  def elu(self, alpha: float = 1.0) -> Tensor:
    """x for x > 0, alpha * (exp(x) - 1) below."""
    return self._in_float(lambda x: (x > 0).where(x, x.minimum(0.0)._expm1() * alpha))

  def celu(self, alpha: float = 1.0) -> Tensor:
    """x for x > 0, alpha * (exp(x / alpha) - 1) below."""
    return self._in_float(lambda x: (x > 0).where(x, (x.minimum(0.0) / alpha)._expm1() * alpha))

  def selu(self, alpha: float = 1.67326, gamma: float = 1.0507) -> Tensor:
    """gamma * elu(x, alpha), with tinygrad's rounded constants as defaults."""
    return self._in_float(lambda x: (x >= 0).where(x, x.minimum(0.0)._expm1() * alpha) * gamma)

  def leaky_relu(self, neg_slope: float = 0.01) -> Tensor:
    """x for x >= 0, neg_slope * x below."""
    return self._in_float(lambda x: (x < 0).where(x * neg_slope, x))

  def relu6(self) -> Tensor:
    """min(max(x, 0), 6); integer tensors stay integer."""
    return self.clip(0, 6)

  def hardtanh(self, min_val: Any = -1, max_val: Any = 1) -> Tensor:
    """x clipped to [min_val, max_val]."""
    return self.clip(min_val, max_val)

  def hardsigmoid(self, alpha: float = 1 / 6, beta: float = 0.5) -> Tensor:
    """alpha * x + beta clipped to [0, 1]."""
    return self._in_float(lambda x: (x * alpha + beta).clip(0.0, 1.0))

  def hardswish(self) -> Tensor:
    """x * relu6(x + 3) / 6."""
    return self._in_float(lambda x: x * (x + 3).clip(0.0, 6.0) * (1 / 6))

  def _softplus(self, beta: float) -> Tensor:
    # log(1 + e^bx) = max(bx, 0) + log(1 + e^-|bx|): the exp never overflows
    bx = self * beta
    return (bx.maximum(0.0) + (-bx.abs()).exp()._log1p()) * (1 / beta)

  def softplus(self, beta: float = 1.0) -> Tensor:
    """log(1 + exp(beta * x)) / beta, without overflow for large x."""
    return self._in_float(lambda x: x._softplus(beta))

  def mish(self) -> Tensor:
    """x * tanh(softplus(x))."""
    return self._in_float(lambda x: x * x._softplus(1.0).tanh())

  def softsign(self) -> Tensor:
    """x / (1 + |x|)."""
    return self._in_float(lambda x: x / (1 + x.abs()))

  def logsigmoid(self) -> Tensor:
    """log(sigmoid(x)) = -softplus(-x), without overflow."""
    return self._in_float(lambda x: -(-x)._softplus(1.0))

  def softmin(self, axis: int = -1, dtype: Any = None) -> Tensor:
    """softmax(-x) along axis; dtype casts the input first (as tinygrad's softmax(dtype=))."""
    x = self if dtype is None else self.cast(dtype)
    if not x.dtype.is_float: x = x.cast(x._half_up()[1])
    return (-x).softmax(axis)
