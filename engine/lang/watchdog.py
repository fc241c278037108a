"""The time bound on one guard or replacement at run time (limits.RULE_TIME_S, RULEC_RULE_TIMEOUT seconds).

A rule's guard and replacement are Python expressions run inside graph_rewrite, in the user's own thread. The
checked operators (engine/lang/bounded.py) keep any one operation small, but a comprehension can still loop for
hours. Timing every rule call would cost the matchers' hot path, so instead a daemon thread looks, a few times a
second, at what each thread is running: a thread whose innermost frame of generated matcher code (a code object
named `<rulec ...>`) has been the same frame, matching the same node, for longer than the limit gets a RuleTimeout
raised into it (CPython's asynchronous exception, delivered at the next bytecode). The matcher's own error handler
turns it into a RuleRuntimeError naming the rule and where it is. Work inside one C call (a huge sort) is not
interrupted; the operand checks are what keep those short."""
from __future__ import annotations

import ctypes
import gc
import os
import sys
import threading
import time

from rulec.engine.lang.limits import RULE_TIME_S

MATCHER_FILE_PREFIX = "<rulec"      # the file name generated matchers are compiled under (engine/lang/loader.py)


def rule_time_limit() -> float:
  try: return max(0.05, float(os.environ.get("RULEC_RULE_TIMEOUT", RULE_TIME_S)))
  except ValueError: return RULE_TIME_S


class RuleTimeout(Exception):
  """A guard or replacement ran past the time limit on one node."""
  def __init__(self, *args):
    super().__init__(*(args or (f"the guard or replacement ran longer than {rule_time_limit():g} s on one node "
                                "(RULEC_RULE_TIMEOUT seconds); a rule whose guard does much work belongs in a helper",)))


_lock = threading.Lock()
_thread: threading.Thread | None = None
_pid = -1


def start() -> None:
  """Start the watching thread (once per process; again in a forked child, which has no threads of its parent)."""
  global _thread, _pid
  with _lock:
    if _thread is not None and _pid == os.getpid() and _thread.is_alive(): return
    _pid = os.getpid()
    _thread = threading.Thread(target=_watch, name="rulec-rule-watchdog", daemon=True)
    _thread.start()


def _matcher_frame(frame):
  """The innermost frame running generated matcher code on this stack, or None."""
  while frame is not None:
    if frame.f_code.co_filename.startswith(MATCHER_FILE_PREFIX): return frame
    frame = frame.f_back
  return None


def _key(frame) -> tuple:
  # the frame, and the node it matches (`n` in a matcher's dispatch function): a new call that happens to reuse the
  # frame's memory almost never also matches a node at the same address
  try: node = frame.f_locals.get("n")
  except Exception: node = None   # noqa: BLE001 - reading another thread's frame must never stop the watchdog
  return (id(frame), frame.f_code, id(node))


def _raise_in(tid: int) -> None:
  ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(tid), ctypes.py_object(RuleTimeout))


def _other_frames() -> dict | None:
  """sys._current_frames(), with the garbage collector held off while it runs. CPython 3.11 builds the dict while
  holding its lock on the thread list; an allocation there that starts a collection which needs that lock again
  deadlocks the process, this thread holding the GIL (a CI run of `rulec prove` hung so, the main thread waiting for
  the GIL inside z3's Z3_inc_ref, this one inside gc_collect_main under _PyThread_CurrentFrames). None on error."""
  was = gc.isenabled()
  gc.disable()
  try: return sys._current_frames()
  except Exception: return None   # noqa: BLE001
  finally:
    if was: gc.enable()


def _watch() -> None:
  me = threading.get_ident()
  since: dict[int, tuple[tuple, float]] = {}     # thread id -> (what it runs, when first seen)
  top = f = None
  while True:
    limit = rule_time_limit()
    time.sleep(min(0.25, limit / 4))
    now = time.monotonic()
    frames = _other_frames()
    if frames is None: continue
    for tid in list(since):
      if tid not in frames: del since[tid]
    for tid, top in frames.items():
      if tid == me: continue
      f = _matcher_frame(top)
      if f is None: since.pop(tid, None); continue
      key = _key(f)
      seen = since.get(tid)
      if seen is None or seen[0] != key: since[tid] = (key, now); continue
      if now - seen[1] > limit:
        _raise_in(tid)
        since[tid] = (key, now)          # (again after another limit if a helper swallowed it)
    # no frame of another thread may stay referenced while this thread sleeps: a frame keeps its locals (tensors,
    # buffers) alive, and a realize's frame held here once kept a whole chain of realized values from being freed
    frames = top = f = None
