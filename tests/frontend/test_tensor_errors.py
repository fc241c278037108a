"""Bad input to Tensor raises at the user's call, with the right exception type and a
message naming the problem (shapes, axes, values), never from deep inside the engine."""
from __future__ import annotations

import os
import re

import numpy as np
import pytest

from rulec.engine.ir.dtypes import dtypes
from rulec.engine.tensor import AxisError
from rulec import Tensor

FRONT_END = (os.path.join("engine", "tensor", ""),)


def raises(exc, *needles: str):
  """pytest.raises that also checks the message holds every needle and that the error comes from the front end (engine/tensor*.py)."""
  class _Check:
    def __enter__(self):
      self.cm = pytest.raises(exc)
      self.info = self.cm.__enter__()
      return self.info

    def __exit__(self, *a):
      out = self.cm.__exit__(*a)
      msg = str(self.info.value)
      for n in needles: assert n in msg, f"{n!r} not in error message {msg!r}"
      origin = str(self.info.traceback[-1].path)
      assert os.sep + FRONT_END[0] in origin, f"error raised in {origin}, not at the front end"
      return out
  return _Check()


@pytest.fixture
def t23():
  return Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))


# *** broadcasting ***

@pytest.mark.parametrize("op", ["+", "-", "*", "/", "//", "%", "**", "<", "<=", "==", "!=", "maximum", "minimum"])
def test_broadcast_mismatch_names_both_shapes(op):
  a, b = Tensor.ones(2, 3), Tensor.ones(4)
  with raises(ValueError, "(2, 3)", "(4,)"):
    if op == "maximum": a.maximum(b)
    elif op == "minimum": a.minimum(b)
    else: eval(f"a {op} b")


def test_broadcast_mismatch_in_where_assign_expand_and_numpy_operands(t23):
  with raises(ValueError, "(2, 3)", "(5,)"): (t23 > 1).where(Tensor.ones(5), 0)
  with raises(ValueError, "(4,)", "(2, 3)"): Tensor.ones(2, 3).assign(Tensor.ones(4))
  with raises(ValueError, "(2, 3)", "(4, 3)"): t23.expand(4, 3)
  with raises(ValueError, "(2, 3)", "(3, 2)"): t23 + np.ones((3, 2))
  with raises(ValueError, "(2, 3)", "(2,)"): t23 * [1, 2]


# *** axes ***

@pytest.mark.parametrize("call", [
  lambda t: t.sum(axis=2), lambda t: t.sum(axis=-3), lambda t: t.max(axis=5), lambda t: t.min(axis=(0, 2)),
  lambda t: t.mean(axis=2), lambda t: t.var(axis=-4), lambda t: t.std(axis=3), lambda t: t.prod(axis=9),
  lambda t: t.argmax(axis=2), lambda t: t.argmin(axis=-3), lambda t: t.any(axis=2), lambda t: t.softmax(axis=2),
  lambda t: t.log_softmax(axis=-3), lambda t: t.layernorm(axis=2), lambda t: t.flip(axis=2),
  lambda t: t.squeeze(axis=2), lambda t: t.unsqueeze(4), lambda t: t.transpose(0, 2), lambda t: t.flatten(0, 5),
  lambda t: Tensor.cat(t, t, axis=2), lambda t: Tensor.stack(t, t, axis=4),
])
def test_bad_axis_names_axis_and_ndim(t23, call):
  with raises(AxisError, "axis", "dimension 2") as info:
    call(t23)
  assert isinstance(info.value, ValueError) and isinstance(info.value, IndexError)
  assert re.search(r"axis -?\d", str(info.value))


def test_duplicate_and_non_integer_axes(t23):
  with raises(ValueError, "duplicate", "(0, 0)"): t23.sum(axis=(0, 0))
  with raises(ValueError, "duplicate"): t23.sum(axis=(1, -1))
  with raises(TypeError, "axis", "1.5"): t23.sum(axis=1.5)
  with raises(TypeError, "axis"): t23.sum(axis=True)


def test_axis_error_on_0d():
  # a 0-d tensor takes axis 0 and -1 (tinygrad); others are out of range
  with raises(AxisError, "axis 1", "dimension 0"): Tensor(1.0).sum(axis=1)
  with raises(AxisError, "axis -2", "dimension 0"): Tensor(1.0).max(axis=-2)


# *** dtypes ***

@pytest.mark.parametrize("bad", ["float128", "floot32", "index", "void", object, complex, np.complex64, 3,
                                 dtypes.index, dtypes.void])
