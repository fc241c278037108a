"""Cumulative scans along an axis (cumsum, cumprod, cummax, cummin, logcumsumexp)."""
from __future__ import annotations


class ScansMixin:
  """Cumulative scans along an axis (cumsum, cumprod, cummax, cummin, logcumsumexp)."""
  __slots__ = ()
