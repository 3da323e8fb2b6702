"""Futures (Client.put_async ...), state dicts (put_dict/get_dict) and tensorport.aio."""
import asyncio
import concurrent.futures
import gc
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import tensorport as tp
from tensorport import aio


def resnet50_shapes():
    """torchvision's resnet50 parameter shapes (as bench/bench_pipeline.c makes them):
    the stem, 16 bottlenecks in layers of 3, 4, 6, 3, the classifier."""
    shapes = []

    def conv_bn(out, inp, k):
        shapes.extend([(out, inp, k, k), (out,), (out,)])

    conv_bn(64, 3, 7)
    inp = 64
    for layer, blocks in enumerate((3, 4, 6, 3)):
        planes = 64 << layer
        for b in range(blocks):
            conv_bn(planes, inp, 1)
            conv_bn(planes, planes, 3)
            conv_bn(planes * 4, planes, 1)
            if b == 0:
                conv_bn(planes * 4, inp, 1)
            inp = planes * 4
    shapes += [(1000, 2048), (1000,)]
    return shapes


def resnet50_state_dict(seed=1):
    rng = np.random.default_rng(seed)
    return {"p%03d" % i: rng.standard_normal(s, dtype=np.float32)
            for i, s in enumerate(resnet50_shapes())}


def test_the_resnet50_shapes_are_torchvisions():
    shapes = resnet50_shapes()
    assert len(shapes) == 161
    assert sum(int(np.prod(s)) for s in shapes) == 25557032


# ---------------------------------------------------------------- futures


def test_futures_resolve_with_exact_values(server):
    with tp.Client(server.url, tenant="fut") as c:
        x = np.arange(300000, dtype=np.float64).reshape(300, 1000)
        f = c.put_async(x)
        assert isinstance(f, concurrent.futures.Future)
        t = f.result(30)
        assert isinstance(t, tp.Tensor) and t.shape == (300, 1000) and t.dtype == "float64"
        assert np.array_equal(c.get_async(t).result(30), x)
        named = c.put_async(np.arange(10, dtype=np.int32), name="fut-named", ttl=60).result(30)
        assert named.name == "fut-named"
        assert np.array_equal(c.get_async("fut-named").result(30), np.arange(10, dtype=np.int32))
        assert np.array_equal(c.get_async(named.ref).result(30), np.arange(10, dtype=np.int32))
        dst = c.put(np.zeros(10, np.int32))
        assert c.copy_async(dst, "fut-named").result(30) is None
        assert np.array_equal(c.get(dst), np.arange(10, dtype=np.int32))
        c.free("fut-named")


def test_many_futures_in_flight(server):
    with tp.Client(server.url, tenant="fut") as c:
        xs = [np.full(1000 + i, i, dtype=np.int64) for i in range(200)]
        puts = [c.put_async(x) for x in xs]
        ts = [f.result(60) for f in puts]
        gets = [c.get_async(t) for t in ts]
        for x, g in zip(xs, concurrent.futures.as_completed(gets, 60) and gets):
            assert np.array_equal(g.result(60), x)


def test_a_tensor_dropped_while_its_get_runs_is_not_freed_under_it(server):
    with tp.Client(server.url, tenant="fut-drop", shm=False) as c:
        x = np.arange(1 << 20, dtype=np.int32)
        busy = c.put(np.ones(64 << 20, np.uint8))
        for _ in range(3):
            ahead = [c.get_async(busy) for _ in range(8)]  # the library threads are busy
            f = c.get_async(c.put(x))  # the Tensor is garbage at once
            gc.collect()
            c.flush_frees()  # would free it on the server before its get starts
            assert np.array_equal(f.result(60), x)
            concurrent.futures.wait(ahead, 60)


def test_an_error_resolves_the_future_with_its_class(server):
    with tp.Client(server.url, tenant="fut") as c:
        f = c.get_async("fut-no-such-name")
        with pytest.raises(tp.NotFound) as e:
            f.result(30)
        assert "fut-no-such-name" in str(e.value)
        c.put(np.zeros(4, np.float32), name="fut-taken", ttl=60)
        with pytest.raises(tp.AlreadyExists):
            c.put_async(np.zeros(4, np.float32), name="fut-taken").result(30)
        c.free("fut-taken")


