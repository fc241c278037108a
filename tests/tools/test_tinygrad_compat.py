"""What tinygrad model code imports besides Tensor (issue #33): getenv, Context and its flags, GlobalCounters counted
from rulec's kernel runs, Device, @function, and `import tinygrad` running rulec through rulec.tinygrad_alias."""
import os
import subprocess
import sys
import textwrap

import ml_dtypes  # noqa: F401  (registers np.dtype("bfloat16"))
import numpy as np
import pytest

import rulec
from rulec import Context, Device, GlobalCounters, Tensor, TinyJit, dtypes, function, getenv
from rulec import helpers
from rulec.engine.sched import driver
from tests.helpers import REPO, subprocess_env


def test_getenv_as_tinygrad(monkeypatch):
  monkeypatch.setenv("RULEC_TEST_BS", "64")
  getenv.cache_clear()
  assert getenv("RULEC_TEST_BS") == 64 and getenv("RULEC_TEST_BS", 32) == 64 and getenv("RULEC_TEST_BS", "x") == "64"
  assert getenv("RULEC_TEST_UNSET_NAME") == 0 and getenv("RULEC_TEST_UNSET_NAME", 1.5) == 1.5
  monkeypatch.setenv("RULEC_TEST_BS", "65")
  assert getenv("RULEC_TEST_BS") == 64   # cached, as tinygrad's
  getenv.cache_clear()
  assert getenv("RULEC_TEST_BS") == 65


def test_context_sets_rulec_settings_and_restores_them(monkeypatch):
  for k in ("RULEC_DEBUG", "RULEC_SEARCH", "RULEC_JIT", "RULEC_RING"): monkeypatch.delenv(k, raising=False)
  assert helpers.DEBUG.value == 0 and not helpers.DEBUG and helpers.JIT == 1
  with Context(DEBUG=2, BEAM=3, JIT=0, RING=2):
    assert os.environ["RULEC_DEBUG"] == "2" and driver.DEBUG == 2 and helpers.DEBUG >= 2
    assert os.environ["RULEC_SEARCH"] == "3" and os.environ["RULEC_JIT"] == "0" and os.environ["RULEC_RING"] == "2"
    with Context(DEBUG=0):
      assert driver.DEBUG == 0 and helpers.DEBUG == 0
    assert driver.DEBUG == 2
  for k in ("RULEC_DEBUG", "RULEC_SEARCH", "RULEC_JIT", "RULEC_RING"): assert k not in os.environ   # unset again
  assert driver.DEBUG == 0

  @Context(DEBUG=1)
  def inside(): return helpers.DEBUG.value
  assert inside() == 1 and helpers.DEBUG.value == 0


def test_context_training_device_and_jit():
  assert not Tensor.training
  with Context(TRAINING=1):
    assert Tensor.training and helpers.TRAINING == 1
    w = Tensor([1.0, 2.0])
    opt = rulec.nn.optim.SGD([w], lr=0.5)
    (w * w).sum().backward()
    opt.step()   # (the optimizer needs training mode: Context(TRAINING=1) is tinygrad's way to give it)
  assert not Tensor.training
  np.testing.assert_allclose(w.numpy(), [0.0, 0.0])
  with Context(DEV="numpy"):
    assert Device.DEFAULT == "NUMPY" and Tensor([1.0]).device == "NUMPY"
  assert Device.DEFAULT == "CPU" and Tensor([1.0]).device == "CPU"
  calls = []
  @TinyJit
  def f(x):
    calls.append(1)
    return (x * 2).realize()
  with Context(JIT=0):   # the function runs every time, as tinygrad's JIT=0
    for i in range(4): np.testing.assert_allclose(f(Tensor([float(i)])).numpy(), [2.0 * i])
  assert len(calls) == 4


def test_context_flags_accepted_refused_unknown(monkeypatch):
  monkeypatch.delenv("RULEC_DEBUG", raising=False)
  with Context(NOOPT=1, WINO=1, TC=0, SPLIT_REDUCEOP=0, VIZ=0):
    assert helpers.NOOPT == 1 and helpers.ContextVar._cache["WINO"].value == 1
    np.testing.assert_allclose((Tensor([1.0, 2.0]) * 3).numpy(), [3.0, 6.0])
  assert helpers.NOOPT == 0
  with Context(DEFAULT_FLOAT="float32", IMAGE=0): pass   # their defaults are fine
  with pytest.raises(NotImplementedError, match="IMAGE=2: image"):
    with Context(DEBUG=3, IMAGE=2): pass
  assert "RULEC_DEBUG" not in os.environ and driver.DEBUG == 0   # nothing left changed by the refused one
  with pytest.raises(NotImplementedError, match="DEFAULT_FLOAT"):
    with Context(DEFAULT_FLOAT="half"): pass
  with pytest.raises(KeyError, match="no flag named NOT_A_FLAG"):
    with Context(NOT_A_FLAG=1): pass
  with pytest.raises(ValueError, match="unknown device"):
    with Context(DEV="TPU"): pass
  mine = helpers.ContextVar("RULEC_TEST_MY_FLAG", 5)   # a program's own flag, as in tinygrad
  with Context(RULEC_TEST_MY_FLAG=7): assert mine == 7 and mine > 6 and mine.value == 7
  assert mine.value == 5
  with pytest.raises(RuntimeError, match="recreate"): helpers.ContextVar("RULEC_TEST_MY_FLAG", 1)


