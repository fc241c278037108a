"""Whole models end to end: GPT-2 and LLaMA generation in tokens/s, rulec beside tinygrad 0.14 and torch, in one run.

    python bench/generate.py [--model gpt2|llama] [--size gpt2] [--layers N] [--prompt 8] [--tokens 32] [--device CPU]
                             [--tinygrad PATH] [--tg-dev CPU] [--only rulec,rulec-tgfile,tinygrad,torch]

--model llama runs examples/llama.py's model (and tinygrad's extra/models/llama.py) at a LLaMA-shaped config of
GPT-2-small's cost: width 768, 12 layers, 12 heads over 4 KV heads, SwiGLU width 2048, a 32000-token vocabulary,
random weights (no GGUF file is read: the bench builds the model from the arrays, as examples/llama.py's `load`
does after reading one). torch has no LLaMA side here.

Every side generates greedily from the same prompt with random weights of GPT-2's shapes (124M parameters at
--size gpt2), each in a fresh process, and reports the steady rate: the median seconds of the one-token steps
after the first three (those build and capture kernels), as tokens/s. The first step's seconds and the kernels
built are reported beside it: they are what a user waits for before the first token.

  rulec          examples/gpt2.py: TinyJit over a KV cache of --context positions, the position a bound Variable.
  rulec-tgfile   tinygrad's own examples/gpt2.py (needs --tinygrad PATH, a checkout with examples/) run
                 unchanged on rulec through rulec.tinygrad_alias: the position and the token are bound
                 Variables, which rulec keeps symbolic (docs/api.md, "Symbolic shapes"), so its TinyJit
                 builds the step once and replays it for every position.
  tinygrad       tinygrad 0.14 running the same file on DEV=--tg-dev with its TinyJit (symbolic kernels, built
                 once). Its CPU device compiles with clang: where none is installed, put a `clang` on PATH
                 (`pip install ziglang` and a script running `python -m ziglang clang "$@"` works).
  torch          torch eager, a KV-cache GPT-2 written here (the same math), when torch is installed.

The machine (CPU model, cores; the GPU when --device CL) is printed with the table. Ratios are each side's
tokens/s over rulec's.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SIZES = {"gpt2": (12, 12, 768), "gpt2-medium": (24, 16, 1024)}
VOCAB = 50257
# --model llama: width, layers, heads, KV heads, SwiGLU width, vocabulary
LLAMA = dict(dim=768, layers=12, heads=12, kv_heads=4, hidden=2048, vocab=32000)
SEED = 1234


def machine() -> str:
  cpu = platform.processor() or platform.machine()
  try:
    cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
               if line.startswith("model name"))
  except (OSError, StopIteration): pass
  return f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"


def prompt_tokens(n: int, vocab: int = VOCAB) -> list[int]:
  return [int(t) for t in np.random.default_rng(SEED).integers(0, vocab, n)]


def steady(times: list[float]) -> dict:
  later = sorted(times[3:]) or sorted(times)
  med = later[len(later) // 2]
  return {"tokens_s": 1.0 / med, "ms_token": med * 1e3, "first_s": times[0], "steps": len(times)}


# ------------------------------------------------------------------------------------------------------------
# the sides (each runs in a process of its own and prints one JSON line)


def llama_weights(layers: int, c: dict = LLAMA) -> tuple[dict, dict]:
  """examples/llama.py's GGUF metadata and weights (GGUF names, numpy float32) for a config shaped as LLAMA (the
  LLAMA config by default), random. bench/models.py builds its LLaMA decode row from these too."""
  rng = np.random.default_rng(SEED)
  hd = c["dim"] // c["heads"]
  def w(*shape): return (rng.standard_normal(shape, dtype=np.float32) * 0.02)
  weights = {"token_embd.weight": w(c["vocab"], c["dim"]), "output_norm.weight": np.ones(c["dim"], np.float32),
             "output.weight": w(c["vocab"], c["dim"])}
  for i in range(layers):
    p = f"blk.{i}."
    weights.update({p + "attn_norm.weight": np.ones(c["dim"], np.float32), p + "ffn_norm.weight": np.ones(c["dim"], np.float32),
                    p + "attn_q.weight": w(c["heads"] * hd, c["dim"]), p + "attn_k.weight": w(c["kv_heads"] * hd, c["dim"]),
                    p + "attn_v.weight": w(c["kv_heads"] * hd, c["dim"]), p + "attn_output.weight": w(c["dim"], c["heads"] * hd),
                    p + "ffn_gate.weight": w(c["hidden"], c["dim"]), p + "ffn_up.weight": w(c["hidden"], c["dim"]),
                    p + "ffn_down.weight": w(c["dim"], c["hidden"])})
  kv = {"general.architecture": "llama", "llama.block_count": layers, "llama.embedding_length": c["dim"],
        "llama.attention.head_count": c["heads"], "llama.attention.head_count_kv": c["kv_heads"],
        "llama.feed_forward_length": c["hidden"], "llama.context_length": 4096}
  return kv, weights


def side_rulec(a) -> dict:
  sys.path.insert(0, str(ROOT / "examples"))
  sys.path.insert(0, str(ROOT))
  import textgen
  textgen.use_device(a.device)
  if a.model == "llama":
    import llama
    kv, weights = llama_weights(a.layers or LLAMA["layers"])
    model, vocab = llama.Llama(llama.Config(kv, weights), weights, a.context), LLAMA["vocab"]
  else:
    import gpt2
    layers, heads, dim = SIZES[a.size]
    model, vocab = gpt2.GPT2(a.layers or layers, heads, dim, a.context), VOCAB
    gpt2.load(model, gpt2.random_weights(model, SEED))
  before = textgen.kernels_built(a.device)
  # (the prompt steps are one-token steps too: all of them count, after the first three)
  _, times = model.generate(prompt_tokens(a.prompt, vocab), a.tokens)
  out = steady(times)
  out["built"] = textgen.kernels_built(a.device) - before
  return out


def _tg_model(a):
  """tinygrad's examples/gpt2.py Transformer with random weights (on whatever `tinygrad` is in this process)."""
  sys.path.insert(0, a.tinygrad)
  import examples.gpt2 as g
  from tinygrad import Tensor
  from tinygrad.nn.state import get_state_dict
  layers, heads, dim = SIZES[a.size]
  m = g.Transformer(dim=dim, n_heads=heads, n_layers=a.layers or layers, norm_eps=1e-5, vocab_size=VOCAB)
  rng = np.random.default_rng(SEED)
  for k, t in get_state_dict(m).items():
    v = (np.ones(t.shape) if k.endswith(".weight") and "ln" in k else
         np.zeros(t.shape) if k.endswith(".bias") else rng.standard_normal(t.shape) * 0.02)
    t.assign(Tensor(v.astype(np.float32))).realize()
  return g, m


