"""Starting a duckd for the e2e drivers: on loopback, port 0, its log in the
work directory, its address read from the line it prints when it listens."""
import json
import os
import re
import subprocess
import sys
import time


def start_duckd(duckd, work, name, *extra):
    """Returns (the process, {"host", "port"} and, started with
    --mesh-port, "mesh_port", with --cast, "cast_port"); exits naming
    `name` if the daemon does not come up."""
    log = open(os.path.join(work, f"{name}.log"), "w")
    p = subprocess.Popen([duckd, "--port", "0", "--name", name, "--cores", "1",
                          "--cache_dir", os.path.join(work, name),
                          "--weights_size", "64M", *extra],
                         stdout=subprocess.PIPE, stderr=log, text=True)
    ep = {}
    line = p.stdout.readline()
    # --mesh-port's and --cast's lines come first.
    while re.match(r"duckd: (mesh|cast) on ", line):
        kind, port = re.match(r"duckd: (mesh|cast) on [0-9.]+:([0-9]+)",
                              line).groups()
        ep[f"{kind}_port"] = int(port)
        line = p.stdout.readline()
    m = re.search(r"listening on ([0-9.]+):([0-9]+)", line)
    if not m:
        sys.exit(f"{os.path.basename(sys.argv[0])}: duckd {name} did not "
                 f"start: {line!r}")
    return p, {"host": m.group(1), "port": int(m.group(2)), **ep}


def run_tool(cmd, who, check=True):
    """Runs cmd, its output captured; with `check` a failure exits naming
    `who`, the command and its output."""
    r = subprocess.run(cmd, capture_output=True, text=True)
    if check and r.returncode != 0:
        sys.exit(f"{who}: {' '.join(cmd)} failed ({r.returncode}):\n"
                 f"{r.stdout}{r.stderr}")
    return r


def decode_logits(duckrun, plan, cluster, work, name, prompt, who):
    """duckrun on `plan` over the cluster file, 12 tokens of `prompt`: its
    logits file, its summary (parsed) and its stderr; a failure exits
    naming `who`."""
    logits = os.path.join(work, name + ".logits")
    summary = os.path.join(work, name + ".json")
    r = run_tool([duckrun, plan, "--cluster", cluster, "--prompt-ids",
                  prompt, "--max-tokens", "12", "--ignore-eos", "--quiet",
                  "--logits-out", logits, "--summary-json", summary], who)
    return logits, json.load(open(summary)), r.stderr


def stop_all(procs, timeout=10):
    """Terminates the daemons and waits for each, killing one that has not
    ended within `timeout` seconds."""
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def wait_listening(procs, logs, timeout=30):
    """Waits until each daemon's log (its stdout) says it listens; exits
    naming the log of one that ended or did not within `timeout` s."""
    deadline = time.time() + timeout
    for p, log in zip(procs, logs):
        while True:
            with open(log) as f:
                if "listening on" in f.read():
                    break
            if p.poll() is not None or time.time() > deadline:
                with open(log) as f:
                    sys.exit(f"{os.path.basename(sys.argv[0])}: duckd did not "
                             f"start ({log}):\n{f.read()}")
            time.sleep(0.02)
