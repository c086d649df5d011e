import java.io.File;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.net.URI;
import java.net.URISyntaxException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.StandardCopyOption;
import java.nio.file.attribute.PosixFilePermissions;
import java.lang.reflect.Field;
import java.lang.reflect.Method;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Properties;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.ChecksumFs;
import org.apache.hadoop.fs.DelegateToFileSystem;
import org.apache.hadoop.fs.FsConstants;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.FsServerDefaults;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.local.LocalConfigKeys;
import org.apache.hadoop.fs.permission.FsPermission;
import org.apache.hadoop.hdfs.MiniDFSCluster;
import org.apache.hadoop.hdfs.MiniDFSNNTopology;
import org.apache.hadoop.hdfs.server.namenode.ha.ConfiguredFailoverProxyProvider;
import org.apache.hadoop.minikdc.MiniKdc;
import org.apache.hadoop.security.UserGroupInformation;
import org.apache.hadoop.util.VersionInfo;
import org.apache.hadoop.yarn.conf.YarnConfiguration;
import org.apache.hadoop.yarn.logaggregation.AggregatedLogDeletionService;
import org.apache.hadoop.yarn.server.MiniYARNCluster;
import org.apache.hadoop.yarn.server.nodemanager.NodeManager;
import org.apache.hadoop.yarn.server.resourcemanager.ResourceManager;
import org.apache.hadoop.yarn.webapp.WebApp;

/**
 * hvdtrain's one-JVM Hadoop (started by hvdtrain/hadoop/minicluster/cluster.py, which plans every setting):
 * MiniDFSCluster (one NameNode with WebHDFS, or an HA pair; one DataNode) and MiniYARNCluster (one ResourceManager,
 * N NodeManagers). MiniHadoopClusterManager (Hadoop's CLI MiniCluster) always adds MapReduce and a
 * JobHistoryServer and cannot bind its NodeManagers to loopback, hence this launcher.
 *
 * The NodeManagers' local filesystem sets permissions through java.nio (NioLocalFs below), as a production
 * NodeManager does through libhadoop's native chmod: without that library Hadoop forks `chmod` once per file,
 * and localizing a 45,000-file Python environment took 100 s per NodeManager instead of about 15.
 *
 * With a Hive metastore (`hvdtrain cluster up --hive`, settings under hvdtrain.hive.*): once HDFS serves, a child
 * JVM runs Hive's own metastore Thrift service (HiveMetaStore, from the Hive jars pyspark ships: the version
 * Spark's client speaks), its Derby database on this host and its warehouse on HDFS; CONF_DIR/hive-site.xml
 * names it. The shutdown hook stops it first.
 *
 * HA (`hvdtrain cluster up --ha`, settings under hvdtrain.ha.*): a nameservice of two NameNodes (nn1 on NN_PORT and
 * NN_HTTP_PORT, nn2 on hvdtrain.ha.nn2-port and -http-port) sharing an edits folder, as MiniDFSCluster's HA topology
 * makes it; nn1 is made active, nn2 stays standby until `hdfs haadmin -failover nn1 nn2`. Clients (and the YARN
 * daemons here) reach hdfs://NAMESERVICE through Hadoop's ConfiguredFailoverProxyProvider, as on a real cluster.
 * With dfs.http.policy=HTTPS_ONLY (`up --https`; cluster.py writes the keystore and CONF_DIR/ssl-*.xml before this
 * JVM starts) the NameNodes' and the DataNode's web servers speak TLS only, and the ready file names https URLs.
 *
 * Secure mode (`hvdtrain cluster up --secure`, settings under hvdtrain.kdc.*): a MiniKdc (Apache Kerby) starts
 * first and writes the principals' keytabs; every daemon then runs with Kerberos as cluster.py configured it.
 *
 * args: BASE_DIR CONF_DIR READY_FILE NN_PORT NN_HTTP_PORT NODE_MANAGERS [key=value ...]
 * Writes CONF_DIR/{core,hdfs,yarn}-site.xml, then READY_FILE (JSON) once the NodeManagers are registered
 * and the NameNode is out of safe mode; runs until SIGTERM, whose shutdown hook stops YARN and HDFS.
 */
