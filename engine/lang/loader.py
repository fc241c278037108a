"""Loading rule files: parse, check, compile, and cache the generated matchers.

`load_library()` finds rules/ (in a checkout, or inside the installed
package), layers the user's rules directory (RULEC_RULES) over it, and
`library.matcher("symbolic")` returns a Matcher. Generated
matcher source is cached on disk under a key made of the rule files' content
and the compiler's own source, so a warm process skips Lark and the checker
entirely. A cache entry that fails its HMAC (engine/diskcache.py: only what
rulec wrote loads) or does not load is ignored and rebuilt. Rules files are
read by read_rule_file: regular files only, never through a link, never past
the size limit (docs/security.md).
"""
from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from rulec.engine import diskcache
from rulec.engine.lang import ast as A
from rulec.engine.lang import shipped
from rulec.engine.lang.checker import CheckedLibrary, check_library
from rulec.engine.lang.compiler import generate, per_rule_functions
from rulec.engine.lang.diagnostics import Diagnostic, RuleError
from rulec.engine.lang.limits import MAX_FILE_BYTES
from rulec.engine.lang.parser import decode_source, parse_rules

_HERE = Path(__file__).resolve().parent
_COMPILER_FILES = ("compiler.py", "parser.py", "checker.py", "names.py", "rules.lark", "ast.py", "runtime.py", "loader.py",
                   "capability.py", "limits.py", "shipped.py")

# Where each matcher of this process came from: a module the wheel's build compiled (engine/lang/shipped.py), the
# disk cache, or the rules compiled now (Lark, the checker, the compiler)
COMPILED = {"shipped": 0, "cached": 0, "compiled": 0}


def default_rules_dir() -> Path:
  """The shipped rules: rules/ beside engine/, in a checkout and in the installed package (`rulec.rules`)."""
  rules = _HERE.parent.parent / "rules"
  if not rules.is_dir(): raise FileNotFoundError(f"rulec's rules directory is missing (looked in {rules})")
  return rules


def rule_files(paths: list[str | Path] | None = None) -> list[Path]:
  """Expand files and directories (recursively, *.rules) into a sorted file list."""
  out: list[Path] = []
  for p in [default_rules_dir()] if not paths else [Path(p) for p in paths]:
    if p.is_dir(): out += sorted(p.rglob("*.rules"))
    else: out.append(p)
  return out


def user_rules_paths() -> list[Path]:
  """The user's rules directories (or files) from RULEC_RULES, several separated by os.pathsep; [] when unset."""
  return [Path(p) for p in os.environ.get("RULEC_RULES", "").split(os.pathsep) if p]


def stats_enabled() -> bool: return os.environ.get("RULEC_STATS", "") not in ("", "0")


def _compiler_digest() -> str:
  h = hashlib.sha256()
  for name in _COMPILER_FILES: h.update((_HERE / name).read_bytes())
  for mod in ("ops.py", "dtypes.py"): h.update((_HERE.parent / "ir" / mod).read_bytes())
  return h.hexdigest()


class Matcher:
  """A compiled rule set: `rewrite(node, ctx)` returns the first rule's replacement or None."""

  def __init__(self, library: RuleLibrary, names: tuple[str, ...]):
    self.library, self.names = library, names
    self.title = "+".join(names)
    self.source, ns = library._compiled(names, stats_enabled())
    self.dispatch: dict = ns["DISPATCH"]
    self.rule_info: tuple = ns["RULES"]
    self.stats: list = ns["STATS"]
    self._per_rule = None
    if stats_enabled(): _STATS_MATCHERS.append(self)

  def rewrite(self, node, ctx: Any = None):
    fn = self.dispatch.get(node.op)
    return None if fn is None else fn(node, ctx)

  def __add__(self, other: Matcher) -> Matcher:
    return self.library.matcher(*self.names, *other.names)

  @property
  def rules(self) -> list[A.Rule]: return self.library.rules_of(self.names)

  def _rule_fns(self):
    if self._per_rule is None:
      rules = self.rules
      ns: dict[str, Any] = {"__name__": f"rulec_rules_{self.title}"}
      exec(compile(per_rule_functions(rules, self.library.checked.helpers_of), f"<rulec {self.title}>", "exec"), ns)
      self._per_rule = ns["RULE_FNS"]
    return self._per_rule

  def which_rule(self, node, ctx: Any = None) -> tuple[str, str] | None:
    """The (name, location) of the rule that rewrites `node`, found by trying the rules one at a time."""
    res = self.rewrite_named(node, ctx)
    return None if res is None else res[1]

  def rewrite_named(self, node, ctx: Any = None) -> tuple[Any, tuple[str, str]] | None:
    """What rewrite() gives, with the (name, location) of the rule that gave it; None when no rule rewrites.
    The rules run once each, in order: a ctx whose methods record (the scheduler's) sees one rewrite."""
    for k, fn in enumerate(self._rule_fns()):
      r = fn(node, ctx)
      if r is not None and r is not node: return r, (self.rule_info[k][0], self.rule_info[k][1])
    return None

  def __repr__(self): return f"<Matcher {self.title}: {len(self.rule_info)} rules>"


