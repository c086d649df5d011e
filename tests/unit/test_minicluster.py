"""The one-machine Hadoop's plan (hvdtrain/hadoop/minicluster) and the hdfs:// -> WebHDFS mapping (pure parts)."""
from __future__ import annotations

import os
import socket

import pyarrow.fs as pafs
import pytest

from hvdtrain.core.errors import DataError, EnvironmentProblem, StorageError
from hvdtrain.hadoop import fs, hadoop_conf
from hvdtrain.hadoop.minicluster import cluster

HDFS_SITE = """<?xml version="1.0"?><configuration>
<property><name>dfs.namenode.rpc-address</name><value>localhost:41000</value></property>
<property><name>dfs.namenode.http-address</name><value>localhost:41001</value></property>
<property><name>dfs.ha.namenodes.prod</name><value>nn1,nn2</value></property>
<property><name>dfs.namenode.rpc-address.prod.nn1</name><value>nn1.example:8020</value></property>
<property><name>dfs.namenode.http-address.prod.nn1</name><value>nn1.example:9870</value></property>
<property><name>dfs.namenode.rpc-address.prod.nn2</name><value>nn2.example:8020</value></property>
<property><name>dfs.namenode.http-address.prod.nn2</name><value>nn2.example:9870</value></property>
</configuration>"""
CORE_SITE = """<configuration><property><name>fs.defaultFS</name><value>hdfs://localhost:41000</value></property>
</configuration>"""


def test_hadoop_version_follows_pysparks_client_jar():
    assert cluster.hadoop_version_of(["spark-core_2.13-4.0.1.jar", "hadoop-client-api-3.4.1.jar",
                                      "hadoop-client-runtime-3.4.1.jar"]) == "3.4.1"
    assert cluster.hadoop_version_of(["parquet-hadoop-1.15.2.jar"]) is None
    assert cluster.pyspark_hadoop_version() == "3.4.1"  # the installed pyspark 4.0.x


def test_every_address_is_loopback_and_the_nodemanagers_fit_an_am_and_two_executors(tmp_path):
    spec = cluster.ClusterSpec(home=str(tmp_path))
    ports = cluster.Ports(1, 2, 3, 4, 5, 6, 7)
    settings = cluster.hadoop_settings(spec, ports)
    addresses = {k: v for k, v in settings.items() if k.endswith("address")}
    assert len(addresses) == 8 and all(v.startswith("127.0.0.1:") for v in addresses.values())
    assert settings["yarn.resourcemanager.address"] == "127.0.0.1:3"
    assert settings["yarn.resourcemanager.webapp.address"] == "127.0.0.1:7"
    assert int(settings["yarn.nodemanager.resource.memory-mb"]) * spec.nodemanagers >= 3 * 2048
    # vcores count (DRF): an application master (1) and a 2-core executor share a NodeManager, two such
    # executors cannot, so a 2-rank job with 2-core executors spans both NodeManagers
    assert settings["yarn.scheduler.capacity.resource-calculator"].endswith(".DominantResourceCalculator")
    vcores = int(settings["yarn.nodemanager.resource.cpu-vcores"])
    assert 1 + 2 <= vcores < 2 + 2 and spec.nodemanagers == 2
    # Log aggregation as on a production cluster: one HDFS folder for clients and NodeManagers (the per-format key
    # wins over the folder per NodeManager MiniYARNCluster sets), kept 7 days, rolled hourly for jobs that ask
    assert settings["yarn.log-aggregation-enable"] == "true"
    assert settings["yarn.nodemanager.remote-app-log-dir"] == "/app-logs"
    assert settings["yarn.log-aggregation.TFile.remote-app-log-dir"] == "/app-logs"
    assert settings["yarn.log-aggregation.retain-seconds"] == str(7 * 86400)
    assert settings["yarn.nodemanager.log-aggregation.roll-monitoring-interval-seconds"] == "3600"
    assert "yarn.nodemanager.log.retain-seconds" not in settings  # not read with aggregation on
    local_only = cluster.hadoop_settings(cluster.ClusterSpec(home=str(tmp_path), log_aggregation=False,
                                                             container_log_seconds=0), ports)
    assert local_only["yarn.log-aggregation-enable"] == "false"
    assert local_only["yarn.nodemanager.log.retain-seconds"] == "0" and "yarn.log-aggregation.retain-seconds" \
        not in local_only
    cmd = cluster.java_command("java", "CP", spec, ports)
    assert cmd[:6] == ["java", "-Xmx1536m", "--add-opens", "java.base/java.lang=ALL-UNNAMED", "-cp",
                       f"CP:{spec.conf_dir}"]  # the daemons read what the launcher writes in conf/
    assert cmd[6:12] == ["HvdtrainMiniCluster", str(tmp_path / "data"), spec.conf_dir, spec.ready_file, "1", "2"]
    assert cmd[12] == "2" and "yarn.resourcemanager.hostname=127.0.0.1" in cmd
    assert spec.heap_mb <= 3072


