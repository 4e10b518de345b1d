"""PyTorch on Downpour: embedding modules whose rows live on the servers, a module's dense
parameters kept on the servers, and a training context that joins the job and leaves it.

    import torch, downpour.torch as dt

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.users = dt.EmbeddingBag(16, mode="sum", rule="adagrad", lr=0.05)
            self.mlp = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
        def forward(self, ids):
            return self.mlp(self.users(ids)).squeeze(1)

    model = Model()
    with dt.TrainCtx(model, dense_rule="adam", dense_lr=1e-3) as ctx:   # downpour.connect()
        for ids, y in batches:
            loss = torch.nn.functional.mse_loss(model(ids), y)
            ctx.backward(loss)          # row gradients pushed, dense step, clock, checkpoints

The servers apply the update rules (`adagrad`, `adam`, `ftrl`, `sgd`, …): a worker holds no
optimizer state. Row gradients are pushed during `backward` and the push travels while the
rest of the step runs; a worker's next pull of that table waits for it, so it reads its own
writes. Replication, fail-over and checkpoints are the cluster's (`python -m downpour.launch
--replication 2 …`): nothing changes here.
"""

import json
from typing import Any, Dict, Iterable, List, Optional

import numpy as np

try:
    import torch
    import torch.nn.functional as F
    from torch import nn
except ImportError as e:  # the package's torch extra
    raise ImportError(f"downpour.torch needs PyTorch: pip install torch (or pip install './python[torch]'): {e}") from e

from . import DownpourError, Session, Table, connect, initial_rows, scramble

__all__ = ["Embedding", "EmbeddingBag", "DenseParameters", "TrainCtx"]

