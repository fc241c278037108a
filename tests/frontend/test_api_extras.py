"""tinygrad's in-place operators (engine/tensor/math.py), usum/uprod/const_like, multinomial and the plumbing
methods (data, replace, to_, contiguous_backward, sequential) in engine/tensor/linalg.py, against numpy."""
import operator
import os

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from rulec.engine.ir.dtypes import dtypes
from rulec.engine.tensor import Tensor

shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=3)
INPLACE = {"__iadd__": operator.add, "__isub__": operator.sub, "__imul__": operator.mul, "__ifloordiv__": operator.floordiv,
           "__iand__": operator.and_, "__ior__": operator.or_, "__ixor__": operator.xor, "__ilshift__": operator.lshift,
           "__irshift__": operator.rshift, "__ipow__": operator.pow, "__itruediv__": operator.truediv}
INT_ONLY = {"__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__"}


def other_device():
  return "CPU" if os.environ.get("RULEC_DEVICE", "CPU").upper() == "NUMPY" else "NUMPY"


@settings(max_examples=6)
@pytest.mark.parametrize("name", sorted(INPLACE))
@given(data=st.data())
def test_inplace_against_numpy(name, data):
  """x op= y keeps x (the same object, its dtype and shape) and holds x op y; y broadcasts to x's shape."""
  dt = data.draw(st.sampled_from([np.int32] if name in INT_ONLY or name == "__ipow__" else
                                 [np.float32] if name == "__itruediv__" else [np.int32, np.float32]))
  shape = data.draw(shapes)
  a = data.draw(hnp.arrays(dt, shape, elements=st.integers(1, 9)))
  # (broadcastable_shapes gives shapes that broadcast *with* x's, (0,) against (1,) among them: only those that
  # broadcast *to* it fit an in-place update)
  to_x = hnp.broadcastable_shapes(shape, max_dims=len(shape), min_side=0).filter(lambda s: np.broadcast_shapes(s, shape) == shape)
  b = data.draw(hnp.arrays(dt, to_x, elements=st.integers(1, 3)))
  if data.draw(st.booleans(), "scalar"): b = dt(b.flat[0]) if b.size else dt(2)
  x = Tensor(a)
  if data.draw(st.booleans(), "realized"): x.realize()
  else: x = x * 1   # a lazy, unrealized x gets a buffer of its own
  alias = x
  out = getattr(x, name)(b if isinstance(b, np.ndarray) else b.item())
  assert out is alias and out.dtype.name == np.dtype(dt).name and out.shape == a.shape
  np.testing.assert_allclose(out.numpy(), INPLACE[name](a, b).astype(dt), rtol=1e-6)


def test_inplace_statement_forms():
  x = Tensor([[1.0, 2.0], [3.0, 4.0]])
  keep = x
  x @= Tensor([[0.0, 1.0], [1.0, 0.0]])
  x += 1
  x *= Tensor([2.0, 3.0])
  assert x is keep
  np.testing.assert_array_equal(x.numpy(), [[6.0, 6.0], [10.0, 12.0]])
  # tinygrad has no in-place %: `x %= y` rebinds x to a new tensor and leaves the old one alone
  y = Tensor([5, 6, 7])
  old = y
  y %= 4
  assert y is not old and y.tolist() == [1, 2, 3] and old.tolist() == [5, 6, 7]


def test_inplace_writes_through_a_view():
  base = Tensor([1.0, 2.0, 3.0, 4.0]).realize()
  v = base[1:3]
  v += 10
  v.realize()
  np.testing.assert_array_equal(base.numpy(), [1.0, 12.0, 13.0, 4.0])


def test_inplace_refuses_other_dtypes_and_shapes():
  """As tinygrad's assign: a result of another dtype raises RuntimeError (no silent cast), a result of
  another shape ValueError."""
  for op, y in [("__iadd__", 1.5), ("__itruediv__", 2), ("__imul__", Tensor([1.5, 2.0, 3.0]))]:
    x = Tensor([1, 2, 3])
    with pytest.raises(RuntimeError, match="dtype"): getattr(x, op)(y)
    assert x.tolist() == [1, 2, 3]
  with pytest.raises(ValueError): Tensor([1, 2, 3]).__iadd__(Tensor([[1, 2, 3]]))
  with pytest.raises(TypeError): Tensor([1.0, 2.0]).__iand__(Tensor([1.0, 2.0]))


