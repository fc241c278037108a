"""The CPU device: kernels compiled to native code by LLVM (llvmlite), run on every core.

A kernel is decomposed (rules/decomp.rules), rendered as LLVM IR
(codegen/llvmir.py), optimised at O3 with loop and SLP vectorisation for the
host CPU (or, with RULEC_CPU_TARGET=baseline, for the architecture's baseline
with no optional features: what the code must also run correctly on), and
called through ctypes, which releases the GIL, so the outermost loop can be
split across threads (RULEC_THREADS, default: the machine's cores). A program
is compiled once per process per distinct IR text and kept on disk
(engine/diskcache.py): its object code keyed by the IR, the target and LLVM,
and a record keyed by the kernel itself naming that object, so a later process
neither renders nor compiles a kernel it has seen. A kernel's variables (DEFINE_VAR) are i64 arguments after
its buffers' pointers (codegen/llvmir.py), their values given at each launch (`var_vals`): the caches know
a variable by its name and range, never its value, so one program serves every value. COUNTERS["compiled"] counts
programs built from IR, COUNTERS["loaded"] those loaded from disk, TIMES the
seconds each took.

The decomposition includes the optional rules for EXP2 and LOG2 (VECTOR_MATH):
float32 exp2 and log2 as polynomials and exponent bits, which LLVM vectorises
where a libm call would not. RULEC_CPU_LIBM=1 keeps the libm calls.
"""
from __future__ import annotations

import atexit
import ctypes
import hashlib
import os
import re
import sys
import threading
import time

import llvmlite
import llvmlite.binding as llvm

from rulec.engine.ir.ops import Ops
from rulec.engine.ir.uop import prod
from rulec.engine import diskcache
from rulec.runtime import llvm_build
from rulec.runtime.buffer import buffer_of, host_array
from rulec.codegen import llvmir, pipeline
from rulec.codegen.opt import choose, format_actions, kernel_key, range_kind, transform
from rulec.codegen.opt.search import repetitions
from rulec.codegen.version import code_digest
from rulec.engine.ir.kernel import Kernel, structure

_lock = threading.Lock()
_target_machine = None
_engine = None
COUNTERS = {"compiled": 0, "loaded": 0, "run": 0}
TIMES = {"compile_s": 0.0, "load_s": 0.0, "slowest_compile_s": 0.0}   # (slowest: one program's build, the longest)
# loop iterations below which one thread is faster than two: a split launch costs about 14 us more than a call
# (runtime/cpu_workers.py); exp(2x + 1) over 65536 elements 28.6 us on one thread against 33.4 split, over 131044
# 54.6 against 44.5, 262144: 98.7 against 63.0 (the digits CNN train step unchanged, 250-256 steps/s)
MIN_SPLIT_WORK = 1 << 16


def threads() -> int:
  return max(1, int(os.environ.get("RULEC_THREADS", os.cpu_count() or 1)))


def _native_functions(text: str, names: tuple[str, ...]) -> dict[str, int]:
  """Addresses of the functions `names` of an IR module of the runtime's own (not a kernel), built by this JIT or
  loaded from the disk cache (beside the kernels', under a kind of its own: not a kernel's program)."""
  digest = _cache_key(text)
  obj = diskcache.load("cpu-runtime", digest)
  _, ee = _jit()
  if obj is None:
    obj = _build(text)
    diskcache.store("cpu-runtime", digest, obj)
  ee.add_object_file(llvm.ObjectFileRef.from_data(obj))
  ee.finalize_object()
  return {n: ee.get_function_address(n) for n in names}


def _native_helpers():
  """runtime/cpu_workers.py's polling loop and helpers, and its trampolines as they are needed."""
  from rulec.runtime import cpu_workers
  x86 = llvm.get_process_triple().split("-")[0] in ("x86_64", "amd64")
  fns = _native_functions(cpu_workers.native_ir(x86), ("rulec_wait", "rulec_publish", "rulec_cycles", "rulec_serve",
                                                                   "rulec_hand", "rulec_claim"))
  def trampoline(n: int, m: int = 0) -> int:
    name = cpu_workers.trampoline_name(n, m)
    return _native_functions(cpu_workers.trampoline_ir(n, m), (name,))[name]
  return cpu_workers.Native(fns, trampoline)


