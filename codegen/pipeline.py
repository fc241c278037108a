"""The one compile pipeline every device calls: a scheduled kernel validated, its decompositions applied
(rules/decomp.rules), optimized for the device (codegen/opt) and rendered by the device's backend (LLVM IR for the
CPU, OpenCL C for CL). Devices compile and launch what comes out; they do not run these steps themselves."""
from __future__ import annotations

from collections.abc import Callable

import attrs

from rulec.codegen import llvmir, opencl
from rulec.codegen.decomp import decomposed
from rulec.codegen.online import online
from rulec.codegen.opt import Action, optimize
from rulec.engine.ir.kernel import Kernel, validate


@attrs.frozen
class Lowered:
  low: Kernel                     # decomposed: what the optimizer was given (its structure names the kernel)
  kernel: Kernel                  # optimized: what the renderer prints
  actions: tuple[Action, ...]     # the optimizer's actions


def lower(kernel: Kernel, device: str, target, optional: frozenset = frozenset(),
          timer: Callable[[Kernel], float] | None = None) -> Lowered:
  """Validate (a ValueError naming every problem; after each step), decompose (`optional`: the optional decompositions the device
  asks for) and optimize for `device` ("CPU" or "CL") and its `target`; `timer` times candidates for
  RULEC_SEARCH."""
  # validated again after each rewrite that can touch it: a user's rules directory may layer rules over decomp
  # (and the optimizer is large); what reaches a renderer has only the node kinds and arg types the IR allows
  validate(kernel)
  low = decomposed(online(kernel), optional)  # validates what the online and decomp rules made
  opt, actions = optimize(low, device, target, timer=timer)
  validate(opt)
  return Lowered(low, opt, actions)


def render(kernel: Kernel, device: str, target=None, vars=None):
  """An optimized kernel as its device's source: for the CPU, (LLVM IR text of a function named `kernel`, the range
  split across threads or None); for CL, an opencl.Rendered for `target`. `vars`: the variables (DEFINE_VAR) the
  program takes as scalar arguments, in launch order: the scheduled kernel's `vars` (the optimized kernel's when
  None; a rewrite that dropped one must not shift the others' positions)."""
  if device == "CPU": return llvmir.render(kernel, "kernel", vars)
  if device == "CL": return opencl.render(kernel, target, vars=vars)
  raise ValueError(f"no renderer for device kind {device!r}")
