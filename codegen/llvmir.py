"""A kernel as LLVM IR (llvmlite.ir).

The kernel's decompositions (rules/decomp.rules) have run first, so every op
here maps to a few LLVM instructions. Loops come from the store's END ranges
and each REDUCE's ranges; a REDUCE keeps its accumulator in an alloca that
LLVM's mem2reg turns into a register. Values are emitted where first needed,
inside the innermost open loop; LLVM's loop-invariant code motion hoists what
does not depend on it.

The function is `void kernel(ptr p0, ..., ptr pN, i64 start, i64 end)`: the
outermost range of the (single) store runs over [start, end), so the runtime
can split it across threads.
"""
from __future__ import annotations

import math

from llvmlite import ir

from engine.dtypes import DType, dtypes
from engine.ops import Ops
from engine.sched.indexing import identity_element
from engine.uop import UOp
from runtime.kernel import Kernel

_I1, _I8, _I64 = ir.IntType(1), ir.IntType(8), ir.IntType(64)


def lltype(d: DType) -> ir.Type:
  if d.kind == "b": return _I1
  if d.kind in "iux": return ir.IntType(d.bits)
  if d is dtypes.float16: return ir.HalfType()
  if d is dtypes.float32: return ir.FloatType()
  if d is dtypes.float64: return ir.DoubleType()
  raise NotImplementedError(f"the CPU backend does not support {d}")


def memtype(d: DType) -> ir.Type:
  return _I8 if d.kind == "b" else lltype(d)


class _Loop:
  def __init__(self, r: UOp, var, header, body, exit_):
    self.r, self.var, self.header, self.body, self.exit = r, var, header, body, exit_