public final class HvdtrainMiniCluster {
  public static void main(String[] args) {
    try {
      run(args);
    } catch (Throwable e) {
      e.printStackTrace();
      System.err.println("hvdtrain-minicluster: failed: " + e);
      System.exit(1);  // the shutdown hook stops what did start
    }
  }

  private static void run(String[] args) throws Exception {
    // fs.AbstractFileSystem.file.impl = NioLocalFs for every Configuration in this JVM (cluster.py writes the
    // file beside the classes); writeSite leaves it out of the client's *-site.xml.
    Configuration.addDefaultResource("hvdtrain-localfs.xml");
    File base = new File(args[0]);
    File confDir = new File(args[1]);
    File ready = new File(args[2]);
    Configuration conf = new YarnConfiguration();
    for (int i = 6; i < args.length; i++) {
      String[] kv = args[i].split("=", 2);
      conf.set(kv[0], kv[1]);
    }
    watchOwner(conf.getLong(OWNER_PID, -1));
    MiniKdc kdc = conf.get(KDC + "dir") == null ? null : startKdc(conf);
    String nameservice = conf.get(HA + "nameservice");
    MiniDFSCluster.Builder dfsBuilder = new MiniDFSCluster.Builder(conf, new File(base, "dfs")).numDataNodes(1)
        .format(true);
    if (nameservice == null) {
      dfsBuilder.nameNodePort(Integer.parseInt(args[3])).nameNodeHttpPort(Integer.parseInt(args[4]));
    } else {
      dfsBuilder.nnTopology(new MiniDFSNNTopology().addNameservice(new MiniDFSNNTopology.NSConf(nameservice)
          .addNN(new MiniDFSNNTopology.NNConf("nn1").setIpcPort(Integer.parseInt(args[3]))
              .setHttpPort(Integer.parseInt(args[4])))
          .addNN(new MiniDFSNNTopology.NNConf("nn2").setIpcPort(conf.getInt(HA + "nn2-port", 0))
              .setHttpPort(conf.getInt(HA + "nn2-http-port", 0)))));
    }
    MiniDFSCluster dfs = dfsBuilder.build();
    int nodeManagers = Integer.parseInt(args[5]);
    MiniYARNCluster yarn = new MiniYARNCluster("hvdtrain", nodeManagers, 1, 1);
    Process[] metastore = new Process[1];
    boolean aggregation = conf.getBoolean(YarnConfiguration.LOG_AGGREGATION_ENABLED, false);
    AggregatedLogDeletionService logDeletion = new AggregatedLogDeletionService();
    Runtime.getRuntime().addShutdownHook(new Thread(() -> {
      stopMetastore(metastore[0]);
      logDeletion.stop();  // a no-op when it never started
      stopNodeManagersTogether(yarn, nodeManagers);
      yarn.stop();
      dfs.shutdown();
      if (kdc != null) {
        kdc.stop();
      }
    }));
    dfs.waitActive();
    String fsUri = dfs.getURI(0).toString();
    // HTTPS_ONLY (`up --https`): the NameNodes' web servers (WebHDFS) listen on their https-address only.
    boolean https = "HTTPS_ONLY".equalsIgnoreCase(conf.get("dfs.http.policy", "HTTP_ONLY"));
    String webKey = https ? "dfs.namenode.https-address" : "dfs.namenode.http-address";
    String web = https ? "https://" : "http://";
    String webAddress = conf.get(webKey);
    if (nameservice != null) {
      dfs.transitionToActive(0);
      fsUri = "hdfs://" + nameservice;
      conf.set("dfs.client.failover.proxy.provider." + nameservice, ConfiguredFailoverProxyProvider.class.getName());
      webAddress = conf.get(webKey + "." + nameservice + ".nn1");
    }
    conf.set("fs.defaultFS", fsUri);
    FileSystem hdfs = FileSystem.get(URI.create(fsUri), conf);
    if (aggregation) {
      createAppLogRoot(hdfs, conf.get(YarnConfiguration.NM_REMOTE_APP_LOG_DIR));
    }
    createHomes(hdfs, conf.getTrimmedStrings(USERS));
    yarn.init(conf);
    yarn.start();
    if (aggregation) {  // deletes aggregated logs older than yarn.log-aggregation.retain-seconds
      logDeletion.init(conf);
      logDeletion.start();
    }
    if (!yarn.waitForNodeManagersToConnect(300000)) {
      throw new IllegalStateException("the NodeManagers did not register with the ResourceManager in 300 s");
    }
    restartResourceManagerWebApp(yarn.getResourceManager());
    while (dfs.getNameNode(0).isInSafeMode()) {
      Thread.sleep(200);
    }
    Configuration all = yarn.getConfig();
    confDir.mkdirs();
    writeSite(all, new File(confDir, "core-site.xml"), "fs.", "hadoop.");
    writeSite(all, new File(confDir, "hdfs-site.xml"), "dfs.");
    writeSite(all, new File(confDir, "yarn-site.xml"), "yarn.");
    new File(confDir, "hive-site.xml").delete();  // a previous run's names another port
    if (conf.get(HIVE + "port") != null) {  // after the *-site.xml files: the metastore's classpath reads them
      metastore[0] = startMetastore(conf, hdfs, fsUri, confDir);
    }
    String json = "{\"pid\": " + ProcessHandle.current().pid()
        + ", \"hadoop_version\": \"" + VersionInfo.getVersion() + "\""
        + ", \"fs_default\": \"" + fsUri + "\""
        + ", \"namenode_web\": \"" + web + webAddress + "\""
        + (nameservice == null ? "" : ", \"nameservice\": \"" + nameservice + "\", \"namenodes\": {\"nn1\": \"" + web
            + webAddress + "\", \"nn2\": \"" + web + conf.get(webKey + "." + nameservice + ".nn2") + "\"}")
        + ", \"resourcemanager\": \"" + all.get("yarn.resourcemanager.address") + "\""
        + ", \"resourcemanager_web\": \"http://" + all.get("yarn.resourcemanager.webapp.address") + "\""
        + ", \"nodemanagers\": " + args[5]
        + (metastore[0] == null ? "" : ", \"hive_metastore\": \"thrift://" + conf.get(HIVE + "host") + ":"
            + conf.get(HIVE + "port") + "\", \"hive_warehouse\": \"" + fsUri + conf.get(HIVE + "warehouse")
            + "\"")
        + (kdc == null ? "" : ", \"kdc\": \"" + kdc.getHost() + ":" + kdc.getPort() + "\", \"realm\": \""
            + kdc.getRealm() + "\"") + "}\n";
    File tmp = new File(ready.getPath() + ".tmp");
    Files.write(tmp.toPath(), json.getBytes(StandardCharsets.UTF_8));
    Files.move(tmp.toPath(), ready.toPath(), StandardCopyOption.ATOMIC_MOVE);
    Thread.currentThread().join();
  }

