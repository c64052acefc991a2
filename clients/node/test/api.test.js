'use strict';

// The plain API on every backend: the module (a server with it), and the Lua fallback as a
// function library and as an EVALSHA script (a server without it). Slow rates (0.001/s)
// so nothing refills between calls: counts are exact; waits move by the few ms a call takes.

const assert = require('node:assert/strict');
const { before, describe, test } = require('node:test');
const { RateLimiter, LimiterError, InvalidArgument, LimiterReplyError, Limit, createClient, luaSource } = require('..');
const { admin } = require('./servers');
const { BACKENDS, moduleAndPlainServers, untilTheEnd } = require('./helpers');

const RATE = 0.001;
const servers = moduleAndPlainServers();
const { clients } = untilTheEnd();

async function limiterOn(backend, options = {}) {
  const client = createClient(servers[backend.server].url, options.client);
  clients.push(client);
  await new Promise((resolve) => client.once('ready', resolve));
  const lines = [];
  const limiter = new RateLimiter(client, {
    backend: backend.option, timeoutMs: 2000, logger: (level, message) => lines.push([level, message]), ...options.limiter,
  });
  return { limiter, client, lines };
}

// A key of its own for every test and backend.
let counter = 0;
const fresh = (name) => `t${++counter}:${name}`;

const near = (actual, expected, what) => {
  assert.ok(actual <= expected && actual > expected - 2000, `${what}: ${actual}, expected just under ${expected}`);
};

