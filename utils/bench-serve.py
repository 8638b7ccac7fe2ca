#!/usr/bin/python3
"""Bounded load generator and plotter for an OpenAI-compatible server.

Drives a server such as `duckrun serve` with streaming completion requests at
a series of concurrency levels and reports, per level, the aggregate decode
throughput and the per-stream latency (time to first token, time per output
token), each compared with a single stream of the same run. Every request
sets ignore_eos so it generates exactly --max-tokens tokens. The load is
bounded: each level sends streams x --requests-per-stream requests, and only
loopback servers are accepted.

With --plan (the plan the server runs), each level's aggregate is also set
beside the step's bound on this machine (see --help), measured in the same
run: the read bandwidth and fp9 GEMM rate by `duck-bench host`, the bytes a
token reads by a short `duckrun --summary-json` of the plan.

Output: a Markdown table on stdout, progress on stderr, optionally a JSON file
(--json) and a two-panel PNG plot (--png, needs matplotlib).

    utils/bench-serve.py --url http://127.0.0.1:8080 --levels 1,2,4,8 \\
        --plan PLAN --json build/serve-bench.json --png build/serve-bench.png

Exit status: 0 if every request succeeded, 1 if any failed (results are still
printed and written), 2 for bad usage.
"""
import argparse
import datetime
import http.client
import importlib.util
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

LOOPBACK_HOSTS = {"127.0.0.1", "::1", "localhost"}


