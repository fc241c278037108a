"""rulec.nn.state: state-dict keys as tinygrad names them, load_state_dict (assign into the model's tensors,
strict errors naming keys and shapes), safe_save / safe_load round trips, and files exchanged with
safetensors.numpy in both directions."""
from collections import OrderedDict, namedtuple

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from safetensors.numpy import load_file, save_file

from rulec import Tensor, dtypes, nn
from rulec.nn.state import StateDictError, get_parameters, get_state_dict, load_state_dict, safe_load, safe_save


class Net:
  def __init__(self):
    self.layers = [nn.Linear(3, 4), nn.Linear(4, 2)]
    self.norm = nn.BatchNorm(2)
    self.extra = {"emb": nn.Embedding(5, 3)}
    self.name, self.parent = "net", None


def test_state_dict_keys_as_tinygrad():
  net = Net()
  net.parent = net   # a cycle is walked once
  assert list(get_state_dict(net)) == [
    "layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias", "norm.weight", "norm.bias",
    "norm.num_batches_tracked", "norm.running_mean", "norm.running_var", "extra.emb.weight"]
  assert list(get_state_dict(nn.Linear(2, 2), prefix="fc.")) == ["fc.weight", "fc.bias"]
  P = namedtuple("P", "a b")
  assert list(get_state_dict(P(Tensor([1.0]), OrderedDict(c=Tensor([2.0]))))) == ["a", "b.c"]
  params = get_parameters(net)
  assert len(params) == 10 and params[0] is net.layers[0].weight
  assert get_state_dict(nn.Linear(2, 2, bias=False)).keys() == {"weight"}


def test_load_state_dict_assigns_into_existing_tensors():
  src, dst = Net(), Net()
  w_before = dst.layers[0].weight
  sd = {k: v.numpy() for k, v in get_state_dict(src).items()}
  loaded = load_state_dict(dst, get_state_dict(src), verbose=False)
  assert len(loaded) == 10 and dst.layers[0].weight is w_before
  for k, v in get_state_dict(dst).items(): np.testing.assert_array_equal(v.numpy(), sd[k])
  assert dst.norm.num_batches_tracked.dtype is dtypes.int64
  # numpy values work too, are cast to the model's dtype; () and (1,) pass for each other
  sd2 = {k: (v + 1).astype(np.float64) for k, v in sd.items()}
  sd2["norm.num_batches_tracked"] = np.array([7])
  load_state_dict(dst, sd2, verbose=False)
  np.testing.assert_allclose(dst.layers[1].bias.numpy(), sd["layers.1.bias"] + 1)
  assert dst.layers[1].bias.dtype is dtypes.float32 and dst.norm.num_batches_tracked.item() == 7


def test_load_state_dict_strict_errors():
  net = Net()
  sd = get_state_dict(Net())
  del sd["layers.1.bias"], sd["norm.running_var"]
  sd["head.weight"] = Tensor.zeros(2)
  sd["layers.0.weight"] = Tensor.zeros(3, 4)
  with pytest.raises(StateDictError) as e: load_state_dict(net, sd, verbose=False)
  msg = str(e.value)
  assert "missing keys: ['layers.1.bias', 'norm.running_var']" in msg and "unexpected keys: ['head.weight']" in msg
  assert "layers.0.weight: model (4, 3), state dict (3, 4)" in msg
  assert isinstance(e.value, KeyError) and isinstance(e.value, ValueError)
  before = net.layers[1].weight.numpy()
  # not strict: missing and unexpected keys are skipped, a mis-shaped key still raises
  with pytest.raises(StateDictError, match=r"shape mismatch in layers.0.weight") as e:
    load_state_dict(net, sd, strict=False, verbose=False)
  assert "missing" not in str(e.value)
  sd["layers.0.weight"] = Tensor.ones(4, 3)
  loaded = load_state_dict(net, sd, strict=False, verbose=False)
  assert len(loaded) == 8
  np.testing.assert_array_equal(net.layers[0].weight.numpy(), np.ones((4, 3)))
  np.testing.assert_array_equal(net.layers[1].weight.numpy(), sd["layers.1.weight"].numpy())
  assert not np.array_equal(before, net.layers[1].weight.numpy())
  consumed = {"weight": np.zeros((2, 2)), "bias": np.zeros(2)}
  load_state_dict(nn.Linear(2, 2), consumed, verbose=False, consume=True)
  assert consumed == {}


