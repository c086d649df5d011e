"""``hvdtrain cluster up | status | down``: a one-machine Hadoop from Apache Hadoop's own minicluster.

One JVM (``HvdtrainMiniCluster.java`` beside this file) runs a NameNode with
WebHDFS, a DataNode, a ResourceManager and two NodeManagers, every port on
127.0.0.1. Its jars come from Maven Central through ``mvn -C`` (checksums
enforced) into a cache, once: ``pom.xml`` beside this file, at the Hadoop
version of the ``hadoop-client-api`` jar inside the installed pyspark, so the
client Spark uses and the cluster agree. ``up`` writes a ``HADOOP_CONF_DIR``
and ``bin/yarn`` / ``bin/hdfs`` (Hadoop's own CLIs from the same jars) under the
cluster's home folder. ``up --secure`` adds a MiniKdc and runs every daemon with
Kerberos (:func:`kerberos_settings`; docs/hadoop.md, "Kerberos"); ``up --ha`` makes HDFS a nameservice of two
NameNodes (:func:`ha_settings`), ``up --https`` puts its web servers on TLS only (:func:`https_settings`), ``up
--hive`` adds a Hive metastore service (:func:`hive_settings`).

The home folder is hvdtrain's only when it says so: ``up`` writes a ledger
(:mod:`hvdtrain.hadoop.ledger`) into a new or empty ``--home`` before anything else,
and resets (deletes) only the last run's ``data`` and ``target`` folders of a
home whose ledger names them; a folder holding anything else is refused
(:func:`plan_home`).

Plan, then act: :func:`hadoop_settings`, :func:`java_command`,
:func:`wrapper_script` and :func:`plan_home` are pure; :func:`up`,
:func:`down` and :func:`status` carry them out.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Iterable, Optional, TextIO

from hvdtrain.core.errors import DataError, EnvironmentProblem
from hvdtrain.hadoop import envcheck, ledger

HERE = os.path.dirname(os.path.abspath(__file__))
LAUNCHER = "HvdtrainMiniCluster"
LAUNCHER_SOURCE = os.path.join(HERE, f"{LAUNCHER}.java")
POM = os.path.join(HERE, "pom.xml")
HADOOP_API_JAR = re.compile(r"hadoop-client-api-(\d+(?:\.\d+)+)\.jar$")
LOOPBACK = "127.0.0.1"
REALM = "EXAMPLE.COM"  # MiniKdc's
LOG4J = ("log4j.rootLogger=WARN, console\nlog4j.appender.console=org.apache.log4j.ConsoleAppender\n"
         "log4j.appender.console.layout=org.apache.log4j.PatternLayout\n"
         "log4j.appender.console.layout.ConversionPattern=%d{ISO8601} %p %c{2}: %m%n\n"
         # the ResourceManager's one-line summary of every finished application
         "log4j.logger.org.apache.hadoop.yarn.server.resourcemanager.RMAppManager$ApplicationSummary=INFO\n")
# Java 17 and Hadoop 3.4: Guice (the web UIs) defines classes through ClassLoader.defineClass.
JAVA_OPTS = ("--add-opens", "java.base/java.lang=ALL-UNNAMED")
# ``yarn SUBCOMMAND`` / ``hdfs SUBCOMMAND`` -> Hadoop's CLI class (as Hadoop's own bin/yarn and bin/hdfs map them);
# a True flag keeps the subcommand as the first argument (ApplicationCLI reads it).
YARN_CLIS = {"application": ("org.apache.hadoop.yarn.client.cli.ApplicationCLI", True),
             "applicationattempt": ("org.apache.hadoop.yarn.client.cli.ApplicationCLI", True),
             "container": ("org.apache.hadoop.yarn.client.cli.ApplicationCLI", True),
             "node": ("org.apache.hadoop.yarn.client.cli.NodeCLI", False),
             "logs": ("org.apache.hadoop.yarn.client.cli.LogsCLI", False),
             "rmadmin": ("org.apache.hadoop.yarn.client.cli.RMAdminCLI", False)}
HDFS_CLIS = {"dfs": ("org.apache.hadoop.fs.FsShell", False),
             "dfsadmin": ("org.apache.hadoop.hdfs.tools.DFSAdmin", False),
             "haadmin": ("org.apache.hadoop.hdfs.tools.DFSHAAdmin", False)}
NAMESERVICE = "hvdtrain"  # the HA cluster's (`up --ha`): hdfs://hvdtrain/...
# On the cluster JVM's classpath only (the launcher's folder, never the client conf folder): every Configuration
# in that JVM, including the ones Hadoop builds internally (DefaultContainerExecutor's local FileContext), gets
# the NodeManagers' java.nio local filesystem (HvdtrainMiniCluster.NioLocalFs).
LOCAL_FS_RESOURCE = "hvdtrain-localfs.xml"
LOCAL_FS_XML = ('<?xml version="1.0"?>\n<configuration>\n  <property><name>fs.AbstractFileSystem.file.impl</name>'
                f'<value>{LAUNCHER}$NioLocalFs</value></property>\n</configuration>\n')


def default_home() -> str:
    return os.environ.get("HVDTRAIN_CLUSTER_HOME") or os.path.join(os.path.expanduser("~"), ".hvdtrain", "cluster")


cache_root = envcheck.cache_root


# -- plan ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Ports:
    """Fixed ports (0: a free one is picked at start)."""

    namenode: int = 0
    namenode_http: int = 0
    resourcemanager: int = 0
    scheduler: int = 0
    resource_tracker: int = 0
    rm_admin: int = 0
    resourcemanager_web: int = 0
    hive_metastore: int = 0  # with ``ClusterSpec.hive`` only
    namenode2: int = 0  # the second NameNode's RPC and HTTP ports, with ``ClusterSpec.ha`` only
    namenode2_http: int = 0
    namenode_https: int = 0  # the NameNodes' HTTPS ports, with ``ClusterSpec.https`` only
    namenode2_https: int = 0


# Hadoop's usual ports (`hvdtrain cluster up --standard-ports`), for URLs a newcomer recognizes.
STANDARD_PORTS = Ports(namenode=8020, namenode_http=9870, resourcemanager=8032, scheduler=8030,
                       resource_tracker=8031, rm_admin=8033, resourcemanager_web=8088, hive_metastore=9083)


@dataclass(frozen=True)
class ClusterSpec:
    """What ``up`` starts; the defaults fit a 2-core host where an application master and two executors
    running TensorFlow must fit (4 GB and 3 vcores per NodeManager, a 1.5 GB heap for the cluster JVM)."""

    home: str = field(default_factory=default_home)
    nodemanagers: int = 2
    nm_memory_mb: int = 4096
    nm_vcores: int = 3  # an application master (1) and one 2-core executor fit; two 2-core executors do not
    heap_mb: int = 1536
    ports: Ports = Ports()
    start_timeout: float = 300.0
    # Log aggregation, as a production cluster has it: when an application ends, each NodeManager uploads its
    # containers' log folders to ``remote_log_dir`` on HDFS (created sticky and world-writable, 1777, as an
    # operator creates it), where ``yarn logs -applicationId`` reads them, and deletes its local copies. The
    # uploads are deleted after ``aggregated_log_seconds`` (7 days). Off: the logs stay on the node only.
    log_aggregation: bool = True
    remote_log_dir: str = "/app-logs"
    aggregated_log_seconds: int = 604800
    # Without log aggregation, how long a finished application's container logs stay on the node: Hadoop's
    # 3 hours by default. A NodeManager stopping holds its applications until then, so a cluster that ran one
    # takes about 16 s to stop; a throwaway cluster deleted at once may set 0.
    container_log_seconds: int = 10800
    # Kerberos (`up --secure`): a MiniKdc, every daemon and client authenticated by it, a keytab for ``user``.
    secure: bool = False
    user: str = "hvdtrain"
    ticket_seconds: int = 36000  # the KDC's longest ticket (MIT's usual 10 hours)
    token_renew_seconds: int = 86400  # HDFS/YARN delegation tokens: renewal interval and longest life (Hadoop's)
    token_max_seconds: int = 604800
    # A Hive metastore service (`up --hive`), as a cluster's shared one: Hive's own Thrift server (the Hive jars
    # pyspark ships, the version Spark's client speaks) in a child JVM of the cluster's, its Derby database on this
    # host, its warehouse on HDFS (``hive_warehouse``, 1777); conf/hive-site.xml names it (hive.metastore.uris),
    # so every Spark job whose classpath holds HADOOP_CONF_DIR and whose config says hive.embedded: false uses it.
    hive: bool = False
    hive_warehouse: str = "/user/hive/warehouse"
    hive_heap_mb: int = 384
    # HA (`up --ha`), as a production HDFS: a nameservice (``NAMESERVICE``) of two NameNodes, nn1 active and nn2
    # standby, that clients reach as hdfs://NAMESERVICE through Hadoop's failover proxy; `hdfs haadmin -failover
    # nn1 nn2` (bin/hdfs) swaps them while jobs run.
    ha: bool = False
    # HTTPS only (`up --https`), as a cluster whose policy keeps delegation tokens and data off plain HTTP: the
    # NameNodes' and the DataNode's web servers (WebHDFS) serve TLS only (dfs.http.policy=HTTPS_ONLY), with a key
    # made for this cluster (keytool: CN=localhost, subjectAltName localhost and 127.0.0.1) in ``tls_dir``.
    # Python clients verify it through ``ca_bundle`` (the public CAs and this one), exported as REQUESTS_CA_BUNDLE.
    https: bool = False
    # A throwaway cluster's owner (a test session, a benchmark): the cluster JVM stops its daemons and exits once
    # that process is gone, killed or not. None: the cluster runs until ``down`` (``hvdtrain cluster up``).
    owner_pid: Optional[int] = None

    @property
    def conf_dir(self) -> str:
        return os.path.join(self.home, "conf")

    @property
    def bin_dir(self) -> str:
        return os.path.join(self.home, "bin")

    @property
    def ready_file(self) -> str:
        return os.path.join(self.home, "cluster.json")

    @property
    def pid_file(self) -> str:
        return os.path.join(self.home, "cluster.pid")

    @property
    def log_file(self) -> str:
        return os.path.join(self.home, "cluster.log")

    @property
    def tls_dir(self) -> str:
        return os.path.join(self.home, "tls")

    @property
    def ca_bundle(self) -> str:
        return os.path.join(self.tls_dir, "ca-bundle.pem")

    @property
    def kerberos_dir(self) -> str:
        return os.path.join(self.home, "kerberos")

    @property
    def user_principal(self) -> str:
        return f"{self.user}@{REALM}"

    @property
    def user_keytab(self) -> str:
        return os.path.join(self.kerberos_dir, f"{self.user}.keytab")

    @property
    def krb5_conf(self) -> str:
        return os.path.join(self.kerberos_dir, "krb5.conf")  # MiniKdc writes it there


HOME_WRITER = "hvdtrain cluster"
# The last run's HDFS and NodeManager folders and client configuration (the cluster JVM reads conf/ from its
# classpath once the launcher has written it: a stale one must never be there first): new on every `up`.
RESET_FOLDERS = ("data", "target", "conf", "tls")
HOME_FOLDERS = (*RESET_FOLDERS, "bin", "kerberos")
HOME_FILES = ("cluster.json", "cluster.pid", "cluster.log", "hive-metastore.log", "hive-metastore.log.out")


def home_ledger() -> ledger.Ledger:
    """What ``up`` writes into its home folder, and so may replace or delete there (pure)."""
    return ledger.Ledger(HOME_WRITER, (*map(ledger.tree, HOME_FOLDERS), *map(ledger.exact, HOME_FILES)))


@dataclass(frozen=True)
class HomePlan:
    """The ledger to record in the home before anything is written, and the last run's folders to delete."""

    ledger: ledger.Ledger
    reset: tuple[str, ...] = ()


