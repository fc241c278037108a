"""What a cached compilation was made by: a digest of the code and the rules that turn a kernel into source text.

Kernel entries and search results on disk (engine/diskcache.py) carry it in their keys, so an edit to the engine,
codegen or runtime, or to a rules file (the user's layered rules included), retires them; object code entries,
keyed by the source text itself, stay valid."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from rulec.engine import diskcache
from rulec.engine.lang.loader import load_library

_CODE: list[str] = []
_CODE_DIRS = ("engine", "codegen", "runtime")


def code_digest() -> str:
  """The digest of the Python of the engine, codegen and runtime packages (read once per process) and of the rule
  library as it is now (its files, the user's layered rules included, and its compiler)."""
  if not _CODE:
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for d in _CODE_DIRS:
      for f in sorted((root / d).rglob("*.py")):
        h.update(str(f.relative_to(root)).encode())
        h.update(f.read_bytes())
    _CODE.append(h.hexdigest())
  # (and the switches that change what the optimizer makes of a kernel: RULEC_MERGE_REDUCE_RANGES, codegen/opt)
  return diskcache.key(_CODE[0], load_library().digest, "merge=" + os.environ.get("RULEC_MERGE_REDUCE_RANGES", "1"))
