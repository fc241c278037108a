"""Fusion by cost (rules/fusion.rules store_costly_epilogue and store_costly_value; engine/sched/fusion.py's
repeats, cost, transcendentals, tile and launch_cost facts): a transcendental that a reduction would recompute on
every trip is stored once when that is cheaper, and a cheap or small one is left where it is read. Kernels are
counted and their operations read, never timed; values are checked against numpy."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from rulec.engine.ir.ops import Ops
from rulec.engine.sched import cache as schedule_cache
from rulec.engine.sched.fusion import FusionFacts
from rulec.engine.tensor import Tensor


def _rand(rng, *shape, scale=0.1, device=None):
  return Tensor((rng.standard_normal(shape) * scale).astype(np.float32), device=device)


def _np_gelu(h):
  return 0.5 * h * (1 + np.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h ** 3)))


def _mlp(rng, n=128, c=96, hidden=384):
  x, w1, b1, w2 = _rand(rng, n, c, scale=1.0), _rand(rng, c, hidden), _rand(rng, hidden), _rand(rng, hidden, c)
  return x, w1, b1, w2


def _computes_exp(kernel) -> bool:
  return any(u.op is Ops.EXP2 for u in kernel.ast.toposort())


def test_gelu_read_by_a_matmul_is_stored_not_recomputed():
  """GPT-2's MLP: gelu(x @ w1 + b1) @ w2. The second matmul reads gelu once per output column (96 here): gelu is
  stored in the first matmul's kernel instead of its input, the same number of kernels, and no kernel computes
  an exp inside the second matmul's loop."""
  schedule_cache.clear()
  x, w1, b1, w2 = _mlp(np.random.default_rng(0))
  out = (x @ w1 + b1).gelu() @ w2
  kernels = Tensor.schedule(out)
  assert len(kernels) == 2
  last = kernels[-1]
  assert not _computes_exp(last)   # the second matmul reads gelu, stored
  assert _computes_exp(kernels[0])  # the first computes it once per element
  want = _np_gelu(x.numpy() @ w1.numpy() + b1.numpy()) @ w2.numpy()
  np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-5)


def test_a_user_rules_dir_can_turn_the_cost_rules_off(tmp_path, monkeypatch):
  """The decision is a rule: a directory whose fuse_reduces and fuse_values leave the cost rules out gets the
  old schedule back (h stored, gelu recomputed inside the second matmul), and the same values."""
  src = (Path(__file__).resolve().parents[2] / "rules" / "fusion.rules").read_text()
  keep, skip = [], False
  for line in src.splitlines():
    if line.startswith("  rule "): skip = line.split()[1].rstrip(":") in ("store_costly_epilogue", "store_costly_value")
    elif not line.startswith("    "): skip = False
    if not skip: keep.append(line)
  (tmp_path / "fusion.rules").write_text("\n".join(keep) + "\n")
  x, w1, b1, w2 = _mlp(np.random.default_rng(1))
  want = ((x @ w1 + b1).gelu() @ w2).numpy()
  monkeypatch.setenv("RULEC_RULES", str(tmp_path))
  schedule_cache.clear()
  out = (x @ w1 + b1).gelu() @ w2
  kernels = Tensor.schedule(out)
  assert len(kernels) == 2 and _computes_exp(kernels[-1])
  np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-5)
  monkeypatch.delenv("RULEC_RULES")
  schedule_cache.clear()