for (const backend of BACKENDS) {
  describe(`API on the ${backend.name} backend`, () => {
    let limiter;
    let lines;
    before(async () => {
      ({ limiter, lines } = await limiterOn(backend));
    });

    test('backend chosen at first use, visible as a property and one log line', async () => {
      assert.equal(limiter.backend, null);
      await limiter.peek(fresh('first'), 1, 1);
      assert.equal(limiter.backend, backend.expect);
      await limiter.peek(fresh('second'), 1, 1);
      const choices = lines.filter(([, m]) => m.startsWith('redis-tb backend:'));
      assert.equal(choices.length, 1, JSON.stringify(lines));
      assert.match(choices[0][1], new RegExp(`^redis-tb backend: ${backend.expect} \\(`));
      // A Lua fallback that auto chose is a warning, as in Python and Rust (issue 26, item 6).
      const fallback = backend.option === 'auto' && backend.expect !== 'module';
      assert.equal(choices[0][0], fallback ? 'warn' : 'info');
    });

    test('take, peek, refund: the reply as a Decision', async () => {
      const key = fresh('bucket');
      let d = await limiter.take(key, 10, RATE, 3);
      assert.deepEqual({ ...d }, {
        allowed: true, remaining: 7, retryAfterMs: 0, resetAfterMs: 3_000_000, index: null,
        capacity: 10, rate: RATE, policy: 'default', source: 'server',
      });
      d = await limiter.peek(key, 10, RATE);
      assert.equal(d.allowed, true);
      assert.equal(d.remaining, 6);
      near(d.resetAfterMs, 4_000_000, 'peek reset');
      d = await limiter.peek(key, 10, RATE, 8);
      assert.equal(d.allowed, false);
      d = await limiter.take(key, 10, RATE, 8, { name: 'api' });
      assert.equal(d.allowed, false);
      assert.equal(d.remaining, 7);
      assert.equal(d.policy, 'api');
      near(d.retryAfterMs, 1_000_000, 'retry');
      near(d.resetAfterMs, 3_000_000, 'reset');
      assert.deepEqual(d.headers(), {
        'RateLimit-Policy': '"api";q=10;w=10000',
        RateLimit: '"api";r=7;t=3000',
        'Retry-After': '1000',
      });
      d = await limiter.take(key, 10, RATE, 11);
      assert.equal(d.allowed, false);
      assert.equal(d.retryAfterMs, -1);
      assert.equal(d.headers()['Retry-After'], undefined);
      d = await limiter.refund(key, 10, RATE, 2);
      assert.equal(d.allowed, true);
      assert.equal(d.remaining, 9);
      assert.equal(d.retryAfterMs, 0);
      near(d.resetAfterMs, 1_000_000, 'reset after refund');
      d = await limiter.take(key, 10, RATE);
      assert.equal(d.remaining, 8);
    });

    test('fractional capacity, rate and n', async () => {
      const key = fresh('fraction');
      let d = await limiter.take(key, 2.5, RATE, 0.5);
      assert.deepEqual([d.allowed, d.remaining, d.retryAfterMs, d.resetAfterMs], [true, 2, 0, 500_000]);
      d = await limiter.take(key, 2.5, RATE, 1.75);
      assert.deepEqual([d.allowed, d.remaining, d.retryAfterMs], [true, 0, 0]);
      near(d.resetAfterMs, 2_250_000, 'reset');
      assert.equal(d.headers()['RateLimit-Policy'], '"default";q=2;w=2500');
      d = await limiter.take(key, 2.5, RATE, 1e-7);
      assert.equal(d.allowed, true);
    });

    test('takeAll: all or nothing, the deciding limit and its index', async () => {
      const user = fresh('user');
      const limits = [new Limit(`{${user}}:sec`, 5, RATE, 1, 'sec'), new Limit(`{${user}}:day`, 3, RATE, 1, 'day')];
      let d = await limiter.takeAll(limits);
      assert.deepEqual([d.allowed, d.remaining, d.retryAfterMs, d.resetAfterMs, d.index], [true, 2, 0, 1_000_000, 1]);
      assert.equal(d.policy, 'day');
      assert.equal(d.capacity, 3);
      assert.deepEqual(d.headers(), {
        'RateLimit-Policy': '"sec";q=5;w=5000, "day";q=3;w=3000',
        RateLimit: '"day";r=2;t=1000',
      });
      await limiter.takeAll(limits);
      await limiter.takeAll(limits);
      d = await limiter.takeAll(limits);
      assert.equal(d.allowed, false);
      assert.equal(d.index, 1);
      assert.equal(d.remaining, 0);
      near(d.retryAfterMs, 1_000_000, 'retry');
      assert.equal(d.headers().RateLimit.startsWith('"day";r=0;t='), true);
      assert.equal(d.headers()['Retry-After'], '1000');
      // The denial took nothing from the other bucket: 5 - 3 left.
      assert.equal((await limiter.peek(`{${user}}:sec`, 5, RATE)).remaining, 1);
      // Plain objects work too; unnamed limits are limit0, limit1, ...
      d = await limiter.takeAll([{ key: `{${user}}:x`, capacity: 4, rate: RATE }, { key: `{${user}}:y`, capacity: 9, rate: RATE, n: 2 }]);
      assert.deepEqual([d.allowed, d.remaining, d.index, d.policy], [true, 3, 0, 'limit0']);
      assert.equal(d.headers()['RateLimit-Policy'], '"limit0";q=4;w=4000, "limit1";q=9;w=9000');
    });

    test('server errors: the server\'s texts as LimiterReplyError (kind "server")', async () => {
      const key = fresh('errors');
      const expectServer = async (promise, message) => {
        await assert.rejects(promise, (err) => {
          assert.ok(err instanceof LimiterReplyError && err instanceof LimiterError, String(err));
          assert.equal(err.kind, 'server');
          assert.equal(err.message, message);
          return true;
        });
      };
      await expectServer(limiter.takeAll([{ key: `{${key}}a`, capacity: 1, rate: 1 }, { key: `{${key}}a`, capacity: 1, rate: 1 }]),
        'ERR each key may appear only once in TB.TAKEALL');
      const r = admin(servers[backend.server].port);
      try {
        await r.set(`${key}:string`, 'x');
      } finally {
        r.disconnect();
      }
      await expectServer(limiter.take(`${key}:string`, 10, 1), 'WRONGTYPE Operation against a key holding the wrong kind of value');
    });

    test('numbers the server would refuse are refused before sending: 0, negative, above 2^53 (issue 18, item 4)', async () => {
      const key = fresh('range');
      for (const [capacity, rate, n] of [[0, 1, 1], [-5, 1, 1], [10, 0, 1], [10, -1, 1], [10, 1, -1], [2 ** 54, 1, 1], [1e30, 1, 1], [10, 1, 1e30]]) {
        await assert.rejects(limiter.take(key, capacity, rate, n), (err) => err instanceof InvalidArgument && err.kind === 'argument',
          `${capacity} ${rate} ${n}`);
      }
      await assert.rejects(limiter.takeAll([{ key: `{${key}}a`, capacity: 1, rate: 1, n: 1e30 }]), (err) => err instanceof InvalidArgument);
      const r = admin(servers[backend.server].port);
      try {
        assert.equal(await r.exists(key), 0);
      } finally {
        r.disconnect();
      }
    });

    test('NaN, Infinity and non-numbers are refused before sending (kind "argument")', async () => {
      const key = fresh('args');
      for (const [capacity, rate, n] of [[NaN, 1, 1], [10, Infinity, 1], [10, 1, -Infinity], ['10', 1, 1], [10, 1, null]]) {
        await assert.rejects(limiter.take(key, capacity, rate, n), (err) => err instanceof InvalidArgument && err.kind === 'argument');
      }
      await assert.rejects(limiter.take('', 1, 1), (err) => err.kind === 'argument');
      await assert.rejects(limiter.takeAll([]), (err) => err.kind === 'argument');
      for (const name of ['', 'zürich', 'a\nb', 42]) {
        await assert.rejects(limiter.take(key, 1, 1, 1, { name }), (err) => err instanceof InvalidArgument, String(name));
      }
      await assert.rejects(limiter.waitTake(key, 1, 1, 1, { timeoutMs: -1 }), (err) => err.kind === 'argument');
      await assert.rejects(limiter.waitTake(key, 1, 1, 1, { timeoutMs: NaN }), (err) => err.kind === 'argument');
      await assert.rejects(limiter.waitTake(key, 1, 1, 1), (err) => err.kind === 'argument');
      const r = admin(servers[backend.server].port);
      try {
        assert.equal(await r.exists(key), 0);
      } finally {
        r.disconnect();
      }
    });

    test('the client\'s keyPrefix applies to the buckets, as for any ioredis command', async () => {
      const { limiter: prefixedLimiter } = await limiterOn(backend, { client: { keyPrefix: 'app:' } });
      const key = fresh('prefixed');
      await prefixedLimiter.take(key, 10, RATE, 4);
      await prefixedLimiter.takeAll([{ key: `{${key}}:a`, capacity: 10, rate: RATE }]);
      const r = admin(servers[backend.server].port);
      try {
        assert.equal(await r.hget(`app:${key}`, 'tokens'), '6');
        assert.equal(await r.exists(key), 0);
        assert.equal(await r.hget(`app:{${key}}:a`, 'tokens'), '9');
      } finally {
        r.disconnect();
      }
    });
  });
}

