"""Layers with weights: Linear, the convolutions, Embedding, LSTMCell, and Dropout.

Initialisations follow tinygrad 0.14: Linear and the convolutions draw weight and bias uniformly from
[-1/sqrt(fan_in), 1/sqrt(fan_in)) (fan_in counts every input channel, not per group), Embedding uses
glorot_uniform, LSTMCell uniform +-1/sqrt(hidden_size) weights and zero biases. Weights stay lazy until the first
realize (an optimizer step or a load_state_dict writes them into buffers)."""
from __future__ import annotations

import math
from typing import Any

from rulec.engine.tensor import Tensor
from rulec.engine.ir.uop import prod


def _ksize(kernel_size: Any, n: int = 2) -> tuple[int, ...]:
  """kernel_size as a tuple: an int stands for n equal sizes, a tuple is kept (its length picks the conv's rank)."""
  ks = tuple(kernel_size) if isinstance(kernel_size, (tuple, list)) else (kernel_size,) * n
  if not ks or not all(isinstance(k, int) and k > 0 for k in ks):
    raise ValueError(f"kernel_size must be a positive int or a tuple of them, got {kernel_size!r}")
  return ks


def _channels(**kw: int) -> None:
  for name, v in kw.items():
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0: raise ValueError(f"{name} must be a positive int, got {v!r}")


