"""Linear algebra beyond matmul: qr, svd, newton_schulz; multinomial sampling, built from the same few pieces
(cumulative sums, comparisons, topk); and tinygrad's small plumbing methods that no other family holds (data,
replace, to_, contiguous_backward, sequential).

Everything is a fixed sequence of tensor ops chosen from the shape alone (no convergence test reads data), so the
results stay lazy and get gradients from the autograd rules. QR is Householder reflections applied as rank-one
updates; SVD is one-sided Jacobi (Hestenes) on the R of a QR, with the column pairs of each round chosen by the
circle method so that a round is a handful of elementwise ops on two halves of the matrix."""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from rulec.engine.ir.dtypes import dtypes
from rulec.engine.ir.ops import Ops
from rulec.engine.tensor.base import TensorBase
from rulec.engine.ir.uop import UOp

if TYPE_CHECKING: from rulec.engine.tensor.tensor import Tensor

# struct formats of data()'s memoryview (tinygrad's DType.fmt)
FMT = {"bool": "?", "int8": "b", "uint8": "B", "int16": "h", "uint16": "H", "int32": "i", "uint32": "I", "int64": "q",
       "uint64": "Q", "float16": "e", "float32": "f", "float64": "d"}
# one-sided Jacobi sweeps (each pairs every two columns once): measured on random and ill-conditioned float32
# matrices, 4 leave U orthogonal to ~1e-5 at n = 6..8, 5 to ~4e-7; larger n needs about log2(n) more
JACOBI_SWEEPS = 5


def _sweeps(n: int, dt) -> int:
  return JACOBI_SWEEPS + max(0, (n - 1).bit_length() - 3) + (1 if dt is dtypes.float64 else 0)


class LinalgError(ValueError, AssertionError):
  """A matrix function given fewer than two axes, or an impossible sample count: tinygrad asserts
  (AssertionError); a ValueError is what numpy users catch."""


def _matrix(x: Tensor, what: str) -> Tensor:
  """x as a float stack of matrices (ints compute in the default float, as tinygrad)."""
  if x.ndim < 2: raise LinalgError(f"{what}: expected two or more dimensions, got {x.ndim} (shape {x.shape})")
  return x if x.dtype.is_float else x.cast(dtypes.default_float)


def _mT(x: Tensor) -> Tensor: return x.transpose(-2, -1)


def _eye(x: Tensor, n: int, lead: tuple[int, ...]) -> Tensor:
  return type(x).eye(n, dtype=x.dtype, device=x.device).reshape((1,) * len(lead) + (n, n)).expand(lead + (n, n))


def _circle(t: Tensor, h: int) -> Tensor:
  """The next round of the circle method on (..., 2, h) = (top row, bottom row): the first top stays put and
  the other 2h - 1 places move one step around the circle, so 2h - 1 rounds pair every two places once."""
  if h == 1: return t
  top, bot = t[..., 0, :], t[..., 1, :]
  new_top = top[..., :1].cat(bot[..., :1], top[..., 1:h - 1], dim=-1)
  new_bot = bot[..., 1:].cat(top[..., h - 1:], dim=-1)
  return new_top.unsqueeze(-2).cat(new_bot.unsqueeze(-2), dim=-2)


def _jacobi_round(X: Tensor, m: int, h: int) -> Tensor:
  """One round on X = [W; V] (..., m + n, 2, h): rotate each column pair (top j, bottom j) to make W's two columns
  orthogonal, the rows of V along. A pair already orthogonal (a zero column among them) gets exactly the identity."""
  p, q = X[..., 0, :], X[..., 1, :]
  wp, wq = p[..., :m, :], q[..., :m, :]
  alpha, beta, gamma = (wp.square().sum(-2, keepdim=True), wq.square().sum(-2, keepdim=True),
                        (wp * wq).sum(-2, keepdim=True))
  rot = gamma != 0
  zeta = (beta - alpha) / (2 * rot.where(gamma, 1))
  # the smaller root of t^2 + 2 zeta t - 1 = 0: the rotation by at most 45 degrees
  t = (zeta >= 0).where(1, -1) / (zeta._abs_bits() + (1 + zeta.square()).sqrt())
  # (contiguous: the rotations and the new X each in a kernel of their own, so the scheduler need not weigh
  # what to store in every round, and the rounds are not recomputed from one another)
  t = rot.where(t, 0).contiguous()
  c = 1 / (1 + t.square()).sqrt()
  s = c * t
  p2, q2 = c * p - s * q, s * p + c * q
  return _circle(p2.unsqueeze(-2).cat(q2.unsqueeze(-2), dim=-2), h).contiguous()


