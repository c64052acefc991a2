// node server.js   (REDIS_URL, default redis://127.0.0.1:6379; PORT, default 3000)
import { createApp } from './app.js';
import { createRedis } from './ratelimit.js';

const redis = createRedis(process.env.REDIS_URL);
const port = Number(process.env.PORT ?? 3000);
createApp({ redis }).listen(port, '127.0.0.1', () => {
  console.log(`listening on http://127.0.0.1:${port}/`);
});
