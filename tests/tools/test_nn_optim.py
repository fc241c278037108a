"""rulec.nn.optim: every optimizer's update against a hand-written numpy update over several steps (the
references agree with tinygrad 0.14 to float32 rounding: checked when they were written), one realize per step,
and a 2-layer MLP trained with SGD against the same model computed by hand in numpy."""
import numpy as np
import pytest

import rulec.engine.realize
from rulec import Tensor, nn
from rulec.nn.optim import LAMB, LARS, SGD, Adam, AdamW, OptimizerGroup

RNG = np.random.default_rng(1)
W0 = [RNG.standard_normal((3, 4)).astype(np.float32), RNG.standard_normal(4).astype(np.float32)]
A = [RNG.standard_normal((3, 4)).astype(np.float32), RNG.standard_normal(4).astype(np.float32)]
B = [np.abs(RNG.standard_normal((3, 4))).astype(np.float32), np.abs(RNG.standard_normal(4)).astype(np.float32)]
STEPS = 4


def grad_fn(ws):
  """The gradient of the test loss sum(a * w) + sum(b * w^2)."""
  return [a + 2 * b * w for w, a, b in zip(ws, A, B)]


def sgd_ref(lr, momentum=0.0, wd=0.0, nesterov=False, classic=False):
  ws, buf, hist = [w.astype(np.float64) for w in W0], [np.zeros(w.shape) for w in W0], []
  for _ in range(STEPS):
    for i, (w, g) in enumerate(zip(ws, grad_fn(ws))):
      g = g + wd * w
      if classic: g = g * lr
      if momentum:
        buf[i] = momentum * buf[i] + g
        g = g + momentum * buf[i] if nesterov else buf[i]
      ws[i] = w - (g if classic else g * lr)
    hist.append([w.copy() for w in ws])
  return hist


def lamb_ref(lr, b1=0.9, b2=0.999, eps=1e-6, wd=0.0, adam=False):
  ws, hist = [w.astype(np.float64) for w in W0], []
  m, v = [np.zeros(w.shape) for w in W0], [np.zeros(w.shape) for w in W0]
  for t in range(1, STEPS + 1):
    for i, (w, g) in enumerate(zip(ws, grad_fn(ws))):
      m[i], v[i] = b1 * m[i] + (1 - b1) * g, b2 * v[i] + (1 - b2) * g * g
      up = (m[i] / (1 - b1 ** t)) / (np.sqrt(v[i] / (1 - b2 ** t)) + eps) + wd * w
      r1, r2 = np.sqrt((w * w).sum()), np.sqrt((up * up).sum())
      r = 1.0 if adam or r1 == 0 or r2 == 0 else r1 / r2
      ws[i] = w - lr * r * up
    hist.append([w.copy() for w in ws])
  return hist


def run(make):
  ws = [Tensor(w.copy()) for w in W0]
  opt, hist = make(ws), []
  with Tensor.train():
    for _ in range(STEPS):
      opt.zero_grad()
      loss = sum(((w * Tensor(a)).sum() + (w * w * Tensor(b)).sum()) for w, a, b in zip(ws, A, B))
      loss.backward()
      opt.step()
      hist.append([w.numpy() for w in ws])
  return hist