def test_cancel_a_large_get_in_the_middle(server):
    with tp.Client(server.url, tenant="fut", shm=False) as c:
        big = c.put(np.ones(64 << 20, dtype=np.uint8))  # 64 MiB: many chunks
        seen = []
        for delay in (0, 0.002, 0.005, 0.01, 0.02):
            f = c.get_async(big)
            time.sleep(delay)  # into the transfer (or not yet: either way it ends)
            f.cancel()
            done, _ = concurrent.futures.wait([f], 60)  # a cancel wakes wait() too
            assert f in done
            seen.append(f.cancelled())
            if f.cancelled():
                with pytest.raises(concurrent.futures.CancelledError):
                    f.result()
                assert not f.cancel()
            else:
                assert f.result().sum() == 64 << 20  # it was past the point of no return
        assert any(seen)
        # the connection is whole after the cancels
        assert np.array_equal(c.get(c.put(np.arange(5))), np.arange(5))


def test_a_cancelled_put_leaves_nothing(server):
    with tp.Client(server.url, tenant="fut-cancel", shm=False) as c:
        f = c.put_async(np.ones(64 << 20, dtype=np.uint8), name="fut-cancelled")
        time.sleep(0.005)
        f.cancel()
        done, _ = concurrent.futures.wait([f], 60)
        assert f in done
        if f.cancelled():
            with pytest.raises(tp.NotFound):
                c.info("fut-cancelled")
        else:
            c.free("fut-cancelled")


def test_close_completes_the_requests_in_flight(server):
    c = tp.Client(server.url, tenant="fut", shm=False)
    t = c.put(np.ones(64 << 20, dtype=np.uint8))
    fs = [c.get_async(t) for _ in range(8)]
    c.close()
    for f in fs:
        assert f.done()
        if not f.cancelled() and f.exception() is not None:
            assert isinstance(f.exception(), tp.Error)


def test_a_raising_done_callback_never_crashes(server):
    script = r"""
import sys, threading, numpy as np
sys.path.insert(0, %r)
import tensorport as tp
with tp.Client(%r, tenant="fut") as c:
    hit = threading.Event()
    # a callback added to a done future runs at once in the adding thread,
    # where concurrent.futures lets a BaseException through: raise on
    # libtport's threads only
    def bad(f):
        if threading.current_thread() is not threading.main_thread():
            hit.set()
            raise SystemExit("raised in a done-callback")
    def worse(f):
        if threading.current_thread() is not threading.main_thread():
            raise KeyboardInterrupt
    fs = [c.put_async(np.ones(32 << 20, np.uint8))]
    fs += [c.put_async(np.arange(1000)) for _ in range(20)]
    late = c.info_async("cb-late-raising", wait=30)  # done only after the put below
    for f in fs + [late]:
        f.add_done_callback(bad)
        f.add_done_callback(worse)
    c.put(np.arange(3), name="cb-late-raising")
    for f in fs + [late]:
        f.result(30)
    assert hit.wait(30)
    assert c.get_async(fs[1].result()).result(30).sum() == 499500
print("alive")
""" % (os.path.dirname(os.path.dirname(tp.__file__)), server.url)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    assert "alive" in p.stdout


def test_inside_a_done_callback_waiting_or_closing_is_refused(server):
    with tp.Client(server.url, tenant="fut") as c:
        other = c.put_async(np.ones(32 << 20, dtype=np.uint8))
        seen = {}
        ran = threading.Event()

        def cb(f):
            for what, fn in (("close", c.close), ("wait", lambda: other.result() if not
                                                  other.done() else None)):
                try:
                    fn()
                    seen[what] = None
                except tp.FailedPrecondition as e:
                    seen[what] = e
            ran.set()

        # A future done before add_done_callback runs its callback at once on
        # this thread (concurrent.futures), where close is allowed: wait for a
        # name that only exists after the callback is in place.
        f = c.info_async("cb-late", wait=30)
        f.add_done_callback(cb)
        assert not ran.is_set()
        c.put(np.arange(10), name="cb-late")
        assert ran.wait(30)
        assert isinstance(seen["close"], tp.FailedPrecondition)
        assert not c.closed
        other.result(60)