def _recorded(owned: ledger.Ledger, name: str) -> bool:
    """Whether the ledger names ``name`` (a file, or a folder it created: ``data/*`` matches ``data/``)."""
    return owned.owns(name) or owned.owns(name + "/")


def plan_home(home: str, entries: Iterable[str], recorded: Optional[ledger.Ledger]) -> HomePlan:
    """What ``up`` may do in ``home``, holding ``entries`` (names right under it) and its ledger (pure): a new or
    empty folder becomes hvdtrain's; one whose ledger names everything in it is reset; anything else is refused
    with one line, before anything in it is touched."""
    names = sorted(entries)
    fix = f"choose a new or empty folder for --home (or move them out of {home})"
    if recorded is None:
        if names:
            raise EnvironmentProblem(f"--home {home} holds {ledger.sample(names)} and no ledger ({ledger.NAME}): "
                                     f"hvdtrain did not create it, so it writes and deletes nothing there; {fix}")
        return HomePlan(home_ledger())
    if recorded.writer != HOME_WRITER:
        raise EnvironmentProblem(f"--home {home} is where {recorded.writer} writes ({ledger.NAME}), not a "
                                 f"cluster's home; {fix}")
    foreign = [name for name in names if not _recorded(recorded, name)]
    if foreign:
        raise EnvironmentProblem(f"--home {home} holds {ledger.sample(foreign)}, which hvdtrain did not create "
                                 f"there, so it deletes nothing there; {fix}")
    return HomePlan(recorded.adding(*home_ledger().entries),
                    tuple(name for name in RESET_FOLDERS if name in names and _recorded(recorded, name)))


