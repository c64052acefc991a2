//! Integration tests against real servers (one binary: one link).

mod api;
mod cluster;
mod common;
mod migration;
mod wait_take;
mod web;
mod middleware;
mod fail_open;
