"""Every public method of Client and Tensor, progress, threads, the GIL, the
TPORT_* defaults, and how the library is found."""
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import tensorport as tp
from conftest import PYTHON_DIR, REPO, torch_or_skip


def test_put_options_and_tensor_attributes(client):
    a = np.arange(24, dtype=np.uint8).reshape(1, 2, 3, 4)
    t = client.put(a, name="img-attrs", device="sim:0", dtype="float16",
                   memory_format="channels_last", ttl=120)
    assert len(t.ref) == 32 and int(t.ref, 16) >= 0
    assert t.name == "img-attrs"
    assert (t.dtype, t.shape, t.strides, t.storage_offset) == ("float16", (1, 2, 3, 4),
                                                               (24, 1, 8, 2), 0)
    assert t.device == "sim:0" and t.memory_format == "channels_last"
    assert t.suggested_memory_format == "channels_last"
    assert t.is_contiguous() is False and t.nbytes == 48 and t.ndim == 4
    assert t.numel() == 24 and t.element_size() == 2 and t.client is client
    info = t.info()
    assert isinstance(info, tp.TensorInfo) and info.ref == t.ref and info.name == "img-attrs"
    assert info.storage_nbytes == 48 and not info.managed and not info.conj and not info.neg
    now_ms = time.time() * 1000
    assert now_ms + 100_000 < info.expires_unix_ms < now_ms + 140_000
    assert "img-attrs" in repr(t) and t.ref in repr(t)
    assert np.array_equal(client.get("img-attrs"), a.astype(np.float16))
    t.free()


def test_put_spellings_of_dtype_format_and_device(client):
    torch = torch_or_skip()
    x = np.ones((2, 3, 4, 5), np.float32)
    for dtype in ("half", torch.float16, np.float16, "torch.float16"):
        assert client.put(x, dtype=dtype).dtype == "float16"
    for fmt in (torch.channels_last, "channels_last"):
        assert client.put(x, memory_format=fmt).memory_format == "channels_last"
    assert client.put(x, device=torch.device("cpu")).device == "cpu"
    with pytest.raises(tp.InvalidArgument, match="not a dtype"):
        client.put(x, dtype="float8")
    with pytest.raises(tp.InvalidArgument, match="not a memory format"):
        client.put(x, memory_format="nhwc")


def test_put_non_blocking_then_sync(client):
    x = np.random.default_rng(1).standard_normal((64, 1024))
    t = client.put(x, device="sim:0", non_blocking=True)
    t.sync()
    client.sync()
    assert np.array_equal(t.numpy(), x)


def test_put_managed(client):
    t = client.put(np.ones(10, np.float32), device="sim:0", managed=True)
    assert t.info().managed


def test_tensor_list_free_and_names(client):
    t = client.put(np.arange(6).reshape(2, 3), name="listed")
    u = client.put(np.arange(3))
    by_ref = {x.ref: x for x in client.list()}
    assert t.ref in by_ref and u.ref in by_ref and by_ref[t.ref].name == "listed"
    assert client.tensor("listed").ref == t.ref
    assert client.tensor(t.ref).name == "listed"
    assert client.tensor(u.ref).shape == (3,)
    client.free("listed")
    with pytest.raises(tp.NotFound):
        client.tensor("listed")
    client.free(u.ref)
    with pytest.raises(tp.NotFound):
        u.info()


