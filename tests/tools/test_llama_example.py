"""examples/llama.py on a GGUF file this test writes: greedy tokens against a numpy LLaMA (grouped-query attention,
rotary pairs, SwiGLU, an F16 embedding and Q8_0 projections), kernels built once per generation, the tied output
layer, the SentencePiece tokenizer from the file's vocabulary, and the command line."""
from __future__ import annotations

import math
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import llama  # noqa: E402
import test_state_loaders as tl  # noqa: E402
from rulec.engine.realize import COUNTERS  # noqa: E402
from rulec.runtime.devices import default_device  # noqa: E402
from textgen import kernels_built  # noqa: E402

DIM, HEADS, KV_HEADS, HIDDEN, LAYERS, CONTEXT = 32, 4, 2, 64, 2, 32
SP = "\u2581"
MERGES = ["ll", "he", SP + "he", "llo", SP + "hello", "or", SP + "w", SP + "wor", "ld", SP + "world"]
PIECES = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + list("helowrd") + [SP] + MERGES
SCORES = [0.0] * (3 + 256) + [-20.0] * 8 + [-1.0 - i for i in range(len(MERGES))]
VOCAB = len(PIECES)


def q8_0(x: np.ndarray) -> bytes:
  """ggml's Q8_0: blocks of 32, a float16 scale then 32 int8s."""
  blocks = x.reshape(-1, 32)
  d = (np.abs(blocks).max(1) / 127).astype(np.float16)
  q = np.round(blocks / np.where(d == 0, 1, d.astype(np.float32))[:, None]).astype(np.int8)
  return b"".join(struct.pack("<e", s) + row.tobytes() for s, row in zip(d, q))


def write_model(path, tied: bool = False, tokenizer: str = "llama", seed: int = 0) -> None:
  rng = np.random.default_rng(seed)
  hd = DIM // HEADS
  def w(*shape, s=0.3): return (rng.standard_normal(shape) * s).astype(np.float32)
  tensors = [("token_embd.weight", (DIM, VOCAB), 1, w(VOCAB, DIM, s=1.0).astype(np.float16).tobytes()),
             ("output_norm.weight", (DIM,), 0, (1 + w(DIM, s=0.1)).tobytes())]
  if not tied: tensors.append(("output.weight", (DIM, VOCAB), 0, w(VOCAB, DIM).tobytes()))
  for i in range(LAYERS):
    p = f"blk.{i}."
    tensors += [(p + "attn_norm.weight", (DIM,), 0, (1 + w(DIM, s=0.1)).tobytes()),
                (p + "ffn_norm.weight", (DIM,), 0, (1 + w(DIM, s=0.1)).tobytes()),
                (p + "attn_q.weight", (DIM, HEADS * hd), 8, q8_0(w(HEADS * hd, DIM))),
                (p + "attn_k.weight", (DIM, KV_HEADS * hd), 8, q8_0(w(KV_HEADS * hd, DIM))),
                (p + "attn_v.weight", (DIM, KV_HEADS * hd), 0, w(KV_HEADS * hd, DIM).tobytes()),
                (p + "attn_output.weight", (HEADS * hd, DIM), 1, w(DIM, HEADS * hd).astype(np.float16).tobytes()),
                (p + "ffn_gate.weight", (DIM, HIDDEN), 8, q8_0(w(HIDDEN, DIM))),
                (p + "ffn_up.weight", (DIM, HIDDEN), 0, w(HIDDEN, DIM).tobytes()),
                (p + "ffn_down.weight", (HIDDEN, DIM), 8, q8_0(w(DIM, HIDDEN)))]
  kv = [("general.architecture", 8, "llama"), ("llama.block_count", 4, LAYERS), ("llama.embedding_length", 4, DIM),
        ("llama.attention.head_count", 4, HEADS), ("llama.attention.head_count_kv", 4, KV_HEADS),
        ("llama.feed_forward_length", 4, HIDDEN), ("llama.attention.layer_norm_rms_epsilon", 6, 1e-5),
        ("llama.rope.freq_base", 6, 10000.0), ("llama.context_length", 4, CONTEXT),
        ("tokenizer.ggml.model", 8, tokenizer), ("tokenizer.ggml.tokens", 9, (8, PIECES)),
        ("tokenizer.ggml.scores", 9, (6, SCORES)), ("tokenizer.ggml.bos_token_id", 4, 1)]
  tl.write_gguf(path, kv, tensors)


