'use strict';

// Concurrency limits (docs/leases.md) on real servers, on every backend: acquire, release,
// renew, the LeaseGuard (Symbol.asyncDispose, withLease, renewal, lost), waitAcquire
// (TB.ACQUIRE with timeout_ms on the module, polling on Lua), fail-open with the server
// stopped, and the in-flight limit of the Express middleware and the Fastify plugin.

const assert = require('node:assert/strict');
const { once } = require('node:events');
const { setTimeout: sleep } = require('node:timers/promises');
const { before, describe, test } = require('node:test');
const express = require('express');
const Fastify = require('fastify');
const {
  RateLimiter, Lease, LeaseGuard, LeaseDenied, LeaseLost, InvalidArgument, LimiterReplyError, LimiterUnavailable,
  bucketKey, createClient, createClusterClient, expressRateLimit, fastifyRateLimit,
} = require('..');
const { keySlot } = require('../lib/core');
const { startCluster, startServer, admin } = require('./servers');
const { BACKENDS, moduleAndPlainServers, serveExpress, serveFastify, untilTheEnd } = require('./helpers');

const servers = moduleAndPlainServers();
const { clients } = untilTheEnd();

// `<ms>-<n>-<incarnation>` (docs/leases.md#lease-ids).
const ID = /^[0-9]+-[0-9]+-[0-9]+$/;
let counter = 0;
const fresh = (name) => `lt${++counter}:{${name}}`;
const POLICY = '"inflight";q=1;qu="concurrent-requests"';

async function limiterOn(url, options = {}) {
  const client = createClient(url);
  clients.push(client);
  await once(client, 'ready');
  const lines = [];
  const limiter = new RateLimiter(client, { timeoutMs: 2000, logger: (level, message) => lines.push([level, message]), ...options });
  return { limiter, client, lines };
}

