return redis.error_reply('ERR leasehold: script not yet written')
