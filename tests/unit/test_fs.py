import random

import pytest

from hvdtrain.core.errors import AccessDenied, ConfigError, DataError
from hvdtrain.hadoop import fs
from hvdtrain.hadoop.webhdfs import WebHdfsHandler


def test_local_paths_and_file_uris_round_trip(tmp_path):
    target = tmp_path / "a" / "b.bin"
    fs.write_bytes_atomic(str(target), b"hello")
    assert fs.read_bytes(f"file://{target}") == b"hello"
    assert fs.exists(str(target)) and fs.size(str(target)) == 5
    assert fs.listdir(str(tmp_path / "a")) == ["b.bin"]  # no temporary file left behind
    fs.move(str(target), str(tmp_path / "c.bin"))
    assert not fs.exists(str(target))
    fs.delete(str(tmp_path / "a"))
    assert not fs.exists(str(tmp_path / "a"))
    fs.delete(str(tmp_path / "missing"))  # deleting nothing is fine


def test_atomic_write_replaces_whole_file(tmp_path):
    path = str(tmp_path / "m.json")
    fs.write_bytes_atomic(path, b"old")
    fs.write_bytes_atomic(path, b"new content")
    assert fs.read_bytes(path) == b"new content"


def test_unknown_scheme_is_a_clear_error():
    with pytest.raises(DataError, match="unsupported filesystem in 's3://b/x'"):
        fs.resolve("s3://b/x")


class Flaky:
    """Fails the first k calls with the given error, then succeeds."""

    def __init__(self, k, exc):
        self.k, self.exc, self.calls = k, exc, 0

    def __call__(self):
        self.calls += 1
        if self.calls <= self.k:
            raise self.exc
        return "ok"


def test_transient_errors_are_retried_with_backoff():
    sleeps = []
    fn = Flaky(3, ConnectionResetError("connection reset by peer"))
    assert fs.with_retries(fn, "read x", sleep=sleeps.append, rng=random.Random(0)) == "ok"
    assert fn.calls == 4 and len(sleeps) == 3
    # full jitter: delay k is uniform in [0, base * 2**(k-1)]; the same seed replays the same draws
    policy, replay = fs.RetryPolicy(), random.Random(0)
    assert sleeps == pytest.approx([replay.random() * policy.base_delay * 2 ** k for k in range(3)])


def test_backoff_bounds_grow_geometrically_up_to_the_cap():
    policy = fs.RetryPolicy(attempts=9, base_delay=0.1, max_delay=5.0)
    rng = random.Random(7)
    draws = {a: [policy.delay(a, rng) for _ in range(2000)] for a in range(1, 9)}
    for a, delays in draws.items():
        cap = min(policy.max_delay, 0.1 * 2 ** (a - 1))
        assert 0 <= min(delays) and max(delays) <= cap  # within the jitter bounds
        assert max(delays) > 0.98 * cap and sum(delays) / len(delays) == pytest.approx(cap / 2, rel=0.05)
    means = [sum(draws[a]) / len(draws[a]) for a in range(1, 7)]  # 0.1 .. 3.2: below the 5 s cap
    assert [m2 / m1 for m1, m2 in zip(means, means[1:])] == pytest.approx([2.0] * 5, rel=0.1)


def test_retries_give_up_with_path_and_last_error():
    fn = Flaky(10, TimeoutError("timed out"))
    with pytest.raises(DataError, match="read hdfs://x/y: failed after 5 attempts; last error: timed out"):
        fs.with_retries(fn, "read hdfs://x/y", sleep=lambda s: None)


def test_permanent_errors_fail_at_once():
    fn = Flaky(1, FileNotFoundError("no such file"))
    with pytest.raises(FileNotFoundError):
        fs.with_retries(fn, "read x", sleep=lambda s: None)
    assert fn.calls == 1


HDFS_DENIAL = ('/user/a/data/manifest.json: Permission denied: user=mallory, access=READ, '
               'inode="/user/a/data/manifest.json":alice:supergroup:-rw-r-----')