for (const backend of BACKENDS) {
  describe(`leases on the ${backend.name} backend`, () => {
    let limiter;
    let client;
    let direct;
    before(async () => {
      ({ limiter, client } = await limiterOn(servers[backend.server].url, { backend: backend.option }));
      direct = admin(servers[backend.server].port);
      clients.push(direct);
      assert.equal(await limiter.connect(), backend.expect);
    });

    test('acquire up to the limit, then a denial with the wait', async () => {
      const key = fresh('a');
      const a = await limiter.acquire(key, 2, 30_000);
      const b = await limiter.acquire(key, 2, 30_000);
      const c = await limiter.acquire(key, 2, 30_000);
      assert.ok(a instanceof Lease && a.acquired && a.available === 1 && a.retryAfterMs === 0);
      assert.match(a.lease, ID);
      assert.equal(a.lease.split('-')[1], '1');
      assert.equal(b.lease.split('-')[1], '2');
      assert.ok(b.acquired && b.available === 0);
      assert.ok(!c.acquired && c.lease === null && c.available === 0 && !c.failedOpen);
      assert.ok(c.retryAfterMs > 29_000 && c.retryAfterMs <= 30_000, `${c.retryAfterMs}`);
      assert.deepEqual(c.headers(), { 'RateLimit-Policy': '"default";q=2;qu="concurrent-requests"', 'Retry-After': '30' });
      assert.deepEqual([c.key, c.limit, c.leaseMs, c.policy], [key, 2, 30_000, 'default']);
    });

    test('release frees a slot once; renew keeps only a live lease', async () => {
      const key = fresh('r');
      const a = await limiter.acquire(key, 1, 200);
      assert.equal((await limiter.acquire(key, 1, 200)).acquired, false);
      await sleep(100);
      assert.equal(await limiter.renew(key, a, 400), true);
      await sleep(200); // past the first deadline, inside the renewed one
      assert.equal((await limiter.acquire(key, 1, 200)).acquired, false);
      assert.equal(await limiter.release(key, a), true);
      assert.equal(await limiter.release(key, a.lease), false);
      assert.equal(await limiter.release(key, '123-456'), false);
      assert.equal(await limiter.release(key, null), false);
      assert.equal(await limiter.renew(key, a, 400), false);
      const b = await limiter.acquire(key, 1, 100);
      assert.ok(b.acquired && b.lease !== a.lease);
      await sleep(200); // ends by itself
      assert.equal((await limiter.acquire(key, 1, 100)).acquired, true);
    });

    test('arguments are checked before sending; server errors throw', async () => {
      for (const limit of [0, -1, 1.5, NaN, '2', 2 ** 54]) {
        await assert.rejects(limiter.acquire(fresh('x'), limit, 1000), InvalidArgument);
      }
      await assert.rejects(limiter.acquire(fresh('x'), 1, 0), InvalidArgument);
      await assert.rejects(limiter.renew(fresh('x'), '1-1', 0.5), InvalidArgument);
      await assert.rejects(limiter.release(fresh('x'), 42), InvalidArgument);
      await assert.rejects(limiter.waitAcquire(fresh('x'), 1, 1000, {}), InvalidArgument);
      const wrong = fresh('w');
      await direct.hset(wrong, 'tokens', '1');
      await assert.rejects(limiter.acquire(wrong, 1, 1000), (err) => err instanceof LimiterReplyError && /^WRONGTYPE/.test(err.message));
      const corrupt = fresh('z');
      await direct.zadd(corrupt, 1, 'x');
      await assert.rejects(limiter.acquire(corrupt, 1, 1000),
        (err) => err instanceof LimiterReplyError && err.message.startsWith('ERR corrupt lease set'));
    });

    test('a guard releases at the end of the block (asyncDispose) and when fn throws (withLease)', async () => {
      const key = fresh('g');
      const guard = await limiter.lease(key, 1, 30_000);
      assert.ok(guard instanceof LeaseGuard && ID.test(guard.lease) && !guard.lost && !guard.failedOpen);
      await assert.rejects(limiter.lease(key, 1, 30_000), (err) => err instanceof LeaseDenied && err.retryAfterMs > 29_000);
      await guard[Symbol.asyncDispose]();
      assert.equal(await guard.release(), false); // once only
      await assert.rejects(limiter.withLease(key, 1, 30_000, async (g) => {
        assert.match(g.lease, ID);
        throw new Error('the work failed');
      }), /the work failed/);
      assert.equal(await limiter.withLease(key, 1, 30_000, async () => 42), 42);
      assert.equal((await limiter.acquire(key, 1, 30_000)).acquired, true); // every slot came back
    });

    test('a guard stops renewing once released', async () => {
      const guard = await limiter.lease(fresh('stop'), 1, 150);
      await sleep(200);
      assert.equal(await guard.release(), true);
      const { renewals } = guard;
      assert.ok(renewals >= 1);
      await sleep(300);
      assert.equal(guard.renewals, renewals);
      assert.equal(guard.lost, false);
      await assert.rejects(limiter.lease(fresh('stop'), 1, 150, { renewEveryMs: -1 }), InvalidArgument);
    });

    test('a guard renews past leaseMs, and sees a lost lease', async () => {
      const key = fresh('k');
      await limiter.withLease(key, 1, 300, async (guard) => {
        await sleep(800);
        assert.equal((await limiter.acquire(key, 1, 300)).acquired, false);
        assert.ok(guard.renewals >= 3 && !guard.lost, `${guard.renewals}`);
        guard.check();
      });
      assert.equal((await limiter.acquire(fresh('k'), 1, 300)).acquired, true);
      const lostKey = fresh('lost');
      await limiter.withLease(lostKey, 1, 300, async (guard) => {
        await direct.del(lostKey);
        await sleep(250);
        assert.ok(guard.lost && guard.signal.aborted);
        assert.throws(() => guard.check(), LeaseLost);
      });
    });

    test('a flushed Lua backend is detected again and the call retried once', async () => {
      const key = fresh('flush');
      const flush = async () => {
        await direct.call('function', 'flush');
        await direct.call('script', 'flush');
      };
      const a = await limiter.acquire(key, 2, 30_000);
      await flush();
      const b = await limiter.acquire(key, 2, 30_000);
      assert.ok(a.acquired && b.acquired && b.available === 0);
      await flush();
      assert.equal(await limiter.release(key, a), true);
      await flush();
      assert.equal(await limiter.renew(key, b, 30_000), true);
      assert.equal(limiter.backend, backend.expect);
    });

    test('waitAcquire times out with a denial, and is woken by a release', async () => {
      const key = fresh('t');
      const holder = await limiter.acquire(key, 1, 60_000);
      let started = performance.now();
      const d = await limiter.waitAcquire(key, 1, 60_000, { timeoutMs: 300 });
      const took = performance.now() - started;
      assert.ok(!d.acquired && d.retryAfterMs > 59_000, `${d.retryAfterMs}`);
      assert.ok(took > 250 && took < 2500, `${took}`);
      const waiting = limiter.waitAcquire(key, 1, 60_000, { timeoutMs: 10_000 });
      await sleep(200);
      started = performance.now();
      assert.equal(await limiter.release(key, holder), true);
      const got = await waiting;
      assert.ok(got.acquired && performance.now() - started < 1000);
    });

    if (backend.name !== 'module') {
      test('a polling waitAcquire sleeps min(retryAfterMs, pollMs), at least 1 ms', async () => {
        const key = fresh('p');
        await limiter.acquire(key, 1, 300);
        const started = performance.now();
        const got = await limiter.waitAcquire(key, 1, 60_000, { timeoutMs: 5000, pollMs: 60_000 });
        const took = performance.now() - started;
        assert.ok(got.acquired && took > 250 && took < 2500, `${took}`); // retryAfterMs, not pollMs
        // Lua never denies with retryAfterMs 0 (a live lease ends after now), so the denials
        // are given 0 here: each is tried again after 1 ms, not after pollMs (then: 2 tries).
        // Each poll is _acquireOnce (acquire less the metrics' count: the wait counts once).
        const acquire = limiter._acquireOnce;
        let tries = 0;
        limiter._acquireOnce = async (...args) => {
          tries += 1;
          return Object.assign(await acquire.apply(limiter, args), { retryAfterMs: 0 });
        };
        try {
          const d = await limiter.waitAcquire(key, 1, 60_000, { timeoutMs: 300, pollMs: 60_000 });
          assert.ok(!d.acquired && tries >= 10, `${tries} tries`);
        } finally {
          delete limiter._acquireOnce;
        }
      });
    }

    if (backend.name === 'module') {
      test('waitAcquire is first come first served with the module', async () => {
        const key = fresh('fifo');
        const holder = await limiter.acquire(key, 1, 60_000);
        const order = [];
        const first = limiter.waitAcquire(key, 1, 60_000, { timeoutMs: 10_000 }).then((d) => order.push(['first', d]));
        await sleep(200);
        const second = limiter.waitAcquire(key, 1, 60_000, { timeoutMs: 10_000 }).then((d) => order.push(['second', d]));
        await sleep(200);
        assert.equal((await limiter.acquire(key, 1, 60_000)).acquired, false); // nobody jumps the queue
        await limiter.release(key, holder);
        await first;
        assert.deepEqual(order.map(([name]) => name), ['first']);
        assert.ok(order[0][1].acquired);
        await limiter.release(key, order[0][1]);
        await second;
        assert.ok(order[1][1].acquired);
      });
    }
  });
}

