#!/usr/bin/env python3
"""duckc measure-cluster --mesh against four duckd's started here (loopback,
--mesh-port 0): the mesh's call and message costs land in the cluster file
and duckc compile --residual ducks --dry-run takes them.

  measure-cluster-mesh.test.py --duckd D --duckc C --model M --work DIR
"""
import argparse
import json
import os
import signal
import subprocess
import sys

from duckd_proc import run_tool, start_duckd, stop_all


def run(cmd, check=True):
    return run_tool(cmd, "measure-cluster-mesh", check)


def measure(args, cluster, transport):
    r = run([args.duckc, "measure-cluster", cluster, "--millis", "20",
             "--arena-mib", "16", "--mesh", transport])
    print(next(l for l in r.stdout.splitlines() if l.startswith("mesh (")))
    c = json.load(open(cluster))
    for key in ("mesh_call_us", "mesh_message_us"):
        v = c.get(key)
        if not (isinstance(v, (int, float)) and 0 <= v < 1e5):
            sys.exit(f"measure-cluster-mesh: {key} = {v!r}")
    if c["mesh_call_us"] + 3 * c["mesh_message_us"] <= 0:
        sys.exit("measure-cluster-mesh: a collective measured as free")
    if c.get("latency_us") != 50 or any("mesh_port" not in d
                                        for d in c["ducks"]):
        sys.exit("measure-cluster-mesh: the file lost fields it had")
    print(f"{transport}: mesh_call_us, mesh_message_us written, "
          f"mesh_transport {c.get('mesh_transport')}; the other keys kept")
    return c


def local_cluster(args):
    """duck-cluster --mesh --cluster_file: two ducks with mesh listeners,
    written as a cluster file that measure-cluster --mesh takes as is."""
    f = os.path.join(args.work, "local.json")
    p = subprocess.Popen([args.duck_cluster, "--ducks", "2", "--mesh",
                          "--pin=false", "--cluster_file", f],
                         stdout=subprocess.PIPE, text=True)
    try:
        for line in p.stdout:
            if line.startswith("duck 0:"):
                print("duck-cluster:", line[line.find("("):].strip())
            if line.startswith("ready"):
                break
        c = json.load(open(f))
        ok = all(d.get("mesh_port", 0) > 0 and d.get("cores") == 1
                 for d in c["ducks"])
        print(f"duck-cluster file: {len(c['ducks'])} ducks, "
              f"mesh ports {'written' if ok else 'MISSING'}")
        for d in c["ducks"]:
            d["memory_gib"] = 1
        json.dump(c, open(f, "w"))
        r = run([args.duckc, "measure-cluster", f, "--millis", "20",
                 "--arena-mib", "16", "--mesh", "udp"])
        print(next(l for l in r.stdout.splitlines() if l.startswith("mesh (")))
    finally:
        p.send_signal(signal.SIGINT)
        p.wait()


def main():
    a = argparse.ArgumentParser()
    for f in ("duckd", "duckc", "duck_cluster", "model", "work"):
        a.add_argument("--" + f, required=True)
    args = a.parse_args()
    os.makedirs(args.work, exist_ok=True)
    procs = []
    try:
        eps = []
        for i in range(4):
            p, ep = start_duckd(args.duckd, args.work, f"d{i}",
                                "--cpu_offset", str(i % 2), "--mesh-port",
                                "0")
            procs.append(p)
            eps.append(ep)
        cluster = os.path.join(args.work, "cluster.json")
        for ep in eps:  # room for the model: compile only models it
            ep["memory_gib"] = 65536
        json.dump({"ducks": eps, "latency_us": 50}, open(cluster, "w"))
        measure(args, cluster, "udp")
        r = run([args.duckc, "compile", args.model, "--cluster", cluster,
                 "--tp", "4", "--in-proj", "ducks", "--q-proj", "ducks",
                 "--o-proj", "ducks", "--mla-absorb", "ducks", "--residual",
                 "ducks", "--explain", "--dry-run"])
        print("compile:", next(l for l in r.stdout.splitlines()
                               if l.startswith("residual on the ducks")))
        measure(args, cluster, "tcp")

        bad = os.path.join(args.work, "bad.json")
        json.dump({"ducks": [eps[0], {"host": eps[1]["host"],
                                      "port": eps[1]["port"]}]},
                  open(bad, "w"))
        r = run([args.duckc, "measure-cluster", bad, "--millis", "20",
                 "--arena-mib", "16", "--mesh", "udp"], check=False)
        print("no mesh port:", r.stderr.strip().splitlines()[-1])
        r = run([args.duckc, "measure-cluster", cluster, "--mesh", "ib"],
                check=False)
        print("bad transport:", r.stderr.strip().splitlines()[-1])
        local_cluster(args)
    finally:
        stop_all(procs)


if __name__ == "__main__":
    main()
