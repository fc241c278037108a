"""tinygrad's own model files, imported unchanged, on rulec (through rulec.tinygrad_alias) and on tinygrad 0.14.

    python bench/models_zoo.py PATH [--models resnet,bert,...] [--device CPU] [--no-values] [--no-big] [--json F]

PATH is a checkout (or `git archive`) of tinygrad whose `extra/` and `examples/` folders hold the model files;
tinygrad 0.14 itself must be installed (`pip install '.[bench]'`). Each model runs in two fresh processes, one
with `tinygrad` naming rulec (the alias) and one with the real tinygrad (DEV=PYTHON by default: its pure-Python
device, slow, so the value configs are tiny; --tg-dev CPU where clang is installed). Both build the model from
the file, load the same weights (drawn with numpy from a seed and the parameter's name), run the same inputs,
and save what they got: outputs, a training step's loss and updated weights, or greedy tokens and KV caches.
This script compares them within float32 tolerance (float16 for the UNet) and prints one line per model.

Kernel counts are `GlobalCounters.kernel_count` reset just before the measured call (weights and inputs
realized before it), on both sides: at the small configs of the value runs, and again at larger ones
(ResNet18 and EfficientNet-B0 at 224x224, ViT-Ti, a 4-layer BERT, ConvNeXt-T, ...; --no-big skips them) with
tinygrad on DEV=NULL, its device that compiles and runs nothing. Models that read values back on the host
(the decoders, the MNIST trainer) have only the small-config counts.

What the harness does that the files do not (the files themselves are never edited):
- examples/mamba.py imports `transformers` (for its tokenizer) at the top: a stub module stands in for it, and
  a toy tokenizer object is passed to its `generate`.
- examples/beautiful_mnist.py draws its batch with `Tensor.randint`; rulec's random numbers are not
  tinygrad's (threefry), so the harness replaces `Tensor.randint` by a fixed index list on both sides, and sets
  the module's global `opt` as its `__main__` would. Dropout is set to 0 where a training step runs.
- LLaMA, GPT-2 and Mixtral decode twice: with `start_pos` a plain int and no TinyJit (llama.Transformer(jit=False),
  gpt2's `Transformer.forward` called directly), and by the files' own paths that bind symbolic Variables
  (llama's default jit=True, which binds start_pos for the one-token steps; gpt2's `GPT2.generate` with a stand-in
  tokenizer object, binding the token and start_pos under TinyJit; start_pos bound as mixtral.py's __main__ does).
  Mamba's one-token steps run under its TinyJit (no symbolic shape).
- The UNet's value run is at 6x6 latents, so its attention sees 9 positions: tinygrad 0.14 on DEV=PYTHON fails
  to compile float16 attention over 16 keys ("UOp verification failed ... Ops.AFTER"), a tinygrad bug.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import types
import zlib
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

# ----------------------------------------------------------------------------------------------------------------
# the side process: `tinygrad` is either rulec (the alias) or tinygrad itself


def _fill(model, seed: int, skip=("freqs_cis",), tensors=None) -> None:
  """Give every float tensor of the model's state dict values drawn from (seed, name), the same on both sides."""
  from tinygrad import Tensor, dtypes
  from tinygrad.nn.state import get_state_dict
  sd = tensors if tensors is not None else get_state_dict(model)
  for name, t in sd.items():
    if any(s in name for s in skip) or not dtypes.is_float(t.dtype): continue
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    shape = tuple(t.shape)
    if name.endswith("running_var"): v = rng.uniform(0.5, 1.5, shape)
    elif name.endswith("running_mean"): v = rng.normal(0, 0.1, shape)
    elif len(shape) >= 2: v = rng.normal(0, 1.0 / math.sqrt(max(1, int(np.prod(shape[1:])))), shape)
    else: v = rng.normal(0, 0.2, shape) + (1.0 if name.endswith(("weight", "gamma", "ln1.0", "ln2.0")) else 0.0)
    t.replace(Tensor(v.astype(np.float32)).cast(t.dtype)).realize()


def _arr(shape, seed: int, lo=None, hi=None, dtype=np.float32) -> np.ndarray:
  rng = np.random.default_rng(seed)
  if lo is not None: return rng.integers(lo, hi, shape).astype(dtype)
  return rng.normal(0, 1, shape).astype(dtype)