def _tg_generate(a, g, m) -> list[float]:
  """examples/gpt2.py's GPT2.generate loop (batch 1, greedy), timing each step: the prompt first as one tensor,
  then one token at a time with the token and the position bound Variables."""
  from tinygrad import Tensor
  from tinygrad.uop.ops import UOp
  toks, start, times = prompt_tokens(a.prompt), 0, []
  for _ in range(a.tokens):
    t0 = time.perf_counter()
    if len(toks[start:]) == 1: tokens = UOp.variable("tokens", 0, VOCAB - 1).bind(toks[start])
    else: tokens = Tensor([toks[start:]])
    tok = m(tokens, UOp.variable("start_pos", 1 if start else 0, g.MAX_CONTEXT - 1).bind(start), 0.0).tolist()
    times.append(time.perf_counter() - t0)
    start = len(toks)
    toks.append(tok[0])
  return times


def _tg_llama(a):
  """tinygrad's extra/models/llama.py Transformer at the LLAMA config, random weights, its TinyJit on."""
  sys.path.insert(0, a.tinygrad)
  from extra.models.llama import Transformer
  from tinygrad import Tensor
  from tinygrad.nn.state import get_state_dict
  c = LLAMA
  m = Transformer(dim=c["dim"], hidden_dim=c["hidden"], n_heads=c["heads"], n_layers=a.layers or c["layers"],
                  norm_eps=1e-5, vocab_size=c["vocab"], n_kv_heads=c["kv_heads"], max_context=a.context)
  rng = np.random.default_rng(SEED)
  for k, t in get_state_dict(m).items():
    if "freqs_cis" in k: continue
    v = np.ones(t.shape) if "norm" in k else rng.standard_normal(t.shape) * 0.02
    t.assign(Tensor(v.astype(np.float32))).realize()
  return m


