"""tinygrad's API conventions on rulec's Tensor (issue #12): dtype promotion, dtype names, keyword names and their
older rulec aliases, pad forms and modes, 0-d reductions, and the exception classes of common mistakes.

Expected values were measured on tinygrad 0.14 (CPU backend); tinygrad is not imported here."""
from __future__ import annotations

import itertools

import ml_dtypes  # noqa: F401  (registers np.dtype("bfloat16"))
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rulec.engine.ir.dtypes import dtypes
from rulec.engine.tensor.args import AxisError, ShapeError, promote_types
from rulec import Tensor

NAMES = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16", "bfloat16", "float32",
         "float64"]
SHORT = {"b": "bool", "i8": "int8", "u8": "uint8", "i16": "int16", "u16": "uint16", "i32": "int32", "u32": "uint32",
         "i64": "int64", "u64": "uint64", "f16": "float16", "bf16": "bfloat16", "f32": "float32", "f64": "float64",
         "WF": "float32"}   # tinygrad's weakfloat, which it stores as its default float

# (Tensor of row dtype + Tensor of column dtype).dtype, measured on tinygrad 0.14; columns in NAMES order
PROMOTION = {
  "bool":     "b   i8  u8  i16 u16 i32 u32 i64 u64 f16 bf16 f32 f64",
  "int8":     "i8  i8  i16 i16 i32 i32 i64 i64 WF  f16 bf16 f32 f64",
  "uint8":    "u8  i16 u8  i16 u16 i32 u32 i64 u64 f16 bf16 f32 f64",
  "int16":    "i16 i16 i16 i16 i32 i32 i64 i64 WF  f16 bf16 f32 f64",
  "uint16":   "u16 i32 u16 i32 u16 i32 u32 i64 u64 f16 bf16 f32 f64",
  "int32":    "i32 i32 i32 i32 i32 i32 i64 i64 WF  f16 bf16 f32 f64",
  "uint32":   "u32 i64 u32 i64 u32 i64 u32 i64 u64 f16 bf16 f32 f64",
  "int64":    "i64 i64 i64 i64 i64 i64 i64 i64 WF  f16 bf16 f32 f64",
  "uint64":   "u64 WF  u64 WF  u64 WF  u64 WF  u64 f16 bf16 f32 f64",
  "float16":  "f16 f16 f16 f16 f16 f16 f16 f16 f16 f16 f32  f32 f64",
  "bfloat16": "bf16 bf16 bf16 bf16 bf16 bf16 bf16 bf16 bf16 f32 bf16 f32 f64",
  "float32":  "f32 f32 f32 f32 f32 f32 f32 f32 f32 f32 f32  f32 f64",
  "float64":  "f64 f64 f64 f64 f64 f64 f64 f64 f64 f64 f64  f64 f64",
}
TABLE = {(a, b): SHORT[c] for a, row in PROMOTION.items() for b, c in zip(NAMES, row.split())}


def tinygrad_promote(a, b):
  """The promoted dtype of two Tensor dtypes, from the measured table."""
  return dtypes.by_name(TABLE[(a.name, b.name)])


# *** dtype promotion ***

@pytest.mark.parametrize("a", NAMES)
def test_promotion_table_matches_tinygrad(a):
  for b in NAMES:
    got = (Tensor([1, 0], dtype=a) + Tensor([1, 0], dtype=b)).dtype
    assert got.name == TABLE[(a, b)], (a, b)
    assert promote_types(dtypes.by_name(a), dtypes.by_name(b)).name == TABLE[(a, b)]


def test_promotion_of_three_is_the_pairwise_lattice_bound():
  # a lattice: promoting all at once is promoting pairwise in any order (except where tinygrad's weak float
  # absorbs a later float16, which rulec has no weak dtype for)
  for a, b, c in itertools.product(NAMES, repeat=3):
    d = [dtypes.by_name(n) for n in (a, b, c)]
    if "WF" in (PROMOTION[a].split()[NAMES.index(b)], PROMOTION[b].split()[NAMES.index(c)]): continue
    assert promote_types(*d) is promote_types(promote_types(d[0], d[1]), d[2]) is promote_types(d[0], promote_types(d[1], d[2]))


