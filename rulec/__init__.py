"""rulec: a tensor compiler whose rewrites are .rules files.

The front door: `Tensor` (tinygrad's API), `nn` (modules, `nn.optim`, `nn.state`), `TinyJit`, what tinygrad code
imports beside them (`Context`, `GlobalCounters`, `Device`, `getenv`, `function`: rulec/helpers.py, rulec/device.py;
`import rulec.tinygrad_alias` to run such code unchanged), and the rule library and graph rewriting."""
import os as _os

# In a checkout the layers are the repository's top-level folders (engine/, codegen/, runtime/, rules/), beside
# this one; the wheel installs them inside this package (pyproject.toml's package-dir). Adding the repository
# root to this package's path makes `rulec.engine` and the rest import the same way in both.
_ROOT = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if not _os.path.isdir(_os.path.join(__path__[0], "engine")) and _os.path.isfile(_os.path.join(_ROOT, "engine", "ir", "uop.py")):
  __path__.append(_ROOT)

from rulec.engine.ir.dtypes import dtypes  # noqa: E402 (the package path above comes first)
from rulec.engine.ir.ops import Ops  # noqa: E402
from rulec.engine.ir.rewrite import RewriteLoopError, graph_rewrite  # noqa: E402
from rulec.engine.ir.uop import UOp  # noqa: E402
from rulec.engine.lang.capability import rule_helper  # noqa: E402
from rulec.engine.lang.diagnostics import RuleError  # noqa: E402
from rulec.engine.lang.loader import load_library, matcher  # noqa: E402
from rulec.engine.tensor import Tensor  # noqa: E402
from rulec.engine.tensor.tensor import no_grad  # noqa: E402
from rulec.engine.jit import JitError, TinyJit, jit  # noqa: E402
from rulec.engine import trace as _trace  # noqa: E402
from rulec import nn  # noqa: E402
from rulec.helpers import Context, GlobalCounters, Variable, fetch, function, getenv  # noqa: E402
from rulec.device import Device  # noqa: E402
from rulec import trace_view as _trace_view  # noqa: E402

_trace.exit_writer = _trace_view.write_html   # RULEC_TRACE=1 writes the HTML page at exit (engine/trace.py)

__all__ = ["Tensor", "UOp", "Ops", "dtypes", "graph_rewrite", "load_library", "matcher", "RuleError", "RewriteLoopError",
           "rule_helper", "no_grad", "TinyJit", "jit", "JitError", "nn", "Context", "GlobalCounters", "Device", "getenv",
           "fetch", "function", "Variable"]
