//! Each command against one real server: replies, errors, stored state and expiry.

mod arg_vectors;
mod charge;
mod command_info;
mod concurrency;
mod errors;
mod exact_bound;
mod hostile;
mod jobs;
mod locks;
mod options;
mod peek;
mod random_args;
mod refund;
mod reservations;
mod take;
mod takeall;
mod throttle;
mod top;
mod unblock;