def test_global_counters_count_kernel_runs():
  a, b = Tensor(np.random.rand(4, 8).astype(np.float32)), Tensor(np.random.rand(8, 3).astype(np.float32))
  a.realize(); b.realize()
  GlobalCounters.reset()
  assert (GlobalCounters.kernel_count, GlobalCounters.global_ops, GlobalCounters.global_mem) == (0, 0, 0)
  (a @ b).realize()
  assert GlobalCounters.kernel_count == 1
  assert GlobalCounters.global_ops == 2 * 4 * 8 * 3          # a multiply and an add per term
  assert GlobalCounters.global_mem == 4 * (4 * 8 + 8 * 3 + 4 * 3)   # the three buffers, once each
  assert GlobalCounters.time_sum_s > 0
  runs = rulec.engine.realize.COUNTERS["run"]
  GlobalCounters.reset()
  @TinyJit
  def step(x): return ((x + 1) * 2).sum(0).realize()
  for _ in range(5): step(Tensor(np.ones((16, 16), np.float32)))
  assert GlobalCounters.kernel_count == rulec.engine.realize.COUNTERS["run"] - runs   # replays count too
  GlobalCounters.reset()
  step(Tensor(np.ones((16, 16), np.float32)))
  assert GlobalCounters.kernel_count == 1 and GlobalCounters.global_ops == 3 * 256
  before = GlobalCounters.mem_used
  big = (Tensor.ones(1 << 20) * 2).contiguous().realize()
  assert GlobalCounters.mem_used >= before + 4 * (1 << 20) and GlobalCounters.mem_used_per_device["CPU"] >= 4 * (1 << 20)
  GlobalCounters.reset()
  assert GlobalCounters.mem_used >= 4 * (1 << 20)   # (reset leaves it, as tinygrad's)
  del big


def test_device():
  assert Device.DEFAULT == "CPU" and Device.canonicalize("cpu:0") == "CPU" and Device.canonicalize(None) == "CPU"
  cpu = Device["cpu"]
  assert cpu is Device["CPU"] and cpu.device == "CPU" and Device.default is cpu
  got = cpu.renderer.supported_dtypes()
  assert {dtypes.float32, dtypes.float16, dtypes.float64, dtypes.int8, dtypes.bool, dtypes.uint64} <= got
  assert dtypes.bfloat16 in got
  cpu.synchronize()
  assert "CPU" in list(Device.get_available_devices())
  with pytest.raises(ValueError, match="unknown device"): Device["TPU"]
  with pytest.raises(AttributeError, match="Context"): Device.DEFAULT = "CL"


def test_function_inlines_and_checks_its_result():
  @function
  def f(x, y): return (x * y + 1, x - y)
  a, b = f(Tensor([1.0, 2.0]), Tensor([3.0, 4.0]))
  np.testing.assert_allclose(a.numpy(), [4.0, 9.0]) and np.testing.assert_allclose(b.numpy(), [-2.0, -2.0])

  class M:
    k = 3.0
    @function(precompile=True)
    def __call__(self, x): return x * self.k
  np.testing.assert_allclose(M()(Tensor([2.0])).numpy(), [6.0])
  w = Tensor([2.0])
  f(w, Tensor([5.0]))[0].sum().backward()
  np.testing.assert_allclose(w.grad.numpy(), [5.0])
  with pytest.raises(RuntimeError, match="not supported"): function(lambda x: 3)(Tensor([1.0]))
  with pytest.raises(NotImplementedError, match="grad_fxn"): function(grad_fxn=lambda *a: a)
  assert int(rulec.Variable("start_pos", 1, 10).bind(4) + 1) == 5   # (tests/frontend/test_variables.py has the rest)
  with pytest.raises(NotImplementedError, match="network"): helpers.fetch("https://example.com/w.pt")


def test_small_helpers():
  assert helpers.prod([2, 3, 4]) == 24 and helpers.flatten([[1], [2, 3]]) == [1, 2, 3]
  assert helpers.dedup([3, 1, 3, 2]) == [3, 1, 2] and helpers.argfix((1, 2)) == (1, 2) and helpers.argfix(1, 2) == (1, 2)
  assert helpers.round_up(5, 4) == 8 and helpers.partition([1, 2, 3], lambda x: x > 1) == ([2, 3], [1])
  assert helpers.ansilen(helpers.colored("hi", "red")) == 2 and helpers.colored("x", None) == "x"
  class A: pass
  a = A(); a.layers = [{"w": 5}]
  assert helpers.get_child(a, "layers.0.w") == 5


