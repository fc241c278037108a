"""The kernel optimizer (codegen/opt): actions as text, forced by RULEC_OPT, printed by RULEC_DEBUG=2, and the
guarantee that no action list changes what a kernel computes: it is refused with a reason, or its values match the
NUMPY reference. Register tiles in work-groups (what GPUs get) run here on PoCL."""
from __future__ import annotations

import math
import os
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rulec.codegen.opt import OptError, format_actions, kernel_key, optimize, parse_actions
from rulec.codegen.opt.transform import apply, merged_reduce_ranges
from rulec.engine.ir.dtypes import dtypes
from rulec.engine.ir.ops import Ops
from rulec.engine.tensor import Tensor
from rulec.runtime import cpu_device
from rulec.codegen.decomp import decomposed
from rulec.codegen import pipeline

@pytest.fixture(autouse=True)
def _cpu_unless_named(monkeypatch):
  """Tensors made without a device are the CPU's here, whatever RULEC_DEVICE says: these tests force CPU actions on
  them (the CL tests name their device)."""
  monkeypatch.setenv("RULEC_DEVICE", "CPU")


# *** text ***

def test_actions_round_trip_as_text():
  text = "UPCAST(2,8) upcast(r3,16), KBLOCK(4,64) THREAD(2) GROUP(64) VECTOR(4) LOCAL(1,16)"
  acts = parse_actions(text)
  assert format_actions(acts) == "UPCAST(2,8) UPCAST(3,16) KBLOCK(4,64) THREAD(2) GROUP(64) VECTOR(4) LOCAL(1,16)"
  assert parse_actions(format_actions(acts)) == acts
  assert parse_actions("(none)") == () and format_actions(()) == "(none)"


@pytest.mark.parametrize("text, msg", [
  ("SPLIT(1,2)", r"unknown action 'SPLIT' at column 1"),
  ("UPCAST(1,2) UPCAST(2)", r"UPCAST takes \(axis,amount\) .* at column 13"),
  ("THREAD(a)", r"THREAD takes \(axis\)"),
  ("UPCAST(1,2", r"expected an action such as UPCAST\(2,8\) at column 1"),
  ("GROUP(-4)", r"GROUP takes \(amount\)"),
])
def test_text_that_is_not_an_action_list_is_located(text, msg):
  with pytest.raises(OptError, match=msg): parse_actions(text)


# *** forcing and printing ***

@pytest.fixture
def fresh(monkeypatch, tmp_path):
  """No program of an earlier test is reused, in this process or from the kernel cache on disk (an earlier run of
  the same test stored one): RULEC_OPT decides how these kernels are compiled."""
  monkeypatch.setenv("RULEC_CACHE_DIR", str(tmp_path / "cache"))
  cpu_device._by_ast.clear()
  yield monkeypatch
  cpu_device._by_ast.clear()


def _matmul(m=32, k=24, n=48, seed=0):
  rng = np.random.default_rng(seed)
  a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
  return a, b, Tensor(a) @ Tensor(b)


def _key_and_axes(t):
  """The optimizer's key for t's one kernel, and its ranges' axes by size."""
  (k,) = t.schedule()
  low = decomposed(k, cpu_device.optional_decompositions())
  return kernel_key(low), {r.src[0].arg: r.arg[0] for r in low.ranges}


def test_rulec_opt_forces_one_kernels_actions(fresh, capfd):
  a, b, t = _matmul()
  key, axis = _key_and_axes(t)
  fresh.setenv("RULEC_OPT", f"{key}=UPCAST({axis[48]},4) UPCAST({axis[32]},2); 00000000=UPCAST(0,2)")
  fresh.setenv("RULEC_DEBUG", "2")
  np.testing.assert_allclose(t.numpy(), a @ b, rtol=1e-5, atol=1e-5)
  err = capfd.readouterr().err
  assert f"[opt] CPU kernel {key}" in err and f"UPCAST({axis[48]},4) UPCAST({axis[32]},2) (RULEC_OPT)" in err
  # "(none)": the kernel as scheduled, one output at a time
  (k,) = (Tensor(a) @ Tensor(b)).schedule()
  fresh.setenv("RULEC_OPT", f"{key}=(none)")
  opt, acts = optimize(decomposed(k, cpu_device.optional_decompositions()), "CPU")
  assert acts == () and {r.arg[1] for r in opt.ranges} == {"loop", "reduce"}


def test_rulec_debug_2_prints_the_chosen_actions(fresh, capfd):
  fresh.setenv("RULEC_DEBUG", "2")
  a, b, t = _matmul(seed=1)
  key, axis = _key_and_axes(t)
  t.numpy()
  err = capfd.readouterr().err
  # 48 columns take 16 lanes; rows fill 16 registers of accumulators: 8 rows of 8-lane registers (16 of 16-lane
  # ones, but a kernel this small keeps to 128 lanes: choose.SMALL_TILE_WORK)
  rows = 8
  assert f"[opt] CPU kernel {key}" in err and f"UPCAST({axis[48]},16) UPCAST({axis[32]},{rows}) THREAD({axis[32]})" in err


@pytest.mark.parametrize("acts, msg", [
  ("UPCAST({n},64)", r"UPCAST\({n},64\): r{n} has size 48, fewer than 64"),
  ("LOCAL({n},5)", r"the CPU renderer does not take LOCAL"),
  ("UPCAST(77,2)", r"r77 is not a store range of this kernel \(those it can take: r\d+\[32\] r\d+\[48\]\)"),
  ("UPCAST({k},2)", r"r{k} is not a store range"),
  ("LOCAL({n},16)", r"the CPU renderer does not take LOCAL"),
  ("THREAD({m}) THREAD({n})", r"the kernel has a THREAD range already"),
  ("UPCAST({m},32) UPCAST({n},48)", r"1536 lanes in all; a kernel takes at most 512"),
  ("KBLOCK({k},24)", r"KBLOCK\({k},24\): r{k} has size 24; the block must be smaller"),
  ("KBLOCK({k},1)", r"the block must be smaller \(and at least 2\)"),
  ("GROUP(64)", r"does not take GROUP"),
  ("SIMD({m})", r"SIMD\({m}\): r{m} is not a reduce range of this kernel \(those it has: r{k}\[24\]\)"),
  ("SIMD(99)", r"r99 is not a reduce range"),
  ("BLOCK({m},5)", r"BLOCK\({m},5\): r{m} has size 32; the block must divide it and be smaller"),
  ("BLOCK({k},4)", r"r{k} is not a store range"),
  ("THREAD({m}) BLOCK({m},4)", r"r{m} is a thread range already"),
])
def test_a_forced_action_that_does_not_apply_names_the_kernel_and_why(fresh, acts, msg):
  a, b, t = _matmul()
  key, axis = _key_and_axes(t)
  names = {"m": axis[32], "n": axis[48], "k": axis[24]}
  fresh.setenv("RULEC_OPT", f"{key}={acts.format(**names)}")
  with pytest.raises(OptError, match=f"RULEC_OPT for kernel {key}: .*" + msg.format(**names)): t.numpy()


@pytest.mark.parametrize("threads", ["1", "2"])
def test_kblock_takes_a_cheap_epilogue(fresh, threads):
  """A matmul with a bias, a residual add and a relu after it, in blocks of 8 along the sum: the blocks store
  partial sums and the last one the epilogue of the whole sum (GPT-2's second MLP matmul runs blocked so)."""
  rng = np.random.default_rng(3)
  a, b = rng.standard_normal((40, 24)).astype(np.float32), rng.standard_normal((24, 48)).astype(np.float32)
  bias, res = rng.standard_normal(48).astype(np.float32), rng.standard_normal((40, 48)).astype(np.float32)
  def program(): return (Tensor(a) @ Tensor(b) + Tensor(bias) + Tensor(res)).relu()
  key, axis = _key_and_axes(program())
  fresh.setenv("RULEC_OPT", f"{key}=UPCAST({axis[48]},16) UPCAST({axis[40]},8) KBLOCK({axis[24]},8) THREAD({axis[40]})")
  fresh.setenv("RULEC_THREADS", threads)
  np.testing.assert_allclose(program().numpy(), np.maximum(a @ b + bias + res, 0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("threads", ["1", "2"])
@pytest.mark.parametrize("cols", [16, 20])   # 20: ragged columns over 48, the last tile overlapping
def test_kblock_takes_a_transcendental_epilogue_computed_by_the_last_block_alone(fresh, threads, cols):
  """gelu(x @ w + b) in blocks of 8 along the sum: the block's test is the same for every lane, so the CPU renderer
  branches on it (the earlier blocks store partial sums, the last computes gelu's exp once per output) instead of
  selecting, which computed the exp in every block (GPT-2's first MLP matmul was refused KBLOCK for it)."""
  rng = np.random.default_rng(4)
  a, b = rng.standard_normal((40, 24)).astype(np.float32), rng.standard_normal((24, 48)).astype(np.float32)
  bias = rng.standard_normal(48).astype(np.float32)
  def program(): return (Tensor(a) @ Tensor(b) + Tensor(bias)).gelu()
  key, axis = _key_and_axes(program())
  acts = f"UPCAST({axis[48]},{cols}) UPCAST({axis[40]},8) KBLOCK({axis[24]},8) THREAD({axis[40]})"
  (k,) = program().schedule()
  low = decomposed(k, cpu_device.optional_decompositions())
  text, _ = pipeline.render(apply(low, parse_actions(acts), "CPU"), "CPU")
  assert "uniform_taken" in text and "uniform_other" in text   # one branch around all lanes' stores
  fresh.setenv("RULEC_OPT", f"{key}={acts}")
  fresh.setenv("RULEC_THREADS", threads)
  h = a.astype(np.float64) @ b + bias
  want = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h ** 3)))
  np.testing.assert_allclose(program().numpy(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("threads", ["1", "2"])
@pytest.mark.parametrize("m, k, n", [(100, 72, 256), (37, 130, 192)])   # ragged rows; a sum no power of two divides
def test_a_big_output_runs_in_column_blocks_with_longer_sum_blocks_and_agrees_with_numpy(fresh, threads, m, k, n):
  """Where C outgrows a core's L2 the 16-lane tile's columns run in blocks (BLOCK) with KBLOCK inside them (here
  with the limits shrunk to these sizes): every block of columns adds its sum's blocks and the last of those applies
  gelu(. + bias) to its own columns alone."""
  from rulec.codegen.opt import choose
  fresh.setattr(choose, "COL_BLOCK_OVER", 16 << 10)
  fresh.setattr(choose, "COL_BLOCK_BYTES", m * 64 * 4)   # 64 columns in a block
  fresh.setattr(choose, "COL_BLOCK_K_BYTES", 16 * 64 * 4)
  rng = np.random.default_rng(m + k)
  a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
  bias = rng.standard_normal(n).astype(np.float32)
  def program(): return (Tensor(a) @ Tensor(b) + Tensor(bias)).gelu()
  key, axis = _key_and_axes(program())
  (kern,) = program().schedule()
  text = format_actions(choose.cpu_actions(decomposed(kern, cpu_device.optional_decompositions()), choose.CPUTarget(lanes=16)))
  cols, block = _upcasts(text)[axis[n]], re.search(rf"(?<!K)BLOCK\({axis[n]},(\d+)\)", text)
  assert block and f"KBLOCK({axis[k]}," in text, text
  assert 2 <= int(block[1]) and int(block[1]) * cols <= 64, text
  fresh.setenv("RULEC_OPT", f"{key}={text}")
  fresh.setenv("RULEC_THREADS", threads)
  h = a.astype(np.float64) @ b + bias
  want = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h ** 3)))
  np.testing.assert_allclose(program().numpy(), want, rtol=1e-5, atol=1e-5)


