//! Registration of the commands, with the metadata that COMMAND INFO,
//! COMMAND DOCS, redis-cli hints, ACL and cluster routing read.
//!
//! The crate's `#[command]` macro and its 7.x feature make the module fail to
//! load on Redis 7.0 (they require an API added in 7.2), so commands are
//! created with the classic `RM_CreateCommand` and described afterwards with
//! `RM_SetCommandInfo` (7.0+), and ACL categories are added only where the
//! server has `RM_SetCommandACLCategories` (7.2+, Valkey).

use std::ffi::{CStr, CString};
use std::mem::size_of;
use std::os::raw::c_int;
use std::ptr;

use redis_module::commands::{
    get_redis_key_spec, BeginSearch, CommandArgFlags, FindKeys, KeySpec, KeySpecFlags,
};
use redis_module::raw::{self, RedisModuleCmdFunc, RedisModuleCtx};
use redis_module::raw::{
    RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_DOUBLE as DOUBLE,
    RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_INTEGER as INTEGER,
};

/// One command as registered.
pub struct CommandSpec {
    pub name: &'static CStr,
    pub handler: RedisModuleCmdFunc,
    pub flags: &'static CStr,
    /// Categories for servers that support them (7.2+, Valkey).
    pub acl_categories: &'static CStr,
    pub summary: &'static CStr,
    pub complexity: &'static CStr,
    /// Positive: exact argument count; negative: at least that many.
    pub arity: c_int,
    pub key_flags: KeySpecFlags,
    pub shape: Shape,
}

/// How the arguments are laid out.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// `key capacity rate n`, with `n` optional or not.
    Single { n_optional: bool },
    /// `key capacity rate n [MAXWAIT ms] [BLOCK ms [MAXBLOCK ms]]` (TB.TAKE).
    Take,
    /// `key capacity rate n [MAXDEBT d]` (TB.CHARGE).
    Charge,
    /// `key capacity rate n [key capacity rate n ...]` and TB.TAKE's
    /// options (TB.TAKEALL).
    Repeated,
    /// `key` (TB.UNBLOCK).
    KeyOnly,
    /// `key max_burst count period [quantity]` (TB.THROTTLE).
    Throttle,
    /// `key capacity rate n timeout_ms` (TB.BTAKE).
    Blocking,
    /// `key limit lease_ms [timeout_ms]` (TB.ACQUIRE).
    Acquire,
    /// `key lease` (TB.RELEASE).
    Release,
    /// `key lease lease_ms` (TB.RENEW).
    Renew,
    /// `[COUNT k] | RESET`, no key (TB.TOP).
    NoKey,
}

