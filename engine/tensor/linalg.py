"""Linear algebra beyond matmul: qr, svd, newton_schulz."""
from __future__ import annotations


class LinalgMixin:
  """Matrix decompositions built from tensor ops."""
  __slots__ = ()
