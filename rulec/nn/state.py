"""Model state: get_state_dict / get_parameters walk a model's attributes, load_state_dict writes values into
its tensors, safe_save / safe_load keep a state dict in a .safetensors file (through safetensors.numpy, so the
files are the format every safetensors reader opens). Weights from elsewhere: torch_load reads PyTorch checkpoints
without torch and without running their pickles (rulec/nn/torchfile.py), gguf_load reads GGUF files and
dequantises them (rulec/nn/gguf.py).

Keys are tinygrad's: attribute names and list/dict positions joined by '.', such as `layers.0.weight`."""
from __future__ import annotations

import os
import types
from collections import OrderedDict
from typing import Any

import numpy as np

from rulec.engine.tensor import Tensor
from rulec.nn.gguf import ggml_data_to_tensor, gguf_load
from rulec.nn.torchfile import CheckpointError, UnsafeCheckpointError, torch_load

__all__ = ["get_state_dict", "get_parameters", "load_state_dict", "safe_save", "safe_load", "torch_load", "gguf_load",
           "ggml_data_to_tensor", "StateDictError", "CheckpointError", "UnsafeCheckpointError"]


class StateDictError(KeyError, ValueError):
  """A state dict that does not fit the model: the message names the missing, unexpected or mis-shaped keys.
  A KeyError (what tinygrad raises for a missing key) and a ValueError (its mis-shaped key)."""
  def __str__(self) -> str: return str(self.args[0]) if self.args else ""


def _walk(obj: Any, prefix: str, out: dict[str, Tensor], path: set[int]) -> None:
  if isinstance(obj, Tensor):
    out[prefix.strip(".")] = obj
    return
  # a cycle (a layer pointing at its parent) is walked once; classes and modules held as attributes are not state
  if id(obj) in path or isinstance(obj, (type, types.ModuleType)): return
  key = id(obj)
  if hasattr(obj, "_asdict"): obj = obj._asdict()   # namedtuple
  elif isinstance(obj, OrderedDict): obj = dict(obj)
  elif hasattr(obj, "__dict__"): obj = vars(obj)
  if isinstance(obj, (list, tuple)): items = [(str(i), x) for i, x in enumerate(obj)]
  elif isinstance(obj, dict): items = [(str(k), x) for k, x in obj.items()]
  else: return
  path.add(key)
  for k, x in items: _walk(x, f"{prefix}{k}.", out, path)
  path.discard(key)


def get_state_dict(obj: Any, prefix: str = "", tensor_type: type = Tensor) -> dict[str, Tensor]:
  """Every Tensor reachable from obj through attributes (`__dict__`), lists, tuples, namedtuples and dicts,
  keyed by its path (`l1.weight`, `layers.0.bias`), prefix first; in attribute order."""
  if tensor_type is not Tensor: raise TypeError("get_state_dict: rulec has one tensor type, Tensor")
  out: dict[str, Tensor] = {}
  _walk(obj, prefix, out, set())
  return out


def get_parameters(obj: Any) -> list[Tensor]:
  """The tensors of get_state_dict(obj), in order (BatchNorm's running statistics included, as tinygrad; an
  optimizer realizes those without updating them, they have requires_grad=False)."""
  return list(get_state_dict(obj).values())


def _check(model_sd: dict[str, Tensor], state_dict: dict[str, Any], strict: bool) -> None:
  """Raise StateDictError naming every problem at once: missing and unexpected keys (strict only) and
  mis-shaped keys with both shapes (always: nothing sensible can be loaded into them)."""
  problems = []
  if strict:
    if missing := [k for k in model_sd if k not in state_dict]: problems.append(f"missing keys: {missing}")
    if unexpected := [k for k in state_dict if k not in model_sd]: problems.append(f"unexpected keys: {unexpected}")
  bad = [f"{k}: model {v.shape}, state dict {tuple(np.shape(state_dict[k]))}" for k, v in model_sd.items()
         if k in state_dict and not _fits(v.shape, tuple(np.shape(state_dict[k])))]
  if bad: problems.append("shape mismatch in " + "; ".join(bad))
  if problems: raise StateDictError("load_state_dict: " + ". ".join(problems))