def test_list_by_prefix_gives_the_named_tensors_under_it_by_name(server):
    with tp.Client(server.url, tenant="list-prefix") as c, \
            tp.Client(server.url, tenant="list-prefix-other") as other:
        for name in ("run/7/b", "run/7/a", "run/70", "run/8/a"):
            c.put(np.arange(3), name=name, ttl=60)
        unnamed = c.put(np.arange(2))  # in list() alone (held: a dropped one is freed)
        other.put(np.arange(2), name="run/7/c", ttl=60)
        assert [t.name for t in c.list("run/7/")] == ["run/7/a", "run/7/b"]
        assert [t.name for t in c.list("run/7")] == ["run/7/a", "run/7/b", "run/70"]
        assert [t.name for t in c.list("")] == ["run/7/a", "run/7/b", "run/70", "run/8/a"]
        assert len(c.list()) == 5 and unnamed.ref in {t.ref for t in c.list()}
        assert c.list("nothing/") == []
        assert c.list("run/8/")[0].shape == (3,)
        with pytest.raises(tp.InvalidArgument):
            c.list(7)


def test_view_and_views_share_storage(client):
    t = client.put(np.arange(12, dtype=np.int32), device="sim:1")
    v = t.view((3, 2), (4, 1), storage_offset=1)
    assert v.shape == (3, 2) and v.strides == (4, 1) and v.storage_offset == 1
    assert np.array_equal(v.numpy(), np.arange(12).reshape(3, 4)[:, 1:3])
    w = t.view((4, 3))  # contiguous strides by default
    assert w.strides == (3, 1)
    v.copy_(np.zeros((3, 2), np.int32))
    assert t.numpy()[1] == 0 and t.numpy()[5] == 0 and t.numpy()[3] == 3
    named = t.view((12,), (1,), name="the-view")
    assert named.name == "the-view"
    named.free()
    with pytest.raises(tp.InvalidArgument):
        t.view((3, 2), (1,))


def test_to_contiguous_and_their_options(client):
    torch = torch_or_skip()
    x = torch.randn(2, 3, 4, 5)
    t = client.put(x, device="sim:0")
    u = t.to("sim:1", "float64", memory_format="channels_last", name="to-named", ttl=60)
    assert u.device == "sim:1" and u.dtype == "float64" and u.name == "to-named"
    assert u.strides == x.to(torch.float64, memory_format=torch.channels_last).stride()
    assert t.to(copy=True) is not t
    assert t.to(non_blocking=True) is t
    assert u.contiguous() is not u and u.contiguous("channels_last") is u
    c = u.contiguous(name="cont-named")
    assert c.name == "cont-named" and c.is_contiguous()
    assert torch.equal(c.torch(), x.double())
    u.free()
    c.free()


def test_get_and_get_torch_by_every_kind_of_ref(client):
    torch = torch_or_skip()
    x = torch.randn(3, 4)
    t = client.put(x, name="by-ref")
    for ref in (t, t.ref, "by-ref"):
        assert np.array_equal(client.get(ref), x.numpy())
        assert torch.equal(client.get_torch(ref), x)
    with pytest.raises(tp.InvalidArgument):
        client.get(42)
    t.free()


def test_devices_and_stats(client):
    devs = client.devices()
    assert isinstance(devs, tp.DeviceList)
    names = [d.device for d in devs]
    # cpu, then every CUDA device the machine has (tportd serves them whatever
    # --devices says; none here without a GPU), then the two sim devices
    cuda = names[1:-2]
    assert names == ["cpu"] + cuda + ["sim:0", "sim:1"]
    assert cuda == ["cuda:%d" % i for i in range(len(cuda))]
    # why there is none, exactly when there is none
    assert isinstance(devs.cuda_unavailable_reason, str)
    assert bool(devs.cuda_unavailable_reason) == (not cuda), devs.cuda_unavailable_reason
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and torch.cuda.is_available():  # the same machine, another runtime
        assert len(cuda) == torch.cuda.device_count()
    sim0 = devs[names.index("sim:0")]
    assert isinstance(sim0, tp.DeviceInfo) and sim0.total_bytes > 0
    assert sim0.peers == ("sim:1",) and sim0.managed_memory
    for d in devs[1:1 + len(cuda)]:
        assert d.total_bytes > 0 and d.managed_memory and d.name and d.compute_capability
    # free memory tells of other tenants' use: None to a tenant that is not
    # an operator (not 0, which would read as a full device), a number to one
    assert all(d.free_bytes is None for d in devs), devs
    with tp.Client(client.url, tenant="ops") as ops:
        assert all(isinstance(d.free_bytes, int) for d in ops.devices())
        assert ops.devices()[names.index("sim:0")].free_bytes > 0
    held = client.put(np.ones(5))  # an unnamed tensor lives as long as its object
    st = client.stats()
    assert isinstance(st, dict) and st["tensors"] >= 1 and held.numel() == 5
    assert all(isinstance(k, str) and isinstance(v, int) for k, v in st.items())


