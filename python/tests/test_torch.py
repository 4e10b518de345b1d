"""downpour.torch against torch.nn, and the MovieLens example through the launcher."""

import json
import os
import pathlib
import subprocess
import sys
import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # CI installs it (the README's test command)
import downpour  # noqa: E402
import downpour.torch as dt  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "movielens_dlrm.py"


def run_workers(cluster, n, body):
    """Runs `body(session)` on `n` worker threads of an embedded cluster; returns their results by rank."""
    results, errors = {}, []

    def worker():
        try:
            s = cluster.join()
            results[s.rank] = body(s)
            s.finish()
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    cluster.wait()
    return results


def test_embedding_bag_forward_and_gradient_step_match_nn_embedding_bag():
    cluster = downpour.embedded(servers=2)
    s = cluster.join()
    bag = dt.EmbeddingBag(4, mode="mean", rule="sgd", lr=0.5, init="normal", init_std=0.1, seed=3).bind(s, 1)
    ref = torch.nn.EmbeddingBag.from_pretrained(bag.initial_weight(200), freeze=False, mode="mean")
    ids = torch.tensor([[3, 7, 3], [100, 7, 5]])
    out, expected = bag(ids), ref(ids)
    torch.testing.assert_close(out, expected)
    w = torch.randn(2, 4)
    (out * w).sum().backward()
    (expected * w).sum().backward()
    bag.wait()
    with torch.no_grad():
        ref.weight -= 0.5 * ref.weight.grad  # what the servers' sgd rule did
    torch.testing.assert_close(bag(ids), ref(ids))
    # 1-D ids with offsets, and sum mode through Embedding
    flat, offsets = torch.tensor([3, 7, 100, 5]), torch.tensor([0, 1])
    torch.testing.assert_close(bag(flat, offsets), ref(flat, offsets))
    emb = dt.Embedding(4, rule="sgd", lr=0.5, init="normal", init_std=0.1, seed=3).bind(s, 1)
    torch.testing.assert_close(emb(torch.tensor([[5, 7]])), ref.weight[[5, 7]].detach().unsqueeze(0))
    s.finish()
    cluster.wait()


def test_prefetched_rows_are_used_and_eval_reads_without_creating_rows():
    cluster = downpour.embedded(servers=1)
    s = cluster.join()
    emb = dt.Embedding(3, rule="add", init="uniform", init_std=0.5, seed=9).bind(s, 1)
    ids = torch.tensor([11, 12, 11])
    first = emb(ids)
    first.sum().backward()  # adds 2 to row 11's values, 1 to row 12's
    emb.prefetch(ids)
    assert emb._prefetched is not None
    again = emb(ids)
    assert emb._prefetched is None, "forward took the prefetched rows"
    torch.testing.assert_close(again, first.detach() + torch.tensor([[2.0], [1.0], [2.0]]))
    emb.eval()
    with torch.no_grad():
        unseen = emb(torch.tensor([500]))
    torch.testing.assert_close(unseen, emb.initial_weight(501)[500:])
    keys = downpour.scramble(np.array([500], dtype=np.uint64))
    h = emb.table.pull_async(keys)  # still the initial value: the read created nothing
    np.testing.assert_allclose(h.wait(), emb.initial_weight(501)[500:].numpy())
    with pytest.raises(downpour.DownpourError, match="already waited"):
        h.wait()
    with pytest.raises(downpour.DownpourError, match="non-negative"):
        emb(torch.tensor([-1]))
    s.finish()
    cluster.wait()


def test_synchronous_dense_rounds_average_the_workers_gradients():
    cluster = downpour.embedded(servers=2, workers=2)

    def body(s):
        torch.manual_seed(100 + s.rank)  # different starts: rank 0's wins
        lin = torch.nn.Linear(3, 1)
        dense = dt.DenseParameters(lin.parameters(), mode="sync", rule="sgd", lr=1.0).bind(s, 1)
        start = [p.detach().clone() for p in lin.parameters()]
        x = torch.full((1, 3), float(s.rank + 1))
        dense.zero_grad()
        lin(x).sum().backward()
        dense.step()
        return start, [p.detach().clone() for p in lin.parameters()]

    r = run_workers(cluster, 2, body)
    torch.testing.assert_close(r[0][0], r[1][0])  # both started from rank 0's values
    (w0, b0), (w1, b1) = r[0][1], r[1][1]
    torch.testing.assert_close(w0, w1)
    # gradients x = 1 and x = 2 (weight), 1 and 1 (bias): their mean applied once
    torch.testing.assert_close(w0, r[0][0][0] - 1.5)
    torch.testing.assert_close(b0, r[0][0][1] - 1.0)


