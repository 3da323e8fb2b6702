"""tensor: a tensor on a tportd, as a Python object.

A :class:`Tensor` names one tensor of the server by its handle (``.ref``) and
carries a snapshot of its description (dtype, shape, strides, device, ...,
all fixed for the life of a handle).  Its methods are PyTorch's, run on the
server with PyTorch's semantics: ``to()`` and ``contiguous()`` return the
very same Python object when PyTorch would return the same tensor (an
alias), and a new Tensor otherwise.

NumPy and PyTorch take a Tensor where they take an array: ``np.asarray(t)``
(``__array__``), ``np.from_dlpack(t)`` and ``torch.from_dlpack(t)``
(``__dlpack__``) download its values; ``size()``, ``stride()``, ``dim()``,
``numel()``, ``element_size()`` and ``is_contiguous(memory_format)`` read as
PyTorch's.

Lifetime, as in Ray: an unnamed tensor a client made (``put`` without
``name`` or ``keep``, an unnamed ``to``/``view``/``contiguous`` result) is
freed on the server once Python garbage-collects its Tensor object (the
frees are batched: ``Client.flush_frees``), or by ``free()``, or when its
client closes; a named one (or one put with ``keep=True``) lives for the
tenant until freed or until its time to live ends, whatever Python holds.
"""
import dataclasses
from typing import Optional, Tuple

__all__ = ["Tensor", "TensorInfo"]


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """A tensor's description, as the server gave it (``Tensor.info()``).

    ``memory_format`` is the format the tensor is actually contiguous in
    (``"contiguous"``, ``"channels_last"``, ``"channels_last_3d"``, or
    ``"none"``); ``suggested_memory_format`` is PyTorch's
    ``suggest_memory_format()``, which ``to()`` compares against.  Strides are
    in elements.  ``expires_unix_ms`` is 0 for a tensor that lives with its
    connection.
    """

    ref: str
    name: Optional[str]
    dtype: str
    shape: Tuple[int, ...]
    strides: Tuple[int, ...]
    storage_offset: int
    device: str
    memory_format: str
    suggested_memory_format: str
    is_contiguous: bool
    nbytes: int
    storage_nbytes: int
    managed: bool
    conj: bool
    neg: bool
    expires_unix_ms: int