def test_wrapper_maps_subcommands_to_hadoops_cli_classes():
    script = cluster.wrapper_script("/usr/bin/java", "C:L/*", "/c", cluster.YARN_CLIS, "yarn")
    assert "application) cls=org.apache.hadoop.yarn.client.cli.ApplicationCLI; ;;" in script  # keeps "application"
    assert "node) cls=org.apache.hadoop.yarn.client.cli.NodeCLI; shift; ;;" in script
    assert script.endswith('exec "/usr/bin/java" -Xmx256m -cp "/c:C:L/*" "$cls" "$@"\n')


def test_missing_tools_and_taken_ports_are_one_line():
    with pytest.raises(EnvironmentProblem, match=r"needs javac, mvn on PATH"):
        cluster.require_tools(lambda tool: "/usr/bin/java" if tool == "java" else None)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        with pytest.raises(EnvironmentProblem, match=f"port 127.0.0.1:{taken} \\(the namenode http\\) is taken"):
            cluster.choose_ports(cluster.Ports(namenode_http=taken))
    chosen = cluster.choose_ports(cluster.Ports(namenode=0))
    assert len(set(vars(chosen).values())) == len(vars(chosen)) == 12 and 0 not in vars(chosen).values()


def test_maven_error_quotes_mavens_own_lines():
    out = ("[INFO] Scanning\n[ERROR] Failed to execute goal ... Could not resolve dependencies: "
           "Could not transfer artifact x:y:1 from central: status code: 403\n[ERROR] \n[ERROR] -> [Help 1]\n")
    assert cluster.maven_error(out).startswith("[ERROR] Failed to execute goal ... Could not resolve")
    fatal = ("[ERROR] [ERROR] Some problems were encountered while processing the POMs:\n"
             "[FATAL] Non-parseable POM /c/pom.xml: in comment after two dashes (--) @ line 35\n[ERROR] \n")
    assert cluster.maven_error(fatal).startswith("[FATAL] Non-parseable POM /c/pom.xml")  # the cause first


def test_secure_mode_plans_kerberos_for_every_daemon_and_plain_mode_none(tmp_path):
    plain = cluster.hadoop_settings(cluster.ClusterSpec(home=str(tmp_path)), cluster.Ports())
    assert not any(k.startswith("hvdtrain.kdc.") or "kerberos" in k for k in plain)
    spec = cluster.ClusterSpec(home=str(tmp_path), secure=True, ticket_seconds=80, token_renew_seconds=60)
    secure = cluster.hadoop_settings(spec, cluster.Ports())
    assert secure["hadoop.security.authentication"] == "kerberos"
    service = "hadoop/127.0.0.1@EXAMPLE.COM"  # literal: the cluster binds 127.0.0.1, never _HOST
    assert {secure[k] for k in ("dfs.namenode.kerberos.principal", "dfs.datanode.kerberos.principal",
                                "yarn.resourcemanager.principal", "yarn.nodemanager.principal")} == {service}
    assert secure["hvdtrain.kdc.keytab.hvdtrain.keytab"] == "hvdtrain" and spec.user_principal == "hvdtrain@EXAMPLE.COM"
    assert secure["hvdtrain.kdc.ticket-seconds"] == "80"
    assert secure["dfs.namenode.delegation.token.renew-interval"] == "60000"
    assert f"-Djava.security.krb5.conf={spec.krb5_conf}" in secure["yarn.nodemanager.admin-env"]
    details = {"hadoop_conf_dir": "/c", "krb5_conf": spec.krb5_conf}
    assert cluster.client_env(details)["SPARK_SUBMIT_OPTS"] == f"-Djava.security.krb5.conf={spec.krb5_conf}"
    assert "SPARK_SUBMIT_OPTS" not in cluster.client_env({"hadoop_conf_dir": "/c"})