class _ServerRows(nn.Module):
    """Rows of a sparse table on the servers, looked up by integer id (any int64 >= 0).

    `rule`, `lr` and the other keyword options are the servers' update rule and its
    hyper-parameters as `Session.table` takes them; `init`, `init_std`, `seed` give new rows'
    values (`normal` with standard deviation `init_std`, `uniform` in [-init_std, init_std),
    `zeros`; seeded by `seed`, by default the table's id, so that two tables' rows of one
    id differ); `table_id` and `name` fix the table (else `TrainCtx` numbers it).
    """

    def __init__(
        self,
        embedding_dim: int,
        *,
        rule: str = "adagrad",
        lr: float = 0.01,
        init: str = "normal",
        init_std: float = 0.01,
        seed: Optional[int] = None,
        name: Optional[str] = None,
        table_id: Optional[int] = None,
        **table_options: Any,
    ) -> None:
        super().__init__()
        if embedding_dim < 1:
            raise ValueError("embedding_dim must be at least 1")
        self.embedding_dim = int(embedding_dim)
        self.table_id = table_id
        self.table_name = name
        self.seed = seed
        self._options = dict(rule=rule, lr=lr, init=init, init_std=init_std, **table_options)
        self._table: Optional[Table] = None
        self._push = None  # the last push's handle: waited before this table's next read
        self._prefetched = None  # (ids, keys, order, handle) of `prefetch`

    def bind(self, session: Session, table_id: Optional[int] = None, name: Optional[str] = None) -> "_ServerRows":
        """Creates this module's table on the servers (or checks that it exists with the same
        definition) as table `table_id` of `session`. `TrainCtx` does it for every such module
        of a model; call it yourself to use a module without one."""
        tid = table_id if table_id is not None else self.table_id
        if tid is None:
            raise DownpourError("bind() needs a table id (TrainCtx numbers its modules' tables)")
        self.table_id = tid
        self.table_name = name or self.table_name or f"embedding-{tid}"
        seed = self.seed if self.seed is not None else tid  # tables of one job start apart
        self._table = session.table(tid, self.table_name, value_len=self.embedding_dim, seed=seed, **self._options)
        return self

    def initial_weight(self, num_embeddings: int) -> torch.Tensor:
        """The rows of ids `0 .. num_embeddings - 1` as the servers create them (a
        `(num_embeddings, embedding_dim)` tensor): to start a plain PyTorch copy of the model
        (`nn.EmbeddingBag.from_pretrained`) exactly where this one starts. Needs the seed
        (given, or the table id once bound)."""
        seed = self.seed if self.seed is not None else self.table_id
        if seed is None:
            raise DownpourError("initial_weight() needs the seed: give seed= or bind the module first")
        keys = scramble(np.arange(num_embeddings, dtype=np.uint64))
        o = self._options
        rows = initial_rows(keys, self.embedding_dim, init=o["init"], init_std=o["init_std"], seed=seed)
        return torch.from_numpy(rows)

    @property
    def table(self) -> Table:
        if self._table is None:
            raise DownpourError(f"{type(self).__name__} is not bound to a table: use TrainCtx, or bind(session, table_id)")
        return self._table

    @staticmethod
    def _keys(ids: torch.Tensor):
        """The sorted unique keys of `ids` and, for every id, its row in them."""
        if ids.dtype not in (torch.int64, torch.int32):
            raise DownpourError(f"ids must be an int64 or int32 tensor, not {ids.dtype}")
        flat = ids.reshape(-1)
        if flat.numel() and int(flat.min()) < 0:
            raise DownpourError("ids must be non-negative")
        uniq, inverse = torch.unique(flat, return_inverse=True)
        keys = scramble(uniq.numpy().astype(np.uint64))
        order = np.argsort(keys)
        sorted_keys = np.ascontiguousarray(keys[order])
        # the position of every unique id among the sorted keys
        where = np.empty(len(order), dtype=np.int64)
        where[order] = np.arange(len(order))
        return sorted_keys, torch.from_numpy(where)[inverse].reshape(ids.shape)

    def wait(self) -> None:
        """Waits until this module's last row-gradient push was applied."""
        if self._push is not None:
            h, self._push = self._push, None
            h.wait()

    def prefetch(self, ids: torch.Tensor) -> None:
        """Starts reading the rows of the next batch's `ids` now, so that they travel while
        this batch computes; the next `forward` with equal ids uses them. The rows hold the
        pushes this worker made before the call: issued before this batch's `backward`, they
        miss its update (one step staler than a read at use, as Downpour's `n_fetch`)."""
        keys, index = self._keys(ids)
        self.wait()
        self._prefetched = (ids.detach().clone(), keys, index, self.table.pull_async(keys))

    def _rows(self, ids: torch.Tensor):
        """The batch's rows (a leaf tensor that pushes its gradient) and each id's row index."""
        table = self.table
        pre, self._prefetched = self._prefetched, None
        if pre is not None and pre[0].shape == ids.shape and torch.equal(pre[0], ids):
            _, keys, index, handle = pre
            values = handle.wait()
        else:
            if pre is not None:
                pre[3].wait()  # not the batch it was for: dropped
            keys, index = self._keys(ids)
            self.wait()
            if self.training:
                values = table.pull(keys)
            else:
                values = table.peek(keys)  # evaluation creates no rows
        weight = torch.from_numpy(values)
        if self.training and torch.is_grad_enabled():
            weight.requires_grad_(True)

            def push(grad: torch.Tensor, keys=keys) -> None:
                g = np.ascontiguousarray(grad.detach().numpy(), dtype=np.float32)
                self.wait()
                self._push = table.push_async(keys, g)

            weight.register_hook(push)
        return weight, index

    def extra_repr(self) -> str:
        return f"{self.embedding_dim}, table={self.table_id}, rule={self._options['rule']}, lr={self._options['lr']}"


class Embedding(_ServerRows):
    """`torch.nn.Embedding` whose rows live in a sparse table on the servers: `forward(ids)`
    pulls the batch's unique ids' rows (created on first use from `init`) and returns
    `ids.shape + (embedding_dim,)`; `backward` pushes their gradients, which the servers
    apply by `rule`. In `eval()` mode rows are read without being created. Options as
    `_ServerRows`'s.
    """

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        weight, index = self._rows(ids)
        return F.embedding(index, weight)


