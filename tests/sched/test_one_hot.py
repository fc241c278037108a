"""rules/symbolic.rules' iota_range and one_hot_sum (helpers in engine/sched/symbolic.py): Tensor.arange's iota
over a range is the range itself, and a sum over r of WHERE(i == r, v, 0) is v at r = i. So a gather or an
Embedding reads the rows it picks instead of every row (GPT-2's token embedding read all 50257 rows per token).

`rulec verify` cannot build these rules' graphs (a range, a reduce), so they are checked here: values against
numpy and the tensor evaluator for every arange size up to 130 and for random gathers with negative and
out-of-range indices, and the kernels' shapes (no loop over the rows a gather picks from)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from rulec import Tensor, nn
from rulec.engine.ir.ops import Ops
from rulec.engine.realize import schedule


def ops_of(kernels) -> set:
  return {u.op for k in kernels for u in k.ast.toposort()}


def sizes_of_ranges(kernels) -> set:
  return {u.src[0].arg for k in kernels for u in k.ast.toposort() if u.op is Ops.RANGE and u.src[0].op is Ops.CONST}


@pytest.mark.parametrize("n", [*range(1, 70), 127, 128, 129, 1000, 4097])
def test_arange_is_its_range(n):
  t = Tensor.arange(n)
  ks = schedule([t.uop])
  assert len(ks) == 1
  assert Ops.MOD not in ops_of(ks) and Ops.WHERE not in ops_of(ks), "the iota's digit patterns were not folded"
  np.testing.assert_array_equal(t.numpy(), np.arange(n))


@pytest.mark.parametrize("start,stop,step", [(3, 40, 1), (5, -7, -2), (0, 100, 7), (2, 3, 5)])
def test_arange_with_start_and_step(start, stop, step):
  np.testing.assert_array_equal(Tensor.arange(start, stop, step).numpy(), np.arange(start, stop, step))


def test_a_gather_reads_only_the_picked_rows():
  emb = nn.Embedding(1000, 8)
  idx = Tensor([[3, 999, 0]], dtype="int32")
  ks = schedule([emb(idx).uop])
  assert 1000 not in sizes_of_ranges(ks) and Ops.REDUCE not in ops_of(ks)
  np.testing.assert_array_equal(emb(idx).numpy(), emb.weight.numpy()[[[3, 999, 0]]])


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 12), st.integers(1, 5), st.lists(st.integers(-20, 20), min_size=1, max_size=6), st.integers(0, 2**31))
def test_gathers_and_indexing_match_the_evaluator(rows, cols, picks, seed):
  w = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)
  idx = np.array(picks, dtype=np.int32)
  t, i = Tensor(w), Tensor(idx)
  ok = (idx >= -rows) & (idx < rows)
  if ok.all():   # (advanced indexing raises on out-of-range indices: compare where numpy can)
    np.testing.assert_array_equal(t[i].numpy(), w[idx])
  # gather reads 0 outside [0, rows), with no wrapping (tinygrad)
  g = np.where(((idx >= 0) & (idx < rows))[:, None], w[np.clip(idx, 0, rows - 1)], 0).astype(np.float32)
  gi = Tensor(np.repeat(idx[:, None], cols, 1))
  np.testing.assert_array_equal(t.gather(0, gi).numpy(), g)


def test_embedding_gradient_is_still_a_scatter_add():
  emb = nn.Embedding(6, 3)
  w0 = emb.weight.numpy()
  idx = np.array([[1, 4, 1], [0, 5, 1]], np.int32)
  out = emb(Tensor(idx))
  np.testing.assert_array_equal(out.numpy(), w0[idx])
  (out * Tensor(np.arange(18, dtype=np.float32).reshape(2, 3, 3))).sum().backward()
  want = np.zeros((6, 3), np.float32)
  np.add.at(want, idx.reshape(-1), np.arange(18, dtype=np.float32).reshape(6, 3))
  np.testing.assert_array_equal(emb.weight.grad.numpy(), want)


def test_a_picked_negative_zero_stays_negative_zero():
  w = Tensor(np.array([[-0.0, 1.0], [2.0, -0.0]], np.float32))
  got = w[Tensor([0, 1], dtype="int32")].numpy()
  assert np.signbit(got[0, 0]) and np.signbit(got[1, 1])


def test_a_large_table_is_gathered_not_split():
  """An Embedding over GPT-2's vocabulary (50257 rows) and a gather from a 50000-row table: one kernel reading
  the picked rows. The reduce over the rows is large enough to be split in two (early.rules split_reduce), which
  would read every row of the table; a one-hot select is not split, so the symbolic rules collapse it."""
  from rulec import nn
  from rulec.engine import realize as R
  emb = nn.Embedding(50257, 16)
  emb.weight.realize()
  tok = Tensor([[5], [50256]], dtype="int32")
  ks = R.schedule([emb(tok).uop])
  assert len(ks) == 1 and [r.src[0].arg for r in ks[0].ranges] == [2, 16], ks
  np.testing.assert_array_equal(emb(tok).numpy()[:, 0], emb.weight.numpy()[[5, 50256]])
  w = Tensor(np.random.default_rng(3).standard_normal((50000, 8)).astype(np.float32)).realize()
  idx = [3, 49999, 7, -1, 12]
  ks = R.schedule([w[Tensor(idx, dtype="int32")].uop])
  assert len(ks) == 1 and [r.src[0].arg for r in ks[0].ranges] == [5, 8], ks
  np.testing.assert_array_equal(w[Tensor(idx, dtype="int32")].numpy(), w.numpy()[idx])
  # a masked sum (an equality with a constant) is split as any sum of its size is (in two on the CPU; a GPU sums
  # it in one pass)
  x = Tensor(np.arange(1 << 20, dtype=np.float32) % 7).realize()
  assert len(R.schedule([(x == 3).where(x, 0).sum().uop])) == len(R.schedule([(x * 2).sum().uop]))
  if x.device == "CPU": assert len(R.schedule([(x == 3).where(x, 0).sum().uop])) == 2