# Features turned off on a host that has them, because LLVM 22.1 (llvmlite 0.50) miscompiles with them: its
# X86CompressEVEX pass folds `vpmov{b,d,q}2m %xmm/%ymm -> %k; kmov %k -> gpr` into one VEX `vmovmsk`, and erases the
# mask's definition while a later `kshiftr %k, %k` still reads it (llvm-project #198197, fixed after 22.1) and
# encodes xmm16-31 in VEX, which cannot name them (#191304). A padded convolution's weight gradient with upcast lanes
# read index lanes from a stale mask register and gave wrong values. vpmov{d,q}2m need AVX512DQ and vpmovb2m
# AVX512BW, so without those two the pattern never forms. (Dropping AVX512VL instead, the other half of the
# pattern's condition, hit an assertion in LLVM's instruction selection on an argmax: "Cannot BITCAST between types
# of different sizes", which aborts the process.) The features that imply BW or DQ go with them.
_MISCOMPILED_FEATURES = ("avx512bw", "avx512dq", "avx512fp16", "avx512bf16", "avx512vbmi", "avx512bitalg", "avx10",
                         "amx-avx512")


def _without_evex_mask_compression(features: str) -> str:
  """The host's features less _MISCOMPILED_FEATURES; the removals last, since LLVM applies the list in order and
  a later `+x` would turn back on what x implies."""
  kept = [f for f in features.split(",") if f and not f[1:].startswith(_MISCOMPILED_FEATURES)]
  dropped = ["-" + f[1:] for f in features.split(",") if f[1:].startswith(_MISCOMPILED_FEATURES)]
  return ",".join(kept + dropped)


def target_cpu() -> tuple[str, str]:
  """(LLVM cpu name, features) to compile for: RULEC_CPU_TARGET=host (the default) or baseline."""
  which = os.environ.get("RULEC_CPU_TARGET", "host") or "host"
  if which == "host": return llvm.get_host_cpu_name(), _without_evex_mask_compression(llvm.get_host_cpu_features().flatten())
  if which == "baseline":
    return ("x86-64" if llvm.get_process_triple().split("-")[0] in ("x86_64", "amd64") else "generic"), ""
  raise ValueError(f"RULEC_CPU_TARGET={which!r}: expected 'host' or 'baseline'")


# how IR becomes object code, beyond the target machine: part of every disk cache key, so a change here (another
# pass pipeline, other target-machine options) must change this string
_RECIPE = ("O3 loop+slp vectorize; reloc=default codemodel=jitdefault jit; emit_object -> MCJIT add_object_file; "
           "prefer-vector-width=512 where avx512f")


_target: tuple[str, str] | None = None   # the (cpu, features) the JIT compiles for, fixed at its creation


def _jit():
  global _target_machine, _engine, _target
  if _engine is None:
    cpu, features = _target = target_cpu()
    _target_machine = llvm_build.target_machine(cpu, features)
    _engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), _target_machine)
  return _target_machine, _engine


def _target_key() -> tuple[str, ...]:
  """What the object code depends on besides the IR: the JIT's target (what it was made for, even if
  RULEC_CPU_TARGET changed since), LLVM's version and how it is driven."""
  _jit()
  return (llvm.get_process_triple(), *_target, llvmlite.__version__, ".".join(map(str, llvm.llvm_version_info)), _RECIPE)


def _wide_vectors() -> bool:
  """Whether the JIT's target has 512-bit vector registers (AVX-512F)."""
  _jit()
  return "+avx512f" in _target[1]


def opt_target():
  """What the kernel optimizer's cost model knows of this CPU (rulec.codegen.opt.choose.CPUTarget)."""
  return choose.CPUTarget(lanes=16 if _wide_vectors() else 8)


def _vector_width_attribute(ir_text: str) -> str:
  """The kernel function asks for 512-bit vectors on a target with AVX-512 (LLVM's default for those CPUs is 256
  bits, for fear of clock drops on the first of them). Measured here in one run each: the float32 exp kernel 1.14 ->
  0.94 ms, the conv2d workload 118 -> 102 ms, matmul 12.0 -> 9.8-13 ms (noisy). Baseline and AVX2 targets unchanged."""
  if not _wide_vectors(): return ir_text
  # every function (the kernel, and the half-conversion helpers it inlines): after each parameter list
  text = re.sub(r"^(define [^\n]*?\([^()\n]*\))", r"\1 #0", ir_text, flags=re.M)
  return text + '\nattributes #0 = { "prefer-vector-width"="512" }\n'


