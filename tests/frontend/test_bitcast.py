"""Tensor.bitcast to a type of another item size (rules/early.rules bitcast_resize, the seeds' expand_bitcast):
the same bytes as numpy's `view`, for every pair of sized dtypes, over computed values, views and odd shapes."""
from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rulec.engine.ir.dtypes import dtypes
from rulec.engine.tensor import Tensor

SIZED = ["uint8", "int8", "uint16", "int16", "float16", "uint32", "int32", "float32", "uint64", "int64", "float64"]
EXAMPLES = max(1, int(float(os.environ.get("RULEC_TENSOR_EXAMPLES", "1") or 1) * 40))


def _same_bytes(got: np.ndarray, want: np.ndarray) -> None:
  assert got.dtype == want.dtype and got.shape == want.shape
  assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes()


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True)
@given(src=st.sampled_from(SIZED), dst=st.sampled_from(SIZED), lead=st.lists(st.integers(0, 3), max_size=2),
       items=st.integers(0, 3), seed=st.integers(0, 2**16))
def test_bitcast_matches_numpy_view(src, dst, lead, items, seed):
  a, b = np.dtype(src), np.dtype(dst)
  last = items * max(a.itemsize, b.itemsize) // a.itemsize
  raw = np.random.default_rng(seed).integers(0, 256, size=(*lead, last * a.itemsize), dtype=np.uint8)
  x = raw.view(a)
  _same_bytes(Tensor(x).bitcast(getattr(dtypes, dst)).numpy(), x.view(b))


def test_bitcast_of_a_computed_value_and_of_a_view():
  x = np.arange(12, dtype=np.float32).reshape(3, 4)
  t = Tensor(x)
  _same_bytes((t * 2 + 1).bitcast(dtypes.uint8).numpy(), (x * 2 + 1).view(np.uint8))
  _same_bytes(t.T.bitcast(dtypes.uint16).numpy(), np.ascontiguousarray(x.T).view(np.uint16))   # a permuted view
  _same_bytes(t[:, 1:3].bitcast(dtypes.float64).numpy(), np.ascontiguousarray(x[:, 1:3]).view(np.float64))
  # round trips, and a value bitcast then computed on
  _same_bytes(t.bitcast(dtypes.uint8).bitcast(dtypes.float32).numpy(), x)
  y = Tensor(np.arange(8, dtype=np.uint8)).bitcast(dtypes.uint32) + 1
  _same_bytes(y.numpy(), np.arange(8, dtype=np.uint8).view(np.uint32) + np.uint32(1))


def test_bitcast_shares_one_source_with_other_outputs():
  x = np.linspace(-3, 3, 8, dtype=np.float32)
  t = Tensor(x).exp()
  u8, u16 = t.bitcast(dtypes.uint8), t.bitcast(dtypes.uint16)
  Tensor.realize(u8, u16, t)
  _same_bytes(u8.numpy(), t.numpy().view(np.uint8))
  _same_bytes(u16.numpy(), t.numpy().view(np.uint16))


@pytest.mark.parametrize("make, message", [
  (lambda: Tensor(np.arange(6, dtype=np.uint8)).bitcast(dtypes.float32), "unsupported size in bitcast"),
  (lambda: Tensor(np.float32(1)).bitcast(dtypes.uint8), "needs at least one axis"),
  (lambda: Tensor([True, False]).bitcast(dtypes.int16), "bool"),
])
def test_bitcast_errors_name_the_problem(make, message):
  with pytest.raises(RuntimeError, match=message): make()
