#!/usr/bin/env python3
"""duckd scrubs its memory: bytes of a finished slot changed under a running
duck are found by the scrub, the slot is refused to steps and uploaded
again, alone, and the ids equal an undisturbed run.

Two duckd's on 127.0.0.1 with their default scrub rate, a cluster file
naming them. The weights file is mapped MAP_SHARED, so bytes written into
it land in the very pages the duck serves from: the damage is real, not a
duckd test hook.

  A. Idle between runs: duckrun twice (a miss, then a hit: the hit leaves
     nothing for the next prepare to re-hash, so only the scrub can find
     what follows), bytes of duck 1's slot 1 flipped, the scrub's log line
     awaited, then duckrun again: duck 1 is partial with exactly that
     slot's bytes uploaded.
  B. Mid-generation: duckrun is paused (SIGSTOP: the ducks go idle, no
     step in flight), bytes of duck 1's slot 0 flipped, the scrub's line
     awaited, duckrun continued: the next step on slot 0 is refused naming
     it, the host brings the ducks back (one slot uploaded) and resends.
  C. The same with duckrun's own local ducks (no cluster file; their
     caches under the XDG_CACHE_HOME --local DIR, which the run that made
     --expect filled): the
     host restarts them, the damaged flag survives the restart in the
     cache's metadata, and the slot is uploaded alone.

  duck-scrub.test.py --duckd D --duckrun R --plan P --ids I --tokens N \
      --expect FILE --work DIR --local DIR
"""
import argparse
import json
import os
import re
import signal
import struct
import subprocess
import sys
import time

from duckd_proc import start_duckd

CACHE_HEADER_BYTES = 65536  # duckd_cache_header, before the image
WAIT_SECONDS = 60           # for the scrub's log line (a pass takes ms)


def fail(msg):
    sys.exit(f"duck-scrub: {msg}")


def slot_row(weights, slot):
    """(offset, bytes, layer) of a slot, from the image head in the file."""
    with open(weights, "rb") as f:
        f.seek(CACHE_HEADER_BYTES)
        head = f.read(4096)
        count, = struct.unpack_from("<I", head, 28)
        table, = struct.unpack_from("<Q", head, 48)
        if slot >= count:
            fail(f"{weights} has {count} slots, not {slot + 1}")
        f.seek(CACHE_HEADER_BYTES + table + 32 * slot)
        off, size, _, layer, _ = struct.unpack("<QQQII", f.read(32))
    return off, size, layer


def flip(weights, slot):
    """Flips 7 bytes inside `slot` of the duck's weights file, in place (the
    running duck's mapping shares these pages). Returns the slot's bytes."""
    off, size, _ = slot_row(weights, slot)
    with open(weights, "r+b") as f:
        for i in range(7):
            at = CACHE_HEADER_BYTES + off + size // 3 + 4099 * i
            f.seek(at)
            b = f.read(1)
            f.seek(at)
            f.write(bytes([b[0] ^ 0x5A]))
        f.flush()
    return size


def wait_log(log, pattern, since, what):
    """The first line of `log` after byte `since` matching `pattern`."""
    deadline = time.time() + WAIT_SECONDS
    rx = re.compile(pattern)
    while time.time() < deadline:
        with open(log) as f:
            f.seek(since)
            for line in f:
                if rx.search(line):
                    return line.rstrip("\n")
        time.sleep(0.02)
    fail(f"no {what} in {log} within {WAIT_SECONDS} s")


