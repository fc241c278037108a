"""Optimizers with tinygrad 0.14's names, signatures and update formulas.

SGD is LARS with no trust ratio, Muon is LARS with Newton-Schulz orthogonalised momentum, Adam and AdamW are LAMB
with the trust ratio fixed at 1. `step()` builds every update lazily (each parameter and each piece of optimizer
state is written with assign) and carries them all out in one realize; `schedule_step()` returns those tensors
instead, so a training loop can realize them together with its loss: `loss.realize(*opt.schedule_step())`."""
from __future__ import annotations

import itertools
from typing import Iterable

from rulec.engine.ir.dtypes import dtypes
from rulec.engine.ir.ops import Ops
from rulec.engine.tensor import Tensor


def _dedup(ts: Iterable[Tensor]) -> list[Tensor]:
  """ts without repeats, by identity (a Tensor's == is elementwise, so `in` cannot be used)."""
  seen: set[int] = set()
  return [t for t in ts if not (id(t) in seen or seen.add(id(t)))]


def _zeros_state(shape: tuple, dtype, device) -> Tensor:
  """Optimizer state starting at zero, as a buffer (no kernel): a buffer nothing has written holds zeros on every
  device (runtime/buffer.py, Buffer.untouched). On a device set, the constant, as before."""
  if not isinstance(device, str): return Tensor.zeros(shape, dtype=dtype, device=device)
  return Tensor.empty(shape, dtype=dtype, device=device).requires_grad_(False)


def _ones_state(device) -> Tensor:
  """A (1,) float32 state tensor starting at one (b1^t, b2^t), as a buffer."""
  if not isinstance(device, str): return Tensor.ones((1,), dtype=dtypes.float32, device=device).requires_grad_(False)
  return Tensor([1.0], dtype=dtypes.float32, device=device).requires_grad_(False)


class Optimizer:
  """Optimizer(params, lr, device=None, fused=False): the base of every optimizer.

  params: the tensors to train. As in tinygrad 0.14, those with `is_param` (every tensor unless `is_param_(False)`)
  are trained, the others are buffers: step() realizes them, so their pending assigns run with the step (BatchNorm's
  running statistics), but does not update them. A tensor with requires_grad=False (rulec's and torch's way to
  keep a tensor out of autograd) is a buffer too; the trained ones with requires_grad None get True. lr is kept
  as a float32 tensor of shape (1,)
  (`opt.lr.assign(...)` changes it without rebuilding anything). fused: update all parameters as one
  concatenated vector (fewer, larger kernels)."""
  def __init__(self, params: list[Tensor], lr: float, device: str | None = None, fused: bool = False):
    if lr < 0: raise ValueError(f"Invalid learning rate: {lr}")
    params = list(params)
    for i, t in enumerate(params):
      if not isinstance(t, Tensor): raise TypeError(f"optimizer: params[{i}] is a {type(t).__name__}, not a Tensor")
    trained = [t.is_param and t.requires_grad is not False for t in params]
    self.params: list[Tensor] = _dedup(t for t, p in zip(params, trained) if p)
    if not self.params:
      raise ValueError("optimizer must have at least one param (a tensor with is_param True and requires_grad not False)")
    for t in self.params:
      if not t.dtype.is_float: raise TypeError(f"optimizer: a parameter of shape {t.shape} is {t.dtype.name}, not float")
    for t in self.params:
      if t.requires_grad is None: t.requires_grad = True
    self.buffers: list[Tensor] = _dedup(t for t, p in zip(params, trained) if not p)
    self.device = device or self.params[0].device
    self.param_dtype = dtypes.float32
    self.fused = fused
    self.lr = Tensor([lr], device=self.device, dtype=dtypes.float32)
    if fused: self.pos_params = list(itertools.accumulate((t.numel() for t in self.params), initial=0))
    # Parameters still lazy (a layer's random initialisation) are realized now, and the state is made of buffers
    # (_zeros_state): the first step's graph is then the graph of every later step, so the second step finds its
    # schedule in the cache (engine/sched/cache.py) instead of scheduling again; under TinyJit, the capture (call 2)
    # runs no rule pass either.
    # A trained parameter is a leaf: what it was initialised from (a history, engine/tensor/history.py) is
    # forgotten, or the first backward would compute the parameter again from it inside the step.
    lazy = [t for t in self.params + self.buffers if t.uop.base.op is not Ops.BUFFER and t.uop.op is not Ops.MSTACK]
    if lazy: Tensor.realize(*lazy)
    for t in self.params: t._forward = None

  def _new_optim_param(self) -> list[Tensor]:
    """Zero state: one float32 tensor per parameter, or one vector over all of them when fused."""
    shapes = [(self.pos_params[-1],)] if self.fused else [t.shape for t in self.params]
    return [_zeros_state(s, self.param_dtype, self.device) for s in shapes]

  def zero_grad(self) -> None:
    """Drop the parameters' gradients (the next backward() starts from nothing)."""
    for t in self.params: t.grad = None

  def step(self) -> None:
    """One optimisation step: every parameter and state update, carried out in one realize."""
    Tensor.realize(*self.schedule_step())

  def _grads(self) -> list[Tensor]:
    out = []
    for i, t in enumerate(self.params):
      if t.grad is None:
        raise RuntimeError(f"optimizer: parameter {i} (shape {t.shape}) has no gradient; call loss.backward() "
                           "before step(), and pass only parameters the loss depends on")
      out.append(t.grad)
    return out

  def schedule_step(self) -> list[Tensor]:
    """Build the step lazily (assigns into the parameters and the optimizer state) and return the tensors to
    realize to carry it out: the state, the parameters, the buffers. Needs training mode (Tensor.training)."""
    if not Tensor.training:
      raise RuntimeError("Tensor.training is False: the optimizer only steps in training mode; "
                         "run the step inside `with Tensor.train():` or set Tensor.training = True")
    grads = self._grads()
    if self.fused:
      flat, gflat = Tensor.cat(*[t.flatten() for t in self.params]), Tensor.cat(*[g.flatten() for g in grads])
      (out,), extra = self._step([flat], [gflat])
      p = self.pos_params
      updates = [out[p[i]:p[i + 1]].reshape(t.shape) for i, t in enumerate(self.params)]
    else: updates, extra = self._step(self.params, grads)
    for t, up in zip(self.params, updates): t.assign(self._apply_update(t, up))
    return extra + self.params + self.buffers

  def _step(self, params: list[Tensor], grads: list[Tensor]) -> tuple[list[Tensor], list[Tensor]]:
    """(the update to subtract from each parameter, the state tensors written) for one step."""
    raise NotImplementedError(f"{type(self).__name__} does not define _step")

  def _apply_update(self, t: Tensor, up: Tensor) -> Tensor: return t.detach() - up.to(t.device)


