"""rulec's one disk cache: generated rule matchers, compiled kernels and search results, kept so that a later
process loads them instead of making them again. It sits beneath every layer that caches (the rule language's
matchers, codegen's search results, the devices' compiled kernels), so each of them reads and writes entries
the same way, through this module. It also holds the two file primitives the rest of rulec shares for files it
did not make itself: `read_regular` (a regular file, never through a link, never more than a cap) and
`write_replacing` (a new file renamed over the path, so a link there is replaced, never written through).

What the cache trusts (docs/security.md, "What the cache trusts"): matchers are Python that is executed and
kernels are object code loaded into the process, so an entry is used only when rulec itself wrote it.

- The root (`cache_dir()`: RULEC_CACHE_DIR, made absolute when relative, else $XDG_CACHE_HOME/rulec when
  XDG_CACHE_HOME is an absolute path, else ~/.cache/rulec) is created with mode 0700 and used only when it is a
  directory owned by the current user and not writable by group or others (root included). Otherwise rulec says
  so once on stderr and runs with no disk cache.
- Every entry carries an HMAC-SHA256 tag under a per-user random key: 32 bytes in `hmac-key` in the root, mode
  0600, created with O_EXCL (written under a temporary name, then hard-linked into place, so no process ever
  reads half a key). A key file that is not a regular file of the user's with mode 0600 and 32 bytes refuses
  the cache as above. The tag covers the entry's kind and name and its whole payload, so a file planted in the
  cache, or one entry copied over another, is a miss: removed, built again and written again.
- Entries are opened with O_NOFOLLOW and O_NONBLOCK (a link, a FIFO, a device is never read; opening a FIFO
  never waits), must be regular files of the user's, and are read only up to a cap per kind (MAX_BYTES).
- Writes go to a new file (O_EXCL, mode 0600) in the entry's own directory, renamed into place: a reader never
  sees half an entry, two processes writing one key leave one whole entry, and a link at the entry's name is
  replaced rather than followed.

Matchers (the rule language's loader) are `<key>.py` files in the root: one comment line naming their key and
tag, then the body (`load_text`, `store_text`); beside each, a `.code` file holds the marshalled code object
compiled from it (`load_code`, `store_code`), tagged the same way.

The CPU device stores object code (what LLVM emitted for a kernel's IR), the CL device program binaries, the
optimizer its search results. An entry's name is the digest of its key: every input that decides the compiled
bytes (the kernel's source text, the target, the compiler and its version, the options), so an entry is only
ever found by a process that would have compiled the same bytes. These entries live under `kernels/<kind>/`
in the root. An entry is one header line, `rulec-kernel 2 <key digest> <tag> <payload bytes>`, then the
payload. A reader hands the payload on only when all of that matches: a truncated, altered or planted file, or
one written for another key, reads as a miss (and counts in STATS["rejected"]); the device then compiles and
writes the entry again. Payloads must pass this check before they reach LLVM or an OpenCL driver, which may
abort the process on malformed input instead of raising.

A device may keep two kinds of entry: the compiled payload, keyed by the source text (`<digest>.bin`), and a
kernel entry, keyed by the kernel before rendering (`<digest>.kernel`, a small JSON record naming the payload's
key and whatever else a launch needs), so that a warm process skips rendering too.

`RULEC_KERNEL_CACHE=0` turns the kernel and search entries off (nothing read or written). Nothing is ever
evicted: entries for old compilers or kernels stay until the directory is cleared.
"""
from __future__ import annotations

import errno
import hashlib
import hmac
import importlib.util
import json
import marshal
import os
import secrets
import stat
import sys
from pathlib import Path


FORMAT = 2
STATS = {"hits": 0, "misses": 0, "rejected": 0, "writes": 0}
KEY_FILE, KEY_BYTES = "hmac-key", 32
# The most one entry's payload may hold (a larger file is rejected unread). Object code and program binaries are
# tens to hundreds of KiB (a few MiB for the largest kernels), kernel and search records a few hundred bytes, the
# largest generated matcher (the scheduler's symbolic rules) about 300 KiB.
MAX_BYTES = {".bin": 64 << 20, ".kernel": 1 << 20, ".py": 32 << 20, ".code": 32 << 20}
_HEADER_BYTES = 256   # a header line is shorter than this

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)

_keys: dict[tuple, bytes] = {}   # (root, st_dev, st_ino) -> the key kept in that root
_warned: set[str] = set()        # roots refused, each said once per process