def hadoop_version_of(jar_names: Iterable[str]) -> Optional[str]:
    """The version of the ``hadoop-client-api`` jar among ``jar_names`` (pure)."""
    for name in jar_names:
        match = HADOOP_API_JAR.search(name)
        if match:
            return match.group(1)
    return None


def pyspark_jars_dir() -> str:
    spec = importlib.util.find_spec("pyspark")  # locates, does not import, pyspark
    if spec is None or not spec.submodule_search_locations:
        raise EnvironmentProblem("pyspark is not installed in this environment: the cluster's Hadoop version "
                                 "follows pyspark's hadoop-client jars; run `make env`")
    return os.path.join(list(spec.submodule_search_locations)[0], "jars")


# What fits the default NodeManagers (4 GB, 3 vcores each) with an application master and two executors beside it:
# `up` prints these for `hvdtrain yarn ...` (a larger request is refused before submission, in one line). A training
# executor's container: a 1 GB heap + 384 MB (Spark's overhead) + 1.5 GB for the rank's process = 2,944 MB, and an
# application master's 896 MB beside it on one NodeManager. The NodeManagers enforce it (hadoop_settings).
FITTING_YARN: dict[str, Any] = {"executor_memory": "1g", "executor_cores": 1, "rank_memory": "1536m"}


def yarn_settings(env_cache: str, jars_dir: str, **extra: Any) -> dict[str, Any]:
    """A job config's ``yarn:`` block that fits this cluster (pure): one core and a 1 GB heap per executor (an
    application master and two executors fit two NodeManagers), the env cache (a folder on its HDFS),
    everything bound to loopback, and Spark's jars from this host (``local:``, as on a cluster with Spark on
    every node)."""
    return {**FITTING_YARN, "driver_memory": "1g", "start_timeout": 600,
            "env_cache": env_cache, "env": {"SPARK_LOCAL_IP": "127.0.0.1"},
            "spark_conf": {"spark.yarn.jars": f"local:{jars_dir}/*", "spark.yarn.am.memory": "512m",
                           "spark.yarn.appMasterEnv.SPARK_LOCAL_IP": "127.0.0.1"}, **extra}


def pyspark_hadoop_version() -> str:
    jars = pyspark_jars_dir()
    version = hadoop_version_of(os.listdir(jars)) if os.path.isdir(jars) else None
    if version is None:
        raise EnvironmentProblem(f"no hadoop-client-api-*.jar in {jars}: cannot tell which Hadoop version "
                                 "pyspark's client speaks; reinstall pyspark (make env)")
    return version


QUEUES = ("default", "ml")  # the Capacity Scheduler's leaf queues (root.default, root.ml)

# Read by the launcher only (never written to the *-site.xml files): the process whose end stops the cluster.
OWNER_PID = "hvdtrain.owner-pid"


def hadoop_settings(spec: ClusterSpec, ports: Ports) -> dict[str, str]:
    """Every Hadoop setting the launcher is given (pure): loopback addresses, NodeManager size, two queues."""
    rm = {"address": ports.resourcemanager, "scheduler.address": ports.scheduler,
          "resource-tracker.address": ports.resource_tracker, "admin.address": ports.rm_admin,
          "webapp.address": ports.resourcemanager_web}
    out = {"yarn.minicluster.fixed.ports": "true",  # addresses exactly as below, none on a public interface
           "yarn.resourcemanager.hostname": LOOPBACK,
           **{f"yarn.resourcemanager.{k}": f"{LOOPBACK}:{p}" for k, p in rm.items()},
           **{f"yarn.nodemanager.{k}": f"{LOOPBACK}:0" for k in ("address", "localizer.address", "webapp.address")},
           "yarn.nodemanager.hostname": LOOPBACK,
           **({OWNER_PID: str(spec.owner_pid)} if spec.owner_pid else {}),
           "yarn.nodemanager.resource.memory-mb": str(spec.nm_memory_mb),
           "yarn.minicluster.yarn.nodemanager.resource.memory-mb": str(spec.nm_memory_mb),
           "yarn.nodemanager.resource.cpu-vcores": str(spec.nm_vcores),
           "yarn.scheduler.minimum-allocation-mb": "256",
           "yarn.scheduler.maximum-allocation-mb": str(spec.nm_memory_mb),
           "yarn.scheduler.maximum-allocation-vcores": str(spec.nm_vcores),
           # Cores count, not only memory (the default calculator), as on a production cluster sized by cores:
           # a job whose executors have 2 cores gets them on two NodeManagers (3 vcores each), and an executor
           # relaunched after a lost container lands on the NodeManager that lost it.
           "yarn.scheduler.capacity.resource-calculator":
               "org.apache.hadoop.yarn.util.resource.DominantResourceCalculator",
           # No capacity-scheduler.xml ships in the jars. Two queues, as a shared cluster has: default and ml, half
           # the cluster each, and either may use all of it while the other is idle (one user too: a user-limit
           # factor of 2 lets one user's job grow from the queue's half to the whole cluster).
           "yarn.scheduler.capacity.root.queues": ",".join(QUEUES),
           **{f"yarn.scheduler.capacity.root.{q}.{k}": v for q in QUEUES
              for k, v in (("capacity", "50"), ("maximum-capacity", "100"), ("user-limit-factor", "2"))},
           "yarn.scheduler.capacity.maximum-am-resource-percent": "0.5",
           # A shared test host's disk may be fuller than YARN's 90 % default allows.
           "yarn.nodemanager.disk-health-checker.max-disk-utilization-per-disk-percentage": "99.0",
           # Each container's memory enforced as on a production cluster: the NodeManager's monitor sums the
           # resident memory of the container's process tree (the executor's JVM, its Python workers and the rank)
           # every second and kills a container over its size (MiniYARNCluster skips the monitor unless asked).
           # memory.enforced=false: Hadoop 3.4 leaves a strict limit to cgroups (the kernel's OOM killer) and
           # skips the monitor's check when it is on; this host has no cgroups for YARN, so the monitor kills, as
           # on a cluster without them. Virtual memory is not checked (a JVM's and TensorFlow's address space is
           # far above their use; most clusters turn that check off).
           "yarn.minicluster.control-resource-monitoring": "true",
           "yarn.nodemanager.pmem-check-enabled": "true",
           "yarn.nodemanager.resource.memory.enforced": "false",
           "yarn.nodemanager.container-monitor.interval-ms": "1000",
           "yarn.nodemanager.vmem-check-enabled": "false",
           "yarn.nodemanager.delete.debug-delay-sec": "600",  # keep container folders for reading after a job
           **log_settings(spec),
           "dfs.replication": "1",
           # The trash on, as on most production clusters (a day): what hvdtrain replaces goes there, not away.
           "fs.trash.interval": "1440",
           # Permissions on, as on every production cluster: this JVM's user is HDFS's superuser, spec.user and
           # every other user meet the checks (hvdtrain.hdfs.users: the homes the launcher makes, as an operator).
           "dfs.permissions.enabled": "true",
           "hvdtrain.hdfs.users": spec.user,
           "hadoop.tmp.dir": os.path.join(spec.home, "data", "tmp")}
    if spec.hive:
        out.update(hive_settings(spec, ports))
    if spec.ha:
        out.update(ha_settings(ports))
    if spec.https:
        out.update(https_settings(spec, ports))
    return {**out, **kerberos_settings(spec)} if spec.secure else out