/// Creates the command and sets its info. Errors are log-ready text.
///
/// # Safety
/// Must be called from `RedisModule_OnLoad` with its context.
pub unsafe fn register(
    ctx: *mut RedisModuleCtx,
    spec: &CommandSpec,
    module_category: bool,
) -> Result<(), String> {
    let name = spec.name.to_string_lossy();
    let create = raw::RedisModule_CreateCommand.ok_or("RedisModule_CreateCommand is missing")?;
    // The legacy key range: argv[1] (1,1,1), or every fourth argument from
    // argv[1] on (1,-1,4). Cluster routing and COMMAND GETKEYS rely on it
    // where the key spec below cannot be set (before 7.0); after it, the
    // server derives the same range from the key spec.
    let (first_key, last_key, key_step) = match spec.shape {
        Shape::Repeated => (1, -1, 4),
        Shape::NoKey => (0, 0, 0),
        _ => (1, 1, 1),
    };
    let created = create(
        ctx,
        spec.name.as_ptr(),
        spec.handler,
        spec.flags.as_ptr(),
        first_key,
        last_key,
        key_step,
    );
    if created != raw::REDISMODULE_OK as c_int {
        return Err(format!("could not create command {name}"));
    }
    let Some(get_command) = raw::RedisModule_GetCommand else {
        return Ok(()); // before 7.0: no command info; the handler checks arity itself
    };
    let command = get_command(ctx, spec.name.as_ptr());
    if command.is_null() {
        return Err(format!("could not look up command {name}"));
    }
    if let Some(set_acl) = raw::RedisModule_SetCommandACLCategories {
        let categories = spec.acl_categories.to_string_lossy();
        // `@tb` grants what a limiter's clients need; TB.TOP shows key
        // names, which they may not be allowed to see, so it stays out.
        let categories = if module_category && spec.shape != Shape::NoKey {
            format!("{categories} tb")
        } else {
            categories.into_owned()
        };
        let categories = CString::new(categories).map_err(|e| e.to_string())?;
        if set_acl(command, categories.as_ptr()) != raw::REDISMODULE_OK as c_int {
            return Err(format!("could not set ACL categories of {name}"));
        }
    }
    let Some(set_info) = raw::RedisModule_SetCommandInfo else {
        return Ok(());
    };

    // TB.TAKEALL's options follow its groups, where the range would read
    // `MAXWAIT` as a key: its spec is marked incomplete, so the server asks
    // the command itself (`getkeys-api`, `take_all_keys`) for the keys.
    let key_flags = KeySpecFlags::from_bits_truncate(spec.key_flags.bits());
    let key_flags = match spec.shape {
        Shape::Repeated => key_flags.union(KeySpecFlags::INCOMPLETE),
        _ => key_flags,
    };
    let key_specs = get_redis_key_spec(vec![KeySpec::new(
        None,
        KeySpecFlags::from_bits_truncate(key_flags.bits()),
        BeginSearch::new_index(1),
        match spec.shape {
            Shape::Repeated => FindKeys::new_range(-1, 4, 0),
            _ => FindKeys::new_range(0, 1, 0),
        },
    )]);
    // The argument tree points at static strings only: nothing is allocated
    // for it, so nothing is left to free once the server has copied it.
    let n_flags = match spec.shape {
        Shape::Single { n_optional: true } => CommandArgFlags::OPTIONAL,
        _ => CommandArgFlags::NONE,
    };
    let mut bucket = [
        command_arg(
            c"key",
            raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY,
            c"the bucket's hash",
            CommandArgFlags::NONE,
        ),
        command_arg(
            c"capacity",
            DOUBLE,
            c"tokens when full (burst), > 0",
            CommandArgFlags::NONE,
        ),
        command_arg(
            c"rate",
            DOUBLE,
            c"tokens added per second, > 0",
            CommandArgFlags::NONE,
        ),
        command_arg(c"n", DOUBLE, c"tokens, >= 0", n_flags),
        END_OF_ARGS,
        END_OF_ARGS,
        END_OF_ARGS,
        END_OF_ARGS,
    ];
    let mut block_args = [
        token_arg(
            c"block_ms",
            c"BLOCK",
            c"a denial locks the key for this long, in ms, 1 to 2^53",
            CommandArgFlags::NONE,
        ),
        token_arg(
            c"max_block_ms",
            c"MAXBLOCK",
            c"locks within a probation double, up to this long, in ms",
            CommandArgFlags::OPTIONAL,
        ),
        END_OF_ARGS,
    ];
    let take_options = [
        token_arg(
            c"max_wait_ms",
            c"MAXWAIT",
            c"reserve into debt when the tokens come within this long, in ms, 0 to 2^53",
            CommandArgFlags::OPTIONAL,
        ),
        raw::RedisModuleCommandArg {
            subargs: block_args.as_mut_ptr(),
            ..command_arg(
                c"lockout",
                raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_BLOCK,
                c"lock the key after a denial",
                CommandArgFlags::OPTIONAL,
            )
        },
    ];
    match spec.shape {
        Shape::Take => {
            for (slot, option) in bucket.iter_mut().skip(4).zip(take_options) {
                *slot = option;
            }
        }
        Shape::Charge => {
            if let Some(slot) = bucket.get_mut(4) {
                *slot = token_arg(
                    c"max_debt",
                    c"MAXDEBT",
                    c"the debt the bucket may reach, 0 to 2^53; default: capacity",
                    CommandArgFlags::OPTIONAL,
                );
            }
        }
        _ => {}
    }
    if spec.shape == Shape::Blocking {
        if let Some(slot) = bucket.get_mut(4) {
            *slot = command_arg(
                c"timeout_ms",
                DOUBLE,
                c"how long to wait at most, in ms; 0 waits without limit",
                CommandArgFlags::NONE,
            );
        }
    }
    if let Some(key) = bucket.first_mut() {
        key.key_spec_index = 0;
    }
    let mut repeated = [
        raw::RedisModuleCommandArg {
            subargs: bucket.as_mut_ptr(),
            ..command_arg(
                c"bucket",
                raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_BLOCK,
                c"one limit: key capacity rate n",
                CommandArgFlags::MULTIPLE,
            )
        },
        END_OF_ARGS,
        END_OF_ARGS,
        END_OF_ARGS,
    ];
    for (slot, option) in repeated.iter_mut().skip(1).zip(take_options) {
        *slot = option;
    }
    let mut leases = lease_args(spec.shape);
    let mut others = other_args(spec.shape);
    let mut top_choices = [
        token_arg(
            c"count",
            c"COUNT",
            c"at most this many rows, 1 to 2^53; default 10",
            CommandArgFlags::NONE,
        ),
        raw::RedisModuleCommandArg {
            token: c"RESET".as_ptr(),
            ..command_arg(
                c"reset",
                raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_PURE_TOKEN,
                c"forget every denial counted",
                CommandArgFlags::NONE,
            )
        },
        END_OF_ARGS,
    ];
    let mut top = [
        raw::RedisModuleCommandArg {
            subargs: top_choices.as_mut_ptr(),
            ..command_arg(
                c"what",
                raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_ONEOF,
                c"the rows to list, or RESET",
                CommandArgFlags::OPTIONAL,
            )
        },
        END_OF_ARGS,
    ];
    let args = match spec.shape {
        Shape::Single { .. } | Shape::Blocking | Shape::Take | Shape::Charge => bucket.as_mut_ptr(),
        Shape::Repeated => repeated.as_mut_ptr(),
        Shape::Acquire | Shape::Release | Shape::Renew => leases.as_mut_ptr(),
        Shape::KeyOnly | Shape::Throttle => others.as_mut_ptr(),
        Shape::NoKey => top.as_mut_ptr(),
    };

    // Version 1 of the struct plus our own sizes lets a 7.0 server read the
    // newer header's structs: it steps through arrays by these sizes.
    let version = raw::RedisModuleCommandInfoVersion {
        version: 1,
        sizeof_historyentry: size_of::<raw::RedisModuleCommandHistoryEntry>(),
        sizeof_keyspec: size_of::<raw::RedisModuleCommandKeySpec>(),
        sizeof_arg: size_of::<raw::RedisModuleCommandArg>(),
    };
    let since = CString::new(env!("CARGO_PKG_VERSION")).map_err(|e| e.to_string())?;
    let info = raw::RedisModuleCommandInfo {
        version: &version,
        summary: spec.summary.as_ptr(),
        complexity: spec.complexity.as_ptr(),
        since: since.as_ptr(),
        history: ptr::null_mut(),
        // The reply depends on the clock, not only on the arguments.
        tips: c"nondeterministic_output".as_ptr(),
        arity: spec.arity,
        key_specs: match spec.shape {
            Shape::NoKey => ptr::null_mut(),
            _ => key_specs.as_ptr() as *mut _,
        },
        args,
    };
    // The server copies everything it keeps, so the arrays may go.
    if set_info(command, &info) != raw::REDISMODULE_OK as c_int {
        return Err(format!("could not set command info of {name}"));
    }
    Ok(())
}

