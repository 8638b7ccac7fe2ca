#!/usr/bin/env python3
"""duck-bench e2e: decode and prefill end to end, optionally beside llama.cpp.

Shapes (random FP8 checkpoints written by duck-mkmodel, 128x128 block scales):
  q06  Qwen3-0.6B: 28 layers, hidden 1024, vocab 151936, tied embeddings
  q30  Qwen3-30B-A3B truncated to --moe-layers layers (default 2), 128
       experts top-8 at 768, vocab --moe-vocab (default 1024)
  ds   DeepSeek-V3.2 at real dims, one dense + one MoE layer, vocab 8192
       (about 12 GB of FP8; not in the default set)

Each shape is compiled for every --arrangements entry DUCKSxCORES (default
1xN and Nx1 on an N-core machine: one duck with every core, or one duck a
core) and run on the local cluster with a --prompt-token prompt and --tokens
generated tokens. duckrun's summary gives decode tok/s, TPOT, prefill tok/s,
the per-token breakdown (host attention, host norms/router, LM head, duck
kernel, dispatch gap, other), the weight bytes a token and
decode_bound_fraction (the token rate those bytes allow at the read
bandwidth measured right before that run: duck-bench kernels --filter
read-bw over at least 1 GiB, passed as duckrun --read-bw-gbs).

--lm-head LIST runs each arrangement once for each duckc --lm-head choice
(int8, the default: quantised at load, 1.0625 bytes a weight, its top
rows exact; checkpoint: the head as the checkpoint has it; fp9: 1.125
bytes a weight).

With --llama-bench PATH (a llama.cpp build's llama-bench, with llama-quantize
beside it), every shape but ds is also written as a GGUF of the very same
weights (utils/hf-to-gguf.py with that checkout's gguf-py), quantised to
Q8_0 with llama-quantize, and llama-bench runs at N threads and at 1 thread
(`-p P -n 0` for the prompt, `-p 0 -n T -d P` for decoding after a context
of the prompt's length, the depth duckrun decodes at), alternated with the
duckrun runs for --rounds rounds. The
ratio printed is duckrun's best arrangement over llama.cpp at N threads
(the same cores), per round, then the median.

Writes WORK/e2e.json (every run) and WORK/e2e.png (the decode breakdown;
needs matplotlib, Debian's python3-matplotlib). WORK is BUILD/bench-e2e.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LABEL = {"q06": "Qwen3-0.6B shape", "q30": "Qwen3-30B-A3B shape", "ds": "DeepSeek-V3.2 shape"}
PARTS = ["host_attention", "host_norms_router", "lm_head", "duck_kernel", "dispatch_gap", "other"]


def fail(msg):
    print(f"bench-e2e: {msg}", file=sys.stderr)
    sys.exit(1)


def log(msg):
    print(f"== {msg}", file=sys.stderr, flush=True)


def run(cmd, **kw):
    try:
        return subprocess.run(cmd, check=True, **kw)
    except subprocess.CalledProcessError as e:
        fail(f"{' '.join(cmd[:3])} ... failed with exit code {e.returncode}")


def mkmodel_args(name, a):
    if name == "q06":
        return ["--preset", "qwen3-0.6b-shape"]
    if name == "q30":
        return ["--preset", "qwen3-30b-a3b-shape", "--layers", str(a.moe_layers), "--vocab", str(a.moe_vocab)]
    if name == "ds":
        return ["--preset", "tiny-deepseek", "--family", "deepseek_v32", "--hidden", "7168", "--layers", "2",
                "--dense-layers", "1", "--heads", "128", "--intermediate", "18432", "--moe-intermediate", "2048",
                "--experts", "256", "--top-k", "8", "--shared-experts", "1", "--n-group", "8", "--topk-group", "4",
                "--q-lora", "1536", "--kv-lora", "512", "--qk-nope", "128", "--qk-rope", "64", "--v-head", "128",
                "--index-heads", "64", "--index-head-dim", "128", "--index-topk", "2048", "--vocab", "8192",
                "--max-pos", "163840"]
    fail(f"unknown model {name} (q06, q30, ds)")


def parse_arrangements(text):
    out = []
    for item in text.split(","):
        try:
            d, c = (int(x) for x in item.lower().split("x"))
        except ValueError:
            fail(f"--arrangements: {item!r} is not DUCKSxCORES (e.g. 1x2)")
        if d < 1 or c < 1:
            fail(f"--arrangements: {item!r} needs at least one duck and one core")
        out.append((d, c))
    return out


def machine_facts(llama_bench):
    """The CPU every figure comes from, the ISA the host's kernels use and
    what the llama.cpp build was configured with (its CMakeCache)."""
    facts = {"cpu_model": "unknown", "cpu_family": None, "cpu_model_id": None, "cpu_avx512": False}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, val = line.partition(":")
                key, val = key.strip(), val.strip()
                if key == "model name" and facts["cpu_model"] == "unknown":
                    facts["cpu_model"] = val
                elif key == "cpu family" and facts["cpu_family"] is None:
                    facts["cpu_family"] = int(val)
                elif key == "model" and facts["cpu_model_id"] is None:
                    facts["cpu_model_id"] = int(val)
                elif key == "flags":
                    flags = val.split()
                    facts["cpu_avx512"] = "avx512f" in flags and "avx512dq" in flags
                    break
    except OSError:
        pass
    masked = os.environ.get("DUCK_HOST_ISA") == "avx2"
    facts["host_isa"] = "avx512" if facts["cpu_avx512"] and not masked else "avx2"
    if llama_bench:
        cache = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(llama_bench))), "CMakeCache.txt")
        opts = {}
        if os.path.exists(cache):
            for line in open(cache):
                k, _, v = line.strip().partition("=")
                name = k.split(":")[0]
                if name in ("GGML_NATIVE", "GGML_AVX2", "GGML_AVX512", "GGML_AVX512_VNNI", "GGML_AVX_VNNI"):
                    opts[name] = v
        facts["llama_cmake"] = opts or "unknown (no CMakeCache.txt above llama-bench)"
    return facts


def main():
    n = os.cpu_count() or 1
    ap = argparse.ArgumentParser(prog="duck-bench e2e", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="q06,q30", help="comma list of q06, q30, ds (default q06,q30)")
    ap.add_argument("--arrangements", default=f"1x{n},{n}x1" if n > 1 else "1x1",
                    help=f"comma list of DUCKSxCORES (default 1x{n},{n}x1)")
    ap.add_argument("--tokens", type=int, default=64, help="generated tokens a run (default 64)")
    ap.add_argument("--prompt-tokens", type=int, default=64, help="prompt tokens a run (default 64)")
    ap.add_argument("--rounds", type=int, default=2, help="alternated rounds (default 2)")
    ap.add_argument("--lm-head", default="int8",
                    help="comma list of duckc --lm-head choices to run (checkpoint, int8, fp9, ducks; default int8, duckc's default)")
    ap.add_argument("--kv-cache", default="f32", choices=["f32", "f16"],
                    help="duckrun --kv-cache (default f32; llama.cpp keeps an f16 cache by default)")
    ap.add_argument("--moe-layers", type=int, default=2, help="layers of the q30 shape (default 2)")
    ap.add_argument("--moe-vocab", type=int, default=1024, help="vocab of the q30 shape (default 1024)")
    ap.add_argument("--llama-bench", metavar="PATH", help="llama.cpp's llama-bench: run it beside duckrun")
    ap.add_argument("--build", default=os.environ.get("DUCK_BUILD_DIR", os.path.join(ROOT, "build")),
                    help="Duck build directory (default $DUCK_BUILD_DIR or ./build)")
    ap.add_argument("--json", help="results file (default WORK/e2e.json)")
    ap.add_argument("--plot", help="breakdown plot (default WORK/e2e.png)")
    a = ap.parse_args()
    if a.tokens < 2 or a.prompt_tokens < 1 or a.rounds < 1:
        fail("--tokens must be >= 2, --prompt-tokens and --rounds >= 1")
    models = a.models.split(",")
    for m in models:
        mkmodel_args(m, a)
    arrangements = parse_arrangements(a.arrangements)
    heads = a.lm_head.split(",")
    for h in heads:
        if h not in ("checkpoint", "int8", "fp9", "ducks"):
            fail(f"--lm-head: {h!r} is not checkpoint, int8, fp9 or ducks")
    configs = [(d, c, h) for h in heads for d, c in arrangements]
    bin_ = os.path.join(a.build, "bin")
    for t in ("duck-mkmodel", "duckc", "duckrun", "duck-bench"):
        if not os.access(os.path.join(bin_, t), os.X_OK):
            fail(f"{bin_}/{t} is missing; build first (utils/build.sh)")
    work = os.path.join(a.build, "bench-e2e")
    os.makedirs(work, exist_ok=True)

    def env_for(plan):
        # Each plan its own weight cache: a local duck keeps one image, so
        # plans that took turns in one cache made every measured run a
        # cache miss, measured while the upload's pages were still being
        # written back (2026-12-05). A user's second run of a plan is a hit.
        return dict(os.environ, XDG_CACHE_HOME=os.path.join(work, "cache", os.path.basename(plan)))

    llama = None
    if a.llama_bench:
        bench = os.path.abspath(a.llama_bench)
        quant = os.path.join(os.path.dirname(bench), "llama-quantize")
        if not os.access(bench, os.X_OK):
            fail(f"--llama-bench {bench}: not an executable")
        if not os.access(quant, os.X_OK):
            fail(f"{quant}: missing (llama-quantize must sit beside llama-bench)")
        src = os.path.dirname(os.path.abspath(bench))
        while src != "/" and not os.path.isdir(os.path.join(src, "gguf-py")):
            src = os.path.dirname(src)
        if src == "/":
            fail(f"no gguf-py found above {bench} (it must be inside a llama.cpp checkout)")
        llama = {"bench": bench, "quantize": quant, "gguf_py": os.path.join(src, "gguf-py")}

    bw_file = os.path.join(work, "bw.json")

    def measure_read_bw():
        """The machine's read bandwidth on n cores now (duck-bench kernels
        --filter read-bw: 1 GiB or more, before and after, the higher)."""
        run([os.path.join(bin_, "duck-bench"), "kernels", "--cores", str(n), "--filter", "read-bw", "--json",
             "--json-file", bw_file], stdout=subprocess.DEVNULL)
        rows = json.load(open(bw_file)).get("read_bw", [])
        return {r["cores"]: r["read_bw_gb_s"] for r in rows}

    log("machine read bandwidth (duck-bench kernels --filter read-bw)")
    read_bw = measure_read_bw()

    prompt = ",".join(str(1 + (37 * i) % 1000) for i in range(a.prompt_tokens))
    plans = {}
    for m in models:
        ckpt = os.path.join(work, m if m != "q30" else f"q30-l{a.moe_layers}-v{a.moe_vocab}")
        if not os.path.isdir(ckpt):
            log(f"{LABEL[m]}: writing the checkpoint")
            run([os.path.join(bin_, "duck-mkmodel"), *mkmodel_args(m, a), "--dtype", "fp8", "-q", "-o", ckpt])
        for d, c, h in configs:
            plan = f"{ckpt}-{d}x{c}" + ("" if h == "checkpoint" else f"-{h}head") + "-plan"
            log(f"{LABEL[m]}: compiling for {d} duck(s) x {c} core(s), LM head {h}")
            run([os.path.join(bin_, "duckc"), "compile", ckpt, "--tp", str(d), "--cores-per-duck", str(c),
                 "--lm-head", h, "--force", "-o", plan], stdout=subprocess.DEVNULL)
            # Warm-up: fills the weight cache and the page cache.
            run([os.path.join(bin_, "duckrun"), plan, "--prompt-ids", prompt, "--max-tokens", "4", "--ignore-eos",
                 "--quiet", "--cores-per-duck", str(c)], stdout=subprocess.DEVNULL, env=env_for(plan))
            plans[(m, d, c, h)] = plan
        if llama and m != "ds":
            q8 = os.path.join(work, "gguf", os.path.basename(ckpt) + "-q8_0.gguf")
            if not os.path.exists(q8):
                os.makedirs(os.path.dirname(q8), exist_ok=True)
                f16 = q8.replace("-q8_0.gguf", "-f16.gguf")
                log(f"{LABEL[m]}: writing the same weights as GGUF for llama.cpp")
                py = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
                run([py, os.path.join(ROOT, "utils", "hf-to-gguf.py"), ckpt, f16, "--gguf-py", llama["gguf_py"]])
                run([llama["quantize"], f16, q8 + ".tmp", "Q8_0"], stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL)
                os.replace(q8 + ".tmp", q8)
                os.unlink(f16)
            llama[m] = q8

    runs = []
    for r in range(a.rounds):
        for m in models:
            for d, c, h in configs:
                log(f"round {r + 1}/{a.rounds}: {LABEL[m]}, duckrun {d}x{c}, LM head {h}")
                sj = os.path.join(work, f"run-{m}-{d}x{c}-{h}-{r}.json")
                # decode_bound_fraction against the bandwidth of this very
                # window, not a figure cached on some earlier day.
                bw_now = measure_read_bw().get(n, 0)
                run([os.path.join(bin_, "duckrun"), plans[(m, d, c, h)], "--prompt-ids", prompt, "--max-tokens",
                     str(a.tokens), "--ignore-eos", "--quiet", "--cores-per-duck", str(c), "--kv-cache",
                     a.kv_cache, "--summary-json", sj, "--read-bw-gbs", f"{bw_now:.2f}"],
                    stdout=subprocess.DEVNULL, env=env_for(plans[(m, d, c, h)]))
                s = json.load(open(sj))
                runs.append({"round": r, "model": m, "runner": "duckrun", "ducks": d, "cores": c, "lm_head": h,
                             "kv_cache": a.kv_cache,
                             "decode_tok_s": s["decode_tok_s"], "tpot_ms": s["tpot_ms"],
                             "prefill_tok_s": s["prefill_tok_s"], "breakdown_ms": s["decode_breakdown_ms"],
                             "prefill_ms_per_token_by_op": s.get("prefill_ms_per_token_by_op"),
                             "host_bytes_per_token": s["host_bytes_per_token"],
                             "duck_bytes_per_token": s["duck_bytes_per_token"],
                             "decode_bound_fraction": s["decode_bound_fraction"],
                             "read_bw_gb_s": bw_now,
                             "judge_gap_us_p50": s["judge_gap_us_p50"]})
            if llama and m in llama:
                for threads in sorted({n, 1}, reverse=True):
                    log(f"round {r + 1}/{a.rounds}: {LABEL[m]}, llama-bench -t {threads}")
                    rec = {"round": r, "model": m, "runner": "llama.cpp Q8_0", "threads": threads}
                    # The prompt alone, then decoding after a context of the
                    # prompt's length (-d), as duckrun decodes after its
                    # prompt: both decode rates are at the same depth.
                    for args in (["-p", str(a.prompt_tokens), "-n", "0"],
                                 ["-p", "0", "-n", str(a.tokens), "-d", str(a.prompt_tokens)]):
                        out = run([llama["bench"], "-m", llama[m], *args, "-t", str(threads), "-r", "1",
                                   "-o", "json"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL).stdout
                        for t in json.loads(out):
                            if t.get("n_gen", 0) > 0:
                                rec["decode_tok_s"] = t["avg_ts"]
                            elif t.get("n_prompt", 0) > 0:
                                rec["prefill_tok_s"] = t["avg_ts"]
                    runs.append(rec)

    result = {"date": time.strftime("%Y-%m-%d %H:%M"), "cpus": n, "machine": machine_facts(a.llama_bench),
              "read_bw_gb_s": read_bw,
              "tokens": a.tokens, "prompt_tokens": a.prompt_tokens, "kv_cache": a.kv_cache, "runs": runs}
    json_path = a.json or os.path.join(work, "e2e.json")
    with open(json_path + ".tmp", "w") as f:
        json.dump(result, f, indent=1)
    os.replace(json_path + ".tmp", json_path)
    report(result, models, configs, n)
    plot(result, models, configs, a.plot or os.path.join(work, "e2e.png"))
    print(f"\nresults: {json_path}")


def span(vals, fmt="{:.2f}"):
    vals = sorted(vals)
    if not vals:
        return "-"
    return fmt.format(vals[0]) if len(vals) == 1 or fmt.format(vals[0]) == fmt.format(vals[-1]) \
        else f"{fmt.format(vals[0])}-{fmt.format(vals[-1])}"


def config_label(d, c, h):
    return f"duckrun {d} duck x {c} core" + ("" if h == "checkpoint" else f", {h} head")


def matches(r, m, d, c, h):
    return (r["model"] == m and r["runner"] == "duckrun" and (r["ducks"], r["cores"]) == (d, c)
            and r.get("lm_head", "checkpoint") == h)


def report(res, models, configs, n):
    runs = res["runs"]
    mf = res.get("machine", {})
    if mf:
        fam = f", family {mf['cpu_family']:#x} model {mf['cpu_model_id']:#x}" if mf.get("cpu_family") is not None else ""
        print(f"CPU: {mf['cpu_model']}{fam}, {n} CPUs, AVX-512 {'yes' if mf['cpu_avx512'] else 'no'}; "
              f"host kernels: {mf['host_isa']}" + (" (DUCK_HOST_ISA=avx2)" if mf["cpu_avx512"] and
                                                    mf["host_isa"] == "avx2" else ""))
        if "llama_cmake" in mf:
            print(f"llama.cpp build: {mf['llama_cmake']}")
    per_run = [r["read_bw_gb_s"] for r in runs if r.get("read_bw_gb_s")]
    if per_run:  # each duckrun run's reference, measured right before it
        print(f"read bandwidth on {n} cores: {min(per_run):.1f}-{max(per_run):.1f} GB/s over the runs "
              "(each run's bound fraction against its own figure)")
    print(f"read bandwidth at the start: {res['read_bw_gb_s']} GB/s by cores; {res['prompt_tokens']}-token prompt, "
          f"{res['tokens']} generated; duckrun's KV cache {res.get('kv_cache', 'f32')}; "
          f"ranges over {1 + max(r['round'] for r in runs)} round(s)")
    for m in models:
        print(f"\n{LABEL[m]}")
        print(f"  {'runner':<38}{'decode tok/s':>16}{'TPOT ms':>16}{'prefill tok/s':>16}{'bound frac':>12}")
        for d, c, h in configs:
            rs = [r for r in runs if matches(r, m, d, c, h)]
            print(f"  {config_label(d, c, h):<38}{span([r['decode_tok_s'] for r in rs]):>16}"
                  f"{span([r['tpot_ms'] for r in rs]):>16}{span([r['prefill_tok_s'] for r in rs]):>16}"
                  f"{span([r['decode_bound_fraction'] for r in rs], '{:.3f}'):>12}")
            b = {k: statistics.median(r["breakdown_ms"].get(k, 0) for r in rs) for k in PARTS}
            print("    ms a token: " + ", ".join(f"{k} {v:.2f}" for k, v in b.items()))
        for threads in sorted({n, 1}, reverse=True):
            rs = [r for r in runs if r["model"] == m and r["runner"] != "duckrun" and r["threads"] == threads]
            if rs:
                print(f"  {f'llama.cpp Q8_0 -t {threads}':<38}{span([r['decode_tok_s'] for r in rs]):>16}"
                      f"{span([1e3 / r['decode_tok_s'] for r in rs]):>16}{span([r['prefill_tok_s'] for r in rs]):>16}")
        peer = {r["round"]: r for r in runs if r["model"] == m and r["runner"] != "duckrun" and r["threads"] == n}
        for h in sorted({h for _, _, h in configs}, key=lambda h: h != "checkpoint") if peer else []:
            for key, what in (("decode_tok_s", "decode"), ("prefill_tok_s", "prefill")):
                ratios = []
                for rnd, p in peer.items():
                    ours = [r[key] for r in runs if r["model"] == m and r["runner"] == "duckrun"
                            and r.get("lm_head", "checkpoint") == h and r["round"] == rnd
                            and r["ducks"] * r["cores"] <= n]
                    if ours and p.get(key):
                        ratios.append(max(ours) / p[key])
                if ratios:
                    print(f"  {what}, LM head {h}: duckrun (best arrangement on {n} cores) / llama.cpp -t {n}: "
                          f"median {statistics.median(ratios):.2f} (rounds: {', '.join(f'{x:.2f}' for x in ratios)})")


def plot(res, models, configs, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("bench-e2e: no matplotlib (Debian's python3-matplotlib); no plot written", file=sys.stderr)
        return
    runs = res["runs"]
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 4.5), squeeze=False)
    for ax, m in zip(axes[0], models):
        labels, bottoms = [], []
        bars = {k: [] for k in PARTS}
        for d, c, h in configs:
            rs = [r for r in runs if matches(r, m, d, c, h)]
            labels.append(f"duck {d}x{c}" + ("" if h == "checkpoint" else f"\n{h} head"))
            for k in PARTS:
                bars[k].append(statistics.median(r["breakdown_ms"].get(k, 0) for r in rs))
        bottoms = [0.0] * len(labels)
        for k in PARTS:
            ax.bar(labels, bars[k], bottom=bottoms, label=k)
            bottoms = [b + v for b, v in zip(bottoms, bars[k])]
        peers = sorted({r["threads"] for r in runs if r["model"] == m and r["runner"] != "duckrun"}, reverse=True)
        for t in peers:
            rs = [1e3 / r["decode_tok_s"] for r in runs if r["model"] == m and r["runner"] != "duckrun"
                  and r["threads"] == t]
            ax.bar([f"llama -t {t}"], [statistics.median(rs)], color="grey")
        ax.tick_params(axis="x", labelsize=8, labelrotation=30)
        ax.set_title(LABEL[m])
        ax.set_ylabel("decode ms a token")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"duck-bench e2e, {res['date']}")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()
