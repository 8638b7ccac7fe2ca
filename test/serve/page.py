#!/usr/bin/env python3
"""Checks duckrun serve's page and its endpoint (loopback only).

  page.py check-status URL KEY DUCKS
      GET /v1/duck/status: 401 without the key or with a wrong one; with
      it, DUCKS ducks, each with its 127.0.0.1 address, cores, weight
      cache state and image size. While a long stream runs, one sequence
      is active; after it, every measured value is there (each duck's
      kernel Gparam/s equal to /metrics', the judge gap, tok/s, a step's
      breakdown) and nothing is active. The page's files are served
      without the key (they hold no data), byte for byte as
      runtime/src/serve/page has them.
  page.py browser URL KEY DIR
      Debian's chromium, headless, on the page: without the key it asks
      for one and shows no duck; with it (the URL's #key=) a chat round
      trip (?prompt=...&autosend=1) streams the very answer the API gives
      for the same request, the duck table is the endpoint's, and a
      screenshot (DIR/page.png, 1280x900) shows the page. Fails when
      chromium is missing (utils/bootstrap.sh installs it).
  page.py screenshot URL KEY PNG SECONDS
      The page (with a chat round trip) for SECONDS while 4 clients keep
      streaming, then its screenshot in PNG: docs/serve-page.png
      (utils/serve-page-screenshot.sh).
"""
import html.parser
import json
import os
import shutil
import struct
import subprocess
import sys
import threading
import time
import urllib.parse
import zlib

from serve import request_typed as request  # serve.py, beside this file

PROMPT = "Tell me about ducks."
MAX_TOKENS = 24


def die(msg):
    print(f"page.py: {msg}", file=sys.stderr)
    sys.exit(1)




def status(url, key):
    code, _, data = request(url, "GET", "/v1/duck/status", key=key)
    if code != 200:
        die(f"/v1/duck/status with the key: {code} {data[:200]!r}")
    return json.loads(data)


PAGE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                        "runtime", "src", "serve", "page")


def check_files(url):
    for path, name, kind in (("/", "index.html", "text/html"),
                             ("/app.js", "app.js", "text/javascript"),
                             ("/style.css", "style.css", "text/css")):
        code, ctype, data = request(url, "GET", path)
        want = open(os.path.join(PAGE_DIR, name), "rb").read()
        if code != 200 or not ctype.startswith(kind) or data != want:
            die(f"GET {path} without a key: {code} {ctype}, {len(data)} bytes "
                f"({'equal to' if data == want else 'not'} page/{name})")
    print("page files served as the repository has them: /, /app.js, /style.css")


def check_ducks(s, ducks):
    if len(s["ducks"]) != ducks:
        die(f"{len(s['ducks'])} ducks, not {ducks}: {s}")
    for i, d in enumerate(s["ducks"]):
        host, _, port = d["address"].rpartition(":")
        ok = (d["index"] == i and host == "127.0.0.1" and int(port) > 0 and
              d["health"] == "ok" and isinstance(d["cores"], int) and
              d["cores"] >= 1 and d["weight_cache"] in ("hit", "miss", "partial")
              and 0 <= d["uploaded_bytes"] <= d["image_bytes"] and
              (d["uploaded_bytes"] > 0) == (d["weight_cache"] != "hit"))
        if not ok:
            die(f"duck {i}: {d}")
    print(f"ducks: {ducks}, addresses, cores, weight caches ("
          f"{', '.join(d['weight_cache'] for d in s['ducks'])}) ok")


def metrics_gparams(url):
    _, _, data = request(url, "GET", "/metrics")
    out = {}
    for line in data.decode().splitlines():
        if line.startswith("duck_kernel_gparam_per_second{"):
            duck = int(line.split('duck="')[1].split('"')[0])
            out[duck] = float(line.split()[-1])
    return out