@pytest.mark.parametrize("exc, hint", [
    (PermissionError(HDFS_DENIAL), "hdfs dfs -chmod or -setfacl"),  # WebHDFS (hvdtrain.hadoop.webhdfs)
    (OSError("HDFS open failed\norg.apache.hadoop.security.AccessControlException: " + HDFS_DENIAL.split(": ", 1)[1]
             + "\n\tat org.apache.hadoop.hdfs.server.namenode.FSPermissionChecker.check"), "-setfacl"),  # libhdfs
    (PermissionError(13, "Permission denied", "/data/x"), "(chmod, chown)"),  # a local folder
])
def test_a_denied_path_is_one_line_naming_it_at_once_never_retried(exc, hint):
    """#56 item 2: a refused user gets one line (what was tried, the storage's words: user, access, the path's
    owner and mode) and a fix, at the first refusal: a permission does not come back by retrying."""
    fn = Flaky(5, exc)
    with pytest.raises(AccessDenied) as info:
        fs.with_retries(fn, "read hdfs://nn/user/a/data/manifest.json", sleep=lambda s: None)
    message = str(info.value)
    assert fn.calls == 1 and "\n" not in message and hint in message
    assert message.startswith("read hdfs://nn/user/a/data/manifest.json: ")
    assert isinstance(info.value, DataError) and isinstance(info.value, PermissionError)  # exit 3; still an OSError
    if "user=" in str(exc):
        assert 'Permission denied: user=mallory, access=READ, inode="/user/a/data/manifest.json":alice:supergroup:' \
               '-rw-r-----; ask the owner' in message and "FSPermissionChecker" not in message


def test_gz_names_are_copied_as_stored_bytes_never_recompressed(tmp_path):
    # pyarrow's streams detect compression from a ".gz" name by default; shards are framed (and
    # compressed) by the writer, so the filesystem layer must move their bytes untouched.
    payload = bytes(range(256)) * 64
    uri = fs.join(str(tmp_path), "part-0.tfrecord.gz")
    with fs.open_output(uri) as fh:
        fh.write(payload)
    assert (tmp_path / "part-0.tfrecord.gz").read_bytes() == payload
    with fs.open_input(uri) as fh:
        assert fh.read() == payload
    assert fs.copy_to_local(uri, str(tmp_path / "copy.gz")) == len(payload)
    assert (tmp_path / "copy.gz").read_bytes() == payload


# -- permissions (#54): hvdtrain's HDFS writes withhold HVDTRAIN_HDFS_UMASK, not the cluster's 022 ------------

@pytest.mark.parametrize("raw, umask", [(None, 0o027), ("", 0o027), ("077", 0o077), ("0022", 0o022)])
def test_the_hdfs_umask_comes_from_the_environment_with_a_group_only_default(raw, umask):
    assert fs.hdfs_umask({} if raw is None else {fs.UMASK_ENV: raw}) == umask


@pytest.mark.parametrize("raw", ["27", "0o27", "888", "rwx", "00277"])
def test_a_bad_hdfs_umask_is_one_line_naming_the_variable_and_value(raw):
    with pytest.raises(ConfigError) as err:
        fs.hdfs_umask({fs.UMASK_ENV: raw})
    assert fs.UMASK_ENV in str(err.value) and repr(raw) in str(err.value) and "\n" not in str(err.value)


def test_webhdfs_creates_files_and_folders_with_the_umask_applied():
    handler = WebHdfsHandler("http://nn:9870", user="u", umask=0o027)
    assert (handler.file_mode, handler.dir_mode) == ("640", "750")
    assert WebHdfsHandler("http://nn:9870", umask=0o077).file_mode == "600"
    assert handler != WebHdfsHandler("http://nn:9870", user="u", umask=0o022)  # pyarrow caches by equality
    conf = fs.spark_umask_conf({fs.UMASK_ENV: "077"})
    assert conf["spark.hadoop.fs.permissions.umask-mode"] == "077" and conf[f"spark.executorEnv.{fs.UMASK_ENV}"] == "077"


def test_set_permission_on_a_local_path(tmp_path):
    (tmp_path / "d").mkdir()
    fs.set_permission(str(tmp_path / "d"), fs.PRIVATE_DIR)
    assert fs.permission(str(tmp_path / "d")) == 0o700