def ha_settings(ports: Ports) -> dict[str, str]:
    """The launcher's ``hvdtrain.ha.*`` settings and the HA settings an operator writes (pure): manual failover
    (``hdfs haadmin``; no ZooKeeper failover controllers here), and a fencing method, which Hadoop requires before
    it fails over. A graceful failover needs none (the old active steps down itself); ``shell(/bin/true)`` is the
    usual setting where the shared edits folder admits one writer anyway, as here."""
    return {"hvdtrain.ha.nameservice": NAMESERVICE, "hvdtrain.ha.nn2-port": str(ports.namenode2),
            "hvdtrain.ha.nn2-http-port": str(ports.namenode2_http),
            "dfs.ha.automatic-failover.enabled": "false", "dfs.ha.fencing.methods": "shell(/bin/true)"}


def https_settings(spec: ClusterSpec, ports: Ports) -> dict[str, str]:
    """HTTPS only for HDFS's web servers (pure): each NameNode's https-address (the nameservice's when ``spec.ha``),
    the DataNode's on loopback, and the ssl-server.xml / ssl-client.xml that :func:`write_tls` puts in conf/."""
    if spec.ha:
        namenodes = {f"dfs.namenode.https-address.{NAMESERVICE}.nn1": f"{LOOPBACK}:{ports.namenode_https}",
                     f"dfs.namenode.https-address.{NAMESERVICE}.nn2": f"{LOOPBACK}:{ports.namenode2_https}"}
    else:
        namenodes = {"dfs.namenode.https-address": f"{LOOPBACK}:{ports.namenode_https}"}
    return {"dfs.http.policy": "HTTPS_ONLY", **namenodes, "dfs.datanode.https.address": f"{LOOPBACK}:0",
            "hadoop.ssl.server.conf": "ssl-server.xml", "hadoop.ssl.client.conf": "ssl-client.xml",
            "dfs.client.https.need-auth": "false"}


TLS_ALIAS = "hvdtrain-cluster"
TLS_PASSWORD_ENV = "HVDTRAIN_TLS_STOREPASS"  # keytool reads the stores' password from it, never a command line


def keytool_commands(keytool: str, spec: ClusterSpec) -> list[list[str]]:
    """The JDK's keytool runs that make this cluster's TLS files (pure): a key and self-signed certificate valid for
    localhost and 127.0.0.1 (the names clients reach the web servers by), its PEM, and a truststore holding it. The
    stores' password comes from $HVDTRAIN_TLS_STOREPASS (``-storepass:env``)."""
    keystore, truststore = (os.path.join(spec.tls_dir, n) for n in ("keystore.jks", "truststore.jks"))
    cert = os.path.join(spec.tls_dir, "cluster.pem")
    store, key = ["-storepass:env", TLS_PASSWORD_ENV], ["-keypass:env", TLS_PASSWORD_ENV]
    return [[keytool, "-genkeypair", "-alias", TLS_ALIAS, "-keyalg", "RSA", "-keysize", "2048", "-validity", "3650",
             "-dname", "CN=localhost", "-ext", f"SAN=dns:localhost,ip:{LOOPBACK}", "-keystore", keystore,
             "-storetype", "JKS", *store, *key],
            [keytool, "-exportcert", "-rfc", "-alias", TLS_ALIAS, "-keystore", keystore, *store, "-file", cert],
            [keytool, "-importcert", "-noprompt", "-alias", TLS_ALIAS, "-file", cert, "-keystore", truststore,
             "-storetype", "JKS", *store]]


def ssl_site(kind: str, spec: ClusterSpec, password: str) -> str:
    """ssl-server.xml (``kind="server"``: the keystore) or ssl-client.xml (``"client"``: the truststore) (pure)."""
    stores = {"keystore": "keystore.jks", "truststore": "truststore.jks"} if kind == "server" else \
        {"truststore": "truststore.jks"}
    props = {}
    for store, name in stores.items():
        props.update({f"ssl.{kind}.{store}.location": os.path.join(spec.tls_dir, name),
                      f"ssl.{kind}.{store}.password": password, f"ssl.{kind}.{store}.type": "jks"})
    if kind == "server":
        props[f"ssl.{kind}.keystore.keypassword"] = password
    body = "".join(f"  <property><name>{k}</name><value>{v}</value></property>\n" for k, v in props.items())
    return f'<?xml version="1.0"?>\n<configuration>\n{body}</configuration>\n'


