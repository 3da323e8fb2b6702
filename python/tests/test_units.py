"""Sizes and durations as people type them: libtport's parser (the one tport's
and tportd's flags use) behind tensorport.parse_size/parse_duration and the
ttl= and timeout= arguments; libtport's TPORT_* variables refused when wrong."""
import datetime

import numpy as np
import pytest

import tensorport as tp


def test_parse_size_and_duration():
    assert tp.parse_size("4096") == 4096
    assert tp.parse_size("1.5G") == 3 << 29
    assert tp.parse_size("64 GiB") == 64 << 30
    assert tp.parse_size("2KB") == 2000
    assert tp.parse_duration("1.5h") == 5400.0
    assert tp.parse_duration("500ms") == 0.5
    assert tp.parse_duration("30") == 30.0  # a bare number is seconds
    for bad, why in (("-1", "negative"), ("lots", "not a number"), ("1.5B", "whole"),
                     ("99999999999999999999", "out of range"), ("3 parsecs", "unknown unit")):
        with pytest.raises(tp.InvalidArgument, match=why) as e:
            tp.parse_size(bad, "cache")
        assert str(e.value).startswith("cache: ") and "64GiB" in str(e.value)
    with pytest.raises(tp.InvalidArgument, match="500ms"):
        tp.parse_duration("10 fortnights")


def test_ttl_takes_a_string(client):
    # the server's longest ttl is 7 days (--max-ttl): the string is read as
    # days, not seconds, exactly when both are taken at their word
    t = client.put(np.ones(3), name="ttl-7d", ttl="7d")
    u = t.to(device="sim:0", name="ttl-to", ttl="10m")
    client.put(np.ones(3), name="ttl-td", ttl=datetime.timedelta(minutes=5)).free()
    with pytest.raises(tp.Error, match="691200000"):  # 8 days in ms, past the limit
        client.put(np.ones(3), name="ttl-8d", ttl="8d")
    with pytest.raises(tp.InvalidArgument, match="ttl: '10x' is an unknown unit"):
        client.put(np.ones(3), name="ttl-bad", ttl="10x")
    with pytest.raises(tp.InvalidArgument, match="negative"):
        client.put(np.ones(3), ttl=-1)
    with pytest.raises(tp.InvalidArgument, match="ttl"):
        client.put(np.ones(3), ttl=[1])
    t.free()
    u.free()


def test_timeout_takes_a_string(server):
    with tp.Client(server.url, timeout="5s") as c:
        assert c.stats()["tensors"] >= 0
    with tp.Client(server.url, timeout=datetime.timedelta(seconds=3)) as c:
        c.stats()
    with pytest.raises(tp.InvalidArgument, match="timeout: 'soon'"):
        tp.Client(server.url, timeout="soon")
    with pytest.raises(tp.InvalidArgument, match="24 days"):
        tp.Client(server.url, timeout="30d")


@pytest.mark.parametrize("var,value", [("TPORT_SHM", "off"), ("TPORT_CUDA_IPC", "no"),
                                       ("TPORT_SHM_DIRECT", "maybe"),
                                       ("TPORT_COPY_THREADS", "many"),
                                       ("TPORT_COPY_THREADS", "0"),
                                       ("TPORT_COPY_THREADS", "-2"),
                                       ("TPORT_GET_CACHE_BYTES", "lots"),
                                       ("TPORT_GET_CACHE_BYTES", "-1")])
def test_a_wrong_variable_fails_connect(server, monkeypatch, var, value):
    # once a value that did not parse meant the default without a word
    monkeypatch.setenv(var, value)
    with pytest.raises(tp.InvalidArgument, match="%s='%s'" % (var, value)):
        tp.Client(server.url)
    monkeypatch.setenv(var, "1")
    tp.Client(server.url).close()
