//! What the server does around the module: MODULE LOAD/UNLOAD, keyspace notifications, OOM,
//! writes it refuses, WATCH/MULTI/EVAL, INFO, configs and ACL.

mod lifecycle;
mod monitoring;
mod notifications;
mod oom;
mod operations;
mod transactions;
mod write_failures;