def test_context_managers_and_close(server):
    with tp.Client(server.url) as c:
        with c.put(np.ones(3), name="ctx-freed") as t:
            assert c.tensor("ctx-freed").ref == t.ref
        with pytest.raises(tp.NotFound):
            c.tensor("ctx-freed")
        assert not c.closed and "ipc://" in repr(c)
    assert c.closed and "closed" in repr(c)
    c.close()  # again: nothing
    with pytest.raises(tp.FailedPrecondition, match="closed"):
        c.put(np.ones(3))
    with pytest.raises(tp.FailedPrecondition):
        t.info()


def test_progress_callable(server, monkeypatch):
    # by socket: chunk by chunk (through a same-host region too for a put
    # that is not converted; a get through one reports once, whole)
    client = tp.Client(server.url, shm=False)
    seen = []
    x = np.random.default_rng(2).standard_normal(3_000_000)  # 24 MB: several chunks
    t = client.put(x, progress=lambda done, total: seen.append((done, total)))
    assert len(seen) > 1 and seen[-1] == (x.nbytes, x.nbytes)
    assert all(a[0] < b[0] for a, b in zip(seen, seen[1:]))
    assert all(s[1] == x.nbytes for s in seen)
    seen.clear()
    assert np.array_equal(client.get(t, progress=lambda d, n: seen.append((d, n))), x)
    assert len(seen) > 1 and seen[-1] == (x.nbytes, x.nbytes)
    torch = torch_or_skip()
    seen.clear()
    y = client.get_torch(t, progress=lambda d, n: seen.append(d))
    assert seen[-1] == x.nbytes and torch.equal(y, torch.from_numpy(x))
    # small tensors report once, whole
    seen.clear()
    client.put(np.ones(3), progress=lambda d, n: seen.append((d, n)))
    assert seen == [(24, 24)]
    client.close()
    with tp.Client(server.url) as c:
        seen.clear()
        t = c.put(x, progress=lambda d, n: seen.append((d, n)))
        # read by tportd from this process's memory, up to 32 MiB a request:
        # 24 MB reports once, whole
        assert seen and seen[-1] == (x.nbytes, x.nbytes)
        assert all(a[0] < b[0] for a, b in zip(seen, seen[1:]))
        # written by tportd straight into this process's memory: once, whole
        seen.clear()
        assert np.array_equal(c.get(t, progress=lambda d, n: seen.append((d, n))), x)
        assert seen == [(x.nbytes, x.nbytes)]
    monkeypatch.setenv("TPORT_SHM_DIRECT", "0")
    with tp.Client(server.url) as c:
        t = c.put(x)
        # through the automatic region a chunk at a time: progress per chunk
        seen.clear()
        assert np.array_equal(c.get(t, progress=lambda d, n: seen.append((d, n))), x)
        assert len(seen) > 1 and seen[-1] == (x.nbytes, x.nbytes)
        assert all(a[0] < b[0] for a, b in zip(seen, seen[1:]))


def test_progress_bar_with_tqdm(client, capfd):
    pytest.importorskip("tqdm", reason="python3-tqdm is not installed "
                        "(deploy/install-deps.sh installs it)")
    x = np.zeros(3_000_000)
    t = client.put(x, progress=True)
    client.get(t, progress=True)
    err = capfd.readouterr().err
    assert "put" in err and "get" in err and "22.9M" in err