def _count(fn):
  """Run fn() with the kernel counter reset just before; returns (result, kernels)."""
  from tinygrad import GlobalCounters
  GlobalCounters.reset()
  out = fn()
  return out, GlobalCounters.kernel_count


BIG = False   # the larger configs: tinygrad runs on DEV=NULL, which cannot copy values out (only counts matter)


def _np(t) -> np.ndarray: return np.zeros(()) if BIG else t.numpy()


def _forward(fn) -> dict:
  """The output of fn() (a Tensor) and the kernels realizing it."""
  y, k = _count(lambda: fn().realize())
  return {"out": _np(y), "kernels": np.array(k)}


def case_resnet(big: bool) -> dict:
  from tinygrad import Tensor
  from extra.models.resnet import ResNet
  m = ResNet(18, num_classes=10)
  _fill(m, 1)
  x = Tensor(_arr((1, 3, 224 if big else 16, 224 if big else 16), 2)).realize()
  return _forward(lambda: m(x))


def case_efficientnet(big: bool) -> dict:
  from tinygrad import Tensor
  from extra.models.efficientnet import EfficientNet
  m = EfficientNet(0, classes=10)
  _fill(m, 3)
  x = Tensor(_arr((1, 3, 224 if big else 32, 224 if big else 32), 4)).realize()
  return _forward(lambda: m.forward(x))


def case_vit(big: bool) -> dict:
  from tinygrad import Tensor
  from extra.models.vit import ViT
  m = ViT(layers=12, embed_dim=192, num_heads=3) if big else ViT(layers=2, embed_dim=16, num_heads=2)
  _fill(m, 5)
  x = Tensor(_arr((1, 3, 224, 224), 6)).realize()
  return _forward(lambda: m.forward(x))


def case_bert(big: bool) -> dict:
  from tinygrad import Context, Tensor, nn
  from extra.models.bert import BertForPretraining
  if big: cfg = dict(hidden_size=256, intermediate_size=1024, max_position_embeddings=128, num_attention_heads=4,
                     num_hidden_layers=4, type_vocab_size=2, vocab_size=1024)
  else: cfg = dict(hidden_size=16, intermediate_size=32, max_position_embeddings=16, num_attention_heads=2,
                   num_hidden_layers=2, type_vocab_size=2, vocab_size=40)
  m = BertForPretraining(**cfg, attention_probs_dropout_prob=0.0, hidden_dropout_prob=0.0)
  _fill(m, 7)
  B, S, P = 2, (32 if big else 8), 3
  ids = Tensor(_arr((B, S), 8, 0, cfg["vocab_size"], np.int32)).realize()
  mask = Tensor(np.array([[1] * S, [1] * (S - 2) + [0, 0]], np.float32)).realize()
  pos = Tensor(_arr((B, P), 9, 0, S, np.int32)).realize()
  tt = Tensor(_arr((B, S), 10, 0, 2, np.int32)).realize()
  def fwd():
    lm, ns = m(ids, mask, pos, tt)
    Tensor.realize(lm, ns)
    return lm, ns
  (lm, ns), k = _count(fwd)
  out = {"kernels": np.array(k)}
  out["lm_logits"], out["nsp_logits"] = _np(lm), _np(ns)
  # one training step: the file's own loss, SGD
  lm_ids = Tensor(_arr((B, P), 11, 0, cfg["vocab_size"], np.int32)).realize()
  lm_w = Tensor(np.zeros((B, P), np.float32)).realize()
  nsl = Tensor(np.array([[0, 1], [1, 0]], np.float32)).realize()
  opt = nn.optim.SGD(nn.state.get_parameters(m), lr=0.1)
  def step():
    with Context(TRAINING=1):
      opt.zero_grad()
      lm, ns = m(ids, mask, pos, tt)
      loss = m.loss(lm, ns, lm_ids, lm_w, nsl)
      loss.backward()
      return loss.realize(*opt.schedule_step())
  loss, out["train_kernels"] = _count(step)
  out["loss"] = _np(loss)
  sd = nn.state.get_state_dict(m)
  for k in ("bert.encoder.layer.0.attention.self.query.weight", "cls.predictions.transform.dense.weight"):
    out["after:" + k] = _np(sd[k])
  return out


