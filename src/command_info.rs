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
    get_redis_command_args, get_redis_key_spec, BeginSearch, CommandArgFlags, FindKeys, KeySpec,
    KeySpecFlags, RedisModuleCommandArg,
};
use redis_module::raw::{self, RedisModuleCmdFunc, RedisModuleCtx};

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
    /// `key capacity rate n [key capacity rate n ...]`.
    Repeated,
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
    // Key positions 1,1,1: the bucket key is argv[1]. Cluster routing and
    // COMMAND GETKEYS rely on this.
    let created = create(
        ctx,
        spec.name.as_ptr(),
        spec.handler,
        spec.flags.as_ptr(),
        1,
        1,
        1,
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
        let categories = if module_category {
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

    let key_specs = get_redis_key_spec(vec![KeySpec::new(
        None,
        KeySpecFlags::from_bits_truncate(spec.key_flags.bits()),
        BeginSearch::new_index(1),
        match spec.shape {
            Shape::Single { .. } => FindKeys::new_range(0, 1, 0),
            Shape::Repeated => FindKeys::new_range(-1, 4, 0),
        },
    )]);
    let number = |arg: &str, summary: &str, flags: CommandArgFlags| {
        RedisModuleCommandArg::new(
            arg.into(),
            raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_DOUBLE,
            None,
            None,
            Some(summary.into()),
            None,
            flags,
            None,
            None,
            None,
        )
    };
    let key = RedisModuleCommandArg::new(
        "key".into(),
        raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY,
        Some(0),
        None,
        Some("the bucket's hash".into()),
        None,
        CommandArgFlags::NONE,
        None,
        None,
        None,
    );
    let n_flags = match spec.shape {
        Shape::Single { n_optional: true } => CommandArgFlags::OPTIONAL,
        _ => CommandArgFlags::NONE,
    };
    let bucket = vec![
        key,
        number(
            "capacity",
            "tokens when full (burst), > 0",
            CommandArgFlags::NONE,
        ),
        number(
            "rate",
            "tokens added per second, > 0",
            CommandArgFlags::NONE,
        ),
        number("n", "tokens, >= 0", n_flags),
    ];
    let args = get_redis_command_args(match spec.shape {
        Shape::Single { .. } => bucket,
        Shape::Repeated => vec![RedisModuleCommandArg::new(
            "bucket".into(),
            raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_BLOCK,
            None,
            None,
            Some("one limit: key capacity rate n".into()),
            None,
            CommandArgFlags::MULTIPLE,
            None,
            Some(bucket),
            None,
        )],
    })
    .ok_or("no arguments")?;

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
        key_specs: key_specs.as_ptr() as *mut _,
        args: args.as_ptr() as *mut _,
    };
    // The server copies everything it keeps, so the vectors (and the strings
    // the crate leaked into them, a few bytes once per load) may go.
    if set_info(command, &info) != raw::REDISMODULE_OK as c_int {
        return Err(format!("could not set command info of {name}"));
    }
    Ok(())
}