def test_kblock_refuses_a_cast_epilogue():
  x = np.random.default_rng(3).standard_normal((64, 64)).astype(np.float32)
  for k in (Tensor(x) @ Tensor(x)).cast("float16").schedule():
    low = decomposed(k)
    red = next((u for u in low.ast.toposort() if u.op.name == "REDUCE"), None)
    if red is not None: break
  with pytest.raises(OptError, match="stores a float sum over one range, r\\d+, into its output"):
    apply(low, parse_actions(f"KBLOCK({red.src[1].arg[0]},16)"), "CPU")


# *** no action list changes what a kernel computes ***

_PROGRAMS = {
  "matmul": (lambda r: [r.standard_normal((16, 24)), r.standard_normal((24, 32))], lambda x, y: x @ y),
  "matmul_bias_relu": (lambda r: [r.standard_normal((8, 12)), r.standard_normal((12, 16))], lambda x, y: (x @ y + y[0]).relu()),
  "matmul_gelu": (lambda r: [r.standard_normal((8, 40)), r.standard_normal((40, 20))], lambda x, y: (x @ y + y[1]).gelu()),
  "conv": (lambda r: [r.standard_normal((2, 3, 6, 8)), r.standard_normal((4, 3, 3, 3))], lambda x, w: x.conv2d(w, padding=1)),
  "rowsum": (lambda r: [r.standard_normal((12, 40))], lambda x: x.exp().sum(1) + x[:, 0]),
  "elementwise": (lambda r: [r.standard_normal((64,)), r.standard_normal((64,))], lambda x, y: (x * y + 1).maximum(y)),
  "argmax": (lambda r: [r.standard_normal((6, 32))], lambda x: x.argmax(1)),
  "linear": (lambda r: [r.standard_normal((16, 64)), r.standard_normal((8, 64))], lambda x, w: x @ w.T),
}
_OPS = ["UPCAST", "LOCAL", "KBLOCK", "THREAD", "GROUP", "VECTOR", "STAGE", "SIMD", "BLOCK", "PREFETCH"]


def _check_actions(device, data, name, picks, monkeypatch):
  make, fn = _PROGRAMS[name]
  arrays = [a.astype(np.float32) for a in make(np.random.default_rng(5))]
  ts = [Tensor(a, device=device) for a in arrays]
  ks = fn(*ts).schedule()
  low = [decomposed(k, cpu_device.optional_decompositions() if device == "CPU" else _cl_dev().optional) for k in ks]
  forced = []
  for k in low:   # an action list per kernel from the drawn picks, on the kernel's own axes
    axes = sorted(r.arg[0] for r in k.ranges)
    acts = []
    for op, i, amount in picks:
      text = {"GROUP": f"GROUP({amount})", "VECTOR": f"VECTOR({amount})"}.get(op, f"{op}({axes[i % len(axes)]},{amount})")
      if op in ("THREAD", "SIMD"): text = f"{op}({axes[i % len(axes)]})"
      acts.append(text)
    try: apply(k, parse_actions(" ".join(acts)), device)
    except OptError: continue   # refused: with a reason, which is all that may happen to a list that does not apply
    forced.append(f"{kernel_key(k)}={' '.join(acts)}")
  monkeypatch.setenv("RULEC_OPT", "; ".join(forced))
  got = fn(*[Tensor(a, device=device) for a in arrays]).numpy()
  ref = fn(*[Tensor(a, device="NUMPY") for a in arrays]).numpy()
  if name == "argmax": np.testing.assert_array_equal(got, ref)
  else: np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
  return len(forced)


_picks = st.lists(st.tuples(st.sampled_from(_OPS), st.integers(0, 5), st.sampled_from([2, 3, 4, 8, 16, 32])), min_size=1, max_size=4)


@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(sorted(_PROGRAMS)), _picks)
def test_any_action_list_on_the_cpu_is_refused_or_computes_the_same(fresh, name, picks):
  cpu_device._by_ast.clear()
  _check_actions("CPU", None, name, picks, fresh)


def test_forced_actions_that_apply_do_run(fresh):
  # the property above must see accepted lists too, not only refusals
  assert _check_actions("CPU", None, "matmul", [("UPCAST", 1, 4), ("UPCAST", 0, 8), ("KBLOCK", 2, 8), ("THREAD", 0, 2)], fresh) == 1
  cpu_device._by_ast.clear()
  assert _check_actions("CPU", None, "conv", [("UPCAST", 3, 4), ("THREAD", 0, 2)], fresh) >= 1


# *** sizes no vector width divides: tiles of a divisor, or ragged ones (the CPU) ***

def _upcasts(text: str) -> dict[int, int]:
  return {int(ax): int(n) for ax, n in re.findall(r"UPCAST\((\d+),(\d+)\)", text)}


@settings(max_examples=16, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from([56, 77, 100, 63, 97, 9]), st.sampled_from([91, 100, 130, 64, 97]), st.sampled_from([65, 91, 100, 10, 97, 33]),
       st.booleans())
def test_matmuls_of_sizes_no_width_divides_take_a_divisor_or_ragged_tile_and_agree_with_numpy(fresh, m, k, n, transposed):
  rng = np.random.default_rng(m + k * n)
  a = rng.standard_normal((m, k)).astype(np.float32)
  b = rng.standard_normal((n, k) if transposed else (k, n)).astype(np.float32)
  t = Tensor(a) @ (Tensor(b).T if transposed else Tensor(b))
  (kern,) = t.schedule()
  low = decomposed(kern, cpu_device.optional_decompositions())
  from rulec.codegen.opt import choose
  text = format_actions(choose.cpu_actions(low, cpu_device.opt_target()))
  sizes = {r.arg[0]: r.src[0].arg for r in low.ranges}
  ups = _upcasts(text)
  # every matmul with more than 8 rows gets rows and columns: a divisor from half the width up where there is one
  # (100: 25 columns), else the full width with the last tile overlapping (97, 33 columns; 97, 9 rows)
  if not transposed and m > 8: assert len(ups) == 2, text
  ragged = any(sizes[ax] % n for ax, n in ups.items())
  if not transposed and m > 8 and k == 130: assert "KBLOCK(2,65)" in text, text   # (no power of two from 16 divides 130)
  if not transposed and 97 in (m, n) and m > 8: assert ragged, text
  np.testing.assert_allclose(t.numpy(), a @ (b.T if transposed else b), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("m, k, n", [(1009, 64, 1009), (9, 3, 33), (13, 1, 7), (101, 17, 67)])
def test_prime_sized_matmuls_take_ragged_tiles_and_agree_with_numpy(fresh, m, k, n):
  rng = np.random.default_rng(m * n + k)
  a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
  for t, want in ((Tensor(a) @ Tensor(b), a @ b), (Tensor(b.T.copy()) @ Tensor(a.T.copy()), b.T @ a.T),
                  ((Tensor(a) @ Tensor(b)).relu() + 1, np.maximum(a @ b, 0) + 1)):
    np.testing.assert_allclose(t.numpy(), want, rtol=1e-4, atol=1e-4)
  (kern,) = (Tensor(a) @ Tensor(b)).schedule()
  low = decomposed(kern, cpu_device.optional_decompositions())
  from rulec.codegen.opt import choose
  text = format_actions(choose.cpu_actions(low, cpu_device.opt_target()))
  if m > 8 and n > 16: assert any(n_ and r.src[0].arg % n_ for r in low.ranges if (n_ := _upcasts(text).get(r.arg[0]))), text


@pytest.mark.parametrize("acts", ["UPCAST({n},5) UPCAST({m},3) THREAD({m})", "UPCAST({m},7) UPCAST({n},16)",
                                  "UPCAST({n},31)", "THREAD({m}) UPCAST({m},6) UPCAST({n},10)",
                                  "UPCAST({n},5) UPCAST({m},3) KBLOCK({k},8) THREAD({m})",
                                  "UPCAST({n},32) UPCAST({m},6) KBLOCK({k},4) THREAD({m})",
                                  "UPCAST({m},24) KBLOCK({k},2) THREAD({m})"])
@pytest.mark.parametrize("threads", ["1", "2", "3", "8"])
def test_forced_ragged_upcasts_compute_the_same(fresh, acts, threads):
  # with KBLOCK the last tile's lanes that the tile before also computes store back what they find, and the
  # runtime keeps those two tiles in one thread's call (2 row tiles of 24: one call, whatever the threads)
  a, b, t = _matmul(m=40, k=24, n=48, seed=4)
  key, axis = _key_and_axes(t)
  fresh.setenv("RULEC_OPT", f"{key}={acts.format(m=axis[40], n=axis[48], k=axis[24])}")
  fresh.setenv("RULEC_THREADS", threads)
  fresh.setattr(cpu_device, "MIN_SPLIT_WORK", 1)
  np.testing.assert_allclose(t.numpy(), a @ b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tiles, threads, calls", [(2, 2, [(0, 2)]), (3, 8, [(0, 1), (1, 3)]), (5, 2, [(0, 2), (2, 5)]),
                                                    (4, 4, [(0, 1), (1, 2), (2, 4)])])