def check_status(argv):
    url, key, ducks = argv[0], argv[1], int(argv[2])
    for k, what in ((None, "no key"), ("wrong", "a wrong key")):
        code, _, data = request(url, "GET", "/v1/duck/status", key=k)
        if code != 401 or b"invalid_api_key" not in data:
            die(f"/v1/duck/status with {what}: {code} {data[:200]!r}")
    print("status: 401 without the key or with a wrong one")
    check_files(url)
    s = status(url, key)
    if s["state"] != "ok" or s["model"] != "plan":
        die(f"state/model: {s['state']} {s['model']}")
    check_ducks(s, ducks)

    # A long stream: one active sequence while it runs.
    body = {"messages": [{"role": "user", "content": "Count."}],
            "max_tokens": 200, "ignore_eos": True, "temperature": 0}
    done = threading.Event()
    threading.Thread(target=lambda: (request(url, "POST", "/v1/chat/completions",
                                             body, key), done.set()),
                     daemon=True).start()
    seen_active, busy = 0, None
    while not done.is_set():
        st = status(url, key)
        seen_active = max(seen_active, st["active_sequences"])
        if st["active_sequences"] == 1 and st["tok_s"] and st["step_breakdown"]:
            busy = st  # the windowed figures while the stream runs
        time.sleep(0.02)
    if seen_active != 1:
        die(f"active sequences during one stream: at most {seen_active}")
    print("status: one active sequence during a stream")

    # The answer is out before the batcher has ended the step that made
    # its last token (and fed the status after it): wait for an idle
    # server and a status that stays put while /metrics is read.
    deadline = time.time() + 20
    while True:
        s = status(url, key)
        gp = metrics_gparams(url)
        again = status(url, key)
        if s["active_sequences"] == 0 and [d["kernel_gparam_s"] for d in s["ducks"]] \
                == [d["kernel_gparam_s"] for d in again["ducks"]]:
            break
        if time.time() > deadline:
            die(f"not idle 20 s after the stream: {s}")
        time.sleep(0.1)
    for d in s["ducks"]:
        g = d["kernel_gparam_s"]
        if g is None or g <= 0 or abs(g - gp.get(d["index"], -1)) > 1e-5 * g:
            die(f"duck {d['index']}: kernel_gparam_s {g}, /metrics {gp}")
    # tok/s and the breakdown are over the last 5 s: on a loaded machine the
    # wait above can outlast them, so the stream's own figures count too.
    b = s["step_breakdown"] or (busy or {}).get("step_breakdown")
    tok_s = s["tok_s"] or (busy or {}).get("tok_s")
    parts = ("host_attention_ms", "host_norms_router_ms", "lm_head_ms",
             "duck_kernel_ms", "dispatch_gap_ms")
    if (s["judge_gap_us"] is None or tok_s is None or tok_s <= 0 or
            s["generated_tokens"] < 200 or b is None or b["steps"] < 1 or
            not 0 < b["window_s"] <= s["uptime_s"] or
            any(d["last_answer_s_ago"] > 10 for d in s["ducks"]) or
            b["duck_kernel_ms"] <= 0 or any(b[p] < 0 for p in parts) or
            sum(b[p] for p in parts) > b["step_ms"] * 1.01 + 1e-6):
        die(f"measured values after a stream: {s}")
    if s["active_sequences"] != 0 or s["queue_depth"] != 0:
        die(f"after the stream: {s['active_sequences']} active, {s['queue_depth']} queued")
    print("status: kernel Gparam/s equal /metrics', judge gap, tok/s and a "
          "step's breakdown measured; idle afterwards")


class Dom(html.parser.HTMLParser):
    """Elements with their attributes and text, in document order."""
    VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input",
            "link", "meta", "source", "track", "wbr"}

    def __init__(self, text):
        super().__init__(convert_charrefs=True)
        self.elements, self.open = [], []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        e = {"tag": tag, "attrs": dict(attrs), "text": "", "parent":
             self.open[-1] if self.open else None}
        self.elements.append(e)
        if tag not in self.VOID:
            self.open.append(e)

    def handle_endtag(self, tag):
        while self.open:
            if self.open.pop()["tag"] == tag:
                break

    def handle_data(self, data):
        for e in self.open:
            e["text"] += data

    def find(self, pred):
        return [e for e in self.elements if pred(e)]

    def by_id(self, id_):
        found = self.find(lambda e: e["attrs"].get("id") == id_)
        return found[0] if found else None


def classes(e):
    return (e["attrs"].get("class") or "").split()


def inside(e, ancestor):
    while e is not None:
        if e is ancestor:
            return True
        e = e["parent"]
    return False