def _cache_key(ir_text: str) -> str: return diskcache.key("cpu", ir_text, *_target_key())


def _build(ir_text: str) -> bytes:
  """Object code for the IR, built in this process (runtime/llvm_build.py; prepare() builds in worker processes)."""
  tm, _ = _jit()
  return llvm_build.build(tm, _vector_width_attribute(ir_text))


class Program:
  """A kernel's machine code in the process's JIT, called through ctypes."""
  def __init__(self, name: str, nbufs: int, loaded: bool, seconds: float, nvars: int = 0):
    _, ee = _jit()
    self.name, self.loaded, self.seconds, self.nvars = name, loaded, seconds, nvars
    # the thread range is a ragged UPCAST's tiles (codegen/opt/transform.py): the last two run in one call, since a
    # kernel that reads what it writes (KBLOCK) has the last tile store back what the one before stored
    self.pair_last = False
    self.fn = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * nbufs), *([ctypes.c_int64] * nvars), ctypes.c_int64,
                               ctypes.c_int64)(ee.get_function_address(name))
    COUNTERS["loaded" if loaded else "compiled"] += 1
    TIMES["load_s" if loaded else "compile_s"] += seconds
    if not loaded and seconds > TIMES["slowest_compile_s"]: TIMES["slowest_compile_s"] = seconds


_refused: set[str] = set()   # symbols of objects LLVM refused to load: a rebuild takes another name


def _from_disk(digest: str, name: str, nbufs: int, nvars: int = 0) -> Program | None:
  """The program stored under `digest`, loaded into the JIT, or None (no sound entry; one LLVM refuses is dropped).
  A loaded program is the very code a build would run: both go through MCJIT's add_object_file."""
  t0 = time.perf_counter()
  obj = diskcache.load("cpu", digest)
  if obj is None or name in _refused: return None
  _, ee = _jit()
  try:
    ee.add_object_file(llvm.ObjectFileRef.from_data(obj))
    ee.finalize_object()
  except Exception:   # checked bytes of ours that LLVM still refuses
    diskcache.reject("cpu", digest)
    _refused.add(name)
    return None
  return Program(name, nbufs, True, time.perf_counter() - t0, nvars)


class _Rendered:
  """A kernel's program between rendering and LLVM: its IR, the function's name, the object's digest, the size of
  its thread range and whether the last two tiles run together; `key`/`kkey` where it is a scheduled kernel's (the
  process's and the disk's record to fill in)."""
  __slots__ = ("text", "name", "digest", "split", "pair", "nbufs", "nvars", "key", "kkey", "record")

  def __init__(self, opt: Kernel, nbufs: int, vars: tuple):
    text, rng = pipeline.render(opt, "CPU", vars=tuple(vars))
    self.split = rng.src[0].arg if rng is not None else None
    self.pair = rng is not None and range_kind(rng)[1] is not None
    # named by its IR: the same in every process, so a cached object's symbol is the one asked for, and distinct
    # programs in one JIT never share a name
    self.name = "k" + hashlib.sha256(text.encode()).hexdigest()[:24]
    self.text = text.replace('@"kernel"', f'@"{self.name}"').replace("@kernel(", f"@{self.name}(")
    self.digest = _cache_key(self.text)
    self.nbufs, self.nvars, self.key, self.kkey, self.record = nbufs, len(vars), None, None, None

  def known(self, tried: str | None) -> Program | None:
    """The program from the process's programs or the disk (not the disk when its object is the `tried` one that
    failed), or None: it must be built. A name LLVM refused before is built under another."""
    prog = _by_digest.get(self.digest) or (None if tried == self.digest else
                                           _from_disk(self.digest, self.name, self.nbufs, self.nvars))
    if prog is None and self.name in _refused: self.text, self.name = self.text.replace(self.name, self.name + "r"), self.name + "r"
    return prog

  def load(self, obj: bytes, seconds: float) -> Program:
    """The built object added to the JIT (and stored on disk)."""
    t0 = time.perf_counter()
    _, ee = _jit()
    ee.add_object_file(llvm.ObjectFileRef.from_data(obj))
    ee.finalize_object()
    diskcache.store("cpu", self.digest, obj)
    return Program(self.name, self.nbufs, False, seconds + time.perf_counter() - t0, self.nvars)

  def build(self) -> Program:
    t0 = time.perf_counter()
    return self.load(_build(self.text), time.perf_counter() - t0)

  def finish(self, prog: Program) -> tuple[Program, int | None]:
    """Remember the program: by digest, and for a scheduled kernel by AST and on disk."""
    prog.pair_last = self.pair
    _by_digest[self.digest] = prog
    if self.kkey is not None: diskcache.store_json("cpu", self.kkey, {"object": self.digest, "name": prog.name,
                                                                        "split": self.split, "pair": prog.pair_last,
                                                                        **self.record})
    if self.key is not None: _by_ast[self.key] = prog, self.split
    return prog, self.split


