"""`import tinygrad` running rulec: tinygrad model code imported unchanged.

    import rulec.tinygrad_alias as alias
    alias.install()                 # from now on `from tinygrad import Tensor` is rulec's Tensor
    from tinygrad.nn.state import torch_load
    ...
    alias.uninstall()               # (or `with alias.installed(): ...`)

install() puts modules under tinygrad's names into sys.modules: `tinygrad` (Tensor, TinyJit, dtypes, nn, Device,
GlobalCounters, Context, getenv, fetch, function, Variable, UOp), `tinygrad.tensor`, `tinygrad.helpers`
(rulec.helpers), `tinygrad.dtype`, `tinygrad.device`, `tinygrad.engine.jit`, `tinygrad.function`, `tinygrad.nn`,
`tinygrad.nn.state`, `tinygrad.nn.optim`, `tinygrad.nn.datasets`, `tinygrad.llm.gguf` and `tinygrad.uop.ops`. A name
tinygrad has and rulec does not is an ImportError at the import, as for any missing name. It refuses to shadow a
real tinygrad that is imported already."""
from __future__ import annotations

import contextlib
import sys
import types
import typing
from typing import Iterator

from rulec import device as _device
from rulec import helpers as _helpers
from rulec import nn as _nn
from rulec.engine.ir.dtypes import DType, dtypes
from rulec.engine.ir.ops import Ops
from rulec.engine.ir.uop import UOp
from rulec.engine.jit import JitError, TinyJit
from rulec.engine.tensor import Tensor
from rulec.engine.tensor.args import promote_types, to_dtype
from rulec.nn import datasets as _datasets
from rulec.nn import gguf as _gguf
from rulec.nn import optim as _optim
from rulec.nn import state as _state

__all__ = ["install", "uninstall", "installed", "is_installed"]

_MARK = "__rulec_alias__"


def _module(name: str, doc: str, package: bool = False, **names: object) -> types.ModuleType:
  m = types.ModuleType(name, doc)
  if package: m.__path__ = []   # (a package: `import tinygrad.x` of a name not provided is a ModuleNotFoundError)
  setattr(m, _MARK, True)
  for k, v in names.items(): setattr(m, k, v)
  return m


def _modules() -> dict[str, types.ModuleType]:
  h = _helpers
  top = dict(Tensor=Tensor, TinyJit=TinyJit, dtypes=dtypes, nn=_nn, Device=_device.Device, GlobalCounters=h.GlobalCounters,
             Context=h.Context, getenv=h.getenv, fetch=h.fetch, function=h.function, Variable=h.Variable, UOp=UOp)
  mods = {
    "tinygrad": _module("tinygrad", "rulec under tinygrad's name (rulec.tinygrad_alias)", package=True, **top),
    "tinygrad.tensor": _module("tinygrad.tensor", "tinygrad.tensor: rulec's Tensor", Tensor=Tensor, dtypes=dtypes,
                               cast=typing.cast),
    "tinygrad.helpers": h,
    "tinygrad.dtype": _module("tinygrad.dtype", "tinygrad.dtype: rulec's dtypes", dtypes=dtypes, DType=DType,
                              to_dtype=to_dtype, least_upper_dtype=promote_types),
    "tinygrad.device": _module("tinygrad.device", "tinygrad.device: rulec's devices", Device=_device.Device),
    "tinygrad.engine": _module("tinygrad.engine", "tinygrad.engine", package=True),
    "tinygrad.engine.jit": _module("tinygrad.engine.jit", "tinygrad.engine.jit: rulec's TinyJit", TinyJit=TinyJit,
                                   JitError=JitError),
    "tinygrad.function": _module("tinygrad.function", "tinygrad.function: @function, inlined", function=h.function),
    "tinygrad.nn": _nn, "tinygrad.nn.state": _state, "tinygrad.nn.optim": _optim, "tinygrad.nn.datasets": _datasets,
    "tinygrad.llm": _module("tinygrad.llm", "tinygrad.llm", package=True),
    "tinygrad.llm.gguf": _module("tinygrad.llm.gguf", "tinygrad.llm.gguf: rulec's GGUF loader", gguf_load=_gguf.gguf_load,
                                 ggml_data_to_tensor=_gguf.ggml_data_to_tensor),
    "tinygrad.uop": _module("tinygrad.uop", "tinygrad.uop", package=True),
    "tinygrad.uop.ops": _module("tinygrad.uop.ops", "tinygrad.uop.ops: rulec's UOp and Ops (rulec's IR, not tinygrad's)",
                                UOp=UOp, Ops=Ops, Variable=UOp, sint=int | UOp),   # (Variable: the type, as tinygrad's)
  }
  # (not ("tinygrad", "function"): as in tinygrad, whose __init__ rebinds the name after importing the submodule,
  # `tinygrad.function` is the decorator, not the module `tinygrad.function`)
  for parent, child in [("tinygrad", "tensor"), ("tinygrad", "helpers"), ("tinygrad", "dtype"), ("tinygrad", "device"),
                        ("tinygrad", "engine"), ("tinygrad.engine", "jit"), ("tinygrad", "llm"),
                        ("tinygrad.llm", "gguf"), ("tinygrad", "uop"), ("tinygrad.uop", "ops")]:
    setattr(mods[parent], child, mods[f"{parent}.{child}"])
  return mods


def is_installed() -> bool:
  """Whether `tinygrad` names rulec now."""
  return getattr(sys.modules.get("tinygrad"), _MARK, False)


def install() -> None:
  """Make `import tinygrad` (and the submodules above) give rulec. RuntimeError if the real tinygrad is imported."""
  if is_installed(): return
  real = sorted(k for k in sys.modules if k == "tinygrad" or k.startswith("tinygrad."))
  if real: raise RuntimeError(f"tinygrad itself is imported already ({real[0]}); install the alias before anything imports it")
  sys.modules.update(_modules())


def uninstall() -> None:
  """Take the alias out of sys.modules (a later `import tinygrad` finds the real one, if installed)."""
  if not is_installed(): return
  for k in [k for k in sys.modules if k == "tinygrad" or k.startswith("tinygrad.")]: del sys.modules[k]


@contextlib.contextmanager
def installed() -> Iterator[None]:
  """`with installed():` the alias for the block (modules imported under it keep what they imported)."""
  was = is_installed()
  install()
  try: yield
  finally:
    if not was: uninstall()