def test_training_stores_gelu_beside_what_the_backward_reads():
  """Forward and backward: the backward reads h = x @ w1 + b1 too, so h stays stored (lower_value_first) and gelu
  is stored beside it (store_costly_value, one kernel more) rather than recomputed in the second matmul's loop.
  Gradients match numpy's."""
  schedule_cache.clear()
  rng = np.random.default_rng(2)
  x, w1, b1, w2 = _mlp(rng)
  for t in (w1, b1, w2): t.requires_grad = True
  out = (x @ w1 + b1).gelu() @ w2
  out.square().sum().backward()
  grads = [w1.grad, b1.grad, w2.grad]
  kernels = Tensor.schedule(*grads)
  # the two matmuls that read gelu, y @ w2 (a loop over its 384 columns) and dW2 = y.T @ dout (a loop over the
  # 128 rows), read it stored: neither computes an exp (with the cost rules off both do, on every trip)
  readers = [k for k in kernels if "ranges (128, 96, 384)" in repr(k) or "ranges (384, 96, 128)" in repr(k)]
  assert len(readers) == 2 and not any(_computes_exp(k) for k in readers)
  assert sum(_computes_exp(k) for k in kernels) == 2   # gelu, and its derivative in dh's epilogue
  g = [t.numpy() for t in grads]
  xn, w1n, b1n, w2n = (t.numpy() for t in (x, w1, b1, w2))
  h = xn @ w1n + b1n
  a = math.sqrt(2 / math.pi) * (h + 0.044715 * h ** 3)
  th = np.tanh(a)
  y = _np_gelu(h)
  dout = 2 * (y @ w2n)
  dw2 = y.T @ dout
  dy = dout @ w2n.T
  dh = dy * (0.5 * (1 + th) + 0.5 * h * (1 - th ** 2) * math.sqrt(2 / math.pi) * (1 + 3 * 0.044715 * h ** 2))
  np.testing.assert_allclose(g[2], dw2, rtol=2e-3, atol=1e-3)
  np.testing.assert_allclose(g[1], dh.sum(0), rtol=2e-3, atol=1e-3)
  np.testing.assert_allclose(g[0], xn.T @ dh, rtol=2e-3, atol=1e-3)


def test_a_small_recomputation_is_not_worth_a_kernel():
  """A decoding step's attention: one query over 8 positions. Its softmax is read by the weighted sum over 64
  head dimensions, but recomputing 4 x 8 probabilities twice costs less than a kernel (ctx.launch_cost): the
  kernel count is what it is with the cost rules off."""
  rng = np.random.default_rng(3)
  q, k, v = _rand(rng, 4, 1, 64), _rand(rng, 4, 8, 64), _rand(rng, 4, 8, 64)
  def run():
    schedule_cache.clear()
    out = (q @ k.transpose(-1, -2) / 8).softmax(-1) @ v
    return len(Tensor.schedule(out)), out.numpy()
  n, got = run()
  s = q.numpy() @ k.numpy().transpose(0, 2, 1) / 8
  p = np.exp(s - s.max(-1, keepdims=True))
  np.testing.assert_allclose(got, (p / p.sum(-1, keepdims=True)) @ v.numpy(), rtol=1e-4, atol=1e-5)
  import rulec.engine.sched.fusion as fusion
  old, fusion.LAUNCH_COST = fusion.LAUNCH_COST, 1 << 60
  try: n_off, _ = run()
  finally: fusion.LAUNCH_COST = old
  assert n == n_off


