//! The gateway-side library.
//!
//! Owns (as later work lands): spending leased blocks in memory, the negative
//! cache, fail modes when the agent is unreachable, and the HTTP mapping
//! (429/503, Retry-After, RateLimit headers). Does not own any bucket state:
//! the Region agent does.
//!
//! Nothing is implemented here yet; see the open agent/client issue.
