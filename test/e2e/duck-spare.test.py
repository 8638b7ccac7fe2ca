#!/usr/bin/env python3
"""A cluster file with a spare duck: three duckd's on 127.0.0.1, two in the
plan's cluster and one spare. Duck 1 is killed for good in the middle of a
generation; after it stays unreachable the spare takes its place (its
weight image uploaded to the spare), the step is sent again and the ids
equal an undisturbed run.

  duck-spare.test.py --duckd D --duckrun R --plan P --ids I --tokens N \
      --expect FILE --work DIR
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time

from duckd_proc import start_duckd


def main():
    a = argparse.ArgumentParser()
    for f in ("duckd", "duckrun", "plan", "ids", "expect", "work"):
        a.add_argument("--" + f, required=True)
    a.add_argument("--tokens", type=int, default=1500)
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

        def kill():
            time.sleep(0.3)
            procs[1].send_signal(signal.SIGKILL)
        t = threading.Thread(target=kill)
        t.start()
        start = time.time()
        r = subprocess.run([args.duckrun, args.plan, "--cluster", cluster,
                            "--prompt-ids", args.ids, "--max-tokens",
                            str(args.tokens), "--ignore-eos", "--print-ids"],
                           capture_output=True, text=True, timeout=300)
        t.join()
        if r.returncode != 0:
            sys.exit(f"duck-spare: duckrun failed:\n{r.stderr}")
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
