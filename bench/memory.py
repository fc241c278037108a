"""Peak memory of whole training steps: rulec beside tinygrad 0.14 and torch, same model, same run.

    python bench/memory.py [--layers 2] [--seq 128] [--batch 1] [--dim 768] [--heads 12] [--vocab 50257]
                           [--only gpt2,mlp] [--no-torch] [--no-tinygrad]

The steps (each in a process of its own per side, so one side's buffers never count in another's figures):
  gpt2   a GPT-2 training step: token and position embeddings, `--layers` pre-norm blocks (causal attention, a
         4x MLP with gelu), the final LayerNorm, logits over the vocabulary tied to the token embedding,
         cross-entropy against the next tokens, backward, an AdamW update of every weight. GPT-2 small's shape by
         default (dim 768, 12 heads, vocab 50257); `--layers 12 --seq 1024` is the whole model.
  mlp    a 3-layer MLP (784-2048-2048-10, batch 256) with Adam: the jitted step of bench/train.py's kind.

Each side builds the model in its own API (rulec and tinygrad share the code below: tinygrad's Tensor API), runs
the step under its TinyJit (torch: eager), and reports, for the fourth call (a replay of the JIT's capture):
  peak MiB   the most memory its buffers held at once during the call: rulec's runtime/buffer.py counter (bytes
             of every buffer that has storage), tinygrad's GlobalCounters.mem_used followed through every buffer
             allocation, torch's torch.cuda.max_memory_allocated() on a GPU; on a CPU torch has no allocator
             counter, so its column is the growth of the process's peak resident memory (ru_maxrss) over the four
             calls, beyond what it held after building the model and optimizer (an upper bound of the same thing);
  held MiB   what stays allocated after the call (weights, gradients, optimizer state, the JIT's buffers).
tinygrad runs on DEV=NULL: its allocator counts every buffer as any device would, and no kernel runs (its CPU
device needs clang, which this machine lacks); its memory planner runs as on every device. rulec runs on its
CPU device for real, and with RULEC_MEMORY_PLAN=0 as well (the column "rulec unplanned"), so the planner's part
is visible. Ratios are the other's peak over rulec's (> 1: rulec needs less).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MiB = 1 << 20
CALLS = 4


# *** the model, in tinygrad's Tensor API (rulec's and tinygrad's) ***

def gpt2_step(T, nn, a):
  """(the jitted step, a function making its inputs) for a GPT-2 of a's shape."""
  V, D, H, L, S, B = a.vocab, a.dim, a.heads, a.layers, a.seq, a.batch

  class Block:
    def __init__(self):
      self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
      self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
      self.fc, self.out = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)

    def __call__(self, x):
      q, k, v = [t.reshape(B, S, H, D // H).transpose(1, 2) for t in self.qkv(self.ln1(x)).chunk(3, dim=-1)]
      att = q.scaled_dot_product_attention(k, v, is_causal=True).transpose(1, 2).reshape(B, S, D)
      x = x + self.proj(att)
      return x + self.out(self.fc(self.ln2(x)).gelu())

  class GPT:
    def __init__(self):
      self.wte, self.wpe = nn.Embedding(V, D), nn.Embedding(S, D)
      self.blocks = [Block() for _ in range(L)]
      self.ln_f = nn.LayerNorm(D)

    def __call__(self, tok):
      x = self.wte(tok) + self.wpe(T.arange(S).reshape(1, S))
      for b in self.blocks: x = b(x)
      return self.ln_f(x) @ self.wte.weight.T

  model = GPT()
  params = nn.state.get_parameters(model)
  opt = nn.optim.AdamW(params, lr=1e-4)

  def step(tok, target):
    opt.zero_grad()
    loss = model(tok).sparse_categorical_crossentropy(target)
    loss.backward()
    opt.step()
    if a.drop_grads: opt.zero_grad()
    return loss

  def inputs(rng):
    toks = rng.integers(0, V, (B, S + 1))
    return toks[:, :-1].astype("int32"), toks[:, 1:].astype("int32")
  return step, params, inputs


def mlp_step(T, nn, a):
  layers = [nn.Linear(784, 2048), nn.Linear(2048, 2048), nn.Linear(2048, 10)]
  params = nn.state.get_parameters(layers)
  opt = nn.optim.Adam(params, lr=1e-3)

  def step(x, y):
    opt.zero_grad()
    loss = layers[2](layers[1](layers[0](x).relu()).relu()).sparse_categorical_crossentropy(y)
    loss.backward()
    opt.step()
    if a.drop_grads: opt.zero_grad()
    return loss

  def inputs(rng): return rng.standard_normal((256, 784)).astype("float32"), rng.integers(0, 10, 256).astype("int32")
  return step, params, inputs


STEPS = {"gpt2": gpt2_step, "mlp": mlp_step}


# *** one side, in its own process ***

def side_lib(side: str):
  if side == "tinygrad":
    os.environ["DEV"] = "NULL"
    os.environ["TRAINING"] = "1"
    from tinygrad import Tensor, TinyJit, nn
    from tinygrad.helpers import GlobalCounters
    import tinygrad.device as tdev
    peak = [0]
    alloc = tdev.Buffer.allocate
    def counted(self, *args, **kw):   # (the peak: mem_used after every allocation)
      out = alloc(self, *args, **kw)
      peak[0] = max(peak[0], GlobalCounters.mem_used)
      return out
    tdev.Buffer.allocate = counted
    def reset(): peak[0] = GlobalCounters.mem_used
    return Tensor, TinyJit, nn, reset, lambda: peak[0], lambda: GlobalCounters.mem_used
  sys.path.insert(0, str(ROOT))
  from rulec import Tensor, TinyJit, nn
  from rulec.runtime import buffer as membuf
  return Tensor, TinyJit, nn, membuf.reset_peak, membuf.memory_peak, membuf.memory_used


def run_side(side: str, name: str, a) -> dict:
  import numpy as np
  rng = np.random.default_rng(0)
  if side == "torch": return run_torch(name, a, rng)
  Tensor, TinyJit, nn, reset, peak, used = side_lib(side)
  Tensor.manual_seed(0)
  step, params, inputs = STEPS[name](Tensor, nn, a)
  jitted = TinyJit(lambda x, y: step(x, y))
  Tensor.training = True
  Tensor.realize(*params)
  out = {}
  for i in range(CALLS):
    x, y = (Tensor(v) for v in inputs(rng))
    Tensor.realize(x, y)
    reset()
    before = used()
    loss = jitted(x, y)
    out = {"peak": peak(), "held": used(), "before": before}
    if side == "rulec": out["loss"] = float(loss.numpy())   # (tinygrad's NULL device has nothing to read back)
  return out


def run_torch(name: str, a, rng) -> dict:
  import torch
  import torch.nn.functional as F
  dev = "cuda" if torch.cuda.is_available() else "cpu"
  torch.manual_seed(0)
  if name == "mlp":
    model = torch.nn.Sequential(torch.nn.Linear(784, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 2048),
                                torch.nn.ReLU(), torch.nn.Linear(2048, 10)).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    def loss_of(x, y): return F.cross_entropy(model(x), y)
    def inputs(): return (torch.tensor(rng.standard_normal((256, 784)).astype("float32"), device=dev),
                          torch.tensor(rng.integers(0, 10, 256), device=dev))
  else:
    V, D, H, L, S, B = a.vocab, a.dim, a.heads, a.layers, a.seq, a.batch
    class Block(torch.nn.Module):
      def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(D), torch.nn.LayerNorm(D)
        self.qkv, self.proj = torch.nn.Linear(D, 3 * D), torch.nn.Linear(D, D)
        self.fc, self.out = torch.nn.Linear(D, 4 * D), torch.nn.Linear(4 * D, D)
      def forward(self, x):
        q, k, v = [t.reshape(B, S, H, D // H).transpose(1, 2) for t in self.qkv(self.ln1(x)).chunk(3, dim=-1)]
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, S, D)
        x = x + self.proj(att)
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))
    class GPT(torch.nn.Module):
      def __init__(self):
        super().__init__()
        self.wte, self.wpe = torch.nn.Embedding(V, D), torch.nn.Embedding(S, D)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(L))
        self.ln_f = torch.nn.LayerNorm(D)
      def forward(self, tok):
        x = self.wte(tok) + self.wpe(torch.arange(S, device=tok.device).reshape(1, S))
        for b in self.blocks: x = b(x)
        return self.ln_f(x) @ self.wte.weight.T
    model = GPT().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    def loss_of(x, y): return F.cross_entropy(model(x).reshape(-1, V), y.reshape(-1))
    def inputs():
      toks = torch.tensor(rng.integers(0, V, (B, S + 1)), device=dev)
      return toks[:, :-1], toks[:, 1:]
  def step(x, y):
    opt.zero_grad(set_to_none=True)
    loss = loss_of(x, y)
    loss.backward()
    opt.step()
    if a.drop_grads: opt.zero_grad(set_to_none=True)
    return loss
  rss = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
  base = rss()
  for i in range(CALLS):
    x, y = inputs()
    if dev == "cuda":
      torch.cuda.synchronize()
      torch.cuda.reset_peak_memory_stats()
    loss = float(step(x, y))
    if dev == "cuda": out = {"peak": torch.cuda.max_memory_allocated(), "held": torch.cuda.memory_allocated()}
    else: out = {"peak": rss() - base, "held": None, "rss": True}
    out["loss"] = loss
  return out


