#!/usr/bin/env python3
"""The secret filter's recall and false positives, measured on generated corpora.

    python3 eval/filter/run.py --bin target/release/memvault [--corpus 1] [-v]
        [--min-redacted 0.90] [--max-partial 0] [--max-false-positives 9]
        [--out results.jsonl] [--write-corpus DIR]

Each corpus is generated here from a fixed seed (nothing secret-shaped is
stored in the repository) and sent through the real binary in one process,
`memvault redact --json-lines`, which redacts each text on its own with the
built-in rules, as a vault in `redact` mode does.

A text holding secrets is
- redacted whole when no secret of it survives, nor a run of at least
  max(8, a third of its length) characters of one that is not elsewhere in
  the text;
- partly redacted when only such a run survives;
- missed when a secret survives verbatim.
A look-alike (a text with no secret) is a false positive when the output
differs from the input.

Exit 0, or 1 when a --min/--max bound given is not met (the figures are
printed either way). The corpora were used to tune the filter: these are
figures of a regression check, not of recall on unseen text.
"""
import argparse
import importlib
import json
import os
import re
import subprocess
import sys
import unicodedata
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True
sys.path.insert(0, HERE)

CORPORA = {"1": "corpus1", "2": "corpus2", "3": "corpus3", "4": "corpus4"}


def load(name):
    module = importlib.import_module(CORPORA[name])
    return [dict(e, corpus=name) for e in module.C]


def longest_common(s, t):
    """The longest substring of `s` found in `t` (binary search on length)."""
    best, lo, hi = "", 0, len(s)
    while lo < hi:
        m = (lo + hi + 1) // 2
        found = next((s[i:i + m] for i in range(len(s) - m + 1) if s[i:i + m] in t), None)
        if found:
            lo, best = m, found
        else:
            hi = m - 1
    return best


def judge(e, out):
    if e["benign"]:
        return ("fp" if out != e["text"] else "ok"), ""
    text = e["text"]
    # Corpus 4: a split or obfuscated secret is judged with what split or
    # hid it (a regex, or NFKC for full-width letters) taken out of both.
    if e.get("strip"):
        out, text = re.sub(e["strip"], "", out), re.sub(e["strip"], "", text)
    if e.get("nfkc"):
        out, text = unicodedata.normalize("NFKC", out), unicodedata.normalize("NFKC", text)
    status, detail = "ok", ""
    for s in e["secrets"]:
        if s in out:
            return "miss", s
        rest = text.replace(s, "\x00")
        lc = longest_common(s, out)
        if len(lc) >= max(8, len(s) // 3) and lc not in rest:
            status, detail = "partial", lc
    return status, detail


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=os.path.join(HERE, "..", "..", "target", "release", "memvault"))
    ap.add_argument("--corpus", action="append", choices=sorted(CORPORA),
                    help="which corpus (repeatable; default: all)")
    ap.add_argument("--min-redacted", type=float, help="fail below this share of texts redacted whole")
    ap.add_argument("--max-partial", type=int, help="fail above this many partly redacted texts")
    ap.add_argument("--max-false-positives", type=int, help="fail above this many look-alikes changed")
    ap.add_argument("--out", help="write every text's result here (JSON lines)")
    ap.add_argument("--write-corpus", metavar="DIR", help="also write the generated corpora there")
    ap.add_argument("-v", action="store_true", help="print each miss, partial and false positive")
    a = ap.parse_args()

    entries = []
    for name in a.corpus or sorted(CORPORA):
        part = load(name)
        if a.write_corpus:
            os.makedirs(a.write_corpus, exist_ok=True)
            with open(os.path.join(a.write_corpus, f"corpus{name}.jsonl"), "w", encoding="utf-8") as f:
                for e in part:
                    f.write(json.dumps(e, ensure_ascii=False) + "\n")
        entries += part

    lines = "".join(json.dumps(e["text"], ensure_ascii=False) + "\n" for e in entries)
    p = subprocess.run([a.bin, "redact", "--json-lines"], input=lines.encode("utf-8"),
                       capture_output=True, timeout=600)
    if p.returncode not in (0, 1):
        sys.exit(f"memvault redact --json-lines failed ({p.returncode}): {p.stderr.decode(errors='replace')}")
    outs = [json.loads(l) for l in p.stdout.decode("utf-8").splitlines()]
    if len(outs) != len(entries):
        sys.exit(f"{len(entries)} texts sent, {len(outs)} answered")

    by_family = {}
    totals = Counter()
    outf = open(a.out, "w", encoding="utf-8") if a.out else None
    for e, out in zip(entries, outs):
        st, detail = judge(e, out)
        kind = "benign" if e["benign"] else "secret"
        totals[(kind, st)] += 1
        fam = by_family.setdefault((e["corpus"], e["family"]), Counter())
        fam[(kind, st)] += 1
        if outf:
            outf.write(json.dumps({"id": e["id"], "corpus": e["corpus"], "status": st, "detail": detail,
                                   "note": e.get("note", ""), "out": out}, ensure_ascii=False) + "\n")
        if a.v and st != "ok":
            label = {"miss": "MISSED", "partial": "PARTIAL", "fp": "FALSE+"}[st]
            print(f"{label:8} {e['corpus']}:{e['id']}" + (f"  [{e['note']}]" if e.get("note") else ""))
            print("    in : " + repr(e["text"][:300]))
            print("    out: " + repr(out[:300]))

    print("\nfamilies not redacted whole (corpus:family  whole/texts):")
    for (c, fam), n in sorted(by_family.items()):
        secrets = n[("secret", "ok")] + n[("secret", "miss")] + n[("secret", "partial")]
        if secrets and n[("secret", "ok")] < secrets:
            print(f"  {c}:{fam:40} {n[('secret', 'ok')]}/{secrets}")
    ns = totals[("secret", "ok")] + totals[("secret", "miss")] + totals[("secret", "partial")]
    nb = totals[("benign", "ok")] + totals[("benign", "fp")]
    whole = totals[("secret", "ok")] / max(ns, 1)
    print(f"\ntexts with secrets: {ns}; redacted whole {totals[('secret', 'ok')]} ({100 * whole:.1f}%), "
          f"partly {totals[('secret', 'partial')]}, missed {totals[('secret', 'miss')]}")
    print(f"look-alikes: {nb}; changed (false positives) {totals[('benign', 'fp')]}")

    failed = []
    if a.min_redacted is not None and whole < a.min_redacted:
        failed.append(f"redacted whole {100 * whole:.1f}% < {100 * a.min_redacted:.1f}%")
    if a.max_partial is not None and totals[("secret", "partial")] > a.max_partial:
        failed.append(f"partly redacted {totals[('secret', 'partial')]} > {a.max_partial}")
    if a.max_false_positives is not None and totals[("benign", "fp")] > a.max_false_positives:
        failed.append(f"false positives {totals[('benign', 'fp')]} > {a.max_false_positives}")
    if failed:
        print("FAILED: " + "; ".join(failed))
        sys.exit(1)


if __name__ == "__main__":
    main()
