"""Checks two `duck-bench cluster --json` runs, the second with both link
rates cut by 4x: every key is there, the simulator really limits the links
(a shaped run's TPOT is at least the serialisation the cost model counts,
which the simulator enforces byte for byte: a bound from below, never
flaky), and the network part grows when the rates are cut."""
import json
import sys

KEYS = ["measured_tpot_ms", "predicted_tpot_ms", "measured_network_ms",
        "predicted_network_ms", "baseline_tpot_ms", "scale",
        "simulated_host_link_gbps", "simulated_duck_link_gbps",
        "latency_ms_not_in_model", "steps_per_token"]


def load(path):
    with open(path) as f:
        r = json.load(f)
    missing = [k for k in KEYS if k not in r]
    if missing:
        sys.exit(f"{path}: missing {missing}")
    return r


full, cut = load(sys.argv[1]), load(sys.argv[2])
for name, r in (("full", full), ("cut", cut)):
    if not r["predicted_network_ms"] > 0:
        sys.exit(f"{name}: the cost model counted no network")
    if r["measured_tpot_ms"] < 0.95 * r["predicted_network_ms"]:
        sys.exit(f"{name}: TPOT {r['measured_tpot_ms']:.3f} ms is below the "
                 f"links' own {r['predicted_network_ms']:.3f} ms: not limited")
ratio = cut["predicted_network_ms"] / full["predicted_network_ms"]
if not 3.9 < ratio < 4.1:
    sys.exit(f"the model's network term grew {ratio:.2f}x for a 4x cut")
if not cut["measured_network_ms"] > full["measured_network_ms"]:
    sys.exit(f"the measured network part did not grow: "
             f"{full['measured_network_ms']:.3f} -> "
             f"{cut['measured_network_ms']:.3f} ms")
print("bench cluster ok")