def write_tls(spec: ClusterSpec, java: str) -> None:
    """Make the cluster's key, certificate and truststore (keytool beside ``java``), conf/ssl-server.xml (0600:
    it holds the keystore's password) and ssl-client.xml, and ``spec.ca_bundle``: certifi's public CAs and this
    cluster's certificate, so a shell that exports it as REQUESTS_CA_BUNDLE still reaches public servers."""
    import secrets

    import certifi

    keytool = os.path.join(os.path.dirname(os.path.realpath(java)), "keytool")
    password = secrets.token_hex(16)
    os.makedirs(spec.tls_dir, mode=0o700, exist_ok=True)
    for cmd in keytool_commands(keytool, spec):
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, TLS_PASSWORD_ENV: password})
        if proc.returncode != 0:
            raise EnvironmentProblem(f"keytool could not make the cluster's TLS key ({cmd[1]}: "
                                     f"{(proc.stderr or proc.stdout).strip()[-300:]}); check the JDK at {java}")
    for kind, mode in (("server", 0o600), ("client", 0o644)):
        path = os.path.join(spec.conf_dir, f"ssl-{kind}.xml")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "w") as fh:
            fh.write(ssl_site(kind, spec, password))
    with open(certifi.where()) as public, open(os.path.join(spec.tls_dir, "cluster.pem")) as own, \
            open(spec.ca_bundle, "w") as out:
        out.write(public.read().rstrip("\n") + "\n" + own.read())


def hive_settings(spec: ClusterSpec, ports: Ports) -> dict[str, str]:
    """The launcher's ``hvdtrain.hive.*`` settings for the metastore service (pure but for pyspark's location)."""
    return {"hvdtrain.hive.host": LOOPBACK, "hvdtrain.hive.port": str(ports.hive_metastore),
            "hvdtrain.hive.classpath": os.path.join(pyspark_jars_dir(), "*"),
            "hvdtrain.hive.db": os.path.join(spec.home, "data", "hive"),
            "hvdtrain.hive.log": os.path.join(spec.home, "hive-metastore.log"),
            "hvdtrain.hive.warehouse": spec.hive_warehouse, "hvdtrain.hive.heap": f"{spec.hive_heap_mb}m",
            "hvdtrain.hive.start-ms": str(int(spec.start_timeout * 1000))}


def log_settings(spec: ClusterSpec) -> dict[str, str]:
    """Where finished containers' logs go (pure): aggregated to HDFS (``spec.log_aggregation``), else kept on the
    node for ``spec.container_log_seconds``."""
    if not spec.log_aggregation:
        return {"yarn.log-aggregation-enable": "false",
                "yarn.nodemanager.log.retain-seconds": str(spec.container_log_seconds)}
    return {"yarn.log-aggregation-enable": "true",
            # What clients (`yarn logs`) read. MiniYARNCluster overrides it with a folder per NodeManager, so the
            # NodeManagers are given the folder through the key of Hadoop's default format (TFile), which wins.
            "yarn.nodemanager.remote-app-log-dir": spec.remote_log_dir,
            "yarn.log-aggregation.TFile.remote-app-log-dir": spec.remote_log_dir,
            # Enforced by the AggregatedLogDeletionService the launcher runs (a JobHistoryServer's job elsewhere).
            "yarn.log-aggregation.retain-seconds": str(spec.aggregated_log_seconds),
            # A long-running application that asks for it (a rolled-logs include pattern, Spark's
            # spark.yarn.rolledLog.includePattern) has its logs uploaded hourly too; the others at their end.
            "yarn.nodemanager.log-aggregation.roll-monitoring-interval-seconds": "3600"}


def kerberos_settings(spec: ClusterSpec) -> dict[str, str]:
    """Kerberos for every daemon (pure): the KDC the launcher starts (``hvdtrain.kdc.*``), one service principal
    for the daemons (they share the launcher JVM's login), SPNEGO for WebHDFS, block access tokens, and the
    krb5.conf every container's JVM reads (a production node has it in /etc)."""
    kdir = spec.kerberos_dir
    service_keytab = os.path.join(kdir, "hadoop.keytab")
    service, http = f"hadoop/{LOOPBACK}@{REALM}", f"HTTP/{LOOPBACK}@{REALM}"
    renew_ms, max_ms = str(spec.token_renew_seconds * 1000), str(spec.token_max_seconds * 1000)
    return {"hvdtrain.kdc.dir": kdir, "hvdtrain.kdc.host": LOOPBACK,
            "hvdtrain.kdc.ticket-seconds": str(spec.ticket_seconds),
            "hvdtrain.kdc.renewable-seconds": str(spec.ticket_seconds),
            "hvdtrain.kdc.keytab.hadoop.keytab": f"hadoop/{LOOPBACK},HTTP/{LOOPBACK}",
            f"hvdtrain.kdc.keytab.{os.path.basename(spec.user_keytab)}": spec.user,
            "hadoop.security.authentication": "kerberos",
            "dfs.namenode.kerberos.principal": service, "dfs.namenode.keytab.file": service_keytab,
            "dfs.datanode.kerberos.principal": service, "dfs.datanode.keytab.file": service_keytab,
            "dfs.web.authentication.kerberos.principal": http,
            "dfs.web.authentication.kerberos.keytab": service_keytab,
            "dfs.block.access.token.enable": "true",
            # A secure DataNode wants privileged ports or SASL over HTTPS; Hadoop's own tests waive that (loopback).
            "ignore.secure.ports.for.testing": "true",
            "yarn.resourcemanager.principal": service, "yarn.resourcemanager.keytab": service_keytab,
            "yarn.nodemanager.principal": service, "yarn.nodemanager.keytab": service_keytab,
            "dfs.namenode.delegation.token.renew-interval": renew_ms,
            "dfs.namenode.delegation.token.max-lifetime": max_ms,
            "yarn.resourcemanager.delegation.token.renew-interval": renew_ms,
            "yarn.resourcemanager.delegation.token.max-lifetime": max_ms,
            "yarn.nodemanager.admin-env":
                f"MALLOC_ARENA_MAX=$MALLOC_ARENA_MAX,JAVA_TOOL_OPTIONS=-Djava.security.krb5.conf={spec.krb5_conf}"}


