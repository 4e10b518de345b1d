#!/usr/bin/env python3
"""The reference for `train lda`: the PyPI `lda` package (collapsed Gibbs sampling, the same
priors, sampler and log-likelihood `log p(w, z)`) on an LDA-C corpus, one line of JSON per
seed with the log-likelihood per token after N sweeps and the seconds per sweep.

    pip install lda
    python3 scripts/lda_reference.py CORPUS.ldac [--topics 20] [--sweeps 100] [--seeds 1,2,3]
"""
import argparse
import json
import logging
import time

import lda
import lda.utils
import numpy as np

p = argparse.ArgumentParser()
p.add_argument("corpus")
p.add_argument("--topics", type=int, default=20)
p.add_argument("--sweeps", type=int, default=100)
p.add_argument("--alpha", type=float, default=0.1)
p.add_argument("--eta", type=float, default=0.01)
p.add_argument("--seeds", default="1,2,3")
a = p.parse_args()
logging.getLogger("lda").setLevel(logging.WARNING)
with open(a.corpus) as f:
    X = lda.utils.ldac2dtm(f)
tokens = int(X.sum())
for seed in [int(s) for s in a.seeds.split(",")]:
    m = lda.LDA(n_topics=a.topics, n_iter=a.sweeps, alpha=a.alpha, eta=a.eta, random_state=seed, refresh=max(a.sweeps, 1))
    t = time.perf_counter()
    m.fit(X)
    s = time.perf_counter() - t
    print(json.dumps({"package": f"lda {lda.__version__}", "seed": seed, "topics": a.topics, "sweeps": a.sweeps,
                      "tokens": tokens, "ll_per_token": m.loglikelihood() / tokens, "s_per_sweep": s / a.sweeps}))