def case_transformer(big: bool) -> dict:
  import random
  from tinygrad import Tensor, nn
  from extra.models.transformer import Transformer
  from extra.training import train, evaluate
  import examples.transformer as ex
  random.seed(0)
  X_train, Y_train, X_test, Y_test = ex.make_dataset()
  m = Transformer(10, 6, 2, 128, 4, 32) if big else Transformer(10, 6, 2, 16, 2, 32)
  tensors = {"embed": m.embed, "final": m.final}
  for i, tb in enumerate(m.tbs):
    for a in ("query", "key", "value", "out", "ff1", "ff2", "ln1", "ln2"):
      w, b = getattr(tb, a)
      tensors[f"tbs.{i}.{a}.0"], tensors[f"tbs.{i}.{a}.1"] = w, b
  _fill(m, 12, tensors=tensors)
  for tb in m.tbs: tb.dropout = 0.0   # (dropout draws random numbers, which differ between the two)
  x = Tensor(X_test[:8]).realize()
  out = _forward(lambda: m.forward(x))
  params = nn.state.get_parameters(m)
  out["n_params"] = np.array(len(params))   # embed is is_param False: the optimizer leaves it
  opt = nn.optim.Adam(params, lr=3e-3)
  np.random.seed(1)
  if big:   # (NULL runs nothing: no losses to read back)
    out["train_kernels"] = _count(lambda: train(m, X_train, Y_train, opt, 1, BS=8, allow_jit=False, noloss=True))[1]
    return out
  losses, accs = train(m, X_train, Y_train, opt, 3, BS=8, allow_jit=True)   # the 3rd step is a jit replay
  out["losses"], out["accuracies"] = np.array(losses), np.array(accs)
  out["after:final"], out["after:embed"] = _np(m.final), _np(m.embed)
  acc, preds = evaluate(m, X_test[:16], Y_test[:16], num_classes=10, BS=16, return_predict=True)
  out["eval_acc"], out["eval_preds"] = np.array(acc), np.asarray(preds)
  return out


def _decode(step, prompt: list[int], n: int) -> dict:
  """Greedy decoding, start_pos a plain int: step(tokens, start_pos) -> the next token (an int)."""
  toks, start, kernels = list(prompt), 0, []
  for _ in range(n):
    tok, k = _count(lambda: step(toks[start:], start))
    kernels.append(k)
    start = len(toks)
    toks.append(int(tok))
  return {"tokens": np.array(toks), "kernels": np.array(kernels[0]), "decode_kernels": np.array(kernels[-1])}


def case_llama(big: bool) -> dict:
  from tinygrad import Tensor
  from extra.models.llama import Transformer
  if big: return {}   # (it reads tokens back: NULL cannot run it; the value run counts its kernels)
  cfg = dict(dim=32, hidden_dim=64, n_heads=4, n_layers=2, norm_eps=1e-5, vocab_size=48, n_kv_heads=2, max_context=16)
  m = Transformer(**cfg, jit=False)
  _fill(m, 15)
  out = {"prompt_logits": _np(m(Tensor([[1, 5, 9, 3]]), 0, float("nan")))}
  m2 = Transformer(**cfg, jit=False)
  _fill(m2, 15)
  out.update(_decode(lambda toks, start: m2(Tensor([toks]), start, 0.0).item(), [1, 5, 9, 3], 5))
  out["cache_kv"] = _np(m2.layers[0].attention.cache_kv)
  # the file's default path: TinyJit, start_pos a Variable bound to the position for the one-token steps
  m3 = Transformer(**cfg)
  _fill(m3, 15)
  jit = _decode(lambda toks, start: m3(Tensor([toks]), start, 0.0).item(), [1, 5, 9, 3], 5)
  out["jit_tokens"], out["jit_decode_kernels"] = jit["tokens"], jit["decode_kernels"]
  return out


class _Tokens:
  """A stand-in for tiktoken's encoder (examples/gpt2.py's GPT2 takes any object with encode and decode)."""
  def encode(self, s, allowed_special=None): return [ord(c) % 48 for c in s]
  def decode(self, toks): return "".join(chr(65 + t % 26) for t in toks)


def case_gpt2(big: bool) -> dict:
  from tinygrad import Tensor
  import examples.gpt2 as g
  if big: return {}
  cfg = dict(dim=32, n_heads=2, n_layers=2, norm_eps=1e-5, vocab_size=48, max_seq_len=64)
  m = g.Transformer(**cfg)
  _fill(m, 16)
  out = _decode(lambda toks, start: m.forward(Tensor([toks]), start, 0.0).tolist()[0], [3, 7, 1], 5)
  out["cache_kv"] = _np(m.h[1].attn.cache_kv)
  # the file's own generation: GPT2.generate, TinyJit, the token and start_pos Variables bound each step
  m2 = g.Transformer(**cfg)
  _fill(m2, 16)
  out["generated"], out["generate_kernels"] = _count(lambda: np.array(g.GPT2(m2, _Tokens()).generate("abc", 6, 0.0)))
  return out