@settings(max_examples=8)
@given(data=st.data())
def test_usum_uprod(data):
  dt = data.draw(st.sampled_from([np.int32, np.float32, np.bool_]))
  shape = data.draw(shapes)
  n = data.draw(st.integers(1, 3))
  arrs = [data.draw(hnp.arrays(np.int32, shape, elements=st.integers(0, 3))).astype(dt) for _ in range(n)]
  t0, ts = Tensor(arrs[0]), [Tensor(x) for x in arrs[1:]]
  s_ref, p_ref = arrs[0], arrs[0]
  for x in arrs[1:]: s_ref, p_ref = (s_ref | x, p_ref & x) if dt is np.bool_ else (s_ref + x, p_ref * x)
  np.testing.assert_array_equal(t0.usum(*ts).numpy(), s_ref)
  np.testing.assert_array_equal(t0.uprod(ts).numpy(), p_ref)   # a list works as the one argument
  assert t0.usum().numpy().tolist() == arrs[0].tolist()


def test_const_like():
  t = Tensor([1, 2, 3])
  c = t.const_like(2.5)
  assert c.dtype is dtypes.int32 and c.tolist() == [2, 2, 2]   # cast to the tensor's dtype, as tinygrad
  c = t.const_like(2.5, dtypes.float32)
  assert c.dtype is dtypes.float32 and c.tolist() == [2.5, 2.5, 2.5]
  assert Tensor.ones(2, 0).const_like(1).shape == (2, 0)
  assert Tensor(1.0).const_like(True).tolist() == 1.0


def test_multinomial_with_replacement():
  """Draw frequencies match the normalised weights (4000 draws: 3 sigma is about 0.02); a zero weight is never drawn."""
  Tensor.manual_seed(0)
  w = np.array([1.0, 2.0, 0.0, 5.0], np.float32)
  s = Tensor(w).multinomial(4000, replacement=True)
  assert s.dtype is dtypes.int32 and s.shape == (4000,)
  freq = np.bincount(s.numpy(), minlength=4) / 4000
  np.testing.assert_allclose(freq, w / w.sum(), atol=0.03)
  assert freq[2] == 0
  rows = Tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 3.0]]).multinomial(5, replacement=True)
  assert rows.shape == (2, 5) and rows.numpy().tolist() == [[0] * 5, [2] * 5]
  assert Tensor([1, 3]).multinomial().shape == (1,)   # int weights


def test_multinomial_without_replacement():
  Tensor.manual_seed(1)
  w = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
  s = Tensor(np.tile(w, (2000, 1))).multinomial(3)
  got = s.numpy()
  assert got.shape == (2000, 3) and s.dtype is dtypes.int32
  assert all(len(set(r)) == 3 for r in got.tolist())   # no index twice in a row
  # the first draw of each row is i with probability w_i / sum(w)
  np.testing.assert_allclose(np.bincount(got[:, 0], minlength=4) / 2000, w / w.sum(), atol=0.04)
  one = Tensor([0.0, 1.0, 0.0]).multinomial(1)
  assert one.tolist() == [1]
  full = Tensor([3.0, 1.0, 2.0]).multinomial(3).numpy()
  assert sorted(full.tolist()) == [0, 1, 2]


def test_multinomial_errors():
  """tinygrad asserts; rulec's error is an AssertionError and a ValueError."""
  with pytest.raises(AssertionError, match="exceed|without replacement"): Tensor([1.0, 2.0]).multinomial(3)
  with pytest.raises(ValueError): Tensor(1.0).multinomial()
  with pytest.raises(ValueError): Tensor.ones(2, 2, 2).multinomial()
  with pytest.raises(AssertionError): Tensor([1.0]).multinomial(0)


FMTS = {np.int32: "i", np.int64: "q", np.float32: "f", np.float64: "d", np.bool_: "?", np.uint8: "B", np.int16: "h",
        np.uint64: "Q", np.float16: "e"}


@settings(max_examples=10)
@given(dt=st.sampled_from(sorted(FMTS, key=str)), shape=shapes, data=st.data())
def test_data_is_a_memoryview(dt, shape, data):
  a = data.draw(hnp.arrays(np.int32, shape, elements=st.integers(0, 5))).astype(dt)
  m = Tensor(a).data()
  assert isinstance(m, memoryview) and m.format == FMTS[dt]
  if a.size == 0: assert m.shape == (0,)   # tinygrad's empty view is 1-d
  else:
    assert m.shape == a.shape
    np.testing.assert_array_equal(np.asarray(m), a)


