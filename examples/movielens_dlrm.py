"""A DLRM-style recommendation model on MovieLens-100k, trained on Downpour from PyTorch.

    python -m downpour.launch --servers 2 --workers 2 examples/movielens_dlrm.py
    python -m downpour.launch --servers 2 --workers 2 --replication 2 \\
        --fault "kill server:1 at 3s" examples/movielens_dlrm.py        # a server dies: same quality
    python examples/movielens_dlrm.py --reference                     # the same model, plain PyTorch

The model: user, item and genre embeddings (`downpour.torch.EmbeddingBag`: the user's and
the item's id a bag of one, the item's genres a bag averaged), their pairwise dot products
(DLRM's interaction) and the three vectors into a small MLP that predicts the rating. The
embedding rows live on the servers, updated there by AdaGrad; the MLP's parameters too, by
Adam (Downpour SGD: every worker pushes its gradient and reads the parameters back each
step). Each worker trains on its share of the training ratings; rank 0 evaluates on the
held-out 10% after every epoch: RMSE, and AUC of "rating >= 4" scored by the prediction.

`--reference` trains the same model in one process with `torch.nn.EmbeddingBag` (sparse
gradients, `torch.optim.Adagrad`) and `torch.optim.Adam`: same data, split, seed and epochs.

Data: `--ratings` and `--items` take MovieLens files in either layout: GroupLens' `u.data`
(user, item, rating, time; tab-separated) and `u.item` (`|`-separated, 19 genre flags last),
or RecBole's `ml-100k.inter` / `ml-100k.item` (tab-separated with a typed header; genres a
space-separated `class:token_seq` field). By default `../shared/data/movielens-100k/` beside
the repository; without it, a generated set of the same shape (`--synthetic`) with a note.
The last line printed is a JSON object of the results.
"""

import argparse
import json
import os
import pathlib
import sys
import time

import numpy as np

try:
    import torch
    import torch.nn.functional as F
    from torch import nn
except ImportError:
    sys.exit("error: this example needs PyTorch: pip install torch (or pip install './python[torch]')")

REPO = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data" / "movielens-100k"


# ---------------------------------------------------------------------------------- data
def _open_lines(path):
    try:
        with open(path, encoding="latin-1") as f:
            for n, line in enumerate(f, 1):
                yield n, line.rstrip("\n")
    except OSError as e:
        sys.exit(f"error: cannot read {path}: {e.strerror}")


def load_ratings(path):
    """(users, items, ratings) arrays of a u.data or .inter file; bad lines name file:line."""
    users, items, ratings = [], [], []
    for n, line in _open_lines(path):
        if not line.strip():
            continue
        fields = line.split("\t")
        if n == 1 and ":" in fields[0]:
            continue  # RecBole's typed header
        try:
            u, i, r = int(fields[0]), int(fields[1]), float(fields[2])
        except (ValueError, IndexError):
            sys.exit(f"error: {path}:{n}: expected user<TAB>item<TAB>rating, got {line[:80]!r}")
        users.append(u)
        items.append(i)
        ratings.append(r)
    if not ratings:
        sys.exit(f"error: {path} holds no ratings")
    return np.array(users, dtype=np.int64), np.array(items, dtype=np.int64), np.array(ratings, dtype=np.float32)


def load_genres(path):
    """{item: [genre ids]} of a u.item or .item file."""
    genres, names = {}, {}
    header = None
    for n, line in _open_lines(path):
        if not line.strip():
            continue
        if "|" in line and header is None:  # GroupLens: id|title|date|video|url|19 flags
            f = line.split("|")
            try:
                genres[int(f[0])] = [g for g, flag in enumerate(f[-19:]) if flag == "1"]
            except ValueError:
                sys.exit(f"error: {path}:{n}: not a u.item line: {line[:80]!r}")
            continue
        f = line.split("\t")
        if n == 1:
            header = [h.split(":")[0] for h in f]
            if "item_id" not in header or "class" not in header:
                sys.exit(f"error: {path}:1: a RecBole .item header needs item_id and class fields")
            continue
        if header is None:
            sys.exit(f"error: {path}:{n}: neither a u.item nor a RecBole .item file")
        try:
            item = int(f[header.index("item_id")])
            names_here = f[header.index("class")].split() if len(f) > header.index("class") else []
        except ValueError:
            sys.exit(f"error: {path}:{n}: item id is not an integer: {line[:80]!r}")
        genres[item] = [names.setdefault(g, len(names)) for g in names_here]
    return genres


