'use strict';

// The shared conformance suite (clients/conformance/cases.json, docs/clients.md#the-conformance-suite):
// every case on every backend and topology it names, on real servers: the module and the
// Lua fallback (the function backend), standalone and 3-master clusters. The runner only
// translates the case into Node's spelling (camelCase fields, { name } for the policy,
// { timeoutMs } for waits); the cases do not change.
// TB_IOREDIS=<path> runs it with another ioredis (run-tests.sh: the lowest declared version).

const assert = require('node:assert/strict');
const { once } = require('node:events');
const fs = require('node:fs');
const path = require('node:path');
const { after, describe, before, test } = require('node:test');
const Redis = require(process.env.TB_IOREDIS || 'ioredis');
const IOREDIS_VERSION = JSON.parse(fs.readFileSync(
  path.join(path.dirname(require.resolve(process.env.TB_IOREDIS || 'ioredis')), '..', 'package.json'), 'utf8')).version;
const { RateLimiter, InvalidArgument, LimiterReplyError, LimiterUnavailable, bucketKey, classify } = require('..');
const { freePort, startCluster, startServer, stopAll } = require('./servers');
const { METRICS, meterReader, checkMetrics } = require('./otel');

const CASES = JSON.parse(fs.readFileSync(path.join(__dirname, '..', '..', 'conformance', 'cases.json'), 'utf8'));
// The lease cases: the same format, in a file of their own (its "about" says why).
const LEASES = JSON.parse(fs.readFileSync(path.join(__dirname, '..', '..', 'conformance', 'leases.json'), 'utf8'));
// Reservations, charges, settling, lockout: the same format, a file of its own. Its lua runs
// wait for the Lua twin of those commands (its "about"): skipped while lua/tb.lua has no tb_charge.
const JOBS = JSON.parse(fs.readFileSync(path.join(__dirname, '..', '..', 'conformance', 'jobs.json'), 'utf8'));
const LUA_HAS_JOBS = fs.readFileSync(path.join(__dirname, '..', 'tb.lua'), 'utf8').includes('tb_charge');
const ALL_CASES = [...CASES.cases, ...LEASES.cases, ...JOBS.cases];
// `<ms>-<n>-<incarnation>` (docs/leases.md#lease-ids): every case makes its sets anew.
const LEASE_ID = /^[0-9]+-[0-9]+-[0-9]+$/;
const TOPOLOGIES = ['standalone', 'cluster'];
const BACKENDS = [
  { name: 'module', module: true, expect: 'module' },
  { name: 'lua', module: false, expect: 'function' },
];
const ERRORS = { invalid_argument: InvalidArgument, reply: LimiterReplyError, unavailable: LimiterUnavailable };
const FIELDS = {
  allowed: 'allowed', remaining: 'remaining', retry_after_ms: 'retryAfterMs', reset_after_ms: 'resetAfterMs',
  policy: 'policy', capacity: 'capacity', rate: 'rate', index: 'index', wait_ms: 'waitMs',
  acquired: 'acquired', available: 'available', lease: 'lease', failed_open: 'failedOpen', limit: 'limit', lease_ms: 'leaseMs',
};

const clients = [];
after(async () => {
  clients.forEach((c) => c.disconnect());
  await stopAll();
});

// Plain ioredis clients (not createClient(): that one always loads the package's ioredis).
async function connect(topology, server) {
  const options = { enableOfflineQueue: false, maxRetriesPerRequest: 0 };
  const client = topology === 'cluster'
    ? new Redis.Cluster(server.startup, { enableOfflineQueue: false, redisOptions: options })
    : new Redis({ host: '127.0.0.1', port: server.port, ...options });
  client.on('error', () => {});
  clients.push(client);
  await once(client, 'ready');
  return client;
}

// Every master of the topology, for FLUSHALL.
function masters(client) {
  return client.isCluster ? client.nodes('master') : [client];
}

function expectNumber(actual, expected, what) {
  if (Array.isArray(expected)) {
    assert.ok(actual >= expected[0] && actual <= expected[1], `${what}: ${actual} not in [${expected}]`);
  } else {
    assert.equal(actual, expected, what);
  }
}

function checkDecision(decision, expected, what) {
  for (const [field, value] of Object.entries(expected)) {
    const name = FIELDS[field];
    assert.ok(name, `${what}: the runner does not know the field ${field}`);
    if (field === 'lease' && value === '<id>') {
      assert.match(decision[name], LEASE_ID, `${what}: ${field}`);
    } else if (typeof value === 'number' || Array.isArray(value)) {
      expectNumber(decision[name], value, `${what}: ${field}`);
    } else {
      assert.equal(decision[name], value, `${what}: ${field}`);
    }
  }
}

