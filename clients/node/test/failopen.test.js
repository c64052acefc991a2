'use strict';

// Fail open, fast: with the server hung (SIGSTOP) and then stopped, requests pass without
// rate-limit headers in well under a second, and each outage is logged once (a warning
// when it starts, an info line when calls succeed again). failOpen: false answers 503.

const assert = require('node:assert/strict');
const { once } = require('node:events');
const { before, test } = require('node:test');
const Redis = require('ioredis');
const { RateLimiter, LimiterUnavailable, createClient } = require('..');
const { startServer } = require('./servers');
const { HELLO, untilTheEnd } = require('./helpers');

let server;
const { clients, closers } = untilTheEnd();
const apps = {};

// One app per framework and mode, each with its own limiter and log.
async function setup(name, framework, failOpen) {
  const client = createClient(server.url);
  clients.push(client);
  await once(client, 'ready');
  const log = [];
  const limiter = new RateLimiter(client, { logger: (level, message) => log.push({ level, message }) });
  await limiter.connect();
  const { base, close } = await HELLO[framework]({ limiter, capacity: 1000, rate: 1, failOpen });
  closers.push(close);
  apps[name] = { base, log, limiter, failOpen };
}

before(async () => {
  server = await startServer({ module: true });
  await setup('express', 'express', true);
  await setup('fastify', 'fastify', true);
  await setup('express-closed', 'express', false);
  await setup('fastify-closed', 'fastify', false);
});

const outageLines = (log) => log.filter((l) => l.level === 'warn' || /available again/.test(l.message));

async function expectPassing(name, count = 5) {
  const { base, failOpen } = apps[name];
  for (let i = 0; i < count; i++) {
    const started = performance.now();
    const res = await fetch(base);
    const took = performance.now() - started;
    assert.ok(took < 1000, `${name}: request took ${took.toFixed(0)} ms`);
    assert.equal(res.headers.get('ratelimit'), null);
    assert.equal(res.headers.get('ratelimit-policy'), null);
    if (failOpen) {
      assert.equal(res.status, 200);
      assert.deepEqual(await res.json(), { hello: 'world' });
    } else {
      assert.equal(res.status, 503);
      assert.equal(res.headers.get('content-type'), 'application/problem+json');
      assert.equal((await res.json()).status, 503);
    }
  }
}

async function expectLimited(name) {
  const res = await fetch(apps[name].base);
  assert.equal(res.status, 200);
  assert.match(res.headers.get('ratelimit'), /^"default";r=\d+;t=\d+$/);
}

test('healthy: every app limits', async () => {
  for (const name of Object.keys(apps)) {
    await expectLimited(name);
    assert.deepEqual(outageLines(apps[name].log), []);
  }
});

test('server hung (SIGSTOP): requests pass within the command timeout, one warning per outage', async () => {
  server.pause();
  try {
    for (const name of Object.keys(apps)) {
      await expectPassing(name);
    }
  } finally {
    server.resume();
  }
  for (const name of Object.keys(apps)) {
    const lines = outageLines(apps[name].log);
    assert.equal(lines.length, 1, JSON.stringify(lines));
    assert.equal(lines[0].level, 'warn');
    const action = apps[name].failOpen ? 'letting requests through' : 'answering 503';
    assert.equal(lines[0].message, `redis-tb: rate limiter unavailable, ${action}: Command timed out`);
  }
});

test('after the outage: limited again, and one info line says so', async () => {
  for (const name of Object.keys(apps)) {
    await expectLimited(name);
    await expectLimited(name);
    const lines = outageLines(apps[name].log);
    assert.equal(lines.length, 2, JSON.stringify(lines));
    assert.equal(lines[1].level, 'info');
    assert.equal(lines[1].message, 'redis-tb: rate limiter available again');
  }
});

test('the plain API throws LimiterUnavailable fast, even over a default ioredis client', async () => {
  // Offline queue on, 20 retries per request: the limiter's own per-call timeout still wins.
  const plain = new Redis(server.url);
  plain.on('error', () => {});
  clients.push(plain);
  await once(plain, 'ready');
  const limiter = new RateLimiter(plain, { timeoutMs: 150 });
  assert.equal((await limiter.take('plain', 5, 1)).allowed, true);
  server.pause();
  try {
    const started = performance.now();
    await assert.rejects(limiter.take('plain', 5, 1), (err) => err instanceof LimiterUnavailable && err.kind === 'unavailable');
    assert.ok(performance.now() - started < 1000);
  } finally {
    server.resume();
  }
});

test('a take that timed out while the server hung is still charged when it resumes (documented: README, docs/clients.md)', async () => {
  const client = createClient(server.url);
  clients.push(client);
  await once(client, 'ready');
  const limiter = new RateLimiter(client, { timeoutMs: 100, logger: false });
  const key = `charged-${Date.now()}`;
  assert.equal((await limiter.take(key, 5, 0.001)).remaining, 4);
  server.pause();
  try {
    await assert.rejects(limiter.take(key, 5, 0.001), LimiterUnavailable);
  } finally {
    server.resume();
  }
  const d = await limiter.peek(key, 5, 0.001, 0);
  assert.equal(d.remaining, 3, 'the timed-out take ran when the server resumed');
});

test('server stopped: requests pass at once, one more warning', async () => {
  await server.stop();
  for (const name of Object.keys(apps)) {
    await expectPassing(name, 10);
  }
  for (const name of Object.keys(apps)) {
    const lines = outageLines(apps[name].log);
    assert.equal(lines.length, 3, JSON.stringify(lines));
    assert.equal(lines[2].level, 'warn');
  }
  const started = performance.now();
  await assert.rejects(apps.express.limiter.take('k', 1, 1), (err) => err.kind === 'unavailable');
  await assert.rejects(apps.express.limiter.waitTake('k', 1, 1, 1, { timeoutMs: 5000 }), (err) => err.kind === 'unavailable');
  assert.ok(performance.now() - started < 2500);
});

test('no server at all: the first call (backend detection) fails as "unavailable", the middleware passes', async () => {
  const client = createClient(server.url);
  clients.push(client);
  const log = [];
  const limiter = new RateLimiter(client, { logger: (level, message) => log.push({ level, message }) });
  await assert.rejects(limiter.take('k', 1, 1), (err) => err.kind === 'unavailable');
  assert.equal(limiter.backend, null);
  const { base, close } = await HELLO.express({ limiter, capacity: 1, rate: 1 });
  closers.push(close);
  for (let i = 0; i < 3; i++) {
    assert.equal((await fetch(base)).status, 200);
  }
  assert.equal(log.filter((l) => l.level === 'warn').length, 1);
});