def synthetic(seed=7, users=400, items=600, n=40000, n_genres=19):
    """A MovieLens-shaped set from a latent-factor model with genre effects."""
    rng = np.random.default_rng(seed)
    u_f = rng.normal(0, 0.6, (users, 8))
    i_f = rng.normal(0, 0.6, (items, 8))
    g_f = rng.normal(0, 0.5, (n_genres, 8))
    genres = {i + 1: sorted(set(rng.choice(n_genres, size=rng.integers(1, 4), replace=False).tolist())) for i in range(items)}
    u = rng.integers(0, users, n)
    i = rng.zipf(1.3, n) % items
    score = 3.5 + np.einsum("nk,nk->n", u_f[u], i_f[i] + np.array([g_f[genres[j + 1]].mean(0) for j in i]))
    r = np.clip(np.rint(score + rng.normal(0, 0.7, n)), 1, 5).astype(np.float32)
    return u + 1, i + 1, r, genres


class Data:
    """Ratings split 90/10 by a seeded permutation; genre bags flattened with offsets."""

    def __init__(self, users, items, ratings, genres, seed):
        perm = np.random.default_rng(seed).permutation(len(ratings))
        n_test = len(ratings) // 10
        self.test, self.train = perm[:n_test], perm[n_test:]
        self.users, self.items, self.ratings = users, items, ratings
        self.genres = genres

    def batch(self, rows):
        """Tensors of the examples `rows`: user ids, item ids, genre ids + offsets, ratings."""
        g_ids, offsets = [], []
        for i in self.items[rows]:
            offsets.append(len(g_ids))
            g = self.genres.get(int(i)) or [-1]  # an item without a genre: its own bag id
            g_ids.extend(x + 1 for x in g)
        return (
            torch.from_numpy(self.users[rows]).view(-1, 1),
            torch.from_numpy(self.items[rows]).view(-1, 1),
            torch.tensor(g_ids, dtype=torch.int64),
            torch.tensor(offsets, dtype=torch.int64),
            torch.from_numpy(self.ratings[rows]),
        )