def parse_args(argv):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="""\
Per level N, N worker threads start together; each sends --requests-per-stream
streaming requests one after another. Reported per level (over successful
requests; failed ones are counted in `errors` and left out of the statistics):
  agg tok/s       completion tokens of the level / wall time from the first
                  request sent to the last one finished
  x single        agg tok/s relative to level 1 (aggregate_vs_single)
  TPOT p50/p99    per request (t_last_token - t_first_token) / (tokens - 1), ms
  p99/single p50  TPOT p99 relative to level-1 TPOT p50 (tpot_p99_vs_single)
  TTFT p50/p99    request sent -> first chunk carrying text, ms
  bound tok/s     (--plan) the most tokens a second a step of N rows (N =
                  streams) can give on this machine, host and ducks sharing
                  its cores and memory:
                    step_s(N) = max(bytes(N) / read_bw, N * params / gemm(N))
                    bytes(N)  = host weight bytes + duck (fp9 FFN) bytes
                                + N * kv_bytes_per_position * context
                    bound     = N / step_s(N)
                  host/duck weight bytes a token and kv bytes a position:
                  `duckrun PLAN --summary-json` (host_bytes_per_token,
                  duck_bytes_per_token, kv_bytes_per_token), run once
                  before the load with its own cache directory; context:
                  the level's mean over requests of prompt_tokens +
                  completion_tokens / 2 (usage); params: multiply-adds a
                  row, the elements of every matrix the plan multiplies
                  (host ops' 2-D weights but the embedding, the ducks'
                  slot matrices scaled by duck bytes a token / slot bytes,
                  which is the active share of an MoE); attention over the
                  context is left out. read_bw and gemm(N): `duck-bench host
                  --only=gemv,gemm --json` on all the box's threads before
                  the load (read_gb_s: a plain read of a cold set; gemm:
                  the best panel's gmac_s at the largest measured row
                  count <= N, its smallest (4) below that)
  x bound         agg tok/s / bound tok/s (bound_ratio)
  limit           which term of step_s is larger: bytes or macs
Percentiles are nearest-rank. Ratios are empty when level 1 is not run.
JSON (--json): {"label", "url", "model", "max_tokens", "date", "levels": [...]}
with one object per level holding the columns above plus token/wall totals and
a few sample error messages; with --plan also "bound" (the machine figures,
the plan's bytes and params, the formula and the commands run) and per level
bound_tok_s, bound_ratio, bound_step_ms, bound_limit, bound_bytes_step,
bound_macs_step, bound_gemm_gmac_s, mean_context.

Output: the table (Markdown) on stdout, one progress line per level on stderr.
Exit status: 0 if every request succeeded, 1 if any failed (everything is
still printed and written), 2 for bad usage.""")
    p.add_argument("--url", required=True, metavar="URL",
                   help="server root, e.g. http://127.0.0.1:8080 (loopback "
                        "hosts only: 127.0.0.1, ::1, localhost)")
    p.add_argument("--api-key", metavar="KEY", help="sent as 'Authorization: Bearer KEY'")
    p.add_argument("--model", metavar="NAME",
                   help="model name (default: first id of GET /v1/models)")
    p.add_argument("--levels", metavar="N,N,...", default="1,2,4,8,16",
                   help="comma-separated concurrency levels (default: %(default)s)")
    p.add_argument("--requests-per-stream", type=int, metavar="R", default=3,
                   help="sequential requests per stream (default: %(default)s)")
    p.add_argument("--max-tokens", type=int, metavar="T", default=32,
                   help="tokens generated per request (default: %(default)s)")
    p.add_argument("--prompt", metavar="TEXT", default="Write a short story about a duck.",
                   help="prompt; ' (stream i)' is appended per stream")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--chat", dest="chat", action="store_true", default=True,
                      help="POST /v1/chat/completions (default)")
    mode.add_argument("--completions", dest="chat", action="store_false",
                      help="POST /v1/completions with a plain prompt")
    p.add_argument("--json", metavar="OUT.json", help="write results as JSON")
    p.add_argument("--png", metavar="OUT.png",
                   help="write a plot: aggregate tok/s (left), TPOT/TTFT ms (right)")
    p.add_argument("--label", metavar="TEXT",
                   help="title of the table and plot (default: model name)")
    p.add_argument("--plan", metavar="DIR",
                   help="the plan the server runs: measure the machine and "
                        "print each level's bound (see below)")
    p.add_argument("--kv-cache", choices=("f32", "f16"), default="f32",
                   help="the server's --kv-cache, for the KV bytes of the "
                        "bound (default: %(default)s)")
    p.add_argument("--bin-dir", metavar="DIR",
                   help="where duckrun, duck-bench and duck-plan-dump are "
                        "(default: build/bin beside this script's repository, "
                        "else PATH)")
    p.add_argument("--duck-bench-args", metavar="ARGS", default="",
                   help="extra arguments for `duck-bench host` (e.g. "
                        "'--cold-mib=64 --reps=1' for a quick check)")
    p.add_argument("--timeout", type=float, metavar="SEC", default=300,
                   help="socket timeout per request in seconds, applied to the "
                        "connect and to each read (default: %(default)s)")
    args = p.parse_args(argv)

    u = urllib.parse.urlsplit(args.url)
    if u.scheme != "http" or not u.hostname:
        p.error(f"--url must be http://HOST[:PORT], got {args.url!r}")
    if u.hostname not in LOOPBACK_HOSTS:
        p.error(f"refusing non-loopback host {u.hostname!r}; use 127.0.0.1, ::1 or localhost")
    args.host, args.port, args.base = u.hostname, u.port or 80, u.path.rstrip("/")
    try:
        args.levels = sorted({int(x) for x in args.levels.split(",") if x.strip()})
    except ValueError:
        p.error(f"--levels must be comma-separated integers, got {args.levels!r}")
    if not args.levels or args.levels[0] < 1:
        p.error("--levels needs at least one level, all >= 1")
    if args.requests_per_stream < 1 or args.max_tokens < 1 or args.timeout <= 0:
        p.error("--requests-per-stream, --max-tokens and --timeout must be positive")
    if args.plan and not os.path.isdir(args.plan):
        p.error(f"--plan must be a plan directory, got {args.plan!r}")
    if args.png and importlib.util.find_spec("matplotlib") is None:
        p.error("--png needs matplotlib (Debian: python3-matplotlib)")
    return args


def headers(args):
    h = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if args.api_key:
        h["Authorization"] = f"Bearer {args.api_key}"
    return h