DTYPES = [np.float32, np.float16, np.float64, np.int8, np.uint8, np.int16, np.int32, np.int64, np.uint32, np.bool_]


@settings(max_examples=8)
@given(dt=st.sampled_from(DTYPES), shape=st.lists(st.integers(0, 3), max_size=3))
def test_safe_save_load_round_trip(tmp_path_factory, dt, shape):
  a = (np.random.default_rng(0).standard_normal(shape) * 50).astype(dt)
  fn = tmp_path_factory.mktemp("st") / "t.safetensors"
  safe_save({"a": Tensor(a), "b.c": Tensor(a) * 2 if dt is not np.bool_ else Tensor(a)}, fn)
  back = safe_load(fn)
  assert set(back) == {"a", "b.c"}   # (safetensors lays tensors out in its own order)
  assert back["a"].shape == tuple(shape) and back["a"].numpy().dtype == a.dtype
  np.testing.assert_array_equal(back["a"].numpy(), a)


def test_model_round_trip_through_a_file(tmp_path):
  src, dst = Net(), Net()
  with Tensor.train(): src.norm(Tensor(np.random.default_rng(0).standard_normal((4, 2)).astype(np.float32))).realize()
  src.norm.running_mean.realize()
  fn = tmp_path / "net.safetensors"
  safe_save(get_state_dict(src), fn, metadata={"step": "3"})
  load_state_dict(dst, safe_load(fn), verbose=False)
  for (k, a), b in zip(get_state_dict(src).items(), get_state_dict(dst).values()):
    np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=k)
  assert dst.norm.num_batches_tracked.item() == 1


def test_files_exchange_with_safetensors_numpy(tmp_path):
  # rulec -> safetensors.numpy, with metadata
  t = {"w": Tensor(np.arange(6, dtype=np.float32).reshape(2, 3)), "i": Tensor([1, 2, 3], dtype=dtypes.int64)}
  safe_save(t, tmp_path / "a.safetensors", metadata={"who": "rulec"})
  got = load_file(tmp_path / "a.safetensors")
  np.testing.assert_array_equal(got["w"], np.arange(6, dtype=np.float32).reshape(2, 3))
  assert got["i"].dtype == np.int64 and got["i"].tolist() == [1, 2, 3]
  from safetensors import safe_open
  with safe_open(tmp_path / "a.safetensors", "np") as f: assert f.metadata() == {"who": "rulec"}
  # safetensors.numpy -> rulec
  ref = {"x": np.linspace(0, 1, 5, dtype=np.float16), "y": np.eye(2, dtype=np.float64)}
  save_file(ref, tmp_path / "b.safetensors")
  back = safe_load(tmp_path / "b.safetensors")
  assert back["x"].dtype is dtypes.float16 and back["y"].dtype is dtypes.float64
  for k in ref: np.testing.assert_array_equal(back[k].numpy(), ref[k])


def test_safe_errors(tmp_path):
  with pytest.raises(TypeError, match="'a' is a ndarray, not a Tensor"): safe_save({"a": np.zeros(2)}, tmp_path / "x")
  with pytest.raises(TypeError, match=r"metadata must map str to str.*\['step'\]"):
    safe_save({"a": Tensor([1.0])}, tmp_path / "x", metadata={"step": 3})
  (tmp_path / "bad").write_bytes(b"not a safetensors file")
  with pytest.raises(ValueError, match="not a safetensors file"): safe_load(tmp_path / "bad")
  with pytest.raises(FileNotFoundError): safe_load(tmp_path / "missing.safetensors")
