"""The CPU device's worker threads: a kernel's thread range split into calls, one per core, the first on the caller.

Why not a ThreadPoolExecutor: a worker asleep on a condition variable takes 80 us or more to wake here (a submit
and its result: 160 us), and a Python worker, even one that polls, must take the GIL back from the caller before it
can start its call, which is another sleep and wake. A 256 x 256 elementwise kernel split in two took 63 us to
launch that way for 4 us of work in each half.

So a worker runs a loop of native code (`rulec_serve`, compiled by the CPU device's LLVM and called through
ctypes, which releases the GIL): it polls its slot for a new call, makes it, says it is done, and polls again, for
twice as long as its last call took (at least SPIN_MIN_S, at most SPIN_MAX_S) before it returns to Python to sleep
on an Event. OpenMP runtimes and BLAS libraries keep their threads polling the same way; the time limit keeps the
cost in proportion to the work. The caller, having made its own call, polls for the workers' in the same way.

A slot is four cache lines of int64: JOB (the caller raises it to hand over a call), DONE (the worker sets it to
JOB's value when the call has returned), the call (trampoline, kernel, arguments, lo, hi) and SLEEPING's line. JOB
and DONE are written with release stores and read with acquire loads, so a call's fields are visible before its
JOB, and its results before its DONE, on weakly ordered machines too. A kernel takes its buffers as separate
pointer arguments, so the worker calls it through a trampoline for that many buffers (`rulec_call_<n>`), which
loads them from an array.
"""
from __future__ import annotations

import ctypes
import os
import threading
import time

import numpy as np

from runtime.buffer import host_array

SPIN_MIN_S = 0.0005    # a polling thread polls at least this long before it sleeps ...
SPIN_RATIO = 2.0       # ... or this many times as long as its last call took ...
SPIN_MAX_S = 0.02      # ... but at most this long
LINE = 8               # int64 per cache line
JOB, DONE, CALL = 0, LINE, 2 * LINE   # a slot's fields: its counters each alone on a line, then the call
SLOT = 4 * LINE

# The polling loop and its helpers. wait(p, old, cycles): poll *p until it differs from `old` or `cycles` of the
# cycle counter have passed; the last value read. serve(slot, seen, min, max): make each call handed to the slot,
# polling between calls for twice the last one's cycles (within min..max); returns the last JOB seen when polling
# runs out, -1 when the call's trampoline is null (stop). (On x86, PAUSE between reads spares the sibling
# hyperthread and the memory bus.)
NATIVE_IR = """
declare i64 @llvm.readcyclecounter()
{pause_decl}
define i64 @rulec_wait(ptr %p, i64 %old, i64 %cycles) {{
entry:
  %t0 = call i64 @llvm.readcyclecounter()
  br label %poll
poll:
  %v = load atomic i64, ptr %p acquire, align 8
  %changed = icmp ne i64 %v, %old
  br i1 %changed, label %out, label %again
again:
  {pause_call}
  %t = call i64 @llvm.readcyclecounter()
  %spent = sub i64 %t, %t0
  %more = icmp ult i64 %spent, %cycles
  br i1 %more, label %poll, label %out
out:
  ret i64 %v
}}
define void @rulec_publish(ptr %p, i64 %v) {{
entry:
  store atomic i64 %v, ptr %p release, align 8
  ret void
}}
define i64 @rulec_cycles() {{
entry:
  %t = call i64 @llvm.readcyclecounter()
  ret i64 %t
}}
define i64 @rulec_serve(ptr %slot, i64 %seen0, i64 %least, i64 %most) {{
entry:
  %donep = getelementptr i64, ptr %slot, i64 {done}
  %call = getelementptr i64, ptr %slot, i64 {call}
  br label %wait
wait:
  %seen = phi i64 [%seen0, %entry], [%job, %ran]
  %budget = phi i64 [%least, %entry], [%next, %ran]
  %t0 = call i64 @llvm.readcyclecounter()
  br label %poll
poll:
  %job = load atomic i64, ptr %slot acquire, align 8
  %new = icmp ne i64 %job, %seen
  br i1 %new, label %take, label %again
again:
  {pause_call}
  %t = call i64 @llvm.readcyclecounter()
  %spent = sub i64 %t, %t0
  %more = icmp ult i64 %spent, %budget
  br i1 %more, label %poll, label %idle
idle:
  ret i64 %seen
take:
  %tramp = load ptr, ptr %call, align 8
  %stop = icmp eq ptr %tramp, null
  br i1 %stop, label %stopped, label %run
stopped:
  store atomic i64 %job, ptr %donep release, align 8
  ret i64 -1
run:
  %fnp = getelementptr i64, ptr %call, i64 1
  %fn = load ptr, ptr %fnp, align 8
  %argsp = getelementptr i64, ptr %call, i64 2
  %args = load ptr, ptr %argsp, align 8
  %lop = getelementptr i64, ptr %call, i64 3
  %lo = load i64, ptr %lop, align 8
  %hip = getelementptr i64, ptr %call, i64 4
  %hi = load i64, ptr %hip, align 8
  %s0 = call i64 @llvm.readcyclecounter()
  call void %tramp(ptr %fn, ptr %args, i64 %lo, i64 %hi)
  %s1 = call i64 @llvm.readcyclecounter()
  store atomic i64 %job, ptr %donep release, align 8
  %took = sub i64 %s1, %s0
  %twice = shl i64 %took, 1
  %low = icmp ult i64 %twice, %least
  %a = select i1 %low, i64 %least, i64 %twice
  %high = icmp ugt i64 %a, %most
  %next = select i1 %high, i64 %most, i64 %a
  br label %ran
ran:
  br label %wait
}}
"""


