"""What the text-generation examples (gpt2.py, llama.py) share: the device switch, the kernel-build counter, the
KV-cache attention step, the generation loop and its timing line.

The position is a bound Variable (`Variable("start_pos", 0, max_context - 1).bind(pos)`), as in tinygrad's model
files: each step writes the cache at `start_pos` and attends over `cache[..., 0:start_pos+1, :]`. rulec keeps the
Variable symbolic (an offset and a size: docs/api.md, "Symbolic shapes"), so one TinyJit capture serves every
position of a generation: its kernels are built once, and replays pass the position as a kernel argument.
"""
from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path

import numpy as np

# (run from a checkout without installing: the package is the folder above)
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def use_device(device: str | None) -> str:
  """Make `device` rulec's default (before any tensor is made) and return the device in use."""
  from rulec.runtime.devices import DEVICES, default_device
  if device is not None:
    if device.upper() not in DEVICES: raise SystemExit(f"unknown device {device!r}; known devices: {', '.join(DEVICES)}")
    os.environ["RULEC_DEVICE"] = device.upper()
  return default_device()


def kernels_built(device: str) -> int:
  """Kernels the device has compiled or loaded from the on-disk kernel cache so far (NUMPY builds none)."""
  if device.startswith("CL"): from rulec.runtime.cl_device import COUNTERS
  elif device.startswith("CPU"): from rulec.runtime.cpu_device import COUNTERS
  else: return 0
  return COUNTERS["compiled"] + COUNTERS["loaded"]


def cached_attention(cache, q, new_kv, pos, rep: int = 1):
  """One step of attention through a KV cache: writes new_kv (2, b, kv_heads, 1, head_dim) into `cache`
  (2, b, kv_heads, max_context, head_dim) at position `pos` (a bound Variable), then attends q (b, heads, 1,
  head_dim) over positions 0..pos. `rep`: query heads per KV head (grouped-query attention). Returns
  (b, heads, 1, head_dim)."""
  cache[:, :, :, pos:pos + 1].assign(new_kv).realize()
  keys, values = cache[0, :, :, 0:pos + 1], cache[1, :, :, 0:pos + 1]   # (a size that is the Variable's)
  if rep > 1:
    b, kvh, t, hd = keys.shape
    keys, values = (x.reshape(b, kvh, 1, t, hd).expand(b, kvh, rep, t, hd).reshape(b, kvh * rep, t, hd) for x in (keys, values))
  scores = (q @ keys.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
  return scores.softmax(-1) @ values


def generate(step, vocab: int, max_context: int, prompt: list[int], count: int, temperature: float = 0.0,
             seed: int = 0, on_token=None) -> tuple[list[int], list[float]]:
  """The prompt followed by `count` tokens, and the seconds each step took (prompt steps first). `step(token,
  start_pos, temperature, noise)` is the jitted one-token step, the token and the position bound Variables (the
  token's embedding is a row read at an offset, as tinygrad's gpt2.py does); noise is Gumbel noise over the
  vocabulary drawn on the host (argmax of logits / temperature + noise samples softmax(logits / temperature))."""
  from rulec import Tensor, Variable, no_grad
  if not prompt: raise ValueError("the prompt must hold at least one token")
  if len(prompt) + count > max_context:
    raise ValueError(f"{len(prompt)} prompt tokens + {count} new ones is more than the context ({max_context})")
  bad = [t for t in prompt if not 0 <= t < vocab]
  if bad: raise ValueError(f"{bad[0]} is not a token: the vocabulary has {vocab}")
  rng = np.random.default_rng(seed)
  tokens, times = list(prompt), []
  start_pos, token = Variable("start_pos", 0, max_context - 1), Variable("token", 0, vocab - 1)
  # (no gradient is taken: without no_grad the KV-cache writes would keep, for autograd, the graph of what each
  # step wrote (engine/tensor/inplace.py), and a copy of the first cache before each write)
  with no_grad():
    for pos in range(len(prompt) + count - 1):
      t0 = time.perf_counter()
      noise = Tensor(rng.gumbel(size=(1, vocab)).astype(np.float32)) if temperature > 0 else None
      nxt = int(step(token.bind(tokens[pos]), start_pos.bind(pos), temperature, noise).item())
      times.append(time.perf_counter() - t0)
      if pos + 1 >= len(prompt):
        tokens.append(nxt)
        if on_token is not None: on_token(nxt)
  return tokens, times


def report(times: list[float], generated: int, built: int) -> str:
  """The timing line: the first two steps run the function and capture it (they build kernels), the rest replay."""
  later = sorted(times[2:])
  rate = (len(later) / sum(later)) if later else float("nan")
  return (f"{generated} tokens; first step {times[0]:.2f} s, capture {times[1] if len(times) > 1 else 0:.2f} s, then "
          f"{rate:.2f} tokens/s (median step {later[len(later) // 2] * 1e3 if later else 0:.1f} ms); {built} kernels "
          "built in all (compiled, or loaded from the kernel cache)")