def fetch_model(args):
    """First model id listed by GET /v1/models."""
    conn = http.client.HTTPConnection(args.host, args.port, timeout=args.timeout)
    try:
        conn.request("GET", args.base + "/v1/models", headers=headers(args))
        resp = conn.getresponse()
        body = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {body[:200]!r}")
        return json.loads(body)["data"][0]["id"]
    finally:
        conn.close()


def one_request(args, model, prompt):
    """Send one streaming request; return its timings, token count and error."""
    if args.chat:
        path = args.base + "/v1/chat/completions"
        body = {"messages": [{"role": "user", "content": prompt}]}
    else:
        path, body = args.base + "/v1/completions", {"prompt": prompt}
    body.update(model=model, max_tokens=args.max_tokens, temperature=0, stream=True,
                stream_options={"include_usage": True}, ignore_eos=True)
    rec = {"t_start": time.perf_counter(), "t_tokens": [], "tokens": 0, "error": None,
           "prompt_tokens": None}
    usage, done, data = None, False, []
    conn = http.client.HTTPConnection(args.host, args.port, timeout=args.timeout)

    def dispatch(payload):  # one complete SSE event
        nonlocal usage, done
        if payload == "[DONE]":
            done = True
            return
        obj = json.loads(payload)  # ValueError -> malformed stream
        if obj.get("error"):
            raise RuntimeError(f"server error in stream: {obj['error']}")
        for choice in obj.get("choices") or []:
            if args.chat:
                delta = choice.get("delta") or {}
                text = delta.get("content") or delta.get("reasoning_content")
            else:
                text = choice.get("text")
            if text:
                rec["t_tokens"].append(time.perf_counter())
        if obj.get("usage"):
            usage = obj["usage"]

    try:
        conn.request("POST", path, body=json.dumps(body).encode(), headers=headers(args))
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {resp.read(200)!r}")
        while not done:
            raw = resp.readline()
            line = raw.decode("utf-8").rstrip("\r\n")
            if line.startswith("data:"):
                data.append(line[5:].removeprefix(" "))
            elif not line and data:  # blank line (or EOF) ends an event
                dispatch("\n".join(data))
                data = []
            if not raw:
                break
        if not done:
            raise RuntimeError("stream ended without data: [DONE]")
        resp.read()  # drain the chunked terminator so the close is clean
        if not rec["t_tokens"]:
            raise RuntimeError("stream carried no content")
        rec["tokens"] = (usage or {}).get("completion_tokens") or len(rec["t_tokens"])
        rec["prompt_tokens"] = (usage or {}).get("prompt_tokens")
    except Exception as e:  # counted, never fatal
        rec["error"] = f"{type(e).__name__}: {e}"
    finally:
        conn.close()
    rec["t_end"] = time.perf_counter()
    return rec


def percentile(values, p):
    """Nearest-rank percentile of a list, None when empty."""
    if not values:
        return None
    s = sorted(values)
    return s[max(1, math.ceil(p / 100 * len(s))) - 1]


def run_level(args, model, n):
    """Run n concurrent streams and summarise them."""
    records, lock, go = [], threading.Lock(), threading.Event()

    def worker(i):
        go.wait()
        for _ in range(args.requests_per_stream):
            rec = one_request(args, model, f"{args.prompt} (stream {i})")
            with lock:
                records.append(rec)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    go.set()  # release all streams at once
    for t in threads:
        t.join()

    ok = [r for r in records if r["error"] is None]
    wall = max(r["t_end"] for r in records) - min(r["t_start"] for r in records)
    tokens = sum(r["tokens"] for r in ok)
    ttft = [(r["t_tokens"][0] - r["t_start"]) * 1e3 for r in ok]
    tpot = [(r["t_tokens"][-1] - r["t_tokens"][0]) * 1e3 / (r["tokens"] - 1)
            for r in ok if r["tokens"] > 1 and len(r["t_tokens"]) > 1]
    errors = [r["error"] for r in records if r["error"] is not None]
    ctx = [r["prompt_tokens"] + r["tokens"] / 2 for r in ok if r["prompt_tokens"] is not None]
    return {
        "concurrency": n, "requests": len(records), "errors": len(errors),
        "completion_tokens": tokens, "wall_s": wall,
        "agg_tok_s": tokens / wall if wall > 0 else None,
        "tpot_p50_ms": percentile(tpot, 50), "tpot_p99_ms": percentile(tpot, 99),
        "ttft_p50_ms": percentile(ttft, 50), "ttft_p99_ms": percentile(ttft, 99),
        "mean_context": sum(ctx) / len(ctx) if ctx else None,
        "error_samples": sorted(set(errors))[:5],
    }