def test_the_last_two_ragged_tiles_run_in_one_call(tiles, threads, calls):
  # (a race otherwise: the last tile, under KBLOCK, stores back what it read of the outputs the tile before updates)
  assert cpu_device.thread_calls(tiles, threads, pair_last=True) == calls
  assert cpu_device.thread_calls(tiles, threads, pair_last=False) == [(tiles * i // min(threads, tiles), tiles * (i + 1) // min(threads, tiles))
                                                                     for i in range(min(threads, tiles))]


@pytest.mark.parametrize("device", ["CPU", "CL"])
def test_an_in_place_update_of_a_size_nothing_divides_takes_no_ragged_tile(request, device):
  # an optimizer's step, w -= lr * x.T @ g, fuses into one kernel that reads the weight it writes: the cost models
  # must not choose a ragged tile for it (they did on the H200: 97 columns, and an OptError from the applier)
  if device == "CL": request.getfixturevalue("cl_tiles")
  else: request.getfixturevalue("fresh")
  rng = np.random.default_rng(8)
  w0, x, g = (rng.standard_normal(s).astype(np.float32) for s in ((100, 97), (64, 100), (64, 97)))
  w = Tensor(w0, device=device)
  w.realize()
  w.assign(w - 0.1 * (Tensor(x, device=device).T @ Tensor(g, device=device)))
  np.testing.assert_allclose(w.numpy(), w0 - 0.1 * (x.T @ g), rtol=1e-4, atol=1e-4)


def test_a_ragged_upcast_is_refused_where_the_kernel_reads_what_it_writes(fresh):
  # the overlapping last tile would compute outputs from values the tile before already stored
  x = np.arange(35, dtype=np.float32).reshape(5, 7)
  t = Tensor(x)
  t.realize()
  t.assign(t * 2 + 1)   # reads the buffer it writes: twice would be 4x + 3
  ks = t.schedule()
  hit = 0
  for k in ks:
    low = decomposed(k, cpu_device.optional_decompositions())
    if not set(low.outputs) & set(low.inputs): continue
    r = max(low.ranges, key=lambda r: r.src[0].arg)
    with pytest.raises(OptError, match="reads a buffer it writes, so the last tile"):
      apply(low, parse_actions(f"UPCAST({r.arg[0]},4)"), "CPU")
    hit += 1
  assert hit
  np.testing.assert_array_equal(t.numpy(), x * 2 + 1)


def test_a_conv_input_gradient_is_one_reduce_over_its_window_with_a_cpu_tile_and_agrees_with_numpy(fresh):
  # the input gradient reaches its taps through the repeat trick's 4 window copies, each guarded: the symbolic
  # rules make the guards affine (where_affine), drop the dead fourth copy (narrow_reduce) and make the three nested
  # sums one (merge_reduce), so it is the loop nest of a forward convolution and takes the same kind of tile
  from rulec.codegen.opt import choose
  def grads(device):
    rng = np.random.default_rng(11)
    x = Tensor(rng.standard_normal((4, 8, 8, 8)).astype(np.float32), device=device, requires_grad=True)
    w = Tensor(rng.standard_normal((16, 8, 3, 3)).astype(np.float32), device=device, requires_grad=True)
    x.conv2d(w, padding=1).relu().max_pool2d(2).sum().backward()
    return x.grad, w.grad
  gx, gw = grads("CPU")
  (grad_in,) = [k for k in gx.schedule() if sorted(r.src[0].arg for r in k.ast.ranges if r.arg[1] == "reduce") == [3, 3, 16]]
  low = decomposed(grad_in, cpu_device.optional_decompositions())
  reds = [u for u in low.ast.toposort() if u.op.name == "REDUCE"]
  assert len(reds) == 1 and len(reds[0].src) == 4, reds      # one sum, over window row, window column, channels
  assert "UPCAST(" in format_actions(choose.cpu_actions(low))
  rx, rw = grads("NUMPY")
  np.testing.assert_allclose(gx.numpy(), rx.numpy(), rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(gw.numpy(), rw.numpy(), rtol=1e-4, atol=1e-4)


# *** SIMD: x @ W.T, whose loads run along the reduction ***

def _linear_actions(t):
  (k,) = t.schedule()
  low = decomposed(k, cpu_device.optional_decompositions())
  from rulec.codegen.opt import choose
  return low, choose.cpu_actions(low)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from([(), (3,)]), st.sampled_from([8, 16, 24, 40]), st.sampled_from([64, 96, 256, 65]),
       st.sampled_from([2, 6, 10, 3, 24]), st.sampled_from([np.float32, np.float64]), st.booleans(),
       st.sampled_from([1 << 20, 1024, 3000]), st.booleans())
def test_x_times_w_transposed_tiles_along_the_reduction_and_agrees_with_numpy(fresh, batch, m, k, n, dtype, bias, block,
                                                                              kblock):
  from rulec.codegen.opt import choose
  fresh.setattr(choose, "DOT_BLOCK_BYTES", block)   # small: W's rows in column blocks (BLOCK) at these sizes too
  if kblock:   # the sum in blocks of 32 (KBLOCK), the lanes along each block, as sums over 1536 run
    fresh.setattr(choose, "DOT_K_BLOCK_OVER", 48)
    fresh.setattr(choose, "DOT_K_BLOCK", 32)
  rng = np.random.default_rng(m * k + n)
  x, w, b = rng.standard_normal((*batch, m, k)).astype(dtype), rng.standard_normal((n, k)).astype(dtype), rng.standard_normal(n).astype(dtype)
  t = Tensor(x) @ Tensor(w).T
  if bias: t = t + Tensor(b)
  low, acts = _linear_actions(t)
  text = format_actions(acts)
  # the dot tile where its conditions hold: 8 rows (of 8 or more), 2 columns, a float sum of 64 or more steps
  if m > 8 and m % 8 == 0 and n % 2 == 0 and k >= 64:
    assert "SIMD(" in text and "UPCAST(" in text, text
    if kblock and k % 32 == 0: assert "KBLOCK(" in text, text
  want = x @ w.T + (b if bias else 0)
  tol = 1e-4 if dtype == np.float32 else 1e-10
  np.testing.assert_allclose(t.numpy(), want, rtol=tol, atol=tol)


def test_x_times_w_transposed_takes_a_dot_tile_in_column_blocks(fresh):
  # not a timing: the chosen actions, which the bench measures (bench/kernels.py: linear 1024^3)
  x = Tensor(np.ones((64, 128), np.float32)) @ Tensor(np.ones((32, 128), np.float32)).T
  low, acts = _linear_actions(x)
  axes = {r.src[0].arg: r.arg[0] for r in low.ranges}
  assert format_actions(acts) == f"UPCAST({axes[32]},4) UPCAST({axes[64]},4) SIMD({axes[128]}) THREAD({axes[64]})"
  # a W of 1024 rows of 1024: its column tiles in blocks of 64 (four rows each: 1 MiB of W per block)
  big = Tensor(np.ones((64, 1024), np.float32)) @ Tensor(np.ones((1024, 1024), np.float32)).T
  low, acts = _linear_actions(big)
  axes = {r.src[0].arg: r.arg[0] for r in low.ranges if r.src[0].arg != 1024 or r.arg[0] not in {x.arg[0] for x in low.ranges if x.src[0].arg == 64}}
  text = format_actions(acts)
  assert re.fullmatch(r"UPCAST\((\d+),4\) UPCAST(\(\d+),4\) SIMD\(\d+\) BLOCK\(\1,64\) THREAD\(\d+\)", text), text
  np.testing.assert_array_equal(big.numpy(), np.full((64, 1024), 1024, np.float32))
  np.testing.assert_array_equal(x.numpy(), np.full((64, 32), 128, np.float32))


@pytest.mark.parametrize("m, k, n, ragged", [(64, 33, 64, True), (32, 77, 96, True), (48, 26, 32, True),
                                             (64, 33, 64, False), (32, 77, 96, False), (48, 26, 32, False)])
def test_x_times_w_transposed_with_a_sum_no_power_of_two_divides_is_staged(cl_tiles, m, k, n, ragged):
  # W's rows across the lanes are only read well from local memory: a sum of 33 (77, 26) takes blocks of 16, the
  # steps after the last whole block a sum of their own; without ragged tiles, blocks of a divisor, 11 (11, 13)
  from rulec.codegen.opt import choose
  cl_tiles.setattr(choose, "GPU_RAGGED", ragged)
  from rulec.runtime import cl_device
  rng = np.random.default_rng(k)
  a, w = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((n, k)).astype(np.float32)
  t = Tensor(a, device="CL") @ Tensor(w, device="CL").T
  (kern,) = t.schedule()
  dev = cl_device.get_device()
  text = format_actions(choose.cl_actions(decomposed(kern, dev.optional), dev.target))
  assert re.search(r"STAGE\(\d+,16\)" if ragged else r"STAGE\(\d+,(11|13)\)", text), text
  np.testing.assert_allclose(t.numpy(), a @ w.T, rtol=1e-4, atol=1e-4)


def test_simd_keeps_a_max_in_order(fresh):
  x = Tensor(np.arange(64, dtype=np.float32).reshape(4, 16)).max(1)
  (k,) = x.schedule()
  low = decomposed(k, cpu_device.optional_decompositions())
  red = next(u for u in low.ast.toposort() if u.op.name == "REDUCE")
  with pytest.raises(OptError, match="must be the innermost plain range of a sum"):
    apply(low, parse_actions(f"SIMD({red.src[1].arg[0]})"), "CPU")


# *** OpenCL: the GPU's actions, on PoCL ***

def _cl_dev():
  from rulec.runtime import cl_device
  return cl_device.get_device()


@pytest.fixture
def cl_tiles(monkeypatch, cl_dev):
  """Kernels rendered for the CL device with register tiles in work-groups of up to 256, as on a GPU (and no group
  reductions, which a GPU gives small outputs of long sums instead)."""
  import attrs

  from rulec.runtime import cl_device
  monkeypatch.setattr(cl_dev, "target", attrs.evolve(cl_dev.target, tile=256, group=0, units=int(os.environ.get("TEST_UNITS", "0")) or cl_dev.target.units))
  # (the convolutions here are the direct ones whose tiles these tests check, whatever RULEC_WINOGRAD the run has)
  monkeypatch.setenv("RULEC_WINOGRAD", "0")
  cl_device._by_ast.clear()
  yield monkeypatch
  cl_device._by_ast.clear()


@settings(max_examples=12, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from([4, 8, 12, 64, 96, 3]), st.sampled_from([1, 5, 32, 48]), st.sampled_from([4, 16, 64, 80, 6]),
       st.booleans())
def test_gpu_tiles_agree_with_numpy_for_any_shape(cl_tiles, m, k, n, epilogue):
  from rulec.runtime import cl_device
  rng = np.random.default_rng(m * 100 + k * 10 + n)
  a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
  f = (lambda x, y: (x @ y + y[0]).relu()) if epilogue else (lambda x, y: x @ y)
  t = f(Tensor(a, device="CL"), Tensor(b, device="CL"))
  src = cl_device.render(t.schedule()[-1]).source
  if m % 4 == 0 and m > 4 and n % 4 == 0 and k > 1:   # tiled (k = 1 has no reduction: an outer product)
    assert "get_local_id" in src and "fma(" in src
    if k % 16 == 0: assert "__local float tile" in src   # blocks of 16 staged in local memory (STAGE)
    else: assert "float4 lv" in src or "float8 lv" in src or "float2 lv" in src   # B's columns: one vector load a row
  ref = f(Tensor(a, device="NUMPY"), Tensor(b, device="NUMPY")).numpy()
  np.testing.assert_allclose(t.numpy(), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("m, k, n, dtype, acts", [
  (64, 64, 64, "float32", "UPCAST(0,4) UPCAST(1,4) LOCAL(0,4) LOCAL(1,8) STAGE(2,16)"),
  (32, 96, 48, "float32", "UPCAST(1,4) UPCAST(0,2) LOCAL(1,4) LOCAL(0,8) STAGE(2,32)"),
  (16, 12, 8, "float32", "UPCAST(0,2) UPCAST(1,2) LOCAL(0,8) LOCAL(1,4) STAGE(2,3)"),   # a block of 3 (4 blocks)
  (24, 40, 16, "int32", "UPCAST(0,3) UPCAST(1,4) LOCAL(0,8) LOCAL(1,2) STAGE(2,8)"),
  (16, 32, 32, "float16", "UPCAST(0,4) UPCAST(1,4) LOCAL(0,4) LOCAL(1,8) STAGE(2,16)"),
  (64, 48, 128, "float32", "UPCAST(0,8) UPCAST(1,8) LOCAL(1,16) LOCAL(0,8) STAGE(2,16)"),   # 8-lane vector reads
  # each work-item's columns in two groups of 4 half the tile apart (a warp's vector reads on consecutive banks)
  (64, 64, 128, "float32", "UPCAST(0,8) UPCAST(1,4) LOCAL(1,16) UPCAST(1,2) LOCAL(0,8) STAGE(2,16)"),
])
@pytest.mark.parametrize("ring, rows", [(0, False), (2, False), (3, False), (3, True)])
def test_stage_puts_a_tiles_blocks_in_local_memory_and_agrees_with_numpy(cl_dev, monkeypatch, m, k, n, dtype, acts, ring,
                                                                         rows):
  # STAGE: per block of the reduction the work-group copies A's and B's blocks into local memory (padded so that a
  # warp reading along them does not wait on one bank), then the lanes read them from there. With a ring
  # (Target.async_copy) the blocks go into `ring` buffers, B's rows as 16-byte copies issued ring - 1 blocks ahead
  # (cp.async on NVIDIA; plain float4 copies here), one barrier per block; with `rows` A's block is kept in rows
  # of the sum's steps, as in memory, and copies in chunks too
  import attrs
  from rulec.runtime import cl_device
  monkeypatch.setattr(cl_dev, "target", attrs.evolve(cl_dev.target, async_copy=ring, ptx=False, async_rows=rows,
                                                    row_vectors=rows, fixed_group=rows))
  cl_device._by_ast.clear()
  rng = np.random.default_rng(m + k + n)
  a = (rng.standard_normal((m, k)) * 4).astype(dtype); b = (rng.standard_normal((k, n)) * 4).astype(dtype)
  t = Tensor(a, device="CL") @ Tensor(b, device="CL")
  (kern,) = t.schedule()
  key = kernel_key(decomposed(kern, cl_dev.optional))
  monkeypatch.setenv("RULEC_OPT", f"{key}={acts}")
  src = cl_device.render(kern).source
  assert src.count("__local float tile") + src.count("__local int tile") + src.count("__local float tile") >= 2
  # (with Target.fixed_group the kernel declares its work-group size, which the launch then must use)
  items = math.prod(int(n) for n in re.findall(r"LOCAL\(\d+,(\d+)\)", acts))
  assert (f"reqd_work_group_size({items}, 1, 1)" in src) == rows and src.count("reqd_work_group_size") == rows
  # (2-byte elements, and rows whose fastest copy range is shorter than 4 (2 lanes), copy as before)
  chunked = "rulec_cp16(" in src
  if ring and dtype != "float16" and k != 12: assert chunked
  assert not (chunked and not ring) and (f"% {ring};" in src) == chunked
  assert src.count("barrier(CLK_LOCAL_MEM_FENCE)") == (1 if chunked else 2)
  if dtype != "float16": assert re.search(r"(2|4|8|16) tv\d+ = ", src)   # (the lanes read their neighbours with one vector read)
  if rows and chunked:   # (A's copies too, and its reads one float4 per row and four steps)
    block = int(re.search(r"STAGE\(\d+,(\d+)\)", acts)[1])
    assert src.count("rulec_cp16(") > 2 * (src.count("for (int c") + 1)
    assert ("float4 tr" in src) == (dtype == "float32" and block % 4 == 0)
  got = t.numpy()
  ref = (Tensor(a, device="NUMPY") @ Tensor(b, device="NUMPY")).numpy()
  if dtype == "int32": np.testing.assert_array_equal(got, ref)
  else: np.testing.assert_allclose(got.astype(np.float32), ref.astype(np.float32), rtol=1e-2 if dtype == "float16" else 1e-5, atol=1e-1 if dtype == "float16" else 1e-4)
  cl_device._by_ast.clear()


@pytest.mark.parametrize("acts, msg", [
  ("STAGE(2,16)", "comes after UPCAST and LOCAL"),
  ("UPCAST(0,4) UPCAST(1,4) LOCAL(0,4) LOCAL(1,8) STAGE(2,64)", "blocks of 64 must be at least 2 and fewer"),
  ("UPCAST(0,4) UPCAST(1,4) LOCAL(0,4) LOCAL(1,8) STAGE(1,16)", "not a reduce range"),
  ("UPCAST(0,4) UPCAST(1,4) LOCAL(0,4) LOCAL(1,8) STAGE(2,16) STAGE(2,4)", "already"),
])
def test_stage_is_refused_with_a_reason(fresh, acts, msg):
  (k,) = (Tensor.empty(64, 64) @ Tensor.empty(64, 64)).schedule()
  with pytest.raises(OptError, match=msg): apply(decomposed(k), parse_actions(acts), "CL")


def test_stage_is_refused_when_its_blocks_do_not_fit_local_memory(fresh):
  (k,) = (Tensor.empty(256, 1024) @ Tensor.empty(1024, 256)).schedule()
  with pytest.raises(OptError, match="bytes of local memory"):
    apply(decomposed(k), parse_actions("UPCAST(0,8) UPCAST(1,8) LOCAL(0,16) LOCAL(1,16) STAGE(2,64)"), "CL")


@pytest.mark.parametrize("name", ["a_transposed", "b_transposed", "batched", "int8_times_float", "bias_relu"])
def test_staged_gpu_tiles_of_other_matmuls_agree_with_numpy(cl_tiles, name):
  # the cost model's STAGE (blocks of 16) on matmuls whose loads step differently: transposed inputs (the copy's
  # fastest range is then not the block's), a batch (a loop range fixed for a work-group), a cast inside the load
  from rulec.runtime import cl_device
  rng = np.random.default_rng(3)
  a, b = rng.standard_normal((3, 32, 48)).astype(np.float32), rng.standard_normal((3, 48, 64)).astype(np.float32)
  f = {"a_transposed": lambda x, y: x[0].T.contiguous().T @ y[1], "b_transposed": lambda x, y: x[1] @ y[2].T.contiguous().T,
       "batched": lambda x, y: x @ y, "int8_times_float": lambda x, y: (x[0] * 4).cast("int8") @ y[0],
       "bias_relu": lambda x, y: (x[2] @ y[0] + y[0, 0]).relu()}[name]
  t = f(Tensor(a, device="CL"), Tensor(b, device="CL"))
  assert "__local float tile" in cl_device.render(t.schedule()[-1]).source
  ref = f(Tensor(a, device="NUMPY"), Tensor(b, device="NUMPY")).numpy()
  np.testing.assert_allclose(t.numpy(), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("xs, ws, pad", [((1, 8, 12, 32), (16, 8, 3, 3), 1), ((2, 16, 8, 18), (8, 16, 3, 3), 0),
                                          ((1, 4, 6, 32), (32, 4, 1, 1), 0)])
def test_staged_convolutions_agree_with_numpy(cl_tiles, xs, ws, pad):
  # STAGE on a reduction over several ranges: blocks of input channels, each with its window taps (kh, kw), copied
  # into local memory (the input's block holds each element once per tap that reads it); padded windows read 0.
  # (Not the cost model's choice until measured on a GPU: forced here, as RULEC_SEARCH would try it.)
  from rulec.codegen.opt import choose
  from rulec.runtime import cl_device
  rng = np.random.default_rng(11)
  x, w = rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ws).astype(np.float32)
  t = Tensor(x, device="CL").conv2d(Tensor(w, device="CL"), padding=pad)
  (k,) = t.schedule()
  low = decomposed(k, _cl_dev().optional)
  if ws[2:] != (1, 1):   # (a 1x1 convolution sums over one range, as a matmul: the cost model stages it)
    assert not any(a.op == "STAGE" for a in choose.cl_actions(low, _cl_dev().target))
  acts = next(a for tile in choose.GPU_TILES if (a := choose.gpu_tile(low, tile, choose.GPU_LOCAL, _cl_dev().target, 16, several=True)))
  cl_tiles.setenv("RULEC_OPT", f"{kernel_key(low)}={format_actions(acts)}")
  assert any(a.op == "STAGE" for a in acts) and "__local float tile" in cl_device.render(k).source
  ref = Tensor(x, device="NUMPY").conv2d(Tensor(w, device="NUMPY"), padding=pad).numpy()
  np.testing.assert_allclose(t.numpy(), ref, rtol=1e-4, atol=1e-4)


def _weight_gradient(xs, ws, seed):
  """grad(device): the gradient of a 3x3 convolution (padding 1) of random x by random w with respect to w, for a
  random output gradient."""
  rng = np.random.default_rng(seed)
  x, w = rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ws).astype(np.float32)
  dy = rng.standard_normal((xs[0], ws[0], *xs[2:])).astype(np.float32)
  def grad(device):
    tw = Tensor(w, device=device)
    return Tensor(x, device=device).conv2d(tw, padding=1).gradient(tw, gradient=Tensor(dy, device=device))[0]
  return grad


@pytest.mark.parametrize("block", [4, 6, 5])   # 5: 12 is two blocks and a tail of 2, summed unstaged
def test_stage_on_a_weight_gradients_innermost_sum_keeps_the_outer_sums_as_loops_and_agrees_with_numpy(cl_tiles, block):
  """STAGE on the last range of a sum over (images, rows, columns): the images and rows stay loops around the blocks
  of a row, so a block holds the tile's channels by `block` columns (it held every row and image before: a ResNet
  weight gradient's needed 1.3 MiB of local memory and was refused)."""
  from rulec.codegen.opt.actions import Action
  from rulec.codegen.opt.transform import stage_split
  from rulec.runtime import cl_device
  grad = _weight_gradient((4, 16, 12, 12), (16, 16, 3, 3), 5)
  k = max(grad("CL").schedule(), key=lambda k: len(k.ranges))
  low = decomposed(k, _cl_dev().optional)
  axes = [r.arg[0] for r in low.ranges]   # (16, 16, 3, 3 | 4, 12, 12): out channels, in channels, taps | the sum
  acts = [*parse_actions(f"UPCAST({axes[0]},4) UPCAST({axes[1]},4) LOCAL({axes[0]},4) LOCAL({axes[1]},4)")]
  red = next(u for u in apply(low, tuple(acts), "CL").ast.toposort() if u.op is Ops.REDUCE)
  acts.append(Action("STAGE", red.src[-1].arg[0], block))
  staged = next(u for u in apply(low, tuple(acts), "CL").ast.toposort() if u.op is Ops.REDUCE and stage_split(u))
  outside, _, inner = stage_split(staged)
  assert [r.src[0].arg for r in outside] == [4, 12] and [r.src[0].arg for r in inner] == [block]
  cl_tiles.setenv("RULEC_OPT", f"{kernel_key(low)}={format_actions(acts)}")
  assert cl_device.render(k).source.count("__local float tile") == 2
  np.testing.assert_allclose(grad("CL").numpy(), grad("NUMPY").numpy(), rtol=1e-4, atol=1e-4)


def test_the_gpu_cost_model_stages_a_weight_gradients_rows_and_agrees_with_numpy(cl_tiles):
  from rulec.codegen.opt import choose
  from rulec.codegen.opt.transform import stage_split
  grad = _weight_gradient((16, 8, 48, 40), (16, 8, 3, 3), 6)
  k = max(grad("CL").schedule(), key=lambda k: len(k.ranges))
  low = decomposed(k, _cl_dev().optional)
  acts = choose.cl_actions(low, _cl_dev().target)
  red = next(u for u in apply(low, tuple(acts), "CL").ast.toposort() if u.op is Ops.REDUCE and stage_split(u))
  assert [r.src[0].arg for r in stage_split(red)[2]] == [choose.GPU_STAGE_ROW], format_actions(acts)   # 40 columns: 5 blocks
  # (sums of 30720 products up to about 500: float32 rounding in either order is about 1e-3 where they cancel)
  ref = grad("NUMPY").numpy()
  np.testing.assert_allclose(grad("CL").numpy(), ref, rtol=1e-4, atol=1e-5 * np.abs(ref).max())


def test_gpu_tiles_of_a_convolution_agree_with_numpy(cl_tiles):
  from rulec.runtime import cl_device
  rng = np.random.default_rng(9)
  x, w = rng.standard_normal((2, 3, 10, 16)).astype(np.float32), rng.standard_normal((16, 3, 3, 3)).astype(np.float32)
  t = Tensor(x, device="CL").conv2d(Tensor(w, device="CL"), padding=1)
  assert "get_local_id" in cl_device.render(t.schedule()[-1]).source
  ref = Tensor(x, device="NUMPY").conv2d(Tensor(w, device="NUMPY"), padding=1).numpy()
  np.testing.assert_allclose(t.numpy(), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name, picks", [
  ("matmul", [("UPCAST", 0, 3), ("UPCAST", 1, 5), ("LOCAL", 0, 3)]),
  ("matmul", [("UPCAST", 0, 3), ("UPCAST", 1, 5), ("LOCAL", 0, 3), ("STAGE", 2, 4)]),
  ("matmul", [("UPCAST", 0, 3), ("UPCAST", 1, 5), ("LOCAL", 0, 3), ("STAGE", 2, 5)]),   # 24 in blocks of 5
  ("linear", [("UPCAST", 0, 3), ("UPCAST", 1, 3), ("LOCAL", 0, 3), ("LOCAL", 1, 2), ("STAGE", 2, 16)]),
  ("matmul", [("UPCAST", 0, 2), ("LOCAL", 0, 3), ("UPCAST", 1, 4), ("LOCAL", 1, 3), ("STAGE", 2, 7)]),
  ("matmul_bias_relu", [("UPCAST", 1, 3), ("UPCAST", 0, 3)]),
  ("conv", [("UPCAST", 3, 3), ("UPCAST", 1, 3)]),
])
def test_ragged_upcasts_on_the_cl_device_compute_the_same(cl_tiles, name, picks):
  # the lanes of the last tile (and the work-items of the last group), moved back to end at the range's end; STAGE
  # blocks past the sum's end adding nothing
  assert _check_actions("CL", None, name, picks, cl_tiles) >= 1