def _tg_llama_generate(a, m) -> list[float]:
  """The prompt as one step (start_pos 0), then one token a step: the file's __call__ binds start_pos to a Variable
  and runs its TinyJit for those."""
  from tinygrad import Tensor
  toks, start, times = prompt_tokens(a.prompt, LLAMA["vocab"]), 0, []
  for _ in range(a.tokens):
    t0 = time.perf_counter()
    tok = m(Tensor([toks[start:]]), start, 0.0).item()
    times.append(time.perf_counter() - t0)
    start = len(toks)
    toks.append(int(tok))
  return times


def side_rulec_tgfile(a) -> dict:
  sys.path.insert(0, str(ROOT))
  os.environ["RULEC_DEVICE"] = a.device
  import rulec.tinygrad_alias as alias
  alias.install()
  from rulec.runtime import cl_device, cpu_device
  counters = cl_device.COUNTERS if a.device.startswith("CL") else cpu_device.COUNTERS
  if a.model == "llama":
    m = _tg_llama(a)
    before = counters["compiled"] + counters["loaded"]
    out = steady(_tg_llama_generate(a, m)[1:])
    out["built"] = counters["compiled"] + counters["loaded"] - before
    return out
  g, m = _tg_model(a)
  before = counters["compiled"] + counters["loaded"]
  out = steady(_tg_generate(a, g, m)[1:])   # (the prompt step is one step over every prompt token)
  out["built"] = counters["compiled"] + counters["loaded"] - before
  return out


def side_tinygrad(a) -> dict:
  if a.model == "llama": return steady(_tg_llama_generate(a, _tg_llama(a))[1:])
  g, m = _tg_model(a)
  return steady(_tg_generate(a, g, m)[1:])


def side_torch(a) -> dict:
  if a.model == "llama": raise SystemExit("no torch side for --model llama")
  import torch
  torch.manual_seed(SEED)
  layers, heads, dim = SIZES[a.size]
  layers = a.layers or layers
  hd = dim // heads
  g = torch.Generator().manual_seed(SEED)
  def w(*s): return torch.randn(*s, generator=g) * 0.02
  P = {"wte": w(VOCAB, dim), "wpe": w(1024, dim)}
  blocks = [{"qkv": w(3 * dim, dim), "qkv_b": torch.zeros(3 * dim), "o": w(dim, dim), "o_b": torch.zeros(dim),
             "fc": w(4 * dim, dim), "fc_b": torch.zeros(4 * dim), "pr": w(dim, 4 * dim), "pr_b": torch.zeros(dim)}
            for _ in range(layers)]
  dev = "cuda" if a.device.startswith("CL") and torch.cuda.is_available() else "cpu"
  P = {k: v.to(dev) for k, v in P.items()}
  blocks = [{k: v.to(dev) for k, v in b.items()} for b in blocks]
  cache = [torch.zeros(2, heads, a.context, hd, device=dev) for _ in range(layers)]
  F = torch.nn.functional

  @torch.no_grad()
  def step(tok: int, pos: int) -> int:
    x = P["wte"][tok] + P["wpe"][pos]
    for b, c in zip(blocks, cache):
      h = F.layer_norm(x, (dim,))
      q, k, v = F.linear(h, b["qkv"], b["qkv_b"]).view(3, heads, hd)
      c[0, :, pos], c[1, :, pos] = k, v
      att = torch.softmax((q[:, None] @ c[0, :, :pos + 1].transpose(-1, -2)) / math.sqrt(hd), -1) @ c[1, :, :pos + 1]
      x = x + F.linear(att.reshape(dim), b["o"], b["o_b"])
      x = x + F.linear(F.gelu(F.linear(F.layer_norm(x, (dim,)), b["fc"], b["fc_b"]), approximate="tanh"), b["pr"], b["pr_b"])
    return int((F.layer_norm(x, (dim,)) @ P["wte"].T).argmax())

  toks, times = prompt_tokens(a.prompt), []
  for pos in range(a.prompt + a.tokens - 1):
    t0 = time.perf_counter()
    nxt = step(toks[pos], pos)
    times.append(time.perf_counter() - t0)
    if pos + 1 >= a.prompt: toks.append(nxt)
  out = steady(times)
  out["device"] = dev
  return out


SIDES = {"rulec": side_rulec, "rulec-tgfile": side_rulec_tgfile, "tinygrad": side_tinygrad, "torch": side_torch}
LABELS = {"rulec": "rulec, examples/{model}.py", "rulec-tgfile": "rulec, tinygrad's {file}",
          "tinygrad": "tinygrad 0.14, its {file}", "torch": "torch eager (KV cache, here)"}
