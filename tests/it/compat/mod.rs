//! redis-cell: `CL.THROTTLE` as a second name of TB.THROTTLE, and redis-cell 0.2.2 itself beside.

mod cell_compat;
mod cell_differential;
