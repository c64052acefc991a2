//! Leases: TB.ACQUIRE, TB.RELEASE and TB.RENEW (the Lua twin's are in `twin::leases`).

mod commands;
