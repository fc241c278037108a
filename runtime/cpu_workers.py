"""The CPU device's worker threads: a kernel's thread range split into calls, one per core, the first on the caller.

Why not a ThreadPoolExecutor: a worker asleep on a condition variable takes 80 us or more to wake here (a submit
and its result: 160 us), and a Python worker, even one that polls, must take the GIL back from the caller before it
can start its call, which is another sleep and wake. A 256 x 256 elementwise kernel split in two took 63 us to
launch that way for 4 us of work in each half.

So a worker thread is one call of native code (`rulec_serve`, compiled by the CPU device's LLVM and called through
ctypes, which releases the GIL) that never comes back to Python until it is stopped: it polls its slot for a new
call, makes it, says it is done, and polls again, for twice as long as its last call took (at least SPIN_MIN_S, at
most SPIN_MAX_S); then it sleeps in read(2) on a pipe of its own until the caller writes to it. OpenMP runtimes and
BLAS libraries keep their threads polling the same way; the time limit keeps the cost in proportion to the work.
The caller, having made its own call, polls for the workers' in the same way. (A first version slept in Python, on
an Event: a worker coming back to Python waited up to the interpreter's 5 ms switch interval for the GIL while the
caller ran Python, and took the GIL from it; a 0.2 ms kernel launched back to back took 0.66 ms in some processes.)

A slot is four cache lines of int64: JOB (the caller raises it to hand over a call), DONE (the worker sets it to
JOB's value when the call has returned), the call (trampoline, kernel, arguments, lo, hi) and SLEEPING. JOB and
DONE are written with release stores and read with acquire loads, so a call's fields are visible before its JOB,
and its results before its DONE, on weakly ordered machines too. Going to sleep, a worker sets SLEEPING and then
reads JOB again; the caller raises JOB and then reads SLEEPING (`rulec_hand`), all four sequentially consistent, so
one of the two sees the other: the worker finds the call, or the caller writes the wake-up. A wake-up written
for a worker that found its call anyway wakes it once more, later, to poll and sleep again.

Whoever starts a call first makes it: the worker, and the caller once its own call is done, each raise CLAIM to
the call's JOB (an atomic max, so a worker that wakes late with an old JOB claims nothing) and make the call only
if CLAIM was below it. A worker asleep when its call came may take longer to wake than the call takes (here
0.5 ms on a virtual CPU left idle for a few milliseconds: a 0.2 ms matmul launched after a pause took 0.7 ms);
the caller then makes it itself and does not wait. The caller waits for DONE only for calls a worker claimed, and
a worker reads a call's fields only after claiming it, so the caller never rewrites a slot a worker is reading. A kernel takes its buffers as separate
pointer arguments, and its variables' values as i64 arguments after them, so the worker calls it through a
trampoline for that many buffers and variables (`rulec_call_<n>`, `rulec_call_<n>_<m>`), which loads them from an
array.
"""
from __future__ import annotations

import ctypes
import os
import threading
import time

import numpy as np

from rulec.runtime.buffer import host_array

SPIN_MIN_S = 0.0005    # a polling thread polls at least this long before it sleeps ...
SPIN_RATIO = 2.0       # ... or this many times as long as its last call took ...
SPIN_MAX_S = 0.02      # ... but at most this long
YIELD_AFTER_S = 0.00002   # a worker polling longer than this yields its CPU between polls (sched_yield), so that
                          # it never holds up a thread the scheduler put on the same CPU (the caller, mid-launch)
WAIT_MIN_S = 0.00005   # the caller, waiting for a worker's call, polls twice as long as its own call took, at least
                       # this long, before it yields its CPU, then polls this long between yields
LINE = 8               # int64 per cache line
JOB, DONE, CALL, SLEEPING, CLAIM = 0, LINE, 2 * LINE, 3 * LINE, 4 * LINE   # a slot's fields, each on its own line
SLOT = 5 * LINE

