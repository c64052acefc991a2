import assert from 'node:assert/strict';
import { test } from 'node:test';
import { rateLimitHeaders } from '../ratelimit.js';

const d = (allowed, remaining, retryAfterMs, resetAfterMs) => ({ allowed, remaining, retryAfterMs, resetAfterMs });

test('allowed: policy and state, no Retry-After', () => {
  assert.deepEqual(rateLimitHeaders(d(true, 19, 0, 200), 20, 5), {
    'RateLimit-Policy': '20;w=4',
    RateLimit: 'limit=20, remaining=19, reset=1',
  });
});

test('denied: Retry-After in whole seconds, rounded up', () => {
  for (const [ms, secs] of [[1, '1'], [1000, '1'], [1001, '2'], [120_500, '121']]) {
    const h = rateLimitHeaders(d(false, 0, ms, 3999), 20, 5);
    assert.equal(h['Retry-After'], secs);
    assert.equal(h.RateLimit, 'limit=20, remaining=0, reset=4');
  }
});

test('cost above capacity (retry -1): no Retry-After', () => {
  assert.equal(rateLimitHeaders(d(false, 20, -1, 0), 20, 5)['Retry-After'], undefined);
});

test('policy window is the time to refill, at least 1 s; limit is whole requests', () => {
  assert.equal(rateLimitHeaders(d(true, 0, 0, 0), 10, 3)['RateLimit-Policy'], '10;w=4');
  assert.equal(rateLimitHeaders(d(true, 0, 0, 0), 5, 1000)['RateLimit-Policy'], '5;w=1');
  assert.equal(rateLimitHeaders(d(true, 0, 0, 0), 2.5, 1)['RateLimit-Policy'], '2;w=3');
});
