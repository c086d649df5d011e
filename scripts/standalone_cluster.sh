#!/usr/bin/env bash
# A Spark standalone cluster on one machine, from the pip-installed pyspark: a master and
# two workers that look like two hosts.
#
#   scripts/standalone_cluster.sh start DIR [PYTHON [OWNER_PID]]  # prints the master URL, spark://127.0.0.1:PORT
#   scripts/standalone_cluster.sh stop DIR
#   scripts/standalone_cluster.sh watch OWNER_PID DIR  # stop DIR's daemons once OWNER_PID is gone
#
# start: the master listens on 127.0.0.1; worker host-a on 127.0.0.2 and worker host-b on
# 127.0.0.3, each started inside its own UTS and mount namespaces (`unshare --uts --mount`, needs
# root or user namespaces) with its own hostname, so its executors and the Python processes they
# start report host-a / host-b (socket.gethostname()), and with DIR/hosts bind-mounted on /etc/hosts
# so that both names resolve there, as DNS resolves a cluster's hosts. Every service and web UI binds its
# own loopback address (SPARK_LOCAL_IP): nothing listens on another interface. Each worker
# has one core (one executor, so one rank, per host) and its own local disk, DIR/host-X/
# (work/ for executors, tmp/ as TMPDIR). PYTHON (default: python3 on PATH) is the
# interpreter whose pyspark runs the cluster. DIR/master_url holds the URL, DIR/*.pid the
# daemons' pids, DIR/*.log their logs.
# stop: kills the daemons whose pids are in DIR (their executors go with the workers).
# OWNER_PID (a test session): a detached watcher stops the daemons once that process is gone, however it ended
# (a SIGKILL included), so no JVM outlives it; stop ends the watcher too.
# Requires Java 17 on PATH, like any pyspark 4 use.
set -euo pipefail

die() { echo "standalone_cluster: $*" >&2; exit 2; }

free_port() {  # a free port on the given loopback address
  "$PY" -c 'import socket, sys
s = socket.socket(); s.bind((sys.argv[1], 0)); print(s.getsockname()[1])' "$1"
}

daemon() {  # NAME IP HOSTNAME CLASS ARGS...: start one daemon in its own UTS and mount namespaces, record its pid
  local name=$1 ip=$2 host=$3 class=$4; shift 4
  local disk="$DIR/$name"
  mkdir -p "$disk/work" "$disk/tmp"
  # SPARK_LOCAL_IP binds the daemon, its web UI and its executors to one address; SPARK_LOCAL_HOSTNAME is the
  # name it reports. DIR/hosts, bind-mounted on /etc/hosts in its mount namespace, resolves the new host names
  # (Gloo binds the address of its own host name); a daemon whose mount fails does not start.
  env SPARK_HOME="$SPARK_HOME" SPARK_LOCAL_IP="$ip" SPARK_LOCAL_HOSTNAME="$host" SPARK_LOG_DIR="$disk" \
    SPARK_WORKER_DIR="$disk/work" SPARK_LOCAL_DIRS="$disk/tmp" TMPDIR="$disk/tmp" \
    SPARK_NO_DAEMONIZE=1 PYSPARK_PYTHON="$PY" \
    setsid unshare --uts --mount bash -c 'hostname "$0" && mount --bind "$1" /etc/hosts || exit 1; shift; exec "$@"' \
    "$host" "$DIR/hosts" \
    "$SPARK_HOME/bin/spark-class" "$class" "$@" > "$DIR/$name.log" 2>&1 < /dev/null &
  echo $! > "$DIR/$name.pid"
}

wait_for() {  # LOG PATTERN WHAT: wait up to 120 s for a line in a daemon's log
  for _ in $(seq 600); do
    grep -q "$2" "$1" 2>/dev/null && return 0
    sleep 0.2
  done
  die "$3 did not start in 120 s; its log ($1):
$(tail -n 30 "$1" 2>/dev/null)"
}

start() {
  DIR=$1 PY=${2:-python3}
  [ -d "$DIR" ] || die "no folder $DIR"
  command -v unshare >/dev/null || die "unshare not found (util-linux)"
  unshare --uts --mount true 2>/dev/null \
    || die "cannot create UTS and mount namespaces here (unshare --uts --mount needs root or user namespaces)"
  command -v java >/dev/null || die "java not found: Spark needs Java 17 on PATH"
  SPARK_HOME=$("$PY" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))' 2>/dev/null) \
    || die "$PY cannot import pyspark (pip install pyspark, or pass the venv's python)"
  local port ui
  port=$(free_port 127.0.0.1)
  ui=$(free_port 127.0.0.1)
  # The names resolve inside every daemon's namespaces as a cluster's DNS would resolve them (Gloo binds the
  # address of its own host name): a private /etc/hosts, bind-mounted in each daemon's mount namespace; the
  # machine's own /etc/hosts is not touched.
  { cat /etc/hosts; printf '127.0.0.2 host-a\n127.0.0.3 host-b\n'; } > "$DIR/hosts"
  daemon master 127.0.0.1 "$(hostname)" org.apache.spark.deploy.master.Master \
    --host 127.0.0.1 --port "$port" --webui-port "$ui"
  wait_for "$DIR/master.log" "I have been elected leader" "the master"
  local url="spark://127.0.0.1:$port"
  for spec in host-a:127.0.0.2 host-b:127.0.0.3; do
    local host=${spec%%:*} ip=${spec#*:}
    daemon "$host" "$ip" "$host" org.apache.spark.deploy.worker.Worker \
      --host "$ip" --port "$(free_port "$ip")" --webui-port "$(free_port "$ip")" \
      --cores 1 --memory 2g --work-dir "$DIR/$host/work" "$url"
  done
  for host in host-a host-b; do
    wait_for "$DIR/$host.log" "Successfully registered with master" "worker $host"
  done
  echo "$url" > "$DIR/master_url"
  if [ -n "${3:-}" ]; then
    setsid bash "$0" watch "$3" "$DIR" </dev/null >/dev/null 2>&1 &
    echo $! > "$DIR/watch.pid"
  fi
  echo "$url"
}

watch() {
  local owner=$1 dir=$2
  while kill -0 "$owner" 2>/dev/null; do sleep 1; done
  rm -f "$dir/watch.pid"
  stop "$dir"
}

stop() {
  local dir=$1
  for name in host-a host-b master; do
    [ -s "$dir/$name.pid" ] || continue
    # setsid made each daemon a process-group leader: its group holds the JVM and the executors it started.
    kill -- -"$(cat "$dir/$name.pid")" 2>/dev/null || true
    rm -f "$dir/$name.pid"
  done
  if [ -s "$dir/watch.pid" ]; then
    kill -- -"$(cat "$dir/watch.pid")" 2>/dev/null || true
    rm -f "$dir/watch.pid"
  fi
}

case "${1:-}" in
  start) [ $# -ge 2 ] || die "usage: $0 start DIR [PYTHON [OWNER_PID]]"; start "$2" "${3:-}" "${4:-}" ;;
  stop) [ $# -ge 2 ] || die "usage: $0 stop DIR"; stop "$2" ;;
  watch) [ $# -ge 3 ] || die "usage: $0 watch OWNER_PID DIR"; watch "$2" "$3" ;;
  *) die "usage: $0 start DIR [PYTHON [OWNER_PID]] | stop DIR | watch OWNER_PID DIR" ;;
esac