def test_unknown_dtype_is_a_type_error(bad):
  with raises(TypeError, "dtype"): Tensor([1, 2], dtype=bad)
  with raises(TypeError, "dtype"): Tensor.zeros(2, dtype=bad)
  with raises(TypeError, "dtype"): Tensor([1, 2]).cast(bad)


def test_unsupported_data_is_a_type_error():
  with raises(TypeError, "complex"): Tensor(np.array([1 + 2j]))
  with raises(TypeError, "NoneType"): Tensor(None)
  with raises(TypeError, "str"): Tensor("abc")
  with raises(TypeError, "<U1"): Tensor(["a", "b"])
  with raises(TypeError, "dict"): Tensor({1: 2})
  with raises(ValueError, "rectangular"): Tensor([[1, 2], [3]])
  with raises(TypeError, "float dtype", "int32"): Tensor.rand(2, dtype=dtypes.int32)


def test_dtype_rules_that_raise():
  # tinygrad wraps Python ints that do not fit and allows bool - bool (or-not): those no longer raise
  with raises(TypeError, "float32"): Tensor([1.0]) & Tensor([1.0])
  with raises(RuntimeError, "float32"): Tensor([1.0]) << 1
  with raises(TypeError, "float32"): ~Tensor([1.0])
  with raises(ValueError, "negative integer power", "-1"): Tensor([2, 3]) ** -1
  with raises(RuntimeError, "base needs to be float", "-2"): Tensor([2, 3]) ** -2
  with raises(RuntimeError, "unsupported size in bitcast", "int8"): Tensor([1, 2, 3], dtype=dtypes.int8).bitcast(dtypes.float32)
  with pytest.raises(TypeError): Tensor([1]) + "a"
  with pytest.raises(TypeError): Tensor([1]) + None


# *** devices ***

@pytest.mark.parametrize("make", [lambda d: Tensor([1], device=d), lambda d: Tensor.zeros(2, device=d),
                                  lambda d: Tensor.arange(3, device=d), lambda d: Tensor([1]).to(d),
                                  lambda d: Tensor.rand(2, device=d), lambda d: Tensor.full((2,), 1, device=d)])
def test_unknown_device_names_the_known_ones(make):
  with raises(ValueError, "'TPU'", "NUMPY"): make("TPU")


def test_device_must_be_a_string():
  # base.py takes a non-string device as a dtype passed in rulec's old (data, dtype) order, so the message names
  # the dtype; either way it is a TypeError naming the value
  with raises(TypeError, "0"): Tensor([1], device=0)


# *** shapes and indices ***

def test_reshape_to_the_wrong_size_names_both_shapes(t23):
  with raises(ValueError, "(2, 3)", "(4, 2)"): t23.reshape(4, 2)
  with raises(ValueError, "(2, 3)", "(-1, 4)"): t23.reshape(-1, 4)
  with raises(ValueError, "-1"): t23.reshape(-1, -1)
  with raises(ValueError, "negative"): t23.reshape(-2, -3)
  with raises(ValueError, "(0, 3)", "(-1, 0)"): Tensor.zeros(0, 3).reshape(-1, 0)


def test_out_of_range_and_bad_indices(t23):
  with raises(IndexError, "index 2", "axis 0", "size 2"): t23[2]
  with raises(IndexError, "index -4", "axis 1", "size 3"): t23[0, -4]
  with raises(IndexError, "too many indices", "2-dimensional", "3"): t23[0, 0, 0]
  with raises(IndexError, "ellipsis"): t23[..., 0, ...]
  with raises(TypeError, "boolean"): t23[True]
  assert t23[Tensor([0])].shape == (1, 3) and t23[[0, 1]].shape == (2, 3)   # tensor and list indices: advanced indexing
  with raises(IndexError, "float32"): t23[Tensor([0.0])]
  with raises(TypeError, "1.5"): t23[1.5]
  with raises(IndexError, "boolean"): t23[[True, False]]
  with raises(IndexError, "(2,)", "(3,)"): t23[[0, 1], [0, 1, 2]]
  with raises(IndexError, "too many indices", "0-dimensional"): Tensor(1.0)[0]
  with raises(ValueError, "slice step"): t23[::0]


