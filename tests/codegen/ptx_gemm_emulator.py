"""Runs the tensor-core matmul kernel's LLVM IR (codegen/nvptx_gemm.py) on the CPU, so that its tiling, copies,
fragment layouts and edge handling are tested without a GPU.

Each block of the grid runs as 256 numpy lanes, one per thread; the IR's instructions are interpreted a line at a
time (the few kinds the kernel generator writes). Shared memory is a byte array; global memory is the kernel's
buffers, each at an address of its own. The inline PTX is given its documented meaning:
  * cp.async copies 16 bytes (or src-size of them, the rest zeros) when its group is waited for, so a read of a
    ring slot before the wait shows up as the NaN bits shared memory starts with; `early=True` copies at issue
    instead, which catches a refill that overwrites a slot still being read;
  * ldmatrix.x4 (.trans): lanes 8i..8i+7 give matrix i's row addresses; lane l receives row l/4, columns 2(l%4)
    and 2(l%4)+1 of each matrix (of its transpose);
  * mma.m16n8k16: the fragment layouts of PTX's documentation, computed in float32.
Branches must be uniform across a block (the kernel's are). The (paired) epilogue call is not run: each (ranges, acc)
it is called with where its flag is set is recorded, and the caller checks them (and may run the epilogue on the
CPU, by the calls as the kernel makes them).
A gathered factor's loader is called per lane through `loaders` (the caller compiles it for the CPU).
"""
from __future__ import annotations

import re

import numpy as np

M32 = 0xFFFFFFFF
SHARED = 1 << 20


def _half_to_f32(bits: np.ndarray, ty: str) -> np.ndarray:
  bits = bits.astype(np.uint16)
  if ty == "f16": return bits.view(np.float16).astype(np.float32)
  return (bits.astype(np.uint32) << 16).view(np.float32)


