#!/usr/bin/env bash
# Leasehold on loopback as separate processes: three redis-servers
# (6381-6383), three allocator nodes (allocator-{1,2,3}.toml, 7301-7303,
# /metrics on 7391-7393) and
# three Region agents (agent-{eu,us,ap}.toml, each on its own Redis).
#
#   deploy/regions/run-local.sh up       start what is not running, wait for every /health
#   deploy/regions/run-local.sh up --cluster
#                                        the production topology instead: each Region on
#                                        its own Redis Cluster (3 primaries + 3 replicas:
#                                        eu 6400-6405, us 6410-6415, ap 6420-6425) served by
#                                        two agents (R-a on agent-R.toml's ports, R-b 10
#                                        above its gRPC port and 10 below its HTTP port),
#                                        one of which syncs with the allocator
#   deploy/regions/run-local.sh status   what runs, and each agent's /health
#   deploy/regions/run-local.sh down     stop everything (idempotent)
#   deploy/regions/run-local.sh clean    down, then delete target/leasehold-run and the
#                                        allocators' sled data (target/leasehold-data)
#
# mTLS throughout: the first `up` writes target/leasehold-certs with
# `leasehold certs init` (kept across runs; `clean` keeps it too); the CLI
# reads with `--tls-dir target/leasehold-certs` or LEASEHOLD_TLS_DIR.
#
# Binary: $LEASEHOLD_BIN, else the release build (built with `cargo build
# --release` when missing; $CARGO_TARGET_DIR is honoured). Pid files, logs,
# Redis data and the derived agent configs live in target/leasehold-run/.
# The allocators keep their raft logs in target/leasehold-data/ (their
# configs say so): a second `up` recovers the same cluster.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
run="$root/target/leasehold-run"
# The certificates every process presents (mTLS; the configs name them).
certs="$root/target/leasehold-certs"
regions=(eu us ap)
nodes=(1 2 3)
# `up --cluster` writes "cluster" here; down and status read it.
mode_file="$run/mode"
# Bound on each wait for a process to answer or to exit, in tenths of a second.
wait_tenths=300

redis_port() { # eu → 6381, us → 6382, ap → 6383
  case "$1" in eu) echo 6381 ;; us) echo 6382 ;; ap) echo 6383 ;; esac
}

config_value() { # config_value FILE KEY: the quoted value of a top-level KEY = "…"
  sed -n "s/^$2[[:space:]]*=[[:space:]]*\"\([^\"]*\)\".*/\1/p" "$1" | head -n 1
}

health_url() { # the agent's http_listen, read from its config (HTTPS: mTLS on)
  echo "https://$(config_value "$here/agent-$1.toml" http_listen)/health"
}

# curl as the sre identity (the agents' HTTP listeners want a client
# certificate the CA signed).
curl_sre() {
  curl --cacert "$certs/ca.pem" --cert "$certs/sre.pem" --key "$certs/sre.key" "$@"
}

# Refuses to start NAME when something else already listens on ADDR
# (host:port), e.g. `leasehold dev` on the same default ports.
require_free() {
  local name="$1" addr="$2"
  if port_open "${addr##*:}"; then
    die "$name: port ${addr##*:} is taken by another process (\`leasehold dev\`? give it --port-offset); nothing more started, \`$0 down\` stops what did"
  fi
}

say() { printf 'run-local: %s\n' "$*"; }
die() { printf 'run-local: %s\n' "$*" >&2; exit 1; }

binary() {
  if [[ -n "${LEASEHOLD_BIN:-}" ]]; then
    [[ -x "$LEASEHOLD_BIN" ]] || die "LEASEHOLD_BIN=$LEASEHOLD_BIN is not an executable"
    echo "$LEASEHOLD_BIN"
    return
  fi
  local bin="${CARGO_TARGET_DIR:-$root/target}/release/leasehold"
  if [[ ! -x "$bin" ]]; then
    say "building $bin (cargo build --release)" >&2
    (cd "$root" && cargo build --release >&2)
  fi
  echo "$bin"
}

