'use strict';

// The core's vectors (clients/conformance/vectors/, written by the pure core) replayed
// against the rules this library writes again, without a server: the bucket's take
// (take.json; peek.json without a lock), takeAll (takeall.json without options), firstMsWhen
// and the denial cache's priming window. Each vector's stored state, limit, n and clock go
// in; the reply figures and the state written must come out exactly.

const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { test } = require('node:test');
const { take, takeAll, firstMsWhen, primedDenialMs } = require('../lib/local');

const DIR = path.join(__dirname, '..', '..', 'conformance', 'vectors');

function vectors(rule, keep = () => true) {
  const found = JSON.parse(fs.readFileSync(path.join(DIR, `${rule}.json`), 'utf8')).vectors.filter(keep);
  assert.ok(found.length > 0, `no vectors in ${rule}.json`);
  return found;
}

// A vector's stored bucket as the local limiter keeps one (undefined: a missing key).
function stored(state) {
  return state === null ? undefined : { tokens: state.tokens, last: state.last_refill_ms };
}

// What the local limiter stores of a vector's write: the tokens and last_refill.
function written(write) {
  return write === null ? null : { tokens: write.tokens, last: write.last_refill_ms };
}

function reply(allowed, outcome) {
  return {
    allowed, remaining: outcome.remaining, retry_after_ms: outcome.retryAfterMs, reset_after_ms: outcome.resetAfterMs,
  };
}

function takeOf(v) {
  return take(stored(v.state), v.config.capacity, v.config.rate, v.n, v.now_ms);
}

for (const v of vectors('take')) {
  test(`take.json: a local take replies and writes as the core: ${v.name}`, () => {
    const outcome = takeOf(v);
    assert.deepEqual(reply(outcome.allowed, outcome), v.expect.reply);
    assert.deepEqual(outcome.write, written(v.expect.write));
  });
}

for (const v of vectors('peek', (p) => p.state === null || p.state.lock === undefined)) {
  test(`peek.json: a local peek replies as the core: ${v.name}`, () => {
    const outcome = takeOf(v);
    assert.deepEqual(reply(outcome.allowed, outcome), v.expect.reply);
  });
}

for (const v of vectors('takeall', (t) => Object.keys(t.options).length === 0)) {
  test(`takeall.json: a local takeAll takes from every bucket or none as the core: ${v.name}`, () => {
    const all = takeAll(v.buckets.map((b) => ({
      stored: stored(b.state), capacity: b.config.capacity, rate: b.config.rate, n: b.n,
    })), v.now_ms);
    assert.deepEqual({ ...reply(all.allowed, all.outcomes[all.index]), index: all.index }, v.expect.reply);
    assert.deepEqual(all.outcomes.map((o) => o.write), v.expect.writes.map(written));
  });
}

for (const v of vectors('first_ms_when')) {
  test(`first_ms_when.json: firstMsWhen is the core's: ${v.name}`, () => {
    const state = { tokens: v.state.tokens, last: v.state.last_refill_ms };
    assert.equal(firstMsWhen(state, v.config.capacity, v.config.rate, v.now_ms, v.wanted), v.expect.ms);
  });
}

for (const v of vectors('denial_cache')) {
  test(`denial_cache.json: the denial cache primes the core's window: ${v.name}`, () => {
    const got = primedDenialMs(v.config.capacity, v.config.rate, v.n, v.reply.remaining, v.reply.reset_after_ms);
    assert.equal(got, v.expect.window_ms);
  });
}
