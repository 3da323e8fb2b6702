"""_names: dtypes, memory formats and devices between Python's spellings and libtport's.

Dtypes carry PyTorch's names and tensorport's numbering (tport_types.h).  An
argument may be a name ("float16", "half", "torch.float16"), a torch.dtype,
a NumPy dtype or type, or ml_dtypes.bfloat16.  Memory formats: "contiguous",
"channels_last", "channels_last_3d", "preserve" or torch.memory_format.
"""
import functools

from .errors import InvalidArgument

DTYPES = (
    "bool",
    "uint8",
    "int8",
    "int16",
    "int32",
    "int64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "complex64",
    "complex128",
)
DTYPE_NUMBER = {n: i for i, n in enumerate(DTYPES)}
ITEMSIZE = dict(zip(DTYPES, (1, 1, 1, 2, 4, 8, 2, 2, 4, 8, 8, 16)))
_ALIASES = {
    "half": "float16",
    "float": "float32",
    "double": "float64",
    "short": "int16",
    "int": "int32",
    "long": "int64",
    "cfloat": "complex64",
    "cdouble": "complex128",
    "bool_": "bool",
}

FORMATS = ("contiguous", "channels_last", "channels_last_3d", "preserve", "none")
FORMAT_NUMBER = {n: i for i, n in enumerate(FORMATS)}
_FORMAT_ALIASES = {"contiguous_format": "contiguous", "preserve_format": "preserve"}

# NumPy arrays of uint16 are bfloat16 bit patterns (tensorport has no uint16;
# the tool's .npy files say the same)
_NUMPY_NAMES = {"uint16": "bfloat16"}


def dtype_name(dtype, what="dtype"):
    """The tensorport name of a dtype given in any accepted spelling; InvalidArgument if none.

    Names are PyTorch's first ("float" is float32, as torch.float); other
    strings, types and dtypes go through numpy.dtype ("<f4", float, np.int16).
    """
    if isinstance(dtype, str):
        n = dtype[6:] if dtype.startswith("torch.") else dtype
        n = _ALIASES.get(n, n)
        if n in DTYPE_NUMBER:
            return n
    if (type(dtype).__module__ or "").startswith("torch"):  # a torch.dtype
        n = str(dtype)[6:]
        if n in DTYPE_NUMBER:
            return n
    else:
        try:
            import numpy as np

            nd = np.dtype(dtype)
        except (TypeError, ValueError, ImportError):
            nd = None
        if nd is not None and nd.name in DTYPE_NUMBER:
            return nd.name
    raise InvalidArgument("%s is %r: not a dtype (%s)" % (what, dtype, ", ".join(DTYPES)))


def format_name(fmt, what="memory_format"):
    """The tensorport name of a memory format (a name or a torch.memory_format)."""
    n = str(fmt)
    n = n[6:] if n.startswith("torch.") else n
    n = _FORMAT_ALIASES.get(n, n)
    if n in FORMAT_NUMBER and n != "none":
        return n
    raise InvalidArgument(
        "%s is %r: not a memory format (contiguous, channels_last, channels_last_3d, preserve)"
        % (what, fmt)
    )


def device_name(device):
    """A device as the server spells it ("cpu", "sim:1", "cuda:0"); accepts torch.device."""
    if device is None:
        return None
    n = str(device)
    if not n:
        raise InvalidArgument("device is empty: cpu, sim:N or cuda:N")
    return n


def looks_like_dtype(x):
    """True when x is a dtype in some spelling (to(torch.float16) passes it as the device)."""
    if x is None:
        return False
    try:
        dtype_name(x)
        return True
    except InvalidArgument:
        return False


# ---------------------------------------------------------------- NumPy and torch dtypes


def dtype_of_number(number):
    """The dtype name of libtport's tport_dtype number (its digits if unknown)."""
    return DTYPES[number] if 0 <= number < len(DTYPES) else str(number)


def numpy_dtype(name):
    """The NumPy dtype for a tensorport dtype: bfloat16 is ml_dtypes.bfloat16 when that
    package is present, else uint16 (its bit patterns, the .npy convention)."""
    import numpy as np

    if name == "bfloat16":
        try:
            import ml_dtypes

            return np.dtype(ml_dtypes.bfloat16)
        except ImportError:
            return np.dtype(np.uint16)
    return np.dtype("bool" if name == "bool" else name)


@functools.lru_cache(maxsize=256)
def numpy_to_name(nd):
    """The tensorport dtype of a NumPy dtype (uint16 means bfloat16 bits); None if none.
    Cached by dtype: NumPy works ``dtype.name`` out anew each time (4 us, most of what a
    state dict's 161 values cost put_dict before its request)."""
    n = _NUMPY_NAMES.get(nd.name, nd.name)
    return n if n in DTYPE_NUMBER else None


def torch_dtype(name):
    """The torch.dtype for a tensorport dtype."""
    import torch

    return getattr(torch, name)
