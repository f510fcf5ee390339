#!/usr/bin/env bash
# Prices the bucket-encoding prototypes in this directory in decisions per
# Redis CPU-second (INFO CPU before/after), on a private redis-server, with
# K decisions per EVALSHA spread over 10,000 random buckets each.
# Usage: docs/performance/experiments/run.sh [K...]   (default: 1 16 64)
set -euo pipefail
cd "$(dirname "$0")"
port=$(( 20000 + RANDOM % 20000 ))
dir=$(mktemp -d)
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" --daemonize yes --logfile "$dir/log"
trap 'redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.1; done
cpu() { redis-cli -p "$port" info cpu | awk -F: '/^used_cpu_(sys|user):/{s+=$2} END{printf "%.4f", s}'; }
# 10^6 tokens, 1 token per 1,000 s, cost 1 token (millitokens): never dry,
# keys live for the run.
bucket=(1000000000 1000 1000000 1000 0)
for k in "${@:-1 16 64}"; do
  for proto in hash_k string_k string_mget_k; do
    sha=$(redis-cli -p "$port" -x SCRIPT LOAD < "$proto.lua")
    keys=(); args=()
    if [ "$proto" = string_mget_k ]; then args=(1 1000000000 1000 1000000 0); fi
    for i in $(seq 1 "$k"); do
      keys+=("$proto:{b}:$i:__rand_int__")
      if [ "$proto" = string_mget_k ]; then args+=(1 1000); else args+=("${bucket[@]}"); fi
    done
    n=$(( 640000 / k )); [ "$n" -gt 200000 ] && n=200000
    c0=$(cpu)
    redis-benchmark -p "$port" -c 32 -n "$n" -r 10000 -P 4 --csv EVALSHA "$sha" "$k" "${keys[@]}" "${args[@]}" >/dev/null
    c1=$(cpu)
    echo "$proto K=$k: $(echo "$n * $k / ($c1 - $c0)" | bc) decisions per Redis CPU-s"
  done
done
