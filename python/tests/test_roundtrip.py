"""Round trips: NumPy and PyTorch tensors of every dtype both have, in odd layouts
(transposed, stepped, negative strides, storage offsets, broadcast, channels_last,
conj/neg views, 0-d, empty), put on cpu and on a simulated GPU, and got back equal:
values, dtype, shape, and the layout the server kept (a dense layout as it was sent)."""
import numpy as np
import pytest

import tensorport as tp
from conftest import torch_or_skip

NUMPY_DTYPES = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32",
                "float64", "complex64", "complex128"]
TORCH_DTYPES = NUMPY_DTYPES + ["bfloat16"]
DEVICES = ["cpu", "sim:1"]


def np_random(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype.startswith("complex"):
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    if dtype.startswith("float"):
        return (rng.standard_normal(shape) * 100).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)


def dense_strides(a):
    """Strides in elements, or None when the layout is not dense (the put packs it)."""
    st = [s // a.itemsize for s in a.strides]
    dims = sorted((s, n) for s, n in zip(st, a.shape) if n != 1)
    want = 1
    for s, n in dims:
        if s != want:
            return None
        want *= n
    return tuple(st)


NUMPY_LAYOUTS = {
    "c_order": lambda a: a,
    "fortran": lambda a: np.asfortranarray(a),
    "transposed": lambda a: a.transpose(2, 0, 1),
    "stepped": lambda a: a[:, ::2, 1::3],
    "negative": lambda a: a[::-1, :, ::-2],
    "offset": lambda a: a[1:, 2:, 1:],
    "broadcast": lambda a: np.broadcast_to(a[:1, :1], (3, 5, 6)),
    "read_only": lambda a: _ro(a),
    "zero_dim": lambda a: a[1, 2, 3],
    "empty": lambda a: a[:, :0],
    "byteswapped": lambda a: a.astype(a.dtype.newbyteorder(">")),
}


def _ro(a):
    a = a.copy()
    a.setflags(write=False)
    return a


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", sorted(NUMPY_LAYOUTS))
@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
def test_numpy_round_trip(client, dtype, layout, device):
    base = np_random((3, 5, 6), dtype, seed=hash((dtype, layout)) & 0xFFFF)
    a = NUMPY_LAYOUTS[layout](base)
    if not isinstance(a, np.ndarray):
        a = np.asarray(a)
    t = client.put(a, device=device)
    assert t.dtype == dtype and t.shape == a.shape and t.device == device
    assert t.nbytes == a.size * a.dtype.itemsize
    want = dense_strides(a if a.dtype.isnative else a.astype(a.dtype.newbyteorder("=")))
    if want is not None and a.strides and all(s >= 0 for s in a.strides):
        assert t.strides == want
    else:
        assert t.is_contiguous()
    b = client.get(t)
    assert b.dtype == np.dtype(dtype) and b.shape == a.shape
    assert b.flags.c_contiguous and b.flags.writeable
    assert np.array_equal(a, b)
    assert np.array_equal(t.numpy(), a)
    b[...] = 0  # writable and not shared with anything else
    assert np.array_equal(client.get(t), a)
    t.free()


@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
def test_numpy_through_torch_and_back(client, dtype):
    torch_or_skip()
    a = np_random((4, 3), dtype, seed=3).T
    t = client.put(a)
    x = client.get_torch(t)
    assert str(x.dtype) == "torch." + dtype
    assert np.array_equal(x.numpy(), a)


def test_bfloat16_as_uint16_bits(client):
    torch = torch_or_skip()
    x = torch.randn(5, 7).to(torch.bfloat16)
    t = client.put(x)
    bits = client.get(t)
    if bits.dtype.name == "bfloat16":  # ml_dtypes is installed
        bits = bits.view(np.uint16)
    assert bits.dtype == np.uint16
    assert np.array_equal(bits, x.view(torch.int16).numpy().view(np.uint16))
    # and uint16 bits put back are bfloat16 again
    u = client.put(bits[:, ::2])
    assert u.dtype == "bfloat16"
    assert torch.equal(client.get_torch(u), x[:, ::2])


def torch_random(torch, shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) < 0.5
    if dtype.is_complex:
        return torch.randn(shape, dtype=dtype, generator=g)
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 100).to(dtype)
    lo, hi = (0, 256) if dtype == torch.uint8 else (-(2 ** 7), 2 ** 7) if dtype == torch.int8 \
        else (-(2 ** 15), 2 ** 15)
    return torch.randint(lo, hi, shape, generator=g, dtype=torch.int64).to(dtype)


