"""Independent check of a plan's fp9 weight images against the checkpoint.

  fp9_images.py PLAN_DIR MODEL_DIR [--plan-dump duck-plan-dump]

Written from docs/fp9.md and docs/plan.md, and from what `duck-plan-dump`
prints (where each duck's slots and packed matrices sit in its image); it
calls none of Duck's C++ beyond that dump. It finds every matrix the plan
puts on a duck (FFN gate/up/down slices, routed and shared experts, and the
head slots: LM head, o_proj, the query projection, the attention input
group), decodes magnitudes, signs and scales itself (fp9_np.py) and
compares them with the checkpoint read by safetensors_np.py:

- FP8 sources must convert exactly: every weight's fp9 magnitude equals
  its e4m3 magnitude, its sign bit the e4m3 sign bit, and every block's
  scale the scale_inv of the checkpoint tile it lies in.
- bf16/f16/f32 sources are quantised here by docs/fp9.md's rule on the
  slice the duck holds, and the codes, signs and scales must be the same.

It also checks that the ducks together hold every FFN matrix of the model
once (gate/up rows, down columns). Prints `oracle: bit-exact matrices: N of
N`; on the first difference it names the duck, slot, matrix, tensor, row
and column and exits 1.
"""
import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fp9_np  # noqa: E402
from safetensors_np import E4M3, Checkpoint, bf16_to_f32  # noqa: E402

ROLES = ("gate_proj", "up_proj", "down_proj")


class Mismatch(Exception):
    pass