@pytest.mark.parametrize("name", NAMES)
def test_python_scalars_are_weak(name):
  t = Tensor([1, 0], dtype=name)
  dt = t.dtype
  as_int = dtypes.int32 if dt is dtypes.bool else dt
  as_float = dt if dt.is_float else dtypes.float32
  assert (t + 1).dtype is as_int and (1 + t).dtype is as_int and (t + (-1)).dtype is as_int
  assert (t + 2.5).dtype is as_float and (t * 1.0).dtype is as_float and (t + True).dtype is dt


def test_python_ints_that_do_not_fit_wrap():
  assert (Tensor([100], dtype="int8") + 300).tolist() == [-112]
  assert (Tensor([1, 2], dtype="uint8") - 3).tolist() == [254, 255]
  assert (Tensor([1]) + 2**40).tolist() == [1]


@pytest.mark.parametrize("name", NAMES)
def test_result_dtypes_of_single_dtype_ops(name):
  t = Tensor([1, 0], dtype=name)
  dt = t.dtype
  fl = dt if dt.is_float else dtypes.float32
  for r in (t / t, t / 2, t.sqrt(), t.exp(), t.log(), t.sin(), t.sigmoid(), t.mean(), t.var(), t.std()):
    assert r.dtype is fl
  acc = dt if dt.is_float or dt.bits == 64 else dtypes.uint32 if dt.is_unsigned else dtypes.int32
  assert t.sum().dtype is acc and t.prod().dtype is dt and t.max().dtype is dt
  assert t.argmax().dtype is dtypes.int32 and t.argmin().dtype is dtypes.int32 and t.any().dtype is dtypes.bool
  assert t.sum(dtype="int8").dtype is dtypes.int8


def test_int_true_division_and_mean_values():
  np.testing.assert_allclose((Tensor([3, 4]) / Tensor([2, 2])).numpy(), [1.5, 2.0])
  assert Tensor([1, 2, 4]).mean().item() == pytest.approx(7 / 3)
  assert Tensor([1, 2, 4]).var().item() == pytest.approx(np.var([1, 2, 4], ddof=1))


# *** dtypes ***

def test_dtype_aliases():
  d = dtypes
  assert d.int is d.int32 and d.long is d.int64 and d.half is d.float16 and d.float is d.float32
  assert d.double is d.float64 and d.uchar is d.uint8 and d.char is d.int8 and d.short is d.int16
  assert d.ushort is d.uint16 and d.uint is d.uint32 and d.ulong is d.uint64
  assert d.default_float is d.float32 and d.default_int is d.int32
  assert set(d.floats) == {d.float16, d.bfloat16, d.float32, d.float64} and set(d.ints) == set(d.uints) | set(d.sints)


def test_dtype_min_max_attributes():
  assert dtypes.int32.max == 2147483647 and dtypes.int32.min == -2147483648
  assert dtypes.uint8.max == 255 and dtypes.uint8.min == 0 and dtypes.int64.max == 2**63 - 1
  assert dtypes.float32.min == -np.inf and dtypes.float16.max == np.inf and dtypes.bool.max == True  # noqa: E712
  # the older method calls still work and give plain numbers
  assert dtypes.int8.max() == 127 and type(dtypes.int8.max()) is int and dtypes.bool.min() is False
  assert dtypes.int32.itemsize == 4 and dtypes.int32.bitsize == 32 and dtypes.float16.itemsize == 2


def test_dtype_helpers():
  assert dtypes.is_float(dtypes.float16) and not dtypes.is_float(dtypes.int32)
  assert dtypes.is_int(dtypes.uint8) and not dtypes.is_int(dtypes.bool) and not dtypes.is_int(dtypes.float32)
  assert dtypes.is_unsigned(dtypes.uint64) and not dtypes.is_unsigned(dtypes.int64)


@pytest.mark.parametrize("name,want", [("int", "int32"), ("float", "float32"), ("half", "float16"), ("long", "int64"),
                                       ("INT", "int32"), ("Double", "float64"), ("uchar", "uint8"), ("short", "int16"),
                                       ("default_float", "float32"), ("int8", "int8")])
