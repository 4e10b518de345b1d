"""The Python client against an embedded cluster and a launched one (`pytest python/tests`)."""

import os
import pathlib
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import downpour

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_push_and_pull_fill_the_callers_array_in_place():
    cluster = downpour.embedded(servers=2)
    s = cluster.join()
    assert (s.rank, s.num_workers) == (0, 1)
    t = s.table(1, "rows", value_len=4)
    keys = downpour.scramble(np.arange(1000, dtype=np.uint64))
    keys.sort()
    values = np.arange(4000, dtype=np.float32).reshape(1000, 4)
    t.push(keys, values)
    out = np.zeros((1000, 4), dtype=np.float32)
    got = t.pull(keys, out=out)
    assert got is out, "the pulled values land in the caller's array, no copy"
    np.testing.assert_array_equal(out, values)
    # without out: a new (len(keys), value_len) array
    again = t.pull(keys)
    assert again.shape == (1000, 4) and again.dtype == np.float32
    # an asynchronous push, then its handle
    h = t.push_async(keys, values)
    h.wait()
    h.wait()
    np.testing.assert_array_equal(t.pull(keys), 2 * values)
    s.finish()
    cluster.wait()


def test_the_servers_apply_the_tables_update_rule():
    cluster = downpour.embedded(servers=1)
    s = cluster.join()
    t = s.table(2, "sgd", value_len=2, rule="sgd", lr=0.5)
    keys = np.array([5, 9], dtype=np.uint64)
    t.push(keys, np.ones(4, dtype=np.float32))
    np.testing.assert_allclose(t.pull(keys), -0.5 * np.ones((2, 2)))
    dense = s.table(3, "dense", value_len=3, dense=10)
    dense.push_range(4, np.full((2, 3), 7, dtype=np.float32))
    rows = dense.pull_range(3, count=4)
    np.testing.assert_array_equal(rows[:, 0], [0, 7, 7, 0])
    s.finish()
    cluster.wait()


def test_an_admitting_table_gives_a_key_its_row_at_its_second_push():
    cluster = downpour.embedded(servers=2)
    s = cluster.join()
    t = s.table(3, "admitted", admit="count:2")
    keys = downpour.scramble(np.arange(500, dtype=np.uint64))
    keys.sort()
    ones = np.ones(500, dtype=np.float32)
    t.push(keys, ones)
    np.testing.assert_array_equal(t.pull(keys).ravel(), np.zeros(500, dtype=np.float32))
    t.push(keys, 2 * ones)
    np.testing.assert_array_equal(t.pull(keys).ravel(), 2 * ones)
    with pytest.raises(downpour.DownpourError, match="count:N"):
        s.table(4, "bad", admit="count:0")
    s.finish()
    cluster.wait()


def test_an_lru_table_keeps_its_newest_rows_and_a_dropped_key_reads_as_new():
    cluster = downpour.embedded(servers=1)
    s = cluster.join()
    t = s.table(5, "bounded", evict="lru:100")
    old = np.arange(1, 1001, dtype=np.uint64)
    new = np.arange(5001, 5101, dtype=np.uint64)
    t.push(old, np.ones(1000, dtype=np.float32))
    time.sleep(0.05)  # a few 10 ms ticks: the old rows are older
    t.push(new, np.full(100, 2, dtype=np.float32))
    deadline = time.time() + 20
    while t.peek(old).any() and time.time() < deadline:
        time.sleep(0.02)
    np.testing.assert_array_equal(t.peek(old).ravel(), np.zeros(1000, dtype=np.float32))
    np.testing.assert_array_equal(t.peek(new).ravel(), np.full(100, 2, dtype=np.float32))
    with pytest.raises(downpour.DownpourError, match="lru:MAX_ROWS"):
        s.table(6, "bad", evict="lru:0")
    s.finish()
    cluster.wait()


def _a_change_tracking_table(values):
    """An embedded cluster of 2 servers, a session, and table 7 ("emb", rows of 4, changes
    tracked) holding `values` (one row each) under as many scrambled keys, sorted."""
    cluster = downpour.embedded(servers=2)
    s = cluster.join()
    t = s.table(7, "emb", value_len=4, changes=True)
    keys = downpour.scramble(np.arange(len(values), dtype=np.uint64))
    keys.sort()
    t.push(keys, values)
    return cluster, s, t, keys


