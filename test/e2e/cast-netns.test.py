#!/usr/bin/env python3
"""Cast steps over a Linux bridge between network namespaces
(cast-netns.test): the host on the bridge, each duckd in a namespace of
its own behind a veth port, a multicast group the ducks join on their own
address. Needs root; everything it creates is removed on every path.

  cast-netns.test.py --duckd D --duckrun R --uni PLAN --cast PLAN --work DIR
"""
import argparse
import filecmp
import json
import os
import shutil
import subprocess
import time

from duckd_proc import decode_logits, stop_all, wait_listening

PREFIX = f"duckc{os.getpid() % 10000}"
BRIDGE = PREFIX + "br"
GROUP, PORT, TOKEN = "239.77.0.9", 7420, "cast-netns-token"
PROMPT = "13,402,77,5,261,99"
TC = shutil.which("tc") or next(
    (p for p in ("/usr/sbin/tc", "/sbin/tc") if os.access(p, os.X_OK)), None)


def sh(*cmd, check=True, ns=None):
    if ns:
        cmd = ("ip", "netns", "exec", ns) + cmd
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


def setup(n):
    """The bridge (flooding multicast: no snooping) at 10.78.0.1 and n
    namespaces behind its ports at 10.78.0.(2 + i)."""
    sh("ip", "link", "add", BRIDGE, "type", "bridge", "mcast_snooping", "0")
    sh("ip", "addr", "add", "10.78.0.1/24", "dev", BRIDGE)
    sh("ip", "link", "set", BRIDGE, "up")
    for i in range(n):
        ns, port, duck = f"{PREFIX}n{i}", f"{PREFIX}p{i}", f"{PREFIX}d{i}"
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", port, "type", "veth", "peer", "name", duck)
        sh("ip", "link", "set", duck, "netns", ns)
        sh("ip", "link", "set", port, "master", BRIDGE)
        sh("ip", "link", "set", port, "up")
        sh("ip", "addr", "add", f"10.78.0.{2 + i}/24", "dev", duck, ns=ns)
        sh("ip", "link", "set", duck, "up", ns=ns)
        sh("ip", "link", "set", "lo", "up", ns=ns)


def teardown(n):
    for i in range(n):
        sh("ip", "netns", "del", f"{PREFIX}n{i}", check=False)
        sh("ip", "link", "del", f"{PREFIX}p{i}", check=False)
    sh("ip", "link", "del", BRIDGE, check=False)


def decode(args, plan, cluster, name):
    logits, summary, _ = decode_logits(args.duckrun, plan, cluster, args.work,
                                       name, PROMPT, "cast-netns")
    return logits, summary


def same(a, b):
    return "identical" if filecmp.cmp(a, b, shallow=False) else "DIFFER"


def main():
    a = argparse.ArgumentParser()
    for f in ("duckd", "duckrun", "uni", "cast", "work"):
        a.add_argument("--" + f, required=True)
    args = a.parse_args()
    os.makedirs(args.work, exist_ok=True)
    n, procs, logs = 2, [], []
    try:
        setup(n)
        for i in range(n):
            logs.append(os.path.join(args.work, f"duckd{i}.log"))
            log = open(logs[-1], "w")
            procs.append(subprocess.Popen(
                ["ip", "netns", "exec", f"{PREFIX}n{i}", args.duckd,
                 "--bind", f"10.78.0.{2 + i}", "--port", "7411", "--token",
                 TOKEN, "--cast", f"{GROUP}:{PORT}", "--cache_dir",
                 os.path.join(args.work, f"cache{i}"), "--name", f"c{i}",
                 "--cores", "1", "--weights_size", "64M"],
                stdout=log, stderr=log))
        cluster = os.path.join(args.work, "cluster.json")
        json.dump({"ducks": [{"host": f"10.78.0.{2 + i}", "port": 7411}
                             for i in range(n)],
                   "token": TOKEN, "cast": f"{GROUP}:{PORT}",
                   "cast_interface": "10.78.0.1"}, open(cluster, "w"))
        wait_listening(procs, logs)
        uni, _ = decode(args, args.uni, cluster, "uni")
        cast, s = decode(args, args.cast, cluster, "cast")
        print("over the bridge: logits", same(uni, cast), "cast steps",
              s["cast_steps"] > 0, "resent few",
              10 * s["cast_resent"] < s["cast_steps"])
        loss = TC and all(
            sh(TC, "qdisc", "add", "dev", f"{PREFIX}p{i}", "root", "netem",
               "loss", "2%", check=False).returncode == 0 for i in range(n))
        if not loss:
            print("netem unavailable in this kernel: no loss run")
            return
        lossy, s = decode(args, args.cast, cluster, "lossy")
        print("with 2 % loss: logits", same(uni, lossy), "resent",
              s["cast_resent"] > 0)
    finally:
        stop_all(procs)
        teardown(n)


if __name__ == "__main__":
    main()
