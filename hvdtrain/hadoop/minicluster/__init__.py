"""A one-machine Hadoop (HDFS + YARN) from Apache Hadoop's own minicluster: see :mod:`hvdtrain.hadoop.minicluster.cluster`."""