# *** reading and writing files rulec did not make itself ***

class Refused(OSError):
  """read_regular refused a path: `what` it is (a symbolic link, a FIFO, a device, a socket, another user's file,
  or too large: then `size` is the size fstat gave, or None when the file said less than it held)."""
  def __init__(self, what: str, size: int | None = None):
    super().__init__(errno.EINVAL, what)
    self.what, self.size = what, size

  def __eq__(self, other): return type(other) is type(self) and (self.what, self.size) == (other.what, other.size)
  def __hash__(self): return hash((self.what, self.size))


def _kind(mode: int) -> str:
  if stat.S_ISFIFO(mode): return "a FIFO"
  if stat.S_ISCHR(mode): return "a character device"
  if stat.S_ISBLK(mode): return "a block device"
  if stat.S_ISSOCK(mode): return "a socket"
  return "not a regular file"


def _open_regular(path: str | Path) -> tuple[int, os.stat_result]:
  """An open descriptor of the regular file at `path` and its fstat; the last component is never followed as a
  link, and a FIFO is opened without waiting for a writer. Raises Refused, IsADirectoryError or OSError."""
  try: fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _CLOEXEC)
  except OSError as e:
    if e.errno in (errno.ELOOP, errno.EMLINK) and os.path.islink(path): raise Refused("a symbolic link") from None
    raise
  try:
    st = os.fstat(fd)
    if stat.S_ISDIR(st.st_mode): raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    if not stat.S_ISREG(st.st_mode): raise Refused(_kind(st.st_mode))
  except BaseException:
    os.close(fd)
    raise
  return fd, st


def _read_fd(fd: int, cap: int) -> bytes:
  """At most cap + 1 bytes from fd (one more than the cap tells a file longer than it)."""
  chunks, n = [], 0
  while n <= cap:
    b = os.read(fd, min(cap + 1 - n, 1 << 20))
    if not b: break
    chunks.append(b)
    n += len(b)
  return b"".join(chunks)


def read_regular(path: str | Path, cap: int, owner: int | None = None) -> bytes:
  """The bytes of the regular file at `path`, never through a link at its last component, never waiting on a
  FIFO, never more than `cap` bytes: a larger file is refused before it is read (its size from fstat), and one
  that holds more than its size says (a /proc file says 0) once cap + 1 bytes are in. With `owner`, a file of
  another uid is refused. Raises Refused, IsADirectoryError, FileNotFoundError or another OSError."""
  fd, st = _open_regular(path)
  try:
    if owner is not None and st.st_uid != owner: raise Refused(f"owned by uid {st.st_uid}")
    if st.st_size > cap: raise Refused("too large", st.st_size)
    data = _read_fd(fd, cap)
    if len(data) > cap: raise Refused("too large")
    return data
  finally: os.close(fd)


def write_replacing(path: str | Path, data: bytes, mode: int | None = None) -> None:
  """Write `data` as the file at `path`: into a new file (O_EXCL, never through a link) in the same directory,
  then renamed over `path`. A symbolic link at `path` is replaced by the new file; its target is never written.
  A reader sees the old file or the new one, never half of one. `mode`: the new file's permission bits (default:
  0o666 less the umask, as open() gives a new file). Raises OSError (nothing is left behind)."""
  path = Path(path)
  if not path.name: raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
  fd, tmp = -1, None
  for _ in range(64):
    tmp = path.with_name(f".{path.name[:64]}.{secrets.token_hex(6)}.tmp")
    try:
      fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC,
                   0o600 if mode is not None else 0o666)
      break
    except FileExistsError: continue
  if fd < 0: raise FileExistsError(errno.EEXIST, "no free temporary name", str(path.parent))
  try:
    with os.fdopen(fd, "wb") as f:
      if mode is not None: os.fchmod(f.fileno(), mode)
      f.write(data)
    os.replace(tmp, path)
  except BaseException:
    try: os.unlink(tmp)
    except OSError: pass
    raise


def _drop(path: str | Path) -> None:
  """Remove a rejected entry (unlink never follows a link); one that cannot be removed is overwritten later."""
  try: os.unlink(path)
  except OSError: pass


# *** the root and its key ***