class EmbeddingBag(_ServerRows):
    """`torch.nn.EmbeddingBag` whose rows live in a sparse table on the servers:
    `forward(input, offsets=None, per_sample_weights=None)` takes bags as
    `nn.EmbeddingBag` does (a 2-D tensor of equal bags, or 1-D ids with `offsets`) and
    reduces each bag's rows by `mode` (`sum`, `mean` or `max`); `backward` pushes the rows'
    gradients, which the servers apply by `rule`. Options as `_ServerRows`'s.
    """

    def __init__(self, embedding_dim: int, *, mode: str = "mean", **options: Any) -> None:
        super().__init__(embedding_dim, **options)
        if mode not in ("sum", "mean", "max"):
            raise ValueError(f"mode {mode!r} is not sum, mean or max")
        self.mode = mode

    def forward(
        self, input: torch.Tensor, offsets: Optional[torch.Tensor] = None, per_sample_weights: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        weight, index = self._rows(input)
        return F.embedding_bag(index, weight, offsets, mode=self.mode, per_sample_weights=per_sample_weights)


class DenseParameters:
    """A module's dense parameters (every `nn.Parameter`) kept on the servers.

    `mode="async"` is Downpour SGD: each worker pushes its gradient (averaged over `n_push`
    steps) every `n_push` steps and pulls the parameters every `n_fetch` steps; the servers
    apply `rule` to each push as it comes. `mode="sync"` is synchronous SGD: every step
    each worker pushes its gradient, the servers average the round's pushes (a `bsp`
    table with `aggregate="avg"`) and apply `rule` once, and every worker pulls the result;
    every worker must then take the same number of steps.

    The servers hold the parameters' change since the start (a table of `rule`, from
    zeros) and the starting values, written once by rank 0 (a table of rule `assign`), so
    every worker starts from rank 0's initialisation whatever its own seed.
    """

    def __init__(
        self,
        params: Iterable[nn.Parameter],
        *,
        mode: str = "async",
        rule: str = "adam",
        lr: float = 1e-3,
        n_fetch: int = 1,
        n_push: int = 1,
        **rule_options: Any,
    ) -> None:
        if mode not in ("async", "sync"):
            raise ValueError(f"mode {mode!r} is not async or sync")
        if n_fetch < 1 or n_push < 1:
            raise ValueError("n_fetch and n_push must be at least 1")
        if mode == "sync" and (n_fetch != 1 or n_push != 1):
            raise ValueError("synchronous rounds push and fetch every step: n_fetch and n_push are for mode='async'")
        self.params: List[nn.Parameter] = [p for p in params if p.requires_grad]
        self.mode, self.n_fetch, self.n_push = mode, n_fetch, n_push
        self._rule = dict(rule=rule, lr=lr, **rule_options)
        self.size = sum(p.numel() for p in self.params)
        self._start = np.zeros(self.size, dtype=np.float32)
        self._delta = np.zeros(self.size, dtype=np.float32)
        self._grad = np.zeros(self.size, dtype=np.float32)
        self._step_grad = np.empty(self.size, dtype=np.float32)  # this step's, reused
        self._values = np.empty(self.size, dtype=np.float32)  # start + change, reused
        self._steps = 0
        self._table: Optional[Table] = None
        self._session: Optional[Session] = None

    def bind(self, session: Session, table_id: int) -> "DenseParameters":
        """Creates the two tables (`table_id`: the change, `table_id + 1`: the starting values),
        has rank 0 write its starting values (unless the job resumed), and loads them into the
        module on every worker (a barrier)."""
        self._session = session
        if self.size == 0:
            return self
        sync = self.mode == "sync"
        self._table = session.table(
            table_id,
            f"dense-{table_id}",
            dense=self.size,
            consistency="bsp" if sync else "async",
            aggregate="avg" if sync else "none",
            **self._rule,
        )
        start = session.table(table_id + 1, f"dense-{table_id}-start", dense=self.size, rule="assign")
        if session.rank == 0 and session.resumed is None:
            self._flatten(lambda p: p.data, self._start)
            start.push_range(0, self._start)
        session.barrier(f"downpour.torch.dense-{table_id}")
        start.pull_range(0, out=self._start)
        self._fetch()
        return self

    def _flatten(self, of, out: np.ndarray) -> None:
        at = 0
        for p in self.params:
            n = p.numel()
            t = of(p)
            if t is None:
                out[at : at + n] = 0.0
            else:
                out[at : at + n] = t.detach().reshape(-1).numpy()
            at += n

    def _fetch(self) -> None:
        assert self._table is not None
        self._table.pull_range(0, out=self._delta)
        np.add(self._start, self._delta, out=self._values)
        values = torch.from_numpy(self._values)
        at = 0
        with torch.no_grad():
            for p in self.params:
                n = p.numel()
                p.copy_(values[at : at + n].view_as(p))
                at += n

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        """After `backward`: pushes the gradient (every `n_push` steps, or each round) and
        reads the parameters back (every `n_fetch` steps, or after the round)."""
        if self._table is None:
            if self.size == 0:
                return
            raise DownpourError("DenseParameters is not bound: use TrainCtx, or bind(session, table_id)")
        self._flatten(lambda p: p.grad, self._step_grad)
        self._grad += self._step_grad
        self._steps += 1
        if self.mode == "sync":
            self._table.push_range(0, self._grad)
            self._grad[:] = 0.0
            assert self._session is not None
            self._session.clock()  # ends the round: the pull below waits for every worker's
            self._fetch()
            return
        if self._steps % self.n_push == 0:
            self._grad /= self.n_push
            self._table.push_range(0, self._grad)
            self._grad[:] = 0.0
        if self._steps % self.n_fetch == 0:
            self._fetch()


class TrainCtx:
    """Joins the job, binds the model's tables, runs the training steps' bookkeeping and
    leaves cleanly: a context manager in the spirit of PERSIA's.

    On entry it joins (`session`, else `downpour.connect()`: the cluster of
    `python -m downpour.launch`), gives every `Embedding`/`EmbeddingBag` of `model` a
    sparse table (ids 1, 2, … in module order) and keeps the model's other parameters on the
    servers as `DenseParameters` (`dense_mode`, `dense_rule`, `dense_lr`, `n_fetch`,
    `n_push`; the tables after the embeddings'). `backward(loss)` runs one step and counts
    it in `steps`. `state` (a JSON-able dict, holding `steps`) is recorded at each
    checkpoint (the cluster's `--checkpoint-dir`) as it is when `backward` takes it, and
    after `--resume` it is back in `state` (and `resumed`), with `steps` the steps the
    checkpoint holds: go on from batch `ctx.steps`. On exit it waits for the last pushes,
    retires from checkpoints and finishes the session (failing the job, with the
    exception's message, if the block raised).
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        session: Optional[Session] = None,
        dense_mode: str = "async",
        dense_rule: str = "adam",
        dense_lr: float = 1e-3,
        n_fetch: int = 1,
        n_push: int = 1,
        **dense_rule_options: Any,
    ) -> None:
        self.model = model
        self.session = session
        self.embeddings: List[_ServerRows] = [m for m in model.modules() if isinstance(m, _ServerRows)]
        self.dense = DenseParameters(
            model.parameters(), mode=dense_mode, rule=dense_rule, lr=dense_lr, n_fetch=n_fetch, n_push=n_push, **dense_rule_options
        )
        self.state: Dict[str, Any] = {}
        self.resumed: Optional[Dict[str, Any]] = None
        self.steps = 0

    @property
    def rank(self) -> int:
        return self._s().rank

    @property
    def num_workers(self) -> int:
        return self._s().num_workers

    def _s(self) -> Session:
        if self.session is None:
            raise DownpourError("TrainCtx is not entered: use `with TrainCtx(model) as ctx:`")
        return self.session

    def __enter__(self) -> "TrainCtx":
        if self.session is None:
            self.session = connect()
        s = self.session
        if s.resumed:
            try:
                self.resumed = json.loads(s.resumed)
            except ValueError:
                self.resumed = None
            if isinstance(self.resumed, dict):
                self.state = dict(self.resumed)
                self.steps = int(self.state.get("steps", 0))
        used = set()
        next_id = 1
        for m in self.embeddings:
            if m.table_id is None:
                while next_id in used:
                    next_id += 1
                m.table_id = next_id
            if m.table_id in used:
                raise DownpourError(f"two embedding modules use table {m.table_id}")
            used.add(m.table_id)
            m.bind(s)
        dense_id = max(used, default=0) + 1
        self.dense.bind(s, dense_id)
        return self

    def backward(self, loss: torch.Tensor) -> None:
        """One training step: clears the dense gradients, back-propagates `loss` (row
        gradients are pushed as they are computed), pushes and fetches the dense parameters,
        ends the worker's clock and takes a checkpoint when one is due."""
        s = self._s()
        self.dense.zero_grad()
        loss.backward()
        self.dense.step()
        self.steps += 1
        self.state["steps"] = self.steps
        if self.dense.mode != "sync":
            s.clock()
        if s.checkpointing:
            for m in self.embeddings:
                m.wait()
            s.checkpoint_point(json.dumps(self.state))

    def barrier(self, name: str) -> None:
        """Waits until every worker reached barrier `name` (its pushes applied first)."""
        for m in self.embeddings:
            m.wait()
        self._s().barrier(name)

    def __exit__(self, exc_type, exc, tb) -> None:
        s = self.session
        if s is None:
            return
        if exc is None:
            for m in self.embeddings:
                m.wait()
            s.retire(json.dumps(self.state))
            s.finish()
        else:
            try:
                s.finish(ok=False, message=f"{exc_type.__name__}: {exc}")
            except DownpourError:
                pass  # the job is already failing; the exception in flight says why