def test_data_of_empty_and_0d_float16():
  # (found by the wider hypothesis run: memoryview.cast cannot make 'e' on Python 3.11, not even an empty view, and
  # np.ascontiguousarray gave a 0-d value one axis)
  m = Tensor(np.zeros(0, np.float16)).data()
  assert m.format == "e" and m.shape == (0,) and m.nbytes == 0
  m = Tensor(np.array(2.5, np.float16)).data()
  assert m.format == "e" and m.shape == () and np.asarray(m) == 2.5
  m = Tensor(np.array(-3, np.int64)).data()
  assert m.format == "q" and m.shape == () and m[()] == -3


def test_replace_and_to_():
  t = Tensor([1.0, 2.0])
  other = Tensor([3, 4], dtype=dtypes.int32) + 0
  assert t.replace(other) is t and t.dtype is dtypes.int32 and t.tolist() == [3, 4]
  with pytest.raises(AssertionError, match="shape"): t.replace(Tensor([1, 2, 3]))
  dev = other_device()
  t = Tensor([1.0, 2.0, 3.0])
  (t * t).sum().backward()
  keep = t
  assert t.to_(dev) is keep and t.device == dev and t.grad.device == dev
  np.testing.assert_array_equal(t.numpy(), [1.0, 2.0, 3.0])
  np.testing.assert_array_equal(t.grad.numpy(), [2.0, 4.0, 6.0])


def test_contiguous_backward_and_sequential():
  a = Tensor([1.0, 2.0, 3.0])
  y = a.contiguous_backward()
  np.testing.assert_array_equal(y.numpy(), [1.0, 2.0, 3.0])
  (a.contiguous_backward() * a).sum().backward()   # the identity forward and backward
  np.testing.assert_array_equal(a.grad.numpy(), [2.0, 4.0, 6.0])
  r = Tensor([1, 2, 3]).sequential([lambda x: x * 2, lambda x: x + 1, Tensor.relu])
  assert r.tolist() == [3, 5, 7]
  assert Tensor([1]).sequential([]).tolist() == [1]


def test_alu_ufix_and_max_shape():
  from rulec.engine.ir.ops import Ops
  from rulec.engine.tensor.args import DTypeError
  a, b = Tensor([1.0, 4.0]), Tensor([[2.0], [3.0]])
  np.testing.assert_array_equal(a.alu(Ops.ADD, b).numpy(), [[3.0, 6.0], [4.0, 7.0]])   # broadcast
  np.testing.assert_allclose(a.alu(Ops.SQRT).numpy(), [1.0, 2.0])
  assert (a < 2).alu(Ops.WHERE, a, a * 10).tolist() == [1.0, 40.0]
  assert a.alu(Ops.CMPLT, Tensor([2.0, 2.0])).tolist() == [True, False]
  with pytest.raises(DTypeError, match="float32, int32"): a.alu(Ops.ADD, Tensor([1, 2]))
  with pytest.raises(TypeError, match="ADD takes 2 operands, got 1"): a.alu(Ops.ADD)
  with pytest.raises(DTypeError, match="bool condition"): a.alu(Ops.WHERE, a, a)
  assert a.ufix(3).dtype == dtypes.float32 and a.ufix(3).tolist() == 3.0 and a.ufix(b) is b
  u = Tensor([1, 2]).ufix(2.7)   # weak: a float operand of an int tensor is a float (tinygrad: weakfloat)
  assert u.dtype == dtypes.float32 and abs(u.item() - 2.7) < 1e-6
  assert Tensor([True]).ufix(2).tolist() == 2
  assert b.max_shape == (2, 1) and b.max_numel() == 2


def test_shard_like():
  devs = ("CPU", "CPU:1")
  x = np.arange(8.0).reshape(4, 2)
  for axis in (0, 1, None):
    y = Tensor(x).shard(devs, axis=axis) * 2   # lazy: its axis is known once realized
    z = Tensor(np.ones((4, 2))).shard_like(y)
    assert z.device == devs and z.uop.arg[0] == axis
    np.testing.assert_array_equal((z + y).numpy(), x * 2 + 1)
  assert Tensor([1.0]).shard_like(Tensor([2.0], device="CPU:1")).device == "CPU:1"
  s = Tensor(x).shard(devs, axis=0)
  assert s.shard_like(s) is s