// One call of a case: the operation in Node's spelling.
function run(limiter, call, saved = {}) {
  const options = call.policy === undefined ? {} : { name: call.policy };
  const lease = typeof call.lease === 'string' && call.lease.startsWith('$') ? saved[call.lease.slice(1)] : call.lease;
  const leaseOptions = call.fail_open === undefined ? options : { ...options, failOpen: call.fail_open };
  switch (call.op) {
    case 'acquire':
      return limiter.acquire(call.key, call.limit, call.lease_ms, leaseOptions);
    case 'wait_acquire':
      return limiter.waitAcquire(call.key, call.limit, call.lease_ms, { ...leaseOptions, timeoutMs: call.timeout_ms });
    case 'release':
      return limiter.release(call.key, lease);
    case 'renew':
      return limiter.renew(call.key, lease, call.lease_ms);
    case 'take':
      return limiter.take(call.key, call.capacity, call.rate, call.n,
        { ...options, maxWaitMs: call.max_wait_ms, blockMs: call.block_ms, maxBlockMs: call.max_block_ms });
    case 'charge':
      return limiter.charge({ key: call.key, capacity: call.capacity, rate: call.rate, name: call.policy }, call.n,
        { maxDebt: call.max_debt });
    case 'settle':
      return limiter.settle({ key: call.key, capacity: call.capacity, rate: call.rate, name: call.policy },
        call.reserved, call.actual);
    case 'unblock':
      return limiter.unblock(call.key);
    case 'peek':
      return limiter.peek(call.key, call.capacity, call.rate, call.n, options);
    case 'refund':
      return limiter.refund(call.key, call.capacity, call.rate, call.n, options);
    case 'take_all':
      return limiter.takeAll(call.limits.map((l) => ({
        key: l.key, capacity: l.capacity, rate: l.rate, n: l.n, name: l.policy, blockMs: l.block_ms, maxBlockMs: l.max_block_ms,
      })), { maxWaitMs: call.max_wait_ms });
    case 'wait_take':
      return limiter.waitTake(call.key, call.capacity, call.rate, call.n, { ...options, timeoutMs: call.timeout_ms });
    default:
      throw new Error(`the runner does not know the op ${call.op}`);
  }
}

async function runCall(limiter, client, call, what, saved) {
  if (call.op === 'classify') {
    assert.equal(classify(new Redis.ReplyError(call.reply)), call.class, what);
    return;
  }
  if (call.op === 'sleep') {
    await new Promise((resolve) => setTimeout(resolve, call.ms));
    return;
  }
  if (call.op === 'keys') {
    const keys = call.policies.map((p) => bucketKey(call.prefix, call.id, p));
    assert.deepEqual(keys, call.expect, what);
    if (client.isCluster) {
      // The server's slot for each key: one slot for one caller, and one TB.TAKEALL over them.
      const slots = await Promise.all(keys.map((k) => client.nodes('master')[0].call('cluster', 'keyslot', k)));
      assert.equal(new Set(slots).size, 1, `${what}: slots ${slots}`);
      const d = await limiter.takeAll(keys.map((key, i) => ({ key, capacity: 5, rate: 0.001, name: call.policies[i] })));
      assert.equal(d.allowed, true, what);
    }
    return;
  }
  if (call.error !== undefined) {
    const kind = ERRORS[call.error];
    assert.ok(kind, `${what}: the runner does not know the error ${call.error}`);
    await assert.rejects(run(limiter, call, saved), (err) => {
      assert.ok(err instanceof kind, `${what}: ${err.name}: ${err.message}, expected ${kind.name}`);
      assert.ok(call.message === undefined || err.message.startsWith(call.message),
        `${what}: "${err.message}" does not start with "${call.message}"`);
      return true;
    });
    return;
  }
  const decision = await run(limiter, call, saved);
  if (call.result !== undefined) {
    assert.equal(decision, call.result, what);
  }
  if (call.save !== undefined) {
    saved[call.save] = decision.lease;
  }
  if (call.id_count !== undefined) {
    assert.equal(Number(decision.lease.split('-')[1]), call.id_count, what);
  }
  if (call.decision) {
    checkDecision(decision, call.decision, what);
  }
  if (call.headers) {
    const headers = decision.headers();
    for (const [name, value] of Object.entries(call.headers)) {
      assert.equal(headers[name], value, `${what}: ${name}`);
    }
  }
}

