"""Programs the scheduler once got wrong (issue 10): several outputs that share work, graphs of constants
only, assigns read together with the old contents, views of assigned tensors, and the kernel counts of
outputs that are views or contiguous copies. Every value is checked against numpy; the file runs on the
default device and again on NUMPY and CL in CI (RULEC_DEVICE)."""
import numpy as np
import pytest

from rulec.engine.ir.dtypes import dtypes
from rulec.engine.ir.ops import Ops
from rulec.engine.tensor import Tensor
from rulec.engine.ir.kernel import validate

rng = np.random.default_rng(10)


def arr(*shape, dtype=np.float32): return rng.standard_normal(shape).astype(dtype)


def kernels(*ts):
  ks = Tensor.schedule(*ts)
  for k in ks: validate(k)
  return ks


def close(t, want, **kw):
  np.testing.assert_allclose(t.numpy(), want, rtol=kw.get("rtol", 1e-5), atol=kw.get("atol", 1e-6))


# *** several outputs that share work ***

@pytest.mark.parametrize("keep", [False, True])
def test_a_reduce_and_its_view_are_one_kernel(keep):
  a = arr(3, 7, 17)
  x = Tensor(a)
  s, sk = x.sum(axis=2), x.sum(axis=2, keepdim=True)
  assert len(kernels(s, sk)) == 1
  Tensor.realize(sk, s) if keep else Tensor.realize(s, sk)
  close(s, a.sum(2), rtol=1e-4)
  close(sk, a.sum(2, keepdims=True), rtol=1e-4)


def test_a_total_and_its_reshape():
  a = arr(3, 7, 17)
  x = Tensor(a)
  s, r = x.sum(), x.sum().reshape(1, 1, 1)
  assert len(kernels(s, r)) == 1
  Tensor.realize(s, r)
  close(s, a.sum(), rtol=1e-4)
  close(r, a.sum().reshape(1, 1, 1), rtol=1e-4)


def test_stack_of_one_reduce_twice():
  s = Tensor([[0.5]]).sum(0)
  close(Tensor.stack(s, s), np.array([[0.5], [0.5]]))


def test_int_layernorm_then_softmax():
  out = Tensor([[2]], dtype=dtypes.int64).layernorm(axis=0).softmax(-1)
  close(out, np.array([[1.0]]))


