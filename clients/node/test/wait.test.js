'use strict';

// waitTake: TB.BTAKE on the module backend (on connections of its own), one reservation and
// one sleep on the Lua backends. The observable results are the same.

const assert = require('node:assert/strict');
const { after, before, describe, test } = require('node:test');
const { setTimeout: sleep } = require('node:timers/promises');
const { RateLimiter, createClient } = require('..');
const { admin } = require('./servers');
const { BACKENDS, moduleAndPlainServers, untilTheEnd } = require('./helpers');

const servers = moduleAndPlainServers();
const limiters = [];
// Registered first, so it runs first: the limiters are closed before the clients go.
after(() => limiters.forEach((l) => l.close()));
const { clients } = untilTheEnd();

let counter = 0;
const fresh = (name) => `w${++counter}:${name}`;

for (const backend of BACKENDS) {
  describe(`waitTake on the ${backend.name} backend`, () => {
    let limiter;
    before(async () => {
      const client = createClient(servers[backend.server].url);
      clients.push(client);
      await new Promise((resolve) => client.once('ready', resolve));
      limiter = new RateLimiter(client, { backend: backend.option, timeoutMs: 2000, logger: false });
      limiters.push(limiter);
      await limiter.connect();
    });

    test('a waiter is served once a token is back (rate 20/s)', async () => {
      const key = fresh('fast');
      assert.equal((await limiter.take(key, 1, 20)).allowed, true);
      assert.equal((await limiter.take(key, 1, 20)).allowed, false);
      const started = performance.now();
      const d = await limiter.waitTake(key, 1, 20, 1, { timeoutMs: 5000 });
      const took = performance.now() - started;
      assert.equal(d.allowed, true, JSON.stringify(d));
      assert.equal(d.remaining, 0);
      assert.ok(took < 1000, `served after ${took.toFixed(0)} ms`);
    });

    test('a wait longer than the client\'s commandTimeout (200 ms) is not cut short by it', async () => {
      const key = fresh('longer');
      await limiter.take(key, 1, 2);
      const started = performance.now();
      const d = await limiter.waitTake(key, 1, 2, 1, { timeoutMs: 3000 });
      const took = performance.now() - started;
      assert.equal(d.allowed, true);
      assert.ok(took >= 300 && took < 2000, `served after ${took.toFixed(0)} ms`);
    });

    // Issue 35, also-fix 3: the Lua path answered its reservation's reset, counted from before
    // the wait (5500 ms here, RateLimit t=6), where TB.BTAKE answers at the grant (5000, t=5).
    test('a waiter\'s reset is counted from its grant, not from before its wait', async () => {
      const key = fresh('reset');
      assert.equal((await limiter.take(key, 10, 2, 10)).remaining, 0);
      const d = await limiter.waitTake(key, 10, 2, 1, { timeoutMs: 2000 });
      assert.deepEqual([d.allowed, d.remaining, d.retryAfterMs], [true, 0, 0]);
      assert.ok(d.resetAfterMs >= 4900 && d.resetAfterMs <= 5000, `resetAfterMs ${d.resetAfterMs}`);
      assert.equal(d.headers().RateLimit, '"default";r=0;t=5');
    });

    test('tokens there: granted at once', async () => {
      const started = performance.now();
      const d = await limiter.waitTake(fresh('full'), 5, 0.001, 2, { timeoutMs: 1000, name: 'w' });
      assert.deepEqual([d.allowed, d.remaining, d.retryAfterMs, d.policy], [true, 3, 0, 'w']);
      assert.ok(performance.now() - started < 500);
    });

    test('times out with a denial', async () => {
      const key = fresh('slow');
      await limiter.take(key, 1, 0.001);
      const started = performance.now();
      const d = await limiter.waitTake(key, 1, 0.001, 1, { timeoutMs: 300 });
      const took = performance.now() - started;
      assert.equal(d.allowed, false);
      assert.equal(d.remaining, 0);
      assert.ok(d.retryAfterMs > 990_000, String(d.retryAfterMs));
      assert.equal(d.headers()['Retry-After'], '1000');
      assert.ok(took >= 280 && took < 1500, `denied after ${took.toFixed(0)} ms`);
    });

    test('n above the capacity: denied at once with retry -1', async () => {
      const started = performance.now();
      const d = await limiter.waitTake(fresh('never'), 2, 1, 3, { timeoutMs: 2000 });
      assert.deepEqual([d.allowed, d.retryAfterMs], [false, -1]);
      assert.ok(performance.now() - started < 500);
    });

    test('timeoutMs 0 waits without limit', async () => {
      const key = fresh('nolimit');
      await limiter.take(key, 1, 20);
      const d = await limiter.waitTake(key, 1, 20, 1, { timeoutMs: 0 });
      assert.equal(d.allowed, true);
    });

    // Module only: a poller sleeps retry_after_ms, and does not see a refund before that.
    (backend.name === 'module' ? test : () => {})('timeoutMs 0 waits past the client\'s commandTimeout (200 ms) until a refund, 500 ms later (issue 18, item 7)', async () => {
      const key = fresh('refunded');
      await limiter.take(key, 1, 0.001);
      const waiting = limiter.waitTake(key, 1, 0.001, 1, { timeoutMs: 0 });
      await sleep(500);
      await limiter.refund(key, 1, 0.001, 1);
      const d = await waiting;
      assert.equal(d.allowed, true);
    });

    test('other calls are not held up by a waiter; concurrent waiters are all served', async () => {
      const slow = fresh('blocked');
      await limiter.take(slow, 1, 0.001);
      const waiting = limiter.waitTake(slow, 1, 0.001, 1, { timeoutMs: 800 });
      const started = performance.now();
      if (backend.name === 'module') {
        // The wait is the server's: a client blocked in TB.BTAKE.
        const r = admin(servers.module.port);
        try {
          let list = '';
          for (let i = 0; i < 50 && !list.includes('cmd=tb.btake'); i++) {
            list = await r.call('client', 'list');
          }
          assert.match(list, /cmd=tb\.btake/);
        } finally {
          r.disconnect();
        }
      }
      assert.equal((await limiter.take(fresh('other'), 5, 1)).allowed, true);
      assert.ok(performance.now() - started < 500, 'a take behind a waiter');
      const key = fresh('shared');
      await limiter.take(key, 1, 20);
      const all = await Promise.all([1, 2, 3].map(() => limiter.waitTake(key, 1, 20, 1, { timeoutMs: 5000 })));
      assert.deepEqual(all.map((d) => d.allowed), [true, true, true]);
      assert.equal((await waiting).allowed, false);
    });
  });
}

