"""Hadoop token files as WebHDFS delegation strings (hvdtrain.hadoop.hadoop_tokens).

The two files in tests/unit/data were written by Hadoop 3.4.1's own ``Credentials.writeTokenStorageFile`` (one
HDFS delegation token from a ``hvdtrain cluster up --secure`` NameNode, in each of its two formats); JAVA_URL is
what Hadoop's ``Token.encodeToUrlString`` gave for that token."""
from __future__ import annotations

from pathlib import Path

import pytest

from hvdtrain.core.errors import EnvironmentProblem
from hvdtrain.hadoop import hadoop_tokens
from hvdtrain.hadoop.hadoop_tokens import Token

DATA = Path(__file__).parent / "data"
JAVA_URL = ("LgAUaHZkdHJhaW5ARVhBTVBMRS5DT00GaGFkb29wAIoBoh4lGlaKAaJCMZ5WAgIURYXox6IMHnIEXA-k4P4_di-PtMIVSERGU19ERUx"
            "FR0FUSU9OX1RPS0VODzEyNy4wLjAuMTo0NDM2NQ")


@pytest.mark.parametrize("name", ["hadoop-tokens-writable.bin", "hadoop-tokens-protobuf.bin"])
def test_a_token_file_in_either_format_gives_hadoops_own_url_string(name: str) -> None:
    tokens = hadoop_tokens.read_token_file((DATA / name).read_bytes())
    assert [(t.kind, t.service) for t in tokens] == [("HDFS_DELEGATION_TOKEN", "127.0.0.1:44365")]
    assert hadoop_tokens.url_string(tokens[0]) == JAVA_URL


def test_vlongs_round_trip_as_hadoop_writes_them() -> None:
    import io

    for value in (0, 1, -1, 127, -112, 128, -113, 255, 300, 65536, -70000, 2 ** 40, -(2 ** 40)):
        encoded = hadoop_tokens._write_vlong(value)
        assert hadoop_tokens._read_vlong(io.BytesIO(encoded)) == value, value
    assert hadoop_tokens._write_vlong(128) == bytes([0x8F, 0x80])  # WritableUtils: -113, then one byte


def test_the_token_for_the_namenode_is_picked_by_its_service() -> None:
    a = Token(b"a", b"", "HDFS_DELEGATION_TOKEN", "10.0.0.1:8020")
    b = Token(b"b", b"", "HDFS_DELEGATION_TOKEN", "10.0.0.2:9000")
    rm = Token(b"r", b"", "RM_DELEGATION_TOKEN", "10.0.0.3:8032")
    assert hadoop_tokens.hdfs_token([rm, a, b], "nn2:9000") is b  # by port when the names differ
    assert hadoop_tokens.hdfs_token([rm, a, b], "10.0.0.1:8020") is a
    assert hadoop_tokens.hdfs_token([rm, a], "elsewhere:1") is a  # the only HDFS one
    assert hadoop_tokens.hdfs_token([rm], "10.0.0.3:8032") is None


def test_not_a_token_file_is_refused() -> None:
    with pytest.raises(ValueError, match="HDTS"):
        hadoop_tokens.read_token_file(b"PK\x03\x04zip")
    with pytest.raises(ValueError, match="truncated"):
        hadoop_tokens.read_token_file((DATA / "hadoop-tokens-writable.bin").read_bytes()[:30])


def test_kerberos_is_read_from_core_site() -> None:
    assert hadoop_tokens.kerberos_enabled({"hadoop.security.authentication": "Kerberos"})
    assert not hadoop_tokens.kerberos_enabled({})