BOUND_FORMULA = ("bound tok/s = N / max(bytes(N) / read_bw, N * params / gemm(N)); "
                 "bytes(N) = host weight bytes + duck weight bytes + "
                 "N * kv bytes a position * mean context")


def find_tool(args, name):
    """A Duck binary: --bin-dir, else build/bin of this repository, else PATH."""
    if args.bin_dir:
        return os.path.join(args.bin_dir, name)
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "build", "bin", name)
    if os.access(here, os.X_OK):
        return here
    return shutil.which(name) or name


def run_tool(cmd):
    print("bench-serve: running " + " ".join(shlex.quote(c) for c in cmd), file=sys.stderr)
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{os.path.basename(cmd[0])} exited {r.returncode}: "
                           f"{r.stderr.strip()[-400:]}")
    return r.stdout


def plan_params(dump):
    """Multiply-adds a row from the plan (duck-plan-dump JSON): the host ops'
    2-D weights but the embedding (and an LM head on the ducks), and the
    ducks' slot matrices (all experts; scaled later by the active share)."""
    host = 0
    for op in dump["ops"]:
        kind, params = op["params_type"], op.get("params") or {}
        if kind == "EmbeddingOpDef" or (kind == "LmHeadOpDef" and params.get("on_ducks")):
            continue
        stack = [params]
        while stack:  # every tensor, however nested
            v = stack.pop()
            if isinstance(v, dict):
                shape = v.get("shape")
                if "role" in v and v.get("role") != "scale" and isinstance(shape, list) \
                        and len(shape) == 2:
                    host += shape[0] * shape[1]
                else:
                    stack.extend(x for x in v.values() if isinstance(x, (dict, list)))
            elif isinstance(v, list):
                stack.extend(x for x in v if isinstance(x, (dict, list)))
    duck, slot_bytes = 0, 0
    for d in dump.get("ducks") or []:
        for slot in d.get("slots") or []:
            slot_bytes += slot.get("bytes", 0)
            duck += sum(m["rows"] * m["k"] for m in slot.get("matrices") or [])
    return host, duck, slot_bytes


def measure_machine(args):
    """The machine's read bandwidth and GEMM rates, and the plan's bytes and
    params: everything the bound needs but the context."""
    bench = [find_tool(args, "duck-bench"), "host", "--only=gemv,gemm", "--json"]
    bench += shlex.split(args.duck_bench_args)
    hb = json.loads(run_tool(bench))
    gemm = {}
    for r in hb["results"]:
        m = re.match(r"gemm (\d+) rows", r.get("what", ""))
        if m and r.get("gmac_s"):
            n = int(m.group(1))
            gemm[n] = max(gemm.get(n, 0.0), r["gmac_s"])
    if not gemm or not hb.get("read_gb_s"):
        raise RuntimeError("duck-bench host gave no read_gb_s or gemm gmac_s")
    dump = json.loads(run_tool([find_tool(args, "duck-plan-dump"), args.plan]))
    host_params, duck_params_all, slot_bytes = plan_params(dump)
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        summary = os.path.join(tmp, "summary.json")
        # Its own cache directory: the server's local ducks hold theirs.
        run = ["env", "XDG_CACHE_HOME=" + os.path.join(tmp, "cache"),
               find_tool(args, "duckrun"), args.plan, "--prompt-ids", "1,2,3",
               "--max-tokens", "2", "--ignore-eos", "--quiet", "--kv-cache", args.kv_cache,
               "--summary-json", summary]
        run_tool(run)
        with open(summary) as f:
            sj = json.load(f)
    duck_bytes = float(sj["duck_bytes_per_token"])
    duck_params = duck_params_all * (duck_bytes / slot_bytes if slot_bytes else 1.0)
    return {
        "formula": BOUND_FORMULA,
        "cpu": hb.get("cpu"), "threads": hb.get("threads"),
        "load_average": hb.get("load_average"),
        "read_gb_s": float(hb["read_gb_s"]),
        "gemm_gmac_s": {str(n): gemm[n] for n in sorted(gemm)},
        "host_bytes_per_token": float(sj["host_bytes_per_token"]),
        "duck_bytes_per_token": duck_bytes,
        "kv_bytes_per_position": float(sj["kv_bytes_per_token"]),
        "host_params": host_params, "duck_params": duck_params,
        "params": host_params + duck_params,
        "commands": [" ".join(shlex.quote(c) for c in bench),
                     "duck-plan-dump " + args.plan,
                     " ".join(shlex.quote(c) for c in run[2:])],
    }


