"""tensorport: tensors on a remote tportd, from NumPy and PyTorch.

    import numpy as np, tensorport
    with tensorport.Client("tcp://127.0.0.1:7450") as c:
        t = c.put(np.arange(24, dtype=np.uint8).reshape(1, 2, 3, 4), device="sim:0",
                  dtype="float16", memory_format="channels_last")
        u = t.to(device="sim:1", dtype="float32")     # PyTorch's to(), on the server
        y = u.numpy()                                  # or c.get(u), c.get_torch(u)

A thin layer over libtport (the C client, loaded with ctypes: see
``library_path()`` and ``$TPORT_LIBRARY``).  Conversions follow PyTorch 1.13's
semantics exactly, aliasing included; errors are :class:`Error` subclasses
named for their gRPC status.
"""
from ._batch import BatchError
from ._futures import TransferFuture
from ._lib import LibraryNotFoundError, library_path
from ._names import DTYPES
from .client import DEFAULT_URL, Client, DeviceInfo, DeviceList
from . import errors as _errors
from .errors import *  # noqa: F401,F403 -- Error and one class per status code
from .tensor import Tensor, TensorInfo
from .units import parse_duration, parse_size

__version__ = "0.1.0"

#: the memory formats a request may name (an answer may also be "none")
MEMORY_FORMATS = ("contiguous", "channels_last", "channels_last_3d", "preserve")

__all__ = [
    "Client",
    "Tensor",
    "TransferFuture",
    "BatchError",
    "TensorInfo",
    "DeviceInfo",
    "DeviceList",
    "DEFAULT_URL",
    "DTYPES",
    "MEMORY_FORMATS",
    "library_path",
    "LibraryNotFoundError",
    "parse_size",
    "parse_duration",
    "__version__",
] + [n for n in _errors.__all__ if n != "CODES"]
