"""A LLaMA-style model from a GGUF file (llama.cpp's format): text generation with a KV cache and TinyJit.

  python examples/llama.py PATH.gguf [--prompt TEXT] [--count 64] [--temperature 0.8] [--device CPU|CL]
  python examples/llama.py PATH.gguf --prompt-ids 1,450,4996 ...

The file gives everything: the shapes (llama.block_count, llama.embedding_length, the head counts, the RMSNorm
epsilon, the rotary base), the weights (F32, F16, BF16 and the quantised types nn.state.gguf_load dequantises:
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K; all become float32 on load), and the tokenizer (tokenizer.ggml.*:
a SentencePiece vocabulary with scores, the "llama" tokenizer model). Other tokenizer models are refused with a
message; give the prompt as token ids then.

The model is the LLaMA family's: RMSNorm before attention and before the SwiGLU feed-forward, rotary position
embeddings over adjacent pairs of each head's dims (GGUF's "normal" rope: llama.cpp's converter permutes Q and K
for it), grouped-query attention (head_count_kv <= head_count), an output layer (or the token embedding, tied,
when the file has none). Each step is one TinyJit replay, the position a bound Variable (examples/textgen.py).
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from textgen import cached_attention, generate, kernels_built, report, use_device


class Config:
  """The model's shapes, read from GGUF metadata (llama.cpp's keys, prefixed with the architecture's name)."""
  def __init__(self, kv: dict, weights: dict):
    arch = kv.get("general.architecture", "llama")
    def get(key: str, default=None):
      v = kv.get(f"{arch}.{key}", default)
      if v is None: raise SystemExit(f"the file has no {arch}.{key}")
      return v
    self.layers, self.dim = int(get("block_count")), int(get("embedding_length"))
    self.heads = int(get("attention.head_count"))
    self.kv_heads = int(get("attention.head_count_kv", self.heads))
    self.hidden = int(get("feed_forward_length"))
    self.eps = float(get("attention.layer_norm_rms_epsilon", 1e-5))
    self.rope_base = float(get("rope.freq_base", 10000.0))
    self.context = int(get("context_length", 2048))
    self.vocab = int(weights["token_embd.weight"].shape[0])
    if self.dim % self.heads or self.heads % self.kv_heads:
      raise SystemExit(f"{self.heads} heads of {self.kv_heads} KV heads do not divide width {self.dim}")
    self.head_dim = self.dim // self.heads
    if self.head_dim % 2: raise SystemExit(f"rotary embeddings need an even head width, got {self.head_dim}")