def test_a_session_exports_a_full_model_then_deltas_of_what_changed(tmp_path):
    import json
    import struct

    cluster, s, t, keys = _a_change_tracking_table(np.ones((1000, 4), dtype=np.float32))
    out = str(tmp_path / "exp")
    # (rows written in the 10 ms tick of an export's cut are in the next delta too)
    time.sleep(0.05)
    first = s.export(out, [7], skew_ms=0)
    assert first["kind"] == "full" and first["rows"] == 1000
    time.sleep(0.05)  # past the full export's 10 ms tick
    t.push(keys[:25], np.ones((25, 4), dtype=np.float32))
    second = s.export(out, [7])
    assert second["kind"] == "delta" and second["rows"] == 25 and second["since_ms"] > 0
    manifest = json.loads((tmp_path / "exp" / "manifest.json").read_text())
    assert [e["file"] for e in manifest["exports"]] == [first["file"], second["file"]]
    # a safetensors file: its header names the delta's tensors
    raw = (tmp_path / "exp" / second["file"]).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    assert header["table7.keys"]["shape"] == [25] and header["table7.values"]["shape"] == [25, 4]
    assert header["__metadata__"]["kind"] == "delta"
    with pytest.raises(downpour.DownpourError, match="does not track changes"):
        s.table(8, "plain")
        s.export(str(tmp_path / "other"), [8])
    s.finish()
    cluster.wait()


def test_an_exported_model_is_served_and_read_back_from_python(tmp_path):
    cluster, s, t, keys = _a_change_tracking_table(np.arange(2000, dtype=np.float32).reshape(500, 4))
    out = str(tmp_path / "exp")
    time.sleep(0.05)
    s.export(out, [7], skew_ms=0)
    node = downpour.serve(out, follow_ms=20)
    try:
        c = downpour.serving(node.addr)
        assert c.tables == [(7, "emb", 4)]
        np.testing.assert_array_equal(c.pull(7, keys), t.pull(keys))
        assert node.served()[0].endswith(".safetensors")
        # a key the model never held reads as zeros; a table it does not serve is an error
        np.testing.assert_array_equal(c.pull(7, np.array([12345], dtype=np.uint64)), np.zeros((1, 4), dtype=np.float32))
        with pytest.raises(downpour.DownpourError, match="not served"):
            c.pull(8, keys)
        # a delta written later is followed: the served rows move on
        time.sleep(0.05)
        t.push(keys[:10], np.ones((10, 4), dtype=np.float32))
        s.export(out, [7])
        deadline = time.time() + 10
        want = t.pull(keys[:10])
        while time.time() < deadline and not np.array_equal(c.pull(7, keys[:10]), want):
            time.sleep(0.02)
        np.testing.assert_array_equal(c.pull(7, keys[:10]), want)
    finally:
        node.close()
    s.finish()
    cluster.wait()


def test_two_worker_threads_see_each_others_pushes_with_the_gil_released():
    cluster = downpour.embedded(servers=2, workers=2)
    keys = np.arange(0, 5000, 7, dtype=np.uint64)
    results, errors = {}, []

    def worker():
        try:
            # join returns once both workers joined: the other thread must run meanwhile
            s = cluster.join()
            t = s.table(1, "counts", value_len=1)
            t.push(keys, np.ones(len(keys), dtype=np.float32))
            s.barrier("pushed")
            results[s.rank] = t.pull(keys)
            s.finish()
        except Exception as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert not errors, errors
    assert sorted(results) == [0, 1]
    for r in results.values():
        np.testing.assert_array_equal(r.ravel(), 2.0)
    cluster.wait()


def test_bad_requests_raise_downpour_errors_with_their_messages():
    cluster = downpour.embedded(servers=1)
    s = cluster.join()
    t = s.table(1, "t", value_len=2)
    keys = np.array([1, 2], dtype=np.uint64)
    with pytest.raises(downpour.DownpourError, match="3 values for 2 keys of 2 values each"):
        t.push(keys, np.ones(3, dtype=np.float32))
    with pytest.raises(downpour.DownpourError, match="already exists with a different definition"):
        s.table(1, "t", value_len=3)
    with pytest.raises(downpour.DownpourError, match="not zeros, normal or uniform"):
        s.table(4, "u", init="gaussian")
    with pytest.raises(downpour.DownpourError, match="contiguous"):
        t.pull(keys, out=np.zeros((2, 4), dtype=np.float32)[:, ::2])
    with pytest.raises(TypeError):
        t.pull(np.array([1.0, 2.0]))
    with pytest.raises(downpour.DownpourError, match="replication"):
        downpour.embedded(servers=1, replication=2)
    s.finish()
    cluster.wait()
    with pytest.raises(downpour.DownpourError, match="closed"):
        cluster.join()


def _binary():
    for profile in ("release", "debug"):
        exe = REPO / "target" / profile / "downpour"
        if exe.exists():
            return exe
    pytest.skip("the downpour binary is not built (cargo build --release)")


