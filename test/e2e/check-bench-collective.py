"""Checks one `duck-bench collective --json` run: every key is there, each
duck sent exactly the bytes the cost model counts, the shaped token took at
least the links' own time (the simulator enforces it from below), and the
model's latency part is one one-way latency a collective."""
import json
import sys

KEYS = ["ducks", "collectives_per_token", "measured_direct_ms",
        "measured_baseline_ms", "measured_shaped_ms", "measured_mesh_ms",
        "mesh_call_us", "mesh_cpu_us_per_collective", "predicted_mesh_ms", "predicted_mesh_latency_ms",
        "mesh_ratio", "measured_bytes_per_duck", "predicted_bytes_per_duck",
        "latency_us", "scale", "simulated_duck_link_gbps", "wire"]

with open(sys.argv[1]) as f:
    r = json.load(f)
missing = [k for k in KEYS if k not in r]
if missing:
    sys.exit(f"missing {missing}")
if r["measured_bytes_per_duck"] != r["predicted_bytes_per_duck"]:
    sys.exit(f"duck 0 sent {r['measured_bytes_per_duck']} bytes a token, "
             f"the model counts {r['predicted_bytes_per_duck']}")
if not r["predicted_mesh_ms"] > r["predicted_mesh_latency_ms"] > 0:
    sys.exit("the model counted no wire or no latency")
if r["measured_shaped_ms"] < 0.95 * r["predicted_mesh_ms"]:
    sys.exit(f"a shaped token took {r['measured_shaped_ms']:.3f} ms, below "
             f"the links' own {r['predicted_mesh_ms']:.3f} ms: not limited")
want = r["collectives_per_token"] * r["latency_us"] / 1e3
if abs(r["predicted_mesh_latency_ms"] - want) > 1e-6:
    sys.exit(f"latency term {r['predicted_mesh_latency_ms']} != {want}")
if not r["measured_direct_ms"] > 0 or not r["mesh_call_us"] > 0:
    sys.exit("the loopback run measured nothing")
print(f"bench collective ok: {r['collectives_per_token']:.0f} collectives a "
      "token")
