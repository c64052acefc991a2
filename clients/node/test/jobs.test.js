'use strict';

// Reservations, charges, settling and lockout (docs/clients.md, "Reservations, charges and
// lockout") beyond the shared cases (clients/conformance/jobs.json): what Node adds, on every
// backend (the Lua ones once lua/tb.lua has tb_charge).

const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { after, before, describe, test } = require('node:test');
const { RateLimiter, Limit, InvalidArgument, createClient } = require('..');
const { BACKENDS, moduleAndPlainServers, untilTheEnd } = require('./helpers');

const LUA_HAS_JOBS = fs.readFileSync(path.join(__dirname, '..', 'tb.lua'), 'utf8').includes('tb_charge');
const servers = moduleAndPlainServers();
const limiters = [];
after(() => limiters.forEach((l) => l.close()));
const { clients } = untilTheEnd();

test('a Limit checks its lockout when created', () => {
  for (const bad of [{ blockMs: 0 }, { blockMs: 1.5 }, { blockMs: '5' }, { maxBlockMs: 5 },
    { blockMs: 10, maxBlockMs: 9 }, { blockMs: 2 ** 53 + 2 }]) {
    assert.throws(() => new Limit('k', 1, 1, 1, null, bad), InvalidArgument, JSON.stringify(bad));
  }
  const limit = new Limit('k', 1, 1, 1, 'x', { blockMs: 10, maxBlockMs: 40 });
  assert.equal(limit.blockMs, 10);
  assert.equal(limit.maxBlockMs, 40);
  assert.equal(new Limit('k', 1, 1).blockMs, null);
});

for (const backend of BACKENDS) {
  const skip = backend.name !== 'module' && !LUA_HAS_JOBS && 'lua/tb.lua has no tb_charge yet';
  describe(`reservations, charges and lockout on the ${backend.name} backend`, { skip }, () => {
    let limiter;
    before(async () => {
      const client = createClient(servers[backend.server].url);
      clients.push(client);
      await new Promise((resolve) => client.once('ready', resolve));
      limiter = new RateLimiter(client, { backend: backend.option, timeoutMs: 2000, logger: false });
      limiters.push(limiter);
      assert.equal(await limiter.connect(), backend.expect);
    });

    test('settle of equal amounts sends nothing', async () => {
      const sent = [];
      const real = limiter._sendOp.bind(limiter);
      limiter._sendOp = (...args) => { sent.push(args); return real(...args); };
      try {
        assert.equal(await limiter.settle(new Limit(`${backend.name}:s`, 5, 1), 3, 3), null);
        await assert.rejects(limiter.settle(new Limit(`${backend.name}:s`, 5, 1), 1, NaN), InvalidArgument);
        assert.deepEqual(sent, []);
      } finally {
        delete limiter._sendOp;
      }
    });

    test('a reservation says how long to wait; it has no Retry-After', async () => {
      const key = `${backend.name}:r`;
      assert.equal((await limiter.take(key, 1, 20)).allowed, true);
      const d = await limiter.take(key, 1, 20, 1, { maxWaitMs: 1000 });
      assert.equal(d.allowed, true);
      assert.ok(d.waitMs > 0 && d.waitMs <= 50 && d.waitMs === d.retryAfterMs, String(d.waitMs));
      assert.equal(d.headers()['Retry-After'], undefined);
    });

    test('takeLimit sends the limit\'s lockout; unblock takes a Limit or a key', async () => {
      const limit = new Limit(`${backend.name}:l`, 1, 0.001, 1, 'sec', { blockMs: 60_000 });
      assert.equal((await limiter.takeLimit(limit)).allowed, true);
      const d = await limiter.takeLimit(limit);
      assert.equal(d.allowed, false);
      assert.equal(d.policy, 'sec');
      assert.equal((await limiter.take(limit.key, 1, 1000, 0)).allowed, false);
      assert.equal(await limiter.unblock(limit), true);
      assert.equal(await limiter.unblock(limit.key), false);
      assert.equal(await limiter.unblock({ key: limit.key, capacity: 1, rate: 1 }), false);
      await assert.rejects(limiter.unblock(''), InvalidArgument);
    });

    test('charge into debt, then waitTake is one reservation and one sleep', async () => {
      const limit = new Limit(`${backend.name}:c`, 1, 10);
      const d = await limiter.charge(limit, 3, { maxDebt: 0.5 });
      assert.equal(d.allowed, true);
      assert.ok(d.waitMs > 0 && d.waitMs <= 50, String(d.waitMs));
      const started = performance.now();
      const waited = await limiter.waitTake(limit.key, 1, 10, 1, { timeoutMs: 5000 });
      const took = performance.now() - started;
      assert.equal(waited.allowed, true);
      assert.equal(waited.retryAfterMs, 0);
      assert.ok(took > 100 && took < 1000, String(took));
    });
  });
}