def test_dtype_names(name, want):
  assert Tensor([1], dtype=name).dtype.name == want
  assert Tensor([1.5]).cast(name).dtype.name == want
  assert Tensor.zeros(2, dtype=name).dtype.name == want


def test_tensor_dtype_methods():
  x = Tensor([[1.0, 2.0, 3.0]])
  assert x.short().dtype is dtypes.int16 and x.element_size() == 4 and x.nbytes() == 12
  assert x.is_floating_point() and not x.int().is_floating_point()


def test_arange_past_int32_is_int64():
  t = Tensor.arange(2**31, 2**31 + 3)
  assert t.dtype is dtypes.int64 and t.tolist() == [2**31, 2**31 + 1, 2**31 + 2]
  assert Tensor.arange(3).dtype is dtypes.int32


# *** keywords and aliases ***

def test_var_std_correction():
  a = np.array([[1.0, 2.0, 4.0], [3.0, 5.0, 11.0]], np.float32)
  t = Tensor(a)
  for c in (0, 1, 2):
    np.testing.assert_allclose(t.var(1, correction=c).numpy(), a.var(1, ddof=c), rtol=1e-6)
    np.testing.assert_allclose(t.std(correction=c).numpy(), a.std(ddof=c), rtol=1e-6)
    np.testing.assert_allclose(t.var(1, ddof=c).numpy(), a.var(1, ddof=c), rtol=1e-6)   # rulec's older keyword
  np.testing.assert_allclose(t.var().numpy(), a.var(ddof=1), rtol=1e-6)   # default correction=1
  assert np.isinf(t.var(1, correction=3).numpy()).all()   # n - correction <= 0 divides by 0
  v, m = t.var_mean(1)
  np.testing.assert_allclose(v.numpy(), a.var(1, ddof=1), rtol=1e-6); np.testing.assert_allclose(m.numpy(), a.mean(1))
  s, m = t.std_mean(correction=0, keepdim=True)
  np.testing.assert_allclose(s.numpy(), a.std(keepdims=True), rtol=1e-6); assert m.shape == (1, 1)
  with pytest.raises(TypeError, match="correction"): t.var(correction=1, ddof=0)


def test_dim_keywords_and_axis_aliases():
  a = np.arange(6, dtype=np.float32).reshape(2, 3)
  t = Tensor(a)
  np.testing.assert_array_equal(t.cat(t, dim=1).numpy(), np.concatenate([a, a], 1))
  np.testing.assert_array_equal(Tensor.cat(t, t, axis=1).numpy(), np.concatenate([a, a], 1))
  np.testing.assert_array_equal(Tensor.cat([t, t]).numpy(), np.concatenate([a, a], 0))
  np.testing.assert_array_equal(t.stack(t, dim=2).numpy(), np.stack([a, a], 2))
  np.testing.assert_array_equal(Tensor.stack(t, t, axis=-1).numpy(), np.stack([a, a], -1))
  np.testing.assert_array_equal(t.unsqueeze(dim=0).numpy(), a[None])
  np.testing.assert_array_equal(t.unsqueeze(axis=-1).numpy(), a[..., None])
  assert Tensor.ones(1, 3, 1).squeeze(dim=-1).shape == (1, 3) and Tensor.ones(1, 3, 1).squeeze(axis=0).shape == (3, 1)
  for bad in (lambda: t.cat(t, dim=1, axis=1), lambda: t.stack(t, dim=0, axis=1), lambda: t.squeeze(dim=0, axis=0)):
    with pytest.raises(TypeError, match="both"): bad()


def test_transpose_flip_flatten_signatures():
  a = np.arange(24).reshape(2, 3, 4).astype(np.int32)
  t = Tensor(a)
  np.testing.assert_array_equal(t.transpose().numpy(), a.swapaxes(0, 1))   # tinygrad: dim0=1, dim1=0
  np.testing.assert_array_equal(t.transpose(-1, 0).numpy(), a.swapaxes(-1, 0))
  np.testing.assert_array_equal(t.flip(0, 2).numpy(), a[::-1, :, ::-1])
  np.testing.assert_array_equal(t.flip((0, 2)).numpy(), a[::-1, :, ::-1])
  np.testing.assert_array_equal(t.flip(1).numpy(), a[:, ::-1])
  assert t.flatten(1).shape == (2, 12) and t.flatten(0, 1).shape == (6, 4) and Tensor(2.0).flatten().shape == (1,)
  assert t.reshape((4, 6)).shape == t.reshape(4, 6).shape == t.view(4, -1).shape == (4, 6)
  assert t.permute((2, 0, 1)).shape == t.permute(2, 0, 1).shape == (4, 2, 3) and t.expand((2, 2, 3, 4)).shape == (2, 2, 3, 4)