test('fail open with the server stopped: a Lease without an id, or LimiterUnavailable', async () => {
  const server = await startServer();
  const { limiter, lines } = await limiterOn(server.url, { timeoutMs: 200 });
  const key = fresh('o');
  assert.equal((await limiter.acquire(key, 1, 1000)).acquired, true);
  await server.stop();
  await assert.rejects(limiter.acquire(key, 1, 1000), LimiterUnavailable);
  const started = performance.now();
  const d = await limiter.acquire(key, 1, 1000, { failOpen: true });
  assert.ok(d.acquired && d.failedOpen && d.lease === null);
  assert.deepEqual(d.headers(), {});
  const w = await limiter.waitAcquire(key, 1, 1000, { timeoutMs: 5000, failOpen: true });
  assert.ok(w.acquired && w.failedOpen);
  assert.ok(performance.now() - started < 1000);
  assert.equal(await limiter.release(key, d), false);
  await assert.rejects(limiter.release(key, '1-1'), LimiterUnavailable);
  assert.equal(await limiter.withLease(key, 1, 1000, async (g) => g.failedOpen && g.lease === null, { failOpen: true }), true);
  await assert.rejects(limiter.withLease(key, 1, 1000, async () => 1), LimiterUnavailable);
  assert.ok(lines.every(([level]) => level !== 'error'));
});

