//! The Lua twin (`lua/tb.lua`): against the module on the same calls (buckets in
//! differential.rs, leases in leases.rs), and its script form (behaviour.rs). What its
//! commands do, beside the module's, is in commands/ (`<case>::on_twin`).

mod behaviour;
mod differential;
mod leases;
mod vectors;