class RuleLibrary:
  """Every rule set in a set of .rules files, with `user_files` (a user's rules directory) layered over them:
  a set they define replaces the one of that name, and `ruleset NAME extends BASE:` builds on a set beneath."""

  def __init__(self, files: list[Path], user_files: list[Path] = ()):
    self.files = list(files) + list(user_files)
    self.raw = {str(f): read_rule_file(f) for f in self.files}
    self.layers = {str(f): 1 for f in user_files}
    self.sources = {p: source_text(p, data) for p, data in self.raw.items()}
    self.compiler_digest = _compiler_digest()
    h = hashlib.sha256(self.compiler_digest.encode())
    for path in sorted(self.sources):
      # the full path: generated code names rule locations, so two copies must not share an entry;
      # the layer: the same files give another library when one of them is layered over the others
      data = self.raw[path] if isinstance(self.raw[path], bytes) else repr(self.raw[path]).encode()
      h.update(path.encode("utf-8", "surrogateescape") + b"\0" + str(self.layers.get(path, 0)).encode() + b"\0"
               + data + b"\0")
    self.digest = h.hexdigest()
    self._checked: CheckedLibrary | None = None
    self._matchers: dict[tuple[str, ...], Matcher] = {}

  @property
  def checked(self) -> CheckedLibrary:
    if self._checked is None: self._checked = check_sources(self.raw, layers=self.layers)
    return self._checked

  def require_clean(self):
    if self.checked.errors: raise RuleError(self.checked.errors, self.sources)

  def ruleset_names(self) -> list[str]: return list(self.checked.rulesets)

  def user_ruleset_names(self) -> list[str]:
    """The rule sets the user's layer defines, replaces or extends."""
    return [n for n in self.checked.rulesets if self.layers.get(self.checked.ruleset_file[n], 0) > 0]

  def rules_of(self, names: tuple[str, ...]) -> list[A.Rule]:
    self.require_clean()
    out: list[A.Rule] = []
    seen: set[int] = set()
    for n in names:
      if n not in self.checked.rulesets: raise KeyError(f"no ruleset named {n!r}; known: {', '.join(self.checked.rulesets)}")
      for r in self.checked.flat_rules(n):
        if id(r) not in seen: seen.add(id(r)); out.append(r)
    return out

  def matcher(self, *names: str) -> Matcher:
    key = tuple(names)
    if key not in self._matchers: self._matchers[key] = Matcher(self, key)
    return self._matchers[key]

  def emit(self, *names: str, stats: bool = False) -> str:
    return generate(self.rules_of(tuple(names)), self.checked.helpers_of, stats=stats, title="+".join(names))

  def _compiled(self, names: tuple[str, ...], stats: bool) -> tuple[str, dict]:
    if not stats and (found := _shipped(self, names)) is not None:
      COMPILED["shipped"] += 1
      return found
    key = hashlib.sha256(f"{self.digest}|{'+'.join(names)}|{int(stats)}".encode()).hexdigest()[:32]
    src = diskcache.load_text(key)   # None unless rulec itself wrote it (an HMAC under the user's key)
    if src is not None:
      code = diskcache.load_code(key)   # (its bytecode, kept beside it: compiling the text costs a cold process most)
      try:
        ns, fresh = _exec(src, names, code)
        COMPILED["cached"] += 1
        if fresh is not None: diskcache.store_code(key, fresh)
        return src, ns
      except (Exception, SystemExit): pass  # a stale or broken entry is rebuilt below
    src = self.emit(*names, stats=stats)
    ns, fresh = _exec(src, names)
    COMPILED["compiled"] += 1
    diskcache.store_text(key, src)
    diskcache.store_code(key, fresh)
    return src, ns


def _shipped(library: RuleLibrary, names: tuple[str, ...]) -> tuple[str, dict] | None:
  try: rules_dir, files = default_rules_dir(), rule_files()
  except OSError: return None
  return shipped.load(library, names, rules_dir, files)