VECTOR_MATH = frozenset({Ops.EXP2, Ops.LOG2})


def _debug_level() -> int:
  try: return int(os.environ.get("RULEC_DEBUG", "0") or 0)
  except ValueError: return 0


def optional_decompositions() -> frozenset:
  """The optional rules of rules/decomp.rules the CPU asks for (see the module docstring), and MULACC where the
  JIT's target has FMA: exp2's polynomial steps are then fmas (one rounding each), else a multiply and an add."""
  # (INDEX: the kernels run on host buffers, which have slack around them: a guarded load may stray into it)
  if os.environ.get("RULEC_CPU_LIBM", "") not in ("", "0"): return frozenset({Ops.INDEX})
  _jit()
  return (VECTOR_MATH | {Ops.MULACC, Ops.INDEX}) if "+fma" in _target[1].split(",") else VECTOR_MATH | {Ops.INDEX}


def _aliasing(bufs) -> tuple | None:
  """Which slots name the same buffer (None: all distinct): the renderer's choices depend on it."""
  ids = [id(b) for b in bufs]
  return tuple(ids.index(i) for i in ids) if len(set(ids)) < len(ids) else None


def _kernel_key(kernel: Kernel, alias) -> str:
  """The disk key of a kernel before rendering: its AST's structure, its buffers' dtypes, sizes and aliasing, the
  optional decompositions, the code that renders it (codegen/version.py's code_digest) and the target. Found, it names
  the program without validating, decomposing or rendering the kernel again (for a matmul that is 100-300 ms of
  Python)."""
  # the optimizer's and renderer's tunables as they are now (a benchmark or test may set them), besides the code
  # that reads them, and the actions RULEC_OPT forces
  knobs = sorted((m.__name__, k, v) for m in (llvmir, choose, transform) for k, v in vars(m).items()
                 if k.isupper() and isinstance(v, (int, float, str, tuple)))
  return diskcache.key("cpu-kernel", structure(kernel.ast), repr(alias), os.environ.get("RULEC_OPT", ""),
                          os.environ.get("RULEC_SEARCH", ""),
                          repr([(b.dtype.name, b.arg[-1]) for b in kernel.bufs]), repr(knobs),
                          repr(sorted(o.name for o in optional_decompositions())), code_digest(), *_target_key())


_work: dict = {}     # kernel AST -> loop iterations, which decides the thread split
_by_ast: dict = {}   # (kernel AST, aliasing) -> (program, split): ASTs are hash-consed, equal kernels share one entry
_by_digest: dict[str, Program] = {}   # object digest -> program: one per distinct IR (and target) in the process


def compile_kernel(kernel: Kernel, var_vals: tuple[int, ...] | None = None) -> tuple[Program, int | None]:
  """The compiled program for a kernel and the number of iterations of the loop it splits across threads (None:
  it runs as one call). Cached in the process by AST; on disk by kernel (to the program's digest and the split) and
  by IR (to the object code); a kernel neither cache knows is validated, decomposed, rendered and compiled.
  The program takes the kernel's variables as arguments: one compile serves every value. var_vals: the values
  RULEC_SEARCH times candidates with (each variable's lower bound when None)."""
  alias = _aliasing(kernel.bufs)
  hit = _by_ast.get((kernel.ast, alias))
  if hit is not None: return hit
  with _lock:
    got = _begin(kernel, alias, var_vals)
    return got.finish(got.build()) if isinstance(got, _Rendered) else got