  private static final String KDC = "hvdtrain.kdc.";
  private static final String HA = "hvdtrain.ha.";

  /**
   * The aggregated logs' root on HDFS, made as an operator makes it before the NodeManagers start: sticky and
   * writable by all (1777), so every user's NodeManager uploads create their own folder and none can delete
   * another's.
   */
  private static void createAppLogRoot(FileSystem fs, String dir) throws IOException {
    makeDir(fs, new Path(dir), (short) 01777);
  }

  /** A folder with exactly this mode (mkdirs applies the umask, so the mode is set after it). */
  private static void makeDir(FileSystem fs, Path dir, short mode) throws IOException {
    fs.mkdirs(dir);
    fs.setPermission(dir, new FsPermission(mode));
  }
  private static final String OWNER_PID = "hvdtrain.owner-pid";
  private static final String USERS = "hvdtrain.hdfs.users";
  private static final String HIVE = "hvdtrain.hive.";

  /**
   * Hive's metastore service in a child JVM (so that its jars, pyspark's, never meet the minicluster's): the
   * warehouse made on HDFS first (1777, shared by every user as /tmp is), then HiveMetaStore on
   * hvdtrain.hive.host:port with its Derby database in hvdtrain.hive.db, its log in hvdtrain.hive.log. Returns
   * once the port accepts connections; then CONF_DIR/hive-site.xml names the service and the warehouse.
   */
  private static Process startMetastore(Configuration conf, FileSystem fs, String fsUri, File confDir)
      throws Exception {
    Path warehouse = new Path(conf.get(HIVE + "warehouse"));
    makeDir(fs, warehouse, (short) 01777);
    String host = conf.get(HIVE + "host");
    int port = conf.getInt(HIVE + "port", 9083);
    String uri = "thrift://" + host + ":" + port;
    List<String> cmd = new ArrayList<>(List.of(
        System.getProperty("java.home") + "/bin/java", "-Xmx" + conf.get(HIVE + "heap", "384m"),
        // Hive's log4j2 setup asks for the LMAX disruptor's async loggers, which pyspark does not ship.
        "-Dlog4j2.contextSelector=org.apache.logging.log4j.core.selector.ClassLoaderContextSelector",
        "-Dderby.system.home=" + conf.get(HIVE + "db"),
        // Hive's log (its audit lines too: one per metastore call, naming the call, the user and the table).
        "-Dhive.log.dir=" + new File(conf.get(HIVE + "log")).getParent(),
        "-Dhive.log.file=" + new File(conf.get(HIVE + "log")).getName(),
        "-cp", confDir.getAbsolutePath() + File.pathSeparator + conf.get(HIVE + "classpath"),
        "org.apache.hadoop.hive.metastore.HiveMetaStore", "-p", String.valueOf(port)));
    String[][] settings = {
        {"javax.jdo.option.ConnectionURL", "jdbc:derby:;databaseName=" + conf.get(HIVE + "db")
            + "/metastore_db;create=true"},
        {"hive.metastore.warehouse.dir", fsUri + warehouse},
        {"datanucleus.schema.autoCreateAll", "true"},
        {"hive.metastore.schema.verification", "false"},
        {"fs.defaultFS", fsUri}};
    for (String[] kv : settings) {
      cmd.add("--hiveconf");
      cmd.add(kv[0] + "=" + kv[1]);
    }
    Process proc = new ProcessBuilder(cmd).redirectErrorStream(true)
        .redirectOutput(new File(conf.get(HIVE + "log") + ".out")).start();
    long deadline = System.currentTimeMillis() + conf.getLong(HIVE + "start-ms", 180000);
    while (true) {
      try (Socket socket = new Socket()) {
        socket.connect(new InetSocketAddress(host, port), 1000);
        break;
      } catch (IOException e) {
        if (!proc.isAlive()) {
          throw new IllegalStateException("the Hive metastore exited (" + proc.exitValue() + ") before it served; "
              + "its log: " + conf.get(HIVE + "log"));
        }
        if (System.currentTimeMillis() > deadline) {
          proc.destroyForcibly();
          throw new IllegalStateException("the Hive metastore did not serve on " + uri + " in time; its log: "
              + conf.get(HIVE + "log"));
        }
        Thread.sleep(300);
      }
    }
    Configuration site = new Configuration(false);
    site.set("hive.metastore.uris", uri);
    site.set("hive.metastore.warehouse.dir", fsUri + warehouse);
    try (OutputStream out = new FileOutputStream(new File(confDir, "hive-site.xml"))) {
      site.writeXml(out);
    }
    return proc;
  }

