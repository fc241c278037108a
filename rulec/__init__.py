"""rulec: a tensor compiler whose rewrites are .rules files.

The front door: `Tensor` (tinygrad's API), `nn` (modules, `nn.optim`, `nn.state`), `TinyJit`, and the rule
library and graph rewriting."""
from engine.dtypes import dtypes
from engine.lang.capability import rule_helper
from engine.lang.diagnostics import RuleError
from engine.lang.loader import load_library, matcher
from engine.jit import JitError, TinyJit, jit
from engine.ops import Ops
from engine.rewrite import RewriteLoopError, graph_rewrite
from engine.tensor import Tensor
from engine.tensor.autograd import no_grad
from engine.uop import UOp
from rulec import nn
from rulec import trace_view as _trace_view
from engine import trace as _trace

_trace.exit_writer = _trace_view.write_html   # RULEC_TRACE=1 writes the HTML page at exit (engine/trace.py)

__all__ = ["Tensor", "UOp", "Ops", "dtypes", "graph_rewrite", "load_library", "matcher", "RuleError", "RewriteLoopError",
           "rule_helper", "no_grad", "TinyJit", "jit", "JitError", "nn"]
