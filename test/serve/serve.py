#!/usr/bin/env python3
"""Drives `duckrun serve` in the lit tests (loopback only).

  serve.py start DIR -- duckrun serve PLAN --port 0 ...
      Starts the server in the background (its log: DIR/server.log), waits
      for it to listen and for /health to say 200, writes DIR/url and
      DIR/pid. A watchdog stops it after --timeout seconds, so a failing
      test never leaves it running.
  serve.py stop DIR
      SIGTERM, then waits for a clean exit ("duckrun serve: stopped").
  serve.py cli-expect N -- duckrun PLAN ...
      Runs the one-shot CLI with the first N prompts of prompts.json and
      prints `stream <i> <JSON text>` lines, the format of
      openai-client.cjs. Fails when two answers are the same text: a
      comparison of served and CLI answers means something only when a
      swapped or broken prompt would show.
  serve.py check-stop URL KEY
      A stop string cut from a greedy answer ends the answer just before it,
      with finish_reason "stop", streaming and not.
  serve.py check-disconnect URL KEY
      A client that drops a stream mid-way frees its slot.
  serve.py check-drop-nonstream URL KEY
      A client that drops a non-streaming request mid-way frees its slot.
  serve.py check-bad-clients URL KEY
      Garbage, truncated, stalled and oversized requests (chunked or
      without a Content-Length too), invalid UTF-8 and deeply nested JSON;
      the server answers the next request.
  serve.py check-unsupported URL KEY
      Every field the server cannot honour yet (tools on completions,
      functions, echo, best_of, suffix) gets a 400 naming it; the same fields asking for nothing
      (empty, zero, false, "none", "text") are answered.
  serve.py check-prefix-store URL KEY A B A2 EXPECT WANT
      The prefix store (--kv-budget) on one slot: prompts A, B (sharing
      nothing with A) and A2 (A and more), token ids: with WANT "store",
      A2 reuses at least A's tokens though B overwrote the slot, and the
      store's /metrics gauges say it holds something; with WANT "none"
      (--kv-budget 0) A2 reuses nothing. Either way A2's text is EXPECT's
      (the one-shot CLI's for A2, a cold prefill).
  serve.py check-logprobs URL KEY IDS LOGITS
      /v1/completions over the token ids IDS with logprobs 5, greedy, 4
      tokens, streamed and not: each token's logprob and its 5 best
      alternatives equal the log-softmax of `duckrun --logits-out` rows
      (LOGITS, written for the same ids with --max-tokens 4) within 1e-5,
      the chosen token is the best; chat's logprobs have one entry a token,
      each the best of its top_logprobs at temperature 0.
  serve.py check-penalties URL KEY
      presence_penalty, frequency_penalty and logit_bias, greedy with
      logprobs (those of the raw distribution): every chosen token is the
      best of its top 20 alternatives after logit[t] -= presence *
      (count[t] > 0) + frequency * count[t]; a frequency or presence
      penalty of 2 gives a repetitive answer more distinct tokens, -2
      fewer or as many; a logit_bias of +100 on one token makes every
      token that one, whose raw logprob is reported; zero penalties and
      biases change nothing; bad values are 400s naming the field.
  serve.py tool-tokenizer IN OUT [CONTENT...]
      Writes a copy of the tokenizer.json IN whose last three BPE tokens
      that no merge builds on (and the merges that make them) are replaced
      by the added, non-special tokens "<tool_call>", "<think>" and
      "</think>" with the same ids, as Qwen3's tokenizer has them, and
      prints the three ids: a logit_bias on them then makes a model start
      a tool call or think. With CONTENTs, those tokens instead (one BPE
      token each, in order; DeepSeek's tool-call markers).
  serve.py check-drafts-accepted URL KEY IDS MIN [STEP]
      Three requests at once over the token ids IDS (greedy, 20 tokens,
      Duck's 'speculative' 4), then the same without drafts: the texts are
      equal, and the drafts of the first three were accepted at MIN or more
      (/metrics duck_draft_acceptance) with more than STEP (1.5) tokens a
      verify step: drafts that are right save steps while sequences share
      them.
  serve.py check-slow-clients URL N
      N connections that send half a request head and stall: the server
      still answers /health at once.
  serve.py check-queue-full URL KEY N
      N concurrent long streams on a server with a small --parallel and
      --queue: some get 429, the rest are served or dropped, and every slot
      is free again afterwards.
"""
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse


def die(msg):
    print(f"serve.py: {msg}", file=sys.stderr)
    sys.exit(1)


def split_url(url):
    u = urllib.parse.urlsplit(url)
    if u.hostname not in ("127.0.0.1", "localhost", "::1"):
        die(f"refusing a non-loopback URL {url}")
    return u.hostname, u.port


def request(url, method, path, body=None, key=None, timeout=120):
    status, _, data = request_typed(url, method, path, body, key, timeout)
    return status, data


