"""Loss functions (cross_entropy, nll_loss, binary_crossentropy, ...)."""
from __future__ import annotations


class LossesMixin:
  """Loss functions (cross_entropy, nll_loss, binary_crossentropy, ...)."""
  __slots__ = ()