CASES = {
  "sgd": (lambda p: SGD(p, lr=0.1), lambda: sgd_ref(0.1)),
  "sgd_wd": (lambda p: SGD(p, lr=0.1, weight_decay=0.2), lambda: sgd_ref(0.1, wd=0.2)),
  "sgd_momentum": (lambda p: SGD(p, lr=0.05, momentum=0.9), lambda: sgd_ref(0.05, 0.9)),
  "sgd_nesterov_wd": (lambda p: SGD(p, lr=0.05, momentum=0.9, weight_decay=0.1, nesterov=True),
                      lambda: sgd_ref(0.05, 0.9, 0.1, True)),
  "sgd_classic": (lambda p: SGD(p, lr=0.05, momentum=0.8, classic=True), lambda: sgd_ref(0.05, 0.8, classic=True)),
  "sgd_fused": (lambda p: SGD(p, lr=0.05, momentum=0.9, fused=True), lambda: sgd_ref(0.05, 0.9)),
  "adam": (lambda p: Adam(p, lr=0.05), lambda: lamb_ref(0.05, eps=1e-8, adam=True)),
  "adam_betas": (lambda p: Adam(p, lr=0.02, b1=0.5, b2=0.9, eps=1e-4), lambda: lamb_ref(0.02, 0.5, 0.9, 1e-4, adam=True)),
  "adamw": (lambda p: AdamW(p, lr=0.05, weight_decay=0.1), lambda: lamb_ref(0.05, eps=1e-8, wd=0.1, adam=True)),
  "adamw_fused": (lambda p: AdamW(p, lr=0.05, fused=True), lambda: lamb_ref(0.05, eps=1e-8, wd=0.01, adam=True)),
  "lamb": (lambda p: LAMB(p, lr=0.05, weight_decay=0.01), lambda: lamb_ref(0.05, wd=0.01)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_update_matches_numpy(name):
  make, ref = CASES[name]
  for got_step, want_step in zip(run(make), ref()):
    for g, w in zip(got_step, want_step):
      # relative to the parameter's scale (float32 state: Adam's sqrt(v) + eps amplifies rounding a little)
      np.testing.assert_allclose(g, w, rtol=0, atol=5e-6 * np.abs(w).max())


def test_fused_lamb_uses_one_trust_ratio():
  got = run(lambda p: LAMB(p, lr=0.05, fused=True))[0]
  w, g = np.concatenate([x.ravel() for x in W0]).astype(np.float64), np.concatenate([x.ravel() for x in grad_fn(W0)])
  up = (0.1 * g / 0.1) / (np.sqrt(0.001 * g * g / 0.001) + 1e-6)
  want = w - 0.05 * np.sqrt((w * w).sum()) / np.sqrt((up * up).sum()) * up
  np.testing.assert_allclose(np.concatenate([x.ravel() for x in got]), want, rtol=1e-5, atol=1e-6)


def test_signatures_and_defaults_are_tinygrad():
  p = [Tensor.zeros(2)]
  o = SGD(p)
  assert (o.momentum, o.wd, o.nesterov, o.classic, o.tcoef) == (0.0, 0.0, False, False, 0.0)
  np.testing.assert_allclose(o.lr.numpy(), [0.001])
  a = Adam(p)
  assert (a.b1, a.b2, a.eps, a.wd, a.adam) == (0.9, 0.999, 1e-8, 0.0, True)
  assert AdamW(p).wd == 0.01 and LAMB(p).eps == 1e-6 and LAMB(p).adam is False
  assert isinstance(LARS(p), LARS) and LARS(p).classic is True
  assert p[0].requires_grad is True   # requires_grad None becomes True


def test_one_realize_per_step(monkeypatch):
  ws = [Tensor(w.copy()) for w in W0]
  opt = Adam(ws, lr=0.1)
  with Tensor.train():
    (ws[0].sum() + ws[1].square().sum()).backward()
    calls = []
    real = rulec.engine.realize.realize_map
    monkeypatch.setattr(rulec.engine.realize, "realize_map", lambda *a, **k: calls.append(1) or real(*a, **k))
    opt.step()
  assert len(calls) == 1
  np.testing.assert_allclose(ws[0].numpy(), W0[0] - 0.1, rtol=1e-5)   # Adam's first step: lr * sign(g)


def test_buffers_are_realized_not_updated():
  w = Tensor([1.0, 2.0])
  stat = Tensor.zeros(2).requires_grad_(False)
  opt = SGD([w, stat], lr=0.5)
  assert opt.params == [w] and opt.buffers == [stat]
  with Tensor.train():
    (w * w).sum().backward()
    stat.assign(stat + w)   # a pending write (like BatchNorm's running mean): carried out by the step
    opt.step()
  np.testing.assert_allclose(w.numpy(), [0.0, 0.0])
  np.testing.assert_allclose(stat.numpy(), [1.0, 2.0])


def test_optimizer_group():
  a, b = Tensor([1.0, -1.0]), Tensor([3.0])
  g = OptimizerGroup(SGD([a], lr=0.1), Adam([b], lr=0.5))
  assert g[1].params == [b] and len(g.params) == 2
  with Tensor.train():
    g.zero_grad()
    (a.sum() + b.sum() * 2).backward()
    g.step()
  np.testing.assert_allclose(a.numpy(), [0.9, -1.1], rtol=1e-6)
  np.testing.assert_allclose(b.numpy(), [2.5], rtol=1e-5)
  g.zero_grad()
  assert a.grad is None and b.grad is None


def test_errors():
  w = Tensor([1.0])
  with pytest.raises(ValueError, match="learning rate"): SGD([w], lr=-1)
  with pytest.raises(ValueError, match="momentum"): SGD([w], momentum=-0.1)
  with pytest.raises(ValueError, match="weight_decay"): AdamW([w], weight_decay=-1)
  with pytest.raises(ValueError, match="at least one param"): SGD([Tensor([1.0]).requires_grad_(False)])
  with pytest.raises(TypeError, match=r"params\[1\]"): SGD([w, 3.0])
  opt = SGD([w, Tensor([2.0])])
  with Tensor.train():
    (w * 2).sum().backward()
    with pytest.raises(RuntimeError, match=r"parameter 1 \(shape \(1,\)\) has no gradient"): opt.step()
  w.grad = None
  (w * 2).sum().backward()
  with pytest.raises(RuntimeError, match="training"): SGD([w]).step()


def test_mlp_trains_like_numpy():
  """A 2-layer MLP (Linear, relu, Linear, softmax cross entropy) for 5 SGD steps with momentum and weight
  decay: losses and final weights equal the same model's forward and backward written out in numpy."""
  rng = np.random.default_rng(7)
  x, y = rng.standard_normal((16, 5)).astype(np.float32), rng.integers(0, 3, 16)
  l1, l2 = nn.Linear(5, 8), nn.Linear(8, 3)
  model = [l1, l2]
  params = nn.state.get_parameters(model)
  w1, b1, w2, b2 = [p.numpy().astype(np.float64) for p in params]
  opt = SGD(params, lr=0.2, momentum=0.9, weight_decay=1e-3)
  bufs = [np.zeros_like(p) for p in (w1, b1, w2, b2)]
  losses, want = [], []
  with Tensor.train():
    for _ in range(5):
      opt.zero_grad()
      loss = l2(l1(Tensor(x)).relu()).sparse_categorical_crossentropy(Tensor(y)).backward()
      losses.append(loss.realize(*opt.schedule_step()).item())
      # numpy: forward, backward, the same SGD update
      h = x @ w1.T + b1
      a = np.maximum(h, 0)
      z = a @ w2.T + b2
      e = np.exp(z - z.max(1, keepdims=True))
      p = e / e.sum(1, keepdims=True)
      want.append(-np.log(p[np.arange(16), y]).mean())
      dz = (p - np.eye(3)[y]) / 16
      da = dz @ w2
      dh = da * (h > 0)
      grads = [dh.T @ x, dh.sum(0), dz.T @ a, dz.sum(0)]
      new = []
      for i, (w, g) in enumerate(zip((w1, b1, w2, b2), grads)):
        bufs[i] = 0.9 * bufs[i] + g + 1e-3 * w
        new.append(w - 0.2 * bufs[i])
      w1, b1, w2, b2 = new
  np.testing.assert_allclose(losses, want, rtol=1e-5)
  assert losses[-1] < losses[0]
  for t, w in zip(params, (w1, b1, w2, b2)): np.testing.assert_allclose(t.numpy(), w, rtol=1e-4, atol=1e-5)


def ns_ref(g, steps, params, eps=1e-7):
  """Newton-Schulz orthogonalisation as documented by Tensor.newton_schulz (a tall matrix as its transpose)."""
  if g.shape[0] > g.shape[1]: return ns_ref(g.T, steps, params, eps).T
  G = g / (np.sqrt((g * g).sum()) + eps)
  for _ in range(steps):
    gram, term, acc = G @ G.T, G, 0
    for i, p in enumerate(params):
      if i: term = gram @ term
      acc = acc + p * term
    G = acc
  return G


def test_muon_matches_numpy():
  from rulec.nn.optim import Muon
  w = Tensor(W0[0].copy())
  opt = Muon([w], lr=0.02, weight_decay=0.1)
  ws, b = W0[0].astype(np.float64), np.zeros((3, 4))
  with Tensor.train():
    for _ in range(3):
      opt.zero_grad()
      ((w * Tensor(A[0])).sum() + (w * w * Tensor(B[0])).sum()).backward()
      opt.step()
      g = A[0] + 2 * B[0] * ws
      b = 0.95 * b + g
      ws = ws - (0.02 * ns_ref(g + 0.95 * b, 5, (3.4445, -4.775, 2.0315)) + 0.1 * 0.02 * ws)
  np.testing.assert_allclose(w.numpy(), ws, rtol=1e-4, atol=1e-5)
  with pytest.raises(ValueError, match="fused"): Muon([w], fused=True)


def test_batchnorm_running_stats_ride_with_the_step():
  """BatchNorm's running statistics are assigned lazily in the forward pass and carried out by the optimizer's
  realize (get_parameters lists them, as buffers)."""
  lin, bn = nn.Linear(3, 2), nn.BatchNorm(2, momentum=0.5)
  x = RNG.standard_normal((6, 3)).astype(np.float32)
  h = x @ lin.weight.numpy().T + lin.bias.numpy()
  opt = SGD(nn.state.get_parameters([lin, bn]), lr=0.1)
  assert len(opt.params) == 4 and len(opt.buffers) == 3
  with Tensor.train():
    opt.zero_grad()
    bn(lin(Tensor(x))).square().sum().backward()
    opt.step()
  np.testing.assert_allclose(bn.running_mean.numpy(), 0.5 * h.mean(0), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(bn.running_var.numpy(), 0.5 + 0.5 * h.var(0, ddof=1), rtol=1e-5)
  assert bn.num_batches_tracked.item() == 1


@pytest.mark.parametrize("name", ["sgd_momentum", "adam", "adamw"])
def test_a_step_with_its_gradient_updates_parameters_in_place(name):
  # the step realizes the gradient (which reads the parameters) with the writes: each parameter is written by one
  # kernel reading it raw, neither copied first (a snapshot) nor computed into a buffer and copied back
  make, ref = CASES[name]
  ws = [Tensor(w.copy()) for w in W0]
  opt = make(ws)
  seen = []
  with Tensor.train():
    for _ in range(STEPS):
      opt.zero_grad()
      loss = sum(((w * Tensor(a)).sum() + (w * w * Tensor(b)).sum()) for w, a, b in zip(ws, A, B))
      loss.backward()
      seen.clear()
      rulec.engine.realize.RUN_HOOKS.append(lambda k, dt: seen.append(k))
      try: opt.step()
      finally: rulec.engine.realize.RUN_HOOKS.pop()
  params = {w.uop.base for w in ws}
  for k in seen:
    inputs = {k.bufs[i] for i in k.inputs}
    written = {k.bufs[i] for i in k.outputs}
    assert not (inputs <= params and len(inputs) == 1 and not written & params), f"a copy of a parameter: {k}"
    assert not (written <= params and len(k.bufs) == 2), f"a parameter copied back from a buffer: {k}"
  for got, want in zip([w.numpy() for w in ws], ref()[-1]): np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("jit", [False, True])
def test_the_second_step_finds_its_schedule(jit):
  """The optimizer realizes lazy parameters and makes its state buffers when it is built, so the first step's graph
  is every step's: the second step (TinyJit's capture) schedules nothing anew, a cache hit for each realize."""
  from rulec import TinyJit
  from rulec.engine.sched import cache as schedule_cache
  Tensor.manual_seed(3)
  layers = [nn.Linear(12, 16), nn.Linear(16, 3)]
  opt = Adam(nn.state.get_parameters(layers), lr=1e-2)
  assert all(p.uop.base.op.name == "BUFFER" for p in opt.params + opt.m + opt.v + [opt.b1_t, opt.b2_t])
  assert all(np.array_equal(m.numpy(), np.zeros(m.shape)) for m in opt.m + opt.v) and opt.b1_t.numpy() == 1.0

  def step(x, y):
    with Tensor.train():
      opt.zero_grad()
      loss = layers[1](layers[0](x).relu()).sparse_categorical_crossentropy(y)
      loss.backward()
      opt.step()
      return loss
  run = TinyJit(step) if jit else step
  rng = np.random.default_rng(0)
  misses = []
  schedule_cache.clear()
  for _ in range(3):
    x, y = Tensor(rng.standard_normal((8, 12), dtype=np.float32)), Tensor(rng.integers(0, 3, 8))
    before = schedule_cache.STATS["misses"]
    assert np.isfinite(run(x, y).numpy())
    misses.append(schedule_cache.STATS["misses"] - before)
  assert misses[0] > 0 and misses[1] == 0 and misses[2] == 0
