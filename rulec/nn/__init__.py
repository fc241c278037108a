"""rulec.nn: tinygrad 0.14's neural-network modules (plain classes with __call__), with `optim` (optimizers)
and `state` (state dicts, safetensors files) as submodules: `from rulec import nn; nn.Linear(3, 4)`,
`nn.optim.Adam(nn.state.get_parameters(model))`."""
from rulec.nn import optim, state
from rulec.nn.layers import Conv1d, Conv2d, ConvTranspose1d, ConvTranspose2d, Dropout, Embedding, Linear, LSTMCell
from rulec.nn.norms import (BatchNorm, BatchNorm1d, BatchNorm2d, BatchNorm3d, GroupNorm, InstanceNorm, LayerNorm,
                            LayerNorm2d, RMSNorm)

__all__ = ["optim", "state", "Linear", "Conv1d", "Conv2d", "ConvTranspose1d", "ConvTranspose2d", "Embedding",
           "LSTMCell", "Dropout", "BatchNorm", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "LayerNorm", "LayerNorm2d",
           "GroupNorm", "InstanceNorm", "RMSNorm"]
