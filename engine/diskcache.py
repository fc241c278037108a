"""rulec's one disk cache: generated rule matchers, compiled kernels and search results, kept so that a later
process loads them instead of making them again. It sits beneath every layer that caches (the rule language's
matchers, codegen's search results, the devices' compiled kernels), so each of them reads and writes entries
the same way, through this module.

Matchers (the rule language's loader) are `<key>.py` files in the root, one comment line naming their key and
their body's sha256, then the body (`load_text`, `store_text`). Kernels and search results are described below.

The CPU device stores object code (what LLVM emitted for a kernel's IR), the CL
device program binaries. An entry's name is the digest of its key: every input
that decides the compiled bytes (the kernel's source text, the target, the
compiler and its version, the options), so an entry is only ever found by a
process that would have compiled the same bytes. Entries live under `kernels/<device>/`
in the cache's root (`cache_dir()`: RULEC_CACHE_DIR, else $XDG_CACHE_HOME/rulec
or ~/.cache/rulec).

An entry is one header line, `rulec-kernel 1 <key digest> <payload sha256> <payload bytes>`,
then the payload. A reader hands the payload on only when all of that matches:
a truncated or altered file, or one written for another key, reads as a miss
(and counts in STATS["rejected"]); the device then compiles and writes the
entry again. Payloads must pass this check before they reach LLVM or an OpenCL
driver, which may abort the process on malformed input instead of raising.
Writes go to a temporary file in the same directory and are renamed into
place, so a reader never sees half an entry, and two processes writing one key
leave one whole entry.

A device may keep two kinds of entry: the compiled payload, keyed by the
source text (`<digest>.bin`), and a kernel entry, keyed by the kernel before
rendering (`<digest>.kernel`, a small JSON record naming the payload's key and
whatever else a launch needs), so that a warm process skips rendering too.

`RULEC_KERNEL_CACHE=0` turns the disk cache off (nothing read or written).
Nothing is ever evicted: entries for old compilers or kernels stay until the
directory is cleared.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path


FORMAT = 1
STATS = {"hits": 0, "misses": 0, "rejected": 0, "writes": 0}


def cache_dir() -> Path:
  """The cache's root: RULEC_CACHE_DIR, else $XDG_CACHE_HOME/rulec or ~/.cache/rulec (read at every call, as tests
  change it)."""
  d = os.environ.get("RULEC_CACHE_DIR")
  return Path(d) if d else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "rulec"


def enabled() -> bool:
  return os.environ.get("RULEC_KERNEL_CACHE", "1").strip().lower() not in ("0", "off", "no", "false")


def directory(device: str) -> Path:
  """Where `device`'s entries live (follows RULEC_CACHE_DIR at every call, as tests change it)."""
  return cache_dir() / "kernels" / device


def key(*parts: str | bytes) -> str:
  """The digest naming an entry; each part is length-prefixed, so no two lists of parts run together."""
  h = hashlib.sha256()
  for p in parts:
    b = p.encode() if isinstance(p, str) else p
    h.update(len(b).to_bytes(8, "little"))
    h.update(b)
  return h.hexdigest()


def path_of(device: str, digest: str, suffix: str = ".bin") -> Path: return directory(device) / f"{digest}{suffix}"


def _header(digest: str, payload: bytes) -> bytes:
  return f"rulec-kernel {FORMAT} {digest} {hashlib.sha256(payload).hexdigest()} {len(payload)}\n".encode()


def load(device: str, digest: str, suffix: str = ".bin") -> bytes | None:
  """The payload stored under `digest`, or None (no entry, the cache is off, or the entry fails its checks)."""
  if not enabled(): return None
  return load_path(path_of(device, digest, suffix))


def load_path(path: Path) -> bytes | None:
  """The payload of the entry at `path` (its name is its key's digest), or None."""
  try: data = Path(path).read_bytes()
  except OSError:
    STATS["misses"] += 1
    return None
  head, nl, payload = data.partition(b"\n")
  if not nl or _header(Path(path).stem, payload) != head + nl:
    STATS["rejected"] += 1
    return None
  STATS["hits"] += 1
  return payload


def store(device: str, digest: str, payload: bytes, suffix: str = ".bin") -> None:
  """Write an entry atomically; a cache that cannot be written (read-only, full) only costs speed."""
  if not enabled(): return
  path = path_of(device, digest, suffix)
  tmp = None
  try:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{digest[:16]}-", suffix=".tmp")
    with os.fdopen(fd, "wb") as f: f.write(_header(digest, payload) + payload)
    os.replace(tmp, path)
    tmp = None
    STATS["writes"] += 1
  except OSError: pass
  finally:
    if tmp is not None:
      try: os.unlink(tmp)
      except OSError: pass


def reject(device: str, digest: str, suffix: str = ".bin") -> None:
  """An entry that passed its checks but did not load (the caller rebuilds it): counted, and removed so that no
  other process trips over it before the rebuilt one replaces it."""
  STATS["rejected"] += 1
  STATS["hits"] -= 1
  try: path_of(device, digest, suffix).unlink()
  except OSError: pass


# *** kernel entries: a kernel (before rendering) -> what its compiled program is stored under ***

def load_json(device: str, digest: str) -> dict | None:
  data = load(device, digest, ".kernel")
  if data is None: return None
  try: out = json.loads(data)
  except ValueError: out = None
  if not isinstance(out, dict):   # a sound checksum over bytes that are not ours: dropped
    reject(device, digest, ".kernel")
    return None
  return out


def store_json(device: str, digest: str, value: dict) -> None:
  store(device, digest, json.dumps(value, sort_keys=True).encode(), ".kernel")


# *** matcher entries: generated Python, one file per rule set combination ***

def load_text(path: Path, key: str) -> str | None:
  """A matcher entry's body, if its first line names `key` and the body's sha256."""
  try: text = path.read_text()
  except OSError: return None
  head, _, body = text.partition("\n")
  want = f"# rulec-cache key={key} body={hashlib.sha256(body.encode()).hexdigest()}"
  return body if head == want else None


def store_text(path: Path, key: str, src: str) -> None:
  """Write a matcher entry atomically (a temporary file renamed into place)."""
  try:
    path.parent.mkdir(parents=True, exist_ok=True)
    head = f"# rulec-cache key={key} body={hashlib.sha256(src.encode()).hexdigest()}"
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f: f.write(head + "\n" + src)
    os.replace(tmp, path)
  except OSError: pass  # a read-only cache only costs speed
