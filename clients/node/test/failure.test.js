'use strict';

// The one failure rule (docs/clients.md): unavailable (fast, fail open or closed, logged once
// per outage, counted), the server changed (detect the backend again, retry once, move to
// Lua and back to the module), everything else a bug (the plain API throws, the middleware
// answers 500 and logs every time). Real servers restarted on their own port.

const assert = require('node:assert/strict');
const { spawnSync } = require('node:child_process');
const { once } = require('node:events');
const path = require('node:path');
const { test } = require('node:test');
const Redis = require('ioredis');
const {
  RateLimiter, LimiterUnavailable, LimiterReplyError, InvalidArgument, createClient, createClusterClient, expressRateLimit,
  fastifyRateLimit,
} = require('..');
const { admin, freePort, startCluster, startServer } = require('./servers');
const { HELLO, untilTheEnd } = require('./helpers');

const RATE = 0.001;
const { clients, closers } = untilTheEnd();

function client(url, options) {
  const c = createClient(url, options);
  clients.push(c);
  return c;
}

function logged() {
  const lines = [];
  const logger = (level, message) => lines.push({ level, message });
  return { lines, logger };
}

// The application's error handler (Express's own would answer 500 too, with a stack trace).
const onError = (err, req, res, next) => res.status(500).json({ error: err.name }); // eslint-disable-line no-unused-vars

// HELLO's apps, closed after the last test: (options) -> the app's base URL.
async function opened(app) {
  const { base, close } = await app;
  closers.push(close);
  return base;
}
const FRAMEWORKS = {
  express: (options) => opened(HELLO.express(options, onError)),
  fastify: (options) => opened(HELLO.fastify(options)),
};
const expressApp = FRAMEWORKS.express;

async function waitReady(c) {
  if (c.status !== 'ready') {
    await once(c, 'ready');
  }
}

test('the first take right after createClient() succeeds, without waiting for "ready" (issue 18, item 2)', async () => {
  const server = await startServer({ module: true });
  const limiter = new RateLimiter(client(server.url), { timeoutMs: 2000, logger: false });
  const d = await limiter.take('first', 5, RATE);
  assert.deepEqual([d.allowed, d.remaining], [true, 4]);
  await server.stop();
});

// On a busy machine the first connection and its ready check can take longer than one
// command's timeoutMs (the README's quick start, run under load, died of that); a call waits
// for a first connection in progress up to connectTimeoutMs. Here the server answers the
// ready check only after 500 ms.
test('the first take waits for a first connection slower than timeoutMs, up to connectTimeoutMs', async () => {
  const server = await startServer({ module: true });
  server.pause();
  const limiter = new RateLimiter(client(server.url, { commandTimeout: 10_000 }), { timeoutMs: 200, connectTimeoutMs: 5000, logger: false });
  const resumed = new Promise((resolve) => setTimeout(resolve, 500)).then(() => server.resume());
  try {
    const d = await limiter.take('slow-first', 5, RATE);
    assert.deepEqual([d.allowed, d.remaining], [true, 4]);
  } finally {
    await resumed;
    await server.stop();
  }
});

// Issue 35, also-fix 4: the README says createClient()'s client "can be used at once, before
// 'ready'"; the application's own first command failed ("Stream isn't writeable and
// enableOfflineQueue options is false") until a limiter call had waited for the connection.
test("the application's own first command right after createClient() succeeds, before 'ready'", async () => {
  const server = await startServer({ module: true });
  const c = client(server.url);
  assert.notEqual(c.status, 'ready');
  assert.equal(await c.set('cc', 1), 'OK');
  assert.equal(await c.get('cc'), '1');
  await server.stop();
});

test("the application's own first command right after createClusterClient() succeeds, before 'ready'", async () => {
  const cluster = await startCluster({ module: true });
  const c = createClusterClient(cluster.startup);
  clients.push(c);
  assert.notEqual(c.status, 'ready');
  assert.equal(await c.set('cc', 1), 'OK');
  assert.equal(await c.get('cc'), '1');
});

// The first connection's queue holds nothing past that attempt: a command sent while a
// server refuses connections fails when the attempt does, and once it failed, at once.
test("the application's first command on a server that refuses connections fails within the attempt, then at once", async () => {
  const port = await freePort();
  for (const c of [client(`redis://127.0.0.1:${port}`), createClusterClient([{ host: '127.0.0.1', port }])]) {
    clients.push(c);
    let started = performance.now();
    await assert.rejects(c.set('cc', 1));
    assert.ok(performance.now() - started < 1000, `the first command took ${(performance.now() - started).toFixed(0)} ms`);
    started = performance.now();
    await assert.rejects(c.set('cc', 1), /enableOfflineQueue options is false|Connection is closed/);
    assert.ok(performance.now() - started < 100, `the second command took ${(performance.now() - started).toFixed(0)} ms`);
  }
});

