'use strict';

// lib/engine.js, the limiter's decisions, without I/O (issue 26, item 7; issue 35, item 3):
// the backend choice and its log line, the module recheck, what a failed send leads to, the
// operations (detection, a call's sends, the Lua waits) run step by step with made-up
// answers, redirections, and the shield (the denial cache, the local limiter's outage).

const assert = require('node:assert/strict');
const { test } = require('node:test');
const engine = require('../lib/engine');
const { Decision } = require('../lib/core');
const { LimiterUnavailable, LimiterReplyError, LimiterError } = require('../lib/errors');

const LIMITS = [{ name: 'default', capacity: 4, rate: 1 }];
const takeCall = (how = {}) => new engine.Call('take', ['k'], { costs: [1], limits: LIMITS, ...how });
const served = (fields) => new Decision(fields, LIMITS, null, 'server');

function reply(message) {
  const err = new Error(message);
  err.name = 'ReplyError';
  return err;
}

test('the backend: a forced one is loaded as it is, auto asks for the module first', () => {
  assert.equal(engine.detectionStart('auto'), 'ask_module');
  for (const forced of ['module', 'function', 'script']) {
    assert.equal(engine.detectionStart(forced), forced);
  }
  // FUNCTION LOAD refused by the server: the script; the server unreachable: thrown.
  assert.equal(engine.afterFunctionLoadFailed(reply('ERR unknown command \'FUNCTION\'')), 'script');
  assert.equal(engine.afterFunctionLoadFailed(reply('NOPERM this user has no permissions')), 'script');
  assert.equal(engine.afterFunctionLoadFailed(reply('LOADING Redis is loading')), 'throw');
  assert.equal(engine.afterFunctionLoadFailed(new Error('connect ECONNREFUSED')), 'throw');
});

test('the choice is logged once: a Lua fallback of auto at warn, the module or a forced backend at info', () => {
  assert.deepEqual(engine.choiceLine(null, 'module', 'the server has TB.TAKE', 'auto'),
    ['info', 'redis-tb backend: module (the server has TB.TAKE)']);
  assert.equal(engine.choiceLine(null, 'function', 'no TB.TAKE', 'auto')[0], 'warn');
  assert.equal(engine.choiceLine(null, 'script', 'no TB.TAKE', 'auto')[0], 'warn');
  assert.equal(engine.choiceLine(null, 'script', 'forced', 'script')[0], 'info');
  assert.match(engine.choiceLine('module', 'function', 'x', 'auto')[1], /the module is gone/);
  assert.equal(engine.choiceLine('module', 'function', 'x', 'auto')[0], 'warn');
  assert.deepEqual(engine.choiceLine('function', 'module', 'x', 'auto'),
    ['info', 'redis-tb: the module is back on the server; moving to it from the Lua backend (function)']);
});

test('the module recheck: on Lua after having seen the module, at most every recheckMs, auto only', () => {
  const state = { chosen: 'function', sawModule: true, checkedAt: 1000, requested: 'auto' };
  assert.equal(engine.shouldLookForModule(state, 1000 + 29_999, 30_000), false);
  assert.equal(engine.shouldLookForModule(state, 1000 + 30_000, 30_000), true);
  assert.equal(engine.shouldLookForModule({ ...state, sawModule: false }, 1e9, 30_000), false);
  assert.equal(engine.shouldLookForModule({ ...state, chosen: 'module' }, 1e9, 30_000), false);
  assert.equal(engine.shouldLookForModule({ ...state, requested: 'function' }, 1e9, 30_000), false);
});