def test_attention_with_both_outputs():
  q, k, v = arr(2, 4, 8), arr(2, 4, 8), arr(2, 4, 8)
  att = (Tensor(q) @ Tensor(k).transpose(-1, -2)).softmax(-1)
  out = att @ Tensor(v)
  Tensor.realize(att, out)
  e = np.exp(q @ k.transpose(0, 2, 1) - (q @ k.transpose(0, 2, 1)).max(-1, keepdims=True))
  want_att = e / e.sum(-1, keepdims=True)
  close(att, want_att, rtol=1e-4, atol=1e-5)
  close(out, want_att @ v, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("build", ["cat", "stack", "flip", "where", "expand"])
def test_movement_and_where_over_a_reduce_with_the_reduce_as_output(build):
  a = arr(4, 6)
  x = Tensor(a)
  m = x.max(axis=1, keepdim=True)
  ref = a.max(1, keepdims=True)
  if build == "cat": out, want = Tensor.cat(m, m * 2, axis=1), np.concatenate([ref, ref * 2], 1)
  elif build == "stack": out, want = Tensor.stack(m, m + 1), np.stack([ref, ref + 1])
  elif build == "flip": out, want = m.flip(0), ref[::-1]
  elif build == "where": out, want = (x > m - 0.5).where(m, x), np.where(a > ref - 0.5, ref, a)
  else: out, want = m.expand(4, 6) - x, ref - a
  Tensor.realize(m, out)
  close(m, ref)
  close(out, want)


def test_one_output_used_by_another_is_computed_once():
  a = arr(16, 32)
  x = Tensor(a)
  y = (x * 2).exp().sum(axis=1, keepdim=True)
  z = x / y
  assert len(kernels(y, z)) == 2
  Tensor.realize(y, z)
  want = np.exp(a * 2).sum(1, keepdims=True)
  close(y, want, rtol=1e-4)
  close(z, a / want, rtol=1e-4)


# *** graphs of constants only ***

@pytest.mark.parametrize("red", ["sum", "max", "any", "all"])
def test_a_split_reduce_of_constants(red):
  t = Tensor.ones(2 ** 15)
  got = getattr(t, red)()
  want = getattr(np.ones(2 ** 15, dtype=np.float32), red)()
  assert got.item() == want


def test_contiguous_of_constants():
  close((-Tensor.full((4, 4), 2.0)).contiguous().realize(), np.full((4, 4), -2.0))
  close((Tensor.ones(3, 2) * 3).contiguous() + 1, np.full((3, 2), 4.0))


@pytest.mark.parametrize("device", ["NUMPY", "CPU"])
def test_a_constant_graph_is_stored_on_its_tensors_device(device):
  t = (Tensor.ones(5, device=device) * 2).contiguous().realize()
  assert t.uop.base.op is Ops.BUFFER and t.uop.base.arg[1] == device and t.device == device
  assert t.tolist() == [2.0] * 5


# *** assign ***

def test_a_value_built_before_an_assign_sees_the_old_contents():
  a = Tensor(np.arange(4)).realize()
  old = a + 0
  a.assign(a * 10)
  assert (old + a).tolist() == [0, 11, 22, 33]
  assert a.tolist() == [0, 10, 20, 30]


def test_an_old_read_and_a_new_read_through_another_kernel():
  a = Tensor(np.arange(6, dtype=np.float32)).realize()
  old = a * 1
  a.assign(a + 1)
  new_sum = a.sum()          # a kernel of its own, after the write
  out = old + new_sum        # reads the old contents and, through new_sum, the new ones
  want_old = np.arange(6, dtype=np.float32)
  close(out, want_old + (want_old + 1).sum())
  close(a, want_old + 1)


def test_an_assign_is_carried_out_once():
  a = Tensor(np.arange(4)).realize()
  a.assign(a + 1)
  (a * 2).realize()          # realizes the assign on the way
  assert a.tolist() == [1, 2, 3, 4]
  assert a.tolist() == [1, 2, 3, 4]


def test_two_assigns_in_a_row():
  a = Tensor(np.arange(4)).realize()
  a.assign(a + 1)
  a.assign(a * 3)
  assert a.tolist() == [3, 6, 9, 12]


def test_views_and_values_built_before_an_assign():
  # in one realize every value is computed from the buffer as it was, except through the assign's result
  # (RULEC_REALIZE=eval does the same); an output that is a view computes nothing: it is the buffer, and
  # shows the write (contiguous() of a contiguous tensor is the tensor itself, as in numpy and torch)
  a = Tensor(np.arange(4)).realize()
  alias, view, old = a.contiguous(), a.reshape(2, 2).T, a * 1
  a.assign(a * 10)
  outs = alias + a, view.T.reshape(4) + old, old + a, view, alias
  Tensor.realize(*outs)
  assert [o.numpy().ravel().tolist() for o in outs] == [[0, 11, 22, 33], [0, 2, 4, 6], [0, 11, 22, 33],
                                                         [0, 20, 10, 30], [0, 10, 20, 30]]


@pytest.mark.parametrize("view", ["T", "pad", "flip", "strided", "expand", "reshape", "cat"])
def test_views_of_an_assigned_tensor(view):
  base = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
  t = Tensor(base.copy()).realize()
  t.assign(t + 1)
  want = base + 1
  views = {"T": (lambda x: x.T, lambda x: x.T),
           "pad": (lambda x: x.pad(((1, 0), (0, 2), (1, 1))), lambda x: np.pad(x, ((1, 0), (0, 2), (1, 1)))),
           "flip": (lambda x: x[::-1], lambda x: x[::-1]),
           "strided": (lambda x: x[..., 0::-3, -3], lambda x: x[..., 0::-3, -3]),
           "expand": (lambda x: x[:, :1].expand(2, 5, 4), lambda x: np.broadcast_to(x[:, :1], (2, 5, 4))),
           "reshape": (lambda x: x.reshape(6, 4), lambda x: x.reshape(6, 4)),
           "cat": (lambda x: Tensor.cat(x, x * 2, axis=0), lambda x: np.concatenate([x, x * 2], 0))}
  f, g = views[view]
  close(f(t), g(want))
  close(t, want)


# *** kernels an output needs ***

def test_contiguous_of_a_computed_value_is_one_kernel():
  a, b = Tensor(arr(4, 5)).realize(), Tensor(arr(4, 5)).realize()
  assert len(kernels((a + b).contiguous())) == 1
  # realized beside the value, the copy gets a buffer of its own (an assign into one must not show in the other),
  # and schedule() shows what realize() runs
  assert len(kernels(a + b, (a + b).contiguous())) == 2
  close((a + b).contiguous(), a.numpy() + b.numpy())


def test_views_of_a_realized_buffer_need_no_kernel():
  a = arr(6, 8)
  x = Tensor(a).realize()
  views = [x[1:3], x[::2], x[::-1], x[None, ..., 1], x[..., 1:3], x.T, x.reshape(2, 24)]
  assert kernels(*views) == []
  Tensor.realize(*views)
  for v, want in zip(views, [a[1:3], a[::2], a[::-1], a[None, ..., 1], a[..., 1:3], a.T, a.reshape(2, 24)]):
    close(v, want)
  outs = [x[1:3] * 2, x[::2] + 1, x[::-1]]
  assert len(kernels(*outs)) == 2
  for o, want in zip(outs, [a[1:3] * 2, a[::2] + 1, a[::-1]]): close(o, want)


def test_contiguous_of_a_view_copies():
  a = arr(3, 5)
  x = Tensor(a).realize()
  t = x.T.contiguous().realize()
  assert t.uop.op is Ops.RESHAPE and t.uop.src[0].op is Ops.BUFFER and t.uop.src[0] is not x.uop.base
  close(t, a.T)


@pytest.mark.parametrize("axis", [0, 1])
def test_a_nan_aware_max_and_its_consumer_are_at_most_two_kernels(axis):
  # both reduces of numpy's NaN-propagating max are stored by one kernel (the WHERE over them), not one each; or,
  # where the device hoists a row's value (CPU, NUMPY) and the max is over the last axis, both are computed once per
  # row inside the kernel that reads them; so does a CL device whose work-groups share a row's reduction (a GPU)
  from rulec.runtime.devices import rows_shared
  a = arr(6, 9)
  a[2, 3] = np.nan
  x = Tensor(a).realize()
  am, mx = x.argmax(axis=axis), (x * 2).max(axis=axis, keepdim=True) - x
  row = (x.device in ("CPU", "NUMPY") or rows_shared(x.device)) and axis == 1
  assert len(kernels(am)) == (1 if row else 2) and len(kernels(mx)) == (1 if row else 2)
  np.testing.assert_array_equal(am.numpy(), np.argmax(a, axis))
  np.testing.assert_array_equal(mx.numpy(), (a * 2).max(axis, keepdims=True) - a)


def test_chained_means_stage_only_what_is_shared():
  a = arr(8, 6, 5)
  x = Tensor(a)
  m = x.mean(0)
  out0 = ((m * 2).mean(0) + 1).mean(0)
  out1 = x.mean(2).mean(1) - m.mean(1).mean(0)
  assert len(kernels(out0, out1)) <= 4
  Tensor.realize(out0, out1)
  mm = a.mean(0)
  close(out0, ((mm * 2).mean(0) + 1).mean(0), rtol=1e-4, atol=1e-5)
  close(out1, a.mean(2).mean(1) - mm.mean(1).mean(0), rtol=1e-4, atol=1e-5)


def test_an_assign_no_output_reads_is_still_carried_out():
  # v - v folds to 0 in the kernel, so no kernel reads the assign's result: its store must run all the same
  a = Tensor(np.arange(6, dtype=np.uint8)).realize()
  a.assign(1)
  z = a - a
  assert z.tolist() == [0] * 6
  assert a.tolist() == [1] * 6
  b = Tensor(np.arange(4, dtype=np.float32)).realize()
  b.assign(b + 1)
  assert b[0:0].numpy().shape == (0,)
  assert b.tolist() == [1.0, 2.0, 3.0, 4.0]


def test_assign_into_a_flipped_view_of_its_own_source():
  # the value reads the buffer in order while the target writes it reversed: staged first, not in place
  a = Tensor(np.array([-1, 5, 7, 9], dtype=np.int64)).realize()
  v = a.flip(0)
  v.assign(a).realize()
  assert v.tolist() == [-1, 5, 7, 9] and a.tolist() == [9, 7, 5, -1]
  t = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3)).realize()
  t.T.assign(t.reshape(3, 2)).realize()
  np.testing.assert_array_equal(t.numpy(), np.arange(6, dtype=np.float32).reshape(3, 2).T)