test('a guard that cannot renew for leaseMs (server hung) counts its lease lost', async () => {
  const server = await startServer();
  const { limiter } = await limiterOn(server.url, { timeoutMs: 100 });
  const guard = await limiter.lease(fresh('hung'), 1, 400);
  server.pause();
  try {
    await sleep(1000);
    assert.ok(guard.lost && guard.error instanceof LimiterUnavailable);
    assert.throws(() => guard.check(), LeaseLost);
  } finally {
    server.resume();
  }
  await guard[Symbol.asyncDispose]();
  await server.stop();
});

test('a guard whose server went away ends without throwing (the lease ends by itself)', async () => {
  const server = await startServer();
  const { limiter, lines } = await limiterOn(server.url, { timeoutMs: 200 });
  const result = await limiter.withLease(fresh('gone'), 1, 1000, async () => {
    await server.stop();
    return 'done';
  });
  assert.equal(result, 'done');
  assert.ok(lines.some(([level, message]) => level === 'warn' && /ends at its deadline/.test(message)));
});

// --- middleware ----------------------------------------------------------------------

const FRAMEWORKS = {
  async express(options, gate) {
    const app = express();
    app.use(expressRateLimit(options));
    app.get('/', (req, res) => res.send('hello'));
    app.get('/slow', async (req, res) => {
      await gate.promise;
      res.send('slow');
    });
    app.get('/fail', () => {
      throw new Error('the app failed');
    });
    app.use((err, req, res, next) => res.status(500).send('failed')); // eslint-disable-line no-unused-vars
    return serveExpress(app);
  },
  async fastify(options, gate) {
    const app = Fastify();
    await app.register(fastifyRateLimit, options);
    app.get('/', async () => 'hello');
    app.get('/slow', async () => {
      await gate.promise;
      return 'slow';
    });
    app.get('/fail', async () => {
      throw new Error('the app failed');
    });
    return serveFastify(app);
  },
};

function gate() {
  let open;
  const promise = new Promise((resolve) => {
    open = resolve;
  });
  return { promise, open };
}