/// The arguments of the lease commands (empty for the others).
fn lease_args(shape: Shape) -> [raw::RedisModuleCommandArg; 5] {
    let key = key_arg(c"the lease set's sorted set");
    let lease = command_arg(
        c"lease",
        raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_STRING,
        c"the id TB.ACQUIRE handed out",
        CommandArgFlags::NONE,
    );
    let lease_ms = command_arg(
        c"lease_ms",
        INTEGER,
        c"how long the lease lasts, in ms, 1 to 2^53",
        CommandArgFlags::NONE,
    );
    match shape {
        Shape::Acquire => [
            key,
            command_arg(
                c"limit",
                INTEGER,
                c"leases live at once at most, 1 to 2^53",
                CommandArgFlags::NONE,
            ),
            lease_ms,
            command_arg(
                c"timeout_ms",
                DOUBLE,
                c"wait up to this long, in ms, first come first served; 0 waits without limit",
                CommandArgFlags::OPTIONAL,
            ),
            END_OF_ARGS,
        ],
        Shape::Release => [key, lease, END_OF_ARGS, END_OF_ARGS, END_OF_ARGS],
        Shape::Renew => [key, lease, lease_ms, END_OF_ARGS, END_OF_ARGS],
        _ => [END_OF_ARGS; 5],
    }
}

