'use strict';

// Issue 26 against real servers: a dropped connection is not an outage (one retry after a
// restart), the local limiter while Redis is down (instances, logging, the probe, limits
// from Redis again when it is back), and the denial cache under a flood (counted with INFO
// commandstats) (docs/clients.md).

const assert = require('node:assert/strict');
const { once } = require('node:events');
const { test } = require('node:test');
const { setTimeout: sleep } = require('node:timers/promises');
const { RateLimiter, Limit, LimiterUnavailable, createClient } = require('..');
const { startServer, admin } = require('./servers');
const { HELLO, untilTheEnd } = require('./helpers');

const { clients, closers } = untilTheEnd();

async function limiterOn(server, options = {}, clientOptions = {}) {
  const client = createClient(server.url, clientOptions);
  clients.push(client);
  await once(client, 'ready');
  const lines = [];
  const limiter = new RateLimiter(client, { logger: (level, message) => lines.push({ level, message }), ...options });
  await limiter.connect();
  return { client, limiter, lines };
}

// A restart that outlasts ioredis's first reconnection (createClient's: 100 ms after the
// drop, as on a busy machine) is refused once: an outage by the failure rule, so the call
// after it fails at once. The restart tests are about the other case, a call that meets a
// connection that dropped and has not been retried yet: their client makes its first
// reconnection `firstRetry.ms` (1 s, longer than a restart here) after a drop, and their
// limiter's timeoutMs (5 s) waits for it.
function slowFirstRetry(firstRetry = { ms: 1000 }) {
  return { retryStrategy: (times) => (times === 1 ? firstRetry.ms : 100) };
}
const WAITS_FOR_THE_RETRY = { timeoutMs: 5000 };

// The server stopped and started again on its port, with the same module setting.
async function restarted(server) {
  await server.stop();
  return startServer({ module: server.withModule, port: server.port });
}

async function ready(client) {
  for (let i = 0; i < 500 && client.status !== 'ready'; i++) {
    await sleep(10);
  }
  assert.equal(client.status, 'ready');
}

async function calls(server, command) {
  const r = admin(server.port);
  try {
    const line = (await r.info('commandstats')).split('\r\n').find((l) => l.startsWith(`cmdstat_${command}:`));
    return line ? Number(/calls=(\d+)/.exec(line)[1]) : 0;
  } finally {
    r.disconnect();
  }
}

for (const module of [true, false]) {
  const where = module ? 'module' : 'function';
  test(`${where}: a server restarted between two calls: the second call succeeds (issue 26, item 3)`, async () => {
    let server = await startServer({ module });
    const { limiter } = await limiterOn(server, WAITS_FOR_THE_RETRY, slowFirstRetry());
    try {
      assert.equal((await limiter.take('restart', 5, 1)).allowed, true);
      server = await restarted(server);
      const d = await limiter.take('restart', 5, 1);
      assert.equal(d.allowed, true);
      assert.equal(d.source, 'server');
      server = await restarted(server);
      const all = await limiter.takeAll([new Limit('{r}:a', 5, 1), new Limit('{r}:b', 5, 1)]);
      assert.equal(all.allowed, true);
      server = await restarted(server);
      assert.equal((await limiter.acquire('restart:lease', 2, 10_000)).acquired, true);
      assert.equal(limiter.stats.unavailable, 0);
    } finally {
      await server.stop();
    }
  });
}

test('refund is not sent twice: after a restart it is unavailable; a stopped server is unavailable at once', async () => {
  let server = await startServer({ module: true });
  const firstRetry = { ms: 1000 };
  const { client, limiter } = await limiterOn(server, {}, slowFirstRetry(firstRetry));
  try {
    await limiter.take('norefund', 5, 1);
    server = await restarted(server);
    await assert.rejects(limiter.refund('norefund', 5, 1, 1), LimiterUnavailable);
    await assert.rejects(limiter.settle(new Limit('norefund', 5, 1), 2, 1), LimiterUnavailable);
    // Connected again, and reconnecting at once from now on: the stop is refused at once.
    await ready(client);
    firstRetry.ms = 100;
    await server.stop();
    const started = performance.now();
    await assert.rejects(limiter.take('norefund', 5, 1), LimiterUnavailable);
    await assert.rejects(limiter.take('norefund', 5, 1), LimiterUnavailable);
    assert.ok(performance.now() - started < 1000);
  } finally {
    await server.stop();
  }
});

