"""tinygrad's matrix decompositions (engine/tensor/linalg.py) against numpy.linalg: qr (Q @ R == A, Q orthogonal,
R upper triangular), svd (U @ diag(S) @ Vh == A, S as numpy's, U and Vh orthonormal) and newton_schulz (against a
numpy transcription of the iteration), over square, tall, wide and batched shapes."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from rulec.engine.tensor import Tensor
from rulec.engine.tensor.linalg import LinalgError

# a stack of random normal matrices: (batch shape, m, n, seed); random normal matrices are full rank
matrices = st.tuples(st.sampled_from([(), (1,), (2,), (2, 1)]), st.integers(1, 4), st.integers(1, 4), st.integers(0, 2 ** 16))


def normal(batch, m, n, seed, dt=np.float32):
  return np.random.default_rng(seed).standard_normal(batch + (m, n)).astype(dt)


def mT(a): return np.swapaxes(a, -1, -2)


def assert_orthonormal_cols(q, atol=2e-5):
  k = q.shape[-1]
  np.testing.assert_allclose(mT(q) @ q, np.broadcast_to(np.eye(k), q.shape[:-2] + (k, k)), atol=atol)


@settings(max_examples=6)
@given(matrices)
def test_qr_against_numpy(mat):
  a = normal(*mat)
  m, n = a.shape[-2:]
  Q, R = Tensor(a).qr()
  assert Q.shape == a.shape[:-2] + (m, m) and R.shape == a.shape
  q, r = Q.numpy(), R.numpy()
  np.testing.assert_allclose(q @ r, a, atol=3e-5)
  assert_orthonormal_cols(q)
  assert (np.tril(r, -1) == 0).all()   # exactly upper triangular
  # R is unique up to the sign of each row (full rank): its magnitudes are numpy's
  ref = np.linalg.qr(a.astype(np.float64), mode="complete")[1]
  np.testing.assert_allclose(np.abs(r), np.abs(ref), atol=3e-5)


def test_qr_signs_follow_tinygrad():
  """Householder as LAPACK (R[i, i] against the sign of the entry it reflects), and the last 1-entry reflection
  taken as tinygrad: R[-1, -1] of a square matrix is minus numpy's."""
  a = np.array([[2.0, 1.0], [1.0, 3.0]], np.float32)
  r, ref = Tensor(a).qr()[1].numpy(), np.linalg.qr(a)[1]
  np.testing.assert_allclose(r[0], ref[0], rtol=1e-6)
  np.testing.assert_allclose(r[1], -ref[1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", [(0, 3), (3, 0), (0, 2, 2), (1, 1)])
def test_qr_empty_and_single(shape):
  a = np.ones(shape, np.float32)
  Q, R = Tensor(a).qr()
  m = shape[-2]
  assert Q.shape == shape[:-2] + (m, m) and R.shape == shape
  np.testing.assert_allclose(Q.numpy() @ R.numpy(), a, atol=1e-6)


def test_qr_dtypes_and_errors():
  Q, R = Tensor([[1, 2], [3, 4]]).qr()   # ints compute in float32, as tinygrad
  assert Q.dtype.name == "float32" and R.dtype.name == "float32"
  np.testing.assert_allclose(Q.numpy() @ R.numpy(), [[1, 2], [3, 4]], atol=1e-5)
  a = normal((), 3, 2, 7, np.float64)
  Q, R = Tensor(a).qr()
  assert Q.dtype.name == "float64"
  np.testing.assert_allclose(Q.numpy() @ R.numpy(), a, atol=1e-12)
  for bad in (Tensor([1.0, 2.0]), Tensor(1.0)):
    with pytest.raises(AssertionError, match="two or more dimensions"): bad.qr()
    with pytest.raises(ValueError): bad.svd()


@settings(max_examples=5)
@given(matrices, st.booleans())
def test_svd_against_numpy(mat, full):
  a = normal(*mat)
  m, n = a.shape[-2:]
  k = min(m, n)
  U, S, Vh = Tensor(a).svd(full_matrices=full)
  ru, rs, rvh = np.linalg.svd(a, full_matrices=full)
  assert (U.shape, S.shape, Vh.shape) == (ru.shape, rs.shape, rvh.shape)
  u, s, vh = U.numpy(), S.numpy(), Vh.numpy()
  np.testing.assert_allclose(s, rs, rtol=1e-5, atol=1e-5)
  assert (np.diff(s, axis=-1) <= 0).all()   # descending
  np.testing.assert_allclose((u[..., :k] * s[..., None, :]) @ vh[..., :k, :], a, atol=3e-5)
  assert_orthonormal_cols(u, atol=1e-4)
  assert_orthonormal_cols(mT(vh), atol=1e-4)


def test_svd_rank_deficient():
  """Zero singular values come out (near) zero and the product still rebuilds A; as tinygrad, U's columns for
  them are zero."""
  a = np.array([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [1.0, 0.0, 1.0]], np.float32)   # rank 2
  U, S, Vh = Tensor(a).svd()
  s = S.numpy()
  np.testing.assert_allclose(s, np.linalg.svd(a, compute_uv=False), atol=2e-5)
  np.testing.assert_allclose((U.numpy() * s) @ Vh.numpy(), a, atol=3e-5)
  U, S, Vh = Tensor.zeros(2, 2).svd()
  np.testing.assert_array_equal(S.numpy(), [0, 0])
  assert_orthonormal_cols(mT(Vh.numpy()))


def test_svd_shapes_of_empty_and_float64():
  for shape, full in [((0, 3), True), ((3, 0), False), ((0, 2, 2), True)]:
    U, S, Vh = Tensor(np.ones(shape, np.float32)).svd(full)
    ru, rs, rvh = np.linalg.svd(np.ones(shape), full_matrices=full)
    assert (U.shape, S.shape, Vh.shape) == (ru.shape, rs.shape, rvh.shape)
  a = normal((), 3, 3, 3, np.float64)
  U, S, Vh = Tensor(a).svd()
  assert S.dtype.name == "float64"
  np.testing.assert_allclose(S.numpy(), np.linalg.svd(a, compute_uv=False), rtol=1e-12)
  np.testing.assert_allclose((U.numpy() * S.numpy()) @ Vh.numpy(), a, atol=1e-12)


def np_newton_schulz(a, steps, params, eps=1e-7):
  """The iteration written out: G <- sum_i p_i (G G^T)^i G from G = A / (||A||_F + eps), wide orientation."""
  if a.shape[-2] > a.shape[-1]: return mT(np_newton_schulz(mT(a), steps, params, eps))
  g = a / (np.sqrt((a * a).sum((-2, -1), keepdims=True)) + eps)
  for _ in range(steps):
    gram, term, acc = g @ mT(g), g, 0
    for i, p in enumerate(params):
      if i: term = gram @ term
      acc = acc + p * term
    g = acc
  return g


@settings(max_examples=6)
@given(matrices, st.sampled_from([(1.5, -0.5), (2, -1.5, 0.5), (3.4445, -4.775, 2.0315)]), st.integers(0, 4))
def test_newton_schulz_against_numpy(mat, params, steps):
  a = normal(*mat)
  got = Tensor(a).newton_schulz(steps, params).numpy()
  np.testing.assert_allclose(got, np_newton_schulz(a.astype(np.float64), steps, params), rtol=1e-4, atol=1e-5)


def test_newton_schulz_orthogonalises():
  """On a well-conditioned matrix the cubic iteration converges to the polar factor U Vh."""
  rng = np.random.default_rng(5)
  q1, q2 = np.linalg.qr(rng.standard_normal((3, 3)))[0], np.linalg.qr(rng.standard_normal((4, 4)))[0]
  a = (q1 @ np.diag([1.0, 1.5, 2.0]) @ q2[:3]).astype(np.float32)   # (3, 4), singular values 1 .. 2
  u, _, vh = np.linalg.svd(a, full_matrices=False)
  np.testing.assert_allclose(Tensor(a).newton_schulz(12, (1.5, -0.5)).numpy(), u @ vh, atol=1e-4)
  np.testing.assert_allclose(Tensor(a.T).newton_schulz(12, (1.5, -0.5)).numpy(), (u @ vh).T, atol=1e-4)
  with pytest.raises(LinalgError): Tensor([1.0, 2.0]).newton_schulz(1, (1.5, -0.5))


def test_gradients_flow_through():
  """Built from tensor ops, the decompositions get gradients: d||R||^2/dA = 2A (Q is orthogonal) and
  d sum(S)/dA = U Vh (the nuclear norm's gradient)."""
  a = normal((), 3, 3, 11)
  t = Tensor(a, requires_grad=True)
  R = t.qr()[1]
  (R * R).sum().backward()
  np.testing.assert_allclose(t.grad.numpy(), 2 * a, atol=1e-5)
  t = Tensor(a, requires_grad=True)
  t.svd()[1].sum().backward()
  u, _, vh = np.linalg.svd(a)
  np.testing.assert_allclose(t.grad.numpy(), u @ vh, atol=1e-4)