/// The arguments of TB.UNBLOCK and TB.THROTTLE (empty for the others).
fn other_args(shape: Shape) -> [raw::RedisModuleCommandArg; 6] {
    let key = key_arg(c"the bucket's hash (or a redis-cell key, read and converted)");
    match shape {
        Shape::KeyOnly => [
            key,
            END_OF_ARGS,
            END_OF_ARGS,
            END_OF_ARGS,
            END_OF_ARGS,
            END_OF_ARGS,
        ],
        Shape::Throttle => [
            key,
            command_arg(
                c"max_burst",
                INTEGER,
                c"the burst beyond one, 0 to 2^53 - 1: capacity is max_burst + 1",
                CommandArgFlags::NONE,
            ),
            command_arg(
                c"count",
                INTEGER,
                c"tokens per period, 1 to 2^53",
                CommandArgFlags::NONE,
            ),
            command_arg(
                c"period",
                INTEGER,
                c"the period in seconds, 1 to 2^53",
                CommandArgFlags::NONE,
            ),
            command_arg(
                c"quantity",
                INTEGER,
                c"tokens to take, 0 to 2^53; default 1",
                CommandArgFlags::OPTIONAL,
            ),
            END_OF_ARGS,
        ],
        _ => [END_OF_ARGS; 6],
    }
}

/// An optional keyword argument: `TOKEN value`.
fn token_arg(
    name: &'static CStr,
    token: &'static CStr,
    summary: &'static CStr,
    flags: CommandArgFlags,
) -> raw::RedisModuleCommandArg {
    raw::RedisModuleCommandArg {
        token: token.as_ptr(),
        ..command_arg(name, INTEGER, summary, flags)
    }
}

/// The key argument, the first key spec's.
fn key_arg(summary: &'static CStr) -> raw::RedisModuleCommandArg {
    raw::RedisModuleCommandArg {
        key_spec_index: 0,
        ..command_arg(
            c"key",
            raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY,
            summary,
            CommandArgFlags::NONE,
        )
    }
}

/// The all-zero entry that ends an argument array.
const END_OF_ARGS: raw::RedisModuleCommandArg = raw::RedisModuleCommandArg {
    name: ptr::null(),
    type_: 0,
    key_spec_index: -1,
    token: ptr::null(),
    summary: ptr::null(),
    since: ptr::null(),
    flags: 0,
    deprecated_since: ptr::null(),
    subargs: ptr::null_mut(),
    display_text: ptr::null(),
};

/// One argument without a token, key spec or sub-arguments.
fn command_arg(
    name: &'static CStr,
    type_: raw::RedisModuleCommandArgType,
    summary: &'static CStr,
    flags: CommandArgFlags,
) -> raw::RedisModuleCommandArg {
    raw::RedisModuleCommandArg {
        name: name.as_ptr(),
        type_,
        summary: summary.as_ptr(),
        flags: flags.bits() as c_int,
        ..END_OF_ARGS
    }
}

