"""_lifetime: the tensors a client made, freed on the server when Python drops them.

Like Ray's object store: an unnamed tensor a client made on its own connection
(a put without ``name``/``keep``, an unnamed ``to``/``view``/``contiguous``
result) lives as long as its :class:`~tensorport.Tensor` object.  The client
holds one Python object per such handle (``Client.tensor(ref)`` of it returns
that object, so an alias in Python never frees it from under another), and when
that object is garbage-collected its handle is queued here.  Nothing else
happens in the finalizer: a collection may run it on any thread, inside any
lock, even inside one of the client's own calls -- so it takes no lock and does
no I/O; it appends to a deque (an atomic operation in CPython).  The client
frees the queued handles in one Free request (tport_free_many) before its next
request once ``BATCH`` have gathered, and before ``list()``/``stats()`` and on
``flush_frees()``; closing the client frees them with its connection.

Named and kept tensors, and tensors of other clients reached by name or handle,
are never queued.
"""
import collections
import threading
import weakref

# Handles queued before a request frees them (one Free request each batch).
BATCH = 64


class Lifetime:
    """One client's own tensors: the live objects by handle, and the dropped handles."""

    def __init__(self):
        self._lock = threading.Lock()  # the live objects' table (never in a finalizer)
        self._live = weakref.WeakValueDictionary()
        self._dropped = collections.deque()

    def adopt(self, t):
        """t (a Tensor this client made, unnamed, on its own connection) is freed
        on the server once it is garbage-collected; returns t."""
        with self._lock:
            self._live[t._handle] = t
        t._finalizer = weakref.finalize(t, self._dropped.append, t._handle)
        return t

    def existing(self, handle):
        """The live object of a handle this client made (None: none)."""
        with self._lock:
            return self._live.get(handle)

    def forget(self, t):
        """t was freed explicitly: its collection frees nothing more."""
        f = getattr(t, "_finalizer", None)
        if f is not None:
            f.detach()
        with self._lock:
            if self._live.get(t._handle) is t:
                del self._live[t._handle]

    def due(self):
        """True when enough handles are queued to free them now."""
        return len(self._dropped) >= BATCH

    def take(self):
        """The handles queued so far, dequeued."""
        out = []
        while True:
            try:
                out.append(self._dropped.popleft())
            except IndexError:
                return out


# Buffers this package made for a get that failed with tportd perhaps still
# writing them: over ipc:// a large get is written straight into the
# caller's memory (tport.h, tport_get), and one whose answer never came (a
# timeout, the connection lost) or whose write tportd gave up may land
# later.  Such a buffer is kept for good rather than freed and reused.
_written_late = []
_written_late_lock = threading.Lock()


def keep_if_written_late(buf, exc):
    """Keeps buf for the life of the process where exc says tportd may still write it."""
    from .errors import Aborted, DeadlineExceeded, Unavailable

    if isinstance(exc, (DeadlineExceeded, Unavailable, Aborted)):
        with _written_late_lock:
            _written_late.append(buf)
