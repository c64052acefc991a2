'use strict';

// HTTP headers of draft-ietf-httpapi-ratelimit-headers-11 (Structured Fields, RFC 8941):
//   RateLimit-Policy: "<name>";q=<floor(capacity)>;w=<ceil(capacity / rate)>   (one item per limit)
//   RateLimit: "<name>";r=<remaining>;t=<ceil(reset_after_ms / 1000)>          (the deciding limit)
//   Retry-After: <ceil(retry_after_ms / 1000)>    on a denial with retry_after_ms >= 0

// The largest Structured Field integer (15 digits). Larger values (a capacity near 2^53,
// a window of a very slow rate) are capped there, or the header would not parse.
const SF_INTEGER_MAX = 999999999999999;

function sfInteger(x) {
  if (!(x >= 0)) {
    return '0';
  }
  return String(Math.min(x, SF_INTEGER_MAX));
}

// An sf-string: printable ASCII only, with \ and " escaped. The limiter refuses other policy
// names; for a Decision built by hand anything else becomes '?', so a header never breaks.
function sfString(text) {
  const printable = String(text).replace(/[^\x20-\x7e]/g, '?');
  return `"${printable.replace(/[\\"]/g, (c) => `\\${c}`)}"`;
}

function policyItem(limit) {
  return `${sfString(limit.name)};q=${sfInteger(Math.floor(limit.capacity))};w=${sfInteger(Math.ceil(limit.capacity / limit.rate))}`;
}

function concurrencyItem(name, limit) {
  return `${sfString(name)};q=${sfInteger(limit)};qu="concurrent-requests"`;
}

// The middleware's one RateLimit-Policy line: the rate policies in their order, then the
// in-flight limit ({ name, limit }) if any.
function policyLine(policies, concurrency) {
  const items = policies.map(policyItem);
  if (concurrency) {
    items.push(concurrencyItem(concurrency.name, concurrency.limit));
  }
  return items.join(', ');
}

function rateLimitHeaders(decision) {
  const limits = decision.limits;
  const deciding = limits[decision.index ?? 0];
  const headers = {
    'RateLimit-Policy': limits.map(policyItem).join(', '),
    RateLimit: `${sfString(deciding.name)};r=${sfInteger(decision.remaining)};t=${sfInteger(Math.ceil(decision.resetAfterMs / 1000))}`,
  };
  if (!decision.allowed && decision.retryAfterMs >= 0) {
    headers['Retry-After'] = sfInteger(Math.ceil(decision.retryAfterMs / 1000));
  }
  return headers;
}

module.exports = { rateLimitHeaders, policyItem, policyLine, concurrencyItem, sfString, sfInteger, SF_INTEGER_MAX };