# The pid in a pid file if that process is alive (not a zombie) and its
# command line contains $2 (so a recycled pid is never signalled); empty
# otherwise.
live_pid() {
  local file="$1" expect="$2" pid state
  [[ -f "$file" ]] || return 0
  # The file can go between the test and the read (redis-server removes
  # its own pid file as it exits).
  pid="$(tr -dc '0-9' < "$file" 2>/dev/null)" || return 0
  [[ -n "$pid" ]] || return 0
  state="$(ps -p "$pid" -o stat= 2>/dev/null || true)"
  [[ -n "$state" && "$state" != Z* ]] || return 0
  if ps -p "$pid" -o args= 2>/dev/null | grep -q -- "$expect"; then
    echo "$pid"
  fi
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

healthy() {
  if command -v curl >/dev/null; then
    curl_sre -fsS --max-time 1 "$1" >/dev/null 2>&1
  else
    local hostport="${1#https://}"; hostport="${hostport%%/*}"
    port_open "${hostport##*:}"
  fi
}

# wait_until DESCRIPTION LOG COMMAND...: polls COMMAND; on timeout shows LOG.
wait_until() {
  local what="$1" log="$2"; shift 2
  local i
  for ((i = 0; i < wait_tenths; i++)); do
    if "$@"; then return 0; fi
    sleep 0.1
  done
  [[ -f "$log" ]] && { echo "--- last lines of $log" >&2; tail -n 20 "$log" >&2; }
  die "$what: no answer within $((wait_tenths / 10)) s"
}

cluster_base() { # eu → 6400, us → 6410, ap → 6420: the first of a Region's six nodes
  case "$1" in eu) echo 6400 ;; us) echo 6410 ;; ap) echo 6420 ;; esac
}

cluster_mode() { [[ -f "$mode_file" && "$(cat "$mode_file")" == cluster ]]; }

# The Redis Cluster of REGION: six nodes (full coverage off, so a failing
# primary takes down only its own slots, as docs/operating.md tells production;
# no persistence), joined once by redis-cli --cluster create.
start_redis_cluster() {
  local region="$1" base port i dir pid seeds=()
  base="$(cluster_base "$region")"
  command -v redis-server >/dev/null || die "redis-server not on PATH (apt-get install redis-server)"
  command -v redis-cli >/dev/null || die "redis-cli not on PATH (apt-get install redis-tools)"
  for ((i = 0; i < 6; i++)); do
    port=$((base + i))
    seeds+=("127.0.0.1:$port")
    pid="$(live_pid "$run/redis-$region-$i.pid" redis-server)"
    [[ -n "$pid" ]] && continue
    require_free "redis $region node $i" "127.0.0.1:$port"
    dir="$run/redis-$region-$i"
    mkdir -p "$dir"
    redis-server --port "$port" --bind 127.0.0.1 --dir "$dir" \
      --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 2000 \
      --cluster-require-full-coverage no --save '' --appendonly no \
      --daemonize yes --pidfile "$run/redis-$region-$i.pid" --logfile "$run/redis-$region-$i.log" >/dev/null
    wait_until "redis $region node $i on :$port" "$run/redis-$region-$i.log" port_open "$port"
  done
  if ! redis-cli -p "$base" cluster info 2>/dev/null | grep -q '^cluster_state:ok'; then
    redis-cli --cluster create "${seeds[@]}" --cluster-replicas 1 --cluster-yes >"$run/redis-$region-create.log" 2>&1 \
      || { tail -n 20 "$run/redis-$region-create.log" >&2; die "redis-cli --cluster create for $region failed"; }
  fi
  cluster_ok() {
    local p
    for ((p = base; p < base + 6; p++)); do
      redis-cli -p "$p" cluster info 2>/dev/null | grep -q '^cluster_state:ok' || return 1
    done
  }
  wait_until "the $region Redis Cluster (cluster_state:ok on 6 nodes)" "$run/redis-$region-create.log" cluster_ok
  say "redis cluster $region: 127.0.0.1:$base-$((base + 5)) (3 primaries + 3 replicas)"
}

