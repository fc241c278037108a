"""LLVM's part of compiling a CPU kernel: IR text to object code, in this process or in worker processes.

`build(tm, text)` is what the CPU device (runtime/cpu_device.py) runs for every program it compiles: verify the
module, optimise it at O3 with the loop and SLP vectorisers, emit an object for the target machine `tm`
(`target_machine(cpu, features)`). It takes most of a cold first run's time (a 2-layer GPT-2 training step: 80
programs, half of the step's 30 s).

Why processes: llvmlite serialises every call into LLVM behind one lock (llvmlite.binding.ffi's _LLVMLock), so
threads build one module at a time. `Builders` keeps worker processes, each this file run as a script: it imports
llvmlite and nothing of rulec, makes its own target machine from the parent's CPU name and features, and answers
build requests in order. The parent lowers and renders the next kernel (Python) while a worker builds the last one,
and loads the objects into its own JIT (a JIT's objects must be added in the process that runs them). The object is
the same bytes as an in-process build: the same LLVM, passes and target.

Frames on the pipes, both ways: 16 bytes (`<Qq`: request id, length) and that many bytes: the IR text, or the
build's seconds (a double) and the object; a negative length is an error message of that length (the parent then builds the module itself, and reports the
error if it fails there too).
"""
from __future__ import annotations

import os
import queue
import struct
import subprocess
import sys
import threading
import time
from concurrent.futures import Future

import llvmlite.binding as llvm

_HEAD = struct.Struct("<Qq")
_SECONDS = struct.Struct("<d")   # an object's answer starts with the seconds its build took


def target_machine(cpu: str, features: str):
  """The target machine CPU kernels are built for: this host's triple with the given CPU and features."""
  llvm.initialize_native_target()
  llvm.initialize_native_asmprinter()
  target = llvm.Target.from_triple(llvm.get_process_triple())
  return target.create_target_machine(cpu=cpu, features=features, opt=3, reloc="default", codemodel="jitdefault",
                                      jit=True)


def build(tm, text: str) -> bytes:
  """Object code for the IR: verified, optimised at O3 with both vectorisers, emitted for `tm`."""
  mod = llvm.parse_assembly(text)
  mod.triple = llvm.get_process_triple()
  mod.data_layout = str(tm.target_data)
  mod.verify()
  pto = llvm.create_pipeline_tuning_options(speed_level=3)
  pto.loop_vectorization = True
  pto.slp_vectorization = True
  pb = llvm.create_pass_builder(tm, pto)
  pb.getModulePassManager().run(mod, pb)
  return tm.emit_object(mod)


def _read_exact(stream, n: int) -> bytes | None:
  out = b""
  while len(out) < n:
    part = stream.read(n - len(out))
    if not part: return None
    out += part
  return out


def serve(cpu: str, features: str) -> None:
  """A worker: build each request on stdin, answer on stdout, until stdin closes."""
  tm = target_machine(cpu, features)
  inp, out = sys.stdin.buffer, sys.stdout.buffer
  while True:
    head = _read_exact(inp, _HEAD.size)
    if head is None: return
    rid, n = _HEAD.unpack(head)
    text = _read_exact(inp, n)
    if text is None: return
    t0 = time.perf_counter()
    try:
      obj = build(tm, text.decode())
      data = _SECONDS.pack(time.perf_counter() - t0) + obj
      size = len(data)
    except Exception as e:   # (reported to the parent, which builds it itself and so raises where it should)
      data = f"{type(e).__name__}: {e}".encode()[:4096]
      size = -len(data)
    out.write(_HEAD.pack(rid, size) + data)
    out.flush()


class Builders:
  """`n` worker processes building modules for a target machine of (cpu, features): submit(text) gives a Future
  of (the seconds the build took, the object's bytes). A request goes to the worker with the fewest outstanding; a writer thread per worker feeds
  its stdin (so submit never waits for a busy worker) and a reader thread resolves its answers. A worker that exits
  fails its outstanding requests (the caller builds those itself) and takes no more."""

  def __init__(self, n: int, cpu: str, features: str):
    self._lock = threading.Lock()
    self._next = 0
    self._workers = []
    for _ in range(n):
      proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), cpu, features], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, close_fds=True)
      w = {"proc": proc, "todo": queue.Queue(), "waiting": {}, "alive": True}
      for fn in (self._write, self._read): threading.Thread(target=fn, args=(w,), daemon=True).start()
      self._workers.append(w)

  def submit(self, text: str) -> Future:
    fut: Future = Future()
    with self._lock:
      live = [w for w in self._workers if w["alive"]]
      if not live:
        fut.set_exception(RuntimeError("no LLVM build worker is running"))
        return fut
      w = min(live, key=lambda w: len(w["waiting"]))
      rid, self._next = self._next, self._next + 1
      w["waiting"][rid] = fut
    w["todo"].put((rid, text.encode()))
    return fut

  def _write(self, w: dict) -> None:
    pipe = w["proc"].stdin
    while True:
      item = w["todo"].get()
      if item is None: break
      rid, data = item
      try:
        pipe.write(_HEAD.pack(rid, len(data)) + data)
        pipe.flush()
      except OSError: break
    try: pipe.close()
    except OSError: pass

  def _read(self, w: dict) -> None:
    pipe = w["proc"].stdout
    while True:
      head = _read_exact(pipe, _HEAD.size)
      if head is None: break
      rid, n = _HEAD.unpack(head)
      data = _read_exact(pipe, abs(n))
      if data is None: break
      with self._lock: fut = w["waiting"].pop(rid, None)
      if fut is None: continue
      if n >= 0: fut.set_result((_SECONDS.unpack(data[:_SECONDS.size])[0], data[_SECONDS.size:]))
      else: fut.set_exception(RuntimeError(data.decode(errors="replace")))
    with self._lock:
      w["alive"] = False
      left, w["waiting"] = list(w["waiting"].values()), {}
    for fut in left: fut.set_exception(RuntimeError("the LLVM build worker exited"))

  def close(self) -> None:
    """Stop the workers (each finishes the request it is building)."""
    for w in self._workers: w["todo"].put(None)
    for w in self._workers:
      try: w["proc"].wait(timeout=10)
      except subprocess.TimeoutExpired: w["proc"].kill()


if __name__ == "__main__":
  serve(sys.argv[1], sys.argv[2])
