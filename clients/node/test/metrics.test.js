'use strict';

// The metrics (docs/clients.md, "Metrics") beyond clients/conformance/metrics.json (which
// conformance.test.js runs): what the middleware records when the limiter is unavailable
// (fail open: unavailable_allowed; fail closed: unavailable_denied; 'local': local), its
// in-flight leases, a lease guard that loses its lease, the global meter provider as the
// default (also one installed after the limiter was made), and a limiter without
// @opentelemetry/api installed (a child process that cannot resolve it): it works and records
// nothing.

const assert = require('node:assert/strict');
const { execFileSync } = require('node:child_process');
const { once } = require('node:events');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { before, test } = require('node:test');
const { metrics } = require('@opentelemetry/api');
const { RateLimiter, InvalidArgument, createClient } = require('..');
const { freePort, startServer } = require('./servers');
const { HELLO, untilTheEnd } = require('./helpers');
const { meterReader, points, checkMetrics } = require('./otel');

const { clients, closers } = untilTheEnd();
let server;

before(async () => {
  server = await startServer({ module: true });
});

// A limiter with a meter provider of its own: { limiter, collect }. `url`: default the server.
async function metered(url, options = {}) {
  const client = createClient(url ?? server.url);
  clients.push(client);
  const { meterProvider, collect } = meterReader();
  // Generous timeouts for a busy machine: nothing here measures one.
  const limiter = new RateLimiter(client, { timeoutMs: 5000, connectTimeoutMs: 10_000, logger: false, ...options, meterProvider });
  return { limiter, collect };
}

// A Redis that refuses connections: a loopback port just freed, nothing listening.
const unreachable = async () => `redis://127.0.0.1:${await freePort()}`;

async function serve(framework, options) {
  const app = await HELLO[framework](options);
  closers.push(app.close);
  return app.base;
}

const decisionPoint = (limit, outcome, source, value) => ({ attributes: { 'tb.limit': limit, 'tb.outcome': outcome, 'tb.source': source }, value });
const durationPoint = (limit, outcome, source, count) => ({ attributes: { 'tb.limit': limit, 'tb.outcome': outcome, 'tb.source': source }, count });

for (const framework of ['express', 'fastify']) {
  test(`${framework}: failing open records tb.decisions unavailable_allowed, allowed`, async () => {
    const { limiter, collect } = await metered(await unreachable());
    const base = await serve(framework, { limiter, capacity: 10, rate: 1, name: 'api', onUnavailable: 'open' });
    for (let i = 0; i < 2; i++) {
      assert.equal((await fetch(base)).status, 200);
    }
    checkMetrics(await collect(), {
      'tb.decisions': [decisionPoint('api', 'allowed', 'unavailable_allowed', 2)],
      'tb.decision.duration': [durationPoint('api', 'allowed', 'unavailable_allowed', 2)],
    }, framework);
  });

  test(`${framework}: failing closed records tb.decisions unavailable_denied, denied`, async () => {
    const { limiter, collect } = await metered(await unreachable());
    const base = await serve(framework, { limiter, capacity: 10, rate: 1, onUnavailable: 'closed' });
    assert.equal((await fetch(base)).status, 503);
    checkMetrics(await collect(), {
      'tb.decisions': [decisionPoint('default', 'denied', 'unavailable_denied', 1)],
      'tb.decision.duration': [durationPoint('default', 'denied', 'unavailable_denied', 1)],
    }, framework);
  });
}

test('onUnavailable local: the local limiter\'s decisions record local', async () => {
  const { limiter, collect } = await metered(await unreachable());
  const base = await serve('express', { limiter, capacity: 2, rate: 0.001, name: 'sec', onUnavailable: 'local' });
  const statuses = [];
  for (let i = 0; i < 3; i++) {
    statuses.push((await fetch(base)).status);
  }
  assert.deepEqual(statuses, [200, 200, 429]);
  checkMetrics(await collect(), {
    'tb.decisions': [decisionPoint('sec', 'allowed', 'local', 2), decisionPoint('sec', 'denied', 'local', 1)],
    'tb.decision.duration': [durationPoint('sec', 'allowed', 'local', 2), durationPoint('sec', 'denied', 'local', 1)],
  }, 'local');
});

test('several limits failing open: one decision, under the first limit\'s name', async () => {
  const { limiter, collect } = await metered(await unreachable());
  const base = await serve('express', { limiter, limits: [{ name: 'sec', capacity: 10, rate: 1 }, { name: 'day', capacity: 100, rate: 0.01 }] });
  assert.equal((await fetch(base)).status, 200);
  checkMetrics(await collect(), {
    'tb.decisions': [decisionPoint('sec', 'allowed', 'unavailable_allowed', 1)],
    'tb.decision.duration': [durationPoint('sec', 'allowed', 'unavailable_allowed', 1)],
  }, 'several');
});

