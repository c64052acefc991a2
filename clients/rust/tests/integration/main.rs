//! Integration tests against real servers (one binary: one link).

mod api;
mod arg_vectors;
mod cluster;
mod common;
mod conformance;
mod fail_open;
mod failure_rule;
mod inflight;
mod keys;
mod leases;
mod metrics;
mod middleware;
mod migration;
mod outage;
mod package;
mod top;
mod wait_take;
mod web;
