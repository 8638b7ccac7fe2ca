#!/usr/bin/env python3
"""Cast steps to ducks started here with a token (cast-keyed.test).

  cast-keyed.test.py --duckd D --duckrun R --uni PLAN --cast PLAN --work DIR
      [--staged-uni PLAN --staged-cast PLAN]

The staged plans (--stage-shared on, unicast and multicast): a cast
stage's batch checked against the SHA-256 its sealed step_staged carries.
"""
import argparse
import filecmp
import json
import os
import socket
import sys

from duckd_proc import decode_logits, start_duckd, stop_all

TOKEN = "cast-keyed-secret"
GROUP = "239.77.0.5"
PROMPT = "13,402,77,5,261,99"


def free_udp_port():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def decode(args, plan, cluster, name):
    return decode_logits(args.duckrun, plan, cluster, args.work, name,
                         PROMPT, "cast-keyed")


def cluster_file(args, name, eps, cast_port):
    f = os.path.join(args.work, name + ".json")
    json.dump({"ducks": [{"host": e["host"], "port": e["port"]} for e in eps],
               "token": TOKEN, "cast": f"{GROUP}:{cast_port}",
               "cast_interface": "127.0.0.1"}, open(f, "w"))
    return f


def staged(args, both, mixed):  # cluster files (a summary takes NAME.json)
    """Cast stages to keyed ducks, and to a pair where one has no --cast."""
    uni, _, _ = decode(args, args.staged_uni, both, "staged-uni")
    cast, s, _ = decode(args, args.staged_cast, both, "staged-cast")
    print("keyed cast stages: logits", "identical" if filecmp.cmp(
        uni, cast, shallow=False) else "DIFFER", "every stage cast",
        s["stages"] > 0 and s["stages_cast"] == s["stages"], "ahead",
        s["stage_ducks_ahead"] > 0, "resent", s["stage_resent"])
    half, s, _ = decode(args, args.staged_cast, mixed, "staged-mixed")
    print("duck without --cast, staged: logits", "identical" if
          filecmp.cmp(uni, half, shallow=False) else "DIFFER",
          "ducks given up on", s["cast_ducks_off"], "stages resent",
          0 < s["stage_resent"] <= 8)


def main():
    a = argparse.ArgumentParser()
    for f in ("duckd", "duckrun", "uni", "cast", "work"):
        a.add_argument("--" + f, required=True)
    a.add_argument("--staged-uni")
    a.add_argument("--staged-cast")
    args = a.parse_args()
    os.makedirs(args.work, exist_ok=True)
    port = free_udp_port()
    procs, eps = [], []
    try:
        for i in range(3):  # two with --cast, the third without
            extra = ["--token", TOKEN]
            if i < 2:
                extra += ["--cast", f"{GROUP}:{port}"]
            p, ep = start_duckd(args.duckd, args.work, f"k{i}", *extra)
            procs.append(p)
            eps.append(ep)
        if eps[0].get("cast_port") != port or "cast_port" in eps[2]:
            sys.exit(f"cast-keyed: cast ports {eps}")
        both = cluster_file(args, "both", eps[:2], port)
        uni, _, _ = decode(args, args.uni, both, "uni")
        cast, s, _ = decode(args, args.cast, both, "cast")
        print("keyed cast: logits", "identical" if filecmp.cmp(
            uni, cast, shallow=False) else "DIFFER", "cast steps",
            s["cast_steps"] > 0, "resent few",
            10 * s["cast_resent"] < s["cast_steps"])
        mixed = cluster_file(args, "mixed", [eps[0], eps[2]], port)
        half, s, err = decode(args, args.cast, mixed, "mixed")
        print("duck without --cast: logits", "identical" if filecmp.cmp(
            uni, half, shallow=False) else "DIFFER",
            "ducks given up on", s["cast_ducks_off"], "resent",
            s["cast_resent"])
        for line in err.splitlines():
            if "cast steps in a row" in line:
                print(line)
        if args.staged_cast:
            staged(args, cluster_file(args, "both-staged", eps[:2], port),
                   cluster_file(args, "mixed-staged", [eps[0], eps[2]], port))
    finally:
        stop_all(procs)


if __name__ == "__main__":
    main()
