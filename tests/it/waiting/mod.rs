//! TB.BTAKE: the waiting queue, the server's events around it, and a soak under faults.

mod btake;
mod btake_events;
mod btake_soak;
