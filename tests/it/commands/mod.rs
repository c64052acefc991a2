//! Each command against one real server: replies, errors, stored state and expiry.

mod arg_vectors;
mod command_info;
mod concurrency;
mod errors;
mod exact_bound;
mod hostile;
mod jobs;
mod peek;
mod random_args;
mod refund;
mod take;
mod takeall;