test('cases.json is version 1 and every case names known backends and topologies', () => {
  assert.equal(CASES.version, 1);
  assert.equal(LEASES.version, 1);
  assert.equal(JOBS.version, 1);
  for (const c of ALL_CASES) {
    assert.ok(c.backends.every((b) => BACKENDS.some((x) => x.name === b)), c.name);
    assert.ok(c.topologies.every((t) => TOPOLOGIES.includes(t)), c.name);
  }
});

for (const topology of TOPOLOGIES) {
  for (const backend of BACKENDS) {
    const cases = ALL_CASES.filter((c) => c.backends.includes(backend.name) && c.topologies.includes(topology));
    describe(`conformance: ${backend.name} backend, ${topology}, ioredis ${IOREDIS_VERSION}`, () => {
      let client;
      let limiter;
      before(async () => {
        const server = topology === 'cluster'
          ? await startCluster({ module: backend.module })
          : await startServer({ module: backend.module });
        client = await connect(topology, server);
        // Timing-tolerant: nothing here tests a timeout, and the machine may be busy.
        limiter = new RateLimiter(client, { timeoutMs: 2000, logger: false });
        assert.equal(await limiter.connect(), backend.expect);
        // The limiter sends with the ioredis that made the client (it never loads its own).
        assert.equal(require('../lib/limiter').ioredisOf(client), Redis);
      }, { timeout: 60_000 });

      for (const c of cases) {
        const waiting = backend.name === 'lua' && JOBS.cases.includes(c) && !LUA_HAS_JOBS;
        test(c.name, { skip: waiting && 'lua/tb.lua has no tb_charge yet (jobs.json\'s about)' }, async () => {
          await Promise.all(masters(client).map((node) => node.call('flushall')));
          for (const command of c.setup ?? []) {
            await client.call(...command);
          }
          const saved = {};
          for (const [i, call] of c.calls.entries()) {
            await runCall(limiter, client, call, `${c.name}, call ${i} (${call.op})`, saved);
          }
        });
      }
    });
  }
}

// clients/conformance/resend.json: the one resend after a dropped connection. Each case runs
// on one limiter of its own (a new one per call would never meet a killed connection);
// kill_clients is CLIENT KILL TYPE normal SKIPME yes on every node over a connection of the
// runner's own, which closes the limiter's connections while the servers stay up.
const RESEND = JSON.parse(fs.readFileSync(path.join(__dirname, '..', '..', 'conformance', 'resend.json'), 'utf8'));

test('resend.json is version 1 and names known backends and topologies', () => {
  assert.equal(RESEND.version, 1);
  for (const c of RESEND.cases) {
    assert.ok(c.backends.every((b) => BACKENDS.some((x) => x.name === b)), c.name);
    assert.ok(c.topologies.every((t) => TOPOLOGIES.includes(t)), c.name);
  }
});

async function killClients(server) {
  for (const node of server.nodes ?? [server]) {
    const admin = new Redis({ host: '127.0.0.1', port: node.port, lazyConnect: true });
    admin.on('error', () => {});
    try {
      await admin.connect();
      await admin.call('client', 'kill', 'type', 'normal', 'skipme', 'yes');
    } finally {
      admin.disconnect();
    }
  }
}

for (const topology of TOPOLOGIES) {
  for (const backend of BACKENDS) {
    const cases = RESEND.cases.filter((c) => c.backends.includes(backend.name) && c.topologies.includes(topology));
    describe(`resend: ${backend.name} backend, ${topology}, ioredis ${IOREDIS_VERSION}`, () => {
      let server;
      before(async () => {
        server = topology === 'cluster'
          ? await startCluster({ module: backend.module })
          : await startServer({ module: backend.module });
      }, { timeout: 60_000 });

      for (const c of cases) {
        test(c.name, async () => {
          const client = await connect(topology, server);
          await Promise.all(masters(client).map((node) => node.call('flushall')));
          const limiter = new RateLimiter(client, { timeoutMs: 2000, logger: false });
          assert.equal(await limiter.connect(), backend.expect);
          let refunded = 0; // tokens a refund after the kill gave back (resend.json's about)
          for (const [i, call] of c.calls.entries()) {
            const what = `${c.name}, call ${i} (${call.op})`;
            if (call.op === 'kill_clients') {
              await killClients(server);
            } else if (call.op === 'refund' && call.error !== undefined) {
              // ioredis refuses a command while it reconnects ("Stream isn't writeable"):
              // never written, so the refund is sent once on the new connection.
              try {
                const d = await run(limiter, call);
                assert.equal(d.allowed, true, what);
                refunded = call.n;
              } catch (err) {
                assert.ok(err instanceof ERRORS[call.error], `${what}: ${err.name}: ${err.message}`);
              }
            } else if (call.decision?.remaining !== undefined && refunded > 0) {
              await runCall(limiter, client, { ...call, decision: { ...call.decision, remaining: call.decision.remaining + refunded } }, what, {});
            } else {
              await runCall(limiter, client, call, what, {});
            }
          }
        });
      }
    });
  }
}

