"""The IR: hash-consing, immutability, shapes and value bounds."""
import gc
import pickle

import pytest
from hypothesis import given, settings, strategies as st

from rulec.engine.ir.dtypes import dtypes
from rulec.engine.ir.ops import Ops
from rulec.engine.ir.uop import UOp, _ucache


def test_hash_consing_returns_the_same_object():
  a = UOp.variable("a", 0, 9)
  assert UOp.variable("a", 0, 9) is a
  assert (a + 1) is (a + 1)
  assert UOp(Ops.ADD, dtypes.index, (a, a)) is a + a
  assert UOp.const(dtypes.float32, 0) is not UOp.const(dtypes.int32, 0)


def test_constants_of_different_python_types_stay_apart():
  assert UOp(Ops.CONST, dtypes.index, (), 0) is not UOp(Ops.CONST, dtypes.index, (), False)
  assert UOp.const(dtypes.float32, 1).arg == 1.0 and isinstance(UOp.const(dtypes.float32, 1).arg, float)
  assert UOp.const(dtypes.bool, 1).arg is True


def test_nodes_are_immutable_and_replace_returns_self_when_unchanged():
  a = UOp.variable("a", 0, 9) + 2
  with pytest.raises(AttributeError): a.op = Ops.MUL
  assert a.replace() is a
  assert a.replace(op=Ops.MUL) is UOp(Ops.MUL, a.dtype, a.src)


def test_dead_nodes_leave_the_cache():
  x = UOp.variable("tmp_dead", 0, 3) * 12345
  keys = [k for k in _ucache if k[0] is Ops.MUL and k[2] == x.src]
  assert len(keys) == 1
  del x
  gc.collect()
  assert keys[0] not in _ucache


def test_pickle_round_trip_is_the_same_node():
  e = (UOp.variable("a", 0, 9) + 3) * 2
  assert pickle.loads(pickle.dumps(e)) is e


def test_shapes_of_movement_ops():
  buf = UOp(Ops.BUFFER, dtypes.float32, (), (0, "CPU", 24))
  x = buf.reshape((2, 3, 4))
  assert x.shape == (2, 3, 4)
  assert x.permute((2, 0, 1)).shape == (4, 2, 3)
  assert x.pad(((1, 1), (0, 0), (0, 2))).shape == (4, 3, 6)
  assert x.shrink(((0, 1), (1, 3), (0, 4))).shape == (1, 2, 4)
  assert x.reshape((2, 1, 12)).expand((2, 5, 12)).shape == (2, 5, 12)
  assert x.r(Ops.ADD, (1,)).shape == (2, 1, 4)
  assert (x + x).shape == (2, 3, 4)
  assert x.size == 24 and x.base is buf


def test_deep_graphs_do_not_recurse():
  x = UOp.variable("deep", 0, 1)
  for i in range(20000): x = x + 1
  assert len(x.toposort()) == 20002
  assert x.vmax == 20001


def test_value_bounds():
  r = UOp.range(16, 0)
  v = UOp.variable("v", 2, 5)
  assert (r.vmin, r.vmax) == (0, 15)
  assert ((r * 4 + v) // 4).vmax == (15 * 4 + 5) // 4
  assert (r % 4).vmax == 3 and (r % 32).vmax == 15
  assert (r - v).vmin == -5


def test_negative_zero_is_its_own_constant():
  # 0.0 == -0.0 and they hash alike, but x / -0.0 is -inf: the cache must keep them apart
  pos, neg = UOp.const(dtypes.float32, 0.0), UOp.const(dtypes.float32, -0.0)
  assert pos is not neg and str(neg.arg) == "-0.0"
  assert UOp.const(dtypes.float32, -0.0) is neg


def test_a_float_cast_to_index_truncates_like_the_devices():
  # the reference evaluator and constant folding kept 2.75 as an index value; the devices (and int64) truncate
  from rulec.engine.ir.alu import wrap
  from rulec.engine.ir.dtypes import dtypes as D
  from rulec.engine.verify.evaluate import eval_scalar
  assert wrap(2.75, D.index) == 2 and wrap(-2.75, D.index) == -2 and wrap(float("nan"), D.index) == 0
  assert wrap(True, D.index) is True   # (a bool is not a float: left as it is)
  assert eval_scalar(UOp.const(D.float32, -7.5).cast(D.index), {}) == -7


@settings(max_examples=300, deadline=None)
@given(st.integers(-40, 40), st.integers(0, 40), st.integers(1, 12), st.sampled_from([Ops.CDIV, Ops.CMOD]))
def test_truncating_division_bounds_hold_every_value(lo, width, c, op):
  # the decompositions' CDIV / CMOD (C's division and remainder): the bounds the clamp_load rule trusts to leave a
  # load unclamped hold for every value of the dividend, checked one by one against the evaluator
  from rulec.engine.verify.evaluate import eval_scalar
  v = UOp.variable("x", lo, lo + width)
  e = v.alu(op, UOp.const(dtypes.index, c))
  got = [eval_scalar(e, {v: x}) for x in range(lo, lo + width + 1)]
  assert e.vmin <= min(got) and max(got) <= e.vmax
  if op is Ops.CDIV: assert (e.vmin, e.vmax) == (min(got), max(got))   # (monotone: the ends are reached)
  if lo >= 0: assert (e.vmin, e.vmax) == ((v // c).vmin, (v // c).vmax) if op is Ops.CDIV else ((v % c).vmin, (v % c).vmax)