test('after a failed send: detect again once on a server change, reconnect once on a dropped connection, else fail', () => {
  const fresh = { detected: false, reconnected: false };
  for (const message of ['NOSCRIPT No matching script', 'ERR unknown command \'TB.TAKE\'', 'ERR Function not found']) {
    assert.equal(engine.afterFailure(reply(message), fresh, true), 'detect', message);
    assert.equal(engine.afterFailure(reply(message), { ...fresh, detected: true }, true), 'fail', message);
  }
  const dropped = [
    new Error('Connection is closed.'), new Error('read ECONNRESET'), new Error('write EPIPE'),
    new Error('Reached the max retries per request limit (which is 0). Refer to "maxRetriesPerRequest" option for details.'),
    new LimiterUnavailable('not connected to the server: the connection dropped (client reconnecting)'),
  ];
  for (const err of dropped) {
    assert.equal(engine.afterFailure(err, fresh, true), 'reconnect', err.message);
    assert.equal(engine.afterFailure(err, { ...fresh, reconnected: true }, true), 'fail', err.message);
    // refund and settle are never sent twice
    assert.equal(engine.afterFailure(err, fresh, false), 'fail', err.message);
  }
  // Refused by ioredis while it reconnects (no offline queue): never written, so sent once
  // more even for refund and settle.
  for (const err of [new Error("Stream isn't writeable and enableOfflineQueue options is false"),
    new Error("Cluster isn't ready and enableOfflineQueue options is false")]) {
    assert.equal(engine.afterFailure(err, fresh, true), 'reconnect', err.message);
    assert.equal(engine.afterFailure(err, fresh, false), 'reconnect', err.message);
    assert.equal(engine.afterFailure(err, { ...fresh, reconnected: true }, false), 'fail', err.message);
  }
  // Never retried: a timeout (the server may still run it), a refusal, a bug, an outage reply.
  for (const err of [new Error('Command timed out'), new Error('connect ECONNREFUSED 127.0.0.1:1'),
    new LimiterUnavailable('not connected to the server (client reconnecting)'), reply('WRONGTYPE Operation'),
    reply('LOADING Redis is loading'), new LimiterError('bug', 'unexpected reply'), new LimiterReplyError('ERR x'),
    new TypeError('x')]) {
    assert.equal(engine.afterFailure(err, fresh, true), 'fail', err.message);
  }
});

test('a cluster client that knows no master is waited for while it (re)connects, not once it ended', () => {
  for (const status of ['wait', 'connecting', 'connect', 'reconnecting', 'close']) {
    assert.equal(engine.clusterMayReconnect(status), true, status);
  }
  for (const status of ['ready', 'end', 'disconnecting']) {
    assert.equal(engine.clusterMayReconnect(status), false, status);
  }
});

test('a Lua waitTake\'s grant is the reservation with no wait left and its reset counted from the grant', () => {
  assert.deepEqual(engine.grantAfterWait({ retryAfterMs: 500, resetAfterMs: 5500 }), { retryAfterMs: 0, resetAfterMs: 5000 });
  assert.deepEqual(engine.grantAfterWait({ retryAfterMs: 0, resetAfterMs: 1200 }), { retryAfterMs: 0, resetAfterMs: 1200 });
  assert.deepEqual(engine.grantAfterWait({ retryAfterMs: 30, resetAfterMs: 20 }), { retryAfterMs: 0, resetAfterMs: 0 });
});

// Runs an engine operation with `answer(step)` for its I/O (a thrown error is thrown in);
// -> { value, steps } (the steps but the logs) and the lines it logged.
function run(operation, answer) {
  const steps = [];
  const lines = [];
  let next = operation.next();
  while (!next.done) {
    const step = next.value;
    if (step.step === 'log') {
      lines.push(step.line);
      next = operation.next();
      continue;
    }
    steps.push(step.step === 'load' ? `load ${step.what}` : step.step);
    let result;
    try {
      result = answer(step);
    } catch (err) {
      next = operation.throw(err);
      continue;
    }
    next = operation.next(result);
  }
  return { value: next.value, steps, lines };
}

const HAS_MODULE = [['tb.take', -5, ['write'], 1, 1, 1]];