class OptimizerGroup(Optimizer):
  """OptimizerGroup(*optimizers): several optimizers stepped as one (one realize); `group[i]` is the i-th."""
  def __init__(self, *optimizers: Optimizer):   # (no Optimizer.__init__: the members hold the state)
    for o in optimizers:
      if not isinstance(o, Optimizer): raise TypeError(f"OptimizerGroup takes optimizers, got a {type(o).__name__}")
    self.optimizers = optimizers
    self.params = [t for o in optimizers for t in o.params]
    self.buffers = [t for o in optimizers for t in o.buffers]

  def __getitem__(self, i: int) -> Optimizer: return self.optimizers[i]

  def zero_grad(self) -> None:
    """zero_grad() of every member."""
    for o in self.optimizers: o.zero_grad()

  def schedule_step(self) -> list[Tensor]:
    """Every member's step, built lazily; the tensors to realize."""
    return [t for o in self.optimizers for t in o.schedule_step()]


class LARS(Optimizer):
  """LARS(params, lr=0.001, momentum=0.9, weight_decay=1e-4, ns_steps=0, ns_coefficients=None, nesterov=False,
  classic=True, pre_wd=True, tcoef=0.001, device=None, fused=False): SGD scaled per layer by the trust ratio
  tcoef * |w| / (|g| + wd * |w|) (1 where either norm is 0; tcoef=0 turns it off).

  pre_wd adds wd * w to the gradient first; classic momentum scales by lr before the momentum buffer
  (b = momentum * b + lr * g), the popular form after it; nesterov steps by g + momentum * b. With
  ns_coefficients the step is orthogonalised by Newton-Schulz (Muon), and without pre_wd the decay
  wd * lr * w is added after the momentum."""
  def __init__(self, params: list[Tensor], lr: float = 0.001, momentum: float = 0.9, weight_decay: float = 1e-4,
               ns_steps: int = 0, ns_coefficients: tuple | None = None, nesterov: bool = False, classic: bool = True,
               pre_wd: bool = True, tcoef: float = 0.001, device: str | None = None, fused: bool = False):
    if momentum < 0: raise ValueError(f"Invalid momentum value: {momentum}")
    if weight_decay < 0: raise ValueError(f"Invalid weight_decay value: {weight_decay}")
    super().__init__(params, lr, device, fused)
    self.momentum, self.wd, self.ns_steps, self.ns_coefficients = momentum, weight_decay, ns_steps, ns_coefficients
    self.nesterov, self.classic, self.pre_wd, self.tcoef = nesterov, classic, pre_wd, tcoef
    self.b = self._new_optim_param() if momentum else []

  def _trust(self, t: Tensor, g: Tensor) -> Tensor | float:
    if self.tcoef == 0: return 1.0
    r1, r2 = t.detach().square().sum().sqrt(), g.square().sum().sqrt()
    return (r1 > 0).where((r2 > 0).where(self.tcoef * r1 / (r2 + self.wd * r1), 1.0), 1.0)

  def _step(self, params: list[Tensor], grads: list[Tensor]) -> tuple[list[Tensor], list[Tensor]]:
    out = []
    for i, (t, g) in enumerate(zip(params, grads)):
      r = self._trust(t, g)
      if self.pre_wd and self.wd > 0: g = g + self.wd * t.detach()
      if self.classic: g = g * r * self.lr
      if self.momentum:
        self.b[i].assign(self.momentum * self.b[i] + g)   # (zero at the start: the first step is b = g)
        g = g + self.momentum * self.b[i] if self.nesterov else self.b[i]
      if self.ns_coefficients: g = g.reshape(g.shape[0], -1).newton_schulz(self.ns_steps, self.ns_coefficients).reshape(g.shape)
      if not self.classic: g = g * r * self.lr
      if not self.pre_wd and self.wd > 0: g = g + self.wd * self.lr * t.detach()
      out.append(g.cast(t.dtype))
    return out, self.b


