"""bfloat16 as a Tensor dtype: creation, numpy interop, casts, arithmetic, promotion, reductions, gradients and files,
on every device, against ml_dtypes' numpy bfloat16 (each op computed in float32 and rounded once to bfloat16) and
against the NUMPY reference device bit for bit."""
import ml_dtypes  # noqa: F401  (registers np.dtype("bfloat16"))
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from rulec import Tensor, TinyJit, dtypes
from rulec.nn.state import safe_load, safe_save
from tests.helpers import available_devices

BF16 = np.dtype("bfloat16")   # ml_dtypes' numpy type (imported above: rulec imports it only when a bfloat16 is first needed)


DEVICES = available_devices(("NUMPY", "CPU"))


def bits(a) -> np.ndarray:
  """bfloat16 values as their 16 bits (NaNs compared as bits too: every device gives ml_dtypes' canonical one)."""
  with np.errstate(over="ignore", invalid="ignore"): return np.asarray(a).astype(BF16).view(np.uint16)


def ref(fn, *arrays):
  """fn on bfloat16 numpy arrays: ml_dtypes computes each op in float32 and rounds the result to bfloat16."""
  with np.errstate(all="ignore"): return np.asarray(fn(*arrays)).astype(BF16)


def rand_bf16(rng, shape, lo=-8.0, hi=8.0) -> np.ndarray:
  return rng.uniform(lo, hi, shape).astype(np.float32).astype(BF16)


# *** creation and numpy interop ***

@pytest.mark.parametrize("device", DEVICES)
def test_creation_and_numpy(device):
  t = Tensor([1.0, 2.5, 3.3, -7.1, 1e39], dtype=dtypes.bfloat16, device=device)
  assert t.dtype is dtypes.bfloat16 and t.element_size() == 2 and t.nbytes() == 10
  got = t.numpy()
  assert got.dtype == BF16
  np.testing.assert_array_equal(bits(got), bits(np.array([1.0, 2.5, 3.3, -7.1, 1e39], np.float64).astype(BF16)))
  a = np.array([0.1, -0.2, np.inf], BF16)
  u = Tensor(a, device=device)
  assert u.dtype is dtypes.bfloat16 and bits(u.numpy()).tolist() == bits(a).tolist()
  assert Tensor.zeros(3, dtype="bfloat16", device=device).numpy().tolist() == [0, 0, 0]
  assert Tensor.full((2,), 1.0 / 3, dtype=dtypes.bfloat16, device=device).numpy().astype(np.float32).tolist() == \
    [float(np.float32(1 / 3).astype(BF16))] * 2
  assert Tensor.arange(5, dtype=dtypes.bfloat16, device=device).numpy().astype(np.float32).tolist() == [0, 1, 2, 3, 4]
  r = Tensor.rand(1000, dtype=dtypes.bfloat16, device=device).numpy().astype(np.float32)
  assert r.min() >= 0 and r.max() < 1 and len(np.unique(r)) > 50
  assert Tensor([1, 2], device=device).bfloat16().dtype is dtypes.bfloat16


# *** casts ***

@pytest.mark.parametrize("device", DEVICES)
def test_cast_from_float32_rounds_to_nearest_even(device):
  # ties (0x3F808000 -> 0x3F80, 0x3F818000 -> 0x3F82), a tie plus one ulp, the largest finite (rounds to inf), a
  # subnormal tie, NaNs with payloads (-> ml_dtypes' canonical quiet NaN, sign kept), -0.0, infinities
  u = np.array([0x3F808000, 0x3F818000, 0x3F808001, 0x7F7FFFFF, 0x7F7F7FFF, 0x00018000, 0x00008000, 0x7F800001,
                0xFFA12345, 0x80000000, 0x7F800000, 0xFF800000, 0x807FFFFF], np.uint32)
  x = u.view(np.float32)
  got = Tensor(x, device=device).cast(dtypes.bfloat16).numpy()
  np.testing.assert_array_equal(bits(got), bits(x))


