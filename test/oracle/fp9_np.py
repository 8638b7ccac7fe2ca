"""fp9 with numpy, for the oracle tests: decoding a packed matrix and
quantising float weights, written from docs/fp9.md alone.

No code is taken from duck-rt's fp9.h / fp9_pack.h or the compiler: the
magnitude table, the plane layout and the quantisation rule are re-derived
from the document, so a disagreement between the document and Duck's C++
shows up as a failing test instead of being shared by both sides.
"""
import numpy as np

EXP_BIAS = 22       # docs/fp9.md "The magnitude code"
TOP = 480.0         # the largest code, 2^(30-22) * (1 + 7/8)
SCALE_MIN = 2.0 ** -40
SCALE_MAX = 2.0 ** 10
PLANE_ALIGN = 64    # every plane starts 64-byte aligned


def magnitude_table():
    """The 256 magnitude codes as float64; NaN marks the reserved codes
    (0x01..0x07 and 0xF8..0xFF), which a valid image never holds."""
    out = np.full(256, np.nan)
    out[0] = 0.0
    for M in range(0x08, 0xF8):
        E, m = M >> 3, M & 7
        out[M] = 2.0 ** (E - EXP_BIAS) * (1 + m / 8.0)
    return out


MAGNITUDE = magnitude_table()


def _align(n):
    return -(-n // PLANE_ALIGN) * PLANE_ALIGN


def plane_layout(rows, k, block, scale_rows, row_phase):
    """Byte offsets of the three planes of a packed [rows, k] matrix
    (docs/fp9.md "Blocks and scales": magnitudes uint8 [rows][k], signs
    uint32 [rows][k/32], scales float [tiles][k/block], each plane 64-byte
    aligned). tiles: the source row tiles the local rows touch, counting
    the partial first one of a slice that starts inside a tile."""
    if k % block or k % 32:
        raise ValueError("k %d is not a multiple of block %d and of 32"
                         % (k, block))
    tiles = -(-(row_phase + rows) // scale_rows)
    mag = 0
    sign = mag + _align(rows * k)
    scale = sign + _align(rows * (k // 32) * 4)
    total = scale + _align(tiles * (k // block) * 4)
    return {"mag": mag, "sign": sign, "scale": scale, "tiles": tiles,
            "blocks": k // block, "total": total}


def unpack(buf, base, rows, k, block, scale_rows, row_phase):
    """Reads a packed matrix at byte `base` of `buf` (a bytes-like image).
    Returns (codes uint8 [rows, k], negative bool [rows, k],
    scales float32 [tiles, k/block], row scale index int [rows], layout)."""
    lay = plane_layout(rows, k, block, scale_rows, row_phase)
    if base + lay["total"] > len(buf):
        raise ValueError("matrix at byte %d (%d bytes) runs past the image "
                         "(%d bytes)" % (base, lay["total"], len(buf)))
    codes = np.frombuffer(buf, np.uint8, rows * k,
                          base + lay["mag"]).reshape(rows, k)
    words = np.frombuffer(buf, "<u4", rows * (k // 32),
                          base + lay["sign"]).reshape(rows, k // 32)
    # weight j of a row: bit j % 32 of sign word j / 32
    bits = (words[:, :, None] >> np.arange(32, dtype=np.uint32)) & 1
    negative = bits.reshape(rows, k).astype(bool)
    scales = np.frombuffer(buf, "<f4", lay["tiles"] * lay["blocks"],
                           base + lay["scale"]).reshape(lay["tiles"],
                                                        lay["blocks"])
    tile_of_row = (np.arange(rows) + row_phase) // scale_rows
    return codes, negative, scales, tile_of_row, lay


def dequantise(codes, negative, scales, tile_of_row, block):
    """sign * fp9(code) * scale as float32 (the kernel contract's value;
    the product of a 4-bit-mantissa code and an fp32 scale, rounded to fp32
    once, as the checkpoint's e4m3 * scale_inv is)."""
    mag = MAGNITUDE[codes].astype(np.float32)
    s = np.repeat(scales[tile_of_row], block, axis=1)
    v = mag * s
    return np.where(negative, -v, v)


def quantise(w, block, scale_rows, row_phase):
    """docs/fp9.md's rule for bf16/f16/f32 sources, on one slice [rows, k]
    as a duck holds it (local row r in scale row (r + row_phase) //
    scale_rows, K-blocks of `block` from the slice's first column):
    scale = max(amax / 480, 2^-40) per (row tile, block) over the slice's
    part of that tile, stored as float32; each weight's v / scale in double
    rounds once to the nearest code, ties to the even code.
    Returns (codes uint8, negative bool, scales float32 [tiles, blocks])."""
    w = np.asarray(w, dtype=np.float32)
    rows, k = w.shape
    tiles = -(-(row_phase + rows) // scale_rows)
    nb = k // block
    tile_of_row = (np.arange(rows) + row_phase) // scale_rows
    absw = np.abs(w).reshape(rows, nb, block).max(axis=2)  # [rows, nb]
    amax = np.zeros((tiles, nb), np.float32)
    np.maximum.at(amax, tile_of_row, absw)
    scales = np.maximum(amax / np.float32(TOP), np.float32(SCALE_MIN))
    scales = scales.astype(np.float32)
    if not np.all(np.isfinite(scales)) or scales.max() > SCALE_MAX:
        raise ValueError("scale outside [2^-40, 2^10]")
    s = np.repeat(scales[tile_of_row], block, axis=1).astype(np.float64)
    q = np.abs(w.astype(np.float64)) / s
    codes = np.zeros(q.shape, np.uint8)
    # Normal range: q in [2^e, 2^(e+1)) has steps of 2^(e-3); n = q / step
    # (exact: a power-of-two scaling) rounded half to even is 8..16, and
    # an even n is an even mantissa code. n = 16 is the next binade's m = 0.
    pos = q > 0
    e = np.floor(np.log2(np.where(pos, q, 1.0)))
    # log2 of a value just below a power of two can round up: fix e so that
    # 2^e <= q < 2^(e+1) holds exactly.
    e = np.where(np.ldexp(1.0, e.astype(int)) > q, e - 1, e)
    e = np.where(np.ldexp(1.0, (e + 1).astype(int)) <= q, e + 1, e)
    n = np.rint(np.ldexp(q, (3 - e).astype(int)))
    E = e + EXP_BIAS + (n == 16)
    m = np.where(n == 16, 0, n - 8)
    normal = pos & (e >= 1 - EXP_BIAS)
    codes[normal] = (E[normal].astype(np.int64) * 8 + m[normal]).astype(np.uint8)
    # Below the smallest code 2^-21: nearest of 0 and 2^-21 (a tie, q ==
    # 2^-22, goes to 0, whose code is the even one of the two mantissas 0).
    tiny = pos & ~normal
    codes[tiny & (q > 2.0 ** -22)] = 0x08
    if codes.max(initial=0) > 0xF7:
        raise ValueError("a weight above 480 x its scale")
    negative = np.signbit(w)
    return codes, negative, scales


def quantised_values(w, block, scale_rows, row_phase):
    """The float64 weights a duck multiplies after quantising the slice w."""
    codes, negative, scales = quantise(w, block, scale_rows, row_phase)
    tile_of_row = (np.arange(w.shape[0]) + row_phase) // scale_rows
    return dequantise(codes, negative, scales, tile_of_row,
                      block).astype(np.float64)
