//! Every setting of the module in one place: the `tb.*` configs
//! (`tb.shadow-mode`, `tb.max-waiters`, `tb.cell-compat`, `tb.top-slots`,
//! `tb.top-window-ms`), their load arguments, and the values the commands
//! read.

use std::os::raw::{c_char, c_int, c_longlong, c_void};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering::Relaxed};

use redis_module::raw::{self, RedisModuleCtx, RedisModuleString};
use redis_tb_core::top;

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

/// `tb.top-slots`: how many keys TB.TOP's summary keeps in each of its two
/// generations (src/server/top.rs); 0 turns it off. At most
/// `top::MAX_SLOTS` (4096), which keeps the summary under 4 MiB.
pub static TOP_SLOTS: AtomicI64 = AtomicI64::new(DEFAULT_TOP_SLOTS);
pub const DEFAULT_TOP_SLOTS: i64 = 1024;
const TOP_SLOTS_LIMIT: i64 = top::MAX_SLOTS as i64;

/// `tb.top-window-ms`: how long each generation of TB.TOP's summary lasts;
/// a reply covers at least the last window.
pub static TOP_WINDOW_MS: AtomicI64 = AtomicI64::new(DEFAULT_TOP_WINDOW_MS);
pub const DEFAULT_TOP_WINDOW_MS: i64 = 60_000;
const TOP_WINDOW_MS_RANGE: (i64, i64) = (1_000, 86_400_000);

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
    TOP_SLOTS.store(load_args.top_slots, Relaxed);
    TOP_WINDOW_MS.store(load_args.top_window_ms, Relaxed);
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
    for (name, value, (least, most), get, set) in [
        (
            c"top-slots",
            load_args.top_slots,
            (0, TOP_SLOTS_LIMIT),
            get_top_slots as NumericGet,
            set_top_slots as NumericSet,
        ),
        (
            c"top-window-ms",
            load_args.top_window_ms,
            TOP_WINDOW_MS_RANGE,
            get_top_window_ms,
            set_top_window_ms,
        ),
    ] {
        let status = register_numeric(
            ctx,
            name.as_ptr(),
            value,
            raw::REDISMODULE_CONFIG_DEFAULT,
            least,
            most,
            Some(get),
            Some(set),
            None,
            std::ptr::null_mut(),
        );
        if status != raw::REDISMODULE_OK as c_int {
            return Err(format!(
                "could not register the config tb.{}",
                name.to_string_lossy()
            ));
        }
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

type NumericGet = extern "C" fn(*const c_char, *mut c_void) -> c_longlong;
type NumericSet =
    extern "C" fn(*const c_char, c_longlong, *mut c_void, *mut *mut RedisModuleString) -> c_int;

extern "C" fn get_top_slots(_name: *const c_char, _privdata: *mut c_void) -> c_longlong {
    TOP_SLOTS.load(Relaxed)
}

/// The summary is made anew at the next denial or TB.TOP (top.rs): what it
/// had counted is gone.
extern "C" fn set_top_slots(
    _name: *const c_char,
    value: c_longlong,
    _privdata: *mut c_void,
    _err: *mut *mut RedisModuleString,
) -> c_int {
    TOP_SLOTS.store(value, Relaxed);
    raw::REDISMODULE_OK as c_int
}

extern "C" fn get_top_window_ms(_name: *const c_char, _privdata: *mut c_void) -> c_longlong {
    TOP_WINDOW_MS.load(Relaxed)
}

extern "C" fn set_top_window_ms(
    _name: *const c_char,
    value: c_longlong,
    _privdata: *mut c_void,
    _err: *mut *mut RedisModuleString,
) -> c_int {
    TOP_WINDOW_MS.store(value, Relaxed);
    raw::REDISMODULE_OK as c_int
}

/// What the load arguments set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadArgs {
    shadow_mode: bool,
    max_waiters: i64,
    cell_compat: bool,
    top_slots: i64,
    top_window_ms: i64,
}

/// Load arguments are `name value` pairs of module configs:
/// `shadow-mode yes|no` (default no), `max-waiters N` (default 10000) and
/// `cell-compat yes|no` (default no), `top-slots N` (default 1024) and
/// `top-window-ms N` (default 60000).
/// Anything else is refused rather than ignored, so a typo in `loadmodule`
/// fails loudly instead of silently running defaults. (The fault-injection
/// build's `fault` arguments are taken out before, by load.rs.)
pub fn check_load_args<'a>(mut args: impl Iterator<Item = &'a [u8]>) -> Result<LoadArgs, String> {
    let mut load_args = LoadArgs {
        shadow_mode: false,
        max_waiters: DEFAULT_MAX_WAITERS,
        cell_compat: false,
        top_slots: DEFAULT_TOP_SLOTS,
        top_window_ms: DEFAULT_TOP_WINDOW_MS,
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
                load_args.max_waiters =
                    number_in(args.next(), 1, MAX_WAITERS_LIMIT).ok_or(format!(
                        "max-waiters must be followed by a count from 1 to {MAX_WAITERS_LIMIT}"
                    ))?;
            }
            b"top-slots" => {
                load_args.top_slots = number_in(args.next(), 0, TOP_SLOTS_LIMIT).ok_or(format!(
                    "top-slots must be followed by a count from 0 to {TOP_SLOTS_LIMIT}"
                ))?;
            }
            b"top-window-ms" => {
                let (least, most) = TOP_WINDOW_MS_RANGE;
                load_args.top_window_ms = number_in(args.next(), least, most).ok_or(format!(
                    "top-window-ms must be followed by a number of ms from {least} to {most}"
                ))?;
            }
            _ => {
                let name = String::from_utf8_lossy(name);
                return Err(format!(
                    "unknown load argument '{name}' (known: shadow-mode yes|no, max-waiters N, cell-compat yes|no, top-slots N, top-window-ms N)"
                ));
            }
        }
    }
    Ok(load_args)
}

/// A load argument's decimal value, when it is one in [least, most].
fn number_in(text: Option<&[u8]>, least: i64, most: i64) -> Option<i64> {
    std::str::from_utf8(text?)
        .ok()?
        .parse::<i64>()
        .ok()
        .filter(|value| (least..=most).contains(value))
}