def native_ir(x86: bool) -> str:
  return NATIVE_IR.format(pause_decl="declare void @llvm.x86.sse2.pause()" if x86 else "",
                          pause_call="call void @llvm.x86.sse2.pause()" if x86 else "", done=DONE, call=CALL)


def trampoline_ir(n: int) -> str:
  """rulec_call_<n>(fn, args, lo, hi): fn(args[0], ..., args[n-1], lo, hi), a kernel of n buffers."""
  loads = "\n".join(f"  %q{i} = getelementptr ptr, ptr %args, i64 {i}\n  %p{i} = load ptr, ptr %q{i}, align 8"
                    for i in range(n))
  params = ", ".join(f"ptr %p{i}" for i in range(n))
  return (f"define void @rulec_call_{n}(ptr %fn, ptr %args, i64 %lo, i64 %hi) {{\nentry:\n{loads}\n"
          f"  call void %fn({params}, i64 %lo, i64 %hi)\n  ret void\n}}\n")


class Native:
  """The compiled helpers as ctypes functions, and the cycle counter's rate (0: it does not count, no polling).
  `trampoline(n)` is the address of rulec_call_<n>, compiled on first use."""
  def __init__(self, addresses: dict[str, int], trampoline):
    self.wait = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)(addresses["rulec_wait"])
    self.publish = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64)(addresses["rulec_publish"])
    self.cycles = ctypes.CFUNCTYPE(ctypes.c_int64)(addresses["rulec_cycles"])
    self.serve = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                  ctypes.c_int64)(addresses["rulec_serve"])
    self._trampoline, self._trampolines = trampoline, {}
    c0, t0 = self.cycles(), time.perf_counter()
    while time.perf_counter() - t0 < 0.002: pass
    c1, t1 = self.cycles(), time.perf_counter()
    self.per_second = max(0.0, (c1 - c0) / (t1 - t0))

  def budget(self, seconds: float) -> int:
    return int(min(max(seconds, SPIN_MIN_S), SPIN_MAX_S) * self.per_second)

  def trampoline(self, n: int) -> int:
    if n not in self._trampolines: self._trampolines[n] = self._trampoline(n)
    return self._trampolines[n]