def case_mamba(big: bool) -> dict:
  from tinygrad import Tensor
  if big: return {}
  sys.modules.setdefault("transformers", types.ModuleType("transformers"))
  sys.modules["transformers"].AutoTokenizer = None
  import examples.mamba as mb
  m = mb.Mamba(dim=16, n_layers=2, vocab_size=40)
  _fill(m, 17)
  class Tok:
    def __call__(self, s): return {"input_ids": [ord(c) % 40 for c in s]}
    def decode(self, t): return chr(65 + t % 26)
  text, k = _count(lambda: mb.generate(m, Tok(), "abcde", n_tokens_to_gen=4))
  out = {"text": np.array(text), "kernels": np.array(k), "ssm_state": _np(m.backbone.layers[0].mixer.ssm_state)}
  m2 = mb.Mamba(dim=16, n_layers=2, vocab_size=40)
  _fill(m2, 17)
  out["prompt_kernels"] = np.array(_count(lambda: m2.forward(Tensor([[1, 2, 3, 4]])))[1])
  return out


def case_mixtral(big: bool) -> dict:
  import functools
  from tinygrad import Tensor, Variable
  from extra.models.llama import Transformer
  import examples.mixtral as mx
  if big: return {}
  cfg = dict(dim=32, hidden_dim=48, n_heads=4, n_layers=2, norm_eps=1e-5, vocab_size=48, n_kv_heads=2, max_context=16)
  m = Transformer(**cfg, feed_forward=functools.partial(mx.MixtureFeedForward, 4), jit=False)
  _fill(m, 18)
  out = _decode(lambda toks, start: m(Tensor([toks]), start, 0.0).item(), [2, 4, 6], 4)
  # as mixtral.py's __main__ calls it: start_pos a Variable bound to the position after the first step
  m2 = Transformer(**cfg, feed_forward=functools.partial(mx.MixtureFeedForward, 4), jit=False)
  _fill(m2, 18)
  var = _decode(lambda toks, start: m2(Tensor([toks]), 0 if start == 0 else Variable("start_pos", 1, 1024 - 1).bind(start),
                                       0.0).item(), [2, 4, 6], 4)
  out["variable_tokens"] = var["tokens"]
  return out


def case_unet(big: bool) -> dict:
  from tinygrad import Tensor, dtypes
  from tinygrad.nn.state import get_state_dict
  from extra.models.unet import UNetModel
  m = UNetModel(adm_in_ch=None, in_ch=4, out_ch=4, model_ch=32 if big else 16, attention_resolutions=[2], num_res_blocks=1,
                channel_mult=[1, 2], transformer_depth=[1, 1], ctx_dim=16, n_heads=2, num_groups=8)
  _fill(m, 19)
  for v in get_state_dict(m).values(): v.replace(v.cast(dtypes.float16))   # as stable_diffusion.py --fp16 does
  Tensor.realize(*get_state_dict(m).values())
  size = 16 if big else 6   # (6: see the module docstring)
  x = Tensor(_arr((1, 4, size, size), 20)).realize()
  t = Tensor(np.array([37.0], np.float32)).realize()
  ctx = Tensor(_arr((1, 3, 16), 21)).realize()
  out = _forward(lambda: m(x, t, ctx))
  # (unet.py computes in float16 only where Device[...].renderer.supported_dtypes() has it: rulec's CPU and CL do,
  # tinygrad's PYTHON device does not, so there its activations stay float32 against the float16 weights)
  out["info:dtype"] = np.array(str(out["out"].dtype))
  out["out"] = out["out"].astype(np.float32)
  return out


def case_convnext(big: bool) -> dict:
  from tinygrad import Tensor
  from extra.models.convnext import ConvNeXt
  if big: m = ConvNeXt(depths=[3, 3, 9, 3], dims=[96, 192, 384, 768], num_classes=1000)
  else: m = ConvNeXt(depths=[1, 1, 1, 1], dims=[8, 16, 32, 64], num_classes=10)
  _fill(m, 22)
  x = Tensor(_arr((1, 3, 224 if big else 32, 224 if big else 32), 23)).realize()
  return _forward(lambda: m(x))


