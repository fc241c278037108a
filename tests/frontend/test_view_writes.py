"""Writes through views that nothing realizes itself (engine/tensor/writes.py).

`v = b[1:2]; v.assign(x)` is lazy; as in tinygrad, whatever reads b's buffer later sees the write. The fixed cases
below give the values tinygrad 0.14 gives for the same programs (run side by side when this was written); the
property test checks programs of writes and reads of one buffer against numpy doing the same steps eagerly."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st

from rulec.engine.sched.early import is_buffer_view
from rulec.engine.tensor import Tensor
from rulec.engine.tensor import writes as _writes

X = np.arange(12, dtype=np.float32).reshape(4, 3)
ONES, TWOS = np.ones((1, 3), np.float32), np.full((1, 3), 2, np.float32)


def fresh(device=None):
  return Tensor(X, device=device).realize()


def test_a_write_through_a_view_shows_in_the_base():
  b = fresh(); v = b[1:2]; v.assign(Tensor(ONES))
  assert b.tolist() == [[0, 1, 2], [1, 1, 1], [6, 7, 8], [9, 10, 11]]
  assert v.tolist() == [[1, 1, 1]]
  b = fresh(); b[1:2].assign(Tensor(ONES))   # the view tensor is dropped at once: the write is still made
  assert b.sum().item() == 57.0


def test_a_realized_value_that_folds_to_a_constant_has_storage_to_write_through():
  # an empty matmul is zeros; the scheduler folds it to a constant (found by the fuzzer, seed 1601): realize()
  # still gives it a buffer, so a write through a view of it changes it (tinygrad 0.14: [5, 5, 5], then [0, 1, 2])
  a, b = Tensor(np.ones((3, 0), np.float32)), Tensor(np.ones((0, 1), np.float32))
  v = (a @ b).realize()
  v.reshape(3).assign(Tensor(np.full(3, 5, np.float32))).realize()
  assert v.tolist() == [[5.0]] * 3
  assert (a @ b).realize().tolist() == [[0.0]] * 3
  w = (Tensor(np.arange(3, dtype=np.int32)) * 0).realize()   # integer x * 0 folds too
  w[1:].assign(Tensor(np.array([1, 2], np.int32))).realize()
  assert w.tolist() == [0, 1, 2]
  # reading a folded value needs no storage: still no kernel
  from rulec import GlobalCounters
  n = GlobalCounters.kernel_count
  assert (a @ b).sum().item() == 0.0 and GlobalCounters.kernel_count == n


def test_lazy_readers_see_pending_writes_when_they_are_realized():
  b = fresh(); c = b * 1; w = b[1:3]              # both made before the write
  b[1:2].assign(Tensor(ONES))
  assert c.tolist()[1] == [1, 1, 1] and w.tolist() == [[1, 1, 1], [6, 7, 8]]
  assert (b + 1).tolist()[1] == [2, 2, 2]


def test_writes_into_one_buffer_keep_their_order():
  b = fresh(); b[1:2].assign(Tensor(ONES)); b[2:3].assign(Tensor(TWOS))
  assert b.tolist() == [[0, 1, 2], [1, 1, 1], [2, 2, 2], [9, 10, 11]]
  for realize_first in ("first", "second", "both"):
    b = fresh(); v1 = b[0:1]; v1.assign(Tensor(ONES)); v2 = b[0:1]; v2.assign(Tensor(TWOS))
    {"first": v1.realize, "second": v2.realize, "both": lambda: Tensor.realize(v2, v1)}[realize_first]()
    assert b.tolist()[0] == [2, 2, 2], realize_first   # the later write wins, whichever is realized
  b = fresh(); v = b[1:2]; v.assign(Tensor(ONES)); v.assign(v * 5)
  assert b.tolist()[1] == [5, 5, 5] and v.tolist() == [[5, 5, 5]]
  b = fresh(); b[1:2].assign(b[0:1] + 100); b[0:1].assign(Tensor.zeros(1, 3))
  assert b.tolist()[:2] == [[0, 0, 0], [100, 101, 102]]   # the first write read row 0 before the second wrote it


def test_a_write_is_made_once():
  b = fresh(); v = b[1:2]; v.assign(v * 2 + 1)
  assert b.tolist()[1] == [7, 9, 11]
  assert v.tolist() == [[7, 9, 11]] and b.tolist()[1] == [7, 9, 11]
  u = v + 0   # a graph that held the write before it was made reads the written buffer
  assert u.tolist() == [[7, 9, 11]]


def test_through_a_transpose():
  b = fresh(); b.T[0:1].assign(Tensor.ones(1, 4))
  assert b.tolist() == [[1, 1, 2], [1, 4, 5], [1, 7, 8], [1, 10, 11]]


def test_a_write_reading_another_buffer_sees_that_buffers_pending_writes():
  # tinygrad's order: a write's value is realized when the write is made, so it sees what is pending on the
  # buffers it reads, even writes made after it (the same for either buffer realized first)
  for first in ("a", "b"):
    a, b = fresh(), fresh()
    a[0:1].assign(b[1:2]); b[1:2].assign(Tensor.zeros(1, 3))
    if first == "b": b.realize()
    assert a.tolist()[0] == [0, 0, 0] and b.tolist()[1] == [0, 0, 0]


def test_a_whole_buffer_assign_waits_for_its_own_tensor():
  # (tinygrad too) a lazy reader of the buffer sees the old contents until the assigning tensor is realized
  b = fresh(); c = b * 1; b.assign(Tensor.ones(4, 3))
  assert c.tolist() == X.tolist()
  b = fresh(); c = b[0:2]; b.assign(Tensor.ones(4, 3))
  assert c.tolist() == X[0:2].tolist()
  b = fresh(); c = b * 1; b.assign(Tensor.ones(4, 3)).realize()
  assert c.tolist() == np.ones((4, 3)).tolist()


def test_realized_together_with_its_reader():
  b = fresh(); v = b[1:2]; v.assign(Tensor(ONES)); c = b * 2
  Tensor.realize(v, c)
  assert c.tolist()[1] == [2, 2, 2]
  assert not _writes._PENDING


def test_writes_realized_together_stay_one_realize(monkeypatch):
  # each buffer has one pending write, made by the tensors realized: one realize carries them all out
  from rulec.engine.tensor import base
  calls = []
  real = base._engine.realize_map
  monkeypatch.setattr(base._engine, "realize_map", lambda *a, **k: calls.append(1) or real(*a, **k))
  ps = [Tensor(np.ones(8, np.float32)).realize() for _ in range(3)]
  halves = [p[:4] for p in ps]
  for h in halves: h.assign(h * 0.5)
  Tensor.realize(*halves)
  assert len(calls) == 1 and all(p.tolist() == [0.5] * 4 + [1] * 4 for p in ps)


def test_setitem_reading_itself_then_a_pending_write():
  b = fresh(); b[2:3].assign(Tensor(TWOS))   # pending
  b[0:2] = b[1:3] * 10                         # reads row 2 after the pending write
  assert b.tolist() == [[30, 40, 50], [20, 20, 20], [2, 2, 2], [9, 10, 11]]


# *** programs of writes and reads on one buffer, against numpy doing each step at once ***

def _views(shape):
  def spec(draw):
    sl = []
    for n in shape:
      step = draw(st.sampled_from([1, 1, 2, -1]))
      a, b = sorted(draw(st.lists(st.integers(0, n), min_size=2, max_size=2)))
      if a == b: b = min(n, a + 1); a = b - 1
      sl.append(slice(a, b) if step == 1 else slice(b - 1, a - 1 if a else None, -1) if step == -1 else slice(a, b, 2))
    return tuple(sl), draw(st.booleans())
  return spec


@st.composite
def programs(draw):
  shape = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
  view = _views(shape)
  steps = []
  for _ in range(draw(st.integers(1, 6))):
    kind = draw(st.sampled_from(["write_const", "write_self", "lazy", "read", "realize_write"]))
    steps.append((kind, view(draw), draw(st.integers(-3, 3))))
  return shape, steps


def _np_view(a, spec):
  sl, t = spec
  v = a[sl]
  return v.T if t else v


def _t_view(b, spec):
  sl, t = spec
  v = b[sl]
  return v.T if t else v


@pytest.mark.parametrize("device", [None, "NUMPY"])
@given(programs())
def test_programs_of_view_writes_match_numpy(device, prog):
  shape, steps = prog
  start = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
  ref = start.copy()
  b = Tensor(start, device=device).realize()
  lazies, writes = [], []
  for kind, spec, k in steps:
    if kind in ("write_const", "write_self"):
      v = _t_view(b, spec)
      whole = is_buffer_view(v.uop)
      # (write_self reads the same positions flipped, so it reads places other writes land on)
      v.assign(float(k) if kind == "write_const" else v.flip(0) * 2 + k); writes.append((v, spec))
      nv = _np_view(ref, spec)
      nv[...] = k if kind == "write_const" else nv[::-1] * 2 + k
      # a view that is the whole buffer in its own shape is b itself: lazy readers made before see its write once
      # it is carried out (test_a_whole_buffer_assign_waits_for_its_own_tensor), which b.realize() does here
      if whole: b.realize()
    elif kind == "lazy": lazies.append((b * 1 + k, k))
    elif kind == "read":
      np.testing.assert_array_equal(b.numpy(), ref)
      for t, kk in lazies: np.testing.assert_array_equal(t.numpy(), ref + kk)   # realized now: the buffer as it is now
      lazies = []
    elif writes:   # realize the last write's own tensor
      v, s = writes[-1]
      np.testing.assert_array_equal(v.numpy(), _np_view(ref, s))
  for t, kk in lazies: np.testing.assert_array_equal(t.numpy(), ref + kk)
  for v, s in writes: np.testing.assert_array_equal(v.numpy(), _np_view(ref, s))
  np.testing.assert_array_equal(b.numpy(), ref)
