"""GPT-2 text generation on rulec: a KV cache, one TinyJit capture, tokens/s.

  python examples/gpt2.py --random [--size gpt2] [--count 100] [--prompt TEXT] [--device CPU|CL]
  python examples/gpt2.py --model PATH [--count 100] [--temperature 0.8] [--device CPU|CL]

PATH is GPT-2's weights as Hugging Face publishes them: `model.safetensors` (read with nn.state.safe_load) or
`pytorch_model.bin` (read with nn.state.torch_load, without torch: a restricted unpickler that builds tensors
only). The model size is read from the file. `--random` draws weights instead (GPT-2's own initialisation,
normal with std 0.02, seeded), for a speed run with no download.

Text goes through GPT-2's byte-level BPE from the `tiktoken` package when it is installed and has its vocabulary
(it downloads it on first use). Otherwise the prompt is encoded one byte per token (GPT-2's 256 byte tokens:
valid input, just unmerged) and generated tokens above 255 print as <id>.

Each step is one call of a TinyJit-ed function, the position a bound Variable (examples/textgen.py): the first
call runs it, the second captures its kernels, and every later token replays them with its position, so the
kernels of a whole generation are built once. The prompt goes through the same step, one token at a time.
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from textgen import cached_attention, generate, kernels_built, report, use_device

SIZES = {  # name: (layers, heads, width)
  "gpt2": (12, 12, 768), "gpt2-medium": (24, 16, 1024), "gpt2-large": (36, 20, 1280), "gpt2-xl": (48, 25, 1600)}
VOCAB, MAX_CONTEXT = 50257, 1024


# ---------------------------------------------------------------------------------------------------------------
# the model


class Block:
  """One transformer block: attention over the KV cache, then the MLP, each behind a LayerNorm and a residual."""
  def __init__(self, dim: int, heads: int, max_context: int):
    from rulec import Tensor, nn
    self.heads, self.head_dim, self.max_context = heads, dim // heads, max_context
    self.ln_1, self.ln_2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
    self.c_attn, self.attn_proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
    self.c_fc, self.mlp_proj = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
    # (keys, values) x batch x heads x positions x head_dim
    self.cache = Tensor.zeros(2, 1, heads, max_context, self.head_dim).contiguous().realize()

  def __call__(self, x, pos):
    """x: (1, 1, dim) at position `pos` (a bound Variable)."""
    b, t, d = x.shape
    # (realized here: the cache write and the attention both read it, and would each compute the projection)
    qkv = self.c_attn(self.ln_1(x)).realize().reshape(b, t, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
    q, new_kv = qkv[0], qkv[1:]                                  # (b, heads, 1, head_dim), (2, b, heads, 1, head_dim)
    attn = cached_attention(self.cache, q, new_kv, pos).permute(0, 2, 1, 3).reshape(b, t, d)
    x = x + self.attn_proj(attn)
    return x + self.mlp_proj(self.c_fc(self.ln_2(x)).gelu())


class GPT2:
  def __init__(self, layers: int, heads: int, dim: int, max_context: int = MAX_CONTEXT):
    from rulec import Tensor, TinyJit, nn
    self.dim, self.max_context = dim, max_context
    self.wte, self.wpe = nn.Embedding(VOCAB, dim), nn.Embedding(MAX_CONTEXT, dim)
    self.h = [Block(dim, heads, max_context) for _ in range(layers)]
    self.ln_f = nn.LayerNorm(dim)
    self.step = TinyJit(self._step)

  def _step(self, token, pos, temperature: float, noise):
    """The next token after `token` at position `pos` (both bound Variables): argmax of the logits (temperature
    0), else of logits / temperature plus Gumbel noise (drawn on the host: one sample of softmax(logits /
    temperature))."""
    x = (self.wte.weight[token:token + 1] + self.wpe.weight[pos:pos + 1]).reshape(1, 1, -1)
    for block in self.h: x = block(x, pos)
    logits = self.ln_f(x)[:, -1, :] @ self.wte.weight.T           # (1, vocab): the output layer is wte, tied
    if temperature > 0: logits = logits / temperature + noise
    return logits.argmax(-1).cast("int32").realize()

  def generate(self, prompt: list[int], count: int, temperature: float = 0.0, seed: int = 0,
               on_token=None) -> tuple[list[int], list[float]]:
    """The prompt followed by `count` generated tokens, and the seconds each step took (prompt steps first)."""
    return generate(self.step, VOCAB, self.max_context, prompt, count, temperature, seed, on_token)


# ---------------------------------------------------------------------------------------------------------------
# weights


# Hugging Face's GPT-2 keeps these as Conv1D, weight (in, out): nn.Linear's is (out, in)
_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
# their names here (the block's attention and MLP output layers are flat attributes)
_RENAME = {"attn.c_attn": "c_attn", "attn.c_proj": "attn_proj", "mlp.c_fc": "c_fc", "mlp.c_proj": "mlp_proj"}


def read_weights(path: str) -> dict:
  """GPT-2's weights from a .safetensors or a PyTorch .bin file, as this model names them, as numpy arrays."""
  from rulec.nn.state import safe_load, torch_load
  raw = safe_load(path) if path.endswith(".safetensors") else torch_load(path)
  out = {}
  for k, v in raw.items():
    k = k.removeprefix("transformer.")
    # (the causal-mask buffers of older checkpoints and the tied output layer are not weights of this model)
    if k.endswith((".attn.bias", ".attn.masked_bias")) or k == "lm_head.weight": continue
    a = v.numpy().astype(np.float32)
    if k.endswith(_CONV1D): a = a.T
    for old, new in _RENAME.items(): k = k.replace(old, new)
    out[k] = np.ascontiguousarray(a)
  return out


