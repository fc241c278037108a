"""Data-dependent indexing: gather, scatter, masked ops, one_hot, nonzero, indexing by Tensors."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING: from engine.tensor.tensor import Tensor


class IndexingMixin:
  """Data-dependent indexing: gather, scatter, masked ops, one_hot, nonzero, indexing by Tensors."""
  __slots__ = ()

  def _getitem_advanced(self, items: tuple) -> Tensor:
    raise TypeError("indexing with a Tensor is not supported yet")

  def _setitem_advanced(self, items: tuple, value) -> None:
    raise TypeError("assigning through a Tensor index is not supported yet")
