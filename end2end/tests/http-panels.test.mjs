// What the console shows of an HTTP handler, in Chromium: the overview's endpoint card with its
// calls, and on the record page each call's status and answer (as text) and the redeliveries
// absorbed without calling the service.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startServer, launchBrowser, login, screenshot, openPage } from './support/harness.mjs';

let server;
let browser;
let recordId;
const tag = randomBytes(4).toString('hex');
const group = `e2e-http-${tag}`;

before(async () => {
  // Never called: the test writes the calls itself. A queue of its own, so nothing else arrives.
  const config = join(mkdtempSync(join(tmpdir(), 'dc-http-')), 'http.toml');
  writeFileSync(config, `
[consumer]
group = "${group}"

[consumer.rabbitmq]
exchange = "e2e.http.${tag}"
queue = "e2e.http.${tag}"

[consumer.http."ORDER.PAID"]
url = "http://127.0.0.1:9/charge"
headers = { Authorization = "Bearer e2e-s3cret" }
`);
  server = await startServer({ DEDUP_CONFIG: config });
  recordId = server.sql(`WITH r AS (
      INSERT INTO dedup_records (consumer_group, message_id, message_type, status, handler_mode, attempts,
          max_attempts, payload_hash, source_broker, last_error, error_class, duplicate_count)
      VALUES ('${group}', 'ORDER.PAID.1:1', 'ORDER.PAID', 'dead', 'leased', 1, 5, '\\x00', 'rabbitmq',
              'HTTP_CONFLICT: HTTP 422 Unprocessable Entity', 'HTTP_CONFLICT', 3)
      RETURNING id
    ), a AS (
      INSERT INTO record_attempts (record_id, attempt, worker, started_at, ended_at, outcome, error, answer_status,
          latency_ms, answer, consumer_group, message_type)
      SELECT id, 1, 'host:1:0', now() - interval '1 second', now(), 'dead', 'HTTP_CONFLICT: HTTP 422 Unprocessable Entity',
             422, 41, '<img src=x onerror=alert(1)>', '${group}', 'ORDER.PAID' FROM r
    )
    SELECT id FROM r`);
  browser = await launchBrowser();
  await login(browser, server, server.users.viewer);
});

after(async () => {
  await browser?.close();
  await server?.stop();
});

const open = (path) => openPage(browser, server, path);

test('the overview shows a card per HTTP endpoint with its calls', async () => {
  const { page, errors } = await open('/');
  const card = page.locator(`[data-testid="endpoint"][data-group="${group}"][data-type="ORDER.PAID"]`);
  await card.waitFor();
  assert.equal(await card.getByTestId('endpoint-calls').getAttribute('data-value'), '1');
  assert.equal(await card.getByTestId('endpoint-url').innerText(), 'POST http://127.0.0.1:9/charge');
  assert.equal(await card.locator('tr[data-class="conflict"] td.num').innerText(), '1');
  const p95 = await card.getByTestId('endpoint-p95').innerText();
  assert.ok(p95.startsWith('41 ms'), p95);
  assert.ok(!(await page.content()).includes('e2e-s3cret'), 'no header value on the page');
  await screenshot(page, 'overview-http-endpoint');
  assert.deepEqual(errors, [], 'no script errors');
});

test('the record page shows each call and the redeliveries absorbed', async () => {
  const { page, errors } = await open(`/records/${recordId}`);
  const answer = page.getByTestId('attempt-answer');
  assert.equal(await answer.getAttribute('data-status'), '422');
  assert.equal(await answer.getAttribute('data-class'), 'HTTP_CONFLICT');
  assert.equal(
    await page.getByTestId('redeliveries-absorbed').innerText(),
    '3 redeliveries absorbed; the service was called once',
  );
  await answer.locator('summary').click();
  assert.equal(await page.getByTestId('attempt-answer-text').innerText(), '<img src=x onerror=alert(1)>');
  await screenshot(page, 'record-http-attempt');
  assert.deepEqual(errors, [], 'no script errors, no alert from the answer');
});
