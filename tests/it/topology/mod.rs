//! More than one server, or one server over time: replicas, the AOF and RDB, failover, cluster.

mod cluster;
mod failover;
mod persistence;
mod replication;
