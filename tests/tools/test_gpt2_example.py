"""examples/gpt2.py: greedy and sampled tokens against a numpy GPT-2, kernels built once for a whole generation,
a generation loop in constant memory, weights read from Hugging Face's two file formats (written here), and the
byte-level fallback tokenizer.

The speed run is the example's own job (and bench/generate.py's): python examples/gpt2.py --random
"""
from __future__ import annotations

import gc
import math
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpt2  # noqa: E402
from rulec import Tensor  # noqa: E402
from rulec.engine.ir.ops import Ops  # noqa: E402
from rulec.engine.ir.uop import UOp  # noqa: E402
from rulec.engine.realize import COUNTERS  # noqa: E402
from rulec.runtime.devices import default_device  # noqa: E402

LAYERS, HEADS, DIM, CONTEXT = 2, 2, 16, 24


def tiny(seed: int = 0, std: float = 0.3) -> tuple[gpt2.GPT2, dict]:
  """A small GPT-2 (the full vocabulary, a short context) with weights drawn larger than GPT-2's, so that greedy
  choices are clear."""
  model = gpt2.GPT2(LAYERS, HEADS, DIM, CONTEXT)
  w = gpt2.random_weights(model, seed)
  rng = np.random.default_rng(seed + 1)
  w = {k: (v * (std / 0.02) if v.std() > 0 and "ln_" not in k else v + rng.standard_normal(v.shape).astype(np.float32) * 0.1)
       for k, v in w.items()}
  gpt2.load(model, w)
  return model, w


def np_logits(w: dict, tokens: list[int]) -> np.ndarray:
  """GPT-2's forward over the whole sequence in float64 numpy (causal attention, no cache): logits of the last."""
  w = {k: v.astype(np.float64) for k, v in w.items()}
  def ln(x, p): return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * w[p + ".weight"] + w[p + ".bias"]
  def lin(x, p): return x @ w[p + ".weight"].T + w[p + ".bias"]
  def gelu(x): return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
  t = len(tokens)
  x = w["wte.weight"][tokens] + w["wpe.weight"][:t]
  hd = DIM // HEADS
  for i in range(LAYERS):
    p = f"h.{i}."
    q, k, v = np.split(lin(ln(x, p + "ln_1"), p + "c_attn"), 3, axis=-1)
    q, k, v = (a.reshape(t, HEADS, hd).transpose(1, 0, 2) for a in (q, k, v))
    s = q @ k.transpose(0, 2, 1) / math.sqrt(hd) + np.triu(np.full((t, t), -np.inf), 1)
    s = np.exp(s - s.max(-1, keepdims=True))
    a = ((s / s.sum(-1, keepdims=True)) @ v).transpose(1, 0, 2).reshape(t, DIM)
    x = x + lin(a, p + "attn_proj")
    x = x + lin(gelu(lin(ln(x, p + "ln_2"), p + "c_fc")), p + "mlp_proj")
  return ln(x, "ln_f")[-1] @ w["wte.weight"].T


def builds() -> int: return gpt2.kernels_built(default_device())


def test_greedy_tokens_match_numpy_and_kernels_are_built_once():
  model, w = tiny()
  prompt = [464, 3290, 11]
  first = builds()
  tokens, times = model.generate(prompt, 6)
  assert len(times) == len(prompt) + 6 - 1
  expect = list(prompt)
  for _ in range(6): expect.append(int(np.argmax(np_logits(w, expect))))
  assert tokens == expect
  # the first step runs the function, the second captures it: from then on every step replays, building nothing
  # and running as many kernels as the capture did
  built, ran = builds(), COUNTERS["run"]
  more, _ = model.generate([17, 4], 12)
  assert builds() == built, "a replayed step built kernels"
  per_step = (COUNTERS["run"] - ran) / (2 + 12 - 1)
  assert per_step == int(per_step) and per_step <= 24 * LAYERS   # (2 layers: 37 on CPU, 43 on CL)
  if default_device() != "NUMPY": assert built > first
  expect = [17, 4]
  for _ in range(12): expect.append(int(np.argmax(np_logits(w, expect))))
  assert more == expect   # (the cache of the first generation is written over position by position)


def test_sampling_is_softmax_with_gumbel_noise():
  model, w = tiny(seed=3)
  tokens, _ = model.generate([5, 6], 4, temperature=0.7, seed=11)
  rng, expect = np.random.default_rng(11), [5, 6]
  for pos in range(len(expect) + 4 - 1):
    noise = rng.gumbel(size=(1, gpt2.VOCAB)).astype(np.float32)[0]
    if pos + 1 >= 2: expect.append(int(np.argmax(np_logits(w, expect) / 0.7 + noise)))
  assert tokens == expect


