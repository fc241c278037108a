"""Real blocks and whole steps: rulec beside torch eager and tinygrad 0.14, in one run.

    python bench/models.py [--device CPU|CL] [--size tiny|small|full] [--only NAME,...] [--reps 10] [--budget 10]
                           [--no-tinygrad] [--no-torch] [--torch-threads N] [--tg-dev CPU] [--tg-timeout 600]
                           [--dtype float32|float16|bfloat16] [--autocast float16|bfloat16]

The rows (shapes in SHAPES below; `--size` picks a column: small on CPU, full on `--device CL`; tiny is a seconds-
long check that everything runs):
  matmul                   a @ b, square
  attention [causal]       (q @ k^T * scale).softmax(-1) @ v, the causal rows masking with a lower triangle built
                           in the graph, the softmax in float32 and its probabilities cast back to v's dtype (as
                           torch's softmax of a half tensor returns them); forward, and forward+backward
  GPT-2 MLP                ((layernorm(x) * g + b) @ w1 + b1).gelu() @ w2 + b2 + x (hidden 4C); forward and fwd+bwd
  GPT-2 block              layernorm, qkv projection, causal attention, output projection, residual, the MLP above;
                           forward and forward+backward (the gradients of x and of every weight)
  ResNet block             conv3x3 - batchnorm - relu - conv3x3 - batchnorm, + x, relu (batch statistics, as in
                           training; no conv bias); forward and forward+backward
  LLaMA decode step        one token through examples/llama.py's model (its Blocks, weights and rotary tables; a
                           LLaMA shape with grouped-query attention) with its KV cache filled up to `pos`: the step
                           writes position pos and attends over 0..pos, returning the logits (no sampling). The
                           token and the position are bound Variables, as in the example's generation loop.

Every side gets the same float32 arrays (numpy, fixed seeds). A backward row passes a fixed random gradient of the
output (its shape) and takes the gradients of every input and weight.
  rulec     the row's function under rulec's TinyJit, inputs realized before; three warm-up calls (run, capture, a
            replay), then timed replays, each followed by the device's synchronize() (a no-op on CPU). The kernels
            per call are those of the JIT's capture.
  torch     eager (no torch.compile), the same math in its own functions (F.layer_norm, F.linear with the same
            (in, out) weight arrays, F.gelu tanh, F.conv2d, F.batch_norm with batch statistics; attention written
            out, not F.scaled_dot_product_attention), `torch.set_num_threads(<rulec's threads>)` on CPU; with
            `--device CL`, on cuda when there is one, TF32 off, timed up to torch.cuda.synchronize(). Forward rows
            run under torch.no_grad(). Its outputs are the reference of the error columns.
  tinygrad  the same function as rulec's (tinygrad 0.14 has the same Tensor API; the LLaMA row runs
            examples/llama.py's classes with `rulec` standing for tinygrad), its TinyJit on DEV=--tg-dev (CPU by
            default; with --device CL, its CL device), in a process of its own per row, killed after --tg-timeout
            seconds. Its CPU device compiles with clang: put one on PATH. Where there is none, a script named clang
            that runs `zig cc` (pip install ziglang) with its `--target=x86_64-none-unknown-elf` replaced by
            `-target x86_64-linux-none -fPIC` and `-g0` added (tinygrad's loader takes no debug relocations) served
            (bench/results/cpu-models-tinygrad-2026-12-06-session26.txt). A row it fails or times out shows "-".
Each timing is the median of --reps timed calls (fewer when they pass --budget seconds; at least 3), one side's
calls after the other's (not alternating: each side's idle threads then spin into the other's calls).

On a CPU whose cores are shared (a VM, a neighbour's process), torch's OpenMP threads may sleep between ops and take
milliseconds to wake: small eager ops then run far slower at 2 threads than at 1 (a 2-core VM here: the small LLaMA
step 14.4 ms at 1 thread, 327 ms at 2). rulec's workers poll instead (runtime/cpu_workers.py). `RULEC_THREADS=1`
runs both at one thread; `--torch-threads N` sets torch's alone.

Peak memory (the column "peak MiB r/t/tg": rulec / torch / tinygrad): the most bytes each side's buffers held at once
during one call after the warm-up, weights and the JIT's buffers included: rulec's runtime/buffer.py counter,
tinygrad's GlobalCounters.mem_used followed through every buffer allocation, torch's max_memory_allocated() on
CUDA ("-" on a CPU: torch's CPU allocator counts nothing). bench/memory.py compares whole training steps.

Columns: ms per call; TFLOP/s of rulec (dense flops counted: 2*M*N*K per product, the causal rows count the full
S*S products, a backward is 2x its forward) or GB/s (the LLaMA step: weights and the cache positions read);
torch ms and torch ms / rulec ms (> 1: rulec is faster); the same for tinygrad; rulec's kernels per call; the max
abs error of rulec's output against torch's, and of its gradients (the worst over all of them; in parentheses the
worst of each gradient's max abs error over its max abs value: weight gradients summed over a batch are large).
The machine, the commit (and whether the library's files have uncommitted changes) head the table; the last line
gives the ratios by row and their geometric means.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import time
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "examples"), str(ROOT / "bench")]

from generate import llama_weights, machine, run_json  # noqa: E402
from workloads import fmt, print_table  # noqa: E402

# one column per --size; mlp's hidden width is 4C; llama: heads over kv_heads, SwiGLU width `hidden`, the KV cache
# holds `context` positions and the step writes position `pos`
SHAPES = {
  "matmul":    {"tiny": dict(N=64), "small": dict(N=1024), "full": dict(N=4096)},
  "attention": {"tiny": dict(B=1, H=2, S=32, D=16), "small": dict(B=2, H=12, S=256, D=64),
                "full": dict(B=4, H=12, S=1024, D=64)},
  "mlp":       {"tiny": dict(B=1, T=16, C=32), "small": dict(B=2, T=256, C=768), "full": dict(B=4, T=1024, C=768)},
  "gpt2":      {"tiny": dict(B=1, T=16, C=32, H=2), "small": dict(B=2, T=256, C=768, H=12),
                "full": dict(B=8, T=1024, C=768, H=12)},
  "resnet":    {"tiny": dict(N=2, C=8, HW=8), "small": dict(N=8, C=64, HW=56), "full": dict(N=64, C=64, HW=56)},
  "llama":     {"tiny": dict(dim=32, layers=1, heads=4, kv_heads=2, hidden=64, vocab=128, context=16, pos=8),
                "small": dict(dim=768, layers=4, heads=12, kv_heads=4, hidden=2048, vocab=32000, context=256, pos=128),
                "full": dict(dim=768, layers=12, heads=12, kv_heads=4, hidden=2048, vocab=32000, context=1024, pos=512)},
}
WARMUP, MIN_REPS, SEED, EPS = 3, 3, 20261205, 1e-5
# --dtype: the rows' inputs and weights in float16 or bfloat16 on every side (rounded from the same float32 arrays),
# computed in that dtype as each framework does (rulec and tinygrad: float32 sums, rounded per op; torch: its own
# kernels, tensor cores on cuda); the error columns compare in float64. The LLaMA row stays float32.
DTYPE = "float32"
# --autocast: inputs and weights stay float32 and every matmul and convolution runs on operands cast to this half
# dtype (torch: torch.autocast, which also runs those in it and keeps softmax, layernorm and the rest in float32;
# rulec and tinygrad: `mm` and `conv` below cast their operands, and a half result meeting a float32 bias is float32
# again by promotion, as in torch)
AUTOCAST: str | None = None


def mm(a, b):
  return a @ b if AUTOCAST is None else a.cast(AUTOCAST) @ b.cast(AUTOCAST)


def conv(x, w):
  return x.conv2d(w, padding=1) if AUTOCAST is None else x.cast(AUTOCAST).conv2d(w.cast(AUTOCAST), padding=1).float()


@dataclass(frozen=True)
class Row:
  name: str
  kind: str                # a key of SHAPES
  backward: bool = False
  causal: bool = False


ROWS = [
  Row("matmul", "matmul"),
  Row("attention", "attention"), Row("attention causal", "attention", causal=True),
  Row("attention fwd+bwd", "attention", backward=True), Row("attention causal fwd+bwd", "attention", True, True),
  Row("GPT-2 MLP", "mlp"), Row("GPT-2 MLP fwd+bwd", "mlp", backward=True),
  Row("GPT-2 block", "gpt2"), Row("GPT-2 block fwd+bwd", "gpt2", backward=True),
  Row("ResNet block", "resnet"), Row("ResNet block fwd+bwd", "resnet", backward=True),
  Row("LLaMA decode step", "llama"),
]


def describe(kind: str, s: dict) -> str:
  if kind == "matmul": return f"{s['N']}^3"
  if kind == "resnet": return f"N{s['N']} C{s['C']} {s['HW']}x{s['HW']}"
  if kind == "llama": return f"dim {s['dim']} L{s['layers']} pos {s['pos']}"
  return " ".join(f"{k}{v}" for k, v in s.items())


def work(row: Row, s: dict) -> tuple[float, str]:
  """(flops or bytes, "TFLOP/s" or "GB/s") of one call."""
  k = row.kind
  if k == "llama":
    kvd = s["kv_heads"] * (s["dim"] // s["heads"])
    layer = s["dim"] * (2 * s["dim"] + 2 * kvd) + 3 * s["dim"] * s["hidden"]
    cache = 2 * kvd * (s["pos"] + 1)
    return 4.0 * (s["layers"] * (layer + cache) + s["vocab"] * s["dim"]), "GB/s"
  if k == "matmul": f = 2.0 * s["N"] ** 3
  elif k == "attention": f = 4.0 * s["B"] * s["H"] * s["S"] ** 2 * s["D"]
  elif k == "mlp": f = 16.0 * s["B"] * s["T"] * s["C"] ** 2
  elif k == "gpt2": f = 24.0 * s["B"] * s["T"] * s["C"] ** 2 + 4.0 * s["B"] * s["T"] ** 2 * s["C"]
  else: f = 2 * 2.0 * s["N"] * s["C"] ** 2 * 9 * s["HW"] ** 2
  return f * (3 if row.backward else 1), "TFLOP/s"


# ------------------------------------------------------------------------------------------------------------
# the arrays every side gets: (the call's inputs, the weights), both name -> float32 array


def arrays(row: Row, s: dict) -> tuple[dict, dict]:
  rng = np.random.default_rng([SEED, ROWS.index(row)])
  def n(*shape, std=1.0, mean=0.0): return (rng.standard_normal(shape, dtype=np.float32) * std + mean).astype(np.float32)
  k = row.kind
  if k == "matmul": return {"a": n(s["N"], s["N"]), "b": n(s["N"], s["N"])}, {}
  if k == "attention":
    shape = (s["B"], s["H"], s["S"], s["D"])
    ins, w = {"q": n(*shape), "k": n(*shape), "v": n(*shape)}, {}
  elif k in ("mlp", "gpt2"):
    C = s["C"]
    ins = {"x": n(s["B"], s["T"], C)}
    w = {"g2": n(C, std=0.1, mean=1.0), "b2": n(C, std=0.1), "w1": n(C, 4 * C, std=0.02), "c1": n(4 * C, std=0.02),
         "w2": n(4 * C, C, std=0.02), "c2": n(C, std=0.02)}
    if k == "gpt2":
      w.update({"g1": n(C, std=0.1, mean=1.0), "b1": n(C, std=0.1), "wqkv": n(C, 3 * C, std=0.02),
                "bqkv": n(3 * C, std=0.02), "wo": n(C, C, std=0.02), "bo": n(C, std=0.02)})
  elif k == "resnet":
    C = s["C"]
    ins = {"x": n(s["N"], C, s["HW"], s["HW"])}
    w = {"w1": n(C, C, 3, 3, std=math.sqrt(2 / (9 * C))), "g1": n(C, std=0.1, mean=1.0), "b1": n(C, std=0.1),
         "w2": n(C, C, 3, 3, std=math.sqrt(2 / (9 * C))), "g2": n(C, std=0.1, mean=1.0), "b2": n(C, std=0.1)}
  if row.backward: ins["dout"] = n(*next(iter(ins.values())).shape)
  return ins, w


def llama_arrays(s: dict) -> tuple[dict, dict, list[np.ndarray], int]:
  """(GGUF metadata, weights, each layer's KV cache (2, 1, kv_heads, context, head_dim) filled before pos, token)."""
  kv, weights = llama_weights(s["layers"], s)
  rng = np.random.default_rng([SEED, len(ROWS)])
  shape = (2, 1, s["kv_heads"], s["context"], s["dim"] // s["heads"])
  caches = []
  for _ in range(s["layers"]):
    c = np.zeros(shape, np.float32)
    c[:, :, :, :s["pos"]] = rng.standard_normal(c[:, :, :, :s["pos"]].shape, dtype=np.float32) * 0.5
    caches.append(c)
  return kv, weights, caches, int(rng.integers(0, s["vocab"]))


# ------------------------------------------------------------------------------------------------------------
# the functions, once for rulec and tinygrad (one Tensor API) and once for torch


def lib_attention(lib, q, k, v, causal: bool):
  scores = mm(q, k.transpose(-1, -2)).float() * (1.0 / math.sqrt(q.shape[-1]))
  if causal:
    S = q.shape[-2]
    scores = lib.Tensor.ones(S, S, dtype="bool").tril().where(scores, float("-inf"))
  # (the probabilities back in the inputs' type, as torch's softmax of a float16 / bfloat16 tensor returns them: else
  # a half row's attention output, and the residual stream after it, would be float32)
  return mm(scores.softmax(-1).cast(v.dtype), v)


def lib_mlp(x, w):
  return mm((mm(x.layernorm() * w["g2"] + w["b2"], w["w1"]) + w["c1"]).gelu(), w["w2"]) + w["c2"] + x


def lib_bn(y, g, b):
  mean = y.mean(axis=(0, 2, 3))
  var = (y - mean.reshape(1, -1, 1, 1)).square().mean(axis=(0, 2, 3))
  return y.batchnorm(g, b, mean, (var + EPS).rsqrt())


def lib_forward(lib, row: Row, s: dict, ins: dict, w: dict):
  k = row.kind
  if k == "matmul": return mm(ins["a"], ins["b"])
  if k == "attention": return lib_attention(lib, ins["q"], ins["k"], ins["v"], row.causal)
  x = ins["x"]
  if k == "mlp": return lib_mlp(x, w)
  if k == "gpt2":
    B, T, C, H = s["B"], s["T"], s["C"], s["H"]
    qkv = mm(x.layernorm() * w["g1"] + w["b1"], w["wqkv"]) + w["bqkv"]
    q, kk, v = (qkv[:, :, i * C:(i + 1) * C].reshape(B, T, H, C // H).transpose(1, 2) for i in range(3))
    a = lib_attention(lib, q, kk, v, True).transpose(1, 2).reshape(B, T, C)
    return lib_mlp(x + mm(a, w["wo"]) + w["bo"], w)
  y = lib_bn(conv(x, w["w1"]), w["g1"], w["b1"]).relu()
  return (lib_bn(conv(y, w["w2"]), w["g2"], w["b2"]) + x).relu()


def torch_forward(torch, row: Row, s: dict, ins: dict, w: dict):
  F = torch.nn.functional
  def attention(q, k, v, causal):
    scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    if causal:
      S = q.shape[-2]
      scores = scores.masked_fill(~torch.ones(S, S, dtype=torch.bool, device=q.device).tril(), float("-inf"))
    return scores.softmax(-1) @ v
  def mlp(x):
    h = F.layer_norm(x, x.shape[-1:], w["g2"], w["b2"], EPS)
    return F.linear(F.gelu(F.linear(h, w["w1"].T, w["c1"]), approximate="tanh"), w["w2"].T, w["c2"]) + x
  def bn(y, g, b): return F.batch_norm(y, None, None, g, b, training=True, eps=EPS)
  k = row.kind
  if k == "matmul": return ins["a"] @ ins["b"]
  if k == "attention": return attention(ins["q"], ins["k"], ins["v"], row.causal)
  x = ins["x"]
  if k == "mlp": return mlp(x)
  if k == "gpt2":
    B, T, C, H = s["B"], s["T"], s["C"], s["H"]
    qkv = F.linear(F.layer_norm(x, (C,), w["g1"], w["b1"], EPS), w["wqkv"].T, w["bqkv"])
    q, kk, v = (t.reshape(B, T, H, C // H).transpose(1, 2) for t in qkv.split(C, -1))
    a = attention(q, kk, v, True).transpose(1, 2).reshape(B, T, C)
    return mlp(x + F.linear(a, w["wo"].T, w["bo"]))
  y = F.relu(bn(F.conv2d(x, w["w1"], padding=1), w["g1"], w["b1"]))
  return F.relu(bn(F.conv2d(y, w["w2"], padding=1), w["g2"], w["b2"]) + x)


# ------------------------------------------------------------------------------------------------------------
# rulec's and tinygrad's side: a jitted call on resident inputs


def rulec_lib(device: str) -> types.SimpleNamespace:
  import rulec
  from rulec.runtime import buffer as membuf
  sync = rulec.Device[device].synchronize
  def peak(call):   # (the bytes rulec's buffers held at most during one call: runtime/buffer.py's counter)
    membuf.reset_peak()
    call()
    sync()
    return membuf.memory_peak()
  return types.SimpleNamespace(name="rulec", Tensor=rulec.Tensor, TinyJit=rulec.TinyJit, variable=rulec.Variable,
                               no_grad=rulec.no_grad, sync=sync, kernels=lambda jit: len(jit.captured.plan), peak=peak)


def tinygrad_lib() -> types.SimpleNamespace:
  from tinygrad import Device, Tensor, TinyJit
  from tinygrad.uop.ops import UOp
  from tinygrad.helpers import GlobalCounters
  import tinygrad.device as tdev
  def kernels(jit): return sum(1 for c in jit.captured.linear.src if c.src and c.src[0].op.name == "PROGRAM")
  # its peak: GlobalCounters.mem_used (bytes of allocated buffers) followed through every allocation
  most = [0]
  allocate = tdev.Buffer.allocate
  def counted(self, *args, **kw):
    out = allocate(self, *args, **kw)
    most[0] = max(most[0], GlobalCounters.mem_used)
    return out
  tdev.Buffer.allocate = counted
  sync = Device[Device.DEFAULT].synchronize
  def peak(call):
    most[0] = GlobalCounters.mem_used
    call()
    sync()
    return most[0]
  return types.SimpleNamespace(name="tinygrad", Tensor=Tensor, TinyJit=TinyJit, variable=UOp.variable,
                               no_grad=contextlib.nullcontext, sync=sync, kernels=kernels, peak=peak)


def lib_call(lib, row: Row, s: dict):
  """(call, jit): call() runs the jitted row once and returns its output Tensors (the output, then the gradients)."""
  if row.kind == "llama": return lib_llama(lib, s)
  ins_np, w_np = arrays(row, s)
  def put(v):
    t = lib.Tensor(v)
    return (t if DTYPE == "float32" else t.cast(DTYPE).contiguous()).realize()
  ins = {k: put(v) for k, v in ins_np.items()}
  w = {k: put(v) for k, v in w_np.items()}
  def fn(*xs):
    named = dict(zip(ins, xs))
    out = lib_forward(lib, row, s, named, w)
    if not row.backward: return out.realize()
    targets = [t for n, t in named.items() if n != "dout"] + list(w.values())
    grads = out.gradient(*targets, gradient=named["dout"])
    out.realize(*grads)
    return [out, *grads]
  jit = lib.TinyJit(fn)
  args = list(ins.values())
  def call():
    r = jit(*args)
    return r if isinstance(r, list) else [r]
  return call, jit


def lib_llama(lib, s: dict):
  """examples/llama.py's model at the shape s, its caches filled; the step returns the logits."""
  if lib.name != "rulec":   # (the example's classes import Tensor and TinyJit from rulec: give them tinygrad's)
    sys.modules["rulec"] = types.SimpleNamespace(Tensor=lib.Tensor, TinyJit=lib.TinyJit)
  import llama
  kv, weights, caches, tok = llama_arrays(s)
  m = llama.Llama(llama.Config(kv, weights), weights, s["context"])
  for b, c in zip(m.blocks, caches): b.cache.assign(lib.Tensor(c)).realize()
  def step(token, pos):
    with lib.no_grad():   # (no autograd record of the cache writes: examples/textgen.py's generate does the same)
      cos, sin = m.cos[pos:pos + 1].reshape(1, 1, 1, -1), m.sin[pos:pos + 1].reshape(1, 1, 1, -1)
      x = m.w["token_embd.weight"][token:token + 1].reshape(1, 1, -1)
      for i, block in enumerate(m.blocks): x = block(x, m.w, i, cos, sin, pos)
      return ((llama._rms(x, m.c.eps) * m.w["output_norm.weight"])[:, -1, :] @ m.w["output.weight"].T).realize()
  jit = lib.TinyJit(step)
  token, pos = lib.variable("token", 0, s["vocab"] - 1).bind(tok), lib.variable("start_pos", 0, s["context"] - 1).bind(s["pos"])
  return (lambda: [jit(token, pos)]), jit


@dataclass
class Side:
  """One framework's jitted (or eager) row, warmed up: call() runs it once and returns its outputs; sync() waits
  for the device."""
  call: Callable[[], list]
  sync: Callable[[], None]
  fetch: Callable[[list], list] = list    # outputs -> numpy arrays
  build_s: float = 0.0             # the warm-up calls' seconds (rulec, tinygrad: run, capture, one replay)
  kernels: int | None = None       # per call (the JIT's capture)
  peak: int | None = None          # bytes of buffers held at most during a call after the warm-up (None: not measured)
  times: list = field(default_factory=list)
  outs: list = field(default_factory=list)  # the outputs of a call after the timed ones, as numpy arrays

  def warm(self) -> "Side":
    t0 = time.perf_counter()
    for _ in range(WARMUP):
      self.call()
      self.sync()
    self.build_s = time.perf_counter() - t0
    return self

  @property
  def ms(self) -> float: return statistics.median(self.times) * 1e3


def time_side(x: Side, reps: int, budget: float) -> None:
  """`reps` timed calls, each synchronized (fewer once they pass `budget` seconds, MIN_REPS at least). The sides take
  their turns one after the other, not call by call: alternating calls made each side's idle threads (rulec's
  polling workers, torch's OpenMP threads) compete with the other's calls, slowing both."""
  while len(x.times) < MIN_REPS or (len(x.times) < reps and sum(x.times) < budget):
    t0 = time.perf_counter()
    x.call()
    x.sync()
    x.times.append(time.perf_counter() - t0)


def lib_side(lib, row: Row, s: dict) -> Side:
  call, jit = lib_call(lib, row, s)
  side = Side(call, lib.sync, lambda outs: [o.float().numpy() for o in outs]).warm()
  side.kernels = lib.kernels(jit)
  side.peak = lib.peak(call)
  return side


# ------------------------------------------------------------------------------------------------------------
# torch's side


def torch_llama(torch, s: dict, dev: str):
  """The same decode step as lib_llama, in torch: RMSNorm, q/k/v, rotary pairs, the cache write at pos, grouped-query
  attention over 0..pos, the output projection, SwiGLU, the logits."""
  kv, weights, caches, tok = llama_arrays(s)
  W = {k: torch.from_numpy(v).to(dev) for k, v in weights.items()}
  caches = [torch.from_numpy(c[:, 0]).to(dev) for c in caches]     # (2, kv_heads, context, head_dim)
  dim, heads, kvh, pos = s["dim"], s["heads"], s["kv_heads"], s["pos"]
  hd, eps = dim // heads, float(kv.get("llama.attention.layer_norm_rms_epsilon", 1e-5))
  inv = torch.from_numpy((1.0 / (10000.0 ** (np.arange(0, hd, 2, dtype=np.float64) / hd))).astype(np.float32)).to(dev)
  cos, sin = (pos * inv).cos(), (pos * inv).sin()
  def rms(x): return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)
  def rope(x):
    re, im = x[..., 0::2], x[..., 1::2]
    return torch.stack((re * cos - im * sin, re * sin + im * cos), -1).flatten(-2)
  @torch.no_grad()
  def step():
    x = W["token_embd.weight"][tok:tok + 1]
    for i, cache in enumerate(caches):
      p = f"blk.{i}."
      h = rms(x) * W[p + "attn_norm.weight"]
      q = rope((h @ W[p + "attn_q.weight"].T).view(heads, hd))
      cache[0, :, pos] = rope((h @ W[p + "attn_k.weight"].T).view(kvh, hd))
      cache[1, :, pos] = (h @ W[p + "attn_v.weight"].T).view(kvh, hd)
      keys, values = (cache[j, :, :pos + 1].repeat_interleave(heads // kvh, 0) for j in (0, 1))
      att = ((q[:, None] @ keys.transpose(-1, -2)) / math.sqrt(hd)).softmax(-1) @ values
      x = x + att.reshape(1, dim) @ W[p + "attn_output.weight"].T
      h = rms(x) * W[p + "ffn_norm.weight"]
      x = x + (torch.nn.functional.silu(h @ W[p + "ffn_gate.weight"].T) * (h @ W[p + "ffn_up.weight"].T)) @ W[p + "ffn_down.weight"].T
    return [(rms(x) * W["output_norm.weight"]) @ W["output.weight"].T]
  return step


def torch_call(torch, row: Row, s: dict, dev: str):
  if row.kind == "llama": return torch_llama(torch, s, dev)
  ins_np, w_np = arrays(row, s)
  grad = row.backward
  tdt = getattr(torch, DTYPE)
  ins = {k: torch.from_numpy(v).to(dev).to(tdt).requires_grad_(grad and k != "dout") for k, v in ins_np.items()}
  w = {k: torch.from_numpy(v).to(dev).to(tdt).requires_grad_(grad) for k, v in w_np.items()}
  cast = (lambda: torch.autocast(dev, dtype=getattr(torch, AUTOCAST))) if AUTOCAST else contextlib.nullcontext
  if not grad:
    @torch.no_grad()
    def forward():
      with cast(): return [torch_forward(torch, row, s, ins, w)]
    return forward
  targets = [t for n, t in ins.items() if n != "dout"] + list(w.values())
  def step():
    with cast(): out = torch_forward(torch, row, s, ins, w)
    return [out, *torch.autograd.grad(out, targets, ins["dout"].to(out.dtype))]
  return step


def torch_side(torch, row: Row, s: dict, dev: str) -> Side:
  side = Side(torch_call(torch, row, s, dev), torch.cuda.synchronize if dev == "cuda" else (lambda: None),
              lambda outs: [o.detach().float().cpu().numpy() for o in outs]).warm()
  if dev == "cuda":   # (on a CPU torch counts no allocations: no figure)
    torch.cuda.reset_peak_memory_stats()
    side.call()
    torch.cuda.synchronize()
    side.peak = torch.cuda.max_memory_allocated()
  return side


# ------------------------------------------------------------------------------------------------------------
# tinygrad's side: a process per row


def run_tinygrad_row(a, row: Row) -> dict:
  cmd = [sys.executable, __file__, "--side-tinygrad", row.name, "--size", a.size, "--reps", str(a.reps),
         "--budget", str(a.budget), "--dtype", a.dtype] + (["--autocast", a.autocast] if a.autocast else [])
  return run_json(cmd, {**os.environ, "DEV": a.tg_dev}, a.tg_timeout)


def side_tinygrad(a) -> None:
  row = next(r for r in ROWS if r.name == a.side_tinygrad)
  side = lib_side(tinygrad_lib(), row, SHAPES[row.kind][a.size])
  time_side(side, a.reps, a.budget)
  print(json.dumps({"ms": side.ms, "kernels": side.kernels, "peak": side.peak}))


# ------------------------------------------------------------------------------------------------------------


def max_err(got: list[np.ndarray], want: list[np.ndarray]) -> tuple[float, float]:
  """The max abs error over the arrays, and the largest of each array's max abs error over its max abs value."""
  errs = [(float(np.max(np.abs(g.astype(np.float64) - w))), float(np.max(np.abs(w)))) if g.size else (0.0, 1.0)
          for g, w in zip(got, want)]
  return max(e for e, _ in errs), max(e / (m or 1.0) for e, m in errs)


def group_notes(notes: list[tuple[str, str, str]]) -> list[str]:
  """(row, side, why) -> one line per side and reason, naming its rows."""
  by: dict[tuple[str, str], list[str]] = {}
  for row, side, why in notes: by.setdefault((side, why), []).append(row)
  return [f"{side} failed on {', '.join(rows) if len(rows) < 4 else f'{len(rows)} rows'}: {why}" for (side, why), rows in by.items()]


def commit() -> str:
  def git(*args):
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.rstrip()
  head = git("rev-parse", "--short", "HEAD").strip() or "unknown"
  dirty = git("status", "--porcelain", "--", "engine", "codegen", "runtime", "rules", "rulec").splitlines()
  return head + (f" (+ uncommitted changes to {', '.join(x[3:] for x in dirty)})" if dirty else "")


def print_kernel_times(x: Side, n: int, device: str) -> None:
  """The n slowest kernels of one call of rulec's side: device time from each launch's OpenCL event on CL, the
  host's time around each run on the CPU (whose kernels run while the host waits)."""
  from rulec.engine import realize
  seen: list = []
  hook = lambda k, sec: seen.append((k, sec))  # noqa: E731
  if device.startswith("CL"):
    from rulec.runtime import cl_device
    cl_device.EVENTS.clear()
  realize.RUN_HOOKS.append(hook)
  try:
    x.call()
    x.sync()
  finally: realize.RUN_HOOKS.remove(hook)
  if device.startswith("CL"):
    from rulec.runtime import cl_device
    times = [(e.profile.end - e.profile.start) * 1e-9 for e in cl_device.EVENTS]
    seen = [(k, t) for (k, _), t in zip(seen, times)] if len(times) == len(seen) else seen
  total = sum(t for _, t in seen)
  print(f"    kernels of one call: {len(seen)}, {total * 1e3:.3f} ms in all; the slowest:")
  for k, t in sorted(seen, key=lambda kt: -kt[1])[:n]: print(f"    {t * 1e3:9.3f} ms  {k!r}")


def measure(a, lib, torch, tdev: str, row: Row, notes: list) -> tuple[Side | None, Side | None, Side | None]:
  """rulec's, torch's and tinygrad's Side of the row, timed (None: that side is missing or failed; why goes to
  notes). rulec's and torch's outputs are left in .outs."""
  s = SHAPES[row.kind][a.size]
  sides: dict[str, Side | None] = {"rulec": None, "torch": None}
  makers = {"rulec": lambda: lib_side(lib, row, s), "torch": lambda: torch_side(torch, row, s, tdev) if torch else None}
  for name, make in makers.items():
    try:
      x = make()
      if x is None: continue
      time_side(x, a.reps, a.budget)
      x.outs = x.fetch(x.call())
      if name == "rulec" and a.kernel_times: print_kernel_times(x, a.kernel_times, a.device)
      sides[name] = x
    except Exception as e:   # (a row one side fails is reported, and the others still run)
      notes.append((row.name, name, f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"))
  r, t = sides["rulec"], sides["torch"]
  g = None
  if not a.no_tinygrad:
    res = run_tinygrad_row(a, row)
    if "error" in res: notes.append((row.name, "tinygrad", res["error"]))
    else: g = Side(list, lambda: None, kernels=res["kernels"], times=[res["ms"] * 1e-3], peak=res.get("peak"))
  return r, t, g


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--device", default="CPU", help="rulec's device: CPU or CL (torch then runs on cuda if it can)")
  ap.add_argument("--size", choices=["tiny", "small", "full"], help="the shapes (default: small on CPU, full on CL)")
  ap.add_argument("--only", help="rows whose name contains one of these comma-separated words (case ignored)")
  ap.add_argument("--reps", type=int, default=10, help="timed calls per side and row (the median is reported)")
  ap.add_argument("--budget", type=float, default=10.0, help="stop timing a side after this many seconds (>= 3 calls)")
  ap.add_argument("--no-tinygrad", action="store_true", help="leave tinygrad out")
  ap.add_argument("--no-torch", action="store_true", help="leave torch out (as if it were not installed)")
  ap.add_argument("--torch-threads", type=int, help="torch's CPU threads (default: rulec's, RULEC_THREADS or the cores)")
  ap.add_argument("--tg-dev", help="tinygrad's device (default: CPU, or CL with --device CL)")
  ap.add_argument("--tg-timeout", type=int, default=600, help="seconds tinygrad may take on one row")
  ap.add_argument("--kernel-times", type=int, default=0, metavar="N",
                  help="after each row, rulec's N slowest kernels of one call (device time on CL, RULEC_CL_PROFILE)")
  ap.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default="float32",
                  help="the rows' dtype on every side (the LLaMA row stays float32)")
  ap.add_argument("--autocast", choices=["float16", "bfloat16"],
                  help="float32 inputs and weights, matmuls and convolutions in this dtype (torch: torch.autocast)")
  ap.add_argument("--side-tinygrad", help=argparse.SUPPRESS)
  a = ap.parse_args()
  global DTYPE, AUTOCAST
  DTYPE, AUTOCAST = a.dtype, a.autocast
  a.device = a.device.upper()
  if a.kernel_times and a.device.startswith("CL"): os.environ["RULEC_CL_PROFILE"] = "1"   # (before the device opens)
  a.size = a.size or ("small" if a.device.startswith("CPU") else "full")
  a.tg_dev = a.tg_dev or ("CPU" if a.device.startswith("CPU") else "CL")
  if a.side_tinygrad: return side_tinygrad(a)

  import textgen
  textgen.use_device(a.device)
  from rulec.runtime.cpu_device import threads
  lib = rulec_lib(a.device)
  torch, tdev, torch_note = None, "cpu", "torch: not installed (its columns are empty)"
  if not a.no_torch:
    try:
      import torch
      tdev = "cuda" if not a.device.startswith("CPU") and torch.cuda.is_available() else "cpu"
      if tdev == "cuda": torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
      else: torch.set_num_threads(a.torch_threads or threads())
      torch_note = f"torch {torch.__version__} eager on {tdev}" + (f", {torch.get_num_threads()} thread(s)" if tdev == "cpu" else ", TF32 off")
    except ImportError: torch = None
  else: torch_note = "torch: left out (--no-torch)"
  if not a.no_tinygrad and importlib.util.find_spec("tinygrad") is None: a.no_tinygrad, tg_note = True, "tinygrad: not installed"
  else: tg_note = "tinygrad: left out" if a.no_tinygrad else f"tinygrad 0.14 TinyJit on DEV={a.tg_dev}, a process per row"
  print(f"machine: {machine()}")
  if a.device.startswith("CL"):
    from rulec.runtime import cl_device
    print(f"GPU: {cl_device.get_device()}" + (f"; torch: {torch.cuda.get_device_name(0)}" if tdev == "cuda" else ""))
  print(f"commit {commit()}; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
  print(f"rulec on {a.device}" + (f", {threads()} thread(s)" if a.device.startswith("CPU") else "") +
        f"; {torch_note}; {tg_note}; size {a.size}; dtype {a.dtype}{f', autocast {a.autocast}' if a.autocast else ''}; median of up to {a.reps} calls (>= {MIN_REPS}, {a.budget:g} s budget)")
  sys.stdout.flush()

  rows = [r for r in ROWS if not a.only or any(w.strip().lower() in r.name.lower() for w in a.only.split(","))]
  body, ratios, notes = [], {"torch": {}, "tinygrad": {}}, []
  for row in rows:
    t0 = time.perf_counter()
    r, t, g = measure(a, lib, torch, tdev, row, notes)
    s = SHAPES[row.kind][a.size]
    amount, unit = work(row, s)
    rate = amount / (r.ms * 1e-3) / (1e12 if unit == "TFLOP/s" else 1e9) if r else None
    err = grad_err = None
    if r and t:
      err = f"{max_err(r.outs[:1], t.outs[:1])[0]:.1e}"
      if row.backward: grad_err = "{:.1e} ({:.0e})".format(*max_err(r.outs[1:], t.outs[1:]))
    for side, x in (("torch", t), ("tinygrad", g)):
      if r and x: ratios[side][row.name] = x.ms / r.ms
    body.append([f"{row.name} {describe(row.kind, s)}", fmt(r and r.ms), f"{fmt(rate)} {unit}" if r else "-",
                 fmt(t and t.ms), fmt(ratios["torch"].get(row.name)), fmt(g and g.ms),
                 fmt(ratios["tinygrad"].get(row.name)), str(r.kernels) if r else "-",
                 "/".join(f"{x.peak / 2**20:.1f}" if x and x.peak is not None else "-" for x in (r, t, g)), err or "-",
                 grad_err or "-"])
    print(f"  done {row.name}: rulec {fmt(r and r.ms)} ms ({r.kernels if r else '-'} kernels, run + capture + one replay "
          f"{fmt(r and r.build_s)} s, {len(r.times) if r else 0} timed), torch {fmt(t and t.ms)} ms, tinygrad "
          f"{fmt(g and g.ms)} ms ({g.kernels if g else '-'} kernels) [{time.perf_counter() - t0:.0f} s]")
    sys.stdout.flush()
  print()
  print_table(["row", "rulec ms", "rulec rate", "torch ms", "torch/rulec", "tinygrad ms", "tinygrad/rulec", "kernels",
               "peak MiB r/t/tg", "err out", "err grads (rel)"], body)
  for n in group_notes(notes): print(f"note: {n}")
  for side, by in ratios.items():
    geo = math.exp(statistics.fmean(math.log(v) for v in by.values())) if by else float("nan")
    print(f"ratios {side} ms / rulec ms (> 1: rulec faster): " +
          (" ".join(f"{k.replace(' ', '_')}={v:.2f}" for k, v in by.items()) or "none") + f" geomean={geo:.3f}")


if __name__ == "__main__":
  main()