def _fits(want: tuple, got: tuple) -> bool: return want == got or {want, got} == {(), (1,)}


def load_state_dict(model: Any, state_dict: dict[str, Any], strict: bool = True, verbose: bool = True,
                    consume: bool = False, realize: bool = True) -> list[Tensor]:
  """Write each state_dict value into the model's tensor of the same key (assign: the tensors keep their
  identity, so optimizers holding them see the new values); returns the loaded tensors.

  strict: every model key must be there and no other key (StateDictError lists them); otherwise keys not in
  both are skipped. A mis-shaped key always raises (shapes () and (1,) pass for each other, as tinygrad).
  Values may be Tensors or arrays; they are cast to the model tensor's dtype and moved to its device.
  consume: delete the loaded keys from state_dict. realize: carry out the writes now (in one realize)."""
  if not isinstance(state_dict, dict): raise TypeError(f"load_state_dict: state_dict must be a dict, got {type(state_dict).__name__}")
  model_sd = get_state_dict(model)
  _check(model_sd, state_dict, strict)
  keys = [k for k in model_sd if k in state_dict]
  bar = _progress(keys, verbose)
  loaded = []
  for k in bar:
    v, new = model_sd[k], state_dict[k]
    new = new if isinstance(new, Tensor) else Tensor(np.asarray(new), device=v.device)
    if new.shape != v.shape: new = new.reshape(v.shape)
    v.assign(new.to(v.device).cast(v.dtype))
    if consume: del state_dict[k]
    loaded.append(v)
  if realize and loaded: Tensor.realize(*loaded)
  return loaded


def _progress(keys: list[str], verbose: bool):
  if not verbose: return keys
  from tqdm import tqdm
  return tqdm(keys, desc="loading weights", disable=None)   # (None: no bar when stderr is not a terminal)


def safe_save(tensors: dict[str, Tensor], fn: str | os.PathLike, metadata: dict[str, str] | None = None) -> None:
  """Save a state dict to fn as a .safetensors file (realizes the tensors); metadata is a str -> str dict
  stored in the header's `__metadata__`."""
  if not isinstance(tensors, dict): raise TypeError(f"safe_save: tensors must be a dict of name -> Tensor, got {type(tensors).__name__}")
  for k in tensors:
    if not isinstance(k, str): raise TypeError(f"safe_save: key {k!r} is not a str")
  if metadata is not None:
    bad = [k for k, v in metadata.items() if not (isinstance(k, str) and isinstance(v, str))]
    if bad: raise TypeError(f"safe_save: metadata must map str to str (the safetensors format); not so for {bad}")
  from safetensors.numpy import save_file
  for k, t in tensors.items():
    if not isinstance(t, Tensor): raise TypeError(f"safe_save: {k!r} is a {type(t).__name__}, not a Tensor")
  if tensors: Tensor.realize(*tensors.values())   # one realize for all of them, before reading any
  save_file({k: t.numpy() for k, t in tensors.items()}, os.fspath(fn), metadata=metadata)


def safe_load(fn: str | os.PathLike | Tensor) -> dict[str, Tensor]:
  """Load a .safetensors file (a path, or a Tensor of the file's bytes) as a dict of name -> Tensor (on the default
  device). The order is the file's layout, which safetensors chooses, not the order they were saved in."""
  from safetensors import SafetensorError
  from safetensors.numpy import load, load_file
  where = "<tensor>" if isinstance(fn, Tensor) else repr(os.fspath(fn))
  try: arrays = load(fn.numpy().tobytes()) if isinstance(fn, Tensor) else load_file(os.fspath(fn))
  except SafetensorError as e: raise ValueError(f"safe_load: {where} is not a safetensors file: {e}") from None
  return {k: Tensor(a) for k, a in arrays.items()}
