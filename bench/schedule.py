"""Scheduling: kernels and scheduling time, rulec against tinygrad 0.14, same programs, same run.

Every program is one function of the Tensor class `T` and an input maker
`make(*shape)`, so both front ends build the identical graph. It is built fresh
for every repetition (inputs are buffers on both sides: rulec tensors made from
numpy arrays, tinygrad `Tensor.empty`; `check_inputs` makes sure scheduling an
input alone is no kernel in either), then scheduled without running: rulec
`Tensor.schedule` with its schedule cache cleared, tinygrad `linear_with_vars` with its schedule cache cleared,
so both do the real work every time. Medians of REPEATS runs after a warm-up.

Kernels are compiled kernels: for tinygrad the SINK calls of the linear
schedule. tinygrad's device-to-device COPY calls (plain memcpys) are counted
apart, in the `tg copies` column; rulec has no such calls (a copy to another
host device is a store inside a kernel, or nothing when the kernel that needs
the value can read the source buffer directly).

A target that is only a view of an input (a slice, a permute) stays a view
and gets no kernel in either front end.

Needs `pip install '.[bench]'` (tinygrad==0.14.0) and Debian's `clang`
(tinygrad's CPU device looks for it when it starts). Run: python bench/schedule.py
(`--check` also runs every program in both front ends on the same random inputs and compares the outputs;
`--fresh-memo` forgets rulec's shape-keyed index answers before every schedule;
`--models` schedules the model-sized programs instead, each cold in a new process and then warm: a 12-layer GPT-2
at T 1024 forward and training step, ResNet-50 forward and training step, a 1000-op elementwise chain)

The last three programs are backward passes: the loss of a forward program and its gradients for every input,
through `Tensor.gradient` in both front ends (rulec's gradients come from rules/gradient.rules).
"""
from __future__ import annotations

import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("DEV", "CPU")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import tinygrad  # noqa: E402
import tinygrad.schedule as tg_schedule  # noqa: E402
from tinygrad import Tensor as TT  # noqa: E402

from rulec.engine.sched import cache as schedule_cache  # noqa: E402
from rulec.engine.sched import symbolic  # noqa: E402
from rulec.engine.tensor import Tensor as RT  # noqa: E402

REPEATS = 7
# --fresh-memo: also forget the index and guard answers rulec's symbolic rules keep by their shape across graphs
# (engine/sched/symbolic.py _Fitter.shaped), so each graph pays for all of its own fitting; by default they are
# kept, as tinygrad keeps its own process-wide caches (only its schedule cache is cleared)
FRESH_MEMO = "--fresh-memo" in sys.argv[1:]


def mlp(T, make):
  x, w1, b1, w2, b2 = make(64, 784), make(784, 256), make(256), make(256, 10), make(10)
  return ((x @ w1 + b1).relu() @ w2 + b2,)


def conv_block(T, make):
  x, w, b = make(8, 3, 32, 32), make(16, 3, 3, 3), make(16)
  return (x.conv2d(w, b, padding=1).relu().max_pool2d(2),)


def attention(T, make):
  seq, dim, heads = 128, 256, 4
  hd = dim // heads
  x, wq, wk, wv, wo = make(seq, dim), make(dim, dim), make(dim, dim), make(dim, dim), make(dim, dim)
  q = (x @ wq).reshape(seq, heads, hd).permute(1, 0, 2)
  k = (x @ wk).reshape(seq, heads, hd).permute(1, 0, 2)
  v = (x @ wv).reshape(seq, heads, hd).permute(1, 0, 2)
  att = (q @ k.permute(0, 2, 1) * (1 / math.sqrt(hd))).softmax(-1)
  y = (att @ v).permute(1, 0, 2).reshape(seq, dim) @ wo
  return ((x + y).layernorm(),)


def softmax(T, make): return (make(1024, 1024).softmax(-1),)
def layernorm(T, make): return (make(1024, 1024).layernorm(),)