def load_plan(plan_dir, tool):
    if os.path.isfile(plan_dir) and plan_dir.endswith(".json"):
        with open(plan_dir) as f:
            return json.load(f), os.path.dirname(plan_dir)
    r = subprocess.run([tool, plan_dir], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit("oracle: %s %s failed: %s" % (tool, plan_dir,
                                                        r.stderr.strip()))
    return json.loads(r.stdout), plan_dir


def scale_rows_of(ck):
    """Source rows that share a scale row, for every duck matrix of the
    plan: an FP8 checkpoint's declared block rows (docs/fp9.md), which its
    float matrices on the ducks (a bf16 LM head) share; 128 for a float
    checkpoint (the row tile duckc uses to quantise float sources)."""
    q = ck.config.get("quantization_config") or {}
    if q.get("quant_method") == "fp8" or q.get("weight_block_size"):
        return ck.block()[0]
    return 128


def ffn_pieces(slot, op, ck):
    """[(matrix index, tensor, row0, col0, row_phase_source_row)] of an FFN
    slot: gate/up rows [inter_begin, inter_end), down columns the same."""
    if op is None:
        raise Mismatch("FFN slot of layer %d: no FFN op names it"
                       % slot["layer"])
    L = slot["layer"]
    pre = "model.layers.%d.mlp." % L
    E = op["params"].get("num_experts", 0)
    n_shared = op["params"].get("num_shared", 0)
    ib = slot["inter_begin"]
    out = []
    for i, m in enumerate(slot["matrices"]):
        e, role = m["expert"], m["role"]
        shift = 0
        if not slot["moe"]:
            base = pre
        elif e < E:
            base = pre + "experts.%d." % e
        else:
            # shared expert s: the fused shared_experts MLP, cut in equal
            # parts when there are several
            s = e - E
            base = pre + "shared_experts."
            if n_shared > 1:
                shift = s * ck.tensors[base + "gate_proj.weight"][1].shape[0] \
                    // n_shared
        name = base + ROLES[role] + ".weight"
        if role < 2:
            out.append((i, name, shift + ib, 0, True))
        else:
            out.append((i, name, 0, shift + ib, False))
    return out


def head_groups(plan):
    """slot index -> [tensor names], rows concatenated in this order
    (docs/plan.md: the LM head; o_proj; the query slot; the input group)."""
    groups = {}
    by_layer = collections.defaultdict(dict)
    for op in plan["ops"]:
        p = op["params"]
        names = {k: v["name"] for k, v in p.items()
                 if isinstance(v, dict) and "name" in v}
        if op["params_type"] in ("GqaAttentionOpDef", "MlaAttentionOpDef",
                                 "IndexerOpDef"):
            by_layer[op["layer"]].update(
                {("ix." if op["params_type"] == "IndexerOpDef" else "") + k: v
                 for k, v in names.items()})
    for op in plan["ops"]:
        p, t = op["params"], op["params_type"]
        n = by_layer.get(op["layer"], {})
        if t == "LmHeadOpDef" and p.get("on_ducks"):
            groups[p["duck_slot"]] = [p["weight"]["name"]]
        if t in ("GqaAttentionOpDef", "MlaAttentionOpDef"):
            mla = t == "MlaAttentionOpDef"
            if p.get("o_proj_on_ducks"):
                groups[p["o_proj_slot"]] = [n["o_proj"]]
            if p.get("q_proj_on_ducks"):
                groups[p["q_proj_slot"]] = [n["q_b_proj"] if mla and
                                            "q_b_proj" in n else n["q_proj"]]
            if p.get("in_proj_on_ducks"):
                if mla:
                    groups[p["in_proj_slot"]] = [
                        n.get("q_a_proj") or n["q_proj"],
                        n["kv_a_proj_with_mqa"]]
                else:
                    groups[p["in_proj_slot"]] = [n["q_proj"], n["k_proj"],
                                                 n["v_proj"]]
        if t == "IndexerOpDef" and p.get("on_ducks"):
            groups[p["in_proj_slot"]] = [n["q_a_proj"],
                                         n["kv_a_proj_with_mqa"], n["ix.wk"]]
            groups[p["q_proj_slot"]] = [n["q_b_proj"], n["ix.wq_b"]]
    return groups


def head_pieces(slot, names, ck):
    """Each matrix of a head slot is one piece of the group's rows
    [inter_begin, inter_end), in order."""
    starts, at = [], 0
    for nm in names:
        starts.append(at)
        at += ck.tensors[nm][1].shape[0]
    out, pos = [], slot["inter_begin"]
    for i, m in enumerate(slot["matrices"]):
        j = max(j for j, s in enumerate(starts) if s <= pos)
        out.append((i, names[j], pos - starts[j], 0, True))
        pos += m["rows"]
    if pos != slot["inter_end"]:
        raise Mismatch("head slot pieces cover rows up to %d, slot says %d"
                       % (pos, slot["inter_end"]))
    return out


def source_slice(ck, name, row0, col0, rows, k):
    dtype, arr = ck.tensors[name]
    R, C = arr.shape
    if row0 + rows > R or col0 + k > C:
        raise Mismatch("slice rows [%d, %d) columns [%d, %d) outside %s %s"
                       % (row0, row0 + rows, col0, col0 + k, name,
                          list(arr.shape)))
    return dtype, arr[row0:row0 + rows, col0:col0 + k]


def first_diff(bad):
    r, c = np.argwhere(bad)[0]
    return int(r), int(c)


def check_matrix(buf, m, ck, name, row0, col0, sr, where):
    rows, k, block = m["rows"], m["k"], m["block"]
    phase = row0 % sr
    codes, neg, scales, tile_of_row, lay = fp9_np.unpack(
        buf, m["offset"], rows, k, block, sr, phase)
    dtype, src = source_slice(ck, name, row0, col0, rows, k)

    def fail(what, r, c):
        raise Mismatch("%s: %s row %d column %d (local row %d column %d): %s"
                       % (where, name, row0 + r, col0 + c, r, c, what))

    bad = np.isnan(fp9_np.MAGNITUDE[codes])
    if bad.any():
        r, c = first_diff(bad)
        fail("reserved magnitude code 0x%02x" % codes[r, c], r, c)
    if dtype == "F8_E4M3":
        br, bc = ck.block()
        if br != sr or bc % block:
            raise Mismatch("%s: %s: block %d does not fit the %dx%d FP8 tiles"
                           % (where, name, block, br, bc))
        if col0 % block:
            raise Mismatch("%s: %s: first column %d not on a block"
                           % (where, name, col0))
        want_mag = np.abs(E4M3[src])
        if np.isnan(want_mag).any():
            r, c = first_diff(np.isnan(want_mag))
            fail("the checkpoint's weight is NaN", r, c)
        got_mag = fp9_np.MAGNITUDE[codes]
        bad = got_mag != want_mag
        if bad.any():
            r, c = first_diff(bad)
            fail("image magnitude %r (code 0x%02x), checkpoint e4m3 %r "
                 "(byte 0x%02x)" % (got_mag[r, c], codes[r, c],
                                    want_mag[r, c], src[r, c]), r, c)
        bad = neg != ((src & 0x80) != 0)
        if bad.any():
            r, c = first_diff(bad)
            fail("image sign %s, checkpoint e4m3 byte 0x%02x"
                 % ("-" if neg[r, c] else "+", src[r, c]), r, c)
        sinv = ck.tensors[name + "_scale_inv"][1].astype(np.float32)
        t0 = row0 // sr
        cols = (col0 + np.arange(lay["blocks"]) * block) // bc
        want_s = sinv[t0:t0 + lay["tiles"]][:, cols]
        if want_s.shape != scales.shape:
            raise Mismatch("%s: %s: %d scale tiles in the image, %d in the "
                           "checkpoint" % (where, name, scales.shape[0],
                                           want_s.shape[0]))
        bad = scales.view(np.uint32) != want_s.view(np.uint32)
        if bad.any():
            t, b = first_diff(bad)
            r = max(t * sr - phase, 0)
            fail("scale of tile %d block %d is %r, checkpoint scale_inv %r"
                 % (t, b, float(scales[t, b]), float(want_s[t, b])),
                 r, b * block)
        # And the weights as the checkpoint's own dequantisation gives
        # them (fp32 e4m3 * scale_inv, safetensors_np), bit for bit.
        got = fp9_np.dequantise(codes, neg, scales, tile_of_row, block)
        want = ck.get(name)[row0:row0 + rows, col0:col0 + k].astype(np.float32)
        bad = got.view(np.uint32) != want.view(np.uint32)
        if bad.any():
            r, c = first_diff(bad)
            fail("weight %r, checkpoint %r" % (float(got[r, c]),
                                               float(want[r, c])), r, c)
        return "fp8"
    if dtype == "BF16":
        w = bf16_to_f32(src)
    elif dtype in ("F32", "F16"):
        w = src.astype(np.float32)
    else:
        raise Mismatch("%s: %s has dtype %s" % (where, name, dtype))
    want_c, want_n, want_s = fp9_np.quantise(w, block, sr, phase)
    bad = scales.view(np.uint32) != want_s.view(np.uint32)
    if bad.any():
        t, b = first_diff(bad)
        fail("scale of tile %d block %d is %r, docs/fp9.md's rule gives %r"
             % (t, b, float(scales[t, b]), float(want_s[t, b])),
             max(t * sr - phase, 0), b * block)
    bad = codes != want_c
    if bad.any():
        r, c = first_diff(bad)
        fail("image code 0x%02x, docs/fp9.md's rule gives 0x%02x for %r"
             % (codes[r, c], want_c[r, c], float(w[r, c])), r, c)
    bad = neg != want_n
    if bad.any():
        r, c = first_diff(bad)
        fail("image sign %s for %r" % ("-" if neg[r, c] else "+",
                                       float(w[r, c])), r, c)
    return dtype.lower()


def covered(intervals, n):
    """True when the intervals tile [0, n) exactly once."""
    at = 0
    for b, e in sorted(intervals):
        if b != at:
            return False
        at = e
    return at == n


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("plan", help="plan directory (or a duck-plan-dump JSON "
                   "file next to the images)")
    p.add_argument("model", help="the checkpoint directory")
    p.add_argument("--plan-dump", default=shutil.which("duck-plan-dump")
                   or "duck-plan-dump")
    a = p.parse_args()
    plan, plan_dir = load_plan(a.plan, a.plan_dump)
    ck = Checkpoint(a.model)
    sr = scale_rows_of(ck)
    ffn_ops = {op["params"]["step"]["slot"]: op for op in plan["ops"]
               if op["params_type"] in ("DenseFfnOpDef", "MoeFfnOpDef")}
    heads = head_groups(plan)
    total, kinds = 0, collections.Counter()
    cover = collections.defaultdict(list)  # (tensor, axis) -> intervals
    try:
        for duck in plan["ducks"]:
            with open(os.path.join(plan_dir, duck["image"]), "rb") as f:
                buf = f.read()
            if len(buf) != duck["image_bytes"]:
                raise Mismatch("duck %d: %s has %d bytes, the plan says %d"
                               % (duck["rank"], duck["image"], len(buf),
                                  duck["image_bytes"]))
            for si, slot in enumerate(duck["slots"]):
                if slot["head"]:
                    if si not in heads:
                        raise Mismatch("duck %d slot %d: a head slot no op "
                                       "names" % (duck["rank"], si))
                    pieces = head_pieces(slot, heads[si], ck)
                else:
                    pieces = ffn_pieces(slot, ffn_ops.get(si), ck)
                end = slot["offset"] + slot["bytes"]
                for i, name, row0, col0, by_rows in pieces:
                    m = slot["matrices"][i]
                    where = ("duck %d slot %d (layer %d) matrix %d"
                             % (duck["rank"], si, slot["layer"], i))
                    lay = fp9_np.plane_layout(m["rows"], m["k"], m["block"],
                                              sr, row0 % sr)
                    if not (slot["offset"] <= m["offset"] and
                            m["offset"] + lay["total"] <= end):
                        raise Mismatch("%s: %s outside its slot" % (where,
                                                                    name))
                    kinds[check_matrix(buf, m, ck, name, row0, col0, sr,
                                       where)] += 1
                    total += 1
                    if by_rows:
                        cover[(name, 0)].append((row0, row0 + m["rows"]))
                        want_k = ck.tensors[name][1].shape[1]
                    else:
                        cover[(name, 1)].append((col0, col0 + m["k"]))
                        want_k = ck.tensors[name][1].shape[0]
                        if m["rows"] != want_k:
                            raise Mismatch("%s: %d rows, %s has %d"
                                           % (where, m["rows"], name, want_k))
                        continue
                    if m["k"] != want_k:
                        raise Mismatch("%s: K %d, %s has %d columns"
                                       % (where, m["k"], name, want_k))
        # Every FFN matrix of the model (routed and shared experts included)
        # and every head group the plan uses, held once.
        ffn = re.compile(r"model\.layers\.\d+\.mlp\.(experts\.\d+\.|"
                         r"shared_experts\.)?(gate|up|down)_proj\.weight$")
        need = [(n, 1 if "down_proj" in n else 0) for n in ck.tensors
                if ffn.match(n)]
        need += [(n, 0) for g in heads.values() for n in g]
        for name, axis in sorted(set(need)):
            size = ck.tensors[name][1].shape[axis]
            if not covered(cover.get((name, axis), []), size):
                raise Mismatch("%s: the ducks hold %s %s of %d, not each "
                               "once" % (name, "rows" if axis == 0 else
                                         "columns",
                                         sorted(cover.get((name, axis), [])),
                                         size))
    except Mismatch as e:
        print("oracle: mismatch: %s" % e)
        print("oracle: bit-exact matrices before it: %d" % total)
        sys.exit(1)
    print("oracle: bit-exact matrices: %d of %d" % (total, total))
    print("oracle: sources: %s; %d tensors held once"
          % (", ".join("%s %d" % kv for kv in sorted(kinds.items())),
             len(set(need))))


if __name__ == "__main__":
    main()
