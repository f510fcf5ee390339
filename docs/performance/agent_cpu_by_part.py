import collections,sys
# Each sample of the bench process (redis-server's excluded) goes to the
# leaf-most frame that names a category: where the CPU is spent, not who
# called it. From inferno-collapse-perf output.
cats=[('allocator (malloc/free)',['malloc','_int_free','cfree','realloc','mi_','_mi_','unlink_chunk']),
('tracing spans',['tracing']),
('metrics',['prometheus','metrics::']),
('HMAC/SHA-256 of principals',['sha2','hmac']),
('protobuf encode/decode (prost)',['prost::']),
('HTTP/2 (h2, hyper)',['h2::','hyper::']),
('tonic',['tonic::']),
('store client (redis-rs, RedisStore, coalescer)',['redis::','combine::','leasehold_region_agent::redis_store','leasehold_region_agent::coalesce']),
('agent decision logic',['leasehold_region_agent::']),
('gateway library (Limiter, CheckBatcher)',['leasehold_client']),
('bench callers',['leasehold::bench']),
('tokio runtime',['tokio::']),
('kernel: network and syscalls',['tcp_','sock_','__sys_','ip_','skb','net_rx','__x64_sys','entry_SYSCALL','do_syscall','epoll','__netif','loopback']),
('kernel: scheduling and wakeups',['futex','schedule','finish_task_switch','try_to_wake_up','_raw_spin','__wake_up','pick_next']),
('libc (memcpy, other)',['__mem','libc','__GI']),
]
res={}
for path in sys.argv[1:]:
    tot=0; c=collections.Counter()
    for line in open(path):
        stack,n=line.rsplit(' ',1); n=int(n)
        frames=stack.split(';')
        if frames[0].startswith('redis-server'): continue
        tot+=n
        got='other'
        for f in reversed(frames):
            hit=next((name for name,keys in cats if any(k in f for k in keys)),None)
            if hit: got=hit; break
        c[got]+=n
    res[path]=(tot,c)
names=[n for n,_ in cats]+['other']
print("| where the bench process's CPU goes | "+" | ".join(sys.argv[1:])+" |")
print("|---|"+"---:|"*len(sys.argv[1:]))
for n in names:
    print(f"| {n} | "+" | ".join(f"{100*res[p][1][n]/max(res[p][0],1):.1f}%" for p in sys.argv[1:])+" |")
