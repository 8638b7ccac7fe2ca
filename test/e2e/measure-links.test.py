#!/usr/bin/env python3
"""duckc measure-cluster --links against two duckd's behind duck-linksim
(each duck's link and the host's port at known rates): the link probes
must find those rates, the figures land in the cluster file, and duckc
compile counts them (its network term).

  measure-links.test.py --duckd D --duckc C --linksim L --model M --work DIR
"""
import argparse
import json
import os
import subprocess
import sys

from duckd_proc import run_tool, start_duckd, stop_all

HOST_GBPS, DUCK_GBPS = 0.4, 0.25  # two ducks at once: the host's port binds


def run(cmd, check=True):
    return run_tool(cmd, "measure-links", check)


def near(got, want, what):
    """Within 20 %: the probes time 2 MiB over a simulated link on a shared
    2-core machine (the linksim's pacing is exact from below)."""
    if not (isinstance(got, (int, float)) and 0.8 * want <= got <= 1.2 * want):
        sys.exit(f"measure-links: {what} {got!r}, the link's {want}")
    return f"{what} within 20 % of {want}"


def main():
    a = argparse.ArgumentParser()
    for f in ("duckd", "duckc", "linksim", "model", "work"):
        a.add_argument("--" + f, required=True)
    args = a.parse_args()
    os.makedirs(args.work, exist_ok=True)
    procs = []
    try:
        backends = []
        for i, name in enumerate(("d0", "d1")):
            p, ep = start_duckd(args.duckd, args.work, name,
                                "--cpu_offset", str(i))
            procs.append(p)
            backends.append(f"{ep['host']}:{ep['port']}")
        sim = subprocess.Popen(
            [args.linksim, "--backends", ",".join(backends),
             "--host-link-gbps", str(HOST_GBPS),
             "--duck-link-gbps", str(DUCK_GBPS), "--latency-us", "100"],
            stdout=subprocess.PIPE, text=True)
        procs.append(sim)
        ducks = []
        for line in iter(sim.stdout.readline, ""):
            w = line.split()
            if w[:2] == ["linksim", "ready"]:
                break
            if w[:2] == ["linksim", "duck"]:
                ducks.append({"host": "127.0.0.1", "port": int(w[4])})
        if len(ducks) != 2:
            sys.exit(f"measure-links: duck-linksim gave {ducks}")
        cluster = os.path.join(args.work, "cluster.json")
        json.dump({"ducks": ducks}, open(cluster, "w"))

        r = run([args.duckc, "measure-cluster", cluster, "--millis", "20",
                 "--arena-mib", "16", "--links", "--link-mib", "2"])
        for line in r.stdout.splitlines():
            if line.startswith("link "):
                print(line.split(":")[0])
        c = json.load(open(cluster))
        for i, d in enumerate(c["ducks"]):
            print(near(d.get("link_gbps"), DUCK_GBPS, f"ducks[{i}].link_gbps"))
        print(near(c.get("host_link_gbps"), HOST_GBPS, "host_link_gbps"))

        r = run([args.duckc, "compile", args.model, "--cluster", cluster,
                 "--tp", "2", "--multiple-of", "32", "--dry-run"])
        print(next((l.split(" over ")[0] for l in r.stdout.splitlines()
                    if l.startswith("network:")), r.stdout))

        bad = run([args.duckc, "measure-cluster", cluster, "--links",
                   "--link-mib", "65"], check=False)
        print("bad:", bad.stderr.strip())
    finally:
        stop_all(procs)


if __name__ == "__main__":
    main()
