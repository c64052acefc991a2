'use strict';

// The Express middleware and the Fastify plugin through real HTTP requests on a free
// loopback port, on the module backend and on the Lua fallback.

const assert = require('node:assert/strict');
const { once } = require('node:events');
const { after, before, describe, test } = require('node:test');
const express = require('express');
const Fastify = require('fastify');
const { RateLimiter, createClient, expressRateLimit, fastifyRateLimit } = require('..');
const { moduleAndPlainServers, serveExpress, serveFastify, untilTheEnd } = require('./helpers');

const RATE = 0.001;
const servers = moduleAndPlainServers();
const { clients } = untilTheEnd();

let counter = 0;
const fresh = () => `m${++counter}`;

// A running app with the limiter in front of GET / (and an unlimited GET /free);
// `route` limits only GET /search (per-route use).
const FRAMEWORKS = {
  async express(options, { route = false } = {}) {
    const app = express();
    if (route) {
      app.get('/search', expressRateLimit(options), (req, res) => res.json({ search: true }));
      app.get('/free', (req, res) => res.json({ free: true }));
    } else {
      app.use(expressRateLimit(options));
      app.get('/', (req, res) => res.json({ hello: 'world' }));
    }
    return serveExpress(app);
  },
  async fastify(options, { route = false } = {}) {
    const app = Fastify();
    if (route) {
      await app.register(async (scoped) => {
        await scoped.register(fastifyRateLimit, options);
        scoped.get('/search', async () => ({ search: true }));
      });
      app.get('/free', async () => ({ free: true }));
    } else {
      await app.register(fastifyRateLimit, options);
      app.get('/', async () => ({ hello: 'world' }));
    }
    return serveFastify(app);
  },
};

const BACKENDS = [
  { name: 'module', server: 'module' },
  { name: 'function', server: 'plain' },
];

