#!/usr/bin/env python3
"""Checks the house rules the tree's structure rests on; run by the test suite.

  utils/check-layers.py [REPO]

1. Include directions. The runtime is a folder a layer (runtime/src/<layer>,
   headers in runtime/include/duck/runtime/<layer>), and a layer includes
   only the layers below it:
       serve -> session -> engine -> plan, cluster;  session -> text
   Nothing in the compiler includes the runtime; nothing in duck-rt
   includes the runtime or the compiler; the runtime and duck-rt include
   no LLVM or MLIR header.
2. Function length: no function over 80 lines in compiler/lib, runtime/src
   and duck-rt (its benchmarks aside), measured with universal-ctags.
   utils/long-functions.txt lists the functions that are longer today and
   are still to be split: a function missing from it fails, and so does a
   listed one that is no longer long (the list only shrinks).

Prints one line per finding and "layers: ok" or "layers: N problems";
exits non-zero on any problem.
"""
import json
import os
import re
import shutil
import subprocess
import sys

MAX_LINES = 80

# layer -> the runtime layers it may include (itself always allowed).
RUNTIME_LAYERS = {
    "plan": set(),
    "cluster": set(),
    "text": set(),
    "engine": {"plan", "cluster"},
    "session": {"engine", "plan", "cluster", "text"},
    "serve": {"session", "engine", "plan", "cluster", "text"},
}
COMPILER_HEADERS = re.compile(r'^(duck/(Dialect|Import|Target|Pipelines|'
                              r'CostModel|Cluster)/|mlir/|llvm/)')
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)
SOURCES = (".cpp", ".cc", ".c", ".h", ".hpp", ".inc")


def sources(root, top):
    for d, dirs, files in os.walk(os.path.join(root, top)):
        dirs[:] = [x for x in dirs if x not in ("build", ".git")]
        for f in files:
            if f.endswith(SOURCES):
                yield os.path.relpath(os.path.join(d, f), root)


def runtime_layer(path):
    """The layer a runtime source or header belongs to, or None."""
    m = re.match(r"runtime/(src|include/duck/runtime)/([^/]+)/", path)
    return m.group(2) if m and m.group(2) in RUNTIME_LAYERS else None


def include_problems(root):
    out = []
    for top in ("compiler", "runtime", "duck-rt"):
        for path in sources(root, top):
            text = open(os.path.join(root, path), errors="replace").read()
            for inc in INCLUDE.findall(text):
                why = None
                m = re.match(r"duck/runtime/([^/]+)/", inc)
                target = m.group(1) if m else None
                if top == "compiler" and inc.startswith("duck/runtime/"):
                    why = "the compiler includes the runtime"
                elif top == "duck-rt" and (inc.startswith("duck/runtime/") or
                                           COMPILER_HEADERS.match(inc)):
                    why = "duck-rt includes a layer above it"
                elif top == "runtime" and COMPILER_HEADERS.match(inc):
                    why = "the runtime includes the compiler or LLVM"
                elif top == "runtime" and target in RUNTIME_LAYERS:
                    layer = runtime_layer(path)
                    if layer and target != layer and \
                            target not in RUNTIME_LAYERS[layer]:
                        why = "runtime layer %s includes %s above it" % (
                            layer, target)
                    elif not layer and path.startswith("runtime/src/"):
                        why = "a runtime source outside the layer folders"
                if why:
                    out.append("%s: #include \"%s\": %s" % (path, inc, why))
    return out


def long_functions(root):
    """{(path, name): lines} of the functions over MAX_LINES lines."""
    dirs = ["compiler/lib", "runtime/src", "duck-rt"]
    cmd = ["ctags", "--output-format=json", "--fields=+ne",
           "--kinds-C++=f", "--kinds-C=f", "-R", "-o", "-"] + dirs
    r = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("check-layers: ctags failed: " + r.stderr.strip())
    found = {}
    for line in r.stdout.splitlines():
        t = json.loads(line)
        if t.get("_type") != "tag" or "end" not in t:
            continue
        if t["path"].startswith("duck-rt/bench/"):
            continue
        n = t["end"] - t["line"] + 1
        if n > MAX_LINES:
            name = t["name"]
            if name.startswith("__anon"):  # a lambda: name it by its line's text
                name = "lambda:" + t.get("pattern", "").strip("/^$").strip()
            # Anonymous namespaces get a hash for a name: not stable.
            scope = re.sub(r"__anon[0-9a-f]+", "(anonymous)",
                           t.get("scope", ""))
            key = (t["path"], (scope + "::" if scope else "") + name)
            found[key] = max(n, found.get(key, 0))
    return found


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(__file__), ".."))
    if not shutil.which("ctags"):
        sys.exit("check-layers: universal-ctags is missing "
                 "(utils/bootstrap.sh installs it)")
    problems = include_problems(root)

    allow_file = os.path.join(root, "utils", "long-functions.txt")
    allowed = set()
    for line in open(allow_file):
        line = line.split("#", 1)[0].strip()
        if line:
            path, name = line.split(None, 1)
            allowed.add((path, name))
    found = long_functions(root)
    for (path, name), n in sorted(found.items()):
        if (path, name) not in allowed:
            problems.append("%s: %s is %d lines (over %d: split it where "
                            "its ideas part)" % (path, name, n, MAX_LINES))
    for path, name in sorted(allowed - set(found)):
        problems.append("%s: %s is no longer over %d lines (or is gone): "
                        "remove it from utils/long-functions.txt" %
                        (path, name, MAX_LINES))
    for p in problems:
        print(p)
    print("layers: ok (%d functions still over %d lines, listed)" %
          (len(allowed), MAX_LINES) if not problems else
          "layers: %d problems" % len(problems))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
