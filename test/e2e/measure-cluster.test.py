#!/usr/bin/env python3
"""duckc measure-cluster against two duckd's started here (loopback, with a
token): runs a generation first so the ducks' weight caches hold the plan,
measures, checks the cluster file, compiles with it, and checks that the
next generation is a cache hit with the same ids.

  measure-cluster.test.py --duckd D --duckc C --duckrun R --model M \
      --plan P --work DIR
"""
import argparse
import json
import os
import re
import sys

from duckd_proc import run_tool, start_duckd, stop_all

TOKEN = "measure-cluster-test-token"


def run(cmd, check=True):
    return run_tool(cmd, "measure-cluster", check)


def host_fp8():
    """The format duckrun here keeps an FP8 checkpoint's host matrices in
    (HostReadsE4m3): fp9 with DUCK_HOST_FP8=fp9, else e4m3 (with or
    without AVX-512)."""
    return "fp9" if os.environ.get("DUCK_HOST_FP8") == "fp9" else "e4m3"


def main():
    a = argparse.ArgumentParser()
    for f in ("duckd", "duckc", "duckrun", "model", "plan", "work"):
        a.add_argument("--" + f, required=True)
    args = a.parse_args()
    os.makedirs(args.work, exist_ok=True)
    procs = []
    try:
        eps = []
        for i, name in enumerate(("d0", "d1")):
            p, ep = start_duckd(args.duckd, args.work, name,
                                "--cpu_offset", str(i), "--token", TOKEN)
            procs.append(p)
            eps.append(ep)
        cluster = os.path.join(args.work, "cluster.json")
        json.dump({"ducks": eps, "token": TOKEN, "host_ms_per_token": 2.0},
                  open(cluster, "w"))
        gen = [args.duckrun, args.plan, "--cluster", cluster, "--prompt-ids",
               "5,6,7,8", "--max-tokens", "24", "--ignore-eos", "--print-ids"]
        before = run(gen)

        r = run([args.duckc, "measure-cluster", cluster, "--millis", "40",
                 "--arena-mib", "64", "--host"])
        print(r.stdout, end="")
        c = json.load(open(cluster))
        classes = ("general128", "general64", "general32", "exact128",
                   "exact64", "exact32")
        for i, d in enumerate(c["ducks"]):
            for key in ("cores", "read_gbs", "fp9_gparam_s", "rtt_us",
                        "empty_step_us", "memory_gib", "fp9_gemm_gmac_s"):
                if not (isinstance(d.get(key), (int, float)) and d[key] > 0):
                    sys.exit(f"measure-cluster: ducks[{i}].{key} = "
                             f"{d.get(key)!r}")
            if d["host"] != eps[i]["host"] or d["port"] != eps[i]["port"]:
                sys.exit(f"measure-cluster: ducks[{i}] lost its endpoint")
            # A small matrix's extra cost a call; left out when the cold
            # set made it read no slower than the large one.
            call = d.get("gemv_call_us", 0)
            if not (isinstance(call, (int, float)) and 0 <= call < 1e5):
                sys.exit(f"measure-cluster: ducks[{i}].gemv_call_us = {call!r}")
            rates = d["fp9_gparam_s_by_kernel"]
            if sorted(rates) != sorted(classes) or min(rates.values()) <= 0:
                sys.exit(f"measure-cluster: ducks[{i}] kernel rates {rates}")
        if c.get("token") != TOKEN or c.get("host_ms_per_token") != 2.0:
            sys.exit("measure-cluster: the file lost fields it had")
        # How duckrun on this machine reads an FP8 checkpoint's matrices:
        # e4m3 unless DUCK_HOST_FP8=fp9.
        if c.get("host_fp8") != host_fp8():
            sys.exit(f"measure-cluster: host_fp8 {c.get('host_fp8')!r}, "
                     f"expected {host_fp8()!r} on this machine")
        if not (c["bandwidth_gbs"] > 0 and c["step_overhead_us"] > 0 and
                c.get("host_read_gbs", 0) > 0 and
                c.get("host_gmac_s", 0) > 0 and
                c.get("fp9_gemm_gmac_s") ==
                min(d["fp9_gemm_gmac_s"] for d in c["ducks"])):
            sys.exit(f"measure-cluster: cluster figures {c}")
        # Two ducks: a ping to both at once against one's, the host's CPU
        # for a frame (more than nothing: a send and a receive more) and
        # the same by the wall clock (a number, zero when the second costs
        # nothing).
        if not (isinstance(c.get("host_frame_us"), (int, float)) and
                0 < c["host_frame_us"] < 1e4 and
                isinstance(c.get("host_frame_wall_us"), (int, float)) and
                0 <= c["host_frame_wall_us"] < 1e4):
            sys.exit("measure-cluster: host_frame_us "
                     f"{c.get('host_frame_us')!r}, host_frame_wall_us "
                     f"{c.get('host_frame_wall_us')!r}")
        print("measured: every duck has cores, read_gbs, fp9_gparam_s, "
              f"{len(classes)} kernel classes, fp9_gemm_gmac_s, "
              "gemv_call_us (or none), rtt_us, "
              f"empty_step_us, host_fp8 {c['host_fp8']}, host_frame_us; "
              "token and host_ms_per_token kept")

        r = run([args.duckc, "compile", args.model, "--cluster", cluster,
                 "--tp", "auto", "--explain", "--dry-run"])
        print(r.stdout.splitlines()[0])
        # Each duck's gap is its own ping's: at tp 2 a step adds the host's
        # two frames to and from the other duck.
        if c.get("step_overhead_ducks") != 1:
            sys.exit(f"measure-cluster: step_overhead_ducks "
                     f"{c.get('step_overhead_ducks')!r}")
        r = run([args.duckc, "compile", args.model, "--cluster", cluster,
                 "--tp", "2", "--multiple-of", "32", "--explain", "--dry-run"])
        step = re.search(r"[0-9]+ us per step: [0-9]+ measured with 1 duck\(s\) "
                         r"\+ 2 x 1 frames at [0-9.]+ us", r.stdout)
        print("tp 2 step:", "the other duck's frames added" if step
              else r.stdout)

        after = run(gen)
        hit = re.search(r"weight cache: (.*) \(", after.stderr)
        same = "ids equal" if after.stdout == before.stdout else "ids DIFFER"
        print(f"after measuring: weight cache: "
              f"{hit.group(1) if hit else after.stderr.strip()}; {same}")

        bad = os.path.join(args.work, "bad.json")
        json.dump({"ducks": [eps[0], {"port": 7}]}, open(bad, "w"))
        r = run([args.duckc, "measure-cluster", bad], check=False)
        print("bad:", r.stderr.strip().splitlines()[-1], f"(exit {r.returncode})")
        gone = os.path.join(args.work, "gone.json")
        json.dump({"ducks": [{"host": "127.0.0.1", "port": 1}]}, open(gone, "w"))
        r = run([args.duckc, "measure-cluster", gone], check=False)
        print("unreachable:", r.stderr.strip().splitlines()[-1],
              f"(exit {r.returncode})")
    finally:
        stop_all(procs)


if __name__ == "__main__":
    main()
