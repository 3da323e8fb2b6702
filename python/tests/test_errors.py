"""Errors: each status comes as its own exception class with .code, .status and the
server's message unchanged; authentication and limits on a strict server."""
import pickle

import numpy as np
import pytest

import tensorport as tp
from tensorport import errors


def test_every_code_has_its_class():
    for number, code in errors.CODES.items():
        e = errors.error_for(number, "message %d" % number)
        assert type(e) is not tp.Error and isinstance(e, tp.Error)
        assert (e.code, e.status, e.message, str(e)) == (code, number, "message %d" % number,
                                                         "message %d" % number)
        assert type(e).__name__.lower() == code.replace("_", "").lower()
        assert getattr(tp, type(e).__name__) is type(e)
        again = pickle.loads(pickle.dumps(e))
        assert type(again) is type(e) and again.message == e.message
    assert isinstance(errors.error_for(3, "x"), ValueError)
    assert isinstance(errors.error_for(5, "x"), LookupError)
    odd = errors.error_for(99, "from the future")
    assert type(odd) is tp.Error and odd.code == "UNKNOWN"
    assert "NotFound" in repr(errors.error_for(5, "gone"))


def test_not_found(client):
    with pytest.raises(tp.NotFound, match="no tensor named 'missing'") as e:
        client.tensor("missing")
    assert e.value.code == "NOT_FOUND" and e.value.status == 5
    with pytest.raises(tp.NotFound, match="no tensor with that handle"):
        client.get("0123456789abcdef0123456789abcdef")
    t = client.put(np.ones(3))
    t.free()
    for call in (t.info, t.numpy, t.free, lambda: t.to(dtype="float32"),
                 lambda: t.view((3,), (1,)), t.sync):
        with pytest.raises(tp.NotFound):
            call()


def test_invalid_argument(client):
    t = client.put(np.ones((2, 3), np.float32))
    with pytest.raises(tp.InvalidArgument) as e:
        t.view((2, 3), (-1, 1))
    assert e.value.code == "INVALID_ARGUMENT" and "strides" in str(e.value)
    with pytest.raises(tp.InvalidArgument):
        t.to(device="gpu:7")
    with pytest.raises(tp.InvalidArgument, match="required rank 4 tensor to use channels_last"):
        t.contiguous("channels_last")
    with pytest.raises(tp.InvalidArgument):
        client.put(np.ones(3), device="sim:9")
    with pytest.raises(ValueError):  # InvalidArgument is a ValueError too
        client.put(np.ones(3), ttl=-1)
    with pytest.raises(tp.InvalidArgument):
        client.tensor("x" * 200)


def test_already_exists(client):
    client.put(np.ones(3), name="twice")
    with pytest.raises(tp.AlreadyExists, match="'twice' already exists"):
        client.put(np.ones(3), name="twice")
    client.free("twice")


def test_unavailable(tmp_path):
    with pytest.raises(tp.Unavailable) as e:
        tp.Client("ipc://" + str(tmp_path / "nobody.sock"), timeout=2)
    assert e.value.code == "UNAVAILABLE" and "nobody.sock" in str(e.value)


def test_unauthenticated_and_secrets(strict_server, monkeypatch):
    with pytest.raises(tp.Unauthenticated) as e:
        tp.Client(strict_server.url, tenant="alice")
    assert e.value.code == "UNAUTHENTICATED"
    with pytest.raises(tp.Unauthenticated):
        tp.Client(strict_server.url, tenant="alice", secret="00" * 32)
    with tp.Client(strict_server.url, tenant="alice", secret_file=strict_server.secret_file) as c:
        assert c.put(np.ones(2)).shape == (2,)
    with tp.Client(strict_server.url, tenant="alice", secret=strict_server.secret) as c:
        assert c.list() == [] or all(isinstance(t, tp.Tensor) for t in c.list())
    monkeypatch.setenv("TPORT_SECRET_FILE", strict_server.secret_file)
    monkeypatch.setenv("TPORT_TENANT", "alice")
    with tp.Client(strict_server.url) as c:
        assert c.stats()["tensors"] >= 0


def test_resource_exhausted(strict_server):
    with tp.Client(strict_server.url, tenant="alice", secret_file=strict_server.secret_file) as c:
        with pytest.raises(tp.ResourceExhausted, match="limit per tensor") as e:
            c.put(np.zeros(1 << 18))  # 2 MiB, the limit is 1 MiB
        assert e.value.code == "RESOURCE_EXHAUSTED"
        t = c.put(np.zeros(100_000))  # 800 kB
        with pytest.raises(tp.ResourceExhausted):
            t.to(dtype="complex128")  # 1.6 MB


def test_failed_precondition_on_a_closed_client(server):
    c = tp.Client(server.url)
    c.close()
    with pytest.raises(tp.FailedPrecondition, match="closed") as e:
        c.list()
    assert e.value.code == "FAILED_PRECONDITION"