MODEL_FILE = '''
import numpy as np
import rulec.tinygrad_alias
rulec.tinygrad_alias.install()
# --- as a tinygrad model file imports (gpt2.py, llama.py, beautiful_mnist.py, stable_diffusion.py) ---
from tinygrad import Tensor, TinyJit, Device, GlobalCounters, Variable, dtypes, Context, getenv, nn, function
from tinygrad.helpers import Timing, DEBUG, JIT, fetch, colored, trange, tqdm, flatten, get_child, prod, Profiling
from tinygrad.nn.state import torch_load, safe_load, safe_save, load_state_dict, get_state_dict, get_parameters
from tinygrad.nn import Embedding, Linear, LayerNorm
from tinygrad.nn.optim import Adam
from tinygrad.llm.gguf import gguf_load
from tinygrad.tensor import Tensor as T2, cast
from tinygrad.dtype import dtypes as d2
from tinygrad.device import Device as D2
from tinygrad.engine.jit import TinyJit as J2
from tinygrad.uop.ops import UOp
import tinygrad, tinygrad.nn.state
assert T2 is Tensor and d2 is dtypes and D2 is Device and J2 is TinyJit and tinygrad.nn.state.torch_load is torch_load
import rulec
assert Tensor is rulec.Tensor and nn is rulec.nn

class Net:
  def __init__(self):
    self.emb = Embedding(10, 8)
    self.ln = LayerNorm(8)
    self.out = Linear(8, 10)
    self.table = Tensor.ones(1, 8).is_param_(False)
  def __call__(self, x): return self.out(self.ln(self.emb(x) * self.table)).reshape(None, None, 10)

Tensor.manual_seed(1)
net = Net()
opt = Adam(get_parameters(net), lr=0.01)
@TinyJit
def step(x, y):
  opt.zero_grad()
  loss = net(x).sparse_categorical_crossentropy(y).backward()
  opt.step()
  return loss.realize()
x, y = Tensor([[1, 2, 3]]), Tensor([[2, 3, 4]])
GlobalCounters.reset()
with Context(TRAINING=1):
  losses = [step(x, y).item() for _ in range(6)]
assert losses[-1] < losses[0], losses
assert GlobalCounters.kernel_count > 0 and int(DEBUG.value) == 0
print("ok", len(losses), Device.DEFAULT, Device[Device.DEFAULT].renderer.supported_dtypes() >= {dtypes.float32})
from tinygrad.nn.datasets import mnist
import tinygrad.function
assert callable(function) and tinygrad.function is function   # the decorator, as tinygrad's __init__ leaves it
rulec.tinygrad_alias.uninstall()
import sys
assert "tinygrad" not in sys.modules
'''


def test_tinygrad_alias_runs_model_code_unchanged():
  p = subprocess.run([sys.executable, "-c", textwrap.dedent(MODEL_FILE)], capture_output=True, text=True,
                     env=subprocess_env(), cwd=str(REPO), timeout=300)
  assert p.returncode == 0, p.stdout + p.stderr
  assert "ok 6 CPU True" in p.stdout


def test_tinygrad_alias_refuses_to_shadow_the_real_one():
  code = "import tinygrad, rulec.tinygrad_alias as a\ntry: a.install()\nexcept RuntimeError as e: print('refused:', e)"
  p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=subprocess_env(), cwd="/", timeout=120)
  if "No module named 'tinygrad'" in p.stderr: pytest.skip("tinygrad is not installed")
  assert "refused: tinygrad itself is imported already" in p.stdout, p.stdout + p.stderr


def test_datasets_read_local_files(tmp_path):
  """tinygrad.nn.datasets (rulec.nn.datasets): MNIST's four IDX files read from a folder; without one it raises as
  fetch does (no network)."""
  import gzip
  from rulec.nn import datasets
  rng = np.random.default_rng(0)
  imgs = {"train": rng.integers(0, 256, (5, 28, 28), dtype=np.uint8), "t10k": rng.integers(0, 256, (3, 28, 28), dtype=np.uint8)}
  labels = {"train": np.array([1, 2, 3, 4, 5], np.uint8), "t10k": np.array([7, 8, 9], np.uint8)}
  for part in ("train", "t10k"):
    n = len(labels[part])
    (tmp_path / f"{part}-images-idx3-ubyte.gz").write_bytes(gzip.compress(
      np.array([0x803, n, 28, 28], ">u4").tobytes() + imgs[part].tobytes()))
    (tmp_path / f"{part}-labels-idx1-ubyte.gz").write_bytes(
      gzip.compress(np.array([0x801, n], ">u4").tobytes() + labels[part].tobytes()))
  X_train, Y_train, X_test, Y_test = datasets.mnist(path=tmp_path)
  assert X_train.shape == (5, 1, 28, 28) and X_train.dtype == dtypes.uint8 and X_test.shape == (3, 1, 28, 28)
  np.testing.assert_array_equal(X_train.numpy()[:, 0], imgs["train"])
  np.testing.assert_array_equal(Y_test.numpy(), labels["t10k"])
  with pytest.raises(NotImplementedError, match="network"): datasets.mnist()
  (tmp_path / "train-labels-idx1-ubyte.gz").unlink()
  with pytest.raises(FileNotFoundError, match="train-labels"): datasets.mnist(path=tmp_path)
