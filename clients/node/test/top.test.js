'use strict';

// top() (docs/clients.md, "The most-denied keys"): TB.TOP COUNT count on a standalone server,
// and on every master of a 3-master cluster, merged (the most denied first, ties by key bytes)
// and cut to `count`; a key that is not UTF-8 comes back with its exact bytes; without the
// module (or without the ACL's grant) the server's error is LimiterReplyError, and a master
// that does not answer makes the call LimiterUnavailable.

const assert = require('node:assert/strict');
const { once } = require('node:events');
const { after, before, describe, test } = require('node:test');
const Redis = require('ioredis');
const { RateLimiter, TopKey, InvalidArgument, LimiterReplyError, LimiterUnavailable, createClient, createClusterClient } = require('..');
const { keySlot } = require('../lib/core');
const { freePort, startCluster, startServer, stopAll } = require('./servers');

const clients = [];
const limiters = [];
after(async () => {
  limiters.forEach((l) => l.close());
  clients.forEach((c) => c.disconnect());
  await stopAll();
});

// Nothing here tests a timeout: generous ones for a busy machine.
function limiterOn(client, options = {}) {
  clients.push(client);
  const limiter = new RateLimiter(client, { timeoutMs: 5000, connectTimeoutMs: 10_000, logger: false, ...options });
  limiters.push(limiter);
  return limiter;
}

// `times` denials of `key`: n above the capacity is denied every time, and counted.
async function deny(limiter, key, times) {
  for (let i = 0; i < times; i++) {
    const d = await limiter.take(key, 1, 0.001, 2);
    assert.equal(d.allowed, false);
  }
}

const rows = (top) => top.map((row) => [row.keyBytes.toString('hex'), row.count]);
const hex = (key) => Buffer.from(key).toString('hex');

// Not UTF-8: a lone 0xff, an unfinished sequence, a NUL.
const RAW = Buffer.from([0x74, 0x6f, 0x70, 0x3a, 0xff, 0xe2, 0x82, 0x00, 0x41]);

describe('top() on a standalone server with the module', () => {
  let limiter;
  before(async () => {
    const server = await startServer({ module: true });
    limiter = limiterOn(createClient(server.url));
    await deny(limiter, 'top:a', 5);
    await deny(limiter, 'top:c', 3);
    await deny(limiter, 'top:b', 3);
    await deny(limiter, RAW, 2);
    await deny(limiter, `top:long:${'x'.repeat(300)}`, 1);
    // Allowed takes and peeks count nothing.
    await limiter.take('top:allowed', 5, 1, 1);
    await limiter.peek('top:a', 1, 0.001, 2);
  });

  test('the most denied first, ties by key bytes, with every field', async () => {
    const top = await limiter.top();
    assert.deepEqual(rows(top), [[hex('top:a'), 5], [hex('top:b'), 3], [hex('top:c'), 3], [RAW.toString('hex'), 2],
      [hex(`top:long:${'x'.repeat(256 - 'top:long:'.length)}`), 1]]);
    for (const row of top) {
      assert.ok(row instanceof TopKey);
      assert.ok(Buffer.isBuffer(row.keyBytes));
      assert.equal(row.error, 0);
      assert.equal(row.shadow, 0);
    }
    assert.equal(top[0].key, 'top:a');
    assert.deepEqual(top.map((row) => row.truncated), [false, false, false, false, true]);
    assert.equal(top[4].keyBytes.length, 256);
  });

  test('a key that is not UTF-8: its exact bytes, and its text with U+FFFD', async () => {
    const row = (await limiter.top()).find((r) => r.count === 2);
    assert.ok(row.keyBytes.equals(RAW));
    assert.equal(row.key, RAW.toString('utf8'));
    assert.ok(row.key.includes('\ufffd'));
  });

  test('count cuts the list', async () => {
    assert.deepEqual(rows(await limiter.top({ count: 2 })), [[hex('top:a'), 5], [hex('top:b'), 3]]);
    assert.deepEqual(rows(await limiter.top({ count: 1 })), [[hex('top:a'), 5]]);
    assert.equal((await limiter.top({ count: 100 })).length, 5);
  });

  test('count must be a whole number from 1, checked before sending', async () => {
    for (const count of [0, -1, 1.5, NaN, '3', 2 ** 53 + 2]) {
      await assert.rejects(limiter.top({ count }), InvalidArgument, String(count));
    }
  });

  test('a user the ACL does not grant TB.TOP: the server\'s NOPERM as LimiterReplyError', async () => {
    const { port } = limiter.client.options;
    // Everything but TB.TOP (Redis 7.0 has no module categories such as @tb).
    await limiter.client.call('acl', 'setuser', 'taker', 'on', '>pw', '~*', '&*', '+@all', '-tb.top');
    const limited = limiterOn(createClient(`redis://taker:pw@127.0.0.1:${port}`));
    assert.equal((await limited.take('top:acl', 5, 1)).allowed, true);
    await assert.rejects(limited.top(), (err) => err instanceof LimiterReplyError && /^NOPERM/.test(err.message));
  });
});