def test_hdfs_uri_maps_to_the_namenodes_webhdfs_address():
    props = {**hadoop_conf.parse_site(HDFS_SITE), **hadoop_conf.parse_site(CORE_SITE)}
    assert hadoop_conf.webhdfs_urls("localhost:41000", props) == ["http://localhost:41001"]
    assert hadoop_conf.webhdfs_urls("127.0.0.1:41000", props) == ["http://localhost:41001"]  # loopback names agree
    assert hadoop_conf.webhdfs_urls("", props) == ["http://localhost:41001"]  # hdfs:///path: fs.defaultFS
    # an HA nameservice: every NameNode, in its order (the client goes past a standby)
    assert hadoop_conf.webhdfs_urls("prod", props) == ["http://nn1.example:9870", "http://nn2.example:9870"]
    assert hadoop_conf.webhdfs_urls("nn1.example:8020", props) == ["http://nn1.example:9870"]
    assert hadoop_conf.webhdfs_urls("other:8020", props) == []
    tls = {**props, "dfs.http.policy": "HTTPS_ONLY", "dfs.namenode.https-address.prod.nn1": "nn1.example:9871",
           "dfs.namenode.https-address.prod.nn2": "nn2.example:9871"}
    assert hadoop_conf.webhdfs_urls("prod", tls) == ["https://nn1.example:9871", "https://nn2.example:9871"]


def test_resolve_sends_hdfs_to_webhdfs_without_libhdfs(tmp_path, monkeypatch):
    (tmp_path / "hdfs-site.xml").write_text(HDFS_SITE)
    monkeypatch.setenv("HADOOP_CONF_DIR", str(tmp_path))
    for name in ("ARROW_LIBHDFS_DIR", "HADOOP_HOME", "HADOOP_COMMON_HOME"):
        monkeypatch.delenv(name, raising=False)
    filesystem, path = fs.resolve("hdfs://localhost:41000/data/x")
    assert isinstance(filesystem, pafs.PyFileSystem) and path == "/data/x"
    assert filesystem.handler.url == "http://localhost:41001"
    assert fs.libhdfs_dir({"ARROW_LIBHDFS_DIR": "/opt/h"}, lambda p: p == "/opt/h/libhdfs.so") == "/opt/h"
    assert fs.libhdfs_dir({"HADOOP_HOME": "/opt/hadoop"}, lambda p: False) is None


def test_an_ha_nameservice_goes_past_its_standby_namenode_to_the_active_one(tmp_path, monkeypatch):
    """#56: ``hdfs://prod`` used to map to the first NameNode only, and a StandbyException was retried against it
    until the restart loop gave up. Two loopback NameNodes (tests/support/webhdfs_server.py), the first the
    standby: every call reaches the active one, whatever order the client tries them in."""
    from tests.support.webhdfs_server import WebHdfsServer

    (tmp_path / "standby").mkdir()
    (tmp_path / "active").mkdir()
    with WebHdfsServer(str(tmp_path / "standby")) as standby, WebHdfsServer(str(tmp_path / "active")) as active:
        standby.standby = True
        conf = tmp_path / "conf"
        conf.mkdir()
        (conf / "hdfs-site.xml").write_text(HDFS_SITE.replace("nn1.example:9870", standby.netloc)
                                            .replace("nn2.example:9870", active.netloc))
        monkeypatch.setenv("HADOOP_CONF_DIR", str(conf))
        for name in ("ARROW_LIBHDFS_DIR", "HADOOP_HOME", "HADOOP_COMMON_HOME"):
            monkeypatch.delenv(name, raising=False)
        fs.write_bytes_atomic("hdfs://prod/data/x.json", b"{}")
        assert fs.read_bytes("hdfs://prod/data/x.json") == b"{}" and fs.listdir("hdfs://prod/data") == ["x.json"]
        assert (tmp_path / "active" / "data" / "x.json").read_bytes() == b"{}"
        assert standby.requests and not any((tmp_path / "standby").iterdir())  # asked first, changed nothing