// Three takes on a server that refuses connections: each throws LimiterUnavailable well
// within the limiter's 2 s timeout.
async function refusedAtOnce(limiter) {
  for (let i = 0; i < 3; i++) {
    const started = performance.now();
    await assert.rejects(limiter.take('refused', 5, 1), LimiterUnavailable);
    const took = performance.now() - started;
    assert.ok(took < 500, `call ${i} took ${took.toFixed(0)} ms`);
  }
}

test('a refused connection fails at once, not after the timeout, even over a default ioredis client', async () => {
  const port = await freePort();
  const plain = new Redis({ port, host: '127.0.0.1', lazyConnect: true });
  plain.on('error', () => {});
  clients.push(plain);
  for (const c of [plain, client(`redis://127.0.0.1:${port}`)]) {
    const limiter = new RateLimiter(c, { timeoutMs: 2000, logger: false });
    await refusedAtOnce(limiter);
    assert.equal(limiter.stats.unavailable, 3);
  }
});

test('a cluster client whose nodes refuse connections fails at once too', async () => {
  const port = await freePort();
  const c = createClusterClient([{ host: '127.0.0.1', port }]);
  clients.push(c);
  await refusedAtOnce(new RateLimiter(c, { timeoutMs: 2000, logger: false }));
});

test('a limiter created while the server is down fails open, then limits once the server is up', async () => {
  const port = await freePort();
  const c = client(`redis://127.0.0.1:${port}`);
  const { lines, logger } = logged();
  const limiter = new RateLimiter(c, { logger });
  const base = await expressApp({ limiter, capacity: 2, rate: RATE, key: () => 'startup' });
  for (let i = 0; i < 3; i++) {
    const res = await fetch(base);
    assert.equal(res.status, 200);
    assert.equal(res.headers.get('ratelimit'), null);
  }
  assert.equal(lines.filter((l) => l.level === 'warn').length, 1, JSON.stringify(lines));
  await startServer({ module: true, port });
  await waitReady(c);
  const statuses = [];
  for (let i = 0; i < 3; i++) {
    statuses.push((await fetch(base)).status);
  }
  assert.deepEqual(statuses, [200, 200, 429]);
  assert.equal(limiter.backend, 'module');
  assert.ok(lines.some((l) => l.level === 'info' && /available again/.test(l.message)), JSON.stringify(lines));
});

test('the module goes away: the limiter goes on with the Lua backend, logs it, and keeps limiting (issue 18, item 3)', async () => {
  let server = await startServer({ module: true });
  const c = client(server.url);
  const { lines, logger } = logged();
  const limiter = new RateLimiter(c, { timeoutMs: 2000, logger, moduleRecheckMs: 200 });
  const base = await expressApp({ limiter, capacity: 3, rate: RATE, key: () => 'moved' });
  assert.equal((await fetch(base)).status, 200);
  assert.equal(limiter.backend, 'module');

  await server.stop();
  server = await startServer({ port: server.port });
  await waitReady(c);
  // The bucket went with the server; every call is limited on the Lua backend.
  const statuses = [];
  for (let i = 0; i < 4; i++) {
    const res = await fetch(base);
    statuses.push(res.status);
    assert.match(res.headers.get('ratelimit'), /^"default";r=\d+;t=\d+$/);
  }
  assert.deepEqual(statuses, [200, 200, 200, 429]);
  assert.equal(limiter.backend, 'function');
  const gone = lines.filter((l) => l.level === 'warn');
  assert.equal(gone.length, 1, JSON.stringify(lines));
  assert.match(gone[0].message, /the module is gone from the server; going on with the Lua backend: function/);
  assert.equal(limiter.stats.unavailable + limiter.stats.errors, 0);

  // And back: the module is looked for at most every moduleRecheckMs, and moved to.
  await server.stop();
  server = await startServer({ module: true, port: server.port });
  await waitReady(c);
  const r = admin(server.port);
  try {
    await r.hset('ratelimit:{moved}:default', 'tokens', '0', 'last_refill', String(Date.now()));
    await new Promise((resolve) => setTimeout(resolve, 250));
    assert.equal((await fetch(base)).status, 429);
    assert.equal(limiter.backend, 'module');
    assert.ok(lines.some((l) => l.level === 'info' && /the module is back on the server/.test(l.message)), JSON.stringify(lines));
  } finally {
    r.disconnect();
  }
  await server.stop();
});