describe('top() without the module, or without a server', () => {
  test('a server without the module: its unknown-command error as LimiterReplyError, nothing detected', async () => {
    const server = await startServer();
    const limiter = limiterOn(createClient(server.url));
    await assert.rejects(limiter.top(), (err) => err instanceof LimiterReplyError && /^ERR unknown command/i.test(err.message));
    // Not subject to backend detection: nothing was loaded.
    assert.equal(limiter.backend, null);
    assert.equal(await limiter.connect(), 'function');
    await assert.rejects(limiter.top({ count: 3 }), LimiterReplyError);
  });

  test('nothing listening: LimiterUnavailable', async () => {
    const limiter = limiterOn(createClient(`redis://127.0.0.1:${await freePort()}`));
    await assert.rejects(limiter.top(), LimiterUnavailable);
  });
});

// Keys whose slots fall on each master (startCluster's SLOT_RANGES), by their hash tag.
function keysOnMaster(masterIndex, howMany) {
  const ranges = [[0, 5460], [5461, 10922], [10923, 16383]];
  const [lo, hi] = ranges[masterIndex];
  const found = [];
  for (let i = 0; found.length < howMany; i++) {
    const key = `top:{m${masterIndex}-${i}}`;
    const slot = keySlot(key);
    if (slot >= lo && slot <= hi) {
      found.push(key);
    }
  }
  return found;
}

describe('top() on a 3-master cluster with the module', () => {
  let cluster;
  let limiter;
  const [a1, a2] = keysOnMaster(0, 2);
  const [b1, b2] = keysOnMaster(1, 2);
  const [c1] = keysOnMaster(2, 1);
  before(async () => {
    cluster = await startCluster({ module: true });
    const client = createClusterClient(cluster.startup);
    await once(client, 'ready');
    limiter = limiterOn(client);
    await deny(limiter, a1, 5);
    await deny(limiter, a2, 1);
    await deny(limiter, b1, 4);
    await deny(limiter, b2, 3);
    await deny(limiter, c1, 3);
  }, { timeout: 60_000 });

  test('the masters\' rows merged: the most denied first, ties by key bytes, across masters', async () => {
    const tied = [b2, c1].sort((x, y) => Buffer.compare(Buffer.from(x), Buffer.from(y)));
    const expected = [[hex(a1), 5], [hex(b1), 4], [hex(tied[0]), 3], [hex(tied[1]), 3], [hex(a2), 1]];
    assert.deepEqual(rows(await limiter.top()), expected);
    // Each master holds only its own keys: every row comes from one of them.
    for (const node of cluster.nodes) {
      const direct = new Redis({ host: '127.0.0.1', port: node.port, lazyConnect: true });
      direct.on('error', () => {});
      clients.push(direct);
      await direct.connect();
      assert.ok((await direct.call('tb.top')).length <= 2);
    }
  });

  test('count cuts the merged list, not each master\'s', async () => {
    // The first three come from three masters: a concatenation of each master's first would differ.
    const top = await limiter.top({ count: 3 });
    assert.deepEqual(rows(top).map(([key]) => key).slice(0, 2), [hex(a1), hex(b1)]);
    assert.equal(top.length, 3);
    assert.equal(top[2].count, 3);
    assert.deepEqual(rows(await limiter.top({ count: 1 })), [[hex(a1), 5]]);
  });

  test('a key that is not UTF-8 comes back with its exact bytes from its master', async () => {
    const raw = Buffer.concat([Buffer.from('top:{'), RAW, Buffer.from('}')]);
    await deny(limiter, raw, 6);
    const [first] = await limiter.top({ count: 1 });
    assert.ok(first.keyBytes.equals(raw));
    assert.equal(first.count, 6);
    assert.equal(first.key, raw.toString('utf8'));
  });

  test('a master that does not answer: LimiterUnavailable, never a partial answer', async () => {
    const paused = new RateLimiter(limiter.client, { timeoutMs: 300, logger: false });
    limiters.push(paused);
    cluster.nodes[1].pause();
    try {
      await assert.rejects(paused.top(), LimiterUnavailable);
    } finally {
      cluster.nodes[1].resume();
    }
  });
});