  private static void stopMetastore(Process proc) {
    if (proc == null) {
      return;
    }
    proc.destroy();
    try {
      if (!proc.waitFor(30, java.util.concurrent.TimeUnit.SECONDS)) {
        proc.destroyForcibly();
      }
    } catch (InterruptedException e) {
      proc.destroyForcibly();
      Thread.currentThread().interrupt();
    }
  }

  /**
   * What an operator makes on a new cluster whose permissions are on: /tmp writable by all and sticky (1777),
   * /user (755) and a home folder for each user (hvdtrain.hdfs.users), owned by that user. The cluster's own
   * user (this JVM's login) is HDFS's superuser; every other user meets the permission checks.
   */
  private static void createHomes(FileSystem fs, String[] users) throws IOException {
    makeDir(fs, new Path("/tmp"), (short) 01777);
    makeDir(fs, new Path("/user"), (short) 0755);
    for (String user : users) {
      Path dir = new Path("/user", user);
      makeDir(fs, dir, (short) 0755);
      fs.setOwner(dir, user, user);
    }
  }

  /**
   * With an owner (hvdtrain.owner-pid, a throwaway cluster's test session): once that process is gone, however it
   * ended (a SIGKILL included), exit; the shutdown hook then stops YARN and HDFS. Checked every second.
   */
  private static void watchOwner(long pid) {
    if (pid <= 0) {
      return;
    }
    Thread watch = new Thread(() -> {
      while (ProcessHandle.of(pid).map(ProcessHandle::isAlive).orElse(false)) {
        try {
          Thread.sleep(1000);
        } catch (InterruptedException e) {
          return;
        }
      }
      System.err.println("hvdtrain-minicluster: owner process " + pid + " is gone; stopping");
      System.exit(0);
    }, "hvdtrain-owner-watch");
    watch.setDaemon(true);
    watch.start();
  }