def SGD(params: list[Tensor], lr: float = 0.001, momentum: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False,
        classic: bool = False, device: str | None = None, fused: bool = False) -> LARS:
  """SGD with optional momentum (nesterov), weight decay (added to the gradient), and classic momentum (lr
  applied before the momentum buffer). Without momentum: w -= lr * (g + wd * w)."""
  return LARS(params, lr, momentum, weight_decay, 0, None, nesterov, classic=classic, pre_wd=True, tcoef=0.0,
              device=device, fused=fused)


def Muon(params: list[Tensor], lr: float = 0.001, momentum: float = 0.95, weight_decay: float = 0.1, ns_steps: int = 5,
         ns_coefficients: tuple = (3.4445, -4.775, 2.0315), nesterov: bool = True, device: str | None = None,
         fused: bool = False) -> LARS:
  """Muon: nesterov momentum SGD whose step is orthogonalised by ns_steps Newton-Schulz iterations (each
  parameter seen as a matrix (shape[0], -1)), then decoupled weight decay lr * wd * w."""
  if fused: raise ValueError("Muon: fused=True is not allowed (the orthogonalisation is per parameter)")
  return LARS(params, lr, momentum, weight_decay, ns_steps, ns_coefficients, nesterov, classic=False, pre_wd=False,
              tcoef=0.0, device=device, fused=fused)


class LAMB(Optimizer):
  """LAMB(params, lr=0.001, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.0, adam=False, device=None, fused=False).

  m = b1 m + (1-b1) g, v = b2 v + (1-b2) g^2, with bias corrections by b1^t and b2^t (t counts steps from 1);
  up = m_hat / (sqrt(v_hat) + eps) + wd * w; w -= lr * r * up, r the trust ratio |w| / |up| (1 where either is
  0), or 1 with adam=True (AdamW)."""
  def __init__(self, params: list[Tensor], lr: float = 0.001, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-6,
               weight_decay: float = 0.0, adam: bool = False, device: str | None = None, fused: bool = False):
    if weight_decay < 0: raise ValueError(f"Invalid weight_decay value: {weight_decay}")
    super().__init__(params, lr, device, fused)
    self.b1, self.b2, self.eps, self.wd, self.adam = b1, b2, eps, weight_decay, adam
    # b1^t and b2^t as state tensors: the step count lives on the device, so a replayed step stays right
    self.b1_t, self.b2_t = (_ones_state(self.device) for _ in (b1, b2))
    self.m, self.v = self._new_optim_param(), self._new_optim_param()

  def _step(self, params: list[Tensor], grads: list[Tensor]) -> tuple[list[Tensor], list[Tensor]]:
    self.b1_t *= self.b1
    self.b2_t *= self.b2
    out = []
    for i, (t, g) in enumerate(zip(params, grads)):
      m, v = self.m[i], self.v[i]
      if g.device != m.device: g = g.contiguous().to(m.device)
      m.assign((self.b1 * m + (1.0 - self.b1) * g).cast(m.dtype))
      v.assign((self.b2 * v + (1.0 - self.b2) * (g * g)).cast(v.dtype))
      up = (m / (1.0 - self.b1_t)) / ((v / (1.0 - self.b2_t)).sqrt() + self.eps) + self.wd * t.detach()
      out.append((self.lr * self._trust(t, up) * up).cast(t.dtype))
    return out, [self.b1_t, self.b2_t, *self.m, *self.v]

  def _trust(self, t: Tensor, up: Tensor) -> Tensor | float:
    if self.adam: return 1.0
    r1, r2 = t.detach().square().sum().sqrt(), up.square().sum().sqrt()
    return (r1 > 0).where((r2 > 0).where(r1 / r2, 1.0), 1.0)


def AdamW(params: list[Tensor], lr: float = 0.001, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
          weight_decay: float = 0.01, device: str | None = None, fused: bool = False) -> LAMB:
  """AdamW: Adam with decoupled weight decay (w -= lr * (m_hat / (sqrt(v_hat) + eps) + wd * w))."""
  return LAMB(params, lr, b1, b2, eps, weight_decay, adam=True, device=device, fused=fused)


def Adam(params: list[Tensor], lr: float = 0.001, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
         device: str | None = None, fused: bool = False) -> LAMB:
  """Adam: w -= lr * m_hat / (sqrt(v_hat) + eps), bias-corrected moments (tinygrad 0.14's Adam has no weight
  decay; use AdamW)."""
  return LAMB(params, lr, b1, b2, eps, 0.0, adam=True, device=device, fused=fused)
