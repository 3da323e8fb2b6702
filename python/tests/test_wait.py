"""Waiting for a name, atomic replace, and tensors freed when Python drops them."""
import gc
import threading

import numpy as np
import pytest

import tensorport as tp


def waiting(client, n, seconds=20):
    """Waits (by Stats, not by guess) until n requests of the tenant wait for names."""
    import time

    deadline = time.time() + seconds
    while time.time() < deadline:
        if client.stats().get("waiting_for_names") == n:
            return True
        time.sleep(0.01)
    return False


def test_get_and_info_wait_for_a_later_put(server):
    with tp.Client(server.url, tenant="wait") as c, tp.Client(server.url, tenant="wait") as p:
        got = {}

        def consume():
            got["info"] = c.info("w-later", wait=20)
            got["values"] = c.get("w-later", wait=20)

        th = threading.Thread(target=consume)
        th.start()
        assert waiting(p, 1)
        x = np.arange(100000, dtype=np.float32)
        p.put(x, name="w-later", ttl=60)
        th.join(30)
        assert got["info"].shape == (100000,) and got["info"].name == "w-later"
        assert np.array_equal(got["values"], x)
        with pytest.raises(tp.DeadlineExceeded):
            c.info("w-never", wait=0.2)
        with pytest.raises(tp.DeadlineExceeded):
            c.get("w-never", wait=0.1)
        with pytest.raises(tp.DeadlineExceeded):  # the units' strings, as tport --wait
            c.info("w-never", wait="150ms")
        with pytest.raises(tp.NotFound):
            c.get("w-never")
        with pytest.raises(tp.InvalidArgument):
            c.info("w-never", wait=-1)


def test_put_replace_swaps_the_name(server):
    with tp.Client(server.url, tenant="replace") as c:
        old = c.put(np.ones(1000, np.float32), name="r-latest", ttl=60)
        with pytest.raises(tp.AlreadyExists):
            c.put(np.zeros(1000, np.float32), name="r-latest")
        new = c.put(np.full(1000, 2, np.float32), name="r-latest", replace=True, ttl=60)
        assert new.ref != old.ref and c.info("r-latest").ref == new.ref
        assert np.array_equal(c.get("r-latest"), np.full(1000, 2, np.float32))
        with pytest.raises(tp.NotFound):
            c.info(old.ref)
        c.free("r-latest")


def test_readers_by_name_see_whole_versions_while_it_is_replaced(server):
    with tp.Client(server.url, tenant="replace-r") as w:
        w.put(np.zeros(1 << 17, np.float32), name="r-v", replace=True, ttl=60)
        stop, bad, reads = threading.Event(), [], [0]

        def read():
            with tp.Client(server.url, tenant="replace-r") as r:
                while not stop.is_set():
                    v = r.get("r-v")
                    reads[0] += 1
                    if not (v == v[0]).all():
                        bad.append(v[0])

        ths = [threading.Thread(target=read) for _ in range(2)]
        for t in ths:
            t.start()
        for i in range(1, 21):
            w.put(np.full(1 << 17, i, np.float32), name="r-v", replace=True, ttl=60)
        stop.set()
        for t in ths:
            t.join(60)
        assert not bad and reads[0] > 0
        w.free("r-v")


def test_dropped_tensors_are_freed_in_batches(server):
    with tp.Client(server.url, tenant="gc") as c, tp.Client(server.url, tenant="ops") as op:
        kept = c.put(np.arange(4.0), keep=True)
        named = c.put(np.arange(4.0), name="gc-named", ttl=60)
        frees = op.stats()["requests_Free"]
        for i in range(100):
            t = c.put(np.full(16, i, np.float32))
            del t
        gc.collect()
        c.flush_frees()
        assert c.stats()["tensors"] == 2, "only the kept and the named one are left"
        rounds = op.stats()["requests_Free"] - frees
        assert 1 <= rounds <= 3, "%d Free round trips for 100 dropped tensors" % rounds
        # what was kept, named or reached by name is never freed by a collection
        for t in (c.tensor("gc-named"), c.tensor(kept.ref)):
            del t
        del kept, named
        gc.collect()
        assert c.flush_frees() == 0 and c.stats()["tensors"] == 2
        c.free("gc-named")


def test_an_alias_in_python_keeps_its_tensor(server):
    with tp.Client(server.url, tenant="gc-alias") as c:
        t = c.put(np.arange(8.0))
        same = c.tensor(t.ref)
        assert same is t, "one object per handle the client made"
        v = t.view((4,), (2,))
        ref = t.ref
        del t, same
        gc.collect()
        c.flush_frees()
        with pytest.raises(tp.NotFound):
            c.tensor(ref)
        assert np.array_equal(v.numpy(), np.arange(0.0, 8.0, 2.0)), "a view has its own handle"
        explicit = c.put(np.arange(3.0))
        explicit.free()
        del explicit
        gc.collect()
        assert c.flush_frees() == 0, "an explicit free is not queued again"


def test_a_wait_may_be_a_timedelta(server):
    import datetime

    with tp.Client(server.url, tenant="wait") as c:
        with pytest.raises(tp.DeadlineExceeded):
            c.info("w-td-never", wait=datetime.timedelta(milliseconds=100))