def test_squeeze_of_a_non_1_axis_is_a_no_op():
  t = Tensor.ones(2, 3)
  assert t.squeeze(0).shape == (2, 3) and Tensor.ones(2, 1).squeeze(1).shape == (2,)


@pytest.mark.parametrize("name", ["sum", "prod", "max", "min", "mean", "any", "all"])
def test_0d_reductions_take_axis_0_and_minus_1(name):
  t = Tensor(3.0)
  for ax in (0, -1, (0,), None):
    r = getattr(t, name)(ax)
    assert r.shape == () and r.item() == getattr(np, name)(np.float32(3.0))
  assert getattr(t, name)(0, keepdim=True).shape == ()
  with pytest.raises(AxisError): getattr(t, name)(1)


def test_empty_max_min_give_the_identity():
  np.testing.assert_array_equal(Tensor.zeros(0, 3).max(0).numpy(), [-np.inf] * 3)
  np.testing.assert_array_equal(Tensor.zeros(0, 3).min(0).numpy(), [np.inf] * 3)
  assert Tensor.zeros(2, 0, dtype="int8").max(1).tolist() == [-128, -128]
  assert Tensor.zeros(0, dtype="uint8").min().item() == 255
  assert np.isnan(Tensor.zeros(0, 3).mean(0).numpy()).all()


# *** pad ***

def test_pad_forms():
  a = np.arange(6, dtype=np.int32).reshape(2, 3)
  t = Tensor(a)
  want = np.pad(a, ((0, 1), (1, 2)))
  np.testing.assert_array_equal(t.pad((1, 2, 0, 1)).numpy(), want)         # flat, last axis first
  np.testing.assert_array_equal(t.pad(((0, 1), (1, 2))).numpy(), want)     # one pair per axis
  np.testing.assert_array_equal(t.pad([1, 1]).numpy(), np.pad(a, ((0, 0), (1, 1))))   # fewer flat pads: last axes
  np.testing.assert_array_equal(t.pad(((1, 1), None)).numpy(), np.pad(a, ((1, 1), (0, 0))))
  np.testing.assert_array_equal(t.pad(()).numpy(), a)
  np.testing.assert_array_equal(t.pad(1).numpy(), np.pad(a, 1))            # rulec's extension: every side
  np.testing.assert_array_equal(t.pad((1, -1)).numpy(), np.pad(a, ((0, 0), (1, 0)))[:, :3])   # negative crops
  r = t.pad((1, 1), value=1.5)   # a Python float on an int tensor gives float32 (tinygrad's weak float)
  assert r.dtype is dtypes.float32 and r.tolist()[0] == [1.5, 0.0, 1.0, 2.0, 1.5]
  assert t.pad((1, 1), value=2).dtype is dtypes.int32 and Tensor([True]).pad((1, 1)).dtype is dtypes.bool
  assert Tensor([True]).pad((1, 1), value=2).tolist() == [2, 1, 2]


NP_MODE = {"reflect": "reflect", "replicate": "edge", "circular": "wrap"}


@st.composite
def pad_case(draw):
  shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
  mode = draw(st.sampled_from(sorted(NP_MODE)))
  top = {"reflect": lambda n: n - 1, "replicate": lambda n: 5, "circular": lambda n: n}[mode]
  pairs = tuple((draw(st.integers(0, top(n))), draw(st.integers(0, top(n)))) for n in shape)
  return shape, mode, pairs, draw(st.booleans()), draw(st.sampled_from(["float32", "int32", "float16"]))