@pytest.mark.parametrize("device", [d for d in DEVICES if d != "NUMPY"])
def test_casts_match_the_reference(device):
  rng = np.random.default_rng(0)
  every = np.arange(1 << 16, dtype=np.uint16).view(BF16)   # every bfloat16, NaNs and subnormals included
  for dt in (dtypes.float32, dtypes.float16, dtypes.int32, dtypes.bool):
    got = Tensor(every, device=device).cast(dt).numpy()
    want = Tensor(every, device="NUMPY").cast(dt).numpy()
    np.testing.assert_array_equal(got, want, err_msg=dt.name)
  f64 = np.concatenate([rng.standard_normal(500) * 100, [1 + 2.0 ** -8 + 2.0 ** -30, -(1 + 2.0 ** -8 + 2.0 ** -40)]])
  i32 = rng.integers(-2 ** 31, 2 ** 31, 500, dtype=np.int64).astype(np.int32)
  for a in (f64, i32, rng.standard_normal(500).astype(np.float16)):
    got = Tensor(a, device=device).cast(dtypes.bfloat16).numpy()
    np.testing.assert_array_equal(bits(got), bits(Tensor(a, device="NUMPY").cast(dtypes.bfloat16).numpy()))


def test_cast_from_float64_rounds_once():
  # 1 + 2**-8 + 2**-30 lies just above the tie between 1 and 1 + 2**-7: rounding through float32 first would give 1
  t = Tensor(np.array([1 + 2.0 ** -8 + 2.0 ** -30]), device="NUMPY").cast(dtypes.bfloat16)
  assert bits(t.numpy()).tolist() == [0x3F81]


# *** arithmetic ***

BINARY = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b, "div": lambda a, b: a / b,
          "max": lambda a, b: a.maximum(b) if isinstance(a, Tensor) else np.maximum(a, b)}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", list(BINARY))
def test_binary_ops_round_once(device, op):
  rng = np.random.default_rng(1)
  a, b = rand_bf16(rng, 300), rand_bf16(rng, 300)
  b[:5] = 0
  fn = BINARY[op]
  got = fn(Tensor(a, device=device), Tensor(b, device=device)).numpy()
  assert got.dtype == BF16
  np.testing.assert_array_equal(bits(got), bits(ref(fn, a, b)))


@pytest.mark.parametrize("device", [d for d in DEVICES if d != "NUMPY"])
@settings(max_examples=25)
@given(st.lists(st.integers(0, 0xFFFF), min_size=1, max_size=64), st.lists(st.integers(0, 0xFFFF), min_size=1, max_size=64),
       st.sampled_from(["add", "mul", "div", "sqrt", "exp", "log", "floordiv", "mod", "where", "sin", "cmplt"]))
def test_ops_on_any_bits_match_the_reference(device, xs, ys, op):
  n = min(len(xs), len(ys))
  a, b = np.array(xs[:n], np.uint16).view(BF16), np.array(ys[:n], np.uint16).view(BF16)
  fns = {"add": lambda x, y: x + y, "mul": lambda x, y: x * y, "div": lambda x, y: x / y, "sqrt": lambda x, y: x.sqrt(),
         "exp": lambda x, y: x.exp(), "log": lambda x, y: x.log(), "floordiv": lambda x, y: x // y,
         "mod": lambda x, y: x % y, "where": lambda x, y: (x < y).where(x, y), "sin": lambda x, y: x.sin(),
         "cmplt": lambda x, y: x < y}
  fn = fns[op]
  got = fn(Tensor(a, device=device), Tensor(b, device=device)).numpy()
  want = fn(Tensor(a, device="NUMPY"), Tensor(b, device="NUMPY")).numpy()
  if op in ("exp", "log", "sin"):   # device-defined transcendentals: each device's float32 approximation, rounded
    g, w = got.astype(np.float32), want.astype(np.float32)
    np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
    np.testing.assert_allclose(g, w, rtol=2 ** -7, atol=1e-30)
  elif got.dtype == BF16:
    # bit for bit, but a NaN made by an invalid op (0 % 0, inf - inf) has no defined sign: x86 makes it negative,
    # PoCL's fmod positive; only its position is compared
    nan = np.isnan(want.astype(np.float32))
    np.testing.assert_array_equal(np.isnan(got.astype(np.float32)), nan)
    np.testing.assert_array_equal(got.view(np.uint16)[~nan], want.view(np.uint16)[~nan])
  else: np.testing.assert_array_equal(got, want)


def test_promotion():
  bf = Tensor([1.0], dtype=dtypes.bfloat16, device="NUMPY")
  assert (bf + Tensor([1.0], dtype=dtypes.float16, device="NUMPY")).dtype is dtypes.float32
  assert (Tensor([1.0], dtype=dtypes.float16, device="NUMPY") + bf).dtype is dtypes.float32
  assert (bf + Tensor([1.0], device="NUMPY")).dtype is dtypes.float32
  assert (bf + Tensor([1.0], dtype=dtypes.float64, device="NUMPY")).dtype is dtypes.float64
  assert (bf + Tensor([1], device="NUMPY")).dtype is dtypes.bfloat16
  assert (bf * 1.5).dtype is dtypes.bfloat16 and (bf + 1).dtype is dtypes.bfloat16
  assert (bf < 2).dtype is dtypes.bool