start_redis() {
  local region="$1" port dir pid
  port="$(redis_port "$region")"
  dir="$run/redis-$region"
  pid="$(live_pid "$run/redis-$region.pid" redis-server)"
  if [[ -n "$pid" ]]; then say "redis $region already running (pid $pid, port $port)"; return; fi
  command -v redis-server >/dev/null || die "redis-server not on PATH (apt-get install redis-server)"
  require_free "redis $region" "127.0.0.1:$port"
  mkdir -p "$dir"
  redis-server --port "$port" --bind 127.0.0.1 --dir "$dir" \
    --daemonize yes --pidfile "$run/redis-$region.pid" --logfile "$run/redis-$region.log" >/dev/null
  wait_until "redis $region on :$port" "$run/redis-$region.log" port_open "$port"
  say "redis $region: 127.0.0.1:$port (pid $(live_pid "$run/redis-$region.pid" redis-server), data $dir)"
}

# start_leasehold NAME COMMAND...: in the background, immune to the
# terminal's hangup and Ctrl-C, stdout+stderr to NAME.log, pid to NAME.pid.
start_leasehold() {
  local name="$1"; shift
  nohup "$@" >"$run/$name.log" 2>&1 </dev/null &
  echo $! >"$run/$name.pid"
}

start_allocator() {
  local n="$1" bin="$2" pid
  pid="$(live_pid "$run/allocator-$n.pid" leasehold)"
  if [[ -n "$pid" ]]; then say "allocator $n already running (pid $pid)"; return; fi
  require_free "allocator $n" "$(config_value "$here/allocator-$n.toml" listen)"
  start_leasehold "allocator-$n" "$bin" allocator --config "$here/allocator-$n.toml"
  say "allocator $n: started (pid $(cat "$run/allocator-$n.pid"), log $run/allocator-$n.log)"
}

