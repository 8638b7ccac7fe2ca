#!/usr/bin/env python3
"""Staged MoE steps on one box: whole steps against staged ones, alternated.

Writes a DeepSeek-V3.2-shaped checkpoint (duck-mkmodel: hidden --hidden,
--layers layers of which one dense, --experts routed experts of
--moe-intermediate, top 8 in 8 groups, --shared-experts shared ones),
compiles it at tp 1 twice (`duckc --stage-shared off` and `on`), and runs
duckrun on one duck of one core with one host thread, the two plans
alternated for --rounds rounds of --tokens tokens (the logits compared
every round: they must be the same bits).

Per round, from the summaries:
  saved      the MoE op's time a token, whole less staged
  S          the stages' own time on the duck a token (staged run's
             stage_kernel_ms_total over its decoded tokens)
  R          the routers' time a token (whole run's host_norms_router less
             its RmsNorm ops)
  min(S, R)  what the cost model's staged term hides with no links (the
             host and the duck on separate machines), less, with
             --host-frame-us X (duck-measure-cluster's host_frame_us), the
             one more frame a staged layer costs the host (the routed
             slots' request; the stage is quiet): X a MoE layer
and the medians, with saved / min(S, R): on one box the router and the
stage share the memory and the stage's frames cost the host, so the ratio
says how much of the modelled overlap this box shows.

Writes WORK/stage.json (every run). WORK is BUILD/bench-stage.
"""
import argparse
import filecmp
import json
import os
import shutil
import statistics
import subprocess
import sys


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True)
    if r.returncode != 0:
        sys.exit(f"bench-stage: {' '.join(cmd)} failed ({r.returncode}):\n"
                 f"{r.stderr}")
    return r


def make_plans(a, bin_dir, work):
    model = os.path.join(work, "model")
    # The checkpoint and plans of another shape (an earlier run's) go.
    shape = {k: getattr(a, k) for k in ("hidden", "layers", "experts",
                                         "moe_intermediate", "shared_experts")}
    key = os.path.join(work, "shape.json")
    old = json.load(open(key)) if os.path.exists(key) else None
    if old != shape:
        for d in ("model", "plan-off", "plan-on"):
            shutil.rmtree(os.path.join(work, d), ignore_errors=True)
    if not os.path.exists(os.path.join(model, "config.json")):
        run([os.path.join(bin_dir, "duck-mkmodel"), "-q", "--preset",
             "tiny-deepseek", "--family", "deepseek_v32",
             "--hidden", str(a.hidden), "--layers", str(a.layers),
             "--dense-layers", "1", "--heads", "4", "--intermediate", "256",
             "--moe-intermediate", str(a.moe_intermediate),
             "--experts", str(a.experts), "--top-k", "8",
             "--shared-experts", str(a.shared_experts), "--n-group", "8",
             "--topk-group", "4", "--q-lora", "64", "--kv-lora", "64",
             "--qk-nope", "32", "--qk-rope", "16", "--v-head", "32",
             "--index-heads", "2", "--index-head-dim", "32",
             "--index-topk", "64", "--vocab", "512", "-o", model])
    plans = {}
    for stage in ("off", "on"):
        plan = os.path.join(work, "plan-" + stage)
        if not os.path.exists(os.path.join(plan, "model.duckplan")):
            run([os.path.join(bin_dir, "duckc"), "compile", model, "--tp", "1",
                 "--lm-head", "checkpoint", "--stage-shared", stage, "-o",
                 plan])
        plans[stage] = plan
    json.dump(shape, open(key, "w"))
    return plans


def one_run(bin_dir, plan, tokens, work, name):
    logits = os.path.join(work, name + ".logits")
    summary = os.path.join(work, name + ".json")
    run([os.path.join(bin_dir, "duckrun"), plan, "--threads", "1",
         "--cores-per-duck", "1", "--prompt-ids", "13,402,77,5,261,99",
         "--max-tokens", str(tokens), "--ignore-eos", "--quiet",
         "--logits-out", logits, "--summary-json", summary])
    return logits, json.load(open(summary))