def _begin(kernel: Kernel, alias, var_vals) -> tuple[Program, int | None] | _Rendered:
  """compile_kernel up to LLVM: the program and split where a cache has them, else the rendered kernel whose IR
  must be built (then `finish` it). Called under _lock."""
  nbufs = len(kernel.bufs)
  kkey = _kernel_key(kernel, alias) if diskcache.enabled() else None
  entry = diskcache.load_json("cpu", kkey) if kkey is not None else None
  if entry is not None and not (isinstance(entry.get("object"), str) and isinstance(entry.get("name"), str)
                                and (entry.get("split") is None or isinstance(entry.get("split"), int))):
    entry = None   # a record with sound bytes but not our fields: rendered again, and rewritten
  if entry is not None:
    digest, name, split = entry["object"], entry["name"], entry["split"]
    if _debug_level() >= 2: print(f"[opt] CPU kernel {entry.get('key', '?')} {kernel!r}: {entry.get('actions', '?')} (cached)", file=sys.stderr)
    prog = _by_digest.get(digest) or _from_disk(digest, name, nbufs, len(kernel.vars))
    if prog is not None:
      prog.pair_last = entry.get("pair") is True
      _by_digest[digest] = prog
      _by_ast[(kernel.ast, alias)] = prog, split
      return prog, split
  lowered = pipeline.lower(kernel, "CPU", opt_target(), optional_decompositions(),
                           timer=lambda k: _time_candidate(kernel, k, var_vals))
  r = _Rendered(lowered.kernel, nbufs, kernel.vars)
  r.key, r.kkey = (kernel.ast, alias), kkey
  r.record = {"key": kernel_key(lowered.low), "actions": format_actions(lowered.actions)}
  prog = r.known(entry["object"] if entry is not None else None)
  return r.finish(prog) if prog is not None else r


def _program_for(opt: Kernel, nbufs: int, tried: str | None = None, vars=()) -> tuple[Program, int | None, str]:
  """The program for an optimized kernel (rendered, then from the process's programs, the disk or LLVM), the size
  of its thread range and the object's digest. tried: an object digest the disk cache already failed to give.
  vars: the scheduled kernel's variables, the program's scalar arguments in that order."""
  r = _Rendered(opt, nbufs, tuple(vars))
  prog, split = r.finish(r.known(tried) or r.build())
  return prog, split, r.digest


# *** building many kernels at once ***

_builders: llvm_build.Builders | None | bool = None   # (False: workers could not start in this process)


WORKERS_START_AT = 4   # kernels to build in one realize before the worker processes are started
BUILD_TIMEOUT_S = 600   # a hang guard: a worker's build not back by then is built here instead


def _forget_builders() -> None:
  """In a forked child: the parent's workers are the parent's (their pipes' threads did not fork): start anew."""
  global _builders
  _builders = None


os.register_at_fork(after_in_child=_forget_builders)


def compile_workers() -> int:
  """Worker processes that build kernels' objects while this one lowers the next (prepare): RULEC_COMPILE_WORKERS,
  by default one less than the threads (RULEC_THREADS), at most 8; 0 builds everything in this process."""
  try: n = int(os.environ.get("RULEC_COMPILE_WORKERS", threads() - 1))
  except ValueError: n = threads() - 1
  return max(0, min(n, 8))


def prepare(kernels) -> int:
  """Compile the kernels among `kernels` that this process has not compiled, before they run: each is lowered and
  rendered here, and its object built by a worker process (runtime/llvm_build.py) while this process goes on to
  the next, then loaded into the JIT. Programs a cache has are loaded as compile_kernel would. Nothing to do with
  no workers, with fewer than two kernels to build (fewer than WORKERS_START_AT before the workers have started),
  or while RULEC_SEARCH times candidates (a candidate runs on the kernel's buffers). Returns how many objects the
  workers built."""
  global _builders
  if compile_workers() == 0 or os.environ.get("RULEC_SEARCH", "") not in ("", "0"): return 0
  todo, seen = [], set()
  for k in kernels:
    key = (k.ast, _aliasing(k.bufs))
    if key not in _by_ast and key not in seen:
      seen.add(key)
      todo.append((k, key[1]))
  # (starting the workers costs a process and llvmlite's import, about 0.15 s here: more than building two or three
  # small kernels in this process, as the README's snippet does; once they run, two kernels are worth sending)
  if len(todo) < (2 if _builders else WORKERS_START_AT): return 0
  built = 0
  with _lock:
    waiting, asked = [], {}   # (asked: digest -> its build, once: two kernels may render to the same IR)
    for k, alias in todo:
      got = _begin(k, alias, None)
      if not isinstance(got, _Rendered): continue
      if got.digest not in asked:
        if _builders is None:
          _jit()
          try: _builders = llvm_build.Builders(compile_workers(), *_target)
          except OSError as e:   # (no worker can start here: every build stays in this process)
            _builders = False
            print(f"rulec: LLVM build workers could not start ({e}); kernels compile one at a time", file=sys.stderr)
          else: atexit.register(_builders.close)
        if _builders: asked[got.digest] = _builders.submit(_vector_width_attribute(got.text))
      waiting.append(got)
    for r in waiting:
      prog = _by_digest.get(r.digest)   # (built for an earlier kernel of the same IR)
      if prog is None:
        try: seconds, obj = asked[r.digest].result(timeout=BUILD_TIMEOUT_S)
        # (no worker, or it failed: built here, where a real error is raised)
        except Exception: prog = r.build()
        else:
          prog = r.load(obj, seconds)
          built += 1
      r.finish(prog)
  return built


