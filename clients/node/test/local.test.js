'use strict';

// The local limiter and the denial cache, without a server: clients/conformance/local.json
// (the pure core's case table) replayed step by step with a virtual clock, the LRU bound,
// and the denial cache's rules (docs/clients.md).

const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { test } = require('node:test');
const { LocalLimiter, DenialCache, LruMap } = require('../lib/local');

const TABLE = JSON.parse(fs.readFileSync(path.join(__dirname, '..', '..', 'conformance', 'local.json'), 'utf8'));

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
