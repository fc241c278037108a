"""Writes docs/api.md, the Tensor API reference, from the methods' docstrings.

    python docs/api_reference.py          # rewrite docs/api.md
    python docs/api_reference.py --check  # exit 1 if docs/api.md is stale or a public method has no docstring

One section per family module of engine/tensor/ (the order of the mixins in the Tensor class), one line per
public name: its signature and the first line of its docstring. tests/frontend/test_api_reference.py runs --check."""
from __future__ import annotations

import inspect
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rulec.engine.tensor import Tensor  # noqa: E402

OUT = REPO / "docs" / "api.md"
TITLES = {"TensorBase": "Core: construction, realizing, data, assign", "CreationMixin": "Creation and initialisers",
          "ElementwiseMixin": "Elementwise operators, comparisons, casts, unary math", "MathMixin": "More math",
          "ReduceMixin": "Reductions", "ScansMixin": "Cumulative scans", "MovementMixin": "Movement and basic indexing",
          "ShapeMixin": "Shape functions", "IndexingMixin": "Gather, scatter and advanced indexing",
          "SortingMixin": "Sorting", "NNMixin": "Linear algebra and neural-network functions", "LinalgMixin": "Matrix decompositions",
          "ActivationsMixin": "Activations", "LossesMixin": "Losses", "AutogradMixin": "Autograd",
          "MultiMixin": "Several devices"}


# attributes held in slots (no docstring of their own) and operators, described here
ATTRIBUTES = {"uop": "the tensor-level UOp graph of the value", "device": "the device the value lives on (a tuple of devices for a sharded tensor)",
              "grad": "the accumulated gradient (a Tensor, or None); see backward()",
              "requires_grad": "None (any float tensor gets a gradient), True, or False (excluded from autograd)",
              "is_param": "tinygrad 0.14's optimizer flag: True (every tensor starts so) means an optimizer given the "
                          "tensor updates it, False that it only realizes it (a buffer); set with is_param_()"}
OPERATORS = {"__add__": "x + y", "__sub__": "x - y", "__mul__": "x * y", "__truediv__": "x / y (true division)",
             "__floordiv__": "x // y (floor division)", "__mod__": "x % y (floor modulo)", "__pow__": "x ** y",
             "__and__": "x & y (bitwise and, logical for bool)", "__or__": "x | y", "__xor__": "x ^ y",
             "__lshift__": "x << y", "__rshift__": "x >> y", "__invert__": "~x (bitwise not)", "__pos__": "+x (itself)",
             "__neg__": "-x", "__matmul__": "x @ y (matmul)", "__lt__": "x < y", "__le__": "x <= y", "__gt__": "x > y",
             "__ge__": "x >= y", "__eq__": "x == y (elementwise)", "__ne__": "x != y (elementwise)", "__abs__": "abs(x)",
             "__repr__": "repr(x): shape, dtype and device (does not realize)"}


# tinygrad 0.14 Tensor names rulec does not have, and why (tests/frontend/test_api_reference.py checks this list
# against a snapshot of tinygrad's names: every name is either here or on rulec's Tensor)
LEFT_OUT = {
  "threefry": "rulec draws random numbers on the host (numpy's generator); no THREEFRY kernel is rendered",
  "random_bits": "tinygrad's counter-based bits are built on threefry (above)",
  "const": "a tinygrad internal (a constant UOp for a value); rulec's is the module-level rulec.engine.tensor.uops.const",
  "hash": "tinygrad's own tensor hash (a keccak tree), not a tensor operation; left for later",
  "keccak": "SHA-3 over the last axis: needs 64-bit rotations rulec's backends do not render yet; left for later",
  "invalids": "tinygrad's Invalid value (an index-validity marker) has no counterpart in rulec's IR",
  "custom_kernel": "kernels written in tinygrad's UOps: rulec's kernels come from its rules, not user UOp code",
  "call": "tinygrad's function-call UOps (graph functions); rulec has no call boundary in its IR",
  "callify": "as call",
  "as_param": "a parameter slot of tinygrad's function calls (as call); rulec's `@function` inlines its body instead",
  "linear_with_vars": "tinygrad's LINEAR schedule UOp with symbolic variables; rulec's schedule is Tensor.schedule()",
  "schedule_linear": "as linear_with_vars",
  "from_blob": "wraps a raw memory pointer: unsafe, and rulec owns its buffers; copy from numpy instead",
  "from_url": "downloads a file: rulec reads nothing from the network",
  "decode_hevc_frame": "HEVC video decoding on tinygrad's hardware decoders: out of scope",
  "image_conv2d": "tinygrad's image (texture) dtype path for Qualcomm GPUs: image dtypes are out of scope",
  "image_dot": "as image_conv2d",
}