def figures(whole, staged, frames_ms):
    tokens = max(1, staged["generated_tokens"] - 1)
    by_w = whole["decode_ms_per_token_by_op"]
    by_s = staged["decode_ms_per_token_by_op"]
    s = staged["stage_kernel_ms_total"] / tokens
    r = whole["decode_breakdown_ms"]["host_norms_router"] - by_w.get(
        "RmsNorm", 0)
    return {"tpot_whole_ms": whole["tpot_ms"],
            "tpot_staged_ms": staged["tpot_ms"],
            "saved_moe_ms": by_w["MoeFfn"] - by_s["MoeFfn"],
            "stage_ms": s, "router_ms": r,
            "modelled_ms": min(s, r) - frames_ms,
            "stages": staged["stages"], "stage_resent": staged["stage_resent"]}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", default="build")
    p.add_argument("--work")
    p.add_argument("--hidden", type=int, default=7168)
    p.add_argument("--layers", type=int, default=5)
    p.add_argument("--experts", type=int, default=256)
    p.add_argument("--moe-intermediate", type=int, default=32)
    p.add_argument("--shared-experts", type=int, default=1)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--tokens", type=int, default=96)
    p.add_argument("--host-frame-us", type=float, default=0.0)
    a = p.parse_args()
    if a.rounds < 1 or a.tokens < 2:
        sys.exit("bench-stage: --rounds must be at least 1, --tokens 2")
    bin_dir = os.path.join(a.build, "bin")
    work = a.work or os.path.join(a.build, "bench-stage")
    os.makedirs(work, exist_ok=True)
    plans = make_plans(a, bin_dir, work)
    # One more frame a duck (one here) a MoE layer, a token: the routed
    # slots' request (the stage is quiet).
    frames_ms = a.host_frame_us * (a.layers - 1) / 1e3
    rows = []
    for i in range(a.rounds):
        lw, whole = one_run(bin_dir, plans["off"], a.tokens, work, "whole")
        ls, staged = one_run(bin_dir, plans["on"], a.tokens, work, "staged")
        if not filecmp.cmp(lw, ls, shallow=False):
            sys.exit(f"bench-stage: round {i + 1}: the staged plan's logits "
                     "differ from the whole plan's")
        f = figures(whole, staged, frames_ms)
        rows.append(f)
        print(f"round {i + 1}: TPOT {f['tpot_whole_ms']:.3f} -> "
              f"{f['tpot_staged_ms']:.3f} ms; MoE op saved "
              f"{f['saved_moe_ms']:.3f} ms a token; S {f['stage_ms']:.3f}, "
              f"R {f['router_ms']:.3f}, modelled {f['modelled_ms']:.3f}; "
              f"{f['stages']} stages, {f['stage_resent']} resent; logits "
              "identical")
    med = {k: statistics.median(r[k] for r in rows)
           for k in ("tpot_whole_ms", "tpot_staged_ms", "saved_moe_ms",
                     "modelled_ms")}
    med["tpot_saved_ms"] = statistics.median(
        r["tpot_whole_ms"] - r["tpot_staged_ms"] for r in rows)
    ratio = (med["saved_moe_ms"] / med["modelled_ms"]
             if med["modelled_ms"] != 0 else 0.0)
    print(f"medians: TPOT {med['tpot_whole_ms']:.3f} -> "
          f"{med['tpot_staged_ms']:.3f} ms (per round {med['tpot_saved_ms']:.3f} "
          f"saved); MoE op saved {med['saved_moe_ms']:.3f} against modelled "
          f"{med['modelled_ms']:.3f}: measured / modelled {ratio:.2f}")
    json.dump({"rounds": rows, "medians": med, "ratio": ratio,
               "shape": vars(a)}, open(os.path.join(work, "stage.json"), "w"),
              indent=1)


if __name__ == "__main__":
    main()
