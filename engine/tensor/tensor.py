"""The Tensor class: the core (engine/tensor/base.py) with one mixin per family of operations.

Each family lives in its own module, in the order a program meets them: creating tensors, elementwise math,
reductions, movement and indexing, neural-network functions. Inside those modules the class is reached through
`type(self)` / `cls` (never imported), so the modules do not depend on this one."""
from __future__ import annotations

from rulec.engine.tensor.activations import ActivationsMixin
from rulec.engine.tensor.autograd import AutogradMixin
from rulec.engine.tensor.base import TensorBase
from rulec.engine.tensor.creation import CreationMixin
from rulec.engine.tensor.elementwise import ElementwiseMixin
from rulec.engine.tensor.indexing import IndexingMixin
from rulec.engine.tensor.linalg import LinalgMixin
from rulec.engine.tensor.losses import LossesMixin
from rulec.engine.tensor.math import MathMixin
from rulec.engine.tensor.movement import MovementMixin
from rulec.engine.tensor.multi import MultiMixin
from rulec.engine.tensor.nn import NNMixin
from rulec.engine.tensor.reduce import ReduceMixin
from rulec.engine.tensor.scans import ScansMixin
from rulec.engine.tensor.shape import ShapeMixin
from rulec.engine.tensor.sorting import SortingMixin


class Tensor(TensorBase, CreationMixin, ElementwiseMixin, MathMixin, ReduceMixin, ScansMixin, MovementMixin, ShapeMixin,
             IndexingMixin, SortingMixin, NNMixin, LinalgMixin, ActivationsMixin, LossesMixin, AutogradMixin, MultiMixin):
  """A lazy tensor: a tensor-level UOp graph and the device its value lives on."""
  __slots__ = ()
  __hash__ = TensorBase.__hash__   # ElementwiseMixin defines __eq__ (elementwise ==), which would clear it


class no_grad:
  """`with no_grad():` (torch's spelling): tensors made inside get requires_grad=False, and backward() refuses."""
  def __init__(self, cls: type | None = None): self.cls = cls

  def __enter__(self):
    self.cls = self.cls or Tensor
    self.prev, self.cls.no_grad = self.cls.no_grad, True
    return self

  def __exit__(self, *exc): self.cls.no_grad = self.prev
