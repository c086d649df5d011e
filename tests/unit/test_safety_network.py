"""Network exposure (#28 item 16): /metrics on loopback by default, swebhdfs:// over verified TLS."""
from __future__ import annotations

import subprocess
import urllib.request

import pytest
import requests

from hvdtrain.core import config
from hvdtrain.core.errors import ConfigError, EnvironmentProblem
from hvdtrain.hadoop import fs
from hvdtrain.observe import monitoring
from tests.support.webhdfs_server import WebHdfsServer


def test_metrics_bind_to_loopback_unless_told_otherwise(tmp_path):
    assert config.from_dict({}).monitoring.addr == "127.0.0.1"
    with pytest.raises(ConfigError, match="monitoring.addr must be an IP address"):
        config.from_dict({"monitoring": {"addr": "all"}})
    exporter = monitoring.Exporter(monitoring.Metrics("j", "r", 0, "h"), str(tmp_path / "m.prom"), 60, port=0)
    with exporter.start():
        host, port = exporter._server.server_address[:2]
        assert host == "127.0.0.1"
        assert b"hvdtrain_training_active" in urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read()


@pytest.fixture
def tls_files(tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    return str(cert), str(key)


def test_swebhdfs_speaks_verified_tls(tmp_path, tls_files, monkeypatch):
    root = tmp_path / "hdfs"
    root.mkdir()
    with WebHdfsServer(str(root), tls=tls_files) as server:
        uri = server.uri("/data/a.txt")
        assert uri.startswith("swebhdfs://")
        monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
        fs._webhdfs.cache_clear()
        # A certificate nobody vouched for is refused: one line naming the fix, the TLS error as its cause.
        with pytest.raises(EnvironmentProblem, match="TLS certificate is not trusted here") as refused:
            fs.write_bytes_atomic(uri, b"x")
        assert isinstance(refused.value.__cause__, requests.exceptions.SSLError)
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", tls_files[0])
        fs._webhdfs.cache_clear()
        fs.write_bytes_atomic(uri, b"over tls")
        assert fs.read_bytes(uri) == b"over tls"
    assert (root / "data" / "a.txt").read_bytes() == b"over tls"
    fs._webhdfs.cache_clear()