# *** reductions and whole computations ***

@pytest.mark.parametrize("device", DEVICES)
def test_sum_accumulates_in_float32(device):
  # adding 1 to a bfloat16 256 leaves 256: a sum rounded at every step would stop there
  assert Tensor.ones(4096, dtype=dtypes.bfloat16, device=device).sum().item() == 4096
  rng = np.random.default_rng(2)
  a = rand_bf16(rng, (33, 70))
  for axis in (0, 1, None):
    got = Tensor(a, device=device).sum(axis).numpy()
    assert got.dtype == BF16
    np.testing.assert_array_equal(bits(got), bits(a.astype(np.float64).sum(axis).astype(np.float32)))
    np.testing.assert_array_equal(bits(Tensor(a, device=device).max(axis).numpy()), bits(a.max(axis)))
    m = Tensor(a, device=device).mean(axis).numpy()
    np.testing.assert_allclose(m.astype(np.float32), a.astype(np.float64).mean(axis), rtol=2 ** -8, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_matmul_softmax_layernorm_near_float32(device):
  rng = np.random.default_rng(3)
  x, w = rand_bf16(rng, (16, 64), -1, 1), rand_bf16(rng, (64, 32), -1, 1)
  xt, wt = Tensor(x, device=device), Tensor(w, device=device)
  y = (xt @ wt)
  assert y.dtype is dtypes.bfloat16
  want = x.astype(np.float64) @ w.astype(np.float64)
  # the products and their sum in float32, rounded once to bfloat16: within half an ulp of bfloat16 (2**-9)
  np.testing.assert_allclose(y.numpy().astype(np.float64), want, rtol=2 ** -8, atol=1e-2)
  s = y.softmax(-1).numpy().astype(np.float64)
  e = np.exp(want - want.max(-1, keepdims=True))
  np.testing.assert_allclose(s, e / e.sum(-1, keepdims=True), rtol=2 ** -6, atol=2e-3)
  ln = y.layernorm().numpy().astype(np.float64)
  wl = (want - want.mean(-1, keepdims=True)) / np.sqrt(want.var(-1, keepdims=True) + 1e-5)
  np.testing.assert_allclose(ln, wl, rtol=2 ** -5, atol=3e-2)


@pytest.mark.parametrize("device", DEVICES)
def test_gradients_in_bfloat16(device):
  rng = np.random.default_rng(4)
  x, w = rand_bf16(rng, (8, 16), -1, 1), rand_bf16(rng, (16, 4), -1, 1)
  xt = Tensor(x, device=device, requires_grad=True)
  wt = Tensor(w, device=device, requires_grad=True)
  loss = (xt @ wt).relu().sum()
  loss.backward()
  assert wt.grad.dtype is dtypes.bfloat16 and xt.grad.dtype is dtypes.bfloat16
  xf, wf = x.astype(np.float64), w.astype(np.float64)
  mask = (xf @ wf > 0).astype(np.float64)
  np.testing.assert_allclose(wt.grad.numpy().astype(np.float64), xf.T @ mask, rtol=2 ** -7, atol=2e-2)
  np.testing.assert_allclose(xt.grad.numpy().astype(np.float64), mask @ wf.T, rtol=2 ** -7, atol=2e-2)


@pytest.mark.parametrize("device", DEVICES)
def test_jitted_loop(device):
  @TinyJit
  def step(a: Tensor, b: Tensor) -> Tensor: return (a * b + 1).realize()
  rng = np.random.default_rng(5)
  for _ in range(5):
    a, b = rand_bf16(rng, 64), rand_bf16(rng, 64)
    got = step(Tensor(a, device=device), Tensor(b, device=device)).numpy()
    np.testing.assert_array_equal(bits(got), bits(ref(lambda x, y: (x * y).astype(BF16) + np.float32(1), a, b)))


# *** files ***

def test_safetensors_round_trip(tmp_path):
  a = np.array([1.5, -2.25, 3e38, np.inf, 1e-40], np.float32).astype(BF16)
  safe_save({"w": Tensor(a, device="NUMPY")}, tmp_path / "w.safetensors")
  got = safe_load(tmp_path / "w.safetensors")["w"]
  assert got.dtype is dtypes.bfloat16
  np.testing.assert_array_equal(bits(got.numpy()), bits(a))
  # the file says BF16 in its header, as torch and the safetensors library write it
  raw = (tmp_path / "w.safetensors").read_bytes()
  assert b'"BF16"' in raw[:200]
