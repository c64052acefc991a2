'use strict';

// The local limiter, the denial cache and the outage, without a server: clients/conformance/vectors/local.json
// (the pure core's case table) replayed step by step with a virtual clock, the LRU bound,
// and the denial cache's rules (docs/clients.md).

const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { test } = require('node:test');
const { LocalLimiter, DenialCache, LruMap, Outage, primedDenialMs } = require('../lib/local');

const TABLE = JSON.parse(fs.readFileSync(path.join(__dirname, '..', '..', 'conformance', 'vectors', 'local.json'), 'utf8'));

function fields(allowed, outcome, index) {
  const out = {
    allowed, remaining: outcome.remaining, retry_after_ms: outcome.retryAfterMs, reset_after_ms: outcome.resetAfterMs,
  };
  if (index !== undefined) {
    out.index = index;
  }
  return out;
}

function run(local, step) {
  if (step.op === 'take_all') {
    const all = local.takeAll(step.limits, step.now_ms);
    return fields(all.allowed, all.outcomes[all.index], all.index);
  }
  const outcome = local.take(step.key, step.capacity, step.rate, step.n, step.now_ms, step.op === 'take');
  return fields(outcome.allowed, outcome);
}

for (const c of TABLE.cases) {
  test(`local.json: ${c.name}`, () => {
    const local = new LocalLimiter(c.instances, 10_000);
    c.steps.forEach((step, i) => {
      assert.deepEqual(run(local, step), step.expect, `step ${i}: ${JSON.stringify(step)}`);
    });
  });
}

test('the LRU forgets the least recently used key first', () => {
  const lru = new LruMap(2);
  lru.set('a', 1);
  lru.set('b', 2);
  lru.get('a');
  lru.set('c', 3);
  assert.deepEqual([...lru.map.keys()], ['a', 'c']);
  const local = new LocalLimiter(1, 2);
  const now = 1_700_000_000_000;
  local.take('x', 1, 0.001, 1, now);
  local.take('y', 1, 0.001, 1, now);
  local.take('z', 1, 0.001, 1, now);
  assert.equal(local.buckets.size, 2);
  // x was forgotten: it comes back as a full bucket.
  assert.equal(local.take('x', 1, 0.001, 1, now).allowed, true);
  assert.equal(local.take('z', 1, 0.001, 1, now).allowed, false);
});

test('the denial cache: until the named time, takes of at least n; -1 and grants are not kept', () => {
  const cache = new DenialCache(2);
  const now = 1_700_000_000_000;
  cache.remember('k', 2, { allowed: false, remaining: 1, retryAfterMs: 500, resetAfterMs: 900 }, now);
  assert.equal(cache.denial('k', 1, now + 10), undefined);
  const entry = cache.denial('k', 2, now + 100);
  assert.ok(entry);
  assert.equal(cache.denial('k', 3, now + 499).until, now + 500);
  assert.equal(cache.denial('k', 2, now + 500), undefined);
  assert.equal(cache.entries.size, 0);
  cache.remember('never', 9, { allowed: false, remaining: 0, retryAfterMs: -1, resetAfterMs: 0 }, now);
  cache.remember('ok', 1, { allowed: true, remaining: 0, retryAfterMs: 0, resetAfterMs: 10 }, now);
  assert.equal(cache.entries.size, 0);
  cache.remember('a', 1, { allowed: false, remaining: 0, retryAfterMs: 50, resetAfterMs: 50 }, now);
  cache.forget('a');
  assert.equal(cache.denial('a', 1, now), undefined);
  for (const key of ['a', 'b', 'c']) {
    cache.remember(key, 1, { allowed: false, remaining: 0, retryAfterMs: 50, resetAfterMs: 50 }, now);
  }
  assert.equal(cache.entries.size, 2);
  assert.equal(cache.denial('a', 1, now), undefined);
});

test('an allowed take that left fewer than n waits until the bucket holds n again, plus a ms', () => {
  // [capacity, rate, n, remaining, resetAfterMs, wait]
  const table = [
    [10, 1, 1, 0, 9500, 501], // 0.5 tokens left: 1 is back in 500 ms
    [10, 1, 1, 0, 9000, 0], // exactly 1 token left: the next take is allowed
    [10, 1, 1, 1, 9000, 0], // a whole token left
    [10, 3, 1, 0, 3001, 2], // ceil(9 * 1000 / 3) = 3000
    [10, 2, 3, 2, 3600, 101], // ceil(7 * 1000 / 2) = 3500
    [10, 1, 0.5, 0, 9300, 0], // 0.7 left holds n = 0.5
    [10, 1, 1, 0, -1, 0], // no reset time
    [10, 0, 1, 0, 9500, 0], // a bucket that does not refill
  ];
  for (const [capacity, rate, n, remaining, reset, wait] of table) {
    assert.equal(primedDenialMs(capacity, rate, n, remaining, reset), wait, JSON.stringify([capacity, rate, n, remaining, reset]));
  }
});

test('an allowed plain take that left fewer than n is remembered as the next denial; a lockout take is not', () => {
  const cache = new DenialCache(10);
  const now = 1_700_000_000_000;
  const granted = { allowed: true, remaining: 0, retryAfterMs: 0, resetAfterMs: 9500 };
  cache.remember('k', 1, granted, now, { capacity: 10, rate: 1 });
  assert.equal(cache.denial('k', 1, now + 500).until, now + 501);
  assert.equal(cache.denial('k', 0.5, now), undefined);
  assert.equal(cache.denial('k', 1, now + 501), undefined);
  cache.remember('locked', 1, granted, now, null);
  assert.equal(cache.denial('locked', 1, now), undefined);
});

test('the outage: logged once at each end; nothing sent for probeMs, then one probe', () => {
  const outage = new Outage(1000, 2);
  assert.equal(outage.shouldSend(0), true);
  assert.equal(outage.succeeded(), null);
  assert.deepEqual(outage.failed('connect ECONNREFUSED', 100),
    ['warn', 'redis-tb: Redis unreachable (connect ECONNREFUSED); limiting in process at 1/2 of each limit']);
  assert.equal(outage.failed('again', 150), null);
  assert.equal(outage.shouldSend(1149), false);
  assert.equal(outage.shouldSend(1150), true); // the probe
  assert.equal(outage.shouldSend(1151), false); // the others, while it is out
  assert.equal(outage.failed('still down', 1160), null);
  assert.equal(outage.shouldSend(2159), false);
  assert.equal(outage.shouldSend(2160), true);
  assert.deepEqual(outage.succeeded(), ['warn', 'redis-tb: Redis reachable again; limits come from Redis']);
  assert.equal(outage.succeeded(), null);
  assert.equal(outage.shouldSend(2161), true);
});
