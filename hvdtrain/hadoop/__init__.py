"""The Hadoop client: file systems (HDFS, WebHDFS, local), cluster configs, tokens and Kerberos, ledgers and
leases on shared outputs, environment checks, and the one-machine minicluster."""
