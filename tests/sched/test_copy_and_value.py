"""A value and its copy read through views that become one node once the copy is staged (#32: a crash the
program fuzzer found, seed 1401 on NUMPY): the output over them is still recognised as an output and computed."""
from __future__ import annotations

import numpy as np

from rulec import Tensor


def test_a_value_and_its_copy_stacked():
  v = Tensor([[1.0]]).mean(axis=0)
  s = Tensor.stack([v.contiguous(), v])
  assert (s.min() != 3.0).tolist() is True
  assert (s * 2).tolist() == [[2.0], [2.0]]


def test_the_fuzzers_program():
  v3 = Tensor([[104, -32], [0, -1]], dtype="int8").min(keepdim=True)
  v5 = v3.mean(axis=0)
  v9 = Tensor.stack([v5.contiguous(), Tensor([5, 2, 2, 9, 8], dtype=np.uint64).any(axis=0, keepdim=True), v5])
  np.testing.assert_array_equal(v9.numpy(), [[-32.0], [1.0], [-32.0]])
  assert (v9.min() != 3.0).tolist() is True
  assert v9.min().item() == -32.0