class Workers:
  """Threads that make calls handed to them; `run` splits one launch between them and the calling thread."""
  def __init__(self, native: Native):
    self.native = native
    self.slots = host_array(0, np.dtype(np.int64))
    self.args: list[np.ndarray] = []
    self.threads: list[threading.Thread] = []
    self.wake: list[threading.Event] = []
    self.seq = 0

  def _slot(self, i: int, field: int = 0) -> int:
    return self.slots.ctypes.data + (i * SLOT + field) * 8

  def _grow(self, n: int) -> None:
    """At least n workers. More replace the ones there are (stopped between launches): the slots' array moves."""
    if len(self.threads) >= n: return
    if self.threads: self.stop()
    self.slots = host_array(n * SLOT, np.dtype(np.int64), zero=True)
    self.args, self.wake, self.threads = [host_array(0, np.dtype(np.int64)) for _ in range(n)], [], []
    for i in range(n):
      self.wake.append(threading.Event())
      th = threading.Thread(target=self._serve, args=(i,), name=f"rulec-cpu-{i}", daemon=True)
      self.threads.append(th)
      th.start()

  def stop(self) -> None:
    for i in range(len(self.threads)):
      self.slots[i * SLOT + CALL] = 0   # a null trampoline: return
      self.seq += 1
      self.native.publish(self._slot(i, JOB), self.seq)
      self.wake[i].set()
    for th in self.threads: th.join()
    self.threads = []

  def _serve(self, i: int) -> None:
    native, slot = self.native, self._slot(i)
    least, most = native.budget(SPIN_MIN_S), native.budget(SPIN_MAX_S)
    seen = 0
    while True:
      seen = native.serve(slot, seen, least, most)
      if seen < 0: return
      self.wake[i].wait()   # polling ran out: sleep until the caller hands over a call (and sets wake)
      self.wake[i].clear()  # (a set left from a call already served wakes this thread once, to poll again)

  def run(self, fn, calls: list[tuple]) -> None:
    """fn(*calls[0]) on this thread and fn(*calls[j]) on worker j - 1, all at once; returns when all have returned.
    Each call is a kernel's buffer addresses, then lo and hi; fn is a kernel's ctypes function."""
    helpers = len(calls) - 1
    self._grow(helpers)
    native, slots = self.native, self.slots
    address = ctypes.cast(fn, ctypes.c_void_p).value
    before = []
    for i in range(helpers):
      *ptrs, lo, hi = calls[i + 1]
      if self.args[i].size < len(ptrs): self.args[i] = host_array(max(len(ptrs), 8), np.dtype(np.int64))
      self.args[i][:len(ptrs)] = ptrs
      base = i * SLOT + CALL
      slots[base:base + 5] = (native.trampoline(len(ptrs)), address, self.args[i].ctypes.data, lo, hi)
      before.append(int(slots[i * SLOT + DONE]))
      self.seq += 1
      native.publish(self._slot(i, JOB), self.seq)
      self.wake[i].set()
    t0 = time.perf_counter()
    try: fn(*calls[0])
    finally:   # (the workers' calls write the same outputs: they end before this returns, or raises)
      budget = native.budget(SPIN_RATIO * (time.perf_counter() - t0))
      for i in range(helpers):
        want = int(slots[i * SLOT + JOB])
        while native.wait(self._slot(i, DONE), before[i], budget) != want:
          time.sleep(0.0001)   # a worker slow to wake (or preempted): poll again after a short sleep


_workers: Workers | None = None
_workers_pid = 0


def workers(native_factory) -> Workers:
  """This process's workers (made on first use; a forked child makes its own, since it has no threads)."""
  global _workers, _workers_pid
  if _workers is None or _workers_pid != os.getpid():
    _workers, _workers_pid = Workers(native_factory()), os.getpid()
  return _workers