def test_movement_argument_errors(t23):
  with raises(ValueError, "(1, 1)", "(2, 3)"): t23.permute(1, 1)
  with raises(ValueError, "(0,)", "(2, 3)"): t23.permute(0)
  with raises(ValueError, "1 (before, after) pairs", "(2, 3)"): t23.pad(((1, 1),))
  with raises(ValueError, "even number", "(1,)"): t23.pad((1,))
  with raises(ValueError, "cropping", "(2, 3)"): t23.pad(((-3, 0), (0, 0)))
  with raises(ValueError, "(0, 4)", "(2, 3)"): t23.shrink(((0, 2), (0, 4)))
  with raises(ValueError, "(2, 1)", "(2, 3)"): t23.shrink(((2, 1), None))
  with raises(ValueError, "(2, 3)", "(3,)"): t23.expand(3)
  with raises(ValueError, "start_dim"): t23.flatten(1, 0)
  with raises(ValueError, "(2, 3)", "(3, 2)"): Tensor.stack(t23, t23.T)
  with raises(ValueError, "(2, 3)", "(2, 4)"): Tensor.cat(t23, Tensor.ones(2, 4), axis=0)
  with raises(ValueError, "zero-dimensional"): Tensor.cat(Tensor(1.0), Tensor(2.0))
  with raises(ValueError, "negative dimensions", "(-1, 2)"): Tensor.zeros(-1, 2)
  with raises(ValueError, "step"): Tensor.arange(0, 5, 0)
  with raises(ValueError, "eye", "-1"): Tensor.eye(-1)


# *** linear algebra and nn ***

def test_matmul_shape_mismatch_names_both_shapes():
  with raises(ValueError, "(2, 3)", "(4, 5)"): Tensor.ones(2, 3) @ Tensor.ones(4, 5)
  with raises(ValueError, "(3,)", "(4,)"): Tensor.ones(3) @ Tensor.ones(4)
  with raises(ValueError, "(2, 2, 3)", "(3, 3, 1)"): Tensor.ones(2, 2, 3) @ Tensor.ones(3, 3, 1)
  with raises(ValueError, "()", "(3,)"): Tensor(1.0).matmul(Tensor.ones(3))
  with raises(ValueError, "(2, 3)", "(2,)"): Tensor.ones(2, 3).matmul([1.0, 2.0])


def test_conv2d_errors_name_channels_and_shapes():
  x = Tensor.ones(1, 3, 5, 5)
  with raises(ValueError, "3 channels", "(1, 3, 5, 5)", "(8, 4, 3, 3)"): x.conv2d(Tensor.ones(8, 4, 3, 3))
  with raises(ValueError, "4-D", "(3, 5, 5)"): Tensor.ones(3, 5, 5).conv2d(Tensor.ones(8, 3, 3, 3))
  with raises(ValueError, "4-D", "(8, 3, 3)"): x.conv2d(Tensor.ones(8, 3, 3))
  with raises(ValueError, "bias", "(8,)", "(7,)"): x.conv2d(Tensor.ones(8, 3, 3, 3), Tensor.ones(7))
  with raises(ValueError, "larger than the padded input"): x.conv2d(Tensor.ones(8, 3, 7, 7))
  with raises(ValueError, "groups"): x.conv2d(Tensor.ones(8, 1, 3, 3), groups=2)
  with raises(ValueError, "stride"): x.conv2d(Tensor.ones(8, 3, 3, 3), stride=0)
  with raises(ValueError, "kernel", "larger"): x.max_pool2d(7)
  with raises(ValueError, "at least 2 dimensions"): Tensor.ones(3).max_pool2d(2)


# *** reductions and values ***

def test_empty_reductions_and_item():
  # max/min of an empty axis give the identity, as in tinygrad (tests/frontend/test_api_conventions.py)
  with raises(ValueError, "argmax", "empty"): Tensor.zeros(0).argmax()
  with raises(ValueError, "argmin", "(3, 0)"): Tensor.zeros(3, 0).argmin(axis=1)
  with raises(ValueError, "item", "(2,)"): Tensor([1, 2]).item()
  with raises(ValueError, "ambiguous", "(2,)"): bool(Tensor([1, 2]))
  with raises(TypeError, "0-d"): len(Tensor(1.0))


def test_assign_errors():
  a = Tensor.arange(6).reshape(2, 3).realize()
  with raises(ValueError, "(3,)", "(2, 2)"): a[:, :2].assign(Tensor([1, 2, 3]))
  with raises(ValueError, "padded"): a.pad(((1, 0), (0, 0))).assign(0)
  with raises(ValueError, "expanded"): a[:1].expand(2, 3).assign(0)



def test_realize_takes_tensors():
  with raises(TypeError, "int"): Tensor.realize(Tensor([1]), 3)