# ---------------------------------------------------------------- state dicts


def test_put_dict_get_dict_of_a_resnet50_state_dict(server):
    sd = resnet50_state_dict()
    with tp.Client(server.url, tenant="sd") as c:
        put = c.put_dict(sd, prefix="resnet50/", ttl=600)
        assert set(put) == set(sd) and put["p000"].name == "resnet50/p000"
        back = c.get_dict("resnet50/")
        assert set(back) == set(sd)
        for k, v in sd.items():
            assert back[k].dtype == v.dtype and np.array_equal(back[k], v), k
        again = c.get_dict("resnet50/p16")  # a narrower prefix
        assert set(again) == {k[len("p16"):] for k in sd if k.startswith("p16")}
        for t in put.values():
            c.free(t)


def test_put_dict_of_torch_tensors_and_get_dict_as_torch(server):
    torch = pytest.importorskip("torch")
    sd = {"w": torch.randn(8, 4).t(), "b": torch.arange(3, dtype=torch.bfloat16),
          "mask": torch.tensor([True, False])}
    with tp.Client(server.url, tenant="sd-torch") as c:
        c.put_dict(sd, prefix="m.")
        back = c.get_dict("m.", as_torch=True)
        for k, v in sd.items():
            assert back[k].dtype == v.dtype and torch.equal(back[k], v), k
        with pytest.raises(tp.InvalidArgument):
            c.put_dict({"x": torch.zeros(2, device="meta")})


def test_put_dict_results_describe_what_the_server_holds(server):
    # the Tensors put_dict returns decode their description when first read:
    # each must be the server's own, field by field
    sd = {"w": np.ones((3, 2, 5), np.float16), "s": np.float64(2.0), "i": np.arange(7)[::3],
          "e": np.zeros((0, 2), np.int32)}
    with tp.Client(server.url, tenant="sd-info") as c:
        put = c.put_dict(sd, prefix="info.", ttl=60)
        for k, t in put.items():
            lazy = t._info  # decoded from put_dict's reply, now
            assert t.info() == lazy, k  # (info() asks the server again)
        fresh = c.put_dict(sd, prefix="info2.", ttl=60)
        for k, v in sd.items():
            t, want = fresh[k], np.asarray(v)
            assert (t.name, t.shape, t.dtype, t.nbytes) == ("info2." + k, want.shape,
                                                             str(want.dtype), want.nbytes), k
            lazy = t._info
            assert t.info() == lazy, k


def test_put_dict_errors_name_every_key_and_leave_nothing(server):
    with tp.Client(server.url, tenant="sd-err") as c:
        c.put(np.zeros(2, np.float32), name="e.b", ttl=60)
        c.put(np.zeros(2, np.float32), name="e.d", ttl=60)
        d = {k: np.full(3, i, np.float32) for i, k in enumerate("abcde")}
        with pytest.raises(tp.BatchError) as e:
            c.put_dict(d, prefix="e.")
        assert set(e.value.errors) == {"b", "d"}
        assert all(isinstance(x, tp.AlreadyExists) for x in e.value.errors.values())
        assert isinstance(e.value, tp.Error) and e.value.code == "ALREADY_EXISTS"
        assert "b:" in str(e.value) and "d:" in str(e.value)
        # all or nothing: a, c and e were freed again
        assert sorted(t.name for t in c.list() if t.name) == ["e.b", "e.d"]
        # replace swaps every name
        c.put_dict(d, prefix="e.", replace=True, ttl=60)
        assert np.array_equal(c.get_dict("e.")["d"], np.full(3, 3, np.float32))