def test_progress_exception_is_raised_after_the_transfer(client):
    before = {t.ref for t in client.list()}

    def boom(done, total):
        raise KeyError("from the callback")

    with pytest.raises(KeyError, match="from the callback"):
        client.put(np.zeros(1_000_000), progress=boom)
    assert {t.ref for t in client.list()} == before  # the tensor it made was freed
    t = client.put(np.zeros(1_000_000))
    with pytest.raises(KeyError):
        client.get(t, progress=boom)
    with pytest.raises(tp.InvalidArgument):
        client.put(np.zeros(3), progress="yes")


def test_close_from_a_callback_is_refused(server):
    c = tp.Client(server.url)
    got = []

    def close_it(done, total):
        try:
            c.close()
        except tp.FailedPrecondition as e:
            got.append(e)

    c.put(np.zeros(10), progress=close_it)
    assert got and not c.closed
    c.close()


def test_many_threads_share_one_client(client):
    errors = []

    def work(k):
        rng = np.random.default_rng(k)
        try:
            for i in range(8):
                a = rng.standard_normal((rng.integers(1, 300), 257)).astype(np.float32)
                t = client.put(a.T, device="sim:%d" % (i % 2))
                u = t.to(dtype="float64")
                assert np.array_equal(client.get(u), a.T.astype(np.float64))
                t.free()
                u.free()
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors


def test_close_waits_for_calls_in_flight(server):
    c = tp.Client(server.url)
    x = np.zeros(4_000_000)
    results = []

    def work():
        try:
            for _ in range(20):
                results.append(c.get(c.put(x)).shape)
        except tp.FailedPrecondition:
            results.append("closed")

    th = threading.Thread(target=work)
    th.start()
    time.sleep(0.05)
    c.close()
    th.join()
    assert results and all(r in ((4_000_000,), "closed") for r in results)


def test_the_gil_is_released_during_transfers(server):
    # With no forced GIL switches (a switch interval of a minute), this thread
    # runs during a put on another thread only if the C call let go of the
    # GIL: ctypes' CDLL does (a PyDLL would not), and the progress callbacks
    # take it back.  sleep(0) hands the GIL over whenever a callback wants it.
    x = np.zeros(64 << 17)  # 64 MiB, 16 chunks (by socket: a region reports once)
    client = tp.Client(server.url, shm=False)
    spins = [0]
    marks = []

    th = threading.Thread(target=lambda: client.put(x, progress=lambda d, n: marks.append(
        spins[0])))
    old = sys.getswitchinterval()
    sys.setswitchinterval(60)
    try:
        th.start()
        while th.is_alive():
            spins[0] += 1
            time.sleep(0)
    finally:
        sys.setswitchinterval(old)
    th.join()
    client.close()
    assert len(marks) > 4
    assert marks[-1] - marks[0] > 20, marks  # 0 with the GIL held; ~500 here


def test_defaults_from_the_environment(server, monkeypatch):
    monkeypatch.setenv("TPORT_URL", server.url)
    monkeypatch.setenv("TPORT_TENANT", "env-tenant")
    with tp.Client() as c:
        assert c.url == server.url and c.tenant == "env-tenant"
        c.put(np.ones(2), name="tenant-scoped")
        with tp.Client(server.url, tenant="other") as o:
            with pytest.raises(tp.NotFound):
                o.tensor("tenant-scoped")  # tenants are isolated
        assert c.tensor("tenant-scoped").name == "tenant-scoped"
        c.free("tenant-scoped")
    monkeypatch.setenv("TPORT_URL", "")  # empty is unset, as for the tool
    monkeypatch.delenv("TPORT_TENANT")
    assert tp.DEFAULT_URL == "tcp://127.0.0.1:7450"
    try:
        with tp.Client(timeout=2) as c:  # a tportd of someone's `make run`, maybe
            assert c.url == tp.DEFAULT_URL and c.tenant == "default"
    except tp.Unavailable as e:
        assert tp.DEFAULT_URL in str(e)


