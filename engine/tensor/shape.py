"""Shape functions built from movement ops: repeat, roll, split, unfold, tril/triu, diag, meshgrid, ..."""
from __future__ import annotations


class ShapeMixin:
  """Shape functions built from movement ops: repeat, roll, split, unfold, tril/triu, diag, meshgrid, ..."""
  __slots__ = ()
