"""_futures: libtport's asynchronous requests as futures.

A request (tport_put_dlpack_async, tport_get_async, ...) returns at once; its
work runs on libtport's threads, and its completion callback -- one CFUNCTYPE
for the whole process, :data:`_ON_DONE`, told which request by a number --
hands the outcome to a *sink*: a ``concurrent.futures.Future`` (set on the
library thread) or an asyncio future (handed to its loop with
``call_soon_threadsafe``, see ``aio``).  No Python thread waits for a request.

What a request reads and writes (the DLTensor and the memory it describes,
the result structs, the ref) stays referenced by its :class:`_Request`, which
the registry holds from before the request is issued until its callback has
run: libtport may touch them until then, after a cancel too.

The callback must not raise into C (it catches everything) and must not wait
for another request or close the client (tport.h): it only builds the result
and sets it.  A concurrent future's done-callbacks run there too, on the
library thread, so ``TransferFuture.result()`` of an unfinished future and
``Client.close()`` refuse to run inside one (FailedPrecondition) instead of
deadlocking.

A failure is raised as the status's class with libtport's message for it
(tport_request_error, readable inside the callback), after the request's
name.
"""
import concurrent.futures
import ctypes
import itertools
import threading

from . import _lib
from .errors import FailedPrecondition, error_for

CANCELLED = 1

_registry = {}  # request number -> _Request, from before it is issued until it completes
_numbers = itertools.count(1)
_registry_lock = threading.Lock()
_here = threading.local()  # .in_callback: this thread runs a completion now


def in_callback():
    """True on a library thread while it completes a request (its callbacks included)."""
    return getattr(_here, "in_callback", False)


def _on_done(req, status, number):
    """tport_request_fn: every request's completion, on a library thread."""
    _here.in_callback = True
    try:
        with _registry_lock:
            r = _registry.pop(number, None)
        if r is not None:
            r.complete(status, req)
    except BaseException:  # noqa: B902 -- nothing may unwind into libtport
        pass
    finally:
        _here.in_callback = False


_ON_DONE = _lib.REQUEST_FN(_on_done)  # alive as long as the module: libtport keeps its address


class TransferFuture(concurrent.futures.Future):
    """A ``concurrent.futures.Future`` for a tensorport request (``Client.put_async`` ...).

    ``cancel()`` on a request still in flight asks libtport to stop it
    (tport_cancel: between chunks on the socket; a put cancelled so is
    aborted on the server and nothing of it stays) and returns True, as
    asyncio's ``Task.cancel`` does: the future then ends cancelled
    (``cancelled()`` is True, ``result()`` raises
    ``concurrent.futures.CancelledError``), or -- a request already past the
    point of no return -- with its result.  It returns False once the future
    is done.  Done-callbacks (``add_done_callback``) run on a libtport thread:
    keep them short, and do not wait there for another unfinished future or
    close the client (both raise FailedPrecondition there).
    """

    def __init__(self):
        super().__init__()
        self._request = None

    def cancel(self):
        """Asks an in-flight request to stop (see the class); False once done."""
        r = self._request
        if r is None or self.done():
            return super().cancel() if r is None else False
        return r.cancel()

    def _refuse_inside_callback(self):
        if in_callback() and not self.done():
            raise FailedPrecondition("waiting for an unfinished tensorport future inside a "
                                     "completion callback (it may need this very thread)")

    def result(self, timeout=None):
        """The request's result, waiting up to ``timeout`` seconds (GIL released)."""
        self._refuse_inside_callback()
        return super().result(timeout)

    def exception(self, timeout=None):
        """The request's exception (None when it succeeded), waiting as ``result`` does."""
        self._refuse_inside_callback()
        return super().exception(timeout)


def future_sink(fut):
    """A sink that completes a TransferFuture on the library thread."""

    def sink(result, exc, cancelled):
        if cancelled:
            # Future.cancel wakes result() but not concurrent.futures.wait():
            # set_running_or_notify_cancel tells its waiters (as an executor does)
            concurrent.futures.Future.cancel(fut)
            fut.set_running_or_notify_cancel()
        elif exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(result)

    return sink


def _message(req, status):
    """libtport's message for the request req that failed with status."""
    lib = _lib.load()
    e = lib.tport_request_error(req) if req else None
    if e and e.contents.msg:
        return e.contents.msg.decode("utf-8", "replace")
    return lib.tport_status_name(status).decode()


class _Request:
    """One request in flight: what it keeps alive, how its result is built, its sink."""

    def __init__(self, what, keepalive, finish, sink, explain=None):
        self.what = what  # "put", "get of 'w'": for error messages
        self.explain = explain  # () -> the failure's exception with its message, or None
        self.keepalive = keepalive
        self.finish = finish  # () -> the result, once the request succeeded
        self.sink = sink
        self.lock = threading.Lock()
        self.req = None  # the tport_request*, once issued
        self.completed = False
        self.cancel_asked = False

    def cancel(self):
        with self.lock:
            if self.completed:
                return False
            self.cancel_asked = True
            if self.req is not None:
                _lib.load().tport_cancel(self.req)
            return True

    def issued(self, req):
        """The C call returned req: cancel it if asked meanwhile; free it if it is over."""
        lib = _lib.load()
        with self.lock:
            self.req = req
            if self.completed:
                lib.tport_request_free(req)
            elif self.cancel_asked:
                lib.tport_cancel(req)

    def complete(self, status, req):
        result = exc = None
        cancelled = status == CANCELLED and self.cancel_asked
        try:
            if status:
                exc = self.explain() if self.explain else None
                if exc is None:
                    exc = error_for(status, "%s: %s" % (self.what, _message(req, status)))
            else:
                result = self.finish()
        except BaseException as e:  # noqa: B902 -- handed to the future, never to C
            exc = e
        with self.lock:
            self.completed = True
            if self.req is not None:
                _lib.load().tport_request_free(self.req)  # its own: allowed in the callback
        self.keepalive = self.finish = self.explain = None
        try:
            self.sink(result, exc, cancelled)
        except BaseException:  # noqa: B902 -- a sink that raised: the future stays as it is
            pass


def issue(client, start, what, keepalive, finish, sink, explain=None):
    """Issues a request: start(done_fn, done_arg, &req, &err) is the C call's tail
    (run inside the client's lifetime guard); raises its error when it is refused."""
    r = _Request(what, keepalive, finish, sink, explain)
    number = next(_numbers)
    with _registry_lock:
        _registry[number] = r
    req = ctypes.c_void_p()
    err = _lib.Err()
    rc = -1
    client._enter()
    try:
        rc = start(_ON_DONE, ctypes.c_void_p(number), ctypes.byref(req), ctypes.byref(err))
    finally:
        client._exit()
        if rc:
            with _registry_lock:
                _registry.pop(number, None)
    client._check(rc, err)
    r.issued(req.value)
    return r