def java_command(java: str, classpath: str, spec: ClusterSpec, ports: Ports) -> list[str]:
    """The cluster JVM's command line (pure)."""
    settings = hadoop_settings(spec, ports)
    # conf/ last on the classpath, as HADOOP_CONF_DIR is on a production daemon's: the Configurations the
    # daemons make afresh after start-up (a NodeManager's resource localizer) read the *-site.xml files the
    # launcher writes there, so they know what only those files say (an HA nameservice's NameNodes).
    return [java, f"-Xmx{spec.heap_mb}m", *JAVA_OPTS, "-cp", f"{classpath}:{spec.conf_dir}", LAUNCHER,
            os.path.join(spec.home, "data"), spec.conf_dir, spec.ready_file, str(ports.namenode),
            str(ports.namenode_http), str(spec.nodemanagers), *(f"{k}={v}" for k, v in settings.items())]


def wrapper_script(java: str, classpath: str, conf_dir: str, clis: dict[str, tuple[str, bool]], tool: str,
                   krb5_conf: Optional[str] = None) -> str:
    """``bin/yarn`` or ``bin/hdfs``: Hadoop's own CLI classes from the cluster's jars (pure)."""
    krb5 = f"-Djava.security.krb5.conf={krb5_conf} " if krb5_conf else ""
    cases = "\n".join(f'  {sub}) cls={cls}; {"" if keep else "shift; "};;' for sub, (cls, keep) in clis.items())
    return (f"#!/bin/sh\n# {tool} for the hvdtrain minicluster: Hadoop's own CLI classes, this cluster's configs.\n"
            f'case "$1" in\n{cases}\n'
            f'  *) echo "usage: {tool} {{{"|".join(clis)}}} ..." >&2; exit 2;;\nesac\n'
            f'exec "{java}" -Xmx256m {krb5}-cp "{conf_dir}:{classpath}" "$cls" "$@"\n')


# -- act: jars and launcher ------------------------------------------------------------------------

def require_tools(which: Callable[[str], Optional[str]] = shutil.which) -> tuple[str, str, str]:
    """java, javac and mvn, or one line naming what is missing."""
    found = {tool: which(tool) for tool in ("java", "javac", "mvn")}
    missing = [tool for tool, path in found.items() if path is None]
    if missing:
        raise EnvironmentProblem(f"hvdtrain cluster needs {', '.join(missing)} on PATH (a JDK 17 and Maven: "
                                 "apt-get install openjdk-17-jdk-headless maven)")
    java, javac, mvn = found["java"], found["javac"], found["mvn"]
    assert java and javac and mvn  # none is missing (checked above)
    return java, javac, mvn


def maven_error(output: str) -> str:
    """Maven's own error lines, joined (what a blocked artifact looks like)."""
    lines = [ln.strip() for ln in output.splitlines() if ln.startswith(("[FATAL]", "[ERROR]"))
             and ln.strip() not in ("[ERROR]", "[FATAL]")]
    lines = [ln for ln in lines if ln.startswith("[FATAL]")] + [ln for ln in lines if ln.startswith("[ERROR]")]
    return " ".join(lines[:3]) or output.strip()[-500:]


def ensure_jars(version: str, mvn: str, cache: Optional[str] = None) -> str:
    """The folder of the cluster's jars, fetched once by Maven (``-C``: a checksum mismatch fails)."""
    with open(POM, "rb") as fh:  # a changed pom (a jar added) is a new folder, fetched again
        pom_digest = hashlib.sha256(fh.read()).hexdigest()[:8]
    root = os.path.join(cache or cache_root(), f"hadoop-{version}-{pom_digest}")
    lib, stamp = os.path.join(root, "lib"), os.path.join(root, "lib.complete")
    if os.path.exists(stamp):
        return lib
    os.makedirs(root, exist_ok=True)
    staging = f"{lib}.part"
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copy(POM, os.path.join(root, "pom.xml"))
    cmd = [mvn, "-B", "-C", "-f", os.path.join(root, "pom.xml"), "dependency:copy-dependencies",
           "-DincludeScope=runtime", f"-DoutputDirectory={staging}", f"-Dhadoop.version={version}"]
    print(f"hvdtrain cluster: fetching Hadoop {version} from Maven Central into {lib} (once)", file=sys.stderr)
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise EnvironmentProblem(f"Maven could not fetch the Hadoop {version} minicluster: "
                                 f"{maven_error(result.stdout + result.stderr)}")
    shutil.rmtree(lib, ignore_errors=True)
    os.replace(staging, lib)
    open(stamp, "w").close()
    return lib