class SafeMode(Exception):
    exception = "SafeModeException"


def test_safe_mode_is_waited_out_then_named():
    now, calls, sleeps = [0.0], [], []

    def fn():
        calls.append(1)
        if len(calls) < 4:
            raise SafeMode("Cannot create file. Name node is in safe mode.")
        return "ok"

    def sleep(s):
        sleeps.append(s)
        now[0] += s

    policy = fs.RetryPolicy(safe_mode_wait=30.0, safe_mode_poll=2.0)
    assert fs.with_retries(fn, "write x", policy, sleep=sleep, clock=lambda: now[0]) == "ok"
    assert sleeps == [2.0, 2.0, 2.0]  # no attempt used up: safe mode is not a failure
    with pytest.raises(StorageError, match="write x: the NameNode stayed in safe mode for 30s"):
        fs.with_retries(lambda: (_ for _ in ()).throw(SafeMode("safe mode")), "write x", policy, sleep=sleep,
                        clock=lambda: now[0])


def test_a_hive_metastore_service_is_planned_only_on_request_and_never_with_kerberos(tmp_path):
    """#56 item 7: ``up --hive`` gives the launcher the metastore's settings (loopback, its own port, Derby under
    the home's reset data/ folder, the warehouse on HDFS, pyspark's Hive jars: the version Spark's client
    speaks); without it none; with --secure one line, before anything starts."""
    ports = cluster.Ports(1, 2, 3, 4, 5, 6, 7, 8)
    assert not any(k.startswith("hvdtrain.hive.") for k in cluster.hadoop_settings(
        cluster.ClusterSpec(home=str(tmp_path)), ports))
    hive = cluster.hadoop_settings(cluster.ClusterSpec(home=str(tmp_path), hive=True), ports)
    assert hive["hvdtrain.hive.host"] == "127.0.0.1" and hive["hvdtrain.hive.port"] == "8"
    assert hive["hvdtrain.hive.db"] == str(tmp_path / "data" / "hive")
    assert hive["hvdtrain.hive.warehouse"] == "/user/hive/warehouse"
    assert hive["hvdtrain.hive.classpath"] == os.path.join(cluster.pyspark_jars_dir(), "*")
    assert any(n.startswith("hive-metastore-") for n in os.listdir(cluster.pyspark_jars_dir()))
    assert {"hive-metastore.log", "hive-metastore.log.out"} <= set(cluster.HOME_FILES)  # a later `up` may replace
    with pytest.raises(EnvironmentProblem, match="--hive --secure: the metastore service does not speak Kerberos"):
        cluster.up(cluster.ClusterSpec(home=str(tmp_path / "new"), hive=True, secure=True))
    assert not (tmp_path / "new").exists()
    assert cluster.STANDARD_PORTS.hive_metastore == 9083


