'use strict';

// A 3-master cluster, with the module on every node and without it (the Lua library
// loaded on every master; the script cached per node through NOSCRIPT -> EVAL), driven
// through the ioredis Cluster client: buckets on the node that owns their slot, takeAll
// over hash-tagged keys, CROSSSLOT without them, waitTake on the module.

const assert = require('node:assert/strict');
const { once } = require('node:events');
const { after, before, describe, test } = require('node:test');
const express = require('express');
const { RateLimiter, Limit, createClusterClient, bucketKey, expressRateLimit } = require('..');
const { keySlot } = require('../lib/core');
const { startCluster, admin, stopAll } = require('./servers');

const RATE = 0.001;
const clusters = {};
const clients = [];
const limiters = [];

before(async () => {
  [clusters.module, clusters.plain] = await Promise.all([startCluster({ module: true }), startCluster()]);
}, { timeout: 60_000 });

after(async () => {
  limiters.forEach((l) => l.close());
  clients.forEach((c) => c.disconnect());
  await stopAll();
});

const VARIANTS = [
  { name: 'module', cluster: 'module', option: 'auto', expect: 'module', command: 'tb.take' },
  { name: 'function', cluster: 'plain', option: 'auto', expect: 'function', command: 'fcall' },
  { name: 'script', cluster: 'plain', option: 'script', expect: 'script', command: 'evalsha' },
];

// INFO commandstats of `command`, summed over the nodes: { calls, rejected }.
async function commandStats(cluster, command) {
  const total = { calls: 0, rejected: 0 };
  for (const node of cluster.nodes) {
    const r = admin(node.port);
    try {
      const info = await r.info('commandstats');
      const line = info.split('\r\n').find((l) => l.startsWith(`cmdstat_${command}:`));
      if (line) {
        total.calls += Number(/calls=(\d+)/.exec(line)[1]);
        total.rejected += Number(/rejected_calls=(\d+)/.exec(line)[1]);
      }
    } finally {
      r.disconnect();
    }
  }
  return total;
}

async function resetStats(cluster) {
  for (const node of cluster.nodes) {
    const r = admin(node.port);
    try {
      await r.call('config', 'resetstat');
    } finally {
      r.disconnect();
    }
  }
}

async function dbsizes(cluster, match) {
  return Promise.all(cluster.nodes.map(async (node) => {
    const r = admin(node.port);
    try {
      const keys = await r.keys(match);
      return keys.length;
    } finally {
      r.disconnect();
    }
  }));
}