def run(ir_text: str, launch, buffers: list[np.ndarray], early: bool = False, loaders=None,
        pairs: list | None = None) -> list[tuple[tuple[int, ...], float]]:
  """The (range values, acc) of every element the paired epilogue is called for with its flag set, over the whole
  grid. buffers: the kernel's buffers as numpy arrays (read as bytes). loaders: name -> f(list of i64 arguments per
  lane) -> the 16 bits, for each gathered factor's loader (its pointer arguments are left out: the caller knows its
  buffers). pairs: if given, each call with either flag set is appended to it whole, as (ranges 0, ranges 1,
  acc 0, acc 1, ok 0, ok 1), for the caller to run the paired epilogue itself."""
  T, W = launch.block, launch.block // 32
  body = ir_text.split("\nentry:\n", 1)[1].split("\n}\n", 1)[0]
  blocks, cur = {"entry": []}, "entry"
  for line in body.splitlines():
    s = line.strip()
    if s.endswith(":") and not s.startswith("%"): cur = s[:-1]; blocks[cur] = []
    elif s: blocks[cur].append(s)
  mem = [np.frombuffer(b.tobytes(), np.uint8) for b in buffers]
  base = [(i + 1) << 40 for i in range(len(buffers))]
  lane = np.arange(T) % 32
  g, t = (lane // 4).reshape(W, 32), (lane % 4).reshape(W, 32)
  calls = []

  def gbytes(addr, n):
    """n bytes of global memory at each lane's address."""
    out = np.zeros((len(addr), n), np.uint8)
    for i, a in enumerate(addr):
      buf = int(a) >> 40
      off = int(a) - base[buf - 1]
      assert 1 <= buf <= len(mem) and 0 <= off and off + n <= mem[buf - 1].size, f"global read out of bounds: {a:#x}"
      out[i] = mem[buf - 1][off:off + n]
    return out

  gx, gy, gz = launch.grid
  for bz in range(gz):
    for by in range(gy):
      for bx in range(gx):
        smem = np.full(launch.smem, 0xFF, np.uint8)
        groups, open_group = [], []
        env = {f"%g{i}": np.full(T, base[i], np.int64) for i in range(len(buffers))}
        env["%n"] = np.full(T, 1, np.int64)

        def val(tok):
          tok = tok.strip()
          if tok in ("@smem", "%lds"): return np.full(T, SHARED, np.int64)   # (%lds: the OpenCL kernel's __local argument)
          if tok.startswith("%"): return env[tok]
          if tok in ("true", "false"): return np.full(T, tok == "true")
          return np.full(T, float(tok), np.float32) if "." in tok else np.full(T, int(tok), np.int64)

        def sh(addr, n):
          off = np.asarray(addr, np.int64) - SHARED
          assert np.all(off >= 0) and np.all(off + n <= smem.size), "shared memory out of range"
          return off[..., None] + np.arange(n)

        def land(copies):
          for dst, src, n in copies:
            data = gbytes(src[n > 0], 16) if np.any(n > 0) else None
            block = np.zeros((T, 16), np.uint8)
            if data is not None: block[n > 0] = data
            keep = np.arange(16)[None, :] < n[:, None]
            block[~keep] = 0
            smem[sh(dst, 16)] = block

        def asm(text, args, nout):
          ref = lambda tok: args[int(tok.strip()[1:]) - nout]
          if text.startswith("cp.async.cg"):
            m = re.match(r"cp\.async\.cg\.shared\.global \[\$(\d)\], \[\$(\d)\], 16, \$(\d);", text)
            dst, src, n = (ref(f"${m.group(i)}") for i in (1, 2, 3))
            copy = (dst, src, n.astype(np.int64))
            if early: land([copy])
            else: open_group.append(copy)
            return None
          if text.startswith("cp.async.commit_group"): groups.append(list(open_group)); open_group.clear(); return None
          if text.startswith("cp.async.wait_group"):
            keep = int(text.split()[1].rstrip(";"))
            while len(groups) > keep: land(groups.pop(0))
            return None
          if text.startswith("ldmatrix"):
            addr = ref(re.search(r"\[(\$\d+)\]", text).group(1))
            rows = smem[sh(addr, 16)].reshape(W, 4, 8, 16).view(np.uint16)   # warp, matrix, row, 8 halves
            w = np.arange(W)[:, None]
            regs = []
            for i in range(4):
              mat = rows[:, i]
              if ".trans" in text: lo, hi = mat[w, 2 * t, g], mat[w, 2 * t + 1, g]
              else: lo, hi = mat[w, g, 2 * t], mat[w, g, 2 * t + 1]
              regs.append((lo.astype(np.int64) | (hi.astype(np.int64) << 16)).ravel())
            return regs
          if text.startswith("mma.sync"):
            ty = "bf16" if ".bf16" in text else "f16"
            _, ag, bg, cg = [grp.split(",") for grp in re.findall(r"\{([^}]*)\}", text)]
            a, b, c = ([ref(v).reshape(W, 32) for v in grp] for grp in (ag, bg, cg))
            lo = lambda r: _half_to_f32(r & 0xFFFF, ty)
            hi = lambda r: _half_to_f32(r >> 16, ty)
            A, B = np.zeros((W, 16, 16), np.float32), np.zeros((W, 16, 8), np.float32)
            C = np.zeros((W, 16, 8), np.float32)
            w = np.arange(W)[:, None]
            for reg, r0, k0 in ((a[0], 0, 0), (a[1], 8, 0), (a[2], 0, 8), (a[3], 8, 8)):
              A[w, g + r0, 2 * t + k0], A[w, g + r0, 2 * t + k0 + 1] = lo(reg), hi(reg)
            for reg, k0 in ((b[0], 0), (b[1], 8)):
              B[w, 2 * t + k0, g], B[w, 2 * t + k0 + 1, g] = lo(reg), hi(reg)
            C[w, g, 2 * t], C[w, g, 2 * t + 1], C[w, g + 8, 2 * t], C[w, g + 8, 2 * t + 1] = c
            D = np.matmul(A, B) + C
            return [D[w, g, 2 * t].ravel(), D[w, g, 2 * t + 1].ravel(), D[w, g + 8, 2 * t].ravel(),
                    D[w, g + 8, 2 * t + 1].ravel()]
          raise NotImplementedError(text)

        def uniform(c):
          assert np.all(c == c[0]), "a divergent branch"
          return bool(c[0])

        prev, cur = None, "entry"
        while True:
          insts = blocks[cur]
          phis = [s for s in insts if " = phi " in s]
          new = {}
          for s in phis:
            name, rest = s.split(" = phi ")
            for v_, lbl in re.findall(r"\[ ([^,]+), %([\w.]+) \]", rest):
              if lbl == prev: new[name] = val(v_)
          env.update(new)
          nxt = None
          for s in insts[len(phis):]:
            if s.startswith("br "):
              m = re.match(r"br i1 (\S+), label %(\S+), label %(\S+)", s)
              nxt = (m.group(2) if uniform(val(m.group(1))) else m.group(3)) if m else s.split("%")[-1]
              break
            if s == "ret void": nxt = "ret"; break
            if s.startswith("call void @llvm.nvvm.barrier0"): continue
            if s.startswith("call void @rulec_tc_epilogue2("):
              args = [a.strip().rsplit(" ", 1)[1] for a in s[s.index("(") + 1:-1].split(",")]
              ok0, ok1 = (val(a).astype(bool) for a in args[-2:])
              acc0, acc1 = (val(a) for a in args[-4:-2])
              ints = [val(a) for a in args[:-4] if not a.startswith("%gp")]
              half = len(ints) // 2
              for i in range(len(ok0)):
                v0, v1 = tuple(int(v[i]) for v in ints[:half]), tuple(int(v[i]) for v in ints[half:])
                if ok0[i]: calls.append((v0, float(acc0[i])))
                if ok1[i]: calls.append((v1, float(acc1[i])))
                if pairs is not None and (ok0[i] or ok1[i]):
                  pairs.append((v0, v1, float(acc0[i]), float(acc1[i]), bool(ok0[i]), bool(ok1[i])))
              continue
            if s.startswith("store i16 "):
              v_, p = re.match(r"store i16 (\S+), ptr addrspace\(3\) (\S+), align", s).groups()
              smem[sh(val(p), 2)] = (val(v_).astype(np.int64)[:, None] >> np.array([0, 8])) & 0xFF
              continue
            name, expr = s.split(" = ", 1) if " = " in s.split('"')[0] else (None, s)
            op = expr.split()[0]
            if op in ("add", "mul", "xor", "or", "and", "shl", "lshr", "udiv", "urem"):
              ty, a, b = re.match(r"\w+ (i1|i32|i64) ([^,]+), (.+)", expr).groups()
              a, b = val(a), val(b)
              if ty == "i1": r = a & b
              else:
                r = {"add": lambda: a + b, "mul": lambda: a * b, "xor": lambda: a ^ b, "or": lambda: a | b,
                     "and": lambda: a & b, "shl": lambda: a << b, "lshr": lambda: a >> b, "udiv": lambda: a // b,
                     "urem": lambda: a % b}[op]()
                r = r & M32 if ty == "i32" else r
            elif op == "call" and expr.startswith("call i16 @"):
              fn = expr.split("@")[1].split("(")[0]
              args = [a.strip().rsplit(" ", 1)[1] for a in expr[expr.index("(") + 1:-1].split(",")]
              ints = [val(a) for a in args if not a.startswith("%gp")]
              r = np.array([loaders[fn]([int(v[i]) for v in ints]) for i in range(T)], np.int64)
            elif op == "call":
              if "@llvm.nvvm.read.ptx.sreg" in expr:
                reg = expr.split("sreg.")[1].split("(")[0]
                r = {"tid.x": np.arange(T), "ctaid.x": np.full(T, bx), "ctaid.y": np.full(T, by),
                     "ctaid.z": np.full(T, bz)}[reg].astype(np.int64)
              else:
                m = re.search(r'asm (?:sideeffect )?"([^"]*)", "([^"]*)"\((.*)\)$', expr)
                nout = m.group(2).count("=")
                args = [a.strip().rsplit(" ", 1)[1] for a in m.group(3).split(",")] if m.group(3).strip() else []
                r = asm(m.group(1), [val(a) for a in args], nout)
            elif op == "getelementptr":
              b_, off = re.match(r"getelementptr i8, ptr addrspace\(\d\) (\S+), i\d+ (\S+)", expr).groups()
              r = val(b_) + val(off)
            elif op in ("ptrtoint", "addrspacecast"): r = val(expr.split()[3])
            elif op == "zext": r = val(expr.split()[2])
            elif op == "icmp":
              cc, a, b = re.match(r"icmp (\w+) i(?:32|64) ([^,]+), (.+)", expr).groups()
              r = (val(a) < val(b)) if cc == "ult" else (val(a) == val(b))
            elif op == "select":
              c, ty, a, b = re.match(r"select i1 (\S+), (i16|i32|ptr addrspace\(1\)) ([^,]+), \S+(?: addrspace\(1\))? (.+)", expr).groups()
              r = np.where(val(c), val(a), val(b))
            elif op == "extractvalue": r = val(expr.split("} ")[1].split(",")[0])[int(expr.split(",")[-1])]
            else: raise NotImplementedError(s)
            if name: env[name] = r
          if nxt == "ret": break
          prev, cur = cur, nxt
  return calls