test('close() releases every connection the limiter opened: five waiting and the idle ones', async () => {
  const client = createClient(servers.module.url);
  clients.push(client);
  const limiter = new RateLimiter(client, { logger: false });
  const key = fresh('close');
  await limiter.take(key, 1, 0.001);
  const r = admin(servers.module.port);
  try {
    const count = async () => (await r.call('client', 'list')).split('\n').filter(Boolean).length;
    const before = await count();
    // Two waits served (their connections go idle, and are reused), five left waiting.
    await limiter.refund(key, 1, 0.001, 1);
    await Promise.all([limiter.waitTake(key, 1, 0.001, 0, { timeoutMs: 1000 }), limiter.waitTake(key, 1, 0.001, 0, { timeoutMs: 1000 })]);
    await limiter.take(key, 1, 0.001);
    const waits = [0, 1, 2, 3, 4].map(() => limiter.waitTake(key, 1, 0.001, 1, { timeoutMs: 10_000 }).catch((err) => err));
    // Generous deadlines: on a busy machine the five connections take a while to open.
    for (let i = 0; i < 1000 && (await count()) < before + 5; i++) {
      await sleep(10);
    }
    assert.ok((await count()) >= before + 5);
    limiter.close();
    for (const result of await Promise.all(waits)) {
      assert.equal(result.kind, 'unavailable');
    }
    // At most as many as before: the other tests of this process may close theirs meanwhile.
    for (let i = 0; i < 1000 && (await count()) > before; i++) {
      await sleep(10);
    }
    assert.ok((await count()) <= before);
  } finally {
    r.disconnect();
  }
});