def request_typed(url, method, path, body=None, key=None, timeout=120):
    """request, with the answer's Content-Type: (status, type, data)."""
    host, port = split_url(url)
    c = http.client.HTTPConnection(host, port, timeout=timeout)
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    c.request(method, path, body=json.dumps(body) if body is not None else None,
              headers=headers)
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, r.getheader("Content-Type", ""), data


def start(argv):
    d, cmd = argv[0], argv[argv.index("--") + 1:]
    timeout = 600
    log = open(os.path.join(d, "server.log"), "wb")
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                         start_new_session=True)
    dog = subprocess.Popen(
        ["sh", "-c", f"sleep {timeout}; kill -TERM {p.pid} 2>/dev/null"],
        start_new_session=True, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    open(os.path.join(d, "watchdog"), "w").write(str(dog.pid))
    url = None
    deadline = time.time() + 180
    while time.time() < deadline:
        if p.poll() is not None:
            break
        text = open(os.path.join(d, "server.log"), errors="replace").read()
        m = re.search(r"listening on (http://[0-9.]+:[0-9]+)", text)
        if m:
            url = m.group(1)
            try:
                status, _ = request(url, "GET", "/health", timeout=5)
                if status == 200:
                    break
            except OSError:
                pass
        time.sleep(0.1)
    else:
        p.terminate()
    text = open(os.path.join(d, "server.log"), errors="replace").read()
    if p.poll() is not None or url is None:
        die(f"the server did not come up; its log:\n{text}")
    open(os.path.join(d, "url"), "w").write(url)
    open(os.path.join(d, "pid"), "w").write(str(p.pid))
    print(f"serving at {url}")


def stop(argv):
    d = argv[0]
    pid = int(open(os.path.join(d, "pid")).read())
    try:
        os.killpg(int(open(os.path.join(d, "watchdog")).read()), signal.SIGKILL)
    except (OSError, ValueError):
        pass
    os.kill(pid, signal.SIGTERM)
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            os.kill(pid, 0)
            # A zombie of ours? (start's Popen is gone, so it is reaped by init.)
            time.sleep(0.1)
        except ProcessLookupError:
            break
    else:
        die(f"the server (pid {pid}) did not stop within 60 s of SIGTERM")
    text = open(os.path.join(d, "server.log"), errors="replace").read()
    if "duckrun serve: stopped" not in text:
        die(f"the server did not stop cleanly; its log:\n{text}")
    print("stopped cleanly")


def cli_expect(argv):
    n, cmd = int(argv[0]), argv[argv.index("--") + 1:]
    prompts = json.load(open(os.path.join(os.path.dirname(
        os.path.abspath(__file__)), "prompts.json")))
    if n > len(prompts):
        die(f"cli-expect: {n} answers asked, prompts.json has {len(prompts)}")
    seen = {}
    for i in range(1, n + 1):
        out = subprocess.run(cmd + ["--prompt", prompts[i - 1]],
                             check=True, capture_output=True).stdout
        text = out.decode("utf-8")
        if text.endswith("\n"):
            text = text[:-1]
        if text in seen:
            die(f"cli-expect: prompts {seen[text]} and {i} give the same "
                f"answer {text!r}: the model cannot tell the streams apart")
        seen[text] = i
        print(f"stream {i} {json.dumps(text, ensure_ascii=False)}")


def chat_body(content, **kw):
    b = {"model": "any", "messages": [{"role": "user", "content": content}],
         "temperature": 0}
    b.update(kw)
    return b


def read_stream(url, key, body):
    """Content and finish_reason of a streamed chat answer."""
    host, port = split_url(url)
    c = http.client.HTTPConnection(host, port, timeout=120)
    c.request("POST", "/v1/chat/completions", body=json.dumps(body),
              headers={"Authorization": f"Bearer {key}",
                       "Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        die(f"stream: HTTP {r.status}: {r.read()!r}")
    text, finish = "", None
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ch = json.loads(line[6:])
        for choice in ch["choices"]:
            text += choice["delta"].get("content", "")
            finish = choice["finish_reason"] or finish
    c.close()
    return text, finish


def check_stop(argv):
    url, key = argv
    full = json.loads(request(url, "POST", "/v1/chat/completions",
                              chat_body("Tell me more", max_tokens=24),
                              key)[1])["choices"][0]["message"]["content"]
    if len(full) < 12:
        die(f"the greedy answer is too short to cut: {full!r}")
    stop = full[6:9]
    want = full[:full.index(stop)]
    r = json.loads(request(url, "POST", "/v1/chat/completions",
                           chat_body("Tell me more", max_tokens=24,
                                     stop=[stop, "\x00never"]), key)[1])
    got, finish = r["choices"][0]["message"]["content"], r["choices"][0]["finish_reason"]
    if got != want or finish != "stop":
        die(f"stop {stop!r}: got {got!r} ({finish}), want {want!r} (stop)")
    got, finish = read_stream(url, key, chat_body("Tell me more", max_tokens=24,
                                                  stop=stop, stream=True))
    if got != want or finish != "stop":
        die(f"stream, stop {stop!r}: got {got!r} ({finish}), want {want!r}")
    print(f"stop string cuts the answer (finish_reason stop, "
          f"{len(want)} of {len(full)} bytes kept)")


def metric(url, name):
    text = request(url, "GET", "/metrics")[1].decode()
    m = re.search(rf"^{name} ([0-9.e+-]+)$", text, re.M)
    return float(m.group(1)) if m else None


def wait_idle(url, seconds=20):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if metric(url, "duck_active_sequences") == 0 and \
                metric(url, "duck_queue_depth") == 0:
            return True
        time.sleep(0.1)
    return False


def open_stream(url, key, body):
    host, port = split_url(url)
    s = socket.create_connection((host, port), timeout=120)
    data = json.dumps(body).encode()
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
              b"Authorization: Bearer " + key.encode() + b"\r\n"
              b"Content-Type: application/json\r\nContent-Length: " +
              str(len(data)).encode() + b"\r\n\r\n" + data)
    return s


def check_disconnect(argv):
    url, key = argv
    # The client leaves after three events of a 4000-token answer; the
    # server must stop generating it and free its slot. Counted by the
    # tokens generated meanwhile rather than by a look at the active
    # sequences while it runs. The server notices a client gone when its
    # HTTP thread next writes; on a loaded machine the tiny model can
    # finish the answer first, so up to five tries, one of which must
    # show the answer cut short.
    def drop():
        s = open_stream(url, key, chat_body("Go on", max_tokens=4000,
                                            stream=True, ignore_eos=True))
        got = b""
        while got.count(b"data: ") < 3:
            chunk = s.recv(4096)
            if not chunk:
                die(f"the stream ended early: {got!r}")
            got += chunk
        s.close()
    dropped_frees_slot(url, drop, "stream")


def dropped_frees_slot(url, drop, what):
    """Up to five tries of drop() (a client that leaves a 4000-token answer
    part way); one must show the answer cut short, its slot free again."""
    for attempt in range(5):
        before = metric(url, "duck_generated_tokens_total")
        drop()
        if not wait_idle(url):
            die(f"the dropped {what} still holds its slot after 20 s")
        made = metric(url, "duck_generated_tokens_total") - before
        if made < 4000:
            print(f"a dropped {what} frees its slot")
            return
    die(f"five answers ran to their end ({made:.0f} tokens the last) before "
        "the server saw their clients leave: nothing was dropped")


def check_drop_nonstream(argv):
    url, key = argv
    # As check-disconnect, for an answer in one piece: the client leaves
    # while the server makes it; nothing is written to the connection
    # meanwhile, so the server must watch it to notice.
    host, port = split_url(url)

    def drop():
        body = json.dumps(chat_body("Go on", max_tokens=4000,
                                    ignore_eos=True)).encode()
        s = socket.create_connection((host, port), timeout=120)
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                  b"Authorization: Bearer " + key.encode() + b"\r\n"
                  b"Content-Type: application/json\r\nContent-Length: " +
                  str(len(body)).encode() + b"\r\n\r\n" + body)
        # Leave once the answer is under way, whatever the machine's speed.
        deadline = time.time() + 20
        while metric(url, "duck_active_sequences") == 0 and \
                time.time() < deadline:
            time.sleep(0.005)
        s.close()
    dropped_frees_slot(url, drop, "non-streaming request")


def check_slow_clients(argv):
    url, n = argv[0], int(argv[1])
    # Each stalled client holds a connection thread as long as it likes
    # (the HTTP library sets no deadline for a request head): more of them
    # than a fixed pool holds must not starve everyone else.
    host, port = split_url(url)
    held = []
    for _ in range(n):
        s = socket.create_connection((host, port), timeout=10)
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        held.append(s)
    time.sleep(0.5)
    t0 = time.time()
    try:
        st, body = request(url, "GET", "/health", timeout=5)
    except OSError as e:
        die(f"/health beside {n} stalled clients: {e}")
    finally:
        for s in held:
            s.close()
    if st != 200:
        die(f"/health beside {n} stalled clients: status {st}")
    print(f"{n} stalled clients: /health answered in "
          f"{time.time() - t0:.1f} s")


def queue_full_once(url, key, n):
    """Statuses of n streams opened at once, each held until all have
    theirs (4000-token answers: none can end, and free its slot, before
    the last request is in), with when each came."""
    statuses, when = [], []
    lock = threading.Lock()
    all_in = threading.Barrier(n)
    t0 = time.time()

    def one(i):
        s = open_stream(url, key, chat_body(f"Stream {i}", max_tokens=4000,
                                            stream=True, ignore_eos=True))
        head = s.recv(64)
        m = re.match(rb"HTTP/1.1 (\d+)", head)
        with lock:
            statuses.append(int(m.group(1)) if m else 0)
            when.append(f"{i}:{time.time() - t0:.3f}")
        try:
            all_in.wait(timeout=60)
        except threading.BrokenBarrierError:
            pass
        s.close()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if not wait_idle(url):
        die("slots still taken after the clients left")
    return statuses, when


def check_queue_full(argv):
    url, key, n = argv[0], argv[1], int(argv[2])
    # A loaded machine can run the clients so late that the first answers
    # end before the last request arrives: up to three tries, one of
    # which must see the queue full.
    for attempt in range(3):
        statuses, when = queue_full_once(url, key, n)
        busy = statuses.count(429)
        if statuses.count(200) + busy != n:
            die(f"statuses {sorted(statuses)}: only 200 and 429 expected")
        if busy and statuses.count(200):
            print(f"queue full: {busy} of {n} requests got 429; every slot "
                  "free again")
            return
    die(f"statuses {sorted(statuses)}: want some 200 and some 429 "
        f"(status times, s: {' '.join(when)})")


def check_logprobs(argv):
    import math
    import struct
    url, key, ids, logits_file = argv
    ids = [int(x) for x in ids.split(",")]
    n = 4
    raw = open(logits_file, "rb").read()
    floats = struct.unpack("<%df" % (len(raw) // 4), raw)
    vocab = len(floats) // (len(ids) + n - 1)
    # Row i predicts the token after position i: generated token k comes
    # from row len(ids) - 1 + k.
    want = []
    for k in range(n):
        at = (len(ids) - 1 + k) * vocab
        r = floats[at:at + vocab]
        mx = max(r)
        lse = mx + math.log(sum(math.exp(v - mx) for v in r))
        order = sorted(range(vocab), key=lambda i: (-r[i], i))[:5]
        want.append((r[order[0]] - lse, [r[i] - lse for i in order]))
    body = {"model": "any", "prompt": ids, "max_tokens": n, "temperature": 0,
            "ignore_eos": True, "logprobs": 5}

    def compare(lp, what):
        if len(lp["token_logprobs"]) != n or len(lp["top_logprobs"]) != n:
            die(f"check-logprobs: {what}: {len(lp['token_logprobs'])} entries, "
                f"expected {n}: {lp}")
        for k in range(n):
            got = lp["token_logprobs"][k]
            tops = sorted(lp["top_logprobs"][k].values(), reverse=True)
            if abs(got - want[k][0]) > 1e-5:
                die(f"check-logprobs: {what}: token {k} logprob {got}, "
                    f"expected {want[k][0]}")
            # Distinct tokens can share a text: compare the values the
            # dict kept with the best five's.
            if len(tops) < 1 or any(not any(abs(t - w) <= 1e-5
                                            for w in want[k][1]) for t in tops):
                die(f"check-logprobs: {what}: token {k} top_logprobs {tops}, "
                    f"expected among {want[k][1]}")
            if abs(tops[0] - got) > 1e-5:
                die(f"check-logprobs: {what}: token {k} is not the best")

    status, data = request(url, "POST", "/v1/completions", body, key)
    if status != 200:
        die(f"check-logprobs: HTTP {status} {data!r}")
    compare(json.loads(data)["choices"][0]["logprobs"], "completion")
    # Streamed: the same entries, spread over the chunks.
    host, port = split_url(url)
    c = http.client.HTTPConnection(host, port, timeout=120)
    c.request("POST", "/v1/completions", body=json.dumps(dict(body, stream=True)),
              headers={"Authorization": f"Bearer {key}",
                       "Content-Type": "application/json"})
    merged = {"token_logprobs": [], "top_logprobs": []}
    for line in c.getresponse().read().decode().splitlines():
        if line.startswith("data: {"):
            lp = json.loads(line[6:])["choices"][0].get("logprobs")
            if lp:
                merged["token_logprobs"] += lp["token_logprobs"]
                merged["top_logprobs"] += lp["top_logprobs"]
    compare(merged, "streamed completion")
    # Chat: an entry a generated token, each the best of its alternatives.
    r = json.loads(request(url, "POST", "/v1/chat/completions",
                           chat_body("Hi", max_tokens=n, ignore_eos=True,
                                     logprobs=True, top_logprobs=3), key)[1])
    content = r["choices"][0]["logprobs"]["content"]
    if len(content) != r["usage"]["completion_tokens"]:
        die(f"check-logprobs: chat: {len(content)} entries for "
            f"{r['usage']['completion_tokens']} tokens")
    for e in content:
        tops = [t["logprob"] for t in e["top_logprobs"]]
        if len(tops) != 3 or tops != sorted(tops, reverse=True) or \
                abs(tops[0] - e["logprob"]) > 1e-6 or e["logprob"] > 0 or \
                bytes(e["bytes"]).decode("utf-8", "replace") != e["token"]:
            die(f"check-logprobs: chat: bad entry {e}")
    print(f"logprobs: {n} tokens equal the log-softmax of duckrun's logits "
          f"(streamed and not); chat gives one entry a token")


def read_expected(path):
    """A file's text less one trailing newline (the CLI's printed answer)."""
    text = open(path, encoding="utf-8").read()
    return text[:-1] if text.endswith("\n") else text


def greedy_completer(url, key, who):
    """complete(ids) -> (text, usage): 8 greedy tokens after the
    comma-separated prompt ids, through /v1/completions."""
    def complete(ids):
        body = {"model": "any", "prompt": [int(x) for x in ids.split(",")],
                "max_tokens": 8, "temperature": 0, "ignore_eos": True}
        st, data = request(url, "POST", "/v1/completions", body, key)
        if st != 200:
            die(f"{who}: HTTP {st} {data!r}")
        r = json.loads(data)
        return r["choices"][0]["text"], r["usage"]
    return complete


def check_prefix(argv):
    """Prefix reuse: a prompt that extends an earlier one reuses its cached
    positions (usage.prompt_tokens_details.cached_tokens), and its text is
    the one-shot CLI's for the same ids (a cold prefill); a prompt sharing
    nothing reuses nothing."""
    url, key, first, second, expect_file = argv
    expect = read_expected(expect_file)
    complete = greedy_completer(url, key, "check-prefix")

    _, u1 = complete(first)
    text, u2 = complete(second)
    n1 = len(first.split(","))
    cached = u2.get("prompt_tokens_details", {}).get("cached_tokens")
    if cached is None or cached < n1 or cached >= u2["prompt_tokens"]:
        die(f"check-prefix: the second prompt ({u2['prompt_tokens']} tokens) "
            f"extends the first ({n1}) but reused {cached}: {u2}")
    if text != expect:
        die(f"check-prefix: with {cached} cached tokens the text is {text!r}, "
            f"the CLI's {expect!r}")
    _, u3 = complete("401,402,403,404,405,406")
    c3 = u3["prompt_tokens_details"]["cached_tokens"]
    if c3 != 0:
        die(f"check-prefix: a prompt sharing nothing reused {c3} tokens")
    print(f"prefix: {cached} of {u2['prompt_tokens']} prompt tokens reused; "
          f"the text is the CLI's; a new prompt reuses none")


def check_prefix_store(argv):
    url, key, a, b, a2, expect_file, want = argv
    expect = read_expected(expect_file)
    complete = greedy_completer(url, key, "check-prefix-store")

    complete(a)
    _, ub = complete(b)
    if ub["prompt_tokens_details"]["cached_tokens"] != 0:
        die(f"check-prefix-store: B shares nothing with A but reused: {ub}")
    text, u2 = complete(a2)
    na = len(a.split(","))
    cached = u2["prompt_tokens_details"]["cached_tokens"]
    if want == "store" and not na <= cached < u2["prompt_tokens"]:
        die(f"check-prefix-store: A2 ({u2['prompt_tokens']} tokens) extends "
            f"A ({na}) but reused {cached} after B took the slot: {u2}")
    if want == "none" and cached != 0:
        die(f"check-prefix-store: no store, yet A2 reused {cached}")
    if text != expect:
        die(f"check-prefix-store: with {cached} cached tokens A2's text is "
            f"{text!r}, the CLI's {expect!r}")
    held = metric(url, "duck_prefix_store_bytes")
    entries = metric(url, "duck_prefix_store_entries")
    if want == "store" and not (held and held > 0 and entries >= 1):
        die(f"check-prefix-store: the store holds {held} bytes in {entries} "
            "entries after A and B left it theirs")
    if want == "none" and (held or entries):
        die(f"check-prefix-store: no store, yet {held} bytes, {entries} "
            "entries")
    print(f"prefix store ({want}): A2 reused {cached} of "
          f"{u2['prompt_tokens']} prompt tokens after B; the text is the "
          "CLI's")


def check_speculative(argv):
    """Duck's 'speculative' field: lookup drafts change no answer (greedy
    and sampled with a seed, streamed and not); a bad value is a 400."""
    url, key = argv
    ids = [31, 32, 33, 34, 35, 31, 32, 33, 34, 35, 31, 32, 33, 34, 35]
    before = metric(url, "duck_drafts_proposed_total")
    for sampling in ({"temperature": 0}, {"temperature": 0.9, "seed": 5}):
        texts = []
        for spec in (0, 4, 2):
            body = dict({"model": "any", "prompt": ids, "max_tokens": 48,
                         "ignore_eos": True, "speculative": spec}, **sampling)
            st, data = request(url, "POST", "/v1/completions", body, key)
            if st != 200:
                die(f"check-speculative: HTTP {st} {data!r}")
            texts.append(json.loads(data)["choices"][0]["text"])
        if len(set(texts)) != 1:
            die(f"check-speculative: {sampling}: answers differ with "
                f"speculation: {texts}")
    drafts = metric(url, "duck_drafts_proposed_total") - before
    per_step = metric(url, "duck_tokens_per_verify_step")
    acceptance = metric(url, "duck_draft_acceptance")
    steps = metric(url, "duck_verify_steps_total")
    if None in (steps, per_step, acceptance) or steps <= 0 or \
            not 1 <= per_step <= 5 or not 0 <= acceptance <= 1:
        die(f"check-speculative: /metrics: {per_step} tokens a verify step, "
            f"acceptance {acceptance}")
    st, data = request(url, "POST", "/v1/completions",
                       {"model": "any", "prompt": "x", "speculative": 99}, key)
    if st != 400 or b"speculative" not in data:
        die(f"check-speculative: speculative 99 gave HTTP {st} {data!r}")
    constrained = check_speculative_constrained(url, key)
    print(f"speculative: answers equal with 0, 4 and 2 drafts a step (greedy "
          f"and sampled; {int(drafts)} drafts proposed, {per_step:.2f} "
          f"tokens a verify step); 99 refused; {constrained}")


def check_speculative_constrained(url, key):
    """Drafts under a JSON schema with logprobs: a draft the grammar would
    not allow is never accepted and every token's logprobs come from its
    verify row, so the answer and its logprobs are those of no drafts."""
    schema = {"type": "object", "properties": {
        "name": {"type": "string"},
        "tags": {"type": "array", "items": {"enum": ["aa", "ab", "ba"]},
                 "maxItems": 6}},
        "required": ["name", "tags"], "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}
    before = metric(url, "duck_drafts_proposed_total")
    for sampling in ({"temperature": 0}, {"temperature": 0.9, "seed": 7}):
        answers = []
        for spec in (0, 4):
            body = chat_body("aa ab aa ab aa ab", max_tokens=64,
                             response_format=fmt, logprobs=True,
                             top_logprobs=3, speculative=spec, **sampling)
            st, data = request(url, "POST", "/v1/chat/completions", body, key)
            if st != 200:
                die(f"check-speculative: constrained, {spec} drafts: HTTP "
                    f"{st} {data!r}")
            c = json.loads(data)["choices"][0]
            try:
                json.loads(c["message"]["content"])
            except ValueError:
                die(f"check-speculative: constrained, {spec} drafts: not "
                    f"JSON: {c['message']['content']!r}")
            answers.append((c["message"]["content"], c["logprobs"]["content"]))
        if answers[0] != answers[1]:
            die(f"check-speculative: constrained {sampling}: the answer or "
                f"its logprobs changed with drafts: {answers[0][0]!r} "
                f"against {answers[1][0]!r}")
    drafts = metric(url, "duck_drafts_proposed_total") - before
    if drafts <= 0:
        die("check-speculative: constrained: no draft was proposed, so "
            "nothing was checked")
    return (f"under a JSON schema with logprobs the same ({int(drafts)} "
            "drafts proposed)")


def check_drafts_accepted(argv):
    url, key, ids, least = argv[0], argv[1], argv[2], float(argv[3])
    above = float(argv[4]) if len(argv) > 4 else 1.5
    prompt = [int(t) for t in ids.split(",")]

    def complete(spec, out, i):
        body = {"model": "any", "prompt": prompt, "max_tokens": 20,
                "ignore_eos": True, "temperature": 0, "speculative": spec}
        st, data = request(url, "POST", "/v1/completions", body, key)
        out[i] = json.loads(data)["choices"][0]["text"] if st == 200 else \
            f"HTTP {st} {data!r}"

    texts = {}
    for spec in (4, 0):
        out = [None] * 3
        threads = [threading.Thread(target=complete, args=(spec, out, i))
                   for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        texts[spec] = out
        if spec:
            acceptance = metric(url, "duck_draft_acceptance")
            per_step = metric(url, "duck_tokens_per_verify_step")
    if len(set(texts[4] + texts[0])) != 1:
        die(f"check-drafts-accepted: texts differ: {texts}")
    if acceptance is None or acceptance < least or per_step <= above:
        die(f"check-drafts-accepted: acceptance {acceptance} (at least "
            f"{least} wanted), {per_step} tokens a verify step (above "
            f"{above} wanted)")
    print(f"drafts accepted: 3 concurrent answers equal without drafts; "
          f"acceptance {acceptance:.2f}, {per_step:.2f} tokens a verify step")


def greedy_tokens(url, key, **kw):
    """The text and logprobs entries of a greedy 32-token chat answer."""
    body = chat_body("Hi", max_tokens=32, ignore_eos=True, logprobs=True,
                     top_logprobs=20, **kw)
    st, data = request(url, "POST", "/v1/chat/completions", body, key)
    if st != 200:
        die(f"check-penalties: {kw}: HTTP {st} {data!r}")
    c = json.loads(data)["choices"][0]
    return c["message"]["content"], c["logprobs"]["content"]


def penalized_best(entries, presence, frequency):
    """Each chosen token's penalized logprob is the best of its top 20."""
    counts = {}
    for i, e in enumerate(entries):
        def adjusted(t):
            c = counts.get(bytes(t["bytes"]), 0)
            return t["logprob"] - presence * (c > 0) - frequency * c
        best = max(adjusted(t) for t in e["top_logprobs"])
        if adjusted(e) < best - 1e-4:
            die(f"check-penalties: presence {presence} frequency {frequency}: "
                f"token {i} {e['token']!r} scores {adjusted(e)}, an "
                f"alternative {best}")
        key = bytes(e["bytes"])
        counts[key] = counts.get(key, 0) + 1


def check_penalties(argv):
    url, key = argv
    base, base_lp = greedy_tokens(url, key)
    distinct = lambda lp: len({bytes(e["bytes"]) for e in lp})
    same, _ = greedy_tokens(url, key, presence_penalty=0, frequency_penalty=0,
                            logit_bias={"5": 0})
    if same != base:
        die(f"check-penalties: zero penalties changed {base!r} to {same!r}")
    for kw in ({"frequency_penalty": 0.5, "presence_penalty": 0.7},
               {"frequency_penalty": 2}, {"presence_penalty": 2},
               {"frequency_penalty": -2}):
        text, lp = greedy_tokens(url, key, **kw)
        penalized_best(lp, kw.get("presence_penalty", 0),
                       kw.get("frequency_penalty", 0))
        more = distinct(lp) - distinct(base_lp)
        if (sum(kw.values()) > 0) != (more > 0) or text == base and more:
            die(f"check-penalties: {kw}: {distinct(lp)} distinct tokens "
                f"({text!r}) against {distinct(base_lp)} ({base!r})")
    text, lp = greedy_tokens(url, key, logit_bias={"123": 100})
    if distinct(lp) != 1 or text == base or \
            all(e["logprob"] >= e["top_logprobs"][0]["logprob"] for e in lp):
        die(f"check-penalties: logit_bias +100: {text!r}, {lp[:2]}")
    bad = [({"presence_penalty": 2.5}, "presence_penalty"),
           ({"frequency_penalty": "x"}, "frequency_penalty"),
           ({"logit_bias": {"abc": 1}}, "logit_bias"),
           ({"logit_bias": {"5": 101}}, "logit_bias"),
           ({"logit_bias": {"99999999": 1}}, "logit_bias"),
           ({"logit_bias": [1]}, "logit_bias")]
    for extra, field in bad:
        st, data = request(url, "POST", "/v1/chat/completions",
                           chat_body("Hi", max_tokens=2, **extra), key)
        if st != 400 or json.loads(data)["error"]["param"] != field:
            die(f"check-penalties: {extra}: HTTP {st} {data!r}, expected a "
                f"400 naming {field}")
    print(f"penalties: chosen tokens follow the penalized logits; "
          f"{distinct(base_lp)} distinct greedy tokens, more with penalties "
          f"2, fewer with -2; logit_bias +100 forces its token; "
          f"{len(bad)} bad values refused by name")


def tool_tokenizer(argv):
    src, dst, *contents = argv
    with open(src) as f:
        t = json.load(f)
    m = t["model"]
    pairs = [tuple(x.split(" ")) if isinstance(x, str) else tuple(x)
             for x in m["merges"]]
    ids = []
    # The highest-id BPE tokens that no other merge builds on, with the
    # merges that make them, become Qwen3's added tokens.
    for content in contents or ("<tool_call>", "<think>", "</think>"):
        used = {part for pair in pairs for part in pair}
        name, last = max(((k, i) for k, i in m["vocab"].items()
                          if k not in used and
                          any("".join(p) == k for p in pairs)),
                         key=lambda kv: kv[1])
        del m["vocab"][name]
        pairs = [p for p in pairs if "".join(p) != name]
        t["added_tokens"].append({"id": last, "content": content,
                                  "single_word": False, "lstrip": False,
                                  "rstrip": False, "normalized": False,
                                  "special": False})
        ids.append(last)
    m["merges"] = [" ".join(p) for p in pairs] \
        if m["merges"] and isinstance(m["merges"][0], str) else \
        [list(p) for p in pairs]
    with open(dst, "w") as f:
        json.dump(t, f)
    print(*ids)


def check_unsupported(argv):
    url, key = argv
    tool = {"type": "function", "function": {"name": "f", "parameters": {}}}
    refused = [
        ("completions", {"tools": [tool]}, "tools"),
        ("completions", {"tool_choice": "required"}, "tool_choice"),
        ("chat", {"functions": [tool["function"]]}, "functions"),
        ("chat", {"function_call": "auto"}, "function_call"),
        ("completions", {"echo": True}, "echo"),
        ("completions", {"best_of": 2}, "best_of"),
        ("completions", {"suffix": "x"}, "suffix"),
    ]
    accepted = {"tools": [], "tool_choice": "none", "presence_penalty": 0,
                "frequency_penalty": 0.0, "logit_bias": {},
                "response_format": {"type": "text"}}
    for endpoint, extra, field in refused:
        if endpoint == "chat":
            body = chat_body("Hi", max_tokens=2, **extra)
        else:
            body = {"model": "any", "prompt": "Hi", "max_tokens": 2, **extra}
        status, data = request(url, "POST", "/v1/" + endpoint.replace(
            "chat", "chat/completions"), body, key)
        err = json.loads(data).get("error", {}) if status == 400 else {}
        if status != 400 or err.get("param") != field or \
                "not supported" not in err.get("message", ""):
            die(f"check-unsupported: {endpoint} {extra}: HTTP {status} "
                f"{data!r}, expected a 400 naming {field!r}")
    status, data = request(url, "POST", "/v1/chat/completions",
                           chat_body("Hi", max_tokens=2, **accepted), key)
    if status != 200:
        die(f"check-unsupported: fields asking for nothing: HTTP {status} "
            f"{data!r}")
    print(f"unsupported fields: {len(refused)} refused by name; the same "
          f"fields asking for nothing answered")


def check_bad_clients(argv):
    """Garbage, truncated and stalled requests, a huge header, invalid
    UTF-8 and deeply nested JSON: each gets an error or a closed
    connection, and the server goes on serving."""
    url, key = argv
    host, port = split_url(url)

    def raw(data, read=True, close=True):
        s = socket.create_connection((host, port), timeout=10)
        try:
            s.sendall(data)
        except OSError:  # refused unread: the answer may be there still
            pass
        out = b""
        if read:
            try:
                while True:
                    c = s.recv(65536)
                    if not c:
                        break
                    out += c
                    if b"\r\n\r\n" in out and len(out) > 200:
                        break
            except OSError:
                pass
        if close:
            s.close()
        return out, s

    def status(resp):
        m = re.match(rb"HTTP/1.1 (\d+)", resp)
        return int(m.group(1)) if m else None

    auth = b"Authorization: Bearer " + key.encode() + b"\r\n"
    raw(b"\x00\xff garbage \x01\x02\r\n\r\n")
    raw(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n", read=False)
    _, stalled = raw(b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 100\r\n\r\n{",
                     read=False, close=False)
    big, _ = raw(b"GET /health HTTP/1.1\r\nX-Big: " + b"a" * 100000 + b"\r\n\r\n")
    bad_utf8 = b'{"messages":[{"role":"user","content":"\xff\xfe"}],"max_tokens":2}'
    r1, _ = raw(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + auth +
                b"Content-Length: " + str(len(bad_utf8)).encode() + b"\r\n\r\n" + bad_utf8)
    nested = b"[" * 30000 + b"]" * 30000  # under --max-request-bytes
    r2, _ = raw(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + auth +
                b"Content-Length: " + str(len(nested)).encode() + b"\r\n\r\n" + nested)
    raw(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + auth +
        b"Content-Length: 5000\r\n\r\n{\"messages\":", read=False)
    # --max-request-bytes holds for a chunked body, and for a body with no
    # length at all; other routes refuse such bodies unread.
    big = b'{"messages":"' + b"x" * 100000 + b'"}'
    chunked = b"".join(b"%x\r\n" % len(big[i:i + 8192]) + big[i:i + 8192] +
                       b"\r\n" for i in range(0, len(big), 8192)) + b"0\r\n\r\n"
    r3, _ = raw(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + auth +
                b"Transfer-Encoding: chunked\r\n\r\n" + chunked)
    r4, _ = raw(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + auth +
                b"Connection: close\r\n\r\n" + big)
    r5, _ = raw(b"POST /v1/nothing HTTP/1.1\r\nHost: x\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n" + chunked)
    stalled.close()
    if status(r1) != 400 or status(r2) != 400:
        die(f"invalid UTF-8 / nested JSON: statuses {status(r1)}, {status(r2)}")
    if status(r3) != 413 or status(r4) != 413 or status(r5) != 411:
        die(f"chunked / unframed bodies: statuses {status(r3)}, {status(r4)}, "
            f"{status(r5)}; want 413, 413, 411")
    if status(big) not in (400, 413, 431, None):
        die(f"a 100 kB header got {status(big)}")
    st, body = request(url, "GET", "/health")
    if st != 200:
        die(f"the server stopped serving: /health {st} {body!r}")
    st, body = request(url, "POST", "/v1/chat/completions",
                      chat_body("still there?", max_tokens=2), key)
    if st != 200:
        die(f"the server stopped serving: {st} {body!r}")
    print("bad clients: errors or closed connections; the server serves on")


def main():
    if len(sys.argv) < 2:
        die("usage: see the docstring")
    cmd, argv = sys.argv[1], sys.argv[2:]
    {"start": start, "stop": stop, "cli-expect": cli_expect,
     "check-stop": check_stop, "check-disconnect": check_disconnect,
     "check-drop-nonstream": check_drop_nonstream,
     "check-queue-full": check_queue_full,
     "check-slow-clients": check_slow_clients,
     "check-bad-clients": check_bad_clients,
     "check-unsupported": check_unsupported,
     "check-penalties": check_penalties,
     "tool-tokenizer": tool_tokenizer,
     "check-logprobs": check_logprobs,
     "check-prefix": check_prefix,
     "check-prefix-store": check_prefix_store,
     "check-speculative": check_speculative,
     "check-drafts-accepted": check_drafts_accepted}.get(
        cmd, lambda _: die(f"unknown command {cmd}"))(argv)


if __name__ == "__main__":
    main()
