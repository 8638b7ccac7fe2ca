#!/usr/bin/env python3
"""A cluster file with a spare duck: three duckd's on 127.0.0.1, two in the
plan's cluster and one spare. Duck 1 is killed for good before duck step
--kill-step (duckrun's DUCK_TEST_KILL_DUCK=STEP:pid=PID, so the kill lands
at that step whatever the machine's speed); after it stays unreachable the
spare takes its place (its weight image uploaded to the spare), the step is
sent again, the summary counts one recovery and the ids equal an
undisturbed run.

  duck-spare.test.py --duckd D --duckrun R --plan P --ids I --tokens N \
      --kill-step S --expect FILE --work DIR
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import time

from duckd_proc import start_duckd


def main():
    a = argparse.ArgumentParser()
    for f in ("duckd", "duckrun", "plan", "ids", "expect", "work"):
        a.add_argument("--" + f, required=True)
    a.add_argument("--tokens", type=int, default=64)
    a.add_argument("--kill-step", type=int, default=100)
    args = a.parse_args()
    os.makedirs(args.work, exist_ok=True)
    procs = []
    try:
        eps = []
        for name in ("d0", "d1", "spare"):
            p, ep = start_duckd(args.duckd, args.work, name)
            procs.append(p)
            eps.append(ep)
        cluster = os.path.join(args.work, "cluster.json")
        json.dump({"ducks": eps[:2], "spares": eps[2:]}, open(cluster, "w"))
        summary = os.path.join(args.work, "summary.json")
        env = dict(os.environ,
                   DUCK_TEST_KILL_DUCK=f"{args.kill_step}:pid={procs[1].pid}")
        start = time.time()
        r = subprocess.run([args.duckrun, args.plan, "--cluster", cluster,
                            "--prompt-ids", args.ids, "--max-tokens",
                            str(args.tokens), "--ignore-eos", "--print-ids",
                            "--summary-json", summary],
                           capture_output=True, text=True, timeout=300,
                           env=env)
        if r.returncode != 0:
            sys.exit(f"duck-spare: duckrun failed:\n{r.stderr}")
        if procs[1].poll() != -signal.SIGKILL:
            sys.exit(f"duck-spare: duck 1 was not killed "
                     f"(exit status {procs[1].poll()})")
        recoveries = json.load(open(summary))["recoveries"]
        if recoveries != 1:
            sys.exit(f"duck-spare: {recoveries} recoveries, expected 1")
        if r.stdout != open(args.expect).read():
            sys.exit(f"duck-spare: ids differ from the undisturbed run")
        for line in r.stderr.splitlines():
            if "spare" in line or "ducks back" in line:
                print(line)
        print(f"ids equal the undisturbed run ({time.time() - start:.1f} s)")
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                p.wait(timeout=10)


if __name__ == "__main__":
    main()