def model_for(weights: dict, max_context: int, heads: int | None = None) -> GPT2:
  """A GPT2 of the size the weights have (layers from the names, width from wte, heads from GPT-2's sizes unless
  given)."""
  dim = weights["wte.weight"].shape[1]
  layers = 1 + max(int(k.split(".")[1]) for k in weights if k.startswith("h."))
  heads = heads or next((h for _, h, d in SIZES.values() if d == dim), None)
  if heads is None: raise SystemExit(f"no GPT-2 size has width {dim}: say how many heads with --heads")
  if dim % heads: raise SystemExit(f"width {dim} is not a multiple of {heads} heads")
  return GPT2(layers, heads, dim, max_context)


def random_weights(model: GPT2, seed: int) -> dict:
  """GPT-2's initialisation: normal(0, 0.02) weights, zero biases, LayerNorms at 1 and 0."""
  rng = np.random.default_rng(seed)
  out = {}
  for k, t in _parameters(model).items():
    if "ln_" in k: out[k] = np.full(t.shape, 1.0 if k.endswith("weight") else 0.0, np.float32)
    elif k.endswith("bias"): out[k] = np.zeros(t.shape, np.float32)
    else: out[k] = (rng.standard_normal(t.shape, dtype=np.float32) * 0.02)
  return out


def load(model: GPT2, weights: dict) -> None:
  from rulec import Tensor
  from rulec.nn.state import load_state_dict
  load_state_dict(model, {k: Tensor(v) for k, v in weights.items()}, strict=False, verbose=False)
  missing = [k for k in _parameters(model) if k not in weights]
  if missing: raise SystemExit(f"the weights lack {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")


def _parameters(model: GPT2) -> dict:
  """The model's weights by name: its state dict without the KV caches."""
  from rulec.nn.state import get_state_dict
  return {k: t for k, t in get_state_dict(model).items() if ".cache" not in k}


# ---------------------------------------------------------------------------------------------------------------
# text


def _byte_tokens() -> list[int]:
  """GPT-2's token id of each byte value: its first 256 tokens are the bytes, printable ones first (in byte
  order), then the rest (in byte order)."""
  shown = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1), *range(ord("\xae"), ord("\xff") + 1)]
  order = shown + [b for b in range(256) if b not in shown]
  ids = [0] * 256
  for i, b in enumerate(order): ids[b] = i
  return ids


class ByteCodec:
  """One token per byte: what the prompt becomes without tiktoken's vocabulary."""
  def __init__(self):
    self.ids = _byte_tokens()
    self.bytes = {i: b for b, i in enumerate(self.ids)}
  def encode(self, text: str) -> list[int]: return [self.ids[b] for b in text.encode()]
  def decode(self, tokens: list[int]) -> str:
    out, raw = [], bytearray()
    for t in tokens:
      if t in self.bytes: raw.append(self.bytes[t]); continue
      out.append(raw.decode(errors="replace") + f"<{t}>")
      raw = bytearray()
    return "".join(out) + raw.decode(errors="replace")


def codec():
  """tiktoken's GPT-2 BPE when it can be had, else ByteCodec (and why, as a note on stderr)."""
  try:
    import tiktoken
    return tiktoken.get_encoding("gpt2")
  except Exception as e:  # noqa: BLE001 (not installed, or no vocabulary: no network)
    print(f"(tiktoken's GPT-2 vocabulary is not available: {type(e).__name__}; the prompt is encoded one byte per "
          "token)", file=sys.stderr)
    return ByteCodec()


# ---------------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  src = ap.add_mutually_exclusive_group(required=True)
  src.add_argument("--model", help="GPT-2 weights: a .safetensors or PyTorch .bin file")
  src.add_argument("--random", action="store_true", help="random weights (GPT-2's initialisation)")
  ap.add_argument("--size", default="gpt2", choices=sorted(SIZES), help="the size --random builds")
  ap.add_argument("--layers", type=int, help="--random with this many layers (a smaller model)")
  ap.add_argument("--heads", type=int, help="--model: attention heads, for a width no GPT-2 size has")
  ap.add_argument("--prompt", default="What is the answer to life, the universe, and everything?")
  ap.add_argument("--count", type=int, default=100, help="tokens to generate")
  ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
  ap.add_argument("--context", type=int, default=MAX_CONTEXT, help=f"positions in the KV cache (at most {MAX_CONTEXT})")
  ap.add_argument("--seed", type=int, default=1337)
  ap.add_argument("--device", help="CPU (default), CL or NUMPY")
  ap.add_argument("--quiet", action="store_true", help="print the timings only")
  args = ap.parse_args(argv)
  if not 1 <= args.context <= MAX_CONTEXT: raise SystemExit(f"--context must be 1..{MAX_CONTEXT}")
  device = use_device(args.device)

  t0 = time.perf_counter()
  if args.random:
    layers, heads, dim = SIZES[args.size]
    model = GPT2(args.layers or layers, heads, dim, args.context)
    weights = random_weights(model, args.seed)
  else:
    weights = read_weights(args.model)
    model = model_for(weights, args.context, args.heads)
  load(model, weights)
  del weights
  tok = codec()
  prompt = tok.encode(args.prompt)
  print(f"device {device}: GPT-2 with {len(model.h)} layers, width {model.dim}, loaded in "
        f"{time.perf_counter() - t0:.1f} s; prompt of {len(prompt)} tokens", file=sys.stderr)
  before = kernels_built(device)
  shown = (lambda t: print(tok.decode([t]), end="", flush=True)) if not args.quiet else None
  if shown: print(args.prompt, end="", flush=True)
  tokens, times = model.generate(prompt, args.count, args.temperature, args.seed, shown)
  if shown: print()
  print(report(times, len(tokens) - len(prompt), kernels_built(device) - before), file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main())
