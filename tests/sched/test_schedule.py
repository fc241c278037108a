"""The scheduler: kernel counts of canonical programs, no duplicated reduces,
assign ordering, split reduces, and RULEC_DEBUG output. Values are checked
against numpy (the programs run on the NUMPY device through the scheduler)."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rulec.engine.ir.ops import Ops
from rulec.engine import realize as engine_realize
from rulec.engine.tensor import Tensor
from rulec.runtime.devices import rows_shared, tiles_sums
from rulec.engine.ir.kernel import validate
from tests.helpers import subprocess_env

ROOT = Path(__file__).resolve().parents[2]
rng = np.random.default_rng(0)


def T(*shape): return Tensor(rng.standard_normal(shape).astype(np.float32))


def kernels(*ts):
  ks = Tensor.schedule(*ts)
  for k in ks: validate(k)
  return ks


def test_elementwise_chain_is_one_kernel():
  a, b, c = T(4, 5), T(4, 5), T(5)
  out = ((a * b + c).exp() - a).relu().sqrt() * 2
  assert len(kernels(out)) == 1
  want = np.sqrt(np.maximum(np.exp(a.numpy() * b.numpy() + c.numpy()) - a.numpy(), 0)) * 2
  np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-6)


def test_a_reduce_two_outputs_read_is_computed_once():
  # each output is a kernel of its own: a matmul both read is stored, not recomputed in each
  a, b = T(8, 16), T(16, 4)
  e, s = (a @ b).exp(), (a @ b).sin()
  ks = kernels(e, s)
  assert len(ks) == 3 and sum(any(u.op is Ops.REDUCE for u in k.ast.toposort()) for k in ks) == 1
  m = a.numpy() @ b.numpy()
  np.testing.assert_allclose(e.numpy(), np.exp(m), rtol=1e-5)
  np.testing.assert_allclose(s.numpy(), np.sin(m), rtol=1e-5, atol=1e-6)


def test_relu_of_matmul_plus_bias_is_one_kernel():
  a, b, c = T(8, 16), T(16, 4), T(4)
  out = (a @ b + c).relu()
  assert len(kernels(out)) == 1
  np.testing.assert_allclose(out.numpy(), np.maximum(a.numpy() @ b.numpy() + c.numpy(), 0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("how", ["sum", "max", "prod", "pool", "mean_keepdim"])
def test_a_reduce_over_axes_of_size_one_is_no_kernel(how):
  # a squeeze-excite pool over a 1x1 image (EfficientNet at 32x32): the reduce combines nothing, so it is the
  # values reshaped and fuses into its consumer (rules/early.rules reduce_unit_axes), as tinygrad builds it
  x, w = T(2, 6, 1, 1), T(3, 6)
  r = {"sum": lambda: x.sum((2, 3)), "max": lambda: x.max((2, 3)), "prod": lambda: x.prod((2, 3)),
       "pool": lambda: x.avg_pool2d(kernel_size=(1, 1)).reshape(2, 6),
       "mean_keepdim": lambda: x.mean((2, 3), keepdim=True).reshape(2, 6)}[how]()
  out = (r @ w.T).relu()
  assert len(kernels(out)) == 1
  np.testing.assert_allclose(out.numpy(), np.maximum(x.numpy().reshape(2, 6) @ w.numpy().T, 0), rtol=1e-5, atol=1e-6)
  # a reduce over unit axes and a real one together still reduces the real one
  both = x.reshape(2, 3, 2, 1).sum((1, 3))
  np.testing.assert_allclose(both.numpy(), x.numpy().reshape(2, 3, 2, 1).sum((1, 3)), rtol=1e-5, atol=1e-6)


def test_a_constant_reduced_over_nothing_is_the_identity_not_the_constant():
  # fold_constant_reduce alone (rulec verify checks each rule alone) answered the constant for an empty max
  from rulec.engine.ir.uop import UOp
  from rulec.engine.ir.dtypes import dtypes
  from rulec.engine.sched.early import fold_constant_reduce
  x = UOp.const(dtypes.int64, 0).reshape((1, 1)).expand((0, 2))
  red = UOp(Ops.REDUCE_AXIS, dtypes.int64, (x,), (Ops.MAX, (0,)))
  assert fold_constant_reduce(red, x) is None
  full = UOp.const(dtypes.int64, 3).reshape((1, 1)).expand((4, 2))
  assert fold_constant_reduce(UOp(Ops.REDUCE_AXIS, dtypes.int64, (full,), (Ops.ADD, (0,))), full).base.arg == 12


def _np_layernorm(x): return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)


@pytest.mark.parametrize("blocks", [1, 2, 4])
def test_a_residual_stream_is_stored_once_per_block(blocks):
  # x = x + relu(ln(x) @ w), block after block (a pre-norm transformer's stream): each sum is stored with its own
  # matmul in its kernel; recomputed from the previous block's stored sum, it cost its matmul a kernel of its own
  # and itself one more, growing with depth (3, 7, 13, 20 kernels for 1..4 blocks; tinygrad: 3 a block)
  x0, ws = T(8, 16), [T(16, 16) for _ in range(blocks)]
  x, want = x0, x0.numpy()
  for w in ws:
    x = x + (x.layernorm() @ w).relu()
    want = want + np.maximum(_np_layernorm(want) @ w.numpy(), 0)
  assert len(kernels(x)) == 3 * blocks
  np.testing.assert_allclose(x.numpy(), want, rtol=1e-4, atol=1e-4)


def test_gelu_backward_recomputes_its_pieces_in_the_gradient_matmuls():
  # BERT's gelu (x * 0.5 * (1 + erf(x / 1.41421))).contiguous() in a training step: its gradient sums two products
  # over two matmuls; stored in pieces it took two kernels more than tinygrad's 7
  x, w1, w2 = (Tensor(rng.standard_normal(s).astype(np.float32), requires_grad=True) for s in ((16, 8), (8, 32), (32, 8)))
  h = x @ w1
  g = (h * 0.5 * (1.0 + (h / 1.41421).erf())).contiguous()
  loss = (g @ w2).sum()
  loss.backward()
  # (a GPU's CL device, whose register tiles run a matmul's epilogue on few threads, stores dg's product before the
  # costly erf' epilogue: rules/fusion.rules store_sum_before_costly_epilogue, one kernel more)
  assert len(kernels(loss, x.grad, w1.grad, w2.grad)) == 7 + tiles_sums(x.device)
  from math import erf
  hn = x.numpy() @ w1.numpy()
  dg = np.ones((16, 8), np.float32) @ w2.numpy().T
  erfv = np.vectorize(erf)(hn / 1.41421)
  dh = dg * (0.5 * (1 + erfv) + hn * 0.5 * 2 / np.sqrt(np.pi) * np.exp(-(hn / 1.41421) ** 2) / 1.41421)
  np.testing.assert_allclose(x.grad.numpy(), dh @ w1.numpy().T, rtol=2e-3, atol=2e-3)
  np.testing.assert_allclose(w1.grad.numpy(), x.numpy().T @ dh, rtol=2e-3, atol=2e-3)
  np.testing.assert_allclose(w2.grad.numpy(), (hn * 0.5 * (1 + erfv)).T @ np.ones((16, 8)), rtol=2e-3, atol=2e-3)


def test_attention_backward_takes_no_gradient_through_the_softmax_max():
  # softmax(x) = softmax(x - c): the max only keeps exp in range, so it is detached (as tinygrad does); the gradient
  # through it (zero up to rounding) cost two kernels (12). Forward and backward of masked attention: 9, tinygrad 10
  q, k, v = (Tensor(rng.standard_normal((2, 3, 8, 4)).astype(np.float32), requires_grad=True) for _ in range(3))
  mask = Tensor(np.tril(np.ones((8, 8), bool)))
  r = T(2, 3, 8, 4)
  loss = (q.scaled_dot_product_attention(k, v, mask) * r).sum()
  loss.backward()
  assert len(kernels(loss, q.grad, k.grad, v.grad)) == 9
  qn, kn, vn, rn = q.numpy(), k.numpy(), v.numpy(), r.numpy()
  sc = np.where(np.tril(np.ones((8, 8), bool)), qn @ kn.swapaxes(-1, -2) / 2.0, -np.inf)
  p = np.exp(sc - sc.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
  dp = rn @ vn.swapaxes(-1, -2)
  ds = p * (dp - (dp * p).sum(-1, keepdims=True)) / 2.0
  np.testing.assert_allclose(loss.item(), ((p @ vn) * rn).sum(), rtol=1e-4)
  np.testing.assert_allclose(q.grad.numpy(), ds @ kn, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(k.grad.numpy(), ds.swapaxes(-1, -2) @ qn, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(v.grad.numpy(), p.swapaxes(-1, -2) @ rn, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op, most", [("softmax", 3), ("layernorm", 3), ("log_softmax", 3)])
def test_normalisations_take_at_most_as_many_kernels_as_tinygrad(op, most):
  x = T(6, 33)
  out = getattr(x, op)()
  assert len(kernels(out)) <= most
  v = x.numpy()
  if op == "layernorm": want = (v - v.mean(-1, keepdims=True)) / np.sqrt(v.var(-1, keepdims=True) + 1e-5)
  else:
    e = np.exp(v - v.max(-1, keepdims=True))
    want = e / e.sum(-1, keepdims=True)
    if op == "log_softmax": want = np.log(want)
  np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-5)


def test_mlp_is_two_kernels_and_a_reused_reduce_is_computed_once():
  x, w1, b1, w2 = T(4, 12), T(12, 8), T(8), T(8, 3)
  out = (x @ w1 + b1).relu() @ w2
  assert len(kernels(out)) == 2
  h = np.maximum(x.numpy() @ w1.numpy() + b1.numpy(), 0)
  np.testing.assert_allclose(out.numpy(), h @ w2.numpy(), rtol=1e-4, atol=1e-4)
  # the same sum used by two consumers at different indices is realized once, not recomputed
  s = x.sum(1, keepdim=True)
  both = x / s + s.T.sum()
  ks = kernels(both)
  # s once (reads x), then the result (reads x and s); its total is computed once inside the result's kernel
  # on devices that hoist a reduce out of loops it does not depend on (CPU, NUMPY), else stored by a kernel of
  # its own (reads only s): s is never recomputed
  if x.device in ("CPU", "NUMPY"): assert len(ks) == 2 and [len(k.inputs) for k in ks] == [1, 2]
  elif rows_shared(x.device):   # (a GPU's CL device: s, a row value, is computed per row in the result's kernel)
    assert len(ks) == 2 and [len(k.inputs) for k in ks] == [1, 2]
  else: assert len(ks) == 3 and [len(k.inputs) for k in ks] == [1, 1, 3] and ks[1].bufs[1].arg[2] == 4
  np.testing.assert_allclose(both.numpy(), x.numpy() / x.numpy().sum(1, keepdims=True) + x.numpy().sum(), rtol=1e-4)


def test_already_realized_needs_no_kernel_and_constants_fold():
  a = T(3, 3).realize()
  assert kernels(a) == []
  z = Tensor.zeros(3, 3) * 5 + 1
  (k,) = kernels(z)
  assert not k.inputs   # a constant fill reads no buffer
  assert z.tolist() == [[1.0] * 3] * 3


def test_a_contiguous_value_of_constants_is_not_kept_in_a_buffer_placed_nowhere():
  # x.all() over an empty x folds to the constant True while scheduling; its contiguous copy, read by the output,
  # was kept (handed back to the live graph) in a buffer with no device, and running it crashed (found by
  # tests/fuzz_programs.py, seed 1601, program 5161)
  v = Tensor(np.zeros((1, 0, 2), np.float32)).all()
  out = v ** v.contiguous().clip(False)
  assert out.numpy() == np.array(True) and out.dtype.name == "bool"


def test_assign_runs_after_the_reads_of_the_old_value():
  a = Tensor([1.0, 2.0, 3.0]).realize()
  old_plus = a + 10            # reads a's old contents
  a.assign(a * 2)
  Tensor.realize(old_plus, a)
  assert old_plus.tolist() == [11.0, 12.0, 13.0] and a.tolist() == [2.0, 4.0, 6.0]


def test_an_update_reading_state_written_from_its_own_reduce_is_in_place():
  # an optimizer's step realized with its gradient: the state m is written from a sum over the parameter, and the
  # parameter's update reads m after that write. The update reads the parameter only at the element it writes, so
  # it is stored in place (2 kernels); it was computed into a copy and copied back (3)
  x, w, m = T(4, 8), T(8).realize(), T(8).realize()
  xn, wn, mn = x.numpy(), w.numpy(), m.numpy()
  m.assign(m * 0.9 + (x * w).sum(0))
  w.assign(w - m * 0.1)
  assert len(kernels(m, w)) == 2
  Tensor.realize(m, w)
  mn = mn * 0.9 + (xn * wn).sum(0)
  # atol: a sum of four unit-sized products can cancel to ~0.01, where float32's summation order alone moves the
  # relative error past 1e-5 (the inputs come from the module's shared generator, so they depend on test order)
  np.testing.assert_allclose(m.numpy(), mn, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(w.numpy(), wn - mn * 0.1, rtol=1e-5, atol=1e-6)
  # the update reading the reduce itself (not through a stored value) still reads a copy of the old contents
  before = w.numpy()
  w.assign(w - (x * w).sum(0) * 0.1)
  assert len(kernels(w)) == 2
  np.testing.assert_allclose(w.numpy(), before - (xn * before).sum(0) * 0.1, rtol=1e-5, atol=1e-5)


def test_big_reduce_is_split_in_two(monkeypatch):
  import rulec.engine.sched.early as th
  monkeypatch.setattr(th, "REDUCE_SPLIT_THRESHOLD", 300)
  x = T(4096)
  # on a device that reduces one value in one launch (a GPU's CL device: GRID) the sum stays whole
  one_pass = th.one_pass_groups(x.device) > 0
  assert len(kernels(x.sum())) == (1 if one_pass else 2)
  monkeypatch.setattr(th, "one_pass_groups", lambda device: 0)
  monkeypatch.setenv("RULEC_SCHEDULE_CACHE", "0")   # (its key reads the device, not this patch)
  s = x.sum()
  assert len(kernels(s)) == 2
  np.testing.assert_allclose(s.numpy(), x.numpy().sum(), rtol=1e-4)


def test_size_zero_and_scalar_outputs():
  e = Tensor(np.zeros((0, 3), np.float32))
  assert (e + 1).numpy().shape == (0, 3) and kernels(e + 1) == []
  assert e.sum(0).tolist() == [0.0, 0.0, 0.0]
  assert T(5).sum().numpy().shape == ()


def test_counters_count_scheduled_and_run_kernels():
  before = dict(engine_realize.COUNTERS)
  (T(3) + 1).realize()
  assert engine_realize.COUNTERS["scheduled"] == before["scheduled"] + 1
  assert engine_realize.COUNTERS["run"] == before["run"] + 1


def test_debug_output_names_every_pass(tmp_path):
  code = "from rulec.engine.tensor import Tensor; import numpy as np; (Tensor(np.ones((4, 4), np.float32)).softmax(-1)).realize()"
  env = subprocess_env(RULEC_DEBUG="1")
  out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
  for p in ("earliest", "prepare", "fusion", "realize", "rangeify", "symbolic"): assert f"[schedule] {p}" in out
  # one kernel where the device computes the row's max and sum once per row inside it (CPU, NUMPY, a GPU's CL
  # device: a row per work-group), else three
  from rulec.runtime.devices import default_device
  one = default_device() in ('CPU', 'NUMPY') or rows_shared(default_device())
  assert f"[schedule] {1 if one else 3} kernels" in out


@pytest.mark.parametrize("name", ["softmax", "log_softmax", "layernorm"])
def test_a_row_program_assigned_into_a_buffer_is_the_same_kernels_as_realized(name):
  # an assign's value is stored where a realized value would be: the row's max and sum stay in the store's kernel
  # (one kernel on devices that compute a row's value once per row); into a transposed view the store's loops run
  # in the target's order, so the row's values are stored first, as before; values as numpy's either way
  from rulec.runtime.devices import default_device
  f = {"softmax": lambda t: t.softmax(-1), "log_softmax": lambda t: t.log_softmax(-1), "layernorm": lambda t: t.layernorm()}[name]
  x = np.random.default_rng(8).standard_normal((16, 64)).astype(np.float32)
  ref = f(Tensor(x, device="NUMPY")).numpy()
  src = Tensor(x).realize()
  out = Tensor.empty(16, 64).realize()
  fresh = len(f(src).schedule())
  assigned = out.assign(f(src))
  assert len(assigned.schedule()) == fresh
  np.testing.assert_allclose(assigned.numpy(), ref, rtol=1e-5, atol=1e-6)
  if default_device() in ("CPU", "NUMPY"): assert fresh == 1
  flipped = Tensor.empty(64, 16).realize()
  flipped.T.assign(f(src)).realize()
  np.testing.assert_allclose(flipped.numpy().T, ref, rtol=1e-5, atol=1e-6)


def test_kernel_buffer_limit(monkeypatch):
  monkeypatch.setenv("RULEC_MAX_KERNEL_BUFFERS", "4")
  ts = [T(3) for _ in range(7)]
  s = ts[0]
  for t in ts[1:]: s = s * 2 + t
  ks = kernels(s)
  assert len(ks) > 1 and all(len(k.bufs) <= 4 for k in ks)
  want = ts[0].numpy()
  for t in ts[1:]: want = want * 2 + t.numpy()
  np.testing.assert_allclose(s.numpy(), want, rtol=1e-5)


@pytest.mark.parametrize("parts, want", [(256, 8), (4096, 16)])
def test_a_device_of_thousands_of_parts_splits_a_sum_over_several_axes_by_its_whole_size(monkeypatch, parts, want):
  """A per-channel sum over N x H x W (a batchnorm's, a convolution's weight gradient): a CPU splits the batch of 64
  into 8 parts (its own root), a GPU into 16 (the root of the whole sum bounds it, and each part keeps 4096 of its
  65536 steps)."""
  from rulec.engine.sched import cache, early
  for m in (early, cache): monkeypatch.setattr(m, "split_parts", lambda device: parts)
  x = np.random.default_rng(7).standard_normal((64, 16, 32, 32)).astype(np.float32)
  t = Tensor(x).sum((0, 2, 3))
  first, second = t.schedule()
  assert [r.src[0].arg for r in first.ranges][:2] == [want, 16] and [r.src[0].arg for r in second.ranges] == [16, want]
  np.testing.assert_allclose(t.numpy(), x.astype(np.float64).sum((0, 2, 3)), rtol=1e-5, atol=1e-3)


def test_scheduling_facts_ask_the_cl_device_the_name_says(monkeypatch):
  # "CL:1" may be another kind of device than "CL" (a GPU beside PoCL): a row's values, one-pass reductions and
  # split sizes follow its own limits
  import types

  pytest.importorskip("pyopencl")
  from rulec.runtime import cl_device, devices
  fake = {0: types.SimpleNamespace(target=types.SimpleNamespace(group=0, grid=0, tile=0), split_parts=256),
          1: types.SimpleNamespace(target=types.SimpleNamespace(group=256, grid=64, tile=256), split_parts=4096)}
  monkeypatch.setattr(cl_device, "get_device", lambda n=0: fake[n])
  assert not devices.rows_shared("CL") and devices.rows_shared("CL:1")
  assert devices.one_pass_groups("CL") == 0 and devices.one_pass_groups("CL:1") == 64
  assert devices.split_parts("CL") == 256 and devices.split_parts("cl:1") == 4096
  assert not devices.tiles_sums("CL") and devices.tiles_sums("CL:1") and not devices.tiles_sums("CPU")
  assert not devices.rows_shared("CPU") and devices.split_parts("CPU:1") == 256