# what tinygrad code imports besides Tensor (written here, not generated: these are modules, not Tensor methods)
BEYOND_TENSOR = """
## Beyond Tensor: what tinygrad model code imports besides

`from rulec import getenv, Context, GlobalCounters, Device, TinyJit, dtypes, function, Variable, fetch` gives what
`from tinygrad import ...` gives; the rest of `tinygrad.helpers` (Timing, Profiling, colored, tqdm, trange, prod,
flatten, dedup, argfix, round_up, partition, get_child, the flags) is `rulec.helpers`. To run a tinygrad model file
unchanged, `import rulec.tinygrad_alias; rulec.tinygrad_alias.install()` first: `tinygrad`, `tinygrad.tensor`,
`tinygrad.helpers`, `tinygrad.dtype`, `tinygrad.device`, `tinygrad.engine.jit`, `tinygrad.function`, `tinygrad.nn`
(with `.state`, `.optim`, `.datasets`), `tinygrad.llm.gguf` and `tinygrad.uop.ops` then import rulec (`uninstall()`
undoes it; it refuses to shadow a real tinygrad already imported). A name rulec lacks is an ImportError at the import.
`tinygrad.nn.datasets`' `mnist(device=None, fashion=False, path=None)` and `cifar(device=None, path=None)` read the
published files from the folder `path` (uint8 tensors, images NCHW, as tinygrad's); without it they raise as `fetch`.

- `getenv(key, default=0)`: the environment variable in the default's type, cached per (key, default) as
  tinygrad's (`getenv.cache_clear()` rereads).
- `Context(**flags)` (a context manager and decorator) sets flags for its block and restores them, an unset
  environment variable included. tinygrad's flags are of three kinds in rulec:

  | flags | in rulec |
  |---|---|
  | `DEBUG` | `RULEC_DEBUG` (rulec's own debug lines at that level, not tinygrad's) |
  | `BEAM` | `RULEC_SEARCH` (BEAM=n searches kernel optimisations timing each candidate n times; not a beam width) |
  | `JIT` | `RULEC_JIT` (JIT=0 runs TinyJit functions plainly) |
  | `TRAINING` | `Tensor.training` (dropout, BatchNorm, optimizer steps) |
  | `DEV` | `RULEC_DEVICE`, the default device (`Context(DEV="CL")`) |
  | `RING`, `NUM_CPU_THREADS` | `RULEC_RING`, `RULEC_THREADS` |
  | `WINO` | `RULEC_WINOGRAD`: 1 computes 3x3, stride-1 float32 convolutions of 16 or more channels as Winograd's F(2x2, 3x3) on any device; off otherwise (engine/tensor/winograd.py; docs/architecture.md says what it measured) |
  | `NOOPT`, `TC`, `TC_OPT`, `TC_SELECT`, `NOLOCALS`, `SPLIT_REDUCEOP`, `NO_MEMORY_PLANNER`, `LRU`, `CACHELEVEL`, `IGNORE_BEAM_CACHE`, `CCACHE`, `SCACHE`, `VIZ`, `PROFILE`, `TRACEMETA`, `CAPTURING`, `NO_COLOR`, `JIT_BATCH_SIZE`, `FUSE_OPTIM`, `TRANSCENDENTAL`, `ALLOW_TF32`, `DISABLE_FAST_IDIV`, `USE_ATOMICS`, `TUPLE_ORDER`, `VALIDATE_WITH_CPU`, `CAPTURE_PROCESS_REPLAY`, `SPEC`, `CHECK_OOB`, `PCONTIG`, `DEBUG_RANGEIFY`, `ALLOW_DEVICE_USAGE`, `MAX_BUFFER_SIZE`, `MAX_KERNEL_BUFFERS`, `ALL2ALL`, `ALLREDUCE_CAST`, `PARALLEL` | accepted and held, no effect: tuning and diagnostics switches rulec has no counterpart of (no value depends on them) |
  | `IMAGE`, `FLOAT16`, `OPENPILOT_HACKS`, `DEFAULT_FLOAT`, `DEFAULT_INT`, `EMULATED_DTYPES`, `DISALLOW_BROADCAST`, `NULL_ALLOW_COPYOUT` | only their default may be set: another value raises NotImplementedError (they would change values in ways rulec does not) |

  A name that is no flag raises ContextError (a KeyError, as tinygrad's). `ContextVar(key, default)` makes a flag of
  the program's own; `DEBUG >= 2`, `if BEAM:` compare a flag's value.
- `GlobalCounters`: counted from every kernel rulec runs (TinyJit replays included), since `reset()`:
  `kernel_count` (copies between devices count one each, as tinygrad's), `global_ops` (an estimate: each value op
  once per iteration of the loops its value depends on, a reduce once per iteration; a matmul is 2*M*N*K),
  `global_mem` (bytes of the buffers each kernel reads and writes, once per buffer), `time_sum_s` (host seconds
  running them; on CL, enqueueing them). `mem_used` / `mem_used_per_device`: bytes of allocated buffers now
  (the peak since a point: `rulec.runtime.buffer.reset_peak()`, then `memory_peak()`).
- `TinyJit`: as tinygrad's (engine/jit.py's docstring has the rules). Its capture's intermediates share buffers
  where their lifetimes allow (engine/memory_plan.py, as tinygrad's memory planner), and the capture clears the
  `.grad` its call left on tensors unless the function returns it: a replay runs no Python, so it would never
  update them (tinygrad leaves them as stale graphs). Return a gradient to read it after each call.
- `Device`: `Device.DEFAULT` (RULEC_DEVICE, else CPU; assigning it raises, as in tinygrad 0.14: use
  `Context(DEV=...)`), `Device[name]` with `.device`, `.renderer.supported_dtypes()` (every Tensor dtype, bfloat16
  included; float64 only on an OpenCL device with cl_khr_fp64) and `.synchronize()`, `Device.canonicalize(name)`,
  `Device.get_available_devices()`. `Device["CL"]` without OpenCL raises RuntimeError.
- `@function` / `@function(precompile=True)`: rulec has no call boundary in its IR, so the body is inlined (the
  same values, gradients and kernels as a plain call); the result must be a Tensor or a tuple of them, as tinygrad
  checks. `grad_fxn=` raises NotImplementedError.
- `Variable(name, min, max)`: tinygrad's `UOp.variable`; `.bind(value)` gives a value that shapes, offsets and
  TinyJit take, specialised to that value (next section).
- `fetch(url)`: rulec reads nothing from the network; it raises NotImplementedError (pass the loaders a path).

## Symbolic shapes (`Variable`): offsets and sizes as kernel arguments

tinygrad decodes with a KV cache by binding the position to a symbolic `Variable` (`Variable("start_pos", 1,
1023).bind(n)`, LLaMA's and GPT-2's JIT path). rulec takes that code unchanged: a bound Variable used as a slice
offset or a slice size stays in the graph, the scheduler takes its value out (engine/sched/variables.py), the
kernels take it as an argument, and one schedule, one set of compiled kernels and one TinyJit capture serve every
value. tinygrad's examples/gpt2.py and extra/models/llama.py decode on rulec with their step compiled once
(bench/generate.py `--only rulec-tgfile`).

- The Variable: `Variable(name, min, max)` is `UOp.variable(name, min, max)` (both spellings, as tinygrad 0.14, and
  `tinygrad.uop.ops.Variable` is the UOp type) and makes a DEFINE_VAR node. `.bind(v)` gives a BIND node; a value
  outside [min, max] raises AssertionError (`bind 11 not in range [1, 10]`, tinygrad's class and text), a non-int
  TypeError. `.unbind()` is `(var, value)`, `.unbind_all()` `(expression with the Variables, {var: value})`,
  `.variables()`, `.expr` the name, `.vmin` / `.vmax` the Variable's range (bound or not, as tinygrad's), `.val`
  the bound value (tinygrad 0.14 has `.val` for constants only), `.render()` tinygrad's text: `(start_pos+1)`,
  `(start_pos+-1)`, `(start_pos*2)`, `(start_pos<3)`.
- Expressions: `+ - * // %` with ints (either side) and other Variables; `< <= > >=` build comparisons, and
  `bool()` of one is its truth when the bound values or the range decide it (`if start_pos > 0:` in LLaMA's
  attention), else ValueError (tinygrad's). `int()` / `operator.index()` of a bound expression is its value
  (tinygrad's raises ValueError for a bound Variable: its value stays symbolic there); of an unbound one ValueError
  (`eval failed to be a single number, range is 1 to 10 in start_pos`, naming the Variable to bind). `==` and `!=`
  compare identity (rulec's UOps are dict keys): `b != 3` is True where tinygrad builds an expression.
- Kept symbolic: a slice or `shrink` bound that is a bound expression of the form `a*v + b` (sums of Variables
  times ints plus an int), on one device, when the slice fits the axis for every value in the Variables' ranges:
  - an **offset** (the size does not depend on the value): `cache[:, start_pos:start_pos+seqlen]` (reads, and
    writes through it: `.assign(v)`, `t[:, b] = v`), `x[:, tokens]`, GPT-2's `wte.shrink(((tokens, tokens+1),
    None))`. The shape is ints, as always.
  - a **size** (from an int start): `cache[:, 0:start_pos+seqlen]`. The axis has its **largest size** in `.shape`
    (here `start_pos.vmax + seqlen`), where tinygrad's shape holds the expression; `UOp.sizes` records the real
    one. The elements past it are not part of the value: every reduction over the axis (sum, max, min, mean, var,
    softmax, argmax, a matmul over it) skips them, and reading the tensor (`numpy()`, `tolist()`) gives the bound
    size. `reshape` and `expand` take the bound expression for that axis (`keys.reshape(bs, start_pos+1, ...)`);
    a reshape may keep the axis or merge it with the axes after it. Errors (ValueError naming the Variable): pad,
    flip or shrink such an axis, a reshape that splits it or merges it inside, assigning through such a view.
    Gradients flow through both kinds (zero past the size).
  - a constant **pad** by bound amounts whose sum per axis is an int: `x.pad(((p, n - p), None))` (the value
    moves, the shape does not), with any fill value.
  - a **scalar** in arithmetic and comparisons with tensors: `x * start_pos`, `Tensor.arange(n) <= start_pos`
    (any bound int expression; a weak int, as a Python int: `Tensor([1, 2]) + b` is int32).

  Kernels over a size run over the largest size with the elements past the bound one masked, except that a
  reduce over the size in a plain loop stops at it (its guard `r < p + 1` bounds the loop: codegen/scoped.py
  `guard_end`, on the CPU and in OpenCL); a reduction a GPU splits across a work-group, and the loops that store
  over the size, still run to the largest size.
- Specialised: every other use of a bound value is its int, so the graph, its schedule and its kernels are built
  for that value: a range that does not guarantee the bounds (`Variable("p", 0, 99)` slicing an axis of 10: the
  value is checked), a slice with a step, an expression that is not `a*v + b`, a pad that changes the size
  (`x.pad(((p, 0), None))`) or is not constant, `Tensor.arange`, the shapes
  of `ones` / `zeros` / `empty` / `full` and `full`'s value, `triu` / `tril`, `Tensor(b)` (a 0-d int32), and any
  offset or scalar of a tensor spread over several devices. `RULEC_SYMBOLIC=0` specialises every bound value (the behaviour before
  symbolic kernels). An unbound Variable where a size is needed raises ValueError naming it. One Variable bound to
  two values in one realize raises ValueError.
- TinyJit: calls are counted per set of Variables among the arguments (also inside lists, tuples and dicts, and in
  bound expressions), whatever their values: the first call runs the function, the second captures it, and when
  the capture read no bound value as an int (every use was kept symbolic) later calls replay it with their own
  values: no scheduling, no compiling (tests/frontend/test_symbolic_kernels.py and test_variables.py count both).
  A capture that specialised a value falls back to one capture per set of values: each set counts its own calls
  (run, capture, replay), so a replay never runs kernels built for another value, and at most `TinyJit.max_keys`
  (64) sets are remembered (least recently used forgotten). A capture whose kernels take a Variable that is not
  among the arguments, or is bound there to another value (bound in the closure), is never replayed: those calls
  always run the function. A 200-step jitted decode loop under `Tensor.no_grad = True` keeps a constant number of
  buffers and bytes.
- rulec's own generation examples (examples/gpt2.py, examples/llama.py: examples/textgen.py) decode the same way:
  the position is a bound Variable, the cache is written at it and read up to it, LLaMA's rotary angles are a
  table read at it.

## Loading weights (`rulec.nn.state`)

- `safe_load(fn)` / `safe_save(tensors, fn, metadata=None)`: .safetensors files (through the safetensors package);
  safe_load also takes a Tensor of the file's bytes.
- `torch_load(fn)`: a PyTorch `.pt` / `.pth` checkpoint (a path or a Tensor of its bytes) without torch: the zip
  format (PyTorch >= 1.6: `data.pkl` and `data/<key>` storages, either byte order) and the legacy single-file format
  before it; returns what the checkpoint holds (usually an OrderedDict of name -> Tensor). Views keep their shape
  and strides (copied out contiguous), bfloat16 storages stay bfloat16 (as in tinygrad). The pickle is read by a restricted
  unpickler: it may name only `torch._utils._rebuild_tensor_v2` (and `_rebuild_tensor`, `_rebuild_parameter`), the
  torch storage classes and `collections.OrderedDict`, each mapped to rulec's own function; any other name
  (`os.system`, `builtins.eval`, a model class) raises UnsafeCheckpointError before anything is made, so a
  malicious checkpoint runs nothing. A whole pickled `nn.Module` is refused the same way: save its `state_dict()`.
  Truncated, corrupt or compressed archives raise CheckpointError (a ValueError); sizes are checked against the file
  before anything is allocated. The tar format of PyTorch < 0.4 is not read.
- `gguf_load(fn)`: a GGUF file (v2 or v3; a path, or a Tensor of its bytes; split files by path) as tinygrad 0.14's
  `tinygrad.llm.gguf.gguf_load` returns it: `(metadata dict, {name: Tensor})`, the tensors shaped with the file's
  dims reversed. Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K are dequantised on load (on the host) to float32;
  F32, F16, BF16, F64 and I8..I64 keep their dtype. Other quant types (Q2_K, Q3_K, the IQ types, MXFP4) raise CheckpointError naming the type. A metadata
  value of type UINT8 is an int (tinygrad's reader returns a one-byte bytes). `ggml_data_to_tensor(t, n, type)`
  dequantises raw bytes as tinygrad's does.

## tinygrad's model files on rulec

`python bench/models_zoo.py PATH` imports the model files of a tinygrad checkout at PATH unchanged through the
alias, runs each on rulec and on tinygrad 0.14 (in separate processes) from the same weights and inputs, and
compares; tests/frontend/test_model_zoo.py checks small models of the same architectures against outputs tinygrad
computed (tests/data/model_zoo_golden.npz), in CI without tinygrad. Measured on tinygrad's files as of 0.14 (rulec
on CPU, tinygrad on its PYTHON device; tokens, losses and weights after a step equal, floats within 1e-4, the UNet
within float16's 2e-2; `kernels` is (rulec, tinygrad) for one forward at the bench's larger config, tinygrad on
DEV=NULL, or for one step of the small config where the model reads values back):

  | file | runs unchanged | compared (all equal to tinygrad) | kernels (rulec, tinygrad) |
  |---|---|---|---|
  | extra/models/resnet.py | yes (ResNet18) | logits | 19, 19 (224x224) |
  | extra/models/efficientnet.py | yes (B0) | logits | 99, 99 (224x224); 93, 93 at 32x32 |
  | extra/models/vit.py | yes (ViT-Ti) | logits | 185, 198 |
  | extra/models/bert.py | yes (BertForPretraining) | LM and NSP logits; one SGD step on the file's loss: loss, weights | 66, 76 forward; 298, 317 step (4 layers of 256) |
  | extra/models/transformer.py | yes, trained by extra/training.py on examples/transformer.py's data | log-probs; 3 jitted Adam steps: losses, accuracies, weights (`embed` is_param False: untouched); evaluate()'s predictions | 33, 37 forward; 197, 311 step |
  | extra/models/llama.py | yes: jit=False, and the default TinyJit path with start_pos a bound Variable | prompt logits, 5 greedy tokens, the KV cache | 34, 35 prompt; 31, 32 decode step; 31, 34 jitted decode step (2 layers) |
  | examples/gpt2.py | yes: Transformer.forward, and GPT2.generate (TinyJit, the token and start_pos bound Variables; any object with encode/decode for tiktoken) | greedy tokens, the KV cache | 36, 50 prompt; 33, 47 decode step; 32, 48 generate step |
  | examples/mamba.py | yes (it imports `transformers` at the top, for its tokenizer: a stand-in module) | generate(): the prompt, then 4 one-token steps under its TinyJit; the SSM state | 147, 200 |
  | examples/mixtral.py | yes (MixtureFeedForward in llama.Transformer; start_pos an int, or a bound Variable as its __main__ passes it) | greedy tokens | 39, 57 prompt; 36, 54 decode step |
  | extra/models/unet.py | yes, weights float16 as stable_diffusion.py --fp16 | output (tinygrad's PYTHON device has no float16 in supported_dtypes(), so the file kept its activations float32 there) | 191, 209 (176, 209 at the small config) |
  | extra/models/convnext.py | yes (ConvNeXt-T) | logits | 126, 128 |
  | examples/beautiful_mnist.py | yes (`tinygrad.nn.datasets` now exists; `@function`) | 3 train steps (plain, captured, replayed) under TinyJit and Context(TRAINING=1), Adam: losses, weights; the jitted test accuracy (a fixed batch for `Tensor.randint`) | 98, 147 step; 98, 114 replayed |

Where rulec differs, and why:

- Symbolic shapes: three of these need them on their default path, llama.py's one-token steps (`forward_jit`,
  start_pos a bound Variable), gpt2.py's `GPT2.generate` (the token and start_pos bound, under TinyJit) and
  mixtral.py's decode loop (start_pos bound, no JIT). All three keep start_pos symbolic in rulec (the `Variable`
  section above): the cache writes and token rows are offsets, the attention over the cache a size, so the jitted
  steps are built once and replayed for every position, as in tinygrad.
- A loss realized after `opt.step()` (`loss.backward(); opt.step(); return loss.realize()`, extra/training.py's
  loop) is computed from the updated weights in rulec. tinygrad computes it from the updated weights too, except
  where its own schedule of the step kept an intermediate of the loss in a buffer (its tensors are rewritten to
  the buffers a schedule made), so its value depends on tinygrad's kernel boundaries: equal on the adder
  Transformer, 3.90 against rulec's 3.89 on a one-layer BERT. `loss.realize(*opt.schedule_step())`
  (beautiful_mnist.py) realizes the loss before the update in both, and is what the zoo test uses.
- `backward()` gives every float tensor in scope a `.grad`, in both. When a loop never reads or resets some tensor's
  `.grad` (the data tensor of an eager training loop), tinygrad keeps adding to it lazily (its graph grows a few
  nodes a step); rulec computes such an accumulated `.grad` (detached) before the next backward adds to it, so its
  graph and the buffers it holds stay bounded. It reads the weights as they are then: under lazy semantics a `.grad`
  read after several `opt.step()` calls has no single "right" value, but reading it each step gives the same.
- Random numbers differ (rulec draws on the host with numpy, tinygrad with threefry): the same seed gives other
  weights, dropout masks and `Tensor.randint` batches, so comparisons load weights and set dropout to 0.
- `Tensor.train()` / `Tensor.training` are rulec's own (older tinygrad's); tinygrad 0.14 has only
  `Context(TRAINING=1)`, which sets the same switch in rulec (an optimizer step outside it raises in both).
- `fetch` and the dataset loaders read nothing from the network: pass paths (`torch_load(path)`,
  `mnist(path=...)`); the examples' `__main__` blocks that download weights stop there.
- Kernel counts (bench/results/models-zoo-2026-12-05d.txt): rulec runs as many kernels as tinygrad or fewer on
  all 12, at both configs. Since the fusion rules weigh what a recomputation costs (docs/fusion.md, "Recomputing
  inside a reduction"), four store a value a matmul or a convolution would otherwise recompute on every trip of
  its loop (a layernorm's output, a training batchnorm's activation): ViT 172 -> 185, BERT's step 295 -> 298,
  ConvNeXt-T 105 -> 126, the UNet at its larger config 176 -> 191, MNIST's step 95 -> 98. The last three above tinygrad were fusion decisions (rules/): EfficientNet's
  squeeze-excite pool over a 1x1 image is its values (rules/early.rules reduce_unit_axes), ViT's pre-norm residual
  stream is stored with each block's matmul (docs/fusion.md, `needed_below`), and BERT's training step keeps its
  gelu and layernorm gradients in their consumers and takes no gradient through softmax's max.
"""