  /**
   * Starts the KDC (bound to hvdtrain.kdc.host, tickets of at most hvdtrain.kdc.ticket-seconds), copies the
   * krb5.conf it writes to hvdtrain.kdc.dir/krb5.conf (this JVM's too), creates every hvdtrain.kdc.keytab.FILE=PRINCIPAL,...
   * and logs this JVM in as the NameNode's principal: MiniYARNCluster's daemons skip their own keytab login and
   * run as the JVM's login user, so every daemon here shares that one service principal.
   */
  private static MiniKdc startKdc(Configuration conf) throws Exception {
    File dir = new File(conf.get(KDC + "dir"));
    dir.mkdirs();
    Properties kdcConf = MiniKdc.createConf();
    kdcConf.setProperty(MiniKdc.KDC_BIND_ADDRESS, conf.get(KDC + "host"));
    kdcConf.setProperty(MiniKdc.MAX_TICKET_LIFETIME, conf.get(KDC + "ticket-seconds"));
    kdcConf.setProperty(MiniKdc.MAX_RENEWABLE_LIFETIME, conf.get(KDC + "renewable-seconds"));
    MiniKdc kdc = new MiniKdc(kdcConf, dir);
    kdc.start();  // writes a krb5.conf into a new folder of its own
    File krb5 = new File(dir, "krb5.conf");  // where cluster.py told the clients and containers to look
    Files.copy(kdc.getKrb5conf().toPath(), krb5.toPath(), StandardCopyOption.REPLACE_EXISTING);
    System.setProperty(MiniKdc.JAVA_SECURITY_KRB5_CONF, krb5.getAbsolutePath());
    for (Map.Entry<String, String> entry : conf.getPropsWithPrefix(KDC + "keytab.").entrySet()) {
      kdc.createPrincipal(new File(dir, entry.getKey()), entry.getValue().split(","));
    }
    UserGroupInformation.setConfiguration(conf);
    UserGroupInformation.loginUserFromKeytab(conf.get("dfs.namenode.kerberos.principal"),
        conf.get("dfs.namenode.keytab.file"));
    return kdc;
  }

  /**
   * Without log aggregation, each NodeManager that ran an application waits about 16 s to stop (its applications
   * stay until their logs' retention ends, which is after the cluster's life: the clean-up wait, then the log
   * handler's 10 s; with aggregation they end once their logs are uploaded): stopped
   * one after the other (MiniYARNCluster.stop), two took 35 s. Stopped together they take one wait.
   */
  private static void stopNodeManagersTogether(MiniYARNCluster yarn, int count) {
    Thread[] stops = new Thread[count];
    for (int i = 0; i < count; i++) {
      NodeManager nm = yarn.getNodeManager(i);
      stops[i] = new Thread(() -> {
        if (nm != null) {
          nm.stop();
        }
      });
      stops[i].start();
    }
    for (Thread stop : stops) {
      try {
        stop.join(60000);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        return;
      }
    }
  }

