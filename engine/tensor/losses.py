"""Loss functions (cross_entropy, nll_loss, binary_crossentropy, ...).

tinygrad's (and torch's) conventions: cross_entropy and nll_loss take classes along axis 1 (axis 0 for a 1-D input),
sparse_categorical_crossentropy along the last axis. Class-index targets become a lazy one-hot
(`Y == arange(C)` broadcast along the class axis); an index outside [0, C) selects no class."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rulec.engine.tensor.args import ShapeError

if TYPE_CHECKING: from rulec.engine.tensor.tensor import Tensor

REDUCTIONS = ("mean", "sum", "none")


def _check_reduction(reduction: str) -> None:
  if reduction not in REDUCTIONS: raise ValueError(f"reduction={reduction!r} must be one of {REDUCTIONS}")


def _reduced(loss: Tensor, reduction: str) -> Tensor:
  return loss if reduction == "none" else loss.sum() if reduction == "sum" else loss.mean()


class LossesMixin:
  """Loss functions (cross_entropy, nll_loss, binary_crossentropy, ...)."""
  __slots__ = ()

  def _class_axis(self) -> int:
    if self.ndim == 0: raise ShapeError("a loss needs at least one (class) axis, got a 0-d tensor")
    return 1 if self.ndim > 1 else 0

  def _one_hot_at(self, Y: Tensor, axis: int, name: str) -> Tensor:
    """Class indices Y (self's shape without axis) as a bool one-hot along axis of self."""
    if not (Y.dtype.is_int or Y.dtype.is_bool):
      raise RuntimeError(f"{name}: class-index targets must be an integer tensor, got {Y.dtype.name}")
    want = self.shape[:axis] + self.shape[axis + 1:]
    if Y.shape != want:
      raise ShapeError(f"{name}: targets of shape {Y.shape} do not fit input of shape {self.shape} (expected {want})")
    C = self.shape[axis]
    classes = type(self).arange(C, device=self.device).reshape(tuple(C if i == axis else 1 for i in range(self.ndim)))
    return Y.unsqueeze(axis) == classes

  def cross_entropy(self, Y: Any, reduction: str = "mean", label_smoothing: float = 0.0) -> Tensor:
    """Cross entropy of logits self (classes on axis 1) with targets Y: class indices (one axis fewer) or
    probabilities (self's shape); label_smoothing mixes the target with the uniform distribution."""
    _check_reduction(reduction)
    Y, ax = self._lift(Y), self._class_axis()
    if Y.ndim == self.ndim:
      if Y.shape != self.shape:
        raise ShapeError(f"cross_entropy: target probabilities of shape {Y.shape} do not fit input of shape {self.shape}")
      target = Y
    else: target = self._one_hot_at(Y, ax, "cross_entropy")
    lsm = self.log_softmax(ax)
    target = target.cast(lsm.dtype)   # (a bool one-hot smoothed on its own would be float32)
    if label_smoothing: target = target * (1 - label_smoothing) + label_smoothing / self.shape[ax]
    return _reduced(-(lsm * target).sum(ax), reduction)

  def nll_loss(self, Y: Any, weight: Any = None, ignore_index: int | None = None, reduction: str = "mean") -> Tensor:
    """Negative log likelihood of log-probabilities self (classes on axis 1) at class indices Y; weight scales
    each class, targets equal to ignore_index count for nothing; 'mean' divides by the summed weights."""
    _check_reduction(reduction)
    Y, ax = self._lift(Y), self._class_axis()
    hot = self._one_hot_at(Y, ax, "nll_loss")
    x = self if self.dtype.is_float else self.float()
    picked = -hot.where(x, 0.0).sum(ax)
    if weight is None: w = (Y == Y).cast(picked.dtype)
    else:
      wt = self._lift(weight)
      w = hot.where(wt.reshape(tuple(-1 if i == ax else 1 for i in range(self.ndim))), 0.0).sum(ax).cast(picked.dtype)
    if ignore_index is not None: w = (Y != ignore_index).where(w, 0.0)
    loss = (w != 0).where(picked * w, 0.0)
    if reduction == "mean": return loss.sum() / w.sum()
    return _reduced(loss, reduction)

  def sparse_categorical_crossentropy(self, Y: Any, ignore_index: int = -1, label_smoothing: float = 0.0,
                                      reduction: str = "mean") -> Tensor:
    """Cross entropy of logits self (classes on the last axis) with class indices Y; rows whose target is
    ignore_index are 0 and left out of the mean.

    As in tinygrad, the default ignore_index=-1 ignores nothing: a target of -1 (like any index outside [0, C))
    selects no class, so its loss is just the label-smoothing term, and it counts toward the mean."""
    _check_reduction(reduction)
    Y, ax = self._lift(Y), self.ndim - 1
    if self.ndim == 0: self._class_axis()
    hot = self._one_hot_at(Y, ax, "sparse_categorical_crossentropy")
    lsm = self.log_softmax(-1)
    loss = -hot.where(lsm, 0.0).sum(-1) * (1 - label_smoothing) - lsm.mean(-1) * label_smoothing
    keep = (Y == Y) if ignore_index == -1 else (Y != ignore_index)
    loss = keep.where(loss, 0.0)
    if reduction == "mean": return loss.sum() / keep.sum()
    return _reduced(loss, reduction)

  def binary_crossentropy(self, Y: Any, reduction: str = "mean") -> Tensor:
    """-(Y log(p) + (1 - Y) log(1 - p)) for probabilities p = self (not clamped: p = 0 with Y = 0 gives NaN, as in tinygrad)."""
    _check_reduction(reduction)
    Y = self._lift(Y)
    return _reduced(-(Y * self.log() + (1 - Y) * (1 - self).log()), reduction)

  def binary_crossentropy_logits(self, Y: Any, reduction: str = "mean", pos_weight: Any = None) -> Tensor:
    """binary_crossentropy(sigmoid(self), Y) computed stably from logits; pos_weight scales the positive term."""
    _check_reduction(reduction)
    Y = self._lift(Y)
    x = self if self.dtype.is_float else self.float()
    # -log(sigmoid(x)) = log(1 + e^-|x|) + max(-x, 0): no overflow for any x
    neg_log_sig = (-x.abs()).exp()._log1p() + (-x).maximum(0.0)
    pos = 1 if pos_weight is None else 1 + (self._lift(pos_weight) - 1) * Y
    return _reduced((1 - Y) * x + pos * neg_log_sig, reduction)