def _jacobi(R: Tensor) -> tuple[Tensor, Tensor]:
  """(W, V) with W = R @ V, the columns of W orthogonal and V orthogonal, for a square R (..., n, n)."""
  *lead, n, _ = R.shape
  lead = tuple(lead)
  X = R.cat(_eye(R, n, lead), dim=-2)   # V's rows below W's: one rotation of the columns turns both
  odd = n % 2
  # odd n: a zero column in front takes the fixed place of the circle, so it is never rotated and is dropped after
  if odd: X = X.pad(((0, 0),) * (len(lead) + 1) + ((1, 0),))
  h = (n + odd) // 2
  X = X.reshape(lead + (2 * n, 2, h))
  for _ in range(_sweeps(n, R.dtype) * (2 * h - 1) if h > 1 else 1): X = _jacobi_round(X, n, h)
  X = X.reshape(lead + (2 * n, 2 * h))[..., odd:]
  return X[..., :n, :], X[..., n:, :]


class LinalgMixin:
  """Matrix decompositions built from tensor ops (qr, svd, newton_schulz), multinomial sampling, and tinygrad's
  plumbing methods data, replace, to_, contiguous_backward and sequential."""
  __slots__ = ()

  def qr(self) -> tuple[Tensor, Tensor]:
    """qr(): (Q, R) with Q @ R == self for the last two axes (m, n): Q (m, m) orthogonal, R (m, n) upper triangular.

    numpy's mode='complete'; batched over leading axes; integer inputs give float32. Householder reflections, each
    chosen (as LAPACK) to send the column away from its first entry's sign, so R's diagonal has the opposite sign
    of what it reflects. As tinygrad, the last reflection of a square or wide matrix is taken too (LAPACK skips a
    reflection of a single entry), so R's last diagonal entry has the opposite sign of numpy's there."""
    a = _matrix(self, "qr")
    *lead, m, n = a.shape
    lead = tuple(lead)
    R, Q = a, _eye(a, m, lead)
    rows = type(self).arange(m, device=self.device).reshape(m, 1)
    for i in range(min(m, n)):
      x = (rows >= i).where(R[..., :, i:i + 1], 0)   # (..., m, 1): column i from the diagonal down
      x0 = R[..., i:i + 1, i:i + 1]
      norm = x.square().sum(-2, keepdim=True).sqrt()
      sgn = (x0 < 0).where(-1, 1).cast(a.dtype)
      u = x + (rows == i).where(sgn * norm, 0)   # H = I - 2 u u^T / (u^T u), and u^T u = 2 norm (norm + |x0|)
      half = norm * (norm + x0._abs_bits())
      w = (half > 0).where(u / (half > 0).where(half, 1), 0)   # a zero column: no reflection
      R = R - w @ (_mT(u) @ R)
      Q = Q - (Q @ u) @ _mT(w)
    return Q, R.triu()

  def svd(self, full_matrices: bool = True) -> tuple[Tensor, Tensor, Tensor]:
    """svd(full_matrices=True): (U, S, Vh) with U @ diag(S) @ Vh == self for the last two axes (m, n), S the
    k = min(m, n) singular values in descending order.

    U is (m, m) and Vh (n, n), or (m, k) and (k, n) with full_matrices=False (numpy's shapes); batched over leading
    axes; integer inputs give float32. The singular vectors of a singular value are unique only up to sign (and
    rotation among equal ones), so they may differ from numpy's by that. Computed from the R of a QR by a fixed
    number of one-sided Jacobi sweeps (no convergence test: the result is lazy). As tinygrad, the columns of U for
    zero singular values of a rank-deficient input are zero, not completed to an orthogonal basis."""
    a = _matrix(self, "svd")
    *lead, m, n = a.shape
    if m < n:   # A^T = U S Vh gives A = Vh^T S U^T
      U, S, Vh = _mT(a).svd(full_matrices)
      return _mT(Vh), S, _mT(U)
    lead = tuple(lead)
    Q, R = a.qr()
    W, V = _jacobi(R[..., :n, :])
    S, order = W.square().sum(-2).sqrt().sort(-1, descending=True)
    idx = order.unsqueeze(-2).expand(lead + (n, n))
    U = W.gather(-1, idx) / (S != 0).where(S, 1).unsqueeze(-2)
    V = V.gather(-1, idx)
    U = Q[..., :, :n] @ U   # Q = [Q1 Q2] and R = [R1; 0]: A = Q1 R1 = (Q1 U1) S V^T
    if full_matrices: U = U.cat(Q[..., :, n:], dim=-1)
    return U, S, _mT(V)

  def newton_schulz(self, steps: int, params: tuple[int, ...], eps: float = 1e-07) -> Tensor:
    """newton_schulz(steps, params, eps=1e-07): `steps` iterations of the odd matrix polynomial
    G <- sum_i params[i] * (G G^T)^i G, starting from self / (its Frobenius norm + eps) over the last two axes.

    With params such as (2, -1.5, 0.5) it converges to the orthogonal factor U Vh of self's SVD (Muon's
    orthogonalisation). A tall matrix is iterated as its transpose, so G G^T is the smaller square."""
    if self.ndim < 2: raise LinalgError(f"newton_schulz: expected two or more dimensions, got {self.ndim} (shape {self.shape})")
    if self.shape[-2] > self.shape[-1]: return _mT(_mT(self).newton_schulz(steps, params, eps))
    G = self / (self.square().sum((-2, -1), keepdim=True).sqrt() + eps)
    for _ in range(steps):
      gram, term, acc = G @ _mT(G), G, None
      for i, p in enumerate(params):
        if i: term = gram @ term
        acc = p * term if acc is None else acc + p * term
      G = acc if acc is not None else G * 0
    return G

  def multinomial(self, num_samples: int = 1, replacement: bool = False) -> Tensor:
    """multinomial(num_samples=1, replacement=False): int32 indices drawn with probabilities proportional to self
    (a weight vector, or one weight row per sample set), shape (num_samples,) or (rows, num_samples).

    With replacement (or one sample) each draw inverts the cumulative weights at a uniform value; without, the
    num_samples largest keys u^(1/w) are taken (Efraimidis-Spirakis), so no index repeats. Uses the generator of
    rand (seeded by manual_seed). More samples than weights without replacement, a count below 1 or a tensor not of
    1 or 2 axes raise LinalgError (a ValueError and, as tinygrad's asserts, an AssertionError)."""
    if not 1 <= self.ndim <= 2: raise LinalgError(f"multinomial: expected 1 or 2 dimensions, got shape {self.shape}")
    if not isinstance(num_samples, int) or num_samples < 1:
      raise LinalgError(f"multinomial: num_samples must be a positive int, got {num_samples!r}")
    w = (self.unsqueeze(0) if self.ndim == 1 else self).float()
    rows, k = w.shape
    if not replacement and num_samples > k:
      raise LinalgError(f"multinomial: {num_samples} samples without replacement from {k} weights")
    if replacement or num_samples == 1:
      cdf = w.cumsum(1)
      cdf = cdf / cdf[:, -1:]
      u = type(self).rand(rows, num_samples, 1, device=self.device)
      # the index of a draw is the number of cumulative weights at or below it (the last never is: u < 1)
      idx = (u >= cdf.unsqueeze(1)).sum(2)
    else:
      keys = type(self).rand(rows, k, device=self.device).log() / w   # log of u^(1/w): same order, no underflow
      idx = keys.topk(num_samples, dim=1)[1]
    idx = idx.cast(dtypes.int32)
    return idx.reshape(num_samples) if self.ndim == 1 else idx

  # *** plumbing ***

  def data(self) -> memoryview:
    """data(): the realized value as a memoryview of its dtype's struct format and the tensor's shape ('f' for
    float32, 'q' for int64, ...); an empty tensor gives an empty 1-d view, as tinygrad.

    The view holds a copy of the buffer, taken when data() is called (tinygrad's may alias the device buffer)."""
    fmt = FMT.get(self.dtype.name)
    if fmt is None: raise TypeError(f"data(): no memoryview format for dtype {self.dtype.name}")
    # (memoryview.cast cannot make 'e' before Python 3.12, not even an empty one; numpy's view can)
    if self.numel() == 0: return memoryview(np.zeros(0, np.float16)) if fmt == "e" else memoryview(bytearray(0)).cast(fmt)
    arr = np.array(self.numpy(), order="C")   # (a C-ordered copy; np.ascontiguousarray gave a 0-d value one axis)
    if fmt == "e": return memoryview(arr)
    return memoryview(arr).cast("B").cast(fmt, self.shape)

  def replace(self, x: Tensor) -> Tensor:
    """replace(x): this tensor takes x's graph (and so its value, dtype and device) and is returned; the shapes
    must match. Unlike assign no storage is written: other tensors sharing the old value keep it."""
    if not isinstance(x, TensorBase):
      raise TypeError(f"replace() takes a Tensor, got {type(x).__name__}")
    if x.shape != self.shape: raise LinalgError(f"replace shape mismatch {self.shape} != {x.shape}")
    self.uop, self.device = x.uop, x.device
    return self

  def to_(self, device: str | None) -> Tensor:
    """to_(device): moves this tensor (and its gradient, if it has one) to device in place; returns self."""
    if device is None: return self
    if self.grad is not None: self.grad.replace(self.grad.to(device))
    return self.replace(self.to(device))

  def contiguous_backward(self) -> Tensor:
    """contiguous_backward(): the same value; in the backward pass the gradient flowing through here is made
    contiguous (a kernel boundary), as tinygrad's CONTIGUOUS_BACKWARD."""
    return self._new(UOp(Ops.CONTIGUOUS_BACKWARD, self.dtype, (self.uop,)))

  def sequential(self, ll: list[Callable[[Any], Any]]) -> Tensor:
    """sequential(ll): the callables of ll applied in order, each to the previous one's result (self first)."""
    return functools.reduce(lambda x, f: f(x), ll, self)