# ---------------------------------------------------------------------------------- model
class DLRM(nn.Module):
    """Embeddings, their pairwise dot products, and an MLP to the rating."""

    def __init__(self, bag, dim=16, hidden=64):
        super().__init__()
        self.user, self.item, self.genre = bag("user"), bag("item"), bag("genre")
        self.mlp = nn.Sequential(nn.Linear(3 * dim + 3, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, users, items, g_ids, g_offsets):
        u = self.user(users)
        i = self.item(items)
        g = self.genre(g_ids, g_offsets)
        dots = torch.stack([(u * i).sum(1), (u * g).sum(1), (i * g).sum(1)], dim=1)
        return 3.5 + self.mlp(torch.cat([u, i, g, dots], dim=1)).squeeze(1)


def auc(scores, labels):
    """Area under the ROC curve (ties counted half), by ranks."""
    order = np.argsort(scores, kind="mergesort")
    s = scores[order]
    ranks = np.empty(len(s))
    start = 0
    for end in range(1, len(s) + 1):
        if end == len(s) or s[end] != s[start]:
            ranks[start:end] = (start + end + 1) / 2.0
            start = end
    r = np.empty(len(s))
    r[order] = ranks
    pos = labels.astype(bool)
    n_pos, n_neg = pos.sum(), (~pos).sum()
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    return float((r[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def evaluate(model, data, batch=4096):
    model.eval()
    preds = []
    with torch.no_grad():
        for at in range(0, len(data.test), batch):
            rows = data.test[at : at + batch]
            u, i, g, o, _ = data.batch(rows)
            preds.append(model(u, i, g, o).numpy())
    model.train()
    p = np.concatenate(preds)
    y = data.ratings[data.test]
    return {"test_rmse": float(np.sqrt(np.mean((np.clip(p, 1, 5) - y) ** 2))), "test_auc": auc(p, y >= 4)}


# ---------------------------------------------------------------------------------- runs
def args_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ratings", type=pathlib.Path, help="u.data or ml-100k.inter (default: ../shared/data/movielens-100k)")
    p.add_argument("--items", type=pathlib.Path, help="u.item or ml-100k.item (genres)")
    p.add_argument("--synthetic", action="store_true", help="train on a generated MovieLens-shaped set")
    p.add_argument("--limit", type=int, default=0, help="use only the first N ratings (0: all)")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--lr", type=float, default=0.05, help="AdaGrad's step for the embeddings")
    p.add_argument("--dense-lr", type=float, default=2e-3, help="Adam's step for the MLP")
    p.add_argument("--init-std", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--prefetch", action=argparse.BooleanOptionalAction, default=True, help="read the next batch's rows ahead")
    p.add_argument("--reference", action="store_true", help="train in this process with plain PyTorch")
    p.add_argument("--out", type=pathlib.Path, help="write the results' JSON here too")
    return p


def load(a):
    if a.synthetic:
        users, items, ratings, genres = synthetic(a.seed)
        source = "generated"
    else:
        ratings_path = a.ratings or DEFAULT_DATA / "ml-100k.inter"
        items_path = a.items or (ratings_path.parent / "u.item" if ratings_path.name == "u.data" else DEFAULT_DATA / "ml-100k.item")
        if a.ratings is None and not ratings_path.exists():
            print(f"note: {ratings_path} not found: training on a generated MovieLens-shaped set (--ratings FILE for real data)", flush=True)
            users, items, ratings, genres = synthetic(a.seed)
            source = "generated"
        else:
            users, items, ratings = load_ratings(ratings_path)
            genres = load_genres(items_path) if items_path.exists() else {}
            source = str(ratings_path)
    if a.limit:
        users, items, ratings = users[: a.limit], items[: a.limit], ratings[: a.limit]
    return Data(users, items, ratings, genres, a.seed), source


def epoch_order(data, epoch, seed, rank=0, workers=1):
    """This worker's training rows in epoch `epoch`: a seeded shuffle, dealt round-robin."""
    rows = data.train[np.random.default_rng(seed * 1000 + epoch).permutation(len(data.train))]
    return rows[rank::workers]


def server_bag(a, name):
    """A `downpour.torch.EmbeddingBag` of the model (rows on the servers)."""
    import downpour.torch as dt

    seed = 1000 * a.seed + {"user": 1, "item": 2, "genre": 3}[name]
    return dt.EmbeddingBag(a.dim, mode="mean", rule="adagrad", lr=a.lr, init="normal", init_std=a.init_std, seed=seed, name=name)


def run_reference(a, data):
    def bag(name):
        n_genres = 2 + max((x for g in data.genres.values() for x in g), default=0)
        n = {"user": int(data.users.max()) + 1, "item": int(data.items.max()) + 1, "genre": n_genres}[name]
        # the rows a Downpour run starts from, so that the two runs start alike
        weight = server_bag(a, name).initial_weight(n)
        return nn.EmbeddingBag.from_pretrained(weight, freeze=False, mode="mean", sparse=True)

    torch.manual_seed(a.seed)  # the MLP's initialisation, as rank 0's in a Downpour run
    model = DLRM(bag, a.dim)
    sparse = [p for m in (model.user, model.item, model.genre) for p in m.parameters()]
    opt_sparse = torch.optim.Adagrad(sparse, lr=a.lr, eps=1e-8)
    opt_dense = torch.optim.Adam(model.mlp.parameters(), lr=a.dense_lr)
    start, examples = time.perf_counter(), 0
    for epoch in range(a.epochs):
        rows, losses = epoch_order(data, epoch, a.seed), []
        for at in range(0, len(rows), a.batch):
            u, i, g, o, y = data.batch(rows[at : at + a.batch])
            loss = F.mse_loss(model(u, i, g, o), y)
            opt_sparse.zero_grad()
            opt_dense.zero_grad()
            loss.backward()
            opt_sparse.step()
            opt_dense.step()
            losses.append(loss.item())
            examples += len(y)
        m = evaluate(model, data)
        print(f"epoch {epoch + 1}/{a.epochs}: train mse {np.mean(losses):.4f}  test rmse {m['test_rmse']:.4f}  auc {m['test_auc']:.4f}", flush=True)
    elapsed = time.perf_counter() - start
    return {"mode": "reference", "workers": 1, **m, "examples_per_s": examples / elapsed, "train_s": elapsed}


def run_downpour(a, data):
    import downpour.torch as dt

    torch.manual_seed(a.seed)
    model = DLRM(lambda name: server_bag(a, name), a.dim)
    # where a worker's time goes: building batches, forward (row pulls included), the step
    # (backward, row pushes, the MLP's push and pull, the clock)
    timing = {"data_s": 0.0, "forward_s": 0.0, "step_s": 0.0}
    examples = 0
    with dt.TrainCtx(model, dense_rule="adam", dense_lr=a.dense_lr) as ctx:
        rank, workers = ctx.rank, ctx.num_workers
        first = ctx.state.get("epoch", 0)
        start = time.perf_counter()
        for epoch in range(first, a.epochs):
            rows, losses = epoch_order(data, epoch, a.seed, rank, workers), []
            batches = [rows[at : at + a.batch] for at in range(0, len(rows), a.batch)]
            nxt = data.batch(batches[0]) if batches else None
            for b in range(len(batches)):
                t0 = time.perf_counter()
                u, i, g, o, y = nxt
                nxt = data.batch(batches[b + 1]) if b + 1 < len(batches) else None
                t1 = time.perf_counter()
                pred = model(u, i, g, o)  # pulls the rows (or takes the prefetched ones)
                if a.prefetch and nxt is not None:
                    model.user.prefetch(nxt[0])
                    model.item.prefetch(nxt[1])
                    model.genre.prefetch(nxt[2])
                t2 = time.perf_counter()
                loss = F.mse_loss(pred, y)
                ctx.backward(loss)  # pushes row gradients, pushes/pulls the MLP, clocks
                t3 = time.perf_counter()
                timing["data_s"] += t1 - t0
                timing["forward_s"] += t2 - t1
                timing["step_s"] += t3 - t2
                losses.append(loss.item())
                examples += len(y)
            ctx.state["epoch"] = epoch + 1
            ctx.barrier(f"epoch-{epoch}")
            line = f"epoch {epoch + 1}/{a.epochs}: worker {rank} train mse {np.mean(losses):.4f}"
            if rank == 0:
                m = evaluate(model, data)
                line += f"  test rmse {m['test_rmse']:.4f}  auc {m['test_auc']:.4f}"
            print(line, flush=True)
        elapsed = time.perf_counter() - start
        result = {"mode": "downpour", "rank": rank, "workers": workers, "examples_per_s": examples / elapsed, "train_s": elapsed, **timing}
        if rank == 0:
            result.update(evaluate(model, data))
    return result


def main(argv=None):
    a = args_parser().parse_args(argv)
    data, source = load(a)
    print(f"data: {source}: {len(data.train)} training and {len(data.test)} test ratings", flush=True)
    result = run_reference(a, data) if a.reference else run_downpour(a, data)
    result["data"] = source
    text = json.dumps(result)
    if a.out and result.get("rank", 0) == 0:
        a.out.write_text(text + "\n")
    print(text, flush=True)


if __name__ == "__main__":
    main()