for (const variant of VARIANTS) {
  describe(`cluster, ${variant.name} backend`, () => {
    let limiter;
    let cluster;
    before(async () => {
      cluster = clusters[variant.cluster];
      const client = createClusterClient(cluster.startup);
      clients.push(client);
      await once(client, 'ready');
      limiter = new RateLimiter(client, { backend: variant.option, timeoutMs: 2000, logger: false });
      limiters.push(limiter);
      assert.equal(await limiter.connect(), variant.expect);
    });

    test('take: buckets on every master, each on the node owning its slot', async () => {
      await resetStats(cluster);
      for (let i = 0; i < 30; i++) {
        const d = await limiter.take(`${variant.name}:spread:${i}`, 10, RATE, 3);
        assert.deepEqual([d.allowed, d.remaining, d.resetAfterMs], [true, 7, 3_000_000]);
      }
      for (let i = 0; i < 30; i++) {
        const d = await limiter.take(`${variant.name}:spread:${i}`, 10, RATE, 3);
        assert.equal(d.remaining, 4);
      }
      // Sent straight to the owner: no MOVED on the way.
      assert.deepEqual(await commandStats(cluster, variant.command), { calls: 60, rejected: 0 });
      const sizes = await dbsizes(cluster, `${variant.name}:spread:*`);
      assert.equal(sizes.reduce((a, b) => a + b, 0), 30);
      assert.ok(sizes.every((n) => n > 0), `keys per node: ${sizes}`);
      const p = await limiter.peek(`${variant.name}:spread:0`, 10, RATE);
      assert.equal(p.remaining, 3);
      const r = await limiter.refund(`${variant.name}:spread:0`, 10, RATE, 2);
      assert.equal(r.remaining, 6);
    });

    test('takeAll over hash-tagged keys: one slot, all or nothing', async () => {
      for (let u = 0; u < 6; u++) {
        const tag = `{${variant.name}:user:${u}}`;
        const limits = [new Limit(`${tag}:sec`, 2, RATE, 1, 'sec'), new Limit(`${tag}:day`, 5, RATE, 1, 'day')];
        let d = await limiter.takeAll(limits);
        assert.deepEqual([d.allowed, d.remaining, d.index], [true, 1, 0]);
        d = await limiter.takeAll(limits);
        assert.deepEqual([d.allowed, d.remaining, d.index], [true, 0, 0]);
        d = await limiter.takeAll(limits);
        assert.deepEqual([d.allowed, d.remaining, d.index, d.policy], [false, 0, 0, 'sec']);
        assert.equal(d.headers()['RateLimit-Policy'], '"sec";q=2;w=2000, "day";q=5;w=5000');
        assert.equal((await limiter.peek(`${tag}:day`, 5, RATE)).remaining, 2);
      }
    });

    test('takeAll over keys of different slots: CROSSSLOT from the server', async () => {
      await assert.rejects(
        limiter.takeAll([{ key: `${variant.name}:a`, capacity: 1, rate: 1 }, { key: `${variant.name}:b`, capacity: 1, rate: 1 }]),
        (err) => err.kind === 'server' && /CROSSSLOT/.test(err.message),
      );
    });

    test('hostile ids: each caller\'s buckets share one slot by CLUSTER KEYSLOT, and a two-policy middleware take passes with headers (issue 18, item 5)', async () => {
      const app = express();
      app.use(expressRateLimit({
        limiter,
        keyPrefix: `${variant.name}-hostile:`,
        key: (req) => req.get('x-user'),
        limits: [{ name: 'sec', capacity: 10, rate: 1 }, { name: 'day', capacity: 100, rate: RATE }],
      }));
      app.get('/', (req, res) => res.json({ ok: true }));
      app.use((err, req, res, next) => res.status(500).json({ error: err.message }));
      const http = app.listen(0, '127.0.0.1');
      await once(http, 'listening');
      const r = admin(cluster.nodes[0].port);
      try {
        for (const id of ['}x', '}{', '{}', '}', '{', '{a}b', 'a{}x}', '50%', '%7D', '']) {
          const res = await fetch(`http://127.0.0.1:${http.address().port}/`, { headers: { 'x-user': id } });
          assert.equal(res.status, 200, `${JSON.stringify(id)}: ${await res.text()}`);
          assert.match(res.headers.get('ratelimit') ?? '', /^"sec";r=9;t=\d+$/, JSON.stringify(id));
          const keys = ['sec', 'day'].map((name) => bucketKey(`${variant.name}-hostile:`, id, name));
          const slots = await Promise.all(keys.map((k) => r.call('cluster', 'keyslot', k)));
          assert.equal(slots[0], slots[1], `${keys}: slots ${slots}`);
          assert.equal(keySlot(keys[0]), slots[0]);
        }
      } finally {
        r.disconnect();
        http.closeAllConnections();
        await new Promise((resolve) => http.close(resolve));
      }
    });

    test('waitTake', async () => {
      const key = `${variant.name}:wait`;
      await limiter.take(key, 1, 20);
      const d = await limiter.waitTake(key, 1, 20, 1, { timeoutMs: 5000 });
      assert.equal(d.allowed, true);
      const slow = `${variant.name}:wait-slow`;
      await limiter.take(slow, 1, RATE);
      const denied = await limiter.waitTake(slow, 1, RATE, 1, { timeoutMs: 200 });
      assert.equal(denied.allowed, false);
    });
  });
}

test('script backend in a cluster: SCRIPT FLUSH on every node, NOSCRIPT -> EVAL on the key\'s node', async () => {
  const client = createClusterClient(clusters.plain.startup);
  clients.push(client);
  await once(client, 'ready');
  const limiter = new RateLimiter(client, { backend: 'script', timeoutMs: 2000, logger: false });
  for (const node of clusters.plain.nodes) {
    const r = admin(node.port);
    try {
      await r.call('script', 'flush');
    } finally {
      r.disconnect();
    }
  }
  for (let i = 0; i < 10; i++) {
    assert.equal((await limiter.take(`noscript:${i}`, 5, RATE, 2)).remaining, 3);
    assert.equal((await limiter.take(`noscript:${i}`, 5, RATE, 2)).remaining, 1);
  }
});

test('the slot of a key is the server\'s (CLUSTER KEYSLOT), also where ioredis\'s slot function differs', async () => {
  const r = admin(clusters.plain.nodes[0].port);
  try {
    for (const key of ['ratelimit:{}x}:sec', 'ratelimit:{}x}:day', 'a{b}c', '{}', '{{a}}', 'x{', '}{y}', 'plain', 'ünï{cödé}']) {
      assert.equal(keySlot(key), await r.call('cluster', 'keyslot', key), key);
    }
  } finally {
    r.disconnect();
  }
});

test('the Lua library is on every master of the cluster without the module', async () => {
  for (const node of clusters.plain.nodes) {
    const r = admin(node.port);
    try {
      const libs = await r.call('function', 'list', 'libraryname', 'tb');
      assert.equal(libs.length, 1, `node ${node.port}`);
    } finally {
      r.disconnect();
    }
  }
});
