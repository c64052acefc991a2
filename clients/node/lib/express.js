'use strict';

// The Express middleware: lib/middleware.js's limiterCore decides, this file answers in
// Express's terms (as Python's asgi.py and wsgi.py over _middleware.py).

const { limiterCore, releaseWhenDone } = require('./middleware');

// Express (or any connect-style framework, or plain node:http): app.use(expressRateLimit({...})).
function expressRateLimit(options) {
  const decide = limiterCore(options);
  return async function redisTbRateLimit(req, res, next) {
    let outcome;
    try {
      outcome = await decide(req);
    } catch (err) {
      return next(err);
    }
    for (const [name, value] of Object.entries(outcome.headers)) {
      res.setHeader(name, value);
    }
    if (outcome.status === 0) {
      releaseWhenDone(options.limiter, outcome.guard, res);
      return next();
    }
    res.statusCode = outcome.status;
    res.setHeader('Content-Type', 'application/problem+json');
    res.end(JSON.stringify(outcome.body));
    return undefined;
  };
}

module.exports = { expressRateLimit };