test('the fallback recovers from FUNCTION FLUSH and SCRIPT FLUSH (reload, retry once)', async () => {
  const fn = (await limiterOn(BACKENDS[1])).limiter;
  const script = (await limiterOn(BACKENDS[2])).limiter;
  const key = fresh('flush');
  await fn.take(key, 10, RATE);
  await script.take(key, 10, RATE);
  const r = admin(servers.plain.port);
  try {
    await r.call('function', 'flush');
    await r.call('script', 'flush');
    assert.equal((await fn.take(key, 10, RATE)).remaining, 7);
    assert.equal((await script.take(key, 10, RATE)).remaining, 6);
    assert.equal(await r.call('script', 'exists', luaSource().sha).then((x) => x[0]), 1);
  } finally {
    r.disconnect();
  }
});

test('the same calls give the same Decisions and headers on every backend', async () => {
  const limiters = await Promise.all(BACKENDS.map(async (b) => (await limiterOn(b)).limiter));
  // Each backend on keys of its own (two of them share a server), same names otherwise.
  const ids = BACKENDS.map((b) => fresh(`same-${b.name}`));
  const steps = [
    (l, id) => l.take(`${id}:a`, 10, RATE, 4),
    (l, id) => l.take(`${id}:a`, 10, RATE, 4),
    (l, id) => l.take(`${id}:a`, 10, RATE, 4),
    (l, id) => l.peek(`${id}:a`, 10, RATE, 2),
    (l, id) => l.take(`${id}:a`, 10, RATE, 20),
    (l, id) => l.refund(`${id}:a`, 10, RATE, 5),
    (l, id) => l.take(`${id}:b`, 0.5, RATE, 0.25),
    (l, id) => l.take(`${id}:c`, 3, RATE, 0),
    (l, id) => l.takeAll([{ key: `{${id}}:1`, capacity: 2, rate: RATE, name: 's' }, { key: `{${id}}:2`, capacity: 5, rate: RATE, n: 3 }]),
    (l, id) => l.takeAll([{ key: `{${id}}:1`, capacity: 2, rate: RATE, name: 's' }, { key: `{${id}}:2`, capacity: 5, rate: RATE, n: 3 }]),
    (l, id) => l.takeAll([{ key: `{${id}}:1`, capacity: 2, rate: RATE, name: 's' }, { key: `{${id}}:2`, capacity: 5, rate: RATE, n: 3 }]),
  ];
  for (const [i, step] of steps.entries()) {
    const results = await Promise.all(limiters.map((l, j) => step(l, ids[j])));
    const [first, ...rest] = results;
    for (const [j, other] of rest.entries()) {
      const what = `step ${i}, ${BACKENDS[j + 1].name} vs module`;
      assert.equal(other.allowed, first.allowed, what);
      assert.equal(other.remaining, first.remaining, what);
      assert.equal(other.index, first.index, what);
      assert.equal(other.policy, first.policy, what);
      assert.ok(Math.abs(other.retryAfterMs - first.retryAfterMs) < 2000, `${what}: retry ${other.retryAfterMs} vs ${first.retryAfterMs}`);
      assert.ok(Math.abs(other.resetAfterMs - first.resetAfterMs) < 2000, `${what}: reset ${other.resetAfterMs} vs ${first.resetAfterMs}`);
      assert.deepEqual(other.headers(), first.headers(), what);
    }
  }
});

test('peek is FCALL_RO on the function backend, so it may run on a replica (docs/clients.md)', async () => {
  const { limiter } = await limiterOn(BACKENDS[1]);
  const r = admin(servers.plain.port);
  try {
    await limiter.connect();
    await r.call('config', 'resetstat');
    await limiter.peek(fresh('ro'), 5, RATE);
    const stats = await r.info('commandstats');
    assert.match(stats, /cmdstat_fcall_ro:calls=1,/);
    assert.doesNotMatch(stats, /cmdstat_fcall:/);
  } finally {
    r.disconnect();
  }
});

test('backend option is checked', () => {
  assert.throws(() => new RateLimiter({ sendCommand() {} }, { backend: 'lua' }), (err) => err.kind === 'argument');
  assert.throws(() => new RateLimiter(null), (err) => err.kind === 'argument');
});