def add_bound(bound, lv):
    """The step bound for lv's stream count (see --help), and the ratio."""
    n, ctx = lv["concurrency"], lv["mean_context"] or 0.0
    rows = sorted(int(k) for k in bound["gemm_gmac_s"])
    g = bound["gemm_gmac_s"][str(max([r for r in rows if r <= n], default=rows[0]))]
    nbytes = (bound["host_bytes_per_token"] + bound["duck_bytes_per_token"]
              + n * bound["kv_bytes_per_position"] * ctx)
    macs = n * bound["params"]
    t_bytes, t_macs = nbytes / (bound["read_gb_s"] * 1e9), macs / (g * 1e9)
    step = max(t_bytes, t_macs)
    lv.update(bound_bytes_step=nbytes, bound_macs_step=macs, bound_gemm_gmac_s=g,
              bound_step_ms=step * 1e3, bound_limit="bytes" if t_bytes >= t_macs else "macs",
              bound_tok_s=n / step if step > 0 else None)
    lv["bound_ratio"] = (lv["agg_tok_s"] / lv["bound_tok_s"]
                         if lv["agg_tok_s"] is not None and lv["bound_tok_s"] else None)


def add_ratios(levels):
    """Compare every level with level 1 of the same run (None without one)."""
    single = next((lv for lv in levels if lv["concurrency"] == 1), {})

    def ratio(a, b):
        return a / b if a is not None and b else None

    for lv in levels:
        lv["aggregate_vs_single"] = ratio(lv["agg_tok_s"], single.get("agg_tok_s"))
        lv["tpot_p99_vs_single"] = ratio(lv["tpot_p99_ms"], single.get("tpot_p50_ms"))


