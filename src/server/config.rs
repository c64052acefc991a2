//! Every setting of the module in one place: the `tb.*` configs
//! (`tb.shadow-mode`, `tb.max-waiters`, `tb.cell-compat`), their load
//! arguments, and the values the commands read.

use std::os::raw::{c_char, c_int, c_longlong, c_void};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering::Relaxed};

use redis_module::raw::{self, RedisModuleCtx, RedisModuleString};

/// `tb.shadow-mode`: report denials as allowed (see `shadow` in
/// src/bucket/commands.rs).
pub static SHADOW_MODE: AtomicBool = AtomicBool::new(false);

/// `tb.max-waiters`: how many clients may wait on one key, counted apart
/// for each kind of wait (TB.BTAKE's token waiters, TB.ACQUIRE's lease
/// waiters).
pub static MAX_WAITERS: AtomicI64 = AtomicI64::new(DEFAULT_MAX_WAITERS);
pub const DEFAULT_MAX_WAITERS: i64 = 10_000;

/// `tb.cell-compat`: also register TB.THROTTLE as redis-cell's
/// `CL.THROTTLE` (load.rs). Set at load only (an immutable config): the
/// commands are registered once, when the module loads.
pub static CELL_COMPAT: AtomicBool = AtomicBool::new(false);

/// Registers the `tb.*` configs (`CONFIG GET/SET`, redis.conf),
/// starting at the value the load arguments gave, then lets the server
/// apply what its config file says.
///
/// # Safety
/// OnLoad context, after Init.
pub unsafe fn register(ctx: *mut RedisModuleCtx, load_args: LoadArgs) -> Result<(), String> {
    SHADOW_MODE.store(load_args.shadow_mode, Relaxed);
    MAX_WAITERS.store(load_args.max_waiters, Relaxed);
    CELL_COMPAT.store(load_args.cell_compat, Relaxed);
    let (Some(register_bool), Some(register_numeric)) = (
        raw::RedisModule_RegisterBoolConfig,
        raw::RedisModule_RegisterNumericConfig,
    ) else {
        return Ok(()); // before 7.0: the load arguments alone set them
    };
    let status = register_bool(
        ctx,
        c"shadow-mode".as_ptr(),
        c_int::from(load_args.shadow_mode),
        raw::REDISMODULE_CONFIG_DEFAULT,
        Some(get_shadow_mode),
        Some(set_shadow_mode),
        None,
        std::ptr::null_mut(),
    );
    if status != raw::REDISMODULE_OK as c_int {
        return Err("could not register the config tb.shadow-mode".into());
    }
    let status = register_numeric(
        ctx,
        c"max-waiters".as_ptr(),
        load_args.max_waiters,
        raw::REDISMODULE_CONFIG_DEFAULT,
        1,
        MAX_WAITERS_LIMIT,
        Some(get_max_waiters),
        Some(set_max_waiters),
        None,
        std::ptr::null_mut(),
    );
    if status != raw::REDISMODULE_OK as c_int {
        return Err("could not register the config tb.max-waiters".into());
    }
    let status = register_bool(
        ctx,
        c"cell-compat".as_ptr(),
        c_int::from(load_args.cell_compat),
        raw::REDISMODULE_CONFIG_IMMUTABLE,
        Some(get_cell_compat),
        Some(set_cell_compat),
        None,
        std::ptr::null_mut(),
    );
    if status != raw::REDISMODULE_OK as c_int {
        return Err("could not register the config tb.cell-compat".into());
    }
    if let Some(load_configs) = raw::RedisModule_LoadConfigs {
        if load_configs(ctx) != raw::REDISMODULE_OK as c_int {
            return Err("the server refused the value of a tb.* config".into());
        }
    }
    Ok(())
}

/// The largest `tb.max-waiters`.
const MAX_WAITERS_LIMIT: i64 = 10_000_000;

extern "C" fn get_shadow_mode(_name: *const c_char, _privdata: *mut c_void) -> c_int {
    c_int::from(SHADOW_MODE.load(Relaxed))
}

extern "C" fn set_shadow_mode(
    _name: *const c_char,
    value: c_int,
    _privdata: *mut c_void,
    _err: *mut *mut RedisModuleString,
) -> c_int {
    SHADOW_MODE.store(value != 0, Relaxed);
    raw::REDISMODULE_OK as c_int
}

extern "C" fn get_cell_compat(_name: *const c_char, _privdata: *mut c_void) -> c_int {
    c_int::from(CELL_COMPAT.load(Relaxed))
}

/// Called only while loading (the config is immutable), before the
/// commands are registered.
extern "C" fn set_cell_compat(
    _name: *const c_char,
    value: c_int,
    _privdata: *mut c_void,
    _err: *mut *mut RedisModuleString,
) -> c_int {
    CELL_COMPAT.store(value != 0, Relaxed);
    raw::REDISMODULE_OK as c_int
}

extern "C" fn get_max_waiters(_name: *const c_char, _privdata: *mut c_void) -> c_longlong {
    MAX_WAITERS.load(Relaxed)
}

extern "C" fn set_max_waiters(
    _name: *const c_char,
    value: c_longlong,
    _privdata: *mut c_void,
    _err: *mut *mut RedisModuleString,
) -> c_int {
    // The server has checked the range.
    MAX_WAITERS.store(value, Relaxed);
    raw::REDISMODULE_OK as c_int
}

/// What the load arguments set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadArgs {
    shadow_mode: bool,
    max_waiters: i64,
    cell_compat: bool,
}

/// Load arguments are `name value` pairs of module configs:
/// `shadow-mode yes|no` (default no), `max-waiters N` (default 10000) and
/// `cell-compat yes|no` (default no).
/// Anything else is refused rather than ignored, so a typo in `loadmodule`
/// fails loudly instead of silently running defaults. (The fault-injection
/// build's `fault` arguments are taken out before, by load.rs.)
pub fn check_load_args<'a>(mut args: impl Iterator<Item = &'a [u8]>) -> Result<LoadArgs, String> {
    let mut load_args = LoadArgs {
        shadow_mode: false,
        max_waiters: DEFAULT_MAX_WAITERS,
        cell_compat: false,
    };
    while let Some(name) = args.next() {
        match name {
            b"shadow-mode" => {
                load_args.shadow_mode = match args.next() {
                    Some(b"yes") => true,
                    Some(b"no") => false,
                    _ => return Err("shadow-mode must be followed by yes or no".into()),
                };
            }
            b"cell-compat" => {
                load_args.cell_compat = match args.next() {
                    Some(b"yes") => true,
                    Some(b"no") => false,
                    _ => return Err("cell-compat must be followed by yes or no".into()),
                };
            }
            b"max-waiters" => {
                load_args.max_waiters = args
                    .next()
                    .and_then(|text| std::str::from_utf8(text).ok())
                    .and_then(|text| text.parse::<i64>().ok())
                    .filter(|max| (1..=MAX_WAITERS_LIMIT).contains(max))
                    .ok_or(format!(
                        "max-waiters must be followed by a count from 1 to {MAX_WAITERS_LIMIT}"
                    ))?;
            }
            _ => {
                let name = String::from_utf8_lossy(name);
                return Err(format!(
                    "unknown load argument '{name}' (known: shadow-mode yes|no, max-waiters N, cell-compat yes|no)"
                ));
            }
        }
    }
    Ok(load_args)
}