def public_names(cls: type) -> list[str]:
  """Names a user calls: public attributes, and the operators (dunders other than object's plumbing)."""
  own = vars(cls)
  keep = []
  for name, v in own.items():
    if name.startswith("__") and name.endswith("__"):
      if name in ("__init__", "__slots__", "__module__", "__qualname__", "__doc__", "__hash__", "__weakref__",
                  "__firstlineno__", "__static_attributes__", "__dict__", "__annotations__"): continue
      if not callable(v): continue
    elif name.startswith("_"): continue
    if isinstance(v, (int, float, bool, str)) or v is None: continue
    keep.append(name)
  return keep


def describe(cls: type, name: str) -> tuple[str, str | None]:
  v = vars(cls)[name]
  fn = v.fget if isinstance(v, property) else v.__func__ if isinstance(v, (staticmethod, classmethod)) else v
  try: sig = str(inspect.signature(fn))
  except (TypeError, ValueError): sig = "(...)"
  if isinstance(v, property): sig = ""
  kind = "property" if isinstance(v, property) else "classmethod" if isinstance(v, classmethod) else \
    "staticmethod" if isinstance(v, staticmethod) else ""
  if type(v).__name__ == "member_descriptor": return (f"`{name}` (attribute)", ATTRIBUTES.get(name))
  doc = inspect.getdoc(fn) if fn.__doc__ is not None else None
  first = _first_sentence(doc) if doc else OPERATORS.get(name)
  if first is None and name.startswith("__") and name.startswith("__r") and hasattr(cls, "__" + name[3:]):
    first = f"the reflected form of `{'__' + name[3:]}`"
  return (f"`{name}{sig}`" + (f" ({kind})" if kind else ""), first)