class Tensor:
    """A tensor held by tportd (made by ``Client.put``, ``to``, ``view``, ``Client.tensor``...).

    Attributes mirror PyTorch's: ``dtype`` (PyTorch's name, a str),
    ``shape`` and ``strides`` (tuples; strides in elements),
    ``storage_offset``, ``device`` (``"cpu"``, ``"sim:0"``, ``"cuda:0"``),
    ``memory_format``, ``nbytes``; methods ``size()``, ``stride()``,
    ``dim()``, ``numel()``, ``element_size()``, ``is_contiguous()``; plus ``ref`` (the
    handle, 32 hex digits) and ``name``.  Safe to use from many threads.
    """

    def __init__(self, client, info, handle):
        self._client = client
        # a TensorInfo, or a function that makes it when first read (a batch's
        # results: most are never looked at, and 161 decoded cost ~2 ms)
        self._info_or_maker = info
        self._handle = handle
        self._finalizer = None  # set when its client frees it on collection

    @property
    def _info(self):
        i = self._info_or_maker
        if isinstance(i, TensorInfo):
            return i
        v = i()  # two threads may both make it: the same value
        if self._info_or_maker is i:  # (not over a fresher one info() stored meanwhile)
            self._info_or_maker = v
        return v

    @_info.setter
    def _info(self, info):
        self._info_or_maker = info

    # ------------------------------------------------------------ description

    @property
    def client(self):
        """The :class:`~tensorport.Client` this tensor is reached through."""
        return self._client

    @property
    def ref(self):
        """The handle, 32 hex digits: the same for every alias of one server tensor."""
        return self._info.ref

    @property
    def name(self):
        """The name it was registered under, or None."""
        return self._info.name

    @property
    def dtype(self):
        """PyTorch's name of the dtype: ``"float32"``, ``"bfloat16"``, ``"complex64"``..."""
        return self._info.dtype

    @property
    def shape(self):
        """Sizes, a tuple of ints."""
        return self._info.shape

    @property
    def strides(self):
        """Strides in elements (PyTorch's ``stride()``), a tuple of ints."""
        return self._info.strides

    @property
    def storage_offset(self):
        """Offset of the first element in its storage, in elements."""
        return self._info.storage_offset

    @property
    def device(self):
        """The device it lives on: ``"cpu"``, ``"sim:N"`` or ``"cuda:N"``."""
        return self._info.device

    @property
    def memory_format(self):
        """The format it is contiguous in (``"contiguous"``, ``"channels_last"``,
        ``"channels_last_3d"``), or ``"none"``."""
        return self._info.memory_format

    @property
    def suggested_memory_format(self):
        """PyTorch's ``suggest_memory_format()`` for its strides."""
        return self._info.suggested_memory_format

    def is_contiguous(self, memory_format=None):
        """PyTorch's ``is_contiguous(memory_format=torch.contiguous_format)``:
        ``memory_format`` "contiguous" (default), "channels_last" (rank 4 only)
        or "channels_last_3d" (rank 5 only), or torch's; computed from the
        shape and strides with c10's rules (size-1 dims skipped; 0 elements
        count as contiguous in the default format only)."""
        from ._names import format_name

        fmt = "contiguous" if memory_format is None else format_name(memory_format)
        if fmt == "contiguous":
            return self._info.is_contiguous
        order = {"channels_last": (4, (1, 3, 2, 0)),
                 "channels_last_3d": (5, (1, 4, 3, 2, 0))}.get(fmt)
        if order is None:
            raise ValueError("is_contiguous: memory_format %r is not a layout "
                             "(contiguous, channels_last, channels_last_3d)" % (memory_format,))
        rank, walk = order
        shape, strides = self._info.shape, self._info.strides
        if len(shape) != rank:
            return False
        expected = 1
        for d in walk:
            if shape[d] == 1:
                continue
            if strides[d] != expected:
                return False
            expected *= shape[d]
        return True

    @property
    def nbytes(self):
        """Bytes of its elements (numel * element size)."""
        return self._info.nbytes

    @property
    def ndim(self):
        """Number of dimensions."""
        return len(self._info.shape)

    def dim(self):
        """Number of dimensions (PyTorch's ``dim()``)."""
        return len(self._info.shape)

    def size(self, dim=None):
        """PyTorch's ``size()``: the shape (a tuple), or the size of ``dim``
        (negative counts from the end)."""
        if dim is None:
            return self._info.shape
        return self._info.shape[self._dim(dim)]

    def stride(self, dim=None):
        """PyTorch's ``stride()``: strides in elements (a tuple), or that of ``dim``."""
        if dim is None:
            return self._info.strides
        return self._info.strides[self._dim(dim)]

    def _dim(self, dim):
        n = len(self._info.shape)
        if not isinstance(dim, int) or isinstance(dim, bool) or not -max(n, 1) <= dim < max(n, 1):
            raise IndexError("Dimension out of range (expected to be in range of [%d, %d], "
                             "but got %r)" % (-max(n, 1), max(n, 1) - 1, dim))
        if n == 0:
            raise IndexError("dimension specified as %d but tensor has no dimensions" % dim)
        return dim % n

    def numel(self):
        """Number of elements."""
        n = 1
        for s in self._info.shape:
            n *= s
        return n

    def element_size(self):
        """Bytes per element."""
        from ._names import ITEMSIZE

        return ITEMSIZE[self._info.dtype]

    def __repr__(self):
        i = self._info
        return "tensorport.Tensor(ref=%r%s, dtype=%r, shape=%r, strides=%r, device=%r)" % (
            i.ref,
            ", name=%r" % i.name if i.name else "",
            i.dtype,
            i.shape,
            i.strides,
            i.device,
        )

    # ------------------------------------------------------------ operations

    def info(self):
        """Asks the server for this tensor's description now; returns a :class:`TensorInfo`
        (and refreshes this object's).  NotFound once it is freed or gone."""
        self._info = self._client._info_of(self)
        return self._info

    def to(self, device=None, dtype=None, memory_format=None, copy=False, non_blocking=False,
           exact_format=False, name=None, ttl=None):
        """PyTorch's ``Tensor.to`` on the server; returns ``self`` when PyTorch would alias.

        ``device`` ("sim:1", "cuda:0", "cpu"; a torch.device too), ``dtype`` (any
        spelling: "float16", torch.float16, numpy.float16), ``memory_format``
        ("contiguous", "channels_last", "channels_last_3d", "preserve" or
        torch's); ``to(torch.float16)`` works as in PyTorch.  ``exact_format``:
        alias only when the tensor ``is_contiguous(memory_format)`` (PyTorch
        compares with ``suggest_memory_format()``, pytorch#62027).  ``name``
        (and ``ttl``, seconds) registers the result for the tenant; an alias
        given a name is a new Tensor sharing the storage.
        """
        return _tensor_ops.to(self._client, self, device, dtype, memory_format, copy,
                              non_blocking, exact_format, name, ttl)

    def to_async(self, *args, **kwargs):
        """``to`` as a request on libtport's threads: a ``concurrent.futures.Future``
        of the result (``Client.to_async``)."""
        return self._client.to_async(self, *args, **kwargs)

    def contiguous(self, memory_format="contiguous", name=None):
        """PyTorch's ``Tensor.contiguous``: ``self`` when already contiguous in
        ``memory_format``, else a copy in it."""
        return _tensor_ops.contiguous(self._client, self, memory_format, name)

    def view(self, shape, strides=None, storage_offset=0, name=None):
        """A view of this tensor's storage (``torch.as_strided``): ``shape``, ``strides``
        in elements (None: contiguous for ``shape``), ``storage_offset`` in elements."""
        return _tensor_ops.view(self._client, self, shape, strides, storage_offset, name)

    def copy_(self, src, non_blocking=False):
        """PyTorch's ``Tensor.copy_``: copies ``src`` into this tensor (broadcasting,
        converting dtype), returns ``self``.  ``src``: a Tensor, a ref, or host data
        (a NumPy array, a torch.Tensor...) which is put first."""
        _tensor_ops.copy(self._client, self, src, non_blocking)
        return self

    def numpy(self, progress=None):
        """Downloads the values: a NumPy array in logical C order (see ``Client.get``)."""
        return self._client.get(self, progress=progress)

    def __array__(self, dtype=None, copy=None):
        """``numpy.asarray(t)`` / ``numpy.array(t)``: downloads the values (every
        call is a get; keep the array rather than converting again).
        ``copy=False`` is refused: the values live on the server."""
        if copy is False:
            raise ValueError("a tensorport.Tensor cannot be viewed without a copy: its values "
                             "are on the server (use copy=None or True)")
        a = self._client.get(self)
        return a if dtype is None else a.astype(dtype, copy=False)

    def torch(self, progress=None):
        """Downloads the values: a CPU torch.Tensor, contiguous (see ``Client.get_torch``)."""
        return self._client.get_torch(self, progress=progress)

    def sync(self):
        """Waits until the server's pending device work on this tensor is done."""
        self._client.sync(self)

    def free(self):
        """Frees the tensor on the server (every alias sharing its handle goes with it;
        views and copies under other handles stay)."""
        self._client.free(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        """Leaving a ``with`` block frees the tensor."""
        self.free()
        return False

    # ------------------------------------------------------------ DLPack

    def __dlpack__(self, stream=None):
        """Downloads the tensor into a DLPack capsule (host memory, C order), for
        ``numpy.from_dlpack(t)`` and ``torch.utils.dlpack.from_dlpack(t)``.  DLPack 0.6
        has no bool: a bool tensor comes as uint8."""
        return self._client._get_capsule(self)

    def __dlpack_device__(self):
        """(kDLCPU, 0): a download always lands in host memory."""
        return (1, 0)


# last: the methods' module reads TensorInfo from this one
from . import _tensor_ops  # noqa: E402
