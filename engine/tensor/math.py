"""Elementwise math beyond the operators: operators as methods, trigonometry and hyperbolics, rounding, tests (isnan, isclose), logaddexp/logsumexp."""
from __future__ import annotations


class MathMixin:
  """Elementwise math beyond the operators: operators as methods, trigonometry and hyperbolics, rounding, tests (isnan, isclose), logaddexp/logsumexp."""
  __slots__ = ()