def test_get_dict_arrays_are_writable_and_their_own(server):
    # each value owns its buffer (one of libtport's kept get buffers): writing
    # one leaves the others and the next get_dict's alone, also once the
    # first dict's arrays were collected and their memory went to the second
    sd = {"big": np.arange(600_000, dtype=np.float32),  # 2.4 MB: a kept buffer
          "small": np.arange(5, dtype=np.int64)}
    with tp.Client(server.url, tenant="sd-own") as c:
        c.put_dict(sd, prefix="own.")
        a = c.get_dict("own.")
        a["big"][:] = -1
        a["small"][0] = 99
        b = c.get_dict("own.")
        assert np.array_equal(b["big"], sd["big"]) and np.array_equal(b["small"], sd["small"])
        del a
        gc.collect()
        c2 = c.get_dict("own.")
        assert np.array_equal(c2["big"], sd["big"]) and c2["big"].flags.writeable
        assert np.array_equal(b["big"], sd["big"])


def test_put_dict_keeps_a_scalar_a_scalar(server):
    # a state dict's 0-d values (BatchNorm's num_batches_tracked) keep their
    # shape (), whether NumPy scalars, 0-d arrays or 0-d torch tensors
    sd = {"n": np.int64(7), "a": np.array(2.5), "v": np.arange(3.0)[::2], "e": np.zeros((0, 4))}
    try:
        import torch
        sd["num_batches_tracked"] = torch.tensor(11)
    except ImportError:
        torch = None
    with tp.Client(server.url, tenant="sd-0d") as c:
        c.put_dict(sd, prefix="z.")
        back = c.get_dict("z.")
        for k, v in sd.items():
            want = v.numpy() if torch is not None and isinstance(v, torch.Tensor) else np.asarray(v)
            assert back[k].shape == want.shape and np.array_equal(back[k], want), (k, back[k])


def test_a_value_read_as_another_element_size_is_refused(server):
    # a listing that says int64 of a tensor the get says is int32 (a lying or
    # racing server): an array over the block would reach past it
    import ctypes
    from tensorport import _dlpack

    with tp.Client(server.url, tenant="sd-size") as c:
        t = c.put(np.arange(4, dtype=np.int32))
        ptr = ctypes.c_void_p()
        c._call("tport_get_dlpack", ctypes.byref(c._ref(t)), ctypes.byref(ptr))
        with pytest.raises(tp.DataLoss):
            _dlpack.numpy_from_managed(ptr.value, np.dtype(np.int64))
        ptr2 = ctypes.c_void_p()  # the right size: read as it is
        c._call("tport_get_dlpack", ctypes.byref(c._ref(t)), ctypes.byref(ptr2))
        assert np.array_equal(_dlpack.numpy_from_managed(ptr2.value, np.dtype(np.int32)),
                              np.arange(4))


def test_get_dict_of_nothing_is_empty(server):
    with tp.Client(server.url, tenant="sd-none") as c:
        assert c.get_dict("nothing/") == {}
        assert c.put_dict({}) == {}


# ---------------------------------------------------------------- asyncio


def test_asyncio_gather_of_50_puts_and_gets(server):
    async def main():
        async with aio.Client(server.url, tenant="aio") as c:
            xs = [np.arange(i * 100, (i + 1) * 100, dtype=np.int32) for i in range(50)]
            ts = await asyncio.gather(*(c.put(x) for x in xs))
            ys = await asyncio.gather(*(c.get(t) for t in ts))
            for x, y in zip(xs, ys):
                assert np.array_equal(x, y)
            await c.put(np.arange(3), name="aio-n", ttl=60)
            assert (await c.info("aio-n")).shape == (3,)
            assert np.array_equal(await c.get("aio-n"), np.arange(3))
            with pytest.raises(tp.NotFound):
                await c.get("aio-none")
            with pytest.raises(tp.DeadlineExceeded):
                await c.info("aio-later", wait=0.1)
            waiter = asyncio.ensure_future(c.get("aio-later", wait=20))
            await asyncio.sleep(0.2)
            await c.put(np.ones(4), name="aio-later", ttl=60)
            assert np.array_equal(await waiter, np.ones(4))
            sd = {"a": np.ones(3, np.float32), "b": np.zeros(2, np.int8)}
            await c.put_dict(sd, prefix="aio-sd/")
            assert set(await c.get_dict("aio-sd/")) == {"a", "b"}
            await c.free("aio-n")

    asyncio.run(main())