def _torch_layouts(torch):
    return {
        "contiguous": lambda x: x,
        "transposed": lambda x: x.permute(3, 1, 0, 2),
        "channels_last": lambda x: x.contiguous(memory_format=torch.channels_last),
        "channels_last_3d": lambda x: x.unsqueeze(2).expand(2, 3, 2, 4, 5).contiguous(
            memory_format=torch.channels_last_3d),
        "stepped": lambda x: x[:, ::2, :, 1::2],
        "offset": lambda x: x.narrow(0, 1, 1),
        "offset_gappy": lambda x: x.narrow(0, 1, 1).narrow(2, 1, 3),
        "expanded": lambda x: x[:, :1].expand(2, 6, 4, 5),
        "conj": lambda x: x.conj() if x.is_complex() else x,
        "neg_view": lambda x: torch._neg_view(x) if x.is_complex() else x,
        "zero_dim": lambda x: x[1, 2, 3, 4],
        "empty": lambda x: x[:, :, :0],
        "requires_grad": lambda x: x.clone().requires_grad_() if x.is_floating_point() else x,
    }


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "channels_last",
                                    "channels_last_3d", "stepped", "offset", "offset_gappy",
                                    "expanded", "conj", "neg_view", "zero_dim", "empty",
                                    "requires_grad"])
@pytest.mark.parametrize("dtype", TORCH_DTYPES)
def test_torch_round_trip(client, dtype, layout, device):
    torch = torch_or_skip()
    td = getattr(torch, dtype)
    x = _torch_layouts(torch)[layout](torch_random(torch, (2, 3, 4, 5), td, seed=len(layout)))
    t = client.put(x, device=device)
    assert t.dtype == dtype and t.shape == tuple(x.shape) and t.device == device
    if layout in ("contiguous", "transposed", "channels_last", "channels_last_3d", "offset"):
        assert t.strides == x.stride()  # a dense layout is kept as sent
    if layout == "channels_last":
        assert t.memory_format == "channels_last"
    if layout in ("stepped", "expanded", "offset_gappy"):
        assert t.is_contiguous()
    y = client.get_torch(t)
    assert y.dtype == td and y.shape == x.shape and y.is_contiguous()
    assert torch.equal(y, x.detach().resolve_conj().resolve_neg())
    assert torch.equal(t.torch(), y)
    if dtype not in ("bfloat16",):
        assert np.array_equal(client.get(t), y.numpy())
    t.free()


@pytest.mark.parametrize("dtype", TORCH_DTYPES)
def test_put_converts_dtype_and_format_like_torch(client, dtype):
    torch = torch_or_skip()
    x = torch_random(torch, (2, 3, 4, 5), torch.float32, seed=9).permute(0, 2, 1, 3)
    t = client.put(x, device="sim:0", dtype=dtype, memory_format="channels_last")
    want = x.to(dtype=getattr(torch, dtype), memory_format=torch.channels_last)
    assert t.dtype == dtype and t.strides == want.stride()
    assert torch.equal(client.get_torch(t), want)


def test_other_inputs(client):
    torch = torch_or_skip()
    # lists and scalars through numpy.asarray; objects with __dlpack__
    assert np.array_equal(client.get(client.put([[1, 2], [3, 4]])), [[1, 2], [3, 4]])
    assert client.get(client.put(2.5)).shape == ()

    class Producer:
        def __init__(self, x):
            self.x = x

        def __dlpack__(self, stream=None):
            return torch.utils.dlpack.to_dlpack(self.x)

        def __dlpack_device__(self):
            return (1, 0)

    x = torch.arange(12, dtype=torch.int16).reshape(3, 4).t()
    t = client.put(Producer(x))
    assert t.strides == (1, 4) and torch.equal(client.get_torch(t), x)
    # a tensorport Tensor is itself a DLPack producer (a download)
    u = client.put(t)
    assert torch.equal(client.get_torch(u), x)


def test_dlpack_consumers(client):
    torch = torch_or_skip()
    x = torch.randn(3, 4, dtype=torch.complex64)
    t = client.put(x)
    assert torch.equal(torch.utils.dlpack.from_dlpack(t), x)
    assert np.array_equal(np.from_dlpack(t), x.numpy())
    cap = t.__dlpack__()  # never consumed: its destructor frees the download
    del cap
    assert t.__dlpack_device__() == (1, 0)


def test_large_round_trip_in_chunks(client):
    torch = torch_or_skip()
    x = torch.randn(3, 1500, 1100, dtype=torch.float64).transpose(0, 2)  # ~40 MB, 10 chunks
    t = client.put(x, device="sim:0")
    assert t.strides == x.stride()
    assert torch.equal(client.get_torch(t), x)
    assert np.array_equal(client.get(t), x.numpy())


def test_put_rejects_what_tensorport_has_no_dtype_for(client):
    with pytest.raises(tp.InvalidArgument, match="uint32"):
        client.put(np.zeros(3, np.uint32))
    with pytest.raises(tp.InvalidArgument):
        client.put(np.array(["a", "b"]))
    with pytest.raises(tp.InvalidArgument):
        client.put(object())
    torch = torch_or_skip()
    with pytest.raises(tp.InvalidArgument, match="put takes host and cuda tensors"):
        client.put(torch.empty(3, device="meta"))
    with pytest.raises(tp.InvalidArgument, match="layout"):
        client.put(torch.eye(3).to_sparse())