test('detection: the module if the server has TB.TAKE, else FUNCTION LOAD, else SCRIPT LOAD; every detection ends a generation', () => {
  const withModule = new engine.Backend('auto', () => 0);
  assert.deepEqual(run(engine.detect(withModule), () => HAS_MODULE).steps, ['ask_module']);
  assert.deepEqual([withModule.chosen, withModule.sawModule, withModule.generation], ['module', true, 1]);
  const plain = new engine.Backend('auto', () => 0);
  const loaded = run(engine.detect(plain), (step) => (step.step === 'ask_module' ? [null] : 'OK'));
  assert.deepEqual([loaded.steps, plain.chosen], [['ask_module', 'load function'], 'function']);
  assert.equal(loaded.lines[0][0], 'warn');
  const old = new engine.Backend('auto', () => 0);
  const refused = run(engine.detect(old), (step) => {
    if (step.step === 'load' && step.what === 'function') throw reply("ERR unknown command 'FUNCTION'");
    return step.step === 'ask_module' ? [null] : 'sha';
  });
  assert.deepEqual([refused.steps, old.chosen], [['ask_module', 'load function', 'load script'], 'script']);
  const down = new engine.Backend('auto', () => 0);
  assert.throws(() => run(engine.detect(down), () => { throw new Error('connect ECONNREFUSED'); }), /ECONNREFUSED/);
  assert.deepEqual([down.chosen, down.generation], [null, 1]);
  const forced = new engine.Backend('script', () => 0);
  assert.deepEqual(run(engine.detect(forced), () => 'sha').steps, ['load script']);
});

test('a call: detected first; a server change detects again and sends once more; a drop reconnects and sends once more', () => {
  const backend = new engine.Backend('auto', () => 0);
  // The first call asks for the one detection in progress.
  const first = run(engine.exchange(backend, 30_000, 'take', ['k'], ['1', '1', '1'], true), (step) => {
    if (step.step === 'detect') {
      run(engine.detect(backend), () => HAS_MODULE);
      return undefined;
    }
    return [1, 0, 0, 1000];
  });
  assert.deepEqual([first.steps, first.value], [['detect', 'send'], [1, 0, 0, 1000]]);
  let sends = 0;
  const changed = run(engine.exchange(backend, 30_000, 'take', ['k'], [], true), (step) => {
    if (step.step === 'send' && ++sends === 1) throw reply('NOSCRIPT No matching script');
    return 'OK';
  });
  assert.deepEqual(changed.steps, ['send', 'detect', 'send']);
  assert.match(changed.lines[0][1], /the server changed/);
  sends = 0;
  const dropped = run(engine.exchange(backend, 30_000, 'take', ['k'], [], true), (step) => {
    if (step.step === 'send' && ++sends === 1) throw new Error('read ECONNRESET');
    return 'OK';
  });
  assert.deepEqual(dropped.steps, ['send', 'reconnect', 'send']);
  // A refund is not sent twice after a drop; a second server change is the answer.
  assert.throws(() => run(engine.exchange(backend, 30_000, 'refund', ['k'], [], false), () => {
    throw new Error('read ECONNRESET');
  }), /ECONNRESET/);
  assert.throws(() => run(engine.exchange(backend, 30_000, 'take', ['k'], [], true), (step) => {
    if (step.step === 'send') throw reply('NOSCRIPT No matching script');
    return undefined;
  }), /NOSCRIPT/);
});

test('on Lua after the module went away, a call looks for it again at most every recheckMs', () => {
  let now = 0;
  const backend = new engine.Backend('auto', () => now);
  run(engine.detect(backend), () => HAS_MODULE);
  backend.use('function', 'the module went away');
  const steps = () => run(engine.ensure(backend, 1000), (step) => (step.step === 'ask_module' ? [null] : 'OK')).steps;
  assert.deepEqual(steps(), []);
  now = 1000;
  assert.deepEqual(steps(), ['ask_module']);
  assert.deepEqual(steps(), []);
  now = 2000;
  run(engine.ensure(backend, 1000), () => HAS_MODULE);
  assert.equal(backend.chosen, 'module');
});