  /**
   * Guice's servlet pipeline is JVM-wide: the last web app started (a NodeManager's) answers on every port, so
   * the ResourceManager's UI and REST API return 404. Restarting the ResourceManager's web app after the
   * NodeManagers makes it the last one (the NodeManagers' own UIs are the ones left broken).
   */
  private static void restartResourceManagerWebApp(ResourceManager rm) throws Exception {
    Field field = ResourceManager.class.getDeclaredField("webApp");
    field.setAccessible(true);
    ((WebApp) field.get(rm)).stop();
    Method start = ResourceManager.class.getDeclaredMethod("startWepApp");
    start.setAccessible(true);
    start.invoke(rm);
  }

  /**
   * A NameNode's own identity, which MiniDFSCluster leaves in the shared Configuration when it starts an HA pair: a
   * client's configuration names the nameservice's NameNodes, never which one it is.
   */
  private static final List<String> DAEMON_ONLY = List.of("dfs.ha.namenode.id", "dfs.nameservice.id");

  /** The settings whose names start with one of the prefixes, as a Hadoop *-site.xml. */
  private static void writeSite(Configuration all, File file, String... prefixes) throws Exception {
    Configuration site = new Configuration(false);
    for (Map.Entry<String, String> entry : all) {
      for (String prefix : prefixes) {
        if (entry.getKey().startsWith(prefix) && !entry.getValue().startsWith(HvdtrainMiniCluster.class.getName())
            && !DAEMON_ONLY.contains(entry.getKey())) {
          site.set(entry.getKey(), all.get(entry.getKey()));
        }
      }
    }
    try (OutputStream out = new FileOutputStream(file)) {
      site.writeXml(out);
    }
  }

  /**
   * Hadoop's LocalFs (file:// for FileContext: NodeManager localization, container folders) whose
   * setPermission is a java.nio call instead of a forked `chmod` (Hadoop's fallback without libhadoop).
   */
  public static final class NioLocalFs extends ChecksumFs {
    public NioLocalFs(URI uri, Configuration conf) throws IOException, URISyntaxException {
      super(new NioRawLocalFs(uri, conf));
    }
  }

  /** Hadoop's RawLocalFs over {@link NioRawLocalFileSystem} (RawLocalFs's constructors are package-private). */
  public static final class NioRawLocalFs extends DelegateToFileSystem {
    public NioRawLocalFs(URI uri, Configuration conf) throws IOException, URISyntaxException {
      super(uri, new NioRawLocalFileSystem(), conf, FsConstants.LOCAL_FS_URI.getScheme(), false);
    }

    @Override
    public int getUriDefaultPort() {
      return -1;  // file:/// has none
    }

    @Override
    @Deprecated
    public FsServerDefaults getServerDefaults() throws IOException {
      return LocalConfigKeys.getServerDefaults();
    }

    @Override
    public FsServerDefaults getServerDefaults(Path f) throws IOException {
      return LocalConfigKeys.getServerDefaults();
    }

    @Override
    public boolean isValidName(String src) {
      return true;  // as RawLocalFs: the OS decides
    }
  }

  /** RawLocalFileSystem with setPermission through java.nio (a sticky bit still goes to `chmod`). */
  public static final class NioRawLocalFileSystem extends RawLocalFileSystem {
    @Override
    public void setPermission(Path p, FsPermission permission) throws IOException {
      if (permission.getStickyBit()) {
        super.setPermission(p, permission);
        return;
      }
      String symbols = permission.getUserAction().SYMBOL + permission.getGroupAction().SYMBOL
          + permission.getOtherAction().SYMBOL;
      Files.setPosixFilePermissions(pathToFile(p).toPath(), PosixFilePermissions.fromString(symbols));
    }
  }
}
