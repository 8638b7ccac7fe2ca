"""Checks two `duck-bench cluster --json` runs, the second with both link
rates cut by 4x: every key is there, the simulator really limits the links
(a shaped run's TPOT is at least the serialisation and latency the cost
model counts, which the simulator enforces byte for byte: a bound from
below, never flaky), the model's parts add up, its wire time (without the
latency) grows 4x, and the measured network part grows, when the rates are
cut."""
import json
import sys

KEYS = ["measured_tpot_ms", "predicted_tpot_ms", "measured_network_ms",
        "predicted_network_ms", "baseline_tpot_ms", "scale",
        "simulated_host_link_gbps", "simulated_duck_link_gbps",
        "predicted_network_out_ms", "predicted_network_back_ms",
        "predicted_latency_ms", "steps_per_token",
        "measured_one_way_latency_us",
        "predicted_network_ms_at_measured_latency", "network_ratio",
        "tpot_ratio", "predicted_tpot_on_baseline_ms",
        "measured_gap_network_ms", "gap_network_ratio",
        "baseline_breakdown_ms", "shaped_breakdown_ms"]


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
for name, r in (("full", full), ("cut", cut)):
    # The latency term: steps a token x 2 x the one-way latency.
    want = r["steps_per_token"] * 2 * r["latency_us"] / 1e3
    if abs(r["predicted_latency_ms"] - want) > 1e-6:
        sys.exit(f"{name}: latency term {r['predicted_latency_ms']} != {want}")
    parts = (r["predicted_network_out_ms"] + r["predicted_network_back_ms"] +
             r["predicted_latency_ms"])
    if abs(parts - r["predicted_network_ms"]) > 1e-6:
        sys.exit(f"{name}: the network parts do not add up")
    if not r["measured_one_way_latency_us"] >= 0:
        sys.exit(f"{name}: the latency probe failed")


def wire(r):  # the link rates' part, without the latency
    return r["predicted_network_ms"] - r["predicted_latency_ms"]


ratio = wire(cut) / wire(full)
if not 3.9 < ratio < 4.1:
    sys.exit(f"the model's wire time grew {ratio:.2f}x for a 4x cut")
if not cut["measured_network_ms"] > full["measured_network_ms"]:
    sys.exit(f"the measured network part did not grow: "
             f"{full['measured_network_ms']:.3f} -> "
             f"{cut['measured_network_ms']:.3f} ms")
print("bench cluster ok")