test('a Lua waitTake: one reservation, one sleep for the wait it names, then the grant TB.BTAKE would answer', () => {
  const take = { key: 'k', capacity: 10, rate: 2, n: 1, name: 'default' };
  const sleeps = [];
  const maxWaits = [];
  let now = 0;
  const answer = (reply) => (step) => {
    if (step.step === 'sleep') {
      sleeps.push(step.ms);
      now += step.ms;
      return undefined;
    }
    maxWaits.push(step.maxWaitMs);
    return served(reply);
  };
  const granted = run(engine.reserveAndWait(take, 2000, 0, () => now), answer([1, 0, 500, 5500]));
  assert.deepEqual([granted.steps, maxWaits, sleeps], [['take', 'sleep'], [2000], [500]]);
  assert.deepEqual([granted.value.allowed, granted.value.retryAfterMs, granted.value.resetAfterMs], [true, 0, 5000]);
  // Not within the timeout: the timeout slept out, then one plain take is the answer.
  maxWaits.length = 0;
  sleeps.length = 0;
  now = 100;
  const late = run(engine.reserveAndWait(take, 2000, 0, () => now), answer([0, 0, 3000, 5000]));
  assert.deepEqual([late.steps, maxWaits, sleeps, now], [['take', 'sleep', 'take'], [2000, undefined], [1900], 2000]);
  // Never (n above the capacity: -1), or no timeout (MAXWAIT 2^53): the reservation's answer.
  maxWaits.length = 0;
  assert.deepEqual(run(engine.reserveAndWait(take, 2000, 0, () => now), answer([0, 0, -1, 0])).steps, ['take']);
  assert.deepEqual(run(engine.reserveAndWait(take, 0, 0, () => now), answer([0, 0, 10, 0])).steps, ['take']);
  assert.deepEqual(maxWaits, [2000, 2 ** 53]);
});

test('a Lua waitAcquire polls: min(retryAfterMs, pollMs, the time left) but at least 1 ms, until a lease or the deadline', () => {
  const acquire = { key: 'k', limit: 1, leaseMs: 1000, options: {} };
  let now = 0;
  const sleeps = [];
  const poll = (leases, timeoutMs) => run(engine.pollForLease(acquire, timeoutMs, 100, 0, () => now), (step) => {
    if (step.step === 'sleep') {
      sleeps.push(step.ms);
      now += step.ms;
      return undefined;
    }
    return leases.length > 1 ? leases.shift() : leases[0];
  });
  const got = poll([{ acquired: false, retryAfterMs: 300 }, { acquired: false, retryAfterMs: 0 }, { acquired: true }], 1000);
  assert.deepEqual([got.value.acquired, sleeps], [true, [100, 1]]);
  now = 0;
  sleeps.length = 0;
  const timedOut = poll([{ acquired: false, retryAfterMs: 300 }], 250);
  assert.deepEqual([timedOut.value.acquired, sleeps, now], [false, [100, 100, 50], 250]);
});

test('redirections: MOVED refreshes the slots, ASK asks; none outside a cluster', () => {
  assert.deepEqual(engine.redirection(reply('MOVED 3999 127.0.0.1:7001'), true),
    { node: { host: '127.0.0.1', port: 7001 }, asking: false, refreshSlots: true });
  assert.deepEqual(engine.redirection(reply('ASK 3999 10.0.0.2:7002'), true),
    { node: { host: '10.0.0.2', port: 7002 }, asking: true, refreshSlots: false });
  assert.equal(engine.redirection(reply('MOVED 3999 127.0.0.1:7001'), false), null);
  assert.equal(engine.redirection(reply('WRONGTYPE x'), true), null);
});

test('a blocking command follows MOVED (refreshing the slots) and ASK (asking), at most MAX_REDIRECTIONS times, and is sent once more after a drop', () => {
  const OWNER = { host: '127.0.0.1', port: 7000 };
  const blocks = [];
  const answering = (...errors) => (step) => {
    if (step.step === 'owner') return OWNER;
    if (step.step === 'refresh_slots') return undefined;
    blocks.push([step.node.port, step.asking]);
    const err = errors.shift();
    if (err) throw err;
    return [1, 0, 0, 0];
  };
  const moved = run(engine.blockOnOwner('TB.BTAKE', 'k', [], 100, true),
    answering(reply('MOVED 1 127.0.0.1:7001'), reply('ASK 1 127.0.0.1:7002'), new Error('read ECONNRESET')));
  assert.deepEqual(moved.steps, ['owner', 'block', 'refresh_slots', 'block', 'block', 'block']);
  assert.deepEqual(blocks, [[7000, false], [7001, false], [7002, true], [7002, true]]);
  assert.deepEqual(moved.value, [1, 0, 0, 0]);
  const endless = Array.from({ length: engine.MAX_REDIRECTIONS + 1 }, () => reply('MOVED 1 127.0.0.1:7001'));
  assert.throws(() => run(engine.blockOnOwner('TB.BTAKE', 'k', [], 100, true), answering(...endless)),
    (err) => err instanceof LimiterUnavailable && /more than 5 cluster redirections/.test(err.message));
  // A second drop, a timeout, or a redirection outside a cluster is the answer.
  assert.throws(() => run(engine.blockOnOwner('TB.BTAKE', 'k', [], 100, true),
    answering(new Error('read ECONNRESET'), new Error('read ECONNRESET'))), /ECONNRESET/);
  assert.throws(() => run(engine.blockOnOwner('TB.BTAKE', 'k', [], 100, true), answering(new Error('Command timed out'))), /timed out/);
  assert.throws(() => run(engine.blockOnOwner('TB.BTAKE', 'k', [], 100, false), answering(reply('MOVED 1 127.0.0.1:7001'))), /MOVED/);
});