test('the in-flight lease records tb.leases (acquired, denied), and its rate decision tb.decisions', async () => {
  const { limiter, collect } = await metered();
  // A slow route holds the one slot while a second request comes.
  let releaseSlow;
  const slow = new Promise((resolve) => { releaseSlow = resolve; });
  const express = require('express');
  const { expressRateLimit } = require('..');
  const { serveExpress } = require('./helpers');
  const app = express();
  app.use(expressRateLimit({ limiter, capacity: 10, rate: 1, key: () => 'inflight-metrics', concurrency: { limit: 1, name: 'jobs' } }));
  app.get('/', async (req, res) => {
    await slow;
    res.json({ ok: true });
  });
  const { base, close } = await serveExpress(app);
  closers.push(close);
  const first = fetch(base);
  // The first request holds its lease once the server counts one live.
  const key = 'ratelimit:{inflight-metrics}:jobs';
  for (let i = 0; i < 500 && Number(await limiter.client.call('zcard', key)) === 0; i++) {
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  assert.equal((await fetch(base)).status, 429);
  releaseSlow();
  assert.equal((await first).status, 200);
  const collected = await collect();
  checkMetrics(collected, {
    'tb.leases': [
      { attributes: { 'tb.limit': 'jobs', 'tb.outcome': 'acquired', 'tb.source': 'redis' }, value: 1 },
      { attributes: { 'tb.limit': 'jobs', 'tb.outcome': 'denied', 'tb.source': 'redis' }, value: 1 },
    ],
    'tb.decisions': [decisionPoint('default', 'allowed', 'redis', 1)],
    'tb.decision.duration': [durationPoint('default', 'allowed', 'redis', 1)],
  }, 'in-flight');
});

test('an in-flight lease failing open records tb.leases unavailable_allowed; failing closed unavailable_denied', async () => {
  for (const [mode, status, outcome, source] of [['open', 200, 'acquired', 'unavailable_allowed'], ['closed', 503, 'denied', 'unavailable_denied']]) {
    const { limiter, collect } = await metered(await unreachable());
    const base = await serve('express', { limiter, concurrency: { limit: 2 }, onUnavailable: mode });
    assert.equal((await fetch(base)).status, status, mode);
    checkMetrics(await collect(), {
      'tb.leases': [{ attributes: { 'tb.limit': 'inflight', 'tb.outcome': outcome, 'tb.source': source }, value: 1 }],
    }, mode);
  }
});

test('a lease guard that loses its lease records tb.leases lost', async () => {
  const { limiter, collect } = await metered();
  const guard = await limiter.lease('metrics:{guard}:jobs', 1, 60_000, { name: 'jobs', renewEveryMs: 50 });
  // The server forgets every lease of the key: the next renewal answers 0.
  await limiter.client.call('del', 'metrics:{guard}:jobs');
  if (!guard.lost) {
    await Promise.race([once(guard.signal, 'abort'), new Promise((resolve) => setTimeout(resolve, 30_000))]);
  }
  assert.equal(guard.lost, true);
  await guard.release();
  checkMetrics(await collect(), {
    'tb.leases': [
      { attributes: { 'tb.limit': 'jobs', 'tb.outcome': 'acquired', 'tb.source': 'redis' }, value: 1 },
      { attributes: { 'tb.limit': 'jobs', 'tb.outcome': 'lost', 'tb.source': 'redis' }, value: 1 },
    ],
  }, 'lost');
});

test('waitAcquire is one wait and one lease, however many polls (Lua backend)', async () => {
  const plain = await startServer();
  const { limiter, collect } = await metered(plain.url);
  const held = await limiter.acquire('metrics:{poll}', 1, 60_000, { name: 'slots' });
  const waited = await limiter.waitAcquire('metrics:{poll}', 1, 60_000, { name: 'slots', timeoutMs: 300, pollMs: 20 });
  assert.equal(waited.acquired, false);
  assert.equal(await limiter.release('metrics:{poll}', held), true);
  checkMetrics(await collect(), {
    'tb.leases': [
      { attributes: { 'tb.limit': 'slots', 'tb.outcome': 'acquired', 'tb.source': 'redis' }, value: 1 },
      { attributes: { 'tb.limit': 'slots', 'tb.outcome': 'denied', 'tb.source': 'redis' }, value: 1 },
    ],
    'tb.waits': [{ attributes: { 'tb.limit': 'slots', 'tb.outcome': 'denied' }, value: 1 }],
  }, 'waitAcquire');
  await plain.stop();
});

test('takeLimit is a decision; a take that raises is none', async () => {
  const { limiter, collect } = await metered();
  await limiter.takeLimit({ key: 'metrics:{limit}', capacity: 1, rate: 0.001, name: 'one' });
  await limiter.client.call('set', 'metrics:{wrong}', 'x');
  await assert.rejects(limiter.take('metrics:{wrong}', 1, 1, 1, { name: 'one' }));
  checkMetrics(await collect(), {
    'tb.decisions': [decisionPoint('one', 'allowed', 'redis', 1)],
    'tb.decision.duration': [durationPoint('one', 'allowed', 'redis', 1)],
  }, 'takeLimit');
});

test('meterProvider must be a MeterProvider', () => {
  const client = createClient(server.url, { lazyConnect: true });
  clients.push(client);
  for (const meterProvider of [null, 42, {}, { getMeter: 'no' }]) {
    assert.throws(() => new RateLimiter(client, { meterProvider }), InvalidArgument);
  }
});

test('by default the global meter provider, also one installed after the limiter was made', async () => {
  const client = createClient(server.url);
  clients.push(client);
  const limiter = new RateLimiter(client, { timeoutMs: 5000, logger: false });
  // Before any provider is installed the API's is a no-op: nothing to see, nothing breaks.
  await limiter.take('metrics:{global}', 5, 0.001, 1, { name: 'g' });
  const { meterProvider, collect } = meterReader();
  assert.equal(metrics.setGlobalMeterProvider(meterProvider), true);
  try {
    await limiter.take('metrics:{global}', 5, 0.001, 1, { name: 'g' });
    const collected = await collect();
    assert.deepEqual(points(collected, 'tb.decisions'), [
      { attributes: { 'tb.limit': 'g', 'tb.outcome': 'allowed', 'tb.source': 'redis' }, value: 1 },
    ]);
  } finally {
    metrics.disable();
  }
});

test('without @opentelemetry/api installed the limiter works and records nothing', async () => {
  // A child process in which requiring @opentelemetry/api fails, as when it is not installed.
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tb-node-no-otel-'));
  try {
    const preload = path.join(dir, 'no-otel.js');
    fs.writeFileSync(preload, `
      const Module = require('node:module');
      const resolve = Module._resolveFilename;
      Module._resolveFilename = function (request, ...rest) {
        if (request === '@opentelemetry/api' || request.startsWith('@opentelemetry/')) {
          const err = new Error("Cannot find module '" + request + "'");
          err.code = 'MODULE_NOT_FOUND';
          throw err;
        }
        return resolve.call(this, request, ...rest);
      };`);
    const code = `
      const fromPackage = require('node:module').createRequire(${JSON.stringify(path.join(__dirname, '..', 'package.json'))});
      const express = fromPackage('express');
      const { RateLimiter, createClient, expressRateLimit } = fromPackage('./');
      const assert = require('node:assert/strict');
      assert.throws(() => fromPackage('@opentelemetry/api'), /Cannot find module/);
      assert.throws(() => require('@opentelemetry/api'), /Cannot find module/);
      (async () => {
        const client = createClient(process.env.URL);
        const limiter = new RateLimiter(client, { timeoutMs: 5000, logger: false });
        assert.equal(limiter._metrics.enabled, false);
        const d = await limiter.take('no-otel', 1, 0.001, 1, { name: 'api' });
        const denied = await limiter.take('no-otel', 1, 0.001, 1, { name: 'api' });
        const waited = await limiter.waitTake('no-otel:w', 1, 0.001, 1, { timeoutMs: 5000 });
        const lease = await limiter.acquire('no-otel:l', 1, 60000);
        const guard = await limiter.lease('no-otel:g', 1, 60000, { renewEveryMs: 50 });
        await limiter.client.call('del', 'no-otel:g');
        await new Promise((resolve) => guard.signal.addEventListener('abort', resolve));
        const dead = new RateLimiter(createClient('redis://127.0.0.1:' + process.env.DEAD), { logger: false });
        const app = express();
        app.use(expressRateLimit({ limiter: dead, capacity: 5, rate: 1 }));
        app.get('/', (req, res) => res.json({ ok: true }));
        const http = app.listen(0, '127.0.0.1');
        await new Promise((resolve) => http.once('listening', resolve));
        const status = (await fetch('http://127.0.0.1:' + http.address().port + '/')).status;
        http.closeAllConnections();
        http.close();
        console.log(JSON.stringify({ allowed: d.allowed, denied: denied.allowed, waited: waited.allowed, lease: lease.acquired, lost: guard.lost, status }));
        limiter.close();
        client.disconnect();
        dead.client.disconnect();
      })().catch((err) => { console.error(err); process.exit(1); });`;
    const out = execFileSync(process.execPath, ['--require', preload, '-e', code], {
      cwd: dir, encoding: 'utf8', env: { ...process.env, URL: server.url, DEAD: String(await freePort()) }, timeout: 60_000,
    });
    assert.deepEqual(JSON.parse(out.trim().split('\n').pop()),
      { allowed: true, denied: false, waited: true, lease: true, lost: true, status: 200 });
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