def run(args, cluster, quiet=False):
    where = (["--cluster", cluster] if cluster else
             ["--cores-per-duck", "1"])  # as the run that made --expect
    cmd = [args.duckrun, args.plan, *where, "--prompt-ids", args.ids,
           "--max-tokens", str(args.tokens), "--ignore-eos",
           "--print-ids"] + (["--quiet"] if quiet else [])
    env = dict(os.environ)
    if not cluster:
        env["XDG_CACHE_HOME"] = args.local
    return subprocess.Popen(cmd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def finish(p, expect, what):
    out, err = p.communicate(timeout=300)
    if p.returncode != 0:
        fail(f"{what}: duckrun failed:\n{err}")
    if out != expect:
        fail(f"{what}: ids differ from the undisturbed run\n{err}")
    return err


def paused(args, expect, cluster, log, weights, slot):
    """Damages `slot` of a duck while a run is paused mid-generation."""
    since = os.path.getsize(log) if os.path.exists(log) else 0
    p = run(args, cluster)
    # Paused as soon as its session is open (1500 tokens take 0.4 s or
    # more after it): any moment of the generation will do.
    wait_log(log, r"session \d+ opened", since, "session of the run")
    p.send_signal(signal.SIGSTOP)
    time.sleep(0.1)  # a step in flight finishes: the ducks are idle
    if p.poll() is not None:
        fail("the run ended before it could be paused")
    size = flip(weights, slot)
    print(wait_log(log, rf"scrub: slot {slot} \(layer", since,
                   f"scrub line for slot {slot}"))
    p.send_signal(signal.SIGCONT)
    err = finish(p, expect, "run damaged while paused")
    for line in err.splitlines():
        if "bringing the ducks back" in line or "ducks back" in line:
            print(line.strip())
    print(wait_log(log, rf"step -> cache: slot {slot} \(layer", since,
                   f"step refused on slot {slot}"))
    if f"{size} bytes uploaded" not in err:
        fail(f"expected slot {slot}'s {size} bytes uploaded again:\n{err}")
    print("ids equal the undisturbed run")


def main():
    a = argparse.ArgumentParser()
    for f in ("duckd", "duckrun", "plan", "ids", "expect", "work", "local"):
        a.add_argument("--" + f, required=True)
    a.add_argument("--tokens", type=int, default=1500)
    args = a.parse_args()
    os.makedirs(args.work, exist_ok=True)
    expect = open(args.expect).read()
    procs = []
    try:
        eps = []
        for name in ("d0", "d1"):
            p, ep = start_duckd(args.duckd, args.work, name)
            procs.append(p)
            eps.append(ep)
        cluster = os.path.join(args.work, "cluster.json")
        json.dump({"ducks": eps}, open(cluster, "w"))
        log = os.path.join(args.work, "d1.log")
        weights = os.path.join(args.work, "d1", "duckd-d1.weights")
        print(wait_log(log, r"scrub \d+ MB/s", 0, "listening line"))

        # A. The duck idle between runs.
        finish(run(args, cluster, quiet=True), expect, "first run")
        err = finish(run(args, cluster), expect, "second run")
        if "duck 0 hit, duck 1 hit" not in err:
            fail(f"the second run was not a hit on both ducks:\n{err}")
        since = os.path.getsize(log)
        size = flip(weights, 1)
        print(wait_log(log, r"scrub: slot 1 \(layer", since,
                       "scrub line for slot 1"))
        err = finish(run(args, cluster), expect, "run after the damage")
        m = re.search(r"duck 1 partial \((\d+) bytes\)", err)
        if not m or int(m.group(1)) != size:
            fail(f"expected duck 1 partial with slot 1's {size} bytes:\n{err}")
        print(f"duck 1 partial: {m.group(1)} bytes uploaded, slot 1's "
              f"{size}; ids equal the undisturbed run")

        # B. Mid-generation: the host paused between steps.
        paused(args, expect, cluster, log, weights, 0)
        # C. duckrun's local ducks.
        print("local ducks:")
        local = os.path.join(args.local, "duck", "duckrun")
        paused(args, expect, None,
               os.path.join(local, "logs", "duckd-duck1.log"),
               os.path.join(local, "duckd-duck1.weights"), 1)
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                p.wait(timeout=10)


if __name__ == "__main__":
    main()