@settings(max_examples=40, deadline=None)
@given(pad_case())
def test_pad_modes_match_numpy(case):
  shape, mode, pairs, flat, dt = case
  a = np.arange(int(np.prod(shape))).reshape(shape).astype(dt)
  padding = tuple(p for pair in pairs[::-1] for p in pair) if flat else pairs
  got = Tensor(a).pad(padding, mode=mode)
  np.testing.assert_array_equal(got.numpy(), np.pad(a, pairs, mode=NP_MODE[mode]))
  assert got.dtype.name == dt


def test_pad_mode_with_crops():
  a = np.array([[1.0, 2, 3], [4, 5, 6]], np.float32)
  np.testing.assert_array_equal(Tensor(a).pad((-1, 1), mode="reflect").numpy(), [[2, 3, 2], [5, 6, 5]])
  np.testing.assert_array_equal(Tensor(a).pad((-1, 2), mode="circular").numpy(), [[2, 3, 2, 3], [5, 6, 5, 6]])


# *** exception classes ***

def _raises(cls, *fragments):
  class _Check:
    def __enter__(self):
      self.cm = pytest.raises(cls); self.info = self.cm.__enter__(); return self
    def __exit__(self, *a):
      out = self.cm.__exit__(*a)
      for f in fragments: assert f in str(self.info.value), (f, str(self.info.value))
      return out
  return _Check()


def test_error_classes():
  t = Tensor.ones(2, 3)
  with _raises(RuntimeError, "permutation", "(0, 0)"): t.permute(0, 0)
  with _raises(RuntimeError, "permutation", "(0,)"): t.permute(0)
  with _raises(IndexError, "axis 2"): t.permute(0, 2)
  with _raises(RuntimeError, "at most once", "(0, 0)"): t.flip(0, 0)
  with _raises(RuntimeError, "at most once"): t.flip(0, -2)
  with _raises(IndexError, "axis 2"): t.flip(2)
  with _raises(RuntimeError, "at most once"): t.sum((0, 0))
  with _raises(IndexError, "axis 2"): t.sum(2)
  with _raises(IndexError, "axis 3"): t.unsqueeze(3)
  with _raises(IndexError, "axis 5"): t.squeeze(5)
  with _raises(IndexError, "axis 2"): t.cat(t, dim=2)
  with _raises(ValueError, "(2, 3)", "(4, 2)"): t.reshape(4, 2)
  with _raises(RuntimeError, "-1", "(-1, -1)"): t.reshape(-1, -1)
  with _raises(ValueError, "(2, 3)", "(4, 3)"): t.expand(4, 3)
  with _raises(RuntimeError, "(2, 3)", "(2, 4)"): t.cat(Tensor.ones(2, 4))
  with _raises(RuntimeError, "(2, 3)", "(2, 4)"): t.stack(Tensor.ones(2, 4))
  with _raises(RuntimeError, "min_", "max_"): t.clip(None, None)
  with _raises(RuntimeError, "base needs to be float", "-2"): Tensor([1, 2]) ** -2
  with _raises(AttributeError, "foo"): Tensor([1, 2], dtype="foo")
  with _raises(AttributeError, "int128"): Tensor([1.5]).cast("int128")
  with _raises(TypeError, "foo"): Tensor([1.5]).cast("foo")   # numpy's class too
  with _raises(RuntimeError, "float32"): Tensor([1.5]) << 1
  assert issubclass(ShapeError, ValueError) and issubclass(ShapeError, RuntimeError) and issubclass(AxisError, IndexError)


def test_pad_errors():
  t = Tensor.ones(2, 3)
  with _raises(ValueError, "even", "(1,)"): t.pad((1,))
  with _raises(ValueError, "improper", "(2, 3)"): t.pad((1, 1, 1, 1, 1, 1))
  with _raises(ValueError, "improper", "(2, 3)"): t.pad(((1, 1),))
  with _raises(ValueError, "reflect", "(3, 3)", "3"): t.pad((3, 3), mode="reflect")
  with _raises(ValueError, "circular", "(4, 4)"): t.pad((4, 4), mode="circular")
  with _raises(NotImplementedError, "edge"): t.pad((1, 1), mode="edge")
  with _raises(ValueError, "cropping"): t.pad((1, -4))
