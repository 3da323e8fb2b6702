"""Client.put of GPU memory through DLPack: an object whose __dlpack__ hands over
kDLCUDA memory goes to libtport as it is (to this session's tportd, on this host, by
CUDA IPC: the emulated runtime exports the allocation as a descriptor), not refused;
Client.get_into writes into such memory the same way.  Debian's torch is a CPU build, so the device memory is the emulated
runtime's (tests/gpu/emu/cudart_client_emu.c, $TPORT_CUDART_EMU, set by ctest), which
libtport loads through $TPORT_CUDART_LIBRARY.  A torch cuda tensor takes the same
path (tensorport/_dlpack.py, _from_torch) and needs a GPU: not run here."""
import ctypes
import os

import numpy as np
import pytest

from tensorport import _dlpack, _lib

EMU = os.environ.get("TPORT_CUDART_EMU")
pytestmark = pytest.mark.skipif(not EMU, reason="TPORT_CUDART_EMU is not set (ctest sets it)")


class EmuDeviceArray:
    """uint8 bytes in the emulator's device memory, exported through __dlpack__."""

    def __init__(self, rt, data):
        self.rt = rt
        p = ctypes.c_void_p()
        assert rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(len(data))) == 0
        self.ptr = p.value
        assert rt.cudaMemcpy(ctypes.c_void_p(self.ptr), data, ctypes.c_size_t(len(data)), 1) == 0
        self.shape = (ctypes.c_int64 * 1)(len(data))
        self.m = _lib.DLManagedTensor()
        t = self.m.dl_tensor
        t.data = self.ptr
        t.device = _lib.DLDevice(_dlpack.kDLCUDA, 0)
        t.ndim = 1
        t.dtype = _lib.DLDataType(1, 8, 1)  # uint8
        t.shape = ctypes.cast(self.shape, ctypes.POINTER(ctypes.c_int64))
        self.streams = []

    def __dlpack_device__(self):
        return (_dlpack.kDLCUDA, 0)

    def __dlpack__(self, stream=None):
        self.streams.append(stream)
        return _dlpack._capsule_new(ctypes.addressof(self.m), ctypes.addressof(_dlpack._NAME),
                                    None)

    def free(self):
        self.rt.cudaFree(ctypes.c_void_p(self.ptr))


def test_put_of_gpu_memory_through_dlpack(client, monkeypatch):
    monkeypatch.setenv("TPORT_CUDART_LIBRARY", EMU)
    rt = ctypes.CDLL(EMU)  # the same library libtport loads
    rng = np.random.default_rng(7)
    for n in (1, 3 * 65536 + 11):
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        obj = EmuDeviceArray(rt, data)
        t = client.put(obj, device="sim:0")
        assert obj.streams == [1], "asked for the legacy default stream"
        assert client.get(t).tobytes() == data
        t.free()
        obj.free()
    assert rt.emu_cudart_violations() == 0


def test_get_into_gpu_memory_through_dlpack(client, monkeypatch):
    monkeypatch.setenv("TPORT_CUDART_LIBRARY", EMU)
    rt = ctypes.CDLL(EMU)
    rng = np.random.default_rng(8)
    for n in (1, 2 * 65536 + 5):
        data = rng.integers(0, 256, n, dtype=np.uint8)
        t = client.put(data, device="sim:0")
        out = EmuDeviceArray(rt, bytes(n))
        assert client.get_into(t, out) is out
        back = ctypes.create_string_buffer(n)
        assert rt.cudaMemcpy(back, ctypes.c_void_p(out.ptr), ctypes.c_size_t(n), 2) == 0
        assert back.raw == data.tobytes()
        # the wrong size writes nothing
        small = EmuDeviceArray(rt, b"\x07" * max(n - 1, 1))
        if n > 1:
            with pytest.raises(Exception):
                client.get_into(t, small)
            assert rt.cudaMemcpy(back, ctypes.c_void_p(small.ptr), ctypes.c_size_t(n - 1), 2) == 0
            assert back.raw[: n - 1] == b"\x07" * (n - 1)
        small.free()
        out.free()
        t.free()
    assert rt.emu_cudart_violations() == 0


def test_get_into_a_cpu_torch_tensor(client):
    torch = pytest.importorskip("torch")
    src = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)
    t = client.put(src)
    out = torch.empty(2, 3, 4)
    assert client.get_into(t, out) is out
    assert torch.equal(out, src)
    assert torch.equal(client.get_torch(t, device="cpu"), src)
    with pytest.raises(Exception):
        client.get_into(t, torch.empty(4, 3, 2).transpose(0, 2))  # not contiguous
    t.free()
