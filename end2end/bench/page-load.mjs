// Page loads in Chromium, for the console bench (server/benches/console.rs runs it while its two
// servers are up): each page of each server, navigation start to the `load` event, from the
// Navigation Timing entry. Three warm-ups, then N timed loads (BENCH_PAGE_LOADS, default 20);
// prints p50 and p95 in ms side by side, as a Markdown table.
//
//   node end2end/bench/page-load.mjs <served base URL> <debug base URL> <record id>
import { launchBrowser } from '../tests/support/harness.mjs';

const [served, debug, recordId] = process.argv.slice(2);
if (!served || !debug || !recordId) {
  console.error('usage: page-load.mjs <served base URL> <debug base URL> <record id>');
  process.exit(2);
}
const loads = Number(process.env.BENCH_PAGE_LOADS ?? 20);
// `/healthz` (two bytes of text) is the floor: what Chromium itself takes on this machine.
const paths = ['/healthz', '/', '/records', `/records/${recordId}`, '/stuck', '/retries', '/dead-letters', '/cleanup',
  '/audit', '/requeue'];

function percentile(sorted, q) {
  return sorted[Math.min(sorted.length, Math.max(1, Math.ceil(sorted.length * q))) - 1];
}

async function time(page, url) {
  const response = await page.goto(url, { waitUntil: 'load' });
  if (response.status() !== 200) throw new Error(`${url}: ${response.status()}`);
  return page.evaluate(() => {
    const [nav] = performance.getEntriesByType('navigation');
    return nav.loadEventEnd - nav.startTime;
  });
}

const context = await launchBrowser();
const page = await context.newPage();
console.log(`\nPage loads in Chromium (navigation to load, ${loads} loads after 3 warm-ups; ms)\n`);
console.log('| page | served p50 | served p95 | debug p50 | debug p95 |\n|---|---:|---:|---:|---:|');
try {
  for (const path of paths) {
    const row = [];
    for (const base of [served, debug]) {
      for (let i = 0; i < 3; i += 1) await time(page, base + path);
      const samples = [];
      for (let i = 0; i < loads; i += 1) samples.push(await time(page, base + path));
      samples.sort((a, b) => a - b);
      row.push(percentile(samples, 0.5), percentile(samples, 0.95));
    }
    console.log(`| ${path.padEnd(20)} | ${row.map((v) => v.toFixed(1).padStart(8)).join(' | ')} |`);
  }
} finally {
  await context.close();
}