class Block:
  def __init__(self, c: Config, max_context: int):
    from rulec import Tensor
    self.c = c
    self.cache = Tensor.zeros(2, 1, c.kv_heads, max_context, c.head_dim).contiguous().realize()

  def __call__(self, x, w: dict, i: int, cos, sin, pos):
    c, p = self.c, f"blk.{i}."
    b = x.shape[0]
    h = _rms(x, c.eps) * w[p + "attn_norm.weight"]
    q = (h @ w[p + "attn_q.weight"].T).reshape(b, 1, c.heads, c.head_dim)
    k = (h @ w[p + "attn_k.weight"].T).reshape(b, 1, c.kv_heads, c.head_dim)
    v = (h @ w[p + "attn_v.weight"].T).reshape(b, 1, c.kv_heads, c.head_dim)
    q, k = _rope(q, cos, sin), _rope(k, cos, sin)
    new_kv = k.stack(v).permute(0, 1, 3, 2, 4)                 # (2, b, kv_heads, 1, head_dim)
    attn = cached_attention(self.cache, q.permute(0, 2, 1, 3), new_kv, pos, c.heads // c.kv_heads)
    x = x + attn.permute(0, 2, 1, 3).reshape(b, 1, c.dim) @ w[p + "attn_output.weight"].T
    h = _rms(x, c.eps) * w[p + "ffn_norm.weight"]
    ff = (h @ w[p + "ffn_gate.weight"].T).silu() * (h @ w[p + "ffn_up.weight"].T)
    return x + ff @ w[p + "ffn_down.weight"].T


def _rms(x, eps: float):
  return x * (x.square().mean(-1, keepdim=True) + eps).rsqrt()


def _rope(x, cos, sin):
  """x (b, 1, heads, head_dim) with each adjacent pair of dims (2i, 2i+1) rotated by the position's angle i."""
  b, t, n, d = x.shape
  pairs = x.reshape(b, t, n, d // 2, 2)
  re, im = pairs[..., 0], pairs[..., 1]
  return (re * cos - im * sin).stack(re * sin + im * cos, dim=-1).reshape(b, t, n, d)


class Llama:
  def __init__(self, c: Config, weights: dict, max_context: int):
    from rulec import Tensor, TinyJit
    self.c, self.max_context = c, max_context
    self.w = {k: Tensor(v).realize() for k, v in weights.items()}
    if "output.weight" not in self.w: self.w["output.weight"] = self.w["token_embd.weight"]   # (tied)
    missing = [k for k in _needed(c) if k not in self.w]
    if missing: raise SystemExit(f"the file lacks {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")
    self.blocks = [Block(c, max_context) for _ in range(c.layers)]
    # the rotary angles of every position, (max_context, head_dim / 2): a step reads its row (pos is a Variable)
    inv = 1.0 / (c.rope_base ** (np.arange(0, c.head_dim, 2, dtype=np.float64) / c.head_dim))
    angle = Tensor.arange(max_context, dtype="float32").reshape(-1, 1) * Tensor(inv.astype(np.float32)).reshape(1, -1)
    self.cos, self.sin = angle.cos().realize(), angle.sin().realize()
    self.step = TinyJit(self._step)

  def _step(self, token, pos, temperature: float, noise):
    w, c = self.w, self.c
    cos, sin = self.cos[pos:pos + 1].reshape(1, 1, 1, -1), self.sin[pos:pos + 1].reshape(1, 1, 1, -1)
    x = w["token_embd.weight"][token:token + 1].reshape(1, 1, -1)              # (1, 1, dim): token a Variable
    for i, block in enumerate(self.blocks): x = block(x, w, i, cos, sin, pos)
    logits = (_rms(x, c.eps) * w["output_norm.weight"])[:, -1, :] @ w["output.weight"].T
    if temperature > 0: logits = logits / temperature + noise
    return logits.argmax(-1).cast("int32").realize()

  def generate(self, prompt: list[int], count: int, temperature: float = 0.0, seed: int = 0,
               on_token=None) -> tuple[list[int], list[float]]:
    return generate(self.step, self.c.vocab, self.max_context, prompt, count, temperature, seed, on_token)


def _needed(c: Config) -> list[str]:
  per = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")
  return ["token_embd.weight", "output_norm.weight"] + [f"blk.{i}.{n}.weight" for i in range(c.layers) for n in per]


def load(path: str, max_context: int | None = None) -> tuple[Llama, dict]:
  """The model of a GGUF file (its weights as float32) and the file's metadata."""
  from rulec.nn.state import gguf_load
  kv, tensors = gguf_load(path)
  weights = {k: np.ascontiguousarray(t.numpy().astype(np.float32)) for k, t in tensors.items()}
  c = Config(kv, weights)
  return Llama(c, weights, min(max_context or c.context, c.context)), kv


# ---------------------------------------------------------------------------------------------------------------
# the tokenizer: SentencePiece's, from the file's vocabulary and scores


class SentencePiece:
  """llama.cpp's "llama" tokenizer: the text with a leading space, spaces as "▁", split into characters, then
  the adjacent pair whose joined piece has the highest score merged, over and over, while a pair's piece is in
  the vocabulary; a character with no piece becomes its UTF-8 bytes' <0xNN> tokens."""
  SPACE = "\u2581"

  def __init__(self, kv: dict):
    model = kv.get("tokenizer.ggml.model")
    if model != "llama":
      raise SystemExit(f"tokenizer model {model!r} is not supported here (only 'llama', SentencePiece): give the "
                       "prompt as --prompt-ids")
    self.pieces: list[str] = list(kv["tokenizer.ggml.tokens"])
    self.scores: list[float] = list(kv.get("tokenizer.ggml.scores", [0.0] * len(self.pieces)))
    self.ids = {p: i for i, p in enumerate(self.pieces)}
    self.bos = kv.get("tokenizer.ggml.bos_token_id")
    self.bytes = {i: int(p[3:5], 16) for i, p in enumerate(self.pieces) if len(p) == 6 and p.startswith("<0x") and p.endswith(">")}

  def encode(self, text: str, bos: bool = True) -> list[int]:
    syms = list((" " + text).replace(" ", self.SPACE))
    while len(syms) > 1:
      best, at = None, -1
      for i in range(len(syms) - 1):
        j = self.ids.get(syms[i] + syms[i + 1])
        if j is not None and (best is None or self.scores[j] > self.scores[best]): best, at = j, i
      if best is None: break
      syms[at:at + 2] = [syms[at] + syms[at + 1]]
    out = [self.bos] if bos and self.bos is not None else []
    for s in syms:
      if s in self.ids: out.append(self.ids[s]); continue
      for byte in s.encode():
        j = self.ids.get(f"<0x{byte:02X}>")
        if j is None: raise ValueError(f"{s!r} has no token and the vocabulary has no byte token <0x{byte:02X}>")
        out.append(j)
    return out

  def decode(self, tokens: list[int]) -> str:
    raw = bytearray()
    for t in tokens:
      if t == self.bos: continue
      if t in self.bytes: raw.append(self.bytes[t])
      elif 0 <= t < len(self.pieces): raw += self.pieces[t].replace(self.SPACE, " ").encode()
      else: raw += f"<{t}>".encode()
    return raw.decode(errors="replace")


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("path", help="a .gguf file")
  ap.add_argument("--prompt", default="Once upon a time")
  ap.add_argument("--prompt-ids", help="the prompt as token ids, comma-separated (instead of --prompt)")
  ap.add_argument("--count", type=int, default=64, help="tokens to generate")
  ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
  ap.add_argument("--context", type=int, default=512, help="positions in the KV cache (at most the file's)")
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--device", help="CPU (default), CL or NUMPY")
  args = ap.parse_args(argv)
  device = use_device(args.device)
  t0 = time.perf_counter()
  model, kv = load(args.path, args.context)
  c = model.c
  tok = None if args.prompt_ids else SentencePiece(kv)
  prompt = [int(x) for x in args.prompt_ids.split(",")] if args.prompt_ids else tok.encode(args.prompt)
  print(f"device {device}: {c.layers} layers, width {c.dim}, {c.heads} heads ({c.kv_heads} KV), vocabulary "
        f"{c.vocab}; loaded in {time.perf_counter() - t0:.1f} s; prompt of {len(prompt)} tokens", file=sys.stderr)
  before = kernels_built(device)
  shown = (lambda t: print(tok.decode([t]), end="", flush=True)) if tok else None
  if tok: print(args.prompt, end="", flush=True)
  tokens, times = model.generate(prompt, args.count, args.temperature, args.seed, shown)
  print() if tok else print(",".join(map(str, tokens[len(prompt):])))
  print(report(times, len(tokens) - len(prompt), kernels_built(device) - before), file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main())
