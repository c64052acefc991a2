'use strict';

// What the metrics tests share (conformance.test.js's metrics.json cases, metrics.test.js): a
// meter provider of the OpenTelemetry SDK for one limiter alone, with a reader collected on
// demand, and the check of what it recorded against clients/conformance/metrics.json's format.

const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { MeterProvider, MetricReader, DataPointType } = require('@opentelemetry/sdk-metrics');

const METRICS = JSON.parse(fs.readFileSync(path.join(__dirname, '..', '..', 'conformance', 'metrics.json'), 'utf8'));
const KINDS = { counter: DataPointType.SUM, histogram: DataPointType.HISTOGRAM };

// A reader that exports nowhere: collect() is what the tests call.
class InMemoryReader extends MetricReader {
  onForceFlush() {
    return Promise.resolve();
  }

  onShutdown() {
    return Promise.resolve();
  }
}

// { meterProvider, collect }: collect() -> Map name -> { descriptor, dataPointType, dataPoints }
// of the meter "redis-tb" (and asserts that nothing else was recorded on this provider).
function meterReader() {
  const reader = new InMemoryReader();
  const meterProvider = new MeterProvider({ readers: [reader] });
  async function collect() {
    const { resourceMetrics, errors } = await reader.collect();
    assert.deepEqual(errors, []);
    const found = new Map();
    for (const scope of resourceMetrics.scopeMetrics) {
      assert.equal(scope.scope.name, 'redis-tb');
      assert.equal(scope.scope.version, require('../package.json').version);
      for (const metric of scope.metrics) {
        found.set(metric.descriptor.name, metric);
      }
    }
    return found;
  }
  return { meterProvider, collect };
}

// The data points of `name` as [{ attributes, value }] (value: a counter's sum, or a
// histogram's { count, sum, ... }); [] when it has none.
function points(collected, name) {
  const metric = collected.get(name);
  return metric ? metric.dataPoints.map((p) => ({ attributes: p.attributes, value: p.value })) : [];
}

const sameAttributes = (a, b) => {
  const ka = Object.keys(a).sort();
  return ka.length === Object.keys(b).length && ka.every((k) => a[k] === b[k]);
};

// metrics.json's check: every instrument the case names has exactly those data points (by all
// their attributes), with `value` (a counter's sum) or `count` (a histogram's; its sum at least 0
// and finite); every other instrument of METRICS.instruments has none. Kind and unit as declared.
function checkMetrics(collected, expected, what) {
  for (const instrument of METRICS.instruments) {
    const metric = collected.get(instrument.name);
    const got = points(collected, instrument.name);
    const want = expected[instrument.name] ?? [];
    if (metric && got.length > 0) {
      assert.equal(metric.dataPointType, KINDS[instrument.kind], `${what}: ${instrument.name}'s kind`);
      assert.equal(metric.descriptor.unit, instrument.unit, `${what}: ${instrument.name}'s unit`);
    }
    const shown = JSON.stringify(got);
    assert.equal(got.length, want.length, `${what}: ${instrument.name} has ${shown}, expected ${JSON.stringify(want)}`);
    for (const point of want) {
      const match = got.find((p) => sameAttributes(p.attributes, point.attributes));
      assert.ok(match, `${what}: ${instrument.name} has no point ${JSON.stringify(point.attributes)}: ${shown}`);
      assert.deepEqual(Object.keys(match.attributes).sort(), [...instrument.attributes].sort(), `${what}: ${instrument.name}'s attributes`);
      if (point.value !== undefined) {
        assert.equal(match.value, point.value, `${what}: ${instrument.name} ${JSON.stringify(point.attributes)}: ${shown}`);
      }
      if (point.count !== undefined) {
        assert.equal(match.value.count, point.count, `${what}: ${instrument.name} ${JSON.stringify(point.attributes)}: ${shown}`);
        assert.ok(Number.isFinite(match.value.sum) && match.value.sum >= 0, `${what}: ${instrument.name}'s sum ${match.value.sum}`);
      }
    }
  }
  for (const name of collected.keys()) {
    assert.ok(METRICS.instruments.some((i) => i.name === name), `${what}: an instrument metrics.json does not know: ${name}`);
  }
}

module.exports = { METRICS, meterReader, points, checkMetrics };