# The polling loop and its helpers. wait(p, old, cycles, courtesy): poll *p until it differs from `old` or `cycles`
# of the cycle counter have passed, yielding the CPU between polls after `courtesy` cycles; the last value read. serve(slot, seen, min, max): make each call handed to the slot,
# polling between calls for twice the last one's cycles (within min..max); returns the last JOB seen when polling
# runs out, -1 when the call's trampoline is null (stop). (On x86, PAUSE between reads spares the sibling
# hyperthread and the memory bus.)
NATIVE_IR = """
declare i64 @llvm.readcyclecounter()
{pause_decl}
declare i32 @sched_yield()
define i64 @rulec_wait(ptr %p, i64 %old, i64 %cycles, i64 %courtesy) {{
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
  br i1 %more, label %stay, label %out
stay:
  %long = icmp ugt i64 %spent, %courtesy
  br i1 %long, label %yield, label %poll
yield:
  %y = call i32 @sched_yield()
  br label %poll
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
define i64 @rulec_hand(ptr %job, i64 %v, ptr %sleeping) {{
entry:
  store atomic i64 %v, ptr %job seq_cst, align 8
  %s = load atomic i64, ptr %sleeping seq_cst, align 8
  ret i64 %s
}}
define i64 @rulec_claim(ptr %claim, i64 %job) {{
entry:
  %old = atomicrmw umax ptr %claim, i64 %job seq_cst
  ret i64 %old
}}
declare i64 @read(i32, ptr, i64)
define i64 @rulec_serve(ptr %slot, i64 %seen0, i64 %least, i64 %most, i32 %fd, i64 %courtesy) {{
entry:
  %buf = alloca [16 x i8], align 8
  %donep = getelementptr i64, ptr %slot, i64 {done}
  %call = getelementptr i64, ptr %slot, i64 {call}
  %sleepp = getelementptr i64, ptr %slot, i64 {sleeping}
  br label %wait
wait:
  %seen = phi i64 [%seen0, %entry], [%job, %ran], [%seen, %awake], [%job, %stolen]
  %budget = phi i64 [%least, %entry], [%next, %ran], [%least, %awake], [%least, %stolen]
  %job = call i64 @rulec_wait(ptr %slot, i64 %seen, i64 %budget, i64 %courtesy)
  %new = icmp ne i64 %job, %seen
  br i1 %new, label %take, label %sleep
sleep:
  store atomic i64 1, ptr %sleepp seq_cst, align 8
  %late = load atomic i64, ptr %slot seq_cst, align 8
  %came = icmp ne i64 %late, %seen
  br i1 %came, label %awake, label %block
block:
  %got = call i64 @read(i32 %fd, ptr %buf, i64 16)
  br label %awake
awake:
  store atomic i64 0, ptr %sleepp seq_cst, align 8
  br label %wait
take:
  %claimp = getelementptr i64, ptr %slot, i64 {claim}
  %old = atomicrmw umax ptr %claimp, i64 %job seq_cst
  %mine = icmp ult i64 %old, %job
  br i1 %mine, label %fields, label %stolen
stolen:
  br label %wait
fields:
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
                          pause_call="call void @llvm.x86.sse2.pause()" if x86 else "", done=DONE, call=CALL,
                          sleeping=SLEEPING, claim=CLAIM)


def trampoline_name(n: int, m: int = 0) -> str:
  return f"rulec_call_{n}" if not m else f"rulec_call_{n}_{m}"


def trampoline_ir(n: int, m: int = 0) -> str:
  """rulec_call_<n>(fn, args, lo, hi): fn(args[0], ..., args[n-1], lo, hi), a kernel of n buffers; with m
  variables (rulec_call_<n>_<m>), args[n], ..., args[n+m-1] follow the pointers as i64 arguments."""
  loads = "\n".join(f"  %q{i} = getelementptr ptr, ptr %args, i64 {i}\n  %p{i} = load ptr, ptr %q{i}, align 8"
                    for i in range(n))
  loads += "".join(f"\n  %q{i} = getelementptr i64, ptr %args, i64 {i}\n  %p{i} = load i64, ptr %q{i}, align 8"
                   for i in range(n, n + m))
  params = "".join(f"ptr %p{i}, " for i in range(n)) + "".join(f"i64 %p{i}, " for i in range(n, n + m))
  return (f"define void @{trampoline_name(n, m)}(ptr %fn, ptr %args, i64 %lo, i64 %hi) {{\nentry:\n{loads}\n"
          f"  call void %fn({params}i64 %lo, i64 %hi)\n  ret void\n}}\n")


class Native:
  """The compiled helpers as ctypes functions, and the cycle counter's rate (0: it does not count, no polling).
  `trampoline(n, m)` is the address of the trampoline for n buffers and m variables, compiled on first use."""
  def __init__(self, addresses: dict[str, int], trampoline):
    wait = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64)(addresses["rulec_wait"])
    self.wait = lambda p, old, cycles: wait(p, old, cycles, cycles)   # (the caller yields in Python: run)
    self.publish = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64)(addresses["rulec_publish"])
    self.cycles = ctypes.CFUNCTYPE(ctypes.c_int64)(addresses["rulec_cycles"])
    self.serve = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                  ctypes.c_int32, ctypes.c_int64)(addresses["rulec_serve"])
    self.hand = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p)(addresses["rulec_hand"])
    self.claim = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64)(addresses["rulec_claim"])
    self._trampoline, self._trampolines = trampoline, {}
    c0, t0 = self.cycles(), time.perf_counter()
    while time.perf_counter() - t0 < 0.002: pass
    c1, t1 = self.cycles(), time.perf_counter()
    self.per_second = max(0.0, (c1 - c0) / (t1 - t0))

  def budget(self, seconds: float, least: float = SPIN_MIN_S) -> int:
    return int(min(max(seconds, least), SPIN_MAX_S) * self.per_second)

  def trampoline(self, n: int, m: int = 0) -> int:
    if (n, m) not in self._trampolines: self._trampolines[(n, m)] = self._trampoline(n, m) if m else self._trampoline(n)
    return self._trampolines[(n, m)]


_WAKE = (1).to_bytes(8, "little")   # one wake-up: an eventfd adds it to its count; a pipe holds the bytes


def _wake_channel() -> tuple[int, int]:
  """(read end, write end) a worker sleeps on in read(2). An eventfd where there is one (Linux): a pipe's write wakes
  its reader as the writer's CPU's next task (a "sync" wake-up, for a writer about to wait), so the worker waited
  for the caller, who polls: a 0.2 ms kernel launched after a 3 ms pause took 0.56 ms (an eventfd: 0.07). Else a
  pipe. Either write end is non-blocking."""
  if hasattr(os, "eventfd"):
    fd = os.eventfd(0, os.EFD_NONBLOCK if hasattr(os, "EFD_NONBLOCK") else 0)
    os.set_blocking(fd, True)        # (the worker's read blocks; the caller's write never does: an eventfd only
    return fd, fd                    # refuses a write at a count of 2^64 - 2)
  r, w = os.pipe()
  os.set_blocking(w, False)
  return r, w


class Workers:
  """Threads that make calls handed to them; `run` splits one launch between them and the calling thread."""
  def __init__(self, native: Native):
    self.native = native
    self.slots = host_array(0, np.dtype(np.int64))
    self.args: list[np.ndarray] = []
    self.threads: list[threading.Thread] = []
    self.pipes: list[tuple[int, int]] = []   # each worker's (read, write) ends: the write wakes it from `read`
    self.seq = 0
    self.busy = threading.Lock()   # one launch at a time owns the slots

  def _slot(self, i: int, field: int = 0) -> int:
    return self.slots.ctypes.data + (i * SLOT + field) * 8

  def _grow(self, n: int) -> None:
    """At least n workers. More replace the ones there are (stopped between launches): the slots' array moves."""
    if len(self.threads) >= n: return
    if self.threads: self.stop()
    self.slots = host_array(n * SLOT, np.dtype(np.int64), zero=True)
    self.args, self.threads = [host_array(8, np.dtype(np.int64)) for _ in range(n)], []
    least, most = self.native.budget(SPIN_MIN_S), self.native.budget(SPIN_MAX_S)
    courtesy = self.native.budget(0, YIELD_AFTER_S)
    for i in range(n):
      r, w = _wake_channel()
      self.pipes.append((r, w))
      th = threading.Thread(target=self.native.serve, args=(self._slot(i), 0, least, most, r, courtesy),
                            name=f"rulec-cpu-{i}", daemon=True)
      self.threads.append(th)
      th.start()

  def _hand(self, i: int) -> None:
    """Worker i's JOB raised (its call is in the slot already), and the worker woken if it sleeps."""
    self.seq += 1
    if self.native.hand(self._slot(i, JOB), self.seq, self._slot(i, SLEEPING)):
      try: os.write(self.pipes[i][1], _WAKE)
      except BlockingIOError: pass   # (full: it holds wake-ups enough)

  def stop(self) -> None:
    for i in range(len(self.threads)):
      self.slots[i * SLOT + CALL] = 0   # a null trampoline: return
      self._hand(i)
    for th in self.threads: th.join()
    for r, w in self.pipes:
      os.close(r)
      if w != r: os.close(w)
    self.threads, self.pipes = [], []

  def run(self, fn, calls: list[tuple], nvars: int = 0) -> None:
    """fn(*calls[0]) on this thread and fn(*calls[j]) on worker j - 1, all at once; returns when all have returned.
    Each call is a kernel's buffer addresses, then its `nvars` variables' values, then lo and hi; fn is a kernel's
    ctypes function."""
    if not self.busy.acquire(blocking=False):   # another Python thread's launch has the workers: this one runs alone
      for c in calls: fn(*c)
      return
    try: self._run(fn, calls, nvars)
    finally: self.busy.release()

  def _run(self, fn, calls: list[tuple], nvars: int = 0) -> None:
    helpers = len(calls) - 1
    self._grow(helpers)
    native, slots = self.native, self.slots
    address = ctypes.cast(fn, ctypes.c_void_p).value
    before = []
    for i in range(helpers):
      *ptrs, lo, hi = calls[i + 1]
      if self.args[i].size < len(ptrs): self.args[i] = host_array(len(ptrs), np.dtype(np.int64))
      self.args[i][:len(ptrs)] = ptrs
      base = i * SLOT + CALL
      slots[base:base + 5] = (native.trampoline(len(ptrs) - nvars, nvars), address, self.args[i].ctypes.data, lo, hi)
      before.append(int(slots[i * SLOT + DONE]))
      self._hand(i)
    t0 = time.perf_counter()
    try: fn(*calls[0])
    finally:   # (the workers' calls write the same outputs: they end before this returns, or raises)
      budget = native.budget(SPIN_RATIO * (time.perf_counter() - t0), WAIT_MIN_S)
      for i in range(helpers):
        want = int(slots[i * SLOT + JOB])
        if native.claim(self._slot(i, CLAIM), want) < want:   # not started yet (asleep): this thread makes it
          fn(*calls[i + 1])
          continue
        while native.wait(self._slot(i, DONE), before[i], budget) != want:
          # the worker is late: it may be waiting for this very CPU (the scheduler put both threads on one), so
          # give the CPU up between shorter polls
          os.sched_yield()
          budget = native.budget(0, WAIT_MIN_S)


_workers: Workers | None = None
_workers_pid = 0
_made = threading.Lock()


def _after_fork_in_child() -> None:
  global _made
  _made = threading.Lock()   # (a fork while another thread held it would leave the child's copy held forever)


if hasattr(os, "register_at_fork"): os.register_at_fork(after_in_child=_after_fork_in_child)


def workers(native_factory) -> Workers:
  """This process's workers (made on first use; a forked child makes its own, since it has no threads)."""
  global _workers, _workers_pid
  with _made:
    if _workers is None or _workers_pid != os.getpid():
      _workers, _workers_pid = Workers(native_factory()), os.getpid()
  return _workers
