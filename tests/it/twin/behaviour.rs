//! What only the Lua twin (`lua/tb.lua`) has, on a server without the module: the script
//! form, which takes the command's name as its first argument. What the twin's commands do,
//! beside the module's, is in commands/ (each case there runs on both: `<case>::on_module`,
//! `<case>::on_twin`).

use crate::harness::*;

#[test]
fn the_script_runs_the_new_commands_by_name() {
    let server = Server::start_without_module(&[]);
    let mut con = server.conn();
    let script = Fallback::script(&mut con);
    let run = |con: &mut redis::Connection, command: &str, args: &[&[u8]]| -> Vec<i64> {
        script
            .cmd(command, b"k", args)
            .query(con)
            .unwrap_or_else(|e| panic!("{command}: {e}"))
    };
    assert_eq!(
        run(&mut con, "charge", &[b"5", b"1", b"6"]),
        [1, 0, 1000, 6000]
    );
    assert_eq!(
        run(&mut con, "take", &[b"5", b"1", b"1", b"BLOCK", b"50"])[0],
        0
    );
    let unblocked: i64 = script.cmd("unblock", b"k", &[]).query(&mut con).unwrap();
    assert_eq!(unblocked, 1);
    let _: i64 = redis::cmd("DEL").arg("k").query(&mut con).unwrap();
    assert_eq!(
        run(&mut con, "throttle", &[b"4", b"1", b"2"]),
        [0, 5, 4, -1, 2]
    );
    let Fallback::Script { sha } = &script else {
        unreachable!()
    };
    let err = outcome(
        &mut con,
        redis::cmd("EVALSHA").arg(sha).arg(1).arg("k").arg("nope"),
    )
    .expect_err("an unknown name");
    assert_eq!(
        err,
        "ERR the first argument must be take, peek, refund, takeall, charge, unblock, throttle, \
         acquire, release or renew"
    );
}