/// Every command the module registers, with its COMMAND DOCS and key specs.
pub const COMMANDS: [CommandSpec; 12] = [
    CommandSpec {
        name: c"tb.take",
        handler: Some(crate::bucket::commands::tb_take),
        flags: c"write deny-oom fast",
        acl_categories: c"write fast",
        summary: c"Takes n tokens from a token bucket if it holds that many (MAXWAIT: reserve into debt; BLOCK: a denial locks the key). Replies [allowed, remaining, retry_after_ms, reset_after_ms].",
        complexity: c"O(1)",
        arity: -5,
        key_flags: READ_WRITE_UPDATE,
        shape: Shape::Take,
    },
    CommandSpec {
        name: c"tb.peek",
        handler: Some(crate::bucket::commands::tb_peek),
        flags: c"readonly fast",
        acl_categories: c"read fast",
        summary: c"Replies what TB.TAKE would for n tokens (default 1), without taking or writing anything.",
        complexity: c"O(1)",
        arity: -4,
        key_flags: KeySpecFlags::READ_ONLY.union(KeySpecFlags::ACCESS),
        shape: Shape::Single { n_optional: true },
    },
    CommandSpec {
        name: c"tb.refund",
        handler: Some(crate::bucket::commands::tb_refund),
        flags: c"write deny-oom fast",
        acl_categories: c"write fast",
        summary: c"Gives n tokens back to a bucket, capped at capacity. Replies like TB.TAKE.",
        complexity: c"O(1)",
        arity: 5,
        key_flags: READ_WRITE_UPDATE,
        shape: Shape::Single { n_optional: false },
    },
    CommandSpec {
        name: c"tb.btake",
        handler: Some(crate::bucket::btake::tb_btake),
        flags: c"write deny-oom blocking",
        acl_categories: c"write slow blocking",
        summary: c"Like TB.TAKE, but waits up to timeout_ms (0: no limit) for the tokens, first come first served. Replies like TB.TAKE.",
        complexity: c"O(1)",
        arity: 6,
        key_flags: READ_WRITE_UPDATE,
        shape: Shape::Blocking,
    },
    CommandSpec {
        name: c"tb.takeall",
        handler: Some(crate::bucket::commands::tb_takeall),
        // Not `fast`: its cost grows with the number of buckets, like MSET.
        flags: c"write deny-oom getkeys-api",
        acl_categories: c"write slow",
        summary: c"Takes from every bucket if all hold enough, else from none. Replies [allowed, remaining, retry_after_ms, reset_after_ms, index] for the deciding bucket.",
        complexity: c"O(N) where N is the number of buckets",
        arity: -5,
        key_flags: READ_WRITE_UPDATE,
        shape: Shape::Repeated,
    },
    CommandSpec {
        name: c"tb.charge",
        handler: Some(crate::bucket::commands::tb_charge),
        flags: c"write deny-oom fast",
        acl_categories: c"write fast",
        summary: c"Takes n tokens whatever the bucket holds, into debt down to MAXDEBT (default: capacity): a cost learned after the work. Replies [1, remaining, retry_after_ms, reset_after_ms].",
        complexity: c"O(1)",
        arity: -5,
        key_flags: READ_WRITE_UPDATE,
        shape: Shape::Charge,
    },
    CommandSpec {
        name: c"tb.unblock",
        handler: Some(crate::bucket::commands::tb_unblock),
        // No deny-oom: lifting a lock must work when memory is short.
        flags: c"write fast",
        acl_categories: c"write fast",
        summary: c"Ends a bucket's lock and forgets its strikes. Replies 1 if there was a lock or a strike, else 0.",
        complexity: c"O(1)",
        arity: 2,
        key_flags: KeySpecFlags::READ_WRITE.union(KeySpecFlags::DELETE),
        shape: Shape::KeyOnly,
    },
    THROTTLE,
    CommandSpec {
        name: c"tb.acquire",
        handler: Some(crate::lease::commands::tb_acquire),
        // `blocking` as XREAD has it: it may wait, when given timeout_ms.
        flags: c"write deny-oom blocking",
        acl_categories: c"write slow blocking",
        summary: c"Takes a lease if fewer than limit are live, ending after lease_ms unless released or renewed; with timeout_ms, waits first come first served. Replies [acquired, available, retry_after_ms, lease].",
        complexity: c"O(log N) where N is the number of leases, plus O(log N) for each ended lease removed (at most 64)",
        arity: -4,
        key_flags: READ_WRITE_UPDATE,
        shape: Shape::Acquire,
    },
    CommandSpec {
        name: c"tb.release",
        handler: Some(crate::lease::commands::tb_release),
        // No deny-oom: giving a lease back must work when memory is short.
        flags: c"write fast",
        acl_categories: c"write fast",
        summary: c"Releases a live lease. Replies 1 if it was live, 0 otherwise (released, expired or unknown).",
        complexity: c"O(log N) where N is the number of leases, plus O(log N) for each ended lease removed (at most 64)",
        arity: 3,
        key_flags: KeySpecFlags::READ_WRITE
            .union(KeySpecFlags::ACCESS)
            .union(KeySpecFlags::DELETE),
        shape: Shape::Release,
    },
    CommandSpec {
        name: c"tb.renew",
        handler: Some(crate::lease::commands::tb_renew),
        // No deny-oom: a holder must be able to keep its lease.
        flags: c"write fast",
        acl_categories: c"write fast",
        summary: c"Makes a live lease end lease_ms from now. Replies 1 if it was live, 0 otherwise.",
        complexity: c"O(log N) where N is the number of leases, plus O(log N) for each ended lease removed (at most 64)",
        arity: 4,
        key_flags: READ_WRITE_UPDATE,
        shape: Shape::Renew,
    },
    CommandSpec {
        name: c"tb.top",
        handler: Some(crate::server::top::tb_top),
        // `readonly`: it changes no key (RESET empties the module's own
        // memory), so scripts, EVAL_RO and replicas may call it.
        flags: c"readonly",
        acl_categories: c"slow dangerous",
        summary: c"The keys denied most over at least the last tb.top-window-ms, the most first: [key, count, error, shadow, truncated] rows (count is at least the true number, at most error above it). RESET forgets them.",
        complexity: c"O(S log S) where S is tb.top-slots",
        arity: -1,
        key_flags: KeySpecFlags::empty(),
        shape: Shape::NoKey,
    },
];

