#!/usr/bin/python3
"""Prefix reuse against a cold prefill, on a running `duckrun serve`.

A second turn that adds --extra new tokens to a --prefix-token prompt the
slot already holds, against a same-length prompt with a prefix never sent
before (cold), alternated for --rounds rounds. The server should run with
--parallel 1, so that "the slot" is one. With --between N an unrelated
N-token request runs between the first turn and the warm one, so the slot
no longer holds the prefix and the warm turn finds it in the prefix store
(--kv-budget) instead. Prints each round's time to first token (TTFT:
request sent -> first chunk with text) cold and warm, the cached_tokens
the server reports, and the median ratio. Only loopback servers.

    utils/bench-prefix.py --url http://127.0.0.1:8080 --prefix 1000 --extra 20
"""
import argparse
import http.client
import json
import random
import statistics
import sys
import time
import urllib.parse


def stream(url, key, ids):
    """TTFT in ms and the usage of one streamed completion of `ids`."""
    u = urllib.parse.urlparse(url)
    if u.hostname not in ("127.0.0.1", "localhost", "::1"):
        sys.exit("bench-prefix: loopback servers only")
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    body = {"model": "any", "prompt": ids, "max_tokens": 2, "temperature": 0,
            "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    h = {"Content-Type": "application/json"}
    if key:
        h["Authorization"] = f"Bearer {key}"
    t0 = time.monotonic()
    c.request("POST", "/v1/completions", body=json.dumps(body), headers=h)
    r = c.getresponse()
    if r.status != 200:
        sys.exit(f"bench-prefix: HTTP {r.status}: {r.read()!r}")
    ttft, usage = None, None
    for line in r:
        line = line.decode().strip()
        if not line.startswith("data: {"):
            continue
        d = json.loads(line[6:])
        if ttft is None and d.get("choices") and d["choices"][0].get("text"):
            ttft = (time.monotonic() - t0) * 1e3
        usage = d.get("usage") or usage
    return ttft, usage


def main():
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a.add_argument("--url", required=True)
    a.add_argument("--api-key", default="")
    a.add_argument("--prefix", type=int, default=1000)
    a.add_argument("--extra", type=int, default=20)
    a.add_argument("--rounds", type=int, default=3)
    a.add_argument("--between", type=int, default=0,
                   help="tokens of a request between the turns (0: none)")
    a.add_argument("--vocab", type=int, default=1000, help="ids drawn below this")
    a.add_argument("--seed", type=int, default=1,
                   help="of the ids (another for a second run on one server)")
    a = a.parse_args()
    rng = random.Random(a.seed)
    ratios = []
    for rnd in range(a.rounds):
        prefix = [rng.randrange(10, a.vocab) for _ in range(a.prefix)]
        x = [rng.randrange(10, a.vocab) for _ in range(a.extra)]
        y = [rng.randrange(10, a.vocab) for _ in range(a.extra)]
        z = [rng.randrange(10, a.vocab) for _ in range(a.extra)]
        stream(a.url, a.api_key, [3, 4, 5])        # the slot cleared
        cold, uc = stream(a.url, a.api_key, prefix + y)
        stream(a.url, a.api_key, [3, 4, 5])
        stream(a.url, a.api_key, prefix + x)       # the first turn
        if a.between:                              # takes the slot
            stream(a.url, a.api_key,
                   [rng.randrange(10, a.vocab) for _ in range(a.between)])
        # New after the prefix (prefix + y itself is stored by now).
        warm, uw = stream(a.url, a.api_key, prefix + z)
        cached = uw["prompt_tokens_details"]["cached_tokens"]
        cold_cached = uc["prompt_tokens_details"]["cached_tokens"]
        ratios.append(cold / warm)
        print(f"round {rnd + 1}: {a.prefix + a.extra}-token prompt: cold TTFT "
              f"{cold:.1f} ms (cached {cold_cached}), warm {warm:.1f} ms "
              f"(cached {cached}): {cold / warm:.1f}x", flush=True)
    print(f"median cold/warm TTFT: {statistics.median(ratios):.1f}x")


if __name__ == "__main__":
    main()
