"""Several devices (docs/multi.md): indexed devices, sharded tensors, rules/multi.rules, allreduce.

Every sharded program is checked against the same program on one device (numpy values), and every kernel it
schedules either runs on one device's buffers or is a transfer between two. The devices are `KIND:0 .. KIND:3`
for the default device's kind (CPU, or NUMPY under RULEC_DEVICE=NUMPY), and CL:0 / CL:1 on PoCL, which shows
two devices with POCL_DEVICES="pthread pthread" (tests/conftest.py sets it).
RULEC_MULTI_EXAMPLES scales the property test's example count.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rulec.engine.ir.ops import Ops
from rulec.engine.sched import cache as schedule_cache
from rulec.engine.tensor.args import DeviceError, ShapeError
from rulec import Tensor, nn
from rulec.nn import optim
from rulec.nn.state import get_parameters
from rulec.runtime import devices as rt_devices
from rulec.runtime.buffer import buffer_of

# (under RULEC_DEVICE=CL the host devices carry the main set: PoCL shows two CL devices, not four)
KIND = {"CL": "CPU"}.get(k := rt_devices.device_kind(rt_devices.default_device()), k)
D2 = tuple(f"{KIND}:{i}" for i in range(2))
D4 = tuple(f"{KIND}:{i}" for i in range(4))
EXAMPLES = max(1, int(float(os.environ.get("RULEC_MULTI_EXAMPLES", "1") or 1) * 12))
RNG = np.random.default_rng(0)


def rand(*shape) -> np.ndarray: return RNG.standard_normal(shape).astype(np.float32)


def canon(devices): return tuple(rt_devices.canonical_device(d) for d in devices)


def transfers(kernels) -> int:
  return sum(1 for k in kernels if (p := rt_devices.copy_buffers(k)) is not None
             and rt_devices.separate_memory(p[0].arg[1], p[1].arg[1]))


def each_on_its_device(kernels) -> None:
  """Every kernel is a transfer between two devices, or reads and writes buffers of one device only."""
  for k in kernels:
    if rt_devices.copy_buffers(k) is None: assert len({b.arg[1] for b in k.bufs}) == 1, k.render()


def same(got: np.ndarray, want: np.ndarray, tol: float = 1e-5) -> None:
  assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape, got.dtype, want.dtype)
  np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def sharded(x: np.ndarray, devices, axis):
  t = Tensor(x, device=devices[0])
  return t.shard(devices, axis=axis if axis is None or (axis < x.ndim and x.shape[axis] % len(devices) == 0) else None)


# *** devices with an index ***

def test_device_names_and_separate_buffers():
  assert Tensor([1.0], device=f"{KIND.lower()}:1").device == f"{KIND}:1"
  assert Tensor([1.0], device=f"{KIND}:0").device == KIND    # X:0 is X, as in tinygrad
  for bad in (f"{KIND}:x", f"{KIND}:-1", "GPU:1", f"{KIND}:1:2"):
    with pytest.raises(ValueError, match="unknown device"): Tensor([1.0], device=bad)
  a = Tensor(np.arange(6, dtype=np.float32), device=D2[0])
  b = a.to(D2[1])
  ks = b.schedule()
  assert transfers(ks) == 1 and b.device == canon(D2)[1]   # the copy is in the schedule
  before = dict(rt_devices.COPIES)
  b.realize()
  assert rt_devices.COPIES["copies"] == before["copies"] + 1 and rt_devices.COPIES["bytes"] == before["bytes"] + 24
  buf = b.uop.base
  assert buf.op is Ops.BUFFER and buf.arg[1] == canon(D2)[1] and buffer_of(buf) is not buffer_of(a.uop.base)
  same((b + 1).numpy(), np.arange(6, dtype=np.float32) + 1)
  c = (a * 2).to(D2[1]) + b   # computed on D2[0], then moved
  each_on_its_device(c.schedule())
  same(c.numpy(), np.arange(6, dtype=np.float32) * 3)


def test_shard_layout_and_gather():
  x = rand(4, 6)
  for axis, part in ((0, (2, 6)), (1, (4, 3)), (-1, (4, 3)), (None, (4, 6))):
    t = Tensor(x).shard(D2, axis=axis).realize()
    assert t.device == canon(D2) and t.shape == (4, 6) and t.uop.op is Ops.MSTACK
    assert [p.base.arg[1] for p in t.uop.src] == list(canon(D2)) and all(p.shape == part for p in t.uop.src)
    same(t.numpy(), x)
    same(t.to(D2[1]).numpy(), x)
    assert not t.schedule()   # realized: nothing left to compute
  r = Tensor(x).to(D2)   # a device set: replicated
  assert r.device == canon(D2) and r.uop.arg[0] is None
  same(Tensor(x, device=D2).numpy(), x)
  assert Tensor(x).shard([D2[0]]).device == canon(D2)[0]   # one device: that device


def test_a_gathered_value_keeps_the_sign_of_zero():
  # a sharded value gathered onto one device (an elementwise op with another axis's shards, a copy to one device):
  # the parts were padded with +0.0 and added, so a -0.0 came back +0.0 (rulec prove refuted the gathering rules)
  x = np.array([[-0.0, 1.0, -0.0, 4.0], [2.0, -0.0, -3.0, -0.0]], np.float32)
  t = Tensor(x).shard(D2, axis=0).realize()
  for got in (t.to(D2[1]).numpy(), (t + Tensor(np.full((2, 4), -0.0, np.float32)).shard(D2, axis=1)).numpy()):
    assert np.array_equal(np.signbit(got), np.signbit(x)) and np.array_equal(got, x)


def test_errors_are_tinygrads():
  x = Tensor(rand(5, 4))
  with pytest.raises(RuntimeError, match="uneven"): x.shard(D2, axis=0)
  with pytest.raises(ShapeError): Tensor(rand(4, 6)).shard(D4, axis=1)
  with pytest.raises(IndexError): x.shard(D2, axis=2)
  s = Tensor(rand(4, 4)).shard(D2, axis=0)
  with pytest.raises(RuntimeError, match="multi-device"): s.shard(D2, axis=1)
  with pytest.raises(RuntimeError, match="different devices"): s + Tensor(rand(4, 4)).shard(D4[2:], axis=0)
  with pytest.raises(DeviceError, match="different devices"): s + Tensor(rand(4, 4))
  with pytest.raises(RuntimeError, match="different devices"): s @ Tensor(rand(4, 4))
  with pytest.raises(TypeError): x.shard(D2[0])
  with pytest.raises(ValueError): x.shard(())
  with pytest.raises(DeviceError, match="setitem"): s[0] = 1.0


# *** every op, sharded, against the program on one device ***

X, Y, V, W, B = rand(4, 8), rand(4, 8), rand(8), rand(8, 4), rand(2, 4, 8)
IMG, KW, IDX = rand(4, 2, 6, 6), rand(3, 2, 3, 3), RNG.integers(0, 8, (4, 3)).astype(np.int32)
OPS = {   # name -> (program, inputs)
  "add": (lambda a, b: a + b, (X, Y)),
  "broadcast_row": (lambda a, v: a * v - 1, (X, V)),
  "broadcast_col": (lambda a, b: a / (b[:, :1].abs() + 1), (X, Y)),
  "scalar": (lambda a: (a * 2 + 1).maximum(0.5), (X,)),
  "where": (lambda a, b: (a > b).where(a, b * 3), (X, Y)),
  "cast": (lambda a: (a * 4).cast("int32") + 1, (X,)),
  "sum_all": (lambda a: a.sum(), (X,)),
  "sum_0": (lambda a: a.sum(0), (X,)),
  "sum_1_keepdim": (lambda a: a.sum(1, keepdim=True), (X,)),
  "max_0": (lambda a: a.max(0), (X,)),
  "mean_var": (lambda a: a.var(1) + a.mean(0).sum(), (X,)),
  "argmax": (lambda a: a.argmax(1), (X,)),
  "softmax": (lambda a: a.softmax(1), (X,)),
  "softmax_0": (lambda a: a.log_softmax(0), (X,)),
  "layernorm": (lambda a: a.layernorm(), (X,)),
  "cumsum": (lambda a: a.cumsum(0), (X,)),
  "permute": (lambda a: a.permute(2, 0, 1) + 1, (B,)),
  "reshape": (lambda a: a.reshape(8, 8) * 2, (B,)),
  "reshape_mixing": (lambda a: a.reshape(16, 2), (X,)),
  "expand": (lambda a: a.reshape(4, 1, 8).expand(4, 3, 8) + 0, (X,)),
  "pad": (lambda a: a.pad(((1, 1), (0, 2))), (X,)),
  "flip": (lambda a: a.flip(0) + a.flip(1), (X,)),
  "shrink": (lambda a: a.shrink(((1, 3), (2, 6))), (X,)),
  "getitem_one_part": (lambda a: a[1], (X,)),
  "getitem": (lambda a: a[1:3, ::2] + a[-1, ::2], (X,)),
  "getitem_tensor": (lambda a: a[Tensor([2, 0, 3], device=a.device)], (X,)),
  "cat_0": (lambda a, b: a.cat(b, dim=0), (X, Y)),
  "cat_1": (lambda a, b: Tensor.cat(a, b, a, dim=1), (X, Y)),
  "stack": (lambda a, b: Tensor.stack(a, b, dim=1), (X, Y)),
  "matmul": (lambda a, w: a @ w, (X, W)),
  "matmul_t": (lambda a, b: a @ b.T, (X, Y)),
  "batched_matmul": (lambda b, w: (b @ w).relu().sum(2), (B, W)),
  "conv2d_pool": (lambda a, w: a.conv2d(w, padding=1).relu().max_pool2d(2), (IMG, KW)),
  "gather_scatter": (lambda a, i: a.gather(1, i).sum() + a.scatter(1, i, 1.0), (X, IDX)),
  "einsum": (lambda a, b: Tensor.einsum("ij,kj->ik", a, b), (X, Y)),
}
AXES = [(0, 0), (1, 1), (0, None), (None, 0), (None, None), (1, 0), (0, 1)]


@pytest.mark.parametrize("name", sorted(OPS))
def test_sharded_op_matches_one_device(name):
  fn, inputs = OPS[name]
  want = fn(*[Tensor(x) for x in inputs]).numpy()
  for axes in AXES[:3] if len(inputs) == 1 else AXES:
    got = fn(*[sharded(x, D2, ax) for x, ax in zip(inputs, axes)])
    assert got.device == canon(D2)
    each_on_its_device(got.schedule())
    same(got.numpy(), want)


@pytest.mark.parametrize("name", ["add", "sum_0", "softmax", "matmul", "getitem", "cat_0"])
def test_sharded_op_on_four_devices(name):
  fn, inputs = OPS[name]
  want = fn(*[Tensor(x) for x in inputs]).numpy()
  for axes in ((0, 0), (1, None), (None, 1)):
    same(fn(*[sharded(x, D4, ax) for x, ax in zip(inputs, axes)]).numpy(), want)


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(st.sampled_from([D2, D4]), st.integers(0, 2), st.lists(st.sampled_from([1, 2, 3]), min_size=3, max_size=3),
       st.sampled_from(["sum", "max", "mean"]), st.integers(0, 2), st.integers(0, 2 ** 16))
def test_random_elementwise_and_reduce(devices, axis, dims, reduce, raxis, seed):
  shape = tuple(d * (len(devices) if i == axis else 1) for i, d in enumerate(dims))
  r = np.random.default_rng(seed)
  x, y = r.standard_normal(shape).astype(np.float32), r.standard_normal(shape[1:]).astype(np.float32)
  prog = lambda a, b: getattr((a * b).exp() - a, reduce)(raxis) + 1
  want = prog(Tensor(x), Tensor(y)).numpy()
  same(prog(Tensor(x).shard(devices, axis=axis), Tensor(y).shard(devices)).numpy(), want)


# *** what runs where ***

def test_kernels_run_per_device():
  a, b = Tensor(rand(4, 8)).shard(D2, axis=0).realize(), Tensor(rand(4, 8)).shard(D2, axis=0).realize()
  ks = ((a + b) * 2).schedule()
  assert len(ks) == 2 and transfers(ks) == 0
  assert sorted(k.bufs[0].arg[1] for k in ks) == sorted(canon(D2))
  for k in ks: assert {b.arg[1] for b in k.bufs} == {k.bufs[0].arg[1]}   # each reads its own device's buffers
  # a reduce over the shard axis ends in an allreduce: copies between the devices, and per device a sum
  ks = (a + b).sum(0).schedule()
  assert transfers(ks) == 2
  for k in ks:
    if rt_devices.copy_buffers(k) is None: assert {b.arg[1] for b in k.bufs} == {k.bufs[0].arg[1]}


@pytest.mark.parametrize("devices", [D2, D4])
@pytest.mark.parametrize("ring", ["0", "2"])
@pytest.mark.parametrize("op", ["sum", "max"])
def test_allreduce_forms(devices, ring, op, monkeypatch):
  """naive: n (n - 1) copies of the whole value; ring (RULEC_RING=2 forces it): 2 n (n - 1) copies of 1/n each.
  (A float max is two reduces, the max and whether a NaN is there: two allreduces.)"""
  monkeypatch.setenv("RULEC_RING", ring)
  schedule_cache.clear()   # (the ring setting is not part of the cache key)
  n = len(devices)
  x = rand(n * 3, 40)
  t = Tensor(x).shard(devices, axis=0).realize()
  r = getattr(t, op)(0)
  assert transfers(r.schedule()) == n * (n - 1) * (2 if ring == "2" else 1) * (2 if op == "max" else 1)
  same(r.numpy(), getattr(x, op)(0))
  assert r.uop.arg[0] is None and all(np.array_equal(p, r.numpy()) for p in [np.asarray(Tensor(u).numpy()) for u in r.uop.src])
  schedule_cache.clear()


def test_allreduce_is_chosen_by_size_and_device_count(monkeypatch):
  monkeypatch.delenv("RULEC_RING", raising=False)
  monkeypatch.setenv("RULEC_RING_THRESHOLD", "100")
  schedule_cache.clear()
  big, small = rand(8, 200), rand(8, 20)
  for devices, x, want in ((D4, big, 2), (D4, small, 1), (D2, big, 1)):
    n = len(devices)
    ks = Tensor(x).shard(devices, axis=0).realize().sum(0).schedule()
    assert transfers(ks) == want * n * (n - 1), (devices, x.shape)
  schedule_cache.clear()


# *** bigger programs ***

@pytest.mark.parametrize("axes", [(0, None), (None, 1), (1, 0)])
def test_sharded_matmul(axes):
  """rows of x, columns of w, or the shared axis of both (then the sum over it is an allreduce)."""
  x, w = rand(8, 16), rand(16, 12)
  got = Tensor(x).shard(D4, axis=axes[0]) @ Tensor(w).shard(D4, axis=axes[1])
  same(got.numpy(), (Tensor(x) @ Tensor(w)).numpy(), 1e-4)


def test_attention_block():
  bsz, seq, dim = 4, 6, 8
  x = rand(bsz, seq, dim)
  wq, wk, wv, wo = (rand(dim, dim) / 3 for _ in range(4))
  def block(x, wq, wk, wv, wo):
    q, k, v = x @ wq, x @ wk, x @ wv
    att = (q @ k.transpose(1, 2) / dim ** 0.5).softmax(-1)
    return ((att @ v) @ wo + x).layernorm()
  want = block(*[Tensor(a) for a in (x, wq, wk, wv, wo)]).numpy()
  ws = [Tensor(a).shard(D2) for a in (wq, wk, wv, wo)]
  same(block(Tensor(x).shard(D2, axis=0), *ws).numpy(), want, 1e-4)   # data parallel: the batch split
  ws = [Tensor(wq).shard(D2, axis=1), Tensor(wk).shard(D2, axis=1), Tensor(wv).shard(D2, axis=1), Tensor(wo).shard(D2, axis=0)]
  same(block(Tensor(x).shard(D2), *ws).numpy(), want, 1e-4)           # model parallel: the features split


class _MLP:
  def __init__(self): self.l1, self.l2 = nn.Linear(8, 16), nn.Linear(16, 4)
  def __call__(self, x): return self.l2(self.l1(x).relu())


def _train(devices, opt_name: str, steps: int = 2):
  Tensor._rng = np.random.default_rng(1)
  model = _MLP()
  if devices:
    for p in get_parameters(model): p.shard_(devices)   # weights replicated
  opt = {"sgd": lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9), "adam": lambda ps: optim.Adam(ps, lr=0.01)}[opt_name](
    get_parameters(model))
  r = np.random.default_rng(2)
  for _ in range(steps):
    x, y = Tensor(r.standard_normal((8, 8)).astype(np.float32)), Tensor(r.integers(0, 4, 8).astype(np.int32))
    if devices: x, y = x.shard(devices, axis=0), y.shard(devices, axis=0)   # the batch split
    with Tensor.train():
      opt.zero_grad()
      loss = model(x).sparse_categorical_crossentropy(y)
      loss.backward()
      opt.step()
  return [p.numpy() for p in get_parameters(model)], loss.numpy()


@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
def test_data_parallel_step_gives_the_single_device_weights(opt_name):
  want, want_loss = _train(None, opt_name)
  got, loss = _train(D2, opt_name)
  same(loss, want_loss)
  for g, w in zip(got, want): same(g, w)


def test_gradient_through_shard():
  x, w = rand(4, 6), rand(6, 3)
  for axis in (0, 1, None):
    xt, wt = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
    (xt.shard(D2, axis=axis) @ wt.shard(D2)).tanh().sum().backward()
    xr, wr = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
    (xr @ wr).tanh().sum().backward()
    same(xt.grad.numpy(), xr.grad.numpy())
    same(wt.grad.numpy(), wr.grad.numpy())
    assert xt.grad.device == xt.device


def test_gradient_across_devices():
  x = Tensor(rand(4, 4), requires_grad=True, device=D2[0])
  ((x * 2).to(D2[1]).exp() * x.to(D2[1])).sum().backward()   # the gradient is computed on D2[1], copied back
  each_on_its_device(x.grad.schedule())
  xr = Tensor(x.numpy(), requires_grad=True)
  ((xr * 2).exp() * xr).sum().backward()
  assert x.grad.device == canon(D2)[0]
  same(x.grad.numpy(), xr.grad.numpy(), 1e-4)


def test_assign_into_sharded():
  src = rand(4, 4)
  orig = Tensor(src, device=D2[0])
  t = orig.shard(D2, axis=0).realize()
  bufs = [p.base for p in t.uop.src]
  new = rand(4, 4)
  t.assign(Tensor(new).shard(D2, axis=1)).realize()   # resharded on the way in
  assert [p.base for p in t.uop.src] == bufs
  same(t.numpy(), new)
  same(orig.numpy(), src)   # the parts are buffers of their own
  with pytest.raises(DeviceError, match="view"): t[1:].assign(Tensor(new[1:], device=D2))
  z = Tensor.zeros(4, 4, device=D2)
  z.assign(z + t).realize()
  same(z.numpy(), new)


# *** PoCL: two OpenCL devices ***

def _cl_devices() -> int:
  try:
    from rulec.runtime import cl_device
    return len(cl_device.all_devices())
  except (ImportError, RuntimeError): return 0


TWO_CL = pytest.mark.skipif(_cl_devices() < 2, reason='needs two OpenCL devices (PoCL: POCL_DEVICES="pthread pthread")')
CL2 = ("CL:0", "CL:1")


@TWO_CL
@pytest.mark.parametrize("name", ["add", "broadcast_row", "sum_0", "softmax", "reshape_mixing", "getitem", "cat_1"])
def test_sharded_op_on_two_cl_devices(name):
  fn, inputs = OPS[name]
  want = fn(*[Tensor(x) for x in inputs]).numpy()
  for axes in ((0, 0), (1, None)):
    got = fn(*[sharded(x, CL2, ax) for x, ax in zip(inputs, axes)])
    each_on_its_device(got.schedule())
    same(got.numpy(), want)


@TWO_CL
def test_two_cl_devices():
  from rulec.runtime import cl_device
  x, w = rand(8, 16), rand(16, 4)
  a, b = Tensor(x, device="CL").shard(CL2, axis=0), Tensor(w, device="CL").shard(CL2)
  r = (a @ b).relu()
  s = r.sum(0)
  same(r.numpy(), (Tensor(x) @ Tensor(w)).relu().numpy(), 1e-4)
  same(s.numpy(), (Tensor(x) @ Tensor(w)).relu().sum(0).numpy(), 1e-4)
  devs = {m.owner for p in r.uop.src for m in [buffer_of(p.base).mirror] if m is not None}
  assert devs == {cl_device.get_device(0), cl_device.get_device(1)} and len(devs) == 2   # one buffer on each device
