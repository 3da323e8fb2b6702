"""Tensor handles read like torch tensors: size/stride/dim, is_contiguous as a
method, NumPy's and PyTorch's conversions, legacy DLPack capsules, get(out=)."""
import numpy as np
import pytest

import tensorport as tp
from conftest import torch_or_skip


def test_size_stride_dim_like_torch(client):
    a = np.zeros((2, 3, 4, 5), dtype=np.float32)
    t = client.put(a, memory_format="channels_last", dtype="float16")
    assert t.size() == (2, 3, 4, 5) and t.dim() == 4 and t.ndim == 4
    assert t.stride() == (60, 1, 15, 3)
    assert [t.size(d) for d in range(-4, 4)] == [2, 3, 4, 5] * 2
    assert [t.stride(d) for d in (1, -1)] == [1, 3]
    assert t.numel() == 120 and t.element_size() == 2
    with pytest.raises(IndexError):
        t.size(4)
    with pytest.raises(IndexError):
        t.stride(-5)
    s = client.put(np.float64(3.0))
    assert s.size() == () and s.dim() == 0 and s.numel() == 1
    with pytest.raises(IndexError):
        s.size(0)


def test_is_contiguous_is_a_method_with_memory_formats(client):
    a = np.zeros((2, 3, 4, 5), dtype=np.float32)
    cl = client.put(a, memory_format="channels_last")
    assert cl.is_contiguous() is False
    assert cl.is_contiguous("channels_last") is True
    assert cl.is_contiguous(memory_format="channels_last_3d") is False
    c = client.put(a)
    assert c.is_contiguous() and not c.is_contiguous("channels_last")
    v = client.put(np.zeros((2, 3, 4, 5, 6), np.uint8), memory_format="channels_last_3d")
    assert v.is_contiguous("channels_last_3d") and not v.is_contiguous()
    with pytest.raises((ValueError, tp.InvalidArgument)):
        c.is_contiguous("preserve")


def test_numpy_takes_a_tensor_as_an_array(client):
    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    t = client.put(a, device="sim:0")
    got = np.asarray(t)
    assert got.dtype == np.int32 and np.array_equal(got, a)
    assert np.array_equal(np.array(t, dtype=np.float64), a.astype(np.float64))
    assert np.array(t, dtype=np.float64).dtype == np.float64
    assert np.array_equal(np.from_dlpack(t), a)
    assert float(np.sum(t)) == float(a.sum())  # any NumPy function, through __array__


def test_torch_takes_a_tensor(client):
    torch = torch_or_skip()
    x = torch.arange(10, dtype=torch.bfloat16).reshape(2, 5)
    t = client.put(x)
    assert torch.equal(torch.from_dlpack(t), x)
    assert torch.equal(t.torch(), x)
    probe = type("Probe", (), {"__dlpack__": lambda self, stream=None: np.ones(1).__dlpack__(),
                               "__dlpack_device__": lambda self: (1, 0)})
    try:
        torch.as_tensor(probe())
    except (RuntimeError, TypeError):
        pytest.skip("this torch's as_tensor does not take __dlpack__ objects (1.13 does not; "
                    "torch.from_dlpack(t) does)")
    assert torch.equal(torch.as_tensor(t), x)


def test_put_takes_a_legacy_dlpack_capsule(client):
    torch = torch_or_skip()
    x = torch.arange(24, dtype=torch.float32).reshape(4, 6)[:, 1:5]  # strided
    cap = torch.utils.dlpack.to_dlpack(x)
    t = client.put(cap, device="sim:1")
    assert t.shape == (4, 4) and t.dtype == "float32"
    assert torch.equal(t.torch(), x)
    # read, not consumed: the capsule can still be handed on
    assert torch.equal(torch.utils.dlpack.from_dlpack(cap), x)
    used = torch.utils.dlpack.to_dlpack(x)
    torch.utils.dlpack.from_dlpack(used)
    with pytest.raises(tp.InvalidArgument):
        client.put(used)


def test_get_into_out(client):
    a = np.random.default_rng(5).standard_normal((8, 16)).astype(np.float32)
    t = client.put(a)
    out = np.empty((8, 16), np.float32)
    assert client.get(t, out=out) is out and np.array_equal(out, a)
    seen = []
    client.get(t, out=out, progress=lambda done, total: seen.append((done, total)))
    assert seen and seen[-1] == (a.nbytes, a.nbytes)
    for bad in (np.empty((16, 8), np.float32), np.empty((8, 16), np.float64),
                np.empty((8, 32), np.float32)[:, ::2]):
        before = bad.copy()
        with pytest.raises(tp.InvalidArgument):
            client.get(t, out=bad)
        assert np.array_equal(bad, before, equal_nan=True)
    ro = np.empty((8, 16), np.float32)
    ro.flags.writeable = False
    with pytest.raises(tp.InvalidArgument):
        client.get(t, out=ro)
    torch = pytest.importorskip("torch")
    o = torch.empty(8, 16)
    assert client.get(t, out=o) is o and torch.equal(o, torch.from_numpy(a))