def read_rule_file(path: Path) -> bytes | OSError:
  """A rules file's bytes, or the OSError that stopped the read (reported by unread_diagnostic, never raised).
  Only a regular file is read, never through a symbolic link at its own name, and never past MAX_FILE_BYTES:
  a FIFO, a device, a link (to /dev/zero, to a secret) or a larger file is refused before one byte of it is
  read, so no text of it is ever shown (diskcache.read_regular: O_NOFOLLOW, O_NONBLOCK, fstat)."""
  try: return diskcache.read_regular(path, MAX_FILE_BYTES)
  except OSError as e: return e


def unread_diagnostic(path: str, err: OSError) -> Diagnostic:
  """The located diagnostic for a rules file that was not read: R006 for a symbolic link, a FIFO, a device or a
  socket, R705 for a file over the size limit, R003 for any other error (a directory, no permission)."""
  span = A.Span(path, 1, 1, 1, 1)
  if isinstance(err, diskcache.Refused) and err.what == "too large":
    size = f"{err.size} bytes" if err.size is not None else f"more than {MAX_FILE_BYTES} bytes"
    return Diagnostic("R705", "error", span, f"the file has {size}; rules files are limited to {MAX_FILE_BYTES} bytes")
  if isinstance(err, diskcache.Refused):
    return Diagnostic("R006", "error", span, f"not a regular file ({err.what}); nothing of it was read",
                      note="rules are read only from regular files, never through a symbolic link or from a "
                           "FIFO or device: put the file itself here")
  return Diagnostic("R003", "error", span, f"cannot read the file: {err.strerror or type(err).__name__}")


def source_text(path: str, data: str | bytes | OSError) -> str:
  """The text diagnostics show for a source (undecodable bytes shown as U+FFFD)."""
  if isinstance(data, OSError): return ""
  return decode_source(path, data)[0]


def check_sources(sources: dict[str, str | bytes | OSError], examples: bool = False,
                  layers: dict[str, int] | None = None) -> CheckedLibrary:
  """Parse and check rule sources (text, or a file's bytes); with examples=True (and no errors) also run the rules' examples.
  `layers` maps a source to its layer (default 0); a user's rules directory is layer 1 (see check_library).

  Nothing in a source can make this raise: every problem is a located Diagnostic."""
  files, diags = [], []
  for path, data in sources.items():
    if isinstance(data, OSError):
      diags.append(unread_diagnostic(path, data))
      continue
    text, bad = decode_source(path, data)
    if bad is not None:
      diags.append(bad)
      continue
    rf, d = parse_rules(text, path)
    diags += d
    if rf is not None: files.append(rf)
  lib = check_library(files, diags, layers)
  if examples and not lib.errors:
    from rulec.engine.lang.examples import run_examples
    lib.diagnostics += run_examples(lib)
    lib.diagnostics.sort(key=lambda d: (d.span.file, d.span.line, d.span.col, d.code))
  return lib


def check_paths(paths: list[str | Path] | None = None, examples: bool = False,
                user: list[str | Path] | None = None) -> tuple[CheckedLibrary, dict[str, str]]:
  """Check files (default: the shipped rules), with the files of `user` layered over them."""
  base, top = rule_files(paths), rule_files(user) if user else []
  raw = {str(f): read_rule_file(f) for f in base + top}
  layers = {str(f): 1 for f in top}
  return check_sources(raw, examples=examples, layers=layers), {p: source_text(p, data) for p, data in raw.items()}


def _exec(src: str, names, code=None) -> tuple[dict, Any]:
  """The namespace of generated matcher source `src` run (from `code`, its compiled form, when given), and the code
  object compiled here (None when `code` was used)."""
  ns: dict[str, Any] = {"__name__": f"rulec_rules_{'_'.join(names)}"}
  fresh = None
  if code is None: code = fresh = compile(src, f"<rulec {'+'.join(names)}>", "exec")
  exec(code, ns)
  if not isinstance(ns.get("DISPATCH"), dict): raise RuntimeError("generated matcher has no DISPATCH table")
  return ns, fresh


_LIBRARIES: dict[tuple[tuple[str, ...], tuple[str, ...]], RuleLibrary] = {}


def load_library(paths: list[str | Path] | None = None, user: list[str | Path] | None = None) -> RuleLibrary:
  """The library for these paths (default: rules/) with the user's rules `user` layered over them, loaded once
  per process (again when a file changed). Without `paths` and `user`, the user's rules are RULEC_RULES's;
  with explicit `paths` and no `user`, the files alone are the library.

  Errors surface as RuleError when a matcher is asked for (or on require_clean())."""
  held = _HELD.libraries
  if held is not None:
    ask = (None if paths is None else tuple(map(str, paths)), None if user is None else tuple(map(str, user)),
           os.environ.get("RULEC_RULES") if user is None and paths is None else None)
    if (lib := held.get(ask)) is None: lib = held[ask] = _load_library(paths, user)
    return lib
  return _load_library(paths, user)