def _first_sentence(doc: str) -> str:
  """The docstring's first paragraph on one line, cut after its first sentence when that is long."""
  para = " ".join(doc.strip().split("\n\n")[0].split())
  if len(para) > 160 and ". " in para: para = para[:para.index(". ") + 1]
  return para


def render() -> tuple[str, list[str]]:
  lines = ["# The Tensor API", "",
           "Generated from the docstrings by `python docs/api_reference.py` (CI checks it is current). The API is",
           "tinygrad 0.14's (names, signatures, defaults); rulec's older numpy-style keywords (`axis=`, `ddof=`) are",
           "accepted as aliases. One line per name: its signature and the first sentence of its docstring.",
           ""]
  missing = []
  for cls in Tensor.__mro__[1:-1]:
    names = public_names(cls)
    if not names: continue
    lines += [f"## {TITLES.get(cls.__name__, cls.__name__)}", "", f"`{cls.__module__}`", ""]
    for name in names:
      head, first = describe(cls, name)
      if first is None: missing.append(f"{cls.__module__}.{cls.__name__}.{name}")
      lines.append(f"- {head}: {first or '(undocumented)'}")
    lines.append("")
  lines += ["## tinygrad names left out", "",
            "Every public name of tinygrad 0.14's Tensor is above except these:", ""]
  lines += [f"- `{name}`: {why}" for name, why in LEFT_OUT.items()]
  lines.append("")
  lines += BEYOND_TENSOR.strip("\n").split("\n") + [""]
  return "\n".join(lines), missing


def main() -> int:
  text, missing = render()
  if "--check" in sys.argv[1:]:
    ok = True
    if missing:
      print("public Tensor names without a docstring:\n  " + "\n  ".join(missing)); ok = False
    if not OUT.exists() or OUT.read_text() != text:
      print(f"{OUT} is not current: run python docs/api_reference.py"); ok = False
    return 0 if ok else 1
  OUT.write_text(text)
  print(f"wrote {OUT} ({text.count(chr(10) + '- ')} names)" + (f"; {len(missing)} without a docstring" if missing else ""))
  return 0


if __name__ == "__main__":
  sys.exit(main())