test('a FUNCTION FLUSH is a server change: loaded again, the call retried once, nothing thrown', async () => {
  const server = await startServer();
  const limiter = new RateLimiter(client(server.url), { timeoutMs: 2000, logger: false });
  assert.equal((await limiter.take('flushed', 5, RATE)).remaining, 4);
  const r = admin(server.port);
  try {
    await r.call('function', 'flush');
    assert.equal((await limiter.take('flushed', 5, RATE)).remaining, 3);
    assert.equal(limiter.backend, 'function');
  } finally {
    r.disconnect();
  }
  await server.stop();
});

test('a forced module backend on a server without it: LimiterReplyError, not unavailable', async () => {
  const server = await startServer();
  const limiter = new RateLimiter(client(server.url), { backend: 'module', logger: false });
  await assert.rejects(limiter.take('forced', 5, RATE), (err) => err instanceof LimiterReplyError && /unknown command/.test(err.message));
  assert.equal(limiter.stats.errors, 1);
  await server.stop();
});

test('the middleware refuses invalid policies when it is created (issue 18, item 4)', async () => {
  const limiter = new RateLimiter(client('redis://127.0.0.1:1'), { logger: false });
  const bad = [
    { capacity: 0, rate: 1 }, { capacity: 5, rate: -1 }, { capacity: 1e30, rate: 1 }, { capacity: NaN, rate: 1 },
    { capacity: 5, rate: Infinity }, { capacity: 5, rate: 1, name: 'zürich' },
  ];
  for (const make of [expressRateLimit, (options) => fastifyRateLimit({ addHook() {} }, options)]) {
    for (const policy of bad) {
      await assert.rejects(async () => make({ limiter, ...policy }), InvalidArgument, JSON.stringify(policy));
      await assert.rejects(async () => make({ limiter, limits: [{ name: 'ok', capacity: 1, rate: 1 }, { name: 'bad', ...policy }] }),
        InvalidArgument, JSON.stringify(policy));
    }
  }
});

for (const [framework, makeApp] of Object.entries(FRAMEWORKS)) {
  test(`${framework}: a cost of 1e30 and a key holding a string answer 500 and are logged every time, never let through (issue 18, item 4)`, async () => {
    const server = await startServer({ module: true });
    const c = client(server.url);
    const { lines, logger } = logged();
    const limiter = new RateLimiter(c, { timeoutMs: 2000, logger });
    const costly = await makeApp({ limiter, capacity: 5, rate: 1, keyPrefix: `${framework}-cost:`, cost: () => 1e30 });
    const r = admin(server.port);
    try {
      await r.set(`${framework}-str:{127.0.0.1}:default`, 'not a bucket');
      await r.set(`${framework}-str:{::ffff:127.0.0.1}:default`, 'not a bucket');
    } finally {
      r.disconnect();
    }
    const wrongType = await makeApp({ limiter, capacity: 5, rate: 1, keyPrefix: `${framework}-str:` });
    for (const [base, text] of [[costly, /n must be a non-negative finite number/], [wrongType, /WRONGTYPE/]]) {
      for (let i = 0; i < 2; i++) {
        const res = await fetch(base);
        assert.equal(res.status, 500);
      }
      const errors = lines.filter((l) => l.level === 'error' && text.test(l.message));
      assert.equal(errors.length, 2, JSON.stringify(lines));
    }
    assert.equal(lines.filter((l) => l.level === 'warn').length, 0, 'a bug is not an outage');
    await server.stop();
  });
}

test('without a logger, an outage is printed to stderr (issue 18, item 12)', () => {
  const code = `
    const { RateLimiter, createClient, expressRateLimit } = require(${JSON.stringify(path.resolve(__dirname, '..'))});
    const client = createClient('redis://127.0.0.1:1');
    const limiter = new RateLimiter(client);
    const mw = expressRateLimit({ limiter, capacity: 5, rate: 1 });
    mw({ ip: '1.2.3.4' }, { setHeader() {} }, () => { client.disconnect(); });`;
  const child = spawnSync(process.execPath, ['-e', code], { encoding: 'utf8', timeout: 10_000 });
  assert.equal(child.status, 0, child.stderr);
  assert.match(child.stderr, /redis-tb: rate limiter unavailable, letting requests through/);
});

test('many calls during one connection attempt share one wait: no listener leak warning', async () => {
  const server = await startServer({ module: true });
  const warnings = [];
  const onWarning = (w) => warnings.push(w.name);
  process.on('warning', onWarning);
  try {
    // Forced backend: no detection to wait for, so all 50 sends meet the connection attempt.
    const limiter = new RateLimiter(client(server.url), { backend: 'module', timeoutMs: 2000, logger: false });
    const all = await Promise.all(Array.from({ length: 50 }, (_, i) => limiter.take(`many:${i}`, 5, RATE)));
    assert.ok(all.every((d) => d.allowed));
    await new Promise((resolve) => setImmediate(resolve));
    assert.deepEqual(warnings, []);
  } finally {
    process.off('warning', onWarning);
    await server.stop();
  }
});
