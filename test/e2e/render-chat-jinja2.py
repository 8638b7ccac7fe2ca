#!/usr/bin/env python3
"""Renders a corpus of chats with a checkpoint's chat_template the way
transformers does (jinja2's sandbox, trim_blocks and lstrip_blocks, its
tojson and raise_exception), for comparison with duck-tokenize
--render-chat.

  render-chat-jinja2.py FAMILY tokenizer_config.json corpus.json

Prints "=== NAME ===" then the prompt, for each case of the corpus whose
"families" (default: all) include FAMILY.
"""
import json
import os
import sys

try:
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    # Debian's python3-jinja2 (utils/bootstrap.sh) is in the system Python,
    # which need not be the one running lit.
    if sys.executable != "/usr/bin/python3" and os.path.exists("/usr/bin/python3"):
        os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)
    sys.exit("render-chat-jinja2.py: no jinja2 in %s (Debian's python3-jinja2,"
             " which utils/bootstrap.sh installs)" % sys.executable)


def token(v):
    return v.get("content") if isinstance(v, dict) else v


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None,
           sort_keys=False):
    # transformers' own: json.dumps, members in their order, no HTML escapes.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)


def main():
    family, config_path, corpus_path = sys.argv[1:4]
    config = json.load(open(config_path, encoding="utf-8"))
    source = config["chat_template"]
    if isinstance(source, list):
        source = {t["name"]: t["template"] for t in source}["default"]
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    template = env.from_string(source)
    out = sys.stdout.buffer
    for case in json.load(open(corpus_path, encoding="utf-8")):
        if family not in case.get("families", [family]):
            continue
        kwargs = {"messages": case["messages"],
                  "add_generation_prompt": case.get("add_generation_prompt", True),
                  "bos_token": token(config.get("bos_token")) or "",
                  "eos_token": token(config.get("eos_token")) or ""}
        for key in ("tools", "enable_thinking"):
            if key in case:
                kwargs[key] = case[key]
        out.write(("=== %s ===\n" % case["name"]).encode())
        out.write(template.render(**kwargs).encode("utf-8"))
        out.write(b"\n")


if __name__ == "__main__":
    main()
