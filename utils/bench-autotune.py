#!/usr/bin/env python3
"""The cost model with measured duck inputs, and --tp auto against explicit
choices, on this machine's two cores.

For each shape (the checkpoints of `duck-bench e2e`, in BUILD/bench-e2e):
two duckd's of one core each are started on loopback; `duckc
measure-cluster` measures them (read bandwidth, fp9 rate, dispatch gap:
the duck-side inputs, from the ducks, not from a run); one calibration run
gives the host's time a token (the one input the ducks cannot measure);
then `duckc compile --tp auto` chooses, and the winner and the explicit
alternatives (tp 1 on one duck, tp 2 with each multiple_of and strategy)
are compiled and run in alternation. Prints each candidate's predicted and
measured TPOT, and auto's measured TPOT over the best explicit one's. The
prefill inputs go in too (a one-core duck's fp9 GEMM rate at 64 rows from
`duck-bench kernels`, the host's time a prompt token from the calibration
run), and each candidate's predicted and measured prompt rate is printed.

  utils/bench-autotune.py [--build DIR] [--models q06,q30] [--tokens N]
                          [--rounds R] [--json FILE] [--arena-mib MIB]
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys

CKPT = {"q06": "q06", "q30": "q30-l2-v1024"}
LINE = re.compile(r"TPOT ([0-9.]+) ms: fp9 stream ([0-9.]+) \+ dispatch "
                  r"([0-9.]+) \+ host ([0-9.]+)")
PREFILL = re.compile(r"prefill ([0-9.]+) tok/s")


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"bench-autotune: {' '.join(cmd)} failed ({r.returncode}):\n"
                 f"{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return r


def start_duckd(bin_dir, work, name, cpu):
    log = open(os.path.join(work, f"{name}.log"), "w")
    p = subprocess.Popen([os.path.join(bin_dir, "duckd"), "--port", "0",
                          "--name", name, "--cores", "1", "--cpu_offset",
                          str(cpu), "--cache_dir", os.path.join(work, name),
                          "--weights_size", "2G"],
                         stdout=subprocess.PIPE, stderr=log, text=True)
    m = re.search(r"listening on ([0-9.]+):([0-9]+)", p.stdout.readline())
    if not m:
        sys.exit(f"bench-autotune: duckd {name} did not start")
    return p, {"host": m.group(1), "port": int(m.group(2))}


def table(candidates, auto, unit, pred, meas, digits):
    """Each candidate's prediction beside its measured rounds (markdown)."""
    print(f"| candidate | predicted {unit} | measured {unit} | "
          "predicted / measured |")
    print("|---|---|---|---|")
    for c in candidates:
        med = statistics.median(meas[c])
        tag = " (auto)" if c == auto else ""
        print(f"| tp {c[0]}, {c[1]}, {c[2]}{tag} | {pred[c]:.{digits}f} | "
              f"{' / '.join(f'{v:.{digits}f}' for v in meas[c])} | "
              f"{pred[c] / med:.2f} |")


def ids(seed):
    return ",".join(str((seed + 37 * i) % 1000 + 10) for i in range(64))


