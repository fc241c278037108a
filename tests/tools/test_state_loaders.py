"""Weight loaders of rulec.nn.state on files written here, by writers of this file's own:

- torch_load: PyTorch zip checkpoints (data.pkl + data/<key>) and the legacy single-file format, their pickles put
  together opcode by opcode (torch is not a test dependency); views, offsets, shared storages, every storage dtype.
  Hostile pickles (os.system, builtins.eval, a __reduce__ gadget, protocol 0 INST, protocol 4 STACK_GLOBAL, BUILD on
  a tensor) are refused and run nothing: the marker file they would create is never there. Truncated and corrupt
  files are CheckpointErrors (ValueErrors), never other exceptions or large allocations.
- gguf_load: GGUF v2/v3 files with every metadata type and every supported ggml type, compared against a scalar
  dequantisation written here from ggml's reference loops (not the loader's vectorised numpy).
- safe_save / safe_load: a file read back with a header parser of this file's own, and loaded from a Tensor.
"""
from __future__ import annotations

import io
import json
import os
import pickle
import struct
import zipfile

import ml_dtypes  # noqa: F401  (registers np.dtype("bfloat16"))
import numpy as np
import pytest

from rulec import Tensor, dtypes
from rulec.nn.state import CheckpointError, UnsafeCheckpointError, gguf_load, safe_load, safe_save, torch_load


# *** a minimal pickle writer (protocol 2 opcodes) ***