class Chromium:
    """Debian's chromium, headless, driven over the DevTools protocol on a
    pipe (--remote-debugging-pipe: commands in on fd 3, answers out on fd
    4, each a JSON text ended by a NUL byte): one page, 1280x900."""

    def __init__(self, out_dir):
        exe = shutil.which("chromium")
        if not exe:
            die("chromium is missing: the page's test needs Debian's chromium "
                "(utils/bootstrap.sh installs it)")
        cmd_r, self.cmd_w = os.pipe()
        self.out_r, out_w = os.pipe()

        def fds():  # in the child: the pipe's ends as fds 3 and 4
            a, b = os.dup(cmd_r), os.dup(out_w)  # out of the way of 3 and 4
            os.dup2(a, 3)
            os.dup2(b, 4)
            os.set_inheritable(3, True)
            os.set_inheritable(4, True)

        self.log = open(os.path.join(out_dir, "chromium.log"), "wb")
        self.proc = subprocess.Popen(
            [exe, "--headless=new", "--no-sandbox", "--disable-gpu",
             "--no-first-run", "--disable-extensions", "--hide-scrollbars",
             "--remote-debugging-pipe", "--window-size=1280,900",
             "--user-data-dir=" + os.path.join(out_dir, "chromium-profile"),
             "about:blank"],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log,
            preexec_fn=fds, close_fds=False)
        os.close(cmd_r)
        os.close(out_w)
        self.buf, self.next_id, self.session = b"", 1, None
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target,
                                 flatten=True)["sessionId"]
        self.call("Emulation.setDeviceMetricsOverride", width=1280, height=900,
                  deviceScaleFactor=1, mobile=False)

    def call(self, method, **params):
        msg = {"id": self.next_id, "method": method, "params": params}
        if self.session:
            msg["sessionId"] = self.session
        self.next_id += 1
        os.write(self.cmd_w, json.dumps(msg).encode() + b"\0")
        while True:
            while b"\0" not in self.buf:
                chunk = os.read(self.out_r, 1 << 16)
                if not chunk:
                    die(f"chromium ended (exit {self.proc.wait()}); see chromium.log")
                self.buf += chunk
            text, _, self.buf = self.buf.partition(b"\0")
            reply = json.loads(text)
            if reply.get("id") == msg["id"]:
                if "error" in reply:
                    die(f"{method}: {reply['error']}")
                return reply["result"]

    def eval(self, expression):
        r = self.call("Runtime.evaluate", expression=expression,
                      returnByValue=True)
        if "exceptionDetails" in r:
            die(f"{expression}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def open(self, url, ready, seconds=60):
        """Loads url and waits until the expression `ready` is true."""
        self.call("Page.navigate", url=url)
        deadline = time.time() + seconds
        # Before the page has loaded, its elements are not there yet.
        while not self.eval(f"(() => {{ try {{ return !!({ready}); }} "
                            f"catch (e) {{ return false; }} }})()"):
            if time.time() > deadline:
                die(f"{url}: not ready ({ready}) after {seconds} s")
            time.sleep(0.1)
        return Dom(self.eval("document.documentElement.outerHTML"))

    def screenshot(self, path):
        import base64
        data = self.call("Page.captureScreenshot", format="png")["data"]
        open(path, "wb").write(base64.b64decode(data))

    def close(self):
        try:
            self.session = None
            self.call("Browser.close")
        finally:
            self.proc.wait(timeout=30)
            self.log.close()


def png_rgb(path):
    """(width, height, rows of RGB bytes) of an 8-bit RGB or RGBA PNG."""
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        die(f"{path} is not a PNG")
    pos, idat, ihdr = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + n
    w, h, depth, color, _, _, interlace = ihdr
    if depth != 8 or color not in (2, 6) or interlace:
        die(f"{path}: an unexpected PNG format {ihdr}")
    bpp = 3 if color == 2 else 4
    raw, stride, rows, prev = zlib.decompress(idat), w * bpp, [], bytearray(w * bpp)
    for y in range(h):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line[i] for i in range(stride) if i % bpp < 3))
        prev = line
    return w, h, rows


def check_screenshot(path):
    w, h, rows = png_rgb(path)
    if (w, h) != (1280, 900):
        die(f"{path}: {w}x{h}, not 1280x900")
    # The header's colour (#2d3a4a) across the top, the page's background
    # (#f6f6f4) and the plots' colours below it.
    top = rows[4]
    header = sum(1 for x in range(w) if top[3 * x:3 * x + 3] == b"\x2d\x3a\x4a")
    colours = {rows[y][3 * x:3 * x + 3] for y in range(60, h, 7) for x in range(0, w, 7)}
    if header < w // 2 or len(colours) < 20:
        die(f"{path}: {header} header pixels in row 4, {len(colours)} colours")
    print(f"screenshot: {w}x{h}, the header and {len(colours)} colours")


def positive(text):
    try:
        return float(text) > 0
    except ValueError:
        return False


def check_browser(argv):
    url, key, out_dir = argv
    # The API's greedy answer to the request the page sends.
    body = {"messages": [{"role": "user", "content": PROMPT}], "stream": True,
            "temperature": 0, "max_tokens": MAX_TOKENS}
    code, _, data = request(url, "POST", "/v1/chat/completions",
                            dict(body, stream=False), key)
    if code != 200:
        die(f"the API's answer: {code} {data[:200]!r}")
    want = json.loads(data)["choices"][0]["message"]["content"]
    if not want:
        die("the API's answer is empty: a round trip would show nothing")

    browser = Chromium(out_dir)
    try:
        browse(browser, url, key, want, out_dir)
    finally:
        browser.close()