// The shield (engine.Shield): the denial cache and the local limiter, before and after a call.

test('the shield: a remembered denial answers from the cache until its time, and a change forgets it', () => {
  const shield = new engine.Shield(1, 100, 1000, true);
  const call = takeCall({ cache: true });
  assert.equal(shield.before(call, 0), null);
  assert.equal(shield.after(call, served([0, 0, 500, 4000]), 0), null);
  const cached = shield.before(call, 100);
  assert.deepEqual([cached.source, cached.allowed, cached.retryAfterMs], ['cache', false, 400]);
  assert.equal(shield.before(call, 500), null); // its time has come: sent
  shield.after(call, served([0, 0, 500, 4000]), 500);
  shield.forget('k');
  assert.equal(shield.before(call, 600), null);
  // Without the cache (a reservation), or without cacheDenials: always sent.
  shield.after(call, served([0, 0, 500, 4000]), 600);
  assert.equal(shield.before(takeCall(), 700), null);
  assert.equal(new engine.Shield(1, 100, 1000, false).before(call, 0), null);
});

test('the shield: a primable take that left fewer than n tokens is remembered as the next denial', () => {
  const shield = new engine.Shield(1, 100, 1000, true);
  // Allowed, 0 left of capacity 4 at 1/s: full in 4000 ms, so the next token in 1000 (+1).
  shield.after(takeCall({ cache: true, primable: true }), served([1, 0, 0, 4000]), 0);
  assert.equal(shield.before(takeCall({ cache: true }), 1000).source, 'cache');
  assert.equal(shield.before(takeCall({ cache: true }), 1001), null);
  // Not primable (a lockout): nothing remembered.
  const other = new engine.Shield(1, 100, 1000, true);
  other.after(takeCall({ cache: true }), served([1, 0, 0, 4000]), 0);
  assert.equal(other.before(takeCall({ cache: true }), 10), null);
});

test('the shield: an unavailable call the local limiter serves starts an outage and is answered locally until a probe succeeds', () => {
  const shield = new engine.Shield(2, 100, 1000, false);
  const call = takeCall({ local: 'take' });
  const { decision, line } = shield.failed(call, new LimiterUnavailable('connect ECONNREFUSED'), 0);
  assert.deepEqual([decision.source, decision.allowed, decision.remaining], ['local', true, 1]); // capacity 4 / 2 instances
  assert.match(line[1], /Redis unreachable \(connect ECONNREFUSED\)/);
  assert.equal(shield.before(call, 10).source, 'local'); // between probes
  assert.throws(() => shield.before(new engine.Call('refund', ['k']), 20), LimiterUnavailable);
  assert.equal(shield.before(call, 1000), null); // the probe
  assert.deepEqual(shield.after(call, served([1, 3, 0, 1000]), 1005), ['warn', 'redis-tb: Redis reachable again; limits come from Redis']);
  assert.equal(shield.before(call, 1010), null);
  // A bug is never answered locally; without a local answer an unavailable call is only thrown.
  assert.deepEqual(shield.failed(call, new LimiterError('bug', 'x'), 1020), { decision: null, line: null });
  assert.deepEqual(shield.failed(takeCall(), new LimiterUnavailable('down'), 1030), { decision: null, line: null });
});
