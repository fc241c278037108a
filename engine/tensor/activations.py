"""Activation functions (gelu, silu, elu, softplus, ...)."""
from __future__ import annotations


class ActivationsMixin:
  """Activation functions (gelu, silu, elu, softplus, ...)."""
  __slots__ = ()