test('a stopped server is unavailable at its refused reconnection, not after timeoutMs', async () => {
  const server = await startServer({ module: true });
  const { limiter } = await limiterOn(server, { timeoutMs: 5000 });
  try {
    await limiter.take('refused', 5, 1);
    await server.stop();
    const started = performance.now();
    await assert.rejects(limiter.take('refused', 5, 1), LimiterUnavailable);
    const waited = performance.now() - started;
    assert.ok(waited < 2500, `unavailable after ${Math.round(waited)} ms, not at the refusal`);
  } finally {
    await server.stop();
  }
});

test('the middleware after a restart: the first request is limited, not let through (issue 26, item 3)', async () => {
  let server = await startServer({ module: true });
  const { limiter, lines } = await limiterOn(server, WAITS_FOR_THE_RETRY, slowFirstRetry());
  const app = await HELLO.express({ limiter, capacity: 5, rate: 0.001, prefix: 'restart-mw:' });
  closers.push(app.close);
  try {
    assert.equal((await fetch(app.base)).headers.get('ratelimit'), '"default";r=4;t=1000');
    server = await restarted(server);
    const res = await fetch(app.base);
    assert.equal(res.status, 200);
    assert.equal(res.headers.get('ratelimit'), '"default";r=4;t=1000');
    assert.deepEqual(lines.filter((l) => l.level === 'warn'), []);
  } finally {
    await server.stop();
  }
});

for (const module of [true, false]) {
  test(`${module ? 'module' : 'function'}: the outage: 10 takes, server stopped, 100 takes with local and instances=2; Redis again when it is back`, async () => {
    let server = await startServer({ module });
    const capacity = 20;
    const rate = 2;
    const { client, limiter, lines } = await limiterOn(server, { onUnavailable: 'local', instances: 2, localProbeMs: 200 });
    try {
      for (let i = 0; i < 10; i++) {
        const d = await limiter.take('outage', capacity, rate);
        assert.equal(d.allowed, true);
        assert.equal(d.source, 'server');
      }
      await server.stop();
      const started = Date.now();
      let allowed = 0;
      for (let i = 0; i < 100; i++) {
        const d = await limiter.take('outage', capacity, rate);
        assert.equal(d.source, 'local');
        allowed += d.allowed ? 1 : 0;
      }
      const refill = Math.ceil(((Date.now() - started) / 1000) * (rate / 2));
      assert.ok(allowed >= capacity / 2 && allowed <= capacity / 2 + refill, `allowed ${allowed} (refill ${refill})`);
      const peeked = await limiter.peek('outage', capacity, rate);
      assert.equal(peeked.source, 'local');
      const all = await limiter.takeAll([new Limit('{o}:a', capacity, rate), new Limit('{o}:b', capacity, rate)]);
      assert.equal(all.source, 'local');
      assert.equal(all.allowed, true);
      // Not served locally: unavailable.
      await assert.rejects(limiter.refund('outage', capacity, rate, 1), LimiterUnavailable);
      await assert.rejects(limiter.charge(new Limit('outage', capacity, rate), 1), LimiterUnavailable);
      await assert.rejects(limiter.waitTake('outage', capacity, rate, 1, { timeoutMs: 100 }), LimiterUnavailable);
      await assert.rejects(limiter.acquire('outage:lease', 2, 1000), LimiterUnavailable);
      const outageLines = () => lines.filter((l) => /^redis-tb: Redis (?:un)?reachable/.test(l.message));
      const warned = outageLines();
      assert.ok(warned.every((l) => l.level === 'warn'));
      assert.equal(warned.length, 1, JSON.stringify(lines));
      assert.match(warned[0].message, /^redis-tb: Redis unreachable \(.+\); limiting in process at 1\/2 of each limit$/);

      server = await startServer({ module, port: server.port });
      await ready(client);
      await sleep(250); // past the probe interval
      const back = await limiter.take('outage', capacity, rate);
      assert.equal(back.source, 'server');
      assert.equal(back.remaining, capacity - 1); // the restarted server's bucket, not the local one
      const after = outageLines();
      assert.equal(after.length, 2, JSON.stringify(lines));
      assert.deepEqual(after[1], { level: 'warn', message: 'redis-tb: Redis reachable again; limits come from Redis' });
    } finally {
      await server.stop();
    }
  });
}

