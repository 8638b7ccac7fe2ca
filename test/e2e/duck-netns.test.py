#!/usr/bin/env python3
"""Ducks on a real (virtual) network: each duckd in its own network
namespace, joined to the host by a veth pair, listening off loopback with
a token. Runs a generation through a cluster file and checks its ids
against the local run; with `tc netem` (when the kernel has it) adds
200 us of delay and 1 % loss; then takes one duck's link down for 2 s in
the middle of a generation and checks it completes with the same ids.

  duck-netns.test.py --duckd D --duckrun R --plan P --ids "1,2,3" \
      --tokens N --expect FILE --work DIR

Needs root (network namespaces); everything it creates is removed on
every path. Prints one line a check.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time

from duckd_proc import stop_all, wait_listening

PREFIX = f"duckt{os.getpid() % 10000}"
# tc lives in /sbin or /usr/sbin, which a non-login PATH may not hold;
# without it there is no netem to use.
TC = shutil.which("tc") or next(
    (p for p in ("/usr/sbin/tc", "/sbin/tc") if os.access(p, os.X_OK)), None)


def sh(*cmd, check=True, ns=None, **kw):
    if ns:
        cmd = ("ip", "netns", "exec", ns) + cmd
    return subprocess.run(cmd, check=check, capture_output=True, text=True, **kw)


def setup(n, netem):
    """n namespaces, veth pairs 10.77.i.1 (host) <-> 10.77.i.2 (duck)."""
    for i in range(n):
        ns, host, duck = f"{PREFIX}n{i}", f"{PREFIX}h{i}", f"{PREFIX}d{i}"
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", host, "type", "veth", "peer", "name", duck)
        sh("ip", "link", "set", duck, "netns", ns)
        sh("ip", "addr", "add", f"10.77.{i}.1/24", "dev", host)
        sh("ip", "link", "set", host, "up")
        sh("ip", "addr", "add", f"10.77.{i}.2/24", "dev", duck, ns=ns)
        sh("ip", "link", "set", duck, "up", ns=ns)
        sh("ip", "link", "set", "lo", "up", ns=ns)
        if netem:
            for dev, where in ((host, None), (duck, ns)):
                sh(TC, "qdisc", "add", "dev", dev, "root", "netem", "delay",
                   "200us", "loss", "1%", ns=where)


def teardown(n):
    for i in range(n):
        sh("ip", "netns", "del", f"{PREFIX}n{i}", check=False)
        sh("ip", "link", "del", f"{PREFIX}h{i}", check=False)


def netem_available():
    """Whether this kernel has the netem qdisc (a throwaway veth pair)."""
    if not TC:
        return False
    a, b = f"{PREFIX}ta", f"{PREFIX}tb"
    try:
        sh("ip", "link", "add", a, "type", "veth", "peer", "name", b)
        return sh(TC, "qdisc", "add", "dev", a, "root", "netem", "delay",
                  "200us", check=False).returncode == 0
    finally:
        sh("ip", "link", "del", a, check=False)


def tx_packets(i):
    """Packets the host's end of duck i's veth pair has sent."""
    with open(f"/sys/class/net/{PREFIX}h{i}/statistics/tx_packets") as f:
        return int(f.read())


def run(args, cluster, label):
    r = subprocess.run(
        [args.duckrun, args.plan, "--cluster", cluster, "--prompt-ids",
         args.ids, "--max-tokens", str(args.tokens), "--ignore-eos",
         "--print-ids", "--quiet"], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        sys.exit(f"duck-netns: {label}: duckrun failed:\n{r.stderr}")
    return r.stdout


def main():
    p = argparse.ArgumentParser()
    for f in ("duckd", "duckrun", "plan", "ids", "expect", "work"):
        p.add_argument("--" + f, required=True)
    p.add_argument("--tokens", type=int, default=24)
    p.add_argument("--ducks", type=int, default=2)
    args = p.parse_args()
    if os.geteuid() != 0:
        print("duck-netns: skipped (needs root for network namespaces)")
        return
    want = open(args.expect).read()
    netem = netem_available()
    procs, logs = [], []
    try:
        setup(args.ducks, netem)
        token = "netns-test-token"
        for i in range(args.ducks):
            cache = os.path.join(args.work, f"cache{i}")
            os.makedirs(cache, exist_ok=True)
            logs.append(os.path.join(args.work, f"duckd{i}.log"))
            log = open(logs[-1], "w")
            procs.append(subprocess.Popen(
                ["ip", "netns", "exec", f"{PREFIX}n{i}", args.duckd,
                 "--bind", f"10.77.{i}.2", "--port", "7411", "--token", token,
                 "--cache_dir", cache, "--name", f"net{i}", "--cores", "1",
                 "--weights_size", "64M"],
                stdout=log, stderr=log))
        cluster = os.path.join(args.work, "cluster.json")
        with open(cluster, "w") as f:
            json.dump({"ducks": [{"host": f"10.77.{i}.2", "port": 7411}
                                 for i in range(args.ducks)],
                       "token": token}, f)
        wait_listening(procs, logs)
        got = run(args, cluster, "veth")
        if got != want:
            sys.exit(f"duck-netns: ids over veth differ:\n{got}\nwant\n{want}")
        # Again, the weights now cached on the ducks as they will be for
        # the flap's run: the packets one such run sends duck 1.
        before = tx_packets(1)
        got = run(args, cluster, "veth, weights cached")
        packets = tx_packets(1) - before
        if got != want:
            sys.exit(f"duck-netns: ids over veth (weights cached) differ:"
                     f"\n{got}\nwant\n{want}")
        print("ids over veth pairs equal the local run"
              + (" (200 us delay, 1 % loss)" if netem else
                 " (netem unavailable in this kernel: no delay or loss)"))

        # A link down for 2 s in the middle of a generation. A fixed delay
        # misses it on a machine fast enough to finish first, so the link
        # goes down once duck 1's link has carried half the packets the
        # whole last run did: by traffic, the middle, at any speed.
        done = threading.Event()
        flapped = threading.Event()

        def flap():
            base = tx_packets(1)
            while not done.is_set():
                if tx_packets(1) - base >= packets // 2:
                    sh("ip", "link", "set", f"{PREFIX}h1", "down")
                    flapped.set()
                    time.sleep(2)
                    sh("ip", "link", "set", f"{PREFIX}h1", "up")
                    return
                time.sleep(0.0005)
        t = threading.Thread(target=flap)
        t.start()
        start = time.time()
        try:
            got = run(args, cluster, "link flap")
        finally:
            done.set()
            t.join()
        elapsed = time.time() - start
        if not flapped.is_set():
            sys.exit(f"duck-netns: the generation ended ({elapsed:.1f} s) "
                     f"before duck 1's link carried {packets // 2} packets: "
                     "the flap never happened")
        if elapsed < 2.0:
            sys.exit(f"duck-netns: the generation took {elapsed:.1f} s with "
                     "duck 1's link down for 2 s in its middle")
        if got != want:
            sys.exit(f"duck-netns: ids after the link flap differ:\n{got}")
        print(f"a duck's link down for 2 s: the generation completes with the "
              f"same ids ({elapsed:.1f} s)")
    finally:
        stop_all(procs)
        teardown(args.ducks)


if __name__ == "__main__":
    main()