def _home() -> str | None:
  """The user's home: $HOME when it is an absolute path, else the password database's; None when neither is."""
  home = os.environ.get("HOME", "")
  if not os.path.isabs(home):
    try:
      import pwd
      home = pwd.getpwuid(os.getuid()).pw_dir
    except (ImportError, KeyError): return None
  return home if os.path.isabs(home) else None


def cache_dir() -> Path | None:
  """The cache's root: RULEC_CACHE_DIR (made absolute), else $XDG_CACHE_HOME/rulec when XDG_CACHE_HOME is an absolute
  path (an empty or relative one is ignored, as the XDG spec says), else ~/.cache/rulec; None with no absolute home.
  Read at every call, as tests change it. Whether it may be used is _root()'s question."""
  d = os.environ.get("RULEC_CACHE_DIR", "")
  if d: return Path(os.path.abspath(d))
  xdg = os.environ.get("XDG_CACHE_HOME", "")
  if os.path.isabs(xdg): return Path(xdg) / "rulec"
  home = _home()
  return Path(home) / ".cache" / "rulec" if home is not None else None


def _printable(s: str) -> str: return "".join(c if c.isprintable() else repr(c)[1:-1] for c in s)


def _warn(root: Path | None, why: str) -> None:
  name = "" if root is None else str(root)
  if name in _warned: return
  _warned.add(name)
  where = f"the cache directory {_printable(name)}" if root is not None else "a cache directory"
  print(f"rulec: warning: not using {where}: {why}; running without a disk cache "
        f"(set RULEC_CACHE_DIR to a directory only you can write)", file=sys.stderr)