# agent-R.toml with redis_url set to this Region's redis-server (plaintext
# on loopback: insecure_redis_plaintext = true beside [tls]) and
# pepper_file / policy_file made absolute; every other line kept.
derive_agent_config() {
  local region="$1" out="$run/agent-$1.toml"
  awk -v redis="redis://127.0.0.1:$(redis_port "$region")/" -v dir="$here" '
    function absolute(line,    key, value, rest) {
      key = line; sub(/[[:space:]]*=.*/, "", key)
      if (!match(line, /"[^"]*"/)) return line
      value = substr(line, RSTART + 1, RLENGTH - 2)
      rest = substr(line, RSTART + RLENGTH)
      if (value !~ /^\//) value = dir "/" value
      gsub(/\\/, "\\\\", value); gsub(/"/, "\\\"", value)
      return key " = \"" value "\"" rest
    }
    /^[[:space:]]*#?[[:space:]]*redis_url[[:space:]]*=/ {
      if (!done) print "redis_url = \"" redis "\"   # set by run-local.sh"; print "insecure_redis_plaintext = true   # set by run-local.sh: its loopback redis-server is plaintext (logged)"
      done = 1; next
    }
    /^[[:space:]]*(pepper_file|policy_file|ca_file|cert_file|key_file|config_dir)[[:space:]]*=/ { print absolute($0); next }
    /^[[:space:]]*\[/ && !done { print "redis_url = \"" redis "\"   # set by run-local.sh"; print "insecure_redis_plaintext = true   # set by run-local.sh: its loopback redis-server is plaintext (logged)"; done = 1 }
    { print }
  ' "$here/agent-$region.toml" >"$out"
  echo "$out"
}

# agent-R.toml for `up --cluster`: redis_cluster instead of redis_url,
# [global] agent_id = R-a or R-b, and for R-b its ports moved (gRPC + 10,
# HTTP - 10).
derive_cluster_agent_config() {
  local region="$1" which="$2" base out="$run/agent-$1-$2.toml" seeds="" i single
  base="$(cluster_base "$region")"
  for ((i = 0; i < 6; i++)); do
    seeds+="${seeds:+, }\"redis://127.0.0.1:$((base + i))/\""
  done
  single="$(derive_agent_config "$region")"
  awk -v seeds="$seeds" -v id="$region-$which" -v shift_ports="$([[ $which == b ]] && echo 10 || echo 0)" '
    function moved(line, by,    head, port) {
      if (!match(line, /:[0-9]+"/)) return line
      head = substr(line, 1, RSTART)
      port = substr(line, RSTART + 1, RLENGTH - 2) + by
      return head port "\"" substr(line, RSTART + RLENGTH)
    }
    /^[[:space:]]*redis_url[[:space:]]*=/ { next }
    /^listen[[:space:]]*=/ { print moved($0, shift_ports); next }
    /^http_listen[[:space:]]*=/ { print moved($0, -shift_ports); next }
    /^\[/ && !cluster_done { print "redis_cluster = [" seeds "]   # set by run-local.sh --cluster"; cluster_done = 1 }
    { print }
    /^\[global\][[:space:]]*$/ { print "agent_id = \"" id "\"   # set by run-local.sh --cluster" }
  ' "$single" >"$out"
  rm -f "$single"
  echo "$out"
}

start_cluster_agent() {
  local region="$1" which="$2" bin="$3" name="agent-$1-$2" pid config
  pid="$(live_pid "$run/$name.pid" leasehold)"
  if [[ -n "$pid" ]]; then say "agent $region-$which already running (pid $pid)"; return; fi
  config="$(derive_cluster_agent_config "$region" "$which")"
  require_free "agent $region-$which" "$(config_value "$config" listen)"
  require_free "agent $region-$which" "$(config_value "$config" http_listen)"
  start_leasehold "$name" "$bin" agent --config "$config"
  say "agent $region-$which: started (pid $(cat "$run/$name.pid"), config $config)"
}

wait_cluster_agent() {
  local region="$1" which="$2" name="agent-$1-$2" url
  url="https://$(config_value "$run/$name.toml" http_listen)/health"
  cluster_agent_up() {
    [[ -n "$(live_pid "$run/$name.pid" leasehold)" ]] \
      || { tail -n 20 "$run/$name.log" >&2; die "agent $region-$which exited (log $run/$name.log)"; }
    healthy "$url"
  }
  wait_until "agent $region-$which $url" "$run/$name.log" cluster_agent_up
  say "agent $region-$which: $url answers"
}

start_agent() {
  local region="$1" bin="$2" pid config
  pid="$(live_pid "$run/agent-$region.pid" leasehold)"
  if [[ -n "$pid" ]]; then say "agent $region already running (pid $pid)"; return; fi
  require_free "agent $region" "$(config_value "$here/agent-$region.toml" listen)"
  require_free "agent $region" "$(config_value "$here/agent-$region.toml" http_listen)"
  config="$(derive_agent_config "$region")"
  start_leasehold "agent-$region" "$bin" agent --config "$config"
  say "agent $region: started (pid $(cat "$run/agent-$region.pid"), config $config)"
}

# Waits for the process to stay up and /health to answer.
wait_agent() {
  local region="$1" url
  url="$(health_url "$region")"
  agent_up() {
    [[ -n "$(live_pid "$run/agent-$region.pid" leasehold)" ]] \
      || { tail -n 20 "$run/agent-$region.log" >&2; die "agent $region exited (log $run/agent-$region.log)"; }
    healthy "$url"
  }
  wait_until "agent $region $url" "$run/agent-$region.log" agent_up
  say "agent $region: $url answers"
}

check_allocator() {
  local n="$1"
  [[ -n "$(live_pid "$run/allocator-$n.pid" leasehold)" ]] && return 0
  tail -n 20 "$run/allocator-$n.log" >&2
  die "allocator $n exited (log $run/allocator-$n.log)"
}

# Before starting anything: every port of a service that is not running
# must be free.
preflight() {
  local region n
  for region in "${regions[@]}"; do
    [[ -n "$(live_pid "$run/redis-$region.pid" redis-server)" ]] \
      || require_free "redis $region" "127.0.0.1:$(redis_port "$region")"
    [[ -n "$(live_pid "$run/agent-$region.pid" leasehold)" ]] || {
      require_free "agent $region" "$(config_value "$here/agent-$region.toml" listen)"
      require_free "agent $region" "$(config_value "$here/agent-$region.toml" http_listen)"
    }
  done
  for n in "${nodes[@]}"; do
    [[ -n "$(live_pid "$run/allocator-$n.pid" leasehold)" ]] \
      || require_free "allocator $n" "$(config_value "$here/allocator-$n.toml" listen)"
  done
}

up() {
  local bin region n cluster=0
  [[ "${1:-}" == --cluster ]] && cluster=1
  bin="$(binary)"
  mkdir -p "$run"
  if ((cluster)) && ! cluster_mode && compgen -G "$run/*.pid" >/dev/null; then
    die "the single-Redis layout is running: \`$0 down\` first"
  fi
  if ((!cluster)) && cluster_mode && compgen -G "$run/*.pid" >/dev/null; then
    die "the --cluster layout is running: \`$0 down\` first (or \`$0 up --cluster\`)"
  fi
  if ((cluster)); then
    echo cluster >"$mode_file"
    up_cluster "$bin"
    return
  fi
  rm -f "$mode_file"
  preflight
  if [[ ! -f "$certs/ca.pem" ]]; then
    "$bin" certs init --dir "$certs" --regions eu,us,ap --nodes 3 >/dev/null
    say "certificates: $certs (leasehold certs init)"
  fi
  for region in "${regions[@]}"; do start_redis "$region"; done
  for n in "${nodes[@]}"; do start_allocator "$n" "$bin"; done
  for region in "${regions[@]}"; do start_agent "$region" "$bin"; done
  for region in "${regions[@]}"; do wait_agent "$region"; done
  for n in "${nodes[@]}"; do check_allocator "$n"; done
  cat <<EOF
run-local: up. Try:
  $bin pool show api-rate --tls-dir $certs   # shares appear within a few rebalance intervals (5 s each)
  $bin region list --tls-dir $certs          # or: export LEASEHOLD_TLS_DIR=$certs
  $bin lease list --tls-dir $certs           # blocks leased per rule and Region (the agents' Status)
  curl -s --cacert $certs/ca.pem --cert $certs/sre.pem --key $certs/sre.key $(health_url eu)
  $0 down
EOF
}

up_cluster() {
  local bin="$1" region n which
  if [[ ! -f "$certs/ca.pem" ]]; then
    "$bin" certs init --dir "$certs" --regions eu,us,ap --nodes 3 >/dev/null
    say "certificates: $certs (leasehold certs init)"
  fi
  for region in "${regions[@]}"; do start_redis_cluster "$region"; done
  for n in "${nodes[@]}"; do start_allocator "$n" "$bin"; done
  for region in "${regions[@]}"; do
    for which in a b; do start_cluster_agent "$region" "$which" "$bin"; done
  done
  for region in "${regions[@]}"; do
    for which in a b; do wait_cluster_agent "$region" "$which"; done
  done
  for n in "${nodes[@]}"; do check_allocator "$n"; done
  cat <<EOF
run-local: up (--cluster: each Region on its own Redis Cluster, two agents each). Try:
  $bin pool show api-rate --tls-dir $certs
  curl -s --cacert $certs/ca.pem --cert $certs/sre.pem --key $certs/sre.key https://$(config_value "$run/agent-eu-a.toml" http_listen)/health   # "syncer": true or false
  curl -s --cacert $certs/ca.pem --cert $certs/sre.pem --key $certs/sre.key https://$(config_value "$run/agent-eu-b.toml" http_listen)/health
  $0 down
EOF
}

# stop NAME PATTERN: SIGTERM, wait (bounded), then SIGKILL; removes the pid file.
stop() {
  local name="$1" expect="$2" pid i
  pid="$(live_pid "$run/$name.pid" "$expect")"
  if [[ -z "$pid" ]]; then rm -f "$run/$name.pid"; return; fi
  stopped=$((stopped + 1))
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < wait_tenths; i++)); do
    [[ -n "$(live_pid "$run/$name.pid" "$expect")" ]] || break
    sleep 0.1
  done
  if [[ -n "$(live_pid "$run/$name.pid" "$expect")" ]]; then
    say "$name (pid $pid) ignored SIGTERM for $((wait_tenths / 10)) s: SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$run/$name.pid"
  say "$name stopped (pid $pid)"
}

down() {
  local region n
  stopped=0
  if [[ -d "$run" ]]; then
    for region in "${regions[@]}"; do
      stop "agent-$region" leasehold
      stop "agent-$region-a" leasehold
      stop "agent-$region-b" leasehold
    done
    for n in "${nodes[@]}"; do stop "allocator-$n" leasehold; done
    for region in "${regions[@]}"; do
      stop "redis-$region" redis-server
      for i in 0 1 2 3 4 5; do stop "redis-$region-$i" redis-server; done
      # A cluster's node ids live in its data dirs: the next `up --cluster`
      # forms a fresh cluster.
      rm -rf "$run"/redis-"$region"-[0-5]
    done
  fi
  rm -f "$mode_file"
  if ((stopped == 0)); then say "nothing was running"; fi
}

status() {
  local name expect pid region
  local names=(redis-eu redis-us redis-ap allocator-1 allocator-2 allocator-3 agent-eu agent-us agent-ap)
  if cluster_mode; then
    names=()
    for region in "${regions[@]}"; do for i in 0 1 2 3 4 5; do names+=("redis-$region-$i"); done; done
    names+=(allocator-1 allocator-2 allocator-3)
    for region in "${regions[@]}"; do names+=("agent-$region-a" "agent-$region-b"); done
  fi
  for name in "${names[@]}"; do
    case "$name" in redis-*) expect=redis-server ;; *) expect=leasehold ;; esac
    pid="$(live_pid "$run/$name.pid" "$expect")"
    if [[ -n "$pid" ]]; then
      printf '%-12s running (pid %s)\n' "$name" "$pid"
    else
      printf '%-12s stopped\n' "$name"
    fi
  done
  if cluster_mode; then
    local url
    for name in "${names[@]}"; do
      [[ "$name" == agent-* && -f "$run/$name.toml" ]] || continue
      url="https://$(config_value "$run/$name.toml" http_listen)/health"
      if healthy "$url"; then
        printf '%-14s %s\n' "health ${name#agent-}" "$(curl_sre -fsS --max-time 1 "$url" 2>/dev/null || echo answers)"
      fi
    done
    return
  fi
  for region in "${regions[@]}"; do
    if healthy "$(health_url "$region")"; then
      printf '%-12s %s\n' "health $region" "$(curl_sre -fsS --max-time 1 "$(health_url "$region")" 2>/dev/null || echo answers)"
    fi
  done
}

clean() {
  down
  rm -rf "$run" "$root/target/leasehold-data/allocator-1" \
    "$root/target/leasehold-data/allocator-2" "$root/target/leasehold-data/allocator-3"
  rmdir "$root/target/leasehold-data" 2>/dev/null || true
  say "removed $run and target/leasehold-data/allocator-{1,2,3}"
}

case "${1:-}" in
  up) up "${2:-}" ;;
  down) down ;;
  status) status ;;
  clean) clean ;;
  *) echo "usage: $0 up [--cluster]|down|status|clean" >&2; exit 2 ;;
esac