def test_train_ctx_trains_leaves_and_fails_the_job_with_the_exception():
    cluster = downpour.embedded(servers=1)
    model = torch.nn.Sequential()
    model.add_module("emb", dt.EmbeddingBag(2, mode="sum", rule="adagrad", lr=0.1))
    with dt.TrainCtx(model, session=cluster.join(), dense_rule="adam") as ctx:
        assert model.emb.table_id == 1 and ctx.num_workers == 1
        ids = torch.tensor([[1, 2]])
        before = model(ids).sum().item()
        for _ in range(5):
            ctx.backward(model(ids).sum())
        assert model(ids).sum().item() < before - 0.1, "adagrad on the servers lowered the sum"
    cluster.wait()

    cluster = downpour.embedded(servers=1)
    with pytest.raises(ValueError):
        with dt.TrainCtx(torch.nn.Linear(2, 1), session=cluster.join()):
            raise ValueError("bad batch 7")
    with pytest.raises(downpour.DownpourError, match="bad batch 7"):
        cluster.wait()


def test_connect_without_an_address_says_what_is_missing(monkeypatch):
    monkeypatch.delenv("DOWNPOUR_COORDINATOR", raising=False)
    with pytest.raises(downpour.DownpourError, match="DOWNPOUR_COORDINATOR"):
        downpour.connect()
    monkeypatch.setenv("DOWNPOUR_COORDINATOR", "127.0.0.1:9")
    monkeypatch.setenv("DOWNPOUR_WORKER_FLAGS", '["--replication", "two"]')
    with pytest.raises(downpour.DownpourError, match="two"):
        downpour.connect()


def example(*args, timeout=300):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    # one stream, in the order the launcher printed its children's lines
    p = subprocess.run(
        [sys.executable, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout, env=env, cwd=REPO
    )
    return p.returncode, p.stdout


def test_the_example_survives_a_server_killed_mid_training_and_matches_plain_pytorch(tmp_path):
    # 30 epochs of the generated set: 7 s (a fast day) to 18 s of training on this machine
    # kind after 1-4 s of start-up, so that the kill at 5 s lands in the training (checked
    # below; with 10 epochs a fast day finished before it)
    common = [str(EXAMPLE), "--synthetic", "--epochs", "30"]
    rc, out = example(*common, "--reference", "--out", str(tmp_path / "ref.json"))
    assert rc == 0, out
    ref = json.loads((tmp_path / "ref.json").read_text())
    launch = ["-m", "downpour.launch", "--servers", "2", "--workers", "2", "--replication", "2", "--fault", "kill server:1 at 5s"]
    rc, out = example(*launch, *common, "--out", str(tmp_path / "ps.json"))
    assert rc == 0, out
    killed = out.find("killed server 1")
    assert killed >= 0, out
    assert out.find("worker 1 registered") < killed < out.rfind("epoch 30/30"), f"the server was not killed mid-training:\n{out}"
    got = json.loads((tmp_path / "ps.json").read_text())
    assert got["workers"] == 2
    assert abs(got["test_auc"] - ref["test_auc"]) < 0.01, (got, ref)
    assert got["test_auc"] > 0.8, got


def test_the_readmes_pytorch_example_runs_through_the_launcher(tmp_path):
    text = (REPO / "README.md").read_text()
    blocks = [b.split("```", 1)[0] for b in text.split("```python\n")[1:]]
    block = next(b for b in blocks if "TrainCtx" in b)
    script = tmp_path / "readme_torch.py"
    # the README leaves the data out: a few batches of ids and targets
    script.write_text(
        "import torch\n"
        "batches = [(torch.randint(0, 1000, (32, 3)), torch.randn(32)) for _ in range(20)]\n"
        + block
        + "print('README example trained', ctx.steps, 'steps')\n"
    )
    rc, out = example("-m", "downpour.launch", "--servers", "2", "--workers", "2", str(script), timeout=120)
    assert rc == 0, out
    assert out.count("README example trained 20 steps") == 2, out


def test_train_ctx_checkpoints_and_resumes_at_the_step_the_checkpoint_holds(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import sys, torch, downpour.torch as dt\n"
        "torch.manual_seed(0)\n"
        "model = torch.nn.Sequential(dt.EmbeddingBag(4, mode='sum'), torch.nn.Linear(4, 1))\n"
        "g = torch.Generator().manual_seed(1)\n"
        "batches = [(torch.randint(0, 50, (8, 2), generator=g), torch.randn(8, generator=g)) for _ in range(int(sys.argv[1]))]\n"
        "with dt.TrainCtx(model) as ctx:\n"
        "    print('start', ctx.steps, 'resumed', ctx.resumed is not None)\n"
        "    for ids, y in batches[ctx.steps:]:\n"
        "        ctx.backward(torch.nn.functional.mse_loss(model(ids).squeeze(1), y))\n"
        "    print('done', ctx.steps)\n"
    )
    ckpt = tmp_path / "ckpt"
    launch = ["-m", "downpour.launch", "--servers", "2", "--workers", "2"]
    rc, out = example(*launch, "--checkpoint-dir", str(ckpt), "--checkpoint-every", "5", str(script), "12", timeout=120)
    assert rc == 0, out
    assert out.count("done 12") == 2, out
    assert sorted(p.name for p in ckpt.iterdir()) == ["ckpt-000001", "ckpt-000002"], out
    rc, out = example(*launch, "--resume", str(ckpt), str(script), "14", timeout=120)
    assert rc == 0, out
    assert out.count("start 10 resumed True") == 2, out  # the checkpoint of clock 10
    assert out.count("done 14") == 2, out
