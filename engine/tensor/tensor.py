"""The Tensor class: the core (engine/tensor/base.py) with one mixin per family of operations.

Each family lives in its own module, in the order a program meets them: creating tensors, elementwise math,
reductions, movement and indexing, neural-network functions. Inside those modules the class is reached through
`type(self)` / `cls` (never imported), so the modules do not depend on this one."""
from __future__ import annotations

from engine.tensor.base import TensorBase
from engine.tensor.creation import CreationMixin
from engine.tensor.elementwise import ElementwiseMixin
from engine.tensor.movement import MovementMixin
from engine.tensor.nn import NNMixin
from engine.tensor.reduce import ReduceMixin


class Tensor(TensorBase, CreationMixin, ElementwiseMixin, ReduceMixin, MovementMixin, NNMixin):
  """A lazy tensor: a tensor-level UOp graph and the device its value lives on."""
  __slots__ = ()
  __hash__ = TensorBase.__hash__   # ElementwiseMixin defines __eq__ (elementwise ==), which would clear it