def _make_key(root: Path) -> None:
  """Make root's key file, atomically: written whole under a temporary name, then hard-linked to its name (which
  fails when another process made it first: theirs is the key). Where hard links are not supported, created
  in place with O_EXCL."""
  key = secrets.token_bytes(KEY_BYTES)
  final = root / KEY_FILE
  tmp = root / f".{KEY_FILE}.{secrets.token_hex(6)}.tmp"
  fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o600)
  try:
    with os.fdopen(fd, "wb") as f:
      os.fchmod(f.fileno(), 0o600)
      f.write(key)
    try: os.link(tmp, final)
    except FileExistsError: pass
    except OSError:
      try:
        fd = os.open(final, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as f:
          os.fchmod(f.fileno(), 0o600)
          f.write(key)
      except FileExistsError: pass
  finally: _drop(tmp)


def _load_key(root: Path) -> tuple[bytes | None, str | None]:
  """(root's key, None), or (None, why the cache is refused), or (None, None) when no key can be made (a
  read-only cache: only speed is lost)."""
  path = root / KEY_FILE
  for _ in range(3):
    try: fd, st = _open_regular(path)
    except FileNotFoundError:
      try: _make_key(root)
      except OSError: return None, None
      continue
    except Refused as e: return None, f"its key file {KEY_FILE} is {e.what}"
    except OSError as e: return None, f"its key file {KEY_FILE} cannot be read ({e.strerror or type(e).__name__})"
    try:
      if st.st_uid != os.getuid(): return None, f"its key file {KEY_FILE} is owned by uid {st.st_uid}, not by you"
      if st.st_mode & 0o077: return None, f"its key file {KEY_FILE} has mode {st.st_mode & 0o777:04o}, not 0600"
      key = _read_fd(fd, KEY_BYTES)
      if len(key) != KEY_BYTES: return None, f"its key file {KEY_FILE} does not hold {KEY_BYTES} bytes (remove it)"
      return key, None
    finally: os.close(fd)
  return None, None


def _root(root: Path | None = None) -> tuple[Path, bytes] | None:
  """The cache's root (`root`, default cache_dir()) and its key when the root may be used: a directory (made with
  mode 0700 when missing) owned by the current user, root included, that neither group nor others can write, with
  a sound key file. Otherwise None, said once per directory on stderr (a cache that cannot be made is only slower,
  said nowhere)."""
  if root is None: root = cache_dir()
  if root is None:
    _warn(None, "there is no absolute RULEC_CACHE_DIR, XDG_CACHE_HOME or home directory")
    return None
  try: st = os.stat(root)
  except FileNotFoundError:
    try:
      os.makedirs(root, mode=0o700, exist_ok=True)
      st = os.stat(root)
    except OSError: return None
  except OSError: return None
  uid = os.getuid()
  if not stat.S_ISDIR(st.st_mode): why = "it is not a directory"
  elif st.st_uid != uid: why = f"it is owned by uid {st.st_uid}, not by you (uid {uid})"
  elif st.st_mode & 0o022:
    who = {0o020: "group", 0o002: "others", 0o022: "group and others"}[st.st_mode & 0o022]
    why = f"it is writable by {who} (mode {st.st_mode & 0o777:04o})"
  else: why = None
  if why is not None:
    _warn(root, why)
    return None
  ident = (str(root), st.st_dev, st.st_ino, uid)
  key = _keys.get(ident)
  if key is None:
    key, why = _load_key(root)
    if key is None:
      if why is not None: _warn(root, why)
      return None
    _keys[ident] = key
  return root, key


def _tag(key: bytes, label: str, payload: bytes) -> str:
  """The HMAC-SHA256 of an entry: its format, its name (`label`) and its payload, under the root's key."""
  h = hmac.new(key, f"rulec-cache {FORMAT}\0{label}\0".encode(), hashlib.sha256)
  h.update(payload)
  return h.hexdigest()


# *** kernel and search entries ***

def enabled() -> bool:
  return os.environ.get("RULEC_KERNEL_CACHE", "1").strip().lower() not in ("0", "off", "no", "false")


def directory(device: str) -> Path | None:
  """Where `device`'s entries live (follows RULEC_CACHE_DIR at every call, as tests change it)."""
  root = cache_dir()
  return None if root is None else root / "kernels" / device


def key(*parts: str | bytes) -> str:
  """The digest naming an entry; each part is length-prefixed, so no two lists of parts run together."""
  h = hashlib.sha256()
  for p in parts:
    b = p.encode() if isinstance(p, str) else p
    h.update(len(b).to_bytes(8, "little"))
    h.update(b)
  return h.hexdigest()


def path_of(device: str, digest: str, suffix: str = ".bin") -> Path | None:
  d = directory(device)
  return None if d is None else d / f"{digest}{suffix}"


def _header(key_: bytes, path: Path, payload: bytes) -> bytes:
  label = f"kernels/{path.parent.name}/{path.name}"
  return f"rulec-kernel {FORMAT} {path.stem} {_tag(key_, label, payload)} {len(payload)}\n".encode()


def load(device: str, digest: str, suffix: str = ".bin") -> bytes | None:
  """The payload stored under `digest`, or None (no entry, the cache is off or refused, or the entry fails its
  checks)."""
  if not enabled(): return None
  path = path_of(device, digest, suffix)
  if path is None:
    STATS["misses"] += 1
    return None
  return load_path(path)


def load_path(path: Path) -> bytes | None:
  """The payload of the entry at `path` (`<root>/kernels/<kind>/<digest><suffix>`), or None. The entry is checked
  under its own root's key (which must pass _root()'s checks), whatever RULEC_CACHE_DIR says now."""
  path = Path(os.path.abspath(path))
  got = _root(path.parent.parent.parent) if path.parent.parent.name == "kernels" else None
  if got is None:
    STATS["misses"] += 1
    return None
  try: data = read_regular(path, MAX_BYTES.get(path.suffix, 1 << 20) + _HEADER_BYTES, owner=os.getuid())
  except Refused:
    _drop(path)
    STATS["rejected"] += 1
    return None
  except OSError:
    STATS["misses"] += 1
    return None
  head, nl, payload = data.partition(b"\n")
  if not nl or not hmac.compare_digest(head + nl, _header(got[1], path, payload)):
    _drop(path)
    STATS["rejected"] += 1
    return None
  STATS["hits"] += 1
  return payload


def store(device: str, digest: str, payload: bytes, suffix: str = ".bin") -> None:
  """Write an entry atomically; a cache that cannot be written (read-only, full, refused) only costs speed."""
  if not enabled() or len(payload) > MAX_BYTES.get(suffix, 1 << 20): return
  got = _root()
  path = path_of(device, digest, suffix)
  if got is None or path is None or path.parent.parent.parent != got[0]: return
  try:
    os.makedirs(path.parent, mode=0o700, exist_ok=True)
    write_replacing(path, _header(got[1], path, payload) + payload, mode=0o600)
    STATS["writes"] += 1
  except OSError: pass


def reject(device: str, digest: str, suffix: str = ".bin") -> None:
  """An entry that passed its checks but did not load (the caller rebuilds it): counted, and removed so that no
  other process trips over it before the rebuilt one replaces it."""
  STATS["rejected"] += 1
  STATS["hits"] -= 1
  path = path_of(device, digest, suffix)
  if path is not None: _drop(path)


def load_json(device: str, digest: str) -> dict | None:
  """A kernel entry: a kernel (before rendering) -> what its compiled program is stored under."""
  data = load(device, digest, ".kernel")
  if data is None: return None
  try: out = json.loads(data)
  except ValueError: out = None
  if not isinstance(out, dict):   # a sound tag over bytes that are not a record: dropped
    reject(device, digest, ".kernel")
    return None
  return out


def store_json(device: str, digest: str, value: dict) -> None:
  store(device, digest, json.dumps(value, sort_keys=True).encode(), ".kernel")


# *** matcher entries: generated Python, one file per rule set combination ***

def _matcher_head(key_: bytes, name: str, body: bytes) -> bytes:
  return f"# rulec-cache key={name} hmac={_tag(key_, f'matchers/{name}.py', body)}".encode()


def _read_entry(stem: str, suffix: str, head) -> tuple[Path, bytes] | None:
  """(path, body) of the root-level entry `<stem><suffix>` (a matcher's text or bytecode) whose first line is
  head(key, stem, body): its tag under the root's key. None for a miss; an entry that fails is removed."""
  got = _root()
  if got is None: return None
  path = got[0] / f"{stem}{suffix}"
  try: data = read_regular(path, MAX_BYTES[suffix] + _HEADER_BYTES, owner=os.getuid())
  except Refused:
    _drop(path)
    return None
  except OSError: return None
  first, nl, body = data.partition(b"\n")
  if not nl or not hmac.compare_digest(first, head(got[1], stem, body)):
    _drop(path)
    return None
  return path, body


def _write_entry(stem: str, suffix: str, head, body: bytes) -> None:
  """Write the root-level entry `<stem><suffix>` atomically (a new file renamed into place); a read-only or refused
  cache, or a body over the cap, only costs speed."""
  got = _root()
  if got is None or len(body) > MAX_BYTES[suffix]: return
  try: write_replacing(got[0] / f"{stem}{suffix}", head(got[1], stem, body) + b"\n" + body, mode=0o600)
  except OSError: pass


def load_text(name: str) -> str | None:
  """The body of the matcher entry `name` (the loader's key: hex digits), if its first line names `name` and
  carries the body's tag; None otherwise (a miss; an entry that fails is removed)."""
  if not name.isalnum() or (found := _read_entry(name, ".py", _matcher_head)) is None: return None
  try: return found[1].decode("utf-8")
  except UnicodeDecodeError: return None


def store_text(name: str, src: str) -> None:
  """Write the matcher entry `name` atomically (a new file renamed into place)."""
  if name.isalnum(): _write_entry(name, ".py", _matcher_head, src.encode("utf-8"))


# *** matcher code: the bytecode Python compiled a matcher entry's body to ***
#
# Compiling a matcher's source costs a cold process 0.3-0.9 s (the symbolic rules' module alone is 300 KiB of
# Python); loading the marshalled code object takes milliseconds. A code entry is written beside its text entry,
# under the same rules (tagged, regular files of the user's, capped), and named for the text entry and the
# interpreter's bytecode format (marshal's format follows the Python version), so no other interpreter reads it.

def _code_name(name: str) -> str:
  return key(name, importlib.util.MAGIC_NUMBER, sys.implementation.cache_tag or "")[:32]


def _code_head(key_: bytes, stem: str, body: bytes) -> bytes:
  return f"# rulec-cache code={stem} hmac={_tag(key_, f'matchers/{stem}.code', body)}".encode()


def load_code(name: str):
  """The code object kept for the matcher entry `name`, or None (a miss; an entry that fails its tag is removed).
  Only ever a payload rulec wrote under the user's key: marshal is not safe on bytes from anyone else."""
  if not name.isalnum() or (found := _read_entry(_code_name(name), ".code", _code_head)) is None: return None
  path, body = found
  try: code = marshal.loads(body)
  except (ValueError, EOFError, TypeError): code = None
  if code.__class__.__name__ != "code":   # (a sound tag over bytes that are no code object: dropped)
    _drop(path)
    return None
  return code


def store_code(name: str, code) -> None:
  """Keep the code object compiled from the matcher entry `name` (atomically; a read-only cache costs speed)."""
  if name.isalnum(): _write_entry(_code_name(name), ".code", _code_head, marshal.dumps(code))
