# Checks duckrun's --summary-json against its plan (duck-plan-dump JSON):
# the decode breakdown adds up to the TPOT, the median token's time is
# at most twice the mean, the prompt's duck steps fit in
# the prefill's time, the bound fraction is a
# fraction, the ducks' bytes a token are the plan's (dense slots whole;
# MoE slots by top_k + shared of their experts), and the KV bytes a token
# are the attention ops' caches. Exits 1 on the first failed check.
import json
import sys

summary, plan = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


bd = summary["decode_breakdown_ms"]
total = sum(bd.values())
tpot = summary["tpot_ms"]
if abs(total - tpot) > 0.05 * tpot + 0.05:
    fail("breakdown %s sums to %.3f ms, TPOT is %.3f" % (bd, total, tpot))
# The median token's time: at least half the tokens take that long or
# more, so it is at most twice the mean.
p50 = summary["tpot_p50_ms"]
if not 0 < p50 <= 2 * tpot:
    fail("tpot_p50_ms %r against the mean TPOT %r" % (p50, tpot))
# The slow tokens: p50 <= p99 <= max, and the slowest token at most the
# whole decode's time (tokens x the mean).
p99, top = summary["tpot_p99_ms"], summary["tpot_max_ms"]
n = summary["generated_tokens"]
if not p50 <= p99 <= top <= n * tpot * 1.001:
    fail("tpot p50 %r, p99 %r, max %r against %d tokens of %r"
         % (p50, p99, top, n, tpot))
# The prompt's duck steps: the slowest duck's kernel and the rest of the
# host's wait, ms a prompt token, within the prefill's own time.
pk, pg = summary["prefill_duck_kernel_ms"], summary["prefill_dispatch_gap_ms"]
prefill_ms = 1e3 * summary["prefill_s"] / summary["prompt_tokens"]
if pk <= 0 or pg < -0.02 * pk or pk + pg > 1.05 * prefill_ms:
    fail("prefill duck kernel %r + gap %r ms a prompt token against %r"
         % (pk, pg, prefill_ms))
if not 0 < summary["decode_bound_fraction"] <= 1.0:
    fail("decode_bound_fraction %r" % summary["decode_bound_fraction"])
moe = {op["layer"]: op["params"] for op in plan["ops"]
       if op["params_type"] == "MoeFfnOpDef"}
want = 0.0
for duck in plan["ducks"]:
    for s in duck["slots"]:
        if not s.get("moe", False):
            want += s["bytes"]
            continue
        p = moe[s["layer"]]
        E, b, e = p["num_experts"], s["expert_begin"], s["expert_end"]
        routed = max(0, min(e, E) - b)
        shared = max(0, e - max(b, E))
        want += s["bytes"] * (p["top_k"] * routed / E + shared) / (e - b)
got = summary["duck_bytes_per_token"]
if abs(got - want) > 1e-6 * want:
    fail("duck bytes a token %r, plan says %r" % (got, want))
kv = 0
for op in plan["ops"]:
    p = op.get("params", {})
    if op["params_type"] == "GqaAttentionOpDef":
        kv += 2 * p["kv_heads"] * p["head_dim"] * 4
    elif op["params_type"] == "MlaAttentionOpDef":
        kv += (p["kv_lora_rank"] + p["qk_rope_head_dim"]) * 4
    elif op["params_type"] == "IndexerOpDef":
        kv += p["head_dim"] * 4
if summary["kv_bytes_per_token"] != kv:
    fail("kv bytes a token %r, plan says %r" % (summary["kv_bytes_per_token"], kv))
# The KV cache a decoded token reads: every position's, at the decode's
# mean context (decode step i attends over prompt + i + 1 positions).
want_ctx = summary["prompt_tokens"] + summary["generated_tokens"] / 2.0
if summary["generated_tokens"] > 1 and abs(summary["mean_context"] - want_ctx) > 1e-9:
    fail("mean context %r, want %r" % (summary["mean_context"], want_ctx))
indexed = any(op["params_type"] == "IndexerOpDef" for op in plan["ops"])
if not indexed and summary["generated_tokens"] > 1:
    want_cache = kv * round(summary["mean_context"])
    if summary["host_cache_bytes_per_token"] != want_cache:
        fail("KV cache bytes a token %r, want %r"
             % (summary["host_cache_bytes_per_token"], want_cache))
if summary["host_bytes_per_token"] <= 0 or summary["host_read_gb_s"] <= 0:
    fail("no host bytes or bandwidth")
print("summary ok: breakdown %.3f of %.3f ms, bound fraction %.3f, duck bytes %d"
      % (total, tpot, summary["decode_bound_fraction"], got))
