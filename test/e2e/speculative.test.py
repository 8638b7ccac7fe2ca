#!/usr/bin/env python3
"""duckrun --speculative lookup against --speculative none on one plan.

For each plan: greedy ids with lookup drafts from the text alone, from a
corpus that holds the expected continuation (the prompt and the ids of the
run without speculation) and from one wrong at every 4th token (drafts
rejected part way, so rewound positions are written again) must equal the
ids without speculation; with the
corpus the drafts must mostly be accepted (the summary's acceptance at
least --min-acceptance), so the verify steps really carried several rows.
With --sampled, the same holds at a temperature and seed (each token is
one sampler draw on the same logits). With --logits-out, the logits of
every position kept with speculation equal those without, byte for byte.

  speculative.test.py --duckrun R --plan P [--plan P2 ...] --ids 1,2,3
      --tokens N --work DIR [--sampled] [--logits]
"""
import argparse
import json
import os
import subprocess
import sys


def run(duckrun, plan, ids, tokens, extra):
    cmd = [duckrun, plan, "--prompt-ids", ids, "--max-tokens", str(tokens),
           "--ignore-eos", "--print-ids", "--quiet"] + extra
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr}")
    return r.stdout.split()


def summary(path):
    return json.load(open(path)).get("speculative") or {}


def check_plan(a, plan, n):
    name = os.path.basename(plan)
    work = os.path.join(a.work, f"{n}-{name}")
    os.makedirs(work, exist_ok=True)
    modes = [[]] + ([["--temperature", "0.8", "--seed", "11"]] if a.sampled else [])
    for sampling in modes:
        what = "sampled" if sampling else "greedy"
        base = run(a.duckrun, plan, a.ids, a.tokens, sampling)
        corpus = os.path.join(work, f"corpus-{what}")
        with open(corpus, "w") as f:
            f.write(a.ids.replace(",", " ") + "\n" + " ".join(base) + "\n")
        plain = run(a.duckrun, plan, a.ids, a.tokens,
                    sampling + ["--speculative", "lookup:3"])
        js = os.path.join(work, f"spec-{what}.json")
        hinted = run(a.duckrun, plan, a.ids, a.tokens,
                     sampling + ["--speculative", "lookup:4", "--lookup-corpus",
                                 corpus, "--summary-json", js])
        # A corpus wrong at every 4th token: drafts rejected part way, the
        # rejected positions rewound and written again.
        wrong = os.path.join(work, f"corpus-wrong-{what}")
        bad = [str((int(t) + 1) % 256) if i % 4 == 3 else t
               for i, t in enumerate(base)]
        with open(wrong, "w") as f:
            f.write(a.ids.replace(",", " ") + "\n" + " ".join(bad) + "\n")
        jw = os.path.join(work, f"spec-wrong-{what}.json")
        mixed = run(a.duckrun, plan, a.ids, a.tokens,
                    sampling + ["--speculative", "lookup:3", "--lookup-corpus",
                                wrong, "--summary-json", jw])
        if plain != base or hinted != base or mixed != base:
            sys.exit(f"{name} {what}: ids differ with speculation:\n"
                     f"  none:   {' '.join(base)}\n  lookup: {' '.join(plain)}\n"
                     f"  corpus: {' '.join(hinted)}\n  wrong:  {' '.join(mixed)}")
        sw = summary(jw)
        if sw.get("drafts_accepted", 0) >= sw.get("drafts_proposed", 0):
            sys.exit(f"{name} {what}: the wrong corpus had no draft rejected: {sw}")
        s = summary(js)
        acc = s.get("acceptance", 0)
        if what == "greedy" and acc < a.min_acceptance:
            sys.exit(f"{name}: acceptance {acc} with the corpus, below "
                     f"{a.min_acceptance}: {s}")
        print(f"{name} {what}: ids equal; with the corpus {s.get('drafts_accepted')}"
              f" of {s.get('drafts_proposed')} drafts accepted in "
              f"{s.get('verify_steps')} verify steps; with a wrong one "
              f"{sw.get('drafts_accepted')} of {sw.get('drafts_proposed')}")
    if a.logits:
        b0, b1 = (os.path.join(work, f"logits-{m}.bin") for m in ("none", "spec"))
        run(a.duckrun, plan, a.ids, a.tokens, ["--logits-out", b0])
        run(a.duckrun, plan, a.ids, a.tokens,
            ["--logits-out", b1, "--speculative", "lookup:4", "--lookup-corpus",
             os.path.join(work, "corpus-greedy")])
        if open(b0, "rb").read() != open(b1, "rb").read():
            sys.exit(f"{name}: --logits-out differs with speculation")
        print(f"{name}: logits equal, every position")


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--duckrun", required=True)
    a.add_argument("--plan", action="append", required=True)
    a.add_argument("--ids", required=True)
    a.add_argument("--tokens", type=int, default=24)
    a.add_argument("--work", required=True)
    a.add_argument("--min-acceptance", type=float, default=0.8)
    a.add_argument("--sampled", action="store_true")
    a.add_argument("--logits", action="store_true")
    a = a.parse_args()
    for n, plan in enumerate(a.plan):
        check_plan(a, plan, n)


if __name__ == "__main__":
    main()