def contiguous(T, make):
  a, b = make(256, 256), make(256, 256)
  return ((a + b).contiguous(),)   # one kernel, as (a + b) is


def strided_slicing(T, make):
  x = make(8, 16, 32)
  return (x[2:6], x[::2], x[::-1], x[None, ..., 1], x[..., 1:3], x[1:3] * 2, x[:, ::2] + 1)


def arg_variants(T, make):
  x = make(64, 128)
  y = x * 2 + 1
  return (x.argmax(0), x.argmax(1), x.argmin(1, keepdim=True), x.argmax(), y.argmin(0), y.argmax(-1, keepdim=True))


def movement_chains(T, make):
  x = make(16, 32, 64)
  a = x.permute(2, 0, 1).reshape(64, 512).transpose(0, 1)
  b = (x.transpose(0, 2) * 2).reshape(64, 16, 32).permute(1, 2, 0) + 1
  c = x.reshape(16, 2048).T.reshape(32, 64, 16).permute(2, 0, 1) - x
  return (a, b, c)


def small_cnn(T, make):
  x, w, b, w2, b2 = make(8, 1, 28, 28), make(8, 1, 3, 3), make(8), make(8 * 14 * 14, 10), make(10)
  h = x.conv2d(w, b, padding=1).relu().max_pool2d(2)
  return ((h.flatten(1) @ w2 + b2).softmax(-1),)


def chained_means(T, make):
  x = make(32, 64, 128)
  m = x.mean(0)
  return (((m * 2).mean(0) + 1).mean(0), x.mean(2).mean(1) - m.mean(1).mean(0))


def batched_matmul(T, make):
  a, w, b = make(8, 64, 32), make(32, 48), make(48)            # (B,M,K) @ (K,N) + bias
  c, v, d = make(4, 1, 16, 32), make(3, 32, 24), make(24)      # (B,1,M,K) @ (N,K,P) + bias
  return (a @ w + b, c @ v + d)


# *** model-sized programs (#36): the graphs of whole models, scheduled as they are; run by --models ***

def _gpt2(T, make, layers=12, batch=1, seq=1024, dim=768, heads=12, vocab=50257):
  """GPT-2 small's forward from its input embeddings (token + position, as a buffer: the lookup is one gather)
  to the logits over the whole vocabulary, with every weight an input: (logits, the weights)."""
  hd = dim // heads
  ws = []
  def w(*s):
    ws.append(make(*s))
    return ws[-1]
  def norm(x, g, b): return x.layernorm() * g + b
  x = make(batch, seq, dim)
  mask = make(seq, seq)   # (the causal mask as an input: 0 or -inf)
  for _ in range(layers):
    g1, b1, wqkv, bqkv, wo, bo = w(dim), w(dim), w(dim, 3 * dim), w(3 * dim), w(dim, dim), w(dim)
    g2, b2, w1, c1, w2, c2 = w(dim), w(dim), w(dim, 4 * dim), w(4 * dim), w(4 * dim, dim), w(dim)
    qkv = norm(x, g1, b1) @ wqkv + bqkv
    q, k, v = [qkv[:, :, i * dim:(i + 1) * dim].reshape(batch, seq, heads, hd).transpose(1, 2) for i in range(3)]
    att = (q @ k.transpose(-1, -2) * (1 / math.sqrt(hd)) + mask).softmax(-1)
    x = x + (att @ v).transpose(1, 2).reshape(batch, seq, dim) @ wo + bo
    x = x + (norm(x, g2, b2) @ w1 + c1).gelu() @ w2 + c2
  gf, bf, wte = w(dim), w(dim), w(vocab, dim)
  return norm(x, gf, bf) @ wte.transpose(0, 1), ws


def gpt2_forward(T, make): return (_gpt2(T, make)[0],)


