"""Normalisation layers: BatchNorm (and its 2d/3d names), LayerNorm, LayerNorm2d, GroupNorm, InstanceNorm, RMSNorm.

Statistics are biased (divide by n) as in tinygrad and torch; BatchNorm's running variance alone is updated with
the unbiased batch variance."""
from __future__ import annotations

from rulec.engine.ir.dtypes import dtypes
from rulec.engine.tensor import Tensor


def _frozen(t: Tensor) -> Tensor:
  """A tensor that is state, not a parameter: no gradient, and optimizers realize it without updating it
  (tinygrad 0.14's is_param_(False))."""
  t.requires_grad, t.is_param = False, False
  return t


def _per_channel(p: Tensor, ndim: int) -> Tensor:
  """A (C,) parameter shaped to broadcast over axis 1 of an ndim-d input."""
  return p.reshape(1, -1, *([1] * (ndim - 2)))


class BatchNorm:
  """BatchNorm(sz, eps=1e-5, affine=True, track_running_stats=True, momentum=0.1) over axis 1 of (N, C, ...).

  In training mode (Tensor.training) it normalises with the batch's mean and biased variance and updates
  running_mean / running_var lazily with assign (running_var takes the unbiased variance), and counts
  num_batches_tracked: the writes are carried out with the next realize that holds them, such as an optimizer
  step given these tensors (get_parameters lists them). Out of training mode it uses the running statistics
  (or the batch's when track_running_stats is False)."""
  def __init__(self, sz: int, eps: float = 1e-5, affine: bool = True, track_running_stats: bool = True,
               momentum: float = 0.1):
    if not isinstance(sz, int) or sz <= 0: raise ValueError(f"BatchNorm: sz must be a positive int, got {sz!r}")
    self.eps, self.track_running_stats, self.momentum = eps, track_running_stats, momentum
    self.weight = Tensor.ones(sz) if affine else None
    self.bias = Tensor.zeros(sz) if affine else None
    self.num_batches_tracked = _frozen(Tensor.zeros(dtype=dtypes.int64))
    if track_running_stats:
      self.running_mean, self.running_var = _frozen(Tensor.zeros(sz)), _frozen(Tensor.ones(sz))

  def calc_stats(self, x: Tensor) -> tuple[Tensor, Tensor]:
    """(mean, variance) per channel: the running ones in eval mode, else the batch's (biased variance)."""
    if self.track_running_stats and not Tensor.training: return self.running_mean, self.running_var
    axes = tuple(a for a in range(x.ndim) if a != 1)
    mean = x.mean(axis=axes)
    d = x - _per_channel(mean.detach(), x.ndim)   # the variance's gradient through the mean is zero anyway
    return mean, (d * d).mean(axis=axes)

  def __call__(self, x: Tensor) -> Tensor:
    C = (self.weight if self.weight is not None else self.running_mean if self.track_running_stats else None)
    if x.ndim < 2 or (C is not None and x.shape[1] != C.shape[0]):
      raise ValueError(f"BatchNorm: input of shape {x.shape} needs {C.shape[0] if C is not None else 'C'} channels on axis 1")
    mean, var = self.calc_stats(x)
    if self.track_running_stats and Tensor.training: self._track(x, mean, var)
    return x.batchnorm(self.weight, self.bias, mean, (var + self.eps).rsqrt())

  def _track(self, x: Tensor, mean: Tensor, var: Tensor) -> None:
    n = x.numel() // x.shape[1]
    if n < 2: raise ValueError(f"BatchNorm: training needs more than one value per channel, got input of shape {x.shape}")
    m = self.momentum
    self.running_mean.assign((1 - m) * self.running_mean + m * mean.detach())
    self.running_var.assign((1 - m) * self.running_var + m * (n / (n - 1)) * var.detach())
    self.num_batches_tracked.assign(self.num_batches_tracked + 1)


BatchNorm2d = BatchNorm3d = BatchNorm
BatchNorm1d = BatchNorm   # not in tinygrad 0.14 (its BatchNorm takes (N, C) and (N, C, L) as it is); torch's name


