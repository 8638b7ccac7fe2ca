"""Safetensors, FP8 E4M3 and bf16 with numpy, for the oracle tests.

Written from shared/reference/FORMATS.md alone: no code or convention is
taken from Duck's C++ importer, packer or runtime, so a misreading there
shows up as a disagreement here.
"""
import json
import os
import struct

import numpy as np

_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16,
           "BF16": np.uint16, "F8_E4M3": np.uint8, "I64": np.int64,
           "I32": np.int32, "U8": np.uint8, "I8": np.int8}


def e4m3_table():
    """The 256 FP8 E4M3 codes as float64 (NaN for the two NaN codes)."""
    out = np.empty(256)
    for b in range(256):
        s, e, m = b >> 7, (b >> 3) & 15, b & 7
        if e == 15 and m == 7:
            v = float("nan")
        elif e == 0:
            v = m / 8.0 * 2.0 ** -6
        else:
            v = (1 + m / 8.0) * 2.0 ** (e - 7)
        out[b] = -v if s else v
    return out


E4M3 = e4m3_table()


def bf16_to_f32(u16):
    return (u16.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x):
    """Round to nearest even, as torch does."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    u = u.astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def f32_to_e4m3(x):
    """Nearest E4M3 code for each value (|x| <= 448), ties to even code."""
    mags = E4M3[:127]  # codes 0..126, increasing, finite
    a = np.abs(x)
    mid = (mags[1:] + mags[:-1]) / 2
    code = np.searchsorted(mid, a, side="left")
    # exact midpoints go to the even code
    at_mid = (code < 126) & (a == mid[np.minimum(code, 125)])
    code = np.where(at_mid & (code % 2 == 1), code + 1, code)
    sign = np.where(np.signbit(x), 0x80, 0)
    return (code | sign).astype(np.uint8)


class Checkpoint:
    """A model directory: config.json plus single or sharded safetensors."""

    def __init__(self, d):
        self.dir = d
        with open(os.path.join(d, "config.json")) as f:
            self.config = json.load(f)
        idx = os.path.join(d, "model.safetensors.index.json")
        if os.path.exists(idx):
            with open(idx) as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        else:
            files = sorted(n for n in os.listdir(d)
                           if n.endswith(".safetensors"))
        self.tensors = {}
        for name in files:
            self._read(os.path.join(d, name))

    def _read(self, path):
        with open(path, "rb") as f:
            raw = f.read()
        (n,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8:8 + n])
        data = raw[8 + n:]
        for name, info in header.items():
            if name == "__metadata__":
                continue
            dt = _DTYPES[info["dtype"]]
            b, e = info["data_offsets"]
            shape = info["shape"]
            count = int(np.prod(shape)) if shape else 1
            if e - b != count * np.dtype(dt).itemsize:
                raise ValueError("%s: tensor %s has %d bytes for shape %s"
                                 % (path, name, e - b, shape))
            arr = np.frombuffer(data, dtype=dt, count=count, offset=b)
            self.tensors[name] = (info["dtype"], arr.reshape(shape))

    def has(self, name):
        return name in self.tensors

    def block(self):
        q = self.config.get("quantization_config") or {}
        bs = q.get("weight_block_size")
        if bs is None:
            raise ValueError("FP8 tensors but no "
                             "quantization_config.weight_block_size")
        return int(bs[0]), int(bs[1])

    def get(self, name):
        """The tensor as float64; FP8 times its block scale (fp32 product,
        as the checkpoint's own dequantisation does)."""
        dtype, arr = self.tensors[name]
        if dtype == "BF16":
            return bf16_to_f32(arr).astype(np.float64)
        if dtype != "F8_E4M3":
            return arr.astype(np.float64)
        w = E4M3[arr].astype(np.float32)
        s = self.get(name + "_scale_inv").astype(np.float32)
        br, bc = self.block()
        rows, cols = w.shape
        want = (-(-rows // br), -(-cols // bc))
        if s.shape != want:
            raise ValueError("%s_scale_inv has grid %s, expected %s for %s "
                             "with %dx%d blocks" % (name, s.shape, want,
                                                    w.shape, br, bc))
        full = np.repeat(np.repeat(s, br, axis=0), bc, axis=1)[:rows, :cols]
        return (w * full).astype(np.float64)


def write_safetensors(path, tensors):
    """tensors: [(name, dtype string, numpy array)] in file order."""
    header, off, blobs = {}, 0, []
    for name, dtype, arr in tensors:
        b = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape),
                        "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    text = json.dumps(header)
    text += " " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text.encode())
        for b in blobs:
            f.write(b)
