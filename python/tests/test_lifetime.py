"""A tensor goes when its client closes, unless it is named or kept."""
import time

import numpy as np
import pytest

import tensorport as tp


def gone(client, ref, seconds=10):
    """True once ref is NOT_FOUND (a closed connection is cleaned up asynchronously)."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            client.tensor(ref)
        except tp.NotFound:
            return True
        time.sleep(0.02)
    return False


def test_unnamed_go_with_their_client_named_and_kept_stay(server):
    a = tp.Client(server.url, tenant="life")
    x = np.arange(10.0)
    unnamed = a.put(x, device="sim:0")
    converted = unnamed.to(dtype="float32")  # made on the server: connection-scoped too
    viewed = unnamed.view((5,), (2,))
    named = a.put(x, name="life-named", ttl=60)
    kept = a.put(x, keep=True, device="sim:1")
    kept_to = a.put(x).to(dtype="int32", name="life-to-named")
    refs = [t.ref for t in (unnamed, converted, viewed, named, kept, kept_to)]
    a.close()
    with tp.Client(server.url, tenant="life") as b:
        assert gone(b, refs[0]) and gone(b, refs[1]) and gone(b, refs[2])
        assert np.array_equal(b.get("life-named"), x)
        assert b.tensor(refs[3]).name == "life-named"
        k = b.tensor(refs[4])
        assert k.device == "sim:1" and k.name is None and k.info().expires_unix_ms > 0
        assert np.array_equal(k.numpy(), x)
        assert np.array_equal(b.get("life-to-named"), x.astype(np.int32))
        for r in refs[3:]:
            b.free(r)


def test_a_keeping_client_keeps_everything(server):
    with tp.Client(server.url, tenant="life2", keep=True) as a:
        t = a.put(np.ones(4))
        u = t.to(dtype="float16")
        refs = [t.ref, u.ref]
    with tp.Client(server.url, tenant="life2") as b:
        for r in refs:
            assert b.tensor(r).shape == (4,)
            b.free(r)


def test_a_dropped_client_is_closed_by_the_garbage_collector(server):
    import gc

    a = tp.Client(server.url, tenant="life3")
    ref = a.put(np.ones(3)).ref
    del a
    gc.collect()
    with tp.Client(server.url, tenant="life3") as b:
        assert gone(b, ref)


def test_free_is_for_the_tenant_only(server):
    with tp.Client(server.url, tenant="life4") as a, tp.Client(server.url, tenant="other4") as o:
        t = a.put(np.ones(3), name="mine")
        with pytest.raises(tp.NotFound):
            o.free(t.ref)  # another tenant's handle is "not found"
        with pytest.raises(tp.NotFound):
            o.get("mine")
        assert a.tensor("mine").ref == t.ref
        t.free()


def test_a_buffer_tportd_may_still_write_is_kept():
    # a get written straight into a buffer this package made (over ipc://)
    # that failed without its answer may still be written by tportd: that
    # buffer is kept for good, never freed and reused; one that failed
    # otherwise goes as usual
    import gc
    import weakref

    from tensorport import _lifetime
    from tensorport.errors import DeadlineExceeded, NotFound, Unavailable

    class Buf:
        pass

    late, lost, gone = Buf(), Buf(), Buf()
    refs = [weakref.ref(b) for b in (late, lost, gone)]
    _lifetime.keep_if_written_late(late, DeadlineExceeded("the write may still land"))
    _lifetime.keep_if_written_late(lost, Unavailable("the connection was lost"))
    _lifetime.keep_if_written_late(gone, NotFound("no such tensor"))
    del late, lost, gone
    gc.collect()
    assert [r() is not None for r in refs] == [True, True, False]