test('during an outage nothing is sent until the probe is due', async () => {
  const { limiter } = await limiterOn(await startServer({ module: true }), { onUnavailable: 'local', localProbeMs: 60_000 });
  // Every send of the limiter goes through _sendTo (the connection check, then the command).
  const sent = [];
  const sendTo = limiter._sendTo.bind(limiter);
  limiter._sendTo = (client, name, ...rest) => {
    sent.push(name);
    return sendTo(client, name, ...rest);
  };
  limiter.client.disconnect();
  await limiter.take('quiet', 5, 1);
  assert.equal(sent.length, 1);
  for (let i = 0; i < 50; i++) {
    assert.equal((await limiter.take('quiet', 5, 1)).source, 'local');
  }
  assert.equal(sent.length, 1);
});

test('the middleware with onUnavailable local: 429 from the local limiter while Redis is down', async () => {
  const server = await startServer({ module: true });
  const { limiter } = await limiterOn(server);
  const app = await HELLO.express({ limiter, capacity: 6, rate: 0.001, prefix: 'local-mw:', onUnavailable: 'local' });
  closers.push(app.close);
  await server.stop();
  const statuses = [];
  for (let i = 0; i < 8; i++) {
    const res = await fetch(app.base);
    statuses.push(res.status);
    await res.text();
  }
  assert.deepEqual(statuses, [200, 200, 200, 200, 200, 200, 429, 429]);
});

for (const module of [true, false]) {
  const where = module ? 'module' : 'function';
  test(`${where}: a flood of 10,000 takes by one id reaches the server at most once per retry window (cacheDenials, plus one)`, async () => {
    const server = await startServer({ module });
    const { limiter } = await limiterOn(server, { cacheDenials: true });
    const command = module ? 'tb.take' : 'fcall';
    try {
      // capacity 5 at 10 tokens/s: a token, so one take, every 100 ms; the 10,000 takes
      // are spread over about 12 of those windows.
      for (let i = 0; i < 5; i++) {
        assert.equal((await limiter.take('flood', 5, 10)).allowed, true);
      }
      const before = await calls(server, command);
      const started = Date.now();
      const sources = { server: 0, cache: 0, local: 0 };
      let allowed = 0;
      for (let i = 0; i < 10_000; i++) {
        if (i % 100 === 99) {
          await new Promise((resolve) => setTimeout(resolve, 10));
        }
        const d = await limiter.take('flood', 5, 10);
        sources[d.source] += 1;
        if (d.allowed) {
          // A window ended: the server granted a refilled token, and that take, which left
          // less than one, is remembered as the denial the next take would get.
          allowed += 1;
          continue;
        }
        assert.ok(d.retryAfterMs >= 1);
      }
      const windows = Math.ceil((Date.now() - started) / 100);
      const sent = (await calls(server, command)) - before;
      assert.ok(sent <= windows + 1, `${sent} calls in ${windows} windows`);
      assert.equal(sources.server, sent, JSON.stringify(sources));
      assert.ok(allowed >= windows - 2, `${allowed} allowed in ${windows} windows`);
      // A refund through this limiter drops the entry: the next take goes to the server.
      for (let i = 0; i < 3; i++) {
        await limiter.take('flood3', 3, 1);
      }
      await limiter.refund('flood3', 3, 1, 1);
      const d = await limiter.take('flood3', 3, 1);
      assert.equal(d.source, 'server');
      assert.equal(d.allowed, true);
      // It left less than one token: the next take of 1 is denied from the cache, and so is
      // a bigger one; a take of fewer tokens than that goes to the server.
      const next = await limiter.take('flood3', 3, 1);
      assert.deepEqual([next.allowed, next.source], [false, 'cache']);
      assert.equal((await limiter.take('flood3', 3, 1, 2)).source, 'cache');
      assert.equal((await limiter.take('flood3', 3, 1, 0.5)).source, 'server');
      // takeAll: a key held in the cache denies the call with its index.
      await limiter.take('{f}:b', 1, 0.001); // it leaves none: the next take is denied from the cache
      assert.equal((await limiter.take('{f}:b', 1, 0.001)).source, 'cache');
      const all = await limiter.takeAll([new Limit('{f}:a', 5, 1), new Limit('{f}:b', 1, 0.001)]);
      assert.deepEqual([all.allowed, all.source, all.index], [false, 'cache', 1]);
      // unblock drops it too.
      await limiter.unblock('{f}:b');
      assert.equal((await limiter.take('{f}:b', 1, 0.001)).source, 'server');
    } finally {
      await server.stop();
    }
  });
}