def test_connect_joins_a_cluster_of_processes():
    exe = _binary()
    tmp = pathlib.Path(os.environ.get("TMPDIR", "/tmp")) / f"downpour-py-{os.getpid()}"
    tmp.mkdir(parents=True, exist_ok=True)
    addr_file = tmp / "coordinator.addr"
    addr_file.unlink(missing_ok=True)
    env = dict(os.environ, DOWNPOUR_LOG="warn")
    coord = subprocess.Popen([exe, "coordinator", "--listen", "127.0.0.1:0", "--servers", "1", "--workers", "1", "--addr-file", addr_file], env=env)
    procs = [coord]
    try:
        for _ in range(200):
            if addr_file.exists() and addr_file.read_text().strip():
                break
            time.sleep(0.05)
        addr = addr_file.read_text().strip()
        procs.append(subprocess.Popen([exe, "server", "--coordinator", addr, "--listen", "127.0.0.1:0"], env=env))
        s = downpour.connect(addr)
        t = s.table(1, "w", value_len=2, rule="add")
        keys = np.array([10, 20, 30], dtype=np.uint64)
        t.push(keys, np.full(6, 1.5, dtype=np.float32))
        np.testing.assert_array_equal(t.pull(keys), 1.5)
        s.finish()
        assert coord.wait(timeout=30) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_python_m_downpour_runs_the_command_line_tool_and_its_children():
    import sys

    help_ = subprocess.run([sys.executable, "-m", "downpour", "--help"], capture_output=True, text=True, timeout=60)
    assert help_.returncode == 0 and "launch" in help_.stdout, help_.stderr
    # launch starts its coordinator, servers and workers as `python -m downpour` processes
    run = subprocess.run(
        [sys.executable, "-m", "downpour", "--log", "warn", "launch", "--servers", "2", "--workers", "2", "--", "counter", "--keys", "500"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.count("counter: OK keys=500") == 2, run.stdout
    bad = subprocess.run([sys.executable, "-m", "downpour", "launch", "--servers", "x"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "invalid value" in bad.stderr, bad.stderr


def test_python_m_downpour_nodes_get_the_binarys_process_settings_and_the_host_keeps_its_own(tmp_path):
    """`python -m downpour` is a node like the binary: no transparent huge pages, the soft
    open-files limit at the hard one. Importing the module changes neither in this process."""
    status = pathlib.Path(f"/proc/{os.getpid()}/status")
    if not status.exists() or "THP_enabled:" not in status.read_text():
        pytest.skip("the kernel reports no THP_enabled")

    def thp(pid):
        line = [l for l in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines() if l.startswith("THP_enabled:")]
        return line[0].split()[1]

    def nofile(pid):
        line = [l for l in pathlib.Path(f"/proc/{pid}/limits").read_text().splitlines() if l.startswith("Max open files")]
        soft, hard = line[0].split()[3:5]
        return soft, hard

    ours = (thp(os.getpid()), nofile(os.getpid()))
    addr_file = tmp_path / "coordinator.addr"
    py = [sys.executable, "-m", "downpour"]
    coord = subprocess.Popen([*py, "coordinator", "--listen", "127.0.0.1:0", "--servers", "1", "--workers", "1", "--addr-file", str(addr_file)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(400):
            if addr_file.exists() and addr_file.read_text().endswith("\n"):
                break
            time.sleep(0.05)
        assert thp(coord.pid) == "0"
        soft, hard = nofile(coord.pid)
        assert soft == hard, (soft, hard)
    finally:
        coord.kill()
        coord.wait()
    assert (thp(os.getpid()), nofile(os.getpid())) == ours


def test_the_readme_example_runs():
    text = (REPO / "README.md").read_text()
    block = text.split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(block, "README.md", "exec"), {})


def test_unsorted_keys_and_a_lost_server_raise_errors_not_crashes(tmp_path):
    addr_file = tmp_path / "coordinator.addr"
    env = dict(os.environ, DOWNPOUR_LOG="warn")
    py = [sys.executable, "-m", "downpour"]
    coord = subprocess.Popen([*py, "coordinator", "--listen", "127.0.0.1:0", "--servers", "1", "--workers", "1", "--addr-file", str(addr_file)], env=env)
    procs = [coord]
    try:
        for _ in range(400):
            if addr_file.exists() and addr_file.read_text().endswith("\n"):
                break
            time.sleep(0.05)
        addr = addr_file.read_text().strip()
        server = subprocess.Popen([*py, "server", "--coordinator", addr, "--listen", "127.0.0.1:0"], env=env)
        procs.append(server)
        s = downpour.connect(addr)
        t = s.table(1, "w")
        keys = np.array([1, 2], dtype=np.uint64)
        t.push(keys, np.ones(2, dtype=np.float32))
        with pytest.raises(downpour.DownpourError, match="sorted and unique"):
            t.push(keys[::-1].copy(), np.ones(2, dtype=np.float32))
        server.kill()
        server.wait()
        with pytest.raises(downpour.DownpourError, match="server 0"):
            t.pull(keys)  # an unreplicated job's server is gone: an exception naming it
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