class LayerNorm:
  """LayerNorm(normalized_shape, eps=1e-5, elementwise_affine=True): normalises over the last
  len(normalized_shape) axes, then scales by weight and shifts by bias (of normalized_shape)."""
  def __init__(self, normalized_shape: int | tuple[int, ...], eps: float = 1e-5, elementwise_affine: bool = True):
    self.normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    self.axis, self.eps = tuple(-1 - i for i in range(len(self.normalized_shape))), eps
    self.weight = Tensor.ones(*self.normalized_shape) if elementwise_affine else None
    self.bias = Tensor.zeros(*self.normalized_shape) if elementwise_affine else None

  def __call__(self, x: Tensor) -> Tensor:
    n = len(self.normalized_shape)
    if x.shape[x.ndim - n:] != self.normalized_shape or x.ndim < n:
      raise ValueError(f"LayerNorm: the last dimensions of input shape {x.shape} must be {self.normalized_shape}")
    x = x.layernorm(axis=self.axis, eps=self.eps)
    return x if self.weight is None or self.bias is None else x * self.weight + self.bias


class LayerNorm2d(LayerNorm):
  """LayerNorm2d(channels, ...): LayerNorm over the channel axis of (N, C, H, W) input."""
  def __call__(self, x: Tensor) -> Tensor:
    if x.ndim != 4: raise ValueError(f"LayerNorm2d expects (N, C, H, W) input, got shape {x.shape}")
    return super().__call__(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def _grouped(x: Tensor, groups: int, eps: float, weight: Tensor | None, bias: Tensor | None) -> Tensor:
  """x normalised within each of `groups` runs of channels (per sample), then a per-channel affine."""
  y = x.reshape(x.shape[0], groups, -1).layernorm(eps=eps).reshape(x.shape)
  if weight is None or bias is None: return y
  return y * _per_channel(weight, x.ndim) + _per_channel(bias, x.ndim)


class GroupNorm:
  """GroupNorm(num_groups, num_channels, eps=1e-5, affine=True): per sample, the channels split into num_groups
  groups, each normalised over its channels and spatial positions, then a per-channel weight and bias."""
  def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True):
    if num_groups <= 0 or num_channels % num_groups:
      raise ValueError(f"GroupNorm: num_channels={num_channels} does not split into num_groups={num_groups}")
    self.num_groups, self.num_channels, self.eps = num_groups, num_channels, eps
    self.weight = Tensor.ones(num_channels) if affine else None
    self.bias = Tensor.zeros(num_channels) if affine else None

  def __call__(self, x: Tensor) -> Tensor:
    if x.ndim < 2 or x.shape[1] != self.num_channels:
      raise ValueError(f"GroupNorm: input of shape {x.shape} needs {self.num_channels} channels on axis 1")
    return _grouped(x, self.num_groups, self.eps, self.weight, self.bias)


class InstanceNorm:
  """InstanceNorm(num_features, eps=1e-5, affine=True): each channel of each sample normalised over its spatial
  positions, then a per-channel weight and bias."""
  def __init__(self, num_features: int, eps: float = 1e-5, affine: bool = True):
    self.num_features, self.eps = num_features, eps
    self.weight = Tensor.ones(num_features) if affine else None
    self.bias = Tensor.zeros(num_features) if affine else None

  def __call__(self, x: Tensor) -> Tensor:
    if x.ndim < 3 or x.shape[1] != self.num_features:
      raise ValueError(f"InstanceNorm: input of shape {x.shape} needs (N, {self.num_features}, ...) with spatial dims")
    return _grouped(x, self.num_features, self.eps, self.weight, self.bias)


class RMSNorm:
  """RMSNorm(dim, eps=1e-6, elementwise_affine=True): x / sqrt(mean(x^2 over the last axis) + eps), computed in
  float32 and cast back to x's dtype, then scaled by weight."""
  def __init__(self, dim: int, eps: float = 1e-6, elementwise_affine: bool = True):
    self.eps = eps
    self.weight = Tensor.ones(dim) if elementwise_affine else None

  def _norm(self, x: Tensor) -> Tensor: return x * (x.square().mean(-1, keepdim=True) + self.eps).rsqrt()

  def __call__(self, x: Tensor) -> Tensor:
    if self.weight is not None and x.shape[-1:] != self.weight.shape:
      raise ValueError(f"RMSNorm: input of shape {x.shape} must end in dim={self.weight.shape[0]}")
    y = self._norm(x.float()).cast(x.dtype)
    return y if self.weight is None else y * self.weight
