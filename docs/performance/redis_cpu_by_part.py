import collections,sys
cats=[('Lua VM (interpreting the script)',['luaV_','luaD_','luaH_','luaC_','luaS_','luaF_','lua_','luaL_','luaO_','luaK','luaG','luaZ','str_','math_','luaB','tonumber','string_']),
('redis.call from Lua (argv, ACL, lookup)',['luaRedisGenericCommand','scriptCall','luaRedisCallCommand','luaRedisPCallCommand','luaArgsToRedisArgv','ACLCheck','lookupCommand','redisProtocolToLuaType','luaReplyToRedisReply']),
('commands run (HMGET/HSET/PEXPIRE/TIME, dict)',['hmgetCommand','hsetCommand','pexpireCommand','timeCommand','dictFind','dbAdd','setKey','lookupKey','hashType','expireGeneric','getCommand','setCommand','mgetCommand']),
('EVALSHA entry (script lookup, KEYS/ARGV tables)',['evalGenericCommand','evalShaCommand','luaCallFunction','luaCreateArray','scriptPrepareForRun','scriptResetRun']),
('propagation, replies',['propagate','alsoPropagate','addReply','_addReply','afterCommand']),
('network and event loop',['readQueryFromClient','processInputBuffer','writeToClient','aeProcessEvents','connSocket','handleClientsWithPendingWrites','processMultibulkBuffer']),
('allocator (jemalloc)',['je_','jemalloc','zmalloc','zfree']),
('kernel',['tcp_','sock_','__sys_','entry_SYSCALL','do_syscall','epoll','futex','schedule']),
]
for path in sys.argv[1:]:
    tot=0; c=collections.Counter()
    for line in open(path):
        stack,n=line.rsplit(' ',1); n=int(n); tot+=n
        frames=stack.split(';'); got='other'
        for f in reversed(frames):
            hit=next((name for name,keys in cats if any(k in f for k in keys)),None)
            if hit: got=hit; break
        c[got]+=n
    print(path, tot)
    for name,_ in cats+[('other',0)]: print(f"  {100*c[name]/max(tot,1):5.1f}% {name}")