def _same_padding(ks: tuple[int, ...], stride: Any, dilation: Any) -> tuple[int, ...]:
  """padding='same' as torch's flat (before, after) pairs, last spatial dim first; the odd pixel goes after."""
  if stride != 1: raise ValueError("padding='same' is not supported for strided convolutions")
  dil = tuple(dilation) if isinstance(dilation, (tuple, list)) else (dilation,) * len(ks)
  flat: list[int] = []
  for d, k in zip(dil[::-1], ks[::-1]):
    total = d * (k - 1)
    flat += [total // 2, total - total // 2]
  return tuple(flat)


class Linear:
  """Linear(in_features, out_features, bias=True): y = x @ weight.T + bias; weight is (out_features, in_features)."""
  def __init__(self, in_features: int, out_features: int, bias: bool = True):
    _channels(in_features=in_features, out_features=out_features)
    bound = 1 / math.sqrt(in_features)
    self.weight = Tensor.uniform(out_features, in_features, low=-bound, high=bound)
    self.bias = Tensor.uniform(out_features, low=-bound, high=bound) if bias else None

  def __call__(self, x: Tensor) -> Tensor:
    if x.shape[-1:] != self.weight.shape[1:]:
      raise ValueError(f"Linear: input of shape {x.shape} does not end in in_features={self.weight.shape[1]}")
    return x.linear(self.weight.T, self.bias)


class Conv2d:
  """Conv2d(in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1, bias=True).

  An int kernel_size is square; a tuple's length sets the number of spatial dims (Conv1d passes one). padding
  is an int, one int per dim, torch's flat pairs, or 'same' (stride 1 only)."""
  def __init__(self, in_channels: int, out_channels: int, kernel_size: Any, stride: Any = 1, padding: Any = 0,
               dilation: Any = 1, groups: int = 1, bias: bool = True):
    _channels(in_channels=in_channels, out_channels=out_channels, groups=groups)
    if in_channels % groups or out_channels % groups:
      raise ValueError(f"in_channels={in_channels} and out_channels={out_channels} must both divide by groups={groups}")
    self.kernel_size = _ksize(kernel_size)
    if isinstance(padding, str):
      if padding.lower() != "same": raise ValueError(f"padding={padding!r}: the only string accepted is 'same'")
      padding = _same_padding(self.kernel_size, stride, dilation)
    self.stride, self.dilation, self.groups, self.padding = stride, dilation, groups, padding
    scale = 1 / math.sqrt(in_channels * prod(self.kernel_size))
    self.weight = Tensor.uniform(out_channels, in_channels // groups, *self.kernel_size, low=-scale, high=scale)
    self.bias = Tensor.uniform(out_channels, low=-scale, high=scale) if bias else None

  def __call__(self, x: Tensor) -> Tensor:
    return x.conv2d(self.weight, self.bias, self.groups, self.stride, self.dilation, self.padding)


def Conv1d(in_channels: int, out_channels: int, kernel_size: int, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
           groups: int = 1, bias: bool = True) -> Conv2d:
  """Conv1d(...): a Conv2d over one spatial dim (input (N, C, L)), as tinygrad builds it."""
  return Conv2d(in_channels, out_channels, (kernel_size,), stride, padding, dilation, groups, bias)


class ConvTranspose2d(Conv2d):
  """ConvTranspose2d(in_channels, out_channels, kernel_size, stride=1, padding=0, output_padding=0, dilation=1,
  groups=1, bias=True): weight is (in_channels, out_channels/groups, *kernel), as torch's."""
  def __init__(self, in_channels: int, out_channels: int, kernel_size: Any, stride: Any = 1, padding: Any = 0,
               output_padding: Any = 0, dilation: Any = 1, groups: int = 1, bias: bool = True):
    if isinstance(padding, str): raise ValueError(f"ConvTranspose2d: padding={padding!r} must be ints")
    super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias)
    scale = 1 / math.sqrt(in_channels * prod(self.kernel_size))
    self.weight = Tensor.uniform(in_channels, out_channels // groups, *self.kernel_size, low=-scale, high=scale)
    self.output_padding = output_padding

  def __call__(self, x: Tensor) -> Tensor:
    return x.conv_transpose2d(self.weight, self.bias, self.groups, self.stride, self.dilation, self.padding,
                              self.output_padding)


def ConvTranspose1d(in_channels: int, out_channels: int, kernel_size: int, stride: Any = 1, padding: Any = 0,
                    output_padding: Any = 0, dilation: Any = 1, groups: int = 1, bias: bool = True) -> ConvTranspose2d:
  """ConvTranspose1d(...): a ConvTranspose2d over one spatial dim."""
  return ConvTranspose2d(in_channels, out_channels, (kernel_size,), stride, padding, output_padding, dilation, groups, bias)


class Embedding:
  """Embedding(vocab_size, embed_size): rows of weight (vocab_size, embed_size) picked by integer indices;
  the result has shape idx.shape + (embed_size,)."""
  def __init__(self, vocab_size: int, embed_size: int):
    _channels(vocab_size=vocab_size, embed_size=embed_size)
    self.vocab_sz, self.embed_sz = vocab_size, embed_size
    self.weight = Tensor.glorot_uniform(vocab_size, embed_size)

  def __call__(self, idx: Tensor) -> Tensor:
    if not isinstance(idx, Tensor): idx = Tensor(idx)
    if not idx.dtype.is_int: raise TypeError(f"Embedding expects integer indices, got dtype {idx.dtype.name}")
    return self.weight[idx]


class LSTMCell:
  """LSTMCell(input_size, hidden_size, bias=True): one LSTM step; `cell(x, (h, c))` returns the new (h, c),
  starting from zeros when hc is None. Gates are ordered input, forget, cell, output (torch's)."""
  def __init__(self, input_size: int, hidden_size: int, bias: bool = True):
    _channels(input_size=input_size, hidden_size=hidden_size)
    stdv = 1.0 / math.sqrt(hidden_size)
    self.weight_ih = Tensor.uniform(hidden_size * 4, input_size, low=-stdv, high=stdv)
    self.weight_hh = Tensor.uniform(hidden_size * 4, hidden_size, low=-stdv, high=stdv)
    self.bias_ih = Tensor.zeros(hidden_size * 4) if bias else None
    self.bias_hh = Tensor.zeros(hidden_size * 4) if bias else None

  def __call__(self, x: Tensor, hc: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
    hidden = self.weight_hh.shape[1]
    if hc is None:
      zero = Tensor.zeros(x.shape[0], hidden, dtype=x.dtype, device=x.device)
      hc = (zero, zero)
    h, c = hc
    gates = x.linear(self.weight_ih.T, self.bias_ih) + h.linear(self.weight_hh.T, self.bias_hh)
    i, f, g, o = gates.chunk(4, dim=1)
    new_c = f.sigmoid() * c + i.sigmoid() * g.tanh()
    return o.sigmoid() * new_c.tanh(), new_c


class Dropout:
  """Dropout(p=0.5): Tensor.dropout as a module (zeroes with probability p in training mode only).
  tinygrad 0.14 has no nn.Dropout; this is rulec's, for torch-shaped model code."""
  def __init__(self, p: float = 0.5):
    if not 0 <= p <= 1: raise ValueError(f"Dropout: p={p} is out of range [0, 1]")
    self.p = p

  def __call__(self, x: Tensor) -> Tensor: return x.dropout(self.p)