def test_a_long_attention_stores_its_probabilities():
  """Attention over 256 positions: the probabilities exp(s - max) / sum are read by the weighted sum on every
  trip over 64 head dimensions; they are stored once (one kernel more than with the cost rules off), and the
  weighted sum's kernel computes no exp."""
  rng = np.random.default_rng(4)
  q, k, v = _rand(rng, 4, 256, 64), _rand(rng, 4, 256, 64), _rand(rng, 4, 256, 64)
  schedule_cache.clear()
  out = (q @ k.transpose(-1, -2) / 8).softmax(-1) @ v
  kernels = Tensor.schedule(out)
  assert not _computes_exp(kernels[-1])
  s = q.numpy() @ k.numpy().transpose(0, 2, 1) / 8
  p = np.exp(s - s.max(-1, keepdims=True))
  np.testing.assert_allclose(out.numpy(), (p / p.sum(-1, keepdims=True)) @ v.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("shape_a, shape_b, reduce_axes, want", [
  ((8, 1, 16), (8, 32, 16), (2,), 32.0),    # a matmul's left operand: once per output column
  ((8, 16), (8, 16), (1,), 1.0),            # a dot product of the value as it is
  ((8, 1), (8, 16), (1,), 0.0),             # broadcast along the reduced axis only: the same on every trip
])
def test_repeats_counts_expansions_along_kept_axes(shape_a, shape_b, reduce_axes, want):
  """ctx.repeats under a contraction (a sum of products), and the cost of one exp2 (16 ALU ops)."""
  from rulec.engine.ir.dtypes import dtypes
  from rulec.engine.ir.uop import UOp
  a = Tensor(np.ones(shape_a, np.float32)).exp2()
  r = (a.expand(shape_b) * Tensor(np.ones(shape_b, np.float32))).sum(reduce_axes)
  facts = FusionFacts(UOp(Ops.SINK, dtypes.void, (r.uop,)), hoists=False)
  assert facts.repeats(a.uop) == want
  assert facts.transcendentals(a.uop) == 1 and facts.cost(a.uop) == 16


def test_a_pool_is_not_a_contraction():
  """A max pool reads each element once per window it lies in: no reduction recomputes it per output column."""
  from rulec.engine.ir.dtypes import dtypes
  from rulec.engine.ir.uop import UOp
  a = Tensor(np.ones((1, 4, 8, 8), np.float32)).exp2()
  r = a.max_pool2d(3, stride=1)
  facts = FusionFacts(UOp(Ops.SINK, dtypes.void, (r.uop,)), hoists=False)
  assert facts.repeats(a.uop) == 0


def test_an_elementwise_broadcast_is_not_a_repeat():
  """A per-channel scale broadcast over an image and added to it: no reduce reads it, so it is computed outside
  the loops over the broadcast axes (repeats 0), whatever its expansion."""
  from rulec.engine.ir.dtypes import dtypes
  from rulec.engine.ir.uop import UOp
  s = Tensor(np.ones((4, 1, 1), np.float32)).sqrt()
  out = Tensor(np.ones((4, 8, 8), np.float32)) * s.expand(4, 8, 8)
  facts = FusionFacts(UOp(Ops.SINK, dtypes.void, (out.uop,)), hoists=False)
  assert facts.repeats(s.uop) == 0 and facts.uses(s.uop) == 64


def test_attention_heads_merged_for_the_projection_keep_their_axes():
  """Attention's (B, H, T, D) output permuted to (B, T, H, D) and reshaped to (B, T, H * D) for the output
  projection is stored permuted (store_permuted_reduce), with the kernel's loops over H and D apart: a loop over
  H * D would index v with divisions by D, which no register tile takes (it ran 90 times slower on the CPU)."""
  schedule_cache.clear()
  rng = np.random.default_rng(5)
  b, t, h, d = 2, 8, 4, 16
  q, k, v, w = _rand(rng, b, h, t, d), _rand(rng, b, h, t, d), _rand(rng, b, h, t, d), _rand(rng, h * d, h * d)
  a = (q @ k.transpose(-1, -2)).softmax(-1) @ v
  out = a.transpose(1, 2).reshape(b, t, h * d) @ w
  kernels = Tensor.schedule(out)
  assert any(f"ranges ({b}, {t}, {h}, {d}, {t})" in repr(k) for k in kernels), kernels
  s = q.numpy() @ k.numpy().transpose(0, 1, 3, 2)
  p = np.exp(s - s.max(-1, keepdims=True))
  want = ((p / p.sum(-1, keepdims=True)) @ v.numpy()).transpose(0, 2, 1, 3).reshape(b, t, h * d) @ w.numpy()
  np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("rows, stored", [(512, True), (1, False)])
def test_a_layernorm_read_by_a_wide_matmul_is_stored_unless_it_is_one_row(rows, stored):
  """ln(x) * g + b read by x @ w1 (3072 columns): recomputed on every trip of the matmul's loop it slowed that loop
  (store_costly_value stores it: the matmul kernel then reads one buffer for its left operand); for one row (a
  decoding step) the recomputation costs less than a kernel, and it stays in the matmul."""
  schedule_cache.clear()
  rng = np.random.default_rng(6)
  x, g, b, w = _rand(rng, rows, 768, scale=1.0), _rand(rng, 768), _rand(rng, 768), _rand(rng, 768, 3072)
  out = (x.layernorm() * g + b) @ w
  kernels = Tensor.schedule(out)
  matmul = kernels[-1]
  assert ("reads p1 p2, writes" in repr(matmul)) == stored, kernels   # the normalised rows and w, or all five
  xn = x.numpy()
  ln = (xn - xn.mean(-1, keepdims=True)) / np.sqrt(xn.var(-1, keepdims=True) + 1e-5)
  np.testing.assert_allclose(out.numpy(), (ln * g.numpy() + b.numpy()) @ w.numpy(), rtol=1e-4, atol=1e-4)


def test_a_convolutions_normalised_input_is_stored_when_training():
  """A residual block in training: relu(batchnorm(conv1(x))) with batch statistics is the second convolution's
  input. Recomputed there, on every trip over 64 output channels and 9 taps, it held that convolution to a third of
  the first one's speed (193 against 54 ms at 8x64x56x56 on this CPU); it is stored, and the second convolution's
  kernel reads one buffer besides its weights, as the first does. Both inputs are stored padded
  (store_padded_input): relu(batchnorm(..)) in the kernel that writes the second one's padded input. (On the CPU,
  whatever RULEC_DEVICE says: padded inputs are stored only where a guard costs every vector lane, and a GPU's CL
  orders a convolution's ranges otherwise.)"""
  schedule_cache.clear()
  rng = np.random.default_rng(7)
  x, w1, w2 = (_rand(rng, *s, scale=sc, device="CPU") for s, sc in (((4, 64, 16, 16), 1.0), ((64, 64, 3, 3), 0.1),
                                                                   ((64, 64, 3, 3), 0.1)))
  def bn(y):
    mean = y.mean(axis=(0, 2, 3)).reshape(1, -1, 1, 1)
    return (y - mean) * ((y - mean).square().mean(axis=(0, 2, 3)).reshape(1, -1, 1, 1) + 1e-5).rsqrt()
  out = bn(bn(x.conv2d(w1, padding=1)).relu().conv2d(w2, padding=1))
  kernels = Tensor.schedule(out)
  convs = [k for k in kernels if "ranges (4, 64, 16, 16, 64, 3, 3)" in repr(k)]
  assert len(convs) == 2 and all("reads p1 p2, writes" in repr(k) for k in convs), kernels
  padded = [k for k in kernels if "ranges (4, 64, 18, 18)" in repr(k)]
  assert len(padded) == 2 and sum("reads p1, writes" in repr(k) for k in padded) == 1, kernels
  def np_bn(y):
    return (y - y.mean((0, 2, 3), keepdims=True)) / np.sqrt(y.var((0, 2, 3), keepdims=True) + 1e-5)
  def np_conv(a, w):
    p = np.pad(a, ((0, 0), (0, 0), (1, 1), (1, 1)))
    win = np.lib.stride_tricks.sliding_window_view(p, (3, 3), axis=(2, 3))   # (n, c, 16, 16, 3, 3)
    return np.einsum("nchwij,ocij->nohw", win, w)
  want = np_bn(np_conv(np.maximum(np_bn(np_conv(x.numpy(), w1.numpy())), 0), w2.numpy()))
  np.testing.assert_allclose(out.numpy(), want, rtol=1e-3, atol=1e-3)


def test_reduced_axes_are_followed_through_reshapes():
  from rulec.engine.sched.fusion import _reshape_mask
  from rulec.engine.sched.fusion import BROADCAST, KEPT, REDUCED
  assert _reshape_mask((2, 12, 64), (2, 768), (KEPT, REDUCED)) == (KEPT, REDUCED, REDUCED)   # a reduced axis split
  assert _reshape_mask((2, 768), (2, 12, 64), (KEPT, REDUCED, BROADCAST)) == (KEPT, REDUCED)  # two merged
  assert _reshape_mask((2, 768), (2, 12, 64), (KEPT, KEPT, REDUCED)) is None               # kept and reduced merged
  assert _reshape_mask((4, 1, 8), (4, 8, 1), (REDUCED, KEPT, KEPT)) == (REDUCED, KEPT, KEPT)  # unit axes: kept


def test_a_tiled_contractions_costly_epilogue_is_a_kernel_of_its_own(monkeypatch):
  """store_sum_before_costly_epilogue: where a contraction runs in register tiles on few threads (ctx.tiled_epilogues:
  the CL device with tiles, a GPU; here PoCL with its target's tiles on), the MLP backward's gelu' over dy @ W2.T
  (ctx.epilogue_cost about 97 ALU ops an element) is an elementwise kernel of its own after the product's; gelu(x @ w1
  + b1) (about 47) stays in its matmul, and without tiles both stay fused. Values agree with the NUMPY device."""
  pytest.importorskip("pyopencl")
  import attrs

  from rulec.runtime import cl_device
  dev = cl_device.get_device()
  rng = np.random.default_rng(26)
  n, c, hidden = 64, 32, 96
  dy, w2, h = (rng.standard_normal(s).astype(np.float32) for s in ((n, c), (hidden, c), (n, hidden)))
  x, w1, b1 = (rng.standard_normal(s).astype(np.float32) for s in ((n, c), (c, hidden), (hidden,)))
  def programs(device):
    T = lambda a: Tensor(a, device=device)  # noqa: E731
    th = T(h)
    return th.gelu().gradient(th, gradient=T(dy) @ T(w2).T)[0], (T(x) @ T(w1) + T(b1)).gelu()
  want = [t.numpy() for t in programs("NUMPY")]
  untiled = attrs.evolve(dev.target, tile=0)
  for tiled in (False, True):
    monkeypatch.setattr(dev, "target", attrs.evolve(untiled, tile=256) if tiled else untiled)
    schedule_cache.clear()
    back, fwd = programs("CL")
    kb, kf = back.schedule(), fwd.schedule()
    sums = [k for k in kb if any(u.op is Ops.REDUCE for u in k.ast.toposort())]
    assert len(sums) == 1 and _computes_exp(sums[0]) == (not tiled) and len(kb) == 1 + tiled, (tiled, kb)
    assert len(kf) == 1 and _computes_exp(kf[0])
    back, fwd = programs("CL")
    np.testing.assert_allclose(back.numpy(), want[0], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(fwd.numpy(), want[1], rtol=1e-4, atol=1e-4)
  schedule_cache.clear()


@pytest.mark.parametrize("tc", [False, True])
def test_half_factors_of_a_contraction_are_stored_where_tensor_cores_run_it(monkeypatch, tc):
  """store_half_factor: on devices with tensor cores (ctx.tensor_cores; forced here on the CPU, which runs the same
  schedule), autocast's casts that a matmul reads, of inputs or of a layernorm's float32 output, are kernels of their
  own (the tensor cores copy stored 2-byte operands, and compute fused ones an element at a time); elsewhere they
  stay fused. The values are the same either way."""
  from rulec.engine.ir.dtypes import dtypes
  from rulec.engine.sched import driver
  monkeypatch.setattr(driver, "tensor_cores", lambda d: tc)
  monkeypatch.setattr(schedule_cache, "tensor_cores", lambda d: tc)
  schedule_cache.clear()
  rng = np.random.default_rng(33)
  x, w, g = (rng.standard_normal(s).astype(np.float32) for s in ((2, 40, 64), (64, 96), (64,)))
  def programs(device):
    tx, tw = Tensor(x, device=device), Tensor(w, device=device)
    autocast = tx.cast(dtypes.bfloat16) @ tw.cast(dtypes.bfloat16)
    wb = tw.cast(dtypes.bfloat16).contiguous().realize()
    normed = (tx.layernorm() * Tensor(g, device=device)).cast(dtypes.bfloat16) @ wb
    return autocast, normed
  from rulec.codegen import gemm_plan
  a, n = programs("CPU")
  ka, kn = a.schedule(), n.schedule()
  # autocast: two casts and the matmul, which then copies both factors (not 1 kernel computing the casts); the
  # layernorm: its half output (the CPU computes its rows' statistics in that kernel) and the matmul (not a matmul
  # that normalises its factor)
  assert (len(ka), len(kn)) == ((3, 2) if tc else (1, 3)), (ka, kn)
  for k in (ka[-1], kn[-1]):
    p = gemm_plan.plan(k)
    assert (isinstance(p.a, gemm_plan.Operand) and isinstance(p.b, gemm_plan.Operand)) == tc, (p.a, p.b)
  for got, want in zip(programs("CPU"), programs("NUMPY")):
    np.testing.assert_array_equal(got.float().numpy(), want.float().numpy())
  schedule_cache.clear()