def browse(browser, url, key, want, out_dir):
    # Without the key: the page asks for it and shows no duck.
    dom = browser.open(url + "/", "document.getElementById('state')."
                       "textContent === 'key needed'")
    form, state = dom.by_id("key-form"), dom.by_id("state")
    rows = dom.find(lambda e: e["tag"] == "tr" and inside(e, dom.by_id("ducks"))
                    and e["parent"]["tag"] == "tbody")
    if form is None or "hidden" in form["attrs"] or state["text"] != "key needed" or rows:
        die(f"without a key: form {form and form['attrs']}, state {state and state['text']!r}, {len(rows)} ducks")
    print("browser: without the key the page asks for it and shows no duck")

    query = urllib.parse.urlencode({"prompt": PROMPT, "autosend": 1,
                                    "max_tokens": MAX_TOKENS, "temperature": 0})
    page = f"{url}/?{query}#key={urllib.parse.quote(key)}"
    # Done: the answer streamed whole, and a few statuses plotted.
    dom = browser.open(page, "document.querySelector('.msg.assistant[data-finish]')"
                       " && document.body.dataset.polls >= 4")
    answers = dom.find(lambda e: "assistant" in classes(e))
    if len(answers) != 1 or answers[0]["attrs"].get("data-finish") in (None, "none", "error"):
        die(f"the page's answer: {answers and answers[0]}")
    text = dom.find(lambda e: "text" in classes(e) and inside(e, answers[0]))[0]["text"]
    if text != want:
        die(f"the page streamed {text!r}, the API answers {want!r}")
    print(f"browser: the chat streamed the API's answer ({len(want)} chars, "
          f"finish {answers[0]['attrs']['data-finish']})")

    s = status(url, key)
    table = dom.by_id("ducks")
    rows = dom.find(lambda e: e["tag"] == "tr" and inside(e, table) and
                    e["parent"]["tag"] == "tbody")
    got = [[c["text"] for c in dom.find(lambda e: e["tag"] == "td" and e["parent"] is r)]
           for r in rows]
    if len(got) != len(s["ducks"]) or not got:
        die(f"the page's duck table {got}, the endpoint's {s['ducks']}")
    for row, d in zip(got, s["ducks"]):
        cache = "cached" if d["weight_cache"] == "hit" else "uploaded"
        if (row[0] != str(d["index"]) or row[1] != d["address"] or
                not row[2].startswith("ok") or row[3] != str(d["cores"]) or
                cache not in row[4] or not positive(row[5])):
            die(f"the page's row {row}, the endpoint's duck {d}")
    if dom.by_id("state")["text"] != "ok" or dom.by_id("model")["text"] != "plan":
        die("the page's state or model name")
    print(f"browser: the duck table read from the page: {len(got)} ducks as the endpoint has them")
    for r in got:
        print("  " + " | ".join(r[:2] + r[3:5]))

    shot = os.path.join(out_dir, "page.png")
    browser.screenshot(shot)
    check_screenshot(shot)


def take_screenshot(argv):
    url, key, png, seconds = argv[0], argv[1], argv[2], int(argv[3])
    import tempfile
    out_dir = tempfile.mkdtemp(prefix="duck-page-")  # the browser's profile
    stop = threading.Event()

    def load(i):  # streams of different lengths, one after another
        n = 0
        while not stop.is_set():
            n += 1
            body = {"messages": [{"role": "user", "content": f"Story {i}.{n}"}],
                    "max_tokens": 40 + 60 * ((i + n) % 4), "ignore_eos": True,
                    "stream": True, "temperature": 0.7, "seed": n}
            request(url, "POST", "/v1/chat/completions", body, key)
            time.sleep(0.3 * i)

    threads = [threading.Thread(target=load, args=(i,), daemon=True)
               for i in range(4)]
    for t in threads:
        t.start()
    query = urllib.parse.urlencode({"prompt": PROMPT, "autosend": 1,
                                    "max_tokens": 48, "temperature": 0})
    browser = Chromium(out_dir)
    try:
        browser.open(f"{url}/?{query}#key={urllib.parse.quote(key)}",
                     "document.querySelector('.msg.assistant[data-finish]')"
                     f" && document.body.dataset.polls >= {seconds}",
                     seconds + 60)
        browser.screenshot(png)
    finally:
        stop.set()
        browser.close()
        shutil.rmtree(out_dir, ignore_errors=True)
    check_screenshot(png)


def main():
    if len(sys.argv) < 2:
        die(__doc__)
    cmd, argv = sys.argv[1], sys.argv[2:]
    {"check-status": check_status, "browser": check_browser,
     "screenshot": take_screenshot}.get(
        cmd, lambda _: die(f"unknown command {cmd}"))(argv)


if __name__ == "__main__":
    main()
