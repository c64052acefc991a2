// The Express example over HTTP on 127.0.0.1, against a real redis-server
// with the redis-tb module; then with that server stopped (fail-open).
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { after, before, test } from 'node:test';
import { createApp } from '../app.js';
import { createRedis, take } from '../ratelimit.js';
import { startRedisServer } from './redis-server.js';

let redisServer;
let redis;
let http;
let base;
const warnings = [];
const logger = { warn: (msg) => warnings.push(msg) };

before(async () => {
  redisServer = await startRedisServer();
  // disconnectTimeout: after the server is gone, ioredis would otherwise keep
  // the process alive for its default 2 s when disconnect() is called.
  redis = createRedis(redisServer.url, { disconnectTimeout: 100 });
  await once(redis, 'ready');
  http = createApp({ redis, capacity: 5, rate: 1, logger }).listen(0, '127.0.0.1');
  await once(http, 'listening');
  base = `http://127.0.0.1:${http.address().port}`;
}, { timeout: 20_000 });

after(async () => {
  if (http) {
    http.closeAllConnections();
    await new Promise((resolve) => http.close(resolve));
  }
  redis?.disconnect();
  await redisServer?.stop();
}, { timeout: 20_000 });

test('take() returns the module reply', { timeout: 10_000 }, async () => {
  assert.deepEqual(await take(redis, 'rl:take', 3, 1, 2), {
    allowed: true, remaining: 1, retryAfterMs: 0, resetAfterMs: 2000,
  });
  const denied = await take(redis, 'rl:take', 3, 1, 2);
  assert.equal(denied.allowed, false);
  assert.ok(denied.retryAfterMs > 0 && denied.retryAfterMs <= 1000, JSON.stringify(denied));
  assert.equal((await take(redis, 'rl:take', 3, 1, 4)).retryAfterMs, -1);
  await assert.rejects(take(redis, 'rl:take', 3, 0, 1), /rate must be a positive finite number/);
});

test('a burst of 5 gets 200s, the 6th a 429 with Retry-After', { timeout: 10_000 }, async () => {
  for (let remaining = 4; remaining >= 0; remaining--) {
    const res = await fetch(base);
    assert.equal(res.status, 200);
    assert.deepEqual(await res.json(), { hello: 'world' });
    assert.equal(res.headers.get('ratelimit-policy'), '5;w=5');
    assert.match(res.headers.get('ratelimit'), new RegExp(`^limit=5, remaining=${remaining}, reset=[1-5]$`));
    assert.equal(res.headers.get('retry-after'), null);
  }
  const res = await fetch(base);
  assert.equal(res.status, 429);
  assert.deepEqual(await res.json(), { error: 'rate limit exceeded' });
  assert.equal(res.headers.get('retry-after'), '1');
  assert.equal(res.headers.get('ratelimit'), 'limit=5, remaining=0, reset=5');
});

async function expectFailOpen() {
  for (let i = 0; i < 3; i++) {
    const started = performance.now();
    const res = await fetch(base);
    const took = performance.now() - started;
    assert.equal(res.status, 200);
    assert.deepEqual(await res.json(), { hello: 'world' });
    assert.equal(res.headers.get('ratelimit'), null);
    assert.ok(took < 1000, `request took ${took.toFixed(0)} ms`);
  }
}

test('with redis-server hung, requests succeed after the command timeout (fail-open)', { timeout: 10_000 }, async () => {
  redisServer.pause();
  try {
    await expectFailOpen();
  } finally {
    redisServer.resume();
  }
  assert.match(warnings[0], /failing open: Command timed out/);
});

test('with redis-server stopped, requests succeed at once (fail-open)', { timeout: 10_000 }, async () => {
  await redisServer.stop();
  assert.equal(redisServer.running, false);
  await expectFailOpen();
  // However many requests fail open, one warning per 10 s.
  assert.equal(warnings.length, 1, warnings.join('\n'));
});