def np_next(w: dict, tokens: list[int]) -> int:
  """The greedy next token: LLaMA's forward over the whole sequence in float64 numpy."""
  w = {k: v.astype(np.float64) for k, v in w.items()}
  out = w.get("output.weight", w["token_embd.weight"])
  hd, t, rep = DIM // HEADS, len(tokens), HEADS // KV_HEADS
  def rms(x, g): return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5) * g
  ang = np.arange(t)[:, None] * (1.0 / 10000.0 ** (np.arange(0, hd, 2) / hd))[None]
  cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
  def rope(x):   # (t, heads, hd): pairs (2i, 2i+1)
    re, im = x[..., 0::2], x[..., 1::2]
    y = np.empty_like(x)
    y[..., 0::2], y[..., 1::2] = re * cos - im * sin, re * sin + im * cos
    return y
  x = w["token_embd.weight"][tokens]
  for i in range(LAYERS):
    p = f"blk.{i}."
    h = rms(x, w[p + "attn_norm.weight"])
    q = rope((h @ w[p + "attn_q.weight"].T).reshape(t, HEADS, hd))
    k = np.repeat(rope((h @ w[p + "attn_k.weight"].T).reshape(t, KV_HEADS, hd)), rep, axis=1)
    v = np.repeat((h @ w[p + "attn_v.weight"].T).reshape(t, KV_HEADS, hd), rep, axis=1)
    s = np.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd) + np.triu(np.full((t, t), -np.inf), 1)
    s = np.exp(s - s.max(-1, keepdims=True))
    a = np.einsum("hqk,khd->qhd", s / s.sum(-1, keepdims=True), v).reshape(t, DIM)
    x = x + a @ w[p + "attn_output.weight"].T
    h = rms(x, w[p + "ffn_norm.weight"])
    g = h @ w[p + "ffn_gate.weight"].T
    x = x + ((g / (1 + np.exp(-g))) * (h @ w[p + "ffn_up.weight"].T)) @ w[p + "ffn_down.weight"].T
  return int(np.argmax(rms(x, w["output_norm.weight"])[-1] @ out.T))


def weights_of(path) -> dict:
  from rulec.nn.state import gguf_load
  return {k: v.numpy().astype(np.float32) for k, v in gguf_load(str(path))[1].items()}


@pytest.mark.parametrize("tied", [False, True])
def test_greedy_tokens_match_numpy_and_kernels_are_built_once(tmp_path, tied):
  path = tmp_path / "tiny.gguf"
  write_model(path, tied=tied)
  model, _ = llama.load(str(path))
  c = model.c
  assert (c.layers, c.dim, c.heads, c.kv_heads, c.hidden, c.vocab) == (LAYERS, DIM, HEADS, KV_HEADS, HIDDEN, VOCAB)
  w = weights_of(path)
  prompt = [1, 270, 275, 5]
  tokens, _ = model.generate(prompt, 6)
  expect = list(prompt)
  for _ in range(6): expect.append(np_next(w, expect))
  assert tokens == expect
  built = kernels_built(default_device())
  ran = COUNTERS["run"]
  again, _ = model.generate([1, 30], 10)
  assert kernels_built(default_device()) == built, "a replayed step built kernels"
  assert (COUNTERS["run"] - ran) % 11 == 0
  expect = [1, 30]
  for _ in range(10): expect.append(np_next(w, expect))
  assert again == expect
  with pytest.raises(ValueError, match="not a token"): model.generate([1, VOCAB], 2)


def test_sentencepiece_merges_by_score_and_falls_back_to_bytes(tmp_path):
  path = tmp_path / "tiny.gguf"
  write_model(path)
  from rulec.nn.state import gguf_load
  sp = llama.SentencePiece(gguf_load(str(path))[0])
  ids = sp.encode("hello world")
  assert [PIECES[i] for i in ids] == ["<s>", SP + "hello", SP + "world"]
  ids = sp.encode("hé")   # no pair merges; é has no piece: its two UTF-8 bytes
  assert [PIECES[i] for i in ids] == ["<s>", SP, "h", "<0xC3>", "<0xA9>"]
  assert sp.decode(sp.encode("hello wörld")) == " hello wörld"
  assert sp.decode([1, 10 ** 6]) == "<1000000>"


def test_command_line_and_other_tokenizers(tmp_path, capsys):
  path = tmp_path / "tiny.gguf"
  write_model(path)
  assert llama.main([str(path), "--prompt", "hello world", "--count", "3", "--context", "16"]) == 0
  out = capsys.readouterr()
  assert out.out.startswith("hello world") and "3 tokens" in out.err and "tokens/s" in out.err
  other = tmp_path / "bpe.gguf"
  write_model(other, tokenizer="gpt2")
  with pytest.raises(SystemExit, match="--prompt-ids"): llama.main([str(other), "--count", "2"])
  assert llama.main([str(other), "--prompt-ids", "1,5,9", "--count", "2", "--context", "8"]) == 0
  assert len(capsys.readouterr().out.strip().split(",")) == 2