class LLVMRenderer:
  def __init__(self, kernel: Kernel, name: str = "kernel"):
    self.k = kernel
    self.module = ir.Module(name="rulec")
    params = sorted({u for u in kernel.ast.toposort() if u.op is Ops.PARAM}, key=lambda p: p.arg[0])
    self.nbufs = len(kernel.bufs)
    ftype = ir.FunctionType(ir.VoidType(), [ir.PointerType()] * self.nbufs + [_I64, _I64])
    self.fn = ir.Function(self.module, ftype, name=name)
    for i, a in enumerate(self.fn.args[:self.nbufs]):
      a.name = f"p{i}"
      a.add_attribute("noalias")
    self.start, self.end = self.fn.args[self.nbufs], self.fn.args[self.nbufs + 1]
    self.entry = self.fn.append_basic_block("entry")
    self.b = ir.IRBuilder(self.entry)
    self.ptrs = {p: self.fn.args[p.arg[0]] for p in params}
    self.scopes: list[dict[UOp, ir.Value]] = [{}]
    self.ranges: dict[UOp, ir.Value] = {}
    self.split_range: UOp | None = None

  # *** loops ***
  def open_loop(self, r: UOp, lo=None, hi=None) -> _Loop:
    var = self._alloca(_I64, f"i{r.arg[0]}")
    self.b.store(lo if lo is not None else ir.Constant(_I64, 0), var)
    header = self.fn.append_basic_block(f"r{r.arg[0]}_head")
    body = self.fn.append_basic_block(f"r{r.arg[0]}_body")
    exit_ = self.fn.append_basic_block(f"r{r.arg[0]}_exit")
    self.b.branch(header)
    self.b.position_at_end(header)
    i = self.b.load(var)
    bound = hi if hi is not None else ir.Constant(_I64, r.src[0].arg)
    self.b.cbranch(self.b.icmp_signed("<", i, bound), body, exit_)
    self.b.position_at_end(body)
    self.ranges[r] = self.b.load(var, name=f"r{r.arg[0]}")
    self.scopes.append({})
    return _Loop(r, var, header, body, exit_)

  def close_loop(self, lp: _Loop):
    i = self.b.load(lp.var)
    self.b.store(self.b.add(i, ir.Constant(_I64, 1)), lp.var)
    self.b.branch(lp.header)
    self.b.position_at_end(lp.exit)
    self.scopes.pop()
    del self.ranges[lp.r]

  def _alloca(self, ty, name):
    with self.b.goto_block(self.entry):
      self.b.position_at_start(self.entry)
      return self.b.alloca(ty, name=name)

  # *** the kernel ***
  def render(self) -> str:
    stores = [s for s in self.k.ast.src]
    with_ranges = [s for s in stores if s.op is Ops.END]
    # thread-split the first range of a kernel with exactly one looping store
    if len(stores) == 1 and with_ranges: self.split_range = stores[0].src[1]
    for st in stores:
      loops = []
      if st.op is Ops.END:
        for r in st.src[1:]:
          if r is self.split_range: loops.append(self.open_loop(r, self.start, self.end))
          else: loops.append(self.open_loop(r))
        st = st.src[0]
      target, value = st.src
      p, idx = target.src
      v = self.value(value)
      self._store(p, self.value(idx), v, value.dtype)
      for lp in reversed(loops): self.close_loop(lp)
    self.b.ret_void()
    return str(self.module)

  def _store(self, p: UOp, idx, v, d: DType):
    ptr = self.b.gep(self.ptrs[p], [idx], inbounds=True, source_etype=memtype(d))
    if d.kind == "b": v = self.b.zext(v, _I8)
    self.b.store(v, ptr)

  def lookup(self, u: UOp):
    for sc in reversed(self.scopes):
      if u in sc: return sc[u]
    return None

  def value(self, u: UOp):
    got = self.lookup(u)
    if got is not None: return got
    # post-order without recursion; REDUCE opens loops, so its value is emitted on its own
    stack = [(u, False)]
    while stack:
      x, ready = stack.pop()
      if self.lookup(x) is not None: continue
      if x.op is Ops.REDUCE or not x.src or x.op is Ops.RANGE:
        self.scopes[-1][x] = self.emit(x)
        continue
      if not ready:
        stack.append((x, True))
        for s in (x.src[1:] if x.op is Ops.INDEX else x.src):   # a PARAM is a pointer, not a value
          if self.lookup(s) is None: stack.append((s, False))
        continue
      self.scopes[-1][x] = self.emit(x)
    return self.lookup(u)

  # *** one node ***
  def emit(self, u: UOp):
    op, d, b = u.op, u.dtype, self.b
    if op is Ops.CONST: return self.const(u.arg, d)
    if op is Ops.RANGE:
      if u not in self.ranges: raise ValueError(f"range r{u.arg[0]} used outside its loop")
      return self.ranges[u]
    if op is Ops.INDEX:
      p, idx = u.src
      ptr = b.gep(self.ptrs[p], [self.value(idx)], inbounds=True, source_etype=memtype(d))
      v = b.load(ptr, typ=memtype(d))
      return b.trunc(v, _I1) if d.kind == "b" else v
    if op is Ops.REDUCE: return self.reduce(u)
    srcs = [self.lookup(s) for s in u.src]
    if op is Ops.CAST: return self.cast(srcs[0], u.src[0].dtype, d)
    if op is Ops.BITCAST: return b.bitcast(srcs[0], lltype(d))
    if op is Ops.WHERE: return b.select(srcs[0], srcs[1], srcs[2])
    sd = u.src[0].dtype
    return self.alu(op, sd, d, srcs)

  def const(self, v, d: DType):
    if d.kind == "f":
      if math.isnan(v) or math.isinf(v): return ir.Constant(lltype(d), v)
      return ir.Constant(lltype(d), float(v))
    return ir.Constant(lltype(d), int(v))

  def alu(self, op: Ops, sd: DType, d: DType, s: list):
    b, fl, uns = self.b, sd.kind == "f", sd.kind in "ub"
    if sd.kind == "b" and op in (Ops.ADD, Ops.MAX): return b.or_(*s)    # bools saturate: + is or, * is and
    if sd.kind == "b" and op is Ops.MUL: return b.and_(*s)
    if op is Ops.ADD: return b.fadd(*s) if fl else b.add(*s)
    if op is Ops.SUB: return b.fsub(*s) if fl else b.sub(*s)
    if op is Ops.MUL: return b.fmul(*s) if fl else b.mul(*s)
    if op is Ops.FDIV: return b.fdiv(*s)
    if op is Ops.NEG: return b.fneg(s[0]) if fl else b.sub(ir.Constant(s[0].type, 0), s[0])
    if op is Ops.MAX:  # b if b > a else a: the first operand survives a NaN second, as in engine/alu.py
      gt = b.fcmp_ordered(">", s[1], s[0]) if fl else (b.icmp_unsigned if uns else b.icmp_signed)(">", s[1], s[0])
      return b.select(gt, s[1], s[0])
    if op is Ops.CMPLT:
      return b.fcmp_ordered("<", *s) if fl else (b.icmp_unsigned if uns else b.icmp_signed)("<", *s)
    if op is Ops.CMPNE: return b.fcmp_unordered("!=", *s) if fl else b.icmp_unsigned("!=", *s)
    if op is Ops.CMPEQ: return b.fcmp_ordered("==", *s) if fl else b.icmp_unsigned("==", *s)
    if op is Ops.AND: return b.and_(*s)
    if op is Ops.OR: return b.or_(*s)
    if op is Ops.XOR: return b.xor(*s)
    if op is Ops.CDIV: return self._int_div(s[0], s[1], uns, rem=False)
    if op is Ops.CMOD:
      if fl: return b.frem(*s)
      return self._int_div(s[0], s[1], uns, rem=True)
    if op is Ops.IDIV and fl:  # floor(a / b); a non-finite quotient passes through; x // 0 is +-inf by x's sign (numpy)
      ty = s[0].type
      q = self._intrinsic("llvm.floor", [b.fdiv(*s)])
      by0 = b.fcmp_ordered("==", s[1], ir.Constant(ty, 0.0))
      signed_inf = self._intrinsic("llvm.copysign", [ir.Constant(ty, math.inf), s[0]])
      a0 = b.fcmp_unordered("==", s[0], ir.Constant(ty, 0.0))
      return b.select(by0, b.select(a0, ir.Constant(ty, math.nan), signed_inf), q)
    if op in (Ops.SHL, Ops.SHR): return self._shift(op, s[0], s[1], uns)
    if op is Ops.SQRT: return self._intrinsic("llvm.sqrt", s)
    if op is Ops.EXP2: return self._intrinsic("llvm.exp2", s)
    if op is Ops.LOG2: return self._intrinsic("llvm.log2", s)
    if op is Ops.SIN: return self._intrinsic("llvm.sin", s)
    if op is Ops.TRUNC: return self._intrinsic("llvm.trunc", s)
    if op is Ops.RECIPROCAL: return b.fdiv(ir.Constant(s[0].type, 1.0), s[0])
    if op is Ops.POW: return self._intrinsic("llvm.pow", s) if fl else self._int_pow(s[0], s[1], uns)
    if op is Ops.MULACC: return b.fadd(b.fmul(s[0], s[1]), s[2]) if fl else b.add(b.mul(s[0], s[1]), s[2])
    raise NotImplementedError(f"the CPU backend cannot render {op} on {sd} (no decomposition rule for it)")

  def _intrinsic(self, name: str, args: list):
    ty = args[0].type
    fn = self.module.declare_intrinsic(name, [ty], ir.FunctionType(ty, [ty] * len(args)))
    return self.b.call(fn, args)

  def _int_div(self, x, y, unsigned: bool, rem: bool):
    # division by zero is 0 (numpy's answer); INT_MIN / -1 wraps: guard both, LLVM would trap
    b, ty = self.b, x.type
    zero, one = ir.Constant(ty, 0), ir.Constant(ty, 1)
    is0 = b.icmp_unsigned("==", y, zero)
    if unsigned:
      safe = b.select(is0, one, y)
      r = b.urem(x, safe) if rem else b.udiv(x, safe)
      return b.select(is0, zero, r)
    neg1 = b.icmp_signed("==", y, ir.Constant(ty, -1))
    safe = b.select(b.or_(is0, neg1), one, y)
    r = b.srem(x, safe) if rem else b.sdiv(x, safe)
    r = b.select(neg1, zero if rem else b.sub(zero, x), r)
    return b.select(is0, zero, r)

  def _int_pow(self, a, e, unsigned: bool):
    # square and multiply (wrapping, as numpy); a negative exponent gives 1/a**|e| truncated, as engine/alu.py
    b, ty = self.b, a.type
    res, base, exp = self._alloca(ty, "pow_res"), self._alloca(ty, "pow_base"), self._alloca(ty, "pow_exp")
    b.store(ir.Constant(ty, 1), res)
    b.store(a, base)
    b.store(e, exp)
    head, body, done = (self.fn.append_basic_block(n) for n in ("pow_head", "pow_body", "pow_done"))
    b.branch(head)
    b.position_at_end(head)
    cur = b.load(exp)
    # != 0 with a logical shift: ends within the width for any bit pattern (unsigned top bit, negative)
    b.cbranch(b.icmp_unsigned("!=", cur, ir.Constant(ty, 0)), body, done)
    b.position_at_end(body)
    cur, bv, rv = b.load(exp), b.load(base), b.load(res)
    odd = b.icmp_unsigned("!=", b.and_(cur, ir.Constant(ty, 1)), ir.Constant(ty, 0))
    b.store(b.select(odd, b.mul(rv, bv), rv), res)
    b.store(b.mul(bv, bv), base)
    b.store(b.lshr(cur, ir.Constant(ty, 1)), exp)
    b.branch(head)
    b.position_at_end(done)
    out = b.load(res)
    if unsigned: return out
    neg = b.icmp_signed("<", e, ir.Constant(ty, 0))
    one, m1 = ir.Constant(ty, 1), ir.Constant(ty, -1)
    odd_e = b.icmp_unsigned("!=", b.and_(e, one), ir.Constant(ty, 0))
    neg_val = b.select(b.icmp_unsigned("==", a, one), one,
                       b.select(b.icmp_unsigned("==", a, m1), b.select(odd_e, m1, one), ir.Constant(ty, 0)))
    return b.select(neg, neg_val, out)

  def _shift(self, op: Ops, x, n, unsigned: bool):
    # engine/alu.py: a negative amount leaves x alone; an amount past the width shifts everything out
    b, ty = self.b, x.type
    width = ir.Constant(ty, ty.width)
    neg = b.icmp_signed("<", n, ir.Constant(ty, 0)) if not unsigned else ir.Constant(_I1, 0)
    big = b.icmp_unsigned(">=", n, width)
    safe = b.select(b.or_(neg, big), ir.Constant(ty, 0), n)
    if op is Ops.SHL: shifted, out = b.shl(x, safe), ir.Constant(ty, 0)
    elif unsigned: shifted, out = b.lshr(x, safe), ir.Constant(ty, 0)
    else: shifted, out = b.ashr(x, safe), b.ashr(x, ir.Constant(ty, ty.width - 1))
    return b.select(neg, x, b.select(big, out, shifted))

  def cast(self, v, sd: DType, d: DType):
    b, to = self.b, lltype(d)
    if sd is d: return v
    if d.kind == "b":
      if sd.kind == "f": return b.fcmp_unordered("!=", v, ir.Constant(v.type, 0.0))
      return b.icmp_unsigned("!=", v, ir.Constant(v.type, 0))
    if sd.kind == "b": return b.uitofp(v, to) if d.kind == "f" else b.zext(v, to)
    if sd.kind == "f" and d.kind == "f": return b.fpext(v, to) if _fbits(d) > _fbits(sd) else b.fptrunc(v, to)
    if d.kind == "f": return b.uitofp(v, to) if sd.kind == "u" else b.sitofp(v, to)
    if sd.kind == "f":
      # engine/alu.py: non-finite -> 0, else truncate toward zero and wrap to the width
      ty = v.type
      finite = b.fcmp_ordered("<", self._intrinsic("llvm.fabs", [v]), ir.Constant(ty, math.inf))
      if sd is not dtypes.float16:
        # an integer-valued float past int64 wraps: reduce it modulo 2**64 (exact) into [-2**63, 2**63)
        w = b.frem(v, ir.Constant(ty, 2.0 ** 64))
        w = b.select(b.fcmp_ordered(">=", w, ir.Constant(ty, 2.0 ** 63)), b.fsub(w, ir.Constant(ty, 2.0 ** 64)),
                     b.select(b.fcmp_ordered("<", w, ir.Constant(ty, -2.0 ** 63)), b.fadd(w, ir.Constant(ty, 2.0 ** 64)), w))
        v = b.select(b.fcmp_ordered("<", self._intrinsic("llvm.fabs", [v]), ir.Constant(ty, 2.0 ** 63)), v, w)
      wide = b.fptosi(b.select(finite, v, ir.Constant(ty, 0.0)), _I64)
      return b.trunc(wide, to) if to.width < 64 else wide
    # int -> int
    if to.width < v.type.width: return b.trunc(v, to)
    if to.width > v.type.width: return b.zext(v, to) if sd.kind == "u" else b.sext(v, to)
    return v

  def reduce(self, u: UOp):
    op, d = u.arg, u.dtype
    value, rngs = u.src[0], u.src[1:]
    # half sums and products accumulate in float, as numpy's do, then round once
    wide = d is dtypes.float16 and op in (Ops.ADD, Ops.MUL)
    ad = dtypes.float32 if wide else d
    acc = self._alloca(lltype(ad), "acc")
    self.b.store(self.const(identity_element(op, d), ad), acc)
    loops = [self.open_loop(r) for r in rngs]
    v = self.value(value)
    if wide: v = self.b.fpext(v, lltype(ad))
    cur = self.b.load(acc)
    if ad.kind == "f" and op is Ops.ADD: new = self.b.fadd(cur, v, flags=("reassoc", "contract"))
    elif ad.kind == "f" and op is Ops.MUL: new = self.b.fmul(cur, v, flags=("reassoc",))
    # MAX stays a compare-and-select: llvm.maxnum would vectorise, but LLVM 22's loop vectoriser (as
    # built in llvmlite 0.50, assertions on) aborts the process on some maxnum reductions
    else: new = self.alu(op, ad, ad, [cur, v])
    self.b.store(new, acc)
    for lp in reversed(loops): self.close_loop(lp)
    out = self.b.load(acc)
    return self.b.fptrunc(out, lltype(d)) if wide else out


def _fbits(d: DType) -> int: return d.itemsize * 8


def render(kernel: Kernel, name: str = "kernel") -> tuple[str, UOp | None]:
  """(LLVM IR text, the range split across threads or None)."""
  r = LLVMRenderer(kernel, name)
  return r.render(), r.split_range
