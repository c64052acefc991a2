'use strict';

// clients/conformance/behaviour.json, without a server: the default key, the one
// RateLimit-Policy line, the Limits refused when made, and the shared option names and
// defaults (docs/clients.md, "The same behaviour in all three"; issue 26, item 6).

const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { test } = require('node:test');
const { Decision, InvalidArgument, Lease, Limit, RateLimiter, createClient } = require('..');
const { limiterCore, peerId } = require('../lib/middleware');
const { policyLine } = require('../lib/headers');

const CASES = JSON.parse(fs.readFileSync(path.join(__dirname, '..', '..', 'conformance', 'behaviour.json'), 'utf8'));

// A limiter over a client that never connects (lazyConnect): only its settings are looked at.
function idleLimiter(options = {}) {
  const client = createClient('redis://127.0.0.1:1', { lazyConnect: true });
  return new RateLimiter(client, { logger: false, ...options });
}

test('default_key: the peer address, IPv4-mapped IPv6 as IPv4, unknown without one', () => {
  for (const { remote, id } of CASES.default_key) {
    assert.equal(peerId(remote), id, String(remote));
  }
});

test('policy_header: one RateLimit-Policy line, the rate policies first, the in-flight limit last', () => {
  for (const c of CASES.policy_header) {
    assert.equal(policyLine(c.policies, c.concurrency), c.header);
    // The middleware joins the decision's and the lease's headers into that line.
    const decision = new Decision([1, 0, 0, 0, 0], c.policies, c.policies.length > 1 ? 0 : null);
    const items = [decision.headers()['RateLimit-Policy']];
    if (c.concurrency) {
      const lease = new Lease(true, 0, 0, 'id', { key: 'k', limit: c.concurrency.limit, leaseMs: 1, name: c.concurrency.name });
      items.push(lease.headers()['RateLimit-Policy']);
    }
    assert.equal(items.join(', '), c.header);
  }
});

test('invalid_limits: refused with InvalidArgument when the Limit is made', () => {
  const number = (x) => (typeof x === 'string' ? Number(x) : x);
  for (const l of CASES.invalid_limits) {
    assert.throws(() => new Limit(l.key, number(l.capacity), number(l.rate), number(l.n), l.name), InvalidArgument, JSON.stringify(l));
  }
  assert.doesNotThrow(() => new Limit('k', 5, 1, 1, 'default'));
  assert.doesNotThrow(() => new Limit('k', 5, 1));
});

test('defaults: the shared option names and their defaults', () => {
  const limiter = idleLimiter();
  const decide = limiterCore({ limiter, capacity: 1, rate: 1, concurrency: { limit: 2 } });
  const { settings } = decide;
  // behaviour.json's snake_case name -> where Node holds it (camelCase).
  const where = {
    prefix: () => settings.prefix,
    lease_ms: () => settings.concurrency.leaseMs,
    concurrency_name: () => settings.concurrency.name,
    module_recheck_ms: () => limiter.moduleRecheckMs,
    on_unavailable_limiter: () => limiter.onUnavailable,
    on_unavailable_middleware: () => settings.onUnavailable,
    instances: () => limiter.instances,
    local_max_keys: () => limiter.localMaxKeys,
    local_probe_ms: () => limiter.localProbeMs,
    cache_denials: () => limiter.cacheDenials,
  };
  for (const [name, value] of Object.entries(CASES.defaults)) {
    assert.ok(where[name], `behaviour.json names a default Node does not check: ${name}`);
    assert.equal(where[name](), value, name);
  }
});

test('the shared names are the options: prefix and keyPrefix, onUnavailable and failOpen', () => {
  const limiter = idleLimiter();
  const settings = (options) => limiterCore({ limiter, capacity: 1, rate: 1, ...options }).settings;
  assert.equal(settings({ prefix: 'a:' }).prefix, 'a:');
  assert.equal(settings({ keyPrefix: 'b:' }).prefix, 'b:');
  assert.equal(settings({ failOpen: false }).onUnavailable, 'closed');
  assert.equal(settings({ failOpen: true }).onUnavailable, 'open');
  assert.equal(settings({ onUnavailable: 'local' }).onUnavailable, 'local');
  assert.throws(() => settings({ onUnavailable: 'raise' }), InvalidArgument);
  const configured = idleLimiter({ moduleRecheckMs: 5, onUnavailable: 'local', instances: 3, localMaxKeys: 7, localProbeMs: 9, cacheDenials: true });
  assert.deepEqual([configured.moduleRecheckMs, configured.onUnavailable, configured.instances, configured.localMaxKeys,
    configured.localProbeMs, configured.cacheDenials], [5, 'local', 3, 7, 9, true]);
  for (const bad of [{ onUnavailable: 'open' }, { instances: 0 }, { instances: 1.5 }, { localMaxKeys: 0 }, { localProbeMs: -1 },
    { cacheDenials: 'yes' }]) {
    assert.throws(() => idleLimiter(bad), InvalidArgument, JSON.stringify(bad));
  }
});