def case_mnist(big: bool) -> dict:
  from tinygrad import Tensor, nn
  if big: return {}
  os.environ["BS"] = "2"
  import examples.beautiful_mnist as bm
  def randint(*shape, low=0, high=10, **kw): return Tensor(np.array([0, 3], np.int32))
  Tensor.randint = staticmethod(randint)   # (see the module docstring)
  model = bm.Model()
  _fill(model, 24)
  bm.opt = nn.optim.Adam(nn.state.get_parameters(model))
  X = Tensor(_arr((4, 1, 28, 28), 25)).realize()
  Y = Tensor(np.array([3, 1, 4, 1], np.int32)).realize()
  losses, kernels = [], []
  for _ in range(3):   # plain, captured, replayed
    loss, k = _count(lambda: model.train_step(X, Y).numpy())
    losses.append(loss)
    kernels.append(k)
  return {"losses": np.array(losses), "conv1": _np(model.layers[0].weight), "acc": _np(model.get_test_acc(X, Y)),
          "train_kernels": np.array(kernels[0]), "replay_kernels": np.array(kernels[-1])}


CASES = {"resnet": case_resnet, "efficientnet": case_efficientnet, "vit": case_vit, "bert": case_bert,
         "transformer": case_transformer, "llama": case_llama, "gpt2": case_gpt2, "mamba": case_mamba,
         "mixtral": case_mixtral, "unet": case_unet, "convnext": case_convnext, "mnist": case_mnist}
# where each case's file lives in a tinygrad checkout
FILES = {"resnet": "extra/models/resnet.py", "efficientnet": "extra/models/efficientnet.py", "vit": "extra/models/vit.py",
         "bert": "extra/models/bert.py", "transformer": "extra/models/transformer.py", "llama": "extra/models/llama.py",
         "gpt2": "examples/gpt2.py", "mamba": "examples/mamba.py", "mixtral": "examples/mixtral.py",
         "unet": "extra/models/unet.py", "convnext": "extra/models/convnext.py", "mnist": "examples/beautiful_mnist.py"}
TOL = {"unet": (2e-2, 2e-2)}
TIMEOUT_S = int(os.environ.get("ZOO_TIMEOUT_S", "3600"))   # per model and side (tinygrad's PYTHON device is slow)


def side(args) -> None:
  global BIG
  BIG = args.counts
  if args.side == "rulec":
    sys.path.insert(0, str(ROOT))
    import rulec.tinygrad_alias as alias
    alias.install()
  sys.path.insert(0, args.path)
  t0 = time.perf_counter()
  res: dict = {}
  try:
    res = CASES[args.model](args.counts)
    res["ok"] = np.array(True)
  except Exception as e:  # noqa: BLE001  (the report says what stopped it)
    import traceback
    tb = traceback.extract_tb(e.__traceback__)
    where = next((f"{Path(f.filename).name}:{f.lineno}" for f in reversed(tb) if args.path in f.filename), "")
    res = {"ok": np.array(False), "error": np.array(f"{type(e).__name__}: {e}"[:300] + (f" (at {where})" if where else ""))}
    if os.environ.get("ZOO_TRACEBACK"): traceback.print_exc()
  res["seconds"] = np.array(time.perf_counter() - t0)
  np.savez(args.out, **{k: np.asarray(v) for k, v in res.items()})


# ----------------------------------------------------------------------------------------------------------------
# the driver


def run_side(which: str, model: str, path: str, counts: bool, device: str, tg_dev: str) -> dict:
  with tempfile.TemporaryDirectory() as d:
    out = os.path.join(d, "out.npz")
    env = dict(os.environ)
    if which == "tinygrad": env["DEV"] = "NULL" if counts else tg_dev
    else:
      env.pop("DEV", None)
      env["RULEC_DEVICE"] = device
    cmd = [sys.executable, __file__, path, "--side", which, "--model", model, "--out", out] + (["--counts"] if counts else [])
    try: p = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=d, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired: return {"ok": False, "error": f"timed out after {TIMEOUT_S} s", "seconds": float(TIMEOUT_S)}
    if not os.path.exists(out):
      return {"ok": False, "error": (p.stderr.strip().splitlines() or ["(no output)"])[-1][:300], "seconds": 0.0}
    with np.load(out, allow_pickle=False) as z: return {k: z[k] for k in z.files}