@settings(max_examples=10, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(sorted(_PROGRAMS)), _picks)
def test_any_action_list_on_the_cl_device_is_refused_or_computes_the_same(cl_tiles, name, picks):
  from rulec.runtime import cl_device
  cl_device._by_ast.clear()
  _check_actions("CL", None, name, picks, cl_tiles)


@pytest.mark.parametrize("shape, vec, fn", [
  ((8, 64), 4, lambda x: x.sum(1)),
  ((5, 48), 2, lambda x: (x * 2 + x[:, :1]).sum(1)),            # a load that is the same for every element of a step
  ((5, 64), 4, lambda x: (x * 100).cast(dtypes.int32).max(1)),   # a max
  ((3, 4, 32), 8, lambda x: x.exp().sum((1, 2))),               # two reduce ranges, flattened
  ((6, 40), 4, lambda x: (x.T.contiguous().T * x).sum(1)),      # a strided load beside a contiguous one
  ((7, 16), 4, lambda x: x.cast(dtypes.int32).sum(1)),           # integer sums
  ((1, 1 << 14), 4, lambda x: x.sum()),                         # a split sum's two stages
])
def test_group_reductions_with_vector_loads_agree_with_numpy(monkeypatch, cl_dev, shape, vec, fn):
  # VECTOR after GROUP: each work-item's step reads vec neighbouring elements, with vloadn where a load is
  # contiguous in the innermost reduce range; forced on PoCL (a CPU device gets neither by default)
  from rulec.runtime import cl_device
  x = np.random.default_rng(len(shape) * 7 + vec).standard_normal(shape).astype(np.float32)
  ks = fn(Tensor(x, device="CL")).schedule()
  forced, sources = [], []
  for k in ks:
    low = decomposed(k, cl_dev.optional)
    acts = parse_actions(f"GROUP(16) VECTOR({vec})")
    try: opt = apply(low, acts, "CL")
    except OptError: continue
    forced.append(f"{kernel_key(low)}=GROUP(16) VECTOR({vec})")
    from rulec.codegen.opencl import render
    sources.append(render(opt, cl_dev.target).source)
  # (aligned vector loads through a vector pointer where the start is a multiple of vec, vloadn elsewhere)
  assert forced and all(re.search(rf"(float|int|uint){vec}\*\)p\d+\)\[|vload{vec}\(0, ", src) for src in sources)
  monkeypatch.setenv("RULEC_OPT", "; ".join(forced))
  cl_device._by_ast.clear()
  got = fn(Tensor(x, device="CL")).numpy()
  cl_device._by_ast.clear()
  ref = fn(Tensor(x, device="NUMPY")).numpy()
  np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-3)


