//! Integration tests against real servers (one binary: one link).

mod api;
mod common;
