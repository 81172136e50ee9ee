// Page loads in Chromium, for the console bench (server/benches/console.rs runs it while its two
// servers are up): each page of each server, navigation start to the `load` event, from the
// Navigation Timing entry, and navigation start to hydrated (the wasm bundle has taken over:
// `<body data-hydrated>` set, seen by a MutationObserver). Three warm-ups, then N timed loads, a
// page's served, static and debug loads taken in turn
// (BENCH_PAGE_LOADS, default 20); prints p50 and p95 in ms side by side, as a Markdown table.
//
// Two floors: `/healthz` (two bytes of text: what Chromium itself takes on this machine), and
// each page's static copy: the served page's HTML without its scripts (no wasm, no hydration
// data), with its stylesheet, from a plain Node.js server. What a page costs beyond its copy is
// the console's; the copy itself is what the browser needs for that much HTML.
//
//   node end2end/bench/page-load.mjs <served base URL> <debug base URL> <record id>
import { createServer } from 'node:http';
import { launchBrowser } from '../tests/support/harness.mjs';

const [served, debug, recordId] = process.argv.slice(2);
if (!served || !debug || !recordId) {
  console.error('usage: page-load.mjs <served base URL> <debug base URL> <record id>');
  process.exit(2);
}
const loads = Number(process.env.BENCH_PAGE_LOADS ?? 20);
const paths = ['/healthz', '/', '/records', `/records/${recordId}`, '/stuck', '/retries', '/dead-letters', '/cleanup',
  '/audit', '/requeue'];

function percentile(sorted, q) {
  return sorted[Math.min(sorted.length, Math.max(1, Math.ceil(sorted.length * q))) - 1];
}

// Runs in every page before its own scripts: notes when `<body>` gets `data-hydrated`.
function watchHydration() {
  new MutationObserver((changes, observer) => {
    if (document.body?.hasAttribute('data-hydrated')) {
      window.__hydratedAt = performance.now();
      observer.disconnect();
    }
  }).observe(document, { attributes: true, subtree: true, attributeFilter: ['data-hydrated'] });
}

/** Serves the static copy of every page of `base` (and its stylesheet); resolves to its URL. */
async function staticCopies(base) {
  const files = new Map();
  for (const path of paths) {
    const html = await (await fetch(base + path)).text();
    const copy = html.replace(/<script[^>]*>[\s\S]*?<\/script>/g, '').replace(/<link rel="modulepreload"[^>]*>/g, '');
    files.set(path, [path === '/healthz' ? 'text/plain' : 'text/html; charset=utf-8', copy]);
  }
  const css = '/pkg/dedup-console.css';
  files.set(css, ['text/css', await (await fetch(base + css)).text()]);
  const server = createServer((req, res) => {
    const [type, body] = files.get(req.url) ?? ['text/plain', 'not found'];
    res.writeHead(files.has(req.url) ? 200 : 404, { 'content-type': type }).end(body);
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  server.unref();
  return `http://127.0.0.1:${server.address().port}`;
}

/** [load, hydrated] in ms from navigation start; hydrated is NaN unless `app` (waited for). */
async function time(page, url, app) {
  const response = await page.goto(url, { waitUntil: 'load' });
  if (response.status() !== 200) throw new Error(`${url}: ${response.status()}`);
  if (app) await page.waitForFunction(() => window.__hydratedAt !== undefined, null, { timeout: 30_000 });
  return page.evaluate(() => {
    const [nav] = performance.getEntriesByType('navigation');
    return [nav.loadEventEnd - nav.startTime, (window.__hydratedAt ?? NaN) - nav.startTime];
  });
}

/**
 * p50 and p95 of load, then of hydrated, for each of `targets` ([url, app] pairs), their loads
 * interleaved (one of each in turn), so that what else the machine does meanwhile falls on all
 * of them alike.
 */
async function measure(page, targets) {
  for (let i = 0; i < 3; i += 1) for (const [url, app] of targets) await time(page, url, app);
  const samples = targets.map(() => []);
  for (let i = 0; i < loads; i += 1) {
    for (const [t, [url, app]] of targets.entries()) samples[t].push(await time(page, url, app));
  }
  return samples.map((of) => {
    const column = (k) => of.map((s) => s[k]).sort((a, b) => a - b);
    return [0, 1].flatMap((k) => [percentile(column(k), 0.5), percentile(column(k), 0.95)]);
  });
}

const copies = await staticCopies(served);
const context = await launchBrowser();
await context.addInitScript(watchHydration);
const page = await context.newPage();
console.log(`\nPage loads in Chromium (navigation start to load, and to hydrated; ${loads} loads after 3 warm-ups; ms)\n`);
console.log('| page | served load p50 | p95 | served hydrated p50 | p95 | static copy load p50 | p95 | debug load p50 | p95 |');
console.log('|---|---:|---:|---:|---:|---:|---:|---:|---:|');
try {
  for (const path of paths) {
    const app = path !== '/healthz';
    const [live, copy, slow] = await measure(page, [[served + path, app], [copies + path, false], [debug + path, app]]);
    const row = [...live, ...copy.slice(0, 2), ...slow.slice(0, 2)];
    const cells = row.map((v) => (Number.isNaN(v) ? '–' : v.toFixed(1)).padStart(7));
    console.log(`| ${path.padEnd(20)} | ${cells.join(' | ')} |`);
  }
} finally {
  await context.close();
}