def main():
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a.add_argument("--build", default="build")
    a.add_argument("--models", default="q06,q30")
    # Tokens decoded a measurement. 256: at 32 the 30B-A3B shape's runs
    # (~5 ms a token) lasted 0.2 s and identical plans differed by up to
    # 25 % between rounds; at 256 by 2-7 %.
    a.add_argument("--tokens", type=int, default=256)
    a.add_argument("--rounds", type=int, default=2)
    a.add_argument("--json")
    # duckc measure-cluster's cold set a duck (its default: 1024).
    a.add_argument("--arena-mib", type=int)
    args = a.parse_args()
    bin_dir = os.path.join(args.build, "bin")
    base = os.path.join(args.build, "bench-e2e")
    work = os.path.join(base, "autotune")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    duckc, duckrun = os.path.join(bin_dir, "duckc"), os.path.join(bin_dir, "duckrun")
    results = []
    procs = []
    try:
        eps = []
        for i in range(2):
            p, ep = start_duckd(bin_dir, work, f"d{i}", i)
            procs.append(p)
            eps.append(ep)
        files = {t: os.path.join(work, f"cluster{t}.json") for t in (1, 2)}
        json.dump({"ducks": eps}, open(files[2], "w"))
        r = run([duckc, "measure-cluster", files[2]] +
                (["--arena-mib", str(args.arena_mib)] if args.arena_mib else []))
        print(r.stdout, end="")
        measured = json.load(open(files[2]))

        # A one-core duck's fp9 GEMM rate at 64 rows (the prefill input of
        # the cost model; the measure request does not carry it).
        r = run([os.path.join(bin_dir, "duck-bench"), "kernels", "--filter",
                 "prefill/Qwen3-0.6B", "--json"])
        gemm = [x["gflop_s"] / 2 for x in json.loads(r.stdout)["records"]
                if x.get("tokens") == 64 and x.get("cores") == 1]
        gemm_gmac_s = gemm[0] if gemm else 0
        print(f"fp9 GEMM at 64 rows, one core: {gemm_gmac_s:.1f} GMAC/s")

        for m in args.models.split(","):
            ckpt = os.path.join(base, CKPT[m])
            if not os.path.isdir(ckpt):
                sys.exit(f"bench-autotune: no {ckpt} (run duck-bench e2e first)")
            plans = {}

            def plan_for(tp, mo, strategy):
                key = (tp, mo, strategy)
                if key not in plans:
                    out = os.path.join(work, f"{m}-tp{tp}-mo{mo}-{strategy}")
                    run([duckc, "compile", ckpt, "--cluster", files[tp],
                         "--tp", str(tp), "--multiple-of", str(mo),
                         "--strategy", strategy, "-o", out, "--force"])
                    plans[key] = out
                return plans[key]

            def tpot(plan, tp, seed):
                summary = os.path.join(work, "summary.json")
                run([duckrun, plan, "--cluster", files[tp], "--prompt-ids",
                     ids(seed), "--max-tokens", str(args.tokens),
                     "--ignore-eos", "--quiet", "--summary-json", summary])
                return json.load(open(summary))

            # The host's time a token: one calibration run (tp 2, 128).
            json.dump(measured, open(files[2], "w"))
            one = dict(measured, ducks=measured["ducks"][:1])
            json.dump(one, open(files[1], "w"))
            s = tpot(plan_for(2, 128, "intermediate"), 2, 1)
            b = s["decode_breakdown_ms"]
            host = (b["host_attention"] + b["host_norms_router"] +
                    b["lm_head"] + b["other"])
            # The host's time a prompt token: every op but the FFNs.
            host_prefill = sum(v for k, v in
                               s["prefill_ms_per_token_by_op"].items()
                               if k not in ("DenseFfn", "MoeFfn"))
            for t in (1, 2):
                c = json.load(open(files[t]))
                c["host_ms_per_token"] = host
                if gemm_gmac_s:
                    c["fp9_gemm_gmac_s"] = gemm_gmac_s
                    c["host_prefill_ms_per_token"] = host_prefill
                json.dump(c, open(files[t], "w"))

            r = run([duckc, "compile", ckpt, "--cluster", files[2], "--tp",
                     "auto", "--explain", "--dry-run"])
            chosen = re.search(r"chosen: tp ([0-9]+), multiple_of ([0-9]+), "
                               r"strategy (\w+)", r.stdout)
            auto = (int(chosen.group(1)), int(chosen.group(2)), chosen.group(3))
            moe = "experts" in r.stdout
            candidates = [(1, 128, "intermediate"), (2, 128, "intermediate"),
                          (2, 32, "intermediate")]
            if moe:
                candidates.append((2, 128, "experts"))
            if auto not in candidates:
                candidates.append(auto)
            pred, pred_pf = {}, {}
            for c in candidates:
                r = run([duckc, "compile", ckpt, "--cluster", files[c[0]],
                         "--tp", str(c[0]), "--multiple-of", str(c[1]),
                         "--strategy", c[2], "--explain", "--dry-run"])
                pred[c] = float(LINE.search(r.stdout).group(1))
                pf = PREFILL.search(r.stdout)
                pred_pf[c] = float(pf.group(1)) if pf else 0.0
                plan_for(*c)
            meas = {c: [] for c in candidates}
            meas_pf = {c: [] for c in candidates}
            for rnd in range(args.rounds):
                for c in candidates:
                    sj = tpot(plan_for(*c), c[0], 2 + rnd)
                    meas[c].append(sj["tpot_ms"])
                    meas_pf[c].append(sj["prefill_tok_s"])
            best = min(candidates, key=lambda c: statistics.median(meas[c]))
            print(f"\n{m}: host {host:.2f} ms a token (calibration run); "
                  f"auto chose tp {auto[0]}, multiple_of {auto[1]}, {auto[2]}")
            table(candidates, auto, "TPOT ms", pred, meas, 2)
            if gemm_gmac_s:
                print(f"prefill (host {host_prefill:.2f} ms a prompt token "
                      f"in the calibration run):")
                table(candidates, auto, "tok/s", pred_pf, meas_pf, 1)
            ratio = statistics.median(meas[auto]) / statistics.median(meas[best])
            print(f"auto / best explicit measured TPOT: {ratio:.3f} "
                  f"(best: tp {best[0]}, {best[1]}, {best[2]}; target <= 1.05)")
            results.append({"model": m, "host_ms": host, "auto": list(auto),
                            "best": list(best), "auto_over_best": ratio,
                            "candidates": [{"tp": c[0], "multiple_of": c[1],
                                            "strategy": c[2],
                                            "predicted_ms": pred[c],
                                            "measured_ms": meas[c],
                                            "predicted_prefill_tok_s":
                                                pred_pf[c],
                                            "measured_prefill_tok_s":
                                                meas_pf[c]}
                                           for c in candidates]})
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait()
    if args.json:
        json.dump({"measured_cluster": measured, "shapes": results},
                  open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
