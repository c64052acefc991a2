'use strict';

// waitTake in a cluster with the module (docs/clients.md, "Waiting in a cluster"): TB.BTAKE
// on the node that owns the key's slot, one pooled connection per wait in progress (never a
// copy of the whole cluster client), first come first served, following MOVED and ASK when
// the slot moves. A 3-master cluster of its own: the tests move slots.

const assert = require('node:assert/strict');
const { once } = require('node:events');
const { setTimeout: sleep } = require('node:timers/promises');
const { after, before, test } = require('node:test');
const { RateLimiter, createClusterClient } = require('..');
const { keySlot } = require('../lib/core');
const { admin, startCluster, stopAll } = require('./servers');

let cluster;
let client;
let limiter;
const admins = [];

before(async () => {
  cluster = await startCluster({ module: true });
  client = createClusterClient(cluster.startup);
  await once(client, 'ready');
  limiter = new RateLimiter(client, { timeoutMs: 2000, logger: false });
  await limiter.connect();
  for (const node of cluster.nodes) {
    admins.push(admin(node.port));
  }
}, { timeout: 60_000 });

after(async () => {
  limiter.close();
  client.disconnect();
  admins.forEach((a) => a.disconnect());
  await stopAll();
});

// The node (index) whose CLUSTER NODES says it owns `slot`.
async function ownerOf(slot) {
  for (const [i, a] of admins.entries()) {
    const slots = await a.call('cluster', 'slots');
    const mine = slots.find(([from, to, [, port]]) => slot >= from && slot <= to && port === cluster.nodes[i].port);
    if (mine) return i;
  }
  throw new Error(`no owner for slot ${slot}`);
}

async function blockedOn(i) {
  const list = await admins[i].call('client', 'list');
  return list.split('\n').filter((line) => line.includes('cmd=tb.btake')).length;
}

async function connectionsPerNode() {
  return Promise.all(admins.map(async (a) => (await a.call('client', 'list')).split('\n').filter(Boolean).length));
}

async function until(check, what) {
  for (let i = 0; i < 200; i++) {
    if (await check()) return;
    await sleep(10);
  }
  throw new Error(`timed out waiting for ${what}`);
}

test('waiters block in TB.BTAKE on the slot owner, one connection each, and are served first come first served', async () => {
  const key = '{fifo}:w';
  const owner = await ownerOf(keySlot(key));
  await limiter.take(key, 1, 0.001);
  const clientsBefore = await connectionsPerNode();
  const order = [];
  const waits = [];
  for (let i = 0; i < 3; i++) {
    waits.push(limiter.waitTake(key, 1, 0.001, 1, { timeoutMs: 10_000 }).then((d) => {
      order.push(i);
      return d;
    }));
    await until(async () => (await blockedOn(owner)) === i + 1, `waiter ${i} to block`);
  }
  const others = cluster.nodes.map((_, i) => i).filter((i) => i !== owner);
  assert.deepEqual(await Promise.all(others.map(blockedOn)), [0, 0]);
  // One connection per wait, to the owner only: not a copy of the cluster client (which
  // would also connect to other nodes for its slot map).
  const clientsDuring = await connectionsPerNode();
  assert.deepEqual(clientsDuring.map((n, i) => n - clientsBefore[i]), cluster.nodes.map((_, i) => (i === owner ? 3 : 0)));
  for (let i = 0; i < 3; i++) {
    await limiter.refund(key, 1, 0.001, 1);
    await until(() => order.length === i + 1, `waiter ${i} to be served`);
  }
  assert.deepEqual(order, [0, 1, 2]);
  assert.deepEqual((await Promise.all(waits)).map((d) => d.allowed), [true, true, true]);
});