def test_vector_after_group_is_refused_where_it_cannot_apply(fresh):
  def low(t):
    return decomposed(t.schedule()[-1])
  with pytest.raises(OptError, match=r"r\d+ has size 30, which 4 does not divide"):
    apply(low(Tensor.empty(4, 30).sum(1)), parse_actions("GROUP(16) VECTOR(4)"), "CL")
  with pytest.raises(OptError, match="no load of the reduction reads neighbouring elements"):
    apply(low(Tensor.empty(32, 8).sum(0)), parse_actions("GROUP(16) VECTOR(4)"), "CL")
  with pytest.raises(OptError, match="the kernel reduces"):   # VECTOR first: the elementwise kind, refused
    apply(low(Tensor.empty(4, 32).sum(1)), parse_actions("VECTOR(4) GROUP(16)"), "CL")
  with pytest.raises(OptError, match="has vector loads already"):
    apply(low(Tensor.empty(4, 32).sum(1)), parse_actions("GROUP(16) VECTOR(4) VECTOR(2)"), "CL")


def test_the_gpu_tile_is_the_largest_that_still_fills_the_device():
  # 132 compute units (an H200): a 1024^2 output gets 8x4 tiles (8x8 would leave 16K work-items), the conv2d
  # workload's 6.4M outputs 8 output channels by 2 image rows by 2 columns (choose._spatial_tile); a CPU OpenCL
  # device (tile=0) gets none
  from rulec.codegen.opencl import Target
  from rulec.codegen.opt.choose import cl_actions
  gpu = Target(group=512, vector=4, tile=256, units=132)
  def ups(t, target):
    k = t.schedule()[-1]   # (a convolution's padded input is a kernel of its own first)
    return [a.amount for a in cl_actions(decomposed(k), target) if a.op == "UPCAST"]
  mm = Tensor.empty(1024, 1024) @ Tensor.empty(1024, 1024)
  conv = Tensor.empty(32, 32, 56, 56).conv2d(Tensor.empty(64, 32, 3, 3), padding=1)
  assert ups(mm, gpu) == [8, 4] and ups(conv, gpu) == [8, 2, 2]
  (k,) = mm.schedule()
  assert any(a.op == "STAGE" for a in cl_actions(decomposed(k), gpu))   # the matmul's blocks staged in local memory
  assert ups(mm, Target(group=0, vector=0, tile=0)) == []


@pytest.mark.parametrize("m, k, n, transposed", [(1009, 1009, 1009, False), (1024, 4099, 512, False), (2048, 4099, 512, True),
                                                 (1018, 1024, 1024, False)])
def test_gpu_tiles_of_prime_sizes_are_ragged(m, k, n, transposed):
  # rows and columns no tile divides take ragged tiles and work-groups, a sum with no divisor from 4 ragged STAGE
  # blocks of 16; before, a prime size got one work-item per output, a prime sum no STAGE
  from rulec.codegen.opencl import Target
  from rulec.codegen.opt.choose import cl_actions
  b = Tensor.empty(n, k).T if transposed else Tensor.empty(k, n)
  (kern,) = (Tensor.empty(m, k) @ b).schedule()
  low = decomposed(kern)
  acts = cl_actions(low, Target(group=512, vector=4, tile=256, units=132))
  sizes = {r.arg[0]: r.src[0].arg for r in low.ranges}
  assert [a.op for a in acts].count("UPCAST") == 2 and [a.op for a in acts].count("LOCAL") == 2, acts
  assert any(a.op == "STAGE" for a in acts), acts
  if k == 4099: assert any(a.op == "STAGE" and a.amount == 16 for a in acts), acts


def _gpu_actions_by_size(kernel, target) -> list[tuple]:
  """The cost model's CL actions for `kernel` on `target`, each as (op, the size of its range, amount)."""
  from rulec.codegen.opt.choose import cl_actions
  low = decomposed(kernel)
  sizes = {r.arg[0]: r.src[0].arg for r in low.ranges}
  return [(a.op, sizes.get(a.axis), a.amount) for a in cl_actions(low, target)]


def _conv_arrays(seed: int, n: int, h: int, w: int, c: int = 32) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """A 3x3 convolution's input (n, c, h, w), weights (c, c, 3, 3) and an output gradient, padding 1."""
  rng = np.random.default_rng(seed)
  return (rng.standard_normal((n, c, h, w)).astype(np.float32), rng.standard_normal((c, c, 3, 3)).astype(np.float32),
          rng.standard_normal((n, c, h, w)).astype(np.float32))


