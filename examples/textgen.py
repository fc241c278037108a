"""What the text-generation examples (gpt2.py, llama.py) share: the device switch, the kernel-build counter, the
masked fixed-shape KV-cache attention step, the generation loop and its timing line.

Why fixed shapes: each step writes position `pos` of a cache of max_context positions (a `where` over the cache)
and attends over every position with the later ones masked out, so one TinyJit capture serves every position of
a generation: its kernels are built once. (tinygrad's model files bind the position to a symbolic Variable and
slice the cache instead; rulec runs them too, building kernels per position: docs/api.md, "Symbolic shapes".)
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


def cached_attention(cache, q, new_kv, at, seen, rep: int = 1):
  """One step of attention through a KV cache of fixed size: writes new_kv (2, b, kv_heads, 1, head_dim) into
  `cache` (2, b, kv_heads, max_context, head_dim) where `at` (bool, max_context) is True, then attends q
  (b, heads, 1, head_dim) over the positions where `seen` is True. `rep`: query heads per KV head (grouped-query
  attention). Returns (b, heads, 1, head_dim)."""
  cache.assign(at.reshape(1, 1, 1, -1, 1).where(new_kv, cache))
  keys, values = cache[0], cache[1]
  if rep > 1:
    b, kvh, t, hd = keys.shape
    keys, values = (x.reshape(b, kvh, 1, t, hd).expand(b, kvh, rep, t, hd).reshape(b, kvh * rep, t, hd) for x in (keys, values))
  scores = (q @ keys.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
  scores = seen.reshape(1, 1, 1, -1).where(scores, -math.inf)
  return scores.softmax(-1) @ values


def generate(step, vocab: int, max_context: int, prompt: list[int], count: int, temperature: float = 0.0,
             seed: int = 0, on_token=None) -> tuple[list[int], list[float]]:
  """The prompt followed by `count` tokens, and the seconds each step took (prompt steps first). `step(token,
  pos, temperature, noise)` is the jitted one-token step (Tensors (1, 1) and (1,)); noise is Gumbel noise over
  the vocabulary drawn on the host (argmax of logits / temperature + noise samples softmax(logits / temperature))."""
  from rulec import Tensor
  if not prompt: raise ValueError("the prompt must hold at least one token")
  if len(prompt) + count > max_context:
    raise ValueError(f"{len(prompt)} prompt tokens + {count} new ones is more than the context ({max_context})")
  bad = [t for t in prompt if not 0 <= t < vocab]
  if bad: raise ValueError(f"{bad[0]} is not a token: the vocabulary has {vocab}")
  rng = np.random.default_rng(seed)
  tokens, times = list(prompt), []
  for pos in range(len(prompt) + count - 1):
    t0 = time.perf_counter()
    noise = Tensor(rng.gumbel(size=(1, vocab)).astype(np.float32)) if temperature > 0 else None
    nxt = int(step(Tensor([[tokens[pos]]], dtype="int32"), Tensor([pos], dtype="int32"), temperature, noise).item())
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