def gpt2_train_step(T, make):
  """A training step: cross-entropy against one-hot targets (a buffer), every gradient, and an SGD update of every
  weight."""
  logits, ws = _gpt2(T, make)
  target = make(*logits.shape)
  loss = -(logits.log_softmax(-1) * target).sum() * (1 / (logits.shape[0] * logits.shape[1]))
  return (loss, *(p - g * 1e-4 for p, g in zip(ws, loss.gradient(*ws))))


def _resnet50(T, make, batch=1, size=224, classes=1000):
  """ResNet-50's forward (training-mode batch norm: each batch's statistics): (logits, the weights)."""
  ws = []
  def w(*s):
    ws.append(make(*s))
    return ws[-1]
  def bn(x):
    c = x.shape[1]
    g, b = w(1, c, 1, 1), w(1, c, 1, 1)
    mean = x.mean(axis=(0, 2, 3), keepdim=True)
    var = ((x - mean) * (x - mean)).mean(axis=(0, 2, 3), keepdim=True)
    return (x - mean) * (var + 1e-5).rsqrt() * g + b
  def conv(x, cout, k, stride=1):
    return x.conv2d(w(cout, x.shape[1], k, k), stride=stride, padding=k // 2)
  x = make(batch, 3, size, size)
  x = bn(conv(x, 64, 7, 2)).relu().max_pool2d(kernel_size=3, stride=2, padding=1)
  for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
    for i in range(blocks):
      s = stride if i == 0 else 1
      h = bn(conv(x, width, 1)).relu()
      h = bn(conv(h, width, 3, s)).relu()
      h = bn(conv(h, width * 4, 1))
      short = bn(conv(x, width * 4, 1, s)) if i == 0 else x
      x = (h + short).relu()
  fc, fb = w(2048, classes), w(classes)
  return x.mean(axis=(2, 3)) @ fc + fb, ws


def resnet50_forward(T, make): return (_resnet50(T, make)[0],)


def resnet50_train_step(T, make):
  logits, ws = _resnet50(T, make)
  target = make(*logits.shape)
  loss = -(logits.log_softmax(-1) * target).sum() * (1 / logits.shape[0])
  return (loss, *(p - g * 1e-4 for p, g in zip(ws, loss.gradient(*ws))))


def chain_1000(T, make):
  """1,000 elementwise ops (sin, a maximum every third step, a mean-centering every fifth) on 64x64."""
  x = make(64, 64)
  y, ops = x, 0
  while ops < 1000:
    y, ops = (y * 1.0001 + 0.5).sin(), ops + 3
    if ops % 9 == 0: y, ops = y.maximum(x), ops + 1
    if ops % 15 == 0: y, ops = y - y.mean(), ops + 2
  return (y,)


MODEL_PROGRAMS = {"GPT-2 12L T1024 forward": gpt2_forward, "GPT-2 12L T1024 train step": gpt2_train_step,
                  "ResNet-50 forward": resnet50_forward, "ResNet-50 train step": resnet50_train_step,
                  "1000-op chain": chain_1000}


# a second device on the host for each front end: rulec's NUMPY reference device (CPU when that is
# the default), tinygrad's PYTHON device (it schedules like any other: kernels and COPY calls)
def other_device(T, here: str) -> str:
  if T is RT: return "CPU" if here == "NUMPY" else "NUMPY"
  return "PYTHON"


def to_round_trip(T, make):
  x = make(256, 256)
  here = x.device
  y = (x.to(other_device(T, here)) * 2 + 1).to(here)
  return (y - x,)


def backward_of(prog):
  """The program's first output summed into a loss, with the loss's gradients for every input (a training step's
  backward pass: forward and backward scheduled together)."""
  def backward(T, make):
    inputs = []
    def made(*s):
      inputs.append(make(*s))
      return inputs[-1]
    loss = prog(T, made)[0].sum()
    return (loss, *loss.gradient(*inputs))
  return backward


PROGRAMS = {"MLP 64x784-256-10": mlp, "conv block 8x3x32x32": conv_block, "attention 128x256x4": attention,
            "softmax 1024x1024": softmax, "layernorm 1024x1024": layernorm, "contiguous": contiguous,
            "strided slicing": strided_slicing, "argmax/argmin variants": arg_variants,
            "permute/reshape chains": movement_chains, "small CNN": small_cnn, "chained means": chained_means,
            "batched bcast matmul": batched_matmul, ".to() round trip": to_round_trip,
            "MLP backward": backward_of(mlp), "conv block backward": backward_of(conv_block),
            "attention backward": backward_of(attention)}


def rulec_make(*s): return RT(np.zeros(s, dtype=np.float32))
def tinygrad_make(*s): return TT.empty(*s)


def rulec_run(prog):
  # inputs are real buffers (Tensor.zeros would be a constant the scheduler folds away)
  outs = prog(RT, rulec_make)
  schedule_cache.clear()   # the real work every time, as tinygrad's cache is cleared
  if FRESH_MEMO: symbolic.forget_shapes()
  t0 = time.perf_counter()
  kernels = RT.schedule(*outs)
  return time.perf_counter() - t0, len(kernels), 0


def tinygrad_calls(outs) -> tuple[int, int]:
  """Kernels (SINK calls) and device copies (COPY calls) in tinygrad's linear schedule of outs."""
  linear, _ = TT.linear_with_vars(*outs)
  kinds = [call.src[0].op.name for call in linear.src]
  return kinds.count("SINK"), kinds.count("COPY")


def tinygrad_run(prog):
  outs = prog(TT, tinygrad_make)
  tg_schedule.schedule_cache.clear()
  t0 = time.perf_counter()
  kernels, copies = tinygrad_calls(outs)
  return time.perf_counter() - t0, kernels, copies


def check_inputs():
  """An input is a buffer on both sides: scheduling it alone makes no kernel and no copy."""
  r, t = len(RT.schedule(rulec_make(4, 4))), tinygrad_calls([tinygrad_make(4, 4)])
  if r or any(t): raise RuntimeError(f"an input alone scheduled work: rulec {r} kernels, tinygrad {t} (kernels, copies)")


def machine() -> str:
  return (f"machine: {platform.processor() or platform.machine()} ({platform.system()} {platform.release()}), "
          f"{os.cpu_count()} CPUs, Python {platform.python_version()}, tinygrad {tinygrad.__version__ if hasattr(tinygrad, '__version__') else '0.14'}")


def check_same_results(seed: int = 0) -> None:
  """Both front ends compute the same values for every program (same random inputs; runs the kernels)."""
  for name, prog in PROGRAMS.items():
    rng = np.random.default_rng(seed)
    arrays: list[np.ndarray] = []
    def numpy_make(*s):
      arrays.append(rng.standard_normal(s).astype(np.float32))
      return arrays[-1]
    outs = prog(RT, lambda *s: RT(numpy_make(*s)))
    RT.realize(*outs)
    got = [o.numpy() for o in outs]
    it = iter(arrays)
    want = [o.numpy() for o in prog(TT, lambda *s: TT(next(it)))]
    for i, (g, w) in enumerate(zip(got, want)):
      # float32 rounding differs with the order of a sum: the error allowed grows with the values
      if g.shape != w.shape or np.abs(g.astype(np.float64) - w).max(initial=0) > 1e-4 * max(1.0, np.abs(w).max(initial=0)):
        raise AssertionError(f"{name}: output {i} differs (shapes {g.shape} / {w.shape})")
  print(f"--check: rulec and tinygrad agree on all {len(PROGRAMS)} programs")


def one_model(name: str, front: str) -> None:
  """--one NAME FRONT (a child process of --models): schedule the model program cold (this process's first
  schedule: imports done, matchers loaded from the disk cache or compiled) and then warm (a fresh graph of the
  same program), and print both."""
  run = rulec_run if front == "rulec" else tinygrad_run
  cold, kernels, _ = run(MODEL_PROGRAMS[name])
  warm, _, _ = run(MODEL_PROGRAMS[name])
  print(f"RESULT {cold} {warm} {kernels}")


def models() -> None:
  """--models: the model-sized programs, rulec and tinygrad, each cold in a process of its own and then warm."""
  import subprocess
  print(machine())
  print("model-sized programs: scheduling only, cold = the first schedule in a new process (after imports), warm = "
        "a fresh graph of the same program in that process")
  head = (f"{'program':<28} {'rulec cold s':>12} {'tg cold s':>10} {'cold x':>7} {'rulec warm s':>12} {'tg warm s':>10} "
          f"{'warm x':>7} {'rulec kernels':>14} {'tg kernels':>11}")
  print(head)
  print("-" * len(head))
  for name in MODEL_PROGRAMS:
    got = {}
    for front in ("rulec", "tinygrad"):
      out = subprocess.run([sys.executable, __file__, "--one", name, front], capture_output=True, text=True)
      line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
      if line is None: raise SystemExit(f"{front} {name} failed:\n{out.stderr[-2000:]}")
      cold, warm, k = line.split()[1:]
      got[front] = (float(cold), float(warm), int(k))
    (rc, rw, rk), (tc, tw, tk) = got["rulec"], got["tinygrad"]
    print(f"{name:<28} {rc:>12.2f} {tc:>10.2f} {tc / rc:>7.2f} {rw:>12.2f} {tw:>10.2f} {tw / rw:>7.2f} {rk:>14} {tk:>11}",
          flush=True)


def main():
  if sys.argv[1:2] == ["--one"]: return one_model(sys.argv[2], sys.argv[3])
  if "--models" in sys.argv[1:]: return models()
  check_inputs()
  if "--check" in sys.argv[1:]: check_same_results()
  rows = []
  for name, prog in PROGRAMS.items():
    rulec_run(prog), tinygrad_run(prog)   # warm-up: matcher compilation, imports
    r = [rulec_run(prog) for _ in range(REPEATS)]
    t = [tinygrad_run(prog) for _ in range(REPEATS)]
    rows.append((name, statistics.median(x[0] for x in r), r[0][1], statistics.median(x[0] for x in t), t[0][1], t[0][2]))
  print(machine())
  print(f"scheduling only (no compile, no run), median of {REPEATS} fresh graphs; tinygrad schedule cache cleared each time; "
        + ("rulec's shape-keyed index answers forgotten each time (--fresh-memo)" if FRESH_MEMO else
           "rulec's shape-keyed index answers kept across graphs (--fresh-memo forgets them)"))
  head = (f"{'program':<24} {'rulec ms':>9} {'tinygrad ms':>12} {'speedup':>8} {'rulec kernels':>14} "
          f"{'tinygrad kernels':>17} {'tg copies':>10}")
  print(head)
  print("-" * len(head))
  for name, rt, rk, tt, tk, tc in rows:
    print(f"{name:<24} {rt * 1e3:>9.2f} {tt * 1e3:>12.2f} {tt / rt:>8.2f} {rk:>14} {tk:>17} {tc:>10}")
  speed = math.exp(statistics.fmean(math.log(tt / rt) for _, rt, _, tt, _, _ in rows))
  kern = math.exp(statistics.fmean(math.log(rk / tk) for _, _, rk, _, tk, _ in rows))
  print(f"schedule_speedup_vs_tinygrad={speed:.2f} kernels_vs_tinygrad={kern:.2f}")
  more = [name for name, _, rk, _, tk, _ in rows if rk > tk]
  fewer = sum(1 for _, _, rk, _, tk, _ in rows if rk < tk)
  print(f"rulec schedules more kernels than tinygrad on {len(more)} of {len(rows)} programs"
        + (f": {', '.join(more)}" if more else "") + f" (fewer on {fewer})")


if __name__ == "__main__":
  main()