def test_verify_and_timeout_options(server, monkeypatch):
    monkeypatch.setenv("TPORT_VERIFY", "1")
    x = np.random.default_rng(3).standard_normal((5, 700, 1000))  # chunks with CRC32C
    with tp.Client(server.url, timeout=30) as c:
        assert c._conf["verify"] and c._conf["timeout_ms"] == 30000
        assert np.array_equal(c.get(c.put(x)), x)


def test_same_host_shared_memory(server, monkeypatch):
    """A local client moves large tensors through a region (the server counts
    them); shm=False and TPORT_SHM=0 keep them on the socket."""
    x = np.random.default_rng(4).standard_normal((2, 3, 256, 512)).astype(np.float32)
    with tp.Client(server.url, tenant="ops") as ops:
        def moved():
            return ops.stats()["shm_transfers"]
        before = moved()
        with tp.Client(server.url) as c:
            t = c.put(x, dtype="float16", memory_format="channels_last")
            assert np.array_equal(c.get(t), x.astype(np.float16))
            assert np.array_equal(c.get(c.put(x)), x)
        assert moved() == before + 4
        with tp.Client(server.url, shm=False) as c:
            assert np.array_equal(c.get(c.put(x)), x)
        monkeypatch.setenv("TPORT_SHM", "0")
        with tp.Client(server.url) as c:
            assert np.array_equal(c.get(c.put(x)), x)
        assert moved() == before + 4


def _python(code, env):
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=60, cwd=PYTHON_DIR)


def test_library_not_found_lists_what_was_tried(tmp_path):
    env = dict(os.environ, TPORT_LIBRARY=str(tmp_path / "nope.so"))
    p = _python("import tensorport as tp\n"
                "try:\n  tp.Client('ipc:///nowhere')\n"
                "except tp.LibraryNotFoundError as e:\n  print(e)\n", env)
    assert p.returncode == 0, p.stderr
    assert "cannot load libtport" in p.stdout and str(tmp_path / "nope.so") in p.stdout
    assert "TPORT_LIBRARY" in p.stdout


def test_a_sanitized_library_is_refused_not_loaded(tmp_path):
    fake = tmp_path / "libtport.so"
    fake.write_bytes(b"\x7fELF...NEEDED libasan.so.8...")  # dlopen would abort the process
    env = dict(os.environ, TPORT_LIBRARY=str(fake))
    p = _python("import tensorport._lib as l\n"
                "try:\n  l.load()\nexcept ImportError as e:\n  print(e)\n", env)
    assert p.returncode == 0 and "built with a sanitizer (needs libasan preloaded)" in p.stdout


def test_library_found_in_the_build_tree():
    env = {k: v for k, v in os.environ.items() if k != "TPORT_LIBRARY"}
    p = _python("import tensorport._lib as l; print('\\n'.join(l.candidates()))", env)
    cands = p.stdout.split()
    tree = [c for c in cands if c.startswith(os.path.join(REPO, "build"))]
    assert tree, cands
    assert cands.index(tree[0]) < cands.index("libtport.so.0")
    if os.path.exists(os.path.join(REPO, "build", "lib", "libtport.so")):
        assert tree[0] == os.path.join(REPO, "build", "lib", "libtport.so")


def test_public_names_have_docstrings():
    import inspect

    for name in tp.__all__:
        obj = getattr(tp, name)
        if name.startswith("__") or isinstance(obj, (str, tuple)):
            continue
        assert inspect.getdoc(obj), name
        if inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if not attr.startswith("_") or attr in ("__dlpack__", "__dlpack_device__",
                                                        "__exit__"):
                    if callable(member) or isinstance(member, property):
                        assert inspect.getdoc(member), "%s.%s" % (name, attr)