// clients/conformance/metrics.json: the same calls, each case on a limiter of its own made with
// the case's `limiter` options (camelCase) and a meter provider of its own, whose reader is
// collected once after the calls (test/otel.js). Node has one driver (asynchronous): one run.
test('metrics.json is version 1 and names known backends, topologies and instruments', () => {
  assert.equal(METRICS.version, 1);
  for (const c of METRICS.cases) {
    assert.ok(c.backends.every((b) => BACKENDS.some((x) => x.name === b)), c.name);
    assert.ok(c.topologies.every((t) => TOPOLOGIES.includes(t)), c.name);
    assert.ok(Object.keys(c.metrics).every((name) => METRICS.instruments.some((i) => i.name === name)), c.name);
    assert.ok(c.server === undefined || (c.server === 'unreachable' && c.topologies.join() === 'standalone'), c.name);
  }
});

const camelCase = (name) => name.replace(/_([a-z])/g, (_, c) => c.toUpperCase());
const limiterOptions = (spec) => Object.fromEntries(Object.entries(spec ?? {}).map(([name, value]) => [camelCase(name), value]));

async function runMetricsCase(c, client, expectBackend) {
  const { meterProvider, collect } = meterReader();
  const limiter = new RateLimiter(client, { timeoutMs: 2000, logger: false, ...limiterOptions(c.limiter), meterProvider });
  try {
    if (expectBackend) {
      // Detection is no decision: nothing is recorded by it.
      assert.equal(await limiter.connect(), expectBackend);
    }
    for (const [i, call] of c.calls.entries()) {
      await runCall(limiter, client, call, `${c.name}, call ${i} (${call.op})`, {});
    }
    checkMetrics(await collect(), c.metrics, c.name);
  } finally {
    limiter.close();
  }
}

for (const topology of TOPOLOGIES) {
  for (const backend of BACKENDS) {
    const cases = METRICS.cases.filter((c) => c.server === undefined && c.backends.includes(backend.name) && c.topologies.includes(topology));
    describe(`metrics: ${backend.name} backend, ${topology}, ioredis ${IOREDIS_VERSION}`, () => {
      let client;
      before(async () => {
        const server = topology === 'cluster'
          ? await startCluster({ module: backend.module })
          : await startServer({ module: backend.module });
        client = await connect(topology, server);
      }, { timeout: 60_000 });

      for (const c of cases) {
        const waiting = backend.name === 'lua' && !LUA_HAS_JOBS && c.calls.some((call) => ['charge', 'settle', 'unblock'].includes(call.op));
        test(c.name, { skip: waiting && 'lua/tb.lua has no tb_charge yet (jobs.json\'s about)' }, async () => {
          await Promise.all(masters(client).map((node) => node.call('flushall')));
          for (const command of c.setup ?? []) {
            await client.call(...command);
          }
          await runMetricsCase(c, client, backend.expect);
        });
      }
    });
  }
}

// server: 'unreachable': a loopback port nothing listens on (a port just freed), so every
// call meets a refused connection; no backend is ever detected, so the case runs once.
describe(`metrics: Redis unreachable, ioredis ${IOREDIS_VERSION}`, () => {
  for (const c of METRICS.cases.filter((x) => x.server === 'unreachable')) {
    test(c.name, async () => {
      const client = new Redis({
        host: '127.0.0.1', port: await freePort(), enableOfflineQueue: false, maxRetriesPerRequest: 0, retryStrategy: () => 100,
      });
      client.on('error', () => {});
      clients.push(client);
      await runMetricsCase(c, client, null);
    });
  }
});