@pytest.mark.parametrize("shape", [(2,), (1, 2)])
def test_contiguous_of_a_buffer_is_that_buffer_and_its_assign_is_not_redirected(shape):
  a = Tensor(np.array([5, -2], dtype=np.int32).reshape(shape)).realize()
  c = a.contiguous()
  a.assign(Tensor(np.array([1, 1], dtype=np.int32).reshape(shape)))
  Tensor.realize(c, a)       # c is a (the same buffer, as in numpy and torch): it shows the write
  assert c.numpy().ravel().tolist() == [1, 1] and a.numpy().ravel().tolist() == [1, 1]
  b = Tensor(np.arange(3, dtype=np.float32)).realize()
  assert b.contiguous().realize().uop.base is b.uop.base   # already contiguous: no copy, as in tinygrad and torch


def test_clone_is_a_copy():
  a = Tensor(np.arange(3, dtype=np.float32)).realize()
  c = a.clone().realize()
  assert c.uop.base is not a.uop.base and c.tolist() == [0.0, 1.0, 2.0]
  a.assign(a + 1).realize()
  assert c.tolist() == [0.0, 1.0, 2.0] and a.tolist() == [1.0, 2.0, 3.0]


def test_a_whole_tensor_reduce_stays_in_its_only_consumer_where_the_device_hoists_it():
  # CPU and NUMPY compute a reduce that depends on no loop around it once per kernel: x.argmax() is one kernel,
  # as in tinygrad; on CL each work-item would compute it, so there it is stored first, except the argmax's max
  # where work-groups share a row's reduction (a GPU: the whole tensor is the argmax's one row)
  from rulec.runtime.devices import rows_shared
  a = arr(48, 40)
  a[3, 7] = 9.0
  x = Tensor(a).realize()
  am, centred = x.argmax(), x - x.mean()
  hoisting = x.device in ("CPU", "NUMPY")
  assert len(kernels(am)) == (1 if hoisting or rows_shared(x.device) else 2)
  assert len(kernels(centred)) == (1 if hoisting else 2)
  assert am.item() == np.argmax(a)
  close(centred, a - a.mean(), rtol=1e-5, atol=1e-5)
  m = x.mean(0)
  out = x.mean(1) - m.mean(0)      # the scalar's own input (a 40-vector) is computed once, not stored
  assert len(kernels(out)) == (1 if hoisting else 2)
  close(out, a.mean(1) - a.mean(0).mean(0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("view", ["T", "reshape"])
def test_a_contiguous_copy_of_a_view_is_reused_by_elementwise_users(view):
  # y is expensive (a matmul) and used twice: its copy's kernel computes it once and y + 1 reads the copy
  a, b = arr(4, 5), arr(5, 6)
  y = Tensor(a) @ Tensor(b)
  yc = y.T.contiguous() if view == "T" else y.reshape(2, 12).contiguous()
  z = y + 1
  assert len(kernels(yc, z)) == 2
  Tensor.realize(yc, z)
  r = a @ b
  close(yc, r.T if view == "T" else r.reshape(2, 12), rtol=1e-5, atol=1e-5)
  close(z, r + 1, rtol=1e-5, atol=1e-5)


def test_assigning_a_copy_from_another_device_is_one_kernel():
  src = Tensor(np.arange(6, dtype=np.float32), device="NUMPY").realize()
  dst = Tensor(np.zeros(6, dtype=np.float32), device="CPU").realize()
  dst.assign(src.to("CPU"))
  assert len(kernels(dst)) == 1
  assert dst.tolist() == list(range(6)) and dst.device == "CPU"


def test_two_tensors_with_one_graph_do_not_share_a_buffer():
  # UOps are hash-consed: both fulls are one node; realizing one must not give the other its buffer, or an
  # assign into the first would change the second
  a, b = Tensor.full((2, 3), -2), Tensor.full((2, 3), -2)
  a.realize()
  a[1] = Tensor([5, 6, 7])
  assert a.tolist() == [[-2, -2, -2], [5, 6, 7]] and b.tolist() == [[-2, -2, -2]] * 2
  x = Tensor(np.arange(4, dtype=np.float32)).realize()
  y, z = x * 2, x * 2
  y.realize()
  y.assign(y + 1).realize()
  assert y.tolist() == [1.0, 3.0, 5.0, 7.0] and z.tolist() == [0.0, 2.0, 4.0, 6.0]


def test_two_tensors_with_one_graph_realized_together_get_a_buffer_each():
  a, b = Tensor.full((2, 4), 1), Tensor.full((2, 4), 1)
  Tensor.realize(a, b)
  # constants are realized without storage (nothing to share); anything stored is stored twice
  assert a.uop.base is not b.uop.base or a.uop.base.op is Ops.CONST
  a.assign(Tensor.full((2, 4), 3)).realize()
  assert a.tolist() == [[3] * 4] * 2 and b.tolist() == [[1] * 4] * 2
  x = Tensor(np.arange(3, dtype=np.float32)).realize()
  c = x.exp().clone()
  Tensor.realize(x.exp(), c)
  close(c, np.exp(np.arange(3, dtype=np.float32)))


def test_constants_fold_in_their_own_dtype():
  # folding happens in Python floats: each constant and each folded result is rounded to its dtype first
  assert (Tensor.full((2,), 0.1) == 0.1).tolist() == [True, True]
  assert (Tensor.full((2,), 0.1) * 3 == 0.3).tolist() == (np.full(2, 0.1, np.float32) * 3 == np.float32(0.3)).tolist()
  assert (Tensor.full((2,), 60000.0, dtype=dtypes.float16) * 2 / 4).tolist() == [np.inf, np.inf]


def test_a_copy_of_a_padded_constant_keeps_its_padding():
  t = Tensor.full((2,), 5.0, device="NUMPY").pad(((1, 1),)).to("CPU")
  assert t.tolist() == [0.0, 5.0, 5.0, 0.0] and t.device == "CPU"
  t.realize()
  assert t.uop.base.arg[1] == "CPU"


def test_abs_of_a_float_modulo():
  # the bounds of a float % c are not those of an integer one ([0, c - 1] made `x % 0.3 < 0` fold to True)
  for device in ("NUMPY", "CPU"):
    v = Tensor(-2.75, dtype=dtypes.float64, device=device)
    np.testing.assert_allclose((v % 0.3).abs().numpy(), np.abs(np.float64(-2.75) % 0.3))
  x = Tensor(np.array([-2.75, 1.1, -0.05], dtype=np.float32))
  np.testing.assert_allclose(((x % 0.3) < 0.1).numpy(), (np.array([-2.75, 1.1, -0.05], np.float32) % np.float32(0.3)) < 0.1)


def test_clones_of_one_tensor_realized_together_are_separate():
  a = Tensor(np.array([7, 8, 9], dtype=np.int32)).realize()
  c1, c2 = a.clone(), a.clone()
  Tensor.realize(c1, c2)
  c1[0:1] = Tensor([-5], dtype=dtypes.int32)
  assert c1.tolist() == [-5, 8, 9] and c2.tolist() == [7, 8, 9] and a.tolist() == [7, 8, 9]


def test_schedule_shows_the_kernels_realize_runs():
  # Tensor.schedule(...) prepares its tensors as Tensor.realize(...) does (a copy realized beside its value, one
  # graph held by two tensors, a constant asked for storage) and leaves them unrealized
  from rulec.runtime import cpu_device
  def programs():
    a, b = Tensor(arr(4, 5)).realize(), Tensor(arr(4, 5)).realize()
    s = a + b
    yield [s, s.contiguous()]
    t = a * 2
    yield [t, Tensor(t.uop)]                      # two tensors, one graph
    yield [Tensor.full((3, 2), 1.5), a.exp()]     # a constant gets storage
    yield [a[1:3], b.T]                           # views of realized buffers: nothing to run
  for ts in programs():
    graphs = [t.uop for t in ts]
    planned = kernels(*ts)
    assert [t.uop for t in ts] == graphs   # (left as they were)
    if ts[0].device != "CPU": continue
    before = cpu_device.COUNTERS["run"]
    Tensor.realize(*ts)
    assert cpu_device.COUNTERS["run"] - before == len(planned)