def markdown(report):
    cols = [("streams", "concurrency", "{}"), ("requests", "requests", "{}"),
            ("errors", "errors", "{}"), ("agg tok/s", "agg_tok_s", "{:.1f}"),
            ("x single", "aggregate_vs_single", "{:.2f}"),
            ("TPOT p50 ms", "tpot_p50_ms", "{:.2f}"), ("TPOT p99 ms", "tpot_p99_ms", "{:.2f}"),
            ("p99/single p50", "tpot_p99_vs_single", "{:.2f}"),
            ("TTFT p50 ms", "ttft_p50_ms", "{:.1f}"), ("TTFT p99 ms", "ttft_p99_ms", "{:.1f}")]
    b = report.get("bound")
    if b:
        cols[4:4] = [("bound tok/s", "bound_tok_s", "{:.1f}"), ("x bound", "bound_ratio", "{:.2f}"),
                     ("limit", "bound_limit", "{}")]
    lines = [f"{report['label']}: url {report['url']}, model {report['model']}, "
             f"max_tokens {report['max_tokens']}, {report['date']}", ""]
    if b:
        gemm = ", ".join(f"{k} rows {v:.1f}" for k, v in b["gemm_gmac_s"].items())
        lines += [f"bound: {b['formula']}",
                  f"  read_bw {b['read_gb_s']:.2f} GB/s, gemm GMAC/s {gemm} "
                  f"({b['cpu']}, {b['threads']} threads, `duck-bench host --only=gemv,gemm`)",
                  f"  host {b['host_bytes_per_token'] / 1e6:.1f} MB + ducks "
                  f"{b['duck_bytes_per_token'] / 1e6:.1f} MB of weights a step, "
                  f"{b['kv_bytes_per_position'] / 1e3:.1f} kB of KV a position a row, "
                  f"params {b['params'] / 1e6:.1f} M (host {b['host_params'] / 1e6:.1f} M, "
                  f"ducks {b['duck_params'] / 1e6:.1f} M)", ""]
    lines += [
             "| " + " | ".join(c[0] for c in cols) + " |",
             "|" + "|".join("---:" for _ in cols) + "|"]
    for lv in report["levels"]:
        cells = ["-" if lv[k] is None else f.format(lv[k]) for _, k, f in cols]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_atomic(path, write):
    """Call write(tmp_path) on a temp file next to path, then rename over path."""
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=d, prefix="." + os.path.basename(path) + ".", suffix=".tmp")
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; match a plain open()
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def plot(report, path):
    import matplotlib  # lazily: only needed for --png
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lv = report["levels"]
    x = [v["concurrency"] for v in lv]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    left.plot(x, [v["agg_tok_s"] for v in lv], "o-", label="measured")
    single = next((v["agg_tok_s"] for v in lv if v["concurrency"] == 1), None)
    if single:
        left.plot(x, [single * n for n in x], "--", color="gray", label="ideal (linear from 1)")
    left.set(xlabel="streams", ylabel="aggregate decode tok/s", title="throughput")
    right.plot(x, [v["tpot_p50_ms"] for v in lv], "o-", label="TPOT p50")
    right.plot(x, [v["tpot_p99_ms"] for v in lv], "s--", label="TPOT p99")
    right.set(xlabel="streams", ylabel="TPOT ms", title="per-stream latency")
    # TTFT is usually far larger than TPOT, so it gets its own y axis.
    ttft = right.twinx()
    ttft.plot(x, [v["ttft_p50_ms"] for v in lv], "^:", color="tab:green", label="TTFT p50")
    ttft.set(ylabel="TTFT p50 ms")
    ttft.set_ylim(bottom=0)
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(x, [str(n) for n in x])
        ax.set_xlim(x[0] / 1.25, x[-1] * 1.25)  # fixed, so failed levels (no data) still plot
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
    left.legend(loc="upper left")
    handles = [h for a in (right, ttft) for h in a.get_legend_handles_labels()[0]]
    right.legend(handles, [h.get_label() for h in handles], loc="upper left")
    fig.suptitle(report["label"])
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=120)
    plt.close(fig)


def main(argv=None):
    args = parse_args(argv)
    try:
        model = args.model or fetch_model(args)
    except Exception as e:
        print(f"bench-serve: cannot list models at {args.url}: {e}", file=sys.stderr)
        return 1
    report = {"label": args.label or model, "url": args.url, "model": model,
              "max_tokens": args.max_tokens,
              "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
              "levels": []}
    if args.plan:
        try:  # before the load, while the server is idle
            report["bound"] = measure_machine(args)
        except Exception as e:
            print(f"bench-serve: cannot measure the bound: {e}", file=sys.stderr)
            return 1
    for n in args.levels:
        lv = run_level(args, model, n)
        if args.plan:
            add_bound(report["bound"], lv)
        report["levels"].append(lv)
        print(f"bench-serve: {n} streams: {lv['requests']} requests, {lv['errors']} errors, "
              f"{lv['completion_tokens']} tokens in {lv['wall_s']:.2f} s", file=sys.stderr)
        for msg in lv["error_samples"]:
            print(f"bench-serve:   error: {msg}", file=sys.stderr)
    add_ratios(report["levels"])
    print(markdown(report))

    if args.json:
        def dump(tmp):
            with open(tmp, "w") as f:
                json.dump(report, f, indent=2)
                f.write("\n")
        write_atomic(args.json, dump)
    if args.png:
        write_atomic(args.png, lambda tmp: plot(report, tmp))
    return 1 if any(lv["errors"] for lv in report["levels"]) else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
