'use strict';

// Moving from the Lua fallback to the module on the same keys loses nothing: a server
// without the module runs buckets down through the fallback, then MODULE LOAD, a new
// RateLimiter (auto -> module) continues from the exact remaining counts.

const assert = require('node:assert/strict');
const { once } = require('node:events');
const { after, test } = require('node:test');
const { RateLimiter, Limit, createClient } = require('..');
const { startServer, admin, modulePath, stopAll } = require('./servers');

const RATE = 0.001;
const clients = [];

after(async () => {
  clients.forEach((c) => c.disconnect());
  await stopAll();
});

for (const fallback of ['function', 'script']) {
  test(`${fallback} backend, then MODULE LOAD: the buckets continue exactly`, async () => {
    const server = await startServer();
    const client = createClient(server.url);
    clients.push(client);
    await once(client, 'ready');
    const before = new RateLimiter(client, { backend: fallback === 'script' ? 'script' : 'auto', timeoutMs: 2000, logger: false });
    for (let i = 0; i < 3; i++) {
      await before.take('bucket', 10, RATE, 2);
    }
    assert.equal(before.backend, fallback);
    const limits = [new Limit('{u}:sec', 4, RATE, 1, 'sec'), new Limit('{u}:day', 6, RATE, 1, 'day')];
    await before.takeAll(limits);
    assert.equal((await before.take('bucket', 10, RATE, 1)).remaining, 3);

    const r = admin(server.port);
    try {
      assert.equal(await r.call('module', 'load', modulePath()), 'OK');
    } finally {
      r.disconnect();
    }
    const after = new RateLimiter(client, { timeoutMs: 2000, logger: false });
    let d = await after.take('bucket', 10, RATE, 1);
    assert.equal(after.backend, 'module');
    assert.equal(d.remaining, 2);
    d = await after.takeAll(limits);
    assert.deepEqual([d.allowed, d.remaining, d.index], [true, 2, 0]);
    d = await after.take('bucket', 10, RATE, 3);
    assert.deepEqual([d.allowed, d.remaining], [false, 2]);
    assert.ok(d.retryAfterMs > 990_000, String(d.retryAfterMs));
    d = await after.waitTake('bucket', 10, RATE, 2, { timeoutMs: 100 });
    assert.deepEqual([d.allowed, d.remaining], [true, 0]);
    after.close();
    await server.stop();
  });
}
