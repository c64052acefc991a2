import express from 'express';
import { rateLimit } from './ratelimit.js';

// The demo: 5 requests of burst per client IP, then 1 per second.
export function createApp({ redis, capacity = 5, rate = 1, logger = console }) {
  const app = express();
  app.disable('x-powered-by');
  app.use(rateLimit({ redis, capacity, rate, logger }));
  app.get('/', (req, res) => res.json({ hello: 'world' }));
  return app;
}
