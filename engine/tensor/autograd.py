"""Autograd: backward(), gradient(), .grad and requires_grad; the gradients themselves are rules/gradient.rules."""
from __future__ import annotations


class AutogradMixin:
  """Gradients of tensor graphs."""
  __slots__ = ()