for (const backend of BACKENDS) {
  for (const [framework, start] of Object.entries(FRAMEWORKS)) {
    describe(`${framework} on the ${backend.name} backend`, () => {
      let limiter;
      const apps = [];
      const app = async (options, extra) => {
        const a = await start({ limiter, keyPrefix: `${fresh()}:`, ...options }, extra);
        apps.push(a);
        return a.base;
      };
      before(async () => {
        const client = createClient(servers[backend.server].url);
        clients.push(client);
        await once(client, 'ready');
        limiter = new RateLimiter(client, { timeoutMs: 2000, logger: false });
        assert.equal(await limiter.connect(), backend.name);
      });
      after(async () => {
        await Promise.all(apps.map((a) => a.close()));
      });

      test('allowed: passes through with RateLimit-Policy and RateLimit; then 429 problem+json', async () => {
        const base = await app({ capacity: 3, rate: RATE });
        for (const remaining of [2, 1, 0]) {
          const res = await fetch(base);
          assert.equal(res.status, 200);
          assert.deepEqual(await res.json(), { hello: 'world' });
          assert.equal(res.headers.get('ratelimit-policy'), '"default";q=3;w=3000');
          assert.equal(res.headers.get('ratelimit'), `"default";r=${remaining};t=${1000 * (3 - remaining)}`);
          assert.equal(res.headers.get('retry-after'), null);
        }
        const res = await fetch(base);
        assert.equal(res.status, 429);
        assert.equal(res.headers.get('content-type'), 'application/problem+json');
        assert.equal(res.headers.get('ratelimit-policy'), '"default";q=3;w=3000');
        assert.equal(res.headers.get('ratelimit'), '"default";r=0;t=3000');
        assert.equal(res.headers.get('retry-after'), '1000');
        assert.deepEqual(await res.json(), {
          type: 'https://iana.org/assignments/http-problem-types#quota-exceeded',
          title: 'Too Many Requests',
          status: 429,
          detail: 'Rate limit of policy "default" exceeded; retry in 1000 s.',
          'violated-policies': ['default'],
        });
      });

      test('key function (per user) and cost function (weighted requests), policy name', async () => {
        const base = await app({
          capacity: 5,
          rate: RATE,
          name: 'api',
          key: (req) => req.headers['x-user'] ?? 'anonymous',
          cost: (req) => Number(req.headers['x-cost'] ?? 1),
        });
        const get = (user, cost) => fetch(base, { headers: { 'x-user': user, 'x-cost': String(cost) } });
        let res = await get('alice', 4);
        assert.equal(res.status, 200);
        assert.equal(res.headers.get('ratelimit'), '"api";r=1;t=4000');
        res = await get('alice', 2);
        assert.equal(res.status, 429);
        assert.deepEqual((await res.json())['violated-policies'], ['api']);
        res = await get('bob', 2);
        assert.equal(res.status, 200);
        assert.equal(res.headers.get('ratelimit'), '"api";r=3;t=2000');
        // A cost above the capacity can never pass: 429 without Retry-After.
        res = await get('carol', 6);
        assert.equal(res.status, 429);
        assert.equal(res.headers.get('retry-after'), null);
        assert.equal((await res.json()).detail, 'This request costs more than policy "api" can ever allow.');
      });

      test('default key is the client IP', async () => {
        const base = await app({ capacity: 1, rate: RATE });
        assert.equal((await fetch(base)).status, 200);
        assert.equal((await fetch(base)).status, 429);
      });

      test('several limits at once (takeAll): all policies, the deciding one in RateLimit', async () => {
        const base = await app({
          limits: [{ name: 'sec', capacity: 2, rate: RATE }, { name: 'day', capacity: 5, rate: RATE }],
          key: (req) => req.headers['x-user'],
        });
        const get = (user) => fetch(base, { headers: { 'x-user': user } });
        let res = await get('dave');
        assert.equal(res.status, 200);
        assert.equal(res.headers.get('ratelimit-policy'), '"sec";q=2;w=2000, "day";q=5;w=5000');
        assert.equal(res.headers.get('ratelimit'), '"sec";r=1;t=1000');
        res = await get('dave');
        assert.equal(res.headers.get('ratelimit'), '"sec";r=0;t=2000');
        res = await get('dave');
        assert.equal(res.status, 429);
        assert.equal(res.headers.get('ratelimit'), '"sec";r=0;t=2000');
        assert.deepEqual((await res.json())['violated-policies'], ['sec']);
        // Unnamed limits are limit0, limit1.
        const unnamed = await app({ limits: [{ capacity: 2, rate: RATE }, { capacity: 1, rate: RATE }] });
        res = await fetch(unnamed);
        assert.equal(res.headers.get('ratelimit-policy'), '"limit0";q=2;w=2000, "limit1";q=1;w=1000');
        assert.equal(res.headers.get('ratelimit'), '"limit1";r=0;t=1000');
      });

      test('per route: only the limited route carries headers', async () => {
        const base = await app({ capacity: 1, rate: RATE }, { route: true });
        let res = await fetch(`${base}/search`);
        assert.equal(res.status, 200);
        assert.equal(res.headers.get('ratelimit'), '"default";r=0;t=1000');
        assert.equal((await fetch(`${base}/search`)).status, 429);
        res = await fetch(`${base}/free`);
        assert.equal(res.status, 200);
        assert.equal(res.headers.get('ratelimit'), null);
      });
    });
  }
}

test('options are checked when the middleware is made', () => {
  const limiter = new RateLimiter({ sendCommand() {}, options: { enableOfflineQueue: false } });
  assert.throws(() => expressRateLimit({ capacity: 1, rate: 1 }), /needs options.limiter/);
  assert.throws(() => expressRateLimit({ limiter, capacity: 0, rate: 1 }), /capacity must be a positive/);
  assert.throws(() => expressRateLimit({ limiter, capacity: 1, rate: NaN }), /rate must be a positive/);
  assert.throws(() => expressRateLimit({ limiter, limits: [{ name: 'a', capacity: 1, rate: 1 }, { name: 'a', capacity: 2, rate: 1 }] }),
    /two limits are named a/);
});
