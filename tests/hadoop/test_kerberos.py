"""On a Kerberos cluster: ``hvdtrain cluster up --secure`` (a MiniKdc; every daemon and client authenticated).

The cluster's tickets last 80 s and its delegation tokens lapse unless renewed every 60 s, so that one short
YARN job outlives both: ``hvdtrain yarn submit --principal --keytab`` trains on two executors, the ranks' Python
reaching HDFS through WebHDFS with a delegation token the driver renews from the keytab, and ends SUCCEEDED with
its final state read through Hadoop's YarnClient logged in from the keytab (there is no ticket cache). Without a
ticket, a submission is one line at once (spark-submit alone would retry for minutes).
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from hvdtrain.data.synthetic import Layout, TextSpec, make_text_dataset
from hvdtrain.hadoop import fs, hadoop_tokens
from hvdtrain.hadoop.minicluster import cluster
from hvdtrain.runtime import startup
from hvdtrain.training import checkpoint
from tests.hadoop.conftest import _delete_in_background, cluster_env, packed_env
from tests.multiprocess.test_yarn_local import REPO, read_records, submit_command, submit_env, write_job
from yarn.packaging import PACK_CACHE_ENV

pytestmark = pytest.mark.hadoop

TICKET_SECONDS, RENEW_SECONDS = 80, 60


@pytest.fixture(scope="module")
def secure_cluster(hadoop_cluster: dict) -> Iterator[dict]:
    """A second, Kerberos, cluster (the tier's plain one stays up meanwhile; it is idle). One NodeManager: the
    application master and both executors (one core each) fit on it, so the env archive is localized once (two
    NodeManagers are the plain cluster's test): 8 GB for two training executors' containers of 2,944 MB (each
    with its rank's 1.5 GB, under the NodeManager's memory check) and the application master's."""
    packed_env(hadoop_cluster)  # its job uploads the session's archive
    home = tempfile.mkdtemp(prefix="hvdtrain-kerberos-")
    spec = cluster.ClusterSpec(home=home, start_timeout=600, owner_pid=os.getpid(),
                               secure=True, nodemanagers=1, nm_memory_mb=8192, ticket_seconds=TICKET_SECONDS,
                               token_renew_seconds=RENEW_SECONDS,
                               token_max_seconds=1800)
    try:
        details = cluster.up(spec)
        details["env"] = {**cluster.client_env(details),
                          "PATH": f"{spec.bin_dir}{os.pathsep}{os.environ['PATH']}",
                          "HVDTRAIN_CLUSTER_HOME": home, "KRB5CCNAME": f"FILE:{home}/no-ticket-cache",
                          PACK_CACHE_ENV: hadoop_cluster["env"][PACK_CACHE_ENV]}
        yield details
    finally:
        cluster.down(spec, quiet=True)
        _delete_in_background(home)


def test_secure_cluster_status_names_the_kdc_and_the_users_keytab(secure_cluster: dict) -> None:
    assert secure_cluster["realm"] == "EXAMPLE.COM" and secure_cluster["kdc"].startswith("127.0.0.1:")
    assert secure_cluster["principal"] == "hvdtrain@EXAMPLE.COM" and os.path.isfile(secure_cluster["keytab"])
    described = cluster.describe(secure_cluster)
    assert f"--principal hvdtrain@EXAMPLE.COM --keytab {secure_cluster['keytab']}" in described
    assert f"SPARK_SUBMIT_OPTS=-Djava.security.krb5.conf={secure_cluster['krb5_conf']}" in described
    core = Path(secure_cluster["hadoop_conf_dir"], "core-site.xml").read_text()
    assert "<name>hadoop.security.authentication</name><value>kerberos</value>" in core
    # The keytab logs in, and the KDC's tickets are as short as asked (the job below outlives one).
    with cluster_env(secure_cluster), keytab_login(secure_cluster), hadoop_tokens.logged_in_jvm() as (jvm, _):
        user = jvm.org.apache.hadoop.security.UserGroupInformation.getLoginUser()
        tickets = user.getSubject().getPrivateCredentials(
            jvm.java.lang.Class.forName("javax.security.auth.kerberos.KerberosTicket")).toArray()
        lifetimes = [(t.getEndTime().getTime() - t.getStartTime().getTime()) / 1000 for t in tickets]
        name, kerberos = str(user.getUserName()), bool(user.hasKerberosCredentials())
    assert name == "hvdtrain@EXAMPLE.COM" and kerberos and lifetimes == [TICKET_SECONDS], (name, lifetimes)


def test_without_a_ticket_hadoop_refuses_and_hvdtrain_says_so_in_one_line(secure_cluster: dict,
                                                                           tmp_path: Path) -> None:
    with cluster_env(secure_cluster):
        # Hadoop's own client is refused: the cluster really checks (a plain cluster would answer).
        ls = subprocess.run(["hdfs", "dfs", "-ls", "/"], capture_output=True, text=True, timeout=120)
        assert ls.returncode != 0 and "Client cannot authenticate via:[TOKEN, KERBEROS]" in ls.stderr, ls.stderr
        with pytest.raises(Exception, match="uses Kerberos .* there is no Kerberos credential cache"):
            fs.exists(f"{secure_cluster['fs_default']}/tmp")
        job = write_job(tmp_path, "noticket", f"{secure_cluster['fs_default']}/none", f"{tmp_path}/out",
                        yarn=cluster.yarn_settings(f"{secure_cluster['fs_default']}/user/hvdtrain/envs",
                                                   cluster.pyspark_jars_dir()))
        start = time.monotonic()
        proc = subprocess.run(submit_command(job, "--num-workers", "2"), cwd=REPO, capture_output=True, text=True,
                              env=submit_env(), timeout=300)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode != 0 and "spark-submit" not in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "the cluster uses Kerberos (hadoop.security.authentication=kerberos in" in last, last
    assert "run `kinit USER@REALM`, or pass --principal USER@REALM --keytab FILE" in last
    print(f"no-ticket submission refused in {time.monotonic() - start:.0f}s: {last}")


@pytest.fixture(scope="module")
def secure_dataset(secure_cluster: dict, tmp_path_factory: pytest.TempPathFactory) -> str:
    local = tmp_path_factory.mktemp("kerberos-data")
    make_text_dataset(str(local), TextSpec(layout=Layout(n_per_split={"train": 480, "validation": 61, "test": 67},
                                                         shards_per_split=4), class_rate=0.35, seed=11))
    remote = f"{secure_cluster['fs_default']}/user/hvdtrain/synthetic"
    with cluster_env(secure_cluster), keytab_login(secure_cluster):
        for name in sorted(p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file()):
            fs.copy_from_local(str(local / name), f"{remote}/{name}")
    return remote


@contextlib.contextmanager
def keytab_login(details: dict) -> Iterator[None]:
    """This test process's HDFS calls log in from the user's keytab (as ``--principal/--keytab`` does)."""
    hadoop_tokens.use_keytab(details["principal"], details["keytab"])
    try:
        yield
    finally:
        hadoop_tokens.forget()


@pytest.mark.timeout(1800)
def test_keytab_submission_trains_on_hdfs_through_ticket_expiry_and_token_renewal(
        secure_cluster: dict, secure_dataset: str, tmp_path: Path) -> None:
    root = secure_cluster["fs_default"]
    output = f"{root}/user/hvdtrain/train"
    job = write_job(tmp_path, "kerberostrain", secure_dataset, output, epochs=EPOCHS,
                    yarn=cluster.yarn_settings(f"{root}/user/hvdtrain/envs", cluster.pyspark_jars_dir()))  # its home
    doc: dict[str, Any] = yaml.safe_load(job.read_text())
    doc["checkpoint"].update({"dir": f"{output}-checkpoints", "every_steps": 15, "keep_last": 2})
    job.write_text(yaml.safe_dump(doc, sort_keys=False))
    start = time.time()
    with cluster_env(secure_cluster):
        proc = subprocess.run(submit_command(job, "--num-workers", "2", "--principal", secure_cluster["principal"],
                                             "--keytab", secure_cluster["keytab"]),
                              cwd=REPO, capture_output=True, text=True, env=submit_env(), timeout=1500)
        out = proc.stdout + proc.stderr
        (tmp_path / "submit.log").write_text(out)
        assert proc.returncode == 0, f"{out[-8000:]}\nwhole output: {tmp_path / 'submit.log'}"
        assert "env archive: uploading" in out  # the submitter's own WebHDFS calls, with a token from the keytab
        app = re.search(r"application_\d+_\d+", out)
        assert app and f"hvdtrain: {app.group(0)} ended FINISHED/SUCCEEDED" in out, out[-4000:]
        renewed = re.search(r"HDFS delegation token was renewed (\d+) times", out)
        assert renewed and int(renewed.group(1)) >= 1, out[-4000:]
        with keytab_login(secure_cluster):  # this process reads what the job wrote
            result = read_records(f"{output}/yarn_result.json")  # written by the driver while Spark ran
            assert result["ok"] and result["world_size"] == 2, result
            assert checkpoint.latest_valid(f"{output}-checkpoints") is not None  # the ranks' checkpoints
            filesystem, path = fs.resolve(f"{output}/model.keras")  # rank 0's export
            written = filesystem.get_file_info(path).mtime.timestamp()
            phases = json.loads(fs.read_bytes(f"{output}/eval_report.json"))["startup"]
    took = time.time() - start
    print(f"Kerberos job start-up: {startup.describe(phases)}")
    print(f"Kerberos job: {took:.0f}s from submission; tickets last {TICKET_SECONDS}s, tokens lapse unless renewed "
          f"every {RENEW_SECONDS}s; the ranks' token renewed {renewed.group(1)} times; export written "
          f"{written - start:.0f}s after submission")
    # The ranks' last HDFS write (the export) came after the tickets first issued had lapsed.
    assert written - start > TICKET_SECONDS, (written - start, out[-3000:])


# Long enough that the export comes well after the first tickets lapse (at 80 s) on a faster host too: here it
# came 93 s after submission with 20 epochs (training about 1.4 s an epoch) and 125 s with 36.
EPOCHS = 30
