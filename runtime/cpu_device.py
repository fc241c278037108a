"""The CPU device: kernels compiled to native code by LLVM (llvmlite), run on every core.

A kernel is decomposed (rules/decomp.rules), rendered as LLVM IR
(codegen/llvmir.py), optimised at O3 with loop and SLP vectorisation for the
host CPU (or, with RULEC_CPU_TARGET=baseline, for the architecture's baseline
with no optional features: what the code must also run correctly on), and
called through ctypes, which releases the GIL, so the outermost loop can be
split across threads (RULEC_THREADS, default: the machine's cores). A program
is compiled once per process per distinct IR text.
"""
from __future__ import annotations

import ctypes
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import llvmlite.binding as llvm

from engine.uop import prod
from runtime.buffer import buffer_of
from runtime.kernel import Kernel, decomposed, validate

_lock = threading.Lock()
_target_machine = None
_engine = None
_programs: dict[str, "Program"] = {}
COUNTERS = {"compiled": 0, "run": 0}
MIN_SPLIT_WORK = 1 << 15   # loop iterations below which one thread is faster than two (dispatch costs ~30-90 us)


def threads() -> int:
  return max(1, int(os.environ.get("RULEC_THREADS", os.cpu_count() or 1)))


_pool: ThreadPoolExecutor | None = None


def _get_pool() -> ThreadPoolExecutor:
  global _pool
  if _pool is None: _pool = ThreadPoolExecutor(max_workers=max(1, threads() - 1), thread_name_prefix="rulec-cpu")
  return _pool


def target_cpu() -> tuple[str, str]:
  """(LLVM cpu name, features) to compile for: RULEC_CPU_TARGET=host (the default) or baseline."""
  which = os.environ.get("RULEC_CPU_TARGET", "host") or "host"
  if which == "host": return llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten()
  if which == "baseline":
    return ("x86-64" if llvm.get_process_triple().split("-")[0] in ("x86_64", "amd64") else "generic"), ""
  raise ValueError(f"RULEC_CPU_TARGET={which!r}: expected 'host' or 'baseline'")


def _jit():
  global _target_machine, _engine
  if _engine is None:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    target = llvm.Target.from_triple(llvm.get_process_triple())
    cpu, features = target_cpu()
    _target_machine = target.create_target_machine(cpu=cpu, features=features, opt=3, reloc="default",
                                                   codemodel="jitdefault", jit=True)
    _engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), _target_machine)
  return _target_machine, _engine


class Program:
  def __init__(self, ir_text: str, name: str, nbufs: int):
    tm, ee = _jit()
    mod = llvm.parse_assembly(ir_text)
    mod.triple = llvm.get_process_triple()
    mod.data_layout = str(tm.target_data)
    mod.verify()
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
    ee.add_module(mod)
    ee.finalize_object()
    self.module = mod   # keep the module alive as long as the code is used
    self.fn = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * nbufs), ctypes.c_int64, ctypes.c_int64)(ee.get_function_address(name))
    COUNTERS["compiled"] += 1


_names = iter(range(1 << 62))


_work: dict = {}     # kernel AST -> loop iterations, which decides the thread split
_by_ast: dict = {}   # kernel AST -> (program, split range): ASTs are hash-consed, so equal kernels share one entry


def compile_kernel(kernel: Kernel) -> tuple[Program, object]:
  """The compiled program for a kernel (cached by its AST, then by its IR) and the range it splits across threads."""
  hit = _by_ast.get(kernel.ast)
  if hit is not None: return hit
  validate(kernel)
  from codegen.llvmir import render
  low = decomposed(kernel)
  text, split = render(low, "kernel")
  with _lock:
    prog = _programs.get(text)
    if prog is None:
      name = f"k{next(_names)}"
      prog = _programs[text] = Program(text.replace('@"kernel"', f'@"{name}"').replace("@kernel(", f"@{name}("), name,
                                       len(kernel.bufs))
    _by_ast[kernel.ast] = (prog, split)
  return prog, split


def run_kernel(kernel: Kernel) -> None:
  prog, split = compile_kernel(kernel)   # validates the kernel the first time its AST is seen
  outs = kernel.outputs
  ptrs = [(buffer_of(b).numpy_view() if i in outs else buffer_of(b).host_view()).ctypes.data for i, b in enumerate(kernel.bufs)]
  n = split.src[0].arg if split is not None else 1
  work = _work.get(kernel.ast)
  if work is None:   # loop iterations, counted once per AST rather than on every launch
    work = _work[kernel.ast] = prod(r.src[0].arg for r in kernel.ranges)
  t = threads()
  if split is None or t == 1 or n < 2 or work < MIN_SPLIT_WORK:
    prog.fn(*ptrs, 0, n)
  else:
    chunks = min(t, n)
    bounds = [(n * i // chunks, n * (i + 1) // chunks) for i in range(chunks)]
    futs = [_get_pool().submit(prog.fn, *ptrs, lo, hi) for lo, hi in bounds[1:]]
    prog.fn(*ptrs, *bounds[0])
    for f in futs: f.result()
  COUNTERS["run"] += 1
