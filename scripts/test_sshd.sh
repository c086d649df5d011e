#!/usr/bin/env bash
# A throwaway sshd for the multihost test tier: two "hosts" on one machine.
#
#   scripts/test_sshd.sh start DIR [PORT]   # run as root; prints the port it listens on
#   scripts/test_sshd.sh stop DIR
#
# start: installs Debian's openssh-server when sshd is missing (apt-get update first
# if the install needs it), generates a host key and a user key in DIR (a fresh,
# private temporary folder), and starts sshd listening ONLY on 127.0.0.2 and
# 127.0.0.3 on PORT (a free port when omitted). Root may log in with the run's key
# only: no passwords, no PAM. DIR/ssh_config is a client config for those hosts
# (port, key, no host-key prompts, known hosts kept in DIR), DIR/bin/ssh an ssh that
# uses it (put DIR/bin first on PATH for horovodrun), DIR/port holds the port. Each
# host's sessions get their own TMPDIR, DIR/host-<address>/tmp: a host's local disk.
# stop: kills the sshd whose pid is in DIR/sshd.pid. DIR itself is the caller's to delete.
set -euo pipefail

die() { echo "test_sshd: $*" >&2; exit 2; }

find_sshd() {
  command -v sshd 2>/dev/null || { [ -x /usr/sbin/sshd ] && echo /usr/sbin/sshd; } || true
}

install_sshd() {
  command -v apt-get >/dev/null || die "sshd not found and no apt-get to install openssh-server"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq --no-install-recommends openssh-server openssh-client >/dev/null 2>&1 \
    || { apt-get update -qq >/dev/null && \
         apt-get install -y -qq --no-install-recommends openssh-server openssh-client >/dev/null; } \
    || die "apt-get install openssh-server failed"
}

free_port() {
  python3 - <<'EOF'
import socket
s = socket.socket()
s.bind(("127.0.0.2", 0))
print(s.getsockname()[1])
EOF
}

start() {
  local dir=$1 port=${2:-}
  [ "$(id -u)" = 0 ] || die "must run as root (sshd binds a port and logs in as root)"
  [ -d "$dir" ] || die "no folder $dir"
  local sshd
  sshd=$(find_sshd)
  if [ -z "$sshd" ]; then install_sshd; sshd=$(find_sshd); fi
  [ -n "$sshd" ] || die "sshd still not found after installing openssh-server"
  command -v ssh-keygen >/dev/null || die "ssh-keygen not found (openssh-client)"
  chmod 700 "$dir"
  [ -n "$port" ] || port=$(free_port)
  ssh-keygen -q -t ed25519 -N '' -f "$dir/host_key"
  ssh-keygen -q -t ed25519 -N '' -f "$dir/id_ed25519"
  cp "$dir/id_ed25519.pub" "$dir/authorized_keys"
  chmod 600 "$dir/authorized_keys"
  mkdir -p /run/sshd  # privilege separation folder
  cat > "$dir/sshd_config" <<EOF
Port $port
ListenAddress 127.0.0.2
ListenAddress 127.0.0.3
HostKey $dir/host_key
PidFile $dir/sshd.pid
AuthorizedKeysFile $dir/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
# The key files live in a temporary folder under /tmp (world-writable): sshd's ownership
# checks of the path would refuse them. The folder itself is 0700 and root's.
StrictModes no
MaxStartups 64:30:128
MaxSessions 64
LogLevel VERBOSE
EOF
  for host in 127.0.0.2 127.0.0.3; do
    mkdir -p "$dir/host-$host/tmp"
    printf 'Match LocalAddress %s\n  SetEnv TMPDIR=%s\n' "$host" "$dir/host-$host/tmp" >> "$dir/sshd_config"
  done
  cat > "$dir/ssh_config" <<EOF
Host 127.0.0.2 127.0.0.3
  Port $port
  User root
  IdentityFile $dir/id_ed25519
  IdentitiesOnly yes
  BatchMode yes
  StrictHostKeyChecking no
  UserKnownHostsFile $dir/known_hosts
  LogLevel ERROR
EOF
  mkdir -p "$dir/bin"
  printf '#!/bin/sh\nexec %s -F %s "$@"\n' "$(command -v ssh)" "$dir/ssh_config" > "$dir/bin/ssh"
  chmod 755 "$dir/bin/ssh"
  "$sshd" -f "$dir/sshd_config" -E "$dir/sshd.log" || die "sshd did not start: $(cat "$dir/sshd.log" 2>/dev/null)"
  for _ in $(seq 50); do
    [ -s "$dir/sshd.pid" ] && ssh -F "$dir/ssh_config" 127.0.0.3 true 2>/dev/null && break
    sleep 0.1
  done
  ssh -F "$dir/ssh_config" 127.0.0.2 true || die "ssh to 127.0.0.2:$port failed: $(cat "$dir/sshd.log")"
  echo "$port" > "$dir/port"
  echo "$port"
}

stop() {
  local dir=$1
  [ -s "$dir/sshd.pid" ] || return 0
  kill "$(cat "$dir/sshd.pid")" 2>/dev/null || true
  rm -f "$dir/sshd.pid"
}

case "${1:-}" in
  start) [ $# -ge 2 ] || die "usage: $0 start DIR [PORT]"; start "$2" "${3:-}" ;;
  stop) [ $# -ge 2 ] || die "usage: $0 stop DIR"; stop "$2" ;;
  *) die "usage: $0 start DIR [PORT] | stop DIR" ;;
esac