# *** the table ***

def in_process(side: str, name: str, argv: list[str], env: dict | None = None) -> dict | None:
  cmd = [sys.executable, __file__, "--side", side, "--only", name, *argv]
  r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})})
  line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
  if line is None:
    print(f"  ({side} {name} failed: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode})")
    return None
  return json.loads(line[7:])


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--layers", type=int, default=2)
  ap.add_argument("--seq", type=int, default=128)
  ap.add_argument("--batch", type=int, default=1)
  ap.add_argument("--dim", type=int, default=768)
  ap.add_argument("--heads", type=int, default=12)
  ap.add_argument("--vocab", type=int, default=50257)
  ap.add_argument("--only", default="gpt2,mlp")
  ap.add_argument("--drop-grads", action="store_true",
                  help="the step ends with opt.zero_grad(): no gradient is held after it (a JIT may reuse their memory)")
  ap.add_argument("--side", help=argparse.SUPPRESS)
  ap.add_argument("--no-torch", action="store_true")
  ap.add_argument("--no-tinygrad", action="store_true")
  a = ap.parse_args()
  names = [n for n in a.only.split(",") if n]
  if a.side:
    print("RESULT " + json.dumps(run_side(a.side, names[0], a)))
    return
  argv = [f"--{k}={getattr(a, k)}" for k in ("layers", "seq", "batch", "dim", "heads", "vocab")]
  if a.drop_grads: argv.append("--drop-grads")
  print(f"machine: {platform.processor() or platform.machine()} ({platform.system()}), {os.cpu_count()} CPUs; "
        f"rulec on CPU, tinygrad 0.14 on DEV=NULL (allocations counted, no kernels run), torch eager")
  print(f"gpt2: {a.layers} layers, seq {a.seq}, batch {a.batch}, dim {a.dim}, heads {a.heads}, vocab {a.vocab}; "
        f"figures of call {CALLS} (a JIT replay), MiB" + ("; each step ends with opt.zero_grad()" if a.drop_grads else ""))
  head = (f"{'step':<6} {'rulec peak':>10} {'held':>8} {'unplanned':>10} {'tinygrad':>9} {'held':>8} {'tg/rulec':>9} "
          f"{'torch':>9} {'torch/rulec':>11}")
  print(head)
  print("-" * len(head))
  ratios = []
  for name in names:
    r = in_process("rulec", name, argv)
    u = in_process("rulec", name, argv, {"RULEC_MEMORY_PLAN": "0"})
    t = None if a.no_tinygrad else in_process("tinygrad", name, argv)
    p = None if a.no_torch else in_process("torch", name, argv)
    mib = lambda d, k: f"{d[k] / MiB:.1f}" if d and d.get(k) is not None else "-"
    ratio = lambda d: f"{d['peak'] / r['peak']:.2f}" if d and r and r["peak"] else "-"
    tcol = mib(p, "peak") + (" rss" if p and p.get("rss") else "")
    print(f"{name:<6} {mib(r, 'peak'):>10} {mib(r, 'held'):>8} {mib(u, 'peak'):>10} {mib(t, 'peak'):>9} "
          f"{mib(t, 'held'):>8} {ratio(t):>9} {tcol:>9} {ratio(p):>11}", flush=True)
    if r and t: ratios.append(t["peak"] / r["peak"])
  if ratios: print(f"tinygrad peak / rulec peak, geomean: {math.exp(sum(map(math.log, ratios)) / len(ratios)):.2f}")


if __name__ == "__main__":
  main()
