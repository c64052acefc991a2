'use strict';

// Header formatting (draft-ietf-httpapi-ratelimit-headers-11), no server needed.

const assert = require('node:assert/strict');
const { test } = require('node:test');
const { Decision, rateLimitHeaders } = require('..');

const single = (reply, capacity, rate, name = 'default') => new Decision(reply, [{ name, capacity, rate }], null);

test('allowed: policy and state, no Retry-After', () => {
  assert.deepEqual(single([1, 19, 0, 200], 20, 5).headers(), {
    'RateLimit-Policy': '"default";q=20;w=4',
    RateLimit: '"default";r=19;t=1',
  });
});

test('denied: Retry-After in whole seconds, rounded up', () => {
  for (const [ms, secs] of [[1, '1'], [1000, '1'], [1001, '2'], [120_500, '121']]) {
    const h = single([0, 0, ms, 3999], 20, 5).headers();
    assert.equal(h['Retry-After'], secs);
    assert.equal(h.RateLimit, '"default";r=0;t=4');
  }
});

test('n above the capacity (retry -1): no Retry-After', () => {
  assert.equal(single([0, 20, -1, 0], 20, 5).headers()['Retry-After'], undefined);
  assert.equal(single([0, 20, -1, 0], 20, 5).headers().RateLimit, '"default";r=20;t=0');
});

test('quota is floor(capacity), window ceil(capacity / rate) seconds', () => {
  assert.equal(single([1, 0, 0, 0], 10, 3).headers()['RateLimit-Policy'], '"default";q=10;w=4');
  assert.equal(single([1, 0, 0, 0], 5, 1000).headers()['RateLimit-Policy'], '"default";q=5;w=1');
  assert.equal(single([1, 0, 0, 0], 2.5, 1).headers()['RateLimit-Policy'], '"default";q=2;w=3');
  assert.equal(single([1, 0, 0, 0], 5000, 0.05787).headers()['RateLimit-Policy'], '"default";q=5000;w=86401');
  // Past the largest Structured Field integer: capped, so the header still parses.
  assert.equal(single([1, 0, 0, 0], 2 ** 53, 1e-300).headers()['RateLimit-Policy'], '"default";q=999999999999999;w=999999999999999');
});

test('takeAll: one policy item per limit in call order; RateLimit for the deciding one', () => {
  const d = new Decision([0, 0, 1500, 4000, 1], [
    { name: 'sec', capacity: 10, rate: 2 }, { name: 'day', capacity: 5000, rate: 5000 / 86400 },
  ], 1);
  assert.equal(d.policy, 'day');
  assert.equal(d.index, 1);
  assert.deepEqual(rateLimitHeaders(d), {
    'RateLimit-Policy': '"sec";q=10;w=5, "day";q=5000;w=86400',
    RateLimit: '"day";r=0;t=4',
    'Retry-After': '2',
  });
});

test('policy names are sf-strings: quotes and backslashes escaped, non-ASCII replaced', () => {
  assert.equal(single([1, 0, 0, 0], 1, 1, 'a"b\\c').headers().RateLimit, '"a\\"b\\\\c";r=0;t=0');
  assert.equal(single([1, 0, 0, 0], 1, 1, 'zürich\n').headers().RateLimit, '"z?rich?";r=0;t=0');
});