def compare(model: str, a: dict, b: dict) -> tuple[bool, str]:
  """Outputs of rulec (a) against tinygrad (b): floats within tolerance, everything else equal. Kernel counts
  are not compared here."""
  rtol, atol = TOL.get(model, (1e-4, 1e-4))
  worst, bad = 0.0, []
  for k in sorted(set(a) | set(b)):
    if k in ("ok", "seconds", "error") or "kernels" in k or k.startswith("info:"): continue
    if k not in a or k not in b: bad.append(f"{k} missing"); continue
    x, y = np.asarray(a[k]), np.asarray(b[k])
    if x.shape != y.shape: bad.append(f"{k} shape {x.shape} vs {y.shape}"); continue
    if x.dtype.kind in "fc":
      if not np.allclose(x, y, rtol=rtol, atol=atol, equal_nan=True): bad.append(f"{k} max diff {np.max(np.abs(x - y)):.3g}")
      else: worst = max(worst, float(np.max(np.abs(x - y))) if x.size else 0.0)
    elif not np.array_equal(x, y): bad.append(f"{k}: {x.tolist()} vs {y.tolist()}")
  return not bad, ("; ".join(bad) if bad else f"max diff {worst:.2g}")


def kernels(a: dict, b: dict) -> dict[str, tuple[int, int]]:
  return {k: (int(a[k]), int(b[k])) for k in a if "kernels" in k and k in b}


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("path", help="a tinygrad checkout holding extra/models and examples")
  ap.add_argument("--models", default=",".join(CASES))
  ap.add_argument("--device", default="CPU", help="rulec's device (CPU, NUMPY, CL)")
  ap.add_argument("--tg-dev", default=os.environ.get("TG_DEV", "PYTHON"), help="tinygrad's device for the values")
  ap.add_argument("--no-values", action="store_true", help="skip the small configs (values and their kernel counts)")
  ap.add_argument("--no-big", action="store_true", help="skip the kernel counts at the larger configs")
  ap.add_argument("--json", help="write the results here too")
  ap.add_argument("--side", choices=["rulec", "tinygrad"], help=argparse.SUPPRESS)
  ap.add_argument("--model", help=argparse.SUPPRESS)
  ap.add_argument("--out", help=argparse.SUPPRESS)
  ap.add_argument("--counts", action="store_true", help=argparse.SUPPRESS)
  args = ap.parse_args()
  args.path = str(Path(args.path).resolve())
  if args.side: return side(args)
  results = {}
  print(f"rulec on {args.device}, tinygrad on DEV={args.tg_dev} (values) and DEV=NULL (kernel counts at the larger "
        "configs); kernels are (rulec, tinygrad)", flush=True)
  for model in args.models.split(","):
    row: dict = {"file": FILES[model]}
    if not args.no_values:
      r = run_side("rulec", model, args.path, False, args.device, args.tg_dev)
      t = run_side("tinygrad", model, args.path, False, args.device, args.tg_dev)
      row["rulec_s"], row["tinygrad_s"] = float(r["seconds"]), float(t["seconds"])
      if not bool(r["ok"]): row["values"] = f"rulec fails: {r['error']}"
      elif not bool(t["ok"]): row["values"] = f"tinygrad fails: {t['error']}"
      else:
        same, what = compare(model, r, t)
        row["values"] = ("match, " if same else "MISMATCH: ") + what
        for k in sorted(k for k in r if k.startswith("info:")):
          row["values"] += f"; {k[5:]} {r[k]} (rulec) vs {t.get(k, '-')} (tinygrad)"
        row["kernels"] = kernels(r, t)
    if not args.no_big:
      r = run_side("rulec", model, args.path, True, args.device, args.tg_dev)
      t = run_side("tinygrad", model, args.path, True, args.device, args.tg_dev)
      if bool(r["ok"]) and bool(t["ok"]):
        if kernels(r, t): row["kernels_big"] = kernels(r, t)
      else: row["kernels_big"] = f"failed: {r.get('error', '') if not bool(r['ok']) else t.get('error', '')}"
    results[model] = row
    line = f"{model:13s} {row.get('values', '')}"
    if "rulec_s" in row: line += f" [rulec {row['rulec_s']:.1f}s, tinygrad {row['tinygrad_s']:.1f}s]"
    for key in ("kernels", "kernels_big"):
      if row.get(key): line += f"\n{'':13s} {key}: {row[key]}"
    print(line, flush=True)
  if args.json: Path(args.json).write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
  main()
