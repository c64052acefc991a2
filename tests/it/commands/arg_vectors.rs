//! The module replays the core's argument vectors (clients/conformance/vectors/args.json,
//! written by core/tests/vectors from the core's parsers): each vector's arguments through the
//! real TB.* command on a fresh key must give the core's error text exactly, or be accepted
//! (no error at all: on a fresh key nothing else can refuse them, and no call waits, since a
//! full bucket grants every n it can ever hold and a missing lease set grants a lease). The
//! twin replays the same file (tests/it/twin/vectors.rs).

use crate::harness::*;

#[test]
fn the_module_reads_arguments_as_the_core_does() {
    let server = Server::start();
    let mut con = server.conn();
    let mut failures = Vec::new();
    let mut replayed = 0;
    for vector in arg_vectors() {
        let _: () = redis::cmd("FLUSHALL").query(&mut con).expect("FLUSHALL");
        let mut argv: Vec<&[u8]> = vec![vector.command.as_bytes()];
        if vector.command != "TB.TAKEALL" {
            argv.push(b"vector");
        }
        argv.extend(vector.args.iter().map(String::as_bytes));
        failures.extend(vector.differs(raw(&mut con, &argv)));
        replayed += 1;
    }
    finish_arg_replay("the module", &failures, replayed);
}