/// TB.THROTTLE, also registered under redis-cell's name (`CELL_THROTTLE`).
const THROTTLE: CommandSpec = CommandSpec {
    name: c"tb.throttle",
    handler: Some(crate::bucket::throttle::tb_throttle),
    flags: c"write deny-oom fast",
    acl_categories: c"write fast",
    summary: c"redis-cell's CL.THROTTLE on a token bucket of capacity max_burst + 1 refilled at count per period seconds. Replies [limited, limit, remaining, retry_after, reset_after] in seconds.",
    complexity: c"O(1)",
    arity: -5,
    key_flags: READ_WRITE_UPDATE,
    shape: Shape::Throttle,
};

/// `CL.THROTTLE`, registered only with `cell-compat yes`: TB.THROTTLE's
/// handler and info under redis-cell's name, so its clients need no change.
pub const CELL_THROTTLE: CommandSpec = CommandSpec {
    name: c"cl.throttle",
    ..THROTTLE
};

/// Registers `CL.THROTTLE` (`cell-compat yes`). The server refuses a name
/// another module holds: redis-cell, most likely, loaded first.
///
/// # Safety
/// Must be called from `RedisModule_OnLoad` with its context.
pub unsafe fn register_cell_compat(
    ctx: *mut RedisModuleCtx,
    module_category: bool,
) -> Result<(), String> {
    // RM_CreateCommand fails for a name the server knows already; TB.THROTTLE's
    // flags, the one other cause, were accepted a moment before.
    register(ctx, &CELL_THROTTLE, module_category).map_err(|why| {
        if why.starts_with("could not create command") {
            CELL_COMPAT_TAKEN.to_owned()
        } else {
            why
        }
    })
}

const CELL_COMPAT_TAKEN: &str = "cell-compat: CL.THROTTLE is already registered by another module (redis-cell?); load redis-tb without cell-compat or unload it";

const READ_WRITE_UPDATE: KeySpecFlags = KeySpecFlags::READ_WRITE
    .union(KeySpecFlags::ACCESS)
    .union(KeySpecFlags::UPDATE);