def _load_library(paths, user) -> RuleLibrary:
  if user is None and paths is None: user = user_rules_paths()
  files, top = _listed(paths, user)
  key = (tuple(str(f) for f in files), tuple(str(f) for f in top))
  lib = _LIBRARIES.get(key)
  stamps = _stamps(files + top)
  if lib is not None and stamps is not None and _STAMPS.get(key) == stamps: return lib
  if lib is None or any(lib.raw[str(f)] != read_rule_file(f) for f in files + top):
    lib = _LIBRARIES[key] = RuleLibrary(files, top)
  _STAMPS[key] = stamps
  return lib


class _Held(threading.local):
  libraries: dict | None = None


# library_held(): inside it, each library is checked for changed files once (one schedule sees one version of the
# rules, and its hundreds of requests cost a dictionary lookup, not a dozen stats each)
_HELD = _Held()


@contextlib.contextmanager
def library_held():
  """While inside, load_library answers each set of paths with the library it first answered there (re-entrant;
  per thread). The scheduler holds it for one schedule."""
  if _HELD.libraries is not None:
    yield
    return
  _HELD.libraries = {}
  try: yield
  finally: _HELD.libraries = None


# load_library's check that no file changed: each file's (inode, size, modification time), so that asking for the
# library again (the scheduler's helpers ask hundreds of times a schedule) stats the files instead of reading them.
# A file modified in the last RACY_S seconds is read every time (a write within the file system's timestamp
# granularity could leave all three as they were: git's "racy" files)
_STAMPS: dict[tuple, tuple | None] = {}
RACY_S = 2.0


# and which files it has: rule_files' walk, again only when a directory of it changed (an entry added, removed or
# renamed changes its directory's modification time; a new subdirectory, its parent's)
_LISTS: dict[tuple, tuple] = {}


def _listed(paths, user) -> tuple[list[Path], list[Path]]:
  key = (None if paths is None else tuple(map(str, paths)), tuple(map(str, user or ())))
  hit = _LISTS.get(key)
  if hit is not None and hit[1] is not None and _stamps(hit[0]) == hit[1]: return hit[2], hit[3]
  dirs = [d for p in ([default_rules_dir()] if not paths else [Path(p) for p in paths]) + [Path(p) for p in user or ()]
          for d in _dirs_under(p)]
  stamps = _stamps(dirs)   # (before the walk: a file added while it runs changes a stamp the next call compares)
  files, top = rule_files(paths), rule_files(user) if user else []
  _LISTS[key] = (dirs, stamps, files, top)
  return files, top


def _dirs_under(p: Path) -> list[Path]:
  """p and every directory below it (a file: the directory it is in)."""
  if not p.is_dir(): return [p.parent]
  return [Path(d) for d, _, _ in os.walk(p)]


def _stamps(files: list[Path]) -> tuple | None:
  out = []
  now = time.time_ns()
  for f in files:
    try: st = os.stat(f, follow_symlinks=False)
    except OSError: return None
    if now - st.st_mtime_ns < RACY_S * 1e9: return None
    out.append((st.st_ino, st.st_size, st.st_mtime_ns))
  return tuple(out)


def matcher(*names: str) -> Matcher:
  """A matcher over the default library (rules/, with RULEC_RULES layered over it): `matcher("symbolic")`."""
  return load_library().matcher(*names)


# *** RULEC_STATS=1: per-rule counters, printed at exit ***

_STATS_MATCHERS: list[Matcher] = []


def format_stats() -> str:
  lines = []
  for m in _STATS_MATCHERS:
    lines.append(f"rule statistics for {m.title}:")
    lines.append(f"  {'attempts':>9} {'matches':>8} {'time ms':>9}  rule")
    never = []
    for (name, loc, _), (att, hit, t) in zip(m.rule_info, m.stats):
      lines.append(f"  {att:>9} {hit:>8} {t * 1e3:>9.3f}  {name} ({loc})")
      if hit == 0: never.append(f"{name} ({loc})")
    lines.append(f"  never matched: {', '.join(never) if never else 'none'}")
  return "\n".join(lines)


@atexit.register
def _print_stats():
  if _STATS_MATCHERS: print(format_stats(), file=sys.stderr)