def _time_candidate(kernel: Kernel, opt: Kernel, var_vals: tuple[int, ...] | None = None) -> float:
  """Seconds (median of RULEC_SEARCH runs) of an optimized form of `kernel`, writing scratch copies of its outputs:
  the real outputs are not touched (the kernel runs for real afterwards). Its variables are set to var_vals (their
  lower bounds when None)."""
  prog, split, _ = _program_for(opt, len(kernel.bufs), vars=kernel.vars)
  vals = tuple(var_vals) if var_vals is not None else tuple(v.arg[1] for v in kernel.vars)
  outs, scratch = kernel.outputs, {}
  arrays = []
  for i, b in enumerate(kernel.bufs):
    buf = buffer_of(b)
    if i in outs:
      if id(buf) not in scratch:   # (a kernel may read what it overwrites; a copy with the buffers' slack around it)
        scratch[id(buf)] = host_array(buf.size, buf.host_view().dtype)
        scratch[id(buf)][:] = buf.host_view()
      arrays.append(scratch[id(buf)])
    else: arrays.append(buf.host_view())
  ptrs = [a.ctypes.data for a in arrays]
  times = []
  for _ in range(max(1, repetitions())):
    t0 = time.perf_counter()
    _launch(prog, split, ptrs, prod(r.src[0].arg for r in kernel.ranges), vals)
    times.append(time.perf_counter() - t0)
  return sorted(times)[len(times) // 2]


def thread_calls(n: int, threads: int, pair_last: bool) -> list[tuple[int, int]]:
  """The [lo, hi) parts of a thread range of n that `threads` threads take, one each. pair_last: the last two
  steps stay in one part (a ragged tile and the one it overlaps; Program.pair_last)."""
  chunks = min(threads, n)
  if pair_last and chunks == n: chunks = n - 1
  return [(n * i // chunks, n * (i + 1) // chunks) for i in range(chunks)]


def _launch(prog: Program, split: int | None, ptrs: list[int], work: int, var_vals: tuple[int, ...] = ()) -> None:
  n = split if split is not None else 1
  t = threads()
  if split is None or t == 1 or n < 2 or work < MIN_SPLIT_WORK:
    prog.fn(*ptrs, *var_vals, 0, n)
  else:
    from rulec.runtime.cpu_workers import workers
    workers(_native_helpers).run(prog.fn, [(*ptrs, *var_vals, lo, hi) for lo, hi in thread_calls(n, t, prog.pair_last)],
                                 nvars=len(var_vals))


def run_kernel(kernel: Kernel, var_vals: tuple[int, ...] = ()) -> None:
  """Run the kernel, its variables (Kernel.vars, in that order) set to var_vals."""
  var_vals = kernel.check_var_vals(var_vals)
  prog, split = compile_kernel(kernel, var_vals)   # validates the kernel the first time it is compiled
  outs = kernel.outputs
  ptrs = [(buffer_of(b).numpy_view() if i in outs else buffer_of(b).host_view()).ctypes.data for i, b in enumerate(kernel.bufs)]
  work = _work.get(kernel.ast)
  if work is None:   # loop iterations, counted once per AST rather than on every launch
    work = _work[kernel.ast] = prod(r.src[0].arg for r in kernel.ranges)
  if var_vals: _launch(prog, split, ptrs, work, var_vals)
  else: _launch(prog, split, ptrs, work)   # (the signature a kernel without variables has always had)
  COUNTERS["run"] += 1
