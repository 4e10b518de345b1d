"""Coded against uncoded shuffling, and shuffled against unshuffled training.

    python3 scripts/shuffle_compare.py [--train sp_train.svm --test sp_test.svm]
        [--learners 4,8] [--cache 0.25,0.5,0.75] [--epochs 6] [--out DIR]

Runs `downpour train shuffle` on an embedded cluster (worker 0 the master, the others the
learners). Without --train it featurizes the SpamAssassin messages committed under
data/spamassassin (train.jsonl.gz / test.jsonl.gz, hashed words, 2^20 ids), whose training
file lists the ham before the spam: unshuffled, the learners' blocks are one class each.

Part 1, traffic: for each number of learners n and cache fraction α (values below 1/n are
raised to 1/n), `--shuffle uncoded` and `--shuffle coded`: messages per shuffle against the
formula (downpour_core::shuffle::formula), the master's bytes on the wire per shuffle, the
learners' bytes, and whether both modes trained the same model (they must: same deal).
Part 2, quality: 4 learners, α = 0.5, `--shuffle none` against `coded`, averaging once per
epoch (--local-steps 1000) and every 10 steps: final train and test log loss and AUC.
Writes results.json and results.md.
"""

import argparse
import json
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
BIN = REPO / "target" / "release" / "downpour"


def sh(cmd):
    p = subprocess.run([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(map(str, cmd))}\n{p.stdout[-3000:]}")


def run(args, out):
    out.unlink(missing_ok=True)
    sh([BIN, "--log", "warn", "train", "shuffle", *args, "--quiet", "--out", out])
    return json.loads(out.read_text())


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--train", type=pathlib.Path)
    p.add_argument("--test", type=pathlib.Path)
    p.add_argument("--learners", default="4,8")
    p.add_argument("--cache", default="0.25,0.5,0.75")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("out/shuffle-compare"))
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    if not BIN.exists():
        sys.exit(f"{BIN} missing: cargo build --release first")
    if a.train is None:
        for part in ("train", "test"):
            sh([BIN, "data", "featurize", "--format", "text-jsonl", "--hash-bits", "20",
                "--in", REPO / "data" / "spamassassin" / f"{part}.jsonl.gz", "--out", a.out / f"sp_{part}.svm"])
        a.train, a.test = a.out / "sp_train.svm", a.out / "sp_test.svm"
    data = ["--train", a.train, "--test", a.test]

    traffic = []
    for n in [int(v) for v in a.learners.split(",")]:
        for alpha in sorted({max(float(v), 1.0 / n) for v in a.cache.split(",")}):
            row = {"learners": n, "cache": alpha}
            for mode in ("uncoded", "coded"):
                m = run([*data, "--workers", n + 1, "--shuffle", mode, "--cache-fraction", alpha, "--epochs", a.epochs],
                        a.out / f"{mode}-{n}-{alpha}.json")
                row[mode] = {k: m["per_shuffle"][k] for k in ("messages", "expected_messages", "master_bytes", "learner_bytes", "seconds")}
                row[mode]["final"] = m["final"]
                row["rows"], row["data_bytes"] = m["rows"], m["data_bytes"]
            row["same_model"] = row["uncoded"]["final"] == row["coded"]["final"]
            traffic.append(row)
            print(json.dumps(row), flush=True)

    quality = []
    for steps in (1000, 10):
        for mode in ("none", "coded"):
            m = run([*data, "--workers", 5, "--shuffle", mode, "--cache-fraction", 0.5, "--epochs", a.epochs,
                     "--local-steps", steps], a.out / f"quality-{mode}-{steps}.json")
            q = {"mode": mode, "local_steps": steps, **m["final"],
                 "curve": [e["test_logloss"] for e in m["trace"]]}
            quality.append(q)
            print(json.dumps(q), flush=True)

    (a.out / "results.json").write_text(json.dumps({"traffic": traffic, "quality": quality}, indent=1))
    md = ["| learners | α | uncoded messages (formula) | coded messages (formula) | coded / uncoded | master MB uncoded → coded | learners' MB uncoded → coded | shuffle s uncoded → coded | same model |",
          "|---|---|---|---|---|---|---|---|---|"]
    for r in traffic:
        u, c = r["uncoded"], r["coded"]
        md.append(f"| {r['learners']} | {r['cache']:.3g} | {u['messages']:.0f} ({u['expected_messages']:.0f}) | "
                  f"{c['messages']:.0f} ({c['expected_messages']:.0f}) | {c['messages'] / max(u['messages'], 1):.2f} | "
                  f"{u['master_bytes'] / 1e6:.2f} → {c['master_bytes'] / 1e6:.2f} | {u['learner_bytes'] / 1e6:.2f} → {c['learner_bytes'] / 1e6:.2f} | "
                  f"{u['seconds']:.3f} → {c['seconds']:.3f} | {'yes' if r['same_model'] else 'NO'} |")
    md += ["", "| shuffle | averaging every | train log loss | test log loss | test AUC | test log loss by epoch |", "|---|---|---|---|---|---|"]
    for q in quality:
        md.append(f"| {q['mode']} | {q['local_steps']} steps | {q['train_logloss']:.4f} | {q['test_logloss']:.4f} | {q['test_auc']:.4f} | "
                  + " ".join(f"{v:.3f}" for v in q["curve"]) + " |")
    (a.out / "results.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
