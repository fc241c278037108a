"""Sorting: sort, argsort, topk."""
from __future__ import annotations


class SortingMixin:
  """Sorting: sort, argsort, topk."""
  __slots__ = ()
