"""tensorport.aio: the client for asyncio.

    import asyncio, numpy as np
    from tensorport import aio

    async def main():
        async with aio.Client("ipc:///run/tportd.sock") as c:
            ts = await asyncio.gather(*(c.put(np.ones(1000) * i) for i in range(50)))
            xs = await asyncio.gather(*(c.get(t) for t in ts))

``put``, ``get``, ``info`` (``wait`` included: the server waits for the
name), ``to`` and ``copy`` are libtport asynchronous requests: their
completion callback, on a library thread, hands the result to the event loop
with ``loop.call_soon_threadsafe`` -- no thread per request, and the loop
never blocks.  Cancelling the awaiting task cancels the request
(tport_cancel: a put so stopped leaves nothing on the server).

The calls libtport has no asynchronous request for run in the loop's default
executor (a thread of its pool each, for as long as the call): ``free``,
``list``, ``tensor``, ``put_dict``, ``get_dict``, ``stats``, ``devices``,
``close``.
``sync`` is the :class:`tensorport.Client` underneath, for anything else.
"""
import asyncio
import functools

from . import _requests
from .client import Client as _SyncClient
from .tensor import Tensor

__all__ = ["Client"]


class Client:
    """An asyncio client: ``tensorport.Client``'s arguments (``url``, ``tenant``,
    ``timeout``, ``shm`` ...).  Connects when made (a blocking connect; make it
    before the loop's hot path, or ``await aio.Client.connect(...)``).  An async
    context manager."""

    def __init__(self, *args, **kwargs):
        self.sync = _SyncClient(*args, **kwargs)

    @classmethod
    async def connect(cls, *args, **kwargs):
        """Makes a Client in the default executor (the connect does not block the loop)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, functools.partial(cls, *args, **kwargs))

    def __repr__(self):
        return "tensorport.aio." + repr(self.sync)[len("tensorport."):]

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()
        return False

    # ------------------------------------------------------------ requests

    async def _request(self, issue):
        loop = asyncio.get_running_loop()
        fut = loop.create_future()

        def deliver(result, exc, cancelled):
            if fut.done():
                return  # the awaiting task was cancelled meanwhile
            if cancelled:
                fut.cancel()
            elif exc is not None:
                fut.set_exception(exc)
            else:
                fut.set_result(result)

        def sink(result, exc, cancelled):  # on a library thread
            try:
                loop.call_soon_threadsafe(deliver, result, exc, cancelled)
            except RuntimeError:
                pass  # the loop is closed: nobody awaits it any more

        req = issue(sink)
        try:
            return await fut
        except asyncio.CancelledError:
            req.cancel()
            raise

    async def put(self, obj, **kwargs):
        """``tensorport.Client.put`` (its keyword arguments but ``progress``); obj must
        not change until it returns."""
        return await self._request(lambda sink: _requests.put(self.sync, obj, sink, **kwargs))

    async def get(self, ref, *, wait=None):
        """``tensorport.Client.get`` as a NumPy array; ``wait`` (seconds, with a name)
        waits for the name on the server first (``info``), then gets what it holds
        then (by name: looked up and read in one request, so a replace in between
        gives the newer tensor, whole)."""
        if wait and not isinstance(ref, Tensor):
            await self.info(ref, wait=wait)
        return await self._request(lambda sink: _requests.get(self.sync, ref, sink))

    async def info(self, ref, *, wait=None):
        """``tensorport.Client.info``; ``wait`` (seconds, with a name) waits for the
        name on the server."""
        if isinstance(ref, Tensor):
            return ref._info
        return await self._request(lambda sink: _requests.info(self.sync, ref, sink, wait))

    async def to(self, t, device=None, dtype=None, memory_format=None, copy=False,
                 non_blocking=False, exact_format=False, name=None, ttl=None):
        """``t.to(...)`` (``Tensor.to``'s arguments) on the server: the resulting Tensor
        (``t`` itself where PyTorch would alias)."""
        return await self._request(lambda sink: _requests.to(
            self.sync, t, sink, device, dtype, memory_format, copy, non_blocking,
            exact_format, name, ttl))

    async def copy(self, dst, src, *, non_blocking=False):
        """``dst.copy_(src)`` (Tensors, handles or names)."""
        return await self._request(
            lambda sink: _requests.copy(self.sync, dst, src, sink, non_blocking))

    # ------------------------------------------------------------ in the executor

    async def _blocking(self, fn, *args, **kwargs):
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, functools.partial(fn, *args, **kwargs))

    async def tensor(self, ref):
        """``tensorport.Client.tensor`` (in the default executor)."""
        return await self._blocking(self.sync.tensor, ref)

    async def free(self, ref):
        """``tensorport.Client.free`` (in the default executor)."""
        return await self._blocking(self.sync.free, ref)

    async def list(self, prefix=None):
        """``tensorport.Client.list`` (in the default executor)."""
        return await self._blocking(self.sync.list, prefix)

    async def put_dict(self, d, prefix="", **kwargs):
        """``tensorport.Client.put_dict`` (in the default executor)."""
        return await self._blocking(self.sync.put_dict, d, prefix, **kwargs)

    async def get_dict(self, prefix="", **kwargs):
        """``tensorport.Client.get_dict`` (in the default executor)."""
        return await self._blocking(self.sync.get_dict, prefix, **kwargs)

    async def stats(self):
        """``tensorport.Client.stats`` (in the default executor)."""
        return await self._blocking(self.sync.stats)

    async def devices(self):
        """``tensorport.Client.devices`` (in the default executor)."""
        return await self._blocking(self.sync.devices)

    async def close(self):
        """Closes the client (in the default executor: it waits for the calls in flight;
        requests still in flight end with the error libtport gives them)."""
        await self._blocking(self.sync.close)

    @property
    def closed(self):
        """True once ``close()`` has run."""
        return self.sync.closed