test('a slot moved to another node: TB.BTAKE follows MOVED', async () => {
  const key = '{moved}:w';
  const slot = keySlot(key);
  const from = await ownerOf(slot);
  const to = (from + 1) % 3;
  const target = await admins[to].call('cluster', 'myid');
  // The slot is empty: assigning it elsewhere on every node moves it (the client's map is stale).
  for (const a of admins) {
    await a.call('cluster', 'setslot', String(slot), 'node', target);
  }
  const d = await limiter.waitTake(key, 2, 0.001, 1, { timeoutMs: 1000 });
  assert.deepEqual([d.allowed, d.remaining], [true, 1]);
  assert.match(await admins[from].info('errorstats'), /errorstat_MOVED:count=1\b/);
  assert.equal(await admins[to].exists(key), 1);
  assert.equal(await admins[from].call('cluster', 'countkeysinslot', String(slot)), 0);
});

test('a slot being migrated: a key not yet on the source follows ASK to the target', async () => {
  const key = '{asked}:w';
  const slot = keySlot(key);
  const from = await ownerOf(slot);
  const to = (from + 2) % 3;
  const source = await admins[from].call('cluster', 'myid');
  const target = await admins[to].call('cluster', 'myid');
  await admins[to].call('cluster', 'setslot', String(slot), 'importing', source);
  await admins[from].call('cluster', 'setslot', String(slot), 'migrating', target);
  try {
    const d = await limiter.waitTake(key, 3, 0.001, 1, { timeoutMs: 1000 });
    assert.deepEqual([d.allowed, d.remaining], [true, 2]);
    assert.match(await admins[from].info('errorstats'), /errorstat_ASK:count=1\b/);
    assert.equal(await admins[to].call('cluster', 'countkeysinslot', String(slot)), 1);
    assert.equal(await admins[from].call('cluster', 'countkeysinslot', String(slot)), 0);
  } finally {
    for (const a of admins) {
      await a.call('cluster', 'setslot', String(slot), 'node', target);
    }
  }
});

test('close() closes every waitTake connection, idle or waiting', async () => {
  const own = new RateLimiter(client, { timeoutMs: 2000, logger: false });
  const key = '{closing}:w';
  const owner = await ownerOf(keySlot(key));
  await own.take(key, 1, 0.001);
  const waits = [0, 1, 2].map(() => own.waitTake(key, 1, 0.001, 1, { timeoutMs: 10_000 }).catch((err) => err));
  await until(async () => (await blockedOn(owner)) === 3, 'three waiters');
  own.close();
  for (const result of await Promise.all(waits)) {
    assert.equal(result.kind, 'unavailable');
  }
  await until(async () => (await blockedOn(owner)) === 0, 'the waits to end on the server');
});

// Issue 35: a cluster client whose connections all dropped knows no master until it has
// reconnected. waitTake's resend met it there and failed ("the cluster client is not
// connected"); it waits for the reconnection up to timeoutMs, as a standalone client is
// waited for. The client retries after 300 ms, so the call surely meets it reconnecting.
test('a waitTake while the cluster client reconnects after its connections dropped waits for it', async () => {
  const name = 'dropped-cluster';
  const own = createClusterClient(cluster.startup, { clusterRetryStrategy: () => 300, redisOptions: { connectionName: name } });
  const ownLimiter = new RateLimiter(own, { timeoutMs: 2000, logger: false });
  try {
    await once(own, 'ready');
    const key = '{dropped}:w';
    assert.equal((await ownLimiter.waitTake(key, 5, 0.001, 1, { timeoutMs: 1000 })).remaining, 4);
    // A connection to every master (the client connects to a node when first used): once
    // they are all closed, the client has none left and reconnects as a whole.
    await Promise.all(own.nodes('master').map((node) => node.ping()));
    for (const a of admins) {
      const ids = (await a.call('client', 'list')).split('\n')
        .filter((line) => line.includes(` name=${name} `)).map((line) => /\bid=(\d+)/.exec(line)[1]);
      for (const id of ids) {
        await a.call('client', 'kill', 'id', id);
      }
    }
    await until(() => own.nodes('master').length === 0, 'the cluster client to lose every node');
    const d = await ownLimiter.waitTake(key, 5, 0.001, 1, { timeoutMs: 1000 });
    assert.deepEqual([d.allowed, d.remaining], [true, 3]);
  } finally {
    ownLimiter.close();
    own.disconnect();
  }
});