TG_FILES = {"gpt2": "examples/gpt2.py", "llama": "extra/models/llama.py"}


def run_json(cmd: list[str], env: dict, timeout: float) -> dict:
  """The last JSON line a child process prints, or {"error": why not} (a timeout, a failure's last stderr line).
  bench/models.py runs its tinygrad side with this too."""
  try:
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
  except subprocess.TimeoutExpired:
    return {"error": f"timed out after {timeout} s"}
  lines = [x for x in p.stdout.splitlines() if x.startswith("{")]
  if p.returncode or not lines:
    return {"error": (p.stderr.strip().splitlines() or ["(no output)"])[-1][:200]}
  return json.loads(lines[-1])


def run_side(name: str, a) -> dict:
  env = dict(os.environ)
  if name == "tinygrad": env["DEV"] = a.tg_dev
  cmd = [sys.executable, __file__, "--side", name] + [x for x in sys.argv[1:] if x != "--side"]
  return run_json(cmd, env, a.timeout)


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--model", default="gpt2", choices=["gpt2", "llama"])
  ap.add_argument("--size", default="gpt2", choices=sorted(SIZES), help="--model gpt2's shapes")
  ap.add_argument("--layers", type=int, help="fewer layers than the size has (a quicker run)")
  ap.add_argument("--prompt", type=int, default=8, help="prompt tokens")
  ap.add_argument("--tokens", type=int, default=32, help="tokens to generate")
  ap.add_argument("--context", type=int, default=128, help="rulec's and torch's KV-cache positions")
  ap.add_argument("--device", default="CPU", help="rulec's device (CPU or CL); torch uses cuda for CL")
  ap.add_argument("--tinygrad", help="a tinygrad checkout holding examples/gpt2.py (for rulec-tgfile and tinygrad)")
  ap.add_argument("--tg-dev", default="CPU", help="tinygrad's device")
  ap.add_argument("--only", default=",".join(SIDES))
  ap.add_argument("--timeout", type=int, default=1800)
  ap.add_argument("--json", help="write the results here too")
  ap.add_argument("--side", help=argparse.SUPPRESS)
  a = ap.parse_args()
  if a.tinygrad: a.tinygrad = str(Path(a.tinygrad).resolve())
  if a.prompt + a.tokens > a.context: raise SystemExit("--prompt + --tokens must fit in --context")
  if a.side:
    print(json.dumps(SIDES[a.side](a)))
    return
  if a.model == "llama":
    layers = a.layers or LLAMA["layers"]
    what = f"LLaMA-shaped (width {LLAMA['dim']}, {layers} layers, {LLAMA['heads']}/{LLAMA['kv_heads']} heads, vocab {LLAMA['vocab']})"
  else:
    layers = a.layers or SIZES[a.size][0]
    what = f"GPT-2 ({a.size} shapes, {layers} layers)"
  print(f"{what}, random weights, greedy; prompt {a.prompt} tokens, {a.tokens} generated; rulec on {a.device}, "
        f"tinygrad on DEV={a.tg_dev}")
  print(f"machine: {machine()}")
  rows = {}
  for name in a.only.split(","):
    if name in ("rulec-tgfile", "tinygrad") and not a.tinygrad:
      rows[name] = {"error": "needs --tinygrad PATH"}
      continue
    rows[name] = run_side(name, a)
  base = rows.get("rulec", {}).get("tokens_s")
  print(f"{'side':40s} {'tokens/s':>9s} {'ms/token':>9s} {'vs rulec':>9s} {'first step s':>13s} {'built':>6s}")
  for name, r in rows.items():
    label = LABELS[name].format(model=a.model, file=TG_FILES[a.model])
    if "error" in r: print(f"{label:40s} {r['error']}"); continue
    ratio = f"{r['tokens_s'] / base:.2f}x" if base else "-"
    print(f"{label:40s} {r['tokens_s']:9.2f} {r['ms_token']:9.1f} {ratio:>9s} {r['first_s']:13.2f} "
          f"{r.get('built', '-'):>6}")
  if a.json: Path(a.json).write_text(json.dumps({"machine": machine(), "args": vars(a), "rows": rows}, indent=1))


if __name__ == "__main__":
  main()
