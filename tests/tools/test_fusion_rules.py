"""docs/fusion.md, run: the fusion decisions are rules (rules/fusion.rules), and a user's directory changes them.

Each ```rules dir=NAME``` block of the page is written to NAME/fusion.rules, each ```python file=F``` block
to F, and each ```console``` block's commands run in that directory (`$ ` lines; the expected output follows,
`...` matching any text). The page's copy of the shipped sets must be the shipped file's rules."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path: sys.path.insert(0, str(REPO))

from rulec.engine.sched import cache as schedule_cache  # noqa: E402
from rulec.engine.tensor import Tensor  # noqa: E402
from tests.helpers import subprocess_env, with_and_without_rule  # noqa: E402

DOC = REPO / "docs" / "fusion.md"
FENCE = re.compile(r"^```(?P<info>[^\n`]*)\n(?P<body>.*?)^```[ \t]*$", re.M | re.S)


def blocks() -> list[tuple[str, str]]:
  return [(m["info"].strip(), m["body"]) for m in FENCE.finditer(DOC.read_text())]


def _matches(want: str, got: str) -> bool:
  pattern = ".*".join(re.escape(part) for part in want.strip().split("..."))
  return re.fullmatch(pattern, got.strip(), re.S) is not None


def _code(text: str) -> str:
  """The rules text without comments, whitespace collapsed."""
  return " ".join(re.sub(r"#.*", "", text).split())


def test_the_page_shows_the_shipped_rules():
  page = next(body for info, body in blocks() if info == "rules")
  assert _code(page) == _code((REPO / "rules" / "fusion.rules").read_text())


def _write(tmp: Path, name: str, text: str) -> Path:
  (tmp / name).mkdir(exist_ok=True)
  (tmp / name / "fusion.rules").write_text(text)
  return tmp / name / "fusion.rules"


def test_every_console_example_of_the_page(tmp_path):
  ran = 0
  env = subprocess_env(PYTHONPATH=str(REPO))
  for info, body in blocks():
    words = dict(w.split("=", 1) for w in info.split()[1:] if "=" in w)
    if info.startswith("rules") and "dir" in words: _write(tmp_path, words["dir"], body)
    elif info.startswith("python") and "file" in words: (tmp_path / words["file"]).write_text(body)
    elif info.startswith("console"):
      for cmd, want in re.findall(r"^\$ (.*)\n((?:(?!\$ ).*\n?)*)", body, re.M):
        out = subprocess.run(["bash", "-c", cmd], cwd=tmp_path, env=env, capture_output=True, text=True)
        got = out.stdout + out.stderr
        assert out.returncode == 0 and _matches(want, got), f"{cmd}\n--- expected ---\n{want}\n--- got ---\n{got}"
        ran += 1
  assert ran >= 4


def test_the_demo_kernel_counts_follow_a_users_directory(tmp_path, monkeypatch):
  from rulec.demo import _workloads
  rules = next(body for info, body in blocks() if info == "rules dir=matmul_apart")
  _write(tmp_path, "matmul_apart", rules)
  def counts() -> list[int]:
    schedule_cache.clear()
    return [len(Tensor.schedule(f()[0])) for f in _workloads(np.random.default_rng(0)).values()]
  shipped = counts()
  monkeypatch.setenv("RULEC_RULES", str(tmp_path / "matmul_apart"))
  assert counts() == [4, 3, 12] and shipped == [2, 2, 9]   # the numbers docs/fusion.md states
  monkeypatch.delenv("RULEC_RULES")
  assert counts() == shipped


def _gpt2_block(x, w: dict, heads: int, ln):
  """A GPT-2 block (pre-norm, fused qkv split into heads, causal attention, gelu MLP, residuals)."""
  B, T, C = x.shape
  qkv = ln(x) @ w["attn"]
  q, k, v = (t.reshape(B, T, heads, C // heads).permute(0, 2, 1, 3) for t in qkv.split(C, -1))
  mask = Tensor(np.triu(np.full((T, T), -np.inf, np.float32), 1), device=x.device)
  att = ((q @ k.transpose(-2, -1)) * (C // heads) ** -0.5 + mask).softmax(-1) @ v
  x = x + att.permute(0, 2, 1, 3).reshape(B, T, C) @ w["proj"]
  return x + (ln(x) @ w["fc"]).gelu() @ w["out"]


def _products(kernel) -> int:
  """The contractions in a kernel (a matmul's, a convolution's: each wants a register tile): sums of products of
  two loads, each load indexed by a range the other is not (m and n). A row's dot product (sum(dy * x) in a
  layernorm's backward) reads both factors at the same indices and is no contraction."""
  from rulec.engine.ir.ops import Ops
  def load(u): return u.op is Ops.INDEX or (u.op is Ops.CAST and u.src[0].op is Ops.INDEX)
  def ranges(u): return {r for r in u.toposort() if r.op is Ops.RANGE}
  def contraction(u):
    if u.op is not Ops.REDUCE or u.src[0].op is not Ops.MUL or not all(map(load, u.src[0].src)): return False
    a, b = map(ranges, u.src[0].src)
    return bool(a - b) and bool(b - a)
  return sum(1 for u in kernel.ast.toposort() if contraction(u))