def test_a_conv_weight_gradient_takes_a_long_sum_tile_on_a_gpu_and_agrees_with_numpy(cl_tiles):
  # its taps are the innermost store range (3: no column tile), its sum long: lanes of output channels by lanes of
  # input channels (choose._long_sum_tile), each image row's 24 columns staged in blocks of 8
  from rulec.codegen.opencl import Target
  x, w, g = _conv_arrays(12, 64, 24, 24)   # (8 partial sums of 8 x 24 x 24 steps each: more outputs than a group takes)
  def grad(device):
    tx, tw = Tensor(x, device=device, requires_grad=True), Tensor(w, device=device, requires_grad=True)
    (tx.conv2d(tw, padding=1) * Tensor(g, device=device)).sum().backward()
    return tw.grad
  gw = grad("CL")
  longest = max(gw.schedule(), key=lambda k: math.prod(r.src[0].arg for r in k.ast.ranges))
  acts = _gpu_actions_by_size(longest, Target(group=512, vector=4, tile=256, units=132))
  assert acts == [("UPCAST", 32, 8), ("UPCAST", 32, 4), ("LOCAL", 32, 8), ("LOCAL", 32, 4), ("STAGE", 24, 8)], acts
  np.testing.assert_allclose(gw.numpy(), grad("NUMPY").numpy(), rtol=1e-3, atol=1e-3)