def test_an_ha_cluster_is_planned_only_on_request_with_a_fencing_method_and_never_with_kerberos(tmp_path):
    """#56 item 1: ``up --ha`` gives the launcher the nameservice and the second NameNode's ports, manual failover
    and a fencing method (Hadoop refuses `haadmin -failover` without one), and bin/hdfs knows `haadmin`; without
    it none of that; with --secure one line, before anything starts."""
    ports = cluster.Ports(1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
    plain = cluster.hadoop_settings(cluster.ClusterSpec(home=str(tmp_path)), ports)
    assert not any(k.startswith(("hvdtrain.ha.", "dfs.ha.")) for k in plain)
    ha = cluster.hadoop_settings(cluster.ClusterSpec(home=str(tmp_path), ha=True), ports)
    assert ha["hvdtrain.ha.nameservice"] == cluster.NAMESERVICE == "hvdtrain"
    assert (ha["hvdtrain.ha.nn2-port"], ha["hvdtrain.ha.nn2-http-port"]) == ("9", "10")
    assert ha["dfs.ha.automatic-failover.enabled"] == "false" and ha["dfs.ha.fencing.methods"] == "shell(/bin/true)"
    cmd = cluster.java_command("java", "CP", cluster.ClusterSpec(home=str(tmp_path), ha=True), ports)
    assert cmd[10:12] == ["1", "2"]  # nn1's RPC and HTTP ports
    script = cluster.wrapper_script("/usr/bin/java", "CP", "/c", cluster.HDFS_CLIS, "hdfs")
    assert "haadmin) cls=org.apache.hadoop.hdfs.tools.DFSHAAdmin; shift; ;;" in script
    with pytest.raises(EnvironmentProblem, match="--ha --secure: an HA nameservice with Kerberos is not set up"):
        cluster.up(cluster.ClusterSpec(home=str(tmp_path / "new"), ha=True, secure=True))
    assert not (tmp_path / "new").exists()
    details = {"fs_default": "hdfs://hvdtrain", "namenode_web": "http://localhost:1", "resourcemanager_web": "r",
               "nodemanagers": 2, "log": "l", "nameservice": "hvdtrain", "bin": "/b", "hadoop_conf_dir": "/c",
               "namenodes": {"nn1": "http://localhost:1", "nn2": "http://localhost:2"}}
    assert ("NameNodes      nn1 http://localhost:1, nn2 http://localhost:2 (nameservice hvdtrain; fail over: hdfs "
            "haadmin -failover nn1 nn2)") in cluster.describe(details)


def test_an_https_cluster_plans_tls_only_web_servers_and_clients_verify_by_its_ca_bundle(tmp_path):
    """#56 item 1: ``up --https`` puts HDFS's web servers on TLS only, each NameNode on its own https-address (the
    nameservice's keys with --ha), with a key valid for the names clients use; a shell told to use it verifies the
    certificate through the cluster's CA bundle. Without --https none of it."""
    ports = cluster.Ports(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12)
    assert "dfs.http.policy" not in cluster.hadoop_settings(cluster.ClusterSpec(home=str(tmp_path)), ports)
    spec = cluster.ClusterSpec(home=str(tmp_path), ha=True, https=True)
    tls = cluster.hadoop_settings(spec, ports)
    assert tls["dfs.http.policy"] == "HTTPS_ONLY" and tls["dfs.datanode.https.address"] == "127.0.0.1:0"
    assert tls["dfs.namenode.https-address.hvdtrain.nn1"] == "127.0.0.1:11"
    assert tls["dfs.namenode.https-address.hvdtrain.nn2"] == "127.0.0.1:12"
    single = cluster.hadoop_settings(cluster.ClusterSpec(home=str(tmp_path), https=True), ports)
    assert single["dfs.namenode.https-address"] == "127.0.0.1:11"
    genkey = cluster.keytool_commands("/jdk/bin/keytool", spec)[0]
    assert genkey[genkey.index("-ext") + 1] == "SAN=dns:localhost,ip:127.0.0.1"  # what Python's TLS checks
    server = cluster.ssl_site("server", spec, "pw")
    assert f"<name>ssl.server.keystore.location</name><value>{spec.tls_dir}/keystore.jks</value>" in server
    assert "ssl.server.keystore.keypassword" in server and "keystore" not in cluster.ssl_site("client", spec, "pw")
    assert "tls" in cluster.RESET_FOLDERS  # a new key on every `up`
    env = cluster.client_env({"hadoop_conf_dir": "/c", "ca_bundle": spec.ca_bundle})
    assert env["REQUESTS_CA_BUNDLE"] == str(tmp_path / "tls" / "ca-bundle.pem")
    assert "REQUESTS_CA_BUNDLE" not in cluster.client_env({"hadoop_conf_dir": "/c"})


def test_an_untrusted_certificate_is_one_line_and_never_retried():
    """A WebHDFS server whose certificate this host does not trust: the first attempt stops with the reason and the
    fix (retrying meets the same certificate); other errors are not taken for it."""
    calls = []

    def fail():
        calls.append(1)
        raise OSError("HTTPSConnectionPool(host='localhost', port=1): Max retries exceeded (Caused by "
                      "SSLError(SSLCertVerificationError(1, '[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify "
                      "failed: self-signed certificate (_ssl.c:1006)')))")

    with pytest.raises(EnvironmentProblem) as info:
        fs.with_retries(fail, "list hdfs://prod/x", sleep=lambda s: None)
    assert calls == [1]
    assert str(info.value) == ("list hdfs://prod/x: the server's TLS certificate is not trusted here (self-signed "
                               "certificate); set REQUESTS_CA_BUNDLE to a CA bundle that holds the cluster's CA (its "
                               "admin has it; `hvdtrain cluster up --https` prints its own), then rerun")
    assert fs.untrusted_tls("x", OSError("connection refused")) is None


def test_viewfs_paths_resolve_through_the_mount_table_an_xinclude_brings(tmp_path, monkeypatch):
    """#56: ``viewfs://`` was refused without libhdfs. The mount table (here in mountTable.xml, XIncluded by
    core-site.xml as clusters keep it) maps each path to its NameNode's, as Hadoop's ViewFileSystem does: the
    longest link first, then linkFallback; a path no link covers is one line naming the links."""
    (tmp_path / "core-site.xml").write_text(
        '<?xml version="1.0"?><configuration xmlns:xi="http://www.w3.org/2001/XInclude">'
        '<property><name>fs.defaultFS</name><value>viewfs://prod/</value></property>'
        '<xi:include href="mountTable.xml"/></configuration>')
    links = {"/data": "hdfs://ns1/data", "/data/logs": "hdfs://ns2/logs/", "/user": "hdfs://ns1/user"}
    (tmp_path / "mountTable.xml").write_text(
        '<configuration>' + "".join(f"<property><name>fs.viewfs.mounttable.prod.link.{k}</name><value>{v}</value>"
                                    "</property>" for k, v in links.items()) + '</configuration>')
    props = hadoop_conf.load(str(tmp_path))
    assert hadoop_conf.viewfs_links("prod", props) == {k: v.rstrip("/") for k, v in links.items()}
    assert hadoop_conf.viewfs_target("prod", "/data/x/part-0", props) == "hdfs://ns1/data/x/part-0"
    assert hadoop_conf.viewfs_target("", "/data/logs/a", props) == "hdfs://ns2/logs/a"  # fs.defaultFS's table
    assert hadoop_conf.viewfs_target("prod", "/data", props) == "hdfs://ns1/data"
    assert hadoop_conf.viewfs_target("prod", "/database", props) is None  # /data is not a prefix of it
    fallback = {**props, "fs.viewfs.mounttable.prod.linkFallback": "hdfs://ns3/"}
    assert hadoop_conf.viewfs_target("prod", "/tmp/a", fallback) == "hdfs://ns3/tmp/a"
    monkeypatch.setenv("HADOOP_CONF_DIR", str(tmp_path))
    for name in ("ARROW_LIBHDFS_DIR", "HADOOP_HOME", "HADOOP_COMMON_HOME"):
        monkeypatch.delenv(name, raising=False)
    assert fs.viewfs_target("viewfs://prod/user/me/ckpt") == "hdfs://ns1/user/me/ckpt"
    with pytest.raises(DataError) as info:
        fs.exists("viewfs://prod/tmp/x")
    assert str(info.value) == (f"viewfs://prod/tmp/x: no link of the ViewFs mount table 'prod' covers /tmp/x (links: "
                               f"/data, /data/logs, /user; from HADOOP_CONF_DIR={tmp_path}); add "
                               "fs.viewfs.mounttable.prod.link.<path> to core-site.xml, or use the hdfs:// path")
