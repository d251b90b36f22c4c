"""Corpus 3 (session 29): look-alikes only. 1,400-odd texts an agent's notes commonly hold
that are no secret: commands named by the filter's rules used without one, prose about
passwords, test output, Wi-Fi and network notes, placeholders in docs and `.env.example`
files, base64 that is no credential, ID lists, public example keys. Written by a
false-positive hunt against the rules added in session 29 (texts it judged debatable,
such as vendor default passwords, are left out). Every text is benign: any change is a
false positive."""
import json, os

C = []
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "lookalikes3.jsonl"), encoding="utf-8") as f:
    for n, line in enumerate(f):
        e = json.loads(line)
        C.append({"id": f"benign:{e['family']}/{n}", "family": e["family"], "context": "benign",
                  "text": e["text"], "secrets": [], "benign": True, "note": ""})