def ensure_launcher(lib: str, javac: str) -> str:
    """The compiled launcher's folder (recompiled when its source changes), with a quiet log4j setup."""
    with open(LAUNCHER_SOURCE, "rb") as fh:
        digest = hashlib.sha256(fh.read() + LOG4J.encode() + LOCAL_FS_XML.encode()).hexdigest()[:16]
    classes = os.path.join(os.path.dirname(lib), f"launcher-{digest}")
    if os.path.exists(os.path.join(classes, f"{LAUNCHER}.class")):
        return classes
    staging = f"{classes}.part"
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging)
    result = subprocess.run([javac, "-cp", os.path.join(lib, "*"), "-d", staging, LAUNCHER_SOURCE],
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise EnvironmentProblem(f"javac could not compile {LAUNCHER_SOURCE}: {result.stderr.strip()[-500:]}")
    with open(os.path.join(staging, "log4j.properties"), "w") as fh:
        fh.write(LOG4J)
    with open(os.path.join(staging, LOCAL_FS_RESOURCE), "w") as fh:
        fh.write(LOCAL_FS_XML)
    os.replace(staging, classes)
    return classes


def prepare(mvn: Optional[str] = None, javac: Optional[str] = None) -> tuple[str, str]:
    """(Hadoop version, classpath) of the cluster: jars fetched and launcher compiled if needed."""
    if mvn is None or javac is None:
        _, javac, mvn = require_tools()
    version = pyspark_hadoop_version()
    lib = ensure_jars(version, mvn)
    classes = ensure_launcher(lib, javac)
    return version, f"{classes}:{os.path.join(lib, '*')}"


# -- act: ports --------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def _port_taken(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((LOOPBACK, port))
        except OSError:
            return True
    return False


def choose_ports(wanted: Ports) -> Ports:
    """Fixed ports checked free, the others picked free on 127.0.0.1; a taken port is one clear line."""
    chosen = {}
    for name, port in asdict(wanted).items():
        if port and _port_taken(port):
            raise EnvironmentProblem(f"port {LOOPBACK}:{port} (the {name.replace('_', ' ')}) is taken; stop what "
                                     f"listens there or pick another port")
        chosen[name] = port or _free_port()
    if len(set(chosen.values())) != len(chosen):
        return choose_ports(wanted)  # two picks collided: pick again
    return Ports(**chosen)


# -- act: the cluster process --------------------------------------------------------------------

def _read_pid(spec: ClusterSpec) -> Optional[int]:
    try:
        with open(spec.pid_file) as fh:
            pid = int(fh.read().strip())
    except (OSError, ValueError):
        return None
    return pid if _is_launcher(pid) else None


def _is_launcher(pid: int) -> bool:
    """True while ``pid`` is a live cluster JVM (not a recycled pid)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return LAUNCHER.encode() in fh.read()
    except OSError:
        return False


def status(spec: ClusterSpec) -> Optional[dict]:
    """The running cluster's details, or None."""
    pid = _read_pid(spec)
    if pid is None or not os.path.exists(spec.ready_file):
        return None
    with open(spec.ready_file) as fh:
        details = json.load(fh)
    out = {**details, "pid": pid, "hadoop_conf_dir": spec.conf_dir, "bin": spec.bin_dir, "log": spec.log_file,
           "home": spec.home}
    if "kdc" in details:  # a secure cluster: what a client needs to log in
        out.update(principal=spec.user_principal, keytab=spec.user_keytab, krb5_conf=spec.krb5_conf)
    if details.get("namenode_web", "").startswith("https://"):  # HTTPS only: what a client verifies it by
        out.update(ca_bundle=spec.ca_bundle)
    return out


def client_env(details: dict) -> dict[str, str]:
    """The variables a shell (or a test) sets to use the cluster: its configs, its CLIs and, when it is secure,
    its krb5.conf for MIT tools (KRB5_CONFIG) and for spark-submit's JVM (SPARK_SUBMIT_OPTS) (pure)."""
    env = {"HADOOP_CONF_DIR": details["hadoop_conf_dir"], "SPARK_LOCAL_IP": LOOPBACK}
    if "ca_bundle" in details:
        env["REQUESTS_CA_BUNDLE"] = details["ca_bundle"]
    if "krb5_conf" in details:
        env.update(KRB5_CONFIG=details["krb5_conf"],
                   SPARK_SUBMIT_OPTS=f"-Djava.security.krb5.conf={details['krb5_conf']}")
    return env


def up(spec: ClusterSpec, out: TextIO = sys.stdout) -> dict:
    """Start the cluster (or find it running) and wait until it serves; returns :func:`status`."""
    running = status(spec)
    if running:
        if ("kdc" in running) != spec.secure:
            raise EnvironmentProblem(f"a {'secure' if 'kdc' in running else 'plain'} cluster already runs in "
                                     f"{spec.home} (pid {running['pid']}); stop it (hvdtrain cluster down) to start a "
                                     f"{'secure' if spec.secure else 'plain'} one, or use another --home")
        if spec.https and "ca_bundle" not in running:
            raise EnvironmentProblem(f"the cluster running in {spec.home} (pid {running['pid']}) serves HDFS over plain "
                                     "HTTP; stop it (hvdtrain cluster down) and start it with --https, or use another "
                                     "--home")
        if spec.ha and "nameservice" not in running:
            raise EnvironmentProblem(f"the cluster running in {spec.home} (pid {running['pid']}) has one NameNode; "
                                     "stop it (hvdtrain cluster down) and start it with --ha, or use another --home")
        if spec.hive and "hive_metastore" not in running:
            raise EnvironmentProblem(f"the cluster running in {spec.home} (pid {running['pid']}) has no Hive "
                                     "metastore; stop it (hvdtrain cluster down) and start it with --hive, or use "
                                     "another --home")
        print(f"hvdtrain cluster: already running (pid {running['pid']})", file=out)
        return running
    if spec.ha and spec.secure:
        raise EnvironmentProblem("hvdtrain cluster up --ha --secure: an HA nameservice with Kerberos is not set up "
                                 "here yet (each NameNode needs its own principal); start the cluster with one of "
                                 "the two")
    if spec.hive and spec.secure:
        raise EnvironmentProblem("hvdtrain cluster up --hive --secure: the metastore service does not speak Kerberos "
                                 "(SASL) here yet; start the cluster with one of the two")
    home = plan_home(spec.home, _home_entries(spec.home), _home_ledger(spec.home))  # refused before any change
    down(spec, quiet=True)  # a JVM still starting, or stale files of one that died
    java, javac, mvn = require_tools()
    version, classpath = prepare(mvn, javac)
    unused = {**({} if spec.hive else {"hive_metastore": 0}), **({} if spec.ha else {"namenode2": 0, "namenode2_http": 0}),
              **({} if spec.https else {"namenode_https": 0, "namenode2_https": 0})}
    ports = choose_ports(replace(spec.ports, **unused))
    os.makedirs(spec.home, exist_ok=True)
    ledger.write(spec.home, home.ledger)  # before anything it names is written
    for folder in home.reset:  # the last run's HDFS and NodeManager folders, which the ledger names
        shutil.rmtree(os.path.join(spec.home, folder), ignore_errors=True)
    _write_wrappers(spec, java, classpath)
    # Empty, but there before the JVM starts: a classpath folder missing then is never looked in again.
    os.makedirs(spec.conf_dir, exist_ok=True)
    if spec.https:
        write_tls(spec, java)
    cmd = java_command(java, classpath, spec, ports)
    start = time.monotonic()
    with open(spec.log_file, "w") as log:
        # cwd: MiniYARNCluster keeps the NodeManagers' folders under ./target/test/data
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=spec.home,
                                env={**os.environ, "HADOOP_CONF_DIR": spec.conf_dir}, start_new_session=True)
    with open(spec.pid_file, "w") as fh:
        fh.write(str(proc.pid))
    _wait_ready(spec, proc)
    details = status(spec) or {}
    details["start_seconds"] = round(time.monotonic() - start, 1)
    print(f"hvdtrain cluster: Hadoop {version} up in {details['start_seconds']:.0f}s (pid {proc.pid})", file=out)
    return details