def test_a_1000_token_generation_runs_in_constant_memory():
  """The issue's loop: 1,000 tokens, the resident memory and the buffers alive the same after the 100th as after
  the last (a replayed step allocates nothing; nothing a step makes outlives it)."""
  model = gpt2.GPT2(LAYERS, HEADS, DIM, gpt2.MAX_CONTEXT)
  gpt2.load(model, gpt2.random_weights(model, 0))
  def live() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is UOp and o.op is Ops.BUFFER)
  def rss_mib() -> float:
    with open("/proc/self/statm") as f: return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
  at: dict[int, tuple[int, float]] = {}
  def note(_token):
    n = len(at.setdefault("n", []))
    at["n"].append(1)
    if n + 1 in (100, 1000): at[n + 1] = (live(), rss_mib())
  tokens, _ = model.generate([1], 1000, on_token=note)
  assert len(tokens) == 1001
  (bufs100, rss100), (bufs1000, rss1000) = at[100], at[1000]
  assert bufs1000 == bufs100
  assert rss1000 - rss100 < 4.0, f"resident memory grew {rss1000 - rss100:.1f} MiB over 900 tokens"


def test_context_limit_and_empty_prompt():
  model, _ = tiny()
  with pytest.raises(ValueError, match="more than the context"): model.generate([1] * 20, 5)
  with pytest.raises(ValueError, match="at least one token"): model.generate([], 3)


def hf_names(w: dict) -> dict[str, np.ndarray]:
  """The weights as Hugging Face's GPT-2 names and lays them out (Conv1D weights are (in, out))."""
  out = {}
  for k, v in w.items():
    for new, old in gpt2._RENAME.items(): k = k.replace(old + ".", new + ".")
    out[k] = v.T.copy() if k.endswith(gpt2._CONV1D) else v
  return out


def test_weights_from_safetensors(tmp_path):
  from rulec.nn.state import safe_save
  _, w = tiny()
  hf = hf_names(w)
  assert "h.1.attn.c_attn.weight" in hf and hf["h.1.attn.c_attn.weight"].shape == (DIM, 3 * DIM)
  # an older export: every name under "transformer.", the attention's mask buffers, the tied output layer
  saved = {"transformer." + k: Tensor(v) for k, v in hf.items()}
  saved["transformer.h.0.attn.bias"] = Tensor(np.tril(np.ones((1, 1, 4, 4), np.float32)))
  saved["lm_head.weight"] = Tensor(hf["wte.weight"])
  safe_save(saved, str(tmp_path / "model.safetensors"))
  got = gpt2.read_weights(str(tmp_path / "model.safetensors"))
  assert sorted(got) == sorted(w)
  for k in w: np.testing.assert_array_equal(got[k], w[k])
  model = gpt2.model_for(got, CONTEXT, HEADS)
  assert (len(model.h), model.dim) == (LAYERS, DIM)


def test_weights_from_pytorch_bin(tmp_path):
  import test_state_loaders as tl
  _, w = tiny()
  hf = hf_names(w)
  entries, storages = [], {}
  for i, (k, v) in enumerate(sorted(hf.items())):
    strides = tuple(int(np.prod(v.shape[j + 1:])) for j in range(v.ndim))
    entries.append((k, "FloatStorage", str(i), v.size, 0, v.shape, strides))
    storages[str(i)] = np.ascontiguousarray(v, "<f4").tobytes()
  path = tmp_path / "pytorch_model.bin"
  tl.write_zip(path, tl.state_dict_pickle(entries), storages)
  got = gpt2.read_weights(str(path))
  for k in w: np.testing.assert_array_equal(got[k], w[k])


def test_byte_tokens_are_gpt2s():
  c = gpt2.ByteCodec()
  # GPT-2's vocabulary: "!" is 0, "A" 32, a space ("Ġ") 220, a newline ("Ċ") 198, byte 0 ("Ā") 188
  assert c.encode("!A \n\x00") == [0, 32, 220, 198, 188]
  assert sorted(c.ids) == list(range(256))
  assert c.decode([32, 50256, 33]) == "A<50256>B"


@settings(max_examples=50, deadline=None)
@given(st.text())
def test_byte_codec_round_trip(text):
  c = gpt2.ByteCodec()
  assert c.decode(c.encode(text)) == text


def test_command_line(tmp_path, capsys, monkeypatch):
  # (a width-16 "size" so the run is small; the command line is the example's own)
  monkeypatch.setitem(gpt2.SIZES, "gpt2", (1, HEADS, DIM))
  assert gpt2.main(["--random", "--count", "3", "--context", "64", "--prompt", "Hi!"]) == 0
  out = capsys.readouterr()
  assert out.out.startswith("Hi!") and "3 tokens" in out.err and "tokens/s" in out.err and "1 layers, width 16" in out.err
  from rulec.nn.state import safe_save
  _, w = tiny()
  safe_save({k: Tensor(v) for k, v in hf_names(w).items()}, str(tmp_path / "m.safetensors"))
  assert gpt2.main(["--model", str(tmp_path / "m.safetensors"), "--heads", str(HEADS), "--count", "2",
                    "--context", "64", "--quiet"]) == 0
  assert "2 tokens" in capsys.readouterr().err
  monkeypatch.undo()   # (GPT-2's own sizes again: no size has width 16)
  with pytest.raises(SystemExit, match="--heads"): gpt2.main(["--model", str(tmp_path / "m.safetensors")])
