'use strict';

// "The same behaviour in all three" (docs/clients.md; issue 26, items 5 and 6) through real
// HTTP: the default key of an IPv4 client on a dual-stack listener, in-flight checked before
// rate, and a limiter bug answered 500 application/problem+json without a stack trace, with
// the frameworks' own error handling (no handler of the application's).

const assert = require('node:assert/strict');
const { once } = require('node:events');
const { before, test } = require('node:test');
const { setTimeout: sleep } = require('node:timers/promises');
const express = require('express');
const Fastify = require('fastify');
const { RateLimiter, bucketKey, createClient, expressRateLimit, fastifyRateLimit } = require('..');
const { startServer, admin } = require('./servers');
const { untilTheEnd } = require('./helpers');

const { clients, closers } = untilTheEnd();
let server;
let limiter;
let lines;

before(async () => {
  server = await startServer({ module: true });
  const client = createClient(server.url);
  clients.push(client);
  await once(client, 'ready');
  lines = [];
  limiter = new RateLimiter(client, { logger: (level, message) => lines.push({ level, message }) });
  await limiter.connect();
});

function gate() {
  let open;
  const promise = new Promise((resolve) => {
    open = resolve;
  });
  return { promise, open };
}

// GET / and GET /slow (held until the gate opens) behind the middleware, on `host`.
const FRAMEWORKS = {
  async express(options, g, host = '127.0.0.1') {
    const app = express();
    app.use(expressRateLimit(options));
    app.get('/', (req, res) => res.send('hello'));
    app.get('/slow', async (req, res) => {
      await g.promise;
      res.send('slow');
    });
    const http = app.listen(0, host);
    await once(http, 'listening');
    const close = async () => {
      http.closeAllConnections();
      await new Promise((resolve) => http.close(resolve));
    };
    closers.push(close);
    return `http://127.0.0.1:${http.address().port}`;
  },
  async fastify(options, g, host = '127.0.0.1') {
    const app = Fastify();
    await app.register(fastifyRateLimit, options);
    app.get('/', async () => 'hello');
    app.get('/slow', async () => {
      await g.promise;
      return 'slow';
    });
    await app.listen({ port: 0, host });
    closers.push(() => app.close());
    return `http://127.0.0.1:${app.server.address().port}`;
  },
};

async function bucketsUnder(prefix) {
  const r = admin(server.port);
  try {
    return (await r.keys(`${prefix}*`)).sort();
  } finally {
    r.disconnect();
  }
}

for (const [framework, serve] of Object.entries(FRAMEWORKS)) {
  test(`${framework}: an IPv4 client of a dual-stack listener is keyed by its IPv4 address (issue 26, item 6)`, async () => {
    const prefix = `${framework}-dual:`;
    const base = await serve({ limiter, capacity: 5, rate: 1, prefix }, gate(), '::');
    const res = await fetch(base);
    assert.equal(res.status, 200);
    await res.text();
    assert.deepEqual(await bucketsUnder(prefix), [`${prefix}{127.0.0.1}:default`]);
  });

  test(`${framework}: a request refused for concurrency spends no token; a rate denial releases its lease (issue 26, item 6)`, async () => {
    const prefix = `${framework}-order:`;
    const g = gate();
    const base = await serve({ limiter, prefix, key: () => 'bob', capacity: 3, rate: 0.001, concurrency: { limit: 1, leaseMs: 30_000 } }, g);
    const slow = fetch(`${base}/slow`);
    const r = admin(server.port);
    clients.push(r);
    const leases = bucketKey(prefix, 'bob', 'inflight');
    for (let i = 0; i < 100 && await r.zcard(leases) < 3; i++) {
      await sleep(10);
    }
    const refused = await fetch(base);
    assert.equal(refused.status, 429);
    assert.equal(refused.headers.get('ratelimit-policy'), '"default";q=3;w=3000, "inflight";q=1;qu="concurrent-requests"');
    assert.deepEqual((await refused.json())['violated-policies'], ['inflight']);
    // Only the slow request's token is spent.
    assert.equal((await limiter.peek(bucketKey(prefix, 'bob', 'default'), 3, 0.001, 0)).remaining, 2);
    g.open();
    await (await slow).text();
    for (const expected of [200, 200, 429]) {
      const res = await fetch(base);
      assert.equal(res.status, expected);
      await res.text();
    }
    // The rate denial took a lease and gave it back: only `seq` and `inc` are left.
    for (let i = 0; i < 100 && await r.zcard(leases) > 2; i++) {
      await sleep(10);
    }
    assert.equal(await r.zcard(leases), 2);
  });

  test(`${framework}: a limiter bug answers 500 application/problem+json, no stack trace (issue 26, item 5)`, async () => {
    const prefix = `${framework}-bug:`;
    const r = admin(server.port);
    try {
      await r.set(`${prefix}{127.0.0.1}:default`, 'not a bucket');
    } finally {
      r.disconnect();
    }
    const base = await serve({ limiter, capacity: 5, rate: 1, prefix }, gate());
    const res = await fetch(base);
    assert.equal(res.status, 500);
    assert.equal(res.headers.get('content-type'), 'application/problem+json');
    const text = await res.text();
    assert.doesNotMatch(text, /WRONGTYPE|\bat |<html|<pre/i);
    assert.deepEqual(JSON.parse(text), { title: 'Internal Server Error', status: 500, detail: 'The rate limiter failed.' });
    assert.ok(lines.some((l) => l.level === 'error' && /WRONGTYPE/.test(l.message)));
  });
}
