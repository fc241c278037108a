"""A progress line on stderr for work that runs long, in the manner of tqdm.

`with progress.job("realize", "scheduling") as j:` marks a stretch of work; `j.phase`, `j.total` and `j.advance()`
say how far it got (`j.text` may instead be a function giving the whole text). Nothing is printed until the
outermost job has run `RULEC_PROGRESS_AFTER` seconds (1 by default); then one line, redrawn in place four times a
second, says what each running job is doing, and it is erased when the outermost job ends. A job started
inside another (a realize inside `rulec trace`) shares the line.

Only when stderr is a terminal, and never with RULEC_PROGRESS=0: piped output, logs and test runs see nothing.
A job costs a couple of attribute writes when the line is off, so realize() can mark every call.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from typing import Callable

EVERY = 0.25    # seconds between redraws


def after() -> float:
  """Seconds of work before the line appears (RULEC_PROGRESS_AFTER, default 1)."""
  try: return max(0.0, float(os.environ.get("RULEC_PROGRESS_AFTER", "1")))
  except ValueError: return 1.0


def enabled(stream=None) -> bool:
  """Whether a job started now would show a line: stderr (or `stream`) is a terminal and RULEC_PROGRESS is not 0."""
  if os.environ.get("RULEC_PROGRESS", "").strip() == "0": return False
  stream = sys.stderr if stream is None else stream
  try: return bool(stream.isatty())
  except (AttributeError, ValueError, OSError): return False


class Job:
  """One stretch of work on the line: `label: text` (the text is `phase done/total`, or what `text()` returns)."""
  def __init__(self, label: str, phase: str = "", total: int = 0, text: Callable[[], str] | None = None):
    self.label, self.phase, self.total, self.done, self.text = label, phase, total, 0, text
    self.t0 = time.monotonic()

  def advance(self, n: int = 1, redraw: bool = False) -> None:
    """n more steps done; `redraw`: show the line now (a new stage), not at the next redraw."""
    self.done += n
    _maybe_draw(force=redraw)

  def line(self) -> str:
    if self.text is not None:
      try: body = self.text()
      except Exception as e:  # noqa: BLE001 - a progress line must never end the work it reports on
        body = f"({type(e).__name__})"
    else: body = f"{self.phase} {self.done}/{self.total}" if self.total else self.phase
    return f"{self.label}: {body}" if body else self.label


class _Off:
  """The job handed out while the line is off: accepts everything, shows nothing."""
  label = phase = ""
  total = done = 0
  text = None
  def advance(self, n: int = 1, redraw: bool = False) -> None: pass
  def __enter__(self): return self
  def __exit__(self, *exc): return False


_OFF = _Off()


class _On:
  def __init__(self, job: Job): self.job = job
  def __enter__(self) -> Job:
    _start(self.job)
    return self.job
  def __exit__(self, *exc):
    _end(self.job)
    return False


def job(label: str, phase: str = "", total: int = 0, text: Callable[[], str] | None = None):
  """A context manager for a stretch of work, giving its Job (a do-nothing stand-in when the line is off)."""
  if not enabled(): return _OFF
  return _On(Job(label, phase, total, text))


# *** the line: shared state, drawn by whichever thread gets there (the worker at each advance, the monitor between) ***

_lock = threading.Lock()
_jobs: list[Job] = []
_shown = 0          # characters of the line now on the terminal (0: none)
_last = 0.0         # when it was last drawn
_wake = threading.Event()
_monitor: threading.Thread | None = None


def _start(j: Job) -> None:
  global _monitor
  with _lock:
    _jobs.append(j)
    if _monitor is None or not _monitor.is_alive():
      _monitor = threading.Thread(target=_watch, name="rulec-progress", daemon=True)
      _monitor.start()
  _wake.set()
  _maybe_draw()


def _end(j: Job) -> None:
  global _shown
  with _lock:
    if j in _jobs: _jobs.remove(j)
    if not _jobs and _shown:
      _write("\r" + " " * _shown + "\r")
      _shown = 0


def _maybe_draw(force: bool = False) -> None:
  global _shown, _last
  now = time.monotonic()
  with _lock:
    if not _jobs or now - _jobs[0].t0 < after() or (not force and _shown and now - _last < EVERY): return
    text = "rulec " + " | ".join(j.line() for j in _jobs) + f" ({now - _jobs[0].t0:.0f} s)"
    text = " ".join(text.split())   # one line, whatever a label held
    width = _width()
    if len(text) > width: text = text[:max(1, width - 1)] + "\u2026"
    _write("\r" + text + " " * max(0, _shown - len(text)))
    _shown, _last = len(text), now


def _width() -> int:
  """Characters the line may take: the terminal's width less one (79 when the terminal does not say)."""
  try: columns = os.get_terminal_size(sys.stderr.fileno()).columns
  except (AttributeError, ValueError, OSError): columns = 0
  return max(20, columns - 1) if columns > 0 else 79


def _write(s: str) -> None:
  try:
    sys.stderr.write(s)
    sys.stderr.flush()
  except (OSError, ValueError): pass


def _watch() -> None:
  """The monitor: redraws while jobs run, so a single long step (one big kernel compiling) still shows."""
  while True:
    _wake.wait()
    while True:
      time.sleep(EVERY)
      with _lock: idle = not _jobs
      if idle: break
      _maybe_draw(force=True)
    with _lock:
      if not _jobs: _wake.clear()


def erase() -> None:
  """Take the line off the screen (it comes back at the next redraw), so text written now starts at column 0."""
  global _shown, _last
  with _lock:
    if _shown:
      _write("\r" + " " * _shown + "\r")
      _shown, _last = 0, time.monotonic()


class _Erasing:
  """sys.stdout while a command runs a program under a progress line: the line is erased before each write, as
  tqdm.write does, so the program's output is not glued to it."""
  def __init__(self, stream): self._stream = stream
  def write(self, s):
    if _shown: erase()
    return self._stream.write(s)
  def writelines(self, lines):
    if _shown: erase()
    return self._stream.writelines(lines)
  def __getattr__(self, name): return getattr(self._stream, name)


@contextlib.contextmanager
def erasing_stdout():
  """While the line is on (stderr a terminal), sys.stdout erases it before each write."""
  if not enabled():
    yield
    return
  old = sys.stdout
  sys.stdout = _Erasing(old)
  try: yield
  finally:
    if isinstance(sys.stdout, _Erasing): sys.stdout = old


def _after_fork() -> None:
  # a forked child (the CPU device's workers) starts with no line, a fresh lock and no monitor
  global _lock, _shown, _monitor, _wake
  _lock, _shown, _monitor, _wake = threading.Lock(), 0, None, threading.Event()
  _jobs.clear()


if hasattr(os, "register_at_fork"): os.register_at_fork(after_in_child=_after_fork)