def _home_entries(home: str) -> list[str]:
    if os.path.exists(home) and not os.path.isdir(home):
        raise EnvironmentProblem(f"--home {home} is a file, not a folder; choose a new or empty folder for --home")
    return os.listdir(home) if os.path.isdir(home) else []


def _home_ledger(home: str) -> Optional[ledger.Ledger]:
    try:
        return ledger.read(home)
    except DataError as exc:  # not a ledger: not hvdtrain's folder either
        raise EnvironmentProblem(str(exc)) from None


def _wait_ready(spec: ClusterSpec, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + spec.start_timeout
    while not os.path.exists(spec.ready_file):
        if proc.poll() is not None:
            down(spec, quiet=True)
            raise EnvironmentProblem(f"the cluster JVM exited ({proc.returncode}) before it was up: "
                                     f"{_failure_line(spec.log_file)}; full log: {spec.log_file}")
        if time.monotonic() > deadline:
            down(spec, quiet=True)
            raise EnvironmentProblem(f"the cluster did not come up within {spec.start_timeout:.0f}s (NameNode out "
                                     f"of safe mode, {spec.nodemanagers} NodeManagers registered); it was stopped; "
                                     f"log: {spec.log_file}")
        time.sleep(0.5)


def _failure_line(log_file: str) -> str:
    try:
        with open(log_file, errors="replace") as fh:
            lines = [ln.strip() for ln in fh if ln.strip()]
    except OSError:
        return "no log"
    failed = [ln for ln in lines if ln.startswith("hvdtrain-minicluster: failed:")]
    return (failed or lines or ["no output"])[-1][:400]


def _write_wrappers(spec: ClusterSpec, java: str, classpath: str) -> None:
    os.makedirs(spec.bin_dir, exist_ok=True)
    for tool, clis in (("yarn", YARN_CLIS), ("hdfs", HDFS_CLIS)):
        path = os.path.join(spec.bin_dir, tool)
        with open(path, "w") as fh:
            fh.write(wrapper_script(java, classpath, spec.conf_dir, clis, tool, spec.krb5_conf if spec.secure else None))
        os.chmod(path, 0o755)


def down(spec: ClusterSpec, grace: float = 60.0, quiet: bool = False, out: TextIO = sys.stdout) -> bool:
    """Stop the cluster JVM (SIGTERM: its shutdown hook stops YARN and HDFS; SIGKILL after ``grace``);
    returns whether one was running."""
    pid = _read_pid(spec)
    if pid is not None:
        _signal_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while _is_launcher(pid) and time.monotonic() < deadline:
            time.sleep(0.3)
        if _is_launcher(pid):
            _signal_group(pid, signal.SIGKILL)
            while _is_launcher(pid):
                time.sleep(0.1)
    owned = _home_ledger(spec.home) if os.path.isdir(spec.home) else None
    for path in (spec.pid_file, spec.ready_file):  # only files hvdtrain's ledger says it writes there
        if owned is not None and owned.owns(os.path.basename(path)) and os.path.exists(path):
            os.unlink(path)
    if not quiet:
        print(f"hvdtrain cluster: {'stopped' if pid else 'not running'} ({spec.home})", file=out)
    return pid is not None


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)  # the JVM leads its own session (start_new_session)
    except (ProcessLookupError, PermissionError):
        pass


# -- presentation --------------------------------------------------------------------------------

def describe(details: dict) -> str:
    """What a user needs to reach the cluster (pure)."""
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in client_env(details).items())
    lines = [f"  HDFS           {details['fs_default']}",
             f"  NameNode UI    {details['namenode_web']}  (WebHDFS: {details['namenode_web']}/webhdfs/v1/)",
             f"  ResourceManager UI  {details['resourcemanager_web']}",
             f"  NodeManagers   {details['nodemanagers']}",
             f"  log            {details['log']}"]
    if "namenodes" in details:
        lines += [f"  NameNodes      {', '.join(f'{k} {v}' for k, v in details['namenodes'].items())} (nameservice "
                  f"{details['nameservice']}; fail over: hdfs haadmin -failover nn1 nn2)"]
    if "hive_metastore" in details:
        lines += [f"  Hive metastore {details['hive_metastore']}  (warehouse {details['hive_warehouse']}; "
                  "conf/hive-site.xml: set hive.embedded=false)"]
    if "kdc" in details:
        lines += [f"  Kerberos       realm {details['realm']}, KDC {details['kdc']}",
                  f"  submit with    --principal {details['principal']} --keytab {details['keytab']}"]
    fitting = " ".join(f"yarn.{k}={v}" for k, v in FITTING_YARN.items())
    return "\n".join([*lines, "use it from this shell:", f"  export {exports} PATH={details['bin']}:$PATH",
                      f"and give hvdtrain yarn etl/submit/score/run settings that fit its containers: {fitting}"])


def main(action: str, spec: ClusterSpec, as_json: bool = False, out: TextIO = sys.stdout) -> int:
    """``hvdtrain cluster ACTION``; errors are raised as :class:`EnvironmentProblem` for the CLI to print."""
    if action == "down":
        down(spec, out=out)
        return 0
    if action == "fetch":
        version, classpath = prepare()
        print(f"hvdtrain cluster: Hadoop {version} jars and launcher ready in {os.path.dirname(classpath.split(':')[0])}",
              file=out)
        return 0
    details = up(spec, out=sys.stderr if as_json else out) if action == "up" else status(spec)
    if details is None:
        print(json.dumps({"running": False, "home": spec.home}) if as_json
              else f"hvdtrain cluster: not running ({spec.home}); start it with `hvdtrain cluster up`", file=out)
        return 1
    print(json.dumps({"running": True, **details}, indent=2) if as_json else describe(details), file=out)
    return 0
