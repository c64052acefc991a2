//! The Lua twin (`lua/tb.lua`): on its own, and against the module on the same calls.

mod behaviour;
mod differential;
mod leases;
mod vectors;