def test_a_kerberos_cluster_without_a_ticket_is_one_line_and_a_keytab_is_used(tmp_path, monkeypatch) -> None:
    import shutil
    from types import SimpleNamespace

    from yarn import submit

    (tmp_path / "core-site.xml").write_text(
        "<configuration><property><name>hadoop.security.authentication</name><value>kerberos</value></property>"
        "</configuration>")
    monkeypatch.setattr(shutil, "which", lambda name: None)  # no klist: the credential cache file decides
    monkeypatch.setenv("KRB5CCNAME", f"FILE:{tmp_path}/none")
    with pytest.raises(EnvironmentProblem) as err:
        submit.kerberos_login(str(tmp_path), SimpleNamespace(principal=None, keytab=None))
    assert str(err.value) == (f"the cluster uses Kerberos (hadoop.security.authentication=kerberos in {tmp_path}/"
                              f"core-site.xml) and there is no Kerberos credential cache ({tmp_path}/none): run "
                              "`kinit USER@REALM`, or pass --principal USER@REALM --keytab FILE")
    try:
        submit.kerberos_login(str(tmp_path), SimpleNamespace(principal="ml@R", keytab="/k"))
        assert hadoop_tokens.keytab_without_ticket()  # the yarn CLI would fail: YarnClient from the keytab
    finally:
        hadoop_tokens.forget()
    (tmp_path / "none").write_text("")  # a ticket cache exists
    submit.kerberos_login(str(tmp_path), SimpleNamespace(principal=None, keytab=None))
    (tmp_path / "core-site.xml").write_text("<configuration/>")  # not a Kerberos cluster: nothing asked
    (tmp_path / "none").unlink()
    submit.kerberos_login(str(tmp_path), SimpleNamespace(principal=None, keytab=None))


def test_two_namenodes_on_one_port_are_never_guessed_between() -> None:
    a = Token(b"a", b"", "HDFS_DELEGATION_TOKEN", "10.0.0.1:8020")
    b = Token(b"b", b"", "HDFS_DELEGATION_TOKEN", "10.0.0.2:8020")
    assert hadoop_tokens.hdfs_token([a, b], "10.0.0.2:8020") is b  # the exact service first
    assert hadoop_tokens.hdfs_token([a, b], "nn1.example.com:8020") is None  # two on that port: no guess
    assert hadoop_tokens.hdfs_token([a], "nn1.example.com") is a  # no port: 8020


def test_the_drivers_token_serves_only_its_namenode_and_a_bad_token_file_is_named(tmp_path) -> None:
    env = {hadoop_tokens.TOKEN_ENV: "T0KEN", hadoop_tokens.TOKEN_FS_ENV: "hdfs://nn:8020",
           hadoop_tokens.TOKEN_FILE_ENV: str(DATA / "hadoop-tokens-writable.bin")}
    try:
        assert hadoop_tokens.webhdfs_token("hdfs://nn:8020", env) == "T0KEN"
        assert hadoop_tokens.webhdfs_token("hdfs://other:44365", env) == JAVA_URL  # the container's, by its port
        bad = tmp_path / "tokens"
        bad.write_bytes(b"HDTS\x07junk")
        with pytest.raises(EnvironmentProblem, match=rf"HADOOP_TOKEN_FILE_LOCATION={bad} is not a Hadoop token file"):
            hadoop_tokens.webhdfs_token("hdfs://other:1", {hadoop_tokens.TOKEN_FILE_ENV: str(bad)})
    finally:
        hadoop_tokens.forget()


def test_a_delegation_token_in_an_error_is_masked() -> None:
    from hvdtrain.core import secrets

    text = ("HTTPConnectionPool(host='nn', port=9870): Max retries exceeded with url: "
            "/webhdfs/v1/a?op=GETFILESTATUS&delegation=LgAUaHZkdHJh-_x&user.name=x (Caused by ...)")
    assert secrets.redact_text(text) == text.replace("LgAUaHZkdHJh-_x", "***")


def test_the_ranks_token_is_renewed_sooner_when_renewing_is_slow():
    """The Kerberos tier's job failed once on a loaded host: its token (60 s renewal interval) lapsed 41 ms before a
    renewal begun half way there came back. A renewal is a Python and a JVM started: the slower the last one was,
    the earlier the next begins (three such renewals fit before the lapse), never before a quarter of the way."""
    assert hadoop_tokens.renewal_wait(86400, 5) == 43200  # a production interval: half way, as before
    assert hadoop_tokens.renewal_wait(60, 2) == 30
    assert hadoop_tokens.renewal_wait(60, 12) == 24  # 60 - 3 x 12
    assert hadoop_tokens.renewal_wait(60, 40) == 15  # a quarter of the way at the earliest
    assert hadoop_tokens.renewal_wait(-5, 1) == 0  # already lapsed: at once