class Pickle:
  def __init__(self, proto: int = 2):
    self.b = bytearray(b"\x80" + bytes([proto]))

  def glob(self, module: str, name: str): self.b += b"c" + f"{module}\n{name}\n".encode(); return self
  def mark(self): self.b += b"("; return self
  def tuple(self): self.b += b"t"; return self
  def empty_tuple(self): self.b += b")"; return self
  def empty_dict(self): self.b += b"}"; return self
  def reduce(self): self.b += b"R"; return self
  def setitems(self): self.b += b"u"; return self
  def build(self): self.b += b"b"; return self
  def persid(self): self.b += b"Q"; return self
  def none(self): self.b += b"N"; return self
  def false(self): self.b += b"\x89"; return self
  def stop(self) -> bytes: self.b += b"."; return bytes(self.b)

  def int(self, v: int):
    if -2**31 <= v < 2**31: self.b += b"J" + struct.pack("<i", v)
    else:
      raw = v.to_bytes((v.bit_length() + 8) // 8, "little", signed=True)
      self.b += b"\x8a" + bytes([len(raw)]) + raw
    return self

  def str(self, s: str):
    raw = s.encode()
    self.b += b"X" + struct.pack("<I", len(raw)) + raw
    return self

  def ints(self, xs):
    self.mark()
    for x in xs: self.int(x)
    return self.tuple()

  def ordered_dict(self): return self.glob("collections", "OrderedDict").empty_tuple().reduce()

  def storage(self, stype: str, key: str, numel: int, legacy: bool = False):
    self.mark().str("storage").glob("torch", stype).str(key).str("cpu").int(numel)
    if legacy: self.none()
    return self.tuple().persid()

  def tensor(self, stype, key, numel, offset, size, stride, legacy=False, parameter=False):
    if parameter: self.glob("torch._utils", "_rebuild_parameter").mark()
    self.glob("torch._utils", "_rebuild_tensor_v2").mark().storage(stype, key, numel, legacy)
    self.int(offset).ints(size).ints(stride).false().ordered_dict().tuple().reduce()
    if parameter: self.false().ordered_dict().tuple().reduce()
    return self


STORAGE_NP = {"FloatStorage": np.float32, "HalfStorage": np.float16, "DoubleStorage": np.float64, "LongStorage": np.int64,
              "IntStorage": np.int32, "ShortStorage": np.int16, "CharStorage": np.int8, "ByteStorage": np.uint8,
              "BoolStorage": np.bool_}


def state_dict_pickle(entries, legacy=False, metadata=False) -> bytes:
  """An OrderedDict pickle: entries are (name, storage type, key, numel, offset, size, stride[, parameter])."""
  p = Pickle().ordered_dict().mark()
  for name, stype, key, numel, offset, size, stride, *par in entries:
    p.str(name).tensor(stype, key, numel, offset, size, stride, legacy, parameter=bool(par and par[0]))
  p.setitems()
  if metadata:   # torch's state dicts carry `_metadata` (an attribute set by BUILD)
    p.empty_dict().mark().str("_metadata").empty_dict().mark().str("").empty_dict().mark().str("version").int(1)
    p.setitems().setitems().setitems().build()
  return p.stop()


def write_zip(path, pkl: bytes, storages: dict[str, bytes], byteorder: str = "little", compress=zipfile.ZIP_STORED):
  with zipfile.ZipFile(path, "w", compression=compress) as z:
    z.writestr("archive/data.pkl", pkl)
    z.writestr("archive/byteorder", byteorder)
    for k, raw in storages.items(): z.writestr(f"archive/data/{k}", raw)
    z.writestr("archive/version", "3\n")


def write_legacy(path, main: bytes, storages: dict[str, np.ndarray]):
  out = io.BytesIO()
  for obj in (0x1950a86a20f9469cfc6c, 1001, {"protocol_version": 1001, "little_endian": True,
                                            "type_sizes": {"short": 2, "int": 4, "long": 4}}):
    out.write(pickle.dumps(obj, protocol=2))
  out.write(main)
  keys = sorted(storages)
  out.write(pickle.dumps(keys, protocol=2))
  for k in keys:
    out.write(struct.pack("<q", storages[k].size))
    out.write(storages[k].tobytes())
  with open(path, "wb") as f: f.write(out.getvalue())


RNG = np.random.default_rng(33)


def test_torch_zip_every_storage_type(tmp_path):
  entries, storages, want = [], {}, {}
  for i, (stype, npdt) in enumerate(STORAGE_NP.items()):
    a = (RNG.standard_normal(6) * 50).astype(npdt) if npdt is not np.bool_ else RNG.random(6) > 0.5
    storages[str(i)] = a.tobytes()
    entries.append((f"t.{stype}", stype, str(i), 6, 0, (2, 3), (3, 1)))
    want[f"t.{stype}"] = a.reshape(2, 3)
  write_zip(tmp_path / "m.pt", state_dict_pickle(entries, metadata=True), storages)
  sd = torch_load(tmp_path / "m.pt")
  assert list(sd) == list(want)
  for k, a in want.items():
    assert isinstance(sd[k], Tensor) and sd[k].shape == (2, 3)
    assert sd[k].numpy().dtype == a.dtype, k
    np.testing.assert_array_equal(sd[k].numpy(), a)
  assert sd._metadata == {"": {"version": 1}}
  assert torch_load(str(tmp_path / "m.pt")).keys() == want.keys()   # (a str path too)


def test_torch_views_offsets_shared_storage_scalars_parameters(tmp_path):
  base = np.arange(24, dtype=np.float32) * 0.5
  entries = [("whole", "FloatStorage", "0", 24, 0, (4, 6), (6, 1)),
             ("transposed", "FloatStorage", "0", 24, 0, (6, 4), (1, 6)),         # the same storage, permuted
             ("row2", "FloatStorage", "0", 24, 12, (6,), (1,)),                 # an offset into it
             ("strided", "FloatStorage", "0", 24, 1, (3, 2), (8, 3)),
             ("scalar", "FloatStorage", "0", 24, 5, (), ()),
             ("empty", "FloatStorage", "0", 24, 0, (0, 3), (3, 1)),
             ("param", "FloatStorage", "0", 24, 0, (2, 2), (6, 1), True)]
  write_zip(tmp_path / "v.pth", state_dict_pickle(entries), {"0": base.tobytes()})
  sd = torch_load(tmp_path / "v.pth")
  m = base.reshape(4, 6)
  np.testing.assert_array_equal(sd["whole"].numpy(), m)
  np.testing.assert_array_equal(sd["transposed"].numpy(), m.T)
  np.testing.assert_array_equal(sd["row2"].numpy(), base[12:18])
  np.testing.assert_array_equal(sd["strided"].numpy(), np.array([[base[1 + 8 * i + 3 * j] for j in range(2)] for i in range(3)]))
  assert sd["scalar"].shape == () and sd["scalar"].item() == 2.5
  assert sd["empty"].shape == (0, 3)
  np.testing.assert_array_equal(sd["param"].numpy(), m[:2, :2])


def test_torch_bfloat16_and_big_endian(tmp_path):
  x = np.array([1.0, -2.5, 3.140625, 1e-3, -0.0, np.inf], dtype=np.float32)
  bf = (x.view(np.uint32) >> 16).astype("<u2")   # bfloat16 bits (truncated, exact for these but 1e-3)
  write_zip(tmp_path / "bf.pt", state_dict_pickle([("w", "BFloat16Storage", "k", 6, 0, (6,), (1,))]), {"k": bf.tobytes()})
  got = torch_load(tmp_path / "bf.pt")["w"]
  assert got.dtype == dtypes.bfloat16   # (as tinygrad's torch_load gives it)
  np.testing.assert_array_equal(got.numpy().view(np.uint16), bf)
  np.testing.assert_array_equal(got.float().numpy(), (bf.astype(np.uint32) << 16).view(np.float32))
  y = np.arange(5, dtype=">f4")
  write_zip(tmp_path / "be.pt", state_dict_pickle([("w", "FloatStorage", "0", 5, 0, (5,), (1,))]), {"0": y.tobytes()}, "big")
  np.testing.assert_array_equal(torch_load(tmp_path / "be.pt")["w"].numpy(), np.arange(5, dtype=np.float32))


def test_torch_legacy_format(tmp_path):
  a, b = np.arange(6, dtype=np.float32), np.array([7, -8, 9], dtype=np.int64)
  main = state_dict_pickle([("a", "FloatStorage", "140", 6, 0, (3, 2), (1, 3)),
                            ("b", "LongStorage", "77", 3, 1, (2,), (1,))], legacy=True)
  write_legacy(tmp_path / "old.pt", main, {"140": a, "77": b})
  sd = torch_load(tmp_path / "old.pt")
  np.testing.assert_array_equal(sd["a"].numpy(), a.reshape(2, 3).T)
  np.testing.assert_array_equal(sd["b"].numpy(), b[1:])
  # from a Tensor of the file's bytes, as tinygrad's torch_load takes it
  raw = np.frombuffer((tmp_path / "old.pt").read_bytes(), dtype=np.uint8)
  np.testing.assert_array_equal(torch_load(Tensor(raw))["a"].numpy(), a.reshape(2, 3).T)


# *** hostile checkpoints ***

class Gadget:
  def __init__(self, cmd): self.cmd = cmd
  def __reduce__(self): return (os.system, (self.cmd,))


def hostile_pickles(marker) -> dict[str, bytes]:
  cmd = f"touch {marker}"
  return {
    "os.system": Pickle().glob("os", "system").mark().str(cmd).tuple().reduce().stop(),
    "posix.system": Pickle().glob("posix", "system").mark().str(cmd).tuple().reduce().stop(),
    "builtins.eval": Pickle().glob("builtins", "eval").mark().str(f"open({str(marker)!r}, 'w')").tuple().reduce().stop(),
    "builtins.exec in a state dict": Pickle().ordered_dict().mark().str("w").glob("builtins", "exec")
      .mark().str(f"open({str(marker)!r}, 'w')").tuple().reduce().setitems().stop(),
    "__reduce__ gadget": pickle.dumps(Gadget(cmd), protocol=2),
    "__reduce__ gadget, protocol 4": pickle.dumps({"w": Gadget(cmd)}, protocol=4),
    "__reduce__ gadget, protocol 0": pickle.dumps(Gadget(cmd), protocol=0),
    "INST opcode": b"(S'" + cmd.encode() + b"'\nios\nsystem\n.",
    "subprocess": Pickle().glob("subprocess", "Popen").mark().mark().str("touch").str(str(marker)).tuple().tuple().reduce().stop(),
    "a dotted name": Pickle(4).glob("collections", "OrderedDict.fromkeys").mark().str("x").tuple().reduce().stop(),
    "torch's own module import": Pickle().glob("torch", "load").mark().str(str(marker)).tuple().reduce().stop(),
  }


@pytest.mark.parametrize("name", list(hostile_pickles("m")))
def test_hostile_checkpoints_run_nothing(tmp_path, name):
  marker = tmp_path / "PWNED"
  pkl = hostile_pickles(marker)[name]
  write_zip(tmp_path / "evil.pt", pkl, {})
  with pytest.raises(UnsafeCheckpointError, match="refuses") as e: torch_load(tmp_path / "evil.pt")
  assert isinstance(e.value, ValueError) and isinstance(e.value, pickle.UnpicklingError)
  (tmp_path / "evil_legacy.pt").write_bytes(pkl)   # the bare pickle, as a legacy file's first pickle
  with pytest.raises(UnsafeCheckpointError): torch_load(tmp_path / "evil_legacy.pt")
  assert not marker.exists()


def test_hostile_pickle_after_valid_tensors_and_build_on_a_tensor(tmp_path):
  marker = tmp_path / "PWNED"
  good = Pickle().ordered_dict().mark().str("w").tensor("FloatStorage", "0", 2, 0, (2,), (1,))
  evil = good.str("x").glob("os", "system").mark().str(f"touch {marker}").tuple().reduce().setitems().stop()
  write_zip(tmp_path / "e.pt", evil, {"0": np.zeros(2, np.float32).tobytes()})
  with pytest.raises(UnsafeCheckpointError, match="os.system"): torch_load(tmp_path / "e.pt")
  # BUILD sets state: allowed on OrderedDicts (torch's _metadata), refused on a tensor
  p = Pickle().tensor("FloatStorage", "0", 2, 0, (2,), (1,)).mark().none().empty_dict().mark().str("uop").str("x")
  p.setitems().tuple().build()
  write_zip(tmp_path / "b.pt", p.stop(), {"0": np.zeros(2, np.float32).tobytes()})
  with pytest.raises(UnsafeCheckpointError, match="state of a Tensor"): torch_load(tmp_path / "b.pt")
  assert not marker.exists()


# *** corrupt and truncated checkpoints ***

def test_torch_corrupt_and_truncated(tmp_path):
  a = np.arange(12, dtype=np.float32)
  write_zip(tmp_path / "ok.pt", state_dict_pickle([("w", "FloatStorage", "0", 12, 0, (3, 4), (4, 1))]), {"0": a.tobytes()})
  blob = (tmp_path / "ok.pt").read_bytes()
  for n in range(0, len(blob), 7):   # every prefix: a clear error
    (tmp_path / "t.pt").write_bytes(blob[:n])
    with pytest.raises(CheckpointError): torch_load(tmp_path / "t.pt")
  legacy = tmp_path / "old.pt"
  write_legacy(legacy, state_dict_pickle([("w", "FloatStorage", "1", 12, 0, (12,), (1,))], legacy=True), {"1": a})
  blob = legacy.read_bytes()
  for n in range(0, len(blob) - 1):
    (tmp_path / "t.pt").write_bytes(blob[:n])
    with pytest.raises(CheckpointError): torch_load(tmp_path / "t.pt")
  cases = {
    "storage shorter than its elements": ([("w", "FloatStorage", "0", 12, 0, (12,), (1,))], {"0": a[:5].tobytes()}, "need"),
    "view past the storage": ([("w", "FloatStorage", "0", 12, 4, (3, 4), (4, 1))], {"0": a.tobytes()}, "reaches past"),
    "huge claimed size": ([("w", "FloatStorage", "0", 10**15, 0, (10**15,), (1,))], {"0": a.tobytes()}, "need"),
    "expanded view": ([("w", "FloatStorage", "0", 12, 0, (10**12,), (0,))], {"0": a.tobytes()}, "expanded"),
    "missing storage": ([("w", "FloatStorage", "9", 12, 0, (12,), (1,))], {"0": a.tobytes()}, "missing"),
    "negative size": ([("w", "FloatStorage", "0", 12, 0, (-1,), (1,))], {"0": a.tobytes()}, "size"),
  }
  for name, (entries, storages, msg) in cases.items():
    write_zip(tmp_path / "c.pt", state_dict_pickle(entries), storages)
    with pytest.raises(CheckpointError, match=msg): torch_load(tmp_path / "c.pt")
  write_zip(tmp_path / "z.pt", state_dict_pickle([("w", "FloatStorage", "0", 12, 0, (12,), (1,))]), {"0": a.tobytes()},
            compress=zipfile.ZIP_DEFLATED)
  with pytest.raises(CheckpointError, match="compressed"): torch_load(tmp_path / "z.pt")
  for junk in (b"", b"hello world, not a checkpoint", bytes(RNG.integers(0, 256, 4096, dtype=np.uint8))):
    (tmp_path / "j.pt").write_bytes(junk)
    with pytest.raises(CheckpointError): torch_load(tmp_path / "j.pt")
  with zipfile.ZipFile(tmp_path / "other.zip", "w") as z: z.writestr("readme.txt", "hi")
  with pytest.raises(CheckpointError, match="data.pkl"): torch_load(tmp_path / "other.zip")
  # a corrupted storage byte: the zip's CRC catches it
  blob = bytearray((tmp_path / "ok.pt").read_bytes())
  at = bytes(blob).index(a.tobytes())
  blob[at + 5] ^= 0xFF
  (tmp_path / "crc.pt").write_bytes(bytes(blob))
  with pytest.raises(CheckpointError): torch_load(tmp_path / "crc.pt")


def test_torch_cross_check_with_torch_when_installed(tmp_path):
  torch = pytest.importorskip("torch")
  sd = {"w": torch.arange(12, dtype=torch.float32).reshape(3, 4), "t": torch.arange(6.0).reshape(2, 3).t(),
        "h": torch.ones(3, dtype=torch.float16), "i": torch.tensor([1, 2], dtype=torch.int64)}
  torch.save(sd, tmp_path / "real.pt")
  got = torch_load(tmp_path / "real.pt")
  for k, v in sd.items(): np.testing.assert_array_equal(got[k].numpy(), v.numpy())


# *** GGUF ***

def f16(raw: bytes) -> np.float32: return np.float32(np.frombuffer(raw, dtype="<f2")[0])


def ref_block(typ: int, b: bytes) -> list:
  """ggml's dequantize_row_* for one block, element by element (after ggml-quants.c)."""
  y = []
  if typ == 2:   # Q4_0
    d = f16(b[0:2])
    y = [np.float32((b[2 + j] & 0xF) - 8) * d for j in range(16)] + [np.float32((b[2 + j] >> 4) - 8) * d for j in range(16)]
  elif typ == 3:   # Q4_1
    d, m = f16(b[0:2]), f16(b[2:4])
    y = [np.float32(b[4 + j] & 0xF) * d + m for j in range(16)] + [np.float32(b[4 + j] >> 4) * d + m for j in range(16)]
  elif typ in (6, 7):   # Q5_0, Q5_1
    d = f16(b[0:2])
    m = f16(b[2:4]) if typ == 7 else None
    at = 2 if typ == 6 else 4
    qh = struct.unpack("<I", b[at:at + 4])[0]
    qs = b[at + 4:at + 20]
    lo, hi = [], []
    for j in range(16):
      xh0, xh1 = ((qh >> j) << 4) & 0x10, (qh >> (j + 12)) & 0x10
      x0, x1 = (qs[j] & 0xF) | xh0, (qs[j] >> 4) | xh1
      if typ == 6: lo.append(np.float32(x0 - 16) * d); hi.append(np.float32(x1 - 16) * d)
      else: lo.append(np.float32(x0) * d + m); hi.append(np.float32(x1) * d + m)
    y = lo + hi
  elif typ == 8:   # Q8_0
    d = f16(b[0:2])
    y = [np.float32(v) * d for v in struct.unpack("<32b", b[2:34])]
  elif typ in (12, 13):   # Q4_K, Q5_K
    d, dmin, sc = f16(b[0:2]), f16(b[2:4]), b[4:16]
    def scale_min(j):
      if j < 4: return sc[j] & 63, sc[j + 4] & 63
      return (sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4), (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4)
    qh = b[16:48]
    ql = b[16:144] if typ == 12 else b[48:176]
    u1, u2, q = 1, 2, 0
    for j in range(0, 256, 64):
      s1, m1 = scale_min(j // 32)
      s2, m2 = scale_min(j // 32 + 1)
      d1, mm1, d2, mm2 = d * np.float32(s1), dmin * np.float32(m1), d * np.float32(s2), dmin * np.float32(m2)
      for l in range(32):
        v = ql[q + l] & 0xF
        if typ == 13 and qh[l] & u1: v += 16
        y.append(d1 * np.float32(v) - mm1)
      for l in range(32):
        v = ql[q + l] >> 4
        if typ == 13 and qh[l] & u2: v += 16
        y.append(d2 * np.float32(v) - mm2)
      q += 32
      u1, u2 = u1 << 2, u2 << 2
  elif typ == 14:   # Q6_K
    ql, qh, sc, d = b[0:128], b[128:192], struct.unpack("<16b", b[192:208]), f16(b[208:210])
    out = [0.0] * 256
    for n in range(2):
      L, H, S, Y = ql[64 * n:], qh[32 * n:], sc[8 * n:], 128 * n
      for l in range(32):
        i = l // 16
        q1 = ((L[l] & 0xF) | (((H[l] >> 0) & 3) << 4)) - 32
        q2 = ((L[l + 32] & 0xF) | (((H[l] >> 2) & 3) << 4)) - 32
        q3 = ((L[l] >> 4) | (((H[l] >> 4) & 3) << 4)) - 32
        q4 = ((L[l + 32] >> 4) | (((H[l] >> 6) & 3) << 4)) - 32
        out[Y + l] = d * np.float32(S[i]) * np.float32(q1)
        out[Y + l + 32] = d * np.float32(S[i + 2]) * np.float32(q2)
        out[Y + l + 64] = d * np.float32(S[i + 4]) * np.float32(q3)
        out[Y + l + 96] = d * np.float32(S[i + 6]) * np.float32(q4)
    y = out
  return y


# ggml type -> (block elements, block bytes, byte offsets of float16 scale fields)
QUANTS = {2: (32, 18, (0,)), 3: (32, 20, (0, 2)), 6: (32, 22, (0,)), 7: (32, 24, (0, 2)), 8: (32, 34, (0,)),
          12: (256, 144, (0, 2)), 13: (256, 176, (0, 2)), 14: (256, 210, (208,))}


def quant_blocks(typ: int, nblocks: int) -> bytes:
  """Random blocks (every bit pattern is a valid quant), their float16 scales set to finite values."""
  _, size, scales = QUANTS[typ]
  blocks = RNG.integers(0, 256, (nblocks, size), dtype=np.uint8)
  for at in scales: blocks[:, at:at + 2] = np.asarray(RNG.uniform(-0.1, 0.1, (nblocks, 1)), dtype="<f2").view(np.uint8)
  return blocks.tobytes()


def gguf_str(s: str) -> bytes: return struct.pack("<Q", len(s.encode())) + s.encode()


def gguf_value(typ: int, v) -> bytes:
  fmts = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
  if typ in fmts: return struct.pack("<" + fmts[typ], v)
  if typ == 8: return gguf_str(v)
  item, xs = v
  return struct.pack("<IQ", item, len(xs)) + b"".join(gguf_value(item, x) for x in xs)


def write_gguf(path, kv: list, tensors: list, version: int = 3, align: int = 32, n_tensors=None, n_kv=None) -> bytes:
  """kv: (key, type, value); tensors: (name, dims innermost first, ggml type, raw bytes)."""
  head = b"GGUF" + struct.pack("<IQQ", version, len(tensors) if n_tensors is None else n_tensors, len(kv) if n_kv is None else n_kv)
  for k, typ, v in kv: head += gguf_str(k) + struct.pack("<I", typ) + gguf_value(typ, v)
  data, offsets = b"", []
  for _, _, _, raw in tensors:
    data += b"\0" * (-len(data) % align)
    offsets.append(len(data))
    data += raw
  for (name, dims, typ, _), off in zip(tensors, offsets):
    head += gguf_str(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", typ, off)
  blob = head + b"\0" * (-len(head) % align) + data
  if path is not None:
    with open(path, "wb") as f: f.write(blob)
  return blob


KV = [("general.architecture", 8, "llama"), ("u8", 0, 200), ("i8", 1, -100), ("u16", 2, 65000), ("i16", 3, -30000),
      ("u32", 4, 4000000000), ("i32", 5, -2000000000), ("f32", 6, 0.5), ("bool", 7, True), ("u64", 10, 2**60),
      ("i64", 11, -2**60), ("f64", 12, 0.1), ("ints", 9, (5, [1, -2, 3])), ("strs", 9, (8, ["a", "bé", ""])),
      ("nested", 9, (9, [(4, [1, 2]), (4, [])]))]


@pytest.mark.parametrize("version", [2, 3])
def test_gguf_every_type_against_reference(tmp_path, version):
  tensors, want = [], {}
  f32 = RNG.standard_normal(12).astype(np.float32)
  tensors.append(("f32", (4, 3), 0, f32.tobytes())); want["f32"] = f32.reshape(3, 4)
  h = RNG.standard_normal(8).astype(np.float16)
  tensors.append(("f16", (8,), 1, h.tobytes())); want["f16"] = h
  for typ, npdt in [(24, np.int8), (25, np.int16), (26, np.int32), (27, np.int64), (28, np.float64)]:
    v = (RNG.standard_normal(6) * 100).astype(npdt)
    tensors.append((f"native{typ}", (3, 2), typ, v.tobytes())); want[f"native{typ}"] = v.reshape(2, 3)
  bf = RNG.integers(0, 2**16, 4).astype("<u2")
  bf[(bf & 0x7F80) == 0x7F80] = 0x3F80   # (no NaN/inf bit patterns)
  tensors.append(("bf16", (4,), 30, bf.tobytes())); want["bf16"] = bf.view(np.dtype("bfloat16"))
  for typ, (block, size, _) in QUANTS.items():
    raw = quant_blocks(typ, 3)
    tensors.append((f"q{typ}", (block, 3), typ, raw))
    ref = [x for i in range(3) for x in ref_block(typ, raw[i * size:(i + 1) * size])]
    want[f"q{typ}"] = np.array(ref, dtype=np.float32).reshape(3, block)
  write_gguf(tmp_path / "m.gguf", KV + [("general.alignment", 4, 64)], tensors, version=version, align=64)
  kv, sd = gguf_load(tmp_path / "m.gguf")
  expect_kv = {k: (v if typ != 9 else [x if not isinstance(x, tuple) else x[1] for x in v[1]]) for k, typ, v in KV}
  expect_kv["general.alignment"] = 64
  assert kv.keys() == expect_kv.keys()
  for k, v in expect_kv.items():
    if k == "f32": assert kv[k] == pytest.approx(v)
    elif k == "f64": assert kv[k] == v
    else: assert kv[k] == v, k
  assert list(sd) == list(want)
  for k, a in want.items():
    got = sd[k].numpy()
    assert got.shape == a.shape and got.dtype == a.dtype, (k, got.shape, got.dtype)
    if k.startswith("q"): np.testing.assert_allclose(got, a, rtol=1e-6, atol=1e-6 * np.abs(a).max(), err_msg=k)
    else: np.testing.assert_array_equal(got, a, err_msg=k)
  # the same file from a Tensor of its bytes
  raw = np.frombuffer((tmp_path / "m.gguf").read_bytes(), dtype=np.uint8)
  kv2, sd2 = gguf_load(Tensor(raw))
  assert kv2 == kv and list(sd2) == list(sd)
  np.testing.assert_array_equal(sd2["q14"].numpy(), sd["q14"].numpy())


def test_gguf_split_files(tmp_path):
  a, b = np.arange(4, dtype=np.float32), np.arange(6, dtype=np.float32)
  write_gguf(tmp_path / "m-00001-of-00002.gguf", [("split.count", 2, 2), ("split.no", 2, 0)], [("a", (4,), 0, a.tobytes())])
  write_gguf(tmp_path / "m-00002-of-00002.gguf", [("split.count", 2, 2), ("split.no", 2, 1)], [("b", (6,), 0, b.tobytes())])
  kv, sd = gguf_load(tmp_path / "m-00001-of-00002.gguf")
  assert list(sd) == ["a", "b"] and kv["split.count"] == 2
  np.testing.assert_array_equal(sd["b"].numpy(), b)
  with pytest.raises(CheckpointError, match="first part"): gguf_load(tmp_path / "m-00002-of-00002.gguf")


def test_gguf_corrupt_and_truncated(tmp_path):
  raw = quant_blocks(8, 2)
  blob = write_gguf(tmp_path / "ok.gguf", KV, [("w", (32, 2), 8, raw), ("f", (3,), 0, np.ones(3, np.float32).tobytes())])
  assert gguf_load(tmp_path / "ok.gguf")[1]["w"].shape == (2, 32)
  for n in range(0, len(blob) - 1, 3):
    (tmp_path / "t.gguf").write_bytes(blob[:n])
    with pytest.raises(CheckpointError): gguf_load(tmp_path / "t.gguf")

  def fails(blob: bytes, match: str):
    (tmp_path / "c.gguf").write_bytes(blob)
    with pytest.raises(CheckpointError, match=match): gguf_load(tmp_path / "c.gguf")

  fails(b"GGML" + blob[4:], "magic")
  fails(write_gguf(None, [], [], version=1), "version 1")
  fails(write_gguf(None, [], [], version=4), "version 4")
  fails(write_gguf(None, [], [], n_kv=2**60), "do not fit")
  fails(write_gguf(None, [], [], n_tensors=2**40), "do not fit")
  fails(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 2**62) + b"key" + b"\0" * 20, "ends inside")
  fails(write_gguf(None, [("a", 9, (4, [1]))], []).replace(struct.pack("<IQ", 4, 1), struct.pack("<IQ", 4, 2**50)), "does not fit")
  fails(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + gguf_str("a") + struct.pack("<I", 13) + b"\0" * 8, "unknown value type")
  fails(write_gguf(None, [], [("w", (2**31, 2**31), 0, b"")]), "needs bytes")
  fails(write_gguf(None, [], [("w", (32,), 10, b"\0" * 84)]), "Q2_K")
  fails(write_gguf(None, [], [("w", (32,), 99, b"")]), "unknown ggml type 99")
  fails(write_gguf(None, [], [("w", (33,), 8, b"\0" * 68)]), "whole blocks")
  fails(write_gguf(None, [], [("w", (1,), 0, b"\0" * 4), ("w", (1,), 0, b"\0" * 4)]), "twice")
  fails(write_gguf(None, [("general.alignment", 4, 0)], []), "alignment")
  fails(write_gguf(None, [], [("w", (1,) * 9, 0, b"\0" * 4)]), "dimensions")
  deep = (9, [])
  for _ in range(10): deep = (9, [deep])
  fails(write_gguf(None, [("d", 9, deep)], []), "nested")
  fails(b"", "empty")


# *** safetensors ***

def test_safe_save_round_trip_and_independent_header(tmp_path):
  sd = {"f": Tensor(RNG.standard_normal((2, 3)).astype(np.float32)), "h": Tensor(np.arange(4, dtype=np.float16)),
        "i": Tensor(np.array([1, -2], dtype=np.int64)), "b": Tensor([True, False, True]),
        "u": Tensor(np.arange(5, dtype=np.uint8)), "d": Tensor(np.array([0.1, 0.2]))}
  safe_save(sd, tmp_path / "m.safetensors", metadata={"format": "pt"})
  blob = (tmp_path / "m.safetensors").read_bytes()
  (n,) = struct.unpack("<Q", blob[:8])
  header = json.loads(blob[8:8 + n])
  assert header["__metadata__"] == {"format": "pt"}
  names = {"f": ("F32", np.float32), "h": ("F16", np.float16), "i": ("I64", np.int64), "b": ("BOOL", np.bool_),
           "u": ("U8", np.uint8), "d": ("F64", np.float64)}
  for k, t in sd.items():
    code, npdt = names[k]
    e = header[k]
    assert e["dtype"] == code and tuple(e["shape"]) == t.shape
    lo, hi = e["data_offsets"]
    np.testing.assert_array_equal(np.frombuffer(blob[8 + n + lo:8 + n + hi], dtype=npdt).reshape(t.shape), t.numpy())
  back = safe_load(tmp_path / "m.safetensors")
  assert back.keys() == sd.keys()
  for k, t in sd.items():
    assert back[k].dtype == t.dtype
    np.testing.assert_array_equal(back[k].numpy(), t.numpy())
  from_tensor = safe_load(Tensor(np.frombuffer(blob, dtype=np.uint8)))
  np.testing.assert_array_equal(from_tensor["f"].numpy(), sd["f"].numpy())
  with pytest.raises(ValueError, match="not a safetensors file"): safe_load(Tensor(np.zeros(16, dtype=np.uint8)))