def test_a_softmax_tail_is_stored_before_its_row_reduces_and_nothing_else_is():
  """store_costly_row_tail (ctx.row_tail): attention's probabilities are stored before their max and sum, which are
  hoisted into their kernel (3 kernels, not 5); in a GPT-2 block's training step it takes only rows' tails (a form
  that took any costly value over a reduce stored 68 kernels and fused four matmul sums into one kernel)."""
  schedule_cache.clear()
  q, k, v = (Tensor.empty(2, 12, 256, 64, device="CPU") for _ in range(3))
  kernels = ((q @ k.transpose(-2, -1) * 0.125).softmax(-1) @ v).schedule()
  assert len(kernels) == 3
  C = 768
  w = {n: Tensor.empty(*s, device="CPU", requires_grad=True) for n, s in
       (("attn", (C, 3 * C)), ("proj", (C, C)), ("fc", (C, 4 * C)), ("out", (4 * C, C)))}
  x = Tensor.empty(2, 256, C, device="CPU", requires_grad=True)
  out = _gpt2_block(x, w, 12, lambda t: t.layernorm())
  grads = out.gradient(x, *w.values(), gradient=Tensor.empty(2, 256, C, device="CPU"))
  kernels = Tensor.schedule(out, *grads)
  assert len(kernels) <= 45 and max(map(_products, kernels)) == 1, (len(kernels), sorted(map(_products, kernels))[-4:])


def test_a_gpt2_blocks_training_step_agrees_with_the_reference_device():
  rng = np.random.default_rng(25)
  C, H = 32, 4
  xs = rng.standard_normal((2, 24, C)).astype(np.float32)
  ws = {n: (rng.standard_normal(s) * 0.2).astype(np.float32) for n, s in
        (("attn", (C, 3 * C)), ("proj", (C, C)), ("fc", (C, 4 * C)), ("out", (4 * C, C)))}
  def run(device):
    x = Tensor(xs, device=device, requires_grad=True)
    w = {n: Tensor(a, device=device, requires_grad=True) for n, a in ws.items()}
    out = _gpt2_block(x, w, H, lambda t: t.layernorm())
    (out * out).mean().backward()
    return [out.numpy(), x.grad.numpy()] + [t.grad.numpy() for t in w.values()]
  for got, want in zip(run("CPU"), run("NUMPY")):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_a_backward_rows_value_is_hoisted_into_its_consumer(tmp_path, monkeypatch):
  """hoist_row_epilogue: a softmax's backward reads its row's sum(dy * e) / sum(e)^2 broadcast along the row, and a
  layernorm's backward its two means; each is computed once per row inside the kernel that reads it, not stored by
  a kernel of its own. Fewer kernels than with the rule taken out of a user's fuse_values, the NUMPY device's
  values, in a loop that realizes the step many times with the same kernels."""
  def step(device):
    rng = np.random.default_rng(36)
    x = Tensor(rng.standard_normal((3, 5, 40)).astype(np.float32), device=device, requires_grad=True)
    w = Tensor(rng.standard_normal((40, 40)).astype(np.float32) * 0.3, device=device, requires_grad=True)
    h = x.layernorm() @ w
    p = (h @ h.transpose(-1, -2) * 0.1).softmax(-1)
    loss = (p @ h).square().mean()
    return [loss, *loss.gradient(x, w)]
  shipped, without = with_and_without_rule(monkeypatch, tmp_path, "hoist_row_epilogue", "fuse_values",
                                           lambda: len(Tensor.schedule(*step("CPU"))))
  assert shipped < without, (shipped, without)
  want = [t.numpy() for t in step("NUMPY")]
  for _ in range(20):
    got = [t.numpy() for t in step("CPU")]
    for a, b in zip(got, want): np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