for (const [framework, make] of Object.entries(FRAMEWORKS)) {
  for (const backend of [BACKENDS[0], BACKENDS[1]]) {
    for (const status of [429, 503]) {
      test(`${framework}, ${backend.name}: in-flight limit answers ${status} with the concurrency headers`, async () => {
        const { limiter } = await limiterOn(servers[backend.server].url, { backend: backend.option });
        const keyPrefix = `${framework}${status}${backend.name}:`;
        const g = gate();
        const app = await make({ limiter, keyPrefix, key: () => 'alice', concurrency: { limit: 1, leaseMs: 30_000, status } }, g);
        try {
          const slow = fetch(`${app.base}/slow`);
          const direct = admin(servers[backend.server].port);
          clients.push(direct);
          const key = bucketKey(keyPrefix, 'alice', 'inflight');
          // `seq`, `inc` and the slow request's lease.
          for (let i = 0; i < 100 && await direct.zcard(key) < 3; i++) {
            await sleep(10);
          }
          const denied = await fetch(`${app.base}/`);
          assert.equal(denied.status, status);
          assert.equal(denied.headers.get('ratelimit-policy'), POLICY);
          assert.equal(denied.headers.get('retry-after'), '30');
          assert.equal(denied.headers.get('content-type'), 'application/problem+json');
          const body = await denied.json();
          assert.equal(body.status, status);
          assert.deepEqual(body['violated-policies'], ['inflight']);
          assert.match(body.detail, /retry in 30 s/);
          g.open();
          const done = await slow;
          assert.equal(done.status, 200);
          assert.equal(done.headers.get('ratelimit-policy'), POLICY);
          await done.text();
          assert.equal((await fetch(`${app.base}/fail`)).status, 500);
          for (let i = 0; i < 100 && await direct.zcard(key) > 2; i++) {
            await sleep(10);
          }
          assert.equal(await direct.zcard(key), 2); // only `seq` and `inc`: released after the response and the error
          const ok = await fetch(`${app.base}/`);
          assert.equal(ok.status, 200);
          await ok.text();
        } finally {
          g.open();
          await app.close();
        }
      });
    }
  }

  test(`${framework}: a rate limit and an in-flight limit together list both policies`, async () => {
    const { limiter } = await limiterOn(servers.module.url);
    const app = await make({ limiter, keyPrefix: `${framework}both:`, capacity: 5, rate: 0.001, concurrency: { limit: 2 } }, gate());
    try {
      const res = await fetch(`${app.base}/`);
      assert.equal(res.status, 200);
      assert.equal(res.headers.get('ratelimit-policy'), '"default";q=5;w=5000, "inflight";q=2;qu="concurrent-requests"');
      await res.text();
    } finally {
      await app.close();
    }
  });

  for (const failOpen of [true, false]) {
    test(`${framework}: with the server stopped the in-flight limit fails ${failOpen ? 'open' : 'closed'}`, async () => {
      const server = await startServer();
      const { limiter } = await limiterOn(server.url, { timeoutMs: 200 });
      const app = await make({ limiter, failOpen, concurrency: { limit: 1 } }, gate());
      try {
        assert.equal((await fetch(`${app.base}/`)).status, 200);
        await server.stop();
        const res = await fetch(`${app.base}/`);
        assert.equal(res.status, failOpen ? 200 : 503);
        assert.equal(res.headers.get('ratelimit-policy'), null);
        await res.text();
      } finally {
        await app.close();
      }
    });
  }
}

test('concurrency options are checked when the middleware is made', () => {
  const limiter = new RateLimiter(createClient('redis://127.0.0.1:1', { lazyConnect: true }), { logger: false });
  for (const concurrency of [{ limit: 0 }, { limit: 1, leaseMs: 0 }, { limit: 1, status: 500 }, { limit: 1.5 }]) {
    assert.throws(() => expressRateLimit({ limiter, concurrency }), InvalidArgument);
  }
  assert.throws(() => expressRateLimit({ limiter, capacity: 1, rate: 1, name: 'x', concurrency: { limit: 1, name: 'x' } }), InvalidArgument);
  assert.throws(() => expressRateLimit({ limiter }), InvalidArgument);
  limiter.client.disconnect();
});

// One id per master of a cluster (the slot ranges of servers.js).
function idsPerMaster() {
  const found = new Map();
  for (let i = 0; found.size < 3; i++) {
    const slot = keySlot(`tenant:${i}`);
    const node = slot <= 5460 ? 0 : slot <= 10922 ? 1 : 2;
    if (!found.has(node)) found.set(node, `tenant:${i}`);
  }
  return [...found.values()];
}

for (const module of [true, false]) {
  test(`cluster ${module ? 'with' : 'without'} the module: waitAcquire on every master is woken by a release`, async () => {
    const cluster = await startCluster({ module });
    const c = createClusterClient(cluster.startup);
    await once(c, 'ready');
    const limiter = new RateLimiter(c, { timeoutMs: 2000, logger: false });
    try {
      assert.equal(await limiter.connect(), module ? 'module' : 'function');
      for (const id of idsPerMaster()) {
        const key = bucketKey('rl:', id, 'inflight');
        const holder = await limiter.acquire(key, 1, 60_000);
        assert.ok(holder.acquired, id);
        const waiting = limiter.waitAcquire(key, 1, 60_000, { timeoutMs: 5000 });
        await sleep(200);
        assert.equal(await limiter.release(key, holder), true);
        const got = await waiting;
        assert.ok(got.acquired, `${id}: ${JSON.stringify(got)}`);
        await limiter.withLease(key, 2, 300, async (guard) => {
          await sleep(500);
          assert.ok(guard.renewals >= 1 && !guard.lost);
        });
      }
    } finally {
      limiter.close();
      c.disconnect();
      await cluster.stop();
    }
  }, { timeout: 60_000 });
}
