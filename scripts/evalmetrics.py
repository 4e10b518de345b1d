"""Test-set metrics shared by the benchmark scripts: AUC (ties get their average rank) and log loss."""
import math


def auc(p, y):
    order = sorted(range(len(p)), key=lambda i: p[i])
    ranks, i = [0.0] * len(p), 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and p[order[j + 1]] == p[order[i]]:
            j += 1
        for k in order[i:j + 1]:
            ranks[k] = (i + j) / 2 + 1
        i = j + 1
    npos = sum(1 for t in y if t)
    return (sum(r for r, t in zip(ranks, y) if t) - npos * (npos + 1) / 2) / (npos * (len(y) - npos))


def logloss(p, y):
    return -sum(math.log(min(max(q if t else 1 - q, 1e-15), 1.0)) for q, t in zip(p, y)) / len(p)
