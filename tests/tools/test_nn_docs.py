"""docs/nn.md runs as shown: its Python blocks run in order in one namespace (in a fresh directory), and what each
prints is the `text` block that follows it."""
from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "nn.md"
BLOCK = re.compile(r"^```(?P<lang>\w+)\n(?P<body>.*?)^```$", re.M | re.S)


def examples() -> list[tuple[int, str, str | None]]:
  """(line, python source, the output shown after it or None) for each python block of the page."""
  text = DOC.read_text()
  blocks = [(text.count("\n", 0, m.start()) + 1, m["lang"], m["body"]) for m in BLOCK.finditer(text)]
  out = []
  for i, (line, lang, body) in enumerate(blocks):
    if lang != "python": continue
    shown = blocks[i + 1][2] if i + 1 < len(blocks) and blocks[i + 1][1] == "text" else None
    out.append((line, body, shown))
  return out


def test_the_page_has_examples_of_each_part():
  sources = "\n".join(src for _, src, _ in examples())
  for name in ("nn.Linear", "nn.Conv2d", "nn.BatchNorm2d", "nn.Embedding", "nn.LSTMCell", "nn.optim.SGD", "nn.optim.Adam",
               "get_parameters", "get_state_dict", "load_state_dict", "safe_save", "safe_load"):
    assert name in sources, name


def test_every_example_prints_what_the_page_shows(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  ns: dict = {"__name__": "nn_doc"}
  for line, src, shown in examples():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
      exec(compile(src, f"docs/nn.md:{line}", "exec"), ns)
    if shown is None: continue
    assert out.getvalue() == shown, f"docs/nn.md:{line} printed:\n{out.getvalue()}\nthe page shows:\n{shown}"


@pytest.mark.parametrize("name", ["Linear", "Conv1d", "Conv2d", "ConvTranspose1d", "ConvTranspose2d", "Embedding", "LSTMCell",
                                  "Dropout", "BatchNorm", "LayerNorm", "LayerNorm2d", "GroupNorm", "InstanceNorm", "RMSNorm"])
def test_every_layer_is_on_the_page(name):
  from rulec import nn
  assert hasattr(nn, name) and f"`{name}`" in DOC.read_text()


def test_every_optimizer_and_state_function_is_on_the_page():
  from rulec.nn import optim, state
  text = DOC.read_text()
  for name in ("SGD", "LARS", "Muon", "Adam", "AdamW", "LAMB", "OptimizerGroup"):
    assert hasattr(optim, name) and f"`{name}`" in text, name
  for name in ("get_state_dict", "get_parameters", "load_state_dict", "safe_save", "safe_load", "StateDictError",
               "torch_load", "gguf_load", "ggml_data_to_tensor"):
    assert hasattr(state, name) and f"`{name}" in text, name
