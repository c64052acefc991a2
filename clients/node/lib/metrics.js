'use strict';

// The limiter's metrics through OpenTelemetry's metrics API (docs/clients.md, "Metrics"):
// tb.decisions, tb.decision.duration, tb.waits and tb.leases on the meter "redis-tb". The API
// is an optional peer dependency: without it (and without a meterProvider given) Metrics
// records nothing and costs one branch per call. Until the application installs an SDK the
// API's global provider is its no-op one, so the default costs little more.

const { createRequire } = require('node:module');
const path = require('node:path');

const { version } = require('../package.json');

const METER = 'redis-tb';

// @opentelemetry/api's ValueType.INT, without requiring the API (a given provider needs none):
// the counters count whole things.
const INT = 0;

// Decision.source -> tb.source; the middleware's own values pass as they are.
const SOURCES = { server: 'redis', local: 'local', cache: 'denial_cache' };

// Seconds, from a denial-cache answer (microseconds) to a long wait: the SDK's default
// boundaries (0 .. 10000) are meant for milliseconds and would put every decision in one bucket.
const DURATION_BUCKETS = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30];

// Attribute objects are kept per limit name so that a call allocates none; names come from the
// application's declared limits, but a call's `name` is free text, so past this many a name's
// attributes are made per call instead of growing the cache.
const MAX_CACHED_LIMITS = 1000;

// A package as the application resolves it: from its main module, from the working
// directory, then from this package (the application's own copy first, so one instance of
// a library with global state is used); the first that `accept`s, or undefined.
function requireFromApplication(name, accept = () => true) {
  const bases = [];
  if (require.main && require.main.filename) {
    bases.push(require.main.filename);
  }
  bases.push(path.join(process.cwd(), 'package.json'), __filename);
  for (const base of bases) {
    try {
      const found = createRequire(base)(name);
      if (accept(found)) {
        return found;
      }
    } catch {
      // not from there
    }
  }
  return undefined;
}

// The application's @opentelemetry/api, resolved as it resolves it (its main module, its working
// directory, then this package): a checkout linked into a
// project must not record into its own dev copy. null when it is not installed, or too old to
// have the metrics API (before 1.3).
let api;
function openTelemetryApi() {
  if (api === undefined) {
    api = requireFromApplication('@opentelemetry/api',
      (found) => Boolean(found && found.metrics && typeof found.metrics.getMeterProvider === 'function')) ?? null;
  }
  return api;
}

function isMeterProvider(value) {
  return value !== null && typeof value === 'object' && typeof value.getMeter === 'function';
}

class Metrics {
  // meterProvider: an OpenTelemetry MeterProvider, or undefined for the API's global one (looked
  // up again at each record, so that an SDK registered after the limiter was made is used).
  constructor(meterProvider) {
    this._global = meterProvider === undefined ? openTelemetryApi() : null;
    this.enabled = meterProvider !== undefined || this._global !== null;
    this._provider = null;
    this._attributes = new Map();
    if (meterProvider !== undefined) {
      this._bind(meterProvider);
    }
  }

  _bind(provider) {
    this._provider = provider;
    const meter = provider.getMeter(METER, version);
    this._decisions = meter.createCounter('tb.decisions', {
      unit: '{decision}', description: 'Rate-limit decisions, by limit, outcome and source', valueType: INT,
    });
    this._duration = meter.createHistogram('tb.decision.duration', {
      unit: 's', description: 'Seconds from a take to its decision, a wait included',
      advice: { explicitBucketBoundaries: DURATION_BUCKETS },
    });
    this._waits = meter.createCounter('tb.waits', {
      unit: '{wait}', description: 'waitTake and waitAcquire calls, by outcome', valueType: INT,
    });
    this._leases = meter.createCounter('tb.leases', {
      unit: '{lease}', description: 'Leases acquired, denied and lost', valueType: INT,
    });
  }

  // false: record nothing.
  _ready() {
    if (!this.enabled) {
      return false;
    }
    if (this._global !== null) {
      const provider = this._global.metrics.getMeterProvider();
      if (provider !== this._provider) {
        this._bind(provider);
      }
    }
    return true;
  }

  // { tb.limit, tb.outcome[, tb.source] }, the same object for the same values.
  _attributesOf(limit, outcome, source) {
    let byOutcome = this._attributes.get(limit);
    if (byOutcome === undefined) {
      if (this._attributes.size >= MAX_CACHED_LIMITS) {
        return made(limit, outcome, source);
      }
      byOutcome = new Map();
      this._attributes.set(limit, byOutcome);
    }
    let bySource = byOutcome.get(outcome);
    if (bySource === undefined) {
      bySource = new Map();
      byOutcome.set(outcome, bySource);
    }
    let attributes = bySource.get(source);
    if (attributes === undefined) {
      attributes = made(limit, outcome, source);
      bySource.set(source, attributes);
    }
    return attributes;
  }

  // One decision a take returned or the middleware acted on. source: a Decision's ('server',
  // 'local', 'cache') or 'unavailable_allowed' / 'unavailable_denied'; started: performance.now()
  // at the call.
  decision(limit, allowed, source, started) {
    if (!this._ready()) {
      return;
    }
    const attributes = this._attributesOf(limit, allowed ? 'allowed' : 'denied', SOURCES[source] ?? source);
    this._decisions.add(1, attributes);
    this._duration.record(Math.max(0, (performance.now() - started) / 1000), attributes);
  }

  // The end of a waitTake or waitAcquire: it got its tokens or lease, or timed out.
  wait(limit, allowed) {
    if (!this._ready()) {
      return;
    }
    this._waits.add(1, this._attributesOf(limit, allowed ? 'allowed' : 'denied', undefined));
  }

  // A lease: outcome 'acquired' | 'denied' | 'lost'; source as decision's.
  lease(limit, outcome, source) {
    if (!this._ready()) {
      return;
    }
    this._leases.add(1, this._attributesOf(limit, outcome, SOURCES[source] ?? source));
  }
}

function made(limit, outcome, source) {
  const attributes = { 'tb.limit': limit, 'tb.outcome': outcome };
  if (source !== undefined) {
    attributes['tb.source'] = source;
  }
  return Object.freeze(attributes);
}

module.exports = { Metrics, isMeterProvider, openTelemetryApi, requireFromApplication, METER };