def test_a_convolution_and_its_input_gradient_take_image_tiles_on_a_gpu_and_agree_with_numpy(cl_tiles):
  # the forward's columns as 2 image rows by 2 columns in work-groups of 28 (56 / 2) by 4 (32 output channels / 8) by
  # 2 row pairs; the input gradient's (its products guarded by the padding) as 4 columns of one row by 16 output
  # channels, in work-groups of 14 by 2 by 2 rows (choose._spatial_tile); both run here with the GPU target's tiles
  from rulec.codegen.opencl import Target
  x, w, g = _conv_arrays(13, 8, 8, 56)
  def run(device):
    tx = Tensor(x, device=device, requires_grad=True)
    y = tx.conv2d(Tensor(w, device=device), padding=1)
    (y * Tensor(g, device=device)).sum().backward()
    return y, tx.grad
  gpu = Target(group=512, vector=4, tile=256, units=4)
  ex = Tensor.empty(8, 32, 8, 56, device="CL", requires_grad=True)
  ey = ex.conv2d(Tensor.empty(32, 32, 3, 3, device="CL"), padding=1)
  (egx,) = ey.gradient(ex, gradient=Tensor.empty(8, 32, 8, 56, device="CL"))
  for t, want in ((ey, [("UPCAST", 32, 8), ("UPCAST", 8, 2), ("UPCAST", 56, 2), ("LOCAL", 56, 28), ("LOCAL", 32, 4),
                        ("LOCAL", 8, 2)]),
                  (egx, [("UPCAST", 32, 16), ("UPCAST", 56, 4), ("LOCAL", 56, 14), ("LOCAL", 32, 2), ("LOCAL", 8, 2)])):
    big = max(t.schedule(), key=lambda k: len(k.ast.ranges))
    assert _gpu_actions_by_size(big, gpu) == want
  y, gx = run("CL")
  ry, rgx = run("NUMPY")
  np.testing.assert_allclose(y.numpy(), ry.numpy(), rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(gx.numpy(), rgx.numpy(), rtol=1e-4, atol=1e-4)


def test_many_rows_of_their_own_are_summed_by_work_groups_on_a_gpu(monkeypatch, cl_dev):
  # more than GROUP_MAX_OUTPUTS outputs, each the sum of a row of its own read along the row: GROUP (a warp's
  # work-items then read neighbouring elements); a matmul, whose loads outputs share, keeps its register tile, and so
  # does x @ W.T, whose loads both run along the sum
  import attrs

  from rulec.codegen.opencl import Target
  from rulec.codegen.opt.choose import GROUP_MAX_OUTPUTS, cl_actions
  from rulec.runtime import cl_device
  gpu = Target(group=512, vector=4, tile=256, units=132)
  rows = GROUP_MAX_OUTPUTS + 4096
  ops = lambda t: [a.op for a in cl_actions(decomposed(t.schedule()[-1]), gpu)]  # noqa: E731
  assert ops(Tensor.empty(rows, 256).sum(-1))[0] == "GROUP"
  assert ops(Tensor.empty(rows, 64).sum(-1)) == []                    # (short rows: one work-item each)
  assert "GROUP" not in ops(Tensor.empty(512, 1024) @ Tensor.empty(1024, 512))
  assert "GROUP" not in ops(Tensor.empty(512, 1024) @ Tensor.empty(512, 1024).T)
  x = np.random.default_rng(14).standard_normal((rows, 256)).astype(np.float32)
  monkeypatch.setattr(cl_dev, "target", attrs.evolve(cl_dev.target, group=64))
  cl_device._by_ast.clear()
  try: np.testing.assert_allclose(Tensor(x, device="CL").sum(-1).numpy(), x.sum(-1), rtol=1e-4, atol=1e-4)
  finally: cl_device._by_ast.clear()


# *** RULEC_SEARCH ***

def test_search_times_the_candidates_and_remembers_the_fastest(fresh):
  from rulec.codegen.opt import search
  from rulec.codegen.opt.choose import cpu_actions
  _, _, t = _matmul(64, 32, 64, seed=4)
  (k,) = t.schedule()
  low = decomposed(k, cpu_device.optional_decompositions())
  cands = search.candidates(low, "CPU")
  assert len(cands) > 4 and cands[0] == tuple(cpu_actions(low))
  assert len(set(cands)) == len(cands)
  want = cands[3]
  seen = []
  def timer(opt):   # the fourth candidate is "fastest"
    seen.append(opt)
    return 1.0 if opt.ast is not apply(low, want, "CPU").ast else 0.5
  fresh.setenv("RULEC_SEARCH", "2")
  _, acts = optimize(low, "CPU", timer=timer)
  assert acts == want and len(seen) == len(cands)
  def no_timing(opt): raise AssertionError("searched again")
  assert optimize(low, "CPU", timer=no_timing)[1] == want   # from the disk, without timing
  fresh.setenv("RULEC_SEARCH", "0")
  assert optimize(low, "CPU", timer=no_timing)[1] == cands[0]


def test_search_on_the_cpu_computes_the_same_and_leaves_outputs_alone(fresh):
  fresh.setenv("RULEC_SEARCH", "2")
  rng = np.random.default_rng(8)
  x, w = rng.standard_normal((64, 48)).astype(np.float32), rng.standard_normal((48, 48)).astype(np.float32)
  acc = Tensor(x)
  acc.assign(acc + Tensor(x) @ Tensor(w)).realize()   # the timing runs must not add into acc's buffer
  np.testing.assert_allclose(acc.numpy(), x + x @ w, rtol=1e-4, atol=1e-4)
  img, ker = rng.standard_normal((2, 6, 8, 16)).astype(np.float32), rng.standard_normal((8, 6, 3, 3)).astype(np.float32)
  got = Tensor(img).conv2d(Tensor(ker), padding=1).numpy()
  ref = Tensor(img, device="NUMPY").conv2d(Tensor(ker, device="NUMPY"), padding=1).numpy()
  np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_search_on_the_cl_device_computes_the_same(cl_tiles):
  from rulec.runtime import cl_device
  cl_tiles.setenv("RULEC_SEARCH", "2")
  cl_device._by_ast.clear()
  rng = np.random.default_rng(10)
  # (16 x 12: the search still times tiles, locals and upcasts, 13 candidates where 64 x 40 had 73, each a PoCL
  # compile)
  a, b = rng.standard_normal((16, 12)).astype(np.float32), rng.standard_normal((12, 16)).astype(np.float32)
  out = Tensor(a, device="CL")
  out.assign(out[:, :12] @ Tensor(b, device="CL")[:, :12] + 1).realize()
  np.testing.assert_allclose(out.numpy()[:, :12], a[:, :12] @ b[:, :12] + 1, rtol=1e-4, atol=1e-4)


def test_cl_index_arithmetic_is_int_only_where_every_index_fits():
  # GPUs emulate 64-bit integer arithmetic, so indices are int when their value bounds fit in 32 bits (a 2^31-element
  # buffer's do not: those kernels keep long); rendering only, nothing this big is allocated
  from rulec.codegen.opencl import Target, render
  def src(n):
    (k,) = (Tensor.empty(n) * 2).schedule()
    return render(decomposed(k), Target()).source
  small, big = src(1 << 20), src(1 << 31)
  assert "int r0" in small and "long r0" not in small
  assert "long r0" in big


def test_search_candidates_on_a_gpu_target_are_tiles_groups_and_vectors():
  from rulec.codegen.opencl import Target
  from rulec.codegen.opt.search import candidates
  gpu = Target(group=256, vector=4, tile=256, units=132)
  def cands(t):
    (k,) = t.schedule()[-1:]
    return candidates(decomposed(k), "CL", gpu)
  mm = cands(Tensor.empty(256, 256) @ Tensor.empty(256, 256))
  # (65536 outputs of 256-long sums: the cost model's choice is a group reduction; the tiles are candidates too)
  assert sum(any(a.op == "LOCAL" for a in c) for c in mm) > 5 and any(c and c[0].op == "GROUP" for c in mm)
  assert {a.amount for c in cands(Tensor.empty(1 << 16) * 2) for a in c if a.op == "VECTOR"} == {2, 4, 8, 16}
  assert {a.amount for c in cands(Tensor.empty(64, 4096).sum(1)) for a in c if a.op == "GROUP"} == {32, 64, 128, 256}


def test_a_corrupt_or_stale_search_record_is_searched_again_never_trusted(fresh):
  from rulec.codegen.opt import search
  from rulec.engine import diskcache
  _, _, t = _matmul(32, 16, 32, seed=11)
  (k,) = t.schedule()
  low = decomposed(k, cpu_device.optional_decompositions())
  fresh.setenv("RULEC_SEARCH", "1")
  calls = []
  def timer(opt):
    calls.append(opt)
    return 1.0
  first = optimize(low, "CPU", timer=timer)[1]
  n = len(calls)
  key = search._cache_key(low, "CPU", None)
  path = diskcache.path_of("search", key, ".kernel")
  path.write_bytes(path.read_bytes()[:-3] + b"xyz")          # altered bytes: the checksum fails
  assert optimize(low, "CPU", timer=timer)[1] == first and len(calls) == 2 * n
  diskcache.store_json("search", key, {"actions": "UPCAST(99,3)"})   # sound bytes, actions for another kernel
  assert optimize(low, "CPU", timer=timer)[1] == first and len(calls) == 3 * n
  diskcache.store_json("search", key, {"actions": 7})
  assert optimize(low, "CPU", timer=timer)[1] == first and len(calls) == 4 * n


# *** PREFETCH: a sum's loads that step a line or more, fetched ahead (the CPU) ***

def _ir_of(t, acts: str):
  from rulec.codegen.llvmir import render
  (kern,) = t.schedule()
  low = decomposed(kern, cpu_device.optional_decompositions())
  return render(apply(low, parse_actions(acts), "CPU"), "kernel")[0]


@pytest.mark.parametrize("m, k, n, acts", [
  (64, 200, 96, "UPCAST({n},32) UPCAST({m},8) KBLOCK({k},40) PREFETCH({k},8) THREAD({m})"),
  (101, 97, 67, "UPCAST({n},32) UPCAST({m},14) PREFETCH({k},3) THREAD({m})"),   # ragged tiles, no block
  (37, 101, 33, "UPCAST({n},16) UPCAST({m},4) PREFETCH({k},64)"),    # further ahead than the sum is long
  (40, 24, 48, "PREFETCH({k},1) UPCAST({n},16) UPCAST({m},8)"),       # before the tiles: its mark survives them
  (9, 300, 70, "PREFETCH({k},8)")])                                   # no lanes: one prefetch per step
@pytest.mark.parametrize("threads", ["1", "3"])
def test_forced_prefetches_compute_the_same(fresh, m, k, n, acts, threads):
  a, b, t = _matmul(m=m, k=k, n=n, seed=m + n)
  key, axis = _key_and_axes(t)
  text = acts.format(m=axis[m], n=axis[n], k=axis[k])
  assert "llvm.prefetch" in _ir_of(Tensor(a) @ Tensor(b), text)
  fresh.setenv("RULEC_OPT", f"{key}={text}")
  fresh.setenv("RULEC_THREADS", threads)
  fresh.setattr(cpu_device, "MIN_SPLIT_WORK", 1)
  np.testing.assert_allclose(t.numpy(), a @ b, rtol=1e-4, atol=1e-4)


def test_prefetches_go_to_the_loads_that_step_lines_one_per_line():
  # a 1024-wide B (rows 4 KiB apart): its 32 lanes read two lines per step, prefetched; A steps 4 bytes: none
  _, _, t = _matmul(m=64, k=64, n=1024)
  (kern,) = t.schedule()
  rows = next(r.arg[0] for r in kern.ranges if r.src[0].arg == 64 and r.arg[0] != _k_axis(t))
  cols, kx = next(r.arg[0] for r in kern.ranges if r.src[0].arg == 1024), _k_axis(t)
  ir = _ir_of(t, f"UPCAST({cols},32) UPCAST({rows},8) KBLOCK({kx},16) PREFETCH({kx},8)")
  assert len(re.findall(r"call void @\"?llvm\.prefetch", ir)) == 2
  # x @ W.T: W's rows run along the sum, 4 bytes a step: nothing to prefetch
  a, w = np.ones((64, 256), np.float32), np.ones((96, 256), np.float32)
  tt = Tensor(a) @ Tensor(w).T
  assert not re.findall(r"call void @\"?llvm\.prefetch", _ir_of(tt, f"PREFETCH({_k_axis(tt)},8)"))


def _k_axis(t) -> int:
  (kern,) = t.schedule()
  low = decomposed(kern, cpu_device.optional_decompositions())
  red = next(u for u in low.ast.toposort() if u.op.name == "REDUCE")
  return red.src[1].arg[0]


@pytest.mark.parametrize("acts, msg", [
  ("PREFETCH({k},0)", r"the distance is 1 to 64 steps"),
  ("PREFETCH({k},65)", r"the distance is 1 to 64 steps"),
  ("PREFETCH({m},8)", r"is not a reduce range of this kernel, nor blocks of one"),
  ("PREFETCH({k},8) PREFETCH({k},4)", r"is a prefetch:8 range already"),
  ("SIMD({k}) PREFETCH({k},8)", r"is a simd range already")])
def test_prefetch_that_cannot_apply_is_refused_with_a_reason(acts, msg):
  _, _, t = _matmul(m=32, k=24, n=48)
  _, axis = _key_and_axes(t)
  (kern,) = t.schedule()
  low = decomposed(kern, cpu_device.optional_decompositions())
  with pytest.raises(OptError, match=msg): apply(low, parse_actions(acts.format(m=axis[32], k=_k_axis(t))), "CPU")
  with pytest.raises(OptError, match="the CL renderer does not take PREFETCH"): apply(low, parse_actions(f"PREFETCH({_k_axis(t)},8)"), "CL")


def test_the_cpu_cost_model_prefetches_big_blocked_sums_on_16_lane_targets():
  from rulec.codegen.opt import choose
  for (m, k, n), want in (((1024, 1024, 1024), True), ((64, 64, 64), False)):
    _, _, t = _matmul(m=m, k=k, n=n)
    (kern,) = t.schedule()
    low = decomposed(kern, cpu_device.optional_decompositions())
    wide = format_actions(choose.cpu_actions(low, choose.CPUTarget(lanes=16)))
    narrow = format_actions(choose.cpu_actions(low, choose.CPUTarget(lanes=8)))
    assert ("PREFETCH" in wide) == want and "PREFETCH" not in narrow, (wide, narrow)


# *** KBLOCK whose blocks do not divide the sum: the last block shorter ***

@pytest.mark.parametrize("m, k, n, acts", [
  (64, 1009, 96, "UPCAST({n},32) UPCAST({m},8) KBLOCK({k},64) THREAD({m})"),
  (101, 97, 67, "UPCAST({n},32) UPCAST({m},14) KBLOCK({k},16) PREFETCH({k},8) THREAD({m})"),   # ragged tiles too
  (37, 33, 48, "UPCAST({n},16) UPCAST({m},4) KBLOCK({k},32)"),      # the last block one step long
  (9, 131, 70, "KBLOCK({k},50) PREFETCH({k},3)"),                    # no lanes; blocks 50, 50, 31
  (40, 100, 48, "KBLOCK({k},7) UPCAST({n},16) UPCAST({m},8) THREAD({m})")])   # the block before the tiles
@pytest.mark.parametrize("threads", ["1", "3"])
def test_kblock_with_a_shorter_last_block_computes_the_same(fresh, m, k, n, acts, threads):
  a, b, t = _matmul(m=m, k=k, n=n, seed=m * k + n)
  key, axis = _key_and_axes(t)
  text = acts.format(m=axis[m], n=axis[n], k=_k_axis(t))
  fresh.setenv("RULEC_OPT", f"{key}={text}")
  fresh.setenv("RULEC_THREADS", threads)
  fresh.setattr(cpu_device, "MIN_SPLIT_WORK", 1)
  np.testing.assert_allclose(t.numpy(), a @ b, rtol=1e-4, atol=1e-4)
  b64 = b.astype(np.float64)   # float64 sums block the same way
  t64 = Tensor(a.astype(np.float64)) @ Tensor(b64)
  key64, _ = _key_and_axes(t64)
  fresh.setenv("RULEC_OPT", f"{key64}={text}")
  np.testing.assert_allclose(t64.numpy(), a.astype(np.float64) @ b64, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("k", [1009, 97, 131])
def test_the_cost_model_blocks_prime_sums(k):
  from rulec.codegen.opt import choose
  _, _, t = _matmul(m=1024, k=k, n=1024)
  (kern,) = t.schedule()
  low = decomposed(kern, cpu_device.optional_decompositions())
  text = format_actions(choose.cpu_actions(low, choose.CPUTarget(lanes=16)))
  # blocked exactly where the second matrix's k x 1024 floats outgrow the budget (1009: 4 MiB); 131 x 1024 fits in
  # L2 whole (512 KiB) and runs unblocked (1.29 ms against 1.52 in blocks of 64 here)
  assert ("KBLOCK" in text) == (k * 1024 * 4 > choose.WIDE_K_BLOCK_BYTES), text


def test_a_ragged_upcast_after_kblock_is_refused(fresh):
  # after KBLOCK the kernel reads the sums earlier blocks stored, so the overlapping last tile would add its block
  # twice (it did: RULEC_OPT lists in this order gave wrong values, found by a random action-list stress)
  a, b, t = _matmul(m=7, k=64, n=9)
  key, axis = _key_and_axes(t)
  kx = _k_axis(t)
  (kern,) = t.schedule()
  low = decomposed(kern, cpu_device.optional_decompositions())
  with pytest.raises(OptError, match=r"after KBLOCK: the sums of earlier blocks; UPCAST first, then KBLOCK"):
    apply(low, parse_actions(f"UPCAST({axis[9]},3) KBLOCK({kx},16) UPCAST({axis[7]},4) THREAD({axis[7]})"), "CPU")
  fresh.setenv("RULEC_OPT", f"{key}=UPCAST({axis[7]},4) UPCAST({axis[9]},3) KBLOCK({kx},16) THREAD({axis[7]})")   # the other order
  fresh.setattr(cpu_device, "MIN_SPLIT_WORK", 1)
  np.testing.assert_allclose(t.numpy(), a @ b, rtol=1e-4, atol=1e-4)


def test_random_tile_block_prefetch_lists_are_refused_or_compute_the_same(fresh):
  # UPCAST, KBLOCK, PREFETCH and THREAD in any order and amount on matmuls of odd, prime and even sizes, plain and
  # transposed (the stress that found ragged tiles after KBLOCK adding a block twice). RULEC_OPT_STRESS=N for more
  import random
  rnd = random.Random(5)
  fresh.setattr(cpu_device, "MIN_SPLIT_WORK", 1)
  applied = 0
  for it in range(int(os.environ.get("RULEC_OPT_STRESS", "60"))):
    m, k, n = rnd.choice([7, 33, 64, 97]), rnd.choice([17, 31, 64, 97, 131]), rnd.choice([9, 48, 67])
    rng = np.random.default_rng(it)
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    t = Tensor(a) @ (Tensor(b.T.copy()).T if rnd.random() < 0.3 else Tensor(b))
    (kern,) = t.schedule()
    low = decomposed(kern, cpu_device.optional_decompositions())
    kx = _k_axis(t)
    store = [r.arg[0] for r in low.ranges if r.arg[0] != kx]
    acts = []
    for _ in range(rnd.randint(1, 5)):
      op = rnd.choice(["UPCAST", "UPCAST", "KBLOCK", "PREFETCH", "THREAD"])
      acts.append({"UPCAST": lambda: f"UPCAST({rnd.choice(store)},{rnd.choice([2, 3, 4, 8, 14, 16, 32])})",
                   "KBLOCK": lambda: f"KBLOCK({kx},{rnd.choice([2, 5, 16, 30, 64])})",
                   "PREFETCH": lambda: f"PREFETCH({kx},{rnd.choice([1, 4, 8, 64])})",
                   "THREAD": lambda: f"THREAD({rnd.choice(store)})"}[op]())
    text = " ".join(acts)
    try: apply(low, parse_actions(text), "CPU")
    except OptError: continue
    fresh.setenv("RULEC_OPT", f"{kernel_key(low)}={text}")
    fresh.setenv("RULEC_THREADS", str(rnd.randint(1, 4)))
    cpu_device._by_ast.clear()
    np.testing.assert_allclose(t.numpy(), a @ b, rtol=1e-4, atol=1e-4, err_msg=f"{m}x{k}x{n}: {text}")
    applied += 1
  assert applied >= 15


@settings(max_examples=24, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from([16, 56, 20, 18, 19, 5, 64]), st.sampled_from([1, 3]), st.sampled_from(["mul", "sub", "neg", "exp"]),
       st.sampled_from([np.float32, np.float64]))
def test_simd_over_the_innermost_of_several_ranges_keeps_partial_sums_and_agrees_with_numpy(fresh, q, p, form, dtype):
  # a sum over (p, q) with q in vector lanes: 16 partial sums per output across both ranges, added once at the end
  # (the tail past the last 16, where a power of two, into the first ones); a term the renderer cannot take as
  # vectors (exp; a tail of 3) leaves q to the loop vectoriser: every form agrees with numpy
  from rulec.codegen import llvmir
  rng = np.random.default_rng(q * 10 + p)
  wide, b = rng.standard_normal((6, p, q + 3)).astype(dtype), rng.standard_normal((p, q)).astype(dtype)
  a = wide[:, :, :q]
  ta, tb = Tensor(wide)[:, :, :q], Tensor(b)   # (rows q + 3 apart: p and q stay two ranges)
  term = {"mul": lambda: ta * tb, "sub": lambda: (ta - tb) * tb, "neg": lambda: -(ta * tb) + ta, "exp": lambda: ta.exp() * tb}[form]
  want = {"mul": a * b, "sub": (a - b) * b, "neg": -(a * b) + a, "exp": np.exp(a) * b}[form].sum(axis=(1, 2))
  t = term().sum(axis=(1, 2))
  (k,) = t.schedule()
  low = decomposed(k, cpu_device.optional_decompositions())
  red = next(u for u in low.ast.toposort() if u.op is Ops.REDUCE)
  fresh.setenv("RULEC_OPT", f"{kernel_key(low)}=SIMD({red.src[-1].arg[0]})")
  import tempfile
  fresh.setenv("RULEC_CACHE_DIR", tempfile.mkdtemp(dir=os.path.dirname(os.environ["RULEC_CACHE_DIR"])))   # (no program of an earlier example)
  cpu_device._by_ast.clear()
  taken = []
  original = llvmir.LLVMRenderer._sum_in_simd_lanes
  def spy(self, *args):
    got = original(self, *args)
    taken.append(got is not None)
    return got
  fresh.setattr(llvmir.LLVMRenderer, "_sum_in_simd_lanes", spy)
  tol = 1e-4 if dtype == np.float32 else 1e-10
  np.testing.assert_allclose(t.numpy(), want, rtol=tol, atol=tol)
  vectors = form != "exp" and (q % 16) & (q % 16 - 1) == 0
  if len(red.src) > 2 and q >= 16: assert taken == [vectors], (taken, form, q)


def _force_dot_tile(fresh, t, rows: int, cols: int) -> None:
  """RULEC_OPT for t's one kernel (x @ W.T, and whatever follows it): rows x cols lanes, the sum in vector lanes."""
  (kern,) = t.schedule()
  low = decomposed(kern, cpu_device.optional_decompositions())
  red = next(u for u in low.ast.toposort() if u.op is Ops.REDUCE)
  row_axis, col_axis = (r.arg[0] for r in low.ast.src[0].src[1:])
  ups = [f"UPCAST({ax},{amount})" for ax, amount in ((col_axis, cols), (row_axis, rows)) if amount > 1]
  fresh.setenv("RULEC_OPT", f"{kernel_key(low)}={' '.join(ups)} SIMD({red.src[-1].arg[0]})")


@pytest.mark.parametrize("rows, cols", [(1, 2), (2, 2), (4, 4), (8, 4), (3, 1), (3, 4), (6, 2)])
@pytest.mark.parametrize("k", [64, 65, 80, 16])
def test_a_dot_tiles_partial_sums_are_added_for_every_lane_and_agree_with_numpy(fresh, rows, cols, k):
  # x @ W.T in a tile of rows x cols lanes, its sum in vector lanes (SIMD): each lane's 16 partial sums added
  # together, all lanes at once where they are a power of two (4, 16, 32: fewer lanes than partials, as many,
  # more), one by one where not (3, 12); a tail of 1 (65) or 16 (80) past the last whole vector
  m, n = 24, 16
  rng = np.random.default_rng(rows * 100 + cols * 10 + k)
  a, w = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((n, k)).astype(np.float32)
  t = Tensor(a) @ Tensor(w).T
  _force_dot_tile(fresh, t, rows, cols)
  np.testing.assert_allclose(t.numpy(), a @ w.T, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("n, k, kind", [(1000, 768, "norm"), (1002, 768, "norm"), (64, 256, "plain"), (9, 80, "plain"),
                                        (512, 192, "swiglu"), (30, 64, "swiglu")])
def test_a_matrix_vector_product_takes_a_tile_of_rows_and_agrees_with_numpy(fresh, n, k, kind):
  # a decode step's projections: one output row, so no row tile; rows of W side by side (UPCAST), each sum in vector
  # lanes (SIMD), the vector and an RMSNorm's scale (one value, read at index 0) shared by the tile. SwiGLU's gate and
  # up are two sums in one kernel, both in lanes. Rows that 4 does not divide (1002, 9, 30) keep their values
  rng = np.random.default_rng(n + k)
  xv, wv, w2v, gv = (rng.standard_normal(s).astype(np.float32) for s in ((1, k), (n, k), (n, k), (k,)))
  x, w, w2, g = Tensor(xv), Tensor(wv), Tensor(w2v), Tensor(gv)
  if kind == "norm":
    scale = (x * x).mean(-1, keepdim=True).add(1e-5).rsqrt().realize()
    t, want = ((x * scale) * g) @ w.T, ((xv / np.sqrt((xv * xv).mean(-1, keepdims=True) + 1e-5)) * gv) @ wv.T
  elif kind == "plain": t, want = x @ w.T, xv @ wv.T
  else:
    a, b = xv @ wv.T, xv @ w2v.T
    t, want = (x @ w.T).silu() * (x @ w2.T), a / (1 + np.exp(-a)) * b
  kernels = t.schedule()
  low = decomposed(kernels[-1], cpu_device.optional_decompositions())
  from rulec.codegen.opt import choose
  text = format_actions(choose.cpu_actions(low))
  sums = 2 if kind == "swiglu" else 1
  if n % 4 == 0 and n >= 8 and k >= 64:
    assert re.fullmatch(r"UPCAST\((\d+),4\)" + r" SIMD\(\d+\)" * sums + r" THREAD\(\1\)", text), text
  np.testing.assert_allclose(t.numpy(), want, rtol=2e-5, atol=2e-5 * np.sqrt(k))


def test_one_range_sums_that_share_no_load_take_two_rows_at_a_time():
  # every load moving with the output (a row-wise dot of two matrices; a batchnorm's per-channel sums over N x H*W,
  # the sum over two ranges with its innermost in lanes): UNSHARED_ROWS outputs side by side, values numpy's
  from rulec.codegen.opt import choose
  rng = np.random.default_rng(5)
  av, bv = rng.standard_normal((256, 128)).astype(np.float32), rng.standard_normal((256, 128)).astype(np.float32)
  xv, gv = rng.standard_normal((4, 6, 9, 80)).astype(np.float32), rng.standard_normal((4, 6, 9, 80)).astype(np.float32)
  x, g = Tensor(xv), Tensor(gv)
  cases = [((Tensor(av) * Tensor(bv)).sum(1), (av * bv).sum(1), 1),
           ((x * g).relu().sum((0, 2, 3)), np.maximum(xv * gv, 0).sum((0, 2, 3)), 2)]
  for t, want, nranges in cases:
    (kern,) = t.schedule()
    low = merged_reduce_ranges(decomposed(kern, cpu_device.optional_decompositions()))
    red = next(u for u in low.ast.toposort() if u.op is Ops.REDUCE)
    assert len(red.src) - 1 == nranges
    text = format_actions(choose.cpu_actions(low, choose.CPUTarget(lanes=16)))
    assert re.fullmatch(rf"UPCAST\((\d+),{choose.UNSHARED_ROWS}\) SIMD\({red.src[-1].arg[0]}\) THREAD\(\1\)", text), text
    np.testing.assert_allclose(t.numpy(), want, rtol=1e-5, atol=1e-4)


EPILOGUES = {
  # gelu's tanh times the sum, as GPT-2's MLP backward fuses its derivative (tanh: exp2, where, divisions)
  "gelu_grad": lambda s, h: s * (0.5 * (1 + (0.79788456 * (h + 0.044715 * h * h * h)).tanh())),
  "sigmoid_where": lambda s, h: (s * h).sigmoid().where(s > h, -(s * s).sqrt() - h.exp()) * 3 + h.reciprocal().abs().maximum(0.5),
  # a bool stored: the vector of comparisons, each lane's element widened to a byte
  "bool_out": lambda s, h: ((s * h).sigmoid() * (s > 0).where(s.exp(), h.abs().sqrt()) + (s > h).cast("float32")
                            - h.abs().maximum(0.5)) > 0.7,
  "bits": lambda s, h: ((s * 2.5).bitcast("int32") >> 3 ^ (h * 7).bitcast("int32")).bitcast("float32").isnan().where(
    1.0, s * h * 0.25 + s - h / 3) + (s - h).maximum(s * h) * (s + 1) / (h * h + 1) - (s < 0.1).where(s * 3, h * -2),
}


@pytest.mark.parametrize("kind", sorted(EPILOGUES))
@pytest.mark.parametrize("rows, cols, n", [(4, 4, 64), (2, 8, 48), (4, 4, 36), (1, 1, 16)])
def test_a_dot_tiles_long_epilogue_runs_on_vectors_of_its_lanes_and_agrees_with_the_reference(fresh, kind, rows, cols, n):
  # x @ W.T's dot tile (SIMD) followed by a long elementwise epilogue: the lanes' sums and loads gathered into one
  # vector and the epilogue computed on it (llvmir._lanes_as_vector), against the NUMPY device's values; a 1 x 1
  # tile (one lane) keeps the scalar path. Ragged columns (36 by 4 overlap the last tile)
  from rulec.codegen import llvmir
  taken = []
  orig = llvmir.LLVMRenderer._lanes_as_vector
  fresh.setattr(llvmir.LLVMRenderer, "_lanes_as_vector", lambda self, v: (taken.append(r := orig(self, v)), r)[1])
  m, k = 24, 96
  rng = np.random.default_rng(rows * 7 + n)
  a, w = rng.standard_normal((m, k)).astype(np.float32) * 0.2, rng.standard_normal((n, k)).astype(np.float32) * 0.2
  h = rng.standard_normal((m, n)).astype(np.float32)
  h[0, :3] = [np.inf, -np.inf, np.nan]
  def build(device):
    s = Tensor(a, device=device) @ Tensor(w, device=device).T
    return EPILOGUES[kind](s, Tensor(h, device=device))
  want = build("NUMPY").numpy()
  t = build("CPU")
  _force_dot_tile(fresh, t, rows, cols)
  got = t.numpy()
  if got.dtype == np.bool_: np.testing.assert_array_equal(got, want)
  else: np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
  vectors = [x for x in taken if x is not None]
  assert bool(vectors) == (rows * cols > 1), (kind, rows, cols, taken)