def test_asyncio_cancel_of_a_large_get(server):
    async def main():
        async with aio.Client(server.url, tenant="aio", shm=False) as c:
            big = await c.put(np.ones(64 << 20, dtype=np.uint8))
            task = asyncio.ensure_future(c.get(big))
            await asyncio.sleep(0)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            gc.collect()
            assert np.array_equal(await c.get(await c.put(np.arange(4))), np.arange(4))

    asyncio.run(main())


def test_a_failed_future_carries_libtports_message(server):
    with tp.Client(server.url, tenant="fut") as c:
        t = c.put(np.arange(4, dtype=np.float32))
        with pytest.raises(tp.Error) as e:
            c.to_async(t, device="nosuch:7").result(30)
        # the message libtport gives the blocking call, not the status name alone
        assert "nosuch" in str(e.value), str(e.value)


def test_info_async_waits_and_to_async_converts(server):
    with tp.Client(server.url, tenant="fut") as c:
        f = c.info_async("fut-later", wait=20)
        time.sleep(0.2)
        assert not f.done()
        made = c.put(np.arange(6, dtype=np.int32).reshape(2, 3), name="fut-later", ttl=60)
        info = f.result(30)
        assert info.ref == made.ref and info.shape == (2, 3) and info.dtype == "int32"
        with pytest.raises(tp.DeadlineExceeded):
            c.info_async("fut-never", wait=0.1).result(30)
        h = made.to_async(dtype="float16").result(30)
        assert h.dtype == "float16" and h is not made
        assert np.array_equal(h.numpy(), np.arange(6, dtype=np.float16).reshape(2, 3))
        assert c.to_async(made, dtype="int32").result(30) is made  # PyTorch aliases
        c.free(made)


class _NoThreads(concurrent.futures.ThreadPoolExecutor):
    def submit(self, fn, *args, **kwargs):
        raise AssertionError("ran %r in the executor: it should be a request" % (fn,))


def test_asyncio_info_get_wait_and_to_take_no_executor_thread(server):
    async def main():
        async with aio.Client(server.url, tenant="aio") as c:
            asyncio.get_running_loop().set_default_executor(_NoThreads())
            waiting = asyncio.ensure_future(c.info("aio-pub", wait=20))
            getting = asyncio.ensure_future(c.get("aio-pub", wait=20))
            await asyncio.sleep(0.2)
            assert not waiting.done() and not getting.done()
            t = await c.put(np.arange(5, dtype=np.float32), name="aio-pub", ttl=60)
            assert (await waiting).ref == t.ref
            assert np.array_equal(await getting, np.arange(5, dtype=np.float32))
            h = await c.to(t, dtype="float64")
            assert h.dtype == "float64"
            assert await c.to(t, dtype="float32") is t
            with pytest.raises(tp.DeadlineExceeded):
                await c.info("aio-never", wait=0.1)
            asyncio.get_running_loop().set_default_executor(
                concurrent.futures.ThreadPoolExecutor(1))
            await c.free(t)

    asyncio.run(main())


def test_asyncio_waits_outnumber_the_library_threads(server):
    """More waits for names than libtport's threads (4) and window (8): the puts that
    publish them, on the same client, still run; a cancelled wait ends at once."""
    async def main():
        async with aio.Client(server.url, tenant="aio-many") as c:
            waits = [asyncio.ensure_future(c.get("many-%d" % i, wait=20)) for i in range(10)]
            await asyncio.sleep(0.2)
            await asyncio.wait_for(
                asyncio.gather(*(c.put(np.full(3, i, np.int16), name="many-%d" % i, ttl=60)
                                 for i in range(10))), 15)
            got = await asyncio.wait_for(asyncio.gather(*waits), 15)
            for i, a in enumerate(got):
                assert np.array_equal(a, np.full(3, i, np.int16))
            t0 = time.monotonic()
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(c.info("never-%d" % 0, wait=20), 0.2)
            assert time.monotonic() - t0 < 5
            await asyncio.wait_for(c.put(np.ones(2)), 5)  # nothing left stuck

    asyncio.run(main())
