//! The Lua twin of the module (`lua/tb.lua`, by EVALSHA or as a FUNCTION LOAD library) and
//! the differential harness that runs the same calls through both and compares them.

/// The one Lua source, `lua/tb.lua`: loaded as it is by FUNCTION LOAD, and without its first
/// line as an EVAL script (see `tb_lua_script`).
pub const TB_LUA: &str = include_str!("../../lua/tb.lua");

/// `TB_LUA` as an EVAL script: without the `#!lua name=tb` shebang, whose `name=` EVAL refuses.
pub fn tb_lua_script() -> &'static str {
    TB_LUA.split_once('\n').map_or("", |(_, rest)| rest)
}

/// Where the fallback runs: an EVALSHA of `lua/tb.lua` as a script, or an FCALL of it loaded
/// as a library. Both take the same keys and arguments; the script takes the command name as
/// its first argument, the library has one function per command (`tb_<command>`).
#[derive(Clone)]
pub enum Fallback {
    Script { sha: String },
    Function,
}

impl Fallback {
    /// SCRIPT LOAD of `lua/tb.lua` on `con`'s server.
    pub fn script(con: &mut redis::Connection) -> Fallback {
        let sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(tb_lua_script())
            .query(con)
            .expect("SCRIPT LOAD lua/tb.lua");
        Fallback::Script { sha }
    }

    /// FUNCTION LOAD of `lua/tb.lua` on `con`'s server; REPLACE, so loading it twice on one
    /// server is no error.
    pub fn function(con: &mut redis::Connection) -> Fallback {
        let name: String = redis::cmd("FUNCTION")
            .arg("LOAD")
            .arg("REPLACE")
            .arg(TB_LUA)
            .query(con)
            .expect("FUNCTION LOAD lua/tb.lua");
        assert_eq!(name, "tb");
        Fallback::Function
    }

    /// The twin of TB.<COMMAND> on one key (`command` in lower case: take, acquire, ...).
    pub fn cmd(&self, command: &str, key: &[u8], args: &[&[u8]]) -> redis::Cmd {
        self.cmd_for(command, &[key], args)
    }

    /// The twin of TB.<COMMAND> on `keys` (several for takeall, or to test the key count).
    pub fn cmd_for(&self, command: &str, keys: &[&[u8]], args: &[&[u8]]) -> redis::Cmd {
        let mut cmd = match self {
            Fallback::Script { sha } => {
                let mut cmd = redis::cmd("EVALSHA");
                cmd.arg(sha);
                cmd
            }
            Fallback::Function => {
                let mut cmd = redis::cmd("FCALL");
                cmd.arg(format!("tb_{command}"));
                cmd
            }
        };
        cmd.arg(keys.len());
        for key in keys {
            cmd.arg(*key);
        }
        if let Fallback::Script { .. } = self {
            cmd.arg(command);
        }
        for arg in args {
            cmd.arg(*arg);
        }
        cmd
    }

    /// How failure messages name it.
    pub fn name(&self) -> &'static str {
        match self {
            Fallback::Script { .. } => "EVALSHA lua/tb.lua",
            Fallback::Function => "FCALL tb_*",
        }
    }
}
